"""``eagle3ops stage <prepare|extract|merge|vocab|train|chunked|probe> --run-dir DIR``: the in-container pipeline
stages.

Each command reads ``DIR/pipeline.yaml`` and its inputs' manifests, writes only ``DIR/<stage>/`` and ends with
``DIR/<stage>/manifest.json``. Exit status: 0 done, 2 config or input error (message names file and fix),
1 any other failure (``probe``: 1 = the hidden states are outside the tolerance). Heavy libraries (torch, vLLM, speculators) are imported inside the commands.
"""

from __future__ import annotations

import importlib

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

# Plain Python tracebacks (not rich's boxed, 80-column-wrapped ones): the stage's log is read by the window's
# supervisor (eagle3ops.supervisor.stagerun.stage_error), which takes a crash's reason from the traceback's last line.
app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Run one in-container EAGLE-3 pipeline stage on a run directory.")

RunDir = Annotated[
    Path,
    typer.Option("--run-dir", help="Run directory holding pipeline.yaml, e.g. /data/runs/<id>.", file_okay=False),
]


def _log(msg: str) -> None:
    print(msg, flush=True)


#: ``stage <name>`` → (module, function, whether it takes the command's options).
_STAGES: dict[str, tuple[str, str, bool]] = {
    "prepare": ("eagle3ops.stages.prepare", "run_prepare", False),
    "extract": ("eagle3ops.stages.extract", "run_extract", True),
    "merge": ("eagle3ops.stages.merge", "merge_into_run", True),
    "vocab": ("eagle3ops.stages.vocab", "run_vocab", False),
    "train": ("eagle3ops.stages.train", "run_train", True),
    "chunked": ("eagle3ops.stages.chunked", "run_chunked", True),
    "probe": ("eagle3ops.stages.probe", "run_probe", True),
}


def _stage_function(stage: str) -> tuple[object, bool] | None:
    """The function ``stage <name>`` runs and whether it takes the command's options (None for no such stage);
    imported here, so that a command loads only its own stage's libraries."""
    if stage not in _STAGES:
        return None
    module, name, takes_options = _STAGES[stage]
    return getattr(importlib.import_module(module), name), takes_options


def _config(run_dir: Path) -> object:
    """The run's pipeline config (on a venv host with the container paths mapped to the host's directories).

    Raises:
        PipelineConfigError: no run directory, or its pipeline.yaml does not hold.
    """
    from eagle3ops.config.pipeline import PipelineConfigError, load_pipeline_config

    if not run_dir.is_dir():
        raise PipelineConfigError(f"--run-dir {run_dir}: no such directory")
    config = load_pipeline_config(run_dir)
    if os.environ.get("EAGLE3OPS_MOUNTS"):  # a venv host: container paths → the host's directories
        import json

        from eagle3ops.config.pipeline import apply_mounts

        config = apply_mounts(config, json.loads(os.environ["EAGLE3OPS_MOUNTS"]))
    return config


def _already_done(stage: str, run_dir: Path, config: object, kwargs: dict[str, object]) -> bool:
    """Whether the stage (or the fleet shard) finished for these inputs, said in the log: a finished stage is never
    redone (nor its output touched) for the same inputs unless ``--restart``."""
    from eagle3ops.stages.manifest import MANIFEST, STAGES, finished, stage_dir

    if kwargs.get("shard") is not None:  # a fleet shard: its own manifest says whether it is done
        from eagle3ops.stages.shards import finished_shard, manifest_path

        shard = kwargs["shard"]
        done = None if kwargs.get("restart") else finished_shard(run_dir, config, shard)  # type: ignore[arg-type]
        if done is not None:
            _log(f"extract: shard already done for these inputs ({manifest_path(run_dir, shard)}, "  # type: ignore[arg-type]
                 f"{done.get('created', '?')}); nothing to do (--restart to redo it)")
        return done is not None
    if stage in STAGES and not kwargs.get("restart"):
        done = finished(run_dir, stage, config)  # type: ignore[arg-type]
        if done is not None:
            _log(f"{stage}: already done for these inputs ({stage_dir(run_dir, stage) / MANIFEST}, "
                 f"{done.get('created', '?')}); nothing to do (--restart to redo it)")
            return True
    return False


def _run(stage: str, run_dir: Path, **kwargs: object) -> None:
    """Run ``stage`` on ``run_dir`` unless it is done for these inputs; a config or input error exits 2 with its
    message, a failed probe exits 1 (module doc)."""
    from eagle3ops.config.pipeline import PipelineConfigError
    from eagle3ops.stages.chatdata import ChatDataError
    from eagle3ops.stages.manifest import StageInputError
    from eagle3ops.stages.prepare import UnmaskableConversation
    from eagle3ops.stages.chunkplan import ChunkPlanError
    from eagle3ops.stages.trainplan import TrainPlanError

    try:
        config = _config(run_dir)
        if _already_done(stage, run_dir, config, kwargs):
            return
        found = _stage_function(stage)
        if found is not None:
            function, takes_options = found
            function(run_dir, config, log=_log, **(kwargs if takes_options else {}))  # type: ignore[operator]
    except (PipelineConfigError, StageInputError, ChatDataError, UnmaskableConversation, TrainPlanError,
            ChunkPlanError) as exc:
        print(f"error: stage {stage}: {exc}", file=sys.stderr, flush=True)
        raise typer.Exit(2) from exc
    except Exception as exc:
        from eagle3ops.patches.probekit import ProbeFailed

        if not isinstance(exc, ProbeFailed):
            raise
        print(f"error: stage probe FAILED: {exc}. Do not start a long extraction on this host/image until the "
              f"patched speculators matches the reference (see {run_dir}/probe/report.json; "
              f"`eagle3ops patch probe` probes the patch series).", file=sys.stderr, flush=True)
        raise typer.Exit(1) from exc


