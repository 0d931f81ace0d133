"""Serving kinds on the driver side: what a window's driver does differently per serving manager, one class each,
chosen once from the host's ``serving.kind`` (:func:`driver_kind`).

Each class says which commands it refuses (:meth:`DriverKind.refuse`), what a release may change, how preflight
finds live serving, which plan fields it fills, what runs on the host before the supervisor (the ``process`` and
``systemd`` kinds' restore agent), what ``--dry-run`` shows the supervisor doing, and what ``config check`` says.
Each also reads the live server's command line and files as it sees them (:meth:`DriverKind.served_argv`: serving's
``--chat-template``, :mod:`eagle3ops.window.served_template`). The host side of each kind is
:mod:`eagle3ops.supervisor.kinds` (the driver never imports it: the plan's
``serving_kind`` is the only thing the two share). Nothing else on the driver side looks at the kind's name.

Why this module is long: five serving managers, each answering the same dozen driver questions side by side (what it
refuses, finds, records, previews), and the read-only finders they share; the commands themselves are in
:mod:`eagle3ops.commands`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable

from eagle3ops.commands import docker as dk
from eagle3ops.commands import host as hc
from eagle3ops.commands import logind as lg
from eagle3ops.commands import process as pc
from eagle3ops.commands import serving as sv
from eagle3ops.commands import stages as st
from eagle3ops.commands import systemd as sd
from eagle3ops.commands import venv as vc
from eagle3ops.config import HostConfig
from eagle3ops.config.plan import NO_SERVING_NOTE, Plan, ReleaseChange
from eagle3ops.window.common import WindowError
from eagle3ops.window.hostfacts import inherited_env, replay_refusal

if TYPE_CHECKING:
    from eagle3ops.remote import Remote
    from eagle3ops.window.preflight import Preflight


def agent_limit_s(plan: Plan) -> float:
    """How long (seconds) a ``process``/``systemd`` window's restore agent waits for the supervisor's restore request
    before it restores on its own: the window's budget plus the graceful stop and 600 s; a ``speculate`` plan adds
    both sides' measurement bound (:meth:`~eagle3ops.config.plan.SpeculateJob.measure_bound_s`), and the graceful
    stop and 600 s for each restart the ``aba`` order adds."""
    job = plan.speculate
    measuring = job.measurements() * job.measure_bound_s() if job is not None else 0.0
    extra = job.extra_restarts() * (plan.stop_timeout_s + 600.0) if job is not None else 0.0
    return plan.budget_s + plan.stop_timeout_s + 600.0 + measuring + extra


def agent_stop_wait_s(plan: Plan) -> float:
    """How long (seconds) the restore agent waits for the stop request: :data:`eagle3ops.commands.process.
    AGENT_STOP_WAIT_S`, plus a ``speculate`` plan's baseline measurement (it runs before the switch stops serving)."""
    return pc.AGENT_STOP_WAIT_S + (plan.speculate.measure_bound_s() if plan.speculate is not None else 0.0)


def _measure_preview(plan: Plan, side: str) -> list[str]:
    job = plan.speculate
    assert job is not None and plan.health is not None
    return ["# measure", side, f"http://127.0.0.1:{plan.health.port}: {len(job.prompts)} prompts x {job.max_tokens} "
            f"tokens at concurrency {job.levels}, {job.passes} passes (in the supervisor)"]


def _speculate_preview(plan: Plan, release: list[list[str]], back: list[list[str]]) -> list[list[str]]:
    """A speculate plan's steps around the kind's release commands: baseline, the release, its measurement, the
    decision, and the switch back when it is not kept."""
    job = plan.speculate
    assert job is not None
    rule = (f"x{1 + job.margin:.3f} and acceptance >= {job.acceptance_floor}" if job.rule == "faster"
            else f"x{1 - job.margin:.3f} (not slower beyond the margin)")
    cands = ([["# candidates", ", ".join(c.name for c in job.candidates), "each switched to (never live) and "
               f"measured; the best kept at the corrected level (x{len(job.candidates)} candidates) is the release "
               "below, measured afresh"]] if job.candidates else [])
    control = ([["# control", f"the live serving on {job.control.image} without --speculative-config, health-gated, "
                 "never live: the baseline measured next (one more restart)"]] if job.control else [])
    return [*control, _measure_preview(plan, "baseline"), *cands, *release,
            _measure_preview(plan, "speculative" if job.rule == "faster" else "changed"),
            ["# decide", f"keep when the {job.levels[0]}-concurrency throughput ratio's 90 % interval clears "
             f"{rule}; else:"], *back,
            ["# results", f"{job.results_dir}/{plan.window_id}"]]


