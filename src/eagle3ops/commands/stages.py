"""Stage and supervisor containers as data: specs for the docker SDK and the supervisor's ``docker run`` argv."""

from __future__ import annotations

from typing import Any

from eagle3ops.commands.docker import docker, socket_path
from eagle3ops.config import HostConfig

#: Where the host's data_dir appears inside stage containers.
DATA_MOUNT = "/data"
#: Where the host's target model directory appears (read-only) inside stage containers.
MODEL_MOUNT = "/model"
#: Stages of each maintenance window, in order.
WINDOWS: dict[str, list[str]] = {"extract": ["prepare", "extract"], "train": ["vocab", "train"]}


def run_dir(run: str) -> str:
    """The pipeline run directory inside stage containers."""
    return f"{DATA_MOUNT}/runs/{run}"


def stage_spec(host: HostConfig, *, image: str, stage: str, run: str, window_id: str) -> dict[str, Any]:
    """Container spec for one pipeline stage (docker SDK ``containers.run`` kwargs, JSON-serialisable).

    The stage sees the host's ``data_dir`` at ``/data`` and the target model at ``/model`` (read-only), runs on the
    host network, gets the inventory's ``stage_env`` exactly, all GPUs when the host has any, and what NCCL needs for
    multi-GPU (``ipc=host``, unlimited memlock).
    """
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.update(host.stage_env)
    spec: dict[str, Any] = {
        "image": image,
        "name": f"eagle3ops-{window_id}-{stage}",
        "entrypoint": ["python3"],
        "command": ["-m", "eagle3ops", "stage", stage, "--run-dir", run_dir(run)],
        "environment": env,
        "volumes": [f"{host.data_dir}:{DATA_MOUNT}", f"{host.model_path}:{MODEL_MOUNT}:ro"],
        "network_mode": "host",
        "labels": {"io.eagle3ops.role": "stage", "io.eagle3ops.window": window_id, "io.eagle3ops.stage": stage},
        "device_requests": [{"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}] if host.gpus else [],
    }
    if host.gpus:
        spec["ipc_mode"] = "host"
        spec["ulimits"] = [{"Name": "memlock", "Soft": -1, "Hard": -1}]
    return spec


def supervisor_name(window_id: str) -> str:
    """Container name of a window's supervisor."""
    return f"eagle3ops-supervisor-{window_id}"


#: Seconds `docker stop` gives the supervisor to stop a stage and bring serving back (start, not the full gate).
SUPERVISOR_STOP_TIMEOUT_S = 120


def supervisor_argv(host: HostConfig, *, image: str, window_id: str, plan_path: str) -> list[str]:
    """``docker run -d`` argv that starts the host-side supervisor for a window.

    The supervisor gets the engine socket, the state and data dirs at the same paths as on the host, host
    networking (health checks on 127.0.0.1), the serving API key file when the inventory names one (read-only), and a
    restart policy so a Docker daemon restart resumes it.
    """
    sock = socket_path(host)
    # The secret file of the serving API key (if any), read-only at the same path: the gate reads it on the host.
    secret = host.serving.api_key_file
    secret_mount = ["--volume", f"{secret}:{secret}:ro"] if secret else []
    return docker(
        host, "run", "--detach", "--name", supervisor_name(window_id), "--network", "host",
        "--restart", "on-failure:5",
        # On `docker stop` the supervisor stops the running stage (up to 10 s) and restores serving before it exits.
        "--stop-timeout", str(int(SUPERVISOR_STOP_TIMEOUT_S)),
        "--label", "io.eagle3ops.role=supervisor", "--label", f"io.eagle3ops.window={window_id}",
        "--volume", f"{sock}:/var/run/docker.sock",
        "--volume", f"{host.state_dir}:{host.state_dir}",
        "--volume", f"{host.data_dir}:{host.data_dir}",
        *secret_mount,
        "--env", "PYTHONUNBUFFERED=1",
        "--entrypoint", "python3",
        image, "-m", "eagle3ops.supervisor", plan_path,
    )
