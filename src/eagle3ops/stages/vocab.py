"""Stage ``vocab``: the draft vocabulary (d2t/t2d) from token frequencies of the prepared data.

Output, in ``<run_dir>/vocab/``: ``d2t.npy`` (int64, ``[draft_vocab_size]``), ``t2d.npy`` (bool,
``[target_vocab_size]``), ``token_freq.json`` (``{token id: count}`` over assistant tokens), ``manifest.json``.

Conventions (speculators 0.3.0 ``train/vocab_mapping.py`` and vLLM 0.16 ``model_executor/models/llama_eagle3.py``):

- ``d2t[i]`` is an *offset*: the target id of draft id ``i`` is ``i + d2t[i]``; vLLM's EAGLE-3 proposer maps a
  draft argmax ``i`` to ``i + d2t[i]``;
- ``t2d`` is a bool mask over the target vocabulary with exactly ``draft_vocab_size`` true entries;
- the draft vocabulary is the ``draft_vocab_size`` most frequent target ids among the tokens under the loss
  mask (ties broken by lower id), topped up with the lowest unused ids when the data has fewer distinct tokens,
  and sorted — speculators' ``build_vocab_mappings_from_distribution``, which is used as is.

With ``vocab.coverage_target`` the size is chosen by measured coverage (:func:`choose_draft_size`): the smallest
multiple of :data:`SIZE_STEP` whose most frequent ids cover that fraction of the assistant tokens, at most
``draft_vocab_size``; the manifest records the coverage curve (:func:`coverage_curve`) and the choice.

The target vocabulary size is read from the target's config (``trust_remote_code=True``; ``vocab_size`` or
``text_config.vocab_size``), never assumed.
"""

from __future__ import annotations

import json
import resource
import time
from collections import Counter
from pathlib import Path
from typing import Any

from eagle3ops.config.pipeline import PipelineConfig
from eagle3ops.stages.manifest import atomic_write_text, check_inputs, file_entry, stage_dir, write_manifest
from eagle3ops.stages.prepare import read_samples
from eagle3ops.stages.target import target_text_config

__all__ = ["SIZE_STEP", "choose_draft_size", "coverage_curve", "run_vocab", "target_text_config",
           "target_vocab_size"]

#: Draft vocabulary sizes chosen by coverage are multiples of this (kernel-friendly shapes; a finer choice would not
#: change the head's cost measurably).
SIZE_STEP = 256
#: Sizes at which the manifest records the coverage curve (those above the target vocabulary are left out).
CURVE_SIZES = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


def _coverage_at(counts: list[int], total: int, size: int) -> float:
    return sum(counts[:size]) / total if total else 0.0


def coverage_curve(freq: dict[int, int], vocab: int, sizes: tuple[int, ...] = CURVE_SIZES) -> dict[str, float]:
    """``{size: coverage}``: the fraction of all counted tokens that the ``size`` most frequent ids cover, for each
    of ``sizes`` below ``vocab`` and ``vocab`` itself (rounded to 6 places; 0.0 when nothing was counted)."""
    counts = sorted(freq.values(), reverse=True)
    total = sum(counts)
    return {str(s): round(_coverage_at(counts, total, s), 6) for s in [*(s for s in sizes if s < vocab), vocab]}


def choose_draft_size(freq: dict[int, int], target: float, max_size: int, step: int = SIZE_STEP) -> int:
    """The smallest multiple of ``step`` whose most frequent ids cover at least ``target`` of the counted tokens,
    capped at ``max_size`` (which is returned when no smaller size reaches ``target``).

    Raises:
        ValueError: ``target`` not in (0, 1], or no tokens counted (the prepared data has no assistant tokens).
    """
    if not 0 < target <= 1:
        raise ValueError(f"pipeline.yaml: vocab.coverage_target={target}: must be in (0, 1]")
    counts = sorted(freq.values(), reverse=True)
    total = sum(counts)
    if not total:
        raise ValueError("vocab.coverage_target: the prepared data has no assistant tokens to measure coverage on")
    size = step
    while size < max_size and _coverage_at(counts, total, size) < target:
        size += step
    return min(size, max_size)