def _gate(plan: Plan) -> list[str]:
    assert plan.health is not None  # every plan with serving has a gate
    port = plan.health.port
    return ["GET", f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}/v1/models",
            f"POST http://127.0.0.1:{port}/v1/completions"]


def _stage_argv(h: HostConfig, plan: Plan) -> list[list[str]]:
    if plan.runtime == "venv":  # processes of the pipeline environment
        return [vc.stage_preview(step.spec) for step in plan.stages]
    return [sv.run_argv(h, {**step.spec, "restart_policy": {}}) for step in plan.stages]


def supervisor_words(h: HostConfig, plan: Plan) -> list[str] | None:
    """How a restore agent asks about the window's supervisor: None (``docker``, a container) or, on a venv host,
    :func:`eagle3ops.commands.venv.state_words` of the window directory."""
    if plan.runtime != "venv":
        return None
    return vc.state_words(f"{h.state_dir}/windows/{plan.window_id}")


class DriverKind:
    """One serving manager as a window's driver sees it. The defaults are the ``container`` kind's."""

    name = "container"
    #: A release/rollback needs live serving found at preflight (the kinds whose driver records it before launch).
    records_before_release = False
    #: Said by ``--dry-run`` before the supervisor's commands (None: nothing to say).
    dry_run_note: str | None = None
    #: The form of this kind's release record, which the cycle's served acceptance replays on a work host
    #: (``container``: the container's configuration; ``process``: its command line; None: not replayed).
    record_form: str | None = "container"

    def refuse(self, h: HostConfig, what: str) -> None:
        """Refuse ``what`` (``release``, ``rollback``, ``speculate``) on this kind of serving before the lock.

        Raises:
            WindowError: the kind cannot do ``what``; the message names the host, the inventory key and the fix.
        """

    def release_refusal(self, h: HostConfig, change: ReleaseChange | None) -> str | None:
        """Why a release with ``change`` cannot be made on this kind (None: it can)."""
        return None

    def preflight(self, r: "Remote", pf: "Preflight", need_serving: bool) -> None:
        """Find live serving (read-only) and add its check to ``pf``: the container (by name or Compose labels)."""
        check_serving_container(r, pf, need_serving)

    def plan_fields(self, h: HostConfig, window_id: str, serving_container: str | None,
                    process_pid: int | None) -> dict[str, Any]:
        """The :class:`~eagle3ops.config.plan.Plan` fields of this kind: the serving container's name (found at
        preflight, else :func:`eagle3ops.commands.serving.default_name`) and the host folder that keeps its compile
        cache across recreated releases (``<data_dir>/compile-cache``)."""
        return {"serving_container": serving_container or sv.default_name(h.serving),
                "compile_cache": sv.compile_cache_dir(h)}

    def launch(self, r: "Remote", plan: Plan) -> None:
        """Run what must be on the host before the supervisor starts (nothing for a container)."""

    def supervisor_commands(self, h: HostConfig, plan: Plan) -> list[list[str]]:
        """What the supervisor (docker SDK) will do, as equivalent argv lists (``--dry-run``)."""
        cmds: list[list[str]] = []
        if plan.kind == "window":
            cmds.append(dk.docker(h, "stop", "--time", str(plan.stop_timeout_s), plan.serving_container))
            cmds += _stage_argv(h, plan)
            cmds.append(dk.docker(h, "start", plan.serving_container))
        else:
            if plan.kind in ("release", "speculate"):
                change = plan.change or ReleaseChange()
                record = {"Name": plan.serving_container, "Config": {
                    "Image": change.image or "<image of the live container>",
                    "Cmd": ["<command of the live container, with:", *change.args, ">"] if change.args else
                           ["<command of the live container>"]}}
            else:
                which = plan.to_release or "live before the current one"
                record = {"Name": plan.serving_container, "Config": {"Image": f"<image of release {which}>",
                                                                      "Cmd": [f"<command of release {which}>"]}}
            cmds.append(dk.rm(h, plan.serving_container, force=True))
            cmds.append(sv.record_run_argv(h, record, plan.compile_cache))
        cmds.append(_gate(plan))
        if plan.kind == "speculate":
            back = {"Name": plan.serving_container, "Config": {"Image": "<image of the release live before>",
                                                                "Cmd": ["<command of the release live before>"]}}
            return _speculate_preview(plan, cmds, [dk.rm(h, plan.serving_container, force=True),
                                                   sv.record_run_argv(h, back, plan.compile_cache), _gate(plan)])
        return cmds

    def speculative_change(self, h: HostConfig, head_dir: str, k: int, image: str,
                           draft_tp: int | None = None) -> ReleaseChange:
        """The speculative release: the live container plus ``--speculative-config`` (``draft_tp``: the draft's
        tensor parallelism; and on a CPU host the stand-in's settings), the patched serving ``image`` and the head
        mounted read-only at :data:`eagle3ops.commands.speculate.HEAD_MOUNT`; everything else of the live container
        unchanged."""
        from eagle3ops.commands import speculate as sc

        return ReleaseChange(args=sc.speculative_args(num_speculative_tokens=k, cpu=h.gpus == 0, draft_tp=draft_tp),
                             image=image, binds=[f"{head_dir}:{sc.HEAD_MOUNT}:ro"])

    def ngram_change(self, h: HostConfig, k: int, image: str) -> ReleaseChange:
        """vLLM's n-gram proposer as a speculative release: the live container plus its ``--speculative-config``
        on the patched serving ``image``; no head (one of the candidates ``speculate --method`` chooses from)."""
        from eagle3ops.commands import speculate as sc

        return ReleaseChange(args=sc.ngram_args(num_speculative_tokens=k, cpu=h.gpus == 0), image=image)

    def looked_for(self, h: HostConfig) -> str:
        """What preflight looks for, in words."""
        return f"container {h.serving.container!r}"

    def live_state(self, r: "Remote") -> tuple[str, bool | None]:
        """The live server as the host has it now (read-only): ``(words, running)``; ``running`` is None for a host
        without serving. Containers: the container's own ``State.Status`` (``missing`` when it does not exist)."""
        names, found = serving_container(r)
        if not names:
            return f"no container for {found}", False
        s = r.run(dk.container_status(r.host, names[0]), check=False)
        state = s.stdout.strip() if s.ok else "missing"
        return f"container {names[0]!r} is {state}", state == "running"

    def start_stopped(self, r: "Remote") -> tuple[str, list[Any]]:
        """``recover`` of serving stopped outside a window: ``(what is started, the commands)``.

        Raises:
            WindowError: serving cannot be started as it is (no container); the message names the fix.
        """
        names, found = serving_container(r)
        if not names:
            raise WindowError(f"{r.host.name}: no container for {found} to start: recreate the current release with "
                              f"`eagle3ops rollback {r.host.name} --to N` (N: `eagle3ops status {r.host.name}`'s "
                              f"serving release), or start serving by hand")
        return repr(names[0]), [dk.start(r.host, names[0])]

    def drift_note(self, h: HostConfig) -> str | None:
        """``config check HOST``: why there is no live container to compare (None: compare it)."""
        return None

    def served_argv(self, r: "Remote") -> tuple[list[str], Callable[[str], str | None], str] | None:
        """The live server's command line, a reader of a file as the server sees it (its text, or None when it
        cannot be read), and where it runs in words; None when no serving is found. Read-only. Containers: the
        serving container's ``Entrypoint`` + ``Cmd``; files through ``docker exec NAME cat``."""
        names, _ = serving_container(r)
        if not names:
            return None
        out = r.run(dk.inspect_container(r.host, names[0]), check=False)
        try:
            cfg = (json.loads(out.stdout)[0].get("Config") or {}) if out.ok else None
        except (ValueError, IndexError, AttributeError):
            cfg = None
        if cfg is None:
            return None
        name = names[0]

        def read(path: str) -> str | None:
            res = r.run(dk.exec_cat(r.host, name, path), check=False)
            return res.stdout if res.ok else None

        return [*(cfg.get("Entrypoint") or []), *(cfg.get("Cmd") or [])], read, f"container {name!r}"


