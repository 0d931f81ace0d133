"""``eagle3ops speculate HOST --run RUN``: ship a draft head as a speculative serving release, kept only when it
measured faster. The driver plans, uploads the head, starts the job and watches; the host's
supervisor carries the job out under the lock from start to end (:mod:`eagle3ops.supervisor.speculate`), so a
driver that dies at any point leaves the host to finish (``status``/``recover`` show where it is).

Driver side (reads and pure checks first; every change on the host, a ``--head`` upload into ``data_dir`` and the
inspect helper included, is made under the host's lock, taken once they passed and held by the window after):

1. **inspect** (read-only, in the pipeline image on the host: :mod:`.onhost`): the head's config, tensor shapes and
   sha256, the served target's ``config.json``, the run's train manifest and pipeline config, the gate prompts'
   disjointness from the run's training chats. :func:`.headcheck.check_head` refuses a misfit head; a train
   manifest whose ``offline_estimate.acceptance_length`` is below ``serving.acceptance_floor`` is refused unless
   ``force``.
2. **plan**: the :class:`~eagle3ops.config.plan.SpeculateJob` (the speculative release of the host's serving kind:
   :meth:`eagle3ops.window.kinds.DriverKind.speculative_change`; prompts in a fixed order, levels, passes, margin,
   floor) and the serving restarts with the downtime to expect from this host's recorded restarts
   (:func:`plan_restarts`), printed, in ``--dry-run`` too, after the gate's power at x1.30 for the configured passes
   at this host's recorded pass CV (:mod:`.power`): below 80 % the job is refused before anything is written on the
   host, naming the passes needed, unless ``--accept-low-power`` (``serving.gate_accept_low_power``). The prompts:
   HumanEval's gate split, or every prompt of ``--prompts-file`` (:func:`select_gate`; e.g. held-out chat turns
   rendered with the served chat template).
3. ``run_window(kind="speculate", held=...)``: preflight, plan, supervisor, under the lock taken before step 1's
   writes; watched to its result. A refusal before the supervisor starts releases the lock.

Host side (the supervisor): record → baseline (``serving.gate_passes`` passes, at least 3) → the speculative
release (health-gated; a failed gate rolls back) → its measurement (with vLLM's spec-decode counters as deltas) →
:func:`.decide.decide` (a 90 % interval of the throughput ratio; baseline drift; TTFT bound) → keep, or switch back
to the release live before. Results: one folder per attempt, ``<data_dir>/runs/<run>/speculate/<sha256[:16]>/
<window_id>/`` (``result.json``, ``baseline.json``, ``speculative.json``), a copy of the newest at
``runs/<run>/speculate/result.json`` for the run's own head (:mod:`eagle3ops.report` reads it) or at
``runs/<run>/speculate/<sha256[:16]>/result.json`` for a head from elsewhere (never over the run's own), and the
window's audit line with the verdict and figures, all written under the lock.

A head from elsewhere (``--head``) is estimated before any restart on the run's held-out hidden states on the host
(:mod:`eagle3ops.stages.estimate`, in the inspect helper) and refused below ``serving.acceptance_floor``, or when
it cannot be estimated there, unless ``force`` (:func:`check_offline_floor`).

Like for like: a speculative image other than the live one is refused before anything changes, naming
both, unless ``control`` (``--control``): the job then measures a control release, the speculative image without
``--speculative-config``, as its baseline (:func:`check_like_for_like`; the host checks the measured releases'
identities again, :mod:`eagle3ops.gate.like`). Server flags a speculative image needs (``--arg``, e.g. vLLM 0.32's
``--block-size=32`` on CPU) are set on the speculative release and its control alike (:func:`with_server_args`);
they need ``--control`` (:func:`check_server_args`).

Refused before anything is read from serving: a negative margin without the test-only switch
(:func:`eagle3ops.config.inventory.check_gate_margin`), and a stand-in serving image on a host that is not a
sandbox (:mod:`eagle3ops.window.standin`; the window checks it again).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import yaml

from eagle3ops import redact
from eagle3ops.config.inventory import check_gate_margin
from eagle3ops.config.plan import Candidate, ReleaseChange, SpeculateJob
from eagle3ops.commands import docker as dk
from eagle3ops.commands import runtime as rt
from eagle3ops.commands import host as hc
from eagle3ops.commands import speculate as sc
from eagle3ops.speculate import prompts as pr
from eagle3ops.speculate.prompts import GATE_FRACTION
from eagle3ops.gate.decide import MIN_PASSES, block_passes
from eagle3ops.gate.like import control_change
from eagle3ops.speculate.crossread import check_as_serving_reads, image_vllm
from eagle3ops.speculate.headcheck import HeadMismatch, check_head
from eagle3ops.speculate.headhost import dry_run_head, inspect_on_host, upload_head
from eagle3ops.speculate.prechecks import (SpeculateError, SpeculateOptions, _live_image, check_as_vllm_reads,
                                           check_like_for_like, check_offline_floor, check_server_args,
                                           check_template, check_live_release, offline_estimate_for,
                                           with_server_args)
from eagle3ops.speculate.power import power_plan
from eagle3ops.speculate.restarts import (RestartPlan, design_for, parse_results, recorded_restart_seconds,
                                          restart_plan, restarts_for)
from eagle3ops.window.served_template import ServedTemplateError, read_served_template

__all__ = ["GATE_FRACTION", "SpeculateError", "SpeculateOptions", "check_as_vllm_reads", "check_like_for_like",
           "check_offline_floor", "check_template", "gate_prompts", "offline_estimate_for",
           "prompt_sets", "select_gate", "speculate", "check_server_args", "with_server_args"]

def gate_prompts(n: int) -> list[pr.Prompt]:
    """The first ``n`` HumanEval prompts (file order) of the gate split."""
    _, gate = pr.split_by_id(pr.humaneval(), GATE_FRACTION)
    return gate[:n]


def select_gate(opts: SpeculateOptions, count: int) -> tuple[list[pr.Prompt], dict[str, Any]]:
    """The prompts the gate replays and the record of where they came from (the result's ``prompts`` figures):
    every prompt of ``opts.prompts_file`` in file order, with the file's path and sha256 (then, with
    ``opts.with_humaneval``, the first ``count`` of HumanEval's gate split as set ``code``), else the first
    ``count`` of HumanEval's gate split (:func:`gate_prompts`). Pure apart from reading the file; runs before anything is
    read from the host.

    Raises:
        SpeculateError: the prompts file is unusable (the message names the file and line and the fix), or
            HumanEval's data is missing.
    """
    if opts.prompts_file is None:
        try:
            return gate_prompts(count), {"source": "HumanEval gate split", "fraction": GATE_FRACTION}
        except pr.GatePromptsError as e:
            raise SpeculateError(str(e)) from None
    try:
        prompts = pr.from_jsonl(opts.prompts_file)
    except pr.GatePromptsError as e:
        raise SpeculateError(f"--prompts-file: {e}") from None
    import hashlib

    source = {"source": "prompts file", "file": str(opts.prompts_file),
              "file_sha256": hashlib.sha256(opts.prompts_file.read_bytes()).hexdigest()}
    if opts.with_humaneval:
        if any(p.set == "code" for p in prompts):
            raise SpeculateError(f"--prompts-file {opts.prompts_file}: its prompts are in set \"code\", the name "
                                 "--with-humaneval gives HumanEval's gate split; name the file's set otherwise "
                                 "(a `set` field, or the file's stem)")
        try:
            code = gate_prompts(count)
        except pr.GatePromptsError as e:
            raise SpeculateError(str(e)) from None
        prompts = prompts + code
        source = {**source, "source": "prompts file + HumanEval gate split", "fraction": GATE_FRACTION,
                  "humaneval_prompts": len(code)}
    return prompts, source


def prompt_sets(prompts: list[pr.Prompt]) -> dict[str, list[int]]:
    """Set name -> indices of its prompts in the gate's fixed order (first appearance order of the names)."""
    out: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        out.setdefault(p.set, []).append(i)
    return out


def _ensure_image(r: Any, image: str, echo: Callable[[str], None], push: Callable[[str, Any], str]) -> str:
    if r.run(dk.image_id(r.host, image), check=False).ok:
        return "present"
    echo(f"pushing {image} to {r.host.name}")
    return push(image, r.host)


def speculative_change(h: Any, head_dir: str, k: int, image: str, draft_tp: int | None = None,
                       vllm: str | None = None) -> ReleaseChange:
    """The speculative release of host ``h``'s serving kind (:meth:`eagle3ops.window.kinds.DriverKind.
    speculative_change`): a container gets ``--speculative-config``, the patched ``image`` and the head mounted
    read-only at :data:`sc.HEAD_MOUNT`; a process gets ``--speculative-config`` naming the head's host path.
    ``vllm``: the serving vLLM's version (:func:`serving_vllm`), which chooses the config's keys on CPU."""
    from eagle3ops.window.kinds import driver_kind

    return driver_kind(h).speculative_change(h, head_dir, k, image, draft_tp, vllm)


def serving_vllm(r: Any, image: str, serves_image: bool) -> dict[str, Any]:
    """The vLLM version the speculative release will serve, as a fact for its speculative config
    (:func:`eagle3ops.commands.speculate.speculative_args`) and the cross-version checks: ``{"vllm": version or
    None, "from": where it was read}``; read-only. A container's is the serving ``image``'s label
    (:func:`eagle3ops.speculate.crossread.image_vllm`); a process serves its own vLLM, read from live serving's
    ``/version`` (:func:`eagle3ops.window.servedversion.served_version`)."""
    if serves_image:
        version, where = image_vllm(r, image)
        return {"vllm": version, "from": where}
    from eagle3ops.window.servedversion import served_version

    return {"vllm": served_version(r), "from": "/version of the live server (a process serves no image)"}


def cross_version_checks(r: Any, opts: SpeculateOptions, image: str, vllm: dict[str, Any],
                         echo: Callable[[str], None]) -> dict[str, Any]:
    """The checks ``release --image`` runs before a restart (:func:`eagle3ops.speculate.upgrade.speculate_checks`:
    the new vLLM's parser over production's command line, ``/dev/shm``, the tokenizer), for the speculative release
    as it will run: the serving ``image``, the ``--arg`` flags and ``--speculative-config`` (for ``k`` 3: the
    parser reads the config as one string, whatever ``k``), when ``vllm`` (:func:`serving_vllm`) is not live
    serving's. Read-only; before anything is written on the host.

    Returns:
        figures for the result (``cross_version`` and what was checked).

    Raises:
        SpeculateError: a check refuses (naming the flag, ``/dev/shm`` or the tokenizer, and the fix), or an
            ``--arg`` flag the speculative release sets itself (:func:`with_server_args`).
    """
    from eagle3ops.speculate.upgrade import speculate_checks

    h = r.host
    change = speculative_change(h, f"{h.data_dir}/runs/{opts.run}/train/final", 3, image, None, vllm["vllm"])
    return speculate_checks(r, with_server_args(h.name, change, opts.args), vllm["vllm"], echo)


def window_results(r: Any) -> list[dict[str, Any]]:
    """Every window result recorded on ``r``'s host (read-only; runs in ``--dry-run`` too)."""
    from eagle3ops.window.common import paths

    out = r.run(hc.window_results(paths(r.host)["windows"]), check=False)
    return parse_results(out.stdout or "")


def plan_restarts(r: Any, control: bool = False, candidates: int = 0,
                  results: list[dict[str, Any]] | None = None, passes: int | None = None) -> RestartPlan:
    """The serving restarts of a speculate job on ``r``'s host and the downtime to expect, from the restarts its
    windows recorded (:mod:`eagle3ops.speculate.restarts`; read-only, runs in ``--dry-run`` too), in the design
    ``serving.gate_design`` asks for (:func:`~eagle3ops.speculate.restarts.design_for`,
    :func:`~eagle3ops.speculate.restarts.restarts_for`). ``control``: the job switches to a control release
    first; ``candidates``: several candidates, each one switched to before the winner's confirmation (one more
    restart each, on both paths); ``results``: the host's window results when already read
    (:func:`window_results`); ``passes``: per side (default ``serving.gate_passes``), for the printed order."""
    design = design_for(r.host.serving.gate_design, candidates)
    keep, rollback = restarts_for(design, control=control, candidates=candidates)
    return restart_plan(recorded_restart_seconds(window_results(r) if results is None else results),
                        bound_s=float(r.host.serving.health_timeout_s), keep=keep, rollback=rollback, design=design,
                        block_passes=block_passes(passes or r.host.serving.gate_passes, design))


def needs_control(r: Any) -> bool:
    """Whether a speculate job on ``r``'s host, with the inventory's images, must measure a control release
    (``--control``): its speculative image (``serving.speculative_image``) is not the live serving container's, by
    image id where the host has both, else by reference (:func:`check_like_for_like`'s comparison); read-only. A
    process serves no image, and no serving container found leaves the decision to the job (False)."""
    h = r.host
    image = h.serving.speculative_image or h.serving.image
    if not image or not speculative_change(h, "", 3, image).image:
        return False
    live_ref, live_id = _live_image(r)
    if live_ref is None and live_id is None:
        return False
    got = r.run(dk.image_id(h, image), check=False)
    spec_id = got.stdout.strip() if got.ok else ""
    return not (live_id == spec_id if live_id and spec_id else live_ref == image)


def speculate(r: Any, opts: SpeculateOptions, *, echo: Callable[[str], None] = print,
              on_event: Callable[[dict[str, Any]], None] | None = None,
              push: Callable[[str, Any], str] | None = None) -> dict[str, Any]:
    """Ship a head behind the keep-or-rollback gate (see the module doc); returns the result written to
    ``<data_dir>/runs/<run>/speculate/result.json`` (a head from elsewhere: its own folder's ``result.json``).

    Raises:
        SpeculateError: refused before anything changed (misfit head, low offline estimate without ``force``, gate
            prompts trained on, baseline not measurable), or the speculative release could not be measured (then
            rolled back first).
        eagle3ops.window.WindowError: a window failed to run (its own message: lock, preflight, supervisor), or the
            host has ``serving: none`` or cannot switch serving (refused before anything is done).
    """
    from eagle3ops.window.kinds import require_switchable
    from eagle3ops.window.common import new_window_id
    from eagle3ops.window.run import run_window, under_lock

    require_switchable(r, "speculate")  # read-only, before anything is written on the host
    if not rt.for_host(r.host).engine:  # its gate helper (inspect, measure) runs in a container of the pipeline image
        raise SpeculateError(f"{r.host.name}: speculate on a `stage_runtime: venv` host (no container engine) is not "
                             f"done yet: its on-host gate helper runs in a container of the pipeline "
                             f"image; nothing was done")
    n_candidates = check_candidate_options(r.host.name, opts)  # before anything is read from the host
    check_server_args(r.host.name, opts)
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
    accept_low_power = opts.accept_low_power or s.gate_accept_low_power
    if passes < MIN_PASSES:
        raise SpeculateError(f"{h.name}: {passes} gate passes: the decision needs at least {MIN_PASSES} per side")
    floor = s.acceptance_floor if opts.acceptance_floor is None else opts.acceptance_floor
    max_tokens = opts.max_tokens or s.gate_max_tokens
    image = opts.serving_image or s.speculative_image or s.image
    gate, source = select_gate(opts, opts.prompts or s.gate_prompts)
    serves_image = bool(speculative_change(h, run_dir, 3, image).image)
    like = check_live_release(r, opts, image, gate, serves_image=serves_image)
    vllm = serving_vllm(r, image, serves_image)  # read-only: its label chooses the speculative config's keys
    upgrade = cross_version_checks(r, opts, image, vllm, echo)  # read-only: a speculative image of another vLLM
    restarts, power = _restarts_and_power(r, opts, candidates=n_candidates, passes=passes, margin=margin,
                                          accept_low_power=accept_low_power, echo=echo)

    # every write and launch from here on is made under the host's lock, taken after the reads and pure checks
    # above (the head's upload, the inspect helper, the results' folder, the image push); a refusal before the
    # window's supervisor starts releases it
    window_id = new_window_id("speculate")
    message = f"speculate run {opts.run}" + (f", head {opts.head}" if opts.head else "")
    with under_lock(r, window_id, opts.command, message):
        job = _inspect_and_plan(r, opts, run_dir=run_dir, image=image, gate=gate, source=source, margin=margin,
                                floor=floor, max_tokens=max_tokens, passes=passes, restarts=restarts, power=power,
                                like=like, vllm=vllm, echo=echo)
        if not r.dry_run:
            # 2.-6. the host's supervisor carries out the whole job under the lock; this driver only watches it
            for line in restarts.lines():
                echo(line)
            if job.change.image:
                job.figures["image_push"] = _ensure_image(r, job.change.image, echo, push)
            r.run(hc.mkdir_p(job.results_dir))  # as the SSH user (the supervisor writes the attempt folder inside)
    job.figures.update(upgrade)
    if r.dry_run:
        return _dry(r, opts, job, restarts, run_window, on_event, echo, window_id)
    res = run_window(r, kind="speculate", image=opts.pipeline_image, expected_image_id=opts.pipeline_image_id,
                     command=opts.command, run=opts.run, speculate=job, on_event=on_event, held=window_id)
    attempt = res.get("speculate")
    if not attempt:
        raise SpeculateError(f"{h.name}: the speculate job (window {res.get('window_id')}) ended without a result: "
                             f"{res.get('outcome')}: {res.get('error')}")
    if attempt.get("verdict") == "error":
        raise SpeculateError(f"{h.name}: {attempt.get('reason')}; {attempt.get('rollback') or 'no rollback'} "
                             f"(window {res.get('window_id')}, outcome {res.get('outcome')}: {res.get('error')})")
    return {**attempt, "window_id": res.get("window_id"), "outcome": res.get("outcome"),
            "restarts_s": res.get("restarts_s"), "wall_s": round(time.monotonic() - t0, 1)}


def _restarts_and_power(r: Any, opts: SpeculateOptions, *, candidates: int, passes: int, margin: float,
                        accept_low_power: bool, echo: Callable[[str], None]) -> tuple[RestartPlan, Any]:
    """(restarts, power) of :func:`speculate`, from this host's recorded windows (read-only): the plan's restarts
    and expected downtime (:func:`plan_restarts`) and the gate's power at ``passes`` and ``margin``
    (:func:`eagle3ops.speculate.power.power_plan`), its lines echoed.

    Raises:
        SpeculateError: the gate is too weak to keep a good head (and ``accept_low_power`` is off); refused here,
            before anything is written on the host.
    """
    recorded = window_results(r)
    restarts = plan_restarts(r, control=opts.control, candidates=candidates, results=recorded, passes=passes)
    power = power_plan(recorded, passes=passes, margin=margin, accepted=accept_low_power, candidates=candidates,
                       design=restarts.design)
    for line in power.lines():
        echo(f"# {line}" if r.dry_run else line)
    if (refused := power.refusal(r.host.name)) is not None:
        raise SpeculateError(refused)
    return restarts, power


def _inspect_and_plan(r: Any, opts: SpeculateOptions, *, run_dir: str, image: str, gate: list[pr.Prompt],
                      source: dict[str, Any], margin: float, floor: float, max_tokens: int, passes: int,
                      restarts: RestartPlan, power: Any, like: dict[str, Any], vllm: dict[str, Any],
                      echo: Callable[[str], None]) -> SpeculateJob:
    """Step 1 of :func:`speculate`, under the host's lock: the results' folder and a ``--head`` upload, the inspect
    helper on the host and the checks of its answer (head fit, as vLLM reads it, offline floor, chat template, gate
    prompts' disjointness), then the job (pure). In a dry run with ``--head`` the head is checked here, not uploaded
    (the job carries a placeholder digest); in a dry run the job's summary is echoed. ``vllm``: the serving vLLM
    (:func:`serving_vllm`), for the speculative config's keys and the result's figures.

    Raises:
        SpeculateError: the run has no trained head, the head or target cannot be read, a check refuses.
    """
    from eagle3ops.gate.replay import endpoints

    h = r.host
    # 1. inspect and check (read-only, except a --head upload into data_dir and the results' folder, made here as
    # the SSH user: a bind mount of a missing run dir would make Docker create it as root)
    r.run(hc.mkdir_p(f"{run_dir}/speculate"))
    head_dir, digest = upload_head(r, opts.head) if opts.head else (f"{run_dir}/train/final", None)
    if r.dry_run and opts.head:  # not uploaded in a dry run: nothing on the host to inspect
        dry_run_head(r, opts, head_dir, echo)
        job = _job(opts, h, run_dir, head_dir, digest or "0" * 64, 3, image, [p.request for p in gate], margin, floor,
                   max_tokens, passes, {"serving_vllm": vllm}, prompt_sets(gate), vllm=vllm["vllm"])
        return job
    info = inspect_on_host(r, opts, run_dir=run_dir, head_dir=head_dir, gate=gate)
    try:
        facts = check_head(info["head_config"], info["shapes"], info["target_config"])
        read_as = check_as_vllm_reads(info, facts, own_run=not opts.head)
        read_as += check_as_serving_reads(r, image, head_dir, info, facts.target_layers)  # another vLLM serving it
    except HeadMismatch as e:
        raise SpeculateError(f"{h.name}: {e}") from None
    offline, floor_warnings = check_offline_floor(h, opts, info, floor)
    try:
        served = read_served_template(r)
    except ServedTemplateError as e:
        raise SpeculateError(str(e)) from None
    template_warnings = check_template(h, opts, info, served)
    warnings = list(facts.warnings) + read_as + floor_warnings + template_warnings
    disjoint = info.get("disjointness") or {}
    if disjoint.get("error") or disjoint.get("contained_in_training"):
        raise SpeculateError(f"{h.name}: gate prompts overlap run {opts.run}'s training chats: "
                             f"{disjoint.get('error') or disjoint.get('contained_in_training')}")
    if digest is None:
        digest = info.get("head_sha256")
        if not digest:
            raise SpeculateError(f"{h.name}: the pipeline image {opts.pipeline_image} does not report the head's "
                                 "sha256 (it predates speculate's attempt folders): rebuild and deploy it")
    ttt = None
    if info.get("pipeline_yaml"):
        ttt = ((yaml.safe_load(info["pipeline_yaml"]) or {}).get("train") or {}).get("ttt_steps")
    k = int(ttt or 3)
    figures: dict[str, Any] = {"head_source": str(opts.head or "run"), "serving_image": image,
                               "num_speculative_tokens": k,
                               "server_args": redact.argv(list(opts.args), h.secret_env), "serving_vllm": vllm,
                               "prompts": {**source, "count": len(gate), "max_tokens": max_tokens,
                                           "endpoints": endpoints([p.request for p in gate]),
                                           "disjointness": disjoint, "order": [p.id for p in gate],
                                           "sets": {n: len(ix) for n, ix in prompt_sets(gate).items()}},
                               "head_check": facts.__dict__, "offline_estimate": offline,
                               "offline_estimate_record": (info.get("estimate") if opts.head else
                                                           (info.get("train_manifest") or {}).get("offline_estimate")),
                               "force": opts.force, "warnings": warnings, "restarts": restarts.figures(),
                               "power": power.figures(), "like": like}
    job = _job(opts, h, run_dir, head_dir, digest, k, image, [p.request for p in gate], margin, floor, max_tokens,
               passes, figures, prompt_sets(gate), vllm=vllm["vllm"])
    if r.dry_run:
        echo(f"# dry run: head checked ({facts.__dict__}); would measure {len(gate)} prompts x {max_tokens} tokens "
             f"at concurrency {job.levels}, {passes} passes, on both releases, in the host's supervisor"
             + (f"; the baseline is a control release ({image} without --speculative-config)" if job.control
                else ""))
    return job


#: Most candidates one speculate job measures: each costs a serving restart and a measurement, and on a ``process``
#: host each switch (and each failed gate's rollback) is one of the restore agent's at most 20 rounds.
MAX_CANDIDATES = 6


def check_candidate_options(name: str, opts: SpeculateOptions) -> int:
    """``--method``/``--k``/``--draft-tp`` checked before anything is read from host ``name`` (pure); returns how
    many candidates they give (``--k`` empty counts as the head's one ``k``; ``--draft-tp`` multiplies the EAGLE-3
    candidates only: n-gram has no draft model).

    Raises:
        SpeculateError: an unknown method or none, a ``k`` below 1 or above 8, a draft TP below 1, a method, ``k``
            or draft TP given twice, or more than :data:`MAX_CANDIDATES` candidates; the message names the option
            and the fix.
    """
    bad = [m for m in opts.methods if m not in sc.METHODS]
    if bad or not opts.methods:
        raise SpeculateError(f"{name}: --method {','.join(bad) or '(none)'}: name one or more of "
                             f"{', '.join(sc.METHODS)}, comma-separated (e.g. --method eagle3,ngram)")
    if any(not 1 <= x <= 8 for x in opts.ks):
        raise SpeculateError(f"{name}: --k {','.join(map(str, opts.ks))}: each speculative length from 1 to 8")
    if any(t < 1 for t in opts.draft_tps):
        raise SpeculateError(f"{name}: --draft-tp {','.join(map(str, opts.draft_tps))}: each draft tensor "
                             "parallelism at least 1 (vLLM 0.16 takes 1 or the target's TP)")
    twice = sorted({str(v) for vs in (opts.methods, opts.ks, opts.draft_tps) for v in vs if list(vs).count(v) > 1})
    if twice:
        raise SpeculateError(f"{name}: --method/--k/--draft-tp: {', '.join(twice)} given twice; name each once")
    if "eagle3" not in opts.methods:
        raise SpeculateError(f"{name}: --method {','.join(opts.methods)}: speculate ships the run's EAGLE-3 head and "
                             "measures other methods beside it (e.g. --method eagle3,ngram); to gate n-gram alone, "
                             "with no head: `eagle3ops release HOST --gate --image SPECULATIVE_IMAGE --arg "
                             "--speculative-config --arg '{\"method\": \"ngram\", \"num_speculative_tokens\": 3, "
                             "\"prompt_lookup_min\": 2, \"prompt_lookup_max\": 4}'`")
    n = (len(opts.methods) - 1 + max(1, len(opts.draft_tps))) * max(1, len(opts.ks))
    if n > MAX_CANDIDATES:
        raise SpeculateError(f"{name}: --method/--k/--draft-tp give {n} candidates; at most {MAX_CANDIDATES} in one "
                             "job (each is a serving restart and a measurement): measure fewer methods, lengths or "
                             "draft TPs")
    return n


def check_invocation(name: str, opts: SpeculateOptions) -> None:
    """Every option of a ``speculate`` on host ``name`` that is checked before the inventory is read or the host
    reached, in this order: ``margin`` (:func:`~eagle3ops.config.inventory.check_gate_margin`), the candidates
    (:func:`check_candidate_options`), the ``--arg`` flags (:func:`check_server_args`), ``with_humaneval`` only
    beside a ``prompts_file``, and the prompts file itself (:func:`select_gate`). Pure apart from reading the
    prompts file; ``opts.pipeline_image`` is not used.

    Raises:
        SpeculateError: the first option refused; the message names the option (``--margin``, ``--method``...) and
            the fix (the CLI exits 2 with it, a usage error).
    """
    if opts.margin is not None:
        try:
            check_gate_margin(opts.margin)
        except ValueError as e:
            raise SpeculateError(f"--margin: {e}") from None
    check_candidate_options(name, opts)
    check_server_args(name, opts)
    if opts.with_humaneval and opts.prompts_file is None:
        raise SpeculateError("--with-humaneval adds HumanEval's gate split beside a --prompts-file set; without "
                             "--prompts-file HumanEval's gate split is the gate's prompts already: drop "
                             "--with-humaneval")
    if opts.prompts_file is not None:  # the file alone, as the gate reads it before HumanEval's split is added
        select_gate(SpeculateOptions(run=opts.run, pipeline_image="", prompts_file=opts.prompts_file), 0)


def target_tp(h: Any) -> int:
    """The target's tensor parallelism as host ``h``'s serving flags give it (``--tensor-parallel-size N``, ``-tp
    N`` or ``--tensor-parallel-size=N``; vLLM's default 1)."""
    args = list(h.serving.args or [])
    for i, a in enumerate(args):
        if a.startswith("--tensor-parallel-size="):
            return int(a.split("=", 1)[1])
        if a in ("--tensor-parallel-size", "-tp") and i + 1 < len(args):
            return int(args[i + 1])
    return 1


def candidates_for(h: Any, opts: SpeculateOptions, head_dir: str, k: int, image: str,
                   vllm: str | None = None) -> list[Candidate]:
    """The speculative releases a job measures (pure): per speculative length of ``opts.ks`` (default the head's
    ``k``), one EAGLE-3 release per draft TP of ``opts.draft_tps`` (named ``eagle3-k<k>-dtp<t>``; none given: the
    target's, named ``eagle3-k<k>``) and one per other method (``ngram-k<k>``), each the host's serving kind's change
    (:meth:`eagle3ops.window.kinds.DriverKind.speculative_change` / ``ngram_change``; ``vllm``: the serving
    vLLM's version, :func:`serving_vllm`) with the ``--arg`` flags (:func:`with_server_args`).

    Raises:
        SpeculateError: from :func:`check_candidate_options`; a draft TP other than 1 or the target's TP
            (:func:`target_tp`: vLLM 0.16 refuses others), naming ``--draft-tp`` and ``serving.args``.
    """
    from eagle3ops.window.kinds import driver_kind

    check_candidate_options(h.name, opts)
    tp = target_tp(h)
    bad = [t for t in opts.draft_tps if t not in (1, tp)]
    if bad:
        raise SpeculateError(f"{h.name}: --draft-tp {','.join(map(str, bad))}: vLLM 0.16 runs the draft with TP 1 "
                             f"or the target's ({tp}, from hosts.{h.name}.serving.args); choose from 1,{tp}")
    kind = driver_kind(h)
    out = []
    for m in opts.methods:
        for x in list(opts.ks) or [k]:
            if m != "eagle3":
                out.append(Candidate(name=f"{m}-k{x}",
                                     change=with_server_args(h.name, kind.ngram_change(h, x, image, vllm), opts.args)))
                continue
            for t in list(opts.draft_tps) or [None]:
                out.append(Candidate(name=f"eagle3-k{x}" + (f"-dtp{t}" if t is not None else ""), change=
                                     with_server_args(h.name, speculative_change(h, head_dir, x, image, t, vllm),
                                                      opts.args)))
    return out


def _job(opts: SpeculateOptions, h: Any, run_dir: str, head_dir: str, digest: str, k: int, image: str,
         prompts: list[str], margin: float, floor: float, max_tokens: int, passes: int,
         figures: dict[str, Any], sets: dict[str, list[int]] | None = None, vllm: str | None = None) -> SpeculateJob:
    """The plan's :class:`~eagle3ops.config.plan.SpeculateJob` (pure): one speculative release, or with several
    candidates (:func:`candidates_for`; ``vllm``: the serving vLLM's version) all of them, ``change`` the first's
    until the host confirms the best."""
    s = h.serving
    results = f"{run_dir}/speculate/{digest[:16]}"
    # A head from elsewhere keeps its newest result in its own folder: the run's speculate/result.json (what the
    # run's report reads) stays the run's own head's.
    latest = f"{results}/result.json" if opts.head else f"{run_dir}/speculate/result.json"
    cands = candidates_for(h, opts, head_dir, k, image, vllm)
    change = cands[0].change
    control = (ReleaseChange(image=change.image, args=control_change(change.args))
               if opts.control and change.image else None)
    return SpeculateJob(run=opts.run, head=head_dir, head_sha256=digest, results_dir=results, latest=latest,
                        change=change, control=control, prompts=prompts, candidates=cands if len(cands) > 1 else [],
                        levels=list(s.gate_concurrency), max_tokens=max_tokens, passes=passes, margin=margin,
                        acceptance_floor=floor, ttft_ratio_max=s.gate_ttft_ratio_max,
                        warmup_prompts=min(s.gate_warmup_prompts, len(prompts)), prompt_sets=sets or {},
                        drain_hook=s.drain_hook, undrain_hook=s.undrain_hook, hook_timeout_s=s.hook_timeout_s,
                        traffic=s.gate_traffic,
                        design=design_for(s.gate_design, len(cands)), figures=figures)


def _dry(r: Any, opts: SpeculateOptions, job: SpeculateJob, restarts: RestartPlan, run_window: Any,
         on_event: Any, echo: Callable[[str], None], window_id: str) -> dict[str, Any]:
    """The dry run: the restarts and expected downtime, then the speculate window (printed by ``run_window``, under
    the lock of ``window_id`` the dry run recorded); no measurement, nothing changed."""
    for line in restarts.lines():
        echo(f"# {line}")
    plan = run_window(r, kind="speculate", image=opts.pipeline_image, expected_image_id=opts.pipeline_image_id,
                      command=opts.command, run=opts.run, speculate=job, on_event=on_event, held=window_id)
    return {"verdict": "dry-run", "reason": "dry run: nothing measured, nothing changed", "release_plan": plan,
            "speculative_change": job.change.model_dump(), "restarts": restarts.figures()}


def ensure_image(r: Any, image: str, echo: Callable[[str], None],
                 push: Callable[[str, Any], str] | None = None) -> str:
    """``image`` present on ``r``'s host, pushed when missing (``push``: :func:`eagle3ops.deployer.push_image` when
    None); returns ``present`` or the push's summary line (:func:`_ensure_image`)."""
    if push is None:
        from eagle3ops.deployer import push_image as push
    return _ensure_image(r, image, echo, push)
