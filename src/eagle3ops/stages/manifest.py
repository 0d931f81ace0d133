"""Stage manifests: what a stage produced, and the checks a later stage makes before it trusts it.

Each stage writes ``<run_dir>/<stage>/manifest.json`` as its last act (atomically: temp file + rename), so a
manifest exists only for a stage that finished. A manifest holds:

- ``stage``, ``status: "complete"``, ``created``, ``eagle3ops_version``;
- ``config_digest``: sha256 of the pipeline config sections the stage depends on (see ``STAGE_SECTIONS``);
- ``inputs``: ``{stage: sha256 of that stage's manifest.json}`` for each input stage;
- ``files``: ``{relative path: {"bytes": n, "sha256": hex}}`` of what it wrote;
- stage-specific figures (counts, tokens, shapes, dtype, wall time).

A stage refuses to start (``StageInputError``, naming the file and the stage to rerun) when an input's
manifest is missing, unreadable, not complete, made with different config sections, made from other inputs
than its own inputs now are, or lists a file that is missing or has another size.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from eagle3ops import __version__
from eagle3ops.config.pipeline import PipelineConfig

MANIFEST = "manifest.json"
STAGES = ("prepare", "extract", "vocab", "train")

# Pipeline config sections each stage's output depends on (a change there makes its output stale).
STAGE_SECTIONS: dict[str, tuple[str, ...]] = {
    "prepare": ("target_model", "seed", "prepare"),
    "extract": ("target_model", "extract"),
    "vocab": ("target_model", "vocab"),
    "train": ("target_model", "seed", "train"),
    # stage chunked writes no manifest of its own: it is done when train is (done_status)
    "chunked": ("target_model", "seed", "train"),
}
STAGE_INPUTS: dict[str, tuple[str, ...]] = {
    "prepare": (),
    "extract": ("prepare",),
    "vocab": ("prepare",),
    "train": ("extract", "vocab"),
    "chunked": ("prepare", "vocab"),
}


def _ancestors(stage: str) -> list[str]:
    out: list[str] = []
    for s in STAGE_INPUTS[stage]:
        for a in [*_ancestors(s), s]:
            if a not in out:
                out.append(a)
    return [a for a in out if a != stage]


class StageInputError(Exception):
    """An input of a stage is missing or inconsistent; the message names the file and the stage to rerun."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 (hex) of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_entry(path: Path) -> dict[str, Any]:
    """``{"bytes": size, "sha256": hex}`` for one output file."""
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same directory and ``os.replace``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def stage_dir(run_dir: Path, stage: str) -> Path:
    """``<run_dir>/<stage>``."""
    return Path(run_dir) / stage


def rerun_hint(run_dir: Path, stage: str) -> str:
    """The command that (re)makes ``stage`` for ``run_dir``."""
    return f"python -m eagle3ops stage {stage} --run-dir {run_dir}"


