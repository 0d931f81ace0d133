"""``eagle3ops verify HOST`` as data: the engine-check container's ``docker run`` argv and the record paths.

Pure builders (no I/O); :mod:`eagle3ops.verifier` runs them through :class:`eagle3ops.remote.Remote`.
"""

from __future__ import annotations

from typing import Any

from eagle3ops.commands.docker import docker
from eagle3ops.commands.stages import stage_spec
from eagle3ops.config import HostConfig


def verify_dir(host: HostConfig) -> str:
    """Where verify results live on the host: ``<state_dir>/verify``."""
    return f"{host.state_dir}/verify"


def result_path(host: HostConfig, image_id: str) -> str:
    """The recorded result for one image id: ``<state_dir>/verify/<id hex>.json`` (``sha256:`` stripped)."""
    return f"{verify_dir(host)}/{image_id.split(':', 1)[-1]}.json"


def container_name(image_id: str) -> str:
    """Name of the engine-check container of an image (one at a time per image on a host)."""
    return f"eagle3ops-verify-{image_id.split(':', 1)[-1][:12]}"


def run_options(spec: dict[str, Any]) -> list[str]:
    """``docker run`` options equal to a stage container spec's settings (:func:`stage_spec`): environment, network,
    GPUs (``device_requests`` → ``--gpus all``), IPC mode and ulimits. Volumes, name and labels are not taken: the
    engine checks read nothing from the host."""
    out: list[str] = []
    for k, v in sorted(spec.get("environment", {}).items()):
        out += ["--env", f"{k}={v}"]
    if spec.get("network_mode"):
        out += ["--network", spec["network_mode"]]
    for req in spec.get("device_requests", []):
        if req.get("Capabilities") == [["gpu"]]:
            count = req.get("Count", -1)
            out += ["--gpus", "all" if count == -1 else str(count)]
    if spec.get("ipc_mode"):
        out += ["--ipc", spec["ipc_mode"]]
    for u in spec.get("ulimits", []):
        out += ["--ulimit", f"{u['Name']}={u['Soft']}:{u['Hard']}"]
    return out


def engine_check_argv(host: HostConfig, *, image: str, image_id: str) -> list[str]:
    """``docker run --rm`` of the pipeline image that runs its engine checks (``python3 -m eagle3ops.imagecheck
    host``: every applied patch's probe, on vLLM engines) with the stage containers' settings of this host: all
    GPUs, host IPC and unlimited memlock on a GPU host, the inventory's ``stage_env``, host network. ``image`` is
    pinned by id (``image_id``), so the checks run on exactly the deployed image."""
    spec = stage_spec(host, image=image, stage="verify", run="verify", window_id="verify")
    return docker(host, "run", "--rm", "--name", container_name(image_id),
                  "--label", "io.eagle3ops.role=verify", "--label", f"io.eagle3ops.image={image}",
                  *run_options(spec), "--entrypoint", "python3", image_id, "-m", "eagle3ops.imagecheck", "host")
