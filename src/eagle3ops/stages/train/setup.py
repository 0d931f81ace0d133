"""Setup of stage ``train`` in a process that trains: the process group and device, the draft head, this rank's
share of the samples and its dataset, then (after a checkpoint's weights are in) FSDP2 sharding, the optimizer and
its schedule. Everything the later steps use is held in one :class:`eagle3ops.stages.train.job.TrainJob`; torch
and speculators are imported inside the functions (the stage command imports this package before it knows whether
it will train)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from eagle3ops.config.pipeline import PipelineConfig
from eagle3ops.stages import trainplan
from eagle3ops.stages.draft import build_draft_config, install_loss, register_dense_attention, target_final_norm
from eagle3ops.stages.manifest import stage_dir
from eagle3ops.stages.train.job import TrainJob
from eagle3ops.stages.train.launch import Placement


def _quiet(*_args: Any, **_kwargs: Any) -> None:
    return None


def _join(world: int, tc: Any, log: Any) -> tuple[str, int, Any, bool]:
    """(device, rank, log, use_compile): the device this process trains on, the process group joined when
    ``world`` > 1 (NCCL on cuda, gloo on cpu), the log quiet on every rank but 0, ``train.compile`` applied and the
    loss installed (``train.loss``: before the first forward, and its compile, reads it)."""
    import torch
    import torch.distributed as dist

    device = tc.device if tc.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    rank = 0
    if world > 1:
        if device == "cuda":
            local_rank = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(local_rank)
            device = f"cuda:{local_rank}"
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
        rank = dist.get_rank()
    if rank != 0:
        log = _quiet  # one log per run: rank 0's
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    # speculators decorates the draft forward with @torch.compile; train.compile decides whether it compiles.
    use_compile = tc.compile if tc.compile is not None else device.startswith("cuda")
    torch._dynamo.config.disable = not use_compile
    install_loss(tc.loss, tc.lk_eta)  # before the first forward (and its compile) reads it
    return device, rank, log, use_compile


def _draft_head(run_dir: Path, config: PipelineConfig, ext: dict[str, Any], device: str) -> tuple[Any, Any, str]:
    """(model, d2t, attention): the draft head built from the vocab stage's d2t/t2d and the extracted aux layers,
    after seeding Python, NumPy and torch with ``config.seed`` (every rank builds the same weights)."""
    import numpy as np
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel

    tc = config.train
    d2t = torch.from_numpy(np.load(stage_dir(run_dir, "vocab") / "d2t.npy"))
    t2d = torch.from_numpy(np.load(stage_dir(run_dir, "vocab") / "t2d.npy"))
    attention = tc.attention if tc.attention != "auto" else ("dense" if device == "cpu" else "flex")
    attn_impl = register_dense_attention() if attention == "dense" else "simple_flex_attention"
    draft_cfg = build_draft_config(config, list(ext["aux_layer_ids"]), int(d2t.shape[0]), attn_impl)
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    return Eagle3DraftModel(draft_cfg, t2d=t2d, d2t=d2t), d2t, attention


def _samples(ext: dict[str, Any], config: PipelineConfig, world: int, rank: int) -> dict[str, Any]:
    """This rank's share of the extracted samples (:mod:`eagle3ops.stages.trainplan`): ``by_id``, ``held``,
    ``lay``, ``units``, ``chunks``, ``current``, ``pos``.

    Raises:
        TrainPlanError: this rank's unit holds no sample to train on.
    """
    tc = config.train
    sample_files = ext["sample_files"]
    ids = [int(s.get("i", n)) for n, s in enumerate(sample_files)]
    by_id = {i: s for i, s in zip(ids, sample_files)}
    held_pos = trainplan.held_out_of(sample_files, tc.held_out_fraction, config.seed)  # by content when keyed
    held = sorted(ids[n] for n in held_pos)
    lay = trainplan.layout(trainplan.shards_of(ext), len(sample_files), world)
    my_unit, _replica = lay.unit_of(rank)
    lo, hi = lay.units[my_unit]
    # tokens - 1: shift_batch drops one position
    held_set = set(held)
    units = trainplan.unit_samples(lay, [(i, by_id[i]["tokens"] - 1) for i in ids if i not in held_set])
    mine = [i for i, _t in units[my_unit]]  # this rank's unit: the only files it reads
    chunked = ext.get("chunked") or {}  # a pass of stage chunked: only the current chunk's files are there
    chunks = [tuple(c) for c in chunked.get("chunks") or []]
    current = None
    if chunks:
        current = tuple(chunked["current"])
        mine = [i for i in mine if current[0] <= i < current[1]]
    if not mine:
        raise trainplan.TrainPlanError(f"extract/manifest.json: samples [{lo}, {hi}) of rank {rank} hold no sample "
                                       f"to train on; extract more samples or use fewer nodes")
    return {"by_id": by_id, "held": held, "lay": lay, "units": units, "chunks": chunks, "current": current,
            "pos": {i: n for n, i in enumerate(mine)}}


def set_up(run_dir: Path, config: PipelineConfig, where: Placement, log: Any) -> TrainJob:
    """The :class:`TrainJob` of this training process: the inputs' agreement checked, the checkpoint folder made,
    the process group joined, the draft head built and this rank's dataset opened (speculators'
    ``Eagle3SampleFileDataset`` over its samples' files, with ``train.noise_std``'s uniform noise).

    Raises:
        ValueError: extract/ and vocab/ come from different prepare outputs.
        TrainPlanError: this rank holds no sample to train on.
    """
    from speculators.train.data import Eagle3SampleFileDataset, create_collate_fn
    from speculators.train.noise_transforms import AddUniformNoise

    tc = config.train
    ext, voc = where.inputs["extract"], where.inputs["vocab"]
    if ext["inputs"].get("prepare") != voc["inputs"].get("prepare"):
        raise ValueError("extract/ and vocab/ were made from different prepare outputs; rerun both")
    (where.out / "checkpoints").mkdir(parents=True, exist_ok=True)
    device, rank, log, use_compile = _join(where.world, tc, log)
    model, d2t, attention = _draft_head(run_dir, config, ext, device)
    job = TrainJob(run_dir=run_dir, config=config, out=where.out, world=where.world, rank=rank, log=log,
                   device=device, use_compile=use_compile, attention=attention, model=model, d2t=d2t,
                   aux=list(ext["aux_layer_ids"]), ext=ext, norm=target_final_norm(config.target_model),
                   collate=create_collate_fn(tc.batch_max_tokens), **_samples(ext, config, where.world, rank))
    job.dataset = Eagle3SampleFileDataset(
        max_len=tc.batch_max_tokens, file_list=[job.sample_file(i) for i in job.pos],
        transform=AddUniformNoise(std=tc.noise_std) if tc.noise_std > 0 else None,
        standardize_fn=job.standardize(),
    )
    return job


def shard_and_optimize(job: TrainJob) -> None:
    """FSDP2 ``fully_shard`` of every decoder layer and the whole model (several processes; the package doc), then
    AdamW and speculators' linear warmup/decay schedule, and the full-state-dict options every checkpoint uses."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    from transformers import get_linear_schedule_with_warmup

    tc, model = job.tc, job.model
    if job.world > 1:
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    job.opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=tc.lr)
    job.sched = get_linear_schedule_with_warmup(job.opt, num_warmup_steps=tc.warmup_steps,
                                                num_training_steps=tc.steps)
    # Full (unsharded, name-keyed) state dicts: the same files for any world size. cpu_offload needs a group.
    job.sd_opts = StateDictOptions(full_state_dict=True, cpu_offload=job.world > 1)
