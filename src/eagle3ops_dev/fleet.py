"""The fleet fixture: several named sandbox hosts, each in a network namespace of its own with its
own address, reached over a veth link rate-limited with ``tc tbf`` (both directions), as rented hosts reached over a
network are. Every host is a real OpenSSH server (:func:`eagle3ops_dev.sandbox.up` with ``listen=``/``netns=``),
checked by host key; with ``engine="none"`` it has no Docker engine (a venv host).

Layout of node ``k`` (``prefix``/``ns_prefix``/``subnet``/``ssh_port`` per caller; the fleet extract test uses
``pytest-fleet<k>``, ``e3fleet<k>``, ``10.229.<k>.0/24``, SSH port ``2240 + k``):

- namespace ``<ns_prefix><k>``; veth ``<ns_prefix>h<k>`` here with ``10.<subnet>.<k>.1/24`` ↔ ``<ns_prefix>n<k>``
  inside with ``10.<subnet>.<k>.2/24``; ``tc qdisc ... tbf rate <rate>`` on both ends;
- sandbox ``<prefix><k>``: sshd on ``10.<subnet>.<k>.2:<ssh_port + k>`` inside the namespace. Processes the host
  starts over SSH (the supervisor, stages, a serving process) live in that namespace too: their ``127.0.0.1`` is the
  namespace's own, so each host has its own loopback serving port.

Also here: :func:`venv_host` (an inventory entry for a node as a venv host), :func:`inventory_yaml` (an inventory file
of such entries), :func:`start_standin_server` (the STAND-IN OpenAI server of ``tests/data/standin_openai_server.py``
as a node's ``serving: process``). Development harness only (never imported by the product).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from eagle3ops_dev import provision, sandbox
from eagle3ops_dev.sandbox.proc import run_checked

#: Seconds each ``ip``/``tc`` command may take.
NET_TIMEOUT_S = 30


@dataclass(frozen=True)
class Link:
    """Namespace ``ns`` joined to this one by veth ``here`` (``here_addr``) ↔ ``there`` (``addr``, inside), each end
    limited to ``rate`` by a token bucket filter."""

    k: int
    ns: str
    here: str
    there: str
    here_addr: str
    addr: str
    rate: str

    @classmethod
    def of(cls, k: int, ns_prefix: str, subnet: int, rate: str) -> "Link":
        """Node ``k``'s link (names and addresses of the module doc)."""
        return cls(k, f"{ns_prefix}{k}", f"{ns_prefix}h{k}"[:15], f"{ns_prefix}n{k}"[:15], f"10.{subnet}.{k}.1",
                   f"10.{subnet}.{k}.2", rate)

    def up(self) -> None:
        """Create the namespace, the veth pair, the addresses and the rate limits (anything left from an earlier run
        of the same names removed first).

        Raises:
            SandboxError: an ``ip``/``tc`` command failed (its stderr; root and iproute2 are needed).
        """
        self.down()
        inside = ["ip", "netns", "exec", self.ns]
        for argv in (["ip", "netns", "add", self.ns],
                     ["ip", "link", "add", self.here, "type", "veth", "peer", "name", self.there],
                     ["ip", "link", "set", self.there, "netns", self.ns],
                     ["ip", "addr", "add", f"{self.here_addr}/24", "dev", self.here],
                     ["ip", "link", "set", self.here, "up"],
                     [*inside, "ip", "addr", "add", f"{self.addr}/24", "dev", self.there],
                     [*inside, "ip", "link", "set", self.there, "up"],
                     [*inside, "ip", "link", "set", "lo", "up"],
                     ["tc", "qdisc", "add", "dev", self.here, "root", "tbf", "rate", self.rate, "burst", "32kbit",
                      "latency", "400ms"],
                     [*inside, "tc", "qdisc", "add", "dev", self.there, "root", "tbf", "rate", self.rate, "burst",
                      "32kbit", "latency", "400ms"]):
            run_checked(argv, timeout=NET_TIMEOUT_S)

    def down(self) -> None:
        """Remove the veth pair and the namespace (absent ones are fine)."""
        run_checked(["ip", "link", "del", self.here], timeout=NET_TIMEOUT_S, check=False)
        run_checked(["ip", "netns", "del", self.ns], timeout=NET_TIMEOUT_S, check=False)

    def qdisc(self) -> str:
        """``tc qdisc show dev <here>``: the limit as the kernel has it (for reports)."""
        return run_checked(["tc", "qdisc", "show", "dev", self.here], timeout=NET_TIMEOUT_S).stdout.strip()


@dataclass(frozen=True)
class Node:
    """One fleet host: its sandbox name, its link and the sandbox's connection facts."""

    name: str
    link: Link
    info: sandbox.SandboxInfo


def route_rule(ns_prefix: str) -> list[str]:
    """The iptables rule (without ``-I``/``-D FORWARD``) that lets the namespaces of ``ns_prefix`` reach each other
    through this one (Docker sets the FORWARD policy to DROP)."""
    wild = f"{ns_prefix}h"[:14] + "+"
    return ["-i", wild, "-o", wild, "-j", "ACCEPT"]


