"""Per-host extract manifests → one run manifest, and the check made before training trusts it (pure, but for
:func:`merge_into_run`, ``stage merge``, which reads and writes one run directory).

Each shard of a fleet run (:mod:`eagle3ops.fleet.shard`) ends with its host's ``extract/manifest.json`` (the stage's
own, :mod:`eagle3ops.stages.extract`): ``sample_files`` (``{i, file, tokens}`` per sample, ``i`` the global index of
``prepare/samples.jsonl``), ``files`` (``{file: {bytes, sha256}}``), counts, token totals, ``config_digest``,
``inputs`` (the prepare manifest's sha256), layer ids and shapes. :func:`merge_manifests` checks that the shards
agree on everything that must be equal and cover their ranges exactly, and returns one manifest of the same shape
as a one-host run's (same ``sample_files`` and ``files`` for the same samples: the files are named by global index),
plus ``fleet.shards``: each shard's host, range, counts and the sha256 of its manifest. :func:`check_merged` is the
check before training: the merged manifest covers every prepared sample, with the prepare manifest's token total.

Shards of a fleet run (``--shard``, :mod:`eagle3ops.stages.shards`) each prepared on their own host: their prepare
manifests differ by ``created``, so such shards are compared on ``prepare_files`` (the content digests of the prepared
samples) instead of ``inputs``; :func:`check_merged` then checks those digests against the training host's prepare
manifest, and :func:`bind_inputs` names that manifest in the merged one's ``inputs`` (what training checks).

A scheduler's run (``eagle3ops render slurm|k8s``) has every task's shard in one run directory on a shared filesystem;
``stage merge`` (:func:`merge_into_run`) merges them the same way into that directory's ``extract/manifest.json``.
Here with the in-image stages (below the fleet), so the stage and the fleet's driver share one merge.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from eagle3ops.stages.manifest import MANIFEST, StageInputError, atomic_write_text, stage_dir
from eagle3ops.stages.shards import Shard, finished_shard, manifest_path

#: Fields every shard's manifest must share with the others (the same target, settings, inputs and layout).
SHARED = ("config_digest", "inputs", "dtype", "hidden_size", "num_layers", "aux_layer_ids", "layer_ids",
          "hidden_bytes_per_token", "engine", "layer_convention")
#: Fields summed over shards.
SUMMED = ("samples", "tokens", "hidden_bytes", "file_bytes")


class MergeError(ValueError):
    """Shard manifests that cannot make one run manifest, or a merged manifest that does not match the prepared
    samples; the message names the shard, its host, the field and the fix (rerun that shard)."""


def _complete_manifest(text: str | None, where: str, fix: str) -> dict[str, Any]:
    """A shard's extract manifest from its text.

    Raises:
        MergeError: no manifest (the shard has not finished), not JSON, or not a complete extract manifest.
    """
    if text is None:
        raise MergeError(f"{where}: no extract manifest (the shard has not finished); {fix}")
    try:
        m = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MergeError(f"{where}: extract manifest is not JSON ({exc}); {fix}") from None
    if m.get("stage") != "extract" or m.get("status") != "complete":
        raise MergeError(f"{where}: not a complete extract manifest; {fix}")
    return m


def _shard_tokens(m: dict[str, Any], s: Shard, where: str, fix: str) -> int:
    """The tokens of shard ``s``'s samples, its manifest ``m`` checked to list exactly samples ``[start, end)`` in
    order with the counts it states.

    Raises:
        MergeError: other samples, or counts that disagree with the sample list.
    """
    ids = [int(r["i"]) for r in m.get("sample_files", [])]
    if ids != list(range(s.start, s.end)):
        got = f"{len(ids)} samples" + (f" [{ids[0]}..{ids[-1]}]" if ids else "")
        raise MergeError(f"{where}: manifest lists {got}, expected exactly samples {s.start}..{s.end - 1} in "
                         f"order; {fix}")
    tokens = sum(int(r["tokens"]) for r in m["sample_files"])
    if m.get("samples") != s.samples or m.get("tokens") != tokens:
        raise MergeError(f"{where}: manifest says {m.get('samples')} samples / {m.get('tokens')} tokens, its "
                         f"sample list has {s.samples} / {tokens}; {fix}")
    return tokens


def merge_manifests(shards: list[Shard], texts: dict[int, str]) -> dict[str, Any]:
    """One extract manifest for the run from each shard's ``manifest.json`` text (by shard rank).

    Raises:
        MergeError: a shard's manifest is missing or not complete, a shared field differs from shard 0's, its samples
            are not exactly its range ``[start, end)`` in order, a file is listed twice or a sample's file is not
            listed, or its counts disagree with its samples.
    """
    if not shards:
        raise MergeError("no shard to merge")
    ordered = sorted(shards, key=lambda s: s.start)
    merged: dict[str, Any] = {}
    files: dict[str, Any] = {}
    sample_files: list[dict[str, Any]] = []
    recorded: list[dict[str, Any]] = []
    expect_start = 0
    for s in ordered:
        where = f"shard {s.rank} (samples [{s.start}, {s.end}) on {s.host})"
        fix = f"rerun extract for {where}"
        if s.start != expect_start:
            raise MergeError(f"{where}: shards leave samples [{expect_start}, {s.start}) uncovered or overlap; "
                             f"the plan's shards must be contiguous from 0")
        expect_start = s.end
        if s.samples == 0:
            recorded.append({**s.as_dict(), "samples": 0, "tokens": 0, "manifest_sha256": None})
            continue
        text = texts.get(s.rank)
        m = _complete_manifest(text, where, fix)
        shared = [k for k in SHARED if k != "inputs" or "prepare_files" not in m] + (
            ["prepare_files"] if "prepare_files" in m else [])
        if not merged:
            merged = {k: m.get(k) for k in shared}
        for k in shared:
            if m.get(k) != merged[k]:
                raise MergeError(f"{where}: `{k}` is {m.get(k)!r}, shard {ordered[0].rank}'s is {merged[k]!r}: the "
                                 f"shards were extracted from other inputs or settings; {fix} with the run's "
                                 f"pipeline.yaml")
        tokens = _shard_tokens(m, s, where, fix)
        for name, entry in (m.get("files") or {}).items():
            if name in files:
                raise MergeError(f"{where}: file {name} is also listed by an earlier shard; {fix}")
            files[name] = entry
        missing = [r["file"] for r in m["sample_files"] if r["file"] not in files]
        if missing:
            raise MergeError(f"{where}: sample file(s) {missing[:3]} not in the manifest's `files`; {fix}")
        sample_files += m["sample_files"]
        for k in SUMMED:
            merged[k] = merged.get(k, 0) + int(m.get(k) or 0)
        recorded.append({**s.as_dict(), "samples": s.samples, "tokens": tokens,
                         "manifest_sha256": hashlib.sha256(text.encode()).hexdigest()})
    merged.update(stage="extract", status="complete", files=files, sample_files=sample_files,
                  fleet={"shards": sorted(recorded, key=lambda r: r["rank"])})
    for k in SUMMED:
        merged.setdefault(k, 0)
    return merged


def check_merged(merged: dict[str, Any], prepare_manifest_text: str) -> None:
    """The check before training: the merged manifest covers every prepared sample once, with the prepare
    manifest's token total, and was made from that prepare manifest.

    Raises:
        MergeError: another prepare manifest, samples missing or extra, or another token total (names the fix).
    """
    prep = json.loads(prepare_manifest_text)
    sha = hashlib.sha256(prepare_manifest_text.encode()).hexdigest()
    got = (merged.get("inputs") or {}).get("prepare")
    if "prepare_files" in merged:  # shards prepared on several hosts: compared by the samples' content
        if merged["prepare_files"] != prep.get("files"):
            raise MergeError(f"merged extract manifest was made from prepared samples {merged['prepare_files']}, "
                             f"this host's prepare manifest lists {prep.get('files')}: the hosts prepared other "
                             f"samples (another dataset, chat template or tokenizer); make their inputs equal and "
                             f"rerun the fleet extract with --restart")
    elif got != sha:
        raise MergeError(f"merged extract manifest was made from prepare manifest {got}, the run's is {sha}: the "
                         f"shards extracted other samples; rerun the fleet extract with --restart")
    ids = [int(r["i"]) for r in merged.get("sample_files", [])]
    if ids != list(range(int(prep["samples"]))):
        raise MergeError(f"merged extract manifest lists {len(ids)} samples, prepare has {prep['samples']} "
                         f"(indices 0..{int(prep['samples']) - 1} once each): a shard is missing or overlaps; "
                         f"rerun the missing shards")
    if merged.get("tokens") != prep.get("tokens"):
        raise MergeError(f"merged extract manifest has {merged.get('tokens')} tokens, prepare has "
                         f"{prep.get('tokens')}: a shard extracted other token ids; rerun the fleet extract with "
                         f"--restart")


def bind_inputs(merged: dict[str, Any], prepare_manifest_text: str) -> dict[str, Any]:
    """The merged manifest with ``inputs.prepare`` naming ``prepare_manifest_text`` (the sha256 of the training host's
    prepare manifest, as a one-host extract manifest names its own), after :func:`check_merged` passed for it."""
    return {**merged, "inputs": {"prepare": hashlib.sha256(prepare_manifest_text.encode()).hexdigest()}}


def merge_into_run(run_dir: Path, config: Any, ranges: list[tuple[int, int]], log: Any = print) -> dict[str, Any]:
    """``stage merge``: every range's shard manifest (each finished for the run's current inputs) merged into the
    run's ``extract/manifest.json`` (:func:`merge_manifests`), checked against the run's
    prepare manifest (``check_merged``) and naming it as its input (``bind_inputs``): the train stage then reads the
    run as a one-host extract. The text is deterministic (no time in it); an equal manifest already on disk is left
    untouched, so a train made from it stays current. Returns the merged manifest.

    Raises:
        StageInputError: a shard not finished (names its ranges and the fix: rerun those tasks), or the merge
            refused by :func:`merge_manifests` or :func:`check_merged` (their message).
    """
    shards = [Shard(k, f"task {k}", a, b) for k, (a, b) in enumerate(ranges)]
    missing = [s for s in shards if s.samples and finished_shard(run_dir, config, (s.start, s.end)) is None]
    if missing:
        names = ", ".join(f"{s.rank} ([{s.start}, {s.end}): {manifest_path(run_dir, (s.start, s.end))})"
                          for s in missing)
        raise StageInputError(f"the extract of task(s) {names} has not finished for these inputs; "
                              f"rerun those extract tasks (they resume), then merge")
    texts = {s.rank: manifest_path(run_dir, (s.start, s.end)).read_text() for s in shards if s.samples}
    prep = (stage_dir(run_dir, "prepare") / MANIFEST).read_text()
    try:
        merged = merge_manifests(shards, texts)
        check_merged(merged, prep)
    except MergeError as exc:
        raise StageInputError(str(exc)) from exc
    merged = bind_inputs(merged, prep)
    text = json.dumps(merged, indent=2, sort_keys=True) + "\n"
    path = stage_dir(run_dir, "extract") / MANIFEST
    if path.is_file() and path.read_text() == text:
        log(f"merge: {path} already holds these {len(shards)} shards ({merged['samples']} samples)")
    else:
        atomic_write_text(path, text)
        log(f"merge: {len(shards)} shards, {merged['samples']} samples, {merged['tokens']} tokens -> {path}")
    return merged
