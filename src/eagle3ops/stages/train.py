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
:mod:`eagle3ops.stages.draft`; one rank's set-up, steps and checkpoints in :mod:`eagle3ops.stages.trainrank`; this
module launches the processes and writes the final head and the manifest.)
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

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from eagle3ops.config.pipeline import PipelineConfig
from eagle3ops.stages import trainplan
from eagle3ops.stages.draft import SPECULATIVE_TOKENS
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
from eagle3ops.stages.trainplan import held_out_indices  # noqa: F401 - moved there (pure); imported from here too
from eagle3ops.stages.trainrank import (
    Rank,
    finish_ranks,
    latest_checkpoint,
    peak_memory_bytes,
    start_rank,
    train_steps,
)

NPROC_ENV = "EAGLE3OPS_TRAIN_NPROC"


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
        return {"stopped_at": json.loads((latest_checkpoint(out / "checkpoints")
                                          / "state.json").read_text())["step"]}
    return json.loads((stage_dir(run_dir, "train") / "manifest.json").read_text())


def run_train(
    run_dir: Path, config: PipelineConfig, log: Any = print, restart: bool = False, stop_after: int | None = None,
    nodes: trainplan.Nodes | None = None,
) -> dict[str, Any]:
    """Run stage ``train``; returns the manifest's figures (on a node other than node 0 of a multi-node run:
    ``{"node_rank", "nodes", "nproc"}``).

    ``stop_after`` ends this run after that many steps with a checkpoint and no final output or manifest (an
    interrupted run, as a time-boxed window leaves it); the next call resumes from there. ``nodes``: this node's
    share of a multi-node run (module doc). The steps: where this process trains (:func:`_place`: here, or
    torchrun's ranks), this rank set up (:func:`start_rank`), the steps (:func:`train_steps`), the final head and
    the manifest (:func:`_finish_train`).

    Raises:
        StageInputError: extract/ or vocab/ missing or inconsistent (with each other or pipeline.yaml), or a file
            this node trains on missing.
        ValueError: the loss is not finite; the extract manifest's shards are not contiguous.
        RuntimeError: torchrun failed on this node.
    """
    t_start = time.monotonic()
    launched, out, inputs, world = _place(run_dir, config, log, restart, stop_after, nodes)
    if launched is not None:
        return launched
    rank = start_rank(run_dir, config, inputs, out, world, log)
    stopped = train_steps(rank, stop_after)
    if stopped is not None:
        return stopped
    return _finish_train(rank, t_start)


