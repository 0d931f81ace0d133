"""Serving kind ``process`` on the driver side: a plain process, found with ``pgrep``, recorded from /proc and
handed to the host-side restore agent (:mod:`eagle3ops.commands.process`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from eagle3ops.commands import host as hc
from eagle3ops.commands import process as pc
from eagle3ops.commands import stages as st
from eagle3ops.config import HostConfig
from eagle3ops.config.plan import Plan, ReleaseChange
from eagle3ops.window.common import WindowError
from eagle3ops.window.hostfacts import replay_refusal
from eagle3ops.window.kinds.base import (AgentKind, ServingFindings, add_inherited_env, agent_limit_s,
                                         agent_stop_wait_s, check_session_kill, gate_preview, proc_argv,
                                         speculate_preview, stage_previews, supervisor_words)

if TYPE_CHECKING:
    from eagle3ops.remote import Remote


class ProcessKind(AgentKind):
    """A plain process: found with ``pgrep``, recorded from /proc and handed to the host-side restore agent."""

    name = "process"
    record_form = "process"

    def serves_with(self, h: HostConfig) -> str:
        return "a process"

    def preflight(self, r: "Remote", pf: ServingFindings, need_serving: bool) -> None:
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
        gate = gate_preview(plan)
        head = [pc.record_process(plan.process_pid or 0, pdir),
                pc.start_agent(h, pdir=pdir, pid=plan.process_pid or 0, stop_timeout_s=plan.stop_timeout_s,
                               supervisor=st.supervisor_name(plan.window_id), limit_s=agent_limit_s(plan),
                               stop_wait_s=agent_stop_wait_s(plan), state_words=supervisor_words(h, plan),
                               detach=plan.agent_detach),
                pc.stop_preview(plan.process_pid or 0, plan.stop_timeout_s)]
        if plan.kind == "window":
            return [*head, *stage_previews(h, plan), pc.restore_preview(pdir, [], ""), gate]
        if plan.kind in ("release", "speculate"):
            args = (plan.change or ReleaseChange()).args
            target = ["<recorded command line, with:", *args, ">"] if args else ["<recorded command line>"]
        else:
            target = [f"<command line of release {plan.to_release or 'live before the current one'}>"]
        if plan.kind == "speculate":
            return speculate_preview(plan, [*head, pc.restore_preview(pdir, target, "<its recorded cwd>"), gate],
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


def check_process(r: "Remote", pf: ServingFindings, need_serving: bool = True) -> None:
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
        add_inherited_env(pf, [a for a in env.split("\0") if a], f"serving process {pids[0]}", h.name)
    if ok:  # can the restore replay what the record will hold?
        argv = [a for a in r.run(hc.cat(f"/proc/{pids[0]}/cmdline"), check=False).stdout.split("\0") if a]
        chains = [[int(w) for w in ln.split() if w.isdigit()]
                  for ln in r.run(pc.port_listeners(h.serving.port), check=False).stdout.splitlines()]
        why = replay_refusal(h.name, pids[0], argv, h.serving.port, {c[0]: c for c in chains if c})
        if why:
            pf.add("serving process record", False, why)
