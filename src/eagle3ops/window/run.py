"""One window end to end (driver side): lock → preflight → plan → upload → launch → watch → finish; and relaunch."""

from __future__ import annotations

import contextlib
import getpass
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from eagle3ops.commands import docker as dk
from eagle3ops.commands import host as hc
from eagle3ops.commands import runtime as rt
from eagle3ops.commands import serving as sv
from eagle3ops.commands import stages as st
from eagle3ops.commands import weights as wc
from eagle3ops.config.plan import Plan, ReleaseChange, SpeculateJob
from eagle3ops.remote import Remote, RemoteError, render
from eagle3ops.window.common import (LockHeld, PreflightFailed, WindowError, append_audit, hint, new_window_id,
                                     paths)
from eagle3ops.window.lock import _serving_ok, acquire_lock, describe_lock, read_lock, release_lock, supervisor_alive
from eagle3ops.window.gpucheck import estimate_gpu_memory
from eagle3ops.window.kinds import driver_kind, require_serving, require_switchable
from eagle3ops.window.planner import StageDecision, build_plan, decide_stages, supervisor_commands
from eagle3ops.window.preflight import (Preflight, ask_engine, check_fallbacks, engine_status, estimate_disk,
                                        preflight, read_run_state, rollback_plan)
from eagle3ops.window.served_template import SERVED_FILE, ServedTemplate, ServedTemplateError, read_served_template, \
    resolve_config
from eagle3ops.window.arch import refuse_foreign_image
from eagle3ops.window.standin import refuse_standin_image
from eagle3ops.window.watch import finish_window, remove_left_supervisors, watch


def launch(r: Remote, plan: Plan, image: str) -> None:
    """Write the plan on the host and start the detached supervisor container; first what the serving kind needs on
    the host before it (:meth:`eagle3ops.window.kinds.DriverKind.launch`: for process and systemd serving, the record
    and the host-side restore agent)."""
    p = paths(r.host, plan.window_id)
    r.run(hc.mkdir_p(r.host.data_dir))
    r.run(hc.mkdir_p(p["window"]))
    # the supervisor needs the change's and the stages' environment values as given (they may be secrets): private
    r.run(hc.write_private_file(p["plan"]), stdin=plan.model_dump_json(indent=2))
    driver_kind(r.host).launch(r, plan)  # e.g. a restore agent, before the supervisor that talks with it
    r.run(rt.for_host(r.host).supervisor_argv(r.host, image=image, window_id=plan.window_id, plan_path=p["plan"],
                                              detach=plan.agent_detach))



def relaunch(r: Remote, window_id: str, fallback_image: str | None = None) -> bool:
    """Restart the supervisor of an interrupted window, which resumes from its journal (done stages are skipped,
    serving is restored and health-gated). Returns False, doing nothing, when the window already has a result
    with serving running; a result that says serving is *not* running is moved aside and the restore retried.

    The supervisor image is the one the window's stages ran in (``fallback_image`` for release/rollback plans).

    Raises:
        WindowError: the supervisor still runs (use ``attach``), the window does not hold the host's lock (it never
            started, or another run holds it), or a plan without stages and no ``fallback_image``.
        RemoteError: the plan cannot be read or the supervisor cannot be started.
    """
    h, p = r.host, paths(r.host, window_id)
    res = r.run(hc.cat_if_exists(p["result"]), check=False).stdout
    if res.strip() and _serving_ok(json.loads(res)):
        return False
    if supervisor_alive(r, window_id):
        raise WindowError(f"window {window_id}: its supervisor is still running; follow it with "
                          f"{hint('attach', h.name)}")
    lock = read_lock(r)
    if not lock or lock.get("window_id") != window_id:
        holder = f"the lock is held by window {lock.get('window_id')}" if lock else "the lock is free"
        raise WindowError(f"window {window_id} does not hold the lock of {h.name} ({holder}): it never started "
                          f"or it finished; nothing to recover")
    plan = json.loads(r.run(hc.cat(p["plan"])).stdout)
    image = plan["stages"][0]["spec"]["image"] if plan["stages"] else fallback_image
    if not image:
        raise WindowError(f"window {window_id} has no stages and no deployed image to run its supervisor with")
    if res.strip():
        r.run(hc.mv(p["result"], f"{p['result']}.{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"))
    runtime = rt.for_host(h)
    if (remove := runtime.supervisor_rm(h, window_id)) is not None:  # the exited container, by its name
        r.run(remove, check=False)
    r.run(runtime.supervisor_argv(h, image=image, window_id=window_id, plan_path=p["plan"],
                                  detach=plan.get("agent_detach", "setsid")))
    return True



