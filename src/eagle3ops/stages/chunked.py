"""Stage ``chunked``: extraction and training chunk by chunk, for a run whose hidden states do not fit.

Window train runs it instead of stage ``train`` when the pipeline config sets ``chunks.count`` (``auto`` or N); it
needs ``prepare/`` and ``vocab/``. It plans (:mod:`eagle3ops.stages.chunkplan`: chunks cut from the prepared
samples' sizes and the disk budget, the passes with their training steps), prints the plan, records it in
``chunks/plan.json`` and then carries out each pass, each step a subprocess of this interpreter (so the target's
engine and the trainer never hold the GPU together):

1. delete the training samples' hidden states of every other chunk (left by an interrupted pass: the disk bound
   holds on a rerun too);
2. ``stage extract --shard START:END`` (resumes: samples already written are kept);
3. write ``extract/manifest.json`` as the pass's view: every sample named (``sample_files``), the files now on disk
   listed (``files``: this chunk's and the held-out samples'), and ``chunked`` (the chunks and the current one),
   from which stage train takes the chunk-major step order
   (:func:`eagle3ops.stages.trainplan.chunked_epoch_plan`) and reads only the current chunk;
4. ``stage train --stop-after K``: up to the pass's last step, with a checkpoint (the last pass runs to the end and
   writes the head and the train manifest);
5. delete the chunk's training samples (not after the last pass: the train manifest lists them).

A rerun resumes: passes whose last step the newest checkpoint has reached are skipped, and the plan recorded by
the first run is kept (the chunks must not move under a half-trained head); ``--restart`` plans again and trains from
scratch, with a finished head set aside in ``<run_dir>/.train.before-restart`` until the new one is complete.
``chunks/passes.jsonl`` holds one line per finished pass (seconds of extraction and training, bytes on disk).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from eagle3ops.config.pipeline import PipelineConfig
from eagle3ops.stages import chunkplan, trainplan
from eagle3ops.stages.manifest import MANIFEST, StageInputError, atomic_write_text, check_inputs, stage_dir

#: The stage's folder in the run directory.
CHUNKS_DIR = "chunks"


def budget(run_dir: Path, config: PipelineConfig) -> tuple[int, str]:
    """``(bytes, basis)``: the sample-file bytes the plan may keep on disk at once: ``chunks.budget_bytes``, else
    ``chunks.budget_fraction`` of the data dir's free space (``os.statvfs``) plus the bytes the run's ``extract/``
    already holds, less what stage train will write (:func:`eagle3ops.stages.chunkplan.train_output_bytes`: its
    checkpoints and the final head, an upper bound)."""
    if config.chunks.budget_bytes:
        return int(config.chunks.budget_bytes), "chunks.budget_bytes"
    from eagle3ops.stages.vocab import target_text_config

    t = target_text_config(config.target_model)
    h = int(t.hidden_size)
    dims = {"hidden_size": h, "intermediate_size": int(getattr(t, "intermediate_size", 0) or 4 * h),
            "vocab_size": int(t.vocab_size)}
    reserve = chunkplan.train_output_bytes(dims, config)
    st = os.statvfs(run_dir)
    free = st.f_bavail * st.f_frsize
    train_dir = stage_dir(run_dir, "train")
    ext = stage_dir(run_dir, "extract")
    held = sum(p.stat().st_size for p in ext.rglob("*.pt")) if ext.is_dir() else 0
    held += sum(p.stat().st_size for p in train_dir.rglob("*") if p.is_file()) if train_dir.is_dir() else 0
    frac = config.chunks.budget_fraction
    return int(frac * (free + held)) - reserve, (
        f"chunks.budget_fraction {frac:g} of {free / 2**20:.1f} MiB free + {held / 2**20:.1f} MiB this run's "
        f"extract/ and train/ hold, less {reserve / 2**20:.1f} MiB for train's checkpoints and head")


def make_plan(run_dir: Path, config: PipelineConfig, world: int | None = None) -> chunkplan.ChunkPlan:
    """The plan from ``prepare/samples.jsonl``, the target's hidden size and :func:`budget`, for ``world`` training
    processes (default: the train stage's, :func:`eagle3ops.stages.train.resolve_nproc`).

    Raises:
        StageInputError: prepare/ or vocab/ missing or stale.
        ChunkPlanError: no chunking fits (the message names the key).
    """
    from eagle3ops.stages.extract import resolve_layer_ids
    from eagle3ops.stages.prepare import read_samples

    from eagle3ops.stages.train import resolve_nproc

    check_inputs(run_dir, "vocab", config)  # prepare/ as vocab/ needs it (train checks vocab/ itself)
    samples = read_samples(run_dir)
    tokens = [len(s["input_ids"]) for s in samples]
    _aux, _n, hidden = resolve_layer_ids(config)
    b, basis = budget(run_dir, config)
    return chunkplan.plan(tokens, hidden_size=hidden, config=config, budget_bytes=b, basis=basis,
                          world=world or resolve_nproc(config), content=trainplan.sample_content(samples))


def _stage(run_dir: Path, *args: str) -> None:
    """``python -m eagle3ops.stages ARGS --run-dir RUN_DIR`` (the stage sub-app alone, as torchrun's ranks run it)
    in a subprocess of this interpreter and environment.

    Raises:
        RuntimeError: it exited non-zero (its output is in this stage's log).
    """
    argv = [sys.executable, "-m", "eagle3ops.stages", *args, "--run-dir", str(run_dir)]
    rc = subprocess.run(argv, check=False).returncode  # noqa: S603 - argv list, our own interpreter
    if rc != 0:
        raise RuntimeError(f"chunked: `stage {' '.join(argv[3:])}` exited with status {rc} (its output is above)")


def _checkpoint_step(run_dir: Path) -> int:
    done = sorted((stage_dir(run_dir, "train") / "checkpoints").glob("step_*/state.json"))
    return int(json.loads(done[-1].read_text())["step"]) if done else 0


def _prune(run_dir: Path, p: chunkplan.ChunkPlan, keep: tuple[int, int] | None) -> int:
    """Delete the training samples' files outside ``keep`` and the chunks' shard manifests; returns bytes freed."""
    from eagle3ops.stages.extract import HIDDEN_DIR
    from eagle3ops.stages.shards import manifest_path

    held, freed = set(p.held), 0
    for a, b in p.chunks:
        if keep == (a, b):
            continue
        manifest_path(run_dir, (a, b)).unlink(missing_ok=True)
        for i in range(a, b):
            f = stage_dir(run_dir, "extract") / HIDDEN_DIR / f"data_{i:06d}.pt"
            if i not in held and f.is_file():
                freed += f.stat().st_size
                f.unlink()
    return freed


def write_view(run_dir: Path, config: PipelineConfig, p: chunkplan.ChunkPlan, chunk: tuple[int, int]) -> Path:
    """``extract/manifest.json`` for the pass on ``chunk`` (module doc, step 3), from the chunk's shard manifest and
    the files on disk.

    Raises:
        StageInputError: the chunk's shard manifest is missing (its extract did not finish).
    """
    from eagle3ops.stages.extract import HIDDEN_DIR, PROGRESS
    from eagle3ops.stages.manifest import write_manifest
    from eagle3ops.stages.prepare import read_samples
    from eagle3ops.stages.shards import manifest_path

    sm = manifest_path(run_dir, chunk)
    if not sm.is_file():
        raise StageInputError(f"chunked: {sm} is missing after the chunk's extract; rerun stage chunked")
    shard = json.loads(sm.read_text())
    ext = stage_dir(run_dir, "extract")
    recs: dict[str, dict[str, Any]] = {}
    for line in (ext / PROGRESS).read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        recs[r["file"]] = {"bytes": r["bytes"], "sha256": r["sha256"]}
    held = set(p.held)
    files = dict(shard["files"])
    for i in held:
        rel = f"{HIDDEN_DIR}/data_{i:06d}.pt"
        if rel in recs and (ext / rel).is_file() and (ext / rel).stat().st_size == recs[rel]["bytes"]:
            files[rel] = recs[rel]
    samples = read_samples(run_dir)
    tokens = [len(s["input_ids"]) for s in samples]
    skip = {"stage", "status", "created", "eagle3ops_version", "config_digest", "inputs", "files", "shard",
            "prepare_files", "sample_files", "samples", "tokens", "hidden_bytes", "file_bytes", "samples_this_run"}
    figures = {k: v for k, v in shard.items() if k not in skip}
    return write_manifest(
        run_dir, "extract", config, files, **figures, samples=len(tokens), tokens=sum(tokens),
        sample_files=[{"i": i, "file": f"{HIDDEN_DIR}/data_{i:06d}.pt", "tokens": t,
                       **({"content": s["content"]} if "content" in s else {})}
                      for i, (t, s) in enumerate(zip(tokens, samples))],
        chunked={"chunks": [list(c) for c in p.chunks], "current": list(chunk), "plan": chunkplan.digest(p),
                 "kind": "a pass of stage chunked: `files` lists what is on disk now, `sample_files` every sample"})


def _disk_bytes(run_dir: Path) -> int:
    return sum(f.stat().st_size for f in stage_dir(run_dir, "extract").rglob("*.pt"))


def run_chunked(run_dir: Path, config: PipelineConfig, log: Any = print, restart: bool = False,
                dry_run: bool = False) -> dict[str, Any]:
    """Run stage ``chunked`` (module doc); returns ``{"plan", "passes_run", "train"}`` (``dry_run``: the plan only,
    nothing written).

    Raises:
        StageInputError: prepare/ or vocab/ missing or stale, or a pass's extract left no shard manifest.
        ChunkPlanError: no chunking fits the budget.
        RuntimeError: a pass's extract or train failed (the run resumes from there on a rerun).
    """
    t0 = time.monotonic()
    if config.chunks.count == "off":
        raise StageInputError("stage chunked: pipeline.yaml has chunks.count off; set `chunks: {count: auto}` (or a "
                              "number of chunks), or run stages extract and train")
    for need in ("prepare",) if dry_run else ("prepare", "vocab"):  # window train plans before its vocab runs
        if not (stage_dir(run_dir, need) / MANIFEST).is_file():
            raise StageInputError(f"stage chunked: {stage_dir(run_dir, need) / MANIFEST} is missing; run stage "
                                  f"`{need}` first")
    cdir = run_dir / CHUNKS_DIR
    recorded = cdir / "plan.json"
    if recorded.is_file() and not restart and _checkpoint_step(run_dir) > 0:
        p = chunkplan.from_json(json.loads(recorded.read_text()))
        log(f"chunked: resuming the recorded plan {recorded}")
    else:
        p = make_plan(run_dir, config)
    for line in p.lines():
        log(line)
    if dry_run:
        return {"plan": p.to_json(), "passes_run": 0}
    kept = run_dir / ".train.before-restart"  # a finished head is set aside, deleted only once the new one is done
    if restart:
        if (stage_dir(run_dir, "train") / MANIFEST).is_file():
            shutil.rmtree(kept, ignore_errors=True)
            os.replace(stage_dir(run_dir, "train"), kept)
        shutil.rmtree(stage_dir(run_dir, "train"), ignore_errors=True)
        (cdir / "passes.jsonl").unlink(missing_ok=True)
    cdir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(recorded, json.dumps(p.to_json(), indent=1) + "\n")
    ran = 0
    for n, ps in enumerate(p.passes):
        at = _checkpoint_step(run_dir)
        last = n == len(p.passes) - 1
        if at >= ps.step_end and not (last and not (stage_dir(run_dir, "train") / MANIFEST).is_file()):
            continue
        chunk = (ps.start, ps.end)
        freed = _prune(run_dir, p, keep=chunk)
        log(f"chunked: pass {n + 1}/{len(p.passes)}: epoch {ps.epoch} chunk {ps.chunk} [{ps.start}, {ps.end}), "
            f"steps {at + 1}..{ps.step_end}" + (f" ({freed} bytes of other chunks deleted first)" if freed else ""))
        te = time.monotonic()
        _stage(run_dir, "extract", "--shard", f"{ps.start}:{ps.end}")
        extract_s = time.monotonic() - te
        write_view(run_dir, config, p, chunk)
        on_disk = _disk_bytes(run_dir)
        tt = time.monotonic()
        _stage(run_dir, "train", *([] if last else ["--stop-after", str(ps.step_end - at)]))
        train_s = time.monotonic() - tt
        if not last:
            _prune(run_dir, p, keep=None)
        ran += 1
        with open(cdir / "passes.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"pass": n, "epoch": ps.epoch, "chunk": ps.chunk, "steps": [at, ps.step_end],
                                "extract_s": round(extract_s, 2), "train_s": round(train_s, 2),
                                "sample_bytes_on_disk": on_disk}) + "\n")
    train = json.loads((stage_dir(run_dir, "train") / MANIFEST).read_text())
    shutil.rmtree(kept, ignore_errors=True)
    log(f"chunked: {ran} pass(es) this run, {p.steps} steps; head in {stage_dir(run_dir, 'train') / 'final'} "
        f"({time.monotonic() - t0:.1f} s)")
    return {"plan": p.to_json(), "passes_run": ran,
            "train": {k: train.get(k) for k in ("steps", "offline_estimate", "wall_s")}}
