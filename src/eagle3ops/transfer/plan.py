"""The plan of one host's push, a pure value: read-only facts gathered first (:func:`gather`), then
:func:`plan_push` decides, per host, whether the image is there, which layers it lacks, in which archive parts,
with which compression, and the commands that follow; :mod:`eagle3ops.transfer.pusher` carries the plan out
(``push --dry-run`` carries it out on a dry executor: the reads run, the changes are printed).

Two decisions are left to execution, because they need bytes sent or a change made first: ``auto`` compression of
a large push (the link is measured by streaming random bytes: :func:`eagle3ops.transfer.compression.measure_link`),
and on the containerd store whether left-out layer blobs must follow (``thin+fill``: only ``docker image ls``
after the load tells). The plan names both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from eagle3ops.commands import docker as dk
from eagle3ops.commands import transfer as tc
from eagle3ops.commands.quote import render
from eagle3ops.commands.types import Change
from eagle3ops.transfer.archive import ArchivePart, archive_size, scaffold_config
from eagle3ops.transfer.errors import TransferError
from eagle3ops.transfer.hoststore import HostStore, host_has_zstd, inspect_host
from eagle3ops.transfer.limits import CHUNK_BYTES, COMPRESS_MIN_BYTES, STALL_S
from eagle3ops.transfer.sources import LayerSource
from eagle3ops.window.arch import arch_refusal


@dataclass
class PushOptions:
    """Knobs of a push (defaults suit production).

    Attributes:
        compression: ``auto`` (by measurement), ``none``, ``zstd``, ``gzip``.
        transport: ``auto`` (paramiko for small archives, OpenSSH for bulk), ``openssh``, ``paramiko``.
        attempts: tries per host (tenacity), each re-reading the host inventory (resume). Only errors that can
            pass are retried (a stream that broke or stalled, a lost connection, a reconnect after one); a host this
            push never reached (no TCP, no SSH banner, refused key) fails at once, within the connect bound.
        stall_s: seconds without progress before a stream is killed.
        chunk_bytes: resumable chunk size (layer bytes); 0 disables scaffolds.
        containerd: on a containerd-store host: ``thin`` (an OCI layout without the layers the host holds, then
            the left-out blobs if the host turns out to hold those layers only under other blob digests), ``full``
            (every layer) or ``refuse``.
        source: ``auto``, ``store`` or ``save`` (see :func:`eagle3ops.transfer.sources.open_source`).
        load_argv: the host-side load command (default ``docker [-H ...] load``); only tests change it.
        dry_run: contact the host read-only (its image inventory, tags), plan the parts, and record every command
            that would change the host in :attr:`PushResult.commands` without running it (status ``dry-run``).
        echo: receives each command (read-only ones too) as it is planned or run, and ``#`` notes (dry runs).
        lock: the command line to record in the host's deploy lock, taken after the facts are read and the plan is
            made and held while the plan's changes are made (:func:`eagle3ops.window.lock.holding_lock`; a plan
            with nothing to change takes none); None: the caller holds the host's lock already (``deploy``,
            ``speculate``, the cycle's acceptance step), or the host is not one of the inventory's work hosts.
    """

    compression: str = "auto"
    transport: str = "auto"
    attempts: int = 3
    stall_s: float = STALL_S
    chunk_bytes: int = CHUNK_BYTES
    containerd: str = "thin"
    source: str = "auto"
    load_argv: list[str] | None = None
    dry_run: bool = False
    echo: Callable[[str], None] | None = None
    lock: str | None = None


@dataclass(frozen=True)
class HostFacts:
    """What a push read from one host before deciding anything (every command behind it is a ``Read``).

    Attributes:
        store: the host engine's image store and what it holds (:func:`eagle3ops.transfer.hoststore.inspect_host`).
        tag_ids: tag → the image id the host gives it (``""``: absent); read only when the host holds the image.
        has_zstd: whether the host has ``zstd``; None when this push does not need to know (no zstd possible).
    """

    store: HostStore
    tag_ids: dict[str, str] = field(default_factory=dict)
    has_zstd: bool | None = None


@dataclass(frozen=True)
class PushPlan:
    """One host's push, decided (pure: built by :func:`plan_push` from :class:`HostFacts`).

    Attributes:
        host: inventory name. action: ``present`` (nothing to send), ``tag`` (the image is there, tags missing) or
            ``load`` (layers to send).
        store: ``classic``/``containerd``. mode: ``thin``/``full`` (a ``load``), ``""`` otherwise.
        expect, id_kind: the id the host's engine must give the image, and which id it is
            (:func:`expected_host_id`).
        missing_tags: tags to add (``tag``). parts: the archive parts to stream, in order (``load``).
        compression: ``none``/``zstd``/``gzip`` decided, or ``auto`` (measured when the push runs: the plan's
            loads are shown uncompressed).
        layer_bytes: uncompressed bytes of the layers the parts carry.
        scaffolds: scaffold images (ids) removed at the end: those the host holds for this image and those the
            parts load.
        load: the ``docker load`` command each part streams into (a ``Change``; with the compression decided
            here: ``auto`` loads are printed uncompressed).
    """

    host: str
    action: str
    store: str
    expect: str
    id_kind: str
    mode: str = ""
    missing_tags: tuple[str, ...] = ()
    parts: tuple[ArchivePart, ...] = ()
    compression: str = "none"
    layer_bytes: int = 0
    scaffolds: tuple[str, ...] = ()
    load: Change | None = None

    def commands(self, host) -> list[Change]:
        """The host-changing commands in order (``host``: the :class:`~eagle3ops.config.HostConfig`)."""
        out: list[Change] = [dk.tag(host, self.expect, t) for t in self.missing_tags]
        out += [self.load] * len(self.parts) if self.load is not None else []
        if self.scaffolds:
            out.append(dk.rmi(host, *self.scaffolds))
        return out

    def summary(self) -> str:
        """One ``#`` line: what this push will do."""
        what = {"present": "the host holds the image with every tag: nothing to send",
                "tag": f"the host holds the image; tags to add: {', '.join(self.missing_tags)}",
                "load": (f"{sum(len(p.include) for p in self.parts)} layer(s), {self.layer_bytes / 1e6:.1f} MB "
                         f"uncompressed, in {len(self.parts)} part(s) ({self.mode}); compression "
                         f"{self.compression}")}[self.action]
        return f"# plan for {self.host} ({self.store} store, {self.id_kind} {self.expect[7:19]}): {what}"

    def lines(self, host) -> list[str]:
        """The plan as printed lines: the summary, then each change (rendered) with its ``#`` note."""
        out = [self.summary()]
        for c in self.commands(host):
            out.append(render(c))
        return out


