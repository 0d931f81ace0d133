"""A serving group's HAProxy, through its runtime API: :class:`HaproxyBalancer` implements
:class:`~eagle3ops.group.balancer.Balancer`.

Two ways to reach the runtime API (:class:`RuntimeApi`): :class:`SocketRuntime` connects from this process (the
balancer's socket or TCP address is reachable here), :class:`ShellRuntime` runs the client of
:mod:`eagle3ops.commands.haproxy` through an executor (the balancer host's SSH connection; ``python3`` on that
host). :func:`open_balancer` picks one from the group's ``balancer`` settings.

How HAProxy's words map onto :class:`~eagle3ops.group.balancer.ServerState` (HAProxy 2.6 ``include/haproxy/
server-t.h``; ``show servers state`` prints ``srv_op_state`` and ``srv_admin_state`` as numbers): an administrative
maintenance flag (forced ``0x01``, inherited ``0x02``, from configuration ``0x04``, from DNS resolution ``0x20``,
from an unresolved hostname ``0x40``) is ``maint``; else an operational state ``0`` (stopped: the health check
fails) is ``down``; else a drain flag (forced ``0x08``, inherited ``0x10``) or the operational state ``3`` (stopping,
e.g. ``http-check disable-on-404``) is ``drain``; else (running, or starting in slowstart) ``ready``. ``sessions`` is
``show stat``'s ``scur`` + ``qcur``: the sessions the balancer has open to the server now, and those queued for it
(a server's queue, under its ``maxconn``, is sent to it later, drained or not).
"""

from __future__ import annotations

import csv
import json
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from eagle3ops.commands import haproxy as runtime_cmds
from eagle3ops.group.balancer import ServerState

#: ``srv_admin_state`` bits meaning maintenance (forced, inherited, configuration, resolution, hostname).
MAINT_FLAGS = 0x01 | 0x02 | 0x04 | 0x20 | 0x40
#: ``srv_admin_state`` bits meaning drain (forced, inherited).
DRAIN_FLAGS = 0x08 | 0x10
#: The administrative bit ``set server ... state`` sets for each state (``ready`` clears both).
FORCED = {"ready": 0, "drain": 0x08, "maint": 0x01}


class RuntimeApi(Protocol):
    """Sends runtime API commands to one HAProxy."""

    endpoint: str

    def send(self, commands: list[str]) -> list[str]:
        """Each command's answer, in order (one connection each).

        Raises:
            RuntimeError: the runtime API is not reached or does not answer in its bound (the endpoint named).
        """
        ...


@dataclass
class SocketRuntime:
    """The runtime API reached from this process: ``endpoint`` a unix socket path or ``HOST:PORT``; ``timeout_s``
    bounds each connect and each read."""

    endpoint: str
    timeout_s: float = 5.0

    def _connect(self) -> socket.socket:
        if self.endpoint.startswith("/"):
            s, target = socket.socket(socket.AF_UNIX), self.endpoint
        else:
            h, _, p = self.endpoint.rpartition(":")
            h = h.strip("[]")
            s, target = socket.socket(socket.AF_INET6 if ":" in h else socket.AF_INET), (h, int(p))
        s.settimeout(self.timeout_s)
        try:
            s.connect(target)
        except OSError:
            s.close()
            raise
        return s

    def send(self, commands: list[str]) -> list[str]:
        """See :meth:`RuntimeApi.send`."""
        answers = []
        for c in commands:
            try:
                with self._connect() as s:
                    s.sendall(c.encode() + b"\n")
                    chunks = []
                    while d := s.recv(65536):
                        chunks.append(d)
            except OSError as exc:
                raise RuntimeError(f"HAProxy runtime API {self.endpoint}: {exc} (is HAProxy running, with `stats "
                                   f"socket {self.endpoint} level admin` in its global section?)") from None
            answers.append(b"".join(chunks).decode("utf-8", "replace"))
        return answers


