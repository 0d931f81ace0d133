"""The cross-node preflight trial: one bounded gloo all-reduce across the nodes, before any serving stops.

In the pipeline image, on every node, under torchrun (static rendezvous; :func:`eagle3ops.commands.fleet.trial_argv`):
``python3 -m eagle3ops.fleet.trial --timeout-s T``. Each rank joins the process group (``gloo``, ``timeout=T``),
all-reduces a one-hot vector of its rank, and prints one line ``TRIAL {"rank": r, "world": n, "seen": [...]}``: the
ranks whose contribution arrived. A node that cannot reach the rendezvous prints no such line (its torchrun fails
or times out), and every other node's join times out. :func:`parse_trial` (pure, on the driver) turns each node's
exit status and output into the nodes that did not join, by name. torch is imported only in :func:`main`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

#: The prefix of the trial's one result line.
TAG = "TRIAL "


@dataclass(frozen=True)
class TrialResult:
    """``ok``: every node joined and saw every rank; ``unreachable``: nodes (by name) with no complete result;
    ``detail``: one line per node."""

    ok: bool
    unreachable: tuple[str, ...]
    detail: tuple[str, ...]

    def message(self) -> str:
        """The preflight line: ok, or the nodes that cannot reach the rendezvous and the fix."""
        if self.ok:
            return "cross-node trial: every node reached the rendezvous (gloo all-reduce complete)"
        return (f"cross-node trial: {', '.join(self.unreachable)} cannot reach the rendezvous; check that node's "
                f"route to the first node and the inventory's fleet.rendezvous_port (open in its firewall)")


def parse_trial(nodes: list[str], outputs: dict[str, tuple[int, str]]) -> TrialResult:
    """The trial's verdict from each node's ``(exit status, output)`` (node order = rank order).

    A node is unreachable when it has no output, exited non-zero, printed no ``TRIAL`` line, reported another rank
    or world size, or did not see every rank.
    """
    world = len(nodes)
    bad, detail = [], []
    for rank, name in enumerate(nodes):
        rc, out = outputs.get(name, (None, ""))
        lines = [ln[len(TAG):] for ln in out.splitlines() if ln.startswith(TAG)]
        try:
            rec = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            rec = None
        good = (rc == 0 and isinstance(rec, dict) and rec.get("rank") == rank and rec.get("world") == world
                and rec.get("seen") == list(range(world)))
        if not good:
            bad.append(name)
            last = out.strip().splitlines()[-1] if out.strip() else "no output"
            detail.append(f"{name} (rank {rank}): exit {rc}; {last[:200]}")
        else:
            detail.append(f"{name} (rank {rank}): saw ranks {rec['seen']}")
    return TrialResult(not bad, tuple(bad), tuple(detail))


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - runs in the pipeline image (torch)
    """Join, all-reduce, print the ``TRIAL`` line; exit 0, or 1 when the group could not be formed in time."""
    import datetime

    import torch
    import torch.distributed as dist

    ap = argparse.ArgumentParser(prog="python -m eagle3ops.fleet.trial")
    ap.add_argument("--timeout-s", type=float, required=True)
    args = ap.parse_args(argv)
    try:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
        rank, world = dist.get_rank(), dist.get_world_size()
        t = torch.zeros(world)
        t[rank] = 1.0
        dist.all_reduce(t)
        print(TAG + json.dumps({"rank": rank, "world": world,
                                "seen": [i for i in range(world) if t[i].item() == 1.0]}), flush=True)
        dist.destroy_process_group()
        return 0
    except Exception as exc:  # noqa: BLE001 - the node's verdict is its output; the driver names it
        print(f"trial failed: {type(exc).__name__}: {exc}", flush=True)
        return 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
