"""Layer sources: where the bytes of an image's config and layer tars come from on the build machine.

:class:`StoreLayerSource` reads the build engine's classic overlay2 layer store directly (byte-identical to
``docker save``'s layer tars, digest checked while streaming); :class:`SaveLayerSource` extracts ``docker save``
into a private temporary directory after every member passed the path-escape checks; :func:`open_source` picks the
fastest that works.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

from eagle3ops import executor
from eagle3ops.commands import transfer as tc
from eagle3ops.transfer.errors import LayerDigestMismatch, TransferError, UnsafeArchive
from eagle3ops.transfer.limits import WRITE_CHUNK
from eagle3ops.transfer.local import LocalImage, digest_hex, is_containerd_store, local_info
from eagle3ops.transfer.tarsafe import open_beneath, safe_extract


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
        inf = local_info(docker_host)
        driver = inf.get("Driver")
        if driver != "overlay2" or is_containerd_store(inf):
            raise TransferError(f"build engine storage driver {driver!r} is not the classic overlay2 store")
        root = Path(inf.get("DockerRootDir") or "/var/lib/docker")
        cfg = root / "image" / "overlay2" / "imagedb" / "content" / "sha256" / digest_hex(image.id)
        if not os.access(cfg, os.R_OK):
            raise TransferError(f"{cfg} is not readable (needs root on the build machine)")
        src = cls(image, root)
        for i in range(len(image.diff_ids)):
            d = src._layerdb(i)
            if not (d / "tar-split.json.gz").is_file():
                raise TransferError(f"{d}/tar-split.json.gz missing")
        return src

    def _layerdb(self, i: int) -> Path:
        return self.root / "image" / "overlay2" / "layerdb" / "sha256" / digest_hex(self.image.chain_ids[i])

    def config_bytes(self) -> bytes:
        data = (self.root / "image" / "overlay2" / "imagedb" / "content" / "sha256" / digest_hex(self.image.id)).read_bytes()
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
                        fd = open_beneath(root_fd, val)  # type: ignore[arg-type]
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
                fd = open_beneath(root_fd, val)  # type: ignore[arg-type]
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
            argv = tc.local_save(self.docker_host, self.image.id)
            proc = executor.local().popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
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
                raise TransferError(f"`{shlex.join(argv)}` failed: {err.strip()}")
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

    Raises:
        TransferError: the build engine uses the containerd image store. Its image ids are manifest digests and
            its ``docker save`` carries layer blobs as stored (compressed for built or pulled images), while both
            sources here need the config digest as image id and uncompressed layer tars; only the *host* side
            handles that store so far.
    """
    if is_containerd_store(local_info(docker_host)):
        raise TransferError(f"the build engine ({docker_host or 'the default Docker endpoint'}) uses the containerd "
                            f"image store, which eagle3ops cannot read layers from yet (hosts with that store are "
                            f"supported); build and push from an engine with the classic store (daemon.json "
                            f'"features": {{"containerd-snapshotter": false}})')
    if prefer in ("auto", "store"):
        try:
            return StoreLayerSource.open(image, docker_host)
        except TransferError:
            if prefer == "store":
                raise
    return SaveLayerSource(image, docker_host)