@dataclass
class ShellRuntime:
    """The runtime API reached through an executor's shell (the balancer host's SSH connection, or this machine's
    processes): :func:`eagle3ops.commands.haproxy.runtime_api`'s client, bounded by ``timeout_s`` per exchange."""

    endpoint: str
    run: Any
    timeout_s: float = 5.0
    where: str = "this machine"

    def send(self, commands: list[str]) -> list[str]:
        """See :meth:`RuntimeApi.send`."""
        argv = runtime_cmds.runtime_api(self.endpoint, commands, self.timeout_s)
        try:
            res = self.run.run(argv, check=False, timeout=self.timeout_s * len(commands) + 15)
        except Exception as exc:  # noqa: BLE001 - an SSH or process error, said with the endpoint
            raise RuntimeError(f"HAProxy runtime API {self.endpoint} on {self.where}: {exc}") from None
        if getattr(self.run, "dry_run", False) and not res.stdout:
            return [""] * len(commands)  # a dry run did not send a change
        if res.exited == 127:
            raise RuntimeError(f"HAProxy runtime API on {self.where}: python3 is not installed there (the client "
                               f"runs with it); install it, or reach the runtime API from this machine")
        if res.exited != 0:
            raise RuntimeError(f"HAProxy runtime API on {self.where}: {(res.stderr or res.stdout).strip()[-500:]}")
        try:
            answers = json.loads(res.stdout)
        except ValueError:
            raise RuntimeError(f"HAProxy runtime API on {self.where}: unreadable answer {res.stdout[:200]!r}") from None
        return [str(a) for a in answers]


def parse_servers_state(text: str, backend: str) -> dict[str, tuple[int, int]]:
    """``show servers state BACKEND``'s answer → server name → ``(srv_op_state, srv_admin_state)``.

    Raises:
        RuntimeError: HAProxy's answer is an error (e.g. ``Can't find backend.``) or has no header; the backend named.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header = next((ln[1:].split() for ln in lines if ln.startswith("#")), None)
    if header is None or "srv_name" not in header:
        raise RuntimeError(f"HAProxy: `show servers state {backend}` answered {text.strip()[:200]!r} (is there a "
                           f"backend {backend!r}? fix groups.*.balancer.backend)")
    name, op, admin = header.index("srv_name"), header.index("srv_op_state"), header.index("srv_admin_state")
    rows = [ln.split() for ln in lines if not ln.startswith("#") and len(ln.split()) >= len(header) - 1]
    return {r[name]: (int(r[op]), int(r[admin])) for r in rows if len(r) > max(name, op, admin)}


def parse_sessions(text: str, backend: str) -> dict[str, int]:
    """``show stat``'s CSV → server name of ``backend`` → current sessions + sessions queued for it (``scur`` +
    ``qcur``)."""
    body = text.lstrip().removeprefix("# ")
    out = {}
    for row in csv.DictReader(body.splitlines()):
        if row.get("pxname") == backend and row.get("svname") not in ("FRONTEND", "BACKEND", None):
            out[row["svname"]] = int(row.get("scur") or 0) + int(row.get("qcur") or 0)
    return out


def state_word(op_state: int, admin_state: int) -> str:
    """``ready``, ``drain``, ``maint`` or ``down`` for HAProxy's numbers (module docstring: the mapping)."""
    if admin_state & MAINT_FLAGS:
        return "maint"
    if op_state == 0:
        return "down"
    if admin_state & DRAIN_FLAGS or op_state == 3:
        return "drain"
    return "ready"


