"""Stage ``train``: speculators' EAGLE-3 draft head, trained on the extracted hidden states.

Inputs: ``extract/`` (speculators' v1 sample files) and ``vocab/`` (d2t/t2d). Output in ``<run_dir>/train/``:

- ``checkpoints/step_NNNNNNNN/``: resumable checkpoints (``model.safetensors`` + ``config.json`` in speculators'
  format, fp32; ``optimizer.pt``, ``scheduler.pt``; ``state.json`` written last = the checkpoint is complete).
  A rerun resumes from the newest complete one, with the same data order. ``--restart`` over a finished train
  builds the new output beside it (``<run_dir>/.train.restart/``, every rank writing there: the launching process
  passes it to the torchrun ranks in ``EAGLE3OPS_TRAIN_OUT``) and swaps it in only once complete
  (:func:`eagle3ops.stages.manifest.promote`), so a restart that fails leaves the finished head whole.
- ``final/``: the draft head in speculators' saved format (``config.json`` with ``speculators_config``,
  ``model.safetensors`` in bf16 with ``d2t``/``t2d``), which vLLM 0.16 loads with
  ``--speculative-config '{"method": "eagle3", "model": "<run_dir>/train/final", "num_speculative_tokens": 3}'``.
- ``metrics.jsonl`` (one line per step) and ``manifest.json`` (steps, losses, steps/s, peak memory).

What is speculators' and what is changed here
---------------------------------------------
(The draft head's config, the dense attention used on CPU and the teacher-logit transform live in
:mod:`eagle3ops.stages.draft`; this module runs the training loop, its checkpoints and its processes.)
Used as is from speculators 0.3.0: ``Eagle3DraftModel`` / ``Eagle3SpeculatorConfig`` (model, TTT loss and
accuracy metrics), ``Eagle3SampleFileDataset`` + ``standardize_data_v1`` + ``shift_batch`` + ``create_collate_fn``
(data), ``MultipackDistributedBatchSamplerV2`` (packing), AdamW + linear warmup/decay + grad-norm clip 1.0
(``train/trainer.py``). Changed, each for a reason:

- **Teacher logits use the target's final norm.** The extracted last layer is the *pre-norm* residual stream
  (speculators' capture stores ``hidden + residual`` before ``model.norm``), but 0.3.0 feeds it straight to the
  lm_head (``core.py``: ``targets = self.verifier_lm_head(verifier_last_hidden_states)``). Later speculators
  releases apply ``verifier_norm`` there; here the target's ``model.norm`` (RMSNorm, weight and eps from the
  target) is applied when a sample is loaded, so the targets are the target model's real next-token logits.
- **Layer ids in vLLM's convention.** speculators' generator captures the *output* of layer ``j``; vLLM's
  EAGLE-3 target (``models/llama.py``) captures the *input* of layer ``i`` (= output of layer ``i - 1``). The
  final config therefore records ``eagle_aux_hidden_state_layer_ids = [j + 1 for j in aux_layer_ids]``, so
  vLLM feeds the draft head the same layers it was trained on (leaving it out would give vLLM's default
  ``(2, L // 2, L - 3)``, one layer off from speculators' default ``[2, L // 2, L - 3]``).
- **Step-based, CPU-capable checkpoints.** 0.3.0's ``SingleGPUCheckpointer`` saves per epoch and loads with
  ``map_location="cuda:0"``; here checkpoints are per ``checkpoint_every`` steps, load on any device and store
  RNG state and data position, so a killed run resumes where it stopped.
- ``torch.compile`` of the forward follows ``train.compile`` (default: on for cuda, off for cpu, where eager is
  what runs in reasonable time).

Several processes (FSDP2)
-------------------------
``train.nproc`` (``auto`` = one per visible GPU, 1 on CPU; the ``EAGLE3OPS_TRAIN_NPROC`` environment variable
overrides it) > 1 makes the stage relaunch itself under torchrun (``python -m torch.distributed.run --standalone
--nproc_per_node N``: rendezvous on localhost, a free port), one process per GPU with NCCL, or N CPU processes
with gloo (how CI tests the distributed path). One process stays a plain process. Each rank builds the same
draft head (same seed), loads the checkpoint's full state dict if resuming, then applies FSDP2
``fully_shard`` to every decoder layer and to the whole model, as speculators' ``apply_fully_sharded`` does --
but without its bf16 ``MixedPrecisionPolicy`` (parameters and reductions stay fp32, as on one process, so 1-
and N-process runs train the same numbers) and without its meta-device re-init (the weights are loaded before
sharding). Each rank gets its own packed batches from ``MultipackDistributedBatchSamplerV2`` (``num_replicas``
= world size, every rank the same number of batches); gradients are averaged over ranks by FSDP's
reduce-scatter. Loss and metrics are averaged over ranks before they are logged; only rank 0 writes files.

Checkpoints are world-size independent: rank 0 writes full (unsharded) state dicts gathered with
``torch.distributed.checkpoint.state_dict`` (``get_model_state_dict`` / ``get_optimizer_state_dict`` with
``full_state_dict=True``; optimizer state keyed by parameter name), so a checkpoint written by N processes
resumes in 1 and vice versa. The step count, LR schedule and RNG state carry over; the batch order after a
resume follows the new world size's sampler.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from eagle3ops.config.pipeline import PipelineConfig
from eagle3ops.stages.draft import (
    SPECULATIVE_TOKENS,
    build_draft_config,
    register_dense_attention,
    standardize_with_norm,
    target_final_norm,
)
from eagle3ops.stages.manifest import (
    atomic_write_text,
    check_inputs,
    file_entry,
    output_dir,
    promote,
    stage_dir,
    write_manifest,
)

def _latest_checkpoint(ckpt_root: Path) -> Path | None:
    done = sorted(p.parent for p in ckpt_root.glob("step_*/state.json"))
    return done[-1] if done else None


NPROC_ENV = "EAGLE3OPS_TRAIN_NPROC"


def _quiet(*_args: Any, **_kwargs: Any) -> None:
    return None


def resolve_nproc(config: PipelineConfig) -> int:
    """Training processes: ``$EAGLE3OPS_TRAIN_NPROC``, else ``train.nproc``; ``auto`` = visible CUDA devices
    (when training on cuda), else 1.

    Raises:
        ValueError: ``$EAGLE3OPS_TRAIN_NPROC`` is not a positive integer.
    """
    raw = os.environ.get(NPROC_ENV)
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"${NPROC_ENV}={raw!r}: must be a positive integer (processes for the train stage)")
        return int(raw)
    if config.train.nproc != "auto":
        return int(config.train.nproc)
    if config.train.device == "cpu":
        return 1
    import torch

    return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1


#: Environment variable through which the launching process tells the torchrun ranks where to write (the run's
#: ``train/`` or, for ``--restart`` over a finished train, :func:`eagle3ops.stages.manifest.restart_dir`).
OUT_ENV = "EAGLE3OPS_TRAIN_OUT"


def _launch_torchrun(run_dir: Path, nproc: int, stop_after: int | None, log: Any, out: Path,
                     restart: bool = False) -> dict[str, Any]:
    """Run this stage in ``nproc`` processes under torchrun (localhost rendezvous), writing into ``out``
    (:data:`OUT_ENV`); returns rank 0's figures. ``restart`` is passed on so the ranks redo a finished train (the
    stage command skips one otherwise); ``out`` was emptied by the launching process."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "eagle3ops.stages", "train", "--run-dir", str(run_dir)]
    if stop_after is not None:
        argv += ["--stop-after", str(stop_after)]
    if restart:
        argv += ["--restart"]
    log(f"train: {nproc} processes: {' '.join(argv[1:])}")
    env = {**os.environ, OUT_ENV: str(out)}
    rc = subprocess.run(argv, check=False, env=env).returncode  # noqa: S603 - argv list, our own interpreter
    if rc != 0:
        raise RuntimeError(f"train: torchrun with {nproc} processes exited with status {rc} (see the ranks' log above)")
    # Stopped early: ``out`` holds checkpoints and no manifest (a complete run promoted it to train/ with one).
    if stop_after is not None and out.is_dir() and not (out / "manifest.json").is_file():
        return {"stopped_at": json.loads((_latest_checkpoint(out / "checkpoints")
                                          / "state.json").read_text())["step"]}
    return json.loads((stage_dir(run_dir, "train") / "manifest.json").read_text())


