"""``eagle3ops speculate HOST --run RUN``: ship a draft head as a speculative serving release, kept only when it
measured faster (issue 18).

Order (each step bounded; nothing on the host changes before step 3):

1. **inspect** (read-only, in the pipeline image on the host: :mod:`.onhost`): the head's config and tensor shapes,
   the served target's ``config.json``, the run's train manifest and pipeline config, the gate prompts'
   disjointness from the run's training chats. :func:`.headcheck.check_head` refuses a misfit head; a train
   manifest whose ``offline_estimate.acceptance_length`` is below ``serving.acceptance_floor`` is refused unless
   ``force``.
2. **baseline**: :func:`.replay.replay_level` at each ``serving.gate_concurrency`` level, ``serving.gate_passes``
   passes (at least 3; the prompts in one fixed order every pass, per-prompt figures kept), against the live
   release with the serving API key taken as the health gate takes it (:func:`.reach.serving_api_key`; sent in
   the helper's stdin, never argv), run on the host (``docker run --rm --network host <pipeline image>``, serving's port over the host's loopback:
   no network hop between the load generator and the server on either side).
3. **speculative release**: the patched serving image (``serving.speculative_image``; pushed with
   :func:`eagle3ops.deployer.push_image` when the host lacks it), the head bind-mounted read-only at
   :data:`~eagle3ops.commands.speculate.HEAD_MOUNT`, ``--speculative-config`` (eagle3, ``num_speculative_tokens`` =
   the run's ``train.ttt_steps``; ``disable_padded_drafter_batch`` on a CPU host), through
   ``run_window(kind="release")``: health-gated, rolled back by the supervisor when its gate fails.
4. **speculative measurement**: the same prompts and levels, with vLLM's spec-decode counters as deltas.
5. :func:`.decide.decide` (a 90 % interval of the throughput ratio; baseline drift; TTFT bound); anything but
   ``keep`` (or a failed measurement) → ``run_window(kind="rollback",
   to_release=<the baseline release>)``, health-gated.

Results: ``<data_dir>/runs/<run>/speculate/result.json`` (``verdict``, ``reason``, ``levels``, ``spec_decode`` and
the rest of the figures; :mod:`eagle3ops.report` reads it) and one audit line with the same figures. That file and
the head's upload (``--head``) are written outside a window's lock; they touch only ``<data_dir>``, never serving.

Refused before anything is read from serving: a negative margin without the test-only switch
(:func:`eagle3ops.config.inventory.check_gate_margin`), and a stand-in serving image on a host that is not a
sandbox (:mod:`eagle3ops.window.standin`; the release window checks it again).
"""

from __future__ import annotations

import getpass
import hashlib
import io
import json
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eagle3ops.config.inventory import check_gate_margin
from eagle3ops.config.plan import ReleaseChange
from eagle3ops.commands import docker as dk
from eagle3ops.commands import host as hc
from eagle3ops.commands import speculate as sc
from eagle3ops.speculate import prompts as pr
from eagle3ops.speculate.prompts import GATE_FRACTION
from eagle3ops.speculate.decide import MIN_PASSES, Decision, decide
from eagle3ops.speculate.headcheck import (HeadMismatch, check_head, check_vllm_reading, check_vocab_values,
                                           offline_acceptance)
from eagle3ops.speculate.metrics import SpecCounters, SpecDelta
from eagle3ops.speculate.onhost import parse_answer
from eagle3ops.speculate.replay import LevelResult

__all__ = ["GATE_FRACTION", "SpeculateError", "SpeculateOptions", "gate_prompts", "measure_on_host", "speculate"]

#: Bound on the inspect helper (pipeline image start + reading headers and chats), seconds.
INSPECT_TIMEOUT_S = 300.0


class SpeculateError(RuntimeError):
    """The head was refused before anything changed, or the gate could not run; the message says why and the fix."""


