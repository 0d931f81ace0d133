"""Fetch a pinned wheel from the package index (cached, sha256 verified) and unpack it safely.

The wheel is downloaded with pip's own client (``python -m pip download --no-deps --only-binary=:all:`` with a
``--require-hashes`` requirement line, so pip already refuses another file) into a temporary dir, then its sha256 is
checked again against ``upstream.yaml`` before it enters the cache (``$EAGLE3OPS_CACHE_DIR/wheels`` or
``~/.cache/eagle3ops/wheels``). pip's configuration (index URL, proxy CA bundle) applies as usual.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from eagle3ops.patches.errors import WheelError
from eagle3ops.patches.series import Upstream


def cache_dir(explicit: Path | None = None) -> Path:
    """The wheel cache dir: ``explicit``, ``$EAGLE3OPS_CACHE_DIR/wheels``, or ``~/.cache/eagle3ops/wheels``."""
    if explicit is not None:
        return Path(explicit)
    base = os.environ.get("EAGLE3OPS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "eagle3ops"
    )
    return Path(base) / "wheels"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file (streamed)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _pip_tail(text: str) -> str:
    """pip's error output in one line, without its WARNING lines."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("WARNING:")]
    return " | ".join(lines[-6:])


def fetch_wheel(upstream: Upstream, cache: Path | None = None) -> Path:
    """Return the path of the pinned wheel, downloading it into the cache when absent.

    Raises:
        WheelError: pip failed (its last lines quoted), the file name differs from ``upstream.wheel``, or the
            sha256 differs from ``upstream.sha256`` (both digests named).
    """
    cdir = cache_dir(cache)
    cdir.mkdir(parents=True, exist_ok=True)
    cached = cdir / upstream.wheel
    if cached.is_file():
        if sha256_file(cached) == upstream.sha256:
            return cached
        cached.unlink()  # corrupt or replaced cache entry: fetch again and verify
    with tempfile.TemporaryDirectory(prefix="eagle3ops-dl-") as tmp:
        req = Path(tmp) / "req.txt"
        req.write_text(f"{upstream.package}=={upstream.version} --hash=sha256:{upstream.sha256}\n", encoding="utf-8")
        argv = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
            "--disable-pip-version-check", "--quiet", "--dest", str(Path(tmp) / "out"), "-r", str(req),
        ]
        if upstream.index_url:
            argv += ["--index-url", upstream.index_url]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = _pip_tail(proc.stderr or proc.stdout)
            raise WheelError(
                f"pip could not download {upstream.wheel} (sha256 {upstream.sha256}): {tail}",
                fix="check network/index access and that upstream.yaml's wheel and sha256 are those on the index",
            )
        got = Path(tmp) / "out" / upstream.wheel
        if not got.is_file():
            names = ", ".join(p.name for p in (Path(tmp) / "out").iterdir())
            raise WheelError(f"pip downloaded {names}, not {upstream.wheel}", fix="fix 'wheel' in upstream.yaml")
        digest = sha256_file(got)
        if digest != upstream.sha256:
            raise WheelError(
                f"{upstream.wheel}: sha256 is {digest}, upstream.yaml pins {upstream.sha256}",
                fix="the index served another file; do not change the pin without checking where it came from",
            )
        shutil.move(str(got), cached)
    return cached


def unpack_wheel(wheel: Path, dest: Path, *, skip_suffixes: tuple[str, ...] = ()) -> Path:
    """Unpack ``wheel`` into ``dest`` (which then looks like a site-packages dir) and return ``dest``.

    Members with absolute paths, ``..`` components or symlink mode are refused (zip-slip). Members whose names end
    in one of ``skip_suffixes`` are checked but not written (``patch check`` skips compiled extension modules,
    ``.so``: 1.2 GB of the 1.24 GB vLLM 0.16.0 CUDA wheel; a text diff cannot patch them, nothing byte-compiles
    them).

    Raises:
        WheelError: unsafe member or unreadable archive.
    """
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                parts = PurePosixPath(info.filename).parts
                if info.filename.startswith("/") or ".." in parts or "\\" in info.filename:
                    raise WheelError(f"{wheel.name}: unsafe member {info.filename!r}", fix="do not use this wheel")
                if stat.S_ISLNK(info.external_attr >> 16):
                    raise WheelError(f"{wheel.name}: symlink member {info.filename!r}", fix="do not use this wheel")
            zf.extractall(dest, members=[i for i in zf.infolist() if not i.filename.endswith(skip_suffixes)]
                          if skip_suffixes else None)
    except zipfile.BadZipFile as e:
        raise WheelError(f"{wheel}: not a valid wheel ({e})", fix="delete it from the cache and fetch again")
    return dest


def discover_wheel(package: str, version: str, cache: Path | None = None, index_url: str | None = None) -> Upstream:
    """Download ``package==version``'s wheel without a known hash (used once, by ``rebase`` to a new version) and
    return its :class:`Upstream` record with the sha256 computed here; the wheel is stored in the cache.

    The digest is trust-on-first-use from the configured index: ``rebase`` prints it so it can be compared with the
    index's published sha256 before the new ``upstream.yaml`` is committed.

    Raises:
        WheelError: pip failed, or did not produce exactly one wheel.
    """
    cdir = cache_dir(cache)
    cdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="eagle3ops-dl-") as tmp:
        out = Path(tmp) / "out"
        argv = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
            "--quiet", "--dest", str(out), f"{package}=={version}",
        ]
        if index_url:
            argv += ["--index-url", index_url]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = _pip_tail(proc.stderr or proc.stdout)
            raise WheelError(f"pip could not download {package}=={version}: {tail}", fix="check the version exists as a wheel on the index")
        wheels = sorted(out.glob("*.whl"))
        if len(wheels) != 1:
            raise WheelError(f"expected one wheel for {package}=={version}, got {[w.name for w in wheels]}", fix="pin a pure-Python wheel")
        digest = sha256_file(wheels[0])
        dest = cdir / wheels[0].name
        shutil.move(str(wheels[0]), dest)
    return Upstream(package=package, version=version, wheel=dest.name, sha256=digest, index_url=index_url)