def target_vocab_size(target_model: str) -> int:
    """Vocabulary size of the target (rows of its embedding / lm_head), from its config.

    Raises:
        ValueError: the config has no ``vocab_size`` (nor ``text_config.vocab_size``).
    """
    cfg = target_text_config(target_model)
    size = getattr(cfg, "vocab_size", None)
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"{target_model}/config.json: no vocab_size (nor text_config.vocab_size) to size t2d by")
    return size


def run_vocab(run_dir: Path, config: PipelineConfig, log: Any = print) -> dict[str, Any]:
    """Run stage ``vocab``; returns the manifest's figures.

    Raises:
        StageInputError: the prepare output is missing or inconsistent.
        ValueError: ``draft_vocab_size`` exceeds the target vocabulary, or a token id is outside it.
    """
    t0 = time.monotonic()
    check_inputs(run_dir, "vocab", config, hash_files=True)
    import numpy as np
    import torch
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    out = stage_dir(run_dir, "vocab")
    out.mkdir(parents=True, exist_ok=True)
    vocab = target_vocab_size(config.target_model)
    draft = config.vocab.draft_vocab_size
    if draft > vocab:
        raise ValueError(
            f"pipeline.yaml: vocab.draft_vocab_size ({draft}) is larger than the target vocabulary ({vocab}, "
            f"from {config.target_model}/config.json); set it to at most {vocab}"
        )
    freq: Counter[int] = Counter()
    for row in read_samples(run_dir):
        freq.update(t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m)
    bad = [t for t in freq if not 0 <= t < vocab]
    if bad:
        raise ValueError(
            f"prepare/samples.jsonl holds token ids outside the target vocabulary [0, {vocab}) e.g. {bad[:5]}: the "
            "tokenizer and config.json of the target disagree"
        )
    chosen = None
    if config.vocab.coverage_target is not None:
        draft = choose_draft_size(dict(freq), config.vocab.coverage_target, draft)
        chosen = {"by": "coverage", "coverage_target": config.vocab.coverage_target, "step": SIZE_STEP,
                  "max": config.vocab.draft_vocab_size, "size": draft}
    d2t, t2d = build_vocab_mappings_from_distribution(dict(freq), draft, vocab)
    # Invariants the draft head and vLLM rely on.
    assert d2t.shape == (draft,) and t2d.shape == (vocab,) and int(t2d.sum()) == draft
    assert torch.equal(torch.arange(draft) + d2t, torch.nonzero(t2d).flatten())
    np.save(out / "d2t.npy", d2t.numpy())
    np.save(out / "t2d.npy", t2d.numpy())
    atomic_write_text(out / "token_freq.json", json.dumps({str(k): v for k, v in sorted(freq.items())}) + "\n")
    covered = sum(c for t, c in freq.items() if t2d[t])
    total = sum(freq.values())
    figures = {
        "draft_vocab_size": draft,
        "target_vocab_size": vocab,
        "distinct_assistant_tokens": len(freq),
        "assistant_tokens": total,
        "coverage": round(covered / total, 6) if total else 0.0,
        "padded_ids": max(0, draft - len(freq)),
        "coverage_curve": coverage_curve(dict(freq), vocab),
        "size_choice": chosen or {"by": "config", "size": draft},
        "wall_s": round(time.monotonic() - t0, 3),
        # Linux ru_maxrss is in KiB; the whole process (torch and speculators imports included).
        "peak_memory_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024,
        "peak_memory_kind": "process max RSS",
    }
    files = {n: file_entry(out / n) for n in ("d2t.npy", "t2d.npy", "token_freq.json")}
    write_manifest(run_dir, "vocab", config, files, **figures)
    log(f"vocab: {draft} of {vocab} target ids cover {figures['coverage']:.2%} of assistant tokens "
        f"({len(freq)} distinct) in {figures['wall_s']} s, peak RSS {figures['peak_memory_bytes'] / 2**20:.0f} MiB")
    return figures
