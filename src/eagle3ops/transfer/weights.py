"""Weights and heads from one inventory host to another (the rented-host lifecycle): facts read from both
hosts, the pure plan (:mod:`eagle3ops.transfer.weightsplan`), then each file streamed through the driver —
OpenSSH reading the source (``tail -c +N``) into OpenSSH to the destination (:class:`eagle3ops.transfer.streams.SshStream`) —
appended to a ``.part`` file there, verified by sha256 on the receiving host and renamed into place. Never from a
hub: the only source is another inventory host."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eagle3ops import executor
from eagle3ops.commands import host as hc
from eagle3ops.commands import weights as wc
from eagle3ops.commands.ssh import openssh
from eagle3ops.transfer.errors import StreamStalled, TransferError
from eagle3ops.transfer.limits import STALL_S
from eagle3ops.transfer.sshconfig import write_ssh_config
from eagle3ops.transfer.streams import SshStream
from eagle3ops.transfer.weightsplan import (FileEntry, WeightsPlan, WeightsPlanError, head_digest, parse_hashes,
                                            parse_listing, parse_manifest, plan_copy, refresh, render_manifest, stale)

#: Hashing rate assumed for the bound on a host's sha256 pass (bytes/s), and the bound's floor (s).
HASH_BPS, HASH_FLOOR_S = 100e6, 300.0
#: Seconds the plan's estimate adds per file that moves: its two OpenSSH connections (source, destination) and the
#: sha256 on arrival; ~0.5 s a file measured on the sandbox test's 2-core machine (tests/test_weights_transfer.py).
PER_FILE_S = 0.5


class WeightsError(TransferError):
    """The copy was refused or failed; the message names the host, the file and what to do."""


def _hash_bound(n: int) -> float:
    return HASH_FLOOR_S + n / HASH_BPS


def read_source(r: Any, model_dir: str) -> tuple[dict[str, FileEntry], list[str], bool]:
    """The source's weights manifest, re-verified: (entries, files hashed again now, whether a manifest was recorded
    before). Files whose size and mtime match the record keep its sha256; the others are hashed on the host. Reads
    only: the refreshed manifest is written back by :func:`record_source_manifest`, under the source's lock.

    Raises:
        WeightsError: the source has no file under ``model_dir``, or its manifest is unreadable.
    """
    h = r.host
    listing, _ = parse_listing(r.run(wc.stat_listing(model_dir), check=False).stdout or "")
    if not listing:
        raise WeightsError(f"{h.name}: no file under {model_dir} (hosts.{h.name}.model_path): it cannot be the "
                           "source of the weights; name another host with --from")
    mpath = wc.manifest_path(h.state_dir)
    text = r.run(hc.cat_if_exists(mpath), check=False).stdout or ""
    try:
        recorded = parse_manifest(text, f"{h.name}:{mpath}") if text.strip() else {}
    except WeightsPlanError as e:
        raise WeightsError(str(e)) from None
    todo = stale(recorded, listing)
    hashes = {}
    if todo:
        n = sum(listing[p][0] for p in todo)
        hashes = parse_hashes(r.run(wc.hash_files(model_dir, todo), timeout=_hash_bound(n)).stdout)
    return refresh(recorded, listing, hashes), todo, bool(text.strip())


def record_source_manifest(r: Any, entries: dict[str, FileEntry]) -> None:
    """Write a source's refreshed weights manifest (:func:`read_source`'s entries) to its ``state_dir``: a change,
    made by the caller while it holds that host's lock."""
    mpath = wc.manifest_path(r.host.state_dir)
    r.run(hc.mkdir_p(os.path.dirname(mpath)))
    r.run(hc.write_file(mpath), stdin=render_manifest(entries))


def read_dest(r: Any, model_dir: str, src: dict[str, FileEntry]) -> tuple[dict[str, tuple[int, int]], dict[str, str],
                                                                           dict[str, int]]:
    """The destination's files (bytes, mtime), sha256 of those whose size matches the source's (from its own
    manifest when size and mtime still match, else hashed there now), and its partial files."""
    h = r.host
    files, parts = parse_listing(r.run(wc.stat_listing(model_dir), check=False).stdout or "")
    text = r.run(hc.cat_if_exists(wc.manifest_path(h.state_dir)), check=False).stdout or ""
    try:
        own = parse_manifest(text, h.name) if text.strip() else {}
    except WeightsPlanError:
        own = {}  # unreadable: hash what matters instead
    same_size = {p: v for p, v in files.items() if p in src and v[0] == src[p].size}
    trusted = {p: own[p].sha256 for p in same_size if p in own and (own[p].size, own[p].mtime) == same_size[p]}
    todo = sorted(set(same_size) - set(trusted))
    if todo:
        n = sum(same_size[p][0] for p in todo)
        trusted.update(parse_hashes(r.run(wc.hash_files(model_dir, todo), timeout=_hash_bound(n)).stdout))
    return files, trusted, parts