@app.command()
def prepare(run_dir: RunDir) -> None:
    """Tokenize the chat datasets with the target's chat template; loss masks over assistant turns."""
    _run("prepare", run_dir)


@app.command()
def extract(
    run_dir: RunDir,
    restart: Annotated[bool, typer.Option(help="Delete earlier extract output instead of resuming it.")] = False,
    shard: Annotated[str | None, typer.Option(help="START:END: only samples [START, END) (a fleet run's shard); "
                                              "its manifest is extract/shards/START-END.json. A scheduler's task "
                                              "gives it as EAGLE3OPS_SHARD_RANGES/_COUNT/_INDEX instead (eagle3ops "
                                              "render).")] = None,
) -> None:
    """Hidden states of the target (3 aux layers + last layer) with speculators' VllmHiddenStatesGenerator."""
    from eagle3ops.stages.shards import resolve_shard

    try:  # --shard or the scheduler task's variables: one range, one code path from here on
        rng = resolve_shard(shard, os.environ)
    except ValueError as exc:
        print(f"error: stage extract: {exc}", file=sys.stderr, flush=True)
        raise typer.Exit(2) from exc
    _run("extract", run_dir, restart=restart, shard=rng)


@app.command()
def merge(run_dir: RunDir) -> None:
    """The shards of a scheduler's run (EAGLE3OPS_SHARD_RANGES/_COUNT, as `eagle3ops render` sets them) merged into
    extract/manifest.json, checked against prepare's samples: what train reads. Refuses shards not finished."""
    from eagle3ops.stages.shards import ranges_from_env

    try:
        ranges = ranges_from_env(os.environ)
        if ranges is None:
            raise ValueError("EAGLE3OPS_SHARD_RANGES is not set: stage merge merges the shards `eagle3ops render` "
                             "names in it (with EAGLE3OPS_SHARD_COUNT)")
    except ValueError as exc:
        print(f"error: stage merge: {exc}", file=sys.stderr, flush=True)
        raise typer.Exit(2) from exc
    _run("merge", run_dir, ranges=ranges)


@app.command()
def vocab(run_dir: RunDir) -> None:
    """d2t/t2d draft vocabulary from token frequencies of the prepared data."""
    _run("vocab", run_dir)


@app.command()
def train(
    run_dir: RunDir,
    restart: Annotated[bool, typer.Option(help="Redo from scratch instead of resuming from earlier checkpoints; a finished output is replaced only once the new one is complete.")] = False,
    stop_after: Annotated[
        int | None, typer.Option(min=1, help="Stop after this many steps with a checkpoint (a rerun resumes).")
    ] = None,
    nodes: Annotated[int, typer.Option(min=1, help="Nodes of a multi-node run (each runs this command with its "
                                       "own --node-rank).")] = 1,
    node_rank: Annotated[int, typer.Option(min=0, help="This node's rank (0 = the node that writes the outputs "
                                           "and holds the rendezvous).")] = 0,
    rendezvous: Annotated[str | None, typer.Option(help="HOST:PORT of node 0's rendezvous (torchrun "
                                                   "--master-addr/--master-port); needed with --nodes > 1.")] = None,
) -> None:
    """Train the EAGLE-3 draft head (speculators); resumable checkpoints and a vLLM-loadable final one.

    Processes: ``train.nproc`` / ``$EAGLE3OPS_TRAIN_NPROC`` (default one per GPU); more than one runs under
    torchrun with FSDP2 (NCCL on GPUs, gloo on CPU). ``--nodes N --node-rank R --rendezvous HOST:PORT``: this
    node's share of an N-node run (torchrun's static rendezvous on node 0).
    """
    from eagle3ops.stages.trainplan import Nodes

    spec = None
    if nodes > 1 or rendezvous is not None:
        try:
            spec = Nodes(nodes, node_rank, rendezvous or "")
        except ValueError as exc:
            print(f"error: stage train: {exc}", file=sys.stderr, flush=True)
            raise typer.Exit(2) from exc
    _run("train", run_dir, restart=restart, stop_after=stop_after, nodes=spec)


@app.command()
def chunked(
    run_dir: RunDir,
    restart: Annotated[bool, typer.Option(help="Plan again and train from scratch (the recorded plan is kept "
                                          "otherwise).")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan (chunks, passes, disk) and stop.")] = False,
) -> None:
    """Extract and train chunk by chunk when the hidden states do not fit (pipeline.yaml `chunks`): per epoch and
    chunk, extract it, train its steps, delete its hidden states."""
    _run("chunked", run_dir, restart=restart, dry_run=dry_run)


@app.command()
def probe(
    run_dir: RunDir,
    num_seqs: Annotated[int, typer.Option(min=41, help="Sequences in the probe batch (two generate() calls; > 40).")] = 48,
    max_num_batched_tokens: Annotated[
        int, typer.Option(min=32, help="vLLM per-step token budget for the probe (small: prompts are chunked).")
    ] = 256,
    seed: Annotated[int, typer.Option(help="Seed for sequence lengths (and ids without prepare/).")] = 0,
) -> None:
    """Hidden-state correctness probe: vLLM extraction vs a transformers forward (same layers, dtype).

    Run before a long extraction; exit 1 when the per-token errors exceed the stated tolerance.
    """
    _run("probe", run_dir, num_seqs=num_seqs, max_num_batched_tokens=max_num_batched_tokens, seed=seed)
