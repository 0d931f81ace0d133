"""``eagle3ops release HOST --gate``: any serving change (flags, NCCL settings, a vLLM upgrade, a new image) measured
against the live release through the speculation gate, and kept only when it is not slower beyond the margin
(issue 31).

The same steps and functions as ``speculate`` (:mod:`.ship`, driver side): the live release measured on the host
(:func:`.ship.measure_on_host`: HumanEval gate-split prompts at each ``serving.gate_concurrency`` level,
``serving.gate_passes`` passes, the API key as the health gate takes it), the change made through
``run_window(kind="release")`` (locked, health-gated, rolled back by the supervisor when its gate fails), the same
measurement on it, then :func:`.decide.decide` with ``rule="not_slower"`` (lower bound of the 90 % interval of the
throughput ratio at ``1 - margin``; no acceptance floor; drift and TTFT bound as for speculate); anything but
``keep`` → ``run_window(kind="rollback", to_release=<the live release before>)``, health-gated.

Results: ``<state_dir>/gates/<release window id>.json`` and one audit line ``kind: release-gate`` with the figures.

Where this must move: when ``speculate`` becomes a host-side supervisor job (issue 31 follow-up, helper h11), the
measure → decide → keep/rollback steps here switch to that job with ``rule="not_slower"`` and no floor; this module
then only builds the job's request.
"""

from __future__ import annotations

import getpass
import json
import time
from collections.abc import Callable
from typing import Any

from eagle3ops.commands import host as hc
from eagle3ops.commands import speculate as sc
from eagle3ops.config.inventory import check_gate_margin
from eagle3ops.config.plan import ReleaseChange
from eagle3ops.speculate import ship
from eagle3ops.gate.decide import MIN_PASSES, Decision, decide
from eagle3ops.gate.measure import sum_deltas

__all__ = ["gated_release"]


def gated_release(r: Any, change: ReleaseChange, *, pipeline_image: str, pipeline_image_id: str | None,
                  command: str = "eagle3ops release --gate", margin: float | None = None,
                  passes: int | None = None, echo: Callable[[str], None] = print,
                  on_event: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Make ``change`` a release only if it measures not slower than the live one beyond the margin (see the module
    doc). ``margin``/``passes`` override ``serving.gate_margin``/``serving.gate_passes``.

    Returns:
        the result written to ``<state_dir>/gates/<window id>.json`` (``verdict``, ``reason``, the decision's
        figures, ``baseline_release``, ``release``, ``rollback_window``, ``live_release``); in a dry run the
        release window's plan.

    Raises:
        SpeculateError: the margin or the pass count is refused, or the changed release could not be measured (then
            rolled back first).
        eagle3ops.window.WindowError: the host's serving kind refuses a release, or a window failed to run.
    """
    from eagle3ops.window.common import append_audit, paths
    from eagle3ops.window.kinds import require_serving
    from eagle3ops.window.run import run_window

    h, s = r.host, r.host.serving
    require_serving(h, "release")
    try:
        margin = s.gate_margin if margin is None else check_gate_margin(margin)
    except ValueError as e:
        raise ship.SpeculateError(f"{h.name}: --margin: {e}") from None
    passes = passes or s.gate_passes
    if passes < MIN_PASSES:
        raise ship.SpeculateError(f"{h.name}: {passes} gate passes: the decision needs at least {MIN_PASSES}")
    gate = ship.gate_prompts(s.gate_prompts)
    texts, levels = [p.text for p in gate], list(s.gate_concurrency)
    window = dict(image=pipeline_image, expected_image_id=pipeline_image_id, command=command, on_event=on_event)
    if r.dry_run:
        echo(f"# dry run: would measure the live release and the changed one: {len(gate)} prompts x "
             f"{s.gate_max_tokens} tokens at concurrency {levels}, {passes} passes each; keep if not slower than "
             f"x{1 - margin:.3f}, else roll back:")
        echo("#   " + " ".join(sc.gate_helper(h, pipeline_image, "measure")))
        return run_window(r, kind="release", change=change, **window)
    t0 = time.monotonic()
    base_release = ship._current_release(r)
    echo(f"baseline: release {base_release}, {len(gate)} prompts x {s.gate_max_tokens} tokens at concurrency "
         f"{levels}, {passes} passes")
    baseline, _ = ship.measure_on_host(r, pipeline_image, texts, levels, s.gate_max_tokens, passes, ship._api_key(r))
    rel = run_window(r, kind="release", change=change, message="gated release", **window)
    if rel.get("release_before") is not None:
        base_release = rel["release_before"]
    rollback_window = None
    if rel.get("outcome") != "ok":
        decision = Decision("rollback", f"the changed release failed its health gate (window {rel.get('window_id')}:"
                                        f" {rel.get('error')}); the supervisor rolled back", {})
    else:
        try:
            measured, deltas = ship.measure_on_host(r, pipeline_image, texts, levels, s.gate_max_tokens, passes,
                                                    ship._api_key(r))
            decision = decide(baseline, measured, sum_deltas(list(deltas.values())), production_concurrency=levels[0],
                              margin=margin, acceptance_floor=None, ttft_ratio_max=s.gate_ttft_ratio_max,
                              rule="not_slower")
        except Exception as exc:
            rb = run_window(r, kind="rollback", to_release=base_release,
                            message="changed release could not be measured", **window)
            raise ship.SpeculateError(f"{h.name}: measuring the changed release failed ({exc}); rolled back to "
                                      f"release {rb.get('release')} (outcome {rb.get('outcome')})") from exc
        if not decision.keep:
            rb = run_window(r, kind="rollback", to_release=base_release, message=f"release gate: {decision.verdict}",
                            **window)
            rollback_window = {k: rb.get(k) for k in ("window_id", "outcome", "release")}
    result = {"host": h.name, "verdict": decision.verdict, "reason": decision.reason, **decision.figures,
              "change": change.model_dump(), "baseline_release": base_release, "release": rel.get("release"),
              "release_window": rel.get("window_id"), "rollback_window": rollback_window,
              "live_release": ship._current_release(r), "wall_s": round(time.monotonic() - t0, 1)}
    gates = f"{paths(h)['state']}/gates"
    r.run(hc.mkdir_p(gates))
    r.run(hc.write_file(f"{gates}/{rel.get('window_id') or 'unknown'}.json"),
          stdin=json.dumps(result, indent=2) + "\n")
    append_audit(r, {"user": getpass.getuser(), "host": h.name, "command": command, "kind": "release-gate",
                     "verdict": decision.verdict, "reason": decision.reason,
                     "figures": {k: result.get(k) for k in ("throughput_ratio", "interval", "drift", "passes",
                                                            "ttft_ratio", "margin", "rule", "levels",
                                                            "baseline_release", "release", "live_release",
                                                            "change")}})
    return result
