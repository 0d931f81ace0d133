"""The behavioural probes' model fixtures (:class:`eagle3ops.patches.fixtures.ProbeFixtures`), loaded by name by
that seam: tiny random targets (:mod:`.tinymodel`) and random EAGLE-3 heads (:mod:`.tinydraft`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["build_draft", "build_target"]


def build_target(out_dir: Path, kind: str, seed: int = 0) -> Path:
    """:func:`eagle3ops_dev.tinymodel.build_tiny_model` (same errors: ValueError for an unknown kind,
    FileExistsError for a non-empty ``out_dir``)."""
    from eagle3ops_dev.tinymodel import build_tiny_model

    return build_tiny_model(out_dir, kind=kind, seed=seed)  # type: ignore[arg-type]


def build_draft(out_dir: Path, target_dir: Path, *, draft_vocab: Sequence[int] | None = None, seed: int = 0,
                aux_layer_ids: Sequence[int] | None = None) -> Path:
    """:func:`eagle3ops_dev.tinydraft.build_tiny_eagle3_draft` (same arguments and errors)."""
    from eagle3ops_dev.tinydraft import build_tiny_eagle3_draft

    return build_tiny_eagle3_draft(out_dir, target_dir, draft_vocab=draft_vocab, seed=seed,
                                   aux_layer_ids=aux_layer_ids)
