"""A recording host: the product's own SSH executor (:class:`eagle3ops.remote.Remote`, its ``run`` and
``record_stream`` unchanged) over a **stand-in** Fabric connection that runs nothing. Each command the product sends
arrives here already rendered (``commands/quote.render``), is recorded in order with its kind and answered by a
small table of facts (default: exit 0, no output).

Kinds, from the command's own type (:mod:`eagle3ops.commands.types`), as ``Remote`` itself decides a dry run:

* ``read``: a :class:`~eagle3ops.commands.types.Read` (facts: ``cat``, ``docker image inspect``, ``df`` ...);
* ``lock``: the deploy lock's acquisition, ``mkdir <state_dir>/lock`` (:func:`eagle3ops.commands.host.mkdir_atomic`
  as :func:`eagle3ops.window.lock.acquire_lock` sends it), and the ``mkdir -p <state_dir>`` that
  :func:`~eagle3ops.window.lock.acquire_lock` sends just before it (the lock's parent: it cannot come later); and
  likewise the cycle's lock on production, ``mkdir <state_dir>/cycles/<run>/lock`` after the ``mkdir -p`` of its
  folder (:meth:`eagle3ops.speculate.cyclerun.CycleJournal.acquire`), and a serving group's lock on its first host,
  ``mkdir <state_dir>/groups/<group>/lock`` (the same journal's lock, :class:`eagle3ops.group.journal.GroupJournal`);
* ``launch``: a container started, whatever the command's type says: ``docker run``/``create``/``start``. Helpers
  that only answer questions (speculate's ``inspect``, the fleet's reach probe and trial) are typed ``Read`` so that a
  dry run shows their real answers, but starting one is a host change all the same;
* ``change``: every other command (a write, a removal, a stream's receiver recorded through ``record_stream``).

:func:`pre_lock_changes` lists the changes sent to a host before its lock: the rule of ARCHITECTURE.md (facts →
checks → plan → lock → writes → launch) is that there are none.

Only the transport is a stand-in (named so here and in the report): no sshd, no engine; what the commands would do
on a real host is not simulated, so a flow is followed only as far as the table of facts carries it
(``stop_at_lock`` ends it at the lock, which is all the ordering rule needs).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eagle3ops.commands import host as hc
from eagle3ops.commands.types import is_read
from eagle3ops.remote import Remote, render

#: (exit status, stdout, stderr) for one command, or None: the default (0, "", "").
Answer = tuple[int, str, str]
Facts = Callable[[list[str], bytes], "Answer | None"]


class LockReached(Exception):
    """The recording host saw its lock taken, with ``stop_at_lock``: the flow ends here (what precedes the lock is
    recorded; nothing after it matters to the ordering rule)."""


@dataclass
class Call:
    """One command as the host received it: ``kind`` (``read`` / ``launch`` / ``change`` / ``lock``), the rendered
    command, its argv, the bytes sent to its standard input and whether a dry-run executor sent it (a dry run
    records a change without sending it)."""

    host: str
    kind: str
    cmd: str
    argv: list[str]
    stdin: bytes = b""
    dry_run: bool = False


@dataclass
class _Out:
    exited: int
    stdout: str
    stderr: str


class _StandInConnection:
    """Stand-in for :class:`fabric.Connection`: ``run(cmd, **kw)`` answers from the facts table (its stdout also
    written to ``out_stream`` when given, as Invoke streams it); nothing runs."""

    gateway = None
    is_connected = True

    def __init__(self, owner: "RecordingRemote"):
        self.owner = owner

    def run(self, cmd: str, *, in_stream: Any = None, out_stream: Any = None, **_: Any) -> _Out:
        data = in_stream.read() if in_stream is not None else b""
        data = data.encode() if isinstance(data, str) else data
        code, out, err = self.owner.answer(cmd, data)
        if out_stream is not None and out:  # Invoke copies stdout to out_stream as it arrives (a streamed command)
            out_stream.write(out)
        return _Out(code, out, err)

    def close(self) -> None:
        pass


@dataclass
class RecordingHost:
    """What every host of one test recorded, in one order (several hosts interleave in a multi-host command).

    Args:
        facts: answers reads (and changes) by argv; None: exit 0, no output.
        stop_at_lock: raise :class:`LockReached` when a host's lock is taken (after recording it).
    """

    facts: Facts | None = None
    stop_at_lock: bool = True
    calls: list[Call] = field(default_factory=list)

    def for_host(self, host: Any, *, dry_run: bool = False, echo: Callable[[str], None] | None = None
                 ) -> "RecordingRemote":
        """An :func:`eagle3ops.executor.for_host` replacement: the product's ``Remote`` over the stand-in."""
        return RecordingRemote(host, dry_run=dry_run, echo=echo, recorder=self)

    def of(self, host: str) -> list[Call]:
        """The calls one host received, in order."""
        return [c for c in self.calls if c.host == host]


def lock_commands(host: Any) -> tuple[str, str]:
    """The rendered commands of ``host``'s lock acquisition: the state dir, then the lock's atomic ``mkdir``."""
    from eagle3ops.window.common import paths

    p = paths(host)
    return render(hc.mkdir_p(p["state"])), render(hc.mkdir_atomic(p["lock"]))


