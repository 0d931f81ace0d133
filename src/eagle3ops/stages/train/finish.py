"""The end of stage ``train``: the head chosen (the best held-out checkpoint's, or the last step's) and its offline
acceptance estimate, the final draft head in speculators' saved format (bf16), the run's figures, the output
promoted and its manifest written, and the process group torn down on every rank together."""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import time
from typing import Any

from eagle3ops.stages import trainplan
from eagle3ops.stages.draft import SPECULATIVE_TOKENS
from eagle3ops.stages.manifest import atomic_write_text, file_entry, promote, stage_dir, write_manifest
from eagle3ops.stages.train.ckpt import full_model_sd
from eagle3ops.stages.train.job import TrainJob
from eagle3ops.stages.train.loop import Ran


def _peak_memory_bytes(device: str) -> int:
    import torch

    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def teardown(job: TrainJob) -> None:
    """Tear the process group down on every rank together: a barrier first, so that no rank destroys its gloo
    pairs (or exits) while a peer still works with them. A rank that left early made the others' gloo
    threads die with ``terminate called without an active exception`` (SIGABRT), now and then, on CPU
    (PyTorch: destroy_process_group must be called by all ranks, with no collective in flight)."""
    if job.world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def _chosen(job: TrainJob) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(offline estimate, bf16 state dict) of the head that ships: the chooser's best checkpoint's (its estimate
    measured then, its weights kept in ``best/``), else the last step's (measured now). Collectives when sharded:
    every rank calls it."""
    import torch

    choice = job.chooser.choice()
    offline = job.evaluate() if choice is None else choice["estimate"]  # the last step's, or the chosen one's
    # full_model_sd is a collective when sharded: every rank calls it; an earlier best's weights are in best/
    chosen_sd = full_model_sd(job) if choice is None or choice["step"] == job.step \
        else job.chooser.best_weights(job.step)
    return offline, {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in chosen_sd.items()}


def _peaks(job: TrainJob) -> list[int]:
    """Every rank's peak memory in bytes (a collective with several ranks)."""
    import torch.distributed as dist

    peak = _peak_memory_bytes(job.device)
    if job.world == 1:
        return [peak]
    peaks = [0] * job.world
    dist.all_gather_object(peaks, peak)
    return peaks


def _write_final(job: TrainJob, sd: dict[str, Any]) -> dict[str, Any]:
    """``final/`` in speculators' saved format with the bf16 state dict ``sd``; returns its manifest entries."""
    final = job.out / "final"
    if final.exists():
        shutil.rmtree(final)
    job.model.save_pretrained(final, state_dict=sd)
    # save_pretrained labels the config with the parameters' dtype (fp32 in training); the weights are bf16.
    conf_path = final / "config.json"
    conf = json.loads(conf_path.read_text())
    conf["dtype"] = "bfloat16"
    atomic_write_text(conf_path, json.dumps(conf, indent=2, sort_keys=True) + "\n")
    for p in final.iterdir():  # safetensors writes 0600; the SSH user sizes and copies the head (--head A:RUN)
        p.chmod(0o644)
    return {f"final/{p.name}": file_entry(p) for p in sorted(final.iterdir()) if p.is_file()}


