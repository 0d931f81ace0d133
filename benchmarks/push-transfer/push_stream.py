"""Bulk-stream paths to a host, measured: a paramiko channel on eagle3ops.remote.Remote's connection vs an OpenSSH
``ssh`` subprocess with its default cipher order (chacha20-poly1305 first) and with AES-GCM first (same host, port, user, identity, known_hosts, StrictHostKeyChecking=yes), each sending the same
bytes into ``cat >/dev/null`` on the host. Decides eagle3ops.transfer's bulk path.

Usage (root): python benchmarks/push-transfer/push_stream.py [--mib 512] [--sandbox sandbox --port 2222]
"""

from __future__ import annotations

import argparse
import os
import time

from eagle3ops.transfer.streams import ParamikoStream, SshStream
from eagle3ops.remote import Remote
from eagle3ops_dev import sandbox


def run(stream_factory, mib: int, block: bytes) -> tuple[float, int]:
    t0 = time.monotonic()
    s = stream_factory()
    for _ in range(mib):
        s.write(block)
    rc, _, err = s.finish(timeout=300)
    assert rc == 0, err
    return time.monotonic() - t0, s.sent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--sandbox", default="bench-stream")
    ap.add_argument("--port", type=int, default=2240)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    info = sandbox.up(a.sandbox, a.port)
    host = info.host_config()
    block = os.urandom(1024 * 1024)  # incompressible
    argv = ["sh", "-c", "cat >/dev/null"]
    rows = []
    with Remote(host) as remote:
        remote.run(["true"])
        for _ in range(a.repeat):
            for name, factory in (
                ("openssh default", lambda: SshStream(host, argv, fast_cipher=False)),
                ("openssh aes-gcm", lambda: SshStream(host, argv, fast_cipher=True)),
                ("paramiko channel", lambda: ParamikoStream(remote, argv)),
            ):
                dt, n = run(factory, a.mib, block)
                rows.append((name, n, dt))
    print(f"{'path':20} {'bytes':>12} {'s':>7} {'MB/s':>8}")
    for name, n, dt in rows:
        print(f"{name:20} {n:12d} {dt:7.2f} {n / dt / 1e6:8.1f}")
    if a.sandbox != "sandbox":
        sandbox.down(a.sandbox)


if __name__ == "__main__":
    main()