def refuse_release(r: Remote, kind: str, change: ReleaseChange | None) -> None:
    """The refusals of a ``release``/``rollback``/``speculate`` window that need no lock (reads only): a host with
    ``serving: none``, a change the serving kind cannot make or a host where it cannot switch serving
    (:meth:`~eagle3ops.window.kinds.DriverKind.host_refusal`), a stand-in image on a host that is not a sandbox, an
    image built for another CPU architecture.

    Raises:
        WindowError: the refusal, naming the host and the fix.
    """
    require_serving(r.host, kind)
    refusal = driver_kind(r.host).release_refusal(r.host, change)
    if refusal:
        raise WindowError(refusal)
    require_switchable(r, kind)
    if change is not None and change.image:
        refuse_standin_image(r, change.image, f"{kind} --image")
        foreign = refuse_foreign_image(r, change.image, f"{kind} --image")
        if foreign:
            raise WindowError(foreign)


@contextlib.contextmanager
def under_lock(r: Remote, window_id: str, command: str, message: str = "", *, take: bool = True) -> Iterator[None]:
    """Hold the host's deploy lock for window ``window_id`` over the ``with`` block: every write and launch of a
    window goes inside it (ARCHITECTURE.md: facts → checks → plan → lock → writes → launch).

    On leaving normally the lock stays: the window's supervisor releases it when it ends (or the block released it
    itself, a window with nothing to do). When the block raises before the supervisor started, the lock is released
    (one ``rm``) and an audit line says ``not started``; after the supervisor started, the error becomes a
    :class:`WindowError` naming ``attach`` (the window goes on there and owns the lock); when the host cannot be
    asked whether it started, the lock stays (``status`` reports it stale later). A dry run records the lock's
    commands without running them (a lock held by someone else is reported first). ``take=False``: the caller took
    the lock for ``window_id`` already (and left its own block); only the clean-up after a failure applies.

    Raises:
        LockHeld: another run holds the lock (nothing done).
        WindowError: the lock could not be taken, or the block failed after the window's supervisor started.
    """
    if take:
        if r.dry_run and read_lock(r):
            raise LockHeld(describe_lock(r))
        acquire_lock(r, window_id, command, message)
    try:
        yield
    except BaseException as exc:
        started = None if r.dry_run else _started(r, window_id)
        if started:
            raise WindowError(f"{r.host.name}: the driver failed after window {window_id} started on the host "
                              f"({exc}); it goes on there: {hint('attach', r.host.name)}") from exc
        if started is False:
            release_lock(r, window_id)
            append_audit(r, {"user": getpass.getuser(), "host": r.host.name, "command": command,
                             "window": window_id, "outcome": "not started", "error": str(exc)[-500:]})
        raise


