"""Delivery of a pipeline environment tarball to a venv host (``stage_runtime: venv``, issue 28), verified by its
digest on the host (:data:`eagle3ops.commands.venv.RECEIVE_SH`), then recorded in ``deployed.json`` as
``image: venv:sha256:<hex>`` and ``image_id: sha256:<hex>``: what windows on that host run with."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from eagle3ops.commands import host as hc
from eagle3ops.commands import venv as vc
from eagle3ops.remote import Remote, RemoteError
from eagle3ops.stages.manifest import sha256_file
from eagle3ops.window.common import paths


class EnvDeliveryError(Exception):
    """The environment could not be delivered; the message names the host's words and the fix."""


@dataclass
class Delivery:
    """What :func:`deliver_env` did: the environment, its directory, bytes sent (0: already there), seconds."""

    image: str
    env_dir: str
    sent_bytes: int
    seconds: float


def file_digest(path: Path) -> str:
    """``venv:sha256:<hex>`` of a tarball (:func:`eagle3ops.stages.manifest.sha256_file`)."""
    return f"{vc.IMAGE_PREFIX}sha256:{sha256_file(path)}"


def deliver_env(r: Remote, tarball: Path, *, image: str | None = None) -> Delivery:
    """Put the pipeline environment ``tarball`` on the venv host of ``r`` unless that digest is there already (its
    marker read first), verified by sha256 on the host before it is unpacked under ``<state_dir>/env/<hex>``; then
    write ``deployed.json``. ``image``: the digest the caller computed (checked against the file's).

    Raises:
        EnvDeliveryError: the host is not a venv host, the file's digest differs from ``image``, or the host refused
            the archive (digest mismatch in transit, not a gzip tar, its ``bin/python`` does not start there, its
            build record names another Python minor version than ``venv_python``'s).
    """
    h, t0 = r.host, time.monotonic()
    if not h.uses_venv:
        raise EnvDeliveryError(f"{h.name} has no `stage_runtime: venv`: its pipeline runs from an image "
                               f"(`eagle3ops deploy {h.name}`)")
    got = file_digest(tarball)
    if image is not None and image != got:
        raise EnvDeliveryError(f"{tarball}: its sha256 is {got}, not {image}: rebuild the environment")
    marker = r.run(vc.read_marker(h, got), check=False).stdout
    present = bool(marker.strip()) and json.loads(marker).get("digest") == got.removeprefix(vc.IMAGE_PREFIX)
    sent = 0
    if not present:
        with tarball.open("rb") as f:
            try:
                r.run(vc.receive_env(h, got), stdin=f)
            except RemoteError as exc:
                raise EnvDeliveryError(f"{h.name}: the pipeline environment {got[:24]}... was refused: {exc} "
                                       f"(exit 3: damaged in transit, retry; 5: build it against "
                                       f"hosts.{h.name}.venv_python; 6: point hosts.{h.name}.venv_python at a "
                                       f"Python of the environment's minor version)") from exc
        sent = tarball.stat().st_size
    record = {"image": got, "image_id": got.removeprefix(vc.IMAGE_PREFIX), "runtime": "venv",
              "env_dir": vc.env_dir(h, got)}
    r.run(hc.write_file(paths(h)["deployed"]), stdin=json.dumps(record, indent=2))
    return Delivery(image=got, env_dir=vc.env_dir(h, got), sent_bytes=sent, seconds=round(time.monotonic() - t0, 1))
