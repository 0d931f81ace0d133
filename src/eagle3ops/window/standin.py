"""Refuse a stand-in serving image on a host that is not a sandbox, before anything changes.

The rule and the names are :mod:`eagle3ops.config.standin`'s; this module reads the image's labels from the host's
engine (read-only; an image the host does not hold yet is judged by its reference).
"""

from __future__ import annotations

import json

from eagle3ops.commands import docker as dk
from eagle3ops.config.standin import standin_refusal
from eagle3ops.remote import Remote
from eagle3ops.window.common import WindowError

__all__ = ["image_labels", "refuse_standin_image"]


def image_labels(r: Remote, image: str) -> dict[str, str] | None:
    """The labels of ``image`` on the host's engine (``docker image inspect``), None when the host lacks it."""
    out = r.run(dk.inspect_images(r.host, [image]), check=False)
    if not out.ok:
        return None
    try:
        return dict((json.loads(out.stdout)[0].get("Config") or {}).get("Labels") or {})
    except (ValueError, IndexError, AttributeError):
        return None


def refuse_standin_image(r: Remote, image: str, what: str) -> None:
    """Raise when ``image`` is a stand-in and ``r.host`` is not a sandbox.

    Raises:
        WindowError: the message names the image, why it is a stand-in and the fix.
    """
    msg = standin_refusal(r.host, image, image_labels(r, image), what)
    if msg:
        raise WindowError(msg)
