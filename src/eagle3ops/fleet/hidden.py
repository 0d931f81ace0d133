"""Which hidden-state files move to the training host of a fleet run, from where, and how long that takes (pure):
the plan of ``eagle3ops train HOST --from-fleet MERGED``.

A merged extract manifest (:func:`eagle3ops.stages.merge.merge_manifests`) lists every sample's file (``sample_files``:
``{i, file, tokens}``; ``files``: ``{file: {bytes, sha256}}``) and where each shard was extracted (``fleet.shards``:
``{rank, host, start, end}``). :func:`files_by_host` says which files live on which host; :func:`plan_move` compares
them with what the training host already holds (``present``: ``{file: sha256}`` read there) and returns a
:class:`MovePlan`: per source host the files still to send (a file present with the manifest's sha256 is never sent
again: a rerun resumes), their bytes and the seconds the link is expected to take. The training host's own shard
must already be there with the manifest's digests; a file of it missing or different is refused by name.
The copy itself, and the check of each arrived file's sha256 on the training host, is
:mod:`eagle3ops.transfer.hidden`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

#: Link rate assumed when neither the inventory (``fleet.link_mb_per_s``) nor an earlier copy measured one: 100 Mbit/s.
DEFAULT_LINK_BYTES_PER_S = 12.5e6
#: A file name a manifest may list: relative, plain characters, no ``..`` (it becomes a path on two hosts).
_SAFE = re.compile(r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*$")


class HiddenPlanError(ValueError):
    """The merged manifest or the training host's files cannot make a copy plan; the message names the file, the
    host and the fix."""


@dataclass(frozen=True)
class HiddenFile:
    """One hidden-state file: its path relative to ``extract/``, size in bytes and sha256 (hex) from the manifest."""

    rel: str
    bytes: int
    sha256: str


@dataclass
class Move:
    """What one source host sends: ``files`` (to send), ``bytes`` (their sum), ``present`` (files of this host already
    on the training host with the right sha256: not sent), ``seconds`` (estimated from ``bytes_per_s``, whose origin
    ``rate_from`` names)."""

    host: str
    files: list[HiddenFile]
    present: int
    bytes_per_s: float
    rate_from: str

    @property
    def bytes(self) -> int:
        """Bytes still to send from this host."""
        return sum(f.bytes for f in self.files)

    @property
    def seconds(self) -> float:
        """Estimated seconds of the copy at ``bytes_per_s``."""
        return round(self.bytes / self.bytes_per_s, 1) if self.bytes_per_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The move as printed in the plan (JSON)."""
        return {"host": self.host, "files": len(self.files), "bytes": self.bytes, "already_there": self.present,
                "estimated_s": self.seconds, "bytes_per_s": round(self.bytes_per_s), "rate_from": self.rate_from}


@dataclass
class MovePlan:
    """The copy plan: the training host, its own shard's file count (checked there), one :class:`Move` per other host
    holding files, the wrong-digest files on the training host that will be replaced (``replace``), and every file's
    manifest entry (``expected``)."""

    run: str
    train_host: str
    own_files: int
    moves: list[Move]
    replace: list[str] = field(default_factory=list)
    expected: dict[str, HiddenFile] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        """Bytes to send over every link."""
        return sum(m.bytes for m in self.moves)

    @property
    def seconds(self) -> float:
        """Estimated seconds, the sources one after another."""
        return round(sum(m.seconds for m in self.moves), 1)

    def as_dict(self) -> dict[str, Any]:
        """The plan as printed (JSON)."""
        return {"run": self.run, "train_host": self.train_host, "own_files": self.own_files,
                "moves": [m.as_dict() for m in self.moves], "bytes": self.bytes, "estimated_s": self.seconds,
                "replace": self.replace}


def files_by_host(merged: dict[str, Any]) -> dict[str, list[HiddenFile]]:
    """``{host: its files}`` from a merged manifest: each sample's file belongs to the host of the shard whose range
    holds the sample.

    Raises:
        HiddenPlanError: the manifest has no ``fleet.shards`` (not a merged fleet manifest), a sample lies in no
            shard, a file is not in ``files``, a file name is not a plain relative path, or ``files`` lists a file
            no sample names.
    """
    shards = (merged.get("fleet") or {}).get("shards")
    if not shards:
        raise HiddenPlanError("the manifest has no `fleet.shards`: pass the merged manifest that `eagle3ops extract "
                              "HOST HOST... --merged FILE` wrote")
    files = merged.get("files") or {}
    out: dict[str, list[HiddenFile]] = {}
    named: set[str] = set()
    for rec in merged.get("sample_files") or []:
        i, rel = int(rec["i"]), str(rec["file"])
        shard = next((s for s in shards if int(s["start"]) <= i < int(s["end"])), None)
        if shard is None:
            raise HiddenPlanError(f"merged manifest: sample {i} ({rel}) lies in no shard of `fleet.shards`; merge "
                                  f"the fleet run again (`eagle3ops extract HOST HOST... --merged FILE`)")
        if not _SAFE.match(rel) or ".." in rel.split("/"):
            raise HiddenPlanError(f"merged manifest: file name {rel!r} of sample {i} is not a plain relative path; "
                                  f"merge the fleet run again")
        entry = files.get(rel)
        if not entry or "sha256" not in entry or "bytes" not in entry:
            raise HiddenPlanError(f"merged manifest: {rel} (sample {i}) has no `files` entry with bytes and sha256; "
                                  f"merge the fleet run again")
        named.add(rel)
        out.setdefault(str(shard["host"]), []).append(HiddenFile(rel, int(entry["bytes"]), str(entry["sha256"])))
    extra = sorted(set(files) - named)
    if extra:
        raise HiddenPlanError(f"merged manifest: `files` lists {extra[:3]} that no sample names; merge the fleet run "
                              f"again")
    return out


