"""The sandbox's SSH keys: the client's user key and known_hosts, the sandbox's own host key and its
``authorized_keys`` (the layout: :mod:`eagle3ops_dev.sandbox.host`). Shared host state is added to, never replaced,
so several checkouts can use one sandbox.
"""

from __future__ import annotations

import os
from pathlib import Path

from eagle3ops_dev.sandbox.proc import run_checked


def ensure_keys(identity_file: Path, known_hosts: Path, ssh: Path, ssh_keygen: str, name: str, listen: str,
                ssh_port: int) -> None:
    """The SSH keys of sandbox ``name`` (a step of :func:`eagle3ops_dev.sandbox.host.up`): the client user key
    ``identity_file`` (made once), the host key in the host-side directory ``ssh`` (made once, kept across ups so
    known_hosts stays valid), the client key added to ``ssh/authorized_keys``, and the client's ``known_hosts``
    naming the host key at ``[listen]:ssh_port``.

    Raises:
        SandboxError: ``ssh-keygen`` (the path ``ssh_keygen``) failed (:func:`~eagle3ops_dev.sandbox.proc.run_checked`).
    """
    # Client side: user key + known_hosts.
    cdir = identity_file.parent
    cdir.mkdir(parents=True, exist_ok=True)
    os.chmod(cdir, 0o700)
    if not identity_file.exists():
        run_checked([ssh_keygen, "-q", "-t", "ed25519", "-N", "", "-C", f"eagle3ops-{name}-client",
              "-f", str(identity_file)])
    pub = Path(str(identity_file) + ".pub").read_text().strip()
    # Host side: host key (kept across ups so known_hosts stays valid), authorized_keys.
    hostkey = ssh / "ssh_host_ed25519_key"
    if not hostkey.exists():
        run_checked([ssh_keygen, "-q", "-t", "ed25519", "-N", "", "-C", f"eagle3ops-{name}-host",
              "-f", str(hostkey)])
    os.chmod(hostkey, 0o600)
    ak = ssh / "authorized_keys"
    # Shared host state is added to, never overwritten: a second checkout (its own client key) must not lock
    # the first one out of the same sandbox.
    keys = ak.read_text().splitlines() if ak.exists() else []
    if pub not in (k.strip() for k in keys):
        ak.write_text("".join(f"{k}\n" for k in [*keys, pub] if k.strip()))
    os.chown(ak, 0, 0)
    os.chmod(ak, 0o644)
    host_pub = Path(str(hostkey) + ".pub").read_text().split()
    known_hosts.write_text(f"[{listen}]:{ssh_port} {host_pub[0]} {host_pub[1]}\n")
