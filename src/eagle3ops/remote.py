"""The one executor: runs argv lists on a host over Fabric, quoting them for the shell exactly once.

Every remote command in eagle3ops is built as an argument list by :mod:`eagle3ops.commands` (pure data) and
handed to :meth:`Remote.run`. :func:`render` is the only place where an argv becomes a shell string
(``shlex.join``), so an inventory value with spaces, quotes or ``$(...)`` reaches the host as one literal word.

Host keys are always checked, on every hop: the target and each ``ProxyJump`` bastion that Fabric builds from
ssh_config get paramiko's ``RejectPolicy`` (Fabric's default is ``AutoAddPolicy``, also for the gateway
connections it makes itself) and the same read-only known_hosts files: the inventory's ``known_hosts``,
``~/.ssh/known_hosts``, ``/etc/ssh/ssh_known_hosts`` and any ``UserKnownHostsFile`` ssh_config gives for that hop.
An unknown key is refused and nothing is ever written back to a known_hosts file.

Two departures from Fabric/Invoke defaults, both measured on the sandbox (2026-11-29):

* standard input: Invoke's runner reads ``in_stream`` one byte per loop turn with a 10 ms nap and decodes it to
  text (2,000 bytes took 21 s; bytes that are not UTF-8 were replaced). :class:`_Runner` sends ``stdin`` as raw
  bytes in 256 KiB chunks and then EOF; a command given no ``stdin`` gets EOF at once (never the driver's tty).
* a connection that died between two commands (sshd killed, host rebooted, NAT timeout) is reopened once when the
  new session cannot even be opened — the command had not started, so the retry cannot run it twice.
"""

from __future__ import annotations

import io
import logging
import os
import re
import shlex
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import paramiko
from fabric import Config, Connection
from fabric.runners import Remote as _FabricRunner
from invoke.exceptions import CommandTimedOut, ThreadException, UnexpectedExit

from eagle3ops import redact
from eagle3ops.commands.host import login_shell, quiet_shell_probe
from eagle3ops.commands.quote import render  # noqa: F401 - the one quoting function, used here
from eagle3ops.commands.types import Change, Read, Result, is_read, log_command
from eagle3ops.config import HostConfig

# paramiko's transport thread logs a failed handshake (a port that never sends an SSH banner) with its traceback;
# with no handler configured, Python's last-resort handler printed it on stderr after the one-line error the driver
# gives (`ConnectFailed`). The driver reports every such failure itself; a NullHandler keeps paramiko's log quiet
# unless the application configures logging.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

#: Seconds of SSH transport keepalive (``keepalive@openssh.com``), and the idle time before the first TCP
#: keepalive probe on the first hop's socket.
KEEPALIVE_S = 15
#: TCP keepalive: a probe every TCP_KEEPINTVL_S after KEEPALIVE_S idle, TCP_KEEPCNT unanswered probes drop the
#: socket, so a silently dead peer is noticed after about 15 + 5 × 4 = 35 s instead of the kernel's ~15 min.
TCP_KEEPINTVL_S = 5
TCP_KEEPCNT = 4
#: Seconds to wait for the TCP connect, and separately for the SSH banner and for authentication (per hop).
CONNECT_TIMEOUT_S = 20
#: Seconds to wait for the server to confirm a new channel (a command session, or a bastion's ``direct-tcpip``).
CHANNEL_OPEN_TIMEOUT_S = 60
#: Bytes per write of a command's standard input.
STDIN_CHUNK = 256 * 1024
#: Seconds for the first-contact probe (``true``) that proves the host's shell prints nothing.
QUIET_PROBE_TIMEOUT_S = 30

#: Start-up files each login shell reads for a non-interactive SSH command (bash(1) INVOCATION: bash started by
#: sshd reads ~/.bashrc even when not interactive; zsh(1) STARTUP/SHUTDOWN FILES: ~/.zshenv always), most likely
#: first; /etc files last.
_STARTUP_FILES = {
    "bash": ("~/.bashrc", "/etc/bash.bashrc"),
    "zsh": ("~/.zshenv", "/etc/zsh/zshenv"),
}


