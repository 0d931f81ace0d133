"""The weights transfer's plan (pure): manifests, the cheap re-verification by size and mtime, what a
destination lacks, the bytes to send and the time they take at a link rate. The host side is
:mod:`eagle3ops.commands.weights`; the copy is :mod:`eagle3ops.transfer.weights`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eagle3ops.commands.weights import MANIFEST_HEADER, PART


class WeightsPlanError(ValueError):
    """A manifest or listing could not be read; the message names the host, the file and the fix."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a weights manifest: relative path, bytes, mtime (whole seconds), sha256 (hex)."""

    path: str
    size: int
    mtime: int
    sha256: str


def parse_manifest(text: str, where: str) -> dict[str, FileEntry]:
    """A manifest's text (:mod:`eagle3ops.commands.weights`) → entries by relative path.

    Raises:
        WeightsPlanError: no header or a malformed line (``where`` and the line number named; fix: delete the file,
            it is recorded again).
    """
    lines = text.splitlines()
    if not lines or lines[0].strip() != MANIFEST_HEADER:
        raise WeightsPlanError(f"{where}: not a weights manifest (first line is not {MANIFEST_HEADER!r}); delete it "
                               "and it is recorded again")
    out: dict[str, FileEntry] = {}
    for n, line in enumerate(lines[1:], 2):
        parts = line.split(" ", 3)
        if len(parts) != 4 or len(parts[0]) != 64 or not parts[1].isdigit() or not parts[2].isdigit():
            raise WeightsPlanError(f"{where}: line {n} is not `<sha256> <bytes> <mtime> <path>`: {line[:120]!r}; "
                                   "delete the file and it is recorded again")
        out[parts[3]] = FileEntry(parts[3], int(parts[1]), int(parts[2]), parts[0])
    return out


def render_manifest(entries: dict[str, FileEntry]) -> str:
    """Entries → the manifest's text (names in C order)."""
    rows = [f"{e.sha256} {e.size} {e.mtime} {e.path}" for _, e in sorted(entries.items(), key=lambda kv: kv[0].encode())]
    return "\n".join([MANIFEST_HEADER, *rows]) + "\n"


def parse_listing(text: str) -> tuple[dict[str, tuple[int, int]], dict[str, int]]:
    """:func:`eagle3ops.commands.weights.stat_listing`'s output → (files: path → (bytes, mtime), partial files:
    path of the file being received → bytes it holds).

    Raises:
        WeightsPlanError: a line that is not ``<bytes> <mtime> <path>``.
    """
    files: dict[str, tuple[int, int]] = {}
    parts: dict[str, int] = {}
    for line in text.splitlines():
        if not line:
            continue
        bits = line.split(" ", 2)
        try:
            size, mtime, rel = int(bits[0]), int(float(bits[1])), bits[2]
        except (IndexError, ValueError):
            raise WeightsPlanError(f"unexpected line in a file listing: {line[:120]!r}") from None
        if rel.endswith(PART):
            parts[rel[: -len(PART)]] = size
        else:
            files[rel] = (size, mtime)
    return files, parts


def stale(recorded: dict[str, FileEntry], listing: dict[str, tuple[int, int]]) -> list[str]:
    """Files of ``listing`` whose recorded size or mtime differ, or that no record names: the ones to hash again
    (the cheap re-verification; unchanged files keep their recorded sha256)."""
    return sorted(p for p, (size, mtime) in listing.items()
                  if p not in recorded or recorded[p].size != size or recorded[p].mtime != mtime)


def refresh(recorded: dict[str, FileEntry], listing: dict[str, tuple[int, int]],
            hashes: dict[str, str]) -> dict[str, FileEntry]:
    """The manifest of ``listing`` now: recorded entries whose size and mtime still match, ``hashes`` (of
    :func:`stale` files) for the rest; files gone from the listing are dropped.

    Raises:
        WeightsPlanError: a stale file has no hash in ``hashes``.
    """
    out = {}
    for p, (size, mtime) in listing.items():
        rec = recorded.get(p)
        if rec is not None and rec.size == size and rec.mtime == mtime:
            out[p] = rec
        elif p in hashes:
            out[p] = FileEntry(p, size, mtime, hashes[p])
        else:
            raise WeightsPlanError(f"{p}: changed since the manifest was recorded and not hashed again")
    return out


def parse_hashes(text: str) -> dict[str, str]:
    """:func:`eagle3ops.commands.weights.hash_files`'s output → path → sha256."""
    out = {}
    for line in text.splitlines():
        if line.strip():
            h, _, rel = line.partition(" ")
            out[rel] = h
    return out


@dataclass(frozen=True)
class Step:
    """One file of the plan: ``action`` is ``same`` (nothing sent), ``copy`` (missing), ``replace`` (differs: the
    destination's sha256 or size is another) or ``resume`` (a partial file of ``offset`` bytes continues)."""

    path: str
    action: str
    size: int
    sha256: str
    offset: int = 0
    why: str = ""

    @property
    def send(self) -> int:
        """Bytes this step sends."""
        return 0 if self.action == "same" else self.size - self.offset


