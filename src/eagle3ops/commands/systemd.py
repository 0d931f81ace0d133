"""Serving of kind ``systemd``: vLLM run by a systemd unit on the host (e.g. ``vllm.service``), as argv lists.

The supervisor runs in a container and cannot run the host's ``systemctl``, so serving of this kind goes through the
same host-side restore agent as kind ``process`` (:mod:`eagle3ops.commands.process`: a POSIX sh script started over
SSH by the driver, detached, talking with the supervisor through files in the window's ``process/`` directory). Its
variant here (:data:`AGENT_SH`) redefines the agent's four hooks: the handle it manages is the unit's name, ``term``
is ``systemctl stop UNIT``, ``alive`` is ``systemctl is-active --quiet UNIT``, ``start_from`` is ``systemctl start
UNIT``; the stop/restore requests, the GPU release wait, the restore when the supervisor dies and ``agent.log`` are
the process agent's own. The unit is recorded by the driver with ``systemctl show -p ExecStart -p Environment -p
ActiveState UNIT`` into ``unit.show`` (:func:`record_unit`, parsed by :func:`parse_show`); the unit file itself is
never edited, so a restore is the unit as systemd has it.

The stop ends the unit's whole control group: with ``KillMode=process`` (or ``mixed``/``none``) ``systemctl stop``
ends the main process only, and vLLM's EngineCore and workers would stay holding the GPUs; what is left in the
group after the stop gets SIGTERM, then SIGKILL after the stop timeout (``systemctl kill --kill-who=all``).
Preflight advises ``KillMode=control-group``. Where systemd-logind ends an SSH session's processes
(``KillUserProcesses=yes``), the agent runs as a user service (:mod:`eagle3ops.commands.logind`).

The SSH user must be allowed to ``systemctl stop|start`` the unit (root, or a polkit/sudo rule). Met for real in
``tests/test_systemd_real.py`` (systemd 252 as PID 1 of a container, over SSH: the stop, the group sweep, the
restore, logind); ``tests/test_serving_kinds.py`` checks the driver's side with a named stand-in of ``systemctl``.
"""

from __future__ import annotations

import re
import shlex

from eagle3ops.commands import process as pc
from eagle3ops.commands.types import Change, Read
from eagle3ops.config import HostConfig

#: Properties recorded from the unit.
SHOW_PROPERTIES = ("ExecStart", "Environment", "ActiveState")

#: The systemd variant of the restore agent: the process agent's functions, the hooks redefined for a unit (its
#: ``pid`` argument is the unit's name), then the process agent's main loop.
AGENT_SH = pc.AGENT_FUNCS_SH + r"""
cg_pids() {  # the processes left in the unit's control group (cgroup v2, or v1's name=systemd hierarchy)
  cg=$(systemctl show -p ControlGroup --value "$1" 2>/dev/null)
  [ -n "$cg" ] || return 0
  for f in "/sys/fs/cgroup$cg/cgroup.procs" "/sys/fs/cgroup/unified$cg/cgroup.procs" \
           "/sys/fs/cgroup/systemd$cg/cgroup.procs"; do
    [ -r "$f" ] && { tr '\n' ' ' < "$f"; return 0; }
  done
}
term() {
  systemctl stop "$1" >> "$d/serving.log" 2>&1 || log "systemctl stop $1 failed (exit $?)"
  # KillMode=process|mixed|none: the stop ends the main process only; vLLM's EngineCore and workers stay in the
  # unit's control group holding the GPUs. The whole group goes: SIGTERM, up to the stop timeout, then SIGKILL.
  left=$(cg_pids "$1")
  [ -n "$left" ] || return 0
  log "processes left in $1's control group after systemctl stop (KillMode $(systemctl show -p KillMode --value "$1")): $left; SIGTERM to the group"
  systemctl kill --kill-who=all --signal=SIGTERM "$1" >> "$d/serving.log" 2>&1
  t5=$(now)
  while [ -n "$(cg_pids "$1")" ] && [ $(( $(now) - t5 )) -lt "$stop_s" ]; do sleep 1; done
  if [ -n "$(cg_pids "$1")" ]; then
    log "still in $1's control group after ${stop_s}s: $(cg_pids "$1"); SIGKILL"
    systemctl kill --kill-who=all --signal=SIGKILL "$1" >> "$d/serving.log" 2>&1
  fi
}
kill9() { systemctl kill --kill-who=all --signal=SIGKILL "$1" >> "$d/serving.log" 2>&1; }
alive() { systemctl is-active --quiet "$1"; }
start_from() {  # $1: ignored (a unit has no release records), $2: the file that reports the start
  if systemctl start "$pid" >> "$d/serving.log" 2>&1; then log "restored: systemctl start $pid"
  else log "systemctl start $pid failed (exit $?)"; fi
  new=$pid
  put "$2" "$pid"
}
""" + pc.AGENT_MAIN_SH


