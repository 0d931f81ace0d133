"""The inventory's ``groups:`` section: serving hosts behind one load balancer, and how many may be out at once.

A group names inventory hosts that serve the same model behind a load balancer (today: HAProxy, reached through its
runtime API), the server name each host has in the balancer's backend, and ``max_out``: how many of them may be out
at once (drained, in maintenance, or down by the balancer's own health check). Part of
:class:`eagle3ops.config.inventory.Inventory`; the cross-references (a group's hosts and balancer host are inventory
hosts with serving, a host is in one group only) are checked there by :func:`check_groups`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from eagle3ops.config.base import StrictModel

#: A name HAProxy accepts for a proxy or a server (letters, digits, ``-_.:``); anything else could split a runtime
#: API command (its words are separated by spaces, its commands by ``;``).
HAPROXY_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")

#: ``HOST:PORT`` of a TCP runtime API (an IPv6 address in brackets: ``[::1]:9999``).
_TCP = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


class HaproxyBalancerConfig(StrictModel):
    """An HAProxy load balancer in front of a group, driven through its runtime API (the `stats socket` of its
    `global` section, which must be `level admin` to set a server's state)."""

    kind: Literal["haproxy"] = Field(..., description="The balancer's kind; `haproxy` (HAProxy 2.x runtime API).")
    socket: str | None = Field(
        None, description="Absolute path of the runtime API's unix socket (`stats socket PATH level admin`), on "
                          "`host` when it is set, else on this machine. Exactly one of `socket` and `address`.")
    address: str | None = Field(
        None, description="`HOST:PORT` of a runtime API bound to TCP (`stats socket ipv4@127.0.0.1:9999 level "
                          "admin`), reached from `host` when it is set, else from this machine. Exactly one of "
                          "`socket` and `address`.")
    host: str | None = Field(
        None, description="Inventory host whose shell reaches the runtime API (over its SSH connection, with "
                          "`python3` on that host); null: this machine reaches it directly. A balancer host that "
                          "serves nothing is an inventory entry with `serving: none`.")
    backend: str = Field(..., description="Name of the HAProxy backend the group's servers are in (`backend NAME`).")
    servers: dict[str, str] = Field(
        default_factory=dict, description="Inventory host → its `server` name in that backend; a group host not "
                                          "named here is the server of its own name.")
    timeout_s: float = Field(5.0, gt=0, le=120, description="Longest one runtime API exchange may take, in seconds.")

    @field_validator("socket")
    @classmethod
    def _socket(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"must be the absolute path of the runtime API's unix socket (e.g. "
                             f"/run/haproxy/admin.sock), got {value!r}")
        return value

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        m = _TCP.match(value or "") if value is not None else None
        if value is not None and (m is None or not 1 <= int(m.group(2)) <= 65535):
            raise ValueError(f"must be HOST:PORT of the runtime API on TCP (e.g. 127.0.0.1:9999), got {value!r}")
        return value

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str) -> str:
        if not HAPROXY_NAME.match(value):
            raise ValueError(f"{value!r} is not an HAProxy backend name (letters, digits and -_.: only)")
        return value

    @field_validator("servers")
    @classmethod
    def _servers(cls, value: dict[str, str]) -> dict[str, str]:
        bad = sorted(f"{h}: {n!r}" for h, n in value.items() if not HAPROXY_NAME.match(n))
        if bad:
            raise ValueError(f"{', '.join(bad)}: not an HAProxy server name (letters, digits and -_.: only); use "
                             f"the `server` name of the backend's line")
        return value

    @model_validator(mode="after")
    def _one_address(self) -> "HaproxyBalancerConfig":
        if (self.socket is None) == (self.address is None):
            raise ValueError("set exactly one of `socket` (unix socket path, e.g. /run/haproxy/admin.sock) and "
                             "`address` (TCP HOST:PORT, e.g. 127.0.0.1:9999) for the runtime API")
        return self

    @property
    def endpoint(self) -> str:
        """The runtime API as one word: the socket's path (starts with ``/``) or ``HOST:PORT``."""
        return self.socket or self.address or ""


