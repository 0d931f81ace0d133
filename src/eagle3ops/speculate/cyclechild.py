"""A cycle step's command run as a child that outlives its driver, and adopted by the rerun of a killed driver.

Each step an existing command does (``regenerate``, ``weights``, ``extract``, ``train``, ``speculate``, ``report``)
runs as a child process of the driver (:func:`eagle3ops.commands.cycle.step_child`): its output goes to a log file
and its exit status to a status file, both on the driver's machine, and the child's machine, pid and process start
time are journaled (``child`` event) before the driver follows the log. A driver killed mid-step (``kill -9``, a
closed SSH session to the driver's machine) leaves the child running; it is not killed by a broken pipe, since
nothing it writes goes to the dead driver. The rerun (:class:`StepChild`) finds the step's last ``child`` event
without a later ``done``/``ended`` and, on the same machine:

- the child still runs (the pid is there, not a zombie, with the journaled start time: not a reused pid): it is
  adopted, its log followed until it exits, bounded (:func:`adopt_bound_s`), never a second copy started beside it;
- it finished meanwhile with status 0: its result is taken from its log (the step is not run again);
- it failed, or died with the driver (no status written): the step's command is started again, and resumes on its
  own (answered prompts, verified files, finished shards and stages are kept by each command).

A child journaled on another machine cannot be seen from here: the step is started again (the lock was taken over
with ``--take-over``, which says that machine's driver is dead).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from eagle3ops import executor
from eagle3ops.commands import cycle as cyc
from eagle3ops.speculate.cycle import CycleError, CycleStep, StepFailed

__all__ = ["ChildStillRunning", "StepChild", "adopt_bound_s", "last_child", "proc_start"]

#: The figures a step's command prints on its last JSON line that the journal keeps.
KEPT = ("verdict", "live_release", "mean_acceptance_length")
#: How long an adopted child is waited for when the plan has no estimate of its step (seconds).
DEFAULT_ADOPT_S = 6 * 3600.0


class ChildStillRunning(CycleError):
    """An adopted child still runs after the bounded wait (``pid`` named): rerun to keep waiting, or stop it."""


def proc_start(pid: int) -> str | None:
    """The start time of process ``pid`` (``/proc/PID/stat`` field 22, clock ticks since boot: pid and start
    time name one process, a reused pid has another), or None when it is gone or a zombie (exited, not reaped:
    an orphan whose parent does not reap counts as gone). Linux ``proc(5)``."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after the command name, which may hold spaces
    return None if not fields or fields[0] in ("Z", "X") else fields[19]


def last_child(entries: Sequence[Mapping[str, Any]], step: str) -> dict[str, Any] | None:
    """The step's last ``child`` event with no ``done``/``ended`` of the step after it (None: none). A ``failed``
    does not end it: a rerun that gave up waiting for an adopted child journals ``failed`` while that child still
    runs, and the next rerun must find it again (a child that exited non-zero is told by its status file)."""
    found: dict[str, Any] | None = None
    for e in entries:
        if e.get("step") != step:
            continue
        if e.get("event") == "child":
            found = dict(e)
        elif e.get("event") in ("done", "ended"):
            found = None
    return found


def adopt_bound_s(step: CycleStep) -> float:
    """How long a rerun waits for an adopted child: twice the step's expected seconds plus 10 minutes, or
    :data:`DEFAULT_ADOPT_S` when the plan has no estimate."""
    return DEFAULT_ADOPT_S if step.expected_s is None else 2 * step.expected_s + 600.0


