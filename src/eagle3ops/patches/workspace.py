"""``eagle3ops patch new`` / ``refresh``: edit a patch in a scratch tree, then write it back with its header.

``new <pkg>==<ver> <name>`` makes a scratch dir holding two copies of the pinned, pristine wheel unpacked like a
site-packages dir:

* ``base/`` - the wheel with the series applied *before* the patch being edited (for a new patch: all of it);
* ``work/`` - a copy of ``base/`` (plus the patch itself when it already exists) - edit files here;
* ``scratch.json`` - package, version, patch name, series dir;
* ``reference.patch`` - when the patch file exists in the series dir but is not listed (a patch ``rebase`` could not
  carry over): the old patch. Its hunks are applied to ``work/`` with fuzz 2 as a head start, the rejected ones
  are left in ``reference.rej`` and summarised in ``port-status.txt``; finish the port by hand, then refresh
  (which writes a strict, zero-fuzz diff).

``refresh`` diffs ``base/`` against ``work/`` (GNU diff, ``a/``/``b/`` labels), writes ``NNNN-name.patch`` into the
series dir with its DEP-3 header (kept and ``Last-Update`` bumped when the patch exists, else built from the
options) and appends it to ``series`` if it is not listed. ``base/`` is never modified, so refresh can be repeated.
Every change of ``work/`` is carried (edits, new and deleted files, empty ones included) or refused by name before
anything is written (mode changes, symlinks, changes outside the package, binaries, empty dirs: see
:func:`~eagle3ops.patches.diffgen.tree_changes`); and the diff is applied strictly to a copy of ``base/``, which
must then equal ``work/`` file for file, so nothing is dropped silently.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from eagle3ops.patches.apply import apply_patch
from eagle3ops.patches.diffcheck import parse_diff
from eagle3ops.patches.diffgen import compose_patch, diff_trees, render_header, replace_header_fields
from eagle3ops.patches.errors import PatchToolError, SeriesError
from eagle3ops.patches.installed import find_dist
from eagle3ops.patches.series import Pin, load_patch, load_series, read_series_file
from eagle3ops.patches.wheels import cache_dir, fetch_wheel, unpack_wheel

_NUMBERED = re.compile(r"^(\d{4})-[A-Za-z0-9][A-Za-z0-9._-]*\.patch$")
_SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
STATE_FILE = "scratch.json"


@dataclass
class Scratch:
    """A scratch tree made by :func:`new_scratch`."""

    dir: Path
    package: str
    version: str
    patch_name: str
    series_dir: Path
    existing: bool

    @property
    def base(self) -> Path:
        return self.dir / "base"

    @property
    def work(self) -> Path:
        return self.dir / "work"


def patch_file_name(name: str, existing: list[str]) -> str:
    """Normalise a patch name: an existing series entry or ``NNNN-slug.patch`` is kept; a bare ``slug`` gets the
    next free number (``0003-slug.patch``). Raises :class:`SeriesError` for names with odd characters."""
    if name in existing or _NUMBERED.match(name):
        return name
    slug = name[:-6] if name.endswith(".patch") else name
    if not _SLUG.match(slug):
        raise SeriesError(f"patch name {name!r} has odd characters", fix="use letters, digits, '.', '_' and '-'")
    for e in existing:
        if e.split("-", 1)[-1] == f"{slug}.patch":
            return e
    nums = [int(m.group(1)) for e in existing if (m := _NUMBERED.match(e))]
    return f"{(max(nums) + 1) if nums else 1:04d}-{slug}.patch"


def new_scratch(pin: Pin, name: str, patches_dir: Path, *, dest: Path | None = None, cache: Path | None = None, force: bool = False) -> Scratch:
    """Create the scratch tree for patch ``name`` of the series ``patches_dir/<pkg>/<ver>``.

    Raises:
        SeriesError: no such series dir; dest exists (without ``force``).
        WheelError / HunkRejected: the pinned wheel cannot be fetched or the series does not apply to it.
    """
    series_dir = patches_dir / pin.name / pin.version
    series = load_series(series_dir)
    names = [p.name for p in series.patches]
    fname = patch_file_name(name, names)
    existing = fname in names
    dest = dest or cache_dir(cache).parent / "scratch" / f"{pin.name}-{pin.version}-{fname[:-6]}"
    if dest.exists():
        if not force:
            raise SeriesError(f"scratch dir {dest} exists", fix="refresh/remove it, or pass --force to recreate it")
        shutil.rmtree(dest)
    wheel = fetch_wheel(series.upstream, cache)
    base = unpack_wheel(wheel, dest / "base")
    dist = find_dist(series.package, base)
    label = f"{dist.name} {dist.version} (scratch)"
    for p in series.patches:
        if p.name == fname:
            break
        apply_patch(p, base, dist.top_levels, label)
    shutil.copytree(base, dest / "work", symlinks=True)
    if existing:
        apply_patch(series.patch(fname), dest / "work", dist.top_levels, label)
    elif (series_dir / fname).is_file():
        # an unlisted patch file (e.g. left by a failed rebase): keep it next to the tree as the porting reference
        shutil.copy2(series_dir / fname, dest / "reference.patch")
        _start_port(dest, dist.top_levels)
    state = {"package": series.package, "version": series.version, "patch": fname, "series_dir": str(series_dir.resolve()), "existing": existing}
    (dest / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    return Scratch(dest, series.package, series.version, fname, series_dir.resolve(), existing)


def _start_port(dest: Path, tops: tuple[str, ...]) -> None:
    """Apply ``reference.patch`` to ``work/`` with fuzz 2, rejected hunks into ``reference.rej`` (a head start
    for the port; validated for unsafe paths first). Writes a one-line summary to ``port-status.txt``."""
    from eagle3ops.patches.diffcheck import check_targets, render
    from eagle3ops.patches.gnupatch import run_patch_fuzzy
    from eagle3ops.patches.series import split_header

    text = (dest / "reference.patch").read_text(encoding="utf-8")
    _h, diff = split_header(text, where=str(dest / "reference.patch"))
    files = parse_diff(diff, where="reference.patch")
    check_targets(files, dest / "work", tops, where="reference.patch")
    run = run_patch_fuzzy(render(files), dest / "work", dest / "reference.rej")
    total = sum(len(f.hunks) for f in files)
    failed = sum(len(v) for v in run.failed.values())
    ignored = sum(run.ignored.values())
    status = f"reference.patch: {total - failed - ignored} of {total} hunks applied to work/ (fuzz <= 2)"
    if ignored:
        status += "; skipped as already applied upstream: " + "; ".join(f"{f} ({n} hunks)" for f, n in run.ignored.items())
    if failed:
        status += f"; {failed} rejected into reference.rej: " + "; ".join(f"{f} #{', #'.join(map(str, n))}" for f, n in run.failed.items())
    (dest / "port-status.txt").write_text(status + "\n", encoding="utf-8")


def _check_round_trip(sc: Scratch, diff: str, tops: tuple[str, ...]) -> None:
    """Apply ``diff`` strictly to a copy of ``base/`` and require the result to equal ``work/`` (every regular file's
    bytes, which files exist, symlinks; compiled files ignored).

    Raises:
        PatchToolError: naming each path where the patched copy and ``work/`` differ.
    """
    import tempfile

    from eagle3ops.patches.apply import apply_empty_files
    from eagle3ops.patches.diffcheck import check_landing, check_targets, render
    from eagle3ops.patches.diffgen import tree_bytes
    from eagle3ops.patches.gnupatch import run_patch

    where = f"refreshed {sc.patch_name}"
    files = parse_diff(diff, where=where)
    with tempfile.TemporaryDirectory(prefix="eagle3ops-refresh-") as tmp:
        copy = Path(tmp) / "base"
        shutil.copytree(sc.base, copy, symlinks=True)
        check_targets(files, copy, tops, where=where)
        check_landing(files, copy, patch_name=sc.patch_name)
        if render(files):
            run = run_patch(render(files), copy, dry_run=False)
            if not run.ok or run.offsets:
                raise PatchToolError(f"{where} does not apply to {sc.base}: {run.output.strip()}", fix="report this: GNU diff and patch disagree")
        apply_empty_files(files, copy)
        got, want = tree_bytes(copy), tree_bytes(sc.work)
    lost = sorted(p for p in set(got) | set(want) if got.get(p) != want.get(p))
    if lost:
        raise PatchToolError(
            f"{where}: applied to a copy of {sc.base} it does not reproduce {sc.work} at: {', '.join(lost)}",
            fix="these changes cannot be expressed by the patch; undo them in work/ and refresh again (nothing was written)",
        )


def load_scratch(dest: Path) -> Scratch:
    """Read ``scratch.json`` of a scratch dir; :class:`SeriesError` if it is not one."""
    try:
        st = json.loads((dest / STATE_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SeriesError(f"{dest} is not a scratch dir (no {STATE_FILE})", fix="create one with eagle3ops patch new")
    return Scratch(Path(dest), st["package"], st["version"], st["patch"], Path(st["series_dir"]), bool(st.get("existing")))


def refresh(
    dest: Path,
    *,
    description: str | None = None,
    probe: str | None = None,
    requires: list[Pin] | None = None,
    origin: str = "vendor",
    bug: str | None = None,
    forwarded: str | None = None,
) -> Path:
    """Write the scratch tree's changes as a patch into its series dir; return the patch path.

    For an existing patch the header is kept (``Last-Update`` set to today; ``Description``/``X-Eagle3ops-Probe``/
    ``X-Eagle3ops-Requires`` replaced when given). For a new patch ``description`` and ``probe`` are required.

    Raises:
        PatchToolError: no changes between ``base/`` and ``work/``, or the diff applied to a copy of ``base/`` does
            not reproduce ``work/`` (the paths that differ are named; nothing is written).
        UnsafePatch: ``work/`` holds changes a patch cannot carry, each named with its fix (nothing is written).
        SeriesError: missing description/probe for a new patch, or the written header does not validate.
    """
    sc = load_scratch(dest)
    dist = find_dist(sc.package, sc.base)
    diff = diff_trees(sc.base, sc.work, dist.top_levels)
    if not diff:
        raise PatchToolError(f"no changes in {sc.work} against {sc.base}", fix="edit files under work/ first")
    _check_round_trip(sc, diff, dist.top_levels)
    target = sc.series_dir / sc.patch_name
    pin = Pin(sc.package, sc.version)
    today = _dt.date.today()
    if target.exists():
        old = load_patch(target, name=sc.patch_name)  # may still carry the pin of the series it was rebased from
        updates = {"Last-Update": today.isoformat(), "X-Eagle3ops-Pin": str(pin)}
        if description:
            lines = description.strip().splitlines()
            updates["Description"] = lines[0] + "".join("\n " + (x if x.strip() else ".") for x in lines[1:])
        if probe:
            updates["X-Eagle3ops-Probe"] = probe
        if requires:
            updates["X-Eagle3ops-Requires"] = ", ".join(map(str, requires))
        header = replace_header_fields(old.header_text, updates)
    else:
        if not description or not probe:
            raise SeriesError(
                f"new patch {sc.patch_name} needs a description and a probe",
                fix="pass --description '...' --probe <name> (a key of eagle3ops.patches.probes.PROBES)",
            )
        header = render_header(
            description=description, pin=pin, probe=probe, requires=requires, origin=origin, bug=bug,
            forwarded=forwarded or ("no" if not bug else None), last_update=today,
        )
    tmp = target.with_suffix(".patch.tmp")
    tmp.write_text(compose_patch(header, diff), encoding="utf-8")
    try:
        load_patch(tmp, expected_pin=pin, name=sc.patch_name)
    except PatchToolError:
        tmp.unlink()
        raise
    tmp.replace(target)
    series_file = sc.series_dir / "series"
    listed = read_series_file(series_file) if series_file.exists() else []
    if sc.patch_name not in listed:
        text = series_file.read_text(encoding="utf-8") if series_file.exists() else ""
        if text and not text.endswith("\n"):
            text += "\n"
        series_file.write_text(text + sc.patch_name + "\n", encoding="utf-8")
    return target
