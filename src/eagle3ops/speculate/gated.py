"""``eagle3ops release HOST --gate``: any serving change (flags, NCCL settings, a vLLM upgrade, a new image) measured
against the live release through the speculation gate, and kept only when it is not slower beyond the margin.

The same host-side job as ``speculate`` (:class:`eagle3ops.config.plan.SpeculateJob`, carried out by the host's
supervisor under the lock from start to end: :mod:`eagle3ops.supervisor.speculate`), with ``rule="not_slower"``:
record → drain → the live release measured (HumanEval gate-split prompts at each ``serving.gate_concurrency`` level,
``serving.gate_passes`` passes after ``serving.gate_warmup_prompts`` warm-up prompts, the API key as the health gate
takes it) → the changed release, health-gated (rolled back by the supervisor when its gate fails) → the same
measurement → :func:`eagle3ops.gate.decide.decide` with ``rule="not_slower"`` (lower bound of the 90 % interval of
the throughput ratio at ``1 - margin``; no acceptance floor; drift and TTFT bound as for speculate) → keep, or back
to the release live before, health-gated → undrain. A driver that dies at any point leaves the host to finish, as
for ``speculate``; the plan prints the serving restarts and the downtime to expect from this host's records.

The change is what is measured, so the host does not refuse an unlike release (another image or vLLM version):
both releases' identities (image, id, labels, argv with keys redacted, ``/version``) are in the result. What speed
cannot show is read before any restart when ``--image`` is given (:func:`eagle3ops.speculate.upgrade.upgrade_checks`,
shared with ``speculate``): production's command line under the new image's vLLM parser (:func:`upgrade_flags`),
``/dev/shm`` and production's tokenizer under the new image's transformers (:func:`upgrade_tokenizer`: other token
ids serve other answers at the same speed).

Results: ``<state_dir>/gates/<window id>/`` (``baseline.json``, ``speculative.json``: the changed release's
measurement, ``result.json``), written by the supervisor under the lock, and one audit line ``kind: release-gate``
with the figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from eagle3ops import redact
from eagle3ops.commands import host as hc
from eagle3ops.config.inventory import check_gate_margin
from eagle3ops.config.plan import ReleaseChange, SpeculateJob
from eagle3ops.gate.decide import MIN_PASSES
from eagle3ops.speculate import ship
from eagle3ops.speculate.upgrade import upgrade_checks, upgrade_flags, upgrade_tokenizer

__all__ = ["gate_job", "gated_release", "upgrade_flags", "upgrade_tokenizer"]


def gate_job(h: Any, change: ReleaseChange, *, margin: float, passes: int, restarts: dict[str, Any]
             ) -> SpeculateJob:
    """The host job of a gated release of ``change`` on host ``h`` (pure): the inventory's gate settings, HumanEval's
    gate split (``serving.gate_prompts`` of them, set ``code``), ``rule="not_slower"``, no acceptance floor, results
    under ``<state_dir>/gates``.

    Raises:
        SpeculateError: HumanEval's data is missing (from :func:`eagle3ops.speculate.ship.gate_prompts`).
    """
    from eagle3ops.speculate import prompts as pr
    from eagle3ops.window.common import paths

    s = h.serving
    try:
        gate = ship.gate_prompts(s.gate_prompts)
    except pr.GatePromptsError as e:
        raise ship.SpeculateError(str(e)) from None
    figures = {"prompts": {"source": "HumanEval gate split", "fraction": pr.GATE_FRACTION, "count": len(gate),
                           "max_tokens": s.gate_max_tokens, "order": [p.id for p in gate]},
               "restarts": restarts,
               "change_described": change.model_copy(update={"args": redact.argv(change.args, h.secret_env)}).describe()}
    return SpeculateJob(results_dir=f"{paths(h)['state']}/gates", latest=None, rule="not_slower", change=change,
                        prompts=[p.text for p in gate], levels=list(s.gate_concurrency), max_tokens=s.gate_max_tokens,
                        passes=passes, margin=margin, acceptance_floor=None, ttft_ratio_max=s.gate_ttft_ratio_max,
                        warmup_prompts=min(s.gate_warmup_prompts, len(gate)), prompt_sets=ship.prompt_sets(gate),
                        drain_hook=s.drain_hook, undrain_hook=s.undrain_hook, hook_timeout_s=s.hook_timeout_s,
                        traffic=s.gate_traffic,
                        design=s.gate_design, figures=figures)


def gated_release(r: Any, change: ReleaseChange, *, pipeline_image: str, pipeline_image_id: str | None,
                  command: str = "eagle3ops release --gate", margin: float | None = None,
                  passes: int | None = None, echo: Callable[[str], None] = print,
                  on_event: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Make ``change`` a release only if it measures not slower than the live one beyond the margin (see the module
    doc). ``margin``/``passes`` override ``serving.gate_margin``/``serving.gate_passes``; the job runs in the host's
    supervisor (``pipeline_image``) and this driver only watches it.

    Returns:
        the job's result (``verdict``, ``reason``, the decision's figures, ``baseline_release``,
        ``speculative_release``: the changed release, ``rollback``, ``live_release``, ``measured_releases``,
        ``change``, ``attempt_dir``) with ``window_id``, ``outcome``, ``restarts_s`` and ``wall_s``; in a dry run
        ``{"verdict": "dry-run", "release_plan": ..., "restarts": ...}``.

    Raises:
        SpeculateError: the margin or the pass count is refused (before anything is read from the host), or the job
            ended in error (serving then on the release it left: the message says which).
        eagle3ops.window.WindowError: the host's serving kind refuses a release, a stand-in image on a host that is
            not a sandbox, or a window failed to run (lock, preflight, supervisor).
    """
    from eagle3ops.window.common import new_window_id
    from eagle3ops.window.kinds import require_serving
    from eagle3ops.window.run import refuse_release, run_window, under_lock

    h = r.host
    require_serving(h, "release")
    try:
        margin = h.serving.gate_margin if margin is None else check_gate_margin(margin)
    except ValueError as e:
        raise ship.SpeculateError(f"{h.name}: --margin: {e}") from None
    passes = passes or h.serving.gate_passes
    if passes < MIN_PASSES:
        raise ship.SpeculateError(f"{h.name}: {passes} gate passes: the decision needs at least {MIN_PASSES}")
    if not (change.args or change.env or change.binds or change.image):
        # nothing to change: the job releases a copy of the live spec and measures it against the original, which
        # says how much this host's measurement moves on its own; said before anything runs so it is not mistaken
        # for a change that measured even
        echo(f"note: no change given (--arg/--env/--image): this measures the live release against an identical "
             f"one (an A/A check of the gate's noise on {h.name}); kept or not, serving runs the same spec")
    t0 = time.monotonic()
    extra = upgrade_checks(r, change, echo)  # with --image: the new vLLM's parser, /dev/shm, the tokenizer
    restarts = ship.plan_restarts(r, passes=passes)
    job = gate_job(h, change, margin=margin, passes=passes, restarts=restarts.figures())
    if extra:
        job = job.model_copy(update={"figures": {**job.figures, **extra}})
    window = dict(kind="speculate", image=pipeline_image, expected_image_id=pipeline_image_id, command=command,
                  speculate=job, on_event=on_event)
    head = (f"{len(job.prompts)} prompts x {job.max_tokens} tokens at concurrency {job.levels}, {passes} passes "
            f"on each release, in the host's supervisor; keep if not slower than x{1 - margin:.3f}, else roll back")
    if r.dry_run:
        echo(f"# dry run: would measure the live release and the changed one ({change.describe()}): {head}")
        for line in restarts.lines():
            echo(f"# {line}")
        plan = run_window(r, **window)
        return {"verdict": "dry-run", "reason": "dry run: nothing measured, nothing changed", "release_plan": plan,
                "restarts": restarts.figures()}
    echo(f"gated release ({change.describe()}): {head}")
    for line in restarts.lines():
        echo(line)
    refuse_release(r, "release", change)  # before the lock: a release the host would refuse takes no lock
    window_id = new_window_id("release-gate")
    with under_lock(r, window_id, command, f"gated release: {change.describe()}"):
        r.run(hc.mkdir_p(job.results_dir))  # as the SSH user (the supervisor writes the attempt folder inside)
    res = run_window(r, held=window_id, **window)
    attempt = res.get("speculate")
    if not attempt:
        raise ship.SpeculateError(f"{h.name}: the gated release (window {res.get('window_id')}) ended without a "
                                  f"result: {res.get('outcome')}: {res.get('error')}")
    if attempt.get("verdict") == "error":
        raise ship.SpeculateError(f"{h.name}: {attempt.get('reason')}; {attempt.get('rollback') or 'no rollback'} "
                                  f"(window {res.get('window_id')}, outcome {res.get('outcome')}: {res.get('error')})")
    return {**attempt, "window_id": res.get("window_id"), "outcome": res.get("outcome"),
            "restarts_s": res.get("restarts_s"), "wall_s": round(time.monotonic() - t0, 1)}
