"""The sandbox's second Docker engine kind: Debian 13's docker.io 26.1 with containerd 1.7 (containerd image store).

Unpacked from the Debian packages (never installed over this machine's Debian 12 engine) into
:data:`ENGINE26_DIR`; :func:`eagle3ops_dev.sandbox.host.up` starts it with ``{"features": {"containerd-snapshotter":
true}}`` for ``engine="containerd"``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from eagle3ops_dev.sandbox.proc import SandboxError, run_checked

__all__ = ["DEBIAN_MIRROR", "ENGINE26_DIR", "ENGINE26_PACKAGES", "ensure_containerd_engine"]

#: Where the containerd-store engine's binaries are unpacked, and its Debian packages (suite, name, version prefix).
ENGINE26_DIR = Path("/opt/eagle3ops/engines/docker-26.1")
ENGINE26_PACKAGES = {"docker.io": "26.1.", "containerd": "1.7."}
DEBIAN_MIRROR = "http://deb.debian.org/debian"


def ensure_containerd_engine() -> Path:
    """Unpack Debian 13 (trixie) ``docker.io`` 26.1 and ``containerd`` 1.7 into :data:`ENGINE26_DIR` (once).

    The packages come from the Debian mirror through a private apt sources list and lists dir (the system's apt
    configuration is not changed) and are unpacked with ``dpkg -x`` (never installed). Their versions are recorded
    in ``ENGINE26_DIR/VERSIONS``.

    Returns:
        the directory holding ``dockerd`` and ``containerd`` (``usr/sbin`` and ``usr/bin`` under it).

    Raises:
        SandboxError: the download fails or a package's version is not the expected major.minor.
    """
    stamp = ENGINE26_DIR / "VERSIONS"
    if stamp.exists() and (ENGINE26_DIR / "usr/sbin/dockerd").exists():
        return ENGINE26_DIR
    work = Path("/var/cache/eagle3ops/trixie")
    (work / "lists/partial").mkdir(parents=True, exist_ok=True)
    (work / "debs").mkdir(exist_ok=True)
    (work / "sources.list").write_text(f"deb {DEBIAN_MIRROR} trixie main\n")
    apt = ["-o", f"Dir::Etc::SourceList={work / 'sources.list'}", "-o", "Dir::Etc::SourceParts=/dev/null",
           "-o", f"Dir::State::Lists={work / 'lists'}", "-o", "Debug::NoLocking=1",
           "-o", "APT::Sandbox::User=root"]
    run_checked(["apt-get", *apt, "update", "-qq"], timeout=300)
    versions = {}
    for pkg, prefix in ENGINE26_PACKAGES.items():
        cand = run_checked(["apt-cache", *apt, "policy", pkg]).stdout
        ver = next((ln.split(":", 1)[1].strip() for ln in cand.splitlines() if "Candidate:" in ln), "")
        if not ver.startswith(prefix):
            raise SandboxError(f"trixie's {pkg} candidate is {ver or 'missing'}, expected {prefix}x")
        versions[pkg] = ver
    for f in (work / "debs").glob("*.deb"):
        f.unlink()
    subprocess.run(["apt-get", *apt, "download", *(f"{p}={v}" for p, v in versions.items())], cwd=work / "debs",
                   check=True, capture_output=True, timeout=600)
    tmp = ENGINE26_DIR.with_name(ENGINE26_DIR.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for deb in sorted((work / "debs").glob("*.deb")):
        run_checked(["dpkg", "-x", str(deb), str(tmp)], timeout=300)
    for runc in tmp.glob("usr/*bin/runc"):
        runc.unlink()  # trixie's runc needs glibc 2.38; the system's runc runs the containers
    (tmp / "VERSIONS").write_text("".join(f"{p} {v}\n" for p, v in versions.items()))
    shutil.rmtree(ENGINE26_DIR, ignore_errors=True)
    ENGINE26_DIR.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(ENGINE26_DIR)
    return ENGINE26_DIR
