"""Multi-node training over a fleet run's hosts, planned (pure): ``eagle3ops train A B C --run RUN --from-fleet M``.

Each host given holds one shard of the fleet extract (``fleet.shards`` of the merged manifest ``M``); node ``n`` is
the host of the ``n``-th shard by start, so under torchrun's static rendezvous rank ``n`` (one process per node; ``n
* nproc ...`` with more) trains exactly the hidden states its own host extracted
(:mod:`eagle3ops.stages.trainplan`) and nothing but gradients crosses the network. Node 0 holds the rendezvous
(``fleet.rendezvous_host`` or its inventory ``hostname``, port ``fleet.rendezvous_port``) and writes the checkpoints,
the final head and the train manifest; a rerun resumes from node 0's last checkpoint on every node (rank 0 reads it
and broadcasts it).

:func:`plan_nodes` makes the plan, :func:`socket_interfaces` names each node's NCCL/gloo interface; :func:`blame` turns the nodes' window results into the node that failed first,
by name, and the nodes that stopped because a peer left.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


class NodePlanError(ValueError):
    """The hosts given do not match the merged manifest's shards; the message names the host or shard and the fix."""


@dataclass(frozen=True)
class NodePlan:
    """``nodes``: host names in rank order; ``shards``: node ``n``'s ``[start, end)``; ``rendezvous``: ``HOST:PORT``
    on node 0."""

    run: str
    nodes: tuple[str, ...]
    shards: tuple[tuple[int, int], ...]
    rendezvous: str

    def node_args(self, name: str) -> tuple[int, int, str]:
        """``(count, rank, rendezvous)`` of host ``name`` (what its train window passes to the stage)."""
        return len(self.nodes), self.nodes.index(name), self.rendezvous

    def lines(self) -> list[str]:
        """The plan as printed before anything stops."""
        out = [f"multi-node train of run {self.run}: {len(self.nodes)} nodes, rendezvous {self.rendezvous} "
               f"(torchrun static rendezvous, gloo on CPU / NCCL on GPUs)"]
        for n, (name, (a, b)) in enumerate(zip(self.nodes, self.shards)):
            role = "rank 0: writes checkpoints, final head, manifest" if n == 0 else "trains its shard"
            out.append(f"  node {n}: {name}  samples [{a}, {b})  ({role})")
        out.append("  first: the cross-node trial (one bounded gloo all-reduce) on every node, before any serving "
                   "stops; then one train window per node (vocab + train), all at once")
        return out


def plan_nodes(run: str, merged: dict[str, Any], hosts: list[str], *, rendezvous_host: str, port: int) -> NodePlan:
    """The multi-node plan for ``hosts`` from the merged extract manifest (module doc).

    Args:
        rendezvous_host: how the other nodes reach node 0 (the caller picks it from the inventory).
        port: the rendezvous TCP port (``fleet.rendezvous_port``).

    Raises:
        NodePlanError: the manifest has no shards; a host given twice or holding no shard; a shard whose host was
            not given; a host holding more than one shard.
    """
    shards = (merged.get("fleet") or {}).get("shards") or []
    if not shards:
        raise NodePlanError("the merged manifest lists no fleet.shards: multi-node training trains each node's own "
                            "shard of a fleet extract (`eagle3ops extract HOST HOST... --merged M`); for a one-host "
                            "extract train on that host alone")
    if len(set(hosts)) != len(hosts):
        raise NodePlanError(f"a host is named twice: {', '.join(hosts)}")
    by_host: dict[str, list[tuple[int, int]]] = {}
    for s in shards:
        by_host.setdefault(str(s["host"]), []).append((int(s["start"]), int(s["end"])))
    extra = [h for h in hosts if h not in by_host]
    if extra:
        raise NodePlanError(f"{', '.join(extra)} hold(s) no shard of this fleet run (its shards are on "
                            f"{', '.join(sorted(by_host))}): name exactly the hosts of the merged manifest")
    missing = sorted(set(by_host) - set(hosts))
    if missing:
        raise NodePlanError(f"the shards on {', '.join(missing)} would not be trained: name every host of the merged "
                            f"manifest ({', '.join(sorted(by_host))}), or gather the hidden states on one host with "
                            f"`eagle3ops train HOST --from-fleet M`")
    several = sorted(h for h, r in by_host.items() if len(r) > 1)
    if several:
        raise NodePlanError(f"{', '.join(several)} hold(s) more than one shard: one node trains one shard; rerun the "
                            f"fleet extract with one shard per host, or gather with `train HOST --from-fleet M`")
    order = sorted(hosts, key=lambda h: by_host[h][0][0])
    return NodePlan(run, tuple(order), tuple(by_host[h][0] for h in order), f"{rendezvous_host}:{port}")