def held_out_indices(n: int, fraction: float, seed: int) -> set[int]:
    """Sample indices held out of training: those whose ``sha256(f"{seed}:{i}")`` falls in the first ``fraction`` of
    the range (stable for a run, independent of world size); at least one when ``fraction > 0`` and ``n >= 2``,
    never all."""
    if fraction <= 0 or n < 2:
        return set()
    keys = {i: int.from_bytes(hashlib.sha256(f"{seed}:{i}".encode()).digest()[:8], "big") for i in range(n)}
    held = {i for i, k in keys.items() if k < fraction * 2**64}
    if not held:
        held = {min(keys, key=keys.__getitem__)}
    if len(held) == n:
        held.discard(max(keys, key=keys.__getitem__))
    return held


def offline_estimate(model: Any, held_dataset: Any, collate: Any, device: str, tc: Any) -> dict[str, Any] | None:
    """Simulated acceptance length of the draft head on the held-out samples (never trained on): teacher-forced
    (the draft sees the target's own hidden states at every position), so an optimistic estimate.

    ``full_acc_k`` from speculators' ``Eagle3DraftModel.forward`` is the fraction of positions whose draft tokens
    0..k are all correct; the expected tokens per target forward under greedy verification is then
    ``1 + Σ_k full_acc_k`` (k < ``train.ttt_steps``), the EAGLE papers' acceptance length τ. Averaged over held-out
    batches weighted by tokens. Every rank runs the same batches (a sharded forward needs all ranks).

    Returns:
        ``{"acceptance_length", "per_position": {"k": full_acc_k}, "held_out_samples", "held_out_tokens", "kind"}``,
        or None when nothing is held out.
    """
    import torch

    if len(held_dataset) == 0:
        return None
    sums: dict[int, float] = {}
    tokens = 0
    model.eval()
    with torch.no_grad():
        for i in range(len(held_dataset)):
            batch = collate([held_dataset[i]])
            batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            _d, _loss, metrics = model(**batch, ttt_steps=tc.ttt_steps, ttt_step_loss_decay=tc.ttt_step_loss_decay)
            n = int(batch["lengths"].sum())
            tokens += n
            for k in range(tc.ttt_steps):
                sums[k] = sums.get(k, 0.0) + float(metrics[f"full_acc_{k}"]) * n
    model.train()
    per_pos = {str(k): round(v / tokens, 6) for k, v in sums.items()} if tokens else {}
    return {"acceptance_length": round(1.0 + sum(per_pos.values()), 6), "per_position": per_pos,
            "held_out_samples": len(held_dataset), "held_out_tokens": tokens,
            "kind": "teacher-forced on held-out samples: an optimistic estimate of vLLM's mean acceptance length"}


