"""What a command does to the host it runs on, as a type: :class:`Read` (only asks) or :class:`Change` (changes it).

Builders in :mod:`eagle3ops.commands` return one of the two; the executor (:mod:`eagle3ops.executor`) decides from
the type alone what a dry run does: a :class:`Read` runs (so a dry run shows real answers: preflight facts, what the
host holds), a :class:`Change` is recorded and printed but not run. No call site says it again. A bulk load fed by
a stream (``docker load`` behind :mod:`eagle3ops.transfer.streams`) is a :class:`Change`.

Both are frozen and read as a sequence of words, so whatever takes an argv (``render``, ``subprocess``, ``in``,
slicing, iteration) takes them unchanged; a slice is a plain ``list`` (a piece of a command has no kind). A command
equals another of the same kind with the same words, and a plain ``list``/``tuple`` of the same words (what tests
compare builders with); a :class:`Read` never equals a :class:`Change`.

What running one returns is one type too, :class:`Result`, whichever executor ran it (a host over SSH or this
machine), so a caller handles both alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

from eagle3ops.commands.quote import render

__all__ = ["Change", "Command", "Read", "Result", "is_read", "log_command"]


@dataclass(frozen=True, eq=False)
class Command(Sequence[str]):
    """An argument list with its kind (use :class:`Read` or :class:`Change`, never this base).

    Args:
        argv: program and arguments, each a ``str`` (kept as a tuple).

    Raises:
        TypeError: ``argv`` is a string (a shell line, not a word list), or a word is not a ``str``.
    """

    argv: tuple[str, ...]

    def __init__(self, argv: Sequence[str]):
        if isinstance(argv, (str, bytes)):
            raise TypeError(f"{type(self).__name__} takes an argument list, not a string: {argv!r}")
        words = tuple(argv.argv if isinstance(argv, Command) else argv)
        for a in words:
            if not isinstance(a, str):
                raise TypeError(f"argv elements must be str, got {type(a).__name__}: {a!r} in {words!r}")
        object.__setattr__(self, "argv", words)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i):
        return list(self.argv[i]) if isinstance(i, slice) else self.argv[i]

    def __len__(self) -> int:
        return len(self.argv)

    def __iter__(self) -> Iterator[str]:
        return iter(self.argv)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Command):
            return type(other) is type(self) and other.argv == self.argv
        if isinstance(other, (list, tuple)):
            return tuple(other) == self.argv
        return NotImplemented

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.argv))

    def __add__(self, more: Sequence[str]) -> Command:
        """The same kind of command with ``more`` words appended."""
        return type(self)([*self.argv, *more])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self.argv)!r})"


class Read(Command):
    """A command that only asks the host (``cat``, ``docker image inspect``, ``df``): a dry run runs it."""


class Change(Command):
    """A command that changes the host (``mkdir``, ``docker run``, ``docker load`` fed by a stream): a dry run
    prints it and does not run it."""


def is_read(cmd: Sequence[str]) -> bool:
    """Whether ``cmd`` only reads. A plain list (a command no builder typed) counts as a change: a dry run never
    runs a command nobody said was safe to run."""
    return isinstance(cmd, Read)



def log_command(argv: Sequence[str], history: list[str], changes: list[str],
                echo: Callable[[str], None] | None) -> tuple[str, bool]:
    """How every executor logs a command it is given, before it runs it (or, in a dry run, instead): rendered once
    (:func:`eagle3ops.commands.quote.render`), appended to ``history`` and, unless it is a :class:`Read`, to
    ``changes``, then handed to ``echo`` (None: silent). Returns (the rendered command, whether it changes
    something: :func:`is_read` is false).

    Raises:
        TypeError: a word of ``argv`` is not a ``str``.
    """
    cmd = render(argv)
    changes_host = not is_read(argv)
    history.append(cmd)
    if changes_host:
        changes.append(cmd)
    if echo:
        echo(cmd)
    return cmd, changes_host

@dataclass
class Result:
    """What a command returned, from any executor (:class:`eagle3ops.remote.Remote` or
    :class:`eagle3ops.executor.Local`).

    Args:
        argv: the command as run (a plain list).
        exited: its exit status (0 = success).
        stdout, stderr: its output as text; bytes when a local command was run with ``text=False``.
    """

    argv: list[str]
    exited: int
    stdout: Any = ""
    stderr: Any = ""

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.exited == 0

    @property
    def returncode(self) -> int:
        """``exited`` under :class:`subprocess.CompletedProcess`'s name."""
        return self.exited
