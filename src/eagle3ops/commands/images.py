"""Command lines of image builds on the local build engine (docker CLI with BuildKit, debootstrap), as argv lists.

Pure: no I/O. :mod:`eagle3ops.images` runs them. Why the docker CLI and not the SDK: BuildKit secrets, cache and
bind mounts (images/README.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from eagle3ops.commands.types import Change, Read

__all__ = ["buildkit_build", "buildx_probe", "client_version", "debootstrap", "docker_import", "tar_rootfs"]


def client_version(cli: str) -> Read:
    """The docker client's own version (``23.0.1``...)."""
    return Read([cli, "version", "--format", "{{.Client.Version}}"])


def buildx_probe(cli: str) -> Read:
    """Exit 0 when the buildx plugin is installed for ``cli``."""
    return Read([cli, "buildx", "version"])


def buildkit_build(prefix: Sequence[str], *, context: Path, dockerfile: str, tag: str, iidfile: Path,
                   extra_tags: Sequence[str] = (), no_cache: bool = False,
                   build_args: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None,
                   ca_bundle: Path | None = None) -> Change:
    """A BuildKit build on the host network with plain progress: ``prefix`` is ``[cli, "buildx", "build",
    "--load"]`` or ``[cli, "build"]`` (with ``DOCKER_BUILDKIT=1``); the CA bundle goes in as secret ``ca`` (never a
    layer); the image id is written to ``iidfile``."""
    argv = [*prefix, "--progress=plain", "--network", "host", "--iidfile", str(iidfile), "-f",
            str(context / dockerfile), "-t", tag]
    for t in extra_tags:
        argv += ["-t", t]
    if no_cache:
        argv.append("--no-cache")
    for k, v in (build_args or {}).items():
        argv += ["--build-arg", f"{k}={v}"]
    for k, v in (labels or {}).items():
        argv += ["--label", f"{k}={v}"]
    if ca_bundle is not None:
        argv += ["--secret", f"id=ca,src={ca_bundle}"]
    return Change([*argv, str(context)])


def debootstrap(root: Path, suite: str, include: Sequence[str], mirror: str) -> Change:
    """A minimal Debian ``suite`` root file system in ``root`` (variant minbase, plus ``include``)."""
    return Change(["debootstrap", "--variant=minbase", f"--include={','.join(include)}", suite, str(root), mirror])


def tar_rootfs(root: Path) -> Read:
    """``root`` as a tar stream on stdout (numeric owners)."""
    return Read(["tar", "--numeric-owner", "-C", str(root), "-c", "."])


def docker_import(tag: str) -> Change:
    """Import a root file system tar from stdin as image ``tag``."""
    return Change(["docker", "import", "-c", "ENV LANG=C.UTF-8", "-", tag])