class RemoteError(Exception):
    """Base class for errors talking to a host."""


class HostUnreachable(RemoteError):
    """The SSH connection could not be made or was lost (DNS, refused, timeout, auth, an untrusted host key on any
    hop); the message (one line) names the host, the hop and the fix."""

    def __init__(self, message: str):
        super().__init__(re.sub(r"\s*\n\s*", " ", message.strip()))  # one line, whatever the cause's text holds


class ConnectFailed(HostUnreachable):
    """The connection could not be made at all: nothing ran on the host. Raised within the connect bound (TCP
    connect, then SSH banner, then authentication, each at most ``connect_timeout`` seconds per hop); retrying at
    once does not help (wrong address, no sshd or a silent port, refused key, untrusted host key)."""


class ShellNotQuiet(ConnectFailed):
    """The host's shell prints on non-interactive SSH commands (a banner or ``conda activate`` in ``~/.bashrc``):
    every command's output, and every byte stream, would arrive with that text in front. Raised at first contact,
    before any command of the caller's runs; a :class:`ConnectFailed`, so nothing retries it."""


class ConnectionLost(HostUnreachable):
    """An established connection died while a command ran (or no session could be opened on it after one
    reconnect); the command may or may not have run. A retry of an idempotent step may pass."""


class RemoteCommandError(RemoteError):
    """A remote command exited non-zero (or timed out); the message names host, command and stderr tail."""

    def __init__(self, host: "str | HostConfig", argv: Sequence[str], exited: int | None, stdout: str, stderr: str,
                 why: str = ""):
        """``host``: its name, or its inventory entry (its ``secret_env`` names are then masked too)."""
        names = getattr(host, "secret_env", ())
        host = getattr(host, "name", host)
        self.host, self.argv, self.exited, self.stdout, self.stderr = host, list(argv), exited, stdout, stderr
        tail = "\n".join((stderr or stdout).strip().splitlines()[-8:])
        what = why or f"exited {exited}"
        # the message is printed and may be logged: the command line and its output with their secrets masked
        super().__init__(redact.text(f"{host}: `{render(argv)}` {what}" + (f"\n{tail}" if tail else ""), names))


class _SessionOpenFailed(Exception):
    """Opening the session channel failed: the command never started, so running it again is safe."""


def _hop_name(c: Connection) -> str:
    return f"{c.user}@{c.host}:{c.port}"


def _gateway_chain(conn: Connection) -> list[Connection]:
    """The ``ProxyJump`` hops Fabric built for ``conn``, first hop (the one dialled directly) first."""
    chain: list[Connection] = []
    gw = conn.gateway
    while isinstance(gw, Connection):
        chain.append(gw)
        gw = gw.gateway
    return chain[::-1]


