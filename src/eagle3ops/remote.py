"""The one executor: runs argv lists on a host over Fabric, quoting them for the shell exactly once.

Every remote command in eagle3ops is built as an argument list by :mod:`eagle3ops.commands` (pure data) and
handed to :meth:`Remote.run`. :func:`render` is the only place where an argv becomes a shell string
(``shlex.join``), so an inventory value with spaces, quotes or ``$(...)`` reaches the host as one literal word.

Host keys are always checked: the user's ``~/.ssh/known_hosts`` and the inventory's ``known_hosts`` file are loaded
and an unknown key is refused (paramiko ``RejectPolicy``), unlike Fabric's default ``AutoAddPolicy``.
"""

from __future__ import annotations

import shlex
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import paramiko
from fabric import Config, Connection
from invoke.exceptions import CommandTimedOut, UnexpectedExit

from eagle3ops.config import HostConfig

#: Seconds of SSH transport keepalive; a dead peer is noticed after a few missed keepalives.
KEEPALIVE_S = 15
#: Seconds to wait for the TCP connect + SSH handshake.
CONNECT_TIMEOUT_S = 20


class RemoteError(Exception):
    """Base class for errors talking to a host."""


class HostUnreachable(RemoteError):
    """The SSH connection could not be made (DNS, refused, timeout, auth, or an unknown host key)."""


class RemoteCommandError(RemoteError):
    """A remote command exited non-zero (or timed out); the message names host, command and stderr tail."""

    def __init__(self, host: str, argv: Sequence[str], exited: int | None, stdout: str, stderr: str, why: str = ""):
        self.host, self.argv, self.exited, self.stdout, self.stderr = host, list(argv), exited, stdout, stderr
        tail = "\n".join((stderr or stdout).strip().splitlines()[-8:])
        what = why or f"exited {exited}"
        super().__init__(f"{host}: `{render(argv)}` {what}" + (f"\n{tail}" if tail else ""))


def render(argv: Sequence[str]) -> str:
    """Quote an argv list for a POSIX shell: the single place where commands become strings.

    Args:
        argv: program and arguments; each element becomes exactly one shell word.

    Raises:
        TypeError: an element is not a ``str`` (a bug in a command builder).
    """
    for a in argv:
        if not isinstance(a, str):
            raise TypeError(f"argv elements must be str, got {type(a).__name__}: {a!r} in {argv!r}")
    return shlex.join(argv)


@dataclass
class Result:
    """What a remote command returned. ``exited`` is the exit status (0 = success)."""

    argv: list[str]
    exited: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.exited == 0


