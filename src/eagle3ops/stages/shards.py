"""One shard of the extract stage: samples ``[start, end)`` of ``prepare/samples.jsonl`` (global indices),
what the fleet's windows pass as ``eagle3ops stage extract --run-dir DIR --shard START:END``.

A shard writes its hidden-state files into the run's usual ``extract/`` directory (named by global index, so a shard
writes the same files wherever it runs, and shards on one host share ``progress.jsonl``), and ends with its own
manifest at ``extract/shards/<start>-<end>.json`` (:func:`manifest_rel`) instead of ``extract/manifest.json``: the
same fields as a one-host extract manifest, its ``sample_files``/``files`` only for its range, plus ``shard``
(``{start, end}``) and ``prepare_files`` (the prepare manifest's ``files``: the content digests of the samples it was
cut from, which :mod:`eagle3ops.stages.merge` compares across hosts; the prepare manifests themselves differ by their
``created`` time). The real stage (:mod:`eagle3ops.stages.extract`) and the stand-in stages of the venv tests both use
these helpers. Pure apart from reading/writing the run directory; stdlib only.

A scheduler's task (``eagle3ops render slurm|k8s``) names its shard through the environment instead of ``--shard``:
``EAGLE3OPS_SHARD_RANGES`` (JSON ``[[start, end], ...]``, every task's range, contiguous from 0),
``EAGLE3OPS_SHARD_COUNT`` (their number) and ``EAGLE3OPS_SHARD_INDEX`` (this task's: Slurm's ``SLURM_ARRAY_TASK_ID``,
Kubernetes' job completion index). :func:`resolve_shard` turns either form into the same ``(start, end)``, which the
stage then runs exactly as a fleet window's ``--shard``. After every task,
:func:`eagle3ops.stages.merge.merge_into_run` (``stage merge``) writes the shards' manifests as the run's one
``extract/manifest.json``, the input the train stage reads.

Tasks of one run directory on a shared filesystem append to one ``progress.jsonl`` (one ``write`` a line,
``O_APPEND``); where the filesystem does not make appends atomic (NFS) a line may be lost or torn: it is skipped on
resume and that sample extracted again. Each shard's manifest lists its own samples from its own records, so the
result is unaffected.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from eagle3ops.stages.manifest import MANIFEST, StageInputError, done_status, stage_dir, write_manifest

@dataclass(frozen=True)
class Shard:
    """Samples ``[start, end)`` of ``prepare/samples.jsonl`` (global indices ``i``), extracted by ``host``; ``rank`` is
    the host's position on the command line (a scheduler task's index). The fleet cuts them
    (:func:`eagle3ops.fleet.shard.shard_ranges`); the stages merge them (:mod:`eagle3ops.stages.merge`)."""

    rank: int
    host: str
    start: int
    end: int

    @property
    def samples(self) -> int:
        """Number of samples in the shard (``end - start``; 0 when the fleet has more hosts than samples)."""
        return self.end - self.start

    def as_dict(self) -> dict[str, object]:
        """The shard as recorded in the fleet plan (JSON)."""
        return {"rank": self.rank, "host": self.host, "start": self.start, "end": self.end}


#: Folder of the shard manifests, inside ``extract/``.
SHARD_DIR = "shards"
#: The variables ``render`` sets on a scheduler's tasks (module doc).
ENV_RANGES, ENV_COUNT, ENV_INDEX = "EAGLE3OPS_SHARD_RANGES", "EAGLE3OPS_SHARD_COUNT", "EAGLE3OPS_SHARD_INDEX"


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


def _int(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except KeyError:
        raise ValueError(f"{name} is not set: a scheduler task names its shard by {ENV_RANGES}, {ENV_COUNT} and "
                         f"{name} (as `eagle3ops render slurm|k8s` writes them), or pass --shard START:END") from None
    except ValueError:
        raise ValueError(f"{name} {environ[name]!r} is not an integer") from None



def uncovered(ranges: list[tuple[int, int]]) -> tuple[int, int] | None:
    """Where ``[start, end)`` ``ranges``, in order, stop being contiguous from 0 (pure): ``(end of the one before, 0
    first; start of the one that does not begin there)`` at the first range that begins elsewhere or ends before it
    starts; None when they are contiguous (an empty list is)."""
    at = 0
    for start, end in ranges:
        if start != at or end < start:
            return at, start
        at = end
    return None

def ranges_from_env(environ: Mapping[str, str]) -> list[tuple[int, int]] | None:
    """Every task's ``(start, end)`` from :data:`ENV_RANGES`, checked against :data:`ENV_COUNT`; None when
    :data:`ENV_RANGES` is not set.

    Raises:
        ValueError: not JSON pairs of integers, not contiguous from 0, or another count (the message names the
            variable).
    """
    text = environ.get(ENV_RANGES)
    if text is None:
        return None
    try:
        raw = json.loads(text)
        ranges = [(int(a), int(b)) for a, b in raw]
    except (ValueError, TypeError):
        raise ValueError(f"{ENV_RANGES} {text!r}: write JSON [[start, end], ...], e.g. [[0,4],[4,7]]") from None
    if uncovered(ranges) is not None:
        raise ValueError(f"{ENV_RANGES} {text}: the ranges must be contiguous from 0, each end >= its start "
                         f"(render them with `eagle3ops render`)")
    count = _int(environ, ENV_COUNT)
    if count != len(ranges):
        raise ValueError(f"{ENV_COUNT} {count} but {ENV_RANGES} lists {len(ranges)} ranges: render the run again")
    return ranges


def resolve_shard(option: str | None, environ: Mapping[str, str]) -> tuple[int, int] | None:
    """The extract stage's shard: ``--shard START:END`` (``option``), else the task's range from the environment
    (:data:`ENV_RANGES` at :data:`ENV_INDEX`), else None (the whole run). Both forms give the same tuple, which the
    stage runs one way.

    Raises:
        ValueError: a malformed option or variable, an index outside the ranges, or ``--shard`` and the
            environment naming different ranges (the message names the variable and the fix).
    """
    shard = parse_shard(option) if option is not None else None
    ranges = ranges_from_env(environ)
    if ranges is None:
        return shard
    index = _int(environ, ENV_INDEX)
    if not 0 <= index < len(ranges):
        raise ValueError(f"{ENV_INDEX} {index}: the task index must be in 0..{len(ranges) - 1} ({len(ranges)} "
                         f"ranges in {ENV_RANGES})")
    mine = ranges[index]
    if shard is not None and shard != mine:
        raise ValueError(f"--shard {option} but {ENV_INDEX} {index} of {ENV_RANGES} is {mine[0]}:{mine[1]}: give "
                         f"one of them")
    return mine