def up(n: int, *, prefix: str, ns_prefix: str, subnet: int, ssh_port: int, rate: str = "100mbit",
       engine: str = "none", routed: bool = False) -> list[Node]:
    """Bring up ``n`` nodes (module doc): links first, then each sandbox's sshd inside its namespace, each verified
    over real SSH with strict host-key checking. ``routed``: the nodes also reach each other (each namespace's
    default route via its veth peer here, IPv4 forwarding on, an iptables FORWARD rule between the links), as the
    nodes of a multi-node training run must; each packet between two nodes crosses both rate limits.

    Raises:
        SandboxError: a link or a sandbox could not be set up (what is up stays: call :func:`down`).
    """
    nodes = []
    if routed:
        run_checked(["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"], timeout=NET_TIMEOUT_S)
        run_checked(["iptables", "-D", "FORWARD", *route_rule(ns_prefix)], timeout=NET_TIMEOUT_S, check=False)
        run_checked(["iptables", "-I", "FORWARD", *route_rule(ns_prefix)], timeout=NET_TIMEOUT_S)
    for k in range(n):
        link = Link.of(k, ns_prefix, subnet, rate)
        name = f"{prefix}{k}"
        sandbox.down(name)  # an sshd of an earlier run lives in the namespace about to be replaced
        link.up()
        if routed:
            run_checked(["ip", "netns", "exec", link.ns, "ip", "route", "add", "default", "via", link.here_addr],
                        timeout=NET_TIMEOUT_S)
        nodes.append(Node(name, link, sandbox.up(name, ssh_port + k, listen=link.addr, netns=link.ns,
                                                 engine=engine)))
    return nodes


def down(n: int, *, prefix: str, ns_prefix: str, subnet: int, purge: bool = True) -> None:
    """Stop the ``n`` sandboxes (purged by default) and remove their links. The caller ends the processes it started
    on them first (a process left inside a namespace keeps it alive, unnamed)."""
    for k in range(n):
        sandbox.down(f"{prefix}{k}", purge=purge)
        Link.of(k, ns_prefix, subnet, "1mbit").down()
    run_checked(["iptables", "-D", "FORWARD", *route_rule(ns_prefix)], timeout=NET_TIMEOUT_S, check=False)


def venv_host(node: Node, name: str, base: str, *, serving: dict[str, Any] | str = "none",
              stage_env: dict[str, str] | None = None, budget_s: float = 600, stage_timeout_s: float = 120) -> Any:
    """An inventory entry (:class:`eagle3ops.config.HostConfig`) for ``node`` as a venv host (``stage_runtime: venv``,
    ``/usr/bin/python3``) with data, state and model dirs under ``base`` (a folder of the sandbox's data dir)."""
    from eagle3ops.config import HostConfig

    inf = node.info
    return HostConfig(name=name, hostname=inf.hostname, port=inf.ssh_port, user=inf.user,
                      identity_file=inf.identity_file, known_hosts=inf.known_hosts, data_dir=f"{base}/data",
                      state_dir=f"{base}/state", model_path=f"{base}/model", stage_runtime="venv",
                      venv_python="/usr/bin/python3", stage_env=dict(stage_env or {}),
                      maintenance_budget_s=budget_s, stage_timeout_s=stage_timeout_s, serving=serving)


def inventory_yaml(hosts: list[Any], fleet: dict[str, Any] | None = None) -> str:
    """An inventory file's text holding ``hosts`` (HostConfigs, by name) and the ``fleet:`` settings."""
    import yaml

    entries = {h.name: h.model_dump(mode="json", exclude={"name"}, exclude_defaults=True) for h in hosts}
    return yaml.safe_dump({"hosts": entries, **({"fleet": fleet} if fleet else {})}, sort_keys=True)


def make_dirs(h: Any) -> None:
    """Create the host's data, state and model dirs over SSH and a stand-in model ``config.json`` (the stand-in
    stages read no model; preflight looks for the dirs).

    Raises:
        RemoteError: a command on the host failed.
    """
    from eagle3ops.commands import host as hc
    from eagle3ops.executor import for_host

    with for_host(h) as r:
        for d in (h.data_dir, h.state_dir, h.model_path):
            r.run(hc.mkdir_p(d))
        r.run(hc.write_file(f"{h.model_path}/config.json"),
              stdin=json.dumps({"hidden_size": 64, "intermediate_size": 256, "vocab_size": 512}))


def start_standin_server(h: Any, node: Node, script: Path, *, port: int, model: str, extra: Sequence[str] = ()
                         ) -> Path:
    """Start the STAND-IN OpenAI server ``script`` on ``node`` as its serving process (over SSH, so it runs inside the
    node's namespace, detached in its own session, in a work dir of the sandbox owned by its user), ``extra``
    appended to its arguments; returns the work dir. The host's dirs are made first (:func:`make_dirs`).

    Raises:
        RemoteError: a command on the host failed.
    """
    from eagle3ops.executor import for_host

    work = Path(f"{sandbox.SANDBOX_BASE}/{node.name}/serving-{port}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o755, parents=True)
    shutil.copy(script, work / script.name)
    pw = pwd.getpwnam(node.info.user)
    for p in (work, work / script.name):
        os.chown(p, pw.pw_uid, pw.pw_gid)
    make_dirs(h)
    with for_host(h) as r:
        r.run(provision.detached(["/usr/bin/python3", str(work / script.name), "--port", str(port), "--model",
                                  model, *extra], cwd=str(work), log=str(work / "first.log")))
    return work
