"""A local HAProxy for tests and benchmarks: Debian's ``haproxy`` (``scripts/setup.sh``) in front of servers on
127.0.0.1, its configuration, runtime API socket and log in a temp dir.

The real daemon, not a stand-in: one ``haproxy -db`` process (foreground, no fork) with a frontend on a free port,
one backend whose servers are the given ports on 127.0.0.1 (``option httpchk GET /health``, ``check inter`` of the
caller's choice, ``fall 2 rise 1``), ``retries 0`` and no ``retry-on`` (a failure cannot be hidden behind a retry)
and the runtime API on a unix socket with ``level admin`` (a rollout sets servers' states through it). Every wait
is bounded; :meth:`LocalHaproxy.stop` ends exactly the process it started (TERM, then KILL after a bound).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["HaproxyError", "LocalHaproxy", "haproxy_binary"]


class HaproxyError(RuntimeError):
    """The local HAProxy did not start in its bound; the message names its configuration and log."""


def haproxy_binary() -> str | None:
    """The ``haproxy`` executable (PATH, then /usr/sbin), or None when it is not installed."""
    return shutil.which("haproxy") or (str(Path("/usr/sbin/haproxy")) if Path("/usr/sbin/haproxy").exists() else None)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config_text(servers: dict[str, int], *, port: int, admin_socket: Path, backend: str = "vllm",
                check_inter_ms: int = 300, stats_tcp: int | None = None) -> str:
    """haproxy.cfg for ``servers`` (server name → port on 127.0.0.1) behind a frontend on ``port``; the runtime API
    on ``admin_socket`` (and on 127.0.0.1:``stats_tcp`` when given), both ``level admin``."""
    tcp = f"    stats socket ipv4@127.0.0.1:{stats_tcp} level admin\n" if stats_tcp else ""
    lines = "".join(f"    server {name} 127.0.0.1:{p} check inter {check_inter_ms}ms fall 2 rise 1\n"
                    for name, p in servers.items())
    return (f"global\n    stats socket {admin_socket} mode 600 level admin\n{tcp}"
            f"defaults\n    mode http\n    retries 0\n    timeout connect 2s\n    timeout client 60s\n"
            f"    timeout server 60s\n"
            f"frontend fe\n    bind 127.0.0.1:{port}\n    default_backend {backend}\n"
            f"backend {backend}\n    balance roundrobin\n    option httpchk GET /health\n{lines}")


@dataclass
class LocalHaproxy:
    """One HAProxy in ``workdir`` for ``servers`` (server name → port on 127.0.0.1).

    Attributes:
        port: the frontend's port on 127.0.0.1 (clients send their requests here).
        admin_socket: the runtime API's unix socket. stats_tcp: its TCP port on 127.0.0.1.
    """

    workdir: Path
    servers: dict[str, int]
    backend: str = "vllm"
    check_inter_ms: int = 300
    port: int = field(default_factory=free_port)
    stats_tcp: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def admin_socket(self) -> Path:
        """The runtime API's unix socket."""
        return self.workdir / "admin.sock"

    def start(self, timeout_s: float = 15.0) -> "LocalHaproxy":
        """Write the configuration, start HAProxy and wait (bounded) until its frontend and runtime API accept.

        Raises:
            HaproxyError: no ``haproxy`` installed, it exited, or it did not accept within ``timeout_s``.
        """
        exe = haproxy_binary()
        if exe is None:
            raise HaproxyError("haproxy is not installed (Debian package `haproxy`; scripts/setup.sh installs it)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "haproxy.cfg"
        cfg.write_text(config_text(self.servers, port=self.port, admin_socket=self.admin_socket, backend=self.backend,
                                   check_inter_ms=self.check_inter_ms, stats_tcp=self.stats_tcp))
        log = (self.workdir / "haproxy.log").open("wb")
        self.proc = subprocess.Popen([exe, "-db", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HaproxyError(f"haproxy exited {self.proc.returncode} at start; config {cfg}, log "
                                   f"{self.workdir / 'haproxy.log'}")
            if self.admin_socket.exists() and _accepts(self.port):
                return self
            time.sleep(0.05)
        self.stop()
        raise HaproxyError(f"haproxy did not accept on 127.0.0.1:{self.port} within {timeout_s:g} s; config {cfg}, "
                           f"log {self.workdir / 'haproxy.log'}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the HAProxy this object started (TERM, then KILL after ``timeout_s``); nothing else."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout_s)

    def __enter__(self) -> "LocalHaproxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
