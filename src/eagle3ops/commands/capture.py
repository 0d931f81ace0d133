"""Commands ``eagle3ops patch capture|drift`` run inside a serving container (``docker exec``), as argv lists.

Every one only reads. Pure: no I/O; :mod:`eagle3ops.patches.capture` runs them through a runner (the one executor
for a host, the local docker CLI for ``HOST=local``).
"""

from __future__ import annotations

from collections.abc import Sequence

from eagle3ops.commands.types import Read
#: Python run in the container: the distribution's site dir, version and dist-info dir (importlib.metadata).
LOCATE_PY = (
    "import importlib.metadata as m, json, sys\n"
    "d = m.distribution(sys.argv[1])\n"
    "print(json.dumps({'site': str(d.locate_file('')), 'version': d.version, 'dist_info': str(d._path)}))\n"
)


def docker_exec(container: str, argv: Sequence[str], *, docker: str = "docker", docker_host: str | None = None
                ) -> Read:
    """``docker [-H docker_host] exec <container> argv...``."""
    return Read([docker, *(["-H", docker_host] if docker_host else []), "exec", container, *argv])


def locate(python: str, package: str) -> Read:
    """Print ``{"site", "version", "dist_info"}`` of ``package`` as JSON (:data:`LOCATE_PY`)."""
    return Read([python, "-c", LOCATE_PY, package])


def find_dist_info(root: str, stem: str, *, maxdepth: int | None = None) -> Read:
    """Directories named ``<stem>-*.dist-info`` under ``root`` (one filesystem; ``maxdepth`` limits depth)."""
    depth = ["-maxdepth", str(maxdepth)] if maxdepth is not None else ["-xdev"]
    return Read(["find", root, *depth, "-type", "d", "-name", f"{stem}-*.dist-info"])


def find_files(paths: Sequence[str]) -> Read:
    """Every regular file under ``paths``."""
    return Read(["find", *paths, "-type", "f"])


def sha256sum(paths: Sequence[str]) -> Read:
    """sha256 of each path (``sha256sum`` lines: digest, two spaces, path)."""
    return Read(["sha256sum", *paths])


def base64(path: str) -> Read:
    """A file's bytes as base64 text (byte-exact transport through a text channel)."""
    return Read(["base64", path])


def cat(path: str) -> Read:
    """Print a file."""
    return Read(["cat", path])