def run_window(r: Remote, *, kind: str, image: str, expected_image_id: str | None, command: str,
               run: str = "default", change: ReleaseChange | None = None, to_release: int | None = None,
               need_bytes: int = 0, on_event: Callable[[dict[str, Any]], None] | None = None,
               message: str = "", pipeline_text: str | None = None, restart: bool = False,
               speculate: SpeculateJob | None = None, shard: tuple[int, int] | None = None,
               nodes: tuple[int, int, str] | None = None, held: str | None = None) -> dict[str, Any]:
    """One maintenance window end to end (driver side).

    ``kind`` is ``extract`` / ``train`` (stages from :data:`eagle3ops.commands.stages.WINDOWS`), ``release``,
    ``rollback`` or ``speculate`` (``speculate``: its job, carried out by the supervisor under the lock). Returns the supervisor's ``result.json`` (``outcome``, ``downtime_s``, ``stage_seconds``...).
    ``change``: a release's intended change of the live serving container (:class:`~eagle3ops.config.plan.ReleaseChange`).

    ``pipeline_text``: the run's pipeline config (YAML). It is written to ``<data_dir>/runs/<run>/pipeline.yaml``
    only under the lock, after preflight passed (every write to a host happens then), and it drives the disk
    estimate of the stages (:func:`estimate_disk`) that preflight checks against free space. It is not rewritten
    when the host's copy is byte-identical.

    What the window does is decided before serving stops (:func:`decide_stages`, from the run's manifests read
    over SSH): stages done for exactly these inputs are skipped (with their reason in the plan, the events and the
    result's ``stages``); when every stage is done the window is a no-op: serving is not stopped, nothing of the run
    is written, and the result has ``outcome: "nothing to do"`` and a ``message`` naming each stage's reason.
    ``restart``: extract/train are redone (their ``--restart``). Preflight also starts a throwaway container with the
    first stage's own settings (:func:`eagle3ops.window.preflight.trial_stage_container`).

    Under the lock, once preflight passed (a window with nothing to do included), the exited supervisor containers
    of earlier windows that have a result are removed (:func:`eagle3ops.window.watch.remove_left_supervisors`: a
    killed driver never removed its own).

    ``shard``: an extract window of a fleet run (:mod:`eagle3ops.fleet.execute`): its extract stage takes only
    samples ``[start, end)`` and is done when that shard's manifest (``extract/shards/<start>-<end>.json``) is.
    ``nodes``: ``(count, rank, "HOST:PORT")``, a train window that is one node of a multi-node run
    (:mod:`eagle3ops.fleet.nodes`): its train stage gets ``--nodes/--node-rank/--rendezvous``.
    ``held``: the window id of a lock the caller took already (its own :func:`under_lock`, around the writes it makes
    for this window before: speculate's head upload, say); the window runs under it, and releases it when it fails
    before its supervisor started, as it does its own.

    Raises:
        LockHeld: another run holds the lock (nothing done).
        WindowError: the lock could not be taken (the message names the host's error and the fix), or the driver
            failed after the window started.
        PreflightFailed: a check failed (nothing stopped; lock released; audit entry written).
        SupervisorDead: the supervisor died without a result (the message gives the recover command).
        WindowError: also a ``release``/``rollback`` on a host with ``serving: none``, or a release of a stand-in
            image on a host that is not a sandbox (:mod:`eagle3ops.window.standin`); both refused before the lock.
    """
    if speculate is not None:
        change = speculate.change
    if kind not in st.WINDOWS and held is None:  # refused before the lock (a caller holding one: under it, below)
        refuse_release(r, kind, change)
    t0 = time.monotonic()
    window_id = held or _new_window_id(kind, speculate)
    with under_lock(r, window_id, command, message, take=held is None):
        if kind not in st.WINDOWS and held is not None:  # a refusal releases the caller's lock
            refuse_release(r, kind, change)
        facts = _window_facts(r, kind, run, pipeline_text, restart, shard, to_release, on_event)
        pf = _window_checks(r, facts, kind=kind, run=run, window_id=window_id, image=image,
                            expected_image_id=expected_image_id, need_bytes=need_bytes, change=change,
                            on_event=on_event)
        # under the lock, after preflight (a rerun with nothing to do included): what killed drivers left behind
        _remove_left_supervisors(r, window_id, on_event)
        decision = facts.decision
        if decision is not None and decision.nothing_to_do and pf.ok:
            return {**_nothing_to_do(r, window_id, kind, command, decision, restart_hint=hint(
                kind, r.host.name, "--run", run, "--restart")), "wall_s": round(time.monotonic() - t0, 1)}
        plan = build_plan(r.host, kind="window" if kind in st.WINDOWS else kind, window_id=window_id, image=image,
                          command=command, run=run, stages=facts.to_run, change=change,
                          to_release=facts.to_release, serving_container=pf.serving_container, restart=restart,
                          process_pid=pf.process_pid, speculate=speculate, shard=shard, nodes=nodes,
                          agent_detach=pf.agent_detach, serving_env=pf.serving_env)
        _write_and_launch(r, plan, facts, image=image, run=run, on_event=on_event)
    if r.host.serving.managed:  # the serving host's first window records its weights manifest (detached)
        start_weights_record(r)
    if r.dry_run:
        return _dry_run_result(r, plan, pf)
    result = _with_skipped(watch(r, window_id, on_event=on_event), decision)
    return finish_window(r, window_id, result, command=command)


def _new_window_id(kind: str, speculate: SpeculateJob | None) -> str:
    """A fresh window id for a window of ``kind``; a gated release (``release --gate``: the speculate job under the
    not-slower rule) is named ``release-gate``, for what it is."""
    return new_window_id("release-gate" if speculate is not None and speculate.rule == "not_slower" else kind)


