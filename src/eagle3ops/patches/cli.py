"""``eagle3ops patch ...``: the patch tooling's command line (mounted by ``eagle3ops.cli``).

Also runnable alone as ``python -m eagle3ops.patches ...`` (used by the Dockerfile and the tests). Every command
exits 0 on success and with the error's own non-zero code on failure (see :mod:`eagle3ops.patches.errors`),
printing the cause and the fix to stderr.
"""

from __future__ import annotations

import functools
import json
import time
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from eagle3ops.patches.errors import PatchToolError

app = typer.Typer(
    no_args_is_help=True,
    help="Checked-in, pinned, strictly applied and behaviourally probed patch series (quilt/dpkg rules).",
)

PatchesDir = Annotated[Optional[Path], typer.Option("--patches-dir", help="patches/ dir (default: $EAGLE3OPS_PATCHES_DIR or found upwards)")]
SiteDir = Annotated[Optional[Path], typer.Option("--site-dir", help="dir holding the installed package (default: this interpreter's)")]
ProfileOpt = Annotated[Optional[str], typer.Option("--profile", help="profile in patches/profiles.yaml (default: its default)")]
CacheDir = Annotated[Optional[Path], typer.Option("--cache-dir", help="wheel cache (default: ~/.cache/eagle3ops/wheels)")]


def _err(msg: str) -> None:
    typer.echo(msg, err=True)


