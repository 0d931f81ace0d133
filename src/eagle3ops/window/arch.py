"""Refuse an image or a pipeline environment built for another CPU architecture than the host's, before it is sent
or serving is stopped for it.

A serving image of another architecture is loaded by ``docker load`` without complaint and its container fails at
its first instruction (``exec format error``): a release would stop serving, crash and roll back, two restarts for
what one look at the image refuses. So every command that sends an image or an environment (``push``, ``deploy``,
``deploy --env-tarball``) or runs one in place of serving (``release --image``, ``speculate``) compares:

- the image's architecture: its config's ``architecture`` (``docker image inspect``'s ``Architecture``, GOARCH
  names: ``amd64``, ``arm64``);
- a pipeline environment's: the ELF header of the first compiled file in the tarball (``e_machine``; the venv's
  wheels are compiled for one machine, :func:`tarball_arch`);
- with the host's: its engine's ``docker info`` ``Architecture`` (the kernel's ``uname -m``: ``x86_64``,
  ``aarch64``), or ``uname -m`` on a venv host (no engine).

Names are compared after :func:`normalize`, which mirrors containerd's ``platforms.Normalize``
(``containerd/platforms/database.go``, ``normalizeArch``: ``x86_64`` → ``amd64``, ``aarch64`` → ``arm64``...), the
rule Docker itself applies when it matches an image to its host. An architecture that cannot be read (an image
the host does not hold, an environment without compiled files) is not refused here: nothing is known to be wrong.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

from eagle3ops.commands import docker as dk
from eagle3ops.commands import runtime as rt

__all__ = ["arch_refusal", "elf_arch", "host_arch", "host_image_arch", "normalize", "refuse_foreign_env",
           "refuse_foreign_image", "tarball_arch"]

#: ``uname -m`` / GOARCH / OCI names → the GOARCH name (containerd ``normalizeArch``).
_ALIASES = {"x86_64": "amd64", "x86-64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
            "armv8": "arm64", "armv8l": "arm64", "i386": "386", "i486": "386", "i586": "386", "i686": "386",
            "386": "386", "armhf": "arm", "armel": "arm", "armv7l": "arm", "armv6l": "arm", "armv7": "arm",
            "arm": "arm", "ppc64le": "ppc64le", "ppc64": "ppc64", "s390x": "s390x", "riscv64": "riscv64",
            "mips64": "mips64", "mips64le": "mips64le", "loongarch64": "loong64", "loong64": "loong64"}

#: ELF ``e_machine`` → GOARCH (the System V ABI's machine numbers; EM_PPC64 is told apart by byte order).
_ELF_MACHINES = {3: "386", 40: "arm", 62: "amd64", 183: "arm64", 22: "s390x", 243: "riscv64", 258: "loong64"}

#: The one fix a foreign image gets: rebuild it for the host (a registry's multi-arch image: pull the host's one).
FIX_IMAGE = ("build or pull it for {want} (`docker build --platform linux/{want}`, `docker pull --platform "
             "linux/{want}`) and name that image")
FIX_ENV = ("export the pipeline environment from a pipeline image built for {want} (`eagle3ops image env-tarball` on "
           "a {want} build machine), or leave --env-tarball out so that deploy exports one")


def normalize(name: str) -> str:
    """The GOARCH name of an architecture name (``x86_64`` → ``amd64``, ``aarch64`` → ``arm64``; containerd's
    ``normalizeArch``); an unknown name is returned lower-cased, as it is."""
    n = (name or "").strip().lower()
    return _ALIASES.get(n, n)


def elf_arch(head: bytes) -> str | None:
    """The GOARCH of an ELF file from its first 20 bytes (``e_ident`` + ``e_type`` + ``e_machine``), None when it is
    no ELF file or of a machine not named here."""
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    little = head[5] == 1
    machine = int.from_bytes(head[18:20], "little" if little else "big")
    if machine == 21:  # EM_PPC64
        return "ppc64le" if little else "ppc64"
    return _ELF_MACHINES.get(machine)


def tarball_arch(path: Path, *, max_members: int = 200_000) -> tuple[str, str] | None:
    """``(GOARCH, member)`` of a pipeline environment tarball: the machine of the first ELF file in it (a compiled
    extension of a wheel, a console binary), read as a stream (stops at the first one; no file is extracted). None
    when it has none within ``max_members`` entries (a pure-Python environment runs anywhere its Python does).

    Raises:
        OSError, tarfile.TarError: the file cannot be read as a (gzip) tar.
    """
    with tarfile.open(path, mode="r|*") as tar:
        for k, m in enumerate(tar):
            if k >= max_members:
                return None
            if not m.isfile() or m.size < 64:
                continue
            f = tar.extractfile(m)
            if f is None:
                continue
            got = elf_arch(f.read(20))
            if got:
                return got, m.name
    return None


def arch_refusal(*, what: str, subject: str, subject_arch: str | None, host: str, host_arch: str | None,
                 source: str, env: bool = False) -> str | None:
    """The refusal of ``subject`` (an image or an environment tarball) built for ``subject_arch`` on host ``host``
    whose machine is ``host_arch`` (read from ``source``: ``docker info``, ``uname -m``), or None when they agree or
    either is unknown. Pure.

    Returns:
        a message naming the command (``what``), the subject, both architectures, where the host's came from, that
        nothing was sent or stopped, and the fix.
    """
    if not subject_arch or not host_arch:
        return None
    have, want = normalize(subject_arch), normalize(host_arch)
    if have == want:
        return None
    fix = (FIX_ENV if env else FIX_IMAGE).format(want=want)
    return (f"{what}: {subject} is built for {have} but {host} runs {want} ({source} says {host_arch.strip()}): its "
            f"programs would fail there with `exec format error`; nothing was sent or stopped. Fix: {fix}")


def host_arch(r: Any) -> tuple[str, str] | None:
    """``(machine, source)`` of the host of ``r``: its engine's ``docker info`` ``Architecture``, or ``uname -m``
    on a venv host (no engine); None when it does not answer (the commands that need the engine fail on their own,
    with their own words)."""
    argv, source = rt.for_host(r.host).machine(r.host)
    out = r.run(argv, check=False)
    value = (out.stdout or "").strip() if out.ok else ""
    return (value, source) if value else None


def host_image_arch(r: Any, image: str) -> str | None:
    """The architecture of ``image`` as the host's engine holds it (``docker image inspect``'s ``Architecture``),
    None when the host lacks it."""
    out = r.run(dk.inspect_format(r.host, image, "{{.Architecture}}", kind="image"), check=False)
    value = (out.stdout or "").strip() if out.ok else ""
    return value or None


def refuse_foreign_image(r: Any, image: str, what: str) -> str | None:
    """The refusal of ``image`` (held by the host of ``r``) when its architecture is not the host's, else None
    (read-only: ``docker info`` and ``docker image inspect``; an image the host lacks is judged by the push)."""
    arch = host_image_arch(r, image)
    found = host_arch(r) if arch else None
    if not arch or found is None:
        return None
    return arch_refusal(what=what, subject=image, subject_arch=arch, host=r.host.name, host_arch=found[0],
                        source=found[1])


def refuse_foreign_env(r: Any, tarball: Path, what: str) -> str | None:
    """The refusal of a pipeline environment ``tarball`` whose compiled files are for another machine than the venv
    host of ``r`` (``uname -m``), else None.

    Raises:
        OSError, tarfile.TarError: the tarball cannot be read.
    """
    got = tarball_arch(tarball)
    found = host_arch(r) if got else None
    if not got or found is None:
        return None
    return arch_refusal(what=what, subject=f"{tarball} ({got[1]} is a {got[0]} ELF file)", subject_arch=got[0],
                        host=r.host.name, host_arch=found[0], source=found[1], env=True)
