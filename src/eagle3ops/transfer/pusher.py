"""Push one image to one host (:func:`push`), or to many at once (:func:`push_many`): plan the archive parts from
the host's inventory, stream them (parts overlapping), verify the image id, retry what a retry can fix."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from eagle3ops.commands import docker as dk
from eagle3ops.commands import transfer as tc
from eagle3ops.transfer.archive import ArchivePart, archive_segments, archive_size, scaffold_config
from eagle3ops.transfer.compression import Compression, Encoders, compress_small, measure_link
from eagle3ops.transfer.errors import TransferError, TransientTransferError, VerifyFailed
from eagle3ops.transfer.hoststore import HostStore, host_has_zstd, inspect_host
from eagle3ops.transfer.limits import CHUNK_BYTES, COMPRESS_MIN_BYTES, SMALL_ARCHIVE_BYTES, STALL_S, WRITE_CHUNK
from eagle3ops.transfer.local import LocalImage, inspect_local
from eagle3ops.transfer.sources import LayerSource, open_source
from eagle3ops.transfer.streams import ByteStream, ParamikoStream, SshStream


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
            there, only the tag was added), ``dry-run`` (planned, nothing changed: :attr:`PushOptions.dry_run`) or
            ``failed``.
        reason: why it failed (empty on success).
        image_id: the image id on the build engine (its config digest: the build engine is a classic store).
        host_id: the id the host's engine gives the image, which verification compared: on the classic store the
            config digest (= ``image_id``); on the containerd store the digest of the manifest this push generated
            (:func:`eagle3ops.transfer.archive.oci_manifest`), which names the config digest and every layer.
        id_kind: ``config digest`` or ``manifest digest``: what ``host_id`` is.
        store: host image store, ``classic`` or ``containerd``; mode: ``thin`` (missing layers only), ``full``, or
            ``thin+fill`` (containerd store: the thin load left the image without some layer blobs, because the
            host held those layers under other blob digests, e.g. compressed from a registry pull, so they were
            sent in a second archive).
        layers_total / layers_sent: layer counts; layer_bytes: uncompressed bytes of the layers sent.
        bytes_sent: bytes written into the SSH stream(s) (after compression), probes excluded.
        probe_bytes: bytes spent measuring the link.
        wall_s: seconds from start to verified; attempts: tries used.
        transport: ``openssh``/``paramiko``; compression: codec and why.
        per_layer: layer index → bytes of it on the wire; produced: uncompressed archive bytes streamed.
        load_wait_s: seconds the host's ``docker load`` took after the stream ended (layer apply).
        commands: every command of this push in order (the executor's history: read-only ones, each ``docker
            load`` fed by a stream included); in a dry run, the plan. changes: those that change the host.
        plan: what was echoed, in order: ``commands`` with the dry run's ``#`` notes between them.
    """

    host: str
    status: str = "failed"
    reason: str = ""
    image_id: str = ""
    host_id: str = ""
    id_kind: str = ""
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
    commands: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    plan: list[str] = field(default_factory=list)

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
        attempts: tries per host (tenacity), each re-reading the host inventory (resume). Only errors that can
            pass are retried (a stream that broke or stalled, a lost connection, a reconnect after one); a host this
            push never reached (no TCP, no SSH banner, refused key) fails at once, within the connect bound.
        stall_s: seconds without progress before a stream is killed.
        chunk_bytes: resumable chunk size (layer bytes); 0 disables scaffolds.
        containerd: on a containerd-store host: ``thin`` (an OCI layout without the layers the host holds, then
            the left-out blobs if the host turns out to hold those layers only under other blob digests), ``full``
            (every layer) or ``refuse``.
        source: ``auto``, ``store`` or ``save`` (see :func:`open_source`).
        load_argv: the host-side load command (default ``docker [-H ...] load``); only tests change it.
        dry_run: contact the host read-only (its image inventory, tags), plan the parts, and record every command
            that would change the host in :attr:`PushResult.commands` without running it (status ``dry-run``).
        echo: receives each command (read-only ones too) as it is planned or run, and ``#`` notes (dry runs).
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


def _image_part(source: LayerSource, store: HostStore, include: Sequence[int]) -> ArchivePart:
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
    part = _image_part(source, store, ())
    return part.host_id(source.image.diff_ids), "manifest digest" if part.fmt == "oci" else "config digest"


def _plan_parts(source: LayerSource, store: HostStore, opts: PushOptions) -> tuple[list[ArchivePart], str]:
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
    parts.append(_image_part(source, store, group))
    return parts, mode


