"""Strict application of a series to an installed package (quilt/dpkg rules) and the manifest it leaves.

For each series of a profile, in order:

1. find the installed distribution (:func:`~eagle3ops.patches.installed.find_dist`) and refuse if its version
   differs from the series pin (``upstream.yaml``) - naming both versions;
2. check the required versions (profile ``requires`` + each patch's ``X-Eagle3ops-Requires``) unless disabled;
3. parse and validate every patch's diff (:mod:`~eagle3ops.patches.diffcheck`: no ``..``, absolute paths,
   symlinks, foreign packages);
4. **judge the tree for the series as a whole** (:mod:`~eagle3ops.patches.states`): every file the series touches
   must be the pinned wheel's file (its ``RECORD`` sha256) or the state the manifest recorded when the same series
   (or its first ``k`` patches) was applied here; else the tree is refused naming each file. The first ``k``
   patches are reported ``already-applied`` (all of them: a no-op);
5. **trial run**: copy the package's top-level dirs into a temporary tree and apply the remaining patches there,
   each hunk required to land exactly at the line its header names on the tree the earlier patches produced
   (:func:`~eagle3ops.patches.diffcheck.check_landing`, zero fuzz, zero offset), then GNU ``patch`` with zero fuzz
   (an offset it reports is refused too); only if every patch applies is the real tree touched, so a failing patch
   never leaves the installed package half-patched; failures name patch, file and hunk number + ``@@`` header;
6. write the manifest ``<site>/eagle3ops_patches/<package>.json`` (see :func:`manifest_path`) with the sha256 of
   every touched file: the recorded post-apply state a later ``apply`` of the same series recognises.

:func:`decide` (forward and reverse dry runs, offsets tolerated) is kept for ``rebase``, which carries patches to
another upstream version and regenerates their diffs.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib
import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from eagle3ops.patches.diffcheck import FileDiff, check_landing, check_targets, parse_diff, render
from eagle3ops.patches.errors import HunkRejected, PatchToolError
from eagle3ops.patches.gnupatch import PatchRun, run_patch
from eagle3ops.patches.installed import (
    InstalledDist,
    RequirementFound,
    check_requirement,
    find_dist,
    require_pin,
)
from eagle3ops.patches.series import Patch, Pin, Series
from eagle3ops.patches.states import diff_sha256, judge_tree

MANIFEST_DIR = "eagle3ops_patches"
#: ``<MANIFEST_DIR>/<package><PROBE_RECORD_SUFFIX>``: what ``eagle3ops patch probe --record`` ran and reused (the
#: image build writes it; named ``<package>.verify.json`` before the rename)
PROBE_RECORD_SUFFIX = ".probes.json"
MANIFEST_SCHEMA = 1


class Action(str, Enum):
    """What happened to one patch."""

    APPLIED = "applied"
    ALREADY_APPLIED = "already-applied"
    WOULD_APPLY = "would-apply"


@dataclass
class PatchResult:
    """Result for one patch: action taken, files touched, hunks that applied at an offset (file -> [(n, lines)])."""

    patch: Patch
    action: Action
    files: list[str]
    offsets: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


@dataclass
class SeriesResult:
    """Result for one series applied to one installed distribution."""

    series: Series
    dist: InstalledDist
    patches: list[PatchResult]
    requires_found: list[RequirementFound]
    manifest: Path | None = None


def _hunk_desc(files: list[FileDiff], path: str, number: int) -> str:
    for f in files:
        if f.path == path:
            for h in f.hunks:
                if h.number == number:
                    return f"hunk #{number} \"{h.header}\""
    return f"hunk #{number}"


def rejected_error(patch: Patch, files: list[FileDiff], fwd: PatchRun, dist_label: str) -> HunkRejected:
    """Build the :class:`HunkRejected` for a patch that neither applies nor reverse-applies.

    The message lists every failed hunk as ``<file> hunk #N (@@ -a,b +c,d @@ context)``.
    """
    details = [f"{path}: {_hunk_desc(files, path, n)} FAILED" for path, nums in fwd.failed.items() for n in nums]
    if fwd.missing:
        details.append("a file to patch does not exist")
    if not details:
        details.append("GNU patch said: " + " | ".join(fwd.output.strip().splitlines()[-4:]))
    return HunkRejected(
        f"patch {patch.name} does not apply to {dist_label} (zero fuzz): " + "; ".join(details),
        fix=f"rebase or refresh the patch ({patch.path}): eagle3ops patch new / refresh, or eagle3ops patch rebase",
    )


def decide(patch: Patch, tree: Path, top_levels: tuple[str, ...], dist_label: str) -> tuple[Action, list[FileDiff], PatchRun]:
    """Validate ``patch`` against ``tree`` and decide, by forward and reverse dry runs, what to do - for ``rebase``,
    which carries a patch to *another* upstream version: offsets are tolerated there (the diff is regenerated) and
    "its reverse applies" means "upstream has it". ``apply``/``check`` use :func:`apply_patch` instead.

    Returns (``WOULD_APPLY`` or ``ALREADY_APPLIED``, parsed files, the forward dry run).

    Raises:
        UnsafePatch: path traversal, absolute path, symlink, foreign package (nothing was touched).
        HunkRejected: rejected hunks, or a patch that applies both forward and reversed (ambiguous context).
    """
    where = f"patch {patch.name}"
    files = parse_diff(patch.diff_text, where=where)
    check_targets(files, tree, top_levels, where=where)
    text = render(files)
    if text:
        fwd = run_patch(text, tree, dry_run=True)
        rev = run_patch(text, tree, dry_run=True, reverse=True)
    else:  # only empty files created/deleted: decided by what is there
        fwd = PatchRun(ok=True, returncode=0, output="")
        rev = PatchRun(ok=True, returncode=0, output="")
    for f in files:
        if f.empty_file:
            there = (tree / f.path).is_file()
            fwd.ok = fwd.ok and (there != f.added)
            rev.ok = rev.ok and (there == f.added)
    if fwd.ok and not rev.ok:
        return Action.WOULD_APPLY, files, fwd
    if rev.ok and not fwd.ok:
        return Action.ALREADY_APPLIED, files, fwd
    if fwd.ok and rev.ok:
        raise HunkRejected(
            f"patch {patch.name} applies both forward and in reverse to {dist_label}: cannot tell whether it is "
            "already applied",
            fix="give its hunks more (unique) context lines and refresh it",
        )
    raise rejected_error(patch, files, fwd, dist_label)


def reverse_applies(patch: Patch, tree: Path) -> bool:
    """True when GNU patch would apply ``patch`` reversed to ``tree`` with zero fuzz (dry run): used only to say
    "already upstream" about a patch that does not apply forward (``check``, ``rebase``)."""
    files = parse_diff(patch.diff_text, where=f"patch {patch.name}")
    text = render(files)
    return bool(text) and run_patch(text, tree, dry_run=True, reverse=True).ok


def apply_empty_files(files: list[FileDiff], tree: Path) -> None:
    """Create or delete the empty files of a patch (its git stanzas; GNU patch is not given them). The caller has
    checked the targets (:func:`~eagle3ops.patches.diffcheck.check_targets`) and that they are absent / empty."""
    for f in files:
        if not f.empty_file:
            continue
        target = tree / f.path
        if f.added:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "x", encoding="utf-8"):
                pass
        else:
            target.unlink()


def apply_patch(patch: Patch, tree: Path, top_levels: tuple[str, ...], dist_label: str, *, dry_run: bool = False) -> PatchResult:
    """Apply one patch strictly to ``tree`` as it is now (or only check that it would, with ``dry_run``).

    Strict means: the diff is validated and its targets checked (:func:`~eagle3ops.patches.diffcheck.check_targets`);
    every hunk's old lines must be exactly at the line its header names
    (:func:`~eagle3ops.patches.diffcheck.check_landing`: zero offset, so GNU patch's search for the nearest copy of
    the context never comes into play); GNU patch then runs with zero fuzz (dry run first), and a hunk it reports
    at an offset is refused as well. Empty files (git stanzas) are created/deleted here.

    Nothing decides "already applied" here: that is judged for the whole series (:mod:`~eagle3ops.patches.states`).

    Returns:
        A :class:`PatchResult` with ``APPLIED`` (``WOULD_APPLY`` with ``dry_run``).

    Raises:
        UnsafePatch: path traversal, absolute path, symlink, foreign package (nothing was touched).
        HunkRejected: a hunk that does not match at its line, fails in GNU patch, or lands at an offset; the message
            names patch, file and hunk (number and ``@@`` header). Nothing was touched.
    """
    where = f"patch {patch.name}"
    files = parse_diff(patch.diff_text, where=where)
    check_targets(files, tree, top_levels, where=where)
    check_landing(files, tree, patch_name=patch.name)
    text = render(files)

    def exact(dry: bool) -> None:  # GNU patch, strict: a rejected hunk or one at an offset refuses the patch
        ran = run_patch(text, tree, dry_run=dry)
        if not ran.ok:
            raise rejected_error(patch, files, ran, dist_label)
        if ran.offsets:
            _refuse_offsets(patch, files, ran, dist_label)

    if text:
        exact(True)
    if dry_run:
        return PatchResult(patch=patch, action=Action.WOULD_APPLY, files=[f.path for f in files])
    if text:
        exact(False)
    apply_empty_files(files, tree)
    return PatchResult(patch=patch, action=Action.APPLIED, files=[f.path for f in files])


def _refuse_offsets(patch: Patch, files: list[FileDiff], run: PatchRun, dist_label: str) -> None:
    details = [f"{path}: {_hunk_desc(files, path, n)} at offset {o:+d}" for path, lst in run.offsets.items() for n, o in lst]
    raise HunkRejected(
        f"patch {patch.name} does not apply to {dist_label} at the lines it names (GNU patch found them at an "
        "offset): " + "; ".join(details),
        fix=f"refresh the patch ({patch.path}) against the tree the earlier patches produce: eagle3ops patch new / refresh",
    )


def _copy_package(dist: InstalledDist, dest: Path) -> None:
    for top in dist.top_levels:
        src = dist.site_dir / top
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, dest / top, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        elif (dist.site_dir / f"{top}.py").is_file():
            shutil.copy2(dist.site_dir / f"{top}.py", dest / f"{top}.py")


def apply_series(
    series: Series,
    *,
    site_dir: Path | None = None,
    profile: str | None = None,
    extra_requires: list[Pin] | None = None,
    check_requires: bool = True,
    dry_run: bool = False,
    write_manifest: bool = True,
) -> SeriesResult:
    """Apply ``series`` to the installed distribution it is pinned to.

    Args:
        series: parsed series (:func:`~eagle3ops.patches.series.load_series`).
        site_dir: dir holding the installed package (default: found via this interpreter's ``sys.path``).
        profile: profile name recorded in the manifest.
        extra_requires: the profile's required pins (checked like ``X-Eagle3ops-Requires``).
        check_requires: check required versions (off for scratch trees without the other packages).
        dry_run: decide and report only; nothing is written.
        write_manifest: write ``<site>/eagle3ops_patches/<package>.json`` (rewritten after each patch applied, so an
            apply stopped half-way leaves a recorded state the next apply of the series completes).

    Raises:
        PinMismatch: installed version differs from the series pin (nothing touched).
        RequirementMismatch: a required package is missing or another version (nothing touched).
        UnsafePatch: see :func:`apply_patch` (nothing touched).
        TreeMismatch: a touched file is neither pristine nor in the recorded applied state, naming each file
            (nothing touched; see :func:`~eagle3ops.patches.states.judge_tree`).
        HunkRejected: a hunk does not land exactly where it says (nothing touched: the trial run fails first).
    """
    dist = find_dist(series.package, site_dir)
    label = f"{dist.name} {dist.version} in {dist.site_dir}"
    require_pin(dist, series.upstream.pin, what=f"series {series.dir}")
    found: list[RequirementFound] = []
    if check_requires:
        pins: list[tuple[Pin, str]] = [(p, f"profile {profile}") for p in (extra_requires or []) if p.name != series.upstream.pin.name]
        for patch in series.patches:
            pins += [(p, f"patch {patch.name}") for p in patch.header.requires]
        seen: set[Pin] = set()
        for pin, what in pins:
            if pin in seen:
                continue
            seen.add(pin)
            found.append(check_requirement(pin, site_dir, what=what))
    parsed: list[list[FileDiff]] = []
    for patch in series.patches:
        where = f"patch {patch.name}"
        files = parse_diff(patch.diff_text, where=where)
        check_targets(files, dist.site_dir, dist.top_levels, where=where)  # symlink/traversal checks on the real tree
        parsed.append(files)
    manifest, manifest_where = _existing_manifest(dist.site_dir, series.package)
    state = judge_tree(series, parsed, dist, manifest, manifest_where)
    done = [
        PatchResult(patch=p, action=Action.ALREADY_APPLIED, files=[f.path for f in parsed[i]])
        for i, p in enumerate(series.patches[: state.applied])
    ]
    todo = series.patches[state.applied :]
    # Trial run on a copy: the real tree is only touched when the rest of the series goes through.
    trial_results: list[PatchResult] = []
    with tempfile.TemporaryDirectory(prefix="eagle3ops-trial-") as tmp:
        trial = Path(tmp)
        _copy_package(dist, trial)
        for patch in todo:
            trial_results.append(apply_patch(patch, trial, dist.top_levels, label))
    if dry_run:
        for r in trial_results:
            r.action = Action.WOULD_APPLY
        return SeriesResult(series=series, dist=dist, patches=done + trial_results, requires_found=found)
    results: list[PatchResult] = list(done)
    out = SeriesResult(series=series, dist=dist, patches=results, requires_found=found)
    for patch in todo:
        try:
            results.append(apply_patch(patch, dist.site_dir, dist.top_levels, label))
        except PatchToolError as e:
            raise type(e)(e.message + " (the trial run on a copy had passed: did the tree change meanwhile?)", fix=e.fix) from e
        if write_manifest:  # after every patch: a run stopped half-way leaves a state the next apply recognises
            out.manifest = write_manifest_file(out, profile=profile)
    if write_manifest and out.manifest is None:
        out.manifest = write_manifest_file(out, profile=profile)
    return out


def _existing_manifest(site_dir: Path, package: str) -> tuple[dict | None, str]:
    """The manifest an earlier ``apply`` left (None when absent or unreadable) and its path or why it is unusable."""
    path = manifest_path(site_dir, package)
    if not path.exists():
        return None, f"{path} does not exist"
    try:
        return read_manifest(site_dir, package), str(path)
    except PatchToolError as e:
        return None, f"{path} is unusable: {e.message}"


def manifest_path(site_dir: Path, package: str) -> Path:
    """``<site_dir>/eagle3ops_patches/<package>.json``: where :func:`apply_series` records what it applied."""
    return site_dir / MANIFEST_DIR / f"{package}.json"


def file_sha256(path: Path) -> str | None:
    """Hex sha256 of a file's bytes, or None when it does not exist."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def write_manifest_file(result: SeriesResult, *, profile: str | None) -> Path:
    """Write the manifest JSON of an applied series and return its path.

    Contents: schema, package, installed version, pin, profile, series dir, the patches in order (name, sha256 of
    the patch file and of its diff text, summary, probe, requires, action, files touched), the sha256 of each
    touched file after applying (``verify`` detects later edits with it; a later ``apply`` of the same series
    recognises the applied state by it), the required versions found installed, UTC time, tool version.
    """
    from eagle3ops import __version__

    touched = sorted({f for r in result.patches for f in r.files})
    data = {
        "schema": MANIFEST_SCHEMA,
        "package": result.dist.name,
        "version": result.dist.version,
        "pin": str(result.series.upstream.pin),
        "profile": profile,
        "series_dir": f"{result.series.dir.parent.name}/{result.series.dir.name}",
        "upstream_wheel": result.series.upstream.wheel,
        "upstream_sha256": result.series.upstream.sha256,
        "patches": [
            {
                "name": r.patch.name,
                "sha256": r.patch.sha256,
                "diff_sha256": diff_sha256(r.patch),
                "summary": r.patch.header.summary,
                "probe": r.patch.header.probe,
                "requires": [str(p) for p in r.patch.header.requires],
                "action": r.action.value,
                "files": r.files,
            }
            for r in result.patches
        ],
        "files_sha256": {f: file_sha256(result.dist.site_dir / f) for f in touched},
        "requires_found": [{"pin": str(f.pin), "dist": f.dist, "version": f.version} for f in result.requires_found],
        "applied_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "tool": f"eagle3ops {__version__}",
    }
    path = manifest_path(result.dist.site_dir, result.series.package)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def read_manifest(site_dir: Path, package: str) -> dict:
    """Read the manifest written by :func:`write_manifest_file`.

    Raises:
        PatchToolError: no manifest (the package was never patched with ``eagle3ops patch apply``) or bad JSON.
    """
    path = manifest_path(site_dir, package)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PatchToolError(
            f"no patch manifest at {path}: {package} in {site_dir} was not patched by eagle3ops",
            fix="run eagle3ops patch apply first",
        )
    except json.JSONDecodeError as e:
        raise PatchToolError(f"{path}: not valid JSON ({e})", fix="re-run eagle3ops patch apply")
    if data.get("schema") != MANIFEST_SCHEMA:
        raise PatchToolError(f"{path}: schema {data.get('schema')!r}, expected {MANIFEST_SCHEMA}", fix="re-run eagle3ops patch apply")
    return data


def patched_modules(files: list[str] | tuple[str, ...]) -> list[str]:
    """The module names of the ``.py`` files among ``files`` (paths relative to the site dir; a package's
    ``__init__.py`` gives the package)."""
    mods = []
    for f in files:
        if f.endswith(".py"):
            parts = f[:-3].split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods.append(".".join(parts))
    return mods


def import_patched(site_dir: Path, package: str) -> tuple[int, float]:
    """The ``import`` check: import every module ``apply`` patched (from the manifest in ``site_dir``).

    Returns:
        (modules imported, seconds).

    Raises:
        PatchToolError: no manifest, or a patched module does not import (the message names the module,
        the site dir and the fix).
    """
    mods = patched_modules(sorted(read_manifest(site_dir, package).get("files_sha256", {})))
    t0 = time.monotonic()
    for m in mods:
        try:
            importlib.import_module(m)
        except Exception as e:  # noqa: BLE001 - reported with its type: the check failed
            raise PatchToolError(f"import: patched module {m} ({site_dir}) does not import: {type(e).__name__}: {e}",
                                 fix="fix the patch or the pinned requirements") from None
    return len(mods), time.monotonic() - t0
