"""Serving kind ``systemd`` on the driver side: a systemd unit, recorded with ``systemctl show`` and stopped and
started by the restore agent's systemd variant (:mod:`eagle3ops.commands.systemd`). Windows, releases and rollbacks
(a drop-in), and the speculation gate (``speculate``, ``release --gate``), whose releases are drop-ins too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from eagle3ops.commands import process as pc
from eagle3ops.commands import stages as st
from eagle3ops.commands import systemd as sd
from eagle3ops.config import HostConfig
from eagle3ops.config.plan import Plan, ReleaseChange
from eagle3ops.window.kinds.base import (AgentKind, ServingFindings, agent_limit_s, agent_stop_wait_s,
                                         check_session_kill, gate_preview, proc_argv, speculate_preview,
                                         stage_previews, supervisor_words)

if TYPE_CHECKING:
    from eagle3ops.remote import Remote


class SystemdKind(AgentKind):
    """A systemd unit: recorded with ``systemctl show`` (and its ``ExecStart`` from the bus), stopped and started by
    the restore agent's systemd variant (:mod:`eagle3ops.commands.systemd`). Windows, releases and rollbacks (a
    drop-in, ``daemon-reload``, start, health gate), and the speculation gate: its restarts (the baseline's restart,
    the speculative or changed release, the return to the release live before, the kept one served again) are
    drop-ins written, replaced or removed the same way, each the agent's next round. Tested against a real systemd
    (``tests/test_systemd_real.py``: the agent's stop, group sweep, restore, a release and its rollback, this
    preflight, and a window and ``release --gate`` driven through the CLI on a venv-runtime host)."""

    name = "systemd"
    record_form = None
    release_form = ", written as a drop-in"

    def serves_with(self, h: HostConfig) -> str:
        return f"systemd unit {h.serving.unit!r}"

    def host_refusal(self, r: "Remote") -> str | None:
        """The SSH user must be able to write the unit's drop-in (:func:`eagle3ops.commands.systemd.dropin_writable`):
        a release, a rollback and each of the gate's restarts are that file, and an agent that cannot write it would
        start the unit unchanged while the release is recorded as live."""
        unit = r.host.serving.unit or ""
        if r.run(sd.dropin_writable(unit), check=False).ok:
            return None
        where = sd.dropin_path(unit).rsplit("/", 1)[0]
        return (f"host {r.host.name}: the SSH user ({r.host.user}) cannot write {where}/ (eagle3ops' drop-in of "
                f"{unit}, which releases, rollbacks and the speculation gate switch the unit with); nothing was "
                f"changed. SSH in as root (hosts.{r.host.name}.user), or create {where}/ owned by {r.host.user}")

    def preflight(self, r: "Remote", pf: ServingFindings, need_serving: bool) -> None:
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
                             limit_s=agent_limit_s(plan), stop_wait_s=agent_stop_wait_s(plan),
                             state_words=supervisor_words(r.host, plan), detach=plan.agent_detach))

    def supervisor_commands(self, h: HostConfig, plan: Plan) -> list[list[str]]:
        """The agent runs ``systemctl stop``, the stages run, the agent runs ``systemctl start``, the supervisor
        gates; a release, rollback or speculate job writes (or removes) the drop-in before the start."""
        pdir, unit = plan.process_dir or "?", plan.serving_unit or "?"
        head = [sd.record_unit(unit, pdir),
                sd.start_agent(h, pdir=pdir, unit=unit, stop_timeout_s=plan.stop_timeout_s,
                               supervisor=st.supervisor_name(plan.window_id), limit_s=agent_limit_s(plan),
                               stop_wait_s=agent_stop_wait_s(plan), state_words=supervisor_words(h, plan),
                               detach=plan.agent_detach),
                sd.stop_argv(unit)]
        if plan.kind == "window":
            return [*head, *stage_previews(h, plan), sd.start_argv(unit), gate_preview(plan)]
        args = (plan.change or ReleaseChange()).args
        what = (" ".join(["the recorded command line, with:", *args]) if plan.kind in ("release", "speculate") else
                f"the drop-in of release {plan.to_release or 'live before the current one'} (none: removed)")
        if plan.kind == "speculate":  # the switch there and, when not kept, the unit as recorded put back
            switch = sd.switch_preview(unit, pdir, what, gate_preview(plan))
            return speculate_preview(plan, [*head, *switch[:4]], [sd.stop_argv(unit), *switch[6:]])
        return [*head, *sd.switch_preview(unit, pdir, what, gate_preview(plan))]

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