class StepChild:
    """The runner of the steps that are existing commands (``runners[kind]`` of
    :func:`eagle3ops.speculate.cyclerun.run_cycle`).

    ``journal``: the cycle's :class:`~eagle3ops.speculate.cyclerun.CycleJournal` (the ``child`` events);
    ``folder``: this machine's folder for the children's logs and status files; ``echo``: where the child's output
    is passed through; ``bound_s(step)``: seconds an adopted child is waited for; ``poll_s``: how often the log is
    read. Calling it with a step returns ``{"rc": 0, ...}`` plus :data:`KEPT` of the child's last JSON line.

    Raises (from a call):
        StepFailed: the child exited non-zero.
        ChildStillRunning: an adopted child still runs after ``bound_s(step)``.
    """

    def __init__(self, journal: Any, folder: Path, *, echo: Callable[[str], None] = sys.stdout.write,
                 bound_s: Callable[[CycleStep], float] = adopt_bound_s, poll_s: float = 0.2):
        self.journal, self.folder, self.echo, self.bound_s, self.poll_s = journal, folder, echo, bound_s, poll_s

    def __call__(self, step: CycleStep) -> dict[str, Any]:
        prior = last_child(self.journal.entries(), step.key)
        if prior is not None:
            adopted = self._adopt(step, prior)
            if adopted is not None:
                return adopted
        return self._start(step)

    def _adopt(self, step: CycleStep, prior: Mapping[str, Any]) -> dict[str, Any] | None:
        """The result of the child a killed driver left (None: start the step again)."""
        pid, log, rc = prior.get("pid"), Path(str(prior.get("log"))), Path(str(prior.get("rc")))
        if prior.get("machine") != socket.gethostname():
            self.echo(f"[cycle] {step.key}: its command was started on {prior.get('machine')} (pid {pid}), which "
                      f"cannot be seen from here; started again (it resumes on its own)\n")
            return None
        started = prior.get("started")
        if not isinstance(pid, int):  # killed between the start and the pid's journal entry: the child wrote it
            pid, started = _pid_file(rc)
        if pid is not None and proc_start(pid) is not None and proc_start(pid) == started:
            bound = self.bound_s(step)
            self.echo(f"[cycle] {step.key}: its command left by the killed driver still runs (pid {pid}, since "
                      f"{prior.get('t')}): adopted, no second copy started; following {log} (at most {bound:.0f} s)"
                      f"\n")
            self._follow(log, lambda: proc_start(pid) == started, bound, pid, skip=True)
        status = _status(rc)
        if status == 0:
            self.echo(f"[cycle] {step.key}: its command (pid {pid}) finished with status 0 while no driver ran: "
                      f"its result taken, not run again\n")
            return {"rc": 0, "adopted_pid": pid, **_kept(log)}
        why = "died with the driver (no exit status)" if status is None else f"exited {status}"
        self.echo(f"[cycle] {step.key}: its command (pid {pid}) {why}: started again (it resumes on its own)\n")
        return None

    def _start(self, step: CycleStep) -> dict[str, Any]:
        assert step.argv is not None, f"{step.key} has no command"
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        stem = f"{step.key.replace(':', '-')}.{time.strftime('%Y%m%dT%H%M%S')}.{os.getpid()}"
        log, rc = (self.folder / f"{stem}.log").resolve(), (self.folder / f"{stem}.rc").resolve()
        log.touch(mode=0o600)
        # journaled before the start: a driver killed between the start and the pid's entry leaves the child
        # findable by its pid file (``<rc>.pid``), never started twice
        self.journal.record(step.key, "child", machine=socket.gethostname(), pid=None, started=None, log=str(log),
                            rc=str(rc))
        proc = executor.local().popen(cyc.step_child(step.argv, log, rc),
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.journal.record(step.key, "child", machine=socket.gethostname(), pid=proc.pid,
                            started=proc_start(proc.pid), log=str(log), rc=str(rc))
        self._follow(log, lambda: proc.poll() is None, None, proc.pid)
        status = _status(rc)
        if status != 0:
            raise StepFailed(f"`eagle3ops {' '.join(step.argv[3:5])} ...` exited "
                             f"{'without a status' if status is None else status} (its log: {log})", step.hosts)
        return {"rc": 0, **_kept(log)}

    def _follow(self, log: Path, running: Callable[[], bool], bound_s: float | None, pid: int, *,
                skip: bool = False) -> None:
        """Pass the log's new lines through while ``running()``, then the rest (``skip``: start at its end)."""
        deadline = None if bound_s is None else time.monotonic() + bound_s
        with log.open("r", encoding="utf-8", errors="replace") as f:
            if skip:
                f.seek(0, os.SEEK_END)
            while running():
                self._pass(f)
                if deadline is not None and time.monotonic() > deadline:
                    raise ChildStillRunning(f"the step's command left by the killed driver (pid {pid}) still runs "
                                            f"after {bound_s:.0f} s: rerun the cycle to keep waiting for it, or "
                                            f"stop it (`kill {pid}`) and rerun to start it again; its log: {log}")
                time.sleep(self.poll_s)
            self._pass(f)

    def _pass(self, f: Any) -> None:
        chunk = f.read()
        if chunk:
            self.echo(chunk)


def _pid_file(rc: Path) -> tuple[int | None, str | None]:
    """The pid the step's shell wrote to ``<rc>.pid`` (None: no such file) and its start time when that process
    still runs the step (its command line names ``rc``: a reused pid runs something else; None otherwise)."""
    try:
        pid = int(Path(f"{rc}.pid").read_text().strip())
    except (OSError, ValueError):
        return None, None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return pid, None
    return pid, (proc_start(pid) if str(rc).encode() in cmdline else None)


def _status(rc: Path) -> int | None:
    try:
        return int(rc.read_text().strip())
    except (OSError, ValueError):
        return None


def _kept(log: Path) -> dict[str, Any]:
    """:data:`KEPT` of the log's last JSON line."""
    last: dict[str, Any] = {}
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return {}
    for line in lines:
        if line.startswith("{"):
            try:
                last = json.loads(line)
            except ValueError:
                continue
    return {k: last[k] for k in KEPT if k in last} if isinstance(last, dict) else {}
