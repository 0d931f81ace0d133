"""One rank of stage ``train`` (:mod:`eagle3ops.stages.train`): its set-up (device and process group, the seeded
draft head, its samples, the checkpoint it resumes from, FSDP2 sharding, AdamW and the schedule), its steps and
checkpoints, and how the ranks finish together. The module doc of :mod:`eagle3ops.stages.train` says what is
speculators' and what is changed; the launch (one process, torchrun's ranks, nodes), the final head and the manifest
stay there.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3ops.config.pipeline import PipelineConfig
from eagle3ops.stages import trainplan
from eagle3ops.stages.draft import (
    build_draft_config,
    install_loss,
    register_dense_attention,
    standardize_with_norm,
    target_final_norm,
)
from eagle3ops.stages.heldout import CheckpointChooser, HeldOutEval
from eagle3ops.stages.manifest import atomic_write_text, stage_dir


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The newest complete checkpoint under ``ckpt_root`` (its ``state.json`` is written last), or None."""
    done = sorted(p.parent for p in ckpt_root.glob("step_*/state.json"))
    return done[-1] if done else None


def _quiet(*_args: Any, **_kwargs: Any) -> None:
    return None


def finish_ranks(world: int) -> None:
    """End the process group on every rank together (a no-op for one process): a barrier first, so that no rank
    tears down its pairs (or exits) while a peer still works with them; then NCCL's communicators are destroyed
    (PyTorch: destroy_process_group by all ranks, no collective in flight). A gloo rank (CPU) leaves the process
    instead, by :func:`leave_rank`: its outputs are complete at the barrier, and gloo's teardown —
    ``destroy_process_group`` or the destructors at interpreter exit — still made a rank die with ``terminate called
    without an active exception`` (SIGABRT) now and then after the barrier, on a loaded CPU; torchrun then failed
    that node, and node 0's agent waited out its 300 s exit barrier for it."""
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        if dist.get_backend() == "nccl":
            dist.destroy_process_group()
        else:
            leave_rank()


