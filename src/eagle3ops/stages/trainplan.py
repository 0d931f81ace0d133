"""Which samples each training rank takes at each step, for one node or several (pure: numpy, no torch).

Every rank computes the whole plan — all ranks' batches for an epoch — from the extract manifest alone, so the
ranks agree on the step count without talking, and a test can compare runs of different layouts without training.

**Units.** A fleet run's merged extract manifest (:func:`eagle3ops.stages.merge.merge_manifests`) records its
shards (``fleet.shards``: contiguous ``[start, end)`` sample ranges, each extracted on one host). With ``world``
ranks and ``S`` shards where ``world % S == 0``, shard ``s`` (by start) is a *unit* trained by the ``world // S``
ranks ``s * world // S ...``: under a multi-node launch node ``n`` runs exactly those ranks, so each rank reads
only hidden-state files its own node extracted (nothing crosses the network but gradients). Otherwise (one shard,
no shards, or a world size the shards do not divide) the whole run is one unit trained by every rank, which needs
every file on every rank's node (one host, or the union gathered with ``train --from-fleet``). A one-node run
with as many processes as shards takes the same units as the multi-node run, so the two see the same samples at
every step.

**Batches.** Within a unit, an epoch is packed as speculators 0.3.0's ``MultipackDistributedBatchSamplerV2``
packs it (``speculators/train/distributed_batch_sampler.py``: the unit's lengths clipped to ``batch_max_tokens``,
permuted by ``numpy.random.default_rng(seed + epoch)``, then per step the longest prefix that LPT-packs into one
batch per replica, found by binary search) — :func:`pack_epoch` reproduces its batches for every replica at once —
with one change: V2 drops the last ``< replicas`` samples of the permutation; here they form one more step (one
sample per replica), so every training sample is seen exactly once per epoch. Units packed to fewer steps than the
epoch's longest unit are padded with ``None``: such a rank runs a zero-weight step (its loss times 0, so the
collectives line up and its gradient adds nothing).

**Held-out samples** (the offline estimate) are split the same way: each unit's held-out samples round-robin over
its replicas, ``None`` where a rank has fewer than the most any rank has.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eagle3ops.stages.shards import uncovered


class TrainPlanError(ValueError):
    """The extract manifest's shards cannot make a plan (the message names the field and the fix)."""


@dataclass(frozen=True)
class Layout:
    """How ``world`` ranks divide the samples: ``units`` are ``[start, end)`` global sample ranges, each trained by
    ``per_unit`` consecutive ranks (``world == len(units) * per_unit``)."""

    units: tuple[tuple[int, int], ...]
    per_unit: int
    world: int

    def unit_of(self, rank: int) -> tuple[int, int]:
        """``(unit index, replica within the unit)`` of ``rank``.

        Raises:
            ValueError: ``rank`` outside ``[0, world)``.
        """
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} outside [0, {self.world})")
        return rank // self.per_unit, rank % self.per_unit

    def ranks_of(self, unit: int) -> range:
        """The ranks that train unit ``unit``."""
        return range(unit * self.per_unit, (unit + 1) * self.per_unit)


