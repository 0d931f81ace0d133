"""Wheel ``RECORD`` files (PEP 376/PEP 627): per-file sha256 of an installed distribution.

A RECORD row is ``path,sha256=<urlsafe base64 digest without padding>,size``; ``RECORD`` itself and compiled
``*.pyc`` files carry no hash. Paths are relative to the site dir; entries outside it (``../../bin/...``) are
ignored by :func:`package_entries`.
"""

from __future__ import annotations

import base64
import csv
import io
from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class RecordEntry:
    """One RECORD row: path relative to the site dir, sha256 as hex (None when RECORD has no hash), size."""

    path: str
    sha256: str | None
    size: int | None


def b64_to_hex(digest: str) -> str:
    """Convert RECORD's urlsafe-base64 (unpadded) digest to hex."""
    pad = "=" * (-len(digest) % 4)
    return base64.urlsafe_b64decode(digest + pad).hex()


def parse_record(text: str) -> list[RecordEntry]:
    """Parse a RECORD file's text. Rows with a non-sha256 hash algorithm keep ``sha256=None``."""
    out = []
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0]:
            continue
        path = row[0]
        h = row[1] if len(row) > 1 else ""
        size = int(row[2]) if len(row) > 2 and row[2].strip().isdigit() else None
        sha = b64_to_hex(h.split("=", 1)[1]) if h.startswith("sha256=") else None
        out.append(RecordEntry(path, sha, size))
    return out


def top_levels_of(entries: list[RecordEntry]) -> tuple[str, ...]:
    """Top-level package names in a RECORD (first path component, excluding dist-info/data dirs and ``..``)."""
    tops = set()
    for e in entries:
        parts = PurePosixPath(e.path).parts
        if len(parts) < 2 or parts[0] in ("..", "/") or parts[0].endswith((".dist-info", ".data")) or parts[0] == "__pycache__":
            if len(parts) == 1 and parts[0].endswith(".py"):
                tops.add(parts[0][:-3])
            continue
        tops.add(parts[0])
    return tuple(sorted(tops))


def package_entries(entries: list[RecordEntry], tops: tuple[str, ...]) -> dict[str, RecordEntry]:
    """Entries under the given top-level packages that carry a sha256 (``*.pyc`` and ``__pycache__`` excluded)."""
    out = {}
    for e in entries:
        parts = PurePosixPath(e.path).parts
        if not parts or parts[0] not in tops or "__pycache__" in parts or e.path.endswith(".pyc") or e.sha256 is None:
            continue
        out[e.path] = e
    return out
