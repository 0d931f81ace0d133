"""Serving of kind ``systemd``: vLLM run by a systemd unit on the host (e.g. ``vllm.service``), as argv lists.

The supervisor runs in a container and cannot run the host's ``systemctl``, so serving of this kind goes through the
same host-side restore agent as kind ``process`` (:mod:`eagle3ops.commands.process`: a POSIX sh script started over
SSH by the driver, detached, talking with the supervisor through files in the window's ``process/`` directory). Its
variant here (:data:`AGENT_SH`) redefines the agent's four hooks: the handle it manages is the unit's name, ``term``
is ``systemctl stop UNIT``, ``alive`` is ``systemctl is-active --quiet UNIT``, ``start_from`` is ``systemctl start
UNIT``; the stop/restore requests, the GPU release wait, the restore when the supervisor dies and ``agent.log`` are
the process agent's own. The unit is recorded by the driver with ``systemctl show -p ExecStart -p Environment -p
ActiveState UNIT`` into ``unit.show`` (:func:`record_unit`, parsed by :func:`parse_show`); a window never edits the
unit, so its restore is the unit as systemd has it.

Releases and rollbacks change the unit the way its users do, with a drop-in (:func:`dropin_path`:
``/etc/systemd/system/<unit>.d/50-eagle3ops-release.conf``, :func:`dropin_text`): ``ExecStart=`` reset then the
release's command line, ``Environment=`` reset then the release's whole environment (the unit's ``Environment=``
as recorded, with the release's changes), so that the drop-in alone decides both whatever earlier drop-ins said. The
supervisor writes the release's drop-in into the process dir (``next.unit.dropin``, mode 0600: it holds the unit's
secrets, a release record); the agent copies it into place (mode 0600), runs ``systemctl daemon-reload`` and starts
the unit. The drop-in found at record time is kept as ``unit.dropin`` (0600); restoring the recorded unit puts it
back, or removes eagle3ops' drop-in when there was none. Secrets never travel in argv: the files carry them.

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
#: Where systemd reads an administrator's drop-ins of a unit (``systemd.unit(5)``, "[Unit] Section Options": drop-in
#: directories ``/etc/systemd/system/<unit>.d/``, applied in file-name order, after the unit file).
DROPIN_DIR = "/etc/systemd/system"
#: eagle3ops' drop-in: the one file a release writes and a rollback replaces or removes.
DROPIN_NAME = "50-eagle3ops-release.conf"

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
start_from() {  # $1: record prefix in $d ('' = the unit as recorded), $2: the file that reports the start
  # A switch (release/rollback) puts the record's drop-in in place (none recorded: eagle3ops' drop-in removed), then
  # has systemd read it; a window starts the unit as systemd has it.
  if [ -e "$d/switch" ]; then
    dd="@DROPIN_DIR@/$pid.d" f="$d/${1}unit.dropin"
    # A drop-in that cannot be put in place is reported (dropin-failed[.k]): the unit still starts, so that serving
    # runs, but the supervisor fails this round rather than gate a unit that runs without the release's change.
    if [ -s "$f" ]; then
      if mkdir -p "$dd" && (umask 077 && cp "$f" "$dd/@DROPIN_NAME@.tmp") && chmod 600 "$dd/@DROPIN_NAME@.tmp" \
         && mv "$dd/@DROPIN_NAME@.tmp" "$dd/@DROPIN_NAME@"; then log "drop-in $dd/@DROPIN_NAME@ written (record '${1:-recorded}')"
      else log "cannot write drop-in $dd/@DROPIN_NAME@"; put "dropin-failed${2#restored}" "cannot write $dd/@DROPIN_NAME@"; fi
    elif [ ! -e "$dd/@DROPIN_NAME@" ] || rm -f "$dd/@DROPIN_NAME@"; then
      log "drop-in $dd/@DROPIN_NAME@ removed (record '${1:-recorded}' has none)"
    else log "cannot remove drop-in $dd/@DROPIN_NAME@"; put "dropin-failed${2#restored}" "cannot remove $dd/@DROPIN_NAME@"
    fi
    systemctl daemon-reload >> "$d/serving.log" 2>&1 || log "systemctl daemon-reload failed (exit $?)"
  fi
  if systemctl start "$pid" >> "$d/serving.log" 2>&1; then log "restored: systemctl start $pid"
  else log "systemctl start $pid failed (exit $?)"; fi
  new=$pid
  put "$2" "$pid"
}
""".replace("@DROPIN_DIR@", DROPIN_DIR).replace("@DROPIN_NAME@", DROPIN_NAME) + pc.AGENT_MAIN_SH


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
d=$1 dropin=$2 obj=$3; shift 3
mkdir -p "$d" && (umask 077 && "$@" > "$d/unit.show") || exit
# `systemctl show` joins ExecStart's words with spaces (a quoted word with a space in it is lost); the bus gives them
# as they are. No busctl, or one without --json (systemd < 240): unit.show's words only.
(umask 077 && busctl --json=short get-property org.freedesktop.systemd1 "$obj" org.freedesktop.systemd1.Service \
  ExecStart > "$d/unit.argv.json" 2>/dev/null) || rm -f "$d/unit.argv.json"
