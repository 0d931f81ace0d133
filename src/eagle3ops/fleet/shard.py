"""Contiguous sample ranges, one per host of a fleet run (pure).

The rule mirrors upstream exactly, so a shard here is the chunk the same rank would take there:

- speculators 0.6.0 (``src/speculators/data_generation/offline.py``, ``get_indices_to_process``, behind
  ``scripts/data_generation_offline.py --world-size N --rank R``): ``chunk = n // N``, ``rem = n % N``,
  ``start = R * chunk + min(R, rem)``, ``end = start + chunk + (1 if R < rem else 0)``;
- SpecForge (``scripts/prepare_hidden_states.py``, per data-parallel rank): ``n // dp_size`` samples each, the first
  ``n % dp_size`` ranks one more, ranks taking consecutive ranges from index 0.

Both give the first ``n % N`` ranks one extra sample and lay the ranges end to end from 0; so does :func:`shard_ranges`.
Rank order is the order of the hosts on the command line (``eagle3ops extract a b c``: a is rank 0), recorded in the
plan, so the same command gives the same shards.
"""

from __future__ import annotations

from eagle3ops.stages.shards import Shard

__all__ = ["Shard", "shard_range", "shard_ranges", "split_range"]


def shard_range(n: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(start, end)`` of rank ``rank`` of ``world_size`` over ``n`` samples: speculators 0.6's rule (module doc).

    Raises:
        ValueError: ``n`` negative, ``world_size`` below 1, or ``rank`` outside ``[0, world_size)``.
    """
    if n < 0:
        raise ValueError(f"sample count must be >= 0, got {n}")
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    chunk, rem = divmod(n, world_size)
    start = rank * chunk + min(rank, rem)
    return start, start + chunk + (1 if rank < rem else 0)


def shard_ranges(n: int, hosts: list[str]) -> list[Shard]:
    """One contiguous :class:`Shard` per host, in the given order, covering ``[0, n)`` exactly once.

    Raises:
        ValueError: no host, a host named twice (it would take two ranks), or ``n`` negative.
    """
    if not hosts:
        raise ValueError("a fleet run needs at least one host")
    dup = sorted({h for h in hosts if hosts.count(h) > 1})
    if dup:
        raise ValueError(f"host(s) {', '.join(dup)} named more than once: each host takes one shard; name each once")
    return [Shard(r, h, *shard_range(n, len(hosts), r)) for r, h in enumerate(hosts)]


def split_range(start: int, end: int, parts: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut into ``parts`` contiguous sub-ranges by the same rule (the first ones one longer), for a
    shard whose window must be split to fit the maintenance budget.

    Raises:
        ValueError: ``parts`` below 1 or above the number of samples (an empty window).
    """
    n = end - start
    if not 1 <= parts <= max(n, 1):
        raise ValueError(f"cannot split {n} samples into {parts} windows")
    return [(start + a, start + b) for a, b in (shard_range(n, parts, k) for k in range(parts))]
