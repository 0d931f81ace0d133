"""Byte streams into a remote command's stdin, with a byte count, stall detection and bounded waits.

:class:`SshStream` is the bulk path (an OpenSSH subprocess, see :mod:`eagle3ops.transfer.sshconfig`);
:class:`ParamikoStream` is a channel on the executor's open connection (small archives: no second handshake).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Sequence

from eagle3ops import executor
from eagle3ops.transfer.errors import StreamStalled, TransientTransferError
from eagle3ops.transfer.limits import STALL_S, WRITE_CHUNK
from eagle3ops.commands.ssh import openssh
from eagle3ops.transfer.sshconfig import write_ssh_config


class ByteStream(ABC):
    """A remote command whose stdin we stream into, with a byte count, stall detection and bounded waits."""

    #: bytes written so far (as sent into the SSH stream)
    sent: int
    last_move: float

    @abstractmethod
    def write(self, data: bytes) -> None:
        """Send bytes; raises :class:`StreamStalled` / :class:`TransientTransferError` when the stream breaks."""

    @abstractmethod
    def close_input(self) -> None:
        """Send EOF (idempotent)."""

    @abstractmethod
    def finish(self, timeout: float) -> tuple[int, str, str]:
        """Close stdin, wait up to ``timeout`` s for the command; returns (exit status, stdout, stderr)."""

    @abstractmethod
    def kill(self) -> None:
        """Abort the stream."""


class SshStream(ByteStream):
    """The bulk path: an OpenSSH ``ssh`` subprocess (see :func:`eagle3ops.commands.ssh.openssh`), watched by a stall watchdog.

    Its config file (:func:`write_ssh_config`, at :attr:`config_file`) lives until :meth:`finish` or :meth:`kill`
    (or, as a last resort, until the stream is garbage-collected)."""

    name = "openssh"

    def __init__(self, host, remote_argv: Sequence[str], stall_s: float = STALL_S, fast_cipher: bool = True):
        self.host = host
        self.config_file = write_ssh_config(host, fast_cipher=fast_cipher)
        self._remove_config = weakref.finalize(self, shutil.rmtree, self.config_file.parent, True)
        self.argv = openssh(host, remote_argv, self.config_file)
        try:
            self.proc = executor.local().popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, bufsize=0)
        except BaseException:
            self._remove_config()
            raise
        self.sent = 0
        self.last_move = time.monotonic()
        self.stall_s = stall_s
        self.stalled = False
        self._done = threading.Event()
        self._out: list[bytes] = []
        self._err: list[bytes] = []
        self._readers = [threading.Thread(target=self._drain, args=(self.proc.stdout, self._out), daemon=True),
                         threading.Thread(target=self._drain, args=(self.proc.stderr, self._err), daemon=True)]
        for t in self._readers:
            t.start()
        self._watch = threading.Thread(target=self._watchdog, daemon=True)
        self._watch.start()

    @staticmethod
    def _drain(f, sink: list[bytes]) -> None:
        while chunk := f.read(65536):
            sink.append(chunk)

    def _watchdog(self) -> None:
        while not self._done.wait(0.5):
            if time.monotonic() - self.last_move > self.stall_s and self.proc.poll() is None:
                self.stalled = True
                self.proc.kill()
                return

    def _err_text(self) -> str:
        return b"".join(self._err).decode(errors="replace").strip()

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        view = memoryview(data)
        while view:
            try:
                n = self.proc.stdin.write(view[:WRITE_CHUNK])
            except (BrokenPipeError, OSError, ValueError):
                self.proc.wait(timeout=30)
                for t in self._readers:
                    t.join(timeout=5)
                if self.stalled:
                    raise StreamStalled(f"{self.host.name}: no progress for {self.stall_s:.0f}s after "
                                        f"{self.sent} bytes; stream killed") from None
                raise TransientTransferError(f"{self.host.name}: stream broke after {self.sent} bytes (ssh exit "
                                             f"{self.proc.returncode}): {self._err_text()[-500:]}") from None
            if n:
                self.sent += n
                self.last_move = time.monotonic()
                view = view[n:]

    def close_input(self) -> None:
        """Send EOF. After it docker load still applies the layers with no byte moving, so the stall watchdog
        stops here and the caller's deadline (:meth:`finish`) bounds the wait."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self._done.set()

    def finish(self, timeout: float) -> tuple[int, str, str]:
        self.close_input()
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise TransientTransferError(f"{self.host.name}: remote load did not finish within {timeout:.0f}s after "
                                         f"the stream ended") from None
        finally:
            self._remove_config()
        for t in self._readers:
            t.join(timeout=10)
        if self.stalled:
            raise StreamStalled(f"{self.host.name}: no progress for {self.stall_s:.0f}s; stream killed")
        return rc, b"".join(self._out).decode(errors="replace"), self._err_text()

    def kill(self) -> None:
        self._done.set()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._remove_config()


class ParamikoStream(ByteStream):
    """A channel on the already-open paramiko connection of :class:`eagle3ops.remote.Remote` (small archives)."""

    name = "paramiko"

    def __init__(self, remote, remote_argv: Sequence[str], stall_s: float = STALL_S):
        from eagle3ops.commands.quote import render

        self.host = remote.host
        transport = remote.connection.client.get_transport()
        self.chan = transport.open_session(timeout=30)
        self.chan.settimeout(stall_s)
        self.chan.exec_command(render(list(remote_argv)))
        self.sent = 0
        self.last_move = time.monotonic()
        self.stall_s = stall_s

    def write(self, data: bytes) -> None:
        import socket

        view = memoryview(data)
        while view:
            try:
                n = self.chan.send(view[:WRITE_CHUNK])
            except socket.timeout:
                self.chan.close()
                raise StreamStalled(f"{self.host.name}: no progress for {self.stall_s:.0f}s after {self.sent} "
                                    f"bytes; channel closed") from None
            except (OSError, EOFError) as exc:
                raise TransientTransferError(f"{self.host.name}: channel broke after {self.sent} bytes: {exc}") from None
            if n <= 0:
                raise TransientTransferError(f"{self.host.name}: channel closed by the host after {self.sent} bytes "
                                             f"(exit {self.chan.exit_status if self.chan.exit_status_ready() else '?'})")
            self.sent += n
            self.last_move = time.monotonic()
            view = view[n:]

    def close_input(self) -> None:
        """Send EOF on the channel."""
        if not getattr(self, "_eof", False):
            self._eof = True
            self.chan.shutdown_write()

    def finish(self, timeout: float) -> tuple[int, str, str]:
        self.close_input()
        deadline = time.monotonic() + timeout
        out, err = [], []
        self.chan.settimeout(1.0)
        import socket

        while True:
            progressed = False
            while self.chan.recv_ready():
                out.append(self.chan.recv(65536)); progressed = True
            while self.chan.recv_stderr_ready():
                err.append(self.chan.recv_stderr(65536)); progressed = True
            if self.chan.exit_status_ready() and not progressed:
                break
            if time.monotonic() > deadline:
                self.chan.close()
                raise TransientTransferError(f"{self.host.name}: remote load did not finish within {timeout:.0f}s")
            if not progressed:
                try:
                    self.chan.status_event.wait(0.2)
                except socket.timeout:
                    pass
        rc = self.chan.recv_exit_status()
        self.chan.close()
        return rc, b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace")

    def kill(self) -> None:
        self.chan.close()
