"""One shard of the extract stage (issue 29): samples ``[start, end)`` of ``prepare/samples.jsonl`` (global indices),
what the fleet's windows pass as ``eagle3ops stage extract --run-dir DIR --shard START:END``.

A shard writes its hidden-state files into the run's usual ``extract/`` directory (named by global index, so a shard
writes the same files wherever it runs, and shards on one host share ``progress.jsonl``), and ends with its own
manifest at ``extract/shards/<start>-<end>.json`` (:func:`manifest_rel`) instead of ``extract/manifest.json``: the
same fields as a one-host extract manifest, its ``sample_files``/``files`` only for its range, plus ``shard``
(``{start, end}``) and ``prepare_files`` (the prepare manifest's ``files``: the content digests of the samples it was
cut from, which :mod:`eagle3ops.fleet.merge` compares across hosts; the prepare manifests themselves differ by their
``created`` time). The real stage (:mod:`eagle3ops.stages.extract`) and the stand-in stages of the venv tests both use
these helpers. Pure apart from reading/writing the run directory; stdlib only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eagle3ops.stages.manifest import MANIFEST, StageInputError, done_status, stage_dir, write_manifest

#: Folder of the shard manifests, inside ``extract/``.
SHARD_DIR = "shards"


def parse_shard(text: str) -> tuple[int, int]:
    """``"START:END"`` → ``(start, end)``, ``0 <= start <= end``.

    Raises:
        ValueError: not two non-negative integers joined by ``:``, or ``end < start`` (the message shows the form).
    """
    a, sep, b = text.partition(":")
    try:
        start, end = int(a), int(b)
    except ValueError:
        start = end = -1
    if not sep or start < 0 or end < start:
        raise ValueError(f"--shard {text!r}: write START:END, two sample indices with 0 <= START <= END "
                         f"(END exclusive), e.g. --shard 0:334")
    return start, end


def manifest_rel(start: int, end: int) -> str:
    """The shard manifest's path relative to ``extract/``: ``shards/<start>-<end>.json``."""
    return f"{SHARD_DIR}/{start}-{end}.json"


def manifest_path(run_dir: Path, shard: tuple[int, int]) -> Path:
    """``<run_dir>/extract/shards/<start>-<end>.json``."""
    return stage_dir(run_dir, "extract") / manifest_rel(*shard)


def select(samples: list[dict[str, Any]], shard: tuple[int, int] | None) -> list[dict[str, Any]]:
    """The prepared rows of the shard (all of them for None), checked against the prepared count.

    Raises:
        StageInputError: the shard's end lies past the prepared samples (the fleet plan was cut from another count).
    """
    if shard is None:
        return samples
    start, end = shard
    if end > len(samples):
        raise StageInputError(f"stage extract: --shard {start}:{end} ends past the {len(samples)} prepared samples "
                              f"of prepare/samples.jsonl: the fleet plan was cut from another sample count; rerun "
                              f"the fleet extract so its shards are cut from the prepared count")
    rows = [s for s in samples if start <= int(s["i"]) < end]
    if [int(s["i"]) for s in rows] != list(range(start, end)):
        raise StageInputError(f"stage extract: prepare/samples.jsonl does not hold samples {start}..{end - 1} in "
                              f"order; rerun stage prepare")
    return rows


def prepare_files(run_dir: Path) -> dict[str, Any]:
    """The ``files`` (content digests) of the run's prepare manifest."""
    return json.loads((stage_dir(run_dir, "prepare") / MANIFEST).read_text()).get("files") or {}


def write_shard_manifest(run_dir: Path, config: Any, shard: tuple[int, int], files: dict[str, Any],
                         **figures: Any) -> Path:
    """Write the shard's manifest (:func:`manifest_path`, atomically; after its files) and return its path.

    ``files``: ``{relative path: {bytes, sha256}}`` of the shard's samples; ``figures``: the extract manifest's other
    fields (``sample_files`` and counts for the range only).
    """
    (stage_dir(run_dir, "extract") / SHARD_DIR).mkdir(parents=True, exist_ok=True)
    return write_manifest(run_dir, "extract", config, files, name=manifest_rel(*shard),
                          shard={"start": shard[0], "end": shard[1]}, prepare_files=prepare_files(run_dir),
                          **figures)


def finished_shard(run_dir: Path, config: Any, shard: tuple[int, int]) -> dict[str, Any] | None:
    """The shard's manifest when it is complete for exactly the run's current inputs (made with the current config
    sections, from the prepare manifest now on disk) and every file it lists is there with its size; else None.
    A rerun of such a shard is a no-op."""
    path = manifest_path(run_dir, shard)
    prep = stage_dir(run_dir, "prepare") / MANIFEST
    texts = {"prepare": prep.read_text() if prep.is_file() else None,
             "extract": path.read_text() if path.is_file() else None}
    ok, _why = done_status("extract", config, texts)
    if not ok:
        return None
    data = json.loads(texts["extract"] or "{}")
    if data.get("shard") != {"start": shard[0], "end": shard[1]}:
        return None
    for rel, entry in (data.get("files") or {}).items():
        f = stage_dir(run_dir, "extract") / rel
        if not f.is_file() or f.stat().st_size != entry.get("bytes"):
            return None
    return data