@dataclass
class Remote:
    """A connection to one host of the inventory and the commands run on it.

    The host's ``hostname`` may be an ssh_config alias (``ssh_config`` key, else ``~/.ssh/config``); its
    ``ProxyJump`` hops are dialled in order, each with strict host-key checking (see the module docstring). The
    inventory's ``identity_file`` is offered on every hop, after any ``IdentityFile`` ssh_config names for it.

    Args:
        host: the validated inventory entry.
        dry_run: print each rendered command instead of running it; every run then "succeeds" with empty output.
        echo: callable receiving each rendered command before it runs (for ``--verbose`` and tests).
        history: every rendered command given to :meth:`run`, in order (read-only ones included); in a dry run, the
            plan that was printed.
        changes: the rendered commands of ``history`` that change the host (every command that is not a
            :class:`eagle3ops.commands.types.Read`), in order: in a dry run exactly those that were printed and not
            run; a test compares them with a real run's.
        connect_timeout: seconds for each hop's TCP connect, SSH banner and authentication (whole seconds: Fabric
            truncates to int; at least 1); default the inventory's ``connect_timeout_s``, else
            :data:`CONNECT_TIMEOUT_S` as it is when the Remote is made.
    """

    host: HostConfig
    dry_run: bool = False
    echo: Callable[[str], None] | None = None
    history: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    connect_timeout: float | None = None
    _conn: Connection | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.connect_timeout is None:
            self.connect_timeout = self.host.connect_timeout_s or CONNECT_TIMEOUT_S

    # --- connection -------------------------------------------------------------------------------------------
    def _known_hosts_files(self, c: Connection) -> list[Path]:
        files: list[Path] = []
        if self.host.known_hosts:
            if not Path(self.host.known_hosts).is_file():
                raise ConnectFailed(
                    f"{self.host.name}: known_hosts file {self.host.known_hosts} (inventory key `known_hosts`) does "
                    f"not exist; add the host key with `ssh-keyscan -p PORT HOST >> FILE` after checking its "
                    f"fingerprint")
            files.append(Path(self.host.known_hosts))
        extra = str(c.ssh_config.get("userknownhostsfile", "") or "")
        for name in [*shlex.split(extra), "~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts"]:
            p = Path(os.path.expanduser(name))
            if p.is_file() and p not in files:
                files.append(p)
        return files

    def _trust(self, c: Connection) -> list[Path]:
        """Strict host-key checking on one hop: RejectPolicy + read-only known_hosts (never saved back)."""
        c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        files = self._known_hosts_files(c)
        for f in files:
            c.client.load_system_host_keys(str(f))
        return files

    def _new_connection(self) -> Connection:
        timeout = max(1, int(self.connect_timeout))
        connect_kwargs: dict = {"banner_timeout": timeout, "auth_timeout": timeout,
                                "channel_timeout": CHANNEL_OPEN_TIMEOUT_S}
        if self.host.identity_file:
            connect_kwargs["key_filename"] = [str(self.host.identity_file)]
        # connect_kwargs live in the config (not the constructor) so that the gateway Connections Fabric builds for
        # ProxyJump, which only get a clone of the config, use the same timeouts and identity.
        overrides: dict = {"load_ssh_configs": True, "timeouts": {"connect": timeout},
                           "connect_kwargs": connect_kwargs, "runners": {"remote": _Runner}}
        if self.host.ssh_config:
            if not Path(self.host.ssh_config).is_file():
                raise ConnectFailed(f"{self.host.name}: ssh_config file {self.host.ssh_config} (inventory key "
                                      f"`ssh_config`) does not exist; fix the path or remove the key")
            overrides["ssh_config_path"] = str(self.host.ssh_config)
        try:
            config = Config(overrides=overrides)
            conn = Connection(self.host.hostname, user=self.host.user, port=self.host.port, config=config,
                              connect_timeout=timeout)
        except (paramiko.SSHException, ValueError, OSError) as exc:  # bad ssh_config syntax, bad ProxyJump
            raise ConnectFailed(f"{self.host.name}: cannot use ssh settings for {self.host.hostname}: {exc}"
                                  ) from None
        self._check_jump_kept(conn)
        return conn

    def _check_jump_kept(self, conn: Connection) -> None:
        """Refuse when ssh_config asks for a ProxyJump that Fabric silently dropped.

        Fabric (``Connection.get_gateway``, 3.2) skips the whole ProxyJump when a hop's host string equals the
        target's resolved HostName — its guard against a host proxying through itself — even if the hop's port
        differs. The connection would then go straight to the target, not through the bastion.

        Raises:
            HostUnreachable: a ProxyJump was configured, no gateway was built, and the skipped hop is a different
                endpoint (other port) than the target.
        """
        jump = str(conn.ssh_config.get("proxyjump", "") or "").strip()
        if not jump or jump.lower() == "none" or conn.gateway:
            return
        for hop in jump.split(","):
            sh = conn.derive_shorthand(hop)
            port = int(sh["port"] or conn.config.base_ssh_config.lookup(sh["host"]).get("port", 22))
            if sh["host"] == conn.host and port != conn.port:
                raise ConnectFailed(
                    f"{self.host.name}: ssh_config gives {self.host.hostname} `ProxyJump {jump}`, but the hop "
                    f"{hop} has the same address as the target's HostName ({conn.host}), so Fabric would skip the "
                    f"jump and connect directly. Give the bastion a Host alias of its own in ssh_config (`Host "
                    f"bastion` / `HostName {conn.host}` / `Port {port}`) and write `ProxyJump bastion`.")

    def _unreachable(self, exc: BaseException, hop: Connection, hops: list[Connection], files: list[Path]
                     ) -> ConnectFailed:
        """Turn a paramiko/socket error on ``hop`` into a message naming host, hop and fix."""
        where = _hop_name(hop)
        if len(hops) > 1:
            role = "target" if hop is hops[-1] else f"bastion (hop {hops.index(hop) + 1} of {len(hops)})"
            where = f"{role} {where}"
        first = str(files[0]) if files else "~/.ssh/known_hosts"
        known = ", ".join(str(f) for f in files) or "none found"
        port = hop.port
        if isinstance(exc, paramiko.BadHostKeyException):
            return ConnectFailed(
                f"{self.host.name}: host key of {where} does NOT match the one in known_hosts ({known}): "
                f"got {exc.key.get_name()} {exc.key.fingerprint}. Either the host was reinstalled or someone is "
                f"in the middle; verify the fingerprint out of band, then replace its line in {first}.")
        if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
            server = re.search(r"Server '([^']*)'", str(exc))
            return ConnectFailed(
                f"{self.host.name}: host key of {where} ({server.group(1) if server else hop.host}) is not in "
                f"known_hosts ({known}); refused. Check its fingerprint (`ssh-keyscan -p {port} {shlex.quote(hop.host)} | "
                f"ssh-keygen -lf -` against the host's own `ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub`) and add "
                f"the key to {first}; eagle3ops never skips host-key checking.")
        if isinstance(exc, paramiko.AuthenticationException):
            return ConnectFailed(
                f"{self.host.name}: authentication as {hop.user} on {where} failed ({exc}); check `identity_file` "
                f"/ ssh_config IdentityFile / the agent, and the key in the user's authorized_keys.")
        if isinstance(exc, paramiko.ChannelException) and hop.gateway:
            return ConnectFailed(
                f"{self.host.name}: the bastion in front of {where} refused to forward to it ({exc}); check the "
                f"bastion's `AllowTcpForwarding` and the target address/port in ssh_config.")
        if isinstance(exc, socket.gaierror):
            return ConnectFailed(f"{self.host.name}: cannot resolve {where}: {exc}; check `hostname` / "
                                   f"ssh_config HostName")
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return ConnectFailed(f"{self.host.name}: connecting to {where} timed out after "
                                   f"{self.connect_timeout:.0f}s (host down or port filtered?)")
        if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
            return ConnectFailed(f"{self.host.name}: cannot connect to {where}: connection refused ({exc}); "
                                   f"is sshd running on that port?")
        if isinstance(exc, paramiko.SSHException) and (
                "banner" in str(exc) or str(exc) in ("No existing session", "Negotiation failed.")):
            # paramiko's own negotiation deadline (= the connect timeout) races its banner timeout; either way the
            # peer accepted TCP but did not complete the SSH handshake in time.
            return ConnectFailed(f"{self.host.name}: SSH handshake with {where} did not complete within "
                                   f"{max(1, int(self.connect_timeout))}s (no or slow SSH banner: is that port an "
                                   f"sshd? is the host overloaded?) ({exc})")
        if isinstance(exc, paramiko.SSHException):
            return ConnectFailed(f"{self.host.name}: SSH handshake with {where} failed: {exc}")
        return ConnectFailed(f"{self.host.name}: cannot connect to {where}: {type(exc).__name__}: {exc}")

    def _connect(self) -> Connection:
        if self._conn is not None and self._conn.is_connected:
            return self._conn
        self.close()
        conn = self._new_connection()
        hops = [*_gateway_chain(conn), conn]
        trusted: dict[int, list[Path]] = {}
        for c in hops:
            trusted[id(c)] = self._trust(c)
        try:
            for c in hops:  # first hop first; each later hop tunnels through the one before (direct-tcpip)
                try:
                    c.open()
                except (paramiko.SSHException, OSError, EOFError) as exc:
                    raise self._unreachable(exc, c, hops, trusted[id(c)]) from None
                _tune(c)
        except BaseException:
            for c in reversed(hops):
                c.client.close()
            raise
        self._check_quiet_shell(conn)
        self._conn = conn
        return conn

    def _check_quiet_shell(self, conn: Connection) -> None:
        """Prove the host's shell prints nothing for a non-interactive command (``true``).

        eagle3ops reads command output as data (JSON, container names, sizes) and sends bytes (weights, heads,
        images) through commands' standard streams: text a start-up file prints before every command would be read
        as data or land at the front of a file. Only standard output counts: a start-up file's warnings on standard
        error (a locale warning, say) corrupt nothing and are common.

        Raises:
            ShellNotQuiet: ``true`` printed on standard output; the message gives the byte count, the first
                bytes, the start-up files the login shell reads and the fix. The connection is closed.
        """
        def run(argv: Sequence[str]) -> str:
            r = conn.run(render(argv), hide=True, warn=True, timeout=QUIET_PROBE_TIMEOUT_S,
                         in_stream=io.BytesIO(b""), encoding="utf-8")
            return r.stdout

        try:
            noise = run(quiet_shell_probe())
            if not noise:
                return
            shell = run(login_shell())
            shell = shell[len(noise):] if shell.startswith(noise) else shell
        except (paramiko.SSHException, OSError, EOFError, ThreadException, CommandTimedOut) as exc:
            for c in [conn, *reversed(_gateway_chain(conn))]:
                c.client.close()
            raise ConnectFailed(f"{self.host.name}: the first command on {conn.user}@{conn.host}:{conn.port} "
                                f"(`true`) did not complete: {type(exc).__name__}: {exc}") from None
        for c in [conn, *reversed(_gateway_chain(conn))]:
            c.client.close()
        name = Path(shell.strip()).name or "the login shell"
        files = _STARTUP_FILES.get(name, ("~/.profile", "the login shell's start-up files"))
        nbytes = len(noise.encode("utf-8"))
        port = "" if conn.port == 22 else f"-p {conn.port} "
        head = redact.text(noise if len(noise) <= 80 else noise[:80] + "...", self.host.secret_env)
        raise ShellNotQuiet(
            f"{self.host.name}: the shell of {conn.user}@{conn.host} prints {nbytes} bytes before every "
            f"non-interactive command (`true` printed {head!r}); command output and byte streams (weights, heads, "
            f"images) would arrive with them in front. Likely {' or '.join(files)} ({name}): make it print only in "
            f"interactive shells, e.g. put `[[ $- == *i* ]] || return` before the lines that print (conda "
            f"activate, echo, fortune), then run `ssh {port}{conn.user}@{conn.host} true | wc -c` until it says 0")

    @property
    def connection(self) -> Connection:
        """The open Fabric connection (opened on first use)."""
        return self._connect()

    def close(self) -> None:
        """Close the SSH connection (and its bastion hops) if open."""
        if self._conn is not None:
            for c in [self._conn, *reversed(_gateway_chain(self._conn))]:
                try:
                    c.close()
                except Exception:  # noqa: BLE001 - closing a dead connection must not raise
                    pass
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
    ) -> Result:
        """Run one command on the host.

        What a dry run does follows from the command's type alone: a :class:`~eagle3ops.commands.types.Read` is
        printed and run (so a dry run shows real preflight answers); a
        :class:`~eagle3ops.commands.types.Change`, or a plain list no builder typed, is printed and recorded in
        :attr:`changes` but not run (the result "succeeds" with empty output).

        Args:
            argv: the command (from :mod:`eagle3ops.commands`: a ``Read`` or a ``Change``).
            check: raise :class:`RemoteCommandError` on a non-zero exit.
            timeout: seconds before the command is abandoned (its channel is closed; raises
                :class:`RemoteCommandError` "timed out").
            stdin: text (sent as UTF-8), bytes, or a binary/text file-like object sent to the command's standard
                input byte for byte, followed by EOF. None: the command's stdin is closed at once.
            stream: called with each chunk of stdout (decoded UTF-8 text) as it arrives (live logs).

        Returns:
            :class:`Result` with stdout/stderr as text (UTF-8, undecodable bytes replaced).

        Raises:
            ConnectFailed: the connection could not be made (bounded by ``connect_timeout`` per hop and phase).
            ConnectionLost: the connection was lost while the command ran (both are :class:`HostUnreachable`).
            RemoteCommandError: non-zero exit (or death by a signal) with ``check=True``, or timeout.
        """
        cmd, changes = log_command(argv, self.history, self.changes, self.echo)
        if self.dry_run and changes:
            return Result(list(argv), 0)
        kwargs: dict = {"hide": True, "warn": True, "timeout": timeout, "in_stream": _in_stream(stdin),
                        "encoding": "utf-8"}
        if stream is not None:
            kwargs["out_stream"] = _CallbackStream(stream)  # invoke un-hides stdout when out_stream is given
        for attempt in (1, 2):
            conn = self._connect()
            started = time.monotonic()  # this attempt's command: its timeout runs from here
            try:
                r = conn.run(cmd, **kwargs)
                break
            except _SessionOpenFailed as exc:
                # The transport looked alive but could not open a channel (peer gone): reconnect once.
                self.close()
                if attempt == 2:
                    raise ConnectionLost(f"{self.host.name}: cannot open a session to run `{cmd}` after "
                                          f"reconnecting: {exc}") from None
            except CommandTimedOut as exc:
                res = exc.result
                raise RemoteCommandError(self.host, argv, None, res.stdout, res.stderr,
                                         why=f"timed out after {timeout}s") from None
            except UnexpectedExit as exc:  # only without warn=True; kept for safety
                r = exc.result
                break
            except (paramiko.SSHException, OSError, EOFError, ThreadException) as exc:
                self.close()
                raise ConnectionLost(f"{self.host.name}: connection lost while running `{cmd}`: {exc}") from None
        exited = r.exited
        if exited == -1:  # paramiko: the channel closed without an exit status
            self._no_exit_status(conn, argv, cmd, r, check=check, timeout=timeout, started=started)
        result = Result(list(argv), exited, r.stdout, r.stderr)
        if check and not result.ok:
            raise RemoteCommandError(self.host, argv, exited, r.stdout, r.stderr)
        return result

    def _no_exit_status(self, conn: Connection, argv: Sequence[str], cmd: str, r, *, check: bool,
                        timeout: float | None, started: float) -> None:
        """Judge a command whose channel closed without an exit status (invoke result ``r``, ``r.exited == -1``);
        returns (the caller records exit -1) only when the connection is alive and ``check`` is off.

        Raises:
            ConnectionLost: the transport is gone (the command may or may not have finished on the host).
            RemoteCommandError: with ``check``: "timed out" when ``timeout`` seconds have passed since ``started``
                (``time.monotonic()`` when this attempt's command started), else "ended without an exit status".
        """
        transport = conn.client.get_transport()
        if transport is None or not transport.is_active():
            self.close()
            raise ConnectionLost(f"{self.host.name}: connection lost while running `{cmd}` (no exit status; "
                                  f"it may or may not have finished on the host)")
        if check:
            # invoke's timer closed the channel, but on a loaded machine the result can come back before its
            # timeout flag is read (no CommandTimedOut; seen in CI on 2026-12-02): past the timeout, it timed out
            timed_out = timeout is not None and time.monotonic() - started >= timeout
            raise RemoteCommandError(self.host, argv, None, r.stdout, r.stderr,
                                     why=(f"timed out after {timeout}s" if timed_out
                                          else "ended without an exit status (killed by a signal?)"))

    def record_stream(self, argv: Change, note: str = "") -> str:
        """Record (history, changes, echo) a host-changing command whose bytes go over a bulk stream of its own
        (:mod:`eagle3ops.transfer.streams`) instead of :meth:`run`, so that a dry run prints it and a real run's
        history holds it. ``note`` (one line) is echoed after it as a ``#`` comment. Returns the rendered
        command.

        Raises:
            TypeError: ``argv`` is a :class:`~eagle3ops.commands.types.Read` (a stream that changes nothing needs
                no record).
        """
        if is_read(argv):
            raise TypeError(f"record_stream records a change; {argv!r} is a Read")
        cmd, _ = log_command(argv, self.history, self.changes, self.echo)
        if self.echo and note:
            self.echo(f"#   {note}")
        return cmd

    def run_all(self, commands: Iterable[Sequence[str]], **kwargs) -> list[Result]:
        """Run several commands in order, stopping at the first failure (see :meth:`run`)."""
        return [self.run(c, **kwargs) for c in commands]

    def wait_for(self, argv: Read, *, timeout: float, interval: float = 2.0) -> Result:
        """Re-run ``argv`` (a :class:`~eagle3ops.commands.types.Read`: polling must not change the host) until it
        exits 0 or ``timeout`` seconds pass.

        Raises:
            TypeError: ``argv`` is not a ``Read``.
            RemoteCommandError: still failing at the deadline (the last result's output is in the message).
        """
        if not is_read(argv):
            raise TypeError(f"wait_for polls a Read; got {argv!r}")
        deadline = time.monotonic() + timeout
        while True:
            r = self.run(argv, check=False, timeout=max(5.0, interval * 5))
            if r.ok:
                return r
            if time.monotonic() >= deadline:
                raise RemoteCommandError(self.host, argv, r.exited, r.stdout, r.stderr,
                                         why=f"did not succeed within {timeout:.0f}s")
            time.sleep(interval)


