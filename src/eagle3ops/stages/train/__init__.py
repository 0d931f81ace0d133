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
:mod:`eagle3ops.stages.draft`; this package runs the training loop, its checkpoints and its processes.)
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

The package by job (as speculators' ``train/``): :mod:`~eagle3ops.stages.train.launch` (this process, or torchrun
ranks), :mod:`~eagle3ops.stages.train.setup` (process group, draft head, data, sharding, optimizer),
:mod:`~eagle3ops.stages.train.ckpt` (resume and save), :mod:`~eagle3ops.stages.train.loop` (the steps) and
:mod:`~eagle3ops.stages.train.finish` (the head chosen, its estimate, the final head, the manifest); :func:`run_train`
runs them in order, their state in one :class:`~eagle3ops.stages.train.job.TrainJob`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from eagle3ops.config.pipeline import PipelineConfig
from eagle3ops.stages import trainplan
from eagle3ops.stages.heldout import offline_estimate  # noqa: F401 - moved there; imported from here too
from eagle3ops.stages.train import ckpt, finish, launch, loop, setup
from eagle3ops.stages.train.launch import NPROC_ENV, OUT_ENV, resolve_nproc
from eagle3ops.stages.trainplan import held_out_indices  # noqa: F401 - moved there (pure); imported from here too

__all__ = ["NPROC_ENV", "OUT_ENV", "held_out_indices", "offline_estimate", "resolve_nproc", "run_train"]


def run_train(
    run_dir: Path, config: PipelineConfig, log: Any = print, restart: bool = False, stop_after: int | None = None,
    nodes: trainplan.Nodes | None = None,
) -> dict[str, Any]:
    """Run stage ``train``; returns the manifest's figures (on a node other than node 0 of a multi-node run:
    ``{"node_rank", "nodes", "nproc"}``; stopped by ``stop_after``: ``{"stopped_at": step}``).

    ``stop_after`` ends this run after that many steps with a checkpoint and no final output or manifest (an
    interrupted run, as a time-boxed window leaves it); the next call resumes from there. ``nodes``: this node's
    share of a multi-node run (package doc). The steps: where this process stands (it may launch torchrun ranks
    instead) → setup → the newest checkpoint's weights → sharding and optimizer → the optimizer's state, the
    checkpoint chooser and the held-out evaluation → the step loop → the end (the head chosen, its estimate, the
    final head, the manifest).

    Raises:
        StageInputError: extract/ or vocab/ missing or inconsistent (with each other or pipeline.yaml), or a file
            this node trains on missing.
        ValueError: the loss is not finite; the extract manifest's shards are not contiguous.
        RuntimeError: torchrun failed on this node.
    """
    t_start = time.monotonic()
    where = launch.place(run_dir, config, restart=restart, nodes=nodes)
    if where.launch is not None:
        return launch.launch_torchrun(run_dir, where.launch, stop_after, log, where.out, restart, nodes)
    job = setup.set_up(run_dir, config, where, log)
    saved = ckpt.load_weights(job)
    setup.shard_and_optimize(job)
    ckpt.restore(job, saved)
    ran = loop.train_steps(job, stop_after)
    if ran.stopped:
        finish.teardown(job)
        return {"stopped_at": job.step}
    return finish.finish(job, ran, t_start)
