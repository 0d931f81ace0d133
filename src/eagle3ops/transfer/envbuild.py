"""The real pipeline environment as a tarball (``stage_runtime: venv``), exported from a built pipeline
image: the image's venv (its hash-locked wheels with the patch series applied strictly and verified by the build's
probes, and eagle3ops itself) is read out of a container that is created, never started, and rewritten so that it
runs from wherever it is unpacked on the host with the host's ``venv_python``:

- ``bin/python`` is a symlink to ``venv_python`` (``python3``, ``python3.X`` to ``python``), ``pyvenv.cfg``'s
  ``home`` its directory; the host's Python must be the image's minor version (:func:`check_python`);
- console scripts start with :data:`eagle3ops.commands.venv.RELOCATABLE_SHEBANG` instead of the image's venv path;
- ``bin/eagle3ops-stage`` runs ``python -m eagle3ops stage`` as the stage containers do;
- directories the image puts on ``sys.path`` from outside its venv (a ``.pth`` naming a directory such as ``/opt/x``) are
  carried under ``extra/`` and the ``.pth`` lines made relative to ``site-packages``;
- :data:`eagle3ops.commands.venv.BUILD_RECORD` says the image, its id, its Python and ``venv_python``;
- an image that is a stand-in (its labels: :func:`eagle3ops.config.standin.standin_reason`, e.g. the pipeline image on
  the local stand-in base, which inherits ``io.eagle3ops.stand-in-for``) gives an environment whose first entry is
  the stand-in marker :data:`eagle3ops.config.standin.STANDIN_ENV_MARKER` (:func:`standin_marker`), so
  ``deploy --env-tarball`` refuses it on a host that is not a sandbox, wherever the tarball travelled.

System libraries outside the venv (what the image's apt installed) are NOT carried: the host must have them (the
same distribution as the image's base, or the libraries the wheels load).

The tarball (gzip level :data:`GZIP_LEVEL`, entries in the image's order, the image's mtimes, owner 0:0, gzip mtime 0)
is named by its sha256 (``venv:sha256:<hex>``) and cached per image content (:func:`image_content`: its layers and
environment, not its id: a fully cached rebuild gets a new id, as BuildKit stamps the config's creation time) and
``venv_python`` in :data:`CACHE_DIR`, so an image is exported once per machine.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import posixpath
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from eagle3ops.commands import venv as vc
from eagle3ops.config.standin import STANDIN_ENV_MARKER, standin_reason

#: Where exported environments are cached: ``$XDG_CACHE_HOME/eagle3ops/env-tarballs`` (``~/.cache/...``), or
#: ``$EAGLE3OPS_ENV_CACHE``.
CACHE_DIR = Path(os.environ.get("EAGLE3OPS_ENV_CACHE") or Path(
    os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "eagle3ops/env-tarballs")
#: gzip level of the tarball: 1 (torch/CUDA libraries barely compress further; the export is CPU-bound).
GZIP_LEVEL = 1
#: Seconds the probe container may take (start, ``import site``) before it counts as failed.
PROBE_TIMEOUT_S = 120
#: Seconds the whole export (read the venv out of the engine, rewrite, compress, hash) may take.
EXPORT_TIMEOUT_S = 3600
#: Seconds one engine API call may wait (the SDK's read timeout while the venv streams).
API_TIMEOUT_S = 300
#: Console scripts larger than this (bytes) are copied as they are (binaries, not scripts).
SCRIPT_MAX = 1 << 20
#: Bumped when the rewrite changes: part of the cache key (2: the stand-in marker).
FORMAT = 2


class EnvBuildError(Exception):
    """The environment could not be built; the message names the image, the file or key, and the fix."""


@dataclass
class ImageEnv:
    """What the pipeline image's interpreter says (:data:`eagle3ops.commands.venv.IMAGE_PROBE_PY`)."""

    prefix: str
    base_prefix: str
    version: str
    site_packages: str
    extra_paths: list[str]

    @property
    def minor(self) -> str:
        """``X.Y`` of :attr:`version`."""
        return ".".join(self.version.split(".")[:2])


