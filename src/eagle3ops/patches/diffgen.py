"""Write patches: unified diffs between two trees (GNU ``diff``) and DEP-3 headers.

Diffs are produced by GNU diffutils (``diff -u``, 3 lines of context, ``-F`` naming the enclosing ``def``/``class`` in hunk headers, ``a/``/``b/`` labels, ``/dev/null`` for
created or deleted files, ``\\ No newline at end of file`` handled by diff itself), one file at a time in sorted
path order, so the result is deterministic and applies with ``patch -p1 --fuzz=0``. An empty file created or
deleted has no unified hunk: it is written as a git stanza (``new file mode 100644`` / ``deleted file mode
100644``, see :mod:`~eagle3ops.patches.diffcheck`) after the unified diffs.

:func:`diff_trees` carries every change between two trees or refuses it by name (:class:`UnsafePatch`): changes
outside the package roots, symlinks, files that are neither regular files nor directories, mode changes
(``chmod``), new executable files, new empty directories, binary files and ``*.orig``/``*.rej`` leftovers cannot
be carried by a strict patch, so they are listed instead of silently dropped. Compiled files (``__pycache__``,
``*.pyc``, ``*.pyo``) are not part of a package's source and are ignored.
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
import stat
import subprocess
from pathlib import Path

from eagle3ops.patches.diffcheck import empty_file_stanza
from eagle3ops.patches.errors import PatchToolError, UnsafePatch
from eagle3ops.patches.series import Pin

SKIP_DIRS = {"__pycache__"}
COMPILED_SUFFIXES = (".pyc", ".pyo")
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


def _entries(root: Path, only: set[str] | None) -> dict[str, os.stat_result]:
    """``rel path -> lstat`` of everything under ``root`` (dirs included; symlinks not followed; compiled files and
    ``__pycache__`` dirs skipped), or of the paths in ``only`` (and their parent dirs) when given."""
    out: dict[str, os.stat_result] = {}
    if only is not None:
        for rel in only:
            p = root / rel
            try:
                out[rel] = p.lstat()
            except FileNotFoundError:
                pass
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in dirnames + filenames:
            if name.endswith(COMPILED_SUFFIXES):
                continue
            p = Path(dirpath) / name
            out[p.relative_to(root).as_posix()] = p.lstat()
    return out


def _kind(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISREG(st.st_mode):
        return "file"
    return "special file"


def tree_changes(old_root: Path, new_root: Path, tops: tuple[str, ...], only: set[str] | None = None) -> tuple[list[tuple[str, str]], list[str]]:
    """Compare two trees and sort every difference into what a patch carries and what it cannot.

    Args:
        old_root / new_root: the trees (``base/`` and ``work/`` of a scratch dir), compared entirely - or only at
            the paths in ``only``.
        tops: the package roots a patch may change (first path component).

    Returns:
        (``[(path, how)]`` the carriable changes in path order, ``how`` one of ``edit``, ``create``, ``delete``,
        ``create-empty``, ``delete-empty``; ``["path: reason"]`` the changes a patch cannot carry).
    """
    old, new = _entries(old_root, only), _entries(new_root, only)
    carry: list[tuple[str, str]] = []
    refused: list[str] = []
    for rel in sorted(set(old) | set(new)):
        o, n = old.get(rel), new.get(rel)
        ok_, nk = (_kind(o) if o else None), (_kind(n) if n else None)
        if ok_ == "dir" and nk == "dir":
            continue
        if o is not None and n is not None and ok_ == nk == "file" and stat.S_IMODE(o.st_mode) != stat.S_IMODE(n.st_mode):
            mode_change = f"mode {stat.S_IMODE(o.st_mode):04o} -> {stat.S_IMODE(n.st_mode):04o}"
        else:
            mode_change = ""
        if ok_ == nk == "file":
            same = (old_root / rel).read_bytes() == (new_root / rel).read_bytes()
            if same and not mode_change:
                continue
        elif ok_ == nk == "symlink" and os.readlink(old_root / rel) == os.readlink(new_root / rel):
            continue
        top = rel.split("/", 1)[0]
        if top not in tops:
            refused.append(f"{rel}: outside the package root ({', '.join(t + '/' for t in tops)}); a patch changes only "
                           "its package's files - undo this change")
            continue
        if "symlink" in (ok_, nk):
            target = os.readlink(new_root / rel) if nk == "symlink" else os.readlink(old_root / rel)
            refused.append(f"{rel}: symlink (-> {target}); patches carry regular files only - replace it by a file or remove it")
            continue
        if "special file" in (ok_, nk):
            refused.append(f"{rel}: not a regular file; remove it")
            continue
        if ok_ == "dir" or nk == "dir":
            if ok_ is None:  # a new dir: fine when a file inside it is carried, else it would be lost
                if not any(k.startswith(rel + "/") and _kind(v) == "file" for k, v in new.items()):
                    refused.append(f"{rel}/: new empty directory; a patch cannot create a directory without a file - "
                                   "add a file to it (e.g. an empty __init__.py) or remove it")
                continue
            if nk is None:
                continue  # a removed dir: its files are deleted one by one
            refused.append(f"{rel}: a {ok_} replaced by a {nk}; patches cannot change a path's kind")
            continue
        if rel.endswith((".orig", ".rej")):
            refused.append(f"{rel}: leftover of a patch run (.orig/.rej); delete it")
            continue
        if mode_change:
            refused.append(f"{rel}: {mode_change} (chmod); patches carry no file modes - restore the mode "
                           f"(chmod {stat.S_IMODE(o.st_mode):o} {rel})")  # type: ignore[union-attr]
            continue
        if o is None:
            if n.st_mode & 0o111:  # type: ignore[union-attr]
                refused.append(f"{rel}: new file with mode {stat.S_IMODE(n.st_mode):04o} (executable); patches create "  # type: ignore[union-attr]
                               f"files without modes - chmod a-x {rel}")
                continue
            carry.append((rel, "create-empty" if n.st_size == 0 else "create"))  # type: ignore[union-attr]
        elif n is None:
            carry.append((rel, "delete-empty" if o.st_size == 0 else "delete"))
        else:
            carry.append((rel, "edit"))
    return carry, refused


def diff_trees(old_root: Path, new_root: Path, tops: tuple[str, ...], only: set[str] | None = None) -> str:
    """Concatenated unified diffs of every file that differs between ``old_root`` and ``new_root`` under ``tops``
    (or only at the paths in ``only``), sorted by path, followed by the git stanzas of empty files created or
    deleted; '' when the trees are equal.

    Raises:
        UnsafePatch: the trees differ in a way a patch cannot carry (see :func:`tree_changes`); every such path is
            named with the reason and the fix, and nothing is written.
        PatchToolError: a changed file is binary, or GNU diff failed.
    """
    carry, refused = tree_changes(old_root, new_root, tops, only)
    binary = []
    chunks, stanzas = [], []
    for rel, how in carry:
        if how in ("create-empty", "delete-empty"):
            stanzas.append(empty_file_stanza(rel, created=how == "create-empty"))
            continue
        o, n = old_root / rel, new_root / rel
        try:
            chunks.append(diff_file(o if how != "create" else None, n if how != "delete" else None, rel))
        except PatchToolError as e:
            if "is binary" not in e.message:
                raise
            binary.append(f"{rel}: binary file; patches carry text files only - remove the change")
    refused += binary
    if refused:
        raise UnsafePatch(
            f"{new_root}: {len(refused)} change(s) against {old_root} cannot be carried by a patch: " + "; ".join(refused),
            fix="undo or change them as each one says, then run the command again (nothing was written)",
        )
    return "".join(chunks) + "".join(stanzas)


def tree_bytes(root: Path) -> dict[str, bytes]:
    """``rel path -> bytes`` of every regular file under ``root`` (``__pycache__``/compiled files skipped; a symlink
    is recorded as ``b"symlink -> <target>"`` so a comparison sees it)."""
    out: dict[str, bytes] = {}
    for rel, st in _entries(root, None).items():
        if _kind(st) == "file":
            out[rel] = (root / rel).read_bytes()
        elif _kind(st) == "symlink":
            out[rel] = b"symlink -> " + os.fsencode(os.readlink(root / rel))
    return out


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