class ComposeKind(DriverKind):
    """The container of a Compose service, found by its Compose labels."""

    name = "compose"

    def looked_for(self, h: HostConfig) -> str:
        return f"Compose service {h.serving.compose_project}/{h.serving.compose_service}"


class ProcessKind(DriverKind):
    """A plain process: found with ``pgrep``, recorded from /proc and handed to the host-side restore agent."""

    name = "process"
    record_form = "process"
    records_before_release = True

    def refuse(self, h: HostConfig, what: str) -> None:
        if what not in ("release", "rollback", "speculate"):
            raise WindowError(f"host {h.name} serves with a process (`hosts.{h.name}.serving.kind: process`): {what} "
                              f"is not supported for process serving yet (windows, release, rollback and speculate "
                              f"are); run serving as a container for {what}")

    def speculative_change(self, h: HostConfig, head_dir: str, k: int, image: str,
                           draft_tp: int | None = None) -> ReleaseChange:
        """The live process plus ``--speculative-config`` naming the head at its host path (a process has no
        image or binds: ``image`` is not used; the process's own vLLM must be the patched one)."""
        from eagle3ops.commands import speculate as sc

        return ReleaseChange(args=sc.speculative_args(num_speculative_tokens=k, cpu=h.gpus == 0, model=head_dir,
                                                      draft_tp=draft_tp))

    def ngram_change(self, h: HostConfig, k: int, image: str) -> ReleaseChange:
        """The live process plus the n-gram proposer's ``--speculative-config`` (no head, no image)."""
        from eagle3ops.commands import speculate as sc

        return ReleaseChange(args=sc.ngram_args(num_speculative_tokens=k, cpu=h.gpus == 0))

    def release_refusal(self, h: HostConfig, change: ReleaseChange | None) -> str | None:
        if change is None or not (change.image or change.binds):
            return None
        return (f"host {h.name} serves with a process (`hosts.{h.name}.serving.kind: process`): a release of it "
                f"changes only server flags (--arg) and environment, not the image or binds (asked: "
                f"{'--image' if change.image else 'binds'}); drop --image/binds, or run serving as a container")

    def preflight(self, r: "Remote", pf: "Preflight", need_serving: bool) -> None:
        check_process(r, pf, need_serving)
        check_session_kill(r, pf)

    def plan_fields(self, h: HostConfig, window_id: str, serving_container: str | None,
                    process_pid: int | None) -> dict[str, Any]:
        return {"serving_container": "", "process_dir": pc.process_dir(f"{h.state_dir}/windows/{window_id}"),
                "process_pid": process_pid}

    def launch(self, r: "Remote", plan: Plan) -> None:
        """Record the serving process and start the restore agent, before the supervisor that talks with it. In a
        dry run whose preflight found no serving process (it fails, saying so) there is nothing to record."""
        if r.dry_run and plan.process_pid is None:
            return
        assert plan.process_dir is not None and plan.process_pid is not None
        r.run(pc.record_process(plan.process_pid, plan.process_dir))
        r.run(pc.start_agent(r.host, pdir=plan.process_dir, pid=plan.process_pid, stop_timeout_s=plan.stop_timeout_s,
                             supervisor=st.supervisor_name(plan.window_id), limit_s=agent_limit_s(plan),
                             stop_wait_s=agent_stop_wait_s(plan), state_words=supervisor_words(r.host, plan),
                             detach=plan.agent_detach))

    def supervisor_commands(self, h: HostConfig, plan: Plan) -> list[list[str]]:
        """The host-side restore agent stops and restores; the supervisor gates."""
        pdir = plan.process_dir or "?"
        gate = _gate(plan)
        head = [pc.record_process(plan.process_pid or 0, pdir),
                pc.start_agent(h, pdir=pdir, pid=plan.process_pid or 0, stop_timeout_s=plan.stop_timeout_s,
                               supervisor=st.supervisor_name(plan.window_id), limit_s=agent_limit_s(plan),
                               stop_wait_s=agent_stop_wait_s(plan), state_words=supervisor_words(h, plan),
                               detach=plan.agent_detach),
                pc.stop_preview(plan.process_pid or 0, plan.stop_timeout_s)]
        if plan.kind == "window":
            return [*head, *_stage_argv(h, plan), pc.restore_preview(pdir, [], ""), gate]
        if plan.kind in ("release", "speculate"):
            args = (plan.change or ReleaseChange()).args
            target = ["<recorded command line, with:", *args, ">"] if args else ["<recorded command line>"]
        else:
            target = [f"<command line of release {plan.to_release or 'live before the current one'}>"]
        if plan.kind == "speculate":
            return _speculate_preview(plan, [*head, pc.restore_preview(pdir, target, "<its recorded cwd>"), gate],
                                      [pc.stop_preview(0, plan.stop_timeout_s), pc.restore_preview(pdir, [], ""),
                                       gate])
        return [*head, pc.restore_preview(pdir, target, "<its recorded cwd>"), gate,
                ["# if the gate fails: roll back to the recorded process"],
                pc.stop_preview(0, plan.stop_timeout_s), pc.restore_preview(pdir, [], ""), gate]

    def live_state(self, r: "Remote") -> tuple[str, bool | None]:
        pattern = r.host.serving.process_match or ""
        pids = [p for p in r.run(pc.find_process(pattern), check=False).stdout.split() if p.isdigit()]
        return (f"process {pids[0]} matches {pattern!r}", True) if pids else (f"no process matches {pattern!r}", False)

    def start_stopped(self, r: "Remote") -> tuple[str, list[Any]]:
        raise WindowError(f"{r.host.name}: serving (a process, `hosts.{r.host.name}.serving.kind: process`) is not "
                          f"running and no window recorded it to restore: start it again the way you started it "
                          f"(eagle3ops restores a process only within a window that recorded it)")

    def drift_note(self, h: HostConfig) -> str | None:
        return ("serving kind process: windows restore the running process as recorded from /proc, releases change "
                "its flags (`release --arg`); there is no container to compare")

    def served_argv(self, r: "Remote") -> tuple[list[str], Callable[[str], str | None], str] | None:
        """The serving process's ``/proc/PID/cmdline``; a relative file path is read from its ``cwd``."""
        pids = [int(p) for p in r.run(pc.find_process(r.host.serving.process_match or ""),
                                      check=False).stdout.split() if p.isdigit()]
        return proc_argv(r, pids[0], f"process {pids[0]}") if pids else None


