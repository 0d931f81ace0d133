"""Stage ``train``: speculators' EAGLE-3 draft head, trained on the extracted hidden states.

Inputs: ``extract/`` (speculators' v1 sample files) and ``vocab/`` (d2t/t2d). Output in ``<run_dir>/train/``:

- ``checkpoints/step_NNNNNNNN/``: resumable checkpoints (``model.safetensors`` + ``config.json`` in speculators'
  format, fp32; ``optimizer.pt``, ``scheduler.pt``; ``state.json`` written last = the checkpoint is complete).
  A rerun resumes from the newest complete one, with the same data order. ``--restart`` over a finished train
  builds the new output beside it (``<run_dir>/.train.restart/``, every rank writing there: the launching process
  passes it to the torchrun ranks in ``EAGLE3OPS_TRAIN_OUT``) and swaps it in only once complete
  (:func:`eagle3ops.stages.manifest.promote`), so a restart that fails leaves the finished head whole.
- ``checkpoints/best/``: with ``train.select_checkpoint: held_out`` (the default), the weights of the checkpoint
  with the best held-out offline estimate so far (:mod:`eagle3ops.stages.heldout`); ``final/`` is made from it.
- ``final/``: the draft head in speculators' saved format (``config.json`` with ``speculators_config``,
  ``model.safetensors`` in bf16 with ``d2t``/``t2d``), which vLLM 0.16 loads with
  ``--speculative-config '{"method": "eagle3", "model": "<run_dir>/train/final", "num_speculative_tokens": 3}'``.
- ``metrics.jsonl`` (one line per step) and ``manifest.json`` (steps, losses, steps/s, peak memory, the loss
  trained (``train.loss``: speculators' KL or the hybrid LK loss, :func:`eagle3ops.stages.draft.lk_hybrid_loss`),
  the held-out curve and the checkpoint chosen).

What is speculators' and what is changed here
---------------------------------------------
(The draft head's config, the dense attention used on CPU and the teacher-logit transform live in
:mod:`eagle3ops.stages.draft`; this module runs the training loop, its checkpoints and its processes.)
Used as is from speculators 0.3.0: ``Eagle3DraftModel`` / ``Eagle3SpeculatorConfig`` (model, TTT loss and
accuracy metrics), ``Eagle3SampleFileDataset`` + ``standardize_data_v1`` + ``shift_batch`` + ``create_collate_fn``
(data), ``MultipackDistributedBatchSamplerV2``'s packing (reproduced for every rank at once by
:mod:`eagle3ops.stages.trainplan`, which also keeps the samples V2 drops at an epoch's end), AdamW + linear
warmup/decay + grad-norm clip 1.0 (``train/trainer.py``). Changed, each for a reason:

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
sharding). Each rank gets its own packed batches from :mod:`eagle3ops.stages.trainplan` (V2's packing with
``num_replicas`` = the ranks of its unit; a rank whose unit has no batch left runs a zero-weight step); gradients are
averaged over ranks by FSDP's
reduce-scatter. Loss and metrics are averaged over ranks before they are logged; only rank 0 writes files.

Checkpoints are world-size independent: rank 0 writes full (unsharded) state dicts gathered with
``torch.distributed.checkpoint.state_dict`` (``get_model_state_dict`` / ``get_optimizer_state_dict`` with
``full_state_dict=True``; optimizer state keyed by parameter name), so a checkpoint written by N processes
resumes in 1 and vice versa. The step count, LR schedule and RNG state carry over; the batch order after a
resume follows the new world size's sampler. Rank 0 reads the checkpoint and broadcasts it (model tensors with
``broadcast``, optimizer and scheduler state with ``broadcast_object_list``), so only rank 0's node needs it.

Several nodes
-------------
``stage train --nodes N --node-rank R --rendezvous HOST:PORT`` launches this node's share of an N-node run:
torchrun with ``--nnodes N --node-rank R --master-addr HOST --master-port PORT`` (torchrun's static rendezvous: node
R's processes are ranks ``R * nproc ...``, so rank 0 — the one that writes checkpoints, the final head and the
manifest — is always on node 0, the first host). Which samples each rank trains on is
:mod:`eagle3ops.stages.trainplan`'s plan: on a fleet run's merged extract manifest whose shards divide the world
size, node ``n`` trains shard ``n`` and holds only that shard's hidden states (the file checks skip the others);
the global batch of a step is the union of the ranks' batches, and every training sample is seen once per epoch.
``metrics.jsonl`` records every step's sample ids per rank (``samples``). Gloo picks its interface from
``GLOO_SOCKET_IFNAME`` (the inventory's ``stage_env``) or the node's hostname.
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
    install_loss,
    register_dense_attention,
    standardize_with_norm,
    target_final_norm,
)
from eagle3ops.stages import trainplan
from eagle3ops.stages.trainplan import held_out_indices  # noqa: F401 - moved there (pure); imported from here too
from eagle3ops.stages.heldout import CheckpointChooser, HeldOutEval
from eagle3ops.stages.heldout import offline_estimate  # noqa: F401 - moved there; imported from here too
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
                     restart: bool = False, nodes: trainplan.Nodes | None = None) -> dict[str, Any]:
    """Run this stage in ``nproc`` processes under torchrun (localhost rendezvous, or this node's share of a
    multi-node run), writing into ``out`` (:data:`OUT_ENV`); returns rank 0's figures (on a node other than node 0:
    ``{"node_rank", "nodes", "nproc"}``). ``restart`` is passed on so the ranks redo a finished train (the stage
    command skips one otherwise); ``out`` was emptied by the launching process.

    Raises:
        RuntimeError: torchrun exited non-zero (the ranks' log says why).
    """
    where = nodes.torchrun_flags() if nodes else ["--standalone"]
    argv = [sys.executable, "-m", "torch.distributed.run", *where, f"--nproc_per_node={nproc}",
            "-m", "eagle3ops.stages", "train", "--run-dir", str(run_dir)]
    if stop_after is not None:
        argv += ["--stop-after", str(stop_after)]
    if restart:
        argv += ["--restart"]
    log(f"train: {nproc} processes: {' '.join(argv[1:])}")
    env = {**os.environ, OUT_ENV: str(out)}
    rc = subprocess.run(argv, check=False, env=env).returncode  # noqa: S603 - argv list, our own interpreter
    if rc != 0:
        node = f" on node {nodes.rank} of {nodes.count}" if nodes else ""
        raise RuntimeError(f"train: torchrun with {nproc} processes{node} exited with status {rc} (see the ranks' "
                           f"log above)")
    if nodes is not None and nodes.rank != 0:  # node 0 holds the checkpoints and the outputs
        return {"node_rank": nodes.rank, "nodes": nodes.count, "nproc": nproc}
    # Stopped early: ``out`` holds checkpoints and no manifest (a complete run promoted it to train/ with one).
    if stop_after is not None and out.is_dir() and not (out / "manifest.json").is_file():
        return {"stopped_at": json.loads((_latest_checkpoint(out / "checkpoints")
                                          / "state.json").read_text())["step"]}
    return json.loads((stage_dir(run_dir, "train") / "manifest.json").read_text())


def _finish_ranks(world: int) -> None:
    """End the process group on every rank together (a no-op for one process): a barrier first, so that no rank
    tears down its pairs (or exits) while a peer still works with them; then NCCL's communicators are destroyed
    (PyTorch: destroy_process_group by all ranks, no collective in flight). A gloo rank (CPU) leaves the process
    instead, by :func:`_leave_rank`: its outputs are complete at the barrier, and gloo's teardown —
    ``destroy_process_group`` or the destructors at interpreter exit — still made a rank die with ``terminate called
    without an active exception`` (SIGABRT) now and then after the barrier, on a loaded CPU; torchrun then failed
    that node, and node 0's agent waited out its 300 s exit barrier for it."""
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        if dist.get_backend() == "nccl":
            dist.destroy_process_group()
        else:
            _leave_rank()


def _leave_rank() -> None:
    """End this torchrun rank now with status 0, its output flushed, without running gloo's teardown (see
    :func:`_finish_ranks`): ``os._exit`` skips the process group's destructors and the interpreter's
    shutdown. Only for a rank whose work is done and whose peers passed the final barrier; nothing reads a rank's
    return value (the launching process reads the manifest rank 0 wrote)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _peak_memory_bytes(device: str) -> int:
    import torch

    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def run_train(
    run_dir: Path, config: PipelineConfig, log: Any = print, restart: bool = False, stop_after: int | None = None,
    nodes: trainplan.Nodes | None = None,
) -> dict[str, Any]:
    """Run stage ``train``; returns the manifest's figures (on a node other than node 0 of a multi-node run:
    ``{"node_rank", "nodes", "nproc"}``).

    ``stop_after`` ends this run after that many steps with a checkpoint and no final output or manifest (an
    interrupted run, as a time-boxed window leaves it); the next call resumes from there. ``nodes``: this node's
    share of a multi-node run (module doc).

    Raises:
        StageInputError: extract/ or vocab/ missing or inconsistent (with each other or pipeline.yaml), or a file
            this node trains on missing.
        ValueError: the loss is not finite; the extract manifest's shards are not contiguous.
        RuntimeError: torchrun failed on this node.
    """
    t_start = time.monotonic()
    tc = config.train
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if "LOCAL_RANK" not in os.environ:  # not under torchrun: pick the launch
        count = nodes.count if nodes else 1
        if count == 1:  # this node holds every file: checked before the heavy imports, so refusals stay fast
            inputs = check_inputs(run_dir, "train", config)
        nproc = resolve_nproc(config)
        if count > 1:  # a node of several: only its own shard's files (trainplan)
            first = nodes.rank * nproc
            inputs = check_inputs(run_dir, "train", config,
                                  wanted=trainplan.node_files(run_dir, count * nproc, range(first, first + nproc)))
        # --restart over a finished train builds the new output beside it; promoted (by rank 0) once complete.
        out = output_dir(run_dir, "train", restart=restart)
        if nproc > 1 or count > 1:
            return _launch_torchrun(run_dir, nproc, stop_after, log, out, restart, nodes)
        world = 1
    else:  # a torchrun rank: where the launching process said (its own run: the run's train/)
        out = Path(os.environ.get(OUT_ENV) or stage_dir(run_dir, "train"))
        first = int(os.environ.get("RANK", "0")) - int(os.environ["LOCAL_RANK"])
        node_ranks = range(first, first + int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))
        inputs = check_inputs(run_dir, "train", config, wanted=trainplan.node_files(run_dir, world, node_ranks))

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
    install_loss(tc.loss, tc.lk_eta)  # before the first forward (and its compile) reads it

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
    if chunks:
        ca, cb = chunked["current"]
        mine = [i for i in mine if ca <= i < cb]
    if not mine:
        raise trainplan.TrainPlanError(f"extract/manifest.json: samples [{lo}, {hi}) of rank {rank} hold no sample "
                                       f"to train on; extract more samples or use fewer nodes")
    pos = {i: n for n, i in enumerate(mine)}
    norm_w, eps = target_final_norm(config.target_model)
    transform = AddUniformNoise(std=tc.noise_std) if tc.noise_std > 0 else None
    dataset = Eagle3SampleFileDataset(
        max_len=tc.batch_max_tokens,
        file_list=[str(ext_dir / by_id[i]["file"]) for i in mine],
        transform=transform,
        standardize_fn=standardize_with_norm(norm_w, eps),
    )
    collate = create_collate_fn(tc.batch_max_tokens)

    step = 0
    prev = _latest_checkpoint(ckpt_root) if rank == 0 else None
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
    model.to(device)
    if world > 1:  # rank 0's checkpoint (only rank 0's node has one) to every rank
        box = [{"state": state, "prev": str(prev) if prev else None, "osd": osd, "sched": sched_sd}]
        dist.broadcast_object_list(box, src=0)
        state, osd, sched_sd = box[0]["state"], box[0]["osd"], box[0]["sched"]
        prev = Path(box[0]["prev"]) if box[0]["prev"] else None
        if prev is not None:
            with torch.no_grad():
                for t in model.state_dict().values():
                    dist.broadcast(t, src=0)
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
        set_optimizer_state_dict(model, opt, optim_state_dict=osd, options=StateDictOptions(full_state_dict=True))
        sched.load_state_dict(sched_sd)
        torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
        step = int(state["step"])
        log(f"train: resuming from {prev} at step {step} ({world} process{'es' if world > 1 else ''})")
    chooser = CheckpointChooser(out, tc.select_checkpoint, bool(held), bool(chunks), state, log, is_main)
    metrics_path = out / "metrics.jsonl"
    if step == 0 and is_main:
        metrics_path.unlink(missing_ok=True)
    elif is_main and metrics_path.is_file():  # a run killed after its last checkpoint logged steps it will redo
        kept = [ln for ln in metrics_path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
        atomic_write_text(metrics_path, "".join(ln + "\n" for ln in kept))

    # Epoch e's plan is packed with seed + e (trainplan): the position of step s is reproducible.
    def batches_from(start: int):
        epoch, seen = 0, 0
        while True:
            for row in (trainplan.chunked_epoch_plan(lay, units, tc.batch_max_tokens, config.seed, epoch, chunks)
                        if chunks else trainplan.epoch_plan(lay, units, tc.batch_max_tokens, config.seed, epoch)):
                if seen >= start:
                    yield epoch, row
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
                                                            "torch_rng": torch.get_rng_state().tolist(),
                                                            "held_out_curve": chooser.curve}))
            for old in sorted(p.parent for p in ckpt_root.glob("step_*/state.json"))[: -tc.keep_checkpoints]:
                shutil.rmtree(old)
        if world > 1:
            dist.barrier()

    evaluate = HeldOutEval(model, lay, held, rank, {i: str(ext_dir / by_id[i]["file"]) for i in held}, tc,
                           standardize_with_norm(norm_w, eps), collate, device, world, dataset[0])

    model.train()
    first_step = step
    t_loop = time.monotonic()
    last: dict[str, float] = {}
    with open(metrics_path if is_main else os.devnull, "a", encoding="utf-8") as mf:
        gen = batches_from(step)
        while step < tc.steps:
            epoch, row = next(gen)
            idx = row[rank]
            active = idx is not None  # else a zero-weight step: this rank's unit has no batch left this epoch
            t_step = time.monotonic()
            if active and chunks and any(i not in pos for i in idx):  # only stage chunked's passes stop in time
                raise trainplan.TrainPlanError(f"step {step + 1} trains samples outside the current chunk "
                                               f"[{ca}, {cb}); run stage chunked, which stops each pass in time")
            batch = collate([dataset[pos[i]] for i in idx] if active else [dataset[0]])
            batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            _draft, loss, metrics = model(
                **batch, ttt_steps=tc.ttt_steps, ttt_step_loss_decay=tc.ttt_step_loss_decay
            )
            n_tok = int(batch["lengths"].sum()) if active else 0
            if not active:
                loss = loss * 0.0
            if world > 1:  # mean loss/metrics over the ranks that trained (same on every rank), summed tokens
                names = sorted(metrics)
                a = 1.0 if active else 0.0
                v = torch.stack([loss.detach().float() * a,
                                 *[torch.as_tensor(metrics[k]).float().to(loss.device) * a for k in names],
                                 torch.tensor(float(n_tok), device=loss.device),
                                 torch.tensor(a, device=loss.device)])
                dist.all_reduce(v)
                n_active = max(float(v[-1]), 1.0)
                metrics = {k: v[i + 1] / n_active for i, k in enumerate(names)}
                mean_loss, n_tok = v[0] / n_active, int(v[-2])
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
                                 "tokens": n_tok, **last, "samples": row}) + "\n")
            mf.flush()
            if step % 10 == 0 or step == tc.steps:
                log(f"train: step {step}/{tc.steps} loss {last['loss']:.4f} full_acc_0 {last.get('full_acc_0', 0):.3f}")
            if step % tc.checkpoint_every == 0 or step == tc.steps:
                if chooser.measuring:
                    chooser.measure(step, evaluate(), full_model_sd, model)
                save_checkpoint(step)
            if stop_after is not None and step - first_step >= stop_after and step < tc.steps:
                save_checkpoint(step)
                log(f"train: stopped after {stop_after} steps at step {step}; a rerun resumes")
                _finish_ranks(world)
                return {"stopped_at": step}
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    loop_s = time.monotonic() - t_loop
    ran = step - first_step

    choice = chooser.choice()
    offline = evaluate() if choice is None else choice["estimate"]  # the last step's, or the chosen one's
    # full_model_sd is a collective when sharded: every rank calls it; an earlier best's weights are in best/
    chosen_sd = full_model_sd() if choice is None or choice["step"] == step else chooser.best_weights(step)
    sd = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in chosen_sd.items()}
    peak = _peak_memory_bytes(device)
    peaks = [peak]
    if world > 1:
        peaks = [0] * world
        dist.all_gather_object(peaks, peak)
    if not is_main:
        _finish_ranks(world)
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
    for p in final.iterdir():  # safetensors writes 0600; the SSH user sizes and copies the head (--head A:RUN)
        p.chmod(0o644)
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
        "loss": {"kind": tc.loss, **({"lk_eta": tc.lk_eta} if tc.loss == "lk_hybrid" else {})},
        "first_loss": history[0]["loss"] if history else None,
        "final_metrics": last or (history[-1] if history else {}),
        "aux_layer_ids_extracted": aux,
        "eagle_aux_hidden_state_layer_ids": [j + 1 for j in aux],
        "draft_vocab_size": int(d2t.shape[0]),
        "offline_estimate": offline,
        "checkpoint_choice": chooser.record(step),
        "held_out_split": {**trainplan.held_out_split(sample_files), "held_out_samples": len(held)},
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
    _finish_ranks(world)
    return figures