def leave_rank() -> None:
    """End this torchrun rank now with status 0, its output flushed, without running gloo's teardown (see
    :func:`finish_ranks`): ``os._exit`` skips the process group's destructors and the interpreter's
    shutdown. Only for a rank whose work is done and whose peers passed the final barrier; nothing reads a rank's
    return value (the launching process reads the manifest rank 0 wrote)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def peak_memory_bytes(device: str) -> int:
    """This process's peak memory in bytes: ``torch.cuda.max_memory_allocated`` on a GPU, the process's max RSS
    (``getrusage``; Linux reports KiB) on the CPU."""
    import torch

    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


@dataclass
class RankData:
    """One rank's share of the extracted samples (speculators' v1 sample files in ``ext_dir``): ``sample_files``
    (the extract manifest's rows) keyed by sample id in ``by_id``; ``held`` (sample ids held out, sorted);
    ``lay``/``units`` (:mod:`eagle3ops.stages.trainplan`'s layout and each unit's samples); ``mine`` (this
    rank's sample ids, ``pos`` their index in ``dataset``); ``chunks``/``current`` (stage chunked's chunks and the
    current one, empty/None outside it); ``dataset``/``collate``/``standardize`` (speculators' dataset, its
    collate function and the target-norm transform)."""

    ext_dir: Path
    sample_files: list[dict[str, Any]]
    by_id: dict[int, dict[str, Any]]
    held: list[int]
    lay: Any
    units: Any
    mine: list[int]
    pos: dict[int, int]
    chunks: list[tuple[int, ...]]
    current: tuple[int, int] | None
    dataset: Any
    collate: Any
    standardize: Any


@dataclass
class Rank:
    """One rank's training: where (``run_dir``, ``out``, ``ckpt_root``), who (``world``, ``rank``, ``device``),
    what (``model``, ``opt``, ``sched``, ``data``, ``chooser``, ``evaluate``) and how far (``step``,
    ``first_step``, ``last``: the last step's metrics). Only rank 0 (``is_main``) writes files."""

    run_dir: Path
    config: PipelineConfig
    out: Path
    world: int
    rank: int
    device: str
    log: Any
    use_compile: bool
    attention: str
    aux: list[int]
    draft_vocab: int
    model: Any
    data: RankData
    opt: Any = None
    sched: Any = None
    sd_opts: Any = None
    chooser: Any = None
    evaluate: Any = None
    step: int = 0
    first_step: int = 0
    loop_t0: float = 0.0
    last: dict[str, float] = field(default_factory=dict)

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
        """``<out>/metrics.jsonl``: one line per step."""
        return self.out / "metrics.jsonl"

    def batches_from(self, start: int):
        """``(epoch, row)`` of every step from step ``start`` on: epoch e's plan is packed with seed + e
        (:mod:`eagle3ops.stages.trainplan`), so the position of step s is reproducible; ``row[rank]`` is a rank's
        sample ids (None: a zero-weight step)."""
        tc, d, seed = self.config.train, self.data, self.config.seed
        epoch, seen = 0, 0
        while True:
            for row in (trainplan.chunked_epoch_plan(d.lay, d.units, tc.batch_max_tokens, seed, epoch, d.chunks)
                        if d.chunks else trainplan.epoch_plan(d.lay, d.units, tc.batch_max_tokens, seed, epoch)):
                if seen >= start:
                    yield epoch, row
                seen += 1
            epoch += 1

    def full_model_sd(self) -> dict[str, Any]:
        """The whole model's state dict on the CPU (a collective when sharded: every rank calls it)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        sd = get_model_state_dict(self.model, options=self.sd_opts)
        return {k: v.detach().cpu() for k, v in sd.items()}

    def save_checkpoint(self, s: int) -> None:
        """Checkpoint ``step_<s>`` (rank 0 writes it, ``state.json`` last; only the newest ``keep_checkpoints``
        stay); every rank takes part in the gathers and the barrier."""
        import torch
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        msd = self.full_model_sd()
        osd = get_optimizer_state_dict(self.model, self.opt, options=self.sd_opts)
        if self.is_main:
            d = self.ckpt_root / f"step_{s:08d}"
            if d.exists():
                shutil.rmtree(d)
            self.model.save_pretrained(d, state_dict=msd)
            torch.save(osd, d / "optimizer.pt")
            torch.save(self.sched.state_dict(), d / "scheduler.pt")
            atomic_write_text(d / "state.json", json.dumps({"step": s, "world_size": self.world,
                                                            "torch_rng": torch.get_rng_state().tolist(),
                                                            "held_out_curve": self.chooser.curve}))
            for old in sorted(p.parent for p in self.ckpt_root.glob("step_*/state.json"))[
                    : -self.config.train.keep_checkpoints]:
                shutil.rmtree(old)
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()


def start_rank(run_dir: Path, config: PipelineConfig, inputs: dict[str, Any], out: Path, world: int,
                log: Any) -> Rank:
    """This rank set up: its device and process group, the draft head (seeded), its samples, the checkpoint it
    resumes from (if any), FSDP2 sharding, the optimizer and schedule, the checkpoint chooser and the held-out
    evaluation.

    Raises:
        ValueError: extract/ and vocab/ come from different prepare outputs, or a checkpoint does not fit.
        trainplan.TrainPlanError: this rank has no sample to train on.
    """
    import numpy as np
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel

    tc = config.train
    ext, voc = inputs["extract"], inputs["vocab"]
    if ext["inputs"].get("prepare") != voc["inputs"].get("prepare"):
        raise ValueError("extract/ and vocab/ were made from different prepare outputs; rerun both")
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    device, rank = _init_device(tc.device, world)
    if rank != 0:
        log = _quiet  # one log per run: rank 0's
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
    r = Rank(run_dir, config, out, world, rank, device, log, use_compile, attention, aux, int(d2t.shape[0]), model,
              _rank_data(run_dir, config, ext, world, rank))
    _load_and_shard(r)
    r.evaluate = HeldOutEval(model, r.data.lay, r.data.held, rank,
                             {i: str(r.data.ext_dir / r.data.by_id[i]["file"]) for i in r.data.held}, tc,
                             r.data.standardize, r.data.collate, device, world, r.data.dataset[0])
    return r


def _init_device(want: str, world: int) -> tuple[str, int]:
    """``(device, rank)``: ``train.device`` (``auto``: cuda when there is one); with several ranks, this rank's GPU
    (its ``LOCAL_RANK``) and the process group (NCCL on GPUs, gloo on CPU). Resets the GPU's peak-memory count."""
    import torch
    import torch.distributed as dist

    device = want if want != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    rank = 0
    if world > 1:
        if device == "cuda":
            local_rank = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(local_rank)
            device = f"cuda:{local_rank}"
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
        rank = dist.get_rank()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    return device, rank


def _rank_data(run_dir: Path, config: PipelineConfig, ext: dict[str, Any], world: int, rank: int) -> RankData:
    """Rank ``rank``'s samples of the extract manifest ``ext`` (:class:`RankData`): the held-out split (by content
    when keyed), :mod:`eagle3ops.stages.trainplan`'s unit of the rank, stage chunked's current chunk, and
    speculators' dataset over the rank's files with the target's final norm applied on load.

    Raises:
        trainplan.TrainPlanError: the rank's unit holds no sample to train on."""
    from speculators.train.data import Eagle3SampleFileDataset, create_collate_fn
    from speculators.train.noise_transforms import AddUniformNoise

    tc = config.train
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
    current = None
    if chunks:
        current = tuple(chunked["current"])
        mine = [i for i in mine if current[0] <= i < current[1]]
    if not mine:
        raise trainplan.TrainPlanError(f"extract/manifest.json: samples [{lo}, {hi}) of rank {rank} hold no sample "
                                       f"to train on; extract more samples or use fewer nodes")
    norm_w, eps = target_final_norm(config.target_model)
    standardize = standardize_with_norm(norm_w, eps)
    dataset = Eagle3SampleFileDataset(
        max_len=tc.batch_max_tokens,
        file_list=[str(ext_dir / by_id[i]["file"]) for i in mine],
        transform=AddUniformNoise(std=tc.noise_std) if tc.noise_std > 0 else None,
        standardize_fn=standardize,
    )
    return RankData(ext_dir, sample_files, by_id, held, lay, units, mine, {i: n for n, i in enumerate(mine)}, chunks,
                 current, dataset, create_collate_fn(tc.batch_max_tokens), standardize)


def _load_and_shard(r: Rank) -> None:
    """Rank 0's newest checkpoint (if any) into the unsharded model, broadcast to every rank; FSDP2
    ``fully_shard`` of each decoder layer and the model (several ranks); AdamW and the linear schedule, their
    state, the RNG and the step restored from the checkpoint; the checkpoint chooser; ``metrics.jsonl`` cut back
    to the checkpoint's step (a run killed after its last checkpoint logged steps it will redo).

    Raises:
        ValueError: the checkpoint does not fit the draft head."""
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    from transformers import get_linear_schedule_with_warmup

    tc, model, world = r.config.train, r.model, r.world
    prev = latest_checkpoint(r.ckpt_root) if r.rank == 0 else None
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
    model.to(r.device)
    if world > 1:  # rank 0's checkpoint (only rank 0's node has one) to every rank
        box = [{"state": state, "prev": str(prev) if prev else None, "osd": osd, "sched": sched_sd}]
        dist.broadcast_object_list(box, src=0)
        state, osd, sched_sd = box[0]["state"], box[0]["osd"], box[0]["sched"]
        prev = Path(box[0]["prev"]) if box[0]["prev"] else None
        if prev is not None:
            with torch.no_grad():
                for t in model.state_dict().values():
                    dist.broadcast(t, src=0)
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    r.opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=tc.lr)
    r.sched = get_linear_schedule_with_warmup(r.opt, num_warmup_steps=tc.warmup_steps, num_training_steps=tc.steps)
    # Full (unsharded, name-keyed) state dicts: the same files for any world size. cpu_offload needs a group.
    r.sd_opts = StateDictOptions(full_state_dict=True, cpu_offload=world > 1)
    if prev is not None:
        set_optimizer_state_dict(model, r.opt, optim_state_dict=osd, options=StateDictOptions(full_state_dict=True))
        r.sched.load_state_dict(sched_sd)
        torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
        r.step = int(state["step"])
        r.log(f"train: resuming from {prev} at step {r.step} ({world} process{'es' if world > 1 else ''})")
    r.chooser = CheckpointChooser(r.out, tc.select_checkpoint, bool(r.data.held), bool(r.data.chunks), state, r.log,
                                  r.is_main)
    if r.step == 0 and r.is_main:
        r.metrics_path.unlink(missing_ok=True)
    elif r.is_main and r.metrics_path.is_file():
        kept = [ln for ln in r.metrics_path.read_text().splitlines()
                if ln.strip() and json.loads(ln)["step"] <= r.step]
        atomic_write_text(r.metrics_path, "".join(ln + "\n" for ln in kept))


def train_steps(r: Rank, stop_after: int | None) -> dict[str, Any] | None:
    """The steps from ``r.step`` to ``train.steps`` (or ``stop_after`` of them: then a checkpoint and
    ``{"stopped_at": step}``, the ranks finished); one ``metrics.jsonl`` line a step (rank 0), a log line every 10
    steps, a held-out measurement and a checkpoint every ``checkpoint_every``. None when all steps ran.

    Raises:
        ValueError: the loss is not finite.
        trainplan.TrainPlanError: a step trains samples outside stage chunked's current chunk."""
    import torch

    tc, d = r.config.train, r.data
    r.model.train()
    r.first_step, r.loop_t0 = r.step, time.monotonic()
    with open(r.metrics_path if r.is_main else os.devnull, "a", encoding="utf-8") as mf:
        gen = r.batches_from(r.step)
        while r.step < tc.steps:
            epoch, row = next(gen)
            idx = row[r.rank]
            active = idx is not None  # else a zero-weight step: this rank's unit has no batch left this epoch
            t_step = time.monotonic()
            if active and d.chunks and any(i not in d.pos for i in idx):  # only stage chunked's passes stop in time
                raise trainplan.TrainPlanError(f"step {r.step + 1} trains samples outside the current chunk "
                                               f"[{d.current[0]}, {d.current[1]}); run stage chunked, which stops "
                                               f"each pass in time")
            batch = d.collate([d.dataset[d.pos[i]] for i in idx] if active else [d.dataset[0]])
            batch = {k: v.to(r.device) if torch.is_tensor(v) else v for k, v in batch.items()}
            _draft, loss, metrics = r.model(
                **batch, ttt_steps=tc.ttt_steps, ttt_step_loss_decay=tc.ttt_step_loss_decay
            )
            mean_loss, metrics, n_tok = _reduce_step(r.world, loss, metrics, batch, active)
            if not active:
                loss = loss * 0.0
            if not torch.isfinite(mean_loss):
                raise ValueError(f"train: loss is {mean_loss.item()} at step {r.step}; lower train.lr")
            r.opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(r.model.parameters(), 1.0)
            r.opt.step()
            r.sched.step()
            r.step += 1
            r.last = {k: round(float(v), 6) for k, v in metrics.items()}  # float() waits for the device
            mf.write(json.dumps({"step": r.step, "epoch": epoch, "lr": r.sched.get_last_lr()[0],
                                 "step_s": round(time.monotonic() - t_step, 5), "tokens": n_tok, **r.last,
                                 "samples": row}) + "\n")
            mf.flush()
            if r.step % 10 == 0 or r.step == tc.steps:
                r.log(f"train: step {r.step}/{tc.steps} loss {r.last['loss']:.4f} "
                      f"full_acc_0 {r.last.get('full_acc_0', 0):.3f}")
            if r.step % tc.checkpoint_every == 0 or r.step == tc.steps:
                if r.chooser.measuring:
                    r.chooser.measure(r.step, r.evaluate(), r.full_model_sd, r.model)
                r.save_checkpoint(r.step)
            if stop_after is not None and r.step - r.first_step >= stop_after and r.step < tc.steps:
                r.save_checkpoint(r.step)
                r.log(f"train: stopped after {stop_after} steps at step {r.step}; a rerun resumes")
                finish_ranks(r.world)
                return {"stopped_at": r.step}
    return None


def _reduce_step(world: int, loss: Any, metrics: dict[str, Any], batch: dict[str, Any],
                 active: bool) -> tuple[Any, dict[str, Any], int]:
    """``(mean loss, metrics, tokens)`` of one step: with several ranks, loss and metrics averaged over the ranks
    that trained (the same on every rank) and the tokens summed (an ``all_reduce``); ``active``: whether this rank
    trained a batch (else it counts for nothing)."""
    import torch

    n_tok = int(batch["lengths"].sum()) if active else 0
    if world == 1:
        return (loss if active else loss * 0.0), metrics, n_tok
    import torch.distributed as dist

    names = sorted(metrics)
    a = 1.0 if active else 0.0
    v = torch.stack([loss.detach().float() * a,
                     *[torch.as_tensor(metrics[k]).float().to(loss.device) * a for k in names],
                     torch.tensor(float(n_tok), device=loss.device),
                     torch.tensor(a, device=loss.device)])
    dist.all_reduce(v)
    n_active = max(float(v[-1]), 1.0)
    return v[0] / n_active, {k: v[i + 1] / n_active for i, k in enumerate(names)}, int(v[-2])
