"""Multi-node training over a fleet run's hosts, planned (pure): ``eagle3ops train A B C --run RUN --from-fleet M``
(issue 30).

Each host given holds one shard of the fleet extract (``fleet.shards`` of the merged manifest ``M``); node ``n`` is
the host of the ``n``-th shard by start, so under torchrun's static rendezvous rank ``n`` (one process per node; ``n
* nproc ...`` with more) trains exactly the hidden states its own host extracted
(:mod:`eagle3ops.stages.trainplan`) and nothing but gradients crosses the network. Node 0 holds the rendezvous
(``fleet.rendezvous_host`` or its inventory ``hostname``, port ``fleet.rendezvous_port``) and writes the checkpoints,
the final head and the train manifest; a rerun resumes from node 0's last checkpoint on every node (rank 0 reads it
and broadcasts it).

:func:`plan_nodes` makes the plan; :func:`blame` turns the nodes' window results into the node that failed first,
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