@dataclass
class HaproxyBalancer:
    """One serving group's hosts as HAProxy sees them (servers of ``backend``; ``servers``: host → server name).

    Args:
        runtime: how the runtime API is reached (:class:`SocketRuntime`, :class:`ShellRuntime`).
        settle_s: how long :meth:`set_state` waits (bounded) to read the state it set back.
    """

    runtime: RuntimeApi
    backend: str
    servers: Mapping[str, str]
    settle_s: float = 3.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def _raw(self) -> tuple[dict[str, tuple[int, int]], dict[str, int]]:
        state, stat = self.runtime.send([runtime_cmds.show_servers_state(self.backend), runtime_cmds.show_stat()])
        found = parse_servers_state(state, self.backend)
        missing = sorted(f"{s} (host {h})" for h, s in self.servers.items() if s not in found)
        if missing:
            raise RuntimeError(f"HAProxy backend {self.backend!r} has no server {', '.join(missing)}; its servers: "
                               f"{', '.join(sorted(found)) or '(none)'}: fix groups.*.balancer.servers")
        return found, parse_sessions(stat, self.backend)

    def states(self) -> dict[str, ServerState]:
        """Every host of the group, by host name (see :class:`~eagle3ops.group.balancer.Balancer`).

        Raises:
            RuntimeError: the runtime API is not reached, the backend is missing, or a host's server is not in it.
        """
        found, sessions = self._raw()
        return {h: ServerState(h, state_word(*found[s]), sessions.get(s, 0)) for h, s in self.servers.items()}

    def set_state(self, host: str, state: str) -> None:
        """Set ``host``'s server to ``state`` (``ready``, ``drain``, ``maint``) and read it back (bounded by
        ``settle_s``): its forced maintenance and drain flags must be what ``state`` sets (``ready`` while the
        health check fails reads back as ``down``, which is the balancer's own verdict, not a failure here).

        Raises:
            RuntimeError: ``host`` is not in the group, HAProxy refused the command (its answer quoted; ``Permission
                denied``: the socket is not ``level admin``), or the state did not read back; the host named.
        """
        if host not in self.servers:
            raise RuntimeError(f"{host}: not a host of this group (its hosts: {', '.join(self.servers)})")
        server = self.servers[host]
        line = runtime_cmds.set_server_state(self.backend, server, state)
        (answer,) = self.runtime.send([line])
        if answer.strip():
            hint = " (the runtime API needs `level admin`)" if "denied" in answer.lower() else ""
            raise RuntimeError(f"{host}: HAProxy refused `{line}`: {answer.strip()}{hint}")
        if getattr(getattr(self.runtime, "run", None), "dry_run", False):
            return  # a dry run did not send it: nothing to read back
        deadline = self.clock() + self.settle_s
        while True:
            op, admin = self._raw()[0][server]
            if admin & (0x01 | 0x08) == FORCED[state]:
                return
            if self.clock() >= deadline:
                raise RuntimeError(f"{host}: HAProxy server {self.backend}/{server} reads {state_word(op, admin)} "
                                   f"(admin state {admin:#x}) {self.settle_s:g} s after `{line}`")
            self.sleep(0.1)


@contextmanager
def open_balancer(inventory: Any, group: str, *, dry_run: bool = False) -> Iterator[HaproxyBalancer]:
    """The :class:`HaproxyBalancer` of inventory group ``group``, its runtime API open for the ``with`` block:
    through ``balancer.host``'s SSH connection when set (closed at the end), else from this process.

    Raises:
        eagle3ops.config.ConfigError: no such group (the known ones named).
    """
    from eagle3ops import executor
    from eagle3ops.config import ConfigError

    g = inventory.groups.get(group)
    if g is None:
        known = ", ".join(sorted(inventory.groups)) or "(none)"
        raise ConfigError(f"{inventory.source or 'inventory'}: no group {group!r}. Known groups: {known}. Add it under "
                          f"`groups:` (docs/serving-groups.md).")
    lb = g.balancer
    servers = {h: g.server(h) for h in g.hosts}
    if lb.host is None:
        yield HaproxyBalancer(SocketRuntime(lb.endpoint, lb.timeout_s), lb.backend, servers)
        return
    with executor.for_host(inventory.host(lb.host), dry_run=dry_run) as r:
        yield HaproxyBalancer(ShellRuntime(lb.endpoint, r, lb.timeout_s, where=lb.host), lb.backend, servers)


__all__ = ["HaproxyBalancer", "RuntimeApi", "ShellRuntime", "SocketRuntime", "open_balancer", "parse_servers_state",
           "parse_sessions", "state_word"]
