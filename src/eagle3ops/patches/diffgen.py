"""Write patches: unified diffs between two trees (GNU ``diff``) and DEP-3 headers.

Diffs are produced by GNU diffutils (``diff -u``, 3 lines of context, ``-F`` naming the enclosing ``def``/``class`` in hunk headers, ``a/``/``b/`` labels, ``/dev/null`` for
created or deleted files, ``\\ No newline at end of file`` handled by diff itself), one file at a time in sorted
path order, so the result is deterministic and applies with ``patch -p1 --fuzz=0``.
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
import subprocess
from pathlib import Path

from eagle3ops.patches.errors import PatchToolError
from eagle3ops.patches.series import Pin

SKIP_DIRS = {"__pycache__"}
# hunk headers name the enclosing def/class, like git's Python diff driver (GNU diff -F, basic regex)
PY_FUNCTION_LINE = r"^[[:space:]]*\(async \)\?\(def\|class\) "
SKIP_SUFFIXES = (".pyc", ".pyo", ".orig", ".rej")


def list_files(root: Path, tops: tuple[str, ...]) -> set[str]:
    """Relative POSIX paths of the regular files under ``root/<top>`` for each top-level name (skipping
    ``__pycache__``, ``*.pyc``, ``*.orig``, ``*.rej``)."""
    out: set[str] = set()
    for top in tops:
        base = root / top
        if base.is_file():
            out.add(top)
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for fn in filenames:
                if fn.endswith(SKIP_SUFFIXES):
                    continue
                p = Path(dirpath) / fn
                if p.is_file() and not p.is_symlink():
                    out.add(p.relative_to(root).as_posix())
    return out


def diff_file(old: Path | None, new: Path | None, rel: str) -> str:
    """Unified diff of one file (``old``/``new`` None = absent) with labels ``a/<rel>`` ``b/<rel>``; '' if equal.

    Raises:
        PatchToolError: GNU diff missing, failed, or the file is binary.
    """
    exe = shutil.which("diff")
    if not exe:
        raise PatchToolError("GNU diff is not installed", fix="install diffutils")
    a_label = f"a/{rel}" if old is not None else "/dev/null"
    b_label = f"b/{rel}" if new is not None else "/dev/null"
    argv = [exe, "-u", "-F", PY_FUNCTION_LINE, "--label", a_label, "--label", b_label, str(old or "/dev/null"), str(new or "/dev/null")]
    proc = subprocess.run(argv, capture_output=True, env=dict(os.environ, LC_ALL="C"), check=False)
    if proc.returncode == 0:
        return ""
    if proc.returncode != 1:
        raise PatchToolError(f"diff failed on {rel}: {proc.stderr.decode(errors='replace').strip()}", fix="check the files")
    text = proc.stdout.decode("utf-8")
    if text.startswith("Binary files"):
        raise PatchToolError(f"{rel} is binary", fix="patches may only change text files")
    return text


def diff_trees(old_root: Path, new_root: Path, tops: tuple[str, ...], only: set[str] | None = None) -> str:
    """Concatenated unified diffs of every file that differs between ``old_root`` and ``new_root`` under
    ``tops`` (or only the paths in ``only``), sorted by path; '' when the trees are equal."""
    paths = only if only is not None else list_files(old_root, tops) | list_files(new_root, tops)
    chunks = []
    for rel in sorted(paths):
        o, n = old_root / rel, new_root / rel
        chunks.append(diff_file(o if o.is_file() else None, n if n.is_file() else None, rel))
    return "".join(chunks)


def render_header(
    *,
    description: str,
    pin: Pin,
    probe: str,
    requires: list[Pin] | None = None,
    origin: str = "vendor",
    bug: str | None = None,
    forwarded: str | None = "no",
    last_update: _dt.date | None = None,
    extra: dict[str, str] | None = None,
) -> str:
    """Render a DEP-3 header with the eagle3ops fields (multi-line description: continuation lines indented
    by one space, empty lines as `` .``)."""
    lines = description.strip().splitlines() or ["(no description)"]
    desc = lines[0] + "".join("\n " + (ln if ln.strip() else ".") for ln in lines[1:])
    out = [f"Description: {desc}", f"Origin: {origin}"]
    if bug:
        out.append(f"Bug: {bug}")
    if forwarded:
        out.append(f"Forwarded: {forwarded}")
    out.append(f"Last-Update: {(last_update or _dt.date.today()).isoformat()}")
    out.append(f"X-Eagle3ops-Pin: {pin}")
    if requires:
        out.append("X-Eagle3ops-Requires: " + ", ".join(str(r) for r in requires))
    out.append(f"X-Eagle3ops-Probe: {probe}")
    for k, v in (extra or {}).items():
        out.append(f"{k}: {v}")
    return "\n".join(out) + "\n"


def replace_header_fields(header_text: str, updates: dict[str, str]) -> str:
    """Return ``header_text`` with the given single-line fields replaced (or appended if absent), keeping every
    other line (and its order) verbatim. Used by ``refresh`` and ``rebase`` (``Last-Update``, ``X-Eagle3ops-Pin``)."""
    lines = header_text.splitlines()
    done: set[str] = set()
    out: list[str] = []
    skip_cont = False
    for ln in lines:
        if skip_cont and ln[:1] in (" ", "\t"):
            continue
        skip_cont = False
        key = ln.split(":", 1)[0] if ":" in ln and ln[:1] not in (" ", "\t") else None
        match = next((k for k in updates if key and k.lower() == key.lower()), None)
        if match:
            out.append(f"{match}: {updates[match]}")
            done.add(match)
            skip_cont = True
        else:
            out.append(ln)
    # append missing fields before any free-form paragraph (i.e. after the last field line)
    missing = [f"{k}: {v}" for k, v in updates.items() if k not in done]
    if missing:
        idx = len(out)
        for i, ln in enumerate(out):
            if not ln.strip():
                idx = i
                break
        out[idx:idx] = missing
    return "\n".join(out) + "\n"


def compose_patch(header_text: str, diff_text: str) -> str:
    """A patch file's text: header, the DEP-3 ``---`` separator line, the diff."""
    return header_text.rstrip("\n") + "\n---\n" + diff_text