def image_part(source: LayerSource, store: HostStore, include: Sequence[int]) -> ArchivePart:
    """The part that loads the image itself (config, tags) carrying layers ``include``, in the host store's
    format."""
    img = source.image
    n = len(img.diff_ids)
    if store.kind == "containerd":
        return ArchivePart(source.config_bytes(), n, tuple(include), img.repo_tags, fmt="oci",
                           layer_sizes=tuple(source.layer_size(i) for i in range(n)))
    return ArchivePart(source.config_bytes(), n, tuple(include), img.repo_tags)


def expected_host_id(source: LayerSource, store: HostStore) -> tuple[str, str]:
    """The id the host's engine gives the image once pushed, and what kind of id it is.

    Classic store: the config digest (the build engine's image id). containerd store: the digest of the manifest
    :func:`eagle3ops.transfer.archive.oci_manifest` writes (the same manifest containerd's importer writes for a
    ``docker save`` archive), which names the config digest, so equal manifest digests mean equal configs and
    layers; there an image's config digest is not shown by ``docker image inspect`` (its ``Id`` is the manifest
    digest) and is not accepted as a reference (``No such image``), both measured on Docker 26.1.

    Returns:
        ``(id, kind)`` with kind ``config digest`` or ``manifest digest``.
    """
    part = image_part(source, store, ())
    return part.host_id(source.image.diff_ids), "manifest digest" if part.fmt == "oci" else "config digest"


def plan_parts(source: LayerSource, store: HostStore, opts: PushOptions) -> tuple[list[ArchivePart], str]:
    """The archive parts carrying the layers the host lacks (scaffold chunks of about ``opts.chunk_bytes``, then
    the image's own part) and the mode (``thin``/``full``).

    Raises:
        TransferError: a containerd-store host with ``opts.containerd == "refuse"``.
    """
    img = source.image
    chains = img.chain_ids
    n = len(chains)
    mode = "thin"
    if store.kind == "containerd":
        if opts.containerd == "refuse":
            raise TransferError(f"host runs the containerd image store (Docker {store.server_version}) and "
                                f"--containerd refuse was given; use --containerd thin (default) or full")
        if opts.containerd == "full":
            mode = "full"
    missing = [i for i in range(n) if mode == "full" or chains[i] not in store.chain_ids]
    sizes = tuple(source.layer_size(i) for i in range(n)) if store.kind == "containerd" else ()
    fmt = "oci" if store.kind == "containerd" else "docker-save"
    parts: list[ArchivePart] = []
    group: list[int] = []
    acc = 0
    for i in missing:
        group.append(i)
        acc += source.layer_size(i)
        if opts.chunk_bytes and acc >= opts.chunk_bytes and i != missing[-1]:
            parts.append(ArchivePart(scaffold_config(img, i + 1), i + 1, tuple(group), (), scaffold=True, fmt=fmt,
                                     layer_sizes=sizes[:i + 1]))
            group, acc = [], 0
    parts.append(image_part(source, store, group))
    return parts, mode