class SystemdKind(DriverKind):
    """A systemd unit: recorded with ``systemctl show`` (and its ``ExecStart`` from the bus), stopped and started by
    the restore agent's systemd variant (:mod:`eagle3ops.commands.systemd`). Windows, releases and rollbacks (a
    drop-in, ``daemon-reload``, start, health gate); not speculate. Tested against a real systemd
    (``tests/test_systemd_real.py``: the agent's stop, group sweep, restore, a release and its rollback, this
    preflight); a whole window is not (no Docker engine there)."""

    name = "systemd"
    record_form = None
    records_before_release = True

    def refuse(self, h: HostConfig, what: str) -> None:
        if what not in ("release", "rollback"):
            raise WindowError(f"host {h.name} serves with systemd unit {h.serving.unit!r} (`hosts.{h.name}.serving."
                              f"kind: systemd`): {what} is not supported for systemd serving (windows, release and "
                              f"rollback are); run serving as a container for {what}")

    def release_refusal(self, h: HostConfig, change: ReleaseChange | None) -> str | None:
        return None if change is None or not (change.image or change.binds) else (
            f"host {h.name} serves with systemd unit {h.serving.unit!r} (`hosts.{h.name}.serving.kind: systemd`): a "
            f"release of it changes only server flags (--arg) and environment, written as a drop-in, not the image "
            f"or binds (asked: {'--image' if change.image else 'binds'}); drop --image/binds, or run serving as a "
            f"container")

    def preflight(self, r: "Remote", pf: "Preflight", need_serving: bool) -> None:
        """``systemctl is-active UNIT`` must say ``active`` (read-only)."""
        unit = r.host.serving.unit or ""
        out = r.run(sd.is_active(unit), check=False)
        state = out.stdout.strip() or (out.stderr or "").strip()[-200:] or "?"
        ok = state == "active" or not need_serving
        pf.add("serving unit", ok, f"{unit}: {state}" if ok else
               f"{unit} is {state!r}, not active (hosts.{r.host.name}.serving.unit): start it (`systemctl start "
               f"{unit}`), or fix the unit name")
        mode = r.run(sd.kill_mode(unit), check=False).stdout.strip()
        if mode and mode != "control-group":
            # not a failure: the agent ends what the stop leaves in the unit's control group itself
            pf.add("serving unit KillMode", True,
                   f"{unit} has KillMode={mode}: `systemctl stop` ends its main process only, and vLLM's engine "
                   f"and workers would keep the GPUs; the window ends the rest of the unit's control group after "
                   f"the stop. Advised: KillMode=control-group (systemd's default; `systemctl edit {unit}`)")
        check_session_kill(r, pf)

    def plan_fields(self, h: HostConfig, window_id: str, serving_container: str | None,
                    process_pid: int | None) -> dict[str, Any]:
        return {"serving_container": "", "process_dir": pc.process_dir(f"{h.state_dir}/windows/{window_id}"),
                "serving_unit": h.serving.unit}

    def launch(self, r: "Remote", plan: Plan) -> None:
        """Record the unit (``unit.show``) and start the systemd restore agent, before the supervisor."""
        assert plan.process_dir is not None and plan.serving_unit is not None
        r.run(sd.record_unit(plan.serving_unit, plan.process_dir))
        r.run(sd.start_agent(r.host, pdir=plan.process_dir, unit=plan.serving_unit,
                             stop_timeout_s=plan.stop_timeout_s, supervisor=st.supervisor_name(plan.window_id),
                             limit_s=agent_limit_s(plan), state_words=supervisor_words(r.host, plan),
                             detach=plan.agent_detach))

    def supervisor_commands(self, h: HostConfig, plan: Plan) -> list[list[str]]:
        """The agent runs ``systemctl stop``, the stages run, the agent runs ``systemctl start``, the supervisor
        gates."""
        pdir, unit = plan.process_dir or "?", plan.serving_unit or "?"
        head = [sd.record_unit(unit, pdir),
                sd.start_agent(h, pdir=pdir, unit=unit, stop_timeout_s=plan.stop_timeout_s,
                               supervisor=st.supervisor_name(plan.window_id), limit_s=agent_limit_s(plan),
                               state_words=supervisor_words(h, plan), detach=plan.agent_detach),
                sd.stop_argv(unit)]
        if plan.kind == "window":
            return [*head, *_stage_argv(h, plan), sd.start_argv(unit), _gate(plan)]
        args = (plan.change or ReleaseChange()).args
        what = (" ".join(["the recorded command line, with:", *args]) if plan.kind == "release" else
                f"the drop-in of release {plan.to_release or 'live before the current one'} (none: removed)")
        return [*head, *sd.switch_preview(unit, pdir, what, _gate(plan))]

    def looked_for(self, h: HostConfig) -> str:
        return f"systemd unit {h.serving.unit!r}"

    def live_state(self, r: "Remote") -> tuple[str, bool | None]:
        unit = r.host.serving.unit or ""
        out = r.run(sd.is_active(unit), check=False)
        state = out.stdout.strip() or "?"
        return f"unit {unit!r} is {state}", state == "active"

    def start_stopped(self, r: "Remote") -> tuple[str, list[Any]]:
        unit = r.host.serving.unit or ""
        return f"unit {unit!r}", [sd.start_argv(unit)]

    def drift_note(self, h: HostConfig) -> str | None:
        return (f"serving kind systemd: windows stop and start unit {h.serving.unit!r} as systemd has it; there is "
                f"no container to compare")

    def served_argv(self, r: "Remote") -> tuple[list[str], Callable[[str], str | None], str] | None:
        """The unit's main process (``systemctl show -p MainPID``), read as a process is."""
        unit = r.host.serving.unit or ""
        pid = r.run(sd.main_pid(unit), check=False).stdout.strip()
        return proc_argv(r, int(pid), f"unit {unit!r} (pid {pid})") if pid.isdigit() and pid != "0" else None


