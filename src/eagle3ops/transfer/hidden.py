"""Hidden-state files of a fleet run copied from the host that extracted them to the training host, over
the bulk path: the sending host's ``tar -c`` read through an OpenSSH stream (:func:`eagle3ops.commands.ssh.openssh`,
the generated strict-host-key config of :mod:`eagle3ops.transfer.sshconfig`) and written into an
:class:`eagle3ops.transfer.streams.SshStream` to the training host, which unpacks into ``extract/.incoming/``. Every
arrived file's sha256 is then computed on the training host and compared with the manifest's: the good ones are moved
into ``extract/``, the others removed and named. Files are named by the caller's plan
(:func:`eagle3ops.fleet.hidden.plan_move`); argv only from :mod:`eagle3ops.commands.fleet`.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from eagle3ops import executor
from eagle3ops.commands import fleet as fc
from eagle3ops.commands.ssh import openssh
from eagle3ops.transfer.errors import StreamStalled, TransientTransferError
from eagle3ops.transfer.limits import STALL_S
from eagle3ops.transfer.sshconfig import write_ssh_config
from eagle3ops.transfer.streams import SshStream

#: Bytes read from the sending host per chunk.
CHUNK = 1 << 20
#: Seconds the training host may take to finish unpacking after the stream ends.
FINISH_S = 120.0


class HiddenCopyError(Exception):
    """A copy did not complete: the stream broke, or files arrived with another sha256 than the manifest's (named,
    with the fix). Files that arrived whole and verified are in place before this is raised."""


@dataclass
class Copied:
    """What one source host's copy did: bytes streamed, seconds in all (SSH start, digests and moves included),
    ``stream_s`` (first byte to the unpacking's end), files verified and moved into place (``good``), files that
    arrived with another sha256 (``bad``, removed)."""

    host: str
    sent: int = 0
    seconds: float = 0.0
    stream_s: float = 0.0
    good: list[str] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)

    @property
    def bytes_per_s(self) -> float | None:
        """The link's measured rate, bytes over ``stream_s`` (None for too small a copy to say: under 1 MiB)."""
        return self.sent / self.stream_s if self.sent >= 1 << 20 and self.stream_s > 0 else None


def extract_dir(host: Any, run: str) -> str:
    """``<data_dir>/runs/<run>/extract`` on ``host``."""
    return f"{host.data_dir}/runs/{run}/extract"


def read_digests(r: Any, run: str, *, incoming_only: bool = False) -> tuple[dict[str, str], dict[str, str]]:
    """``({rel: sha256} in place, {rel: sha256} in .incoming)`` of the run's hidden-state files on ``r.host`` (reads
    only, :func:`eagle3ops.commands.fleet.hidden_digests`; both empty when nothing is there; ``incoming_only``: the
    first one left empty, those files not read)."""
    d = extract_dir(r.host, run)
    return parse_digests(r.run(fc.hidden_digests(d, incoming_only=incoming_only), check=False).stdout, d, fc.INCOMING)


def parse_digests(output: str, extract_dir: str, incoming: str) -> tuple[dict[str, str], dict[str, str]]:
    """``({rel: sha256} under hidden/, {rel: sha256} under incoming/)`` from ``sha256sum`` lines, ``rel`` relative to
    ``extract/`` in both (so a file arriving as ``.incoming/hidden/x`` is ``hidden/x``)."""
    placed, arrived = {}, {}
    root, inc = extract_dir.rstrip("/") + "/", f"{extract_dir.rstrip('/')}/{incoming}/"
    for line in output.splitlines():
        digest, _, path = line.partition("  ")
        if len(digest) != 64 or not path:
            continue
        if path.startswith(inc):
            arrived[path[len(inc):]] = digest
        elif path.startswith(root):
            placed[path[len(root):]] = digest
    return placed, arrived


def settle(r: Any, run: str, expected: dict[str, str], arrived: dict[str, str]) -> tuple[list[str], list[str]]:
    """Move the arrived files whose sha256 is ``expected``'s (``{rel: sha256}``) into ``extract/``, remove the
    others; returns ``(good, bad)``. A change: run under the training host's lock.

    Raises:
        RemoteError: a move or removal failed on the host.
    """
    good = sorted(rel for rel, h in arrived.items() if expected.get(rel) == h)
    bad = sorted(rel for rel in arrived if rel not in good)
    d = extract_dir(r.host, run)
    if good:
        r.run(fc.promote_files(f"{d}/{fc.INCOMING}", d), stdin="".join(g + "\n" for g in good))
    if bad:
        r.run(fc.remove_files(f"{d}/{fc.INCOMING}"), stdin="".join(b + "\n" for b in bad))
    return good, bad


def copy_files(src: Any, r: Any, run: str, files: list[str], expected: dict[str, str], *,
               stall_s: float = STALL_S) -> Copied:
    """Copy ``files`` (relative to ``extract/``) of run ``run`` from host ``src`` (a HostConfig) to the training host
    of ``r`` (its executor, lock held), then verify and place them (:func:`settle`). Bounded: either side moving no
    byte for ``stall_s`` seconds kills the stream; the unpacking gets :data:`FINISH_S` after it.

    Raises:
        HiddenCopyError: the stream broke or stalled (the verified arrivals are placed first, so a rerun sends only
            the rest).
    """
    out = Copied(src.name)
    t0 = time.monotonic()
    cfg = write_ssh_config(src)
    proc = executor.local().popen(openssh(src, fc.send_files(extract_dir(src, run)), cfg), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    sink = SshStream(r.host, fc.receive_files(f"{extract_dir(r.host, run)}/{fc.INCOMING}"), stall_s=stall_s)
    err_text = ""
    moved = [time.monotonic()]
    done = threading.Event()

    def watchdog() -> None:  # the sending side may stall too: the sink's watchdog sees only its own writes
        while not done.wait(0.5):
            if time.monotonic() - moved[0] > stall_s and proc.poll() is None:
                proc.kill()
                return

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("".join(f + "\n" for f in files).encode())
        proc.stdin.close()
        first = None
        while chunk := proc.stdout.read(CHUNK):
            moved[0] = time.monotonic()
            first = first or moved[0]
            sink.write(chunk)
        rc_src = proc.wait(timeout=30)
        err_src = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
        rc, _o, err = sink.finish(FINISH_S)
        out.stream_s = round(time.monotonic() - first, 3) if first else 0.0
        if rc_src != 0 or rc != 0:
            err_text = (f"{src.name} `tar -c` exit {rc_src}: {err_src[-300:]}" if rc_src != 0 else
                        f"{r.host.name} unpacking exit {rc}: {err[-300:]}")
    except (StreamStalled, TransientTransferError, subprocess.TimeoutExpired, OSError) as exc:
        sink.kill()
        err_text = f"{type(exc).__name__}: {exc}"
    finally:
        done.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(cfg.parent, ignore_errors=True)
    out.sent, out.seconds = sink.sent, round(time.monotonic() - t0, 3)
    _placed, arrived = read_digests(r, run, incoming_only=True)
    out.good, out.bad = settle(r, run, expected, arrived)
    missing = [f for f in files if f not in out.good and f not in out.bad]
    if err_text or missing:
        what = (f"extract/{missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
                if missing else "no file missing")
        raise HiddenCopyError(f"copying {len(files)} file(s) of run {run} from {src.name} to {r.host.name}: {what} "
                              f"did not arrive ({err_text or 'the stream ended early'}); if {src.name} lacks it, "
                              f"rerun the fleet extract (its shard re-extracts it), else rerun this command; the "
                              f"{len(out.good)} file(s) that arrived whole are verified, kept and not sent again")
    return out