def plan_move(merged: dict[str, Any], run: str, train_host: str, present: dict[str, str],
              rates: dict[str, tuple[float, str]] | None = None, *, dead: set[str] | None = None) -> MovePlan:
    """The copy plan for training on ``train_host``.

    Args:
        merged: the merged extract manifest.
        present: ``{file relative to extract/: sha256}`` of what the training host holds (its ``hidden/`` and the
            verified-but-not-moved ``.incoming/`` files count alike).
        rates: ``{source host: (bytes per second, where that figure comes from)}``; a host not named gets
            :data:`DEFAULT_LINK_BYTES_PER_S` (``"assumed 100 Mbit/s"``).
        dead: hosts not to read from (a file only they hold is refused).

    Raises:
        HiddenPlanError: see :func:`files_by_host`; a file of ``train_host``'s own shard missing or with another sha256
            there (named, with the fix: re-extract it); a file still needed from a ``dead`` host.
    """
    by_host = files_by_host(merged)
    rates, dead = rates or {}, dead or set()
    own = by_host.get(train_host, [])
    bad_own = [f for f in own if present.get(f.rel) != f.sha256]
    if bad_own:
        f = bad_own[0]
        why = ("is missing" if f.rel not in present else
               f"has sha256 {present[f.rel][:16]}..., the manifest {f.sha256[:16]}...")
        raise HiddenPlanError(f"{train_host}: extract/{f.rel} of its own shard {why} ({len(bad_own)} such file(s)); "
                              f"delete it on {train_host} and rerun the fleet extract (`eagle3ops extract HOST "
                              f"HOST... --run {run}`: the shard re-extracts it), then rerun this command")
    moves, replace = [], []
    for host, fs in by_host.items():
        if host == train_host:
            continue
        send = [f for f in fs if present.get(f.rel) != f.sha256]
        replace += [f.rel for f in send if f.rel in present]
        if send and host in dead:
            raise HiddenPlanError(f"{host} is marked dead but holds {len(send)} file(s) the training host lacks (e.g. "
                                  f"extract/{send[0].rel}); rerun the fleet extract with --dead {host} so another "
                                  f"host extracts its shard, then merge again")
        bps, origin = rates.get(host) or (DEFAULT_LINK_BYTES_PER_S, "assumed 100 Mbit/s")
        moves.append(Move(host, send, len(fs) - len(send), bps, origin))
    expected = {f.rel: f for fs in by_host.values() for f in fs}
    return MovePlan(run, train_host, len(own), sorted(moves, key=lambda m: m.host), replace, expected)


def check_space(plan: MovePlan, free_bytes: int | None, data_dir: str) -> None:
    """Refuse a copy larger than the training host's free disk (``free_bytes`` of the filesystem of ``data_dir``;
    None: unknown, not refused).

    Raises:
        HiddenPlanError: the bytes to copy exceed ``free_bytes`` (names both, the inventory key and the fixes).
    """
    if free_bytes is not None and plan.bytes > free_bytes:
        raise HiddenPlanError(f"{plan.train_host}: {data_dir} has {free_bytes} bytes free, the copy needs "
                              f"{plan.bytes}: free space there (or point hosts.{plan.train_host}.data_dir at a larger "
                              f"disk), or train on another host")


def render(plan: MovePlan) -> str:
    """The plan as lines for the terminal: one per source host, then the total."""
    lines = [f"hidden states of run {plan.run} to {plan.train_host} (its own shard: {plan.own_files} file(s), "
             f"checked there):"]
    for m in plan.moves:
        lines.append(f"  from {m.host}: {len(m.files)} file(s), {m.bytes} bytes to send (~{m.seconds} s at "
                     f"{m.bytes_per_s / 1e6:.1f} MB/s, {m.rate_from}); {m.present} already there")
    if plan.replace:
        lines.append(f"  replaced (wrong sha256 on {plan.train_host}): {', '.join(plan.replace[:5])}")
    lines.append(f"  total: {plan.bytes} bytes, ~{plan.seconds} s")
    return "\n".join(lines)
