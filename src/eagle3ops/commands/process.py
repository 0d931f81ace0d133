"""Serving of kind ``process``: vLLM run as a plain process on the host (e.g. from a virtualenv), as argv lists.

The host-side supervisor runs in a container and cannot see or signal the host's processes, so a small POSIX ``sh``
restore agent (:data:`AGENT_SH`), started over SSH by the driver and detached (``setsid nohup``), does the stop and
the restore on the host itself. It talks with the supervisor through files in the window's ``process/`` directory
(the state dir is mounted into the supervisor at the same path):

- the driver records the running process: ``cmdline.nul`` and ``environ.nul`` (``/proc/<pid>/cmdline`` and
  ``environ`` byte for byte), ``cwd`` and ``uid`` (from ``/proc/<pid>/cwd`` and ``status``), ``pid``;
- the supervisor writes ``stop-requested``; the agent sends SIGTERM, waits up to ``stop_timeout_s`` for the process
  to exit (then SIGKILL), waits (bounded, 300 s) for the GPUs to be released where ``nvidia-smi`` exists, and writes
  ``stopped``;
- the supervisor writes ``restore-requested`` after the stages; the agent starts the recorded command line detached
  (``setsid nohup``, ``env -i`` with the recorded environment, in the recorded working directory, its output
  appended to ``serving.log``) and writes ``restored``; the supervisor health-gates it.

The agent restores serving even when the driver or the supervisor dies: it restores once the supervisor container
is gone (or missing for :data:`AGENT_MISSING_GRACE_S`), and in any case after its wait limit. When the supervisor
never asks for the stop (it failed before it), the agent exits having stopped nothing. Its log is ``agent.log``.
"""

from __future__ import annotations

from eagle3ops.commands.docker import docker
from eagle3ops.config import HostConfig

#: Seconds the agent waits for the supervisor's stop request before it exits without stopping anything.
AGENT_STOP_WAIT_S = 600
#: Seconds the supervisor container may be missing (never launched: the driver died) before the agent restores.
AGENT_MISSING_GRACE_S = 120
#: Seconds the agent waits for the GPUs to be released after the stop (hosts with ``nvidia-smi``).
GPU_RELEASE_WAIT_S = 300

#: The restore agent (POSIX sh). Arguments: process dir, pid, stop timeout (s), supervisor container, wait limit for
#: the restore request (s), wait limit for the stop request (s), missing-supervisor grace (s), GPU release wait (s),
#: then the docker command words (``docker`` or ``docker -H URL``) it asks about the supervisor with.
AGENT_SH = r"""
d=$1 pid=$2 stop_s=$3 sup=$4 limit=$5 stop_wait=$6 missing_grace=$7 gpu_wait=$8
shift 8
log() { printf '%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >> "$d/agent.log"; }
now() { date +%s; }
sup_state() {
  out=$("$@" inspect --format '{{.State.Status}}' "$sup" 2>&1)
  case "$out" in *"No such"*|*"no such"*) echo missing ;; running|restarting|created|paused) echo "$out" ;;
    exited|dead|removing) echo gone ;; *) echo unknown ;; esac
}
echo $$ > "$d/agent.pid"
log "agent $$ up for pid $pid; waiting for the stop request"
t0=$(now) missing_since=
while [ ! -e "$d/stop-requested" ]; do
  st=$(sup_state "$@")
  if [ "$st" = gone ]; then log "supervisor $sup ended before asking for the stop: nothing stopped"; exit 0; fi
  if [ $(( $(now) - t0 )) -ge "$stop_wait" ]; then log "no stop request within ${stop_wait}s: nothing stopped"; exit 0; fi
  sleep 1
done
log "stopping pid $pid (SIGTERM, up to ${stop_s}s)"
t1=$(now)
kill -TERM "$pid" 2>/dev/null
while kill -0 "$pid" 2>/dev/null && [ $(( $(now) - t1 )) -lt "$stop_s" ]; do sleep 1; done
if kill -0 "$pid" 2>/dev/null; then log "pid $pid still runs after ${stop_s}s: SIGKILL"; kill -KILL "$pid"; sleep 1; fi
if command -v nvidia-smi >/dev/null 2>&1; then
  t2=$(now)
  while [ -n "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] \
        && [ $(( $(now) - t2 )) -lt "$gpu_wait" ]; do sleep 2; done
  [ $(( $(now) - t2 )) -ge "$gpu_wait" ] && log "GPU memory still held after ${gpu_wait}s; going on"
fi
echo "$(( $(now) - t1 ))" > "$d/stopped.tmp" && mv "$d/stopped.tmp" "$d/stopped"
log "pid $pid stopped"
t3=$(now) missing_since=
while [ ! -e "$d/restore-requested" ]; do
  st=$(sup_state "$@")
  if [ "$st" = gone ]; then log "supervisor $sup ended without asking for the restore: restoring"; break; fi
  if [ "$st" = missing ]; then
    missing_since=${missing_since:-$(now)}
    if [ $(( $(now) - missing_since )) -ge "$missing_grace" ]; then log "supervisor $sup missing: restoring"; break; fi
  else missing_since=; fi
  if [ $(( $(now) - t3 )) -ge "$limit" ]; then log "no restore request within ${limit}s: restoring"; break; fi
  sleep 1
done
if kill -0 "$pid" 2>/dev/null; then
  log "pid $pid runs again: not restoring"; echo "$pid" > "$d/restored"; exit 0
fi
cd "$(cat "$d/cwd")" 2>/dev/null || { log "cannot enter $(cat "$d/cwd"); starting in /"; cd /; }
cat "$d/environ.nul" "$d/cmdline.nul" | setsid nohup xargs -0 -x env -i >> "$d/serving.log" 2>&1 &
launcher=$!
sleep 1
new=$(pgrep -P "$launcher" 2>/dev/null | head -n 1)
echo "${new:-$launcher}" > "$d/restored.tmp" && mv "$d/restored.tmp" "$d/restored"
log "restored: pid ${new:-?} (launcher $launcher), output in $d/serving.log"
"""


