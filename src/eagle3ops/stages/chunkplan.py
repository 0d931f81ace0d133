"""The plan of a chunked run: which samples each chunk holds, and which training steps each pass runs (pure).

A run whose hidden states do not fit the data dir at once is extracted and trained in **chunks**: contiguous
``[start, end)`` ranges of the prepared samples. Stage ``chunked`` (:mod:`eagle3ops.stages.chunked`) carries the
plan out pass by pass: for each epoch, for each chunk, extract the chunk (``stage extract --shard``), train the
pass's steps on it (the train stage resumes from its last checkpoint), delete the chunk's hidden states.

**Chunks and epochs.** An epoch is one pass over every chunk, in order; within a chunk the samples are packed as
speculators' V2 sampler packs an epoch (:func:`eagle3ops.stages.trainplan.chunked_epoch_plan`: permuted with
``seed + epoch``), so a step never needs a sample of another chunk and every training sample is seen exactly once
per epoch, as in a one-chunk run; what differs is the order (shuffled within a chunk, not across the run). Each
epoch extracts every chunk again: ``epochs x chunks`` extractions, the extraction time multiplied by the epochs
(the alternative, several passes over one chunk before the next, saves extraction but trains the chunks one after
another, which a one-chunk run never does). The last pass keeps its chunk (the train manifest lists those files).

**Held-out samples** (the offline estimate, :func:`eagle3ops.stages.trainplan.held_out_indices`) are extracted
with their chunk and kept to the end, so the budget holds them all plus the largest chunk's training samples.

**Bytes.** A sample file holds ``tokens x (4 x hidden_size x 2 + 16)`` bytes (4 bf16 layers; int64 ids and loss
mask) plus :data:`FILE_OVERHEAD` (``torch.save``'s container; measured 2.9 KB on SmolLM2's 320 files).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from eagle3ops.stages import trainplan

#: Bytes of a sample file beyond its tensors (torch.save's zip container), an upper bound.
FILE_OVERHEAD = 4096
#: int64 ``input_ids`` + ``loss_mask`` per token.
ID_BYTES_PER_TOKEN = 16


#: Bytes per trainable draft-head parameter in one resumable checkpoint: fp32 weights (4) + AdamW's two fp32
#: moments (8). Frozen parameters (embeddings, verifier lm_head) are saved as fp32 weights only (4).
CHECKPOINT_BYTES_PER_PARAM = 12
FROZEN_BYTES_PER_PARAM = 4


def draft_param_count(dims: dict[str, int], *, num_layers: int, draft_vocab_size: int) -> tuple[int, int]:
    """Upper bounds of an EAGLE-3 draft head's parameters as ``(trainable, frozen)``: trainable are the fused aux
    projection (3H·H), per decoder layer attention over 2H inputs (≤ 8H²) and the MLP (3·H·I), and the draft
    lm_head (H·draft_vocab); frozen are the target's embeddings and verifier lm_head (2·V·H).

    ``dims``: ``hidden_size``, ``intermediate_size``, ``vocab_size`` of the target
    (:func:`eagle3ops.window.preflight.target_dims`)."""
    h, i, v = dims["hidden_size"], dims["intermediate_size"], dims["vocab_size"]
    return 3 * h * h + num_layers * (8 * h * h + 3 * h * i) + h * draft_vocab_size, 2 * v * h


def train_output_bytes(dims: dict[str, int], config: Any) -> int:
    """Bytes stage train writes (an upper bound): ``train.keep_checkpoints + 1`` resumable checkpoints (the newest is
    written before the oldest is deleted) of :data:`CHECKPOINT_BYTES_PER_PARAM` per trainable and
    :data:`FROZEN_BYTES_PER_PARAM` per frozen parameter (:func:`draft_param_count`), plus the bf16 final head, plus
    with ``train.select_checkpoint: held_out`` two fp32 copies of the weights (``checkpoints/best/`` and the new best
    written before it is swapped in). ``dims``: ``hidden_size``, ``intermediate_size``, ``vocab_size`` of the
    target."""
    trainable, frozen = draft_param_count(dims, num_layers=config.train.num_layers,
                                          draft_vocab_size=config.vocab.draft_vocab_size)
    ckpt = trainable * CHECKPOINT_BYTES_PER_PARAM + frozen * FROZEN_BYTES_PER_PARAM
    best = 2 * (trainable + frozen) * 4 if config.train.select_checkpoint == "held_out" else 0
    return ckpt * (config.train.keep_checkpoints + 1) + (trainable + frozen) * 2 + best


class ChunkPlanError(ValueError):
    """No chunk plan fits (the message names the key to change)."""


def value_bytes(hidden_size: int, dtype: str = "bfloat16") -> int:
    """Stored bytes of one token's state in one layer: ``2 H`` (bf16) or ``H + 4`` (``float8_e4m3fn``: one byte a
    value and its token's fp32 scale); the one formula of extract's figures, preflight's estimate and the plan."""
    return hidden_size + 4 if dtype == "float8_e4m3fn" else hidden_size * 2


