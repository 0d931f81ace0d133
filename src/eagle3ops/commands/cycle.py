"""The command lines of ``eagle3ops cycle``'s steps (pure, no I/O): each step that an existing command already does
is that command, run by the driver as a child process of this interpreter (``python -m eagle3ops ...``), so the
cycle adds no second copy of its orchestration, and ``--dry-run`` can print exactly what each step will run.

Every builder returns a :class:`~eagle3ops.commands.types.Change` (the step changes hosts); the inventory file is
named on every line, so the child reads the same hosts the plan was made from.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

from eagle3ops.commands.types import Change, Read

__all__ = ["cycle_journals", "eagle3ops", "extract", "head_sizes", "bound_ports", "log_tail", "parse_ports",
           "proc_cwd", "regenerate", "regenerated_manifests", "report", "serve_container", "session_alive", "speculate",
           "start_process", "step_child", "stop_session", "train", "weights", "write_private"]


def eagle3ops(words: Sequence[str], inventory: Path | str, python: str | None = None) -> Change:
    """``<python> -m eagle3ops WORDS... --inventory FILE`` (``python``: default this interpreter, so the child runs
    the same eagle3ops as the driver)."""
    return Change([python or sys.executable, "-m", "eagle3ops", *words, "--inventory", str(inventory)])


def regenerate(production: str, run: str, inventory: Path | str, datasets: Sequence[Path | str], *,
               held_out: float | None = None, limit: int | None = None, out: Path | str | None = None,
               truncated: str = "error") -> Change:
    """``regenerate PRODUCTION --run RUN --dataset D... --truncated T`` (answers on production's live serving; no
    restart)."""
    words = ["regenerate", production, "--run", run, "--truncated", truncated]
    for d in datasets:
        words += ["--dataset", str(d)]
    if held_out is not None:
        words += ["--held-out", repr(held_out)]
    if limit is not None:
        words += ["--limit", str(limit)]
    if out is not None:
        words += ["--out", str(out)]
    return eagle3ops(words, inventory)


def weights(work: str, production: str, inventory: Path | str, link_mbit: float) -> Change:
    """``weights WORK --from PRODUCTION --link-mbit N`` (verified, resumable; files already there are skipped)."""
    return eagle3ops(["weights", work, "--from", production, "--link-mbit", repr(float(link_mbit))], inventory)


def extract(work: Sequence[str], run: str, pipeline: Path | str, inventory: Path | str, merged: Path | str, *,
            dead: Sequence[str] = ()) -> Change:
    """``extract W... --run RUN --pipeline P --merged M [--dead D]...`` (one host: its window; several: the fleet
    run, sharded; a host with ``serving: none`` stops nothing)."""
    words = ["extract", *work, "--run", run, "--pipeline", str(pipeline)]
    if len(work) > 1:
        words += ["--merged", str(merged)]
        for d in dead:
            words += ["--dead", d]
    return eagle3ops(words, inventory)


def train(host: str, run: str, pipeline: Path | str, inventory: Path | str, merged: Path | str | None) -> Change:
    """``train HOST --run RUN --pipeline P [--from-fleet M]`` (vocab + train; ``merged``: the fleet extract's
    merged manifest, whose hidden states on other hosts are copied to HOST first)."""
    words = ["train", host, "--run", run, "--pipeline", str(pipeline)]
    if merged is not None:
        words += ["--from-fleet", str(merged)]
    return eagle3ops(words, inventory)


def speculate(production: str, run: str, head_host: str, inventory: Path | str,
              prompts_file: Path | str | None = None, *, control: bool = False) -> Change:
    """``speculate PRODUCTION --run RUN --head HEAD_HOST:RUN [--prompts-file F --with-humaneval] --force
    [--control]``: the head fetched from the work host and verified by sha256 on arrival, then the speed gate (keep
    or roll back). ``--force``: a head from elsewhere is estimated offline on production's hidden states of the run,
    which a cycle never extracts there; the cycle's acceptance step measured the head served against the floor
    instead. ``control``: production's speculative image is not its live one (``--control``, like for like)."""
    words = ["speculate", production, "--run", run, "--head", f"{head_host}:{run}"]
    if prompts_file is not None:
        words += ["--prompts-file", str(prompts_file), "--with-humaneval"]
    words += ["--force", *(["--control"] if control else [])]
    return eagle3ops(words, inventory)


