"""Serving of kind ``process``: vLLM run as a plain process on the host (e.g. from a virtualenv), as argv lists.

The host-side supervisor runs in a container and cannot see or signal the host's processes, so a small POSIX ``sh``
restore agent (:data:`AGENT_SH`), started over SSH by the driver and detached (``setsid nohup``), does the stop and
the restore on the host itself. It talks with the supervisor through files in the window's ``process/`` directory
(the state dir is mounted into the supervisor at the same path):

- the driver records the running process: ``cmdline.nul`` and ``environ.nul`` (``/proc/<pid>/cmdline`` and
  ``environ`` byte for byte), ``cwd`` and ``uid`` (from ``/proc/<pid>/cwd`` and ``status``), ``pid``;
- the supervisor writes ``stop-requested``; the agent takes the process's whole tree (its children and theirs:
  vLLM's engine core and workers; its session when it leads one), taken before any signal because a wrapper that
  does not forward SIGTERM (a shell or ``conda run``) leaves its children re-parented once killed; it sends SIGTERM
  to every one, waits up to ``stop_timeout_s`` (then SIGKILL to each still alive), waits up to 10 s for serving's port
  (``serving.port``) to close, waits (bounded, 300 s) for the GPUs to be released where ``nvidia-smi`` exists, and
  writes ``stopped``; a port still listened on is reported in ``port-held`` (never killed by port: it may be
  anything) and the supervisor then runs no stage;
- the supervisor writes ``restore-requested`` after the stages; the agent starts the recorded command line detached
  (``setsid nohup``, ``env -i`` with the recorded environment, in the recorded working directory, its output
  appended to ``serving.log``) and writes ``restored`` (and ``port-held`` when another server listens on the port
  before the start); the supervisor health-gates it, counting only the process the restore started: the agent
  writes ``exited`` when that process ends before the supervisor writes ``done`` (the gate then fails at once), and
  a ``port-held`` fails the gate.

Releases and rollbacks (``switch`` present in the process dir) go on in rounds ``k = 2, 3, ...`` after the first
start: the supervisor writes ``next.cmdline.nul``, ``next.environ.nul`` and ``next.cwd`` (the process to start) and
``restore-requested`` holding the record prefix to start (``next.``; empty: the recorded process); after each start
the agent writes ``exited[.k]`` when the started process ends, waits for ``done`` (it exits) or
``stop-requested.k`` (it stops the started process, writes ``stopped.k``, then waits for ``restore-requested.k``).
When the supervisor ends or goes missing while the started process is not running, the agent starts the recorded
process again on its own.

The agent restores serving even when the driver or the supervisor dies: it restores once the supervisor container
is gone (or missing for :data:`AGENT_MISSING_GRACE_S`), and in any case after its wait limit. When the supervisor
never asks for the stop (it failed before it), the agent exits having stopped nothing. Its log is ``agent.log``.
"""

from __future__ import annotations

from eagle3ops.commands.docker import docker
from eagle3ops.commands.types import Change, Read
from eagle3ops.config import HostConfig

#: Seconds the agent waits for the supervisor's stop request before it exits without stopping anything.
AGENT_STOP_WAIT_S = 600
#: Seconds the supervisor container may be missing (never launched: the driver died) before the agent restores.
AGENT_MISSING_GRACE_S = 120
#: Seconds the agent waits for the GPUs to be released after the stop (hosts with ``nvidia-smi``).
GPU_RELEASE_WAIT_S = 300

