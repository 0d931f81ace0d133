"""The stages' disk estimate before a window (read-only): bytes each stage will write, from the target's
``config.json`` and the pipeline's settings, against the free space on the host's data dir."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eagle3ops.commands import host as hc
from eagle3ops.commands import stages as st
from eagle3ops.remote import Remote
from eagle3ops.stages.chunkplan import train_output_bytes, value_bytes
from eagle3ops.window.common import host_path

if TYPE_CHECKING:
    from eagle3ops.config.pipeline import PipelineConfig

#: Bytes per token of extracted hidden states: 4 aux layers (3 intermediate + last) × hidden size × 2 bytes (bf16).
AUX_LAYERS_STORED = 4
BF16_BYTES = 2



def hidden_state_bytes(tokens: int, hidden_size: int, dtype: str = "bfloat16") -> int:
    """Disk bytes of extracted hidden states: tokens × 4 aux layers × hidden_size × 2 (bf16), or × (hidden_size + 4)
    for ``extract.hidden_dtype: float8_e4m3fn`` (one byte a value + one fp32 scale a token and layer).

    Source: speculators stores, per token, the 3 aux layers' hidden states concatenated plus the last layer's,
    each ``hidden_size`` values, in the target's dtype (bf16 = 2 bytes).
    """
    return tokens * AUX_LAYERS_STORED * value_bytes(hidden_size, dtype)


#: Bytes per token of ``prepare/samples.jsonl`` (ids and loss mask as JSON text) and of the int64 ``input_ids`` +
#: ``loss_mask`` stored beside each sample's hidden states: generous bounds.
PREPARED_BYTES_PER_TOKEN = 16


def target_dims(model_config: dict[str, Any]) -> dict[str, int]:
    """``hidden_size``, ``intermediate_size``, ``vocab_size`` of a target's ``config.json`` (the text model's for
    multimodal configs with a ``text_config``).

    Raises:
        ValueError: no ``hidden_size`` (the file is not a transformer config).
    """
    t = model_config if "hidden_size" in model_config else (model_config.get("text_config") or {})
    if not t.get("hidden_size"):
        raise ValueError("config.json has no hidden_size (nor text_config.hidden_size)")
    h = int(t["hidden_size"])
    return {"hidden_size": h, "intermediate_size": int(t.get("intermediate_size") or 4 * h),
            "vocab_size": int(t.get("vocab_size") or model_config.get("vocab_size") or 0)}


def stage_output_bytes(stage: str, cfg: Any, dims: dict[str, int], tokens: int) -> int:
    """Estimated bytes a stage writes into ``<data_dir>/runs/<run>/`` (pure).

    Args:
        stage: ``prepare``, ``extract``, ``vocab`` or ``train``.
        cfg: the run's :class:`eagle3ops.config.pipeline.PipelineConfig`.
        dims: :func:`target_dims` of the target model.
        tokens: prepared tokens (exact from the prepare manifest, else an upper bound).

    ``extract``: tokens × 4·H·2 bytes of hidden states (:func:`hidden_state_bytes`) + ids/masks; ``train``:
    ``keep_checkpoints + 1`` resumable checkpoints (the newest is written before the oldest is deleted) of
    :data:`eagle3ops.stages.chunkplan.CHECKPOINT_BYTES_PER_PARAM` per trainable and ``FROZEN_BYTES_PER_PARAM`` per frozen parameter, plus
    the bf16 final head.
    """
    if stage == "prepare":
        return tokens * PREPARED_BYTES_PER_TOKEN
    if stage == "extract":
        return (hidden_state_bytes(tokens, dims["hidden_size"], cfg.extract.hidden_dtype)
                + tokens * PREPARED_BYTES_PER_TOKEN)
    if stage == "vocab":
        return 8 * (cfg.vocab.draft_vocab_size + dims["vocab_size"])
    if stage == "train":
        return train_output_bytes(dims, cfg)
    if stage == "chunked":  # the least it needs: train's outputs, the held-out samples, one sample (stages/chunked)
        held = math.ceil(tokens * cfg.train.held_out_fraction)
        return (train_output_bytes(dims, cfg) + hidden_state_bytes(held + cfg.prepare.max_seq_len, dims["hidden_size"],
                                                                   cfg.extract.hidden_dtype)
                + tokens * PREPARED_BYTES_PER_TOKEN)
    raise ValueError(f"unknown stage {stage!r}")


@dataclass
class DiskEstimate:
    """Bytes each stage of a window is expected to write, how they were estimated, or why they could not be."""

    by_stage: dict[str, int] = field(default_factory=dict)
    basis: str = ""
    error: str = ""

    @property
    def total(self) -> int:
        """Sum over the stages, in bytes."""
        return sum(self.by_stage.values())

    def describe(self) -> str:
        """One line: per-stage MiB and the basis."""
        parts = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in self.by_stage.items())
        return f"stage outputs {parts} ({self.basis})" if parts else self.error


def _manifest_tokens(r: Remote, rdir: str) -> int | None:
    """The exact token count of the run's prepare manifest (``<rdir>/prepare/manifest.json``, read-only); None when
    prepare has not run or its manifest is unreadable."""
    man = r.run(hc.cat_if_exists(f"{rdir}/prepare/manifest.json"), check=False)
    try:
        return int(json.loads(man.stdout)["tokens"]) if man.stdout.strip() else None
    except (ValueError, KeyError, TypeError):
        return None


def _samples_bound(r: Remote, cfg: PipelineConfig, run: str) -> tuple[int | None, str]:
    """At most how many samples prepare keeps, before it runs (read-only): the rows of ``cfg.prepare.datasets``
    (a built-in set's from the package, a host file's by ``wc -l``) capped by ``prepare.max_samples``; when some
    file cannot be counted (Parquet, outside /data and the run directory), ``max_samples`` alone. Returns
    ``(samples, "")``, or ``(None, why)`` when a file cannot be counted and no ``max_samples`` bounds it (``why``
    names the files and the fix)."""
    from importlib import resources

    rows, unknown = 0, []
    for spec in cfg.prepare.datasets:
        if spec.startswith("builtin:"):
            f = resources.files("eagle3ops.data").joinpath(f"chat_{spec.removeprefix('builtin:')}.jsonl")
            rows += len(f.read_text().splitlines()) if f.is_file() else 0
            continue
        hp = host_path(r.host, spec, run)
        wc = r.run(hc.line_count(hp), check=False) if hp and not spec.endswith(".parquet") else None
        if wc is not None and wc.ok and wc.stdout.split():
            rows += int(wc.stdout.split()[0])
        else:
            why = (wc.stderr.strip() if wc is not None else "") or (
                "Parquet" if hp else "not under /data or the run directory")
            unknown.append(f"{spec} ({why})")
    if unknown and not cfg.prepare.max_samples:
        return None, (f"cannot count the rows of {'; '.join(unknown)} before the run; put the file in the run "
                      f"directory or set prepare.max_samples in the pipeline config so the hidden-state size "
                      f"can be bounded")
    if unknown:  # rows of some files unknown: max_samples bounds the count
        return cfg.prepare.max_samples or 0, ""
    return (min(rows, cfg.prepare.max_samples) if cfg.prepare.max_samples else rows), ""


def estimate_disk(r: Remote, *, kind: str, run: str, pipeline_text: str,
                  stages: list[str] | None = None) -> DiskEstimate:
    """Estimate the bytes the stages of window ``kind`` will write, from facts read before anything stops
    (read-only): the target's ``config.json``, the run's prepare manifest (exact token count) or else the dataset
    row counts × ``prepare.max_seq_len`` (an upper bound), and the pipeline config. ``stages``: the stages that
    will run (default: all of the window's; skipped ones write nothing)."""
    import yaml

    from eagle3ops.config.pipeline import PipelineConfig

    h, est = r.host, DiskEstimate()
    try:
        cfg = PipelineConfig.model_validate(yaml.safe_load(pipeline_text) or {})
    except Exception as exc:  # noqa: BLE001 - pydantic or YAML error
        est.error = f"pipeline config is invalid: {exc}"
        return est
    model_dir = host_path(h, cfg.target_model, run) or h.model_path
    out = r.run(hc.cat_if_exists(f"{model_dir}/config.json"), check=False)
    try:
        dims = target_dims(json.loads(out.stdout))
    except (ValueError, TypeError) as exc:
        est.error = (f"cannot read the target's {model_dir}/config.json on the host ({exc or 'missing'}); it gives "
                     f"the hidden size the disk estimate needs (target_model: {cfg.target_model})")
        return est
    rdir = f"{h.data_dir}/runs/{run}"
    stages = st.window_stages(kind, cfg) if stages is None else stages
    if not {"prepare", "extract", "chunked"} & set(stages):  # train window: outputs do not scale with tokens
        est.basis = f"draft head of {cfg.train.num_layers} layer(s), hidden size {dims['hidden_size']}"
        est.by_stage = {s: stage_output_bytes(s, cfg, dims, 0) for s in stages}
        return est
    tokens = _manifest_tokens(r, rdir)
    if tokens is not None:
        est.basis = f"{tokens} prepared tokens from the prepare manifest, hidden size {dims['hidden_size']}"
    else:
        n, why = _samples_bound(r, cfg, run)
        if n is None:
            est.error = why
            return est
        tokens = n * cfg.prepare.max_seq_len
        est.basis = (f"at most {n} samples × {cfg.prepare.max_seq_len} tokens, hidden size {dims['hidden_size']}, "
                     f"4 layers × 2 bytes per value")
    for stage in stages:
        est.by_stage[stage] = stage_output_bytes(stage, cfg, dims, tokens)
    if "chunked" in stages:
        total = hidden_state_bytes(tokens, dims["hidden_size"], cfg.extract.hidden_dtype)
        est.basis += (f"; chunked run: {total / 2**20:.1f} MiB of hidden "
                      f"states in all, extracted and trained chunk by chunk in at most chunks.budget_fraction "
                      f"{cfg.chunks.budget_fraction:g} of the free space (the least it needs is counted here; "
                      f"`stage chunked --dry-run` prints the chunks and passes)")
    return est