#: Interfaces that never carry traffic between hosts: loopback and the virtual ones of container engines, bridges,
#: VMs and overlay networks, and ``ifb`` devices of traffic shaping (not counted when a host's interfaces are judged).
VIRTUAL_IFACE = re.compile(r"^(lo|docker\d*|veth.*|br-.*|virbr.*|cni.*|flannel.*|cali.*|tunl?\d*|vxlan.*|kube.*|ifb\d*)$")
#: The settings that name the socket interface of NCCL (its bootstrap and TCP transport) and of gloo (torch's CPU
#: collectives and the trial's all-reduce).
SOCKET_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def _names_one_of(value: str, ifaces: list[str]) -> bool:
    """Whether an ``*_SOCKET_IFNAME`` value selects one of ``ifaces``: NCCL's syntax (comma-separated prefixes,
    ``=`` for exact names, ``^`` for an exclusion list, which is not judged); gloo's exact names are prefixes too."""
    if value.startswith("^"):
        return True
    exact = value.startswith("=")
    want = [w for w in value.lstrip("=").split(",") if w]
    return any((i == w) if exact else i.startswith(w) for w in want for i in ifaces)


def socket_interfaces(plan: NodePlan, envs: dict[str, dict[str, str]], interfaces: dict[str, list[str]]) -> list[str]:
    """The socket interface each node's NCCL and gloo use, as lines of the printed plan (pure).

    Without ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` each picks an interface on its own (NCCL: the first not
    ``docker``/``lo``; gloo: the one the hostname resolves to), and on a host with several interfaces it may pick one
    the peers cannot reach: the first collective then hangs until its timeout.

    Args:
        envs: each node's stage environment (``hosts.<name>.stage_env``).
        interfaces: each node's interface names (``/sys/class/net``); a node missing here was not read.

    Raises:
        NodePlanError: a multi-node plan where a host with several interfaces (:data:`VIRTUAL_IFACE` not counted)
            names none or only one of :data:`SOCKET_ENV` (the cross-node trial runs on gloo, so it would pass while
            NCCL picks its own interface), or a named interface that host does not have; the message names the
            host, the key and the fix.
    """
    lines, problems = [f"socket interface of NCCL and gloo ({', '.join(SOCKET_ENV)}):"], []
    for n, name in enumerate(plan.nodes):
        env, seen = envs.get(name) or {}, interfaces.get(name)
        real = [i for i in seen or [] if not VIRTUAL_IFACE.match(i)]
        named = {k: env[k] for k in SOCKET_ENV if env.get(k)}
        for k, v in named.items():
            if seen is not None and not _names_one_of(v, seen):
                problems.append(f"hosts.{name}.stage_env.{k} is {v}, not an interface of {name} (it has "
                                f"{', '.join(real) or 'none but loopback'}): name the interface the other nodes "
                                f"reach {name} on")
        several = seen is not None and len(real) > 1 and len(plan.nodes) > 1
        if named and several and len(named) < len(SOCKET_ENV):  # the trial (gloo) can pass while NCCL picks its own
            missing = [k for k in SOCKET_ENV if k not in named]
            problems.append(f"{name} has several network interfaces ({', '.join(real)}) and names "
                            f"{' and '.join(named)} only: set hosts.{name}.stage_env.{' and '.join(missing)} too, "
                            f"to the interface the other nodes reach {name} on, else that library picks its own and "
                            f"its first collective may hang")
        if named:
            lines.append(f"  node {n}: {name}  " + " ".join(f"{k}={v}" for k, v in named.items()))
        elif seen is None:
            lines.append(f"  node {n}: {name}  socket interface not set; its interfaces were not read")
        elif several:
            problems.append(f"{name} has several network interfaces ({', '.join(real)}) and names none for NCCL and "
                            f"gloo: set hosts.{name}.stage_env.NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME to the one "
                            f"the other nodes reach {name} on (e.g. {real[0]}), else each picks its own and the first "
                            f"collective may hang")
        else:
            lines.append(f"  node {n}: {name}  socket interface not set: {name} has one interface "
                         f"({real[0] if real else 'none but loopback'}), NCCL and gloo use it")
    if problems:
        raise NodePlanError("; ".join(problems))
    return lines


#: Words in a failed node's output that say a peer left (gloo/NCCL lost the connection), not that this node failed.
PEER_LOST = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|recvBytes|sendBytes|"
                       r"Timed out waiting|timed out|NCCL.*(remote|peer)|Socket Timeout|ECONNRESET",
                       re.IGNORECASE)
#: Words that say this node's own process was killed.
KILLED = re.compile(r"SIGKILL|Signal 9\b|exitcode\s*:\s*-9|exit(ed)? (with )?(status|code) (137|-9)|Killed",
                    re.IGNORECASE)


def blame(nodes: list[str], errors: dict[str, str]) -> tuple[list[str], list[str]]:
    """``(failed, followed)`` from each node's error text ("" for a node that ended well): ``failed`` are the nodes
    whose own process died (killed, or an error that is not a lost peer), ``followed`` those that stopped because a
    peer left. When every failed node only reports lost peers, they are all ``failed`` (nothing tells them apart)."""
    bad = [n for n in nodes if errors.get(n)]
    killed = [n for n in bad if KILLED.search(errors[n])]
    own = [n for n in bad if n not in killed and not PEER_LOST.search(errors[n])]
    first = killed + own
    if not first:
        return bad, []
    return [n for n in nodes if n in first], [n for n in bad if n not in first]
