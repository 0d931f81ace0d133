"""The archives ``docker load`` reads, generated on the fly (pure: bytes in, bytes out, no I/O of its own).

Two formats, one per image store (:attr:`ArchivePart.fmt`):

``docker-save`` (the classic layer store)
    ``manifest.json``, the config and ``<chainid>/layer.tar`` only for the layers the host lacks. Docker's classic
    ``docker load`` looks layers up by chain id and accepts the layer tars it holds being absent (FACTS.md).
``oci`` (the containerd image store)
    an OCI image layout: ``oci-layout``, ``blobs/sha256/<hex>`` (config, the missing layers, the manifest) and
    ``index.json`` naming the manifest once per tag. containerd's importer refuses a ``docker-save`` archive with a
    layer tar left out (``failed to resolve layers: layer "<chainid>/layer.tar" not found``, measured on Docker
    26.1.5 + containerd 1.7.24), but takes an OCI layout whose manifest names blobs the archive does not carry; its
    unpacker skips every layer whose snapshot (chain id) exists. The manifest (:func:`oci_manifest`) names the
    layers uncompressed (blob digest = diff id) and is byte-identical to the one containerd's importer writes for a
    ``docker save`` archive of the same image, so the image id there (the manifest digest) is the same whichever way
    the image was loaded.

A *scaffold* config (a prefix of the image's layers, labelled :data:`SCAFFOLD_LABEL`) makes a chunk of a large push
loadable on its own, so a broken push resumes after the last chunk the host registered.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from eagle3ops.transfer.local import LocalImage, digest_hex
from eagle3ops.transfer.sources import LayerSource

#: Label on scaffold images (partial chains loaded for resumable pushes).
SCAFFOLD_LABEL = "eagle3ops.scaffold-for"
#: Archive formats: Docker's ``docker save`` layout (classic store) and the OCI image layout (containerd store).
FORMATS = ("docker-save", "oci")
#: Media types of the manifest :func:`oci_manifest` writes (Docker image manifest v2 schema 2, uncompressed layers:
#: what containerd's importer writes for a ``docker save`` archive).
MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_MEDIA_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_MEDIA_TYPE = "application/vnd.docker.image.rootfs.diff.tar"

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
        fmt: ``docker-save`` (classic store) or ``oci`` (containerd store), see the module docs.
        layer_sizes: byte size of each of the ``n_layers`` layer tars (needed by the ``oci`` manifest only).
    """

    config: bytes
    n_layers: int
    include: tuple[int, ...]
    repo_tags: tuple[str, ...]
    scaffold: bool = False
    fmt: str = "docker-save"
    layer_sizes: tuple[int, ...] = ()

    @property
    def config_id(self) -> str:
        """``sha256:`` of the config: the image id on the classic store."""
        return "sha256:" + hashlib.sha256(self.config).hexdigest()

    def manifest(self, diff_ids: Sequence[str]) -> bytes:
        """The ``oci`` format's manifest of this part (:func:`oci_manifest` of its config and first ``n_layers``
        layers)."""
        return oci_manifest(self.config, diff_ids[:self.n_layers], self.layer_sizes[:self.n_layers])

    def host_id(self, diff_ids: Sequence[str]) -> str:
        """The id the host's engine gives the loaded image: the config digest for ``docker-save`` (classic store),
        the manifest digest for ``oci`` (containerd store, where an image id is its manifest's digest)."""
        if self.fmt == "oci":
            return "sha256:" + hashlib.sha256(self.manifest(diff_ids)).hexdigest()
        return self.config_id


def oci_manifest(config: bytes, diff_ids: Sequence[str], sizes: Sequence[int]) -> bytes:
    """A Docker image manifest (v2 schema 2) naming ``config`` and the layers uncompressed (blob digest = diff id).

    The bytes equal those containerd 1.7's importer writes when Docker 26.1 (containerd store) loads a ``docker
    save`` archive of the same image (compact JSON, keys in this order; measured: same digest), so the image id
    there does not depend on whether eagle3ops or ``docker save | docker load`` put the image on the host.

    Args:
        config: the image config JSON bytes.
        diff_ids: ``sha256:<hex>`` of each uncompressed layer tar, base first.
        sizes: byte size of each layer tar, same order.

    Raises:
        ValueError: ``diff_ids`` and ``sizes`` differ in length.
    """
    if len(diff_ids) != len(sizes):
        raise ValueError(f"{len(diff_ids)} diff ids but {len(sizes)} layer sizes")
    m = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": "sha256:" + hashlib.sha256(config).hexdigest(),
                   "size": len(config)},
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": d, "size": n} for d, n in zip(diff_ids, sizes)],
    }
    return json.dumps(m, separators=(",", ":")).encode()


