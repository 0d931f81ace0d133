"""Checkpoints of stage ``train`` (the package doc: step-based, world-size independent, resumable on any device):
``checkpoints/step_NNNNNNNN/`` with ``model.safetensors`` + ``config.json``, ``optimizer.pt``, ``scheduler.pt`` and
``state.json`` written last (= complete). Rank 0 reads and writes them; a resume broadcasts what it read."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3ops.stages.heldout import CheckpointChooser, HeldOutEval
from eagle3ops.stages.manifest import atomic_write_text
from eagle3ops.stages.train.job import TrainJob


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The newest complete checkpoint under ``ckpt_root`` (its ``state.json`` written), or None."""
    done = sorted(p.parent for p in ckpt_root.glob("step_*/state.json"))
    return done[-1] if done else None


@dataclass(frozen=True)
class Saved:
    """What a resume restores after sharding: ``prev`` (the checkpoint's folder, None on a fresh start),
    ``state`` (its ``state.json``), ``osd`` (the full optimizer state dict), ``sched`` (the scheduler's)."""

    prev: Path | None
    state: dict[str, Any]
    osd: Any
    sched: Any


def load_weights(job: TrainJob) -> Saved:
    """The newest checkpoint's weights into the unsharded draft head (rank 0 reads; with several ranks every rank
    gets rank 0's weights and state by broadcast, since only rank 0's node has the files), the head moved to the
    job's device.

    Raises:
        ValueError: the checkpoint's weights do not fit the draft head.
    """
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file

    model = job.model
    prev = latest_checkpoint(job.ckpt_root) if job.rank == 0 else None
    state: dict[str, Any] = {}
    osd: Any = None
    sched_sd: Any = None
    if prev is not None:  # full state dict into the unsharded model, before fully_shard
        state = json.loads((prev / "state.json").read_text())
        sd = load_file(str(prev / "model.safetensors"), device="cpu")
        missing, unexpected = model.load_state_dict(sd, strict=False)
        if unexpected or set(missing) - {"verifier_lm_head.weight"}:
            raise ValueError(f"{prev}: checkpoint does not fit the draft head (missing {missing}, extra {unexpected})")
        osd = torch.load(prev / "optimizer.pt", map_location="cpu", weights_only=True)
        sched_sd = torch.load(prev / "scheduler.pt", weights_only=True)
    model.to(job.device)
    if job.world > 1:  # rank 0's checkpoint (only rank 0's node has one) to every rank
        box = [{"state": state, "prev": str(prev) if prev else None, "osd": osd, "sched": sched_sd}]
        dist.broadcast_object_list(box, src=0)
        state, osd, sched_sd = box[0]["state"], box[0]["osd"], box[0]["sched"]
        prev = Path(box[0]["prev"]) if box[0]["prev"] else None
        if prev is not None:
            with torch.no_grad():
                for t in model.state_dict().values():
                    dist.broadcast(t, src=0)
    return Saved(prev, state, osd, sched_sd)


def restore(job: TrainJob, saved: Saved) -> None:
    """The optimizer, schedule, RNG state and step count of ``saved`` (nothing on a fresh start); the checkpoint
    chooser, its held-out curve continued (:class:`~eagle3ops.stages.heldout.CheckpointChooser`); ``metrics.jsonl``
    cut to the steps done (removed on a fresh start; a run killed after its last checkpoint logged steps it will
    redo); then the held-out evaluation (:class:`~eagle3ops.stages.heldout.HeldOutEval`), whose zero-weight sample
    is read only now: its noise draws from the RNG state just restored, as an uninterrupted run's did."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    tc = job.tc
    if saved.prev is not None:
        set_optimizer_state_dict(job.model, job.opt, optim_state_dict=saved.osd,
                                 options=StateDictOptions(full_state_dict=True))
        job.sched.load_state_dict(saved.sched)
        torch.set_rng_state(torch.tensor(saved.state["torch_rng"], dtype=torch.uint8))
        job.step = int(saved.state["step"])
        job.log(f"train: resuming from {saved.prev} at step {job.step} ({job.world} "
                f"process{'es' if job.world > 1 else ''})")
    job.chooser = CheckpointChooser(job.out, tc.select_checkpoint, bool(job.held), bool(job.chunks), saved.state,
                                    job.log, job.is_main)
    metrics_path = job.metrics_path
    if job.step == 0 and job.is_main:
        metrics_path.unlink(missing_ok=True)
    elif job.is_main and metrics_path.is_file():
        kept = [ln for ln in metrics_path.read_text().splitlines()
                if ln.strip() and json.loads(ln)["step"] <= job.step]
        atomic_write_text(metrics_path, "".join(ln + "\n" for ln in kept))
    job.evaluate = HeldOutEval(job.model, job.lay, job.held, job.rank, {i: job.sample_file(i) for i in job.held}, tc,
                               job.standardize(), job.collate, job.device, job.world, job.dataset[0])
    job.first_step = job.step


def full_model_sd(job: TrainJob) -> dict[str, Any]:
    """The draft head's full (unsharded) state dict on the CPU; a collective when sharded: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    sd = get_model_state_dict(job.model, options=job.sd_opts)
    return {k: v.detach().cpu() for k, v in sd.items()}


def save_checkpoint(job: TrainJob, s: int) -> None:
    """Checkpoint of step ``s`` (rank 0 writes, ``state.json`` last, with the held-out curve so far; only the
    newest ``train.keep_checkpoints`` stay); a collective: every rank calls it."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    msd = full_model_sd(job)
    osd = get_optimizer_state_dict(job.model, job.opt, options=job.sd_opts)
    if job.is_main:
        d = job.ckpt_root / f"step_{s:08d}"
        if d.exists():
            shutil.rmtree(d)
        job.model.save_pretrained(d, state_dict=msd)
        torch.save(osd, d / "optimizer.pt")
        torch.save(job.sched.state_dict(), d / "scheduler.pt")
        atomic_write_text(d / "state.json", json.dumps({"step": s, "world_size": job.world,
                                                        "torch_rng": torch.get_rng_state().tolist(),
                                                        "held_out_curve": job.chooser.curve}))
        for old in sorted(p.parent for p in job.ckpt_root.glob("step_*/state.json"))[: -job.tc.keep_checkpoints]:
            shutil.rmtree(old)
    if job.world > 1:
        dist.barrier()
