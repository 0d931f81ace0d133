"""Run GNU ``patch`` strictly and parse what it reports.

Flags (quilt/dpkg-source rules): ``-p1`` (paths ``a/<pkg>/...``), ``--fuzz=0`` (every context line must match;
GNU patch still tolerates a line offset, which it reports: ``apply``/``check`` refuse any reported offset, and
check beforehand that every hunk is exactly at its line, see :func:`eagle3ops.patches.diffcheck.check_landing`),
``--batch`` (never ask), ``--no-backup-if-mismatch`` and ``--reject-file=-`` (leave no ``.orig``/``.rej``
droppings), ``--unified`` (the input is read only as a unified diff, never as an ed script or context diff),
``--forward --force``: ``--batch`` alone *assumes* a patch that looks reversed should be reversed; ``--forward``
stops that and ``--force`` makes GNU patch try every hunk as given and report each failed hunk instead of skipping
the whole file. Whether a series is already applied is judged from file hashes
(:mod:`eagle3ops.patches.states`); a reverse dry run (:func:`run_patch` with ``reverse=True``) only tells
``rebase``/``check`` that upstream already has a patch. ``LC_ALL=C`` keeps the messages parseable.

Requires GNU patch (2.7 tested; Debian package ``patch``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from eagle3ops.patches.errors import PatchToolError

_FILE_RE = re.compile(r"^(?:checking|patching) file (.+)$")
_FAILED_RE = re.compile(r"^Hunk #(\d+) FAILED at (\d+)")
_OFFSET_RE = re.compile(r"^Hunk #(\d+) succeeded at (\d+)(?: with fuzz \d+)? \(offset (-?\d+) lines?\)")
_FUZZ_RE = re.compile(r"^Hunk #(\d+) succeeded at \d+ with fuzz")
_MISSING_RE = re.compile(r"^(?:can't find file to patch|No file to patch)")
_NOT_REGULAR_RE = re.compile(r"^File (.+) is not a regular file")
_IGNORED_RE = re.compile(r"^(\d+) out of \d+ hunks? ignored")


@dataclass
class PatchRun:
    """Outcome of one ``patch`` invocation.

    Attributes:
        ok: exit status 0.
        failed: file -> numbers of hunks GNU patch reported FAILED (1-based, per file).
        offsets: file -> list of (hunk number, offset in lines) for hunks that applied at another line.
        missing: True when GNU patch could not find a file to patch.
        output: combined stdout+stderr (for error messages).
    """

    ok: bool
    returncode: int
    output: str
    failed: dict[str, list[int]] = field(default_factory=dict)
    offsets: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    missing: bool = False
    fuzzed: bool = False
    ignored: dict[str, int] = field(default_factory=dict)


def patch_binary() -> str:
    """Path of GNU patch; :class:`PatchToolError` if absent or not GNU."""
    exe = shutil.which("patch")
    if not exe:
        raise PatchToolError(
            "GNU patch is not installed (eagle3ops patch apply/check/new/rebase run it)",
            fix="install it: apt-get install -y --no-install-recommends patch (Debian/Ubuntu; also in the image)",
        )
    return exe


def run_patch(diff_text: str, cwd: Path, *, dry_run: bool, reverse: bool = False) -> PatchRun:
    """Apply (or dry-run) ``diff_text`` with GNU patch in ``cwd`` (the site dir) using the strict flags above.

    Args:
        diff_text: a validated unified diff (see :func:`eagle3ops.patches.diffcheck.render`).
        cwd: directory the ``-p1`` paths are relative to.
        dry_run: pass ``--dry-run`` (nothing is written).
        reverse: pass ``-R`` (``rebase``/``check``: does upstream already have the patch).
    """
    argv = [
        patch_binary(), "-p1", "--fuzz=0", "--batch", "--forward", "--force", "--unified",
        "--no-backup-if-mismatch", "--reject-file=-", "--quoting-style=literal", "-d", str(cwd),
    ]
    if dry_run:
        argv.append("--dry-run")
    if reverse:
        argv.append("-R")
    run = _run(argv, diff_text)
    if run.fuzzed:  # cannot happen with --fuzz=0; refuse rather than trust it
        run.ok = False
    return run


def run_patch_fuzzy(diff_text: str, cwd: Path, reject_file: Path, fuzz: int = 2) -> PatchRun:
    """Apply ``diff_text`` leniently (``--fuzz=N``, failed hunks written to ``reject_file``) - only for starting a
    port in a scratch tree (``patch new`` on a patch ``rebase`` could not carry): the result is reviewed by a
    person and written back strictly by ``refresh``. Never used by ``apply``/``check``."""
    argv = [
        patch_binary(), "-p1", f"--fuzz={fuzz}", "--batch", "--forward", "--unified", "--no-backup-if-mismatch",
        f"--reject-file={reject_file}", "--quoting-style=literal", "-d", str(cwd),
    ]
    return _run(argv, diff_text)


def _run(argv: list[str], diff_text: str) -> PatchRun:
    """Run GNU patch (``argv``) on ``diff_text`` in the C locale, with the environment variables that change its
    behaviour (``POSIXLY_CORRECT``, ``PATCH_GET``, ``SIMPLE_BACKUP_SUFFIX``, ``VERSION_CONTROL``) removed, and read
    its report: per file the FAILED hunks, the offsets, the ignored hunks; a missing file; any fuzz."""
    env = dict(os.environ, LC_ALL="C", LANG="C")
    for name in ("POSIXLY_CORRECT", "PATCH_GET", "SIMPLE_BACKUP_SUFFIX", "VERSION_CONTROL"):
        env.pop(name, None)
    proc = subprocess.run(argv, input=diff_text.encode("utf-8"), capture_output=True, env=env, check=False)
    out = proc.stdout.decode("utf-8", "replace") + proc.stderr.decode("utf-8", "replace")
    run = PatchRun(ok=proc.returncode == 0, returncode=proc.returncode, output=out)
    current = ""
    for line in out.splitlines():
        if m := _FILE_RE.match(line):
            current = m.group(1).strip()
        elif m := _FAILED_RE.match(line):
            run.failed.setdefault(current, []).append(int(m.group(1)))
        elif m := _OFFSET_RE.match(line):
            run.offsets.setdefault(current, []).append((int(m.group(1)), int(m.group(3))))
        elif m := _IGNORED_RE.match(line):
            run.ignored[current] = int(m.group(1))
        elif _MISSING_RE.match(line):
            run.missing = True
        if _FUZZ_RE.match(line):
            run.fuzzed = True
    return run
