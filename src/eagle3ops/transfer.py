"""Image transfer over SSH: only the layers a host lacks, verified, with bounded waits, to many hosts at once.

``eagle3ops push IMAGE HOST [HOST...]`` moves an image from the build engine to each host's Docker engine with
nothing but ``docker`` and ``sshd`` on the host (no registry, no helper image).

How one push works (:func:`push`):

1. **Local inventory** — ``docker image inspect`` on the build engine gives the image id (``sha256:`` of the config)
   and the diff ids (``RootFS.Layers``). Chain ids follow the OCI image spec (config.md, "Layer ChainID"):
   ``ChainID(L0) = DiffID(L0)``, ``ChainID(L0..n) = sha256(ChainID(L0..n-1) + " " + DiffID(Ln))``.
2. **Remote inventory** — over SSH, ``docker info`` (which image store: the classic layer store, e.g. overlay2, or
   the containerd image store, whose ``DriverStatus`` names ``io.containerd.snapshotter.v1``) and
   ``docker image inspect`` of every image on the host give the set of chain ids the host holds. A layer at position
   i is present when the chain id of the image's first i+1 layers is (Docker's classic ``docker load`` looks layers
   up by chain id: moby ``image/tarexport/load.go``).
3. **Thin archive** — a ``docker save``-format tar (``manifest.json``, the config, and ``<chainid>/layer.tar`` only
   for the missing layers) is generated on the fly and streamed into ``docker load`` on the host. The classic store
   accepts an archive without the layer tars it already holds (measured on Docker 20.10: FACTS.md). The containerd
   store resolves layers by content digest; for it the full archive is sent (never tried here: this machine runs
   Docker 20.10 only).
4. **Verify** — ``docker image inspect`` on the host must give the local image id; "every layer pushed but the
   image is not there" is an error.

Layer bytes come from the build engine's classic layer store directly when it is readable
(:class:`StoreLayerSource`: the layer's ``tar-split.json.gz`` reassembled with the files of its overlay2 ``diff``
directory, byte-identical to ``docker save``'s layer tar — the digest is checked while streaming), else from
``docker save`` extracted into a private temporary directory after every member passed path-escape checks
(:class:`SaveLayerSource`).

Large pushes are cut into chunks of about :data:`CHUNK_BYTES`: every chunk but the last is loaded as a *scaffold*
image (a minimal config whose ``rootfs.diff_ids`` are a prefix of the image's, labelled
``eagle3ops.scaffold-for=<image id>``), so a broken transfer resumes after the last chunk the host registered;
scaffolds are removed once the image is verified.

Waits are bounded: a stream that moves no byte for ``stall_s`` seconds is killed and reported as stalled; ``docker
load`` after the stream ends gets a deadline proportional to the bytes sent. Broken or stalled transfers are retried
(tenacity, exponential back-off), each attempt re-reading the host's inventory.

Bulk stream: an OpenSSH ``ssh`` subprocess using the inventory's port, user, identity, ssh_config and known_hosts
with ``StrictHostKeyChecking yes`` on every hop, ``ProxyJump`` bastions included (a generated ``-F`` config:
:func:`ssh_client_config`) (measured 125 MB/s vs 76 MB/s for a paramiko channel into ``cat >/dev/null`` on
this machine; ``benchmarks/push_stream.py`` re-measures); small archives go over the already-open paramiko
connection to save the second handshake. Compression (zstd, multi-threaded; gzip when the host has no ``zstd``,
which ``docker load`` reads natively) is chosen per push by measurement: the link rate (a probe of random bytes) and
the compressor's rate and ratio on a sample of the data; used only if it cuts the predicted time.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import threading
import time
import weakref
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import typer

#: Chunk size (bytes of layer tar) after which a push is cut into separately loaded, resumable pieces.
CHUNK_BYTES = 512 * 1024 * 1024
#: Seconds without a byte moving on the stream before it is declared stalled and killed.
STALL_S = 60.0
#: Archives smaller than this go over the open paramiko connection (no second SSH handshake).
SMALL_ARCHIVE_BYTES = 8 * 1024 * 1024
#: Pushes with fewer missing bytes than this never compress and never probe the link.
COMPRESS_MIN_BYTES = 128 * 1024 * 1024
#: Write size towards the SSH stream.
WRITE_CHUNK = 1024 * 1024
#: Label on scaffold images (partial chains loaded for resumable pushes).
SCAFFOLD_LABEL = "eagle3ops.scaffold-for"


# --- errors -----------------------------------------------------------------------------------------------------
class TransferError(Exception):
    """A push failed; the message names the host, what failed and what to do."""


class TransientTransferError(TransferError):
    """A push failed in a way a retry may fix (connection dropped, stream broken or stalled)."""


class StreamStalled(TransientTransferError):
    """No byte moved on the stream for ``stall_s`` seconds; the stream was killed."""


class UnsafeArchive(TransferError):
    """A tar stream holds a member that would escape the extraction directory (absolute path, ``..``, a link
    pointing outside, a device node)."""


class LayerDigestMismatch(TransferError):
    """A layer's bytes do not hash to its diff id (local store corrupt or changed during the push)."""


class VerifyFailed(TransferError):
    """The host's engine does not hold the image with the local image id after the load."""


# --- digests ----------------------------------------------------------------------------------------------------
def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """Chain ids of every prefix of ``diff_ids`` (OCI image spec, config.md "Layer ChainID").

    Args:
        diff_ids: ``sha256:<hex>`` digests of the uncompressed layer tars, base first.

    Returns:
        ``chain[i]`` = ChainID(diff_ids[0..i]), same length as ``diff_ids``.
    """
    out: list[str] = []
    for d in diff_ids:
        out.append(d if not out else "sha256:" + hashlib.sha256(f"{out[-1]} {d}".encode()).hexdigest())
    return out


def _hex(digest: str) -> str:
    algo, _, h = digest.partition(":")
    if algo != "sha256" or len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
        raise TransferError(f"unexpected digest {digest!r} (want sha256:<64 hex>)")
    return h


# --- local image ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LocalImage:
    """An image on the build engine.

    Attributes:
        ref: the reference the user gave (tag or id).
        id: ``sha256:<hex>`` of the image config (the image id).
        diff_ids: layer digests (uncompressed tars), base first.
        repo_tags: tags to give the image on the host (the ref when it is a tag).
        size: image size in bytes as the engine reports it.
    """

    ref: str
    id: str
    diff_ids: tuple[str, ...]
    repo_tags: tuple[str, ...]
    size: int = 0

    @property
    def chain_ids(self) -> list[str]:
        """Chain id of each layer position (see :func:`chain_ids`)."""
        return chain_ids(self.diff_ids)


