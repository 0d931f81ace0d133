"""Delivery of a pipeline environment tarball to a venv host (``stage_runtime: venv``), verified by its
digest on the host (:data:`eagle3ops.commands.venv.RECEIVE_SH`), then recorded in ``deployed.json`` as
``image: venv:sha256:<hex>`` and ``image_id: sha256:<hex>``: what windows on that host run with. A stand-in
environment (its marker :data:`eagle3ops.config.standin.STANDIN_ENV_MARKER` at the tarball's head: :func:`env_marker`)
is refused on a host that is not a sandbox before the host is asked anything."""

from __future__ import annotations

import gzip
import json
import tarfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from eagle3ops.commands import host as hc
from eagle3ops.commands import runtime as rt
from eagle3ops.commands import venv as vc
from eagle3ops.config import HostConfig
from eagle3ops.config.standin import ENV_FIX, STANDIN_ENV_MARKER, env_standin_reason, refusal
from eagle3ops.remote import Remote, RemoteError
from eagle3ops.stages.manifest import sha256_file
from eagle3ops.window.arch import refuse_foreign_env
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


#: Entries of a tarball's head searched for the stand-in marker (it is written first; a few allow for a leading
#: directory entry): the rest of a multi-GB environment is never decompressed for it.
MARKER_SCAN = 4


def env_marker(tarball: Path) -> dict | None:
    """The stand-in marker (:data:`~eagle3ops.config.standin.STANDIN_ENV_MARKER`, parsed JSON) among the first
    :data:`MARKER_SCAN` entries of the gzip tarball, None when there is none there. An unreadable marker reads as
    ``{"why": "its marker is unreadable: ..."}`` (still a stand-in); a file that is not a gzip tar reads as None (the
    host refuses it on arrival, exit 4).

    Raises:
        OSError: the file cannot be read.
    """
    try:
        with tarfile.open(tarball, mode="r|gz") as tar:
            for i, member in enumerate(tar):
                if i >= MARKER_SCAN:
                    break
                if member.name.removeprefix("./") == STANDIN_ENV_MARKER:
                    f = tar.extractfile(member)
                    try:
                        return dict(json.loads(f.read(1 << 16) if f else b""))
                    except (ValueError, TypeError) as exc:
                        return {"why": f"its marker is unreadable: {exc}"}
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error):
        return None
    return None


def refuse_standin_env(host: HostConfig, tarball: Path, image: str, what: str) -> None:
    """Raise when the environment ``tarball`` (digest ``image``) carries the stand-in marker and ``host`` is not a
    sandbox (:func:`eagle3ops.config.standin.refusal`); read locally, nothing is asked of the host.

    Raises:
        EnvDeliveryError: the message names the environment, its marker and the fix.
    """
    msg = refusal(host, what, f"{image} ({tarball})", "stand-in pipeline environment",
                  env_standin_reason(env_marker(tarball)), ENV_FIX)
    if msg:
        raise EnvDeliveryError(msg)


@dataclass(frozen=True)
class EnvCheck:
    """What the host holds of a pipeline environment, read and checked before anything is sent
    (:func:`check_env`): the tarball, its digest (``venv:sha256:<hex>``) and whether the host has it unpacked."""

    tarball: Path
    image: str
    present: bool


def check_env(r: Remote, tarball: Path, *, image: str | None = None, what: str = "deploy --env-tarball") -> EnvCheck:
    """The facts and checks of a delivery (reads only): the host is a venv host, the environment is not a stand-in
    (:func:`refuse_standin_env`, ``what`` naming the command; before the host is asked anything), its compiled files
    are for the host's ``uname -m``, its digest is ``image`` when given, and whether the host holds it already (its
    marker).

    Raises:
        EnvDeliveryError: as :func:`deliver_env`, for every refusal made before anything is sent.
    """
    h = r.host
    if rt.for_host(h).engine:
        raise EnvDeliveryError(f"{h.name} has no `stage_runtime: venv`: its pipeline runs from an image "
                               f"(`eagle3ops deploy {h.name}`)")
    got = file_digest(tarball)
    refuse_standin_env(h, tarball, got, what)
    try:  # its compiled files against the host's machine (`uname -m`), before anything is sent
        foreign = refuse_foreign_env(r, tarball, what)
    except (OSError, tarfile.TarError) as exc:
        raise EnvDeliveryError(f"{tarball}: cannot be read as a gzip tar ({exc}): pass the file "
                               f"`eagle3ops image env-tarball` wrote") from None
    if foreign:
        raise EnvDeliveryError(foreign)
    if image is not None and image != got:
        raise EnvDeliveryError(f"{tarball}: its sha256 is {got}, not {image}: rebuild the environment")
    marker = r.run(vc.read_marker(h, got), check=False).stdout
    present = bool(marker.strip()) and json.loads(marker).get("digest") == got.removeprefix(vc.IMAGE_PREFIX)
    return EnvCheck(tarball, got, present)


def send_env(r: Remote, checked: EnvCheck) -> Delivery:
    """The changes of a delivery (the caller holds the host's lock): the tarball sent unless ``checked`` found it
    there, verified by sha256 on the host before it is unpacked, then ``deployed.json`` written.

    Raises:
        EnvDeliveryError: the host refused the archive (the exit status says why and the message says the fix).
    """
    h, t0, got = r.host, time.monotonic(), checked.image
    sent = 0
    if not checked.present:
        with checked.tarball.open("rb") as f:
            try:
                r.run(vc.receive_env(h, got), stdin=f)
            except RemoteError as exc:
                raise EnvDeliveryError(f"{h.name}: the pipeline environment {got[:24]}... was refused: {exc} "
                                       f"(exit 3: damaged in transit, retry; 5: build it against "
                                       f"hosts.{h.name}.venv_python; 6: point hosts.{h.name}.venv_python at a "
                                       f"Python of the environment's minor version)") from exc
        sent = checked.tarball.stat().st_size
    record = {"image": got, "image_id": got.removeprefix(vc.IMAGE_PREFIX), "runtime": "venv",
              "env_dir": vc.env_dir(h, got)}
    r.run(hc.write_file(paths(h)["deployed"]), stdin=json.dumps(record, indent=2))
    return Delivery(image=got, env_dir=vc.env_dir(h, got), sent_bytes=sent, seconds=round(time.monotonic() - t0, 1))


def deliver_env(r: Remote, tarball: Path, *, image: str | None = None,
                what: str = "deploy --env-tarball") -> Delivery:
    """Put the pipeline environment ``tarball`` on the venv host of ``r`` unless that digest is there already (its
    marker read first), verified by sha256 on the host before it is unpacked under ``<state_dir>/env/<hex>``; then
    write ``deployed.json``: :func:`check_env`, then :func:`send_env` (``deploy`` takes the host's lock between
    them). ``image``: the digest the caller computed (checked against the file's). A stand-in environment is refused
    (:func:`refuse_standin_env`, ``what`` naming the command) before the host is asked anything.

    Raises:
        EnvDeliveryError: the host is not a venv host, the file's digest differs from ``image``, the environment is
            a stand-in and the host not a sandbox, its compiled files are for another CPU architecture than the
            host's ``uname -m`` (:mod:`eagle3ops.window.arch`; nothing sent), or the host refused the archive (digest
            mismatch in transit, not a gzip tar, its ``bin/python`` does not start there, its build record names
            another Python minor version than ``venv_python``'s).
    """
    return send_env(r, check_env(r, tarball, image=image, what=what))
