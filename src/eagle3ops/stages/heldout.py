"""The held-out side of stage ``train``: the offline estimate of acceptance length, measured at checkpoints, and
the choice of the checkpoint that becomes the final draft head.

Why choose: a head trained for many epochs on a few thousand conversations over-fits (the SmolLM2 rounds' last
training windows were 0.1 to 0.2 per position above held-out); the last step's weights are then not the best the
run produced. With ``train.select_checkpoint: held_out`` (the default) every checkpoint (each
``train.checkpoint_every`` steps and the last step) is measured on the held-out samples, the best one's weights are
kept in ``checkpoints/best/`` beside the resumable checkpoints (older ones are deleted by
``train.keep_checkpoints``; ``best/`` holds weights only, no optimizer state), the curve travels in
each checkpoint's ``state.json`` (a resumed run chooses over the whole run), and the manifest records the curve and
the step chosen (``checkpoint_choice``). Runs in the pipeline image (torch and speculators imported lazily).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable, Sequence

from eagle3ops.stages import trainplan
from eagle3ops.stages.manifest import atomic_write_text

__all__ = ["CheckpointChooser", "HeldOutEval", "offline_estimate"]


def offline_estimate(model: Any, held_dataset: Any, collate: Any, device: str, tc: Any, *,
                     plan: list[int | None] | None = None, world: int = 1, dummy: Any = None,
                     held_total: int | None = None) -> dict[str, Any] | None:
    """Simulated acceptance length of the draft head on the held-out samples (never trained on): teacher-forced
    (the draft sees the target's own hidden states at every position), so an optimistic estimate.

    ``full_acc_k`` from speculators' ``Eagle3DraftModel.forward`` is the fraction of positions whose draft tokens
    0..k are all correct; the expected tokens per target forward under greedy verification is then
    ``1 + Σ_k full_acc_k`` (k < ``train.ttt_steps``), the EAGLE papers' acceptance length τ. Averaged over held-out
    samples weighted by tokens. With several ranks each evaluates its share (``plan``: positions in
    ``held_dataset``, None for a zero-weight forward on ``dummy`` — a sharded forward needs every rank) and the sums
    are all-reduced (:func:`eagle3ops.stages.trainplan.held_out_plan`).

    Returns:
        ``{"acceptance_length", "per_position": {"k": full_acc_k}, "held_out_samples", "held_out_tokens", "kind"}``,
        or None when nothing is held out.
    """
    import torch

    if plan is None:
        plan = list(range(len(held_dataset)))
    total = len(held_dataset) if held_total is None else held_total
    if total == 0:
        return None
    sums = torch.zeros(tc.ttt_steps + 1, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for i in plan:
            batch = collate([held_dataset[i] if i is not None else dummy])
            batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            _d, _loss, metrics = model(**batch, ttt_steps=tc.ttt_steps, ttt_step_loss_decay=tc.ttt_step_loss_decay)
            n = int(batch["lengths"].sum()) if i is not None else 0
            sums[-1] += n
            for k in range(tc.ttt_steps):
                sums[k] += float(metrics[f"full_acc_{k}"]) * n
    model.train()
    if world > 1:
        import torch.distributed as dist

        red = sums.to(device)
        dist.all_reduce(red)
        sums = red.cpu()
    tokens = int(sums[-1])
    sums = {k: float(sums[k]) for k in range(tc.ttt_steps)}
    per_pos = {str(k): round(v / tokens, 6) for k, v in sums.items()} if tokens else {}
    return {"acceptance_length": round(1.0 + sum(per_pos.values()), 6), "per_position": per_pos,
            "held_out_samples": total, "held_out_tokens": tokens,
            "kind": "teacher-forced on held-out samples: an optimistic estimate of vLLM's mean acceptance length"}



class HeldOutEval:
    """The offline estimate (:func:`offline_estimate`) of ``model`` as it is when called, on this rank's share of
    the held-out samples ``held`` (ids; ``files[i]`` the sample file of id ``i``); every rank calls it together. The
    held-out dataset is read on the first call (a chunked run's held-out files exist only at its end). The torch
    RNG state is put back after each call, so measuring never changes what training does next (a resumed run
    trains the same numbers as an uninterrupted one)."""

    def __init__(self, model: Any, lay: Any, held: Sequence[int], rank: int, files: dict[int, str], tc: Any,
                 standardize: Any, collate: Any, device: str, world: int, dummy: Any) -> None:
        self.model, self.lay, self.held, self.rank, self.files, self.tc = model, lay, list(held), rank, files, tc
        self.standardize, self.collate, self.device, self.world, self.dummy = standardize, collate, device, world, dummy
        self._data: tuple[Any, list[int | None]] | None = None

    def _dataset(self) -> tuple[Any, list[int | None]]:
        if self._data is None:
            from speculators.train.data import Eagle3SampleFileDataset

            mine = [row[self.rank] for row in trainplan.held_out_plan(self.lay, self.held)]
            ids = [i for i in mine if i is not None]
            dataset: Any = Eagle3SampleFileDataset(  # speculators' dataset cannot be empty
                max_len=self.tc.batch_max_tokens, file_list=[self.files[i] for i in ids],
                standardize_fn=self.standardize,
            ) if ids else []
            pos = {i: n for n, i in enumerate(ids)}
            self._data = (dataset, [pos[i] if i is not None else None for i in mine])
        return self._data

    def __call__(self) -> dict[str, Any] | None:
        import torch

        dataset, plan = self._dataset()
        rng = torch.get_rng_state()
        try:
            return offline_estimate(self.model, dataset, self.collate, self.device, self.tc, plan=plan,
                                    world=self.world, dummy=self.dummy, held_total=len(self.held))
        finally:
            torch.set_rng_state(rng)


class CheckpointChooser:
    """Which checkpoint becomes the final head (module doc): measures at checkpoints, keeps the best's weights.

    ``select`` is ``train.select_checkpoint``; it falls back to ``last`` (saying why in :meth:`record`) when
    nothing is held out or the run is chunked. ``state`` is the resumed checkpoint's ``state.json`` ({} for a fresh
    run): its ``held_out_curve`` continues. Only ``is_main`` (rank 0) writes ``best/``."""

    def __init__(self, out: Path, select: str, held: bool, chunked: bool, state: dict[str, Any], log: Callable,
                 is_main: bool) -> None:
        self.out, self.best_dir, self.log, self.is_main = out, out / "checkpoints" / "best", log, is_main
        self.curve: list[dict[str, Any]] = list(state.get("held_out_curve") or [])
        self.select, self.why_last = select, None
        if select == "held_out" and not held:
            self.select, self.why_last = "last", "no held-out samples (train.held_out_fraction is 0 or too small)"
        elif select == "held_out" and chunked:
            self.select, self.why_last = "last", (
                "a chunked run: the held-out samples of later chunks are extracted only by their pass, so no "
                "checkpoint before the last could be measured on all of them")

    @property
    def measuring(self) -> bool:
        """Whether checkpoints are measured on the held-out samples."""
        return self.select == "held_out"

    def measure(self, step: int, est: dict[str, Any] | None, full_sd: Callable[[], dict[str, Any]],
                model: Any) -> None:
        """Record checkpoint ``step``'s estimate ``est``; a new best's weights (``full_sd()``: a collective when
        sharded, so every rank calls this) go to ``checkpoints/best/`` through a temporary folder renamed in place."""
        if est is None:
            return
        entry = {"step": step, "acceptance_length": est["acceptance_length"], "per_position": est["per_position"],
                 "estimate": est}
        is_best = trainplan.choose_checkpoint([*self.curve, entry]) is entry
        self.curve.append(entry)
        self.log(f"train: step {step}: held-out acceptance length {est['acceptance_length']:.4f}"
                 f"{' (best so far)' if is_best else ''}")
        if not is_best:
            return
        sd = full_sd()
        if self.is_main:
            tmp = self.best_dir.with_name(".best.tmp")
            if tmp.exists():
                shutil.rmtree(tmp)
            model.save_pretrained(tmp, state_dict=sd)
            atomic_write_text(tmp / "state.json", json.dumps({"step": step,
                                                               "acceptance_length": est["acceptance_length"]}))
            if self.best_dir.exists():
                shutil.rmtree(self.best_dir)
            tmp.rename(self.best_dir)

    def choice(self) -> dict[str, Any] | None:
        """The chosen curve entry (:func:`eagle3ops.stages.trainplan.choose_checkpoint`), or None: the last step."""
        return trainplan.choose_checkpoint(self.curve) if self.measuring and self.curve else None

    def best_weights(self, last_step: int) -> dict[str, Any]:
        """The chosen (best) checkpoint's weights, fp32, from ``best/`` on rank 0; ``{}`` on the other ranks (only
        rank 0 writes the final head). ``last_step``: the step training ended at, for the log line."""
        choice = self.choice()
        self.log(f"train: the final head is step {choice['step']}'s (held-out acceptance length "
                 f"{choice['acceptance_length']:.4f}), not step {last_step}'s")
        if not self.is_main:
            return {}
        from safetensors.torch import load_file

        return load_file(str(self.best_dir / "model.safetensors"))

    def record(self, last_step: int) -> dict[str, Any]:
        """The manifest's ``checkpoint_choice``: ``{"by", "step", "acceptance_length", "curve"}`` when chosen by the
        held-out estimate; ``{"by": "last step", "step", "why"?}`` otherwise."""
        choice = self.choice()
        if choice is None:
            return {"by": "last step", "step": last_step, **({"why": self.why_last} if self.why_last else {})}
        return {"by": "held-out acceptance length", "step": choice["step"],
                "acceptance_length": choice["acceptance_length"],
                "curve": [{k: e[k] for k in ("step", "acceptance_length", "per_position")} for e in self.curve]}