@dataclass(frozen=True)
class SpeculateOptions:
    """One ``speculate`` invocation.

    Attributes:
        run: the pipeline run (results go to ``<data_dir>/runs/<run>/speculate/``; its head is
            ``train/final`` unless ``head`` is given).
        pipeline_image, pipeline_image_id: the deployed pipeline image (runs the host-side gate and the windows).
        head: a local head directory (trained elsewhere): uploaded to ``<data_dir>/heads/<sha256[:12]>/``.
        serving_image: overrides ``serving.speculative_image``.
        force: accept a head whose offline acceptance estimate is below the floor.
        margin: overrides ``serving.gate_margin``; negative only with the test-only switch
            ``EAGLE3OPS_TEST_ALLOW_NEGATIVE_MARGIN=1`` (tests name one to exercise the keep branch).
        acceptance_floor: overrides ``serving.acceptance_floor`` (both the offline-estimate check and the gate).
        max_tokens, prompts, passes: override ``serving.gate_max_tokens`` / ``serving.gate_prompts`` /
            ``serving.gate_passes``.
        command: the command line, for the audit log.
    """

    run: str
    pipeline_image: str
    pipeline_image_id: str | None = None
    head: Path | None = None
    serving_image: str | None = None
    force: bool = False
    margin: float | None = None
    acceptance_floor: float | None = None
    max_tokens: int | None = None
    prompts: int | None = None
    passes: int | None = None
    command: str = "eagle3ops speculate"


def offline_estimate_for(opts: SpeculateOptions, info: dict[str, Any]) -> float | None:
    """The offline acceptance estimate that applies to the head being shipped: the run's train manifest's
    (:func:`~eagle3ops.speculate.headcheck.offline_acceptance`) for the run's own head; None for a head passed with
    ``head`` (trained elsewhere: the run's manifest describes another head)."""
    return None if opts.head else offline_acceptance(info.get("train_manifest"))


def check_as_vllm_reads(info: dict[str, Any], facts: Any, *, own_run: bool) -> list[str]:
    """The head as vLLM 0.16 reads it (issue 26, kind 5), from the inspect answer: its config through vLLM's own
    loader in the pipeline image (:func:`.headcheck.check_vllm_reading`; the run's train manifest says which aux
    layers it was trained on when the head is the run's own) and the values of ``d2t``/``t2d``
    (:func:`.headcheck.check_vocab_values`). Runs before any restart, in ``--dry-run`` too.

    Returns:
        warnings for checks that could not run (an image without vLLM, or older than this check).

    Raises:
        HeadMismatch: naming the head's key and what vLLM 0.16 would do instead.
    """
    warnings: list[str] = []
    view = info.get("vllm_view")
    if view and not view.get("error"):
        check_vllm_reading(info["head_config"], view, target_layers=facts.target_layers,
                           train_manifest=info.get("train_manifest") if own_run else None)
    else:
        warnings.append("the head's config was not read through vLLM's own loader (" + (
            (view or {}).get("error") or "the pipeline image predates this check: rebuild it") + ")")
    vocab = info.get("vocab")
    if vocab and vocab.get("d2t") is not None:
        check_vocab_values(vocab["d2t"], vocab.get("t2d"), target_vocab=facts.target_vocab_size)
    elif vocab is None:
        warnings.append("d2t/t2d values not checked (the pipeline image predates this check: rebuild it)")
    return warnings


def gate_prompts(n: int) -> list[pr.Prompt]:
    """The first ``n`` HumanEval prompts (file order) of the gate split."""
    _, gate = pr.split_by_id(pr.humaneval(), GATE_FRACTION)
    return gate[:n]