@dataclass
class EnvTarball:
    """A built environment: ``path`` (the tarball), ``image`` (``venv:sha256:<hex>``, its digest), ``size`` (bytes),
    ``python`` (the image's ``X.Y.Z``), ``source`` (the pipeline image), ``source_id`` (its id), ``venv_python``,
    ``build_s`` (seconds the export took when it was built), ``cached`` (True: found in the cache, not built now)."""

    path: Path
    image: str
    size: int
    python: str
    source: str
    source_id: str
    venv_python: str
    build_s: float
    cached: bool = False


def minor_of(version: str) -> str:
    """``X.Y`` of ``X.Y.Z`` (or of ``X.Y``)."""
    return ".".join(version.strip().split(".")[:2])


def check_python(env_python: str, host_python: str, *, venv_python: str, host: str, source: str) -> None:
    """Refuse a host whose ``venv_python`` is another Python minor version than the environment's (its
    ``site-packages`` is ``lib/pythonX.Y`` and its compiled wheels are built for ``X.Y``).

    Raises:
        EnvBuildError: naming both versions, the inventory key and the fix.
    """
    if minor_of(env_python) != minor_of(host_python):
        raise EnvBuildError(
            f"the pipeline environment from {source} is Python {env_python}, but hosts.{host}.venv_python "
            f"({venv_python}) is Python {host_python}: point hosts.{host}.venv_python at a Python "
            f"{minor_of(env_python)} on {host} (the wheels are built for {minor_of(env_python)})")


def image_content(attrs: dict[str, Any]) -> str:
    """What an image's venv depends on, from ``docker inspect``'s attributes: its filesystem layers
    (``RootFS.Layers``) and its environment (``Config.Env``: ``PATH`` decides which ``python3`` runs), as one
    string; the image id is not used (a rebuild from cache gets a new one)."""
    cfg = attrs.get("Config") or {}
    return json.dumps({"layers": (attrs.get("RootFS") or {}).get("Layers") or [attrs.get("Id", "")],
                       "env": cfg.get("Env") or []}, sort_keys=True)


def cache_key(content: str, venv_python: str) -> str:
    """24 hex digits naming the export of an image of this :func:`image_content` for ``venv_python`` (and
    :data:`FORMAT`)."""
    return hashlib.sha256(f"{FORMAT}\n{content}\n{venv_python}".encode()).hexdigest()[:24]


def cached(content: str, venv_python: str, cache: Path | None = None) -> EnvTarball | None:
    """The cached export of an image of this :func:`image_content` for ``venv_python`` when it is whole (record and
    tarball of the recorded size), else None."""
    base = (cache or CACHE_DIR) / cache_key(content, venv_python)
    rec, tgz = base.with_suffix(".json"), base.with_suffix(".tar.gz")
    try:
        d = json.loads(rec.read_text())
        if tgz.stat().st_size != d["size"]:
            return None
        return EnvTarball(**{**d, "path": tgz, "cached": True})
    except (OSError, ValueError, KeyError, TypeError):
        return None


class _HashingWriter(io.RawIOBase):
    """A write-only file that hashes (sha256) and counts what it passes on to ``out``."""

    def __init__(self, out: BinaryIO) -> None:
        self.out, self.sha, self.n = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        b = bytes(b)
        self.out.write(b)
        self.sha.update(b)
        self.n += len(b)
        return len(b)


