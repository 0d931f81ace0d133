"""The serving container as data: a spec dict (docker SDK ``containers.run`` kwargs) and its ``docker run`` argv.

One spec, two renderers: the host-side supervisor creates containers from the spec with the docker SDK, and the
driver prints (``--dry-run``) or runs (sandbox provisioning) the equivalent ``docker run`` argv.
"""

from __future__ import annotations

import re
from typing import Any

from eagle3ops.commands.docker import docker
from eagle3ops.config import HostConfig, ServingConfig

ROLE_LABEL = "io.eagle3ops.role"
RELEASE_LABEL = "io.eagle3ops.release"
#: Labels by which Docker Compose (v1 and v2) finds a service's containers.
COMPOSE_PROJECT_LABEL = "com.docker.compose.project"
COMPOSE_SERVICE_LABEL = "com.docker.compose.service"
COMPOSE_ONEOFF_LABEL = "com.docker.compose.oneoff"


def compose_labels(s: ServingConfig) -> dict[str, str]:
    """The Compose labels a serving container of kind ``compose`` carries ({} for kind ``container``).

    Compose (``docker compose ps``, ``docker-compose ps``) lists a service's containers by project + service
    labels with ``oneoff=False``; a release that eagle3ops recreates keeps them, so Compose still sees its service.
    """
    if s.kind != "compose":
        return {}
    return {COMPOSE_PROJECT_LABEL: s.compose_project or "", COMPOSE_SERVICE_LABEL: s.compose_service or "",
            COMPOSE_ONEOFF_LABEL: "False", "com.docker.compose.container-number": "1"}


def default_name(s: ServingConfig) -> str:
    """Serving container name when none exists yet: ``container``, or ``<project>-<service>-1`` for kind
    ``compose`` (the name Compose v2 gives a service's first container)."""
    return f"{s.compose_project}-{s.compose_service}-1" if s.kind == "compose" else s.container


def find_container_argv(host: HostConfig) -> list[str]:
    """``docker ps -a`` argv printing the name(s) of the serving container(s) (one name per line).

    Kind ``container``: filtered by name (exact match); kind ``compose``: by the Compose project/service labels.
    """
    s = host.serving
    if s.kind == "compose":
        filters = ["--filter", f"label={COMPOSE_PROJECT_LABEL}={s.compose_project}",
                   "--filter", f"label={COMPOSE_SERVICE_LABEL}={s.compose_service}",
                   "--filter", f"label={COMPOSE_ONEOFF_LABEL}=False"]
    else:
        filters = ["--filter", f"name=^/?{re.escape(s.container)}$"]  # Docker matches names as a regexp
    return docker(host, "ps", "--all", *filters, "--format", "{{.Names}}")


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
        "name": default_name(s),
        "command": list(s.args) + list(extra_args or []),
        "environment": dict(sorted(s.env.items())),
        "volumes": list(s.volumes),
        "network_mode": "host",
        "restart_policy": {"Name": "unless-stopped"},
        "labels": {**compose_labels(s), ROLE_LABEL: "serving", RELEASE_LABEL: str(release)},
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
        if req.get("DeviceIDs"):
            argv += ["--gpus", "device=" + ",".join(req["DeviceIDs"])]
        else:
            argv += ["--gpus", "all" if req.get("Count", -1) == -1 else str(req["Count"])]
    if spec.get("runtime"):
        argv += ["--runtime", spec["runtime"]]
    for cport, binds in (spec.get("ports") or {}).items():
        for ip, hport in binds:
            argv += ["--publish", f"{ip + ':' if ip else ''}{hport or ''}:{cport}"]
    for m in spec.get("mounts") or []:
        argv += ["--mount", f"type={m.get('Type', 'bind')},source={m.get('Source', '')},target={m['Target']}"
                 + (",readonly" if m.get("ReadOnly") else "")]
    if spec.get("shm_size"):
        argv += ["--shm-size", spec["shm_size"]]
    if spec.get("ipc_mode"):
        argv += ["--ipc", spec["ipc_mode"]]
    for u in spec.get("ulimits") or []:  # stage containers on GPU hosts: memlock for NCCL
        argv += ["--ulimit", f"{u['Name']}={u['Soft']}:{u['Hard']}"]
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

    Keeps what decides behaviour — image, command, entrypoint, env, binds and ``--mount`` mounts, network, published
    ports, runtime, restart policy, labels, GPU requests (count or device ids), shm size, IPC mode — and drops runtime
    state. Not kept: extra networks and their aliases, healthchecks, resource limits, capabilities. Mirrors the fields of Docker Engine API
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
    if hc.get("Runtime") and hc["Runtime"] != "runc":
        spec["runtime"] = hc["Runtime"]  # e.g. `nvidia` on hosts set up before `--gpus`
    ports = {k: [(b.get("HostIp") or "", int(b["HostPort"]) if b.get("HostPort") else None) for b in v]
             for k, v in (hc.get("PortBindings") or {}).items() if v}
    if ports:
        spec["ports"] = ports
    if hc.get("Mounts"):  # `--mount` / Compose long-syntax mounts (short `-v` ones are in Binds)
        spec["mounts"] = [{k: m[k] for k in ("Type", "Source", "Target", "ReadOnly") if k in m} for m in hc["Mounts"]]
    return spec