def process_dir(window_dir: str) -> str:
    """The window's directory of process-serving files (see the module doc)."""
    return f"{window_dir}/process"


def find_process(pattern: str) -> list[str]:
    """``pgrep -o -f PATTERN``: the pid of the oldest process whose command line matches ``pattern`` (an extended
    regular expression); vLLM's engine processes are its children, so the oldest is the server."""
    return ["pgrep", "-o", "-f", pattern]


def my_uid() -> list[str]:
    """``id -u``: the SSH user's uid."""
    return ["id", "-u"]


_RECORD_SH = r"""
pid=$1 d=$2
mkdir -p "$d" && cat "/proc/$pid/cmdline" > "$d/cmdline.nul" && cat "/proc/$pid/environ" > "$d/environ.nul" \
  && readlink "/proc/$pid/cwd" > "$d/cwd" && awk '/^Uid:/ {print $2}' "/proc/$pid/status" > "$d/uid" \
  && echo "$pid" > "$d/pid" && tr '\0' '\n' < "$d/cmdline.nul"
"""


def record_process(pid: int, pdir: str) -> list[str]:
    """Record the running serving process ``pid`` into ``pdir`` (read as the SSH user, who must own the process):
    ``cmdline.nul`` and ``environ.nul`` byte for byte from ``/proc/<pid>/``, ``cwd``, ``uid`` (real uid from
    ``/proc/<pid>/status``) and ``pid``. Prints the command line, one argument per line."""
    return ["sh", "-c", _RECORD_SH, "eagle3ops-record", str(pid), pdir]


def start_agent(host: HostConfig, *, pdir: str, pid: int, stop_timeout_s: int, supervisor: str,
                limit_s: float) -> list[str]:
    """Start the restore agent (:data:`AGENT_SH`) detached on the host (``setsid nohup``, all output to
    ``<pdir>/agent.log``), so that it outlives the SSH session and the driver.

    Args:
        pdir: the window's process dir (:func:`process_dir`), already holding the record.
        pid: the serving process to stop.
        stop_timeout_s: SIGTERM → SIGKILL grace, seconds.
        supervisor: the window's supervisor container (its end means: restore now).
        limit_s: longest wait (seconds) for the supervisor's restore request before the agent restores anyway.
    """
    launcher = ('a=$1; shift; setsid nohup sh -c "$a" eagle3ops-restore-agent "$@" </dev/null '
                '>>"$1/agent.log" 2>&1 &')
    return ["sh", "-c", launcher, "eagle3ops-launch", AGENT_SH, pdir, str(pid), str(stop_timeout_s), supervisor,
            str(int(limit_s)), str(AGENT_STOP_WAIT_S), str(AGENT_MISSING_GRACE_S), str(GPU_RELEASE_WAIT_S),
            *docker(host)]


def stop_preview(pid: int, stop_timeout_s: int) -> list[str]:
    """What the agent's stop amounts to, as one readable argv (``--dry-run``)."""
    return ["kill", "-TERM", str(pid), f"(then up to {stop_timeout_s}s for it to exit, SIGKILL after; GPUs released)"]


def restore_preview(pdir: str, argv: list[str], cwd: str) -> list[str]:
    """What the agent's restore amounts to, as one readable argv (``--dry-run``): the recorded command line in the
    recorded working directory with the recorded environment (values not shown), detached, output to the log."""
    return ["cd", cwd or "<recorded cwd>", "&&", "setsid", "nohup", "env", "-i", f"<environment of {pdir}/environ.nul>",
            *(argv or ["<recorded command line>"]), ">>", f"{pdir}/serving.log"]
