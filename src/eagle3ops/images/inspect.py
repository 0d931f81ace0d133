"""The images on an engine as the image code sees them: ``image ls`` (:func:`list_images`, local engine or a host's
through a runner), searching an image's layers (:func:`find_in_layers`), and sizes for people (:func:`human_size`).
The SDK client is :mod:`~eagle3ops.images.engine`'s."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from eagle3ops import executor
from eagle3ops.config.images import ImageError
from eagle3ops.images.engine import docker_client
from eagle3ops.images.tags import LABEL_PREFIX, OCI


@dataclass
class ImageInfo:
    """One image as ``image ls`` shows it."""

    tags: list[str]
    image_id: str
    size: int
    profile: str | None
    patches: dict[str, str]
    revision: str | None = None
    verified: str | None = None


Runner = Callable[[list[str]], Any]


def _run_local(argv: list[str]) -> str:
    return executor.local().run(argv).stdout


def list_images(runner: Runner | None = None, *, all_images: bool = False, host: Any = None) -> list[ImageInfo]:
    """eagle3ops images (those with an ``io.eagle3ops.*`` label) on the local engine or, with ``runner``, a host.

    ``runner(argv)`` runs a docker command where the images are and returns its stdout (a str, or an object with
    ``.stdout`` such as :class:`eagle3ops.commands.types.Result`); e.g. ``lambda argv: Remote(host).run(argv)``.
    ``host`` (a :class:`eagle3ops.config.HostConfig`) names the engine the commands address (its ``docker_host``;
    argv from :mod:`eagle3ops.commands.docker`); None: the default engine where ``runner`` runs. Without ``runner``
    the local engine is asked through the docker SDK.
    """
    if runner is None:
        client = docker_client()
        raw = [i.attrs for i in client.images.list()]
    else:
        def out(argv: list[str]) -> str:
            r = runner(argv)
            return r if isinstance(r, str) else r.stdout

        from eagle3ops.commands import docker as dk

        ids = sorted(set(out(dk.image_ids(host)).split()))
        raw = json.loads(out(dk.inspect_images(host, ids))) if ids else []
    result = []
    for a in raw:
        labels = (a.get("Config") or {}).get("Labels") or {}
        if not all_images and not any(k.startswith(LABEL_PREFIX + ".") for k in labels):
            continue
        try:
            patches = json.loads(labels.get(f"{LABEL_PREFIX}.patches", "{}"))
        except json.JSONDecodeError:
            patches = {}
        result.append(ImageInfo(tags=a.get("RepoTags") or [], image_id=a["Id"], size=int(a.get("Size", 0)),
                                profile=labels.get(f"{LABEL_PREFIX}.profile"), patches=patches,
                                revision=labels.get(f"{OCI}.revision"),
                                verified=labels.get(f"{LABEL_PREFIX}.verified")))
    return sorted(result, key=lambda i: (i.tags or ["~"])[0])


class _ChunkReader:
    """File-like ``read(n)`` over an iterator of byte chunks (``docker save``'s stream), hashing what it yields
    when ``hasher`` is set."""

    def __init__(self, chunks: Iterable[bytes]):
        self._it = iter(chunks)
        self._buf = b""
        self.hasher: Any = None

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buf) < n:
            try:
                self._buf += next(self._it)
            except StopIteration:
                break
        if n < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        if self.hasher is not None:
            self.hasher.update(out)
        return out


class _Hashing:
    """Wrap a file-like, hashing every byte read (to learn a layer tar's diff id while streaming it)."""

    def __init__(self, f: Any):
        self.f, self.h = f, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        return data


def find_in_layers(image: str, contents: Sequence[bytes] = (), names: Sequence[str] = (), *,
                   skip_base: str | None = None, client: Any = None, chunk: int = 1 << 22) -> tuple[list[str], int]:
    """Search every layer of ``docker save image`` for files whose bytes contain one of ``contents`` or whose path
    contains one of ``names``.

    The archive is streamed (nothing written to disk, so a 9 GB image needs no 9 GB of scratch space): each layer
    tar is parsed as it arrives and hashed on the way, which gives its diff id. File contents are read in
    ``chunk``-sized pieces with an overlap, so a needle across a chunk boundary is still found.

    Args:
        skip_base: an image whose layers (by diff id) are not reported, e.g. the base when only the layers a
            build added matter (they are still read: the stream has them).

    Returns:
        (hits as ``"<layer diff id>:<path>: ..."``, number of layers scanned and reported).
    """
    import tarfile

    # the engine prepares the archive before the first byte comes back: allow far more than the 60 s default
    client = client or executor.engine(timeout=3600)
    skip: set[str] = set()
    if skip_base:
        skip = set(client.images.get(skip_base).attrs["RootFS"]["Layers"])
    want = set(client.images.get(image).attrs["RootFS"]["Layers"])
    hits: list[str] = []
    overlap = max((len(n) for n in contents), default=1) - 1
    scanned = 0
    outer = tarfile.open(fileobj=_ChunkReader(client.images.get(image).save(named=False)), mode="r|")
    for m in outer:
        if not (m.isfile() and m.name.endswith("layer.tar")):
            continue
        lf = outer.extractfile(m)
        assert lf is not None
        hashing = _Hashing(lf)
        layer_hits: list[str] = []
        with tarfile.open(fileobj=hashing, mode="r|") as inner:
            for im in inner:
                layer_hits.extend(f"{im.name}: path contains {n!r}" for n in names if n in im.name)
                if not im.isfile() or not contents:
                    continue
                fo = inner.extractfile(im)
                assert fo is not None
                tail = b""
                while data := fo.read(chunk):
                    window = tail + data
                    layer_hits.extend(f"{im.name}: contains {n[:40]!r}" for n in contents if n in window)
                    tail = window[-overlap:] if overlap > 0 else b""
        while hashing.read(chunk):  # the tar's end padding: the diff id covers every byte
            pass
        diff_id = "sha256:" + hashing.h.hexdigest()
        if diff_id not in want:
            raise ImageError(f"docker save of {image}: layer {m.name} has diff id {diff_id}, not one of the image's")
        if diff_id in skip:
            continue
        scanned += 1
        hits.extend(f"{diff_id[7:19]}:{h}" for h in layer_hits)
    return sorted(set(hits)), scanned


def human_size(n: int) -> str:
    """Bytes as a short decimal string (``1.2 GB``), like ``docker image ls``."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"