def plan_weights(src_r: Any, dst_r: Any, rate_bps: float) -> tuple[WeightsPlan, dict[str, Any]]:
    """The plan of copying ``src_r``'s ``model_path`` into ``dst_r``'s (reads both hosts only) and facts for the
    printout (``rehashed``, ``had_manifest``) and for the source's manifest (``source_entries``; ``source_stale``:
    it is to be written back, :func:`record_source_manifest`)."""
    s, d = src_r.host, dst_r.host
    if s.name == d.name:
        raise WeightsError(f"{d.name}: --from names the same host; name another inventory host that holds the weights")
    src, rehashed, had = read_source(src_r, s.model_path)
    files, hashes, parts = read_dest(dst_r, d.model_path, src)
    plan = plan_copy(s.name, d.name, s.model_path, d.model_path, src, files, hashes, parts, rate_bps, PER_FILE_S)
    return plan, {"rehashed": rehashed, "had_manifest": had, "source_entries": src,
                  "source_stale": bool(rehashed) or not had}


def check_room(r: Any, plan: WeightsPlan) -> int | None:
    """Free bytes on the filesystem that will hold ``plan.dest_dir`` on ``r``'s host (its nearest existing folder),
    None when ``df`` could not tell.

    Raises:
        WeightsError: fewer free bytes than the copy sends (a replaced file is written whole beside the old one before
            it is renamed over it); the message names the host, the folder and both sizes.
    """
    from eagle3ops.commands.host import parse_df_free_bytes

    path, free = plan.dest_dir, None
    while path:
        out = r.run(hc.free_bytes(path), check=False)
        if out.ok:
            try:
                free = parse_df_free_bytes(out.stdout)
            except ValueError:
                return None
            break
        path = "" if os.path.dirname(path) == path else os.path.dirname(path)
    if free is not None and free < plan.send_bytes:
        raise WeightsError(f"{plan.dest}: {path} has {free} bytes free, the copy sends {plan.send_bytes}: free space "
                           f"there (or point hosts.{plan.dest}.model_path / data_dir at a larger disk); nothing copied")
    return free


def _pump(src_host: Any, src_path: str, offset: int, sink: SshStream, stall_s: float) -> int:
    """Stream ``src_path`` from ``offset`` on the source host into ``sink``; returns the bytes moved.

    Raises:
        StreamStalled: nothing came from the source for ``stall_s``. WeightsError: the source's read failed.
    """
    cfg = write_ssh_config(src_host)
    argv = openssh(src_host, wc.read_from(src_path, offset), cfg)
    proc = executor.local().popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  bufsize=0)
    moved, fd = 0, proc.stdout.fileno()
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], stall_s)
            if not ready:
                raise StreamStalled(f"{src_host.name}: nothing read from {src_path} for {stall_s:.0f} s after "
                                    f"{moved} bytes")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            sink.write(chunk)
            moved += len(chunk)
        rc = proc.wait(timeout=60)
        if rc != 0:
            err = proc.stderr.read().decode(errors="replace").strip()
            raise WeightsError(f"{src_host.name}: reading {src_path} failed (exit {rc}): {err[-300:]}")
        return moved
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        import shutil

        shutil.rmtree(cfg.parent, ignore_errors=True)


