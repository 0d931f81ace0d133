"""The serving container as data: a spec dict (docker SDK ``containers.run`` kwargs) and its ``docker run`` argv.

One spec, two renderers: the host-side supervisor creates containers from the spec with the docker SDK, and the
driver prints (``--dry-run``) or runs (sandbox provisioning) the equivalent ``docker run`` argv.
"""

from __future__ import annotations

from typing import Any

from eagle3ops.commands.docker import docker
from eagle3ops.config import HostConfig, ServingConfig

ROLE_LABEL = "io.eagle3ops.role"
RELEASE_LABEL = "io.eagle3ops.release"


def _gpu_request(gpus: str | int) -> list[dict[str, Any]]:
    if gpus == "none" or gpus == 0:
        return []
    count = -1 if gpus == "all" else int(gpus)
    return [{"Driver": "", "Count": count, "Capabilities": [["gpu"]]}]


def container_spec(host: HostConfig, *, release: int, serving: ServingConfig | None = None,
                   extra_args: list[str] | None = None) -> dict[str, Any]:
    """Serving container spec for release number ``release``.

    Args:
        host: inventory entry (its ``serving`` section is used unless ``serving`` is given).
        release: release number recorded in the container's labels.
        extra_args: appended to the server args (e.g. a changed serving flag for a new release).

    Returns:
        JSON-serialisable kwargs for ``docker.client.containers.run`` (``device_requests`` as raw dicts).
    """
    s = serving or host.serving
    gpus = "none" if host.gpus == 0 else s.gpus
    spec: dict[str, Any] = {
        "image": s.image,
        "name": s.container,
        "command": list(s.args) + list(extra_args or []),
        "environment": dict(sorted(s.env.items())),
        "volumes": list(s.volumes),
        "network_mode": "host",
        "restart_policy": {"Name": "unless-stopped"},
        "labels": {ROLE_LABEL: "serving", RELEASE_LABEL: str(release)},
        "device_requests": _gpu_request(gpus),
    }
    if s.shm_size:
        spec["shm_size"] = s.shm_size
    return spec


def run_argv(host: HostConfig, spec: dict[str, Any]) -> list[str]:
    """``docker run -d`` argv equivalent to ``spec`` (see :func:`container_spec`)."""
    argv = ["run", "--detach", "--name", spec["name"], "--network", spec.get("network_mode", "host")]
    rp = spec.get("restart_policy") or {}
    if rp.get("Name"):
        argv += ["--restart", rp["Name"]]
    for k, v in (spec.get("environment") or {}).items():
        argv += ["--env", f"{k}={v}"]
    for vol in spec.get("volumes") or []:
        argv += ["--volume", vol]
    for k, v in (spec.get("labels") or {}).items():
        argv += ["--label", f"{k}={v}"]
    for req in spec.get("device_requests") or []:
        argv += ["--gpus", "all" if req.get("Count", -1) == -1 else str(req["Count"])]
    if spec.get("shm_size"):
        argv += ["--shm-size", spec["shm_size"]]
    if spec.get("entrypoint"):
        ep = spec["entrypoint"]
        ep = ep if isinstance(ep, list) else [ep]
        argv += ["--entrypoint", ep[0]]
        cmd_prefix = ep[1:]
    else:
        cmd_prefix = []
    return docker(host, *argv, spec["image"], *cmd_prefix, *spec.get("command", []))


def spec_from_inspect(inspect: dict[str, Any]) -> dict[str, Any]:
    """Rebuild a container spec from ``docker inspect`` output (one container object).

    Keeps what decides behaviour — image, command, entrypoint, env, binds, network, restart policy, labels, GPU
    requests, shm size, IPC mode — and drops runtime state. Mirrors the fields of Docker Engine API
    ``ContainerInspect`` (``Config``, ``HostConfig``).
    """
    cfg, hc = inspect.get("Config") or {}, inspect.get("HostConfig") or {}
    env = dict(e.split("=", 1) for e in (cfg.get("Env") or []) if "=" in e)
    spec: dict[str, Any] = {
        "image": cfg.get("Image") or inspect.get("Image"),
        "name": (inspect.get("Name") or "").lstrip("/"),
        "command": list(cfg.get("Cmd") or []),
        "environment": env,
        "volumes": list(hc.get("Binds") or []),
        "network_mode": hc.get("NetworkMode") or "host",
        "restart_policy": {"Name": (hc.get("RestartPolicy") or {}).get("Name") or ""},
        "labels": dict(cfg.get("Labels") or {}),
        "device_requests": list(hc.get("DeviceRequests") or []),
    }
    if cfg.get("Entrypoint"):
        spec["entrypoint"] = list(cfg["Entrypoint"])
    if hc.get("ShmSize"):
        spec["shm_size"] = str(hc["ShmSize"])
    if hc.get("IpcMode") and hc["IpcMode"] not in ("private", "shareable", ""):
        spec["ipc_mode"] = hc["IpcMode"]
    return spec