def _verify(remote, img: LocalImage, store: HostStore, expect: str, kind: str) -> None:
    """Every tag of ``img`` on the host names an image with id ``expect`` (a ``kind``: see
    :func:`expected_host_id`) and ``img``'s diff ids.

    Raises:
        VerifyFailed: a tag is missing, or names an image with another id or other layers.
    """
    from eagle3ops.remote import RemoteCommandError

    host = remote.host
    refs = list(img.repo_tags) or [expect]
    for ref in refs:
        try:
            r = remote.run(tc.image_id_and_layers(host, ref), timeout=60, mutates=False)
        except RemoteCommandError as exc:
            raise VerifyFailed(f"{host.name}: every layer was pushed but image {ref} is not on the host "
                               f"({exc.stderr.strip()[-200:]})") from None
        rid, _, layers = r.stdout.strip().partition(" ")
        if rid != expect:
            what = ("config digest" if kind == "config digest" else
                    f"manifest digest, {store.kind} store; the manifest names config {img.id}")
            raise VerifyFailed(f"{host.name}: image {ref} on the host has id {rid}, expected {expect} ({what})")
        if tuple(json.loads(layers or "[]")) != img.diff_ids:
            raise VerifyFailed(f"{host.name}: image {ref} on the host has different layers than {img.id}")


def _content_complete(remote, host_id: str) -> bool:
    """Whether the host's ``docker image ls`` lists ``host_id``. On the containerd store an image whose manifest
    names a blob the content store lacks is inspectable and runs (its snapshots exist) but ``docker image ls``
    leaves it out and ``docker save`` of it is broken (measured on Docker 26.1); it is listed again once the blobs
    arrive."""
    r = remote.run(tc.listed_image_ids(remote.host), timeout=60, mutates=False)
    return host_id in r.stdout.split()


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
        load = tc.load(host, comp.codec, opts.load_argv)
        self.size = archive_size(encoders.source, part)
        self.use_paramiko = opts.transport == "paramiko" or (opts.transport == "auto" and
                                                              self.size < SMALL_ARCHIVE_BYTES)
        remote.record_stream(load)
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


def _note(remote, text: str) -> None:
    """Echo a ``#`` note of a dry run's plan (nothing when the push has no echo)."""
    if remote.echo:
        remote.echo(text)


def _dry_parts(remote, src: LayerSource, parts: Sequence[ArchivePart], opts: PushOptions,
               result: PushResult) -> None:
    """Dry run of :func:`_send_parts`: record each part's ``docker load`` (as :class:`_PartSender` does when it
    opens the stream) with what the stream would carry, and the verification that follows; send nothing."""
    total = sum(src.layer_size(i) for p in parts for i in p.include)
    codec = opts.compression if opts.compression in ("zstd", "gzip") else "none"
    if opts.compression == "auto" and total >= COMPRESS_MIN_BYTES:
        _note(remote, f"# compression: chosen when the push runs, by measuring the link ({total / 1e6:.1f} MB of "
                      f"layers); the load is printed uncompressed here")
    for k, p in enumerate(parts, 1):
        size = archive_size(src, p)
        remote.record_stream(tc.load(remote.host, codec, opts.load_argv),
                             note=f"stdin: archive part {k}/{len(parts)}"
                                  f"{' (scaffold)' if p.scaffold else ''}: layers {list(p.include)}, "
                                  f"{size / 1e6:.1f} MB uncompressed")
    result.layers_sent = sum(len(p.include) for p in parts)
    result.layer_bytes = total
    result.status = "dry-run"
    _note(remote, "# then verify every tag names the image with its layers")