def _remove_left_supervisors(r: Remote, window_id: str, on_event: Callable[[dict[str, Any]], None] | None) -> None:
    """Remove the exited supervisor containers earlier windows left (:func:`remove_left_supervisors`); each
    warning it gives becomes a ``driver``/``warn`` event."""
    for warning in remove_left_supervisors(r, window_id):
        if on_event:
            on_event({"step": "driver", "event": "warn", "reason": warning})


def _with_skipped(result: dict[str, Any], decision: StageDecision | None) -> dict[str, Any]:
    """The supervisor's ``result`` with the stages ``decision`` skipped (``"skipped (<why>)"``) listed in its
    ``stages`` before the ones that ran; ``result`` itself when nothing was skipped."""
    if decision is None or not decision.skip:
        return result
    return {**result, "stages": {**{s: f"skipped ({why})" for s, why in decision.skip},
                                 **(result.get("stages") or {})}}


@dataclass
class WindowFacts:
    """What a window read under its lock before any check (:func:`_window_facts`): ``to_release`` (a rollback's
    target as printed, else the caller's), ``engine`` (the host's container engine answer; None on a venv host or
    for a release), ``pipeline_text`` (the run's config, its chat template resolved), ``template``
    (:class:`TemplateResolution`), ``on_host_text`` (the host's copy of the config), ``decision``
    (:class:`~eagle3ops.window.planner.StageDecision`: which stages run and why the others do not) and ``to_run``
    (the stages to run; a release's: the kind's)."""

    to_release: int | None
    engine: Any = None
    pipeline_text: str | None = None
    template: TemplateResolution | None = None
    on_host_text: str | None = None
    decision: StageDecision | None = None
    to_run: list[str] | None = None


def _window_facts(r: Remote, kind: str, run: str, pipeline_text: str | None, restart: bool,
                  shard: tuple[int, int] | None, to_release: int | None,
                  on_event: Callable[[dict[str, Any]], None] | None) -> WindowFacts:
    """The window's facts (reads only): a rollback's target named first, before any check or stop (dry run too);
    for a stage window the engine, then the served chat template and the run's state (:func:`_decide`)."""
    facts = WindowFacts(to_release)
    if kind == "rollback":
        target, why = rollback_plan(r, to_release)
        if on_event:
            on_event({"step": "rollback", "event": "say", "message": f"rolling back to release {target} ({why})"
                      if target is not None else f"rollback: {why}"})
        # the plan names the release printed: the supervisor brings back that one (a process host's supervisor
        # records an unrecorded live process first, which would move its own default); with none, the
        # supervisor refuses before it stops anything
        facts.to_release = target if target is not None else to_release
    facts.pipeline_text = pipeline_text
    if kind in st.WINDOWS:
        # the engine first: a host without one fails preflight in one line, before the served template or the
        # run's state is read from it (no engine, no surprise); a venv host has no engine by configuration
        facts.engine = ask_engine(r) if rt.for_host(r.host).engine else None
        if facts.engine is None or engine_status(r.host, *facts.engine)[0]:
            facts.pipeline_text, facts.template = resolve_chat_template(r, pipeline_text)
            facts.on_host_text, facts.decision = _decide(r, kind, run, facts.pipeline_text, restart, shard)
    decision = facts.decision
    facts.to_run = [s for s, _ in decision.run] if decision is not None and not decision.refuse \
        else st.WINDOWS.get(kind)
    return facts