def oci_ref_name(tag: str) -> str:
    """The fully qualified name containerd records for a Docker tag (``docker.io/library/`` added the way Docker's
    reference normalisation does): ``ubuntu:22.04`` → ``docker.io/library/ubuntu:22.04``, ``me/app:1`` →
    ``docker.io/me/app:1``, ``reg.example:5000/app:1`` unchanged."""
    first, slash, rest = tag.partition("/")
    if not slash:
        return "docker.io/library/" + tag
    if "." in first or ":" in first or first == "localhost":
        return tag
    return "docker.io/" + tag


def archive_segments(source: LayerSource, part: ArchivePart) -> Iterator[tuple[bytes | None, int | None]]:
    """The tar of ``part`` as segments: ``(bytes, None)`` for metadata (tar headers, config, padding, manifest)
    and ``(None, i)`` where layer ``i``'s tar data goes; the last segment is metadata (the manifest and the end of
    the archive), so a sender can hold it back. ``docker-save`` layer paths are ``<chainid hex>/layer.tar`` (unique
    per position even when diff ids repeat); ``oci`` blobs are ``blobs/sha256/<diff id hex>`` (a diff id that
    repeats is carried once)."""
    if part.fmt == "oci":
        yield from _oci_segments(source, part)
        return
    img = source.image
    chains = img.chain_ids
    cfg_name = hashlib.sha256(part.config).hexdigest() + ".json"
    pending = _tar_header(cfg_name, len(part.config)) + part.config + _pad(len(part.config))
    for i in part.include:
        d = digest_hex(chains[i])
        size = source.layer_size(i)
        yield pending + _tar_header(d + "/", 0, is_dir=True) + _tar_header(d + "/layer.tar", size), None
        yield None, i
        pending = _pad(size)
    manifest = json.dumps([{
        "Config": cfg_name,
        "RepoTags": list(part.repo_tags) or None,
        "Layers": [digest_hex(chains[i]) + "/layer.tar" for i in range(part.n_layers)],
    }]).encode()
    yield pending + _tar_header("manifest.json", len(manifest)) + manifest + _pad(len(manifest)) + b"\0" * 1024, None


def _oci_segments(source: LayerSource, part: ArchivePart) -> Iterator[tuple[bytes | None, int | None]]:
    img = source.image
    layout = b'{"imageLayoutVersion":"1.0.0"}'
    cfg_name = "blobs/sha256/" + hashlib.sha256(part.config).hexdigest()
    pending = (_tar_header("oci-layout", len(layout)) + layout + _pad(len(layout))
               + _tar_header("blobs/", 0, is_dir=True) + _tar_header("blobs/sha256/", 0, is_dir=True)
               + _tar_header(cfg_name, len(part.config)) + part.config + _pad(len(part.config)))
    seen: set[str] = set()
    for i in part.include:
        d = digest_hex(img.diff_ids[i])
        if d in seen:
            continue
        seen.add(d)
        size = source.layer_size(i)
        yield pending + _tar_header("blobs/sha256/" + d, size), None
        yield None, i
        pending = _pad(size)
    manifest = part.manifest(img.diff_ids)
    mdigest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    entry = {"mediaType": MANIFEST_MEDIA_TYPE, "digest": mdigest, "size": len(manifest)}
    # One index entry per tag, annotated the way Docker 26's `docker save` does; none for an untagged image (the
    # engine then keeps it by id only).
    entries = [dict(entry, annotations={"io.containerd.image.name": oci_ref_name(t),
                                        "org.opencontainers.image.ref.name": t.rsplit(":", 1)[-1]})
               for t in part.repo_tags] or [entry]
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": entries}, separators=(",", ":")).encode()
    yield (pending + _tar_header("blobs/sha256/" + mdigest[7:], len(manifest)) + manifest + _pad(len(manifest))
           + _tar_header("index.json", len(index)) + index + _pad(len(index)) + b"\0" * 1024), None


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