def _in_stream(stdin: str | bytes | IO | None) -> IO:
    """What :meth:`Remote.run` hands invoke as the command's stdin: text as UTF-8 bytes, bytes as they are, a
    file-like object as it is; None: an empty stream, so the command reads EOF at once instead of waiting."""
    if isinstance(stdin, bytes):
        return io.BytesIO(stdin)
    if isinstance(stdin, str):
        return io.BytesIO(stdin.encode("utf-8"))
    if stdin is None:
        return io.BytesIO(b"")
    return stdin


def _tune(c: Connection) -> None:
    """SSH keepalive on the hop's transport; TCP keepalive on its socket when it is a real one (the first hop)."""
    transport = c.client.get_transport()
    if transport is None:
        return
    transport.set_keepalive(KEEPALIVE_S)
    sock = transport.sock
    if isinstance(sock, socket.socket):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, val in (("TCP_KEEPIDLE", KEEPALIVE_S), ("TCP_KEEPINTVL", TCP_KEEPINTVL_S),
                         ("TCP_KEEPCNT", TCP_KEEPCNT)):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)


class _Runner(_FabricRunner):
    """Fabric's remote runner with byte-exact, chunked stdin and a safe-to-retry marker.

    * :meth:`start` opens the session channel and raises :class:`_SessionOpenFailed` when that fails (the command
      has not started). No pty, no environment: :meth:`Remote.run` never asks for either.
    * :meth:`handle_stdin` replaces Invoke's one-byte-at-a-time, decode-to-text copy (see the module docstring).
    """

    def start(self, command, shell, env, timeout=None):  # noqa: D102 - invoke API
        try:
            self.channel = self.context.create_session()
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise _SessionOpenFailed(f"{type(exc).__name__}: {exc}") from None
        self.send_start_message(command)

    def handle_stdin(self, input_, output, echo=False):  # noqa: D102 - invoke API
        try:
            while True:
                chunk = input_.read(STDIN_CHUNK)
                if not chunk:
                    break
                if isinstance(chunk, str):
                    chunk = chunk.encode("utf-8")
                self.channel.sendall(chunk)
            self.channel.shutdown_write()
        except OSError:
            # The command exited (or was killed on timeout) without reading all of its input: its exit status says
            # what happened. Anything else is a real error.
            if not (self.channel.closed or self.channel.exit_status_ready()):
                raise


class _CallbackStream:
    """A write-only text stream that forwards every chunk to a callback (invoke's ``out_stream``)."""

    def __init__(self, cb: Callable[[str], None]):
        self._cb = cb

    def write(self, data: str) -> int:
        self._cb(data)
        return len(data)

    def flush(self) -> None:
        pass