def _upload_head(r: Any, head: Path) -> str:
    """Upload a local head directory (its regular files) to ``<data_dir>/heads/<sha256[:12]>``; returns the path."""
    files = sorted(p for p in head.iterdir() if p.is_file())
    if not (head / "config.json").is_file():
        raise SpeculateError(f"{head}: no config.json; pass the head's directory (speculators' saved format)")
    digest = hashlib.sha256()
    for p in files:
        digest.update(p.name.encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    dest = f"{r.host.data_dir}/heads/{digest.hexdigest()[:12]}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in files:
            tar.add(p, arcname=p.name)
    r.run(hc.mkdir_p(dest))
    r.run(sc.untar_into(dest), stdin=buf.getvalue(), timeout=600)
    return dest


def measure_on_host(r: Any, image: str, prompts: list[str], levels: list[int], max_tokens: int, passes: int = 1,
                    api_key: str | None = None, request_timeout_s: float = 300.0
                    ) -> tuple[dict[int, list[LevelResult]], dict[int, SpecDelta]]:
    """Replay ``prompts`` (in this order, every pass) at each concurrency in ``levels``, ``passes`` times, against
    the host's serving port, from the host (:func:`eagle3ops.speculate.onhost.measure`). ``api_key`` goes in the
    helper's stdin (never argv).

    Returns:
        (concurrency -> its passes in order, concurrency -> spec-decode counter delta summed over its passes; each
        pass's delta runs from after its idle wait to after its last request).

    Raises:
        SpeculateError: the helper failed (server busy before a level, requests failing, timeout); bounded by
            ``120 + passes * len(levels) * (request_timeout_s + 150)`` seconds.
    """
    s = r.host.serving
    req = {"base_url": f"http://127.0.0.1:{s.port}", "model": s.served_model_name, "prompts": prompts,
           "levels": levels, "max_tokens": max_tokens, "passes": passes, "api_key": api_key,
           "request_timeout_s": request_timeout_s, "idle_timeout_s": 120}
    res = r.run(sc.gate_helper(r.host, image, "measure"), stdin=json.dumps(req), check=False,
                timeout=120 + passes * len(levels) * (request_timeout_s + 150))
    try:
        ans = parse_answer(res.stdout)
    except ValueError as e:
        raise SpeculateError(f"{r.host.name}: gate measurement failed: {res.stderr[-800:] or e}") from None
    out: dict[int, list[LevelResult]] = {}
    deltas: dict[int, SpecDelta] = {}
    for c, figs in ans["levels"].items():
        out[int(c)] = [LevelResult(**fig) for fig in figs]
        per_pass = []
        for pair in ans["counters"][c]:
            before, after = (SpecCounters(d["drafts"], d["draft_tokens"], d["accepted"],
                                          {int(k): v for k, v in d["accepted_per_pos"].items()},
                                          d["requests_running"]) for d in pair)
            per_pass.append(SpecDelta.between(before, after))
        deltas[int(c)] = _sum(per_pass)
    return out, deltas


def _sum(deltas: list[SpecDelta]) -> SpecDelta:
    pos: dict[int, float] = {}
    for d in deltas:
        for k, v in d.accepted_per_pos.items():
            pos[k] = pos.get(k, 0.0) + v
    return SpecDelta(sum(d.drafts for d in deltas), sum(d.draft_tokens for d in deltas),
                     sum(d.accepted for d in deltas), dict(sorted(pos.items())))


def _api_key(r: Any) -> str | None:
    """Serving's API key, taken as the health gate takes it (:func:`eagle3ops.speculate.reach.serving_api_key`)."""
    from eagle3ops.speculate.reach import RegenerateError, serving_api_key

    try:
        return serving_api_key(r)
    except RegenerateError as e:
        raise SpeculateError(str(e)) from None


def _current_release(r: Any) -> int | None:
    from eagle3ops.window.common import paths

    out = r.run(hc.cat_if_exists(f"{paths(r.host)['releases']}/current"), check=False)
    return int(out.stdout.strip()) if out.stdout.strip().isdigit() else None


def _ensure_image(r: Any, image: str, echo: Callable[[str], None], push: Callable[[str, Any], str]) -> str:
    if r.run(dk.image_id(r.host, image), check=False).ok:
        return "present"
    echo(f"pushing {image} to {r.host.name}")
    return push(image, r.host)


def speculative_change(h: Any, head_dir: str, k: int, image: str) -> ReleaseChange:
    """The speculative release: the live serving container plus ``--speculative-config`` (and on a CPU host the
    stand-in's settings), the patched serving ``image`` and the head mounted read-only at :data:`sc.HEAD_MOUNT`;
    everything else of the live container unchanged."""
    return ReleaseChange(args=sc.speculative_args(num_speculative_tokens=k, cpu=h.gpus == 0), image=image,
                         binds=[f"{head_dir}:{sc.HEAD_MOUNT}:ro"])


def _dry_release(r: Any, opts: SpeculateOptions, head_dir: str, k: int, image: str, run_window: Any,
                 on_event: Any) -> dict[str, Any]:
    """The dry run's release window (printed by ``run_window``); no measurement, no result written."""
    change = speculative_change(r.host, head_dir, k, image)
    rel = run_window(r, kind="release", image=opts.pipeline_image, expected_image_id=opts.pipeline_image_id,
                     command=opts.command, run=opts.run, change=change, on_event=on_event)
    return {"verdict": "dry-run", "reason": "dry run: nothing measured, nothing changed", "release_plan": rel,
            "speculative_change": change.model_dump()}


def speculate(r: Any, opts: SpeculateOptions, *, echo: Callable[[str], None] = print,
              on_event: Callable[[dict[str, Any]], None] | None = None,
              push: Callable[[str, Any], str] | None = None) -> dict[str, Any]:
    """Ship a head behind the keep-or-rollback gate (see the module doc); returns the result written to
    ``<data_dir>/runs/<run>/speculate/result.json``.

    Raises:
        SpeculateError: refused before anything changed (misfit head, low offline estimate without ``force``, gate
            prompts trained on, baseline not measurable), or the speculative release could not be measured (then
            rolled back first).
        eagle3ops.window.WindowError: a window failed to run (its own message: lock, preflight, supervisor), or the
            host has ``serving: none`` (refused before anything is done).
    """
    from eagle3ops.window.common import append_audit
    from eagle3ops.window.kinds import require_serving
    from eagle3ops.window.run import run_window
    from eagle3ops.window.standin import refuse_standin_image

    require_serving(r.host, "speculate")  # before anything is read or written on the host
    try:
        margin_override = None if opts.margin is None else check_gate_margin(opts.margin)
    except ValueError as e:
        raise SpeculateError(f"{r.host.name}: --margin: {e}") from None
    if push is None:
        from eagle3ops.deployer import push_image as push
    h, s = r.host, r.host.serving
    t0 = time.monotonic()
    run_dir = f"{h.data_dir}/runs/{opts.run}"
    margin = s.gate_margin if margin_override is None else margin_override
    passes = opts.passes or s.gate_passes
    if passes < MIN_PASSES:
        raise SpeculateError(f"{h.name}: {passes} gate passes: the decision needs at least {MIN_PASSES} per side")
    floor = s.acceptance_floor if opts.acceptance_floor is None else opts.acceptance_floor
    max_tokens = opts.max_tokens or s.gate_max_tokens
    image = opts.serving_image or s.speculative_image or s.image
    gate = gate_prompts(opts.prompts or s.gate_prompts)
    refuse_standin_image(r, image, "speculate")  # read-only; before anything is written on the host

    # 1. inspect and check (read-only, except a --head upload into data_dir and the results' folder, made here as
    # the SSH user: a bind mount of a missing run dir would make Docker create it as root)
    r.run(hc.mkdir_p(f"{run_dir}/speculate"))
    head_dir = _upload_head(r, opts.head) if opts.head else f"{run_dir}/train/final"
    if r.dry_run and opts.head:  # not uploaded in a dry run: nothing on the host to inspect
        echo(f"# dry run: {opts.head} would be uploaded to {head_dir} and checked against {h.model_path}")
        return _dry_release(r, opts, head_dir, 3, image, run_window, on_event)
    mount_run = r.run(hc.test_dir(run_dir), check=False).ok
    res = r.run(sc.gate_helper(h, opts.pipeline_image, "inspect", head_dir=head_dir,
                               run_dir=run_dir if mount_run else None),
                stdin=json.dumps({"gate": [{"id": p.id, "text": p.text} for p in gate]}), check=False,
                timeout=INSPECT_TIMEOUT_S)
    try:
        info = parse_answer(res.stdout)
    except ValueError:
        raise SpeculateError(f"{h.name}: cannot read the head at {head_dir} or the target at {h.model_path}: "
                             f"{res.stderr.strip()[-600:]}; train the run first (eagle3ops train) or pass "
                             "--head DIR") from None
    try:
        facts = check_head(info["head_config"], info["shapes"], info["target_config"])
        read_as = check_as_vllm_reads(info, facts, own_run=not opts.head)
    except HeadMismatch as e:
        raise SpeculateError(f"{h.name}: {e}") from None
    offline = offline_estimate_for(opts, info)
    warnings = list(facts.warnings) + read_as
    if opts.head:
        warnings.append(f"{opts.head}: a head from elsewhere has no offline acceptance estimate here: floor not "
                        "checked before release")
    elif offline is None:
        warnings.append("the train manifest has no offline acceptance estimate: floor not checked before release")
    elif offline < floor and not opts.force:
        raise SpeculateError(f"{h.name}: run {opts.run}: offline acceptance estimate {offline:.3f} is below the "
                             f"floor {floor} (serving.acceptance_floor); train longer, or pass --force "
                             "to measure it anyway")
    disjoint = info.get("disjointness") or {}
    if disjoint.get("error") or disjoint.get("contained_in_training"):
        raise SpeculateError(f"{h.name}: gate prompts overlap run {opts.run}'s training chats: "
                             f"{disjoint.get('error') or disjoint.get('contained_in_training')}")
    ttt = None
    if info.get("pipeline_yaml"):
        ttt = ((yaml.safe_load(info["pipeline_yaml"]) or {}).get("train") or {}).get("ttt_steps")
    k = int(ttt or 3)
    prompt_texts = [p.text for p in gate]
    levels = list(s.gate_concurrency)
    if r.dry_run:
        echo(f"# dry run: head checked ({facts.__dict__}); would measure {len(gate)} prompts x {max_tokens} tokens "
             f"at concurrency {levels}, {passes} passes, on both releases:")
        echo("#   " + " ".join(sc.gate_helper(h, opts.pipeline_image, "measure")))
        return _dry_release(r, opts, head_dir, k, image, run_window, on_event)

    # 2. baseline
    base_release = _current_release(r)
    echo(f"baseline: release {base_release}, {len(gate)} prompts x {max_tokens} tokens at concurrency {levels}, "
         f"{passes} passes")
    baseline, _ = measure_on_host(r, opts.pipeline_image, prompt_texts, levels, max_tokens, passes,
                                  _api_key(r))

    # 3. the speculative release
    pushed = _ensure_image(r, image, echo, push)
    msg = f"speculative release of run {opts.run}"
    rel = run_window(r, kind="release", image=opts.pipeline_image, expected_image_id=opts.pipeline_image_id,
                     command=opts.command, run=opts.run, change=speculative_change(h, head_dir, k, image),
                     on_event=on_event, message=msg)
    if rel.get("release_before") is not None:
        # What the release window's record step found live: differs from releases/current when serving was
        # recreated outside eagle3ops (then recorded as a new release), and is what a rollback must return to.
        base_release = rel["release_before"]
    figures: dict[str, Any] = {"run": opts.run, "head": head_dir, "head_source": str(opts.head or "run"),
                               "serving_image": image, "image_push": pushed, "num_speculative_tokens": k,
                               "baseline_release": base_release, "prompts": {"source": "HumanEval gate split",
                               "fraction": GATE_FRACTION, "count": len(gate), "max_tokens": max_tokens,
                               "disjointness": disjoint, "order": [p.id for p in gate]}, "gate_passes": passes,
                               "head_check": facts.__dict__, "offline_estimate": offline, "force": opts.force,
                               "release_window": rel.get("window_id"), "warnings": warnings}
    rollback_window = None
    if rel.get("outcome") != "ok":
        decision = Decision("rollback", f"the speculative release failed its health gate (window "
                                        f"{rel.get('window_id')}: {rel.get('error')}); the supervisor rolled back",
                            {"baseline_levels": {str(c): [b.figures() for b in bs] for c, bs in baseline.items()}})
    else:
        figures["speculative_release"] = rel.get("release")
        # 4. measure it; 5. decide. A failed measurement rolls back before the error is raised.
        try:
            speculative, deltas = measure_on_host(r, opts.pipeline_image, prompt_texts, levels, max_tokens,
                                                  passes, _api_key(r))
            total = _sum(list(deltas.values()))
            decision = decide(baseline, speculative, total, production_concurrency=levels[0], margin=margin,
                              acceptance_floor=floor, ttft_ratio_max=s.gate_ttft_ratio_max)
            decision.figures["spec_decode_per_level"] = {str(c): d.figures() for c, d in deltas.items()}
        except Exception as exc:
            rb = run_window(r, kind="rollback", image=opts.pipeline_image, expected_image_id=opts.pipeline_image_id,
                            command=opts.command, run=opts.run, to_release=base_release, on_event=on_event,
                            message="speculative release could not be measured")
            raise SpeculateError(f"{h.name}: measuring the speculative release failed ({exc}); rolled back to "
                                 f"release {rb.get('release')} (outcome {rb.get('outcome')})") from exc
        if not decision.keep:
            rb = run_window(r, kind="rollback", image=opts.pipeline_image, expected_image_id=opts.pipeline_image_id,
                            command=opts.command, run=opts.run, to_release=base_release, on_event=on_event,
                            message=f"speculation gate: {decision.verdict}")
            rollback_window = {"window_id": rb.get("window_id"), "outcome": rb.get("outcome"),
                               "release": rb.get("release")}
    result = {"host": h.name, "verdict": decision.verdict, "reason": decision.reason, **decision.figures,
              **figures, "rollback_window": rollback_window, "live_release": _current_release(r),
              "wall_s": round(time.monotonic() - t0, 1)}
    r.run(hc.write_file(f"{run_dir}/speculate/result.json"), stdin=json.dumps(result, indent=2) + "\n")
    append_audit(r, {"user": getpass.getuser(), "host": h.name, "command": opts.command, "kind": "speculate",
                     "run": opts.run, "verdict": decision.verdict, "reason": decision.reason,
                     "figures": {k: result.get(k) for k in ("throughput_ratio", "interval", "drift", "passes",
                                                            "ttft_ratio", "ttft_ratio_max", "deciding",
                                                            "spec_decode", "levels", "margin",
                                                            "margin_is_negative_test_setting", "acceptance_floor",
                                                            "production_concurrency", "live_release",
                                                            "baseline_release", "speculative_release")}})
    return result