#: The restore agent's functions (POSIX sh), before its main loop (:data:`AGENT_MAIN_SH`). ``term``, ``kill9``,
#: ``alive`` and ``start_from`` are the hooks another serving manager redefines between the two (e.g.
#: :data:`eagle3ops.commands.systemd.AGENT_SH`: a unit stopped and started with ``systemctl``).
AGENT_FUNCS_SH = r"""
d=$1 pid=$2 stop_s=$3 sup=$4 limit=$5 stop_wait=$6 missing_grace=$7 gpu_wait=$8 port=$9
shift 9
(umask 077 && : >> "$d/serving.log")  # private: serving may print its own flags (a key); its umask is left as is
log() { printf '%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >> "$d/agent.log"; }
now() { date +%s; }
term() { kill -TERM "$1" 2>/dev/null; }
kill9() { kill -KILL "$1"; }
alive() { kill -0 "$1" 2>/dev/null && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }
put() { echo "$2" > "$d/$1.tmp" && mv "$d/$1.tmp" "$d/$1"; }
sup_state() {
  out=$("$@" inspect --format '{{.State.Status}}' "$sup" 2>&1)
  case "$out" in *"No such"*|*"no such"*) echo missing ;; running|restarting|created|paused) echo "$out" ;;
    exited|dead|removing) echo gone ;; *) echo unknown ;; esac
}
kids() { for c in $(pgrep -P "$1" 2>/dev/null); do echo "$c"; kids "$c"; done; }
tree() {  # $1 and every process under it: its children and theirs (vLLM's engine and workers), its session if it
  # leads one. Taken before any signal: what a killed wrapper leaves behind is re-parented and no longer under it.
  echo "$1"; kids "$1"
  [ "$(ps -o sid= -p "$1" 2>/dev/null | tr -d ' ')" = "$1" ] && pgrep -s "$1" 2>/dev/null
}
any_alive() { for p in "$@"; do alive "$p" && return 0; done; return 1; }
listen_inodes() {  # socket inodes listening on serving's port (IPv4 and IPv6)
  [ -n "$port" ] && [ "$port" != 0 ] || return 0
  awk -v h=":$(printf '%04X' "$port")" '$4 == "0A" && substr($2, length($2) - 4) == h { print $10 }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
listening() { [ -n "$(listen_inodes)" ]; }
port_pids() {  # the processes (visible to this user) holding a socket listening on serving's port
  for i in $(listen_inodes); do
    for f in /proc/[0-9]*/fd/*; do [ "$(readlink "$f" 2>/dev/null)" = "socket:[$i]" ] && echo "${f#/proc/}"; done
  done | cut -d/ -f1 | sort -u | tr '\n' ' '
}
stop_pid() {  # $1: pid, $2: the file that reports the stop
  pids=$(tree "$1" | sort -u | tr '\n' ' ')
  log "stopping pid $1 and the processes under it ($pids) (SIGTERM, up to ${stop_s}s)"
  t1=$(now)
  for p in $pids; do term "$p"; done
  while any_alive $pids && [ $(( $(now) - t1 )) -lt "$stop_s" ]; do sleep 1; done
  for p in $pids; do if alive "$p"; then log "pid $p still runs after ${stop_s}s: SIGKILL"; kill9 "$p"; fi; done
  sleep 1
  t4=$(now)
  while listening && [ $(( $(now) - t4 )) -lt 10 ]; do sleep 1; done
  # Whatever still listens on serving's port is not in the tree stopped above: it is never killed by port (it may
  # be anything); the supervisor refuses to run stages while it is there.
  if listening; then
    put port-held "port $port is still listened on after the stop (pids: $(port_pids))"
    log "$(cat "$d/port-held")"
  fi
  if command -v nvidia-smi >/dev/null 2>&1; then
    t2=$(now)
    while [ -n "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] \
          && [ $(( $(now) - t2 )) -lt "$gpu_wait" ]; do sleep 2; done
    [ $(( $(now) - t2 )) -ge "$gpu_wait" ] && log "GPU memory still held after ${gpu_wait}s; going on"
  fi
  put "$2" "$(( $(now) - t1 ))"
  log "pid $1 stopped"
}
start_from() {  # $1: record prefix in $d ('' = the recorded process), $2: the file that reports the start
  cd "$(cat "$d/${1}cwd")" 2>/dev/null || { log "cannot enter $(cat "$d/${1}cwd"); starting in /"; cd /; }
  cat "$d/${1}environ.nul" "$d/${1}cmdline.nul" | setsid nohup xargs -0 -x env -i >> "$d/serving.log" 2>&1 &
  launcher=$!
  sleep 1
  new=$(pgrep -P "$launcher" 2>/dev/null | head -n 1)
  put "$2" "${new:-$launcher}"
  new=${new:-$launcher}
  log "restored: pid $new (launcher $launcher, record '${1:-recorded}'), output in $d/serving.log"
}
"""

