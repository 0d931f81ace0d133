"""Push one image to one host (:func:`push`), or to many at once (:func:`push_many`): each attempt gathers the
host's facts (reads), plans (:mod:`eagle3ops.transfer.plan`, pure), then carries the plan out (:func:`execute`):
stream the archive parts (parts overlapping), verify the image id; retry what a retry can fix. A dry run carries
the same plan out on a dry executor: the reads run, each change is printed with a ``#`` note and not run.

``PushOptions`` and ``expected_host_id`` live in :mod:`eagle3ops.transfer.plan` and are re-exported here."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from eagle3ops.commands import docker as dk
from eagle3ops.commands import transfer as tc
from eagle3ops.config.standin import standin_refusal
from eagle3ops.transfer.archive import ArchivePart, archive_segments, archive_size
from eagle3ops.transfer.compression import Compression, Encoders, compress_small, measure_link
from eagle3ops.transfer.errors import TransferError, TransientTransferError, VerifyFailed
from eagle3ops.transfer.hoststore import host_has_zstd
from eagle3ops.transfer.limits import COMPRESS_MIN_BYTES, SMALL_ARCHIVE_BYTES, WRITE_CHUNK
from eagle3ops.transfer.local import LocalImage, inspect_local
from eagle3ops.transfer.plan import (HostFacts, PushOptions, PushPlan, expected_host_id, gather, image_part,
                                     part_note, plan_push)
from eagle3ops.transfer.sources import LayerSource, open_source
from eagle3ops.transfer.streams import ByteStream, ParamikoStream, SshStream

__all__ = ["Progress", "PushGroupResult", "PushOptions", "PushPlan", "PushResult", "execute", "expected_host_id",
           "push", "push_many"]


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
        push_plan: the last attempt's :class:`~eagle3ops.transfer.plan.PushPlan` (None when the host's facts
            could not be read).
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
    push_plan: PushPlan | None = None

    @property
    def ok(self) -> bool:
        """True unless the push failed."""
        return self.status != "failed"


def _verify(remote, img: LocalImage, store_kind: str, expect: str, kind: str) -> None:
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
            r = remote.run(tc.image_id_and_layers(host, ref), timeout=60)
        except RemoteCommandError as exc:
            raise VerifyFailed(f"{host.name}: every layer was pushed but image {ref} is not on the host "
                               f"({exc.stderr.strip()[-200:]})") from None
        rid, _, layers = r.stdout.strip().partition(" ")
        if rid != expect:
            what = ("config digest" if kind == "config digest" else
                    f"manifest digest, {store_kind} store; the manifest names config {img.id}")
            raise VerifyFailed(f"{host.name}: image {ref} on the host has id {rid}, expected {expect} ({what})")
        if tuple(json.loads(layers or "[]")) != img.diff_ids:
            raise VerifyFailed(f"{host.name}: image {ref} on the host has different layers than {img.id}")


def _content_complete(remote, host_id: str) -> bool:
    """Whether the host's ``docker image ls`` lists ``host_id``. On the containerd store an image whose manifest
    names a blob the content store lacks is inspectable and runs (its snapshots exist) but ``docker image ls``
    leaves it out and ``docker save`` of it is broken (measured on Docker 26.1); it is listed again once the blobs
    arrive."""
    r = remote.run(tc.listed_image_ids(remote.host), timeout=60)
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


def _dry_parts(remote, src: LayerSource, plan: PushPlan, result: PushResult) -> None:
    """Dry run of :func:`_send_parts`: record each part's ``docker load`` (as :class:`_PartSender` does when it
    opens the stream) with what the stream would carry, and the verification that follows; send nothing."""
    if plan.compression == "auto":
        _note(remote, f"# compression: chosen when the push runs, by measuring the link ({plan.layer_bytes / 1e6:.1f}"
                      f" MB of layers); the load is printed uncompressed here")
    assert plan.load is not None
    for k in range(1, len(plan.parts) + 1):
        remote.record_stream(plan.load, note=part_note(src, plan, k))
    result.layers_sent = sum(len(p.include) for p in plan.parts)
    result.layer_bytes = plan.layer_bytes
    result.status = "dry-run"
    _note(remote, "# then verify every tag names the image with its layers")


def _cleanup_scaffolds(remote, plan: PushPlan) -> None:
    """Remove the scaffold images the plan names (those the inventory saw and those its parts load)."""
    if plan.scaffolds:
        remote.run(dk.rmi(remote.host, *plan.scaffolds), timeout=120, check=False)


def _choose(remote, encoders: Encoders, parts: Sequence[ArchivePart], opts: PushOptions, facts: HostFacts,
            result: PushResult) -> tuple[Compression, int]:
    """The compression of ``parts``: forced by ``opts.compression``, or for ``auto`` on a large push decided by
    measuring the link now (bytes are sent: this is why the plan leaves it to execution). Returns it with the
    parts' uncompressed layer bytes.

    Raises:
        TransferError: ``--compression zstd`` and the host has no ``zstd``.
    """
    src, host = encoders.source, remote.host
    total = sum(src.layer_size(i) for p in parts for i in p.include)
    comp = Compression("none", 0, "")

    def has_zstd() -> bool:
        return facts.has_zstd if facts.has_zstd is not None else host_has_zstd(remote)

    if opts.compression in ("zstd", "gzip"):
        comp = Compression(opts.compression, 3 if opts.compression == "zstd" else 1, "forced",
                           long=opts.compression == "zstd")
        if comp.codec == "zstd" and not has_zstd():
            raise TransferError(f"{host.name}: --compression zstd but the host has no `zstd`; use gzip or auto")
    elif opts.compression == "auto" and total >= COMPRESS_MIN_BYTES:
        largest = max((i for p in parts for i in p.include), key=src.layer_size)
        link, probe = measure_link(host)
        result.probe_bytes += probe
        comp = encoders.decide(link, has_zstd(), total, largest)
    result.compression = comp.label + (f" ({comp.why})" if comp.why else "")
    return comp, total


def execute(remote, plan: PushPlan, facts: HostFacts, encoders: Encoders, opts: PushOptions, result: PushResult,
            on_progress: Callable[[Progress], None] | None = None,
            stream_hook: Callable[[ByteStream], None] | None = None) -> None:
    """Carry out one host's :class:`~eagle3ops.transfer.plan.PushPlan` on ``remote`` (a dry executor: the reads
    run, the changes are printed and recorded, nothing is sent). Sets ``result``'s status and counts.

    Raises:
        TransferError, VerifyFailed, TransientTransferError, eagle3ops.remote.RemoteError: as the steps fail.
    """
    src, host = encoders.source, remote.host
    img = src.image
    if plan.action != "load":
        for tag in plan.missing_tags:
            remote.run(dk.tag(host, plan.expect, tag), timeout=60)
        if opts.dry_run and plan.missing_tags:  # the tags were not added: verifying now would fail
            _note(remote, "# then verify every tag names the image, as after a load")
        else:
            _verify(remote, img, plan.store, plan.expect, plan.id_kind)
        _cleanup_scaffolds(remote, plan)
        if opts.dry_run:
            result.status = "dry-run"
        elif result.status != "ok":
            result.status = "tagged" if plan.missing_tags else "present"
        return
    result.mode = plan.mode
    if opts.dry_run:
        _dry_parts(remote, src, plan, result)
        _cleanup_scaffolds(remote, plan)
        return
    comp, total = _choose(remote, encoders, plan.parts, opts, facts, result)
    _send_parts(remote, encoders, plan.parts, opts, comp, result, on_progress, total, stream_hook)
    if on_progress:
        on_progress(Progress(host.name, "verify", None, 0, 0, result.produced, total, result.bytes_sent))
    _verify(remote, img, plan.store, plan.expect, plan.id_kind)
    if plan.store == "containerd" and not _content_complete(remote, plan.expect):
        # The host holds some left-out layers only as snapshots or under other blob digests (compressed, from a
        # registry pull): send those blobs; the unpacker skips them (the snapshots exist).
        sent = {i for p in plan.parts for i in p.include}
        fill = image_part(src, facts.store, [i for i in range(len(img.diff_ids)) if i not in sent])
        result.mode = "thin+fill"
        comp, total = _choose(remote, encoders, [fill], opts, facts, result)  # decided for the fill's own size
        _send_parts(remote, encoders, [fill], opts, comp, result, on_progress, total, stream_hook)
        _verify(remote, img, plan.store, plan.expect, plan.id_kind)
        if not _content_complete(remote, plan.expect):
            raise VerifyFailed(f"{host.name}: image {plan.expect} is loaded but `docker image ls` does not list it "
                               f"even with every layer blob sent (containerd content store incomplete); "
                               f"retry with --containerd full")
    result.status = "ok"
    _cleanup_scaffolds(remote, plan)


def _attempt(remote, host, img: LocalImage, encoders: Encoders, opts: PushOptions, result: PushResult,
             on_progress: Callable[[Progress], None] | None, stream_hook: Callable[[ByteStream], None] | None
             ) -> None:
    """One try of :func:`push`: the host's facts (reads only) → the plan (pure) → under the host's deploy lock
    (``opts.lock``; none when the plan changes nothing) the plan carried out; ``result`` filled as it goes.

    Raises:
        ConnectFailed: the host was never reached (it fails once, within the connect bound; ``result.store`` is
            still empty: no fact was read). TransientTransferError: the connection was lost after the host had
            answered (a retry may pass). TransferError: the lock is held by another run (a window). RemoteError,
            OSError: as :func:`execute` raises them.
    """
    from eagle3ops.remote import ConnectFailed, HostUnreachable

    result.attempts += 1
    try:
        facts = gather(remote, encoders.source, opts)  # reads only
    except ConnectFailed as exc:
        if not result.store:  # never reached: fail once, within the connect bound (not a TransientTransferError)
            raise
        raise TransientTransferError(str(exc)) from None  # it answered a moment ago (sshd restart, blip)
    except HostUnreachable as exc:  # the connection was lost: a retry may pass
        raise TransientTransferError(str(exc)) from None
    result.store = facts.store.kind  # reached: its store is known
    plan = result.push_plan = plan_push(host, encoders.source, facts, opts)  # pure
    result.host_id, result.id_kind = plan.expect, plan.id_kind
    if opts.lock is None or not plan.commands(host):
        execute(remote, plan, facts, encoders, opts, result, on_progress, stream_hook)
        return
    from eagle3ops.window.common import WindowError
    from eagle3ops.window.lock import holding_lock

    try:
        with holding_lock(remote, "push", opts.lock, f"push {img.ref}"):
            execute(remote, plan, facts, encoders, opts, result, on_progress, stream_hook)
    except WindowError as exc:  # the lock held by another run (a window): not one a retry can pass
        raise TransferError(str(exc)) from None


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

    A stand-in image (:func:`eagle3ops.config.standin.standin_refusal`: its labels, inherited ones included, or its
    name) fails on a host that is not a sandbox, naming the mark and the fix, before the host is contacted.

    Returns:
        :class:`PushResult` (``status`` ``ok``/``present``/``tagged``/``failed``).
    """
    from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

    from eagle3ops import executor
    from eagle3ops.remote import RemoteError

    opts = options or PushOptions()
    t0 = time.monotonic()
    img = inspect_local(image) if isinstance(image, str) else image
    result = PushResult(host=host.name, image_id=img.id, layers_total=len(img.diff_ids))
    refused = standin_refusal(host, img.ref, img.labels, "push")  # its labels on the build engine: before any contact
    if refused:
        result.reason, result.wall_s = refused, time.monotonic() - t0
        return result
    own = encoders is None
    if encoders is None:
        encoders = Encoders(source or open_source(img, prefer=opts.source))
    src = encoders.source

    def echo(line: str) -> None:
        result.plan.append(line)
        if opts.echo:
            opts.echo(line)

    remote = executor.for_host(host, dry_run=opts.dry_run, echo=echo)

    def attempt() -> None:
        _attempt(remote, host, img, encoders, opts, result, on_progress, stream_hook)

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
