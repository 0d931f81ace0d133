"""The ``docker save`` archive format, generated on the fly (pure: bytes in, bytes out, no I/O of its own).

A thin archive carries ``manifest.json``, the config and ``<chainid>/layer.tar`` only for the layers the host
lacks; a *scaffold* config (a prefix of the image's layers, labelled :data:`SCAFFOLD_LABEL`) makes a chunk of a
large push loadable on its own, so a broken push resumes after the last chunk the host registered.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass

from eagle3ops.transfer.local import LocalImage, digest_hex
from eagle3ops.transfer.sources import LayerSource

#: Label on scaffold images (partial chains loaded for resumable pushes).
SCAFFOLD_LABEL = "eagle3ops.scaffold-for"

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