def write_manifest(
    run_dir: Path, stage: str, config: PipelineConfig, files: dict[str, dict[str, Any]], *, name: str = MANIFEST,
    **extra: Any
) -> Path:
    """Write ``<run_dir>/<stage>/manifest.json`` (atomically) and return its path.

    ``files`` maps paths relative to the stage directory to ``file_entry`` dicts; ``extra`` holds the
    stage-specific figures. Input digests are taken from the input manifests now on disk. ``name``: another path
    relative to the stage directory (an extract shard's manifest, :mod:`eagle3ops.stages.shards`).
    """
    inputs = {s: sha256_file(stage_dir(run_dir, s) / MANIFEST) for s in STAGE_INPUTS[stage]}
    data = {
        "stage": stage,
        "status": "complete",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "eagle3ops_version": __version__,
        "config_digest": config.section_digest(*STAGE_SECTIONS[stage]),
        "inputs": inputs,
        "files": files,
        **extra,
    }
    path = stage_dir(run_dir, stage) / name
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def read_manifest(run_dir: Path, stage: str, *, for_stage: str) -> dict[str, Any]:
    """Load ``<run_dir>/<stage>/manifest.json`` for use by ``for_stage`` (no consistency checks).

    Raises:
        StageInputError: missing, unreadable or not ``complete``.
    """
    path = stage_dir(run_dir, stage) / MANIFEST
    hint = rerun_hint(run_dir, stage)
    if not path.is_file():
        raise StageInputError(
            f"stage {for_stage}: input manifest {path} is missing; stage `{stage}` has not finished. Run: {hint}"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StageInputError(f"stage {for_stage}: cannot read {path} ({exc}); rerun stage `{stage}`: {hint}") from exc
    if not isinstance(data, dict) or data.get("stage") != stage or data.get("status") != "complete":
        raise StageInputError(
            f"stage {for_stage}: {path} is not a complete manifest of stage `{stage}`; rerun it: {hint}"
        )
    return data


def check_inputs(
    run_dir: Path, for_stage: str, config: PipelineConfig, *, hash_files: bool = False,
    wanted: Callable[[str, str], bool] | None = None,
) -> dict[str, dict[str, Any]]:
    """Check every input manifest of ``for_stage`` and return them by stage name.

    Checks, per input stage: the manifest exists and is complete; its ``config_digest`` equals the digest of
    the current ``pipeline.yaml`` sections it depends on; its own inputs are the manifests now on disk (so
    extract and vocab were made from the same prepare output); each listed file exists with the listed size,
    and with the listed sha256 when ``hash_files`` is true. ``wanted(stage, rel)``, when given, limits the file
    checks to the files it accepts (a node of a multi-node train holds only its own shards' hidden states).

    Raises:
        StageInputError: naming the file, what is wrong and the stage to rerun.
    """
    run_dir = Path(run_dir)
    out: dict[str, dict[str, Any]] = {}
    for stage in STAGE_INPUTS[for_stage]:
        data = read_manifest(run_dir, stage, for_stage=for_stage)
        path = stage_dir(run_dir, stage) / MANIFEST
        hint = rerun_hint(run_dir, stage)
        want = config.section_digest(*STAGE_SECTIONS[stage])
        if data.get("config_digest") != want:
            raise StageInputError(
                f"stage {for_stage}: {path} was made with other settings of "
                f"{', '.join(STAGE_SECTIONS[stage])} than {run_dir / 'pipeline.yaml'} has now; rerun stage "
                f"`{stage}`: {hint}"
            )
        for ancestor in _ancestors(stage):
            anc_path = stage_dir(run_dir, ancestor) / MANIFEST
            try:
                anc_digest = json.loads(anc_path.read_text()).get("config_digest")
            except (OSError, json.JSONDecodeError):
                anc_digest = None
            if anc_digest != config.section_digest(*STAGE_SECTIONS[ancestor]):
                raise StageInputError(
                    f"stage {for_stage}: {anc_path} (input of `{stage}`) is missing or was made with other settings "
                    f"of {', '.join(STAGE_SECTIONS[ancestor])} than {run_dir / 'pipeline.yaml'} has now; rerun "
                    f"stage `{ancestor}` and the stages after it, first: {rerun_hint(run_dir, ancestor)}"
                )
        for upstream, digest in (data.get("inputs") or {}).items():
            upstream_path = stage_dir(run_dir, upstream) / MANIFEST
            if not upstream_path.is_file() or sha256_file(upstream_path) != digest:
                raise StageInputError(
                    f"stage {for_stage}: {path} was made from another `{upstream}` output than "
                    f"{upstream_path} now describes; rerun stage `{stage}`: {hint}"
                )
        for rel, entry in (data.get("files") or {}).items():
            if wanted is not None and not wanted(stage, rel):
                continue
            f = stage_dir(run_dir, stage) / rel
            if not f.is_file():
                raise StageInputError(
                    f"stage {for_stage}: {f}, listed in {path}, is missing; rerun stage `{stage}`: {hint}"
                )
            if f.stat().st_size != entry["bytes"]:
                raise StageInputError(
                    f"stage {for_stage}: {f} has {f.stat().st_size} bytes, {path} lists {entry['bytes']}; "
                    f"rerun stage `{stage}`: {hint}"
                )
            if hash_files and sha256_file(f) != entry["sha256"]:
                raise StageInputError(
                    f"stage {for_stage}: {f} does not match the sha256 in {path}; rerun stage `{stage}`: {hint}"
                )
        out[stage] = data
    # extract and vocab must both come from the prepare output now on disk (checked above per input); and
    # train's two inputs must agree with each other on it.
    return out


def done_status(stage: str, config: PipelineConfig, manifests: dict[str, str | None]) -> tuple[bool, str]:
    """Whether ``stage`` is finished for exactly these inputs, judged from manifest texts alone (pure, so the
    driver can decide it from files read over SSH before a window stops serving).

    Args:
        stage: one of :data:`STAGES`.
        config: the run's pipeline config now.
        manifests: ``{stage: text of <run_dir>/<stage>/manifest.json, or None when absent}`` for ``stage`` and
            every stage before it (:func:`_ancestors`).

    Returns:
        ``(True, why)`` when the manifests of ``stage`` and of every stage it depends on are complete, made with
        the current config sections, and each made from the input manifests now on disk (byte for byte, by
        sha256); else ``(False, why not)``.
    """
    if stage == "chunked":  # a chunked run is done when its train is (stage chunked's last pass writes train/)
        return done_status("train", config, manifests)
    for s in [*_ancestors(stage), stage]:
        text = manifests.get(s)
        if text is None:
            return False, f"{s}: not finished (no manifest)"
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return False, f"{s}: manifest unreadable"
        if data.get("stage") != s or data.get("status") != "complete":
            return False, f"{s}: manifest not complete"
        if data.get("config_digest") != config.section_digest(*STAGE_SECTIONS[s]):
            return False, f"{s}: made with other settings of {', '.join(STAGE_SECTIONS[s])}"
        for upstream in STAGE_INPUTS[s]:
            up = manifests.get(upstream)
            if up is None or hashlib.sha256(up.encode()).hexdigest() != (data.get("inputs") or {}).get(upstream):
                return False, f"{s}: made from another `{upstream}` output than the one on disk"
    created = json.loads(manifests[stage] or "{}").get("created", "?")
    return True, f"{stage}: already done for these inputs ({created})"


def restart_dir(run_dir: Path, stage: str) -> Path:
    """Where a ``--restart`` of ``stage`` builds its new output while the finished one stays in place:
    ``<run_dir>/.<stage>.restart`` (:func:`promote` swaps it in once complete)."""
    return Path(run_dir) / f".{stage}.restart"


def output_dir(run_dir: Path, stage: str, *, restart: bool) -> Path:
    """The directory a stage writes into. A ``--restart`` over an output that has a manifest builds a new one in
    :func:`restart_dir` (emptied first: a restart starts from scratch), so the finished output is replaced only once
    the new one is complete (:func:`promote`); otherwise :func:`stage_dir`, earlier partial output there discarded on
    restart. What an earlier :func:`promote` left to delete is deleted here."""
    import shutil

    shutil.rmtree(Path(run_dir) / f".{stage}.replaced", ignore_errors=True)
    final = stage_dir(run_dir, stage)
    if not restart:
        return final
    if (final / MANIFEST).is_file():
        staging = restart_dir(run_dir, stage)
        shutil.rmtree(staging, ignore_errors=True)
        return staging
    shutil.rmtree(final, ignore_errors=True)  # no finished output: nothing to keep
    return final


def promote(run_dir: Path, stage: str, out: Path) -> None:
    """Make ``out`` (complete, before its manifest is written) the stage's output: when it is the
    :func:`restart_dir`, the finished output is renamed aside, ``out`` renamed into place and the old one deleted
    (renames within the run directory: the old output stays whole until the new one is). A no-op for
    :func:`stage_dir` itself."""
    import shutil

    final = stage_dir(run_dir, stage)
    if Path(out) == final:
        return
    aside = Path(run_dir) / f".{stage}.replaced"
    shutil.rmtree(aside, ignore_errors=True)
    if final.exists():
        os.replace(final, aside)
    os.replace(out, final)
    shutil.rmtree(aside, ignore_errors=True)


def finished(run_dir: Path, stage: str, config: PipelineConfig) -> dict[str, Any] | None:
    """The manifest of ``stage`` when the stage is finished for exactly its current inputs and every file it
    lists is present with its size (:func:`done_status` plus the files); else None. A rerun of such a stage is a
    no-op: its finished output is never touched."""
    def text(s: str) -> str | None:
        path = stage_dir(run_dir, s) / MANIFEST
        return path.read_text() if path.is_file() else None

    ok, _why = done_status(stage, config, {s: text(s) for s in (*_ancestors(stage), stage)})
    if not ok:
        return None
    data = json.loads(text(stage) or "{}")
    for rel, entry in (data.get("files") or {}).items():
        f = stage_dir(run_dir, stage) / rel
        if not f.is_file() or f.stat().st_size != entry.get("bytes"):
            return None
    return data