def _window_checks(r: Remote, facts: WindowFacts, *, kind: str, run: str, window_id: str, image: str,
                   expected_image_id: str | None, need_bytes: int, change: ReleaseChange | None,
                   on_event: Callable[[dict[str, Any]], None] | None) -> Preflight:
    """The window's checks on its facts: preflight (disk and GPU memory estimates of the stages to run, a trial
    container of the first stage), the release's flags and fallbacks, the chat template and each stage's decision;
    each check sent to ``on_event``. A window with nothing to do checks nothing of the host.

    Raises:
        PreflightFailed: a check failed (a real run: nothing was stopped; the caller's lock is released).
    """
    decision, to_run, text = facts.decision, facts.to_run, facts.pipeline_text
    if decision is not None and decision.nothing_to_do:  # nothing will run: no host check matters
        pf = Preflight()
    else:
        stage_window = text is not None and kind in st.WINDOWS
        disk = estimate_disk(r, kind=kind, run=run, pipeline_text=text, stages=to_run) if stage_window else None
        memory = estimate_gpu_memory(r, run=run, pipeline_text=text, stages=to_run) if stage_window else None
        trial = (run, window_id, to_run[0]) if kind in st.WINDOWS and to_run else None
        pf = preflight(r, image=image, expected_image_id=expected_image_id, need_bytes=need_bytes,
                       need_serving=kind in st.WINDOWS or driver_kind(r.host).records_before_release,
                       disk=disk, trial=trial, memory=memory, engine=facts.engine)
    if change is not None and change.args and pf.serving_container:  # container and compose kinds
        check_release_flags(r, pf, change.args)
    if pf.serving_container and not (decision is not None and decision.nothing_to_do):
        check_fallbacks(r, pf, kind="window" if kind in st.WINDOWS else kind, to_release=facts.to_release)
    if facts.template is not None:
        pf.add("chat template", facts.template.error is None, facts.template.error or facts.template.detail)
    if decision is not None:
        for name, detail in decision.lines():
            pf.add(name, True, detail)
        if decision.refuse:
            pf.add("stage inputs", False, decision.refuse)
    if on_event:
        for name, ok, detail in pf.checks:
            on_event({"step": "preflight", "event": "ok" if ok else "error", "check": name, "detail": detail})
    if not pf.ok and not r.dry_run:
        raise PreflightFailed(f"{r.host.name}: preflight failed, nothing was stopped:\n{pf.failures()}")
    return pf


def _write_and_launch(r: Remote, plan: Plan, facts: WindowFacts, *, image: str, run: str,
                      on_event: Callable[[dict[str, Any]], None] | None) -> None:
    """The window's writes, under the lock and after preflight (a refused run changes nothing on the host): the
    served chat template for prepare, the run's config (not rewritten when the host's copy is identical), a
    chunked run's plan (printed, and fitting, before serving stops), then the plan and its supervisor
    (:func:`launch`)."""
    template, to_run = facts.template, facts.to_run or []
    if template is not None and template.served is not None and "prepare" in to_run:
        rdir = f"{r.host.data_dir}/runs/{run}"
        r.run(hc.mkdir_p(rdir))
        r.run(hc.write_file(f"{rdir}/{SERVED_FILE}"), stdin=template.served.text)
    if facts.pipeline_text is not None and facts.pipeline_text != facts.on_host_text:
        upload_pipeline_config(r, run, facts.pipeline_text)
    if "chunked" in to_run:
        chunk_plan(r, image=image, run=run, window_id=plan.window_id, on_event=on_event)
    launch(r, plan, image)


def _dry_run_result(r: Remote, plan: Plan, pf: Preflight) -> dict[str, Any]:
    """A dry run's result: the commands it printed, the changes it would make, the supervisor's own commands on the
    host (echoed with the serving kind's and the runtime's notes) and the plan.

    Raises:
        PreflightFailed: a check failed, so a real run would stop before anything is stopped.
    """
    on_host = supervisor_commands(r.host, plan)
    if r.echo:
        note = driver_kind(r.host).dry_run_note
        if note:
            r.echo(f"# {r.host.name}: {note}")
        r.echo(rt.for_plan(plan).supervisor_note)
        for argv in on_host:
            r.echo("#   " + render(argv))
    if not pf.ok:
        raise PreflightFailed(f"{r.host.name}: preflight would fail, so a real run would stop before anything "
                              f"is stopped:\n{pf.failures()}")
    return {"window_id": plan.window_id, "outcome": "dry-run", "commands": list(r.history),
            "changes": list(r.changes), "supervisor_commands": on_host, "serving": plan.serving_kind,
            "plan": plan.model_dump(mode="json")}


