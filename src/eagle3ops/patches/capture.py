"""``capture`` and ``drift``: compare a package installed in a running container with its pristine wheel.

Everything that touches the container goes through a *runner*: a callable ``run(argv: list[str]) -> str`` that runs
one command inside the container and returns its stdout (raising on a non-zero exit). :func:`local_docker_runner`
runs ``docker exec`` on the local engine; :func:`remote_docker_runner` wraps ``eagle3ops.remote.Remote`` (SSH, quoting
done once there) to run ``docker exec`` on a host. Commands used in the container are POSIX/busybox ones only
(``cat``, ``find``, ``sha256sum``, ``base64``) plus, for locating the package, ``python3`` when present.

Steps (:func:`inspect_container`): locate the package's site dir and ``*.dist-info`` (``python3`` +
:mod:`importlib.metadata`, or ``find`` as a fallback, or given), read ``RECORD``, ``sha256sum`` every file under the
package's top-level dirs and compare with RECORD: files whose digest differs are *modified*, RECORD files that are
gone are *deleted*, files not in RECORD are *added* (``__pycache__``/``*.pyc`` ignored). Modified/added contents are
fetched base64-encoded (byte-exact through any text channel).

:func:`capture_patch` diffs those contents against the pristine wheel (whose own RECORD digests must match the
container's RECORD, proving the container was installed from that wheel) into a ``-p1`` patch with a DEP-3 header.
:func:`drift` attributes each modified file to the series patches (content equal to the wheel + series, or to an
intermediate state) or to an unknown edit, and lists series patches whose files are still pristine.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import json
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from eagle3ops import executor
from eagle3ops.commands import capture as cc
from eagle3ops.patches.errors import RemoteError, PatchToolError
from eagle3ops.patches.record import RecordEntry, package_entries, parse_record, top_levels_of
from eagle3ops.patches.series import Pin, Series, normalize_name

Runner = Callable[[list[str]], str]



def local_docker_runner(container: str, *, docker: str = "docker", docker_host: str | None = None) -> Runner:
    """A runner executing ``docker [-H host] exec <container> argv...`` on this machine.

    Raises (from the runner): :class:`RemoteError` naming the container, command and stderr.
    """
    def run(argv: list[str]) -> str:
        proc = executor.local().run(cc.docker_exec(container, argv, docker=docker, docker_host=docker_host),
                                    check=False, text=False)
        if proc.returncode != 0:
            raise RemoteError(
                f"in container {container}: {' '.join(argv[:3])}... exited {proc.returncode}: "
                + proc.stderr.decode(errors="replace").strip()[-400:],
                fix="check the container is running and the path exists",
            )
        return proc.stdout.decode("utf-8", errors="surrogateescape")

    return run


def remote_docker_runner(remote: object, container: str, *, docker_host: str | None = None) -> Runner:
    """Wrap an :class:`eagle3ops.remote.Remote` (``.run(argv, check=True) -> Result`` with
    ``.stdout``) into a runner that executes ``docker [-H docker_host] exec <container> argv...`` on that host.
    Quoting is done once, by ``Remote``; every command here only reads (``docker_exec`` builds a ``Read``)."""
    def run(argv: list[str]) -> str:
        try:
            res = remote.run(cc.docker_exec(container, argv, docker_host=docker_host), check=True)  # type: ignore[attr-defined]
        except PatchToolError:
            raise
        except Exception as e:  # noqa: BLE001 - the executor's own error type; keep its message
            raise RemoteError(f"in container {container} on {getattr(remote, 'host', remote)}: {e}") from e
        return res.stdout if hasattr(res, "stdout") else str(res)

    return run


@dataclass
class ContainerPackage:
    """What :func:`inspect_container` found.

    Attributes:
        site_dir / dist_info: paths inside the container; version: installed version (from metadata or dir name).
        record: package entries of RECORD (path -> entry); top_levels: package top-level dirs.
        modified / deleted / added: paths relative to the site dir; contents: bytes of modified and added files.
        remote_sha256: path -> hex digest measured in the container.
        manifest: the container's eagle3ops patch manifest, when present.
    """

    package: str
    version: str
    site_dir: str
    dist_info: str
    top_levels: tuple[str, ...]
    record: dict[str, RecordEntry]
    remote_sha256: dict[str, str]
    modified: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    contents: dict[str, bytes] = field(default_factory=dict)
    manifest: dict | None = None


def locate(run: Runner, package: str, *, python: str = "python3") -> tuple[str, str, str]:
    """Find (site dir, dist-info dir, version) of ``package`` in the container.

    Tries ``python3 -c <importlib.metadata>`` first (exact for the interpreter that serves), then
    ``find / -xdev -type d -name '<pkg>-*.dist-info'`` restricted to ``*-packages`` dirs.

    Raises:
        RemoteError: not found, or found more than once by ``find`` (then pass the site dir explicitly).
    """
    try:
        info = json.loads(run(cc.locate(python, package)).strip().splitlines()[-1])
        return info["site"].rstrip("/"), info["dist_info"].rstrip("/"), info["version"]
    except (RemoteError, PatchToolError, ValueError, KeyError, IndexError):
        pass
    stem = normalize_name(package).replace("-", "_")
    out = run(cc.find_dist_info("/", stem))
    hits = [ln.strip() for ln in out.splitlines() if ln.strip() and "-packages/" in ln]
    if len(hits) != 1:
        raise RemoteError(
            f"{package}: found {len(hits)} installed copies ({', '.join(hits) or 'none'})",
            fix="pass --site-dir (the dir holding the package and its .dist-info)",
        )
    d = PurePosixPath(hits[0])
    version = d.name[len(stem) + 1 : -len(".dist-info")]
    return str(d.parent), str(d), version


def _dist_info_in(run: Runner, site_dir: str, package: str) -> tuple[str, str]:
    stem = normalize_name(package).replace("-", "_")
    out = run(cc.find_dist_info(site_dir, stem, maxdepth=1))
    hits = [ln.strip() for ln in out.splitlines() if ln.strip()]
    if len(hits) != 1:
        raise RemoteError(f"{site_dir}: expected one {stem}-*.dist-info, found {hits}", fix="check --site-dir")
    name = PurePosixPath(hits[0]).name
    return hits[0], name[len(stem) + 1 : -len(".dist-info")]


def fetch_bytes(run: Runner, path: str) -> bytes:
    """Read a file in the container byte-exactly (``base64`` there, decoded here)."""
    return base64.b64decode("".join(run(cc.base64(path)).split()))


def inspect_container(run: Runner, package: str, *, site_dir: str | None = None, python: str = "python3") -> ContainerPackage:
    """Compare the installed files of ``package`` in the container with its RECORD (see module docstring).

    Raises:
        RemoteError: package not found, RECORD unreadable, or ``sha256sum`` output not understood.
    """
    if site_dir:
        site = site_dir.rstrip("/")
        dist_info, version = _dist_info_in(run, site, package)
    else:
        site, dist_info, version = locate(run, package, python=python)
    entries = parse_record(run(cc.cat(f"{dist_info}/RECORD")))
    tops = top_levels_of(entries)
    record = package_entries(entries, tops)
    present_out = run(cc.find_files([f"{site}/{t}" for t in tops]))
    present = set()
    for ln in present_out.splitlines():
        ln = ln.strip()
        if not ln.startswith(site + "/"):
            continue
        rel = ln[len(site) + 1 :]
        if "__pycache__" in PurePosixPath(rel).parts or rel.endswith(".pyc"):
            continue
        present.add(rel)
    cp = ContainerPackage(package, version, site, dist_info, tops, record, {})
    cp.deleted = sorted(p for p in record if p not in present)
    cp.added = sorted(p for p in present if p not in record)
    to_hash = sorted(p for p in present)
    if to_hash:
        out = run(cc.sha256sum([f"{site}/{p}" for p in to_hash]))
        for ln in out.splitlines():
            parts = ln.split(None, 1)
            if len(parts) != 2:
                continue
            digest, path = parts[0], parts[1].lstrip("*").strip()
            if path.startswith(site + "/"):
                cp.remote_sha256[path[len(site) + 1 :]] = digest
        missing = [p for p in to_hash if p not in cp.remote_sha256]
        if missing:
            raise RemoteError(f"sha256sum gave no digest for {missing[:3]}", fix="check sha256sum works in the container")
    cp.modified = sorted(p for p in record if p in cp.remote_sha256 and cp.remote_sha256[p] != record[p].sha256)
    for p in cp.modified + cp.added:
        cp.contents[p] = fetch_bytes(run, f"{site}/{p}")
        if hashlib.sha256(cp.contents[p]).hexdigest() != cp.remote_sha256[p]:
            raise RemoteError(f"{p}: content fetched does not match its sha256 in the container", fix="retry; the file may be changing")
    try:
        cp.manifest = json.loads(run(cc.cat(f"{site}/eagle3ops_patches/{normalize_name(package)}.json")))
    except (RemoteError, PatchToolError, ValueError):
        cp.manifest = None
    return cp


def wheel_files(wheel: Path, cp: ContainerPackage) -> dict[str, bytes]:
    """Pristine contents of the container package's modified/deleted files, from ``wheel``.

    Raises:
        RemoteError: the wheel's bytes for a file do not match the container's RECORD digest (the container was
            not installed from this wheel).
    """
    out = {}
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for p in cp.modified + cp.deleted:
            if p not in names:
                raise RemoteError(f"{p} is in the container's RECORD but not in {wheel.name}", fix="use the wheel the container was built from")
            data = zf.read(p)
            if hashlib.sha256(data).hexdigest() != cp.record[p].sha256:
                raise RemoteError(
                    f"{p}: {wheel.name} differs from the container's RECORD", fix="the container was installed from another build"
                )
            out[p] = data
    return out


def diff_against_wheel(cp: ContainerPackage, pristine: dict[str, bytes]) -> str:
    """Unified ``-p1`` diff from the wheel contents to the container's contents (modified, added, deleted); an
    empty file added or deleted (no unified hunk exists for it) becomes a git stanza after the unified diffs."""
    from eagle3ops.patches.diffcheck import empty_file_stanza
    from eagle3ops.patches.diffgen import diff_file

    chunks, stanzas = [], []
    with tempfile.TemporaryDirectory(prefix="eagle3ops-capture-") as tmp:
        a, b = Path(tmp) / "a", Path(tmp) / "b"
        for rel in sorted(set(cp.modified) | set(cp.added) | set(cp.deleted)):
            if rel not in pristine and cp.contents.get(rel) == b"":
                stanzas.append(empty_file_stanza(rel, created=True))
                continue
            if rel not in cp.contents and pristine.get(rel) == b"":
                stanzas.append(empty_file_stanza(rel, created=False))
                continue
            old = new = None
            if rel in pristine:
                old = a / rel
                old.parent.mkdir(parents=True, exist_ok=True)
                old.write_bytes(pristine[rel])
            if rel in cp.contents:
                new = b / rel
                new.parent.mkdir(parents=True, exist_ok=True)
                new.write_bytes(cp.contents[rel])
            chunks.append(diff_file(old, new, rel))
    return "".join(chunks) + "".join(stanzas)


def capture_patch(
    cp: ContainerPackage,
    wheel: Path,
    *,
    source: str,
    probe: str = "unprobed-capture",
    requires: list[Pin] | None = None,
    description: str | None = None,
) -> str:
    """The patch text (DEP-3 header + diff) turning the pristine wheel into the container's package.

    Raises:
        PatchToolError: no differences.
    """
    from eagle3ops.patches.diffgen import compose_patch, render_header

    if not (cp.modified or cp.added or cp.deleted):
        raise PatchToolError(f"{cp.package} {cp.version} in {source} is identical to its wheel: nothing to capture")
    diff = diff_against_wheel(cp, wheel_files(wheel, cp))
    desc = description or (
        f"Edits captured from {source} ({cp.package} {cp.version} at {cp.site_dir})\n"
        f"Captured by eagle3ops patch capture on {_dt.date.today().isoformat()}: "
        f"{len(cp.modified)} modified, {len(cp.added)} added, {len(cp.deleted)} deleted file(s).\n"
        "Review it, give it a real description and probe, then add it to the series."
    )
    header = render_header(
        description=desc, pin=Pin(normalize_name(cp.package), cp.version), probe=probe, requires=requires,
        origin="vendor", forwarded="no",
    )
    return compose_patch(header, diff)


@dataclass
class DriftItem:
    """One file that differs from the wheel (or should, per the series): ``kind`` is ``known``, ``partial``,
    ``unknown`` or ``missing-patch``; ``patches`` the series patches involved; ``detail`` a sentence."""

    path: str
    kind: str
    patches: list[str]
    detail: str


def series_states(series: Series, wheel: Path) -> tuple[dict[str, list[tuple[str, str | None]]], dict[str, list[str]]]:
    """Apply ``series`` step by step to the pristine wheel and record, per touched file, its sha256 after each
    patch: returns (path -> [(state label, digest or None if absent)], path -> patch names touching it).

    Raises:
        HunkRejected / UnsafePatch: the series does not apply to its own wheel (run ``patch check``).
    """
    from eagle3ops.patches.apply import apply_patch
    from eagle3ops.patches.installed import find_dist
    from eagle3ops.patches.wheels import unpack_wheel

    states: dict[str, list[tuple[str, str | None]]] = {}
    touched: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="eagle3ops-drift-") as tmp:
        site = unpack_wheel(wheel, Path(tmp) / "site")
        dist = find_dist(series.package, site)
        for patch in series.patches:
            r = apply_patch(patch, site, dist.top_levels, f"{dist.name} {dist.version} (pristine wheel)")
            for f in r.files:
                touched.setdefault(f, []).append(patch.name)
                p = site / f
                states.setdefault(f, []).append((patch.name, hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None))
    return states, touched


def drift(cp: ContainerPackage, series: Series | None, wheel: Path | None) -> list[DriftItem]:
    """Attribute every file of the container package that differs from its wheel (see module docstring).

    With ``series`` None (no series for that version) every difference is ``unknown``.
    """
    states, touched = (series_states(series, wheel) if series is not None and wheel is not None else ({}, {}))
    items: list[DriftItem] = []
    changed = set(cp.modified) | set(cp.added) | set(cp.deleted)
    for rel in sorted(changed):
        now = None if rel in cp.deleted else cp.remote_sha256.get(rel)
        st = states.get(rel)
        if not st:
            items.append(DriftItem(rel, "unknown", [], "differs from the wheel; no series patch touches it"))
            continue
        labels = [s[0] for s in st]
        if now == st[-1][1]:
            items.append(DriftItem(rel, "known", touched[rel], "matches the wheel + series (" + ", ".join(touched[rel]) + ")"))
            continue
        hit = next((i for i, (_, d) in enumerate(st) if d == now), None)
        if hit is not None:
            items.append(
                DriftItem(rel, "partial", labels[: hit + 1], f"matches the state after {labels[hit]}; missing {', '.join(labels[hit + 1:])}")
            )
        else:
            items.append(DriftItem(rel, "unknown", touched[rel], "edited beyond/instead of series patches " + ", ".join(touched[rel])))
    for rel, names in sorted(touched.items()):
        if rel not in changed:
            items.append(DriftItem(rel, "missing-patch", names, "still pristine, but the series changes it (" + ", ".join(names) + ")"))
    return items