class GroupConfig(StrictModel):
    """Serving hosts behind one load balancer, released host by host so that at most `max_out` are out at once."""

    hosts: list[str] = Field(
        ..., min_length=2, description="Inventory hosts of the group (each with production serving, each in one "
                                       "group only), in the order a rollout takes them.")
    balancer: HaproxyBalancerConfig = Field(..., description="The load balancer in front of the group's hosts.")
    max_out: int = Field(
        1, ge=1, description="Most hosts of the group that may be out at once: drained, in maintenance or down by "
                             "the balancer's own health check. Below the group's size, so one host always serves; "
                             "a rollout waits (bounded) rather than exceed it.")

    @field_validator("hosts")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        twice = sorted({h for h in value if value.count(h) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} listed more than once: name each host once")
        return value

    @model_validator(mode="after")
    def _fits(self) -> "GroupConfig":
        if self.max_out >= len(self.hosts):
            raise ValueError(f"max_out {self.max_out} would let all {len(self.hosts)} hosts be out at once (no "
                             f"host serving): set max_out to at most {len(self.hosts) - 1}")
        foreign = sorted(set(self.balancer.servers) - set(self.hosts))
        if foreign:
            raise ValueError(f"balancer.servers names {', '.join(foreign)}, not in this group's hosts "
                             f"({', '.join(self.hosts)}): remove it or add it to `hosts`")
        names = [self.server(h) for h in self.hosts]
        unnamed = sorted(h for h in self.hosts if not HAPROXY_NAME.match(self.server(h)))
        if unnamed:
            raise ValueError(f"host {', '.join(unnamed)} is not an HAProxy server name: give its server name in "
                             f"balancer.servers (e.g. `servers: {{{unnamed[0]}: srv1}}`)")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"balancer server name(s) {', '.join(twice)} given to more than one host: each host is "
                             f"its own server in backend {self.balancer.backend!r}")
        return self

    def server(self, host: str) -> str:
        """The balancer's server name of group host ``host`` (``balancer.servers``, else the host's own name)."""
        return self.balancer.servers.get(host, host)


def check_groups(groups: Mapping[str, GroupConfig], hosts: Mapping[str, Any]) -> None:
    """Check the groups against the inventory's ``hosts`` (name → :class:`~eagle3ops.config.inventory.HostConfig`).

    Raises:
        ValueError: a group names a host that is not in the inventory or has no production serving (``serving:
            none``), a host is in two groups (their rollouts would count its absence twice), or ``balancer.host``
            is not an inventory host; the message names the group, the key and the fix.
    """
    seen: dict[str, str] = {}
    known = ", ".join(sorted(hosts)) or "(none)"
    for name, g in groups.items():
        for h in g.hosts:
            if h not in hosts:
                raise ValueError(f"groups.{name}.hosts: {h!r} is not an inventory host (known: {known}): add it "
                                 f"under `hosts:` or fix the name")
            if not hosts[h].serving.managed:
                raise ValueError(f"groups.{name}.hosts: {h!r} has no production serving (`serving: none`): a group "
                                 f"is of serving hosts; remove it from the group")
            if h in seen:
                raise ValueError(f"groups.{name}.hosts: {h!r} is already in group {seen[h]!r}: a host serves in one "
                                 f"group; remove it from one of them")
            seen[h] = name
        lb = g.balancer.host
        if lb is not None and lb not in hosts:
            raise ValueError(f"groups.{name}.balancer.host: {lb!r} is not an inventory host (known: {known}): add the "
                             f"balancer's host under `hosts:` (`serving: none` when it serves nothing), or remove "
                             f"`host` to reach the runtime API from this machine")


__all__ = ["HAPROXY_NAME", "GroupConfig", "HaproxyBalancerConfig", "check_groups"]