class _StreamReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks (the engine's archive stream), checking ``deadline``."""

    def __init__(self, chunks: Iterator[bytes], deadline: float, what: str) -> None:
        self.it, self.buf, self.deadline, self.what = iter(chunks), b"", deadline, what

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self.buf:
            if time.monotonic() > self.deadline:
                raise EnvBuildError(f"exporting {self.what} took more than {EXPORT_TIMEOUT_S} s")
            try:
                self.buf = next(self.it)
            except StopIteration:
                return 0
        n = min(len(b), len(self.buf))
        b[:n], self.buf = self.buf[:n], self.buf[n:]
        return n


def _strip(name: str, top: str) -> str | None:
    """``name`` (an entry of the ``get_archive`` stream of a directory ``top``) relative to that directory; None for
    the directory itself."""
    name = name.lstrip("./")
    if name == top:
        return None
    return name[len(top) + 1:] if name.startswith(top + "/") else name


def rewrite_entries(members: Iterator[tuple[tarfile.TarInfo, BinaryIO | None]], *, env: ImageEnv,
                    venv_python: str, extra_rel: dict[str, str]) -> Iterator[tuple[tarfile.TarInfo, bytes | BinaryIO | None]]:
    """The venv's entries (names relative to the venv, as ``(info, file or None)``) rewritten for the host (see the
    module doc): ``bin/python*``, ``pyvenv.cfg``, console scripts' shebangs, ``.pth`` lines naming ``extra_rel``'s
    directories (image path -> path relative to the environment), absolute symlinks into the venv. Pure: the tests
    feed it made-up entries."""
    pre = env.prefix.rstrip("/")
    sp_rel = posixpath.relpath(env.site_packages, pre) if env.site_packages else ""
    for info, f in members:
        name = info.name
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        if name in ("bin/python", "bin/python3", f"bin/python{env.minor}") and (info.issym() or info.isfile()):
            link = tarfile.TarInfo(name)
            link.type, link.mode, link.mtime = tarfile.SYMTYPE, 0o777, info.mtime
            link.linkname = venv_python if name == "bin/python" else "python"
            yield link, None
            continue
        if info.issym() and info.linkname.startswith(pre + "/"):
            info.linkname = posixpath.relpath(info.linkname, posixpath.dirname(posixpath.join(pre, name)))
        if info.islnk():
            info.linkname = _strip(info.linkname, posixpath.basename(pre)) or info.linkname
        data: bytes | BinaryIO | None = f
        if info.isfile() and f is not None:
            if name == "pyvenv.cfg":
                data = _pyvenv_cfg(f.read().decode(), venv_python, env).encode()
            elif name.startswith("bin/") and info.size <= SCRIPT_MAX:
                raw = f.read()
                first, nl, rest = raw.partition(b"\n")
                if first.startswith(b"#!" + pre.encode() + b"/bin/python"):
                    raw = vc.RELOCATABLE_SHEBANG.encode() + rest
                data = raw
            elif sp_rel and name.startswith(sp_rel + "/") and name.endswith(".pth") and extra_rel:
                lines = f.read().decode().splitlines(keepends=True)
                depth = posixpath.relpath(".", sp_rel)
                data = "".join(posixpath.join(depth, extra_rel[ln.strip()]) + "\n" if ln.strip() in extra_rel
                               else ln for ln in lines).encode()
            if isinstance(data, bytes):
                info.size = len(data)
        yield info, data


def _pyvenv_cfg(text: str, venv_python: str, env: ImageEnv) -> str:
    """``pyvenv.cfg`` for the host: ``home`` = ``venv_python``'s directory, ``executable`` = ``venv_python``, the
    image's ``command`` line dropped, the rest kept."""
    out = []
    for line in text.splitlines():
        key = line.split("=", 1)[0].strip()
        if key == "home":
            line = f"home = {posixpath.dirname(venv_python)}"
        elif key == "executable":
            line = f"executable = {venv_python}"
        elif key == "command":
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def write_tarball(entries: Iterator[tuple[tarfile.TarInfo, bytes | BinaryIO | None]], out: Path) -> tuple[str, int]:
    """Write ``entries`` as a gzip tar (:data:`GZIP_LEVEL`, gzip mtime 0) to ``out`` via ``out.part`` (renamed when
    whole). Returns ``("venv:sha256:<hex>", size in bytes)``, hashed while written."""
    part = out.with_name(out.name + ".part")
    with part.open("wb") as raw:
        hw = _HashingWriter(raw)
        with gzip.GzipFile(fileobj=hw, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as gz:  # type: ignore[arg-type]
            with tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for info, data in entries:
                    tar.addfile(info, io.BytesIO(data) if isinstance(data, bytes) else data)
    part.replace(out)
    return f"{vc.IMAGE_PREFIX}sha256:{hw.sha.hexdigest()}", hw.n


def _extra_entries(extra: dict[str, tuple[str, Iterator[tuple[tarfile.TarInfo, BinaryIO | None]]]]):
    for _src, (rel, members) in extra.items():
        for info, f in members:
            info.name = posixpath.join(rel, info.name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            yield info, f


def _members(tar: tarfile.TarFile, top: str) -> Iterator[tuple[tarfile.TarInfo, BinaryIO | None]]:
    """A stream tar's members named relative to ``top`` (the directory itself skipped)."""
    for m in tar:
        rel = _strip(m.name, top)
        if rel is None:
            continue
        m.name = rel
        yield m, (tar.extractfile(m) if m.isfile() else None)


def probe_image(client: Any, image: str) -> ImageEnv:
    """Ask the pipeline image's ``python3`` where its venv is (a throwaway container, no network, bounded by
    :data:`PROBE_TIMEOUT_S`, removed afterwards).

    Raises:
        EnvBuildError: the container failed, timed out, or its interpreter is not in a venv.
    """
    c = client.containers.create(**vc.image_probe_spec(image))
    try:
        c.start()
        try:
            code = c.wait(timeout=PROBE_TIMEOUT_S).get("StatusCode")
        except Exception as exc:  # noqa: BLE001 - requests' ReadTimeout / ConnectionError under the SDK
            raise EnvBuildError(f"{image}: its python3 did not answer within {PROBE_TIMEOUT_S} s ({exc})") from None
        out = c.logs(stdout=True, stderr=True).decode(errors="replace")
    finally:
        c.remove(force=True)
    try:
        d = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise EnvBuildError(f"{image}: `python3 -c <probe>` exited {code}: {out.strip()[-300:]}") from None
    env = ImageEnv(**d)
    if env.prefix == env.base_prefix or not env.site_packages:
        raise EnvBuildError(f"{image}: its python3 ({env.prefix}) is not a venv, so there is no pipeline "
                            f"environment to export (build it with `eagle3ops image build pipeline`)")
    return env


def export_env(image: str, venv_python: str, *, cache: Path | None = None, client: Any = None,
               echo: Callable[[str], None] = lambda _: None) -> EnvTarball:
    """The pipeline environment of the built pipeline ``image`` (tag or id on the local engine) as a tarball for
    hosts whose ``venv_python`` is that path, from :data:`CACHE_DIR` when an image of the same content
    (:func:`image_content`) was exported for it before.

    The image's venv is read out of a container created from it (never started, removed afterwards) through the
    engine's archive API, rewritten (module doc) and written with its digest computed on the way; bounded by
    :data:`EXPORT_TIMEOUT_S` (and :data:`API_TIMEOUT_S` per engine read).

    Raises:
        EnvBuildError: the image is not on the local engine (build it first), its python3 is not a venv, the export
            timed out or the engine failed (its words).
    """
    import docker

    from eagle3ops import executor

    if not venv_python.startswith("/"):
        raise EnvBuildError(f"venv_python {venv_python!r} is not an absolute path: set it to the host's python3 "
                            f"(e.g. /usr/bin/python3.12)")
    client = client or executor.engine(timeout=API_TIMEOUT_S)
    try:
        img = client.images.get(image)
    except docker.errors.ImageNotFound:
        raise EnvBuildError(f"{image} is not on the local engine: build it (`eagle3ops image build pipeline`) or "
                            f"name a built pipeline image") from None
    cache = cache or CACHE_DIR
    content = image_content(img.attrs)
    if hit := cached(content, venv_python, cache):
        echo(f"{hit.image} (cached, built from {hit.source} {hit.source_id[:19]})")
        return hit
    t0 = time.monotonic()
    env = probe_image(client, image)
    cache.mkdir(parents=True, exist_ok=True)
    key = cache_key(content, venv_python)
    tgz = cache / f"{key}.tar.gz"
    deadline = t0 + EXPORT_TIMEOUT_S
    c = client.containers.create(**vc.export_spec(image))
    try:
        top = posixpath.basename(env.prefix.rstrip("/"))
        stream, _ = c.get_archive(env.prefix, chunk_size=1 << 20)
        extra_rel = {p: f"extra/{posixpath.basename(p.rstrip('/')) or 'root'}" for p in env.extra_paths}
        record = {"image": image, "image_id": img.id, "python": env.version, "venv_python": venv_python,
                  "source_prefix": env.prefix}

        marker = standin_marker(image, (img.attrs.get("Config") or {}).get("Labels"))

        def entries() -> Iterator[tuple[tarfile.TarInfo, bytes | BinaryIO | None]]:
            if marker is not None:  # first: read from the tarball's head without decompressing the venv
                yield from _file_entries([(STANDIN_ENV_MARKER, json.dumps(marker, indent=2, sort_keys=True) + "\n",
                                           0o644)])
            with tarfile.open(fileobj=_StreamReader(stream, deadline, image), mode="r|") as tin:  # type: ignore[arg-type]
                yield from rewrite_entries(_members(tin, top), env=env, venv_python=venv_python, extra_rel=extra_rel)
            for src, rel in extra_rel.items():
                s, _ = c.get_archive(src, chunk_size=1 << 20)
                with tarfile.open(fileobj=_StreamReader(s, deadline, image), mode="r|") as tin:  # type: ignore[arg-type]
                    yield from _extra_entries({src: (rel, _members(tin, posixpath.basename(src.rstrip("/"))))})
            yield from fixed_entries(record)

        echo(f"exporting {env.prefix} (Python {env.version}) of {image} ...")
        digest, size = write_tarball(entries(), tgz)
    except docker.errors.APIError as exc:
        raise EnvBuildError(f"{image}: the engine failed while exporting {env.prefix}: {exc}") from None
    finally:
        c.remove(force=True)
    out = EnvTarball(path=tgz, image=digest, size=size, python=env.version, source=image, source_id=img.id,
                     venv_python=venv_python, build_s=round(time.monotonic() - t0, 1))
    rec = {k: v for k, v in asdict(out).items() if k not in ("path", "cached")}
    (cache / f"{key}.json").write_text(json.dumps(rec, indent=2))
    return out


def standin_marker(image: str, labels: dict[str, str] | None) -> dict[str, str] | None:
    """The stand-in marker's content for an environment exported from ``image`` (labels ``labels``): ``what``,
    ``why`` (:func:`eagle3ops.config.standin.standin_reason`) and ``image``; None when the image is no stand-in."""
    why = standin_reason(image, labels)
    if why is None:
        return None
    return {"what": f"a pipeline environment exported from {image}", "why": f"{image} is a stand-in image ({why})",
            "image": image}


def fixed_entries(record: dict[str, Any]) -> Iterator[tuple[tarfile.TarInfo, bytes]]:
    """The files every exported environment gets: ``bin/eagle3ops-stage`` (:data:`eagle3ops.commands.venv
    .REAL_STAGE_SH`) and :data:`eagle3ops.commands.venv.BUILD_RECORD` (``record`` as JSON)."""
    yield from _file_entries([("bin/" + vc.STAGE_PROGRAM, vc.REAL_STAGE_SH, 0o755),
                              (vc.BUILD_RECORD, json.dumps(record, indent=2, sort_keys=True) + "\n", 0o644)])


def _file_entries(files: list[tuple[str, str, int]]) -> Iterator[tuple[tarfile.TarInfo, bytes]]:
    """Tar entries of ``(name, text, mode)`` files, mtime 0."""
    for name, text, mode in files:
        data = text.encode()
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), mode, 0
        yield info, data