def report(production: str, run: str, inventory: Path | str) -> Change:
    """``report PRODUCTION --run RUN`` (reads only; written locally)."""
    return eagle3ops(["report", production, "--run", run], inventory)


#: Runs ``"$@"`` with its output appended to ``$1`` and its exit status written to ``$2`` (through a ``.part`` file
#: renamed, so a reader never sees half a status): a step's command that outlives a killed driver leaves both, and
#: a rerun reads them instead of starting it again.
_STEP_SH = r"""
log=$1 rc=$2
shift 2
echo $$ > "$rc.pid"
"$@" >> "$log" 2>&1
echo $? > "$rc.part" && mv "$rc.part" "$rc"
"""


def step_child(argv: Sequence[str], log: Path | str, rc: Path | str) -> Change:
    """A step's command (``argv``) run so that it outlives its driver: its shell's pid to ``<rc>.pid`` first (a driver
    killed before it journaled the pid still leaves it findable), output to ``log``, exit status to ``rc``
    (:data:`_STEP_SH`). Not a session of its own: the terminal's Ctrl-C still reaches it."""
    return Change(["sh", "-c", _STEP_SH, "eagle3ops-cycle-step", str(log), str(rc), *argv])


def regenerated_manifests(data_dir: str) -> Read:
    """Every run's ``regenerated/dataset.manifest.json`` under ``<data_dir>/runs``, concatenated (the regenerate
    rates this host recorded; parsed by :func:`eagle3ops.speculate.restarts.parse_results`)."""
    return Read(["find", f"{data_dir}/runs", "-mindepth", "3", "-maxdepth", "3", "-type", "f", "-path",
                 "*/regenerated/dataset.manifest.json", "-exec", "cat", "{}", "+"])


def cycle_journals(state_dir: str) -> Read:
    """Every earlier cycle's ``journal.jsonl`` under ``<state_dir>/cycles``, concatenated (its steps' durations:
    :func:`eagle3ops.speculate.cycle.step_durations`)."""
    return Read(["find", f"{state_dir}/cycles", "-mindepth", "2", "-maxdepth", "2", "-type", "f", "-name",
                 "journal.jsonl", "-exec", "cat", "{}", "+"])


def head_sizes(data_dir: str) -> Read:
    """``du -sb`` of every trained head (``<data_dir>/runs/*/train/final``): ``BYTES<TAB>PATH`` per line."""
    return Read(["find", f"{data_dir}/runs", "-mindepth", "3", "-maxdepth", "3", "-type", "d", "-path",
                 "*/train/final", "-exec", "du", "-sb", "{}", "+"])


# ---- the head served on a work host (the cycle's acceptance step) -------------------------------------------------

def bound_ports() -> Read:
    """The local ports of the host's TCP sockets (IPv4 and IPv6, ``/proc/net/tcp*``): listeners and the local ends
    of connections, which a new listener cannot bind either; not those in TIME_WAIT (state ``06``), which a server
    binding with ``SO_REUSEADDR`` (uvicorn's, vLLM's server) may take. One ``ADDR:PORT`` (hex) per line
    (:func:`parse_ports`)."""
    return Read(["awk", 'FNR > 1 && $4 != "06" { print $2 }', "/proc/net/tcp", "/proc/net/tcp6"])


def parse_ports(out: str) -> set[int]:
    """The port numbers of :func:`bound_ports`' output."""
    ports = set()
    for line in out.split():
        try:
            ports.add(int(line.rsplit(":", 1)[1], 16))
        except (IndexError, ValueError):
            continue
    return ports


