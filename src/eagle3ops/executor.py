"""The one place executors are made: a host over SSH (:func:`for_host`), this machine (:func:`local`) and the build
Docker engine's SDK client (:func:`engine`); and the one reader of a Python answer from a throwaway container of an
image on a host (:func:`read_in_image`).

Every executor takes the typed commands of :mod:`eagle3ops.commands` (:class:`~eagle3ops.commands.types.Read` or
:class:`~eagle3ops.commands.types.Change`) and decides from the type what a dry run does: a ``Read`` runs, a
``Change`` (or a plain list no builder typed) is printed through ``echo`` and recorded, not run. Each keeps
``history`` (every rendered command, in order) and ``changes`` (those that change something), so a dry run's plan
can be compared with a real run's.

Tests replace an executor here and nowhere else: ``monkeypatch.setattr(executor, "for_host", fake)`` (or
``"local"``). Product modules never construct :class:`eagle3ops.remote.Remote` or call :mod:`subprocess` themselves
(``tests/test_contracts.py`` checks it; the exceptions are listed there with their reasons).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from eagle3ops.commands import docker as dk
from eagle3ops.commands.quote import render
from eagle3ops.commands.types import Result, log_command
from eagle3ops.config import HostConfig

__all__ = ["Executor", "ImageAnswer", "Local", "Result", "engine", "for_host", "local", "read_in_image"]

#: how much of a silent container's output a message quotes: its last lines, at most this many characters
TAIL_LINES, TAIL_CHARS = 3, 600


class Executor(Protocol):
    """What every executor offers (an SSH :class:`eagle3ops.remote.Remote`, a :class:`Local`)."""

    dry_run: bool
    history: list[str]
    changes: list[str]

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float | None = None,
            stdin: Any = None) -> Result:
        """Run one typed command (see the module docstring); returns its :class:`Result`."""


def for_host(host: HostConfig, *, dry_run: bool = False, echo: Callable[[str], None] | None = None):
    """An SSH executor (:class:`eagle3ops.remote.Remote`) for one inventory host, not yet connected (use it as a
    context manager).

    Args:
        host: the validated inventory entry.
        dry_run: run the reads, print and record the changes without running them.
        echo: receives each rendered command before it runs (and the ``#`` notes a caller adds); None: silent.
    """
    from eagle3ops import remote

    return remote.Remote(host, dry_run=dry_run, echo=echo)


class LocalCommandError(subprocess.CalledProcessError):
    """A local command exited non-zero with ``check=True`` (a :class:`subprocess.CalledProcessError`, so callers
    that caught that still do); the message names the command and the tail of its stderr."""

    def __str__(self) -> str:
        err = self.stderr.decode("utf-8", "replace") if isinstance(self.stderr, bytes) else (self.stderr or "")
        tail = "\n".join(err.strip().splitlines()[-8:])
        return f"`{render(self.cmd)}` exited {self.returncode}" + (f"\n{tail}" if tail else "")


@dataclass
class Local:
    """The executor of this machine (the driver or the build machine): local tools run as argv, never through a
    shell.

    Args:
        dry_run: run the reads; record and echo the changes without running them (they "succeed" with empty
            output).
        echo: receives each rendered command before it runs.
        history: every rendered command, in order. changes: those that are not a ``Read``.
    """

    dry_run: bool = False
    echo: Callable[[str], None] | None = None
    history: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)

    def _record(self, argv: Sequence[str]) -> bool:
        """Record ``argv``; True when it must not run (a change in a dry run)."""
        _, changes = log_command(argv, self.history, self.changes, self.echo)
        return self.dry_run and changes

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float | None = None,
            stdin: str | bytes | IO | None = None, text: bool = True, env: dict[str, str] | None = None,
            cwd: str | Path | None = None) -> Result:
        """Run one command here and wait for it.

        Args:
            argv: the command (a ``Read`` or a ``Change``; a plain list counts as a change).
            check: raise :class:`LocalCommandError` on a non-zero exit.
            timeout: seconds before the command is killed (raises :class:`subprocess.TimeoutExpired`).
            stdin: text or bytes sent to its standard input (then EOF), or an open file it reads; None: no input
                (``/dev/null``).
            text: decode stdout/stderr as UTF-8 text (else bytes; ``stdin`` must then be bytes or a file).
            env: the whole environment (None: this process's). cwd: its working directory.

        Raises:
            LocalCommandError: non-zero exit with ``check=True``.
            subprocess.TimeoutExpired: ``timeout`` passed.
            OSError: the program does not exist or cannot start.
        """
        if self._record(argv):
            return Result(list(argv), 0, "" if text else b"", "" if text else b"")
        kwargs: dict[str, Any] = {"capture_output": True, "timeout": timeout, "env": env, "cwd": cwd}
        if isinstance(stdin, (str, bytes)):
            kwargs["input"] = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
        else:
            kwargs["stdin"] = stdin if stdin is not None else subprocess.DEVNULL
        cp = subprocess.run(list(argv), **kwargs)  # noqa: S603 - argv list from commands/, no shell
        out, err = cp.stdout, cp.stderr
        if text:
            out, err = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        if check and cp.returncode != 0:
            raise LocalCommandError(cp.returncode, list(argv), out, err)
        return Result(list(argv), cp.returncode, out, err)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Start a command here without waiting (a stream: ``docker save``, ``zstd``, the bulk ``ssh``, a build
        whose log is followed); ``kwargs`` go to :class:`subprocess.Popen` (pipes, ``bufsize``, ``env``...).

        Raises:
            RuntimeError: in a dry run, for a command that is not a ``Read`` (a stream that changes something is
                never started by a dry run; its caller records it and skips it).
            OSError: the program does not exist or cannot start.
        """
        if self._record(argv):
            raise RuntimeError(f"dry run: `{render(argv)}` changes something and was not started")
        return subprocess.Popen(list(argv), **kwargs)  # noqa: S603 - argv list from commands/, no shell


def local(*, dry_run: bool = False, echo: Callable[[str], None] | None = None) -> Local:
    """The executor of this machine (see :class:`Local`)."""
    return Local(dry_run=dry_run, echo=echo)


def engine(timeout: float | None = None) -> Any:
    """A Docker SDK client of the local (build) engine from the environment (``DOCKER_HOST`` etc.), not yet
    pinged; ``timeout``: seconds per API call (None: the SDK's 60).

    Raises:
        docker.errors.DockerException: the environment names no usable engine.
    """
    import docker

    return docker.from_env() if timeout is None else docker.from_env(timeout=timeout)


@dataclass(frozen=True)
class ImageAnswer:
    """What a throwaway container of an image answered (:func:`read_in_image`).

    Args:
        image: the image that ran.
        exited: the container's exit status (the script's; 125-127 when Docker could not start it); None when the
            executor's result carries none. ok: it exited 0.
        answer: the last line of its stdout that starts with ``{``, parsed as JSON; None when there is no such line
            or it does not parse (a traceback, a killed process), whatever came before it.
        tail: the last :data:`TAIL_LINES` lines of its stderr (of its stdout when stderr is empty), joined by
            `` | ``, at most :data:`TAIL_CHARS` characters: what a message about a missing answer quotes.
    """

    image: str
    exited: int | None
    ok: bool
    answer: dict[str, Any] | None
    tail: str

    def silence(self) -> str:
        """Why there is no answer, for a note or a refusal: ``"IMAGE did not answer (exit N): TAIL"``."""
        return f"{self.image} did not answer (exit {self.exited}): {self.tail}"


def read_in_image(r: Executor, image: str, source: str, *, timeout: float,
                  mounts: tuple[tuple[str, str], ...] = (), stdin: str = "") -> ImageAnswer:
    """Run the Python ``source`` in a throwaway container of ``image`` on the host of ``r``
    (:func:`eagle3ops.commands.docker.run_python_stdin`: ``--rm``, no network, ``mounts`` read-only) and read its
    answer: the last JSON-object line of its stdout (an image's imports may print warnings before it). Read-only;
    a non-zero exit is not raised, so that each caller decides (the answer and the exit status are both kept).

    Args:
        r: the executor of the host whose engine runs the container (its ``host``: the inventory entry; an executor
            without one, :class:`Local`, uses the local client's default engine).
        source: the script; it prints its answer as one JSON object on a line of its own.
        timeout: seconds the container may take (an image that imports vLLM or transformers needs minutes).
        mounts: ``(host path, container path)`` pairs, bound read-only. stdin: the script's standard input (values
            go there, never into the argv the host's process list shows).

    Raises:
        whatever ``r.run`` raises when the command cannot run to its end (the host unreachable, ``timeout`` passed).
    """
    out = r.run(dk.run_python_stdin(getattr(r, "host", None), image, source, mounts=mounts), check=False,
                timeout=timeout, stdin=stdin)
    line = next((ln for ln in reversed((out.stdout or "").splitlines()) if ln.startswith("{")), "")
    try:
        answer = json.loads(line)
    except ValueError:
        answer = None
    tail = " | ".join((out.stderr or out.stdout or "").strip().splitlines()[-TAIL_LINES:])[-TAIL_CHARS:]
    return ImageAnswer(image, getattr(out, "exited", None), out.ok, answer if isinstance(answer, dict) else None, tail)