class NoServingKind(DriverKind):
    """A host that only trains (``serving: none``): no serving to find, stop, restore or gate."""

    name = "none"
    record_form = None
    dry_run_note = NO_SERVING_NOTE

    def refuse(self, h: HostConfig, what: str) -> None:
        raise WindowError(f"host {h.name} has no serving: `hosts.{h.name}.serving` is `none` in the inventory (a "
                          f"host that only trains), so there is nothing to {what}. Run {what} on a host that serves, "
                          f"or describe this host's serving (`eagle3ops config docs inventory`).")

    def preflight(self, r: "Remote", pf: "Preflight", need_serving: bool) -> None:
        pf.add("serving", True, NO_SERVING_NOTE)  # no serving container to find or check

    def plan_fields(self, h: HostConfig, window_id: str, serving_container: str | None,
                    process_pid: int | None) -> dict[str, Any]:
        return {"serving_container": ""}

    def supervisor_commands(self, h: HostConfig, plan: Plan) -> list[list[str]]:
        return _stage_argv(h, plan)  # the stages, nothing else (see NO_SERVING_NOTE)

    def looked_for(self, h: HostConfig) -> str:
        return "no serving (serving: none)"

    def live_state(self, r: "Remote") -> tuple[str, bool | None]:
        return "no serving (serving: none)", None

    def start_stopped(self, r: "Remote") -> tuple[str, list[Any]]:
        return "nothing", []

    def drift_note(self, h: HostConfig) -> str | None:
        return "serving: none (a host that only trains): no serving container to compare"

    def served_argv(self, r: "Remote") -> tuple[list[str], Callable[[str], str | None], str] | None:
        return None


