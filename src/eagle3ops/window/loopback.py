"""Serving's routes read as the host itself sees them: over its loopback (``http://127.0.0.1:<serving.port>``),
asked on the host through SSH, where serving's port is often bound to the loopback only.

The driver's own client of the serving API is :class:`eagle3ops.serving_http.ServingClient` (the routes' names are
its constants); this module is the same API's reader when only the host reaches it: one ``curl -s -f`` GET
(:func:`eagle3ops.commands.host.http_body`), run on the host by :class:`eagle3ops.remote.Remote`. A window's
preflight reads ``/version`` and ``/v1/models`` with it before anything stops; ``status`` and ``recover`` ask
``/health``'s status code with it.
"""

from __future__ import annotations

import json
from typing import Any

from eagle3ops.commands import host as hc

__all__ = ["read_json", "read_status", "route_url"]


def route_url(r: Any, route: str) -> str:
    """``http://127.0.0.1:<serving.port><route>``: serving's ``route`` as host ``r`` (its ``host.serving.port``)
    reaches it over its loopback."""
    return f"http://127.0.0.1:{r.host.serving.port}{route}"


def read_status(r: Any, route: str, *, timeout_s: int = 5) -> str | None:
    """The HTTP status code of ``GET route`` of serving on host ``r``'s loopback (``curl``, a read; one try of
    ``timeout_s`` seconds; no API key), as curl prints it: ``"200"``, ``"503"``, ``"000"`` or ``""`` when nothing
    answered. None when the host has no ``curl`` (exit 127). Raises nothing for the server's sake."""
    out = r.run(hc.http_status(route_url(r, route), timeout_s), check=False)
    return None if out.exited == 127 else out.stdout.strip()


def read_json(r: Any, route: str, *, timeout_s: int = 5) -> Any:
    """``GET route`` (``/version``, ``/v1/models``: :mod:`eagle3ops.serving_http`'s constants) of serving on host
    ``r``'s loopback at ``serving.port``, asked on the host through ``r`` (an :class:`eagle3ops.remote.Remote`) with
    ``curl -s -f`` (a read; one try of ``timeout_s`` seconds; no API key), its body decoded as JSON.

    Returns:
        The decoded JSON value, or None when no answer came (no ``curl`` on the host, nothing listening, an HTTP
        error status such as the 401 of a route behind ``--api-key``) or the body is not JSON. Raises nothing for
        the server's sake: its callers judge what they read, and an unreadable answer is not judged.
    """
    out = r.run(hc.http_body(route_url(r, route), timeout_s), check=False)
    if not out.ok:
        return None
    try:
        return json.loads(out.stdout)
    except ValueError:
        return None