if [ -r "$dropin" ]; then (umask 077 && cat "$dropin" > "$d/unit.dropin") || exit; fi
cat "$d/unit.show"
"""


def record_unit(unit: str, pdir: str) -> Change:
    """Record the unit into ``pdir/unit.show`` (:func:`show_argv`'s output), its ``ExecStart`` word for word into
    ``pdir/unit.argv.json`` (``busctl --json=short get-property``, read by :func:`parse_execstart_json`) and
    eagle3ops' drop-in of it, when one is there, into ``pdir/unit.dropin`` (what restoring the recorded unit puts
    back), all readable by the SSH user only (the command line and environment may hold secrets); print
    ``unit.show``."""
    return Change(["sh", "-c", _RECORD_SH, "eagle3ops-record", pdir, dropin_path(unit), unit_object_path(unit),
                   *show_argv(unit)])


def unit_object_path(unit: str) -> str:
    """The unit's D-Bus object path (pure): ``/org/freedesktop/systemd1/unit/`` + the name with every byte but
    ASCII letters and digits (and a leading digit) written ``_xx`` in hex (systemd's ``bus_label_escape``), e.g.
    ``vllm.service`` → ``.../vllm_2eservice``."""
    out = []
    for i, b in enumerate(unit.encode()):
        c = chr(b)
        out.append(c if (c.isascii() and c.isalpha()) or (c.isdigit() and i > 0) else f"_{b:02x}")
    return "/org/freedesktop/systemd1/unit/" + "".join(out)


def parse_execstart_json(text: str) -> tuple[str, list[str]] | None:
    """The first ``ExecStart`` of ``busctl --json=short get-property ... ExecStart`` output (pure): ``(path,
    argv)``; None when ``text`` is not that (empty, or another shape: the caller falls back to :func:`parse_show`).
    The property's type is ``a(sasbttttuii)`` (``org.freedesktop.systemd1(5)``): path, argv, ignore-errors, times,
    pid, code, status."""
    import json

    try:
        first = json.loads(text)["data"][0]
        path, argv = first[0], first[1]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    if not isinstance(path, str) or not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return None
    return path, argv


def dropin_path(unit: str) -> str:
    """eagle3ops' drop-in of ``unit``: ``/etc/systemd/system/<unit>.d/50-eagle3ops-release.conf``."""
    return f"{DROPIN_DIR}/{unit}.d/{DROPIN_NAME}"


def dropin_writable(unit: str) -> Read:
    """Whether the SSH user may write eagle3ops' drop-in of ``unit`` (read-only): exit 0 when its directory
    (``/etc/systemd/system/<unit>.d``) is writable, or does not exist and ``/etc/systemd/system`` is (the agent
    creates it). The agent that cannot write it would start the unit unchanged."""
    return Read(["sh", "-c", 'd=$1; if [ -d "$d" ]; then test -w "$d"; else test -w "${d%/*}"; fi',
                 "eagle3ops-dropin-check", dropin_path(unit).rsplit("/", 1)[0]])


def switch_preview(unit: str, pdir: str, what: str, gate: list[str]) -> list[list[str]]:
    """What the agent and the supervisor do for a release or rollback once the unit is stopped, as readable argv
    lists (``--dry-run``): the drop-in written from ``pdir/next.unit.dropin`` (``what``: whose it is), daemon-reload,
    start, ``gate``; then, if the gate fails, the unit as recorded put back the same way."""
    drop = dropin_path(unit)
    return [["# write", drop, f"(mode 0600, from {pdir}/next.unit.dropin: {what})"], daemon_reload_argv(),
            start_argv(unit), gate, ["# if the gate fails: roll back to the unit as recorded"], stop_argv(unit),
            ["# restore", drop, f"as recorded ({pdir}/unit.dropin; none: removed)"], daemon_reload_argv(),
            start_argv(unit), gate]


def daemon_reload_argv() -> list[str]:
    """``systemctl daemon-reload``: systemd reads changed unit files and drop-ins (the agent runs it after writing
    or removing the drop-in; shown by ``--dry-run``)."""
    return ["systemctl", "daemon-reload"]


def exec_literal(word: str) -> str:
    """``word`` as a command-line word that systemd passes as it is: every ``$`` doubled (``systemd.service(5)``,
    "Command lines": ``$$`` is a literal ``$``). For words a release adds to a recorded command line."""
    return word.replace("$", "$$")


def _quoted(word: str, command_line: bool) -> str:
    """One word as systemd reads it back unchanged (``systemd.syntax(7)``, "Quoting"; ``systemd.service(5)``,
    "Command lines"): double-quoted with C-style escapes (backslash, double quote, control characters), ``%``
    doubled (specifiers are resolved when the unit is loaded, so the bus and ``systemctl show`` give them resolved).
    ``$`` is left as it is: systemd keeps a command line's ``$VAR``/``$$`` unexpanded until it runs it (measured on
    systemd 252: ExecStart's ``"$$@"`` reads back as ``"$$@"`` over the bus), so recorded words are already in
    systemd's form; a literal word added by a release is written with :func:`exec_literal` first."""
    out = []
    for ch in word:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        elif ch == "%":
            out.append("%%")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def dropin_text(argv: list[str], environ: list[str], path: str = "") -> str:
    """The drop-in of a release (pure): ``[Service]``, ``ExecStart=`` (resetting the unit's) then ``argv`` as one
    command line, ``Environment=`` (resetting the unit's ``Environment=`` lines; ``EnvironmentFile=`` is left as it
    is) then one ``Environment="K=V"`` line per entry of ``environ``, each word quoted by :func:`_quoted`.

    Args:
        argv: the command line in systemd's form (``argv[0]`` the program; as the bus gives ``ExecStart``'s words:
            ``$`` unexpanded, see :func:`_quoted`).
        environ: ``["K=V", ...]``, the unit's whole ``Environment=`` for this release.
        path: the executable systemd ran (``ExecStart``'s ``path=``); when it differs from ``argv[0]`` the line is
            written ``@PATH ARGV0 ...`` (systemd's prefix for a separate ``argv[0]``).

    Raises:
        ValueError: ``argv`` is empty, or an ``environ`` entry has no ``=`` (neither is a setting systemd takes).
    """
    if not argv:
        raise ValueError("a release's drop-in needs a command line (ExecStart): the recorded unit has none")
    bad = [e.split("=", 1)[0] for e in environ if "=" not in e or e.startswith("=")]
    if bad:
        raise ValueError(f"environment entries without `NAME=`: {bad}; each must be NAME=VALUE")
    words = [_quoted(w, True) for w in argv]
    if path and path != argv[0]:  # systemd reads the prefix after unquoting the first word
        words = [_quoted("@" + path, True), *words]
    lines = ["# Written by eagle3ops (a release of this unit); a rollback replaces or removes it.", "[Service]",
             "ExecStart=", "ExecStart=" + " ".join(words), "Environment="]
    lines += ["Environment=" + _quoted(e, False) for e in environ]
    return "\n".join(lines) + "\n"


def start_agent(host: HostConfig, *, pdir: str, unit: str, stop_timeout_s: int, supervisor: str,
                limit_s: float, state_words: list[str] | None = None, detach: str = "setsid",
                stop_wait_s: float = pc.AGENT_STOP_WAIT_S) -> list[str]:
    """Start the systemd variant of the restore agent (:data:`AGENT_SH`) detached on the host, managing ``unit``;
    the arguments are :func:`eagle3ops.commands.process.start_agent`'s, with the unit in place of the pid
    (``stop_wait_s``: a speculate job's baseline is measured before its first stop request)."""
    return pc.start_agent(host, pdir=pdir, pid=unit, stop_timeout_s=stop_timeout_s, supervisor=supervisor,
                          limit_s=limit_s, script=AGENT_SH, state_words=state_words, detach=detach,
                          stop_wait_s=stop_wait_s)


def kill_mode(unit: str) -> Read:
    """``systemctl show -p KillMode --value UNIT``: how ``systemctl stop`` ends the unit's processes (read-only)."""
    return Read(["systemctl", "show", "-p", "KillMode", "--value", unit])


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote in a value: plain words rather than nothing
        return text.split()


def parse_show(text: str) -> dict[str, object]:
    """The unit as :func:`show_argv` printed it (pure): ``{"argv": [...], "environ": ["K=V", ...], "active": str,
    "path": str}`` (``path``: the executable of ``ExecStart``, ``""`` when none).

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
    p = re.search(r"\{ path=(.*?) ; ", props.get("ExecStart", ""))
    return {"argv": _words(m.group(1)) if m else [], "environ": _words(props.get("Environment", "")),
            "active": props.get("ActiveState", ""), "path": p.group(1) if p else ""}