#: ``serving.kind`` → its driver-side class.
DRIVER_KINDS: dict[str, type[DriverKind]] = {k.name: k for k in (DriverKind, ComposeKind, ProcessKind, SystemdKind,
                                                                 NoServingKind)}


def driver_kind(h: HostConfig) -> DriverKind:
    """The driver-side serving kind of host ``h`` (from ``serving.kind``, which the inventory validated)."""
    return DRIVER_KINDS[h.serving.kind]()


def require_serving(h: HostConfig, what: str) -> None:
    """Refuse ``what`` (``release``, ``rollback``, ``speculate``) where the host's serving kind cannot do it
    (:meth:`DriverKind.refuse`): ``serving: none`` refuses all three, a systemd unit ``speculate``.

    Raises:
        WindowError: the message names the host, the inventory key and the fix.
    """
    driver_kind(h).refuse(h, what)


# --- finding live serving (read-only; preflight calls these through the kinds) ---------------------------------


def check_serving_container(r: Remote, pf: Preflight, need_serving: bool = True) -> None:
    """Kinds ``container`` and ``compose``: find the serving container (:func:`serving_container`), refuse more than
    one, and when ``need_serving`` check that it runs; sets ``pf.serving_container``. Read-only."""
    h = r.host
    names, found = serving_container(r)
    pf.serving_container = names[0] if names else sv.default_name(h.serving)
    if len(names) > 1:
        pf.add("serving container", False, f"{found} matches {len(names)} containers ({', '.join(names)}); "
                                           f"eagle3ops manages one serving container: scale the service to 1")
    elif need_serving:
        s = r.run(dk.inspect_format(h, pf.serving_container, "{{.State.Status}}"),
                  check=False) if names else None
        pf.add("serving container", bool(s and s.ok and s.stdout.strip() == "running"),
               f"{pf.serving_container}: {s.stdout.strip()}" if s and s.ok else f"no container for {found}")
    if names and len(names) == 1:
        e = r.run(dk.inspect_format(h, pf.serving_container, "{{json .Config.Env}}"), check=False)
        try:
            pairs = json.loads(e.stdout) if e.ok else []
        except ValueError:
            pairs = []
        _inherit(pf, pairs if isinstance(pairs, list) else [], f"serving container {pf.serving_container}", h.name)