def handled(fn):
    """Turn :class:`PatchToolError` into ``error: ...`` on stderr and the error's exit code."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except PatchToolError as e:
            _err(f"error: {e}")
            raise typer.Exit(e.exit_code)

    return wrapper


def _profiles(patches_dir: Path | None):
    from eagle3ops.patches.series import find_patches_dir, load_profiles

    return load_profiles(find_patches_dir(patches_dir))


@app.command("list")
@handled
def list_cmd(patches_dir: PatchesDir = None, profile: ProfileOpt = None) -> None:
    """List the profiles and the patches of each series."""
    from eagle3ops.patches.series import load_series

    profs = _profiles(patches_dir)
    names = [profile] if profile else list(profs.profiles)
    bad = 0
    for n in names:
        p = profs.get(n)
        typer.echo(f"profile {p.name}{' (default)' if p.name == profs.default else ''}: requires {', '.join(map(str, p.requires))}")
        for d in p.series_dirs:
            try:
                s = load_series(d)
            except PatchToolError as e:
                typer.echo(f"  series {d}: ERROR {e}")
                bad += 1
                continue
            typer.echo(f"  series {s.dir} ({s.upstream.wheel} sha256 {s.upstream.sha256[:12]}...)")
            for pt in s.patches:
                typer.echo(f"    {pt.name}  probe={pt.header.probe}  {pt.header.summary}")
    if bad:
        raise typer.Exit(2)


@app.command("apply")
@handled
def apply_cmd(
    patches_dir: PatchesDir = None,
    profile: ProfileOpt = None,
    site_dir: SiteDir = None,
    package: Annotated[Optional[str], typer.Option(help="only the series of this package")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="decide and report; change nothing")] = False,
    require_check: Annotated[bool, typer.Option("--require-check/--no-require-check", help="check X-Eagle3ops-Requires and profile requires are installed")] = True,
) -> None:
    """Apply a profile's series to the installed packages: pin checked, zero fuzz, -p1, series order; already
    applied patches are reported and skipped; a manifest is written next to the package."""
    from eagle3ops.patches.apply import apply_series
    from eagle3ops.patches.series import normalize_name

    profs = _profiles(patches_dir)
    prof = profs.get(profile)
    series_list = [s for s in prof.load() if package is None or normalize_name(s.package) == normalize_name(package)]
    if not series_list:
        raise PatchToolError(f"profile {prof.name} has no series for {package}", fix="check --package / --profile")
    for s in series_list:
        r = apply_series(s, site_dir=site_dir, profile=prof.name, extra_requires=prof.requires, check_requires=require_check, dry_run=dry_run)
        typer.echo(f"{r.dist.name} {r.dist.version} in {r.dist.site_dir}: series {s.dir}")
        for f in r.requires_found:
            typer.echo(f"  requires {f.pin}: found {f.dist} {f.version}")
        for pr in r.patches:
            off = "; ".join(f"{f} hunk #{n} offset {o:+d}" for f, lst in pr.offsets.items() for n, o in lst)
            typer.echo(f"  {pr.action.value:16s} {pr.patch.name}" + (f"  ({off})" if off else ""))
        if r.manifest:
            typer.echo(f"manifest: {r.manifest}")


@app.command("manifest")
@handled
def manifest_cmd(
    site_dir: SiteDir = None,
    package: Annotated[str, typer.Option(help="distribution whose manifest to print")] = "speculators",
) -> None:
    """Print the manifest that apply wrote for an installed package (JSON: patches, sha256, pins, profile)."""
    import json

    from eagle3ops.patches.apply import read_manifest
    from eagle3ops.patches.installed import find_dist

    dist = find_dist(package, site_dir)
    typer.echo(json.dumps(read_manifest(dist.site_dir, package), indent=2))


@app.command("probe")
@handled
def probe_cmd(
    patches_dir: PatchesDir = None,
    profile: ProfileOpt = None,
    site_dir: SiteDir = None,
    package: Annotated[list[str], typer.Option(help="package(s) to probe (default: those of the profile, or speculators)")] = [],  # noqa: B006
    patch: Annotated[list[str], typer.Option(help="only these patches")] = [],  # noqa: B006
    probes_module: Annotated[str, typer.Option(help="module whose PROBES registry is used (tests inject a failing one)")] = "eagle3ops.patches.probes",
    result_cache: Annotated[Optional[Path], typer.Option("--result-cache", help="content-addressed cache of passed probe results: a probe whose inputs (probe code, patched files, installed packages, platform, --salt) are byte-identical to a stored pass is reused, not run")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="with --result-cache: run every probe (passes are still stored)")] = False,
    salt: Annotated[str, typer.Option("--salt", help="extra result-cache key material (image builds pass the base image digest/id)")] = "",
    record: Annotated[bool, typer.Option("--record", help="write <site>/eagle3ops_patches/<package>.probes.json (what ran, what was reused, keys)")] = False,
    import_check: Annotated[bool, typer.Option("--import-check", help="first import every patched module (the image build's import check, here so that the patched stack is imported once)")] = False,
) -> None:
    """Verify every patched file against the manifest apply wrote (sha256), then run the behavioural probe of every
    applied patch; fail on a file edited since apply, or on any failed or unknown probe. With --result-cache, passes
    whose content key matches are reused (see eagle3ops.patches.probecache)."""
    from eagle3ops.patches.apply import MANIFEST_DIR, PROBE_RECORD_SUFFIX, read_manifest
    from eagle3ops.patches.installed import find_dist
    from eagle3ops.patches.apply import import_patched
    from eagle3ops.patches.proberun import LAST_TIMINGS, probe_installed

    pkgs = list(package)
    if not pkgs:
        try:
            pkgs = sorted({s.package for s in _profiles(patches_dir).get(profile).load()})
        except PatchToolError:
            pkgs = ["speculators"]
    bad = 0
    for pkg in pkgs:
        dist = find_dist(pkg, site_dir)
        t0 = time.monotonic()
        before = None
        if import_check:
            from eagle3ops.patches.probekit import _quiet_idle_polling

            # before torch is imported: OpenMP reads its wait policy once, when it is loaded (see the function)
            _quiet_idle_polling()

            def before(pkg=pkg, dist=dist) -> None:
                # after the registry's warm hook: the engines' forkserver imports the stack meanwhile
                n, secs = import_patched(dist.site_dir, pkg)  # PatchToolError: the module, the site dir and the fix
                typer.echo(f"ok   import: {n} patched module(s) of {pkg} import ({secs:.1f} s)")
        changed, outcomes = probe_installed(dist.site_dir, pkg, probes_module=probes_module, only=patch or None,
                                            result_cache=result_cache, fresh=fresh, salt=salt, before_probes=before)
        for f in changed:
            typer.echo(f"FAIL verify {f}: changed since eagle3ops patch apply (sha256 differs from the manifest)")
            bad += 1
        if not changed:
            n_files = len(read_manifest(dist.site_dir, pkg).get("files_sha256", {}))
            typer.echo(f"ok   verify: {n_files} patched file(s) match the apply manifest (sha256)")
        for o in outcomes:
            if o.ok and o.reused:
                typer.echo(f"ok   {o.patch}: probe {o.probe} passed (reused: identical inputs {o.detail}; "
                           f"key {o.key[:16]})")
            elif o.ok:
                typer.echo(f"ok   {o.patch}: probe {o.probe} passed ({o.seconds:.1f} s)")
            else:
                typer.echo(f"FAIL {o.patch}: probe {o.probe}: {o.detail}")
                bad += 1
        n_reused = sum(o.reused for o in outcomes)
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in LAST_TIMINGS.items())
        typer.echo(f"{pkg}: {len(outcomes) - n_reused} probe(s) run, {n_reused} reused"
                   f"{f' (result cache {result_cache})' if result_cache else ''}; {time.monotonic() - t0:.1f} s "
                   f"({phases})")
        if record:
            rec = {"package": pkg, "probes_module": probes_module, "result_cache": bool(result_cache),
                   "fresh": fresh, "files_changed": changed, "seconds": round(time.monotonic() - t0, 3),
                   "phases_s": {k: round(v, 3) for k, v in LAST_TIMINGS.items()},
                   "fixtures": _fixture_sources(),
                   "outcomes": [{"patch": o.patch, "probe": o.probe, "ok": o.ok, "reused": o.reused, "key": o.key,
                                 "seconds": round(o.seconds, 3), "detail": o.detail} for o in outcomes]}
            out = dist.site_dir / MANIFEST_DIR / f"{pkg}{PROBE_RECORD_SUFFIX}"
            out.write_text(json.dumps(rec, indent=2) + "\n")
    if bad:
        _err(f"error: {bad} failure(s): changed file(s) or failed probe(s)")
        raise typer.Exit(6)


def _fixture_sources() -> dict:
    """How this run got its tiny targets and reference states (built, reused from the fixture cache, or in a
    scratch dir) and how long getting the targets took, for the probe record."""
    from eagle3ops.patches import fixtures, probekit

    return {"targets": dict(fixtures.LAST_SOURCE), "references": dict(probekit.LAST_REFERENCE_SOURCE),
            "seconds": round(probekit.LAST_PREPARE.get("fixtures_s", 0.0), 3)}


def deprecated_alias(fn, old: str, new: str):
    """``fn`` under its old command name (kept for users' scripts, registered hidden): the same options; prints
    ``<old> is deprecated: use <new>`` on stderr, then runs ``fn``."""

    @functools.wraps(fn)
    def alias(*a, **kw):
        _err(f"warning: `{old}` is deprecated: it is now `{new}` (same options)")
        return fn(*a, **kw)

    alias.__doc__ = f"Deprecated name of `{new}`."
    return alias


app.command("verify", hidden=True)(deprecated_alias(probe_cmd, "eagle3ops patch verify", "eagle3ops patch probe"))


@app.command("check")
@handled
def check_cmd(
    patches_dir: PatchesDir = None,
    profile: Annotated[list[str], typer.Option(help="profile(s) to check (default: all)")] = [],  # noqa: B006
    cache_dir: CacheDir = None,
    probes_module: Annotated[str, typer.Option(help="module whose PROBES names the patches' probes must be in")] = "eagle3ops.patches.probes",
) -> None:
    """For every series: fetch the pinned wheel (sha256 verified), apply strictly in a scratch tree,
    byte-compile, report per patch; read each retirement record's evidence from the wheels; for a profile that
    succeeds others, the fate of each of their patches. Used by CI."""
    from eagle3ops.patches.check import check_series

    profs = _profiles(patches_dir)
    names = list(profile) or list(profs.profiles)
    failures = 0
    done: set[Path] = set()
    for n in names:
        prof = profs.get(n)
        typer.echo(f"profile {prof.name}")
        if not prof.series_dirs:
            # every fix the stack needs is upstream: nothing to fetch or apply, and nothing that can fail
            typer.echo("  no series: OK (0 files byte-compiled)")
        for d in prof.series_dirs:
            if d in done:
                typer.echo(f"  series {d}: checked above")
                continue
            done.add(d)
            r = check_series(d, cache=cache_dir, profile=prof, probes_module=probes_module)
            typer.echo(f"  series {d}: {'OK' if r.ok else 'FAILED'} ({r.compiled} files byte-compiled)")
            for p in r.patches:
                typer.echo(f"    {'ok  ' if p.ok else 'FAIL'} {p.name}: {p.detail}")
            for w in r.warnings:
                typer.echo(f"    warning: {w}")
            for pr in r.problems:
                typer.echo(f"    FAIL {pr}")
            failures += 0 if r.ok else 1
        if prof.succeeds:
            failures += _echo_fates(profs, prof.name)
    if failures:
        _err(f"error: {failures} series or fate checks failed")
        raise typer.Exit(5)


def _echo_fates(profs, name: str) -> int:
    """Print the fate of every patch of the profiles ``name`` succeeds; 1 when one has none (or two), else 0."""
    from eagle3ops.patches.fates import fates

    got, problems = fates(profs, name)
    typer.echo(f"  fates of the patches of {', '.join(profs.get(name).succeeds)}: {'OK' if not problems else 'FAILED'}")
    for f in got:
        typer.echo(f"    {f.kind:<8} {f.old}" + (f" -> {f.where}" if f.where else ""))
    for pr in problems:
        typer.echo(f"    FAIL {pr}")
    return 1 if problems else 0


@app.command("new")
@handled
def new_cmd(
    pin: Annotated[str, typer.Argument(help="<package>==<version> of an existing series dir")],
    name: Annotated[str, typer.Argument(help="patch name (slug gets the next NNNN- number) or an existing patch to edit")],
    patches_dir: PatchesDir = None,
    dir: Annotated[Optional[Path], typer.Option("--dir", help="scratch dir (default under the cache)")] = None,
    cache_dir: CacheDir = None,
    force: Annotated[bool, typer.Option(help="recreate an existing scratch dir")] = False,
) -> None:
    """Make a scratch tree (pristine wheel + the series before this patch) to edit; then run refresh."""
    from eagle3ops.patches.series import Pin, find_patches_dir
    from eagle3ops.patches.workspace import new_scratch

    sc = new_scratch(Pin.parse(pin, where="argument"), name, find_patches_dir(patches_dir), dest=dir, cache=cache_dir, force=force)
    typer.echo(f"scratch for {sc.patch_name} ({'existing patch applied' if sc.existing else 'new patch'}): {sc.dir}")
    if (sc.dir / "reference.patch").is_file():
        typer.echo(f"the old, unlisted {sc.patch_name} is in {sc.dir / 'reference.patch'}")
        typer.echo((sc.dir / "port-status.txt").read_text().strip())
    typer.echo(f"edit files under {sc.work}/ then: eagle3ops patch refresh {sc.dir}")


@app.command("refresh")
@handled
def refresh_cmd(
    dir: Annotated[Path, typer.Argument(help="scratch dir made by 'patch new'")],
    description: Annotated[Optional[str], typer.Option(help="Description (first line = summary); required for a new patch")] = None,
    probe: Annotated[Optional[str], typer.Option(help="X-Eagle3ops-Probe; required for a new patch")] = None,
    requires: Annotated[list[str], typer.Option(help="X-Eagle3ops-Requires pin, repeatable (pkg==ver)")] = [],  # noqa: B006
    origin: Annotated[str, typer.Option(help="Origin field")] = "vendor",
    bug: Annotated[Optional[str], typer.Option(help="Bug field (upstream issue URL)")] = None,
    forwarded: Annotated[Optional[str], typer.Option(help="Forwarded field (no / not-needed / URL)")] = None,
) -> None:
    """Write the scratch tree's changes as the patch (DEP-3 header) into the series dir and list it in series."""
    from eagle3ops.patches.series import Pin
    from eagle3ops.patches.workspace import refresh

    pins = [Pin.parse(r, where="--requires") for r in requires] or None
    path = refresh(dir, description=description, probe=probe, requires=pins, origin=origin, bug=bug, forwarded=forwarded)
    typer.echo(f"wrote {path}")


@app.command("rebase")
@handled
def rebase_cmd(
    package: Annotated[str, typer.Argument(help="package whose series to rebase")],
    to: Annotated[str, typer.Option("--to", help="new upstream version")],
    from_: Annotated[Optional[str], typer.Option("--from", help="source series version (default: the default profile's)")] = None,
    patches_dir: PatchesDir = None,
    cache_dir: CacheDir = None,
    force: Annotated[bool, typer.Option(help="overwrite a target series that already lists patches")] = False,
) -> None:
    """Carry a series to a new version: per patch applies (diff refreshed) / fails (hunks) / already upstream
    (dropped); writes patches/<pkg>/<to>/."""
    from eagle3ops.patches.rebase import rebase_series
    from eagle3ops.patches.series import find_patches_dir, load_series, normalize_name

    pdir = find_patches_dir(patches_dir)
    if from_ is None:
        prof = _profiles(pdir).get(None)
        cands = [d for d in prof.series_dirs if normalize_name(d.parent.name) == normalize_name(package)]
        if not cands:
            raise PatchToolError(f"default profile {prof.name} has no {package} series", fix="pass --from <version>")
        src_dir = cands[0]
    else:
        src_dir = pdir / package / from_
    rep = rebase_series(load_series(src_dir), to, pdir, cache=cache_dir, force=force)
    typer.echo(f"rebased {src_dir} -> {rep.new_dir}")
    if rep.upstream_written:
        typer.echo(f"  wrote upstream.yaml: {rep.upstream.wheel} sha256 {rep.upstream.sha256} (check it against the index)")
    for e in rep.entries:
        typer.echo(f"  {e.status:17s} {e.name}: {e.detail}")
    if not rep.ok:
        _err("error: some patches failed to rebase (kept unlisted in the new dir); port them with patch new/refresh")
        raise typer.Exit(5)


def _runner(host: str, container: str, docker_host: str | None, inventory: Path | None = None):
    """Runner for ``host``: ``local`` = this machine's docker engine; otherwise the inventory host reached through
    :class:`eagle3ops.remote.Remote` (SSH, host keys checked), running ``docker [-H docker_host] exec`` there
    (``docker_host`` defaults to the inventory's)."""
    from eagle3ops.patches.capture import local_docker_runner, remote_docker_runner

    if host == "local":
        return local_docker_runner(container, docker_host=docker_host)
    from eagle3ops.config import DEFAULT_INVENTORY, ConfigError, load_inventory
    from eagle3ops import executor

    try:
        hc = load_inventory(inventory or DEFAULT_INVENTORY).host(host)
    except ConfigError as e:
        raise PatchToolError(str(e), fix="pass --inventory or HOST=local") from None
    return remote_docker_runner(executor.for_host(hc), container, docker_host=docker_host or hc.docker_host)


InventoryOpt = Annotated[Optional[Path], typer.Option("--inventory", help="inventory file (default deploy/hosts.yaml)")]


@app.command("capture")
@handled
def capture_cmd(
    host: Annotated[str, typer.Argument(help="inventory host name, or 'local' for this machine's docker engine")],
    container: Annotated[str, typer.Option("--container", help="running container holding the package")],
    package: Annotated[str, typer.Option("--package", help="distribution to compare with its wheel")] = "speculators",
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="patch file to write (default: stdout)")] = None,
    site_dir: Annotated[Optional[str], typer.Option("--site-dir", help="site dir inside the container (default: located)")] = None,
    probe: Annotated[str, typer.Option(help="X-Eagle3ops-Probe for the captured patch")] = "unprobed-capture",
    docker_host: Annotated[Optional[str], typer.Option(help="docker -H endpoint on that host")] = None,
    patches_dir: PatchesDir = None,
    cache_dir: CacheDir = None,
    inventory: InventoryOpt = None,
) -> None:
    """Turn live edits inside a running container into a patch against the pristine wheel (RECORD hashes)."""
    from eagle3ops.patches.capture import capture_patch, inspect_container

    run = _runner(host, container, docker_host, inventory)
    cp = inspect_container(run, package, site_dir=site_dir)
    wheel = _wheel_for(cp.package, cp.version, patches_dir, cache_dir)
    text = capture_patch(cp, wheel, source=f"host {host} container {container}", probe=probe)
    _err(f"{cp.package} {cp.version} at {cp.site_dir}: modified {cp.modified}, added {cp.added}, deleted {cp.deleted}")
    if output:
        output.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {output}")
    else:
        sys.stdout.write(text)