#: The restore agent's main loop (POSIX sh): wait for the stop request, stop, wait for the restore request (or the
#: supervisor's end), start, and for a switch go on in rounds (see the module doc).
AGENT_MAIN_SH = r"""
echo $$ > "$d/agent.pid"
log "agent $$ up for pid $pid; waiting for the stop request"
t0=$(now) missing_since=
while [ ! -e "$d/stop-requested" ]; do
  st=$(sup_state "$@")
  if [ "$st" = gone ]; then log "supervisor $sup ended before asking for the stop: nothing stopped"; exit 0; fi
  if [ $(( $(now) - t0 )) -ge "$stop_wait" ]; then log "no stop request within ${stop_wait}s: nothing stopped"; exit 0; fi
  sleep 1
done
stop_pid "$pid" stopped
k=1 auto=
while [ "$k" -le 20 ]; do
  s=; [ "$k" -gt 1 ] && s=".$k"
  t3=$(now) missing_since= from=
  while [ -z "$auto" ] && [ ! -e "$d/restore-requested$s" ]; do
    st=$(sup_state "$@")
    if [ "$st" = gone ]; then log "supervisor $sup ended without asking for the restore: restoring"; break; fi
    if [ "$st" = missing ]; then
      missing_since=${missing_since:-$(now)}
      if [ $(( $(now) - missing_since )) -ge "$missing_grace" ]; then log "supervisor $sup missing: restoring"; break; fi
    else missing_since=; fi
    if [ $(( $(now) - t3 )) -ge "$limit" ]; then log "no restore request within ${limit}s: restoring"; break; fi
    sleep 1
  done
  [ -z "$auto" ] && [ -e "$d/restore-requested$s" ] && from=$(cat "$d/restore-requested$s")
  case "$from" in *[!a-z0-9.-]*) log "bad record prefix '$from': restoring the recorded process"; from= ;; esac
  if [ "$k" = 1 ] && alive "$pid"; then
    log "pid $pid runs again: not restoring"; put restored "$pid"; exit 0
  fi
  if listening; then
    put port-held "port $port is listened on before the restore starts serving (pids: $(port_pids)): another server"
    log "$(cat "$d/port-held")"
  else rm -f "$d/port-held"; fi
  start_from "$from" "restored$s"
  if [ ! -e "$d/switch" ]; then  # a window: report the started process's exit until the supervisor's gate is done
    t3=$(now)
    while [ ! -e "$d/done" ]; do
      if ! alive "$new"; then put exited "$new"; log "pid $new exited before the gate was done"; exit 0; fi
      [ "$(sup_state "$@")" = gone ] && { log "supervisor $sup ended: pid $new serves"; exit 0; }
      [ $(( $(now) - t3 )) -ge "$limit" ] && exit 0
      sleep 1
    done
    log "done: pid $new serves"; exit 0
  fi
  k=$((k + 1)) auto= t3=$(now) missing_since= reported=
  while [ ! -e "$d/stop-requested.$k" ]; do
    if [ -e "$d/done" ]; then log "done: pid $new serves"; exit 0; fi
    if [ -z "$reported" ] && ! alive "$new"; then put "exited$s" "$new"; reported=1; log "pid $new exited"; fi
    st=$(sup_state "$@") why=
    if [ "$st" = gone ]; then why="supervisor $sup ended"; fi
    if [ "$st" = missing ]; then
      missing_since=${missing_since:-$(now)}
      [ $(( $(now) - missing_since )) -ge "$missing_grace" ] && why="supervisor $sup missing"
    else missing_since=; fi
    [ $(( $(now) - t3 )) -ge "$limit" ] && why="no request within ${limit}s"
    if [ -n "$why" ]; then
      if alive "$new"; then log "$why: pid $new serves"; exit 0; fi
      log "$why and pid $new is not running: restoring the recorded process"; auto=1; break
    fi
    sleep 1
  done
  [ -z "$auto" ] && stop_pid "$new" "stopped.$k"
done
log "too many switches: exiting"
"""