def chunk_plan(r: Remote, *, image: str, run: str, window_id: str,
               on_event: Callable[[dict[str, Any]], None] | None = None) -> list[str]:
    """Stage ``chunked``'s plan made on the host by a throwaway stage container (or pipeline-environment process)
    with ``--dry-run`` (:func:`eagle3ops.commands.stages.chunk_plan_argv`), after preflight and the pipeline config's
    upload, before serving stops, bounded by :data:`eagle3ops.commands.stages.TRIAL_TIMEOUT_S`. Each plan line becomes
    a ``preflight`` event (check ``chunk plan``); returns the lines. In a dry run the command is printed, not run.

    Raises:
        PreflightFailed: the plan could not be made (no chunking fits the disk budget, inputs missing, or no answer
            in time): the window stops here, nothing stopped (the message ends with the stage's own words).
    """
    h, runtime = r.host, rt.for_host(r.host)
    argv = runtime.chunk_plan_argv(h, image=image, run=run, window_id=window_id)
    try:
        res = r.run(argv, check=False, timeout=st.TRIAL_TIMEOUT_S)
    except RemoteError as exc:  # timed out
        raise PreflightFailed(f"{h.name}: the chunked run's plan was not made within {st.TRIAL_TIMEOUT_S} s ({exc}); "
                              f"nothing was stopped") from exc
    finally:
        if (remove := runtime.chunk_plan_cleanup(h, window_id)) is not None:
            r.run(remove, check=False)
    if r.dry_run:
        return []
    lines = [ln.rstrip() for ln in res.stdout.splitlines() if ln.startswith(("chunked run:", "  "))]
    for ln in lines:
        if on_event:
            on_event({"step": "preflight", "event": "ok", "check": "chunk plan", "detail": ln.strip()})
    if not res.ok:
        said = " ".join((res.stderr + " " + res.stdout).split())[-600:]
        raise PreflightFailed(f"{h.name}: stage chunked cannot plan run {run}, nothing was stopped: {said}")
    return lines


def start_weights_record(r: Remote) -> bool:
    """Start recording the host's weights manifest (:mod:`eagle3ops.commands.weights`: names, sizes, mtimes, sha256
    of ``model_path``'s files), detached, when it has none and ``model_path`` is a directory: a window calls it once
    its supervisor runs, so the serving host's first window records it without waiting for the hashing (``eagle3ops
    weights`` re-verifies it by size and mtime). Returns whether it was started; a failure here is not the window's
    (False)."""
    h = r.host
    mpath = wc.manifest_path(h.state_dir)
    try:
        # its folder exists once a recording started (or `weights` wrote the manifest): started once, never twice
        if r.run(hc.test_dir(mpath.rsplit("/", 1)[0]), check=False).ok or \
                not r.run(hc.test_dir(h.model_path), check=False).ok:
            return False
        r.run(wc.record_detached(h.model_path, mpath, mpath.rsplit("/", 1)[0] + "/record.log"))
        return True
    except Exception:  # noqa: BLE001 - the window runs already; `eagle3ops weights` records a missing manifest
        return False


@dataclass
class TemplateResolution:
    """How a stage window resolved ``prepare.chat_template`` (:func:`resolve_chat_template`): the template serving
    uses (``served``; None: the tokenizer's own, or the config's own choice), the preflight line, or the error that
    fails preflight."""

    served: ServedTemplate | None = None
    detail: str = ""
    error: str | None = None


def resolve_chat_template(r: Remote, text: str | None) -> tuple[str | None, TemplateResolution | None]:
    """Before a stage window stops serving (read-only): ``prepare.chat_template: auto`` (the default) resolved to
    the template the live server uses (:mod:`eagle3ops.window.served_template`); returns (the
    config text the window writes and decides with, the resolution; None when there is no config text or it is not
    valid YAML, which the disk estimate reports). A setting other than ``auto`` is kept as written."""
    import yaml

    if text is None:
        return None, None
    try:
        data = yaml.safe_load(text) or {}
        spec = (data.get("prepare") or {}).get("chat_template", "auto") if isinstance(data, dict) else "auto"
    except yaml.YAMLError:
        return text, None
    if spec != "auto":
        return text, TemplateResolution(detail=f"prepare.chat_template as configured ({spec})")
    try:
        served = read_served_template(r)
    except ServedTemplateError as e:
        return text, TemplateResolution(error=str(e))
    detail = (f"{served.origin} (sha256 {served.sha256[:16]}...): the data is rendered with it ({SERVED_FILE} "
              "in the run directory)" if served else
              "serving has no --chat-template: the data is rendered with the tokenizer's own, as serving renders")
    return resolve_config(text, served), TemplateResolution(served=served, detail=detail)


def check_release_flags(r: Remote, pf: Preflight, args: list[str]) -> None:
    """Before the stop (and in ``--dry-run``): can the live serving container take the server flags ``args`` of a
    release (``release --arg``, speculate's ``--speculative-config``)? A container whose server runs through a
    shell's ``-c`` string cannot (:func:`eagle3ops.commands.serving.shell_form_problem`): the check fails naming the
    container and the fix. Read-only; a container that cannot be inspected is left to the supervisor, which
    refuses the same release before it stops anything."""
    out = r.run(dk.inspect_container(r.host, pf.serving_container or ""), check=False)
    if not out.ok:
        return
    try:
        inspect = json.loads(out.stdout)[0]
    except (ValueError, IndexError):
        return
    problem = sv.shell_form_problem(inspect, args)
    pf.add("serving command", problem is None, problem or "exec form: the release's flags reach the server")


