"""The command lines of ``eagle3ops cycle``'s steps (pure, no I/O): each step that an existing command already does
is that command, run by the driver as a child process of this interpreter (``python -m eagle3ops ...``), so the
cycle adds no second copy of its orchestration, and ``--dry-run`` can print exactly what each step will run.

Every builder returns a :class:`~eagle3ops.commands.types.Change` (the step changes hosts); the inventory file is
named on every line, so the child reads the same hosts the plan was made from.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from eagle3ops.commands.types import Change, Read

__all__ = ["eagle3ops", "extract", "regenerate", "regenerated_manifests", "report", "speculate", "train", "weights"]


def eagle3ops(words: Sequence[str], inventory: Path | str, python: str | None = None) -> Change:
    """``<python> -m eagle3ops WORDS... --inventory FILE`` (``python``: default this interpreter, so the child runs
    the same eagle3ops as the driver)."""
    return Change([python or sys.executable, "-m", "eagle3ops", *words, "--inventory", str(inventory)])


def regenerate(production: str, run: str, inventory: Path | str, datasets: Sequence[Path | str], *,
               held_out: float | None = None, limit: int | None = None, out: Path | str | None = None,
               truncated: str = "error") -> Change:
    """``regenerate PRODUCTION --run RUN --dataset D... --truncated T`` (answers on production's live serving; no
    restart)."""
    words = ["regenerate", production, "--run", run, "--truncated", truncated]
    for d in datasets:
        words += ["--dataset", str(d)]
    if held_out is not None:
        words += ["--held-out", repr(held_out)]
    if limit is not None:
        words += ["--limit", str(limit)]
    if out is not None:
        words += ["--out", str(out)]
    return eagle3ops(words, inventory)


def weights(work: str, production: str, inventory: Path | str, link_mbit: float) -> Change:
    """``weights WORK --from PRODUCTION --link-mbit N`` (verified, resumable; files already there are skipped)."""
    return eagle3ops(["weights", work, "--from", production, "--link-mbit", repr(float(link_mbit))], inventory)


def extract(work: Sequence[str], run: str, pipeline: Path | str, inventory: Path | str, merged: Path | str, *,
            dead: Sequence[str] = ()) -> Change:
    """``extract W... --run RUN --pipeline P --merged M [--dead D]...`` (one host: its window; several: the fleet
    run, sharded; a host with ``serving: none`` stops nothing)."""
    words = ["extract", *work, "--run", run, "--pipeline", str(pipeline)]
    if len(work) > 1:
        words += ["--merged", str(merged)]
        for d in dead:
            words += ["--dead", d]
    return eagle3ops(words, inventory)


def train(host: str, run: str, pipeline: Path | str, inventory: Path | str, merged: Path | str | None) -> Change:
    """``train HOST --run RUN --pipeline P [--from-fleet M]`` (vocab + train; ``merged``: the fleet extract's
    merged manifest, whose hidden states on other hosts are copied to HOST first)."""
    words = ["train", host, "--run", run, "--pipeline", str(pipeline)]
    if merged is not None:
        words += ["--from-fleet", str(merged)]
    return eagle3ops(words, inventory)


def speculate(production: str, run: str, head_host: str, inventory: Path | str,
              prompts_file: Path | str | None = None) -> Change:
    """``speculate PRODUCTION --run RUN --head HEAD_HOST:RUN [--prompts-file F --with-humaneval]``: the head fetched
    from the work host and verified by sha256 on arrival, then the speed gate (keep or roll back)."""
    words = ["speculate", production, "--run", run, "--head", f"{head_host}:{run}"]
    if prompts_file is not None:
        words += ["--prompts-file", str(prompts_file), "--with-humaneval"]
    return eagle3ops(words, inventory)


def report(production: str, run: str, inventory: Path | str) -> Change:
    """``report PRODUCTION --run RUN`` (reads only; written locally)."""
    return eagle3ops(["report", production, "--run", run], inventory)


def regenerated_manifests(data_dir: str) -> Read:
    """Every run's ``regenerated/dataset.manifest.json`` under ``<data_dir>/runs``, concatenated (the regenerate
    rates this host recorded; parsed by :func:`eagle3ops.speculate.restarts.parse_results`)."""
    return Read(["find", f"{data_dir}/runs", "-mindepth", "3", "-maxdepth", "3", "-type", "f", "-path",
                 "*/regenerated/dataset.manifest.json", "-exec", "cat", "{}", "+"])