#: The restore agent (POSIX sh). Arguments: process dir, pid, stop timeout (s), supervisor container, wait limit for
#: the restore request (s), wait limit for the stop request (s), missing-supervisor grace (s), GPU release wait (s),
#: serving's port (``serving.port``; 0: not checked), then the docker command words (``docker`` or ``docker -H URL``) it asks about the supervisor with.
AGENT_SH = AGENT_FUNCS_SH + AGENT_MAIN_SH


def process_dir(window_dir: str) -> str:
    """The window's directory of process-serving files (see the module doc)."""
    return f"{window_dir}/process"


def find_process(pattern: str) -> Read:
    """``pgrep -o -f PATTERN``: the pid of the oldest process whose command line matches ``pattern`` (an extended
    regular expression); vLLM's engine processes are its children, so the oldest is the server."""
    return Read(["pgrep", "-o", "-f", pattern])


_LISTENERS_SH = r"""
port=$1
for i in $(awk -v h=":$(printf '%04X' "$port")" '$4 == "0A" && substr($2, length($2) - 4) == h { print $10 }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null); do
  find /proc/[0-9]*/fd -maxdepth 1 -lname "socket:\[$i\]" 2>/dev/null
done | cut -d/ -f3 | sort -u | while read -r p; do
  chain=$p q=$p n=0
  while [ "$q" -gt 1 ] && [ "$n" -lt 64 ]; do
    q=$(awk '/^PPid:/ {print $2}' "/proc/$q/status" 2>/dev/null)
    [ -n "$q" ] || break
    chain="$chain $q" n=$((n + 1))
  done
  echo "$chain"
done
"""


def port_listeners(port: int) -> Read:
    """The processes (visible to the SSH user) listening on TCP ``port`` (IPv4 and IPv6, from ``/proc/net/tcp*``
    and each process's ``fd`` links, as the restore agent finds them), one line each: the pid, then its parent,
    grandparent, ... up to pid 1. Prints nothing when none is seen."""
    return Read(["sh", "-c", _LISTENERS_SH, "eagle3ops-listeners", str(port)])


def my_uid() -> Read:
    """``id -u``: the SSH user's uid."""
    return Read(["id", "-u"])


_RECORD_SH = r"""
pid=$1 d=$2
umask 077 && mkdir -p "$d" && cat "/proc/$pid/cmdline" > "$d/cmdline.nul" \
  && cat "/proc/$pid/environ" > "$d/environ.nul" && readlink "/proc/$pid/cwd" > "$d/cwd" && awk '/^Uid:/ {print $2}' "/proc/$pid/status" > "$d/uid" \
  && echo "$pid" > "$d/pid" && tr '\0' '\n' < "$d/cmdline.nul"
"""


def record_process(pid: int, pdir: str) -> Change:
    """Record the running serving process ``pid`` into ``pdir`` (read as the SSH user, who must own the process):
    ``cmdline.nul`` and ``environ.nul`` byte for byte from ``/proc/<pid>/``, ``cwd``, ``uid`` (real uid from
    ``/proc/<pid>/status``) and ``pid``, readable by the SSH user only (``umask 077``: the command line and the
    environment may hold secrets). Prints the command line, one argument per line (masked by whoever shows it:
    :mod:`eagle3ops.redact`)."""
    return Change(["sh", "-c", _RECORD_SH, "eagle3ops-record", str(pid), pdir])