def _decide(r: Remote, kind: str, run: str, pipeline_text: str | None, restart: bool,
            shard: tuple[int, int] | None = None) -> tuple[str | None, StageDecision | None]:
    """(the host's ``runs/<run>/pipeline.yaml`` text, :func:`decide_stages` for the window) read-only; the decision
    is None when no valid pipeline config is known (preflight's disk estimate names that error). For a ``shard``,
    extract is judged by the shard's own manifest."""
    import yaml

    from eagle3ops.config.pipeline import PipelineConfig
    from eagle3ops.stages.shards import manifest_rel

    on_host, manifests, sizes = read_run_state(r, run)
    if shard is not None:
        out = r.run(hc.cat_if_exists(f"{r.host.data_dir}/runs/{run}/extract/{manifest_rel(*shard)}"), check=False)
        manifests = {**manifests, "extract": out.stdout if out.ok and out.stdout else None}
        if manifests["extract"] and not sizes:
            sizes = hc.parse_file_sizes(r.run(hc.file_sizes(f"{r.host.data_dir}/runs/{run}"), check=False).stdout,
                                        f"{r.host.data_dir}/runs/{run}")
    text = pipeline_text if pipeline_text is not None else on_host
    if text is None:
        return on_host, None
    try:
        cfg = PipelineConfig.model_validate(yaml.safe_load(text) or {})
    except Exception:  # noqa: BLE001 - pydantic or YAML error: reported by the disk estimate
        return on_host, None
    return on_host, decide_stages(st.window_stages(kind, cfg), cfg, manifests, sizes, restart=restart,
                                  rerun_hint=hint("extract", r.host.name, "--run", run))


def _nothing_to_do(r: Remote, window_id: str, kind: str, command: str, decision: StageDecision, *,
                   restart_hint: str) -> dict[str, Any]:
    """End a window whose every stage is done for these inputs: nothing stopped, nothing of the run written; the lock
    is released and an audit entry says why. Returns the result (``outcome: "nothing to do"``)."""
    message = ("nothing to do: " + "; ".join(why for _, why in decision.skip)
               + f"; pass --restart to redo it ({restart_hint})")
    result = {"window_id": window_id, "kind": kind, "outcome": "nothing to do", "message": message, "error": "",
              "stages": {s: f"skipped ({why})" for s, why in decision.skip}, "stage_seconds": {},
              "downtime_s": None, "serving_running": True, "serving_healthy": True, "warnings": []}
    if r.dry_run:
        if r.echo:
            r.echo(f"# {message}; serving would not be stopped")
        return {**result, "outcome": "dry-run", "commands": list(r.history), "changes": list(r.changes),
                "supervisor_commands": []}
    release_lock(r, window_id)
    append_audit(r, {"user": getpass.getuser(), "host": r.host.name, "command": command, "window": window_id,
                     "outcome": "nothing to do", "error": "", "message": message})
    return result


def _started(r: Remote, window_id: str) -> bool | None:
    """Whether the window's supervisor container exists (the window runs on the host and owns the lock); None when
    the host cannot be asked (the lock then stays; stale detection reports it later)."""
    try:
        runtime = rt.for_host(r.host)
        out = r.run(runtime.supervisor_started(r.host, window_id), check=False)
        return runtime.started_from(out.ok, out.stdout)
    except Exception:  # noqa: BLE001 - host unreachable
        return None


def upload_pipeline_config(r: Remote, run: str, text: str) -> str:
    """Write a pipeline config (YAML text) as ``<data_dir>/runs/<run>/pipeline.yaml`` on the host; returns the path.

    A write to the host: call it only while holding the lock (``run_window(pipeline_text=...)`` does, after
    preflight); a run refused by the lock must not change a running window's input.
    """
    rdir = f"{r.host.data_dir}/runs/{run}"
    r.run(hc.mkdir_p(rdir))
    r.run(hc.write_file(f"{rdir}/pipeline.yaml"), stdin=text)
    return f"{rdir}/pipeline.yaml"
