"""The build engine's connection: the docker SDK client from the environment and whether it holds an image.

The lowest module of ``images/``: :mod:`~eagle3ops.images.tags` (the base's id when no digest is pinned),
:mod:`~eagle3ops.images.inspect`, :mod:`~eagle3ops.images.facts` and :mod:`~eagle3ops.images.build` reach the engine
through it, so no two of them import each other for the client (no import circle: ``tests/test_contracts.py``).
"""

from __future__ import annotations

from typing import Any

from eagle3ops.config.images import ImageError

__all__ = ["docker_client", "image_present"]


def docker_client() -> Any:
    """A docker SDK client from the environment (``DOCKER_HOST`` etc.). Raises ImageError when the engine is down."""
    from eagle3ops import executor

    try:
        client = executor.engine()
        client.ping()
    except Exception as exc:  # docker.errors.DockerException and connection errors
        raise ImageError(f"cannot reach the docker engine ({exc}); is dockerd running / DOCKER_HOST right?") from None
    return client


def image_present(client: Any, ref: str) -> bool:
    """Whether the engine of ``client`` holds ``ref`` (a tag or an id); other engine errors propagate."""
    import docker.errors

    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False