@dataclass
class RecordingRemote(Remote):
    """The product's :class:`~eagle3ops.remote.Remote` whose connection is the stand-in; every command sent through
    ``run`` (and every stream recorded through ``record_stream``) lands in the recorder."""

    recorder: RecordingHost | None = None
    _kinds: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    def _connect(self) -> _StandInConnection:  # the transport, and nothing else, is the stand-in
        if self._conn is None:
            self._conn = _StandInConnection(self)
        return self._conn

    def close(self) -> None:
        self._conn = None

    def _kind(self, argv: Sequence[str]) -> str:
        state, lock = lock_commands(self.host)
        cmd = render(argv)
        if cmd == lock or (cmd == state and not is_read(argv)) or is_cycle_lock(self.host, argv) \
                or is_cycle_lock(self.host, argv, "groups"):
            return "lock"
        if _docker_verb(argv) in ("run", "create", "start"):
            return "launch"
        return "read" if is_read(argv) else "change"

    def run(self, argv: Sequence[str], **kwargs: Any):
        self._kinds[render(argv)] = self._kind(argv)
        if self.dry_run and not is_read(argv):  # recorded by Remote, not sent: record it here too
            self.recorder.calls.append(Call(self.host.name, self._kind(argv), render(argv), list(argv),
                                            dry_run=True))
        return super().run(argv, **kwargs)

    def record_stream(self, argv, note: str = "") -> str:
        cmd = super().record_stream(argv, note)
        self.recorder.calls.append(Call(self.host.name, "change", cmd, list(argv), dry_run=self.dry_run))
        return cmd

    def answer(self, cmd: str, stdin: bytes) -> Answer:
        argv = shlex.split(cmd)
        kind = self._kinds.get(cmd, "change")
        self.recorder.calls.append(Call(self.host.name, kind, cmd, argv, stdin, self.dry_run))
        got = self.recorder.facts(argv, stdin) if self.recorder.facts else None
        if kind == "lock" and argv[1] != "-p" and self.recorder.stop_at_lock:
            raise LockReached(f"{self.host.name}: {cmd}")
        return got if got is not None else (0, "", "")


def is_cycle_lock(host: Any, argv: Sequence[str], folder: str = "cycles") -> bool:
    """Whether ``argv`` takes the cycle's lock on ``host``: ``mkdir <state_dir>/cycles/<run>/lock``, or the
    ``mkdir -p <state_dir>/cycles/<run>`` just before it (the lock's folder), as
    :meth:`eagle3ops.speculate.cyclerun.CycleJournal.acquire` sends them. ``folder="groups"``: a serving group's lock
    (``<state_dir>/groups/<group>/lock``), which the group's journal takes the same way."""
    a = list(argv)
    prefix = f"{host.state_dir}/{folder}/"
    if a[:2] == ["mkdir", "-p"] and len(a) == 3:
        rest = a[2][len(prefix):] if a[2].startswith(prefix) else ""
        return bool(rest) and "/" not in rest
    if a[:1] == ["mkdir"] and len(a) == 2 and a[1].startswith(prefix) and a[1].endswith("/lock"):
        return "/" not in a[1][len(prefix):-len("/lock")]
    return False


def _docker_verb(argv: Sequence[str]) -> str:
    """The Docker CLI's subcommand of ``argv`` (``[timeout -s SIG N] docker [-H ENDPOINT] VERB ...``), or "" for
    another program."""
    a = list(argv)
    if a[:1] == ["timeout"]:  # a bounded command: `timeout -s KILL N COMMAND...`
        a = a[4:] if a[1:2] == ["-s"] else a[2:]
    if not a or a[0] != "docker":
        return ""
    a = a[3:] if len(a) > 2 and a[1] == "-H" else a[1:]
    a = a[1:] if a[:1] == ["container"] else a
    return a[0] if a else ""


def pre_lock_changes(calls: list[Call]) -> list[str]:
    """``host: command`` of each change a host received before its lock (every change, where it never took one).
    A lock's folder (``mkdir -p``) counts as part of the lock only when that host's next command takes the lock in
    it; else it is a change like any other (a group's folder made for a host's marker is not its lock)."""
    locked: set[str] = set()
    out = []
    for i, c in enumerate(calls):
        if c.kind == "lock" and c.argv[1] != "-p":
            locked.add(c.host)
            continue
        if c.kind == "lock":
            nxt = next((n for n in calls[i + 1:] if n.host == c.host), None)
            if nxt is not None and nxt.kind == "lock" and nxt.argv == ["mkdir", f"{c.argv[2]}/lock"]:
                continue
        if c.kind in ("change", "launch", "lock") and c.host not in locked:
            cmd = " ".join(c.cmd.split())  # a script's lines on one line, its head and tail kept
            out.append(f"{c.host}: {cmd if len(cmd) <= 240 else cmd[:100] + ' ... ' + cmd[-130:]}")
    return out


def stdin_of(calls: list[Call], suffix: str) -> bytes:
    """The standard input of the last call whose command ends with ``suffix`` (b"" when none)."""
    hits = [c for c in calls if c.cmd.endswith(suffix)]
    return hits[-1].stdin if hits else b""


__all__ = ["Call", "LockReached", "RecordingHost", "RecordingRemote", "is_cycle_lock", "lock_commands",
           "pre_lock_changes", "stdin_of"]