def _wheel_for(package: str, version: str, patches_dir: Path | None, cache: Path | None) -> Path:
    """The pristine wheel: from the series' upstream.yaml when one exists (sha256 pinned), else downloaded."""
    from eagle3ops.patches.series import find_patches_dir, load_upstream, normalize_name
    from eagle3ops.patches.wheels import discover_wheel, fetch_wheel

    try:
        up_path = find_patches_dir(patches_dir) / normalize_name(package) / version / "upstream.yaml"
        if up_path.is_file():
            return fetch_wheel(load_upstream(up_path), cache)
    except PatchToolError:
        pass
    up = discover_wheel(package, version, cache)
    _err(f"note: no upstream.yaml for {package} {version}; used {up.wheel} sha256 {up.sha256} from the index")
    from eagle3ops.patches.wheels import cache_dir as _cd

    return _cd(cache) / up.wheel


@app.command("drift")
@handled
def drift_cmd(
    host: Annotated[str, typer.Argument(help="inventory host name, or 'local'")],
    container: Annotated[str, typer.Option("--container")],
    package: Annotated[str, typer.Option("--package")] = "speculators",
    site_dir: Annotated[Optional[str], typer.Option("--site-dir")] = None,
    docker_host: Annotated[Optional[str], typer.Option(help="docker -H endpoint on that host")] = None,
    patches_dir: PatchesDir = None,
    cache_dir: CacheDir = None,
    inventory: InventoryOpt = None,
) -> None:
    """List files of the container's package that differ from the wheel, each attributed to a series patch or
    to an unknown edit; exit 1 when anything is unknown, partial or missing."""
    from eagle3ops.patches.capture import drift, inspect_container
    from eagle3ops.patches.series import find_patches_dir, load_series, normalize_name

    run = _runner(host, container, docker_host, inventory)
    cp = inspect_container(run, package, site_dir=site_dir)
    series = None
    sdir = find_patches_dir(patches_dir) / normalize_name(package) / cp.version
    if (sdir / "series").is_file():
        series = load_series(sdir)
    wheel = _wheel_for(cp.package, cp.version, patches_dir, cache_dir)
    items = drift(cp, series, wheel)
    typer.echo(f"{cp.package} {cp.version} at {cp.site_dir} in {container} on {host}; series: {sdir if series else 'none'}")
    if cp.manifest:
        typer.echo("  manifest lists: " + ", ".join(p["name"] for p in cp.manifest.get("patches", [])))
    for it in items:
        typer.echo(f"  {it.kind:13s} {it.path}: {it.detail}")
    if not items:
        typer.echo("  no difference from the wheel")
    if any(it.kind != "known" for it in items):
        raise typer.Exit(1)


def main() -> None:
    """Entry point for ``python -m eagle3ops.patches``."""
    app(prog_name="eagle3ops patch")