#: Starts ``cmdline.nul`` in ``cwd`` with exactly ``environ.nul`` (the restore agent's way: ``env -i`` from NUL
#: files, so no value reaches an argv), detached in a session of its own whose id (the launcher's pid: a background
#: job of a non-interactive sh is no group leader, so ``setsid`` execs in place) goes to ``sid``.
_START_SH = r"""
d=$1
cd "$(cat "$d/cwd")" 2>/dev/null || cd /
cat "$d/environ.nul" "$d/cmdline.nul" | setsid nohup xargs -0 -x env -i >> "$d/serving.log" 2>&1 &
echo $! > "$d/sid"
"""


def start_process(d: str) -> Change:
    """Start the process recorded in the private directory ``d`` (``cmdline.nul``, ``environ.nul``, ``cwd``),
    detached in a new session; its session id is written to ``d/sid``, its output appended to ``d/serving.log``."""
    return Change(["sh", "-c", _START_SH, "eagle3ops-cycle-serve", d])


_STOP_SH = r"""
d=$1 t=$2
sid=$(cat "$d/sid" 2>/dev/null) || { echo "stopped: nothing started"; exit 0; }
pkill -TERM -s "$sid" 2>/dev/null
i=0
while pgrep -s "$sid" >/dev/null 2>&1 && [ "$i" -lt "$t" ]; do sleep 1; i=$((i + 1)); done
if pgrep -s "$sid" >/dev/null 2>&1; then pkill -KILL -s "$sid" 2>/dev/null; sleep 1; fi
left=$(pgrep -s "$sid" | tr '
' ' ')
[ -z "$left" ] && echo "stopped: session $sid" || { echo "still running in session $sid: $left"; exit 1; }
"""


def stop_session(d: str, timeout_s: int) -> Change:
    """Stop every process of the session started by :func:`start_process` (its id in ``d/sid``: only what the cycle
    started, never by name): SIGTERM, up to ``timeout_s`` seconds, then SIGKILL. Prints ``stopped: ...``; exits 1
    naming the pids still running after that."""
    return Change(["sh", "-c", _STOP_SH, "eagle3ops-cycle-stop", d, str(int(timeout_s))])


def session_alive(d: str) -> Read:
    """Exits 0 while a process of the session in ``d/sid`` runs, or the launcher whose pid that is: until its
    ``setsid`` has run (a moment after :func:`start_process` returns, longer on a loaded host) the session does not
    exist yet, and a check then must not read the server as gone. A launcher that exited but was not reaped (a
    zombie: the host's init may not reap orphans) is gone."""
    return Read(["sh", "-c", 'sid=$(cat "$1/sid") && { pgrep -s "$sid" >/dev/null || '
                 '{ st=$(ps -o stat= -p "$sid") && [ "${st#Z}" = "$st" ]; }; }', "eagle3ops-cycle-alive", d])


def write_private(path: str) -> Change:
    """Write standard input to ``path``, readable by the SSH user only (``umask 077``), echoing nothing back (the
    served acceptance's environment and command line may hold a key)."""
    return Change(["sh", "-c", 'umask 077 && cat > "$1"', "eagle3ops-write", path])


def proc_cwd(pid: int) -> Read:
    """``readlink /proc/PID/cwd``: a process's working directory."""
    return Read(["readlink", f"/proc/{int(pid)}/cwd"])


def log_tail(path: str, nbytes: int = 3000) -> Read:
    """The last ``nbytes`` of ``path`` (a server's log)."""
    return Read(["tail", "-c", str(int(nbytes)), path])


def serve_container(host: Any, spec: dict[str, Any], env_file: str) -> Change:
    """``docker run --detach`` of the work host's serving ``spec`` (:func:`eagle3ops.commands.serving.run_argv`),
    its environment from ``env_file`` (a private file on the host: values never reach argv)."""
    from eagle3ops.commands.serving import run_argv

    return run_argv(host, spec, env_file=env_file)