def show_argv(unit: str) -> list[str]:
    """``systemctl show -p ExecStart -p Environment -p ActiveState UNIT``: the unit's command line, environment and
    state as ``Key=value`` lines (read-only)."""
    argv = ["systemctl", "show"]
    for p in SHOW_PROPERTIES:
        argv += ["-p", p]
    return [*argv, unit]


def main_pid(unit: str) -> Read:
    """``systemctl show -p MainPID --value UNIT``: the pid of the unit's main process (``0`` when it runs none)."""
    return Read(["systemctl", "show", "-p", "MainPID", "--value", unit])


def is_active(unit: str) -> Read:
    """``systemctl is-active UNIT``: prints ``active`` (exit 0) when the unit runs (read-only)."""
    return Read(["systemctl", "is-active", unit])


def stop_argv(unit: str) -> list[str]:
    """``systemctl stop UNIT`` (what the agent runs on the supervisor's stop request; shown by ``--dry-run``)."""
    return ["systemctl", "stop", unit]


def start_argv(unit: str) -> list[str]:
    """``systemctl start UNIT`` (what the agent runs on the restore request; shown by ``--dry-run``)."""
    return ["systemctl", "start", unit]


_RECORD_SH = r"""
d=$1; shift
mkdir -p "$d" && (umask 077 && "$@" > "$d/unit.show") && cat "$d/unit.show"
"""


def record_unit(unit: str, pdir: str) -> Change:
    """Record the unit into ``pdir/unit.show`` (:func:`show_argv`'s output, readable by the SSH user only: the
    environment may hold secrets) and print it."""
    return Change(["sh", "-c", _RECORD_SH, "eagle3ops-record", pdir, *show_argv(unit)])


def start_agent(host: HostConfig, *, pdir: str, unit: str, stop_timeout_s: int, supervisor: str,
                limit_s: float, state_words: list[str] | None = None, detach: str = "setsid") -> list[str]:
    """Start the systemd variant of the restore agent (:data:`AGENT_SH`) detached on the host, managing ``unit``;
    the arguments are :func:`eagle3ops.commands.process.start_agent`'s, with the unit in place of the pid."""
    return pc.start_agent(host, pdir=pdir, pid=unit, stop_timeout_s=stop_timeout_s, supervisor=supervisor,
                          limit_s=limit_s, script=AGENT_SH, state_words=state_words, detach=detach)


def kill_mode(unit: str) -> Read:
    """``systemctl show -p KillMode --value UNIT``: how ``systemctl stop`` ends the unit's processes (read-only)."""
    return Read(["systemctl", "show", "-p", "KillMode", "--value", unit])


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote in a value: plain words rather than nothing
        return text.split()


def parse_show(text: str) -> dict[str, object]:
    """The unit as :func:`show_argv` printed it (pure): ``{"argv": [...], "environ": ["K=V", ...], "active": str}``.

    ``ExecStart`` is systemd's ``{ path=... ; argv[]=WORDS ; ignore_errors=... ; ... }`` (the first one, when a unit
    has several); its ``argv[]`` and ``Environment``'s space-separated ``K=V`` entries are split like a shell line
    (systemd quotes entries holding spaces). ``EnvironmentFile=`` entries are not read (name the API key with
    ``serving.api_key_file``).
    """
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key not in props:
            props[key] = value
    m = re.search(r"argv\[\]=(.*?) ; ", props.get("ExecStart", ""))
    return {"argv": _words(m.group(1)) if m else [], "environ": _words(props.get("Environment", "")),
            "active": props.get("ActiveState", "")}