@dataclass
class WeightsPlan:
    """The copy of the source's model dir into the destination's: steps in name order, extra destination files
    (kept, not in the source's manifest), the rate the estimate assumes (bytes/s)."""

    source: str
    dest: str
    source_dir: str
    dest_dir: str
    steps: list[Step]
    extra: list[str] = field(default_factory=list)
    rate_bps: float = 125e6
    per_file_s: float = 0.0

    @property
    def send_bytes(self) -> int:
        """Bytes the copy sends."""
        return sum(s.send for s in self.steps)

    @property
    def estimate_s(self) -> float:
        """Seconds the copy takes: its bytes at ``rate_bps`` plus ``per_file_s`` for each file that moves (two SSH
        connections and the sha256 on arrival)."""
        moving = sum(1 for s in self.steps if s.send)
        return (self.send_bytes / self.rate_bps if self.rate_bps > 0 else 0.0) + moving * self.per_file_s

    def as_dict(self) -> dict[str, Any]:
        """The plan as JSON-able data."""
        return {"source": self.source, "dest": self.dest, "source_dir": self.source_dir, "dest_dir": self.dest_dir,
                "send_bytes": self.send_bytes, "estimate_s": round(self.estimate_s, 1), "rate_bps": self.rate_bps,
                "per_file_s": self.per_file_s,
                "steps": [s.__dict__ for s in self.steps], "extra": self.extra}


def plan_copy(source: str, dest: str, source_dir: str, dest_dir: str, src: dict[str, FileEntry],
              dst_files: dict[str, tuple[int, int]], dst_hashes: dict[str, str], dst_parts: dict[str, int],
              rate_bps: float, per_file_s: float = 0.0) -> WeightsPlan:
    """What to send so the destination's dir holds the source manifest's files (pure).

    Args:
        src: the source's manifest (re-verified). dst_files: the destination's files (bytes, mtime).
        dst_hashes: sha256 of destination files whose size matches (from its own manifest or hashed there).
        dst_parts: partial files on the destination (path → bytes held). rate_bps: link rate for the estimate
            (bytes/s); per_file_s: seconds added per file that moves.
    """
    steps = []
    for p, e in sorted(src.items(), key=lambda kv: kv[0].encode()):
        held = dst_parts.get(p)
        if p in dst_files and dst_files[p][0] == e.size and dst_hashes.get(p) == e.sha256:
            steps.append(Step(p, "same", e.size, e.sha256))
        elif held is not None and 0 < held < e.size:
            steps.append(Step(p, "resume", e.size, e.sha256, held, f"{held} of {e.size} bytes there"))
        elif p in dst_files:
            why = (f"{dst_files[p][0]} bytes, the source's {e.size}" if dst_files[p][0] != e.size
                   else f"sha256 {str(dst_hashes.get(p))[:12]}..., the source's {e.sha256[:12]}...")
            steps.append(Step(p, "replace", e.size, e.sha256, 0, why))
        else:
            steps.append(Step(p, "copy", e.size, e.sha256, 0, "missing"))
    return WeightsPlan(source, dest, source_dir, dest_dir, steps, sorted(set(dst_files) - set(src)), rate_bps,
                       per_file_s)


def human_bytes(n: float) -> str:
    """``n`` bytes in B/KB/MB/GB (decimal)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def render(plan: WeightsPlan) -> str:
    """The plan as printed before anything runs: totals, the estimate and each file that moves."""
    counts: dict[str, int] = {}
    for s in plan.steps:
        counts[s.action] = counts.get(s.action, 0) + 1
    lines = [f"weights {plan.source}:{plan.source_dir} -> {plan.dest}:{plan.dest_dir} (through the driver over SSH)",
             f"  {len(plan.steps)} files: " + ", ".join(f"{n} {a}" for a, n in sorted(counts.items())),
             f"  to send: {human_bytes(plan.send_bytes)} ({plan.send_bytes} bytes), about {plan.estimate_s:.1f} s at "
             f"{plan.rate_bps * 8 / 1e6:.0f} Mbit/s + {plan.per_file_s:g} s a file; each file's sha256 checked on "
             f"{plan.dest} before it is renamed into place"]
    for s in plan.steps:
        if s.action != "same":
            lines.append(f"  {s.action:8} {s.path} ({human_bytes(s.send)}{'; ' + s.why if s.why else ''})")
    if plan.extra:
        lines.append(f"  kept on {plan.dest} (not in {plan.source}'s manifest): {', '.join(plan.extra[:10])}"
                     + (" ..." if len(plan.extra) > 10 else ""))
    return "\n".join(lines)


def head_digest(entries: dict[str, str]) -> str:
    """A head's content digest from its files' sha256 (name → hex), as
    :func:`eagle3ops.speculate.onhost.head_sha256` computes it from the bytes: name, NUL, the raw sha256, in name
    order."""
    import hashlib

    d = hashlib.sha256()
    for name in sorted(entries):
        d.update(name.encode() + b"\0" + bytes.fromhex(entries[name]))
    return d.hexdigest()