def sample_bytes(tokens: int, hidden_size: int, layers: int = 4, dtype: str = "bfloat16") -> int:
    """Disk bytes of one extracted sample file of ``tokens`` tokens (module doc; :func:`value_bytes` a value)."""
    return tokens * (layers * value_bytes(hidden_size, dtype) + ID_BYTES_PER_TOKEN) + FILE_OVERHEAD


@dataclass(frozen=True)
class Pass:
    """One pass: extract ``chunk`` (samples ``[start, end)``), train steps ``[step_start, step_end)`` of
    ``epoch`` on it."""

    epoch: int
    chunk: int
    start: int
    end: int
    step_start: int
    step_end: int


@dataclass(frozen=True)
class ChunkPlan:
    """A chunked run's plan (module doc). Bytes are sample-file bytes (:func:`sample_bytes`)."""

    chunks: tuple[tuple[int, int], ...]
    passes: tuple[Pass, ...]
    steps: int
    steps_per_epoch: int
    held: tuple[int, ...]
    held_bytes: int
    chunk_bytes: tuple[int, ...]
    total_bytes: int
    budget_bytes: int
    basis: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def peak_bytes(self) -> int:
        """Most sample-file bytes on disk at once: every held-out sample and the largest chunk's training samples."""
        return self.held_bytes + max(self.chunk_bytes, default=0)

    @property
    def epochs(self) -> float:
        """Epochs the steps cover (``steps / steps_per_epoch``)."""
        return self.steps / self.steps_per_epoch if self.steps_per_epoch else 0.0

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (``chunks``, ``passes``, the byte figures); :func:`from_json` reads it back."""
        d = asdict(self)
        d["peak_bytes"], d["epochs"] = self.peak_bytes, round(self.epochs, 4)
        return d

    def lines(self) -> list[str]:
        """The plan as printed before anything runs: the chunks, the passes, the disk figures."""
        g = 2**20
        out = [f"chunked run: {len(self.chunks)} chunk(s), {self.steps} steps = {self.epochs:.2f} epoch(s) of "
               f"{self.steps_per_epoch} steps, {len(self.passes)} pass(es) (each extracts its chunk)",
               f"  hidden states {self.total_bytes / g:.1f} MiB in all; at most {self.peak_bytes / g:.1f} MiB at once "
               f"(held-out {self.held_bytes / g:.1f} MiB kept + largest chunk "
               f"{max(self.chunk_bytes, default=0) / g:.1f}"
               f" MiB) within the budget {self.budget_bytes / g:.1f} MiB ({self.basis})"]
        for c, ((a, b), nb) in enumerate(zip(self.chunks, self.chunk_bytes)):
            out.append(f"  chunk {c}: samples [{a}, {b}), {nb / g:.1f} MiB of training samples")
        for p in self.passes:
            out.append(f"  pass epoch {p.epoch} chunk {p.chunk}: extract [{p.start}, {p.end}), train steps "
                       f"{p.step_start + 1}..{p.step_end}")
        out.extend(f"  note: {n}" for n in self.notes)
        return out


def from_json(d: dict[str, Any]) -> ChunkPlan:
    """:meth:`ChunkPlan.to_json` read back."""
    return ChunkPlan(chunks=tuple(tuple(c) for c in d["chunks"]),  # type: ignore[misc]
                     passes=tuple(Pass(**p) for p in d["passes"]), steps=int(d["steps"]),
                     steps_per_epoch=int(d["steps_per_epoch"]), held=tuple(d["held"]),
                     held_bytes=int(d["held_bytes"]), chunk_bytes=tuple(d["chunk_bytes"]),
                     total_bytes=int(d["total_bytes"]), budget_bytes=int(d["budget_bytes"]),
                     basis=str(d.get("basis", "")), notes=tuple(d.get("notes") or ()))


def cut(sizes: Sequence[int], held: set[int], *, budget: int | None = None,
        count: int | None = None) -> list[tuple[int, int]]:
    """Contiguous chunks of the samples (``sizes[i]``: sample ``i``'s file bytes): with ``budget``, the fewest whose
    training samples each fit ``budget - held bytes`` (greedy, in order); with ``count``, ``count`` chunks of about
    equal training bytes.

    Raises:
        ChunkPlanError: the held-out samples and the largest training sample do not fit ``budget``.
    """
    n = len(sizes)
    train = [0 if i in held else int(sizes[i]) for i in range(n)]
    if count is not None:
        total = sum(train) or 1
        bounds, acc, k = [0], 0, 1
        for i, s in enumerate(train):
            acc += s
            if k < count and acc >= total * k / count and i + 1 < n:
                bounds.append(i + 1)
                k += 1
        bounds.append(n)
        return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    assert budget is not None
    held_b = sum(int(sizes[i]) for i in held)
    room = budget - held_b
    if room < max(train, default=0):
        raise ChunkPlanError(
            f"the held-out samples ({held_b / 2**20:.1f} MiB) and the largest training sample "
            f"({max(train, default=0) / 2**20:.1f} MiB) do not fit the budget of {budget / 2**20:.1f} MiB: free space "
            f"in the data dir, or raise chunks.budget_bytes / chunks.budget_fraction, or lower "
            f"train.held_out_fraction")
    out, a, acc = [], 0, 0
    for i, s in enumerate(train):
        if acc + s > room:
            out.append((a, i))
            a, acc = i, 0
        acc += s
    out.append((a, n))
    return [(x, y) for x, y in out if y > x]


def plan(tokens: Sequence[int], *, hidden_size: int, config: Any, budget_bytes: int, basis: str = "",
         world: int = 1, content: Sequence[Sequence[str]] | None = None) -> ChunkPlan:
    """The plan of a chunked run (module doc).

    Args:
        tokens: tokens of every prepared sample (``len(input_ids)``), by global id.
        hidden_size: the target's hidden size.
        config: the run's :class:`~eagle3ops.config.pipeline.PipelineConfig` (``chunks``, ``train``, ``seed``).
        budget_bytes: sample-file bytes that may be on disk at once (``chunks.count: auto``).
        basis: how the budget was found (printed).
        world: training processes (one unit: every rank trains every chunk).
        content: per sample, its user turns' content keys (prepare's ``content``): the held-out samples are
            then chosen by content (:func:`eagle3ops.stages.trainplan.held_out_indices`); None: by index.

    Raises:
        ChunkPlanError: nothing to train on, or no chunking fits the budget.
    """
    tc, n = config.train, len(tokens)
    held = trainplan.held_out_indices(n, tc.held_out_fraction, config.seed, content)
    sizes = [sample_bytes(int(t), hidden_size, dtype=config.extract.hidden_dtype) for t in tokens]
    count = config.chunks.count
    chunks = cut(sizes, held, count=count if isinstance(count, int) else None,
                 budget=None if isinstance(count, int) else budget_bytes)
    lay = trainplan.layout([], n, world)
    units = trainplan.unit_samples(lay, [(i, int(t) - 1) for i, t in enumerate(tokens) if i not in held])
    if not units[0]:
        raise ChunkPlanError("prepare/ holds no sample to train on (every sample is held out)")
    per_epoch: dict[int, list[int]] = {}

    def steps_of(epoch: int) -> list[int]:
        if epoch not in per_epoch:
            row = []
            for a, b in chunks:
                has = any(a <= i < b for i, _t in units[0])
                row.append(len(trainplan.chunked_epoch_plan(lay, units, tc.batch_max_tokens, config.seed, epoch,
                                                            [(a, b)])) if has else 0)
            per_epoch[epoch] = row
        return per_epoch[epoch]

    passes, step, epoch = [], 0, 0
    while step < tc.steps:
        for c, (a, b) in enumerate(chunks):
            k = steps_of(epoch)[c]
            if k == 0 or step >= tc.steps:
                continue
            passes.append(Pass(epoch, c, a, b, step, min(step + k, tc.steps)))
            step = passes[-1].step_end
        epoch += 1
    chunk_bytes = tuple(sum(sizes[i] for i in range(a, b) if i not in held) for a, b in chunks)
    notes = []
    if isinstance(count, int) and sum(sizes[i] for i in held) + max(chunk_bytes) > budget_bytes:
        notes.append(f"chunks.count {count} needs {(sum(sizes[i] for i in held) + max(chunk_bytes)) / 2**20:.1f} "
                     f"MiB at once, over the budget: use chunks.count auto or more chunks")
    return ChunkPlan(chunks=tuple(chunks), passes=tuple(passes), steps=tc.steps, steps_per_epoch=sum(steps_of(0)),
                     held=tuple(sorted(held)), held_bytes=sum(sizes[i] for i in held), chunk_bytes=chunk_bytes,
                     total_bytes=sum(sizes), budget_bytes=int(budget_bytes), basis=basis, notes=tuple(notes))


def digest(p: ChunkPlan) -> str:
    """A short id of the plan's chunks and passes (recorded by the passes, so a changed plan is noticed)."""
    import hashlib

    return hashlib.sha256(json.dumps([p.chunks, [asdict(x) for x in p.passes]]).encode()).hexdigest()[:16]
