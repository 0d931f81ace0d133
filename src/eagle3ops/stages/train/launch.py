"""Where stage ``train`` runs: in this process, or this process launching torchrun ranks (the package doc's
"Several processes" and "Several nodes"), and which input files this process checks before the heavy imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3ops.config.pipeline import PipelineConfig
from eagle3ops.stages import trainplan
from eagle3ops.stages.manifest import check_inputs, output_dir, stage_dir
from eagle3ops.stages.train.ckpt import latest_checkpoint

NPROC_ENV = "EAGLE3OPS_TRAIN_NPROC"

#: Environment variable through which the launching process tells the torchrun ranks where to write (the run's
#: ``train/`` or, for ``--restart`` over a finished train, :func:`eagle3ops.stages.manifest.restart_dir`).
OUT_ENV = "EAGLE3OPS_TRAIN_OUT"


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


@dataclass(frozen=True)
class Placement:
    """Where this process stands in the run.

    ``out``: the directory it writes (the run's ``train/`` or a restart's side directory); ``world``: processes in
    the run (1 when this process trains alone); ``inputs``: :func:`eagle3ops.stages.manifest.check_inputs`'s answer
    for the files this process (or node) trains on; ``launch``: processes to start under torchrun on this node, or
    None when this process trains itself (alone, or as a torchrun rank)."""

    out: Path
    world: int
    inputs: dict[str, Any]
    launch: int | None = None


def place(run_dir: Path, config: PipelineConfig, *, restart: bool, nodes: trainplan.Nodes | None) -> Placement:
    """This process's :class:`Placement`, its inputs checked (before the heavy imports, so refusals stay fast).

    Raises:
        StageInputError: extract/ or vocab/ missing or inconsistent, or a file this node trains on missing.
        ValueError: ``$EAGLE3OPS_TRAIN_NPROC`` is not a positive integer.
    """
    if "LOCAL_RANK" in os.environ:  # a torchrun rank: where the launching process said (its own run: train/)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        out = Path(os.environ.get(OUT_ENV) or stage_dir(run_dir, "train"))
        first = int(os.environ.get("RANK", "0")) - int(os.environ["LOCAL_RANK"])
        node_ranks = range(first, first + int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))
        return Placement(out, world, check_inputs(run_dir, "train", config,
                                                  wanted=trainplan.node_files(run_dir, world, node_ranks)))
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
    return Placement(out, 1, inputs, launch=nproc if nproc > 1 or count > 1 else None)


def launch_torchrun(run_dir: Path, nproc: int, stop_after: int | None, log: Any, out: Path,
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