def _docker_local(*args: str, docker_host: str | None = None, timeout: float = 120, text: bool = True):
    argv = ["docker"] + (["-H", docker_host] if docker_host else []) + list(args)
    try:
        return subprocess.run(argv, capture_output=True, text=text, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TransferError(f"build engine: `{' '.join(argv)}` did not answer within {timeout:.0f}s") from None


def _engine_api(path: str, docker_host: str | None = None, timeout: float = 30) -> tuple[int, bytes] | None:
    """GET ``path`` from the build engine's API over its unix socket (≈10 ms, vs 100-300 ms for a ``docker`` CLI
    call on a busy 2-core machine). None when the endpoint is not a plain unix socket (then the CLI is used, which
    also honours docker contexts)."""
    import http.client
    import socket as _socket
    from urllib.parse import quote

    endpoint = docker_host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not endpoint.startswith("unix://") or (os.environ.get("DOCKER_CONTEXT") and not docker_host):
        return None
    sock_path = endpoint[len("unix://"):]

    class _Conn(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(sock_path)

    try:
        conn = _Conn("localhost", timeout=timeout)
        conn.request("GET", quote(path, safe="/?=&:@"))
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        return resp.status, body
    except OSError:
        return None


def _local_info(docker_host: str | None = None) -> dict:
    """``docker info`` of the build engine as a dict.

    Raises:
        TransferError: the engine does not answer.
    """
    api = _engine_api("/info", docker_host)
    if api is not None and api[0] == 200:
        return json.loads(api[1])
    cp = _docker_local("info", "--format", "{{json .}}", docker_host=docker_host)
    if cp.returncode != 0:
        raise TransferError(f"build engine does not answer: {cp.stderr.strip()}")
    return json.loads(cp.stdout)


def inspect_local(ref: str, docker_host: str | None = None) -> LocalImage:
    """Read an image's id and layers from the build engine.

    Raises:
        TransferError: the image does not exist locally (build it first) or the engine does not answer.
    """
    api = _engine_api(f"/images/{ref}/json", docker_host)
    if api is not None and api[0] == 200:
        data = json.loads(api[1])
    else:
        cp = _docker_local("image", "inspect", ref, docker_host=docker_host)
        if cp.returncode != 0:
            raise TransferError(f"image {ref!r} is not on the build engine ({cp.stderr.strip()}); build or tag it "
                                f"first")
        data = json.loads(cp.stdout)[0]
    if ref.startswith("sha256:") or "@" in ref or data["Id"].startswith("sha256:" + ref):
        tags: tuple[str, ...] = ()  # an id or a digest reference: nothing to tag
    else:
        tags = (ref if ":" in ref.rsplit("/", 1)[-1] else ref + ":latest",)
    return LocalImage(ref=ref, id=data["Id"], diff_ids=tuple(data["RootFS"].get("Layers") or ()), repo_tags=tags,
                      size=int(data.get("Size") or 0))


# --- path safety ------------------------------------------------------------------------------------------------
def check_member(member: tarfile.TarInfo) -> None:
    """Refuse a tar member that could write outside the extraction directory.

    Allowed: regular files and directories with relative names without ``..``; symbolic and hard links whose
    target stays inside. Refused: absolute names, ``..`` components, links leaving the tree, devices, FIFOs.

    Raises:
        UnsafeArchive: naming the member and why.
    """
    name = member.name
    parts = PurePosixPath(name).parts
    if name.startswith("/") or ".." in parts or "\x00" in name:
        raise UnsafeArchive(f"tar member {name!r} escapes the extraction directory (absolute path or '..')")
    if member.isreg() or member.isdir():
        return
    if member.issym() or member.islnk():
        target = member.linkname
        base = PurePosixPath(name).parent if member.issym() else PurePosixPath(".")
        resolved = os.path.normpath(str(base / target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            raise UnsafeArchive(f"tar member {name!r} links to {target!r}, outside the extraction directory")
        return
    raise UnsafeArchive(f"tar member {name!r} is a device/FIFO/other special file; refused")


def safe_extract(stream: io.RawIOBase | io.BufferedIOBase, dest: Path) -> list[str]:
    """Extract a tar stream into ``dest``, checking every member with :func:`check_member` before it is written
    (and with Python's ``data`` extraction filter as a second line).

    Returns:
        the member names, in stream order.

    Raises:
        UnsafeArchive: a member failed the checks (nothing of it was written; ``dest`` should be discarded).
    """
    names: list[str] = []
    with tarfile.open(fileobj=stream, mode="r|") as tf:
        for m in tf:
            check_member(m)
            try:
                tf.extract(m, dest, filter="data")
            except tarfile.FilterError as exc:
                raise UnsafeArchive(f"tar member {m.name!r} refused by the data filter: {exc}") from None
            names.append(m.name)
    return names


def _open_beneath(root_fd: int, rel: str) -> int:
    """Open regular file ``rel`` below the directory ``root_fd`` without following any symlink (openat per
    component, ``O_NOFOLLOW``); raises :class:`UnsafeArchive` on ``..``/absolute names."""
    parts = [p for p in PurePosixPath(rel).parts if p not in (".", "")]
    if rel.startswith("/") or ".." in parts or not parts:
        raise UnsafeArchive(f"layer entry {rel!r} escapes the layer directory")
    fd = root_fd
    opened: list[int] = []
    try:
        for p in parts[:-1]:
            fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            opened.append(fd)
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    finally:
        for o in opened:
            os.close(o)


# --- layer sources ----------------------------------------------------------------------------------------------
class LayerSource(ABC):
    """Where the bytes of an image's config and layer tars come from (build-engine side)."""

    #: short name shown in results
    kind: str = "?"

    def __init__(self, image: LocalImage):
        self.image = image

    @abstractmethod
    def config_bytes(self) -> bytes:
        """The exact config JSON (its sha256 is the image id)."""

    @abstractmethod
    def layer_size(self, i: int) -> int:
        """Size in bytes of the uncompressed tar of layer ``i``."""

    @abstractmethod
    def _raw_layer(self, i: int) -> Iterator[bytes]:
        """Chunks of layer ``i``'s tar."""

    def iter_layer(self, i: int, verify: bool = True) -> Iterator[bytes]:
        """Chunks of layer ``i``'s uncompressed tar; with ``verify`` the sha256 is checked against the diff id at
        the end.

        Raises:
            LayerDigestMismatch: the bytes do not hash to the diff id, or the size differs from
                :meth:`layer_size` (the archive header already announced it).
        """
        h = hashlib.sha256()
        n = 0
        for chunk in self._raw_layer(i):
            h.update(chunk)
            n += len(chunk)
            yield chunk
        want = self.image.diff_ids[i]
        if verify and ("sha256:" + h.hexdigest() != want or n != self.layer_size(i)):
            raise LayerDigestMismatch(
                f"layer {i} of {self.image.ref}: {n} bytes hashing to sha256:{h.hexdigest()[:16]}…, expected "
                f"{self.layer_size(i)} bytes with {want[:23]}… (the build engine's layer store changed or is "
                f"corrupt; rebuild the image)")

    def sample(self, i: int, n: int = 32 * 1024 * 1024, pieces: int = 32) -> bytes:
        """About ``n`` bytes of layer ``i`` taken in ``pieces`` pieces spread evenly over the layer (a sample for
        the compressor measurement; the start of a layer alone is not representative). This default reads from the
        start; sources with random access override it."""
        buf = bytearray()
        gen = self.iter_layer(i, verify=False)
        for c in gen:
            buf += c
            if len(buf) >= n:
                break
        gen.close()
        return bytes(buf[:n])

    def close(self) -> None:
        """Release temporary files."""


class StoreLayerSource(LayerSource):
    """Layers read straight from the build engine's classic overlay2 layer store (root needed).

    ``<root>/image/overlay2/layerdb/sha256/<chainid>/tar-split.json.gz`` lists the layer tar as raw segments
    (headers, padding) and file entries; file bytes come from ``<root>/overlay2/<cache-id>/diff/<name>``. This is
    what moby's ``layerStore.assembleTarTo`` (layer/layer_store.go) does for ``docker save``; here it streams without
    writing the image to a temporary directory first. Files are opened below the diff directory without following
    symlinks.
    """

    kind = "store"

    def __init__(self, image: LocalImage, docker_root: Path):
        super().__init__(image)
        self.root = docker_root
        self._entries: dict[int, list[tuple[int, bytes | str, int]]] = {}
        self._sizes: dict[int, int] = {}
        self._lock = threading.Lock()

    @classmethod
    def open(cls, image: LocalImage, docker_host: str | None = None) -> StoreLayerSource:
        """Open the store for ``image``.

        Raises:
            TransferError: the engine is not a readable classic overlay2 store (reason in the message).
        """
        inf = _local_info(docker_host)
        driver = inf.get("Driver")
        if driver != "overlay2" or _is_containerd_store(inf):
            raise TransferError(f"build engine storage driver {driver!r} is not the classic overlay2 store")
        root = Path(inf.get("DockerRootDir") or "/var/lib/docker")
        cfg = root / "image" / "overlay2" / "imagedb" / "content" / "sha256" / _hex(image.id)
        if not os.access(cfg, os.R_OK):
            raise TransferError(f"{cfg} is not readable (needs root on the build machine)")
        src = cls(image, root)
        for i in range(len(image.diff_ids)):
            d = src._layerdb(i)
            if not (d / "tar-split.json.gz").is_file():
                raise TransferError(f"{d}/tar-split.json.gz missing")
        return src

    def _layerdb(self, i: int) -> Path:
        return self.root / "image" / "overlay2" / "layerdb" / "sha256" / _hex(self.image.chain_ids[i])

    def config_bytes(self) -> bytes:
        data = (self.root / "image" / "overlay2" / "imagedb" / "content" / "sha256" / _hex(self.image.id)).read_bytes()
        if "sha256:" + hashlib.sha256(data).hexdigest() != self.image.id:
            raise LayerDigestMismatch(f"config of {self.image.ref} in the build engine's store does not hash to "
                                      f"its id {self.image.id}")
        return data

    def _parse(self, i: int) -> list[tuple[int, bytes | str, int]]:
        with self._lock:
            if i in self._entries:
                return self._entries[i]
        entries: list[tuple[int, bytes | str, int]] = []
        total = 0
        with gzip.open(self._layerdb(i) / "tar-split.json.gz", "rt", encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                e = json.loads(line)
                if e["type"] == 2:  # raw segment
                    payload = base64.b64decode(e.get("payload") or b"")
                    entries.append((2, payload, len(payload)))
                    total += len(payload)
                elif e["type"] == 1:  # file entry; bytes come from disk
                    size = int(e.get("size") or 0)
                    if size:
                        name = e.get("name")
                        if name is None:
                            name = base64.b64decode(e["name_raw"]).decode("utf-8", "surrogateescape")
                        entries.append((1, name, size))
                        total += size
        with self._lock:
            self._entries[i] = entries
            self._sizes[i] = total
        return entries

    def layer_size(self, i: int) -> int:
        if i not in self._sizes:
            self._parse(i)
        return self._sizes[i]

    def sample(self, i: int, n: int = 32 * 1024 * 1024, pieces: int = 32) -> bytes:
        entries = self._parse(i)
        total = self.layer_size(i)
        if total <= n:
            return b"".join(self._raw_layer(i))
        piece = n // pieces
        starts, off = [], 0
        for e in entries:
            starts.append(off)
            off += e[2]
        import bisect

        cache_id = (self._layerdb(i) / "cache-id").read_text().strip()
        root_fd = os.open(self.root / "overlay2" / cache_id / "diff", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        out = bytearray()
        try:
            for k in range(pieces):
                at = k * (total - piece) // max(pieces - 1, 1)
                j = bisect.bisect_right(starts, at) - 1
                want = piece
                while want > 0 and j < len(entries):  # contiguous bytes, across entry boundaries
                    kind, val, size = entries[j]
                    rel = at - starts[j]
                    if kind == 2:
                        got = val[rel:rel + want]  # type: ignore[index]
                    else:
                        fd = _open_beneath(root_fd, val)  # type: ignore[arg-type]
                        try:
                            got = os.pread(fd, min(want, size - rel), rel)
                        finally:
                            os.close(fd)
                    out += got
                    want -= len(got)
                    at += len(got)
                    j += 1
        finally:
            os.close(root_fd)
        return bytes(out)

    def _raw_layer(self, i: int) -> Iterator[bytes]:
        entries = self._parse(i)
        cache_id = (self._layerdb(i) / "cache-id").read_text().strip()
        diff = self.root / "overlay2" / cache_id / "diff"
        root_fd = os.open(diff, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for kind, val, size in entries:
                if kind == 2:
                    yield val  # type: ignore[misc]
                    continue
                fd = _open_beneath(root_fd, val)  # type: ignore[arg-type]
                try:
                    left = size
                    while left:
                        chunk = os.read(fd, min(left, WRITE_CHUNK))
                        if not chunk:
                            raise LayerDigestMismatch(f"layer {i}: file {val!r} is shorter than the {size} bytes "
                                                      f"its tar header says")
                        left -= len(chunk)
                        yield chunk
                finally:
                    os.close(fd)
        finally:
            os.close(root_fd)


class SaveLayerSource(LayerSource):
    """Layers from ``docker save``, extracted (after path-escape checks) into a private temporary directory.

    Works with any build engine the CLI reaches, but costs writing the whole image to disk once.
    """

    kind = "save"

    def __init__(self, image: LocalImage, docker_host: str | None = None, tmp_dir: Path | None = None):
        super().__init__(image)
        self.docker_host = docker_host
        self.tmp_dir = tmp_dir
        self._dir: Path | None = None
        self._layers: list[Path] = []
        self._config: Path | None = None
        self._lock = threading.Lock()

    def _ensure(self) -> Path:
        with self._lock:
            if self._dir is not None:
                return self._dir
            d = Path(tempfile.mkdtemp(prefix="eagle3ops-save-", dir=self.tmp_dir))
            argv = ["docker"] + (["-H", self.docker_host] if self.docker_host else []) + ["save", self.image.id]
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                assert proc.stdout is not None
                safe_extract(proc.stdout, d)
            except BaseException:
                proc.kill()
                proc.wait()
                shutil.rmtree(d, ignore_errors=True)
                raise
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            if proc.wait() != 0:
                shutil.rmtree(d, ignore_errors=True)
                raise TransferError(f"`{' '.join(argv)}` failed: {err.strip()}")
            manifest = json.loads((d / "manifest.json").read_text())
            for entry in manifest:
                cfg = d / entry["Config"]
                if "sha256:" + hashlib.sha256(cfg.read_bytes()).hexdigest() == self.image.id:
                    self._config = cfg
                    self._layers = [d / p for p in entry["Layers"]]
                    break
            else:
                shutil.rmtree(d, ignore_errors=True)
                raise TransferError(f"docker save of {self.image.ref}: no manifest entry with config {self.image.id}")
            for p in [self._config, *self._layers]:
                if not p.resolve().is_relative_to(d.resolve()):
                    raise UnsafeArchive(f"docker save manifest names {p}, outside the archive")
            self._dir = d
            return d

    def config_bytes(self) -> bytes:
        self._ensure()
        assert self._config is not None
        return self._config.read_bytes()

    def layer_size(self, i: int) -> int:
        self._ensure()
        return self._layers[i].stat().st_size

    def sample(self, i: int, n: int = 32 * 1024 * 1024, pieces: int = 32) -> bytes:
        self._ensure()
        total = self.layer_size(i)
        piece = max(n // pieces, 1)
        out = bytearray()
        with open(self._layers[i], "rb") as f:
            for k in range(pieces):
                f.seek(k * max(total - piece, 0) // max(pieces - 1, 1))
                out += f.read(piece)
        return bytes(out)

    def _raw_layer(self, i: int) -> Iterator[bytes]:
        self._ensure()
        with open(self._layers[i], "rb") as f:
            while chunk := f.read(WRITE_CHUNK):
                yield chunk

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def open_source(image: LocalImage, docker_host: str | None = None, prefer: str = "auto") -> LayerSource:
    """The fastest layer source that works: the classic store read directly, else ``docker save``.

    Args:
        prefer: ``auto``, ``store`` (fail if the store is not readable) or ``save``.
    """
    if prefer in ("auto", "store"):
        try:
            return StoreLayerSource.open(image, docker_host)
        except TransferError:
            if prefer == "store":
                raise
    return SaveLayerSource(image, docker_host)


# --- archive ----------------------------------------------------------------------------------------------------
def _tar_header(name: str, size: int, *, is_dir: bool = False) -> bytes:
    ti = tarfile.TarInfo(name)
    ti.size = 0 if is_dir else size
    ti.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    ti.mode = 0o755 if is_dir else 0o644
    ti.mtime = 0
    ti.uname = ti.gname = "root"
    return ti.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def _pad(n: int) -> bytes:
    return b"\0" * (-n % 512)


@dataclass(frozen=True)
class ArchivePart:
    """One ``docker load`` archive: the config to load, the layers it carries, their bytes.

    Attributes:
        config: config JSON bytes (the image's own, or a scaffold's).
        n_layers: the config's layer count (a prefix of the image's layers).
        include: indexes of the layer tars carried in the archive.
        repo_tags: tags to set (empty for scaffolds).
        scaffold: whether this is a scaffold (partial chain) image.
    """

    config: bytes
    n_layers: int
    include: tuple[int, ...]
    repo_tags: tuple[str, ...]
    scaffold: bool = False

    @property
    def config_id(self) -> str:
        """``sha256:`` of the config = the id the engine gives the loaded image."""
        return "sha256:" + hashlib.sha256(self.config).hexdigest()


def archive_segments(source: LayerSource, part: ArchivePart) -> Iterator[tuple[bytes | None, int | None]]:
    """The ``docker save``-format tar of ``part`` as segments: ``(bytes, None)`` for metadata (tar headers,
    config, padding, manifest) and ``(None, i)`` where layer ``i``'s tar data goes. Layer paths are
    ``<chainid hex>/layer.tar`` (unique per position even when diff ids repeat)."""
    img = source.image
    chains = img.chain_ids
    cfg_name = hashlib.sha256(part.config).hexdigest() + ".json"
    pending = _tar_header(cfg_name, len(part.config)) + part.config + _pad(len(part.config))
    for i in part.include:
        d = _hex(chains[i])
        size = source.layer_size(i)
        yield pending + _tar_header(d + "/", 0, is_dir=True) + _tar_header(d + "/layer.tar", size), None
        yield None, i
        pending = _pad(size)
    manifest = json.dumps([{
        "Config": cfg_name,
        "RepoTags": list(part.repo_tags) or None,
        "Layers": [_hex(chains[i]) + "/layer.tar" for i in range(part.n_layers)],
    }]).encode()
    yield pending + _tar_header("manifest.json", len(manifest)) + manifest + _pad(len(manifest)) + b"\0" * 1024, None


def archive_size(source: LayerSource, part: ArchivePart) -> int:
    """Exact byte length of the uncompressed archive of ``part``."""
    return sum(len(m) if m is not None else source.layer_size(i) for m, i in archive_segments(source, part))


def archive_chunks(source: LayerSource, part: ArchivePart) -> Iterator[tuple[bytes, int | None]]:
    """The uncompressed archive of ``part`` as chunks, each with the layer index it belongs to (None for
    metadata).

    Raises:
        LayerDigestMismatch: from :meth:`LayerSource.iter_layer`.
    """
    for meta, i in archive_segments(source, part):
        if meta is not None:
            yield meta, None
        else:
            yield from ((c, i) for c in source.iter_layer(i))


def scaffold_config(image: LocalImage, n_layers: int) -> bytes:
    """A minimal image config whose layers are the first ``n_layers`` of ``image`` (for resumable chunks).

    The engine stores it as an untagged image labelled ``eagle3ops.scaffold-for=<image id>``; it holds the
    layers registered so far so that a retry skips them.
    """
    cfg = {
        "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
        "config": {"Labels": {SCAFFOLD_LABEL: image.id}},
        "rootfs": {"type": "layers", "diff_ids": list(image.diff_ids[:n_layers])},
    }
    return json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode()


# --- remote inventory -------------------------------------------------------------------------------------------
def _is_containerd_store(info: dict) -> bool:
    for pair in info.get("DriverStatus") or []:
        if len(pair) == 2 and str(pair[1]).startswith("io.containerd.snapshotter"):
            return True
    return info.get("Driver") in ("overlayfs", "stargz", "native") and not info.get("DriverStatus")


@dataclass(frozen=True)
class HostStore:
    """What a host's engine holds.

    Attributes:
        kind: ``classic`` (layer store, thin archives work) or ``containerd`` (full archives).
        driver: storage driver name (``overlay2``, ``overlayfs``...).
        server_version: Docker server version.
        chain_ids: chain ids of every layer prefix of every image on the host.
        image_ids: ids of the images on the host.
        scaffolds: scaffold image id → the image id it was made for (left by interrupted pushes).
    """

    kind: str
    driver: str
    server_version: str
    chain_ids: frozenset[str]
    image_ids: frozenset[str]
    scaffolds: dict[str, str] = field(default_factory=dict)


def _docker(host, *args: str) -> list[str]:
    return ["docker"] + (["-H", host.docker_host] if host.docker_host else []) + list(args)


#: The host inventory in one round trip: ``docker info`` as JSON, a separator line, then id, diff ids and labels
#: of every image. The docker command (``docker -H ENDPOINT``) comes in as positional arguments ("$@"), so the
#: script is a constant and the argv is rendered (quoted) once like every other command.
_INVENTORY_SCRIPT = (
    '"$@" info --format "{{json .}}" || exit 97; echo "--eagle3ops--"; '
    '"$@" image ls -a -q --no-trunc | sort -u | '
    'xargs -r -n 200 "$@" image inspect --format "{{.Id}}\t{{json .RootFS.Layers}}\t{{json .Config.Labels}}"'
)


def inspect_host(remote) -> HostStore:
    """Ask a host which image store it runs and which layers (as chain ids) it holds.

    One SSH command (:data:`_INVENTORY_SCRIPT`): ``docker info``, then ``docker image inspect`` of every image
    (id, ``RootFS.Layers`` and the scaffold label).

    Args:
        remote: an :class:`eagle3ops.remote.Remote`.

    Raises:
        eagle3ops.remote.RemoteError: the host or its engine does not answer.
    """
    host = remote.host
    # check=False: an image deleted between `ls` and `inspect` makes inspect exit 1 but print all the others.
    r = remote.run(["sh", "-c", _INVENTORY_SCRIPT, "eagle3ops-inventory", *_docker(host)], timeout=120,
                   mutates=False, check=False)
    head, sep, rest = r.stdout.partition("--eagle3ops--\n")
    if r.exited == 97 or not sep:
        raise TransferError(f"{host.name}: the Docker engine at {host.docker_host or 'the default socket'} does not "
                            f"answer `docker info` as {host.user or 'the SSH user'}: {r.stderr.strip()[-300:]} "
                            f"(check docker_host in the inventory and that the user may use the socket)")
    info = json.loads(head)
    kind = "containerd" if _is_containerd_store(info) else "classic"
    ids: set[str] = set()
    chains: set[str] = set()
    scaffolds: dict[str, str] = {}
    for line in rest.splitlines():
        iid, _, tail = line.strip().partition("\t")
        if not iid:
            continue
        ids.add(iid)
        layers, _, labels = tail.partition("\t")
        if layers and layers != "null":
            chains.update(chain_ids(json.loads(layers)))
        target = (json.loads(labels) or {}).get(SCAFFOLD_LABEL) if labels and labels != "null" else None
        if target:
            scaffolds[iid] = target
    return HostStore(kind=kind, driver=str(info.get("Driver")), server_version=str(info.get("ServerVersion")),
                     chain_ids=frozenset(chains), image_ids=frozenset(ids), scaffolds=scaffolds)


def host_has_zstd(remote) -> bool:
    """Whether ``zstd`` is on the host's PATH (needed to send zstd streams)."""
    return remote.run(["sh", "-c", "command -v zstd"], check=False, timeout=30, mutates=False).ok


# --- streams ----------------------------------------------------------------------------------------------------
def _has_aes_ni() -> bool:
    try:
        return " aes " in Path("/proc/cpuinfo").read_text().split("\nflags", 2)[1].split("\n", 1)[0] + " "
    except (OSError, IndexError):
        return False


#: Put AES-GCM ahead of OpenSSH's default cipher order (chacha20-poly1305) when this CPU has AES-NI: measured on
#: this machine (2 loaded cores) 300 MB over loopback in 2.8 s with aes128-gcm vs 6.6 s with chacha20-poly1305.
#: ``^`` keeps the rest of the default list, so a server without AES-GCM still negotiates.
FAST_CIPHERS = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com" if _has_aes_ni() else ""


def _cfg_path(p: object, key: str, host) -> str:
    """``p`` as an absolute, double-quoted ssh_config path argument.

    Raises:
        TransferError: the path holds a character ssh_config cannot carry literally (``"``, a control character)
            or would expand (``%`` tokens, ``*?[`` globs in ``Include``); the message names the inventory key.
    """
    s = os.path.abspath(os.path.expanduser(str(p)))
    bad = sorted({c for c in s if c in '"%*?[' or ord(c) < 32 or ord(c) == 127})
    if bad:
        raise TransferError(f"{host.name}: path {s!r} (inventory key `{key}`) holds {''.join(bad)!r}, which an "
                            f"OpenSSH config cannot carry literally; move or rename the file")
    return f'"{s}"'


def ssh_client_config(host, fast_cipher: bool = True) -> str:
    """Text of the OpenSSH client config that the bulk path runs with (``ssh -F``; see :func:`ssh_argv`).

    Why a generated file: with ``ProxyJump`` OpenSSH dials each jump host with a separate ``ssh -W`` process that
    gets the ``-F`` file (and ``-l``/``-p`` from the jump spec) but none of the outer command line's ``-o``/``-i``
    options, so strictness given as ``-o`` would not reach the bastion hop. Everything that must hold on every hop
    is therefore written here, and ``ssh -F`` passes this file on to each jump process (OpenSSH ``ssh.c``, the
    ProxyJump → ProxyCommand conversion, since 7.3; measured with OpenSSH 9.2 by ``tests/test_remote_bastion.py``).

    Order is deliberate: OpenSSH takes the *first* value it reads for an option (ssh_config(5)), so the file has
    three parts:

    1. **enforced, before anything else** — ``StrictHostKeyChecking yes``, ``BatchMode yes`` (never a prompt),
       ``UpdateHostKeys no`` and ``CheckHostIP no`` (nothing is ever written to a known_hosts file),
       ``GlobalKnownHostsFile`` = the inventory's ``known_hosts``, ``~/.ssh/known_hosts``,
       ``/etc/ssh/ssh_known_hosts`` (+ ``ssh_known_hosts2``, OpenSSH's default), and the bounded-wait settings
       (``ConnectTimeout``, ``ServerAliveInterval``/``CountMax``, from :mod:`eagle3ops.remote`). No line of an
       included ssh_config can weaken these (a ``StrictHostKeyChecking no`` there is read second and ignored).
       The trusted keys sit in ``GlobalKnownHostsFile`` (read-only by OpenSSH's design) rather than
       ``UserKnownHostsFile``, so that a hop's own ``UserKnownHostsFile`` from ssh_config is still consulted as
       well — the same union :class:`eagle3ops.remote.Remote` (paramiko, RejectPolicy on every hop) checks.
    2. ``Include`` of the inventory's ``ssh_config`` — or, without one, of ``~/.ssh/config`` and
       ``/etc/ssh/ssh_config``, the files plain ``ssh`` (and Fabric) would read — for aliases, ``HostName``,
       ``Port``, ``User``, ``ProxyJump``. OpenSSH checks included files like ``~/.ssh/config``: owned by the user
       or root and not writable by group or others, else ``ssh`` stops with "Bad owner or permissions".
    3. ``Host *`` **defaults** the included file did not set: ``IdentityFile`` = the inventory's
       ``identity_file`` with ``IdentitiesOnly yes`` (identities accumulate, so on every hop it is offered after
       any ``IdentityFile`` ssh_config names, as on the paramiko path), and the AES-GCM cipher preference
       (:data:`FAST_CIPHERS`, when ``fast_cipher``) unless ssh_config chose ``Ciphers`` itself.

    The target's inventory ``port``/``user`` go on the command line (``-p``/``-l``), which applies to the target
    only, never to a jump host. Not covered: a ``ProxyCommand`` that runs its own ``ssh`` reads whatever config
    that command names.

    Args:
        host: a :class:`eagle3ops.config.HostConfig` (``name``, ``identity_file``, ``known_hosts``,
            ``ssh_config``).
        fast_cipher: add the :data:`FAST_CIPHERS` preference.

    Returns:
        The config text (paths absolute and double-quoted).

    Raises:
        TransferError: an inventory path cannot be written into an OpenSSH config (see :func:`_cfg_path`).
    """
    from eagle3ops.remote import CONNECT_TIMEOUT_S, KEEPALIVE_S

    known = ([_cfg_path(host.known_hosts, "known_hosts", host)] if host.known_hosts else []) + [
        _cfg_path("~/.ssh/known_hosts", "known_hosts", host), '"/etc/ssh/ssh_known_hosts"',
        '"/etc/ssh/ssh_known_hosts2"']
    if host.ssh_config:
        includes = [_cfg_path(host.ssh_config, "ssh_config", host)]
    else:
        includes = [_cfg_path("~/.ssh/config", "ssh_config", host), '"/etc/ssh/ssh_config"']
    lines = [
        f"# eagle3ops: OpenSSH client config of the bulk transfer path to {host.name!r} (generated, removed after "
        f"use). OpenSSH keeps the first value it reads for an option.",
        "# 1. enforced on every hop (the target and each ProxyJump host):",
        "StrictHostKeyChecking yes",
        "BatchMode yes",
        "UpdateHostKeys no",
        "CheckHostIP no",
        "GlobalKnownHostsFile " + " ".join(known),
        f"ConnectTimeout {CONNECT_TIMEOUT_S}",
        f"ServerAliveInterval {KEEPALIVE_S}",
        "ServerAliveCountMax 3",
        "LogLevel ERROR",
        "# 2. host aliases, HostName, Port, User, ProxyJump:",
        *(f"Include {p}" for p in includes),
        "# 3. defaults for what the included files left unset:",
        "Host *",
    ]
    if host.identity_file:
        lines += [f"    IdentityFile {_cfg_path(host.identity_file, 'identity_file', host)}", "    IdentitiesOnly yes"]
    if fast_cipher and FAST_CIPHERS:
        lines.append(f"    Ciphers {FAST_CIPHERS}")
    return "\n".join(lines) + "\n"


def write_ssh_config(host, fast_cipher: bool = True) -> Path:
    """Write :func:`ssh_client_config` to ``config`` (mode 0600) in a new private directory (``mkdtemp``, 0700).

    Returns:
        The file's path; the caller removes ``path.parent`` when the ``ssh`` process (and its jump processes, which
        read the file when they start) has exited.

    Raises:
        TransferError: see :func:`ssh_client_config` (nothing is left behind then).
    """
    text = ssh_client_config(host, fast_cipher=fast_cipher)
    d = Path(tempfile.mkdtemp(prefix="e3ops-ssh-"))
    path = d / "config"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    except BaseException:
        shutil.rmtree(d, ignore_errors=True)
        raise
    return path


def ssh_argv(host, remote_argv: Sequence[str], config_file: Path | str) -> list[str]:
    """OpenSSH client argv running ``remote_argv`` (quoted once by :func:`eagle3ops.remote.render`) on ``host``.

    Args:
        host: a :class:`eagle3ops.config.HostConfig`; ``hostname`` may be an ssh_config alias (``ProxyJump`` works).
        remote_argv: the remote command as an argv list.
        config_file: the file from :func:`write_ssh_config` (strict host keys on every hop, identity, timeouts),
            passed with ``-F``; the inventory's ``port``/``user`` are given as ``-p``/``-l`` (target only).

    Returns:
        ``["ssh", "-F", config_file, ..., "--", hostname, "<rendered command>"]``.
    """
    from eagle3ops.remote import render

    argv = ["ssh", "-F", str(config_file)]
    if host.port:
        argv += ["-p", str(host.port)]
    if host.user:
        argv += ["-l", host.user]
    return argv + ["--", host.hostname, render(list(remote_argv))]


@contextmanager
def ssh_command(host, remote_argv: Sequence[str], fast_cipher: bool = True) -> Iterator[list[str]]:
    """:func:`ssh_argv` with its config file written for the duration of the block (removed on exit).

    Yields:
        The argv to run (e.g. with :class:`subprocess.Popen`); the process must have exited when the block ends.
    """
    cfg = write_ssh_config(host, fast_cipher=fast_cipher)
    try:
        yield ssh_argv(host, remote_argv, cfg)
    finally:
        shutil.rmtree(cfg.parent, ignore_errors=True)


class ByteStream(ABC):
    """A remote command whose stdin we stream into, with a byte count, stall detection and bounded waits."""

    #: bytes written so far (as sent into the SSH stream)
    sent: int
    last_move: float

    @abstractmethod
    def write(self, data: bytes) -> None:
        """Send bytes; raises :class:`StreamStalled` / :class:`TransientTransferError` when the stream breaks."""

    @abstractmethod
    def close_input(self) -> None:
        """Send EOF (idempotent)."""

    @abstractmethod
    def finish(self, timeout: float) -> tuple[int, str, str]:
        """Close stdin, wait up to ``timeout`` s for the command; returns (exit status, stdout, stderr)."""

    @abstractmethod
    def kill(self) -> None:
        """Abort the stream."""


class SshStream(ByteStream):
    """The bulk path: an OpenSSH ``ssh`` subprocess (see :func:`ssh_argv`), watched by a stall watchdog.

    Its config file (:func:`write_ssh_config`, at :attr:`config_file`) lives until :meth:`finish` or :meth:`kill`
    (or, as a last resort, until the stream is garbage-collected)."""

    name = "openssh"

    def __init__(self, host, remote_argv: Sequence[str], stall_s: float = STALL_S, fast_cipher: bool = True):
        self.host = host
        self.config_file = write_ssh_config(host, fast_cipher=fast_cipher)
        self._remove_config = weakref.finalize(self, shutil.rmtree, self.config_file.parent, True)
        self.argv = ssh_argv(host, remote_argv, self.config_file)
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, bufsize=0)
        except BaseException:
            self._remove_config()
            raise
        self.sent = 0
        self.last_move = time.monotonic()
        self.stall_s = stall_s
        self.stalled = False
        self._done = threading.Event()
        self._out: list[bytes] = []
        self._err: list[bytes] = []
        self._readers = [threading.Thread(target=self._drain, args=(self.proc.stdout, self._out), daemon=True),
                         threading.Thread(target=self._drain, args=(self.proc.stderr, self._err), daemon=True)]
        for t in self._readers:
            t.start()
        self._watch = threading.Thread(target=self._watchdog, daemon=True)
        self._watch.start()

    @staticmethod
    def _drain(f, sink: list[bytes]) -> None:
        while chunk := f.read(65536):
            sink.append(chunk)

    def _watchdog(self) -> None:
        while not self._done.wait(0.5):
            if time.monotonic() - self.last_move > self.stall_s and self.proc.poll() is None:
                self.stalled = True
                self.proc.kill()
                return

    def _err_text(self) -> str:
        return b"".join(self._err).decode(errors="replace").strip()

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        view = memoryview(data)
        while view:
            try:
                n = self.proc.stdin.write(view[:WRITE_CHUNK])
            except (BrokenPipeError, OSError, ValueError):
                self.proc.wait(timeout=30)
                for t in self._readers:
                    t.join(timeout=5)
                if self.stalled:
                    raise StreamStalled(f"{self.host.name}: no progress for {self.stall_s:.0f}s after "
                                        f"{self.sent} bytes; stream killed") from None
                raise TransientTransferError(f"{self.host.name}: stream broke after {self.sent} bytes (ssh exit "
                                             f"{self.proc.returncode}): {self._err_text()[-500:]}") from None
            if n:
                self.sent += n
                self.last_move = time.monotonic()
                view = view[n:]

    def close_input(self) -> None:
        """Send EOF. After it docker load still applies the layers with no byte moving, so the stall watchdog
        stops here and the caller's deadline (:meth:`finish`) bounds the wait."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self._done.set()

    def finish(self, timeout: float) -> tuple[int, str, str]:
        self.close_input()
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise TransientTransferError(f"{self.host.name}: remote load did not finish within {timeout:.0f}s after "
                                         f"the stream ended") from None
        finally:
            self._remove_config()
        for t in self._readers:
            t.join(timeout=10)
        if self.stalled:
            raise StreamStalled(f"{self.host.name}: no progress for {self.stall_s:.0f}s; stream killed")
        return rc, b"".join(self._out).decode(errors="replace"), self._err_text()

    def kill(self) -> None:
        self._done.set()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._remove_config()


class ParamikoStream(ByteStream):
    """A channel on the already-open paramiko connection of :class:`eagle3ops.remote.Remote` (small archives)."""

    name = "paramiko"

    def __init__(self, remote, remote_argv: Sequence[str], stall_s: float = STALL_S):
        from eagle3ops.remote import render

        self.host = remote.host
        transport = remote.connection.client.get_transport()
        self.chan = transport.open_session(timeout=30)
        self.chan.settimeout(stall_s)
        self.chan.exec_command(render(list(remote_argv)))
        self.sent = 0
        self.last_move = time.monotonic()
        self.stall_s = stall_s

    def write(self, data: bytes) -> None:
        import socket

        view = memoryview(data)
        while view:
            try:
                n = self.chan.send(view[:WRITE_CHUNK])
            except socket.timeout:
                self.chan.close()
                raise StreamStalled(f"{self.host.name}: no progress for {self.stall_s:.0f}s after {self.sent} "
                                    f"bytes; channel closed") from None
            except (OSError, EOFError) as exc:
                raise TransientTransferError(f"{self.host.name}: channel broke after {self.sent} bytes: {exc}") from None
            if n <= 0:
                raise TransientTransferError(f"{self.host.name}: channel closed by the host after {self.sent} bytes "
                                             f"(exit {self.chan.exit_status if self.chan.exit_status_ready() else '?'})")
            self.sent += n
            self.last_move = time.monotonic()
            view = view[n:]

    def close_input(self) -> None:
        """Send EOF on the channel."""
        if not getattr(self, "_eof", False):
            self._eof = True
            self.chan.shutdown_write()

    def finish(self, timeout: float) -> tuple[int, str, str]:
        self.close_input()
        deadline = time.monotonic() + timeout
        out, err = [], []
        self.chan.settimeout(1.0)
        import socket

        while True:
            progressed = False
            while self.chan.recv_ready():
                out.append(self.chan.recv(65536)); progressed = True
            while self.chan.recv_stderr_ready():
                err.append(self.chan.recv_stderr(65536)); progressed = True
            if self.chan.exit_status_ready() and not progressed:
                break
            if time.monotonic() > deadline:
                self.chan.close()
                raise TransientTransferError(f"{self.host.name}: remote load did not finish within {timeout:.0f}s")
            if not progressed:
                try:
                    self.chan.status_event.wait(0.2)
                except socket.timeout:
                    pass
        rc = self.chan.recv_exit_status()
        self.chan.close()
        return rc, b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace")

    def kill(self) -> None:
        self.chan.close()


# --- compression ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Compression:
    """How the archive is compressed on the wire.

    Attributes:
        codec: ``none``, ``zstd`` (host needs ``zstd``; the load runs ``zstd -dc | docker load``) or ``gzip``
            (``docker load`` reads gzip natively).
        level: codec level.
        long: zstd long-distance matching with a 128 MiB window (``--long=27``): +14 % ratio on a CUDA-library
            layer here (2.24 → 2.55 at level 3) for ~35 % less speed; 128 MiB is zstd's default decompression
            window limit, so the host's ``zstd -d`` needs no flag.
        why: the measurement that decided it (shown in results).
    """

    codec: str = "none"
    level: int = 0
    why: str = ""
    long: bool = False

    @property
    def label(self) -> str:
        """``zstd-3-long``, ``gzip-1``, ``none``."""
        return "none" if self.codec == "none" else f"{self.codec}-{self.level}" + ("-long" if self.long else "")


def _zstd_argv(comp: Compression, threads: bool = True) -> list[str]:
    return ["zstd", "-q", "-c", f"-{comp.level}"] + (["-T0"] if threads else []) + (["--long=27"] if comp.long else [])


def compress_small(data: bytes, comp: Compression) -> bytes:
    """One complete zstd frame / gzip member holding ``data`` (metadata segments between layers)."""
    if comp.codec == "gzip":
        return gzip.compress(data, comp.level, mtime=0)
    return subprocess.run(_zstd_argv(comp, threads=False), input=data, capture_output=True,
                          check=True).stdout


class _Spool:
    """One layer compressed once into a spool file while any number of readers (hosts) stream from it.

    A producer thread feeds the layer's bytes (digest-checked) into ``zstd -T0`` (or zlib for gzip) and appends
    the output to the file; readers follow the growing file. A zstd stream / gzip member per layer; concatenated
    frames/members decompress as one stream (zstd format spec; RFC 1952 multi-member, which Go's gzip reader and so
    ``docker load`` accept).
    """

    def __init__(self, source: LayerSource, i: int, comp: Compression, path: Path):
        self.source, self.i, self.comp, self.path = source, i, comp, path
        self.raw = 0
        self.size = 0
        self.done = False
        self.error: BaseException | None = None
        self.cond = threading.Condition()
        self._f = open(path, "wb")
        threading.Thread(target=self._produce, daemon=True, name=f"spool-{i}").start()

    def _append(self, data: bytes) -> None:
        if data:
            self._f.write(data)
            self._f.flush()
            with self.cond:
                self.size += len(data)
                self.cond.notify_all()

    def _produce(self) -> None:
        try:
            if self.comp.codec == "gzip":
                z = zlib.compressobj(self.comp.level, zlib.DEFLATED, 31)
                for chunk in self.source.iter_layer(self.i):
                    self.raw += len(chunk)
                    self._append(z.compress(chunk))
                self._append(z.flush())
            else:
                proc = subprocess.Popen(_zstd_argv(self.comp), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, bufsize=0)
                err: list[BaseException] = []

                def feed() -> None:
                    try:
                        for chunk in self.source.iter_layer(self.i):
                            proc.stdin.write(chunk)  # type: ignore[union-attr]
                            self.raw += len(chunk)
                    except BaseException as exc:  # noqa: BLE001 - handed to readers
                        err.append(exc)
                        proc.kill()
                    finally:
                        try:
                            proc.stdin.close()  # type: ignore[union-attr]
                        except OSError:
                            pass

                t = threading.Thread(target=feed, daemon=True)
                t.start()
                while chunk := proc.stdout.read(WRITE_CHUNK):  # type: ignore[union-attr]
                    self._append(chunk)
                t.join()
                if proc.wait() != 0 and not err:
                    err.append(TransferError(f"zstd exited {proc.returncode} compressing layer {self.i}"))
                if err:
                    raise err[0]
        except BaseException as exc:  # noqa: BLE001 - handed to readers
            self.error = exc
        finally:
            self._f.close()
            with self.cond:
                self.done = True
                self.cond.notify_all()

    def read(self) -> Iterator[tuple[bytes, int]]:
        """Chunks of the compressed layer as they become available, each with the estimated raw bytes so far.

        Raises:
            the producer's error (e.g. :class:`LayerDigestMismatch`) once the reader catches up with it.
        """
        pos = 0
        with open(self.path, "rb") as f:
            while True:
                with self.cond:
                    while self.size <= pos and not self.done:
                        self.cond.wait(1.0)
                    size, done, error = self.size, self.done, self.error
                if error is not None:
                    raise error
                while pos < size:
                    chunk = f.read(min(WRITE_CHUNK, size - pos))
                    pos += len(chunk)
                    ratio = self.raw / max(self.size, 1)
                    yield chunk, int(pos * ratio) if not done else int(self.source.layer_size(self.i) * pos / size)
                if done and pos >= size:
                    return


class Encoders:
    """Layer bytes on the wire, shared by all hosts of one fan-out: each layer is compressed once per
    codec/level (in a :class:`_Spool`) however many hosts need it. Also caches the compressor measurement."""

    def __init__(self, source: LayerSource):
        self.source = source
        self._spools: dict[tuple[int, str, int, bool], _Spool] = {}
        self._measured: dict[tuple[str, int, bool], tuple[float, float]] = {}
        self._lock = threading.Lock()
        self._dir: Path | None = None

    def layer(self, i: int, comp: Compression) -> Iterator[tuple[bytes, int]]:
        """Wire chunks of layer ``i`` with the raw bytes they stand for (uncompressed: the chunk itself)."""
        if comp.codec == "none":
            done = 0
            for chunk in self.source.iter_layer(i):
                done += len(chunk)
                yield chunk, done
            return
        with self._lock:
            key = (i, comp.codec, comp.level, comp.long)
            spool = self._spools.get(key)
            if spool is None or (spool.done and spool.error is not None):  # a failed spool is redone on retry
                if self._dir is None:
                    self._dir = Path(tempfile.mkdtemp(prefix="eagle3ops-spool-"))
                spool = _Spool(self.source, i, comp, self._dir / f"{i}-{comp.label}")
                self._spools[key] = spool
        yield from spool.read()

    def sample(self, i: int, n: int = 32 * 1024 * 1024) -> bytes:
        """A sample of layer ``i`` spread over the layer (:meth:`LayerSource.sample`; cached), for the compressor
        measurement."""
        with self._lock:
            if getattr(self, "_sample", None) is None or self._sample[0] != i:
                self._sample = (i, self.source.sample(i, n))
            return self._sample[1]

    def decide(self, link_Bps: float, has_zstd: bool, total: int, largest: int) -> Compression:
        """:func:`choose_compression` for one host, reusing an earlier host's decision when its link rate was within
        a factor 3 (so a fan-out compresses each layer once, not once per host: link probes of hosts that share this
        machine's CPU scatter by 2x on a busy machine)."""
        with self._lock:
            for (link, zstd_ok), comp in getattr(self, "_decisions", {}).items():
                if zstd_ok == has_zstd and link / 3 <= link_Bps <= link * 3:
                    return comp
        comp = choose_compression(self.sample(largest), link_Bps, has_zstd, total, measure=self.measure)
        with self._lock:
            self.__dict__.setdefault("_decisions", {})[(link_Bps, has_zstd)] = comp
        return comp

    def measure(self, sample: bytes, codec: str, level: int, long: bool = False) -> tuple[float, float]:
        """:func:`measure_compressor`, once per setting for all hosts."""
        with self._lock:
            if (codec, level, long) not in self._measured:
                self._measured[(codec, level, long)] = measure_compressor(sample, codec, level, long)
            return self._measured[(codec, level, long)]

    def close(self) -> None:
        """Delete the spool files."""
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def measure_link(host, seconds_budget: float = 3.0, probe_bytes: int = 16 * 1024 * 1024) -> tuple[float, int]:
    """Measure the bulk SSH path to ``host``: random (incompressible) bytes into ``cat >/dev/null``, timed after a
    2 MiB warm-up that covers the handshake.

    Returns:
        (bytes per second, bytes sent in total including the warm-up).
    """
    s = SshStream(host, ["sh", "-c", "cat >/dev/null"], stall_s=30)
    try:
        s.write(os.urandom(2 * 1024 * 1024))
        block = os.urandom(1024 * 1024)
        t0 = time.monotonic()
        n = 0
        while n < probe_bytes and time.monotonic() - t0 < seconds_budget:
            s.write(block)
            n += len(block)
        rc, _, err = s.finish(timeout=60)
        dt = time.monotonic() - t0
        if rc != 0:
            raise TransientTransferError(f"{host.name}: link probe failed: {err}")
        return n / max(dt, 1e-6), s.sent
    except BaseException:
        s.kill()
        raise


def measure_compressor(sample: bytes, codec: str, level: int, long: bool = False) -> tuple[float, float]:
    """(input bytes per second, ratio) of ``codec`` at ``level`` on ``sample`` (zstd uses every core: ``-T0``)."""
    t0 = time.monotonic()
    if codec == "zstd":
        out = subprocess.run(_zstd_argv(Compression(codec, level, long=long)), input=sample, capture_output=True,
                             check=True).stdout
        n = len(out)
    else:
        n = len(zlib.compress(sample, level))
    dt = time.monotonic() - t0
    return len(sample) / max(dt, 1e-6), len(sample) / max(n, 1)


#: zstd settings tried by :func:`choose_compression`: (level, long-distance matching).
ZSTD_OPTIONS = ((1, False), (3, True), (6, True))


def choose_compression(sample: bytes, link_Bps: float, has_zstd: bool, total: int,
                       measure: Callable[..., tuple[float, float]] = measure_compressor) -> Compression:
    """Pick the codec minimising the predicted time ``max(total/compress_rate, total/(ratio*link))``; compression is
    used only when that beats ``total/link`` (uncompressed) by ≥ 20 %.

    Args:
        sample: a piece of the data to send, spread over the largest missing layer (:meth:`LayerSource.sample`).
        link_Bps: measured link rate (:func:`measure_link`).
        has_zstd: the host can decompress zstd (``zstd`` on its PATH); else gzip (``docker load`` native).
        total: bytes to send uncompressed.
        measure: ``(sample, codec, level, long) -> (rate B/s, ratio)``.
    """
    t_none = total / link_Bps
    options = ([Compression("zstd", lv, long=lg) for lv, lg in ZSTD_OPTIONS] if has_zstd and shutil.which("zstd")
               else [Compression("gzip", 1)])
    best, best_t, best_why = None, float("inf"), ""
    for c in options:
        rate, ratio = measure(sample, c.codec, c.level, c.long)
        t = max(total / rate, total / (ratio * link_Bps))
        if t < best_t:
            best, best_t = c, t
            best_why = f"{c.label} {rate / 1e6:.0f} MB/s ratio {ratio:.2f}"
    head = f"link {link_Bps / 1e6:.1f} MB/s, {best_why}: {best_t:.1f}s vs {t_none:.1f}s uncompressed predicted"
    if best is None or best_t > 0.8 * t_none:
        return Compression("none", 0, head)
    return Compression(best.codec, best.level, head, long=best.long)


# --- push one host ----------------------------------------------------------------------------------------------
@dataclass
class Progress:
    """A progress event of one host's push.

    ``layer`` is the layer index being sent (None for metadata), ``layer_bytes``/``layer_total`` its progress,
    ``done``/``total`` the uncompressed archive bytes of this push, ``wire`` the bytes written into SSH so far.
    """

    host: str
    phase: str
    layer: int | None = None
    layer_bytes: int = 0
    layer_total: int = 0
    done: int = 0
    total: int = 0
    wire: int = 0


@dataclass
class PushResult:
    """Outcome of a push to one host.

    Attributes:
        host: inventory name.
        status: ``ok`` (loaded and verified), ``present`` (already there with the tag), ``tagged`` (the image was
            there, only the tag was added) or ``failed``.
        reason: why it failed (empty on success).
        store: host image store, ``classic`` or ``containerd``; mode: ``thin`` (missing layers only) or ``full``.
        layers_total / layers_sent: layer counts; layer_bytes: uncompressed bytes of the layers sent.
        bytes_sent: bytes written into the SSH stream(s) (after compression), probes excluded.
        probe_bytes: bytes spent measuring the link.
        wall_s: seconds from start to verified; attempts: tries used.
        transport: ``openssh``/``paramiko``; compression: codec and why.
        per_layer: layer index → bytes of it on the wire; produced: uncompressed archive bytes streamed.
        load_wait_s: seconds the host's ``docker load`` took after the stream ended (layer apply).
    """

    host: str
    status: str = "failed"
    reason: str = ""
    image_id: str = ""
    store: str = ""
    mode: str = ""
    layers_total: int = 0
    layers_sent: int = 0
    layer_bytes: int = 0
    bytes_sent: int = 0
    probe_bytes: int = 0
    wall_s: float = 0.0
    attempts: int = 0
    transport: str = ""
    compression: str = "none"
    per_layer: dict[int, int] = field(default_factory=dict)
    produced: int = 0
    load_wait_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True unless the push failed."""
        return self.status != "failed"


@dataclass
class PushOptions:
    """Knobs of a push (defaults suit production).

    Attributes:
        compression: ``auto`` (by measurement), ``none``, ``zstd``, ``gzip``.
        transport: ``auto`` (paramiko for small archives, OpenSSH for bulk), ``openssh``, ``paramiko``.
        attempts: tries per host (tenacity), each re-reading the host inventory (resume).
        stall_s: seconds without progress before a stream is killed.
        chunk_bytes: resumable chunk size (layer bytes); 0 disables scaffolds.
        containerd: on a containerd-store host: ``full`` (send the full archive) or ``refuse``.
        source: ``auto``, ``store`` or ``save`` (see :func:`open_source`).
        load_argv: the host-side load command (default ``docker [-H ...] load``); only tests change it.
    """

    compression: str = "auto"
    transport: str = "auto"
    attempts: int = 3
    stall_s: float = STALL_S
    chunk_bytes: int = CHUNK_BYTES
    containerd: str = "full"
    source: str = "auto"
    load_argv: list[str] | None = None


def _plan_parts(source: LayerSource, store: HostStore, opts: PushOptions) -> tuple[list[ArchivePart], str]:
    img = source.image
    chains = img.chain_ids
    n = len(chains)
    if store.kind == "containerd":
        if opts.containerd == "refuse":
            raise TransferError("host runs the containerd image store; thin archives are untested there and "
                                "--containerd refuse was given")
        return [ArchivePart(source.config_bytes(), n, tuple(range(n)), img.repo_tags)], "full"
    missing = [i for i in range(n) if chains[i] not in store.chain_ids]
    parts: list[ArchivePart] = []
    group: list[int] = []
    acc = 0
    for i in missing:
        group.append(i)
        acc += source.layer_size(i)
        if opts.chunk_bytes and acc >= opts.chunk_bytes and i != missing[-1]:
            parts.append(ArchivePart(scaffold_config(img, i + 1), i + 1, tuple(group), (), scaffold=True))
            group, acc = [], 0
    parts.append(ArchivePart(source.config_bytes(), n, tuple(group), img.repo_tags))
    return parts, "thin"


def _verify(remote, img: LocalImage, store: HostStore) -> None:
    from eagle3ops.remote import RemoteCommandError

    host = remote.host
    refs = list(img.repo_tags) or [img.id]
    for ref in refs:
        try:
            r = remote.run(_docker(host, "image", "inspect", "--format", "{{.Id}} {{json .RootFS.Layers}}", ref),
                           timeout=60, mutates=False)
        except RemoteCommandError as exc:
            raise VerifyFailed(f"{host.name}: every layer was pushed but image {ref} is not on the host "
                               f"({exc.stderr.strip()[-200:]})") from None
        rid, _, layers = r.stdout.strip().partition(" ")
        if store.kind == "classic" and rid != img.id:
            raise VerifyFailed(f"{host.name}: image {ref} on the host has id {rid}, expected {img.id}")
        if tuple(json.loads(layers or "[]")) != img.diff_ids:
            raise VerifyFailed(f"{host.name}: image {ref} on the host has different layers than {img.id}")


class _PartSender:
    """Streams one :class:`ArchivePart` into ``docker load`` on the host, in three steps so that parts overlap:
    :meth:`body` (everything but the last archive segment), :meth:`final` (the manifest and end-of-archive) and
    :meth:`wait` (the host's load finishing). ``docker load`` reads the whole archive before it registers any layer
    (moby ``image/tarexport/load.go``), so holding back the manifest until the previous part's load has finished
    keeps the layer-parent order while the next part already streams during the previous part's layer apply."""

    def __init__(self, remote, encoders: Encoders, part: ArchivePart, opts: PushOptions, comp: Compression,
                 result: PushResult, on_progress: Callable[[Progress], None] | None, total_layer_bytes: int,
                 stream_hook: Callable[[ByteStream], None] | None):
        self.remote, self.encoders, self.part, self.opts, self.comp = remote, encoders, part, opts, comp
        self.result, self.on_progress, self.total = result, on_progress, total_layer_bytes
        host = remote.host
        load = opts.load_argv or _docker(host, "load")
        if comp.codec == "zstd":
            load = ["sh", "-c", 'zstd -d -q -c | "$@"', "eagle3ops-load", *load]
        self.size = archive_size(encoders.source, part)
        self.use_paramiko = opts.transport == "paramiko" or (opts.transport == "auto" and
                                                              self.size < SMALL_ARCHIVE_BYTES)
        self.stream: ByteStream = (ParamikoStream(remote, load, opts.stall_s) if self.use_paramiko
                                   else SshStream(host, load, opts.stall_s))
        result.transport = self.stream.name  # type: ignore[attr-defined]
        if stream_hook:
            stream_hook(self.stream)
        self._final: bytes = b""
        self._counted = False

    def _progress(self, phase: str, layer: int | None = None, layer_raw: int = 0) -> None:
        if self.on_progress:
            src = self.encoders.source
            self.on_progress(Progress(self.remote.host.name, phase, layer, layer_raw,
                                      src.layer_size(layer) if layer is not None else 0, self.result.produced,
                                      self.total, self.result.bytes_sent + self.stream.sent))

    def _meta(self, meta: bytes) -> bytes:
        return meta if self.comp.codec == "none" else compress_small(meta, self.comp)

    def body(self) -> None:
        """Send everything but the final segment (the layers the host lacks)."""
        source, result, stream = self.encoders.source, self.result, self.stream
        segments = list(archive_segments(source, self.part))
        final_meta, _ = segments.pop()
        assert final_meta is not None
        self._final = final_meta
        for meta, i in segments:
            if meta is not None:
                stream.write(self._meta(meta))
                result.produced += len(meta)
                continue
            assert i is not None
            base, wire_start = result.produced, stream.sent
            buf: list[bytes] = []
            buffered = 0
            for chunk, raw in self.encoders.layer(i, self.comp):
                buf.append(chunk)
                buffered += len(chunk)
                if buffered >= WRITE_CHUNK:
                    stream.write(b"".join(buf))
                    buf, buffered = [], 0
                    result.produced = base + raw
                    result.per_layer[i] = stream.sent - wire_start
                    self._progress("send", i, raw)
            if buf:
                stream.write(b"".join(buf))
            result.produced = base + source.layer_size(i)
            result.per_layer[i] = stream.sent - wire_start
            self._progress("send", i, source.layer_size(i))

    def hold(self) -> None:
        """Suspend stall detection while this stream waits for the previous part's load (itself bounded)."""
        self._stall = self.stream.stall_s  # type: ignore[attr-defined]
        self.stream.stall_s = float("inf")  # type: ignore[attr-defined]

    def release(self) -> None:
        """Resume stall detection."""
        self.stream.last_move = time.monotonic()
        self.stream.stall_s = self._stall  # type: ignore[attr-defined]

    def final(self) -> None:
        """Send the manifest and the end of the archive; the host's ``docker load`` then registers the layers."""
        self.stream.write(self._meta(self._final))
        self.stream.close_input()
        self.result.produced += len(self._final)
        self._t_end = time.monotonic()

    def wait(self) -> None:
        """Wait (bounded) for the host's ``docker load``; raise on failure.

        Raises:
            TransientTransferError: ssh failed (exit 255) or the load did not finish in time.
            TransferError: ``docker load`` failed.
        """
        self._progress("load")
        timeout = 300 + self.size / 5e6  # docker load applies ~1 GB in well under 200 s; generous, but bounded
        rc, out, err = self.stream.finish(timeout=timeout)
        self.result.load_wait_s += time.monotonic() - self._t_end
        self._count()
        if rc != 0:
            msg = (err or out).strip()[-600:]
            if rc == 255 and not self.use_paramiko and "Host key verification failed" in msg:
                raise TransferError(f"{self.remote.host.name}: OpenSSH refused a host key on the bulk path (target "
                                    f"or ProxyJump host; see ssh_client_config for the known_hosts files it "
                                    f"reads): {msg}")
            if rc == 255 and not self.use_paramiko:
                raise TransientTransferError(f"{self.remote.host.name}: ssh failed (exit 255): {msg}")
            raise TransferError(f"{self.remote.host.name}: `docker load` failed (exit {rc}): {msg}")
        self.result.layers_sent += len(self.part.include)
        self.result.layer_bytes += sum(self.encoders.source.layer_size(i) for i in self.part.include)

    def _count(self) -> None:
        if not self._counted:
            self._counted = True
            self.result.bytes_sent += self.stream.sent

    def kill(self) -> None:
        """Abort the stream (on any failure)."""
        self.stream.kill()
        self._count()


def _send_parts(remote, encoders: Encoders, parts: Sequence[ArchivePart], opts: PushOptions, comp: Compression,
                result: PushResult, on_progress: Callable[[Progress], None] | None, total_layer_bytes: int,
                stream_hook: Callable[[ByteStream], None] | None) -> None:
    """Send the parts in order, part k+1's layers streaming while the host applies part k (see
    :class:`_PartSender`); part k+1's manifest goes out only after part k's load succeeded."""
    pending: _PartSender | None = None
    cur: _PartSender | None = None
    try:
        for part in parts:
            cur = _PartSender(remote, encoders, part, opts, comp, result, on_progress, total_layer_bytes,
                              stream_hook)
            cur.body()
            if pending is not None:
                cur.hold()
                pending.wait()
                cur.release()
            pending = None
            cur.final()
            pending, cur = cur, None
        if pending is not None:
            pending.wait()
            pending = None
    except BaseException:
        if cur is not None:
            cur.kill()
        if pending is not None:
            # The previous part went out whole: let its load finish (bounded) so that a retry resumes after it.
            try:
                pending.wait()
            except BaseException:  # noqa: BLE001 - the first error is the one to report
                pending.kill()
        raise


def _cleanup_scaffolds(remote, img: LocalImage, store: HostStore, parts: Sequence[ArchivePart] = ()) -> None:
    """Remove the scaffold images of ``img`` (those the inventory saw and those loaded now)."""
    host = remote.host
    ids = [i for i, target in store.scaffolds.items() if target == img.id]
    ids += [p.config_id for p in parts if p.scaffold]
    if ids:
        remote.run(_docker(host, "image", "rm", *sorted(set(ids))), timeout=120, check=False)


def push(image: LocalImage | str, host, *, source: LayerSource | None = None, encoders: Encoders | None = None,
         options: PushOptions | None = None, on_progress: Callable[[Progress], None] | None = None,
         stream_hook: Callable[[ByteStream], None] | None = None) -> PushResult:
    """Push one image to one host; never raises for host-side failures (they are in the result).

    Args:
        image: a :class:`LocalImage` or a reference on the build engine.
        host: the :class:`eagle3ops.config.HostConfig` of the host.
        source: layer source (default: :func:`open_source`).
        encoders: shared :class:`Encoders` of a fan-out (compress each layer once for all hosts).
        options: :class:`PushOptions`.
        on_progress: called with :class:`Progress` events (from the pushing thread).
        stream_hook: called with each stream as it opens (tests use it to break streams).

    Returns:
        :class:`PushResult` (``status`` ``ok``/``present``/``tagged``/``failed``).
    """
    from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

    from eagle3ops.remote import HostUnreachable, Remote, RemoteError

    opts = options or PushOptions()
    t0 = time.monotonic()
    img = inspect_local(image) if isinstance(image, str) else image
    result = PushResult(host=host.name, image_id=img.id, layers_total=len(img.diff_ids))
    own = encoders is None
    if encoders is None:
        encoders = Encoders(source or open_source(img, prefer=opts.source))
    src = encoders.source
    remote = Remote(host)

    def attempt() -> None:
        result.attempts += 1
        try:
            store = inspect_host(remote)
        except HostUnreachable as exc:
            raise TransientTransferError(str(exc)) from None
        result.store = store.kind
        if img.id in store.image_ids and store.kind == "classic":
            missing_tags = []
            for tag in img.repo_tags:
                r = remote.run(_docker(host, "image", "inspect", "--format", "{{.Id}}", tag), check=False,
                               timeout=60, mutates=False)
                if r.stdout.strip() != img.id:
                    missing_tags.append(tag)
            for tag in missing_tags:
                remote.run(_docker(host, "tag", img.id, tag), timeout=60)
            _verify(remote, img, store)
            _cleanup_scaffolds(remote, img, store)
            if result.status != "ok":
                result.status = "tagged" if missing_tags else "present"
            return
        parts, result.mode = _plan_parts(src, store, opts)
        total = sum(src.layer_size(i) for p in parts for i in p.include)
        comp = Compression("none", 0, "")
        if opts.compression in ("zstd", "gzip"):
            comp = Compression(opts.compression, 3 if opts.compression == "zstd" else 1, "forced",
                               long=opts.compression == "zstd")
            if comp.codec == "zstd" and not host_has_zstd(remote):
                raise TransferError(f"{host.name}: --compression zstd but the host has no `zstd`; use gzip or auto")
        elif opts.compression == "auto" and total >= COMPRESS_MIN_BYTES:
            largest = max((i for p in parts for i in p.include), key=src.layer_size)
            link, probe = measure_link(host)
            result.probe_bytes += probe
            comp = encoders.decide(link, host_has_zstd(remote), total, largest)
        result.compression = comp.label + (f" ({comp.why})" if comp.why else "")
        _send_parts(remote, encoders, parts, opts, comp, result, on_progress, total, stream_hook)
        if on_progress:
            on_progress(Progress(host.name, "verify", None, 0, 0, result.produced, total, result.bytes_sent))
        _verify(remote, img, store)
        result.status = "ok"
        _cleanup_scaffolds(remote, img, store, parts)

    try:
        for att in Retrying(stop=stop_after_attempt(max(1, opts.attempts)),
                            wait=wait_exponential(multiplier=1, min=1, max=20),
                            retry=retry_if_exception_type(TransientTransferError), reraise=True):
            with att:
                attempt()
    except (TransferError, RemoteError) as exc:
        result.status = "failed"
        result.reason = str(exc)
    except OSError as exc:  # local trouble (disk full for the spool, a vanished file): this host fails, others go on
        result.status = "failed"
        result.reason = f"{host.name}: local error: {exc}"
    except RetryError as exc:  # pragma: no cover - reraise=True makes this unreachable
        result.status, result.reason = "failed", str(exc)
    finally:
        remote.close()
        if own:
            encoders.close()
            src.close()
    result.wall_s = time.monotonic() - t0
    return result


def push_many(image: str, hosts: Sequence, *, options: PushOptions | None = None, parallel: int = 8,
              on_progress: Callable[[Progress], None] | None = None) -> list[PushResult]:
    """Push one image to many hosts in parallel (one thread per host, at most ``parallel`` at once), sharing one
    layer source. One failed host does not stop the others.

    Returns:
        one :class:`PushResult` per host, in the order given.
    """
    opts = options or PushOptions()
    img = inspect_local(image)
    src = open_source(img, prefer=opts.source)
    enc = Encoders(src)
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(hosts)))) as ex:
            futs = [ex.submit(push, img, h, encoders=enc, options=opts, on_progress=on_progress) for h in hosts]
            return [f.result() for f in futs]
    finally:
        enc.close()
        src.close()


# --- CLI --------------------------------------------------------------------------------------------------------
def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def results_table(image: str, results: Iterable[PushResult]):
    """A rich table: one row per host with status, store/mode, layers, bytes, time, reason."""
    from rich.table import Table

    t = Table(title=f"push {image}")
    for col in ("host", "status", "store/mode", "layers sent", "layer bytes", "bytes sent", "time", "transport",
                "reason / compression"):
        t.add_column(col)
    for r in results:
        style = {"ok": "green", "present": "cyan", "tagged": "cyan"}.get(r.status, "red")
        t.add_row(r.host, f"[{style}]{r.status}[/]", f"{r.store}/{r.mode or '-'}", f"{r.layers_sent}/{r.layers_total}",
                  _fmt_bytes(r.layer_bytes), _fmt_bytes(r.bytes_sent), f"{r.wall_s:.1f}s", r.transport or "-",
                  r.reason or r.compression)
    return t


def push_command(
    image: str = typer.Argument(..., help="Image reference on the build engine (tag or id)."),
    hosts: list[str] = typer.Argument(..., help="Inventory host names."),
    inventory: Path = typer.Option(Path("deploy/hosts.yaml"), "--inventory", "-i", help="Inventory file."),
    compression: str = typer.Option("auto", help="auto (by measurement) | none | zstd | gzip."),
    transport: str = typer.Option("auto", help="auto | openssh | paramiko."),
    attempts: int = typer.Option(3, min=1, help="Tries per host."),
    stall_s: float = typer.Option(STALL_S, help="Seconds without progress before a stream is killed."),
    parallel: int = typer.Option(8, min=1, help="Hosts pushed at once."),
    containerd: str = typer.Option("full", help="On a containerd-store host: full (send all layers) | refuse."),
) -> None:
    """Push IMAGE to each HOST over SSH: only missing layers, verified by image id, in parallel."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress as RichProgress, TextColumn, TransferSpeedColumn

    from eagle3ops.config import ConfigError, load_inventory

    console = Console(stderr=True)
    try:
        inv = load_inventory(inventory)
        host_cfgs = [inv.host(h) for h in hosts]
    except ConfigError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2)
    for name, val, allowed in (("--compression", compression, ("auto", "none", "zstd", "gzip")),
                               ("--transport", transport, ("auto", "openssh", "paramiko")),
                               ("--containerd", containerd, ("full", "refuse"))):
        if val not in allowed:
            console.print(f"[red]error:[/] {name} {val!r}: use one of {', '.join(allowed)}")
            raise typer.Exit(2)
    opts = PushOptions(compression=compression, transport=transport, attempts=attempts, stall_s=stall_s,
                       containerd=containerd)
    with RichProgress(TextColumn("{task.fields[host]:>12}"), TextColumn("{task.description}"), BarColumn(),
                      DownloadColumn(), TransferSpeedColumn(), console=console, transient=False) as bar:
        tasks = {h.name: bar.add_task("inventory", host=h.name, total=None) for h in host_cfgs}
        lock = threading.Lock()

        def on_progress(p: Progress) -> None:
            with lock:
                desc = {"send": f"layer {p.layer}" if p.layer is not None else "metadata",
                        "load": "docker load", "verify": "verify"}.get(p.phase, p.phase)
                if p.phase == "send" and p.layer is not None:
                    desc += f" {_fmt_bytes(p.layer_bytes)}/{_fmt_bytes(p.layer_total)}"
                bar.update(tasks[p.host], description=desc, completed=p.done, total=p.total or None)

        try:
            results = push_many(image, host_cfgs, options=opts, parallel=parallel, on_progress=on_progress)
        except TransferError as exc:
            console.print(f"[red]error:[/] {exc}")
            raise typer.Exit(2)
        for r in results:
            bar.update(tasks[r.host], description=r.status)
    Console().print(results_table(image, results))
    if not all(r.ok for r in results):
        raise typer.Exit(1)