def copy_steps(plan: WeightsPlan, src_host: Any, dst_host: Any, *, stall_s: float = STALL_S,
               on_file: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Carry out ``plan``: each file that moves streamed from ``plan.source_dir`` into ``plan.dest_dir`` (resumed
    from its partial file's offset), verified by sha256 on the destination before it is renamed into place.
    Returns ``{"sent_bytes", "seconds", "files": [...]}`` (per file: path, action, offset, bytes, seconds).

    Raises:
        WeightsError: a file was refused on arrival (sha256 or size; a refused file's partial copy is removed, a cut
            one is kept for the rerun to resume), or a stream failed (the message says to rerun the same command).
    """
    t0, done, total = time.monotonic(), [], 0
    for step in plan.steps:
        if step.action == "same":
            continue
        t1 = time.monotonic()
        sink = SshStream(dst_host, wc.receive_file(plan.dest_dir, step.path, step.size, step.sha256, step.offset),
                         stall_s=stall_s)
        try:
            moved = _pump(src_host, f"{plan.source_dir}/{step.path}", step.offset, sink, stall_s)
            rc, out, err = sink.finish(timeout=60 + _hash_bound(step.size))
        except BaseException:
            sink.kill()
            raise
        total += moved
        if rc != 0:
            what = {3: "arrived cut (its partial file is kept: rerun the same command to resume)",
                    4: "its partial file changed under the copy (another copy running?): rerun the same command",
                    5: "was refused: its sha256 on arrival differs from the source's manifest (the partial file was "
                       "removed). The source's bytes no longer match its record: check the source's disk, delete "
                       f"{wc.manifest_path(src_host.state_dir)} on {src_host.name} to record it again"}
            raise WeightsError(f"{dst_host.name}: {step.path} {what.get(rc, f'failed (exit {rc})')}: {err[-400:]}")
        rec = {"path": step.path, "action": step.action, "offset": step.offset, "bytes": moved,
               "seconds": round(time.monotonic() - t1, 2), "sha256": out.strip()}
        done.append(rec)
        if on_file:
            on_file(rec)
    return {"sent_bytes": total, "seconds": round(time.monotonic() - t0, 2), "files": done}


def record_dest_manifest(r: Any, plan: WeightsPlan) -> None:
    """Write the destination's manifest after a copy: the source's sha256 with the destination's own sizes and
    mtimes (so its next re-verification is by size and mtime only)."""
    files, _ = parse_listing(r.run(wc.stat_listing(plan.dest_dir), check=False).stdout or "")
    entries = {s.path: FileEntry(s.path, files[s.path][0], files[s.path][1], s.sha256)
               for s in plan.steps if s.path in files and files[s.path][0] == s.size}
    mpath = wc.manifest_path(r.host.state_dir)
    r.run(hc.mkdir_p(os.path.dirname(mpath)))
    r.run(hc.write_file(mpath), stdin=render_manifest(entries))


@dataclass(frozen=True)
class InstalledHead:
    """A head fetched from another host (``--head A:RUN``) and installed on this one: its directory there and its
    content digest (:func:`eagle3ops.speculate.onhost.head_sha256`). ``pending``: the fetch still to make (planned,
    checked for room, not sent), called by the command that holds this host's lock (speculate's head upload);
    None when the head is installed already. It raises :class:`WeightsError` as :func:`copy_steps` does. ``fetch``:
    the fetch's plan as data (:meth:`~eagle3ops.transfer.weightsplan.WeightsPlan.as_dict`), for a dry run's JSON."""

    label: str
    dir: str
    digest: str
    pending: Callable[[], Any] | None = field(default=None, compare=False, repr=False)
    fetch: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return self.label


def head_plan(src_r: Any, dst_r: Any, run: str, rate_bps: float) -> tuple[WeightsPlan, str]:
    """The plan of fetching run ``run``'s final head from ``src_r``'s host into ``dst_r``'s
    ``<data_dir>/heads/<digest[:12]>`` (reads only) and the head's digest, from the run's train manifest there.

    Raises:
        WeightsError: the run has no finished train stage on the source (no manifest, or no ``final/`` files in it).
    """
    s, d = src_r.host, dst_r.host
    mpath = f"{s.data_dir}/runs/{run}/train/manifest.json"
    text = src_r.run(hc.cat_if_exists(mpath), check=False).stdout or ""
    try:
        files = json.loads(text)["files"] if text.strip() else {}
    except (ValueError, KeyError, TypeError):
        raise WeightsError(f"{s.name}:{mpath}: not a train manifest; rerun stage train of run {run} there") from None
    final = {k.removeprefix("final/"): v for k, v in files.items() if k.startswith("final/") and k.count("/") == 1}
    if "config.json" not in final:
        raise WeightsError(f"{s.name}: run {run} has no trained head ({mpath} lists no final/config.json): train it "
                           f"there first, or name the host and run that trained it (--head HOST:RUN)")
    digest = head_digest({n: v["sha256"] for n, v in final.items()})
    src = {n: FileEntry(n, int(v["bytes"]), 0, v["sha256"]) for n, v in final.items()}
    dest_dir = f"{d.data_dir}/heads/{digest[:12]}"
    dfiles, hashes, parts = read_dest_dir(dst_r, dest_dir, src)
    plan = plan_copy(s.name, d.name, f"{s.data_dir}/runs/{run}/train/final", dest_dir, src, dfiles, hashes, parts,
                     rate_bps, PER_FILE_S)
    return plan, digest


def read_dest_dir(r: Any, dest_dir: str, src: dict[str, FileEntry]) -> tuple[dict[str, tuple[int, int]],
                                                                            dict[str, str], dict[str, int]]:
    """A destination dir's files, the sha256 of those whose size matches ``src`` (hashed there now) and its partial
    files (for a head dir: no manifest of its own)."""
    files, parts = parse_listing(r.run(wc.stat_listing(dest_dir), check=False).stdout or "")
    todo = sorted(p for p, v in files.items() if p in src and v[0] == src[p].size)
    hashes = parse_hashes(r.run(wc.hash_files(dest_dir, todo), check=False).stdout) if todo else {}
    return files, hashes, parts