def needs_zstd_answer(opts: PushOptions, layer_bytes: int) -> bool:
    """Whether the push must know if the host has ``zstd``: forced zstd, or ``auto`` on a push large enough to
    compress."""
    return opts.compression == "zstd" or (opts.compression == "auto" and layer_bytes >= COMPRESS_MIN_BYTES)


def gather(remote, source: LayerSource, opts: PushOptions) -> HostFacts:
    """Read what the plan needs from the host (reads only: its image inventory; the id of each tag when it holds
    the image; whether it has ``zstd`` when the push may use it).

    Raises:
        eagle3ops.remote.RemoteError, TransferError: the host or its engine does not answer.
    """
    store = inspect_host(remote)
    expect, _ = expected_host_id(source, store)
    if expect in store.image_ids:
        tag_ids = {t: remote.run(dk.image_id(remote.host, t), check=False, timeout=60).stdout.strip()
                   for t in source.image.repo_tags}
        return HostFacts(store, tag_ids)
    parts, _ = plan_parts(source, store, opts)
    total = sum(source.layer_size(i) for p in parts for i in p.include)
    return HostFacts(store, {}, host_has_zstd(remote) if needs_zstd_answer(opts, total) else None)


def plan_push(host, source: LayerSource, facts: HostFacts, opts: PushOptions) -> PushPlan:
    """Decide one host's push from its facts (pure: no I/O beyond the layer source's sizes and config).

    Args:
        host: the :class:`~eagle3ops.config.HostConfig`.

    Raises:
        TransferError: ``--containerd refuse`` on a containerd host; ``--compression zstd`` on a host without
            ``zstd``; an image built for another CPU architecture than the host engine's
            (:func:`eagle3ops.window.arch.arch_refusal`).
    """
    store = facts.store
    refusal = arch_refusal(what="push", subject=source.image.ref, subject_arch=source.image.arch, host=host.name,
                           host_arch=store.arch, source="its engine's `docker info`")
    if refusal:
        raise TransferError(refusal)
    img = source.image
    expect, id_kind = expected_host_id(source, store)
    held = tuple(sorted(i for i, target in store.scaffolds.items() if target == img.id))
    if expect in store.image_ids:
        missing = tuple(t for t in img.repo_tags if facts.tag_ids.get(t, "") != expect)
        return PushPlan(host.name, "tag" if missing else "present", store.kind, expect, id_kind,
                        missing_tags=missing, scaffolds=held)
    parts, mode = plan_parts(source, store, opts)
    total = sum(source.layer_size(i) for p in parts for i in p.include)
    if opts.compression == "zstd" and facts.has_zstd is False:
        raise TransferError(f"{host.name}: --compression zstd but the host has no `zstd`; use gzip or auto")
    if opts.compression in ("zstd", "gzip", "none"):
        comp = opts.compression
    else:
        comp = "auto" if total >= COMPRESS_MIN_BYTES else "none"
    loaded = tuple(p.host_id(img.diff_ids) for p in parts if p.scaffold)
    return PushPlan(host.name, "load", store.kind, expect, id_kind, mode=mode, parts=tuple(parts),
                    compression=comp, layer_bytes=total, scaffolds=tuple(sorted(set(held + loaded))),
                    load=tc.load(host, comp if comp in ("zstd", "gzip") else "none", opts.load_argv))


def part_note(source: LayerSource, plan: PushPlan, k: int) -> str:
    """The ``#`` note printed after part ``k`` (1-based)'s load in a dry run: what its stream carries."""
    p = plan.parts[k - 1]
    return (f"stdin: archive part {k}/{len(plan.parts)}{' (scaffold)' if p.scaffold else ''}: layers "
            f"{list(p.include)}, {archive_size(source, p) / 1e6:.1f} MB uncompressed")