def _speed(history: list[dict[str, Any]], job: TrainJob, ran: Ran) -> dict[str, Any]:
    """The figures of the steps this run made: median step seconds after a warm-up, steps/s, tokens per step."""
    steps = job.step - job.first_step
    steady = sorted(h["step_s"] for h in history[job.first_step + min(3, max(0, steps - 1)):] if "step_s" in h)
    median_step_s = steady[len(steady) // 2] if steady else None
    tokens_per_step = [h["tokens"] for h in history[job.first_step:] if "tokens" in h]
    return {
        "steps": job.step,
        "median_step_s": median_step_s,
        "steps_per_s_steady": round(1 / median_step_s, 3) if median_step_s else None,
        "tokens_per_step_mean": round(sum(tokens_per_step) / len(tokens_per_step), 1) if tokens_per_step else None,
        "steps_this_run": steps,
        "resumed_from_step": job.first_step,
    }


def _figures(job: TrainJob, ran: Ran, history: list[dict[str, Any]], offline: dict[str, Any] | None,
             peaks: list[int], t_start: float) -> dict[str, Any]:
    """The manifest's figures (the package doc's ``manifest.json``: steps, speed, device, memory, the loss
    trained, losses, the offline estimate, the checkpoint chosen and the ``--speculative-config`` vLLM loads the
    head with)."""
    import torch

    tc, cuda, steps = job.tc, job.device.startswith("cuda"), job.step - job.first_step
    return {
        **_speed(history, job, ran),
        "device": job.device if job.device == "cpu" else f"cuda ({torch.cuda.get_device_name(0)})",
        "world_size": job.world,
        "distributed": f"FSDP2 fully_shard, {'nccl' if cuda else 'gloo'}" if job.world > 1 else None,
        "compile": job.use_compile,
        "attention": job.attention,
        "steps_per_s": round(steps / ran.loop_s, 4) if steps and ran.loop_s > 0 else None,  # saves included
        "peak_memory_bytes": max(peaks),
        "peak_memory_bytes_per_rank": peaks,
        "peak_memory_kind": "torch.cuda.max_memory_allocated" if cuda else "process max RSS",
        "loss": {"kind": tc.loss, **({"lk_eta": tc.lk_eta} if tc.loss == "lk_hybrid" else {})},
        "first_loss": history[0]["loss"] if history else None,
        "final_metrics": ran.last or (history[-1] if history else {}),
        "aux_layer_ids_extracted": job.aux,
        "eagle_aux_hidden_state_layer_ids": [j + 1 for j in job.aux],
        "draft_vocab_size": int(job.d2t.shape[0]),
        "offline_estimate": offline,
        "checkpoint_choice": job.chooser.record(job.step),
        "held_out_split": {**trainplan.held_out_split(job.ext["sample_files"]), "held_out_samples": len(job.held)},
        "params_trainable": sum(p.numel() for p in job.model.parameters() if p.requires_grad),
        "vllm_speculative_config": {
            "method": "eagle3",
            "model": str((stage_dir(job.run_dir, "train") / "final").resolve()),
            "num_speculative_tokens": SPECULATIVE_TOKENS,
        },
        "wall_s": round(time.monotonic() - t_start, 3),
    }


def finish(job: TrainJob, ran: Ran, t_start: float) -> dict[str, Any]:
    """The end of a run that reached ``train.steps``: the head chosen and its estimate, the final head and the
    manifest (rank 0; the other ranks take part in the collectives and return ``{"rank"}``), then
    :func:`teardown`. Returns the manifest's figures.

    Raises:
        ValueError: a non-finite loss was recorded.
    """
    offline, sd = _chosen(job)
    peaks = _peaks(job)
    if not job.is_main:
        teardown(job)
        return {"rank": job.rank}
    final_files = _write_final(job, sd)
    with open(job.metrics_path, encoding="utf-8") as mf:
        history = [json.loads(line) for line in mf if line.strip()]
    figures = _figures(job, ran, history, offline, peaks, t_start)
    if any(not math.isfinite(h["loss"]) for h in history):
        raise ValueError("train: a non-finite loss was recorded")
    promote(job.run_dir, "train", job.out)  # the new output complete: it replaces a finished one now, not before
    final = stage_dir(job.run_dir, "train") / "final"
    metrics_path = stage_dir(job.run_dir, "train") / "metrics.jsonl"
    write_manifest(job.run_dir, "train", job.config, {"metrics.jsonl": file_entry(metrics_path), **final_files},
                   **figures)
    job.log(f"train: {job.step} steps ({job.step - job.first_step} this run, {figures['steps_per_s']} steps/s on "
            f"{figures['device']} x {job.world}); final draft head in {final}")
    os.sync()
    teardown(job)
    return figures
