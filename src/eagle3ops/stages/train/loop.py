"""The step loop of stage ``train``: this rank's packed batches in :mod:`eagle3ops.stages.trainplan`'s order, one
forward/backward/step each (speculators' TTT loss; AdamW, grad-norm clip 1.0), loss and metrics averaged over the
ranks, a line of ``metrics.jsonl`` per step and, every ``train.checkpoint_every`` steps, the held-out measure (when
the final head is chosen by it) and a checkpoint."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from eagle3ops.stages import trainplan
from eagle3ops.stages.train.ckpt import full_model_sd, save_checkpoint
from eagle3ops.stages.train.job import TrainJob


@dataclass(frozen=True)
class Ran:
    """The loop's outcome: ``stopped`` (ended by ``stop_after`` with a checkpoint, before ``train.steps``),
    ``last`` (the last step's metrics, rounded), ``loop_s`` (seconds in the loop, checkpoint saves included)."""

    stopped: bool
    last: dict[str, float]
    loop_s: float


def batches_from(job: TrainJob, start: int) -> Iterator[tuple[int, list[Any]]]:
    """``(epoch, row)`` from step ``start`` on, endlessly: ``row[rank]`` is that rank's batch of sample ids (None:
    its unit has no batch left this epoch). Epoch e's plan is packed with seed + e (trainplan), so the position of
    step s is reproducible."""
    tc, seed = job.tc, job.config.seed
    epoch, seen = 0, 0
    while True:
        for row in (trainplan.chunked_epoch_plan(job.lay, job.units, tc.batch_max_tokens, seed, epoch, job.chunks)
                    if job.chunks else trainplan.epoch_plan(job.lay, job.units, tc.batch_max_tokens, seed, epoch)):
            if seen >= start:
                yield epoch, row
            seen += 1
        epoch += 1


def _over_ranks(job: TrainJob, loss: Any, metrics: dict[str, Any], n_tok: int, active: bool) -> tuple[Any, Any, int]:
    """(mean loss, metrics, tokens): with several ranks the loss and metrics averaged over the ranks that trained
    (the same on every rank) and the tokens summed; one rank's own otherwise."""
    import torch
    import torch.distributed as dist

    if job.world == 1:
        return loss, metrics, n_tok
    names = sorted(metrics)
    a = 1.0 if active else 0.0
    v = torch.stack([loss.detach().float() * a,
                     *[torch.as_tensor(metrics[k]).float().to(loss.device) * a for k in names],
                     torch.tensor(float(n_tok), device=loss.device),
                     torch.tensor(a, device=loss.device)])
    dist.all_reduce(v)
    n_active = max(float(v[-1]), 1.0)
    return v[0] / n_active, {k: v[i + 1] / n_active for i, k in enumerate(names)}, int(v[-2])


def _step(job: TrainJob, idx: list[int] | None) -> tuple[dict[str, Any], int]:
    """One training step on this rank's batch ``idx`` (None: a zero-weight step, since a sharded forward needs
    every rank); returns (metrics averaged over the ranks, tokens of the step over all ranks).

    Raises:
        TrainPlanError: the batch holds a sample outside a chunked pass's current chunk.
        ValueError: the loss is not finite.
    """
    import torch

    tc, active = job.tc, idx is not None
    if active and job.chunks and any(i not in job.pos for i in idx):  # only stage chunked's passes stop in time
        ca, cb = job.current
        raise trainplan.TrainPlanError(f"step {job.step + 1} trains samples outside the current chunk "
                                       f"[{ca}, {cb}); run stage chunked, which stops each pass in time")
    batch = job.collate([job.dataset[job.pos[i]] for i in idx] if active else [job.dataset[0]])
    batch = {k: v.to(job.device) if torch.is_tensor(v) else v for k, v in batch.items()}
    _draft, loss, metrics = job.model(**batch, ttt_steps=tc.ttt_steps, ttt_step_loss_decay=tc.ttt_step_loss_decay)
    n_tok = int(batch["lengths"].sum()) if active else 0
    if not active:
        loss = loss * 0.0
    mean_loss, metrics, n_tok = _over_ranks(job, loss, metrics, n_tok, active)
    if not torch.isfinite(mean_loss):
        raise ValueError(f"train: loss is {mean_loss.item()} at step {job.step}; lower train.lr")
    job.opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(job.model.parameters(), 1.0)
    job.opt.step()
    job.sched.step()
    return metrics, n_tok


def _at_checkpoint(job: TrainJob) -> None:
    """At a checkpoint step: the held-out measure first (when the final head is chosen by it: the chooser keeps
    the best weights), then the checkpoint, whose ``state.json`` carries the curve with this step."""
    if job.chooser.measuring:
        job.chooser.measure(job.step, job.evaluate(), lambda: full_model_sd(job), job.model)
    save_checkpoint(job, job.step)


def train_steps(job: TrainJob, stop_after: int | None) -> Ran:
    """Steps from ``job.step`` to ``train.steps``, or ``stop_after`` of them (then a checkpoint, and a rerun
    resumes); rank 0 appends each step's line to ``metrics.jsonl``.

    Raises:
        TrainPlanError, ValueError: as :func:`_step`.
    """
    import torch

    tc = job.tc
    job.model.train()
    t_loop = time.monotonic()
    last: dict[str, float] = {}
    with open(job.metrics_path if job.is_main else os.devnull, "a", encoding="utf-8") as mf:
        gen = batches_from(job, job.step)
        while job.step < tc.steps:
            epoch, row = next(gen)
            t_step = time.monotonic()
            metrics, n_tok = _step(job, row[job.rank])
            job.step += 1
            step = job.step
            last = {k: round(float(v), 6) for k, v in metrics.items()}  # float() waits for the device
            step_s = time.monotonic() - t_step
            mf.write(json.dumps({"step": step, "epoch": epoch, "lr": job.sched.get_last_lr()[0],
                                 "step_s": round(step_s, 5), "tokens": n_tok, **last, "samples": row}) + "\n")
            mf.flush()
            if step % 10 == 0 or step == tc.steps:
                job.log(f"train: step {step}/{tc.steps} loss {last['loss']:.4f} "
                        f"full_acc_0 {last.get('full_acc_0', 0):.3f}")
            if step % tc.checkpoint_every == 0 or step == tc.steps:
                _at_checkpoint(job)
            if stop_after is not None and step - job.first_step >= stop_after and step < tc.steps:
                save_checkpoint(job, step)
                job.log(f"train: stopped after {stop_after} steps at step {step}; a rerun resumes")
                return Ran(True, last, time.monotonic() - t_loop)
    if job.device.startswith("cuda"):
        torch.cuda.synchronize()
    return Ran(False, last, time.monotonic() - t_loop)
