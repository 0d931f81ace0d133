"""Strict application of a series to an installed package (quilt/dpkg rules) and the manifest it leaves.

For each series of a profile, in order:

1. find the installed distribution (:func:`~eagle3ops.patches.installed.find_dist`) and refuse if its version
   differs from the series pin (``upstream.yaml``) - naming both versions;
2. check the required versions (profile ``requires`` + each patch's ``X-Eagle3ops-Requires``) unless disabled;
3. **trial run**: copy the package's top-level dirs into a temporary tree and apply the whole series there; only
   if every patch applies (or is already applied) is the real tree touched, so a failing patch never leaves the
   installed package half-patched;
4. for each patch: parse and validate the diff (:mod:`~eagle3ops.patches.diffcheck`: no ``..``, absolute paths,
   symlinks, foreign packages), then a forward and a reverse GNU ``patch --dry-run`` with zero fuzz:
   forward only -> apply; reverse only -> already applied (reported, not applied twice); both -> ambiguous,
   refused; neither -> rejected, naming patch, file and hunk number + ``@@`` header;
5. write the manifest ``<site>/eagle3ops_patches/<package>.json`` (see :func:`manifest_path`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from eagle3ops.patches.diffcheck import FileDiff, check_targets, parse_diff, render
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

MANIFEST_DIR = "eagle3ops_patches"
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
    """Validate ``patch`` against ``tree`` and decide, by forward and reverse dry runs, what to do.

    Returns (``WOULD_APPLY`` or ``ALREADY_APPLIED``, parsed files, the forward dry run).

    Raises:
        UnsafePatch: path traversal, absolute path, symlink, foreign package (nothing was touched).
        HunkRejected: rejected hunks, or a patch that applies both forward and reversed (ambiguous context).
    """
    where = f"patch {patch.name}"
    files = parse_diff(patch.diff_text, where=where)
    check_targets(files, tree, top_levels, where=where)
    text = render(files)
    fwd = run_patch(text, tree, dry_run=True)
    rev = run_patch(text, tree, dry_run=True, reverse=True)
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


def apply_patch(patch: Patch, tree: Path, top_levels: tuple[str, ...], dist_label: str, *, dry_run: bool = False) -> PatchResult:
    """Apply one patch strictly to ``tree`` (or only decide, with ``dry_run``); see :func:`decide`."""
    action, files, fwd = decide(patch, tree, top_levels, dist_label)
    if action is Action.WOULD_APPLY and not dry_run:
        real = run_patch(render(files), tree, dry_run=False)
        if not real.ok:
            raise rejected_error(patch, files, real, dist_label)
        action = Action.APPLIED
    return PatchResult(patch=patch, action=action, files=[f.path for f in files], offsets=fwd.offsets)


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
        write_manifest: write ``<site>/eagle3ops_patches/<package>.json``.

    Raises:
        PinMismatch: installed version differs from the series pin (nothing touched).
        RequirementMismatch: a required package is missing or another version (nothing touched).
        UnsafePatch / HunkRejected: see :func:`decide` (nothing touched: the trial run fails first).
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
    # Trial run on a copy: the real tree is only touched when the whole series goes through.
    trial_results: list[PatchResult] = []
    with tempfile.TemporaryDirectory(prefix="eagle3ops-trial-") as tmp:
        trial = Path(tmp)
        _copy_package(dist, trial)
        for patch in series.patches:
            where = f"patch {patch.name}"
            # symlink/traversal checks against the real tree as well as the copy
            check_targets(parse_diff(patch.diff_text, where=where), dist.site_dir, dist.top_levels, where=where)
            trial_results.append(apply_patch(patch, trial, dist.top_levels, label))
    if dry_run:
        for r in trial_results:
            if r.action is Action.APPLIED:
                r.action = Action.WOULD_APPLY
        return SeriesResult(series=series, dist=dist, patches=trial_results, requires_found=found)
    results: list[PatchResult] = []
    for patch in series.patches:
        try:
            results.append(apply_patch(patch, dist.site_dir, dist.top_levels, label))
        except PatchToolError as e:
            raise type(e)(e.message + " (the trial run on a copy had passed: did the tree change meanwhile?)", fix=e.fix) from e
    out = SeriesResult(series=series, dist=dist, patches=results, requires_found=found)
    if write_manifest:
        out.manifest = write_manifest_file(out, profile=profile)
    return out


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
    the patch file, summary, probe, requires, action, files touched), the sha256 of each touched file after
    applying (so ``verify`` detects later edits), the required versions found installed, UTC time, tool version.
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