def _cleanup_scaffolds(remote, img: LocalImage, store: HostStore, parts: Sequence[ArchivePart] = ()) -> None:
    """Remove the scaffold images of ``img`` (those the inventory saw and those loaded now)."""
    host = remote.host
    ids = [i for i, target in store.scaffolds.items() if target == img.id]
    ids += [p.host_id(img.diff_ids) for p in parts if p.scaffold]
    if ids:
        remote.run(dk.rmi(host, *sorted(set(ids))), timeout=120, check=False)


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

    from eagle3ops.remote import ConnectFailed, HostUnreachable, Remote, RemoteError

    opts = options or PushOptions()
    t0 = time.monotonic()
    img = inspect_local(image) if isinstance(image, str) else image
    result = PushResult(host=host.name, image_id=img.id, layers_total=len(img.diff_ids))
    own = encoders is None
    if encoders is None:
        encoders = Encoders(source or open_source(img, prefer=opts.source))
    src = encoders.source

    def echo(line: str) -> None:
        result.plan.append(line)
        if opts.echo:
            opts.echo(line)

    remote = Remote(host, dry_run=opts.dry_run, echo=echo)
    reached = False  # whether this push has talked to the host yet

    def attempt() -> None:
        nonlocal reached
        result.attempts += 1
        try:
            store = inspect_host(remote)
        except ConnectFailed as exc:
            if not reached:  # never reached: fail once, within the connect bound (not a TransientTransferError)
                raise
            raise TransientTransferError(str(exc)) from None  # it answered a moment ago (sshd restart, blip)
        except HostUnreachable as exc:  # the connection was lost: a retry may pass
            raise TransientTransferError(str(exc)) from None
        reached = True
        result.store = store.kind
        expect, result.id_kind = expected_host_id(src, store)
        result.host_id = expect
        # On the containerd store the inventory lists only images whose every blob is there (_content_complete).
        if expect in store.image_ids:
            missing_tags = []
            for tag in img.repo_tags:
                r = remote.run(dk.image_id(host, tag), check=False, timeout=60, mutates=False)
                if r.stdout.strip() != expect:
                    missing_tags.append(tag)
            for tag in missing_tags:
                remote.run(dk.tag(host, expect, tag), timeout=60)
            if opts.dry_run and missing_tags:  # the tags were not added: verifying now would fail
                _note(remote, "# then verify every tag names the image, as after a load")
            else:
                _verify(remote, img, store, expect, result.id_kind)
            _cleanup_scaffolds(remote, img, store)
            if opts.dry_run:
                result.status = "dry-run"
            elif result.status != "ok":
                result.status = "tagged" if missing_tags else "present"
            return
        parts, result.mode = _plan_parts(src, store, opts)

        def choose(parts: Sequence[ArchivePart]) -> tuple[Compression, int]:
            total = sum(src.layer_size(i) for p in parts for i in p.include)
            comp = Compression("none", 0, "")
            if opts.compression in ("zstd", "gzip"):
                comp = Compression(opts.compression, 3 if opts.compression == "zstd" else 1, "forced",
                                   long=opts.compression == "zstd")
                if comp.codec == "zstd" and not host_has_zstd(remote):
                    raise TransferError(f"{host.name}: --compression zstd but the host has no `zstd`; use gzip or "
                                        f"auto")
            elif opts.compression == "auto" and total >= COMPRESS_MIN_BYTES:
                largest = max((i for p in parts for i in p.include), key=src.layer_size)
                link, probe = measure_link(host)
                result.probe_bytes += probe
                comp = encoders.decide(link, host_has_zstd(remote), total, largest)
            result.compression = comp.label + (f" ({comp.why})" if comp.why else "")
            return comp, total

        if opts.dry_run:
            _dry_parts(remote, src, parts, opts, result)
            _cleanup_scaffolds(remote, img, store, parts)
            return
        comp, total = choose(parts)
        _send_parts(remote, encoders, parts, opts, comp, result, on_progress, total, stream_hook)
        if on_progress:
            on_progress(Progress(host.name, "verify", None, 0, 0, result.produced, total, result.bytes_sent))
        _verify(remote, img, store, expect, result.id_kind)
        if store.kind == "containerd" and not _content_complete(remote, expect):
            # The host holds some left-out layers only as snapshots or under other blob digests (compressed, from a
            # registry pull): send those blobs; the unpacker skips them (the snapshots exist).
            sent = {i for p in parts for i in p.include}
            fill = _image_part(src, store, [i for i in range(len(img.diff_ids)) if i not in sent])
            result.mode = "thin+fill"
            comp, total = choose([fill])  # the fill may be the whole base: compression decided for its own size
            _send_parts(remote, encoders, [fill], opts, comp, result, on_progress, total, stream_hook)
            _verify(remote, img, store, expect, result.id_kind)
            if not _content_complete(remote, expect):
                raise VerifyFailed(f"{host.name}: image {expect} is loaded but `docker image ls` does not list it "
                                   f"even with every layer blob sent (containerd content store incomplete); "
                                   f"retry with --containerd full")
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
        result.commands, result.changes = list(remote.history), list(remote.changes)
        remote.close()
        if own:
            encoders.close()
            src.close()
    result.wall_s = time.monotonic() - t0
    return result


class PushGroupResult(list):
    """The per-host results of a fan-out (like Fabric's ``GroupResult``): a list of :class:`PushResult` in the
    order the hosts were given, with the hosts that succeeded and those that failed by inventory name."""

    @property
    def succeeded(self) -> dict[str, PushResult]:
        """Host name → result, for every host that holds the image now (``ok``, ``present``, ``tagged``)."""
        return {r.host: r for r in self if r.ok}

    @property
    def failed(self) -> dict[str, PushResult]:
        """Host name → result, for every host whose push failed (``reason`` says why)."""
        return {r.host: r for r in self if not r.ok}

    @property
    def ok(self) -> bool:
        """True when every host succeeded."""
        return not self.failed


def push_many(image: str, hosts: Sequence, *, options: PushOptions | None = None, parallel: int = 8,
              on_progress: Callable[[Progress], None] | None = None) -> PushGroupResult:
    """Push one image to many hosts in parallel (one thread per host, at most ``parallel`` at once), sharing one
    layer source (each layer read, and compressed, once). One failed host does not stop the others.

    Returns:
        :class:`PushGroupResult`: one :class:`PushResult` per host, in the order given.

    Raises:
        TransferError: the image is not on the build engine, or the build engine does not answer (no host was
            contacted).
    """
    opts = options or PushOptions()
    img = inspect_local(image)
    src = open_source(img, prefer=opts.source)
    enc = Encoders(src)
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(hosts)))) as ex:
            futs = [ex.submit(push, img, h, encoders=enc, options=opts, on_progress=on_progress) for h in hosts]
            return PushGroupResult(f.result() for f in futs)
    finally:
        enc.close()
        src.close()
