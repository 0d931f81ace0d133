"""Inspect a unified diff before anything is touched: parse it, reject unsafe targets, list its hunks.

The diff is parsed with :mod:`unidiff`. Each file's old and new names are checked after stripping one component
(``-p1``): no absolute path, no ``..``, no empty/odd component, first component must be a top-level package of the
distribution being patched (so ``speculators/...`` may be touched, but not ``vllm/...`` or the ``.dist-info``),
and no existing component of the target under the site dir may be a symlink (GNU patch would write through it).
Renames, copies, mode changes and binary hunks are refused: the strict applier only edits regular files' text.
The one git extended header accepted is the creation or deletion of an *empty* regular file (a unified diff has no
hunk for it): ``diff --git a/P b/P`` followed by ``new file mode 100644`` or ``deleted file mode 100644`` (and an
optional ``index`` line), with no hunks; such a file is created/removed by :mod:`~eagle3ops.patches.apply` itself,
never by GNU patch.

Only the validated content is handed to GNU patch: :func:`render` rebuilds the diff from the parsed files and hunks,
dropping everything else (headers, garbage, ``Index:`` lines, anything GNU patch might interpret as another diff
format such as an ed script).

:func:`check_landing` checks, before GNU patch runs, that every hunk's old lines are exactly at the line its
``@@ -a,b`` header names in the tree it is about to be applied to: GNU patch would otherwise search outwards and
take the *nearest* copy of the context (the wrong one when a file holds the same block twice).
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
# the git extended header lines of an empty regular file created or deleted (no hunks), see the module docstring
EMPTY_NEW = "new file mode 100644"
EMPTY_DELETED = "deleted file mode 100644"
_GIT_DIFF_LINE = re.compile(r"^diff --git (\S+) (\S+)$")
_GIT_INDEX_LINE = re.compile(r"^index [0-9a-f]+\.\.[0-9a-f]+( 100644)?$")
_OK_COMPONENT = re.compile(r"^[A-Za-z0-9_.+@=-][A-Za-z0-9_.+@= -]*$")


@dataclass(frozen=True)
class Hunk:
    """One hunk: its 1-based number within its file (GNU patch numbers hunks per file) and its ``@@`` header.

    ``source_lines`` are the old file's lines the hunk covers (context and removed lines, in order, each with its
    line end; the last one without ``\\n`` when the diff marks ``\\ No newline at end of file``).
    """

    number: int
    header: str
    source_start: int
    source_length: int
    target_start: int
    target_length: int
    source_lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class FileDiff:
    """One file of a diff.

    Attributes:
        path: path relative to the site dir after ``-p1`` (``speculators/x.py``).
        added / removed: the diff creates / deletes the file.
        hunks: its hunks, numbered from 1; empty only for an empty file created or deleted (``added``/``removed``).
        text: the validated ``---``/``+++``/hunks text of this file (see :func:`render`), or for an empty file
            its git stanza (``diff --git``, ``new file mode 100644`` / ``deleted file mode 100644``).
    """

    path: str
    added: bool
    removed: bool
    hunks: tuple[Hunk, ...]
    text: str

    @property
    def empty_file(self) -> bool:
        """True for the creation or deletion of an empty file (no hunks; GNU patch is not given it)."""
        return not self.hunks


def _source_lines(hunk) -> tuple[str, ...]:
    """The old-side lines of a unidiff hunk, honouring ``\\ No newline at end of file`` markers."""
    out: list[str] = []
    last_kind = None
    for line in hunk:
        if line.line_type == "\\":
            if last_kind in (" ", "-") and out and out[-1].endswith("\n"):
                out[-1] = out[-1][:-1]
            continue
        last_kind = line.line_type
        if line.line_type in (" ", "-"):
            out.append(line.value)
    return tuple(out)


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
    seen: set[str] = set()
    return [_file_diff(f, where=where, seen=seen) for f in ps]


def _file_diff(f, *, where: str, seen: set[str]) -> FileDiff:
    """One file's diff of a patch (a :class:`unidiff.PatchedFile`), validated: a plain edit, creation or deletion of
    a text file under the ``-p1`` prefix, with hunks (or an empty file's git stanza), named once in the patch
    (``seen``: the paths so far, this one added).

    Raises:
        UnsafePatch: as :func:`parse_diff` says.
    """
    git_empty: str | None = None
    info = [ln.rstrip("\r\n") for ln in str(f.patch_info or "").splitlines()]
    for line in info:
        if line.strip() in (EMPTY_NEW, EMPTY_DELETED) and len(f) == 0:
            git_empty = line.strip()
            continue
        if _GIT_UNSUPPORTED.match(line):
            raise UnsafePatch(
                f"{where}: unsupported diff feature {line.strip()!r} for {f.path!r}",
                fix="patches may only edit, create or delete regular text files (no renames, modes, binaries, "
                "symlinks; an empty file only as 'new file mode 100644' / 'deleted file mode 100644')",
            )
    if f.is_binary_file or f.is_rename:
        raise UnsafePatch(f"{where}: binary or rename diff for {f.path!r}", fix="edit text files only")
    if git_empty is not None:
        return _empty_file_diff(f, info, git_empty, where=where, seen=seen)
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
            source_lines=_source_lines(h),
        )
        for i, h in enumerate(f, start=1)
    )
    if not hunks:
        raise UnsafePatch(
            f"{where}: {path!r} has no hunks",
            fix="an empty file is created or deleted with a git stanza ('diff --git a/P b/P' + 'new file mode "
            "100644' or 'deleted file mode 100644'); mode/rename-only diffs are not supported",
        )
    old_name = DEV_NULL if added else f"a/{path}"
    new_name = DEV_NULL if removed else f"b/{path}"
    text = f"--- {old_name}\n+++ {new_name}\n" + "".join(str(h) for h in f)
    return FileDiff(path=path, added=added, removed=removed, hunks=hunks, text=text)


def _empty_file_diff(f, info: list[str], kind: str, *, where: str, seen: set[str]) -> FileDiff:
    """The :class:`FileDiff` of an empty file created or deleted by a git stanza (validated: one ``diff --git``
    line naming the same path on both sides, the mode line, at most an ``index`` line; nothing else)."""
    git = [ln for ln in info if ln.startswith("diff --git ")]
    m = _GIT_DIFF_LINE.match(git[0]) if len(git) == 1 else None
    if m is None:
        raise UnsafePatch(f"{where}: {kind!r} without exactly one 'diff --git a/P b/P' line", fix="regenerate it with eagle3ops patch refresh")
    a, b = _strip1(m.group(1), where=where), _strip1(m.group(2), where=where)
    if a != b:
        raise UnsafePatch(f"{where}: {m.group(0)!r} names two paths", fix="renames are not supported")
    for ln in info:
        if ln and ln != git[0] and ln.strip() != kind and not _GIT_INDEX_LINE.match(ln):
            raise UnsafePatch(f"{where}: unexpected line {ln!r} in the stanza of the empty file {a!r}", fix="keep only the 'diff --git' and mode lines")
    if a in seen:
        raise UnsafePatch(f"{where}: {a!r} appears twice in one patch", fix="merge the two diffs of that file")
    seen.add(a)
    return FileDiff(path=a, added=kind == EMPTY_NEW, removed=kind == EMPTY_DELETED, hunks=(), text=empty_file_stanza(a, created=kind == EMPTY_NEW))


def empty_file_stanza(path: str, *, created: bool) -> str:
    """The git stanza that creates (``created``) or deletes the empty regular file ``path`` (site-relative)."""
    return f"diff --git a/{path} b/{path}\n{EMPTY_NEW if created else EMPTY_DELETED}\n"


def render(files: list[FileDiff]) -> str:
    """The validated diff text fed to GNU patch (only ``---``/``+++`` lines and hunks; empty-file stanzas are left
    out: :mod:`~eagle3ops.patches.apply` creates/removes those files itself)."""
    return "".join(f.text for f in files if not f.empty_file)


def _landing_detail(lines: list[str], hunk: Hunk) -> str:
    """Where ``hunk``'s old lines are in ``lines`` instead (the nearest copies, as offsets), or that they are not."""
    n = len(hunk.source_lines)
    want = list(hunk.source_lines)
    at = [i + 1 for i in range(0, max(0, len(lines) - n + 1)) if lines[i : i + n] == want]
    if not at:
        return "its context and removed lines are not in the file"
    offs = sorted((a - hunk.source_start for a in at), key=lambda o: (abs(o), o))
    return "its lines are at offset " + ", ".join(f"{o:+d}" for o in offs[:3]) + (" (and more)" if len(offs) > 3 else "") + " instead"


def check_landing(files: list[FileDiff], tree: Path, *, patch_name: str) -> None:
    """Check that every hunk lands exactly where its header says, in ``tree`` as it is now (offset 0).

    For an edited or deleted file, each hunk's old lines (:attr:`Hunk.source_lines`) must equal the file's lines
    starting at ``source_start`` (1-based; GNU patch reads hunks against the unpatched file, so every hunk of a
    file is checked against the same bytes); a deleted file must consist of exactly its hunk's old lines; a created
    file must not exist; an empty file to delete must exist and be empty. Lines are split after ``\\n`` only
    (as GNU patch does).

    Raises:
        HunkRejected: naming the patch, file, hunk number and ``@@`` header, and where the lines are instead
            (GNU patch would have applied the hunk there: at an offset, possibly on another copy of the context).
    """
    from eagle3ops.patches.errors import HunkRejected

    problems: list[str] = []
    for f in files:
        target = tree / f.path
        if f.added:
            if target.exists() or target.is_symlink():
                problems.append(f"{f.path}: the patch creates it but it already exists")
            continue
        if not target.is_file():
            problems.append(f"{f.path}: does not exist")
            continue
        data = target.read_bytes().decode("utf-8", "surrogateescape")
        if f.empty_file:
            if data:
                problems.append(f"{f.path}: the patch deletes it as an empty file but it holds {len(data)} characters")
            continue
        lines = _split_nl(data)
        bad = False
        for h in f.hunks:
            start = h.source_start - 1 if h.source_length else h.source_start
            if start > len(lines) or lines[start : start + h.source_length] != list(h.source_lines) \
                    or len(h.source_lines) != h.source_length:
                bad = True
                problems.append(f"{f.path}: hunk #{h.number} \"{h.header}\" does not match at line {h.source_start}: "
                                + _landing_detail(lines, h))
        if f.removed and not bad and sum(len(h.source_lines) for h in f.hunks) != len(lines):
            problems.append(f"{f.path}: the patch deletes it but the file has lines its hunks do not cover")
    if problems:
        raise HunkRejected(
            f"patch {patch_name} does not apply at the lines it names (zero fuzz, zero offset): " + "; ".join(problems),
            fix="the tree differs from the one the patch was made for: refresh the patch against the series "
            "(eagle3ops patch new / refresh), or carry the series to this upstream with eagle3ops patch rebase",
        )


def _split_nl(data: str) -> list[str]:
    """``data`` split after each ``\\n`` only (``str.splitlines`` would also split at ``\\r``, form feeds...)."""
    parts = data.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


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
