"""Docker CLI commands on a host, as argv lists (``docker -H ENDPOINT ...``)."""

from __future__ import annotations

from eagle3ops.commands.types import Change, Read
from eagle3ops.config import HostConfig


def docker(host: HostConfig, *args: str) -> list[str]:
    """``docker [-H endpoint] ARGS...`` for the host's Docker endpoint (``docker_host`` in the inventory): the
    prefix the builders below start from, untyped (an executor runs only what a builder typed :class:`Read`; a
    plain list counts as a change)."""
    base = ["docker"]
    if host.docker_host:
        base += ["-H", host.docker_host]
    return base + list(args)


def version(host: HostConfig) -> Read:
    """Server version (proves the engine answers)."""
    return Read(docker(host, "version", "--format", "{{.Server.Version}}"))


def info_format(host: HostConfig, fmt: str) -> Read:
    """``docker info --format FMT``: one Go template over the engine's info (``{{.Architecture}}``: the engine's
    machine as ``uname -m`` names it)."""
    return Read(docker(host, "info", "--format", fmt))


def image_id(host: HostConfig, image: str) -> Read:
    """Print the image id (``sha256:<config digest>``) of ``image``; exits non-zero when absent."""
    return Read(docker(host, "image", "inspect", "--format", "{{.Id}}", image))


def inspect_container(host: HostConfig, name: str) -> Read:
    """Full ``docker inspect`` JSON of a container (its spec and state)."""
    return Read(docker(host, "container", "inspect", name))


def exec_cat(host: HostConfig, name: str, path: str) -> Read:
    """``docker exec NAME cat -- PATH``: a file as a running container sees it (serving's ``--chat-template``)."""
    return Read(docker(host, "exec", name, "cat", "--", path))


def container_status(host: HostConfig, name: str) -> Read:
    """Print a container's state (``created``, ``running``, ``restarting``, ``exited``, ``dead``...); exits
    non-zero with ``No such object`` on stderr when it does not exist."""
    return Read(docker(host, "container", "inspect", "--format", "{{.State.Status}}", name))


def start(host: HostConfig, name: str) -> Change:
    """``docker start NAME``: start an existing, stopped container as it is configured (``recover`` of serving
    stopped outside a window)."""
    return Change(docker(host, "start", name))


def inspect_format(host: HostConfig, name: str, fmt: str, *, kind: str = "") -> Read:
    """``docker [KIND] inspect --format FMT NAME``: one Go template over an object's inspect JSON; exits non-zero
    when it does not exist.

    Args:
        kind: ``""`` (any object: container or image, as ``docker inspect``), ``"container"`` or ``"image"``.
    """
    return Read(docker(host, *([kind] if kind else []), "inspect", "--format", fmt, name))


def logs(host: HostConfig, name: str, *, follow: bool = False, tail: int | None = None) -> Read:
    """Container logs (stdout+stderr)."""
    args = ["logs"]
    if follow:
        args.append("--follow")
    if tail is not None:
        args += ["--tail", str(tail)]
    return Read(docker(host, *args, name))


def containers_by_label(host: HostConfig, label: str, states: tuple[str, ...], fmt: str) -> Read:
    """``docker ps -a --filter label=LABEL --filter status=S... --format FMT``: one line per container carrying
    ``label`` (``key=value``) in one of ``states`` (the Docker CLI ORs filters of one key: ``exited``, ``dead``...),
    formatted by the Go template ``fmt``."""
    filters = ["--filter", f"label={label}"]
    for s in states:
        filters += ["--filter", f"status={s}"]
    return Read(docker(host, "ps", "-a", *filters, "--format", fmt))


def rm(host: HostConfig, name: str, *, force: bool = False) -> Change:
    """Remove a container."""
    return Change(docker(host, "rm", *(["--force"] if force else []), name))


def socket_path(host: HostConfig) -> str:
    """Path of the engine's Unix socket on the host (to mount into the supervisor container).

    Raises:
        ValueError: ``docker_host`` is not a ``unix://`` endpoint (a TCP endpoint cannot be mounted).
    """
    ep = host.docker_host or "unix:///var/run/docker.sock"
    if not ep.startswith("unix://"):
        raise ValueError(
            f"hosts.{host.name}.docker_host: {ep!r} is not a unix:// socket; the host-side supervisor needs the "
            f"engine's socket. Use the engine's unix socket path."
        )
    return ep[len("unix://"):]


def tag(host: HostConfig, source: str, target: str) -> Change:
    """Give image ``source`` (id or reference) the additional reference ``target``."""
    return Change(docker(host, "tag", source, target))


def rmi(host: HostConfig, *images: str) -> Change:
    """Remove images (ids or references); untagged images that other images use fail without harm."""
    return Change(docker(host, "image", "rm", *images))


def image_ids(host: HostConfig | None = None) -> Read:
    """Full ids of the engine's images, one per line (``docker image ls -q --no-trunc``).

    Args:
        host: the inventory entry whose engine is asked (``docker_host``); None: the local client's default engine.
    """
    return (Read(docker(host, *_IMAGE_LS) if host is not None else ["docker", *_IMAGE_LS]))


def inspect_images(host: HostConfig | None, ids: list[str]) -> Read:
    """``docker image inspect`` JSON (a list) of ``ids`` on the engine of ``host`` (None: the local default)."""
    return Read(docker(host, "image", "inspect", *ids) if host is not None else ["docker", "image", "inspect", *ids])


_IMAGE_LS = ("image", "ls", "-q", "--no-trunc")


def run_python_stdin(host: HostConfig | None, image: str, source: str,
                     mounts: tuple[tuple[str, str], ...] = ()) -> Read:
    """``docker run --rm -i --network none [-v SRC:DST:ro ...] --entrypoint python3 IMAGE -c SOURCE``: a throwaway
    container of ``image`` running the Python ``source``, its input on standard input (so values never show in the
    host's process list), with no network, ``mounts`` read-only and nothing kept. A read: the container is gone
    when it returns.

    Args:
        host: the inventory entry whose engine runs it (``docker_host``); None: the local client's default engine.
        mounts: ``(host path, container path)`` pairs, bound read-only.
    """
    vols = [w for src, dst in mounts for w in ("-v", f"{src}:{dst}:ro")]
    args = ("run", "--rm", "-i", "--network", "none", *vols, "--entrypoint", "python3", image, "-c", source)
    return Read(docker(host, *args) if host is not None else ["docker", *args])