def _inherit(pf: Preflight, pairs: list[str], source: str, host: str) -> None:
    """Set ``pf.serving_env`` from serving's environment ``pairs`` and say what the stages inherit (``--dry-run``
    shows it with the checks)."""
    pf.serving_env = inherited_env(pairs)
    if pf.serving_env:
        pf.add("stage environment", True, "stages inherit from " + source + ": " + " ".join(
            f"{k}={v}" for k, v in sorted(pf.serving_env.items())) + f" (hosts.{host}.stage_env overrides)")


def check_process(r: Remote, pf: Preflight, need_serving: bool = True) -> None:
    """Kind ``process``: find the serving process (``pgrep -o -f process_match``) and check that it runs as the SSH
    user (whose restore agent must read its /proc entries and start it again as the same user); sets
    ``pf.process_pid``. Read-only."""
    h = r.host
    pattern = h.serving.process_match or ""
    out = r.run(pc.find_process(pattern), check=False)
    pids = [int(p) for p in out.stdout.split() if p.isdigit()]
    if not pids:
        pf.add("serving process", not need_serving, f"no process matches {pattern!r} (hosts.{h.name}.serving."
                                                   f"process_match): start serving, or fix the pattern")
        return
    pf.process_pid = pids[0]
    status = r.run(hc.cat(f"/proc/{pids[0]}/status"), check=False).stdout
    uid = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("Uid:")), "?")
    me = r.run(pc.my_uid(), check=False).stdout.strip()
    ok = bool(me) and uid == me
    pf.add("serving process", ok, f"pid {pids[0]} (uid {uid})" if ok else
           f"pid {pids[0]} runs as uid {uid}, the SSH user is uid {me or '?'}: eagle3ops records and restores a "
           f"serving process only as its own user; run serving as the SSH user or SSH in as its user")
    if ok:
        env = r.run(hc.cat(f"/proc/{pids[0]}/environ"), check=False).stdout
        _inherit(pf, [a for a in env.split("\0") if a], f"serving process {pids[0]}", h.name)
    if ok:  # can the restore replay what the record will hold?
        argv = [a for a in r.run(hc.cat(f"/proc/{pids[0]}/cmdline"), check=False).stdout.split("\0") if a]
        chains = [[int(w) for w in ln.split() if w.isdigit()]
                  for ln in r.run(pc.port_listeners(h.serving.port), check=False).stdout.splitlines()]
        why = replay_refusal(h.name, pids[0], argv, h.serving.port, {c[0]: c for c in chains if c})
        if why:
            pf.add("serving process record", False, why)


