"""The state one training process of stage ``train`` carries from setup to the final head: :class:`TrainJob`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3ops.config.pipeline import PipelineConfig
from eagle3ops.stages.draft import standardize_with_norm
from eagle3ops.stages.manifest import stage_dir


@dataclass
class TrainJob:
    """One training process's state, from setup to the final head (the package doc tells the run).

    Set by :func:`eagle3ops.stages.train.setup.set_up`: where it writes (``out``; ``ckpt_root`` and
    ``metrics_path`` under it), its place in the process group (``world``, ``rank``, ``is_main``; ``log`` is quiet
    on every rank but 0), ``device``, ``use_compile``, ``attention``, the draft head (``model``; ``d2t``: draft
    token → offset to its target token, shape ``[draft_vocab]``; ``aux``: the extracted aux layer ids), ``ext``
    (the extract manifest), ``norm`` (the target's final RMSNorm: weight, eps), the samples (``by_id``; ``held``: the
    held-out sample ids; ``lay``/``units``: :mod:`eagle3ops.stages.trainplan`'s layout and per-unit
    ``(id, tokens)``; ``chunks``/``current``: a chunked pass's chunks and the current one; ``pos``: this rank's
    sample id → dataset index) and ``dataset``/``collate``. Set by
    :func:`eagle3ops.stages.train.setup.shard_and_optimize`: ``opt``, ``sched``, ``sd_opts``. Set by
    :func:`eagle3ops.stages.train.ckpt.restore`: ``step`` (steps done: a resume's start, then the loop's count),
    ``first_step`` (the step this run started from), ``chooser`` (:class:`eagle3ops.stages.heldout.CheckpointChooser`)
    and ``evaluate`` (:class:`eagle3ops.stages.heldout.HeldOutEval`)."""

    run_dir: Path
    config: PipelineConfig
    out: Path
    world: int
    rank: int
    log: Any
    device: str
    use_compile: bool
    attention: str
    model: Any
    d2t: Any
    aux: list[int]
    ext: dict[str, Any]
    norm: tuple[Any, float]
    by_id: dict[int, dict[str, Any]]
    held: list[int]
    lay: Any
    units: Any
    chunks: list[tuple[int, ...]]
    current: tuple[int, int] | None
    pos: dict[int, int]
    collate: Any
    dataset: Any = None
    opt: Any = None
    sched: Any = None
    sd_opts: Any = None
    step: int = 0
    first_step: int = 0
    chooser: Any = None
    evaluate: Any = None

    @property
    def tc(self) -> Any:
        """``train:`` of pipeline.yaml."""
        return self.config.train

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes checkpoints, the final head and the manifest."""
        return self.rank == 0

    @property
    def ckpt_root(self) -> Path:
        """``<out>/checkpoints``."""
        return self.out / "checkpoints"

    @property
    def metrics_path(self) -> Path:
        """``<out>/metrics.jsonl``: one line per step (rank 0's)."""
        return self.out / "metrics.jsonl"

    @property
    def ext_dir(self) -> Path:
        """The run's ``extract/``: the sample files."""
        return stage_dir(self.run_dir, "extract")

    def sample_file(self, i: int) -> str:
        """The extracted sample file of sample id ``i``."""
        return str(self.ext_dir / self.by_id[i]["file"])

    def standardize(self) -> Any:
        """speculators' ``standardize_data_v1`` with the target's final norm applied to the last layer as a sample
        is loaded (:func:`eagle3ops.stages.draft.standardize_with_norm`; the package doc says why)."""
        norm_w, eps = self.norm
        return standardize_with_norm(norm_w, eps)
