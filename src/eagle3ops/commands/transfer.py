"""Commands of an image transfer (:mod:`eagle3ops.transfer`), as argv lists: the host's inventory and load, the
id check after it, and the build engine's own ``docker`` calls (pure; nothing here runs anything).

Host-side commands take the inventory entry (``docker -H <docker_host>`` when it is set); build-engine commands take
the build engine's endpoint (``None``: the client's default, ``DOCKER_HOST`` or context). The compressor on the
build machine (``zstd``) is a local tool and is built here too, so that every command line of a push is in one
place.
"""

from __future__ import annotations

from eagle3ops.commands.docker import docker
from eagle3ops.commands.types import Change, Read
from eagle3ops.config import HostConfig

#: Separator line between ``docker info`` and the image list in :func:`inventory`'s output.
INVENTORY_SEPARATOR = "--eagle3ops--"
#: Exit status of :func:`inventory` when ``docker info`` fails (the engine does not answer).
INVENTORY_NO_ENGINE = 97

#: The host inventory in one round trip: ``docker info`` as JSON, a separator line, then id, diff ids and labels
#: of every image. The docker command (``docker -H ENDPOINT``) comes in as positional arguments ("$@"), so the
#: script is a constant and the argv is rendered (quoted) once like every other command.
INVENTORY_SCRIPT = (
    f'"$@" info --format "{{{{json .}}}}" || exit {INVENTORY_NO_ENGINE}; echo "{INVENTORY_SEPARATOR}"; '
    '"$@" image ls -a -q --no-trunc | sort -u | '
    'xargs -r -n 200 "$@" image inspect --format "{{.Id}}\t{{json .RootFS.Layers}}\t{{json .Config.Labels}}"'
)


# --- on the host -------------------------------------------------------------------------------------------------
def inventory(host: HostConfig) -> Read:
    """What the host's engine holds, in one command: ``docker info`` (JSON), :data:`INVENTORY_SEPARATOR`, then one
    line per image: ``<id>\\t<RootFS.Layers JSON>\\t<Labels JSON>``. Exits :data:`INVENTORY_NO_ENGINE` when the
    engine does not answer; an image deleted between listing and inspecting makes it exit 1 with the others
    printed."""
    return Read(["sh", "-c", INVENTORY_SCRIPT, "eagle3ops-inventory", *docker(host)])


def has_zstd() -> Read:
    """Exits 0 when ``zstd`` is on the host's PATH (needed to receive zstd streams)."""
    return Read(["sh", "-c", "command -v zstd"])


def discard() -> Read:
    """Read standard input to the end and throw it away (the link probe's sink)."""
    return Read(["sh", "-c", "cat >/dev/null"])


def load(host: HostConfig, codec: str = "none", load_argv: list[str] | None = None) -> Change:
    """``docker load`` reading an archive on standard input.

    Args:
        codec: ``none`` or ``gzip`` (``docker load`` reads both), or ``zstd`` (decompressed by the host's ``zstd``
            in front of the load).
        load_argv: replaces ``docker [-H ...] load`` (tests use it to simulate a load that does nothing).
    """
    argv = list(load_argv) if load_argv else docker(host, "load")
    if codec == "zstd":
        argv = ["sh", "-c", 'zstd -d -q -c | "$@"', "eagle3ops-load", *argv]
    return Change(argv)


def image_id_and_layers(host: HostConfig, ref: str) -> Read:
    """Print ``<image id> <RootFS.Layers as JSON>`` of ``ref``; exits non-zero when the image is absent."""
    return Read(docker(host, "image", "inspect", "--format", "{{.Id}} {{json .RootFS.Layers}}", ref))


def listed_image_ids(host: HostConfig) -> Read:
    """Full ids of every image ``docker image ls -a`` lists, one per line (on the containerd store: only images
    whose content is complete)."""
    return Read(docker(host, "image", "ls", "-a", "-q", "--no-trunc"))


# --- on the build machine -----------------------------------------------------------------------------------------
def local_docker(docker_host: str | None, *args: str) -> list[str]:
    """``docker [-H docker_host] ARGS...`` against the build engine."""
    return ["docker"] + (["-H", docker_host] if docker_host else []) + list(args)


def local_info(docker_host: str | None = None) -> Read:
    """``docker info`` of the build engine as one JSON document."""
    return Read(local_docker(docker_host, "info", "--format", "{{json .}}"))


def local_inspect(docker_host: str | None, ref: str) -> Read:
    """``docker image inspect`` of ``ref`` on the build engine (a JSON list of one)."""
    return Read(local_docker(docker_host, "image", "inspect", ref))


def local_save(docker_host: str | None, image: str) -> Read:
    """``docker save`` of ``image`` from the build engine (a tar on standard output)."""
    return Read(local_docker(docker_host, "save", image))


def zstd_compress(level: int, *, threads: bool = True, long: bool = False) -> Read:
    """``zstd`` compressing standard input to standard output at ``level``; ``threads`` uses every core
    (``-T0``), ``long`` enables long-distance matching with a 128 MiB window (``--long=27``)."""
    return Read(["zstd", "-q", "-c", f"-{level}"] + (["-T0"] if threads else []) + (["--long=27"] if long else []))