def _peak_memory_bytes(device: str) -> int:
    import torch

    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def run_train(
    run_dir: Path, config: PipelineConfig, log: Any = print, restart: bool = False, stop_after: int | None = None
) -> dict[str, Any]:
    """Run stage ``train``; returns the manifest's figures.

    ``stop_after`` ends this run after that many steps with a checkpoint and no final output or manifest (an
    interrupted run, as a time-boxed window leaves it); the next call resumes from there.

    Raises:
        StageInputError: extract/ or vocab/ missing or inconsistent (with each other or pipeline.yaml).
        ValueError: the loss is not finite.
    """
    t_start = time.monotonic()
    tc = config.train
    inputs = check_inputs(run_dir, "train", config)  # before the heavy imports: refusals stay fast and torch-free
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if "LOCAL_RANK" not in os.environ:  # not under torchrun: pick the launch
        nproc = resolve_nproc(config)
        # --restart over a finished train builds the new output beside it; promoted (by rank 0) once complete.
        out = output_dir(run_dir, "train", restart=restart)
        if nproc > 1:
            return _launch_torchrun(run_dir, nproc, stop_after, log, out, restart)
        world = 1
    else:  # a torchrun rank: where the launching process said (its own run: the run's train/)
        out = Path(os.environ.get(OUT_ENV) or stage_dir(run_dir, "train"))

    import numpy as np
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.data import Eagle3SampleFileDataset, create_collate_fn
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2
    from speculators.train.noise_transforms import AddUniformNoise
    from transformers import get_linear_schedule_with_warmup

    ext, voc = inputs["extract"], inputs["vocab"]
    if ext["inputs"].get("prepare") != voc["inputs"].get("prepare"):
        raise ValueError("extract/ and vocab/ were made from different prepare outputs; rerun both")
    ckpt_root = out / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)

    device = tc.device if tc.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    rank = 0
    if world > 1:
        if device == "cuda":
            local_rank = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(local_rank)
            device = f"cuda:{local_rank}"
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
        rank = dist.get_rank()
    is_main = rank == 0
    if not is_main:
        log = _quiet  # one log per run: rank 0's
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    # speculators decorates the draft forward with @torch.compile; train.compile decides whether it compiles.
    use_compile = tc.compile if tc.compile is not None else device.startswith("cuda")
    torch._dynamo.config.disable = not use_compile

    d2t = torch.from_numpy(np.load(stage_dir(run_dir, "vocab") / "d2t.npy"))
    t2d = torch.from_numpy(np.load(stage_dir(run_dir, "vocab") / "t2d.npy"))
    aux = list(ext["aux_layer_ids"])
    attention = tc.attention if tc.attention != "auto" else ("dense" if device == "cpu" else "flex")
    attn_impl = register_dense_attention() if attention == "dense" else "simple_flex_attention"
    draft_cfg = build_draft_config(config, aux, int(d2t.shape[0]), attn_impl)

    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    model = Eagle3DraftModel(draft_cfg, t2d=t2d, d2t=d2t)

    ext_dir = stage_dir(run_dir, "extract")
    held = held_out_indices(len(ext["sample_files"]), tc.held_out_fraction, config.seed)
    train_samples = [s for i, s in enumerate(ext["sample_files"]) if i not in held]
    files = [str(ext_dir / s["file"]) for s in train_samples]
    norm_w, eps = target_final_norm(config.target_model)
    transform = AddUniformNoise(std=tc.noise_std) if tc.noise_std > 0 else None
    dataset = Eagle3SampleFileDataset(
        max_len=tc.batch_max_tokens,
        file_list=files,
        transform=transform,
        standardize_fn=standardize_with_norm(norm_w, eps),
    )
    held_dataset = Eagle3SampleFileDataset(
        max_len=tc.batch_max_tokens,
        file_list=[str(ext_dir / ext["sample_files"][i]["file"]) for i in sorted(held)],
        standardize_fn=standardize_with_norm(norm_w, eps),
    )
    lengths = [s["tokens"] - 1 for s in train_samples]  # shift_batch drops one position
    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=tc.batch_max_tokens, lengths=lengths, num_replicas=world, rank=rank, seed=config.seed
    )
    collate = create_collate_fn(tc.batch_max_tokens)

    step = 0
    prev = _latest_checkpoint(ckpt_root)
    state: dict[str, Any] = {}
    if prev is not None:  # full state dict into the unsharded model, before fully_shard
        state = json.loads((prev / "state.json").read_text())
        sd = load_file(str(prev / "model.safetensors"), device="cpu")
        missing, unexpected = model.load_state_dict(sd, strict=False)
        if unexpected or set(missing) - {"verifier_lm_head.weight"}:
            raise ValueError(f"{prev}: checkpoint does not fit the draft head (missing {missing}, extra {unexpected})")
    model.to(device)
    if world > 1:
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=tc.lr)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=tc.warmup_steps, num_training_steps=tc.steps)
    # Full (unsharded, name-keyed) state dicts: the same files for any world size. cpu_offload needs a group.
    sd_opts = StateDictOptions(full_state_dict=True, cpu_offload=world > 1)
    if prev is not None:
        osd = torch.load(prev / "optimizer.pt", map_location="cpu", weights_only=True)
        set_optimizer_state_dict(model, opt, optim_state_dict=osd, options=StateDictOptions(full_state_dict=True))
        sched.load_state_dict(torch.load(prev / "scheduler.pt", weights_only=True))
        torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
        step = int(state["step"])
        log(f"train: resuming from {prev} at step {step} ({world} process{'es' if world > 1 else ''})")
    metrics_path = out / "metrics.jsonl"
    if step == 0 and is_main:
        metrics_path.unlink(missing_ok=True)

    # Batches of epoch e come from the sampler seeded with seed + e: the position of step s is reproducible.
    def batches_from(start: int):
        epoch, seen = 0, 0
        while True:
            sampler.set_epoch(epoch)
            epoch_batches = list(iter(sampler))
            if not epoch_batches:
                raise ValueError("extract/ holds no sample to train on")
            for b in epoch_batches:
                if seen >= start:
                    yield epoch, [int(i) for i in b]
                seen += 1
            epoch += 1

    def full_model_sd() -> dict[str, Any]:
        sd = get_model_state_dict(model, options=sd_opts)  # a collective when sharded: every rank calls it
        return {k: v.detach().cpu() for k, v in sd.items()}

    def save_checkpoint(s: int) -> None:
        msd = full_model_sd()
        osd = get_optimizer_state_dict(model, opt, options=sd_opts)
        if is_main:
            d = ckpt_root / f"step_{s:08d}"
            if d.exists():
                shutil.rmtree(d)
            model.save_pretrained(d, state_dict=msd)
            torch.save(osd, d / "optimizer.pt")
            torch.save(sched.state_dict(), d / "scheduler.pt")
            atomic_write_text(d / "state.json", json.dumps({"step": s, "world_size": world,
                                                            "torch_rng": torch.get_rng_state().tolist()}))
            for old in sorted(p.parent for p in ckpt_root.glob("step_*/state.json"))[: -tc.keep_checkpoints]:
                shutil.rmtree(old)
        if world > 1:
            dist.barrier()

    def finish() -> None:
        """Tear the process group down on every rank together: a barrier first, so that no rank destroys its gloo
        pairs (or exits) while a peer still works with them. A rank that left early made the others' gloo
        threads die with ``terminate called without an active exception`` (SIGABRT), now and then, on CPU
        (PyTorch: destroy_process_group must be called by all ranks, with no collective in flight)."""
        if world > 1:
            dist.barrier()
            dist.destroy_process_group()

    model.train()
    first_step = step
    t_loop = time.monotonic()
    last: dict[str, float] = {}
    with open(metrics_path if is_main else os.devnull, "a", encoding="utf-8") as mf:
        gen = batches_from(step)
        while step < tc.steps:
            epoch, idx = next(gen)
            t_step = time.monotonic()
            batch = collate([dataset[i] for i in idx])
            batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            _draft, loss, metrics = model(
                **batch, ttt_steps=tc.ttt_steps, ttt_step_loss_decay=tc.ttt_step_loss_decay
            )
            n_tok = int(batch["lengths"].sum())
            if world > 1:  # mean loss/metrics over ranks (same on every rank, so all stop alike), summed tokens
                names = sorted(metrics)
                v = torch.stack([loss.detach().float(), *[torch.as_tensor(metrics[k]).float().to(loss.device)
                                                         for k in names], torch.tensor(float(n_tok), device=loss.device)])
                dist.all_reduce(v)
                metrics = {k: v[i + 1] / world for i, k in enumerate(names)}
                mean_loss, n_tok = v[0] / world, int(v[-1])
            else:
                mean_loss = loss
            if not torch.isfinite(mean_loss):
                raise ValueError(f"train: loss is {mean_loss.item()} at step {step}; lower train.lr")
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            last = {k: round(float(v), 6) for k, v in metrics.items()}  # float() waits for the device
            step_s = time.monotonic() - t_step
            mf.write(json.dumps({"step": step, "epoch": epoch, "lr": sched.get_last_lr()[0], "step_s": round(step_s, 5),
                                 "tokens": n_tok, **last}) + "\n")
            mf.flush()
            if step % 10 == 0 or step == tc.steps:
                log(f"train: step {step}/{tc.steps} loss {last['loss']:.4f} full_acc_0 {last.get('full_acc_0', 0):.3f}")
            if step % tc.checkpoint_every == 0 or step == tc.steps:
                save_checkpoint(step)
            if stop_after is not None and step - first_step >= stop_after and step < tc.steps:
                save_checkpoint(step)
                log(f"train: stopped after {stop_after} steps at step {step}; a rerun resumes")
                finish()
                return {"stopped_at": step}
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    loop_s = time.monotonic() - t_loop
    ran = step - first_step

    offline = offline_estimate(model, held_dataset, collate, device, tc)
    sd = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in full_model_sd().items()}
    peak = _peak_memory_bytes(device)
    peaks = [peak]
    if world > 1:
        peaks = [0] * world
        dist.all_gather_object(peaks, peak)
    if not is_main:
        finish()
        return {"rank": rank}
    final = out / "final"
    if final.exists():
        shutil.rmtree(final)
    model.save_pretrained(final, state_dict=sd)
    # save_pretrained labels the config with the parameters' dtype (fp32 in training); the weights are bf16.
    conf_path = final / "config.json"
    conf = json.loads(conf_path.read_text())
    conf["dtype"] = "bfloat16"
    atomic_write_text(conf_path, json.dumps(conf, indent=2, sort_keys=True) + "\n")
    final_files = {f"final/{p.name}": file_entry(p) for p in sorted(final.iterdir()) if p.is_file()}
    with open(metrics_path, encoding="utf-8") as mf:
        history = [json.loads(line) for line in mf if line.strip()]
    steady = sorted(h["step_s"] for h in history[first_step + min(3, max(0, ran - 1)):] if "step_s" in h)
    median_step_s = steady[len(steady) // 2] if steady else None
    tokens_per_step = [h["tokens"] for h in history[first_step:] if "tokens" in h]
    figures = {
        "steps": step,
        "median_step_s": median_step_s,
        "steps_per_s_steady": round(1 / median_step_s, 3) if median_step_s else None,
        "tokens_per_step_mean": round(sum(tokens_per_step) / len(tokens_per_step), 1) if tokens_per_step else None,
        "steps_this_run": ran,
        "resumed_from_step": first_step,
        "device": device if device == "cpu" else f"cuda ({torch.cuda.get_device_name(0)})",
        "world_size": world,
        "distributed": f"FSDP2 fully_shard, {'nccl' if device.startswith('cuda') else 'gloo'}" if world > 1 else None,
        "compile": use_compile,
        "attention": attention,
        "steps_per_s": round(ran / loop_s, 4) if ran and loop_s > 0 else None,  # checkpoint saves included
        "peak_memory_bytes": max(peaks),
        "peak_memory_bytes_per_rank": peaks,
        "peak_memory_kind": "torch.cuda.max_memory_allocated" if device.startswith("cuda") else "process max RSS",
        "first_loss": history[0]["loss"] if history else None,
        "final_metrics": last or (history[-1] if history else {}),
        "aux_layer_ids_extracted": aux,
        "eagle_aux_hidden_state_layer_ids": [j + 1 for j in aux],
        "draft_vocab_size": int(d2t.shape[0]),
        "offline_estimate": offline,
        "params_trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "vllm_speculative_config": {
            "method": "eagle3",
            "model": str((stage_dir(run_dir, "train") / "final").resolve()),
            "num_speculative_tokens": SPECULATIVE_TOKENS,
        },
        "wall_s": round(time.monotonic() - t_start, 3),
    }
    if any(not math.isfinite(h["loss"]) for h in history):
        raise ValueError("train: a non-finite loss was recorded")
    promote(run_dir, "train", out)  # the new output complete: it replaces a finished one now, not before
    final = stage_dir(run_dir, "train") / "final"
    metrics_path = stage_dir(run_dir, "train") / "metrics.jsonl"
    write_manifest(run_dir, "train", config, {"metrics.jsonl": file_entry(metrics_path), **final_files}, **figures)
    log(f"train: {step} steps ({ran} this run, {figures['steps_per_s']} steps/s on {figures['device']} x {world}); "
        f"final draft head in {final}")
    os.sync()
    finish()
    return figures