def check_session_kill(r: Remote, pf: Preflight) -> None:
    """Kinds ``process``/``systemd``: will the restore agent outlive the driver's SSH session? Reads systemd-logind's
    settings for the SSH user (:func:`eagle3ops.commands.logind.facts`, read-only) and sets ``pf.agent_detach``
    (:func:`eagle3ops.commands.logind.detach_mode`); a check fails when logind would end the agent with the session
    and no user service can hold it (the message names the fix)."""
    sk = lg.parse(r.run(lg.facts(), check=False).stdout)
    mode, refusal = lg.detach_mode(sk)
    pf.agent_detach = mode
    if refusal:
        pf.add("restore agent", False, refusal)
    elif mode == "user-service":
        pf.add("restore agent", True, f"logind ends {sk.user}'s session processes at logout (KillUserProcesses): the "
                                      f"agent runs as a user service (systemd-run --user; {sk.user} lingers)")


def proc_argv(r: "Remote", pid: int, where: str) -> tuple[list[str], Callable[[str], str | None], str] | None:
    """A host process's command line (``/proc/PID/cmdline``, NUL-separated) and a reader of files as it sees them
    (a relative path from ``/proc/PID/cwd``); None when its cmdline cannot be read. Read-only."""
    out = r.run(hc.cat(f"/proc/{pid}/cmdline"), check=False)
    if not out.ok:
        return None

    def read(path: str) -> str | None:
        res = r.run(hc.cat(path if path.startswith("/") else f"/proc/{pid}/cwd/{path}"), check=False)
        return res.stdout if res.ok else None

    return [a for a in out.stdout.split("\0") if a], read, where


def serving_container(r: Remote) -> tuple[list[str], str]:
    """Find the host's serving container (read-only).

    Returns:
        (names found, what was looked for): kind ``container`` looks up its name, kind ``compose`` the
        container(s) carrying the service's Compose labels. An empty list: no such container (callers then use
        :func:`eagle3ops.commands.serving.default_name`).
    """
    what = driver_kind(r.host).looked_for(r.host)
    out = r.run(sv.find_container_argv(r.host), check=False)
    names = [n for n in out.stdout.split() if n] if out.ok else []
    return names, what
