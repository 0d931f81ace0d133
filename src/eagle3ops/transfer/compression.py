"""Compression on the wire, chosen per push by measurement, and each layer compressed once for all hosts.

zstd (multi-threaded; the host needs ``zstd``) or gzip (``docker load`` reads it natively) is used only when the
measured link rate and the compressor's rate and ratio on a sample of the data predict a shorter transfer.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from eagle3ops import executor
from eagle3ops.commands import transfer as tc
from eagle3ops.transfer.errors import TransferError, TransientTransferError
from eagle3ops.transfer.limits import WRITE_CHUNK
from eagle3ops.transfer.sources import LayerSource
from eagle3ops.transfer.streams import SshStream


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
    return tc.zstd_compress(comp.level, threads=threads, long=comp.long)


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
                proc = executor.local().popen(_zstd_argv(self.comp), stdin=subprocess.PIPE,
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
    s = SshStream(host, tc.discard(), stall_s=30)
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