def _place(run_dir: Path, config: PipelineConfig, log: Any, restart: bool, stop_after: int | None,
           nodes: trainplan.Nodes | None) -> tuple[dict[str, Any] | None, Path, dict[str, Any], int]:
    """Where this process trains, before the heavy imports (so refusals stay fast): ``(launched, out, inputs,
    world)``. Not under torchrun with several processes or nodes: the stage relaunched under torchrun, its
    figures as ``launched``. Otherwise ``launched`` is None and this process trains: into ``out``, on the checked
    ``inputs`` of its node's files, in a world of ``world`` ranks."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if "LOCAL_RANK" in os.environ:  # a torchrun rank: where the launching process said (its own run: train/)
        out = Path(os.environ.get(OUT_ENV) or stage_dir(run_dir, "train"))
        first = int(os.environ.get("RANK", "0")) - int(os.environ["LOCAL_RANK"])
        node_ranks = range(first, first + int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))
        return None, out, check_inputs(run_dir, "train", config,
                                       wanted=trainplan.node_files(run_dir, world, node_ranks)), world
    count = nodes.count if nodes else 1
    if count == 1:  # this node holds every file
        inputs = check_inputs(run_dir, "train", config)
    nproc = resolve_nproc(config)
    if count > 1:  # a node of several: only its own shard's files (trainplan)
        first = nodes.rank * nproc
        inputs = check_inputs(run_dir, "train", config,
                              wanted=trainplan.node_files(run_dir, count * nproc, range(first, first + nproc)))
    # --restart over a finished train builds the new output beside it; promoted (by rank 0) once complete.
    out = output_dir(run_dir, "train", restart=restart)
    if nproc > 1 or count > 1:
        return _launch_torchrun(run_dir, nproc, stop_after, log, out, restart, nodes), out, inputs, world
    return None, out, inputs, 1


def _finish_train(r: Rank, t_start: float) -> dict[str, Any]:
    """After the last step: the head chosen (the held-out best or the last step's), the peak memory of every rank;
    on rank 0 the final head in bf16, its figures (:func:`_figures`), ``train/`` promoted and the manifest
    written; then the ranks finished together. Returns the figures (another rank: ``{"rank"}``).

    Raises:
        ValueError: a non-finite loss was recorded."""
    import torch

    if r.device.startswith("cuda"):
        torch.cuda.synchronize()
    loop_s = time.monotonic() - r.loop_t0
    choice = r.chooser.choice()
    offline = r.evaluate() if choice is None else choice["estimate"]  # the last step's, or the chosen one's
    # full_model_sd is a collective when sharded: every rank calls it; an earlier best's weights are in best/
    chosen_sd = r.full_model_sd() if choice is None or choice["step"] == r.step else r.chooser.best_weights(r.step)
    sd = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in chosen_sd.items()}
    peaks = [peak_memory_bytes(r.device)]
    if r.world > 1:
        import torch.distributed as dist

        mine, peaks = peaks[0], [0] * r.world
        dist.all_gather_object(peaks, mine)
    if not r.is_main:
        finish_ranks(r.world)
        return {"rank": r.rank}
    final_files = _write_final(r, sd)
    with open(r.metrics_path, encoding="utf-8") as mf:
        history = [json.loads(line) for line in mf if line.strip()]
    figures = _figures(r, history, loop_s, peaks, offline, t_start)
    if any(not math.isfinite(h["loss"]) for h in history):
        raise ValueError("train: a non-finite loss was recorded")
    promote(r.run_dir, "train", r.out)  # the new output complete: it replaces a finished one now, not before
    final = stage_dir(r.run_dir, "train") / "final"
    metrics_path = stage_dir(r.run_dir, "train") / "metrics.jsonl"
    write_manifest(r.run_dir, "train", r.config, {"metrics.jsonl": file_entry(metrics_path), **final_files},
                   **figures)
    r.log(f"train: {r.step} steps ({figures['steps_this_run']} this run, {figures['steps_per_s']} steps/s on "
          f"{figures['device']} x {r.world}); final draft head in {final}")
    os.sync()
    finish_ranks(r.world)
    return figures


def _write_final(r: Rank, sd: dict[str, Any]) -> dict[str, Any]:
    """The draft head's state dict ``sd`` (bf16) saved as ``<out>/final`` in speculators' format, its config
    labelled bf16 and its files readable by all; returns ``{"final/<name>": file entry}``."""
    final = r.out / "final"
    if final.exists():
        shutil.rmtree(final)
    r.model.save_pretrained(final, state_dict=sd)
    # save_pretrained labels the config with the parameters' dtype (fp32 in training); the weights are bf16.
    conf_path = final / "config.json"
    conf = json.loads(conf_path.read_text())
    conf["dtype"] = "bfloat16"
    atomic_write_text(conf_path, json.dumps(conf, indent=2, sort_keys=True) + "\n")
    for p in final.iterdir():  # safetensors writes 0600; the SSH user sizes and copies the head (--head A:RUN)
        p.chmod(0o644)
    return {f"final/{p.name}": file_entry(p) for p in sorted(final.iterdir()) if p.is_file()}


def _figures(r: Rank, history: list[dict[str, Any]], loop_s: float, peaks: list[int], offline: Any,
             t_start: float) -> dict[str, Any]:
    """The train manifest's figures (pure over what the run did): steps and speeds (the median step of the steady
    part: the first 3 steps of this run left out), the device and processes, peak memory (bytes), the loss, the
    first loss and the last metrics, the layers and vocabulary, the offline estimate and the checkpoint chosen,
    the held-out split, the vLLM speculative config, the wall time (s)."""
    import torch

    tc, device, world, ran = r.config.train, r.device, r.world, r.step - r.first_step
    steady = sorted(h["step_s"] for h in history[r.first_step + min(3, max(0, ran - 1)):] if "step_s" in h)
    median_step_s = steady[len(steady) // 2] if steady else None
    tokens_per_step = [h["tokens"] for h in history[r.first_step:] if "tokens" in h]
    return {
        "steps": r.step,
        "median_step_s": median_step_s,
        "steps_per_s_steady": round(1 / median_step_s, 3) if median_step_s else None,
        "tokens_per_step_mean": round(sum(tokens_per_step) / len(tokens_per_step), 1) if tokens_per_step else None,
        "steps_this_run": ran,
        "resumed_from_step": r.first_step,
        "device": device if device == "cpu" else f"cuda ({torch.cuda.get_device_name(0)})",
        "world_size": world,
        "distributed": f"FSDP2 fully_shard, {'nccl' if device.startswith('cuda') else 'gloo'}" if world > 1 else None,
        "compile": r.use_compile,
        "attention": r.attention,
        "steps_per_s": round(ran / loop_s, 4) if ran and loop_s > 0 else None,  # checkpoint saves included
        "peak_memory_bytes": max(peaks),
        "peak_memory_bytes_per_rank": peaks,
        "peak_memory_kind": "torch.cuda.max_memory_allocated" if device.startswith("cuda") else "process max RSS",
        "loss": {"kind": tc.loss, **({"lk_eta": tc.lk_eta} if tc.loss == "lk_hybrid" else {})},
        "first_loss": history[0]["loss"] if history else None,
        "final_metrics": r.last or (history[-1] if history else {}),
        "aux_layer_ids_extracted": r.aux,
        "eagle_aux_hidden_state_layer_ids": [j + 1 for j in r.aux],
        "draft_vocab_size": r.draft_vocab,
        "offline_estimate": offline,
        "checkpoint_choice": r.chooser.record(r.step),
        "held_out_split": {**trainplan.held_out_split(r.data.sample_files), "held_out_samples": len(r.data.held)},
        "params_trainable": sum(p.numel() for p in r.model.parameters() if p.requires_grad),
        "vllm_speculative_config": {
            "method": "eagle3",
            "model": str((stage_dir(r.run_dir, "train") / "final").resolve()),
            "num_speculative_tokens": SPECULATIVE_TOKENS,
        },
        "wall_s": round(time.monotonic() - t_start, 3),
    }