def shards_of(manifest: dict[str, Any]) -> list[tuple[int, int]]:
    """The ``[start, end)`` ranges of a merged extract manifest's ``fleet.shards``, by start ([] for a one-host
    extract).

    Raises:
        TrainPlanError: a shard without integer ``start``/``end``, or shards that are not contiguous from 0.
    """
    raw = (manifest.get("fleet") or {}).get("shards") or []
    try:
        ranges = sorted((int(s["start"]), int(s["end"])) for s in raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise TrainPlanError(f"extract/manifest.json: fleet.shards holds an entry without integer start/end "
                             f"({exc}); rewrite it with the fleet extract's merged manifest") from exc
    gap = uncovered(ranges)
    if gap is not None:
        raise TrainPlanError(f"extract/manifest.json: fleet.shards leave samples [{gap[0]}, {gap[1]}) uncovered or "
                             f"overlap; rewrite it with the fleet extract's merged manifest")
    return ranges


def layout(shards: Sequence[tuple[int, int]], n_samples: int, world: int) -> Layout:
    """The units of ``world`` ranks (module doc): one per non-empty shard when they divide ``world``, else one.

    Raises:
        ValueError: ``world < 1``.
    """
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    units = [(s, e) for s, e in shards if e > s]
    if len(units) > 1 and world % len(units) == 0:
        return Layout(tuple(units), world // len(units), world)
    return Layout(((0, n_samples),), world, world)


class Nodes:
    """This node's place in a multi-node train: ``count`` nodes, this one ``rank`` (0 = the first host, which
    writes the outputs), the rendezvous ``host:port`` on node 0 (torchrun's ``--master-addr``/``--master-port``).

    Raises:
        ValueError: ``count < 1``, ``rank`` outside ``[0, count)``, or a rendezvous that is not ``HOST:PORT``
            with a port in 1..65535.
    """

    def __init__(self, count: int, rank: int, rendezvous: str) -> None:
        host, _, port = rendezvous.rpartition(":")
        if count < 1 or not 0 <= rank < count:
            raise ValueError(f"--node-rank {rank} must lie in [0, --nodes {count})")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"--rendezvous {rendezvous!r}: write HOST:PORT (node 0's address and a free TCP port)")
        self.count, self.rank, self.host, self.port = count, rank, host, int(port)

    def torchrun_flags(self) -> list[str]:
        """torch.distributed.run's flags for this node (static rendezvous)."""
        return [f"--nnodes={self.count}", f"--node-rank={self.rank}", f"--master-addr={self.host}",
                f"--master-port={self.port}"]

def node_files(run_dir: Path, world: int, node_ranks: range) -> Any:
    """``wanted(stage, rel)`` for :func:`check_inputs`: on a node of a run whose plan gives it only some units
    (module doc), the extract files of the other units' samples are not checked (they live on
    other nodes); None when this node needs every file (or the manifest cannot be read: check_inputs says why)."""
    from eagle3ops.stages.manifest import StageInputError, read_manifest

    try:
        ext = read_manifest(run_dir, "extract", for_stage="train")
        lay = layout(shards_of(ext), len(ext.get("sample_files") or []), world)
    except (StageInputError, TrainPlanError, ValueError):
        return None
    if len(lay.units) == 1:
        return None
    units = [lay.units[lay.unit_of(r)[0]] for r in node_ranks]
    every = {s["file"] for s in ext["sample_files"]}
    mine = {s["file"] for n, s in enumerate(ext["sample_files"])
            if any(a <= int(s.get("i", n)) < b for a, b in units)}
    return lambda stage, rel: stage != "extract" or rel not in every or rel in mine


def _lpt(lengths: np.ndarray, max_len: int, replicas: int) -> list[list[int]] | None:
    """Longest-processing-time packing of ``lengths`` into ``replicas`` bins of at most ``max_len`` tokens: each
    bin's positions (into ``lengths``) in the order placed, or None when they do not fit. speculators 0.3.0's
    ``_lpt_packed_batch``, for every replica at once."""
    bins: list[list[int]] = [[] for _ in range(replicas)]
    heap = [(0, r) for r in range(replicas)]
    order = np.argsort(lengths, kind="quicksort")[::-1]
    for idx in order:
        size = int(lengths[idx])
        fill, r = heap[0]
        if fill + size > max_len:
            return None
        bins[r].append(int(idx))
        heapq.heapreplace(heap, (fill + size, r))
    return bins


def pack_epoch(lengths: Sequence[int], max_len: int, replicas: int, seed: int, epoch: int) -> list[list[list[int]]]:
    """One epoch of one unit: per step, per replica, the positions (into ``lengths``) of its batch (module doc).

    Args:
        lengths: tokens per training sample of the unit (as trained: the shifted length).
        max_len: ``train.batch_max_tokens``, the most tokens one replica's batch holds.
        replicas: ranks training the unit.
        seed, epoch: the permutation is ``default_rng(seed + epoch).permutation(len(lengths))``.

    Returns:
        ``steps[s][r]``: a list of positions, every position exactly once over the epoch; the last step holds the
        leftover samples (one per replica, ``[]`` for replicas without one).
    """
    n = len(lengths)
    if n == 0:
        return []
    clipped = np.clip(np.asarray(lengths, dtype=np.int64), 0, max_len)
    perm = np.random.default_rng(seed=seed + epoch).permutation(np.arange(n))
    lens = clipped[perm]
    cum = np.cumsum(lens)
    steps: list[list[list[int]]] = []
    ind, so_far = 0, 0
    while n - ind >= replicas:
        left = 1
        right = 1 + int(np.searchsorted(cum[ind:], so_far + max_len * replicas, "right"))
        bins = None
        while right - left > 1 and right > replicas:
            mid = (left + right) // 2
            bins = _lpt(lens[ind: ind + mid], max_len, replicas)
            if bins is None:
                right = mid
            else:
                left = mid
        if bins is None:
            bins = _lpt(lens[ind: ind + left], max_len, replicas)
        if bins is None:  # a single clipped sample always fits: unreachable
            raise AssertionError("packing failed")
        steps.append([[int(perm[ind + j]) for j in b] for b in bins])
        ind += left
        so_far = int(cum[ind - 1])
    if ind < n:  # V2 drops these; here one more step
        tail = [int(p) for p in perm[ind:]]
        steps.append([[tail[r]] if r < len(tail) else [] for r in range(replicas)])
    return steps


def epoch_plan(lay: Layout, unit_samples: Sequence[Sequence[tuple[int, int]]], max_len: int, seed: int,
               epoch: int) -> list[list[list[int] | None]]:
    """Every rank's batch at every step of ``epoch``: ``plan[step][rank]`` is a list of global sample ids, or None
    (a zero-weight step: the rank's unit has no batch left this epoch; an empty batch is None too).

    Args:
        lay: the :func:`layout`.
        unit_samples: per unit, its training samples as ``(global sample id, trained length)``.
        max_len, seed, epoch: as :func:`pack_epoch`.

    Raises:
        TrainPlanError: no unit has a sample to train on.
    """
    if len(unit_samples) != len(lay.units):
        raise ValueError(f"{len(unit_samples)} sample lists for {len(lay.units)} units")
    per_unit = []
    for samples in unit_samples:
        steps = pack_epoch([t for _i, t in samples], max_len, lay.per_unit, seed, epoch)
        per_unit.append([[[samples[p][0] for p in b] for b in step] for step in steps])
    n_steps = max((len(s) for s in per_unit), default=0)
    if n_steps == 0:
        raise TrainPlanError("extract/ holds no sample to train on (every sample is held out or none was extracted)")
    plan: list[list[list[int] | None]] = []
    for s in range(n_steps):
        row: list[list[int] | None] = []
        for u, steps in enumerate(per_unit):
            for r in range(lay.per_unit):
                b = steps[s][r] if s < len(steps) else []
                row.append(b or None)
        plan.append(row)
    return plan


def chunked_epoch_plan(lay: Layout, unit_samples: Sequence[Sequence[tuple[int, int]]], max_len: int, seed: int,
                       epoch: int, chunks: Sequence[tuple[int, int]]) -> list[list[list[int] | None]]:
    """:func:`epoch_plan` of a chunked run (:mod:`eagle3ops.stages.chunkplan`): chunk by chunk (``[start, end)``
    global sample ranges, in order), each chunk's samples packed as their own epoch (same ``seed + epoch``), so a
    step never needs a sample of another chunk; chunks without a training sample add no step.

    Raises:
        TrainPlanError: no chunk has a sample to train on.
    """
    plan: list[list[list[int] | None]] = []
    for a, b in chunks:
        sub = [[(i, t) for i, t in samples if a <= i < b] for samples in unit_samples]
        if any(sub):
            plan.extend(epoch_plan(lay, sub, max_len, seed, epoch))
    if not plan:
        raise TrainPlanError("extract/ holds no sample to train on (every sample is held out or none was extracted)")
    return plan


def held_out_plan(lay: Layout, held: Sequence[int]) -> list[list[int | None]]:
    """The offline estimate's samples per rank: ``plan[k][rank]`` the k-th held-out sample id a rank evaluates, or
    None (it runs a zero-weight forward). Each unit's held-out ids (sorted) go round-robin over its replicas."""
    per_rank: list[list[int]] = [[] for _ in range(lay.world)]
    for u, (start, end) in enumerate(lay.units):
        mine = sorted(i for i in held if start <= i < end)
        for j, i in enumerate(mine):
            per_rank[u * lay.per_unit + j % lay.per_unit].append(i)
    depth = max((len(p) for p in per_rank), default=0)
    return [[p[k] if k < len(p) else None for p in per_rank] for k in range(depth)]


def unit_samples(lay: Layout, samples: Sequence[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """The training samples ``(global id, trained length)`` split by unit (ids in ``[start, end)``)."""
    return [[(i, t) for i, t in samples if start <= i < end] for start, end in lay.units]


def held_out_indices(n: int, fraction: float, seed: int, content: Sequence[Sequence[str]] | None = None
                     ) -> set[int]:
    """Sample indices held out of training (the offline estimate's samples), stable for a run and independent of
    world size.

    With ``content`` (per sample, the content keys of its user turns: the ``content`` field stage prepare writes,
    :func:`sample_content`) the split is **by content**: samples sharing any normalized user turn are one group
    (:func:`eagle3ops.stages.contentsplit.content_groups`) and a group is held out when ``sha256(f"{seed}:" +
    its canonical key)`` falls in the first ``fraction`` of the range, so no held-out sample repeats a trained user
    turn; at least one group when ``fraction > 0`` and there are 2 or more groups, never all. Without it (a run
    prepared before samples carried their keys) a sample ``i`` is held out when ``sha256(f"{seed}:{i}")`` falls
    there: at least one when ``fraction > 0`` and ``n >= 2``, never all.

    Raises:
        ValueError: ``content`` is not ``n`` long.
    """
    if content is not None:
        from eagle3ops.stages import contentsplit as cs

        if len(content) != n:
            raise ValueError(f"held_out_indices: {n} samples but content keys for {len(content)}")
        if fraction <= 0:
            return set()
        return cs.held_out_groups(cs.content_groups(content, keyed=True), fraction, f"{seed}:", at_least_one=True)
    if fraction <= 0 or n < 2:
        return set()
    keys = {i: int.from_bytes(hashlib.sha256(f"{seed}:{i}".encode()).digest()[:8], "big") for i in range(n)}
    held = {i for i, k in keys.items() if k < fraction * 2**64}
    if not held:
        held = {min(keys, key=keys.__getitem__)}
    if len(held) == n:
        held.discard(max(keys, key=keys.__getitem__))
    return held


def sample_content(samples: Sequence[dict[str, Any]]) -> list[list[str]] | None:
    """Per sample, its user turns' content keys (the ``content`` field of prepare's rows and of the extract
    manifest's ``sample_files``), or None when any sample lacks them (a run prepared before they were written:
    its held-out split stays by index, as it was trained)."""
    out = [s.get("content") for s in samples]
    return None if any(not isinstance(c, list) for c in out) else out  # type: ignore[return-value]


def held_out_split(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How :func:`held_out_of` splits ``samples``, for the train manifest: ``{"by": "content", groups and duplicate
    counts}`` (:meth:`eagle3ops.stages.contentsplit.ContentGroups.record`, without examples) or ``{"by": "index",
    "why"}`` for samples prepared before they carried content keys."""
    from eagle3ops.stages import contentsplit as cs

    content = sample_content(samples)
    if content is None:
        return {"by": "index", "why": "the prepared samples carry no content keys (prepared by an older eagle3ops): "
                                      "rerun prepare to hold samples out by content"}
    rec = cs.content_groups(content, keyed=True).record()
    return {"by": "content", **{k: v for k, v in rec.items() if k != "examples"}}


def held_out_of(samples: Sequence[dict[str, Any]], fraction: float, seed: int) -> set[int]:
    """:func:`held_out_indices` of ``samples`` (prepare's rows or the extract manifest's ``sample_files``, by
    position), by content where every sample carries its keys."""
    return held_out_indices(len(samples), fraction, seed, sample_content(samples))


def choose_checkpoint(curve: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The entry of ``curve`` (``[{"step": int, "acceptance_length": float, ...}, ...]``, in step order: the held-out
    offline estimate at each checkpoint of a train run) with the highest ``acceptance_length``; on a tie the earlier
    step (as good on held-out samples, trained less: the less over-fitted). Pure.

    Raises:
        ValueError: ``curve`` is empty (nothing was evaluated: the caller keeps the last step).
    """
    if not curve:
        raise ValueError("no held-out estimate was taken at any checkpoint")
    best = curve[0]
    for entry in curve[1:]:
        if entry["acceptance_length"] > best["acceptance_length"]:
            best = entry
    return best