def start_agent(host: HostConfig, *, pdir: str, pid: int | str, stop_timeout_s: int, supervisor: str,
                limit_s: float, script: str = AGENT_SH, stop_wait_s: float = AGENT_STOP_WAIT_S,
                state_words: list[str] | None = None, detach: str = "setsid") -> Change:
    """Start the restore agent (:data:`AGENT_SH`) detached on the host (all output to ``<pdir>/agent.log``), so that
    it outlives the SSH session and the driver: ``setsid nohup``, or with ``detach="user-service"`` a transient user
    service (``systemd-run --user --collect``, unit ``eagle3ops-restore-agent-<window>``), which survives a session
    that systemd-logind ends with its processes (:mod:`eagle3ops.commands.logind`).

    Args:
        pdir: the window's process dir (:func:`process_dir`), already holding the record.
        pid: the serving process to stop (with every process under it).
        stop_timeout_s: SIGTERM → SIGKILL grace, seconds.
        supervisor: the window's supervisor container (its end means: restore now).
        limit_s: longest wait (seconds) for the supervisor's restore request before the agent restores anyway.

    Serving's port, checked closed after the stop and free before the restore, is ``host.serving.port``.
        script: the agent (default :data:`AGENT_SH`; another serving manager's variant, e.g.
            :data:`eagle3ops.commands.systemd.AGENT_SH`, takes its own handle for ``pid``).
        detach: ``setsid`` or ``user-service`` (:func:`eagle3ops.commands.logind.detach_mode`).
        stop_wait_s: longest wait (seconds) for the stop request before the agent exits having stopped nothing
            (default :data:`AGENT_STOP_WAIT_S`; a speculate job measures its baseline first, so it waits longer).
        state_words: the command words the agent asks about the supervisor with (``WORDS inspect --format
            {{.State.Status}} NAME``); default ``docker`` for the host's engine. A venv host's supervisor is a
            process: :func:`eagle3ops.commands.venv.state_words` answers in the same words.
    """
    args = [pdir, str(pid), str(stop_timeout_s), supervisor, str(int(limit_s)), str(int(stop_wait_s)),
            str(AGENT_MISSING_GRACE_S), str(GPU_RELEASE_WAIT_S), str(host.serving.port),
            *(state_words if state_words is not None else docker(host))]
    if detach == "user-service":
        unit = "eagle3ops-restore-agent-" + supervisor.removeprefix("eagle3ops-supervisor-")
        log = f"{pdir}/agent.log"
        # systemd expands $VAR and $$ in a unit's command line (systemd.service(5), "Command lines"), and
        # systemd-run's command is one: every $ is doubled so the words reach sh as they are (measured on
        # systemd 252: `$$` arrived as `$`; % specifiers are not expanded there).
        words = [w.replace("$", "$$") for w in ["sh", "-c", script, "eagle3ops-restore-agent", *args]]
        return Change(["systemd-run", "--user", "--collect", "--quiet", "--unit", unit,
                       "-p", f"StandardOutput=append:{log}", "-p", f"StandardError=append:{log}", *words])
    if detach != "setsid":
        raise ValueError(f"detach must be 'setsid' or 'user-service', not {detach!r}")
    launcher = ('a=$1; shift; setsid nohup sh -c "$a" eagle3ops-restore-agent "$@" </dev/null '
                '>>"$1/agent.log" 2>&1 &')
    return Change(["sh", "-c", launcher, "eagle3ops-launch", script, *args])


def stop_preview(pid: int, stop_timeout_s: int) -> list[str]:
    """What the agent's stop amounts to, as one readable argv (``--dry-run``)."""
    return ["kill", "-TERM", str(pid), f"(then up to {stop_timeout_s}s for it to exit, SIGKILL after; GPUs released)"]


def restore_preview(pdir: str, argv: list[str], cwd: str) -> list[str]:
    """What the agent's restore amounts to, as one readable argv (``--dry-run``): the recorded command line in the
    recorded working directory with the recorded environment (values not shown), detached, output to the log."""
    return ["cd", cwd or "<recorded cwd>", "&&", "setsid", "nohup", "env", "-i", f"<environment of {pdir}/environ.nul>",
            *(argv or ["<recorded command line>"]), ">>", f"{pdir}/serving.log"]