@dataclass
class Remote:
    """A connection to one host of the inventory and the commands run on it.

    Args:
        host: the validated inventory entry.
        dry_run: print each rendered command instead of running it; every run then "succeeds" with empty output.
        echo: callable receiving each rendered command before it runs (for ``--verbose`` and tests).
    """

    host: HostConfig
    dry_run: bool = False
    echo: Callable[[str], None] | None = None
    history: list[str] = field(default_factory=list)
    _conn: Connection | None = field(default=None, init=False, repr=False)

    # --- connection -------------------------------------------------------------------------------------------
    def _connect(self) -> Connection:
        if self._conn is not None and self._conn.is_connected:
            return self._conn
        overrides: dict = {"load_ssh_configs": True, "timeouts": {"connect": CONNECT_TIMEOUT_S}}
        if self.host.ssh_config:
            overrides["ssh_config_path"] = str(self.host.ssh_config)
        config = Config(overrides=overrides)
        connect_kwargs: dict = {"banner_timeout": CONNECT_TIMEOUT_S, "auth_timeout": CONNECT_TIMEOUT_S}
        if self.host.identity_file:
            connect_kwargs["key_filename"] = [str(self.host.identity_file)]
        conn = Connection(
            self.host.hostname,
            user=self.host.user,
            port=self.host.port,
            config=config,
            connect_timeout=CONNECT_TIMEOUT_S,
            connect_kwargs=connect_kwargs,
        )
        # Strict host-key checking: Fabric defaults to AutoAddPolicy; we never do.
        conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        if self.host.known_hosts:
            if not Path(self.host.known_hosts).is_file():
                raise HostUnreachable(
                    f"{self.host.name}: known_hosts file {self.host.known_hosts} does not exist "
                    f"(add the host key with `ssh-keyscan -p PORT HOST >> FILE` after checking its fingerprint)"
                )
            conn.client.load_host_keys(str(self.host.known_hosts))
        try:
            conn.open()
        except paramiko.SSHException as exc:
            if "not found in known_hosts" in str(exc) or isinstance(exc, paramiko.BadHostKeyException):
                raise HostUnreachable(
                    f"{self.host.name}: host key of {self.host.hostname} is not trusted ({exc}). Check its "
                    f"fingerprint and add it to known_hosts; eagle3ops never skips host-key checking."
                ) from None
            raise HostUnreachable(f"{self.host.name}: SSH to {self.host.hostname} failed: {exc}") from None
        except (OSError, socket.timeout) as exc:
            raise HostUnreachable(f"{self.host.name}: cannot connect to {self.host.hostname}: {exc}") from None
        transport = conn.client.get_transport()
        if transport is not None:
            transport.set_keepalive(KEEPALIVE_S)
        self._conn = conn
        return conn

    @property
    def connection(self) -> Connection:
        """The open Fabric connection (opened on first use)."""
        return self._connect()

    def close(self) -> None:
        """Close the SSH connection if open."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- running ----------------------------------------------------------------------------------------------
    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: float | None = None,
        stdin: str | bytes | IO | None = None,
        stream: Callable[[str], None] | None = None,
        mutates: bool = True,
    ) -> Result:
        """Run one command on the host.

        Args:
            argv: the command as an argument list (from :mod:`eagle3ops.commands`).
            check: raise :class:`RemoteCommandError` on a non-zero exit.
            timeout: seconds before the command is abandoned (raises :class:`RemoteCommandError`).
            stdin: text, bytes or a file-like object sent to the command's standard input.
            stream: called with each chunk of stdout as it arrives (live logs).
            mutates: whether the command changes the host; in dry-run, read-only commands (``mutates=False``)
                still print but also run, so a dry run can show real preflight answers.

        Returns:
            :class:`Result` with stdout/stderr as text.

        Raises:
            HostUnreachable: the connection failed.
            RemoteCommandError: non-zero exit with ``check=True``, or timeout.
        """
        cmd = render(argv)
        self.history.append(cmd)
        if self.echo:
            self.echo(cmd)
        if self.dry_run and mutates:
            return Result(list(argv), 0)
        conn = self._connect()
        kwargs: dict = {"hide": True, "warn": True, "timeout": timeout, "in_stream": False}
        if stdin is not None:
            import io

            if isinstance(stdin, bytes):
                stdin = io.BytesIO(stdin)
            elif isinstance(stdin, str):
                stdin = io.StringIO(stdin)
            kwargs["in_stream"] = stdin
        if stream is not None:
            kwargs["out_stream"] = _CallbackStream(stream)
        try:
            r = conn.run(cmd, **kwargs)
        except CommandTimedOut as exc:
            raise RemoteCommandError(self.host.name, argv, None, "", str(exc), why=f"timed out after {timeout}s")
        except UnexpectedExit as exc:  # only without warn=True; kept for safety
            r = exc.result
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise HostUnreachable(f"{self.host.name}: connection lost while running `{cmd}`: {exc}") from None
        result = Result(list(argv), r.exited, r.stdout, r.stderr)
        if check and not result.ok:
            raise RemoteCommandError(self.host.name, argv, r.exited, r.stdout, r.stderr)
        return result

    def run_all(self, commands: Iterable[Sequence[str]], **kwargs) -> list[Result]:
        """Run several commands in order, stopping at the first failure (see :meth:`run`)."""
        return [self.run(c, **kwargs) for c in commands]

    def wait_for(self, argv: Sequence[str], *, timeout: float, interval: float = 2.0) -> Result:
        """Re-run ``argv`` until it exits 0 or ``timeout`` seconds pass.

        Raises:
            RemoteCommandError: still failing at the deadline (the last result's output is in the message).
        """
        deadline = time.monotonic() + timeout
        while True:
            r = self.run(argv, check=False, timeout=max(5.0, interval * 5), mutates=False)
            if r.ok:
                return r
            if time.monotonic() >= deadline:
                raise RemoteCommandError(self.host.name, argv, r.exited, r.stdout, r.stderr,
                                         why=f"did not succeed within {timeout:.0f}s")
            time.sleep(interval)


class _CallbackStream:
    """A write-only text stream that forwards every chunk to a callback (invoke's ``out_stream``)."""

    def __init__(self, cb: Callable[[str], None]):
        self._cb = cb

    def write(self, data: str) -> int:
        self._cb(data)
        return len(data)

    def flush(self) -> None:
        pass
