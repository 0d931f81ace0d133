"""Inspect a unified diff before anything is touched: parse it, reject unsafe targets, list its hunks.

The diff is parsed with :mod:`unidiff`. Each file's old and new names are checked after stripping one component
(``-p1``): no absolute path, no ``..``, no empty/odd component, first component must be a top-level package of the
distribution being patched (so ``speculators/...`` may be touched, but not ``vllm/...`` or the ``.dist-info``),
and no existing component of the target under the site dir may be a symlink (GNU patch would write through it).
Renames, copies, mode changes and binary hunks are refused: the strict applier only edits regular files' text.

Only the validated content is handed to GNU patch: :func:`render` rebuilds the diff from the parsed files and hunks,
dropping everything else (headers, garbage, ``Index:`` lines, anything GNU patch might interpret as another diff
format such as an ed script).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from eagle3ops.patches.errors import PatchToolError, SeriesError, UnsafePatch

DEV_NULL = "/dev/null"
_GIT_UNSUPPORTED = re.compile(
    r"^(old mode|new mode|deleted file mode|new file mode|rename from|rename to|copy from|copy to|"
    r"similarity index|dissimilarity index|GIT binary patch|Binary files )"
)
_OK_COMPONENT = re.compile(r"^[A-Za-z0-9_.+@=-][A-Za-z0-9_.+@= -]*$")


@dataclass(frozen=True)
class Hunk:
    """One hunk: its 1-based number within its file (GNU patch numbers hunks per file) and its ``@@`` header."""

    number: int
    header: str
    source_start: int
    source_length: int
    target_start: int
    target_length: int


@dataclass(frozen=True)
class FileDiff:
    """One file of a diff.

    Attributes:
        path: path relative to the site dir after ``-p1`` (``speculators/x.py``).
        added / removed: the diff creates / deletes the file.
        hunks: its hunks, numbered from 1.
        text: the validated ``---``/``+++``/hunks text of this file (see :func:`render`).
    """

    path: str
    added: bool
    removed: bool
    hunks: tuple[Hunk, ...]
    text: str


def _strip1(name: str, *, where: str) -> str:
    """Apply ``-p1`` to a diff file name and validate the rest; raise :class:`UnsafePatch` when unsafe."""
    if name.startswith("/"):
        raise UnsafePatch(f"{where}: absolute path {name!r} in diff", fix="diff paths must be a/<package>/... and b/<package>/...")
    parts = PurePosixPath(name).parts
    if len(parts) < 2:
        raise UnsafePatch(f"{where}: path {name!r} has no a/ or b/ prefix to strip (-p1)", fix="regenerate the diff with a/ b/ prefixes")
    rest = parts[1:]
    for comp in rest:
        if comp in ("..", "."):
            raise UnsafePatch(f"{where}: path {name!r} contains {comp!r} (path traversal)", fix="diff paths must stay inside the package")
        if not _OK_COMPONENT.match(comp):
            raise UnsafePatch(f"{where}: path {name!r} has an unusual component {comp!r}", fix="use plain file names")
    if "\\" in name:
        raise UnsafePatch(f"{where}: path {name!r} contains a backslash", fix="use POSIX paths")
    return "/".join(rest)


def parse_diff(diff_text: str, *, where: str) -> list[FileDiff]:
    """Parse ``diff_text`` into validated :class:`FileDiff` objects (no filesystem access).

    Raises:
        SeriesError: the text is not a parseable unified diff, or contains no file.
        UnsafePatch: absolute path, ``..``, no ``-p1`` prefix, rename/copy/mode change/binary, a file listed twice,
            or old and new names that differ.
    """
    try:
        from unidiff import PatchSet
        from unidiff.errors import UnidiffParseError
    except ImportError:
        raise PatchToolError(
            "the Python package 'unidiff' is not installed (eagle3ops patch parses diffs with it)",
            fix="pip install unidiff (driver venv: pyproject dependency; image: add it to the pipeline requirements)",
        ) from None
    try:
        ps = PatchSet(diff_text)
    except UnidiffParseError as e:
        raise SeriesError(f"{where}: not a valid unified diff ({e})", fix="regenerate it with diff -u / git diff")
    if len(ps) == 0:
        raise SeriesError(f"{where}: contains no file diff", fix="a patch must change at least one file")
    out: list[FileDiff] = []
    seen: set[str] = set()
    for f in ps:
        for line in str(f.patch_info or "").splitlines():
            if _GIT_UNSUPPORTED.match(line):
                raise UnsafePatch(
                    f"{where}: unsupported diff feature {line.strip()!r} for {f.path!r}",
                    fix="patches may only edit, create or delete regular text files (no renames, modes, binaries, symlinks)",
                )
        if f.is_binary_file or f.is_rename:
            raise UnsafePatch(f"{where}: binary or rename diff for {f.path!r}", fix="edit text files only")
        src = f.source_file.split("\t", 1)[0]
        tgt = f.target_file.split("\t", 1)[0]
        added = src == DEV_NULL
        removed = tgt == DEV_NULL
        if added and removed:
            raise UnsafePatch(f"{where}: both sides are /dev/null", fix="remove that file diff")
        s = None if added else _strip1(src, where=where)
        t = None if removed else _strip1(tgt, where=where)
        if s is not None and t is not None and s != t:
            raise UnsafePatch(
                f"{where}: old name {src!r} and new name {tgt!r} differ", fix="renames are not supported; old and new must be the same file"
            )
        path = t or s
        assert path is not None
        if path in seen:
            raise UnsafePatch(f"{where}: {path!r} appears twice in one patch", fix="merge the two diffs of that file")
        seen.add(path)
        hunks = tuple(
            Hunk(
                number=i,
                header=f"@@ -{h.source_start},{h.source_length} +{h.target_start},{h.target_length} @@"
                + (f" {h.section_header}" if h.section_header else ""),
                source_start=h.source_start,
                source_length=h.source_length,
                target_start=h.target_start,
                target_length=h.target_length,
            )
            for i, h in enumerate(f, start=1)
        )
        if not hunks:
            raise UnsafePatch(f"{where}: {path!r} has no hunks", fix="empty file diffs (mode/rename only) are not supported")
        old_name = DEV_NULL if added else f"a/{path}"
        new_name = DEV_NULL if removed else f"b/{path}"
        text = f"--- {old_name}\n+++ {new_name}\n" + "".join(str(h) for h in f)
        out.append(FileDiff(path=path, added=added, removed=removed, hunks=hunks, text=text))
    return out


def render(files: list[FileDiff]) -> str:
    """The validated diff text fed to GNU patch (only ``---``/``+++`` lines and hunks)."""
    return "".join(f.text for f in files)


def check_targets(files: list[FileDiff], site_dir: Path, top_levels: tuple[str, ...], *, where: str) -> None:
    """Check each file of a diff against the tree it will be applied to.

    Rules: the first path component must be one of ``top_levels`` (the package roots of the distribution);
    no existing component below ``site_dir`` may be a symlink; the resolved target must stay inside
    ``site_dir/<top level>``; an existing target must be a regular file (a missing one is left to GNU patch, which
    rejects the patch).

    Raises:
        UnsafePatch: naming the patch (``where``), the path and the rule broken.
    """
    site = site_dir.resolve()
    for f in files:
        parts = PurePosixPath(f.path).parts
        if parts[0] not in top_levels:
            raise UnsafePatch(
                f"{where}: {f.path!r} is outside the package root (allowed: {', '.join(t + '/' for t in top_levels)})",
                fix="a series may only change the files of its own package",
            )
        cur = site
        for comp in parts:
            cur = cur / comp
            if cur.is_symlink():
                raise UnsafePatch(
                    f"{where}: {f.path!r} goes through a symlink ({cur} -> {cur.readlink()})",
                    fix="patches never write through symlinks; reinstall the package from its wheel",
                )
        target = site / f.path
        root = (site / parts[0]).resolve()
        if not str(target.resolve()).startswith(str(root) + "/"):
            raise UnsafePatch(f"{where}: {f.path!r} resolves outside {root}", fix="fix the diff paths")
        if target.exists() and not target.is_file():
            raise UnsafePatch(f"{where}: {target} exists but is not a regular file", fix="patches edit regular files only")
