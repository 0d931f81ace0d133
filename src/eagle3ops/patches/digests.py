"""Content digests shared by the probe-result cache (:mod:`eagle3ops.patches.probecache`) and the fixture cache
(:mod:`eagle3ops.patches.fixtures`): a file tree's digest and the CPU facts that enter both keys. Imports nothing
of eagle3ops but :mod:`eagle3ops.patches.wheels`, so both caches can use it without an import circle."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from eagle3ops.patches.wheels import sha256_file

__all__ = ["cpu_info", "tree_digest"]


def _skip(path: Path) -> bool:
    return "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo")


def tree_digest(root: Path, names: tuple[str, ...] | list[str]) -> str:
    """sha256 over the files of ``root/<name>`` for each name (a package dir or a module file).

    Each file contributes its path relative to ``root``, its executable bit and the sha256 of its bytes (a
    symlink: its target); ``__pycache__`` and ``*.pyc`` are skipped (Python writes them while probes run).
    A missing name contributes a ``missing`` marker, so removing a package changes the digest.
    """
    h = hashlib.sha256()
    for name in sorted(names):
        base = root / name
        if not base.exists() and (root / f"{name}.py").is_file():
            base = root / f"{name}.py"
        if base.is_symlink() or base.is_file():
            files = [base]
        elif base.is_dir():
            files = sorted(p for p in base.rglob("*") if (p.is_file() or p.is_symlink()) and not _skip(p))
        else:
            h.update(f"missing {name}\n".encode())
            continue
        for p in files:
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                h.update(f"L {rel} {os.readlink(p)}\n".encode())
            else:
                x = "x" if os.access(p, os.X_OK) else "-"
                h.update(f"F {rel} {x} {sha256_file(p)}\n".encode())
    return h.hexdigest()


def cpu_info() -> dict[str, str]:
    """The CPU the code runs on, from ``/proc/cpuinfo``: the first CPU's ``model name`` and ``flags`` (sorted; on
    ARM ``Features``, ``CPU implementer``, ``CPU part``) and ``count`` (``os.cpu_count()``); only ``count`` where
    ``/proc/cpuinfo`` cannot be read."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            k, _, v = line.partition(":")
            k = k.strip()
            if k in ("model name", "flags", "Features", "CPU implementer", "CPU part") and k not in info:
                info[k] = " ".join(sorted(v.split())) if k in ("flags", "Features") else v.strip()
    except OSError:
        pass
    info["count"] = str(os.cpu_count())
    return info
