"""Stage and supervisor containers as data: specs for the docker SDK and the supervisor's ``docker run`` argv."""

from __future__ import annotations

from typing import Any

from eagle3ops.commands.docker import containers_by_label, docker, socket_path
from eagle3ops.commands.serving import run_argv
from eagle3ops.commands.types import Change, Read
from eagle3ops.config import HostConfig

#: Where the host's data_dir appears inside stage containers.
DATA_MOUNT = "/data"
#: Where the host's target model directory appears (read-only) inside stage containers.
MODEL_MOUNT = "/model"
#: The pipeline image an offline plan (``--dry-run --offline``) names when the inventory has no ``pipeline_image``.
UNKNOWN_IMAGE = "<pipeline image from `eagle3ops deploy`>"
#: Stages of each maintenance window, in order. ``prepare`` alone: the fleet's first pass when no host has prepared
#: the run yet (its shards are cut from the prepared count; :mod:`eagle3ops.fleet.execute`).
WINDOWS: dict[str, list[str]] = {"extract": ["prepare", "extract"], "train": ["vocab", "train"],
                                 "prepare": ["prepare"]}


#: The windows of a chunked run (pipeline ``chunks.count`` set): window extract only prepares; window train runs vocab
#: and stage ``chunked`` (extract + train chunk by chunk, :mod:`eagle3ops.stages.chunked`).
CHUNKED_WINDOWS: dict[str, list[str]] = {"extract": ["prepare"], "train": ["vocab", "chunked"], "prepare": ["prepare"]}


def window_stages(kind: str, config: Any = None) -> list[str]:
    """The stages of window ``kind`` for the run's pipeline ``config`` (:data:`WINDOWS`, or :data:`CHUNKED_WINDOWS`
    when ``config.chunks.count`` is not ``off``).

    Raises:
        KeyError: ``kind`` is not a stage window.
    """
    chunked = config is not None and config.chunks.count != "off"
    return list((CHUNKED_WINDOWS if chunked else WINDOWS)[kind])


def shard_args(start: int, end: int) -> list[str]:
    """The extract stage's arguments for one fleet shard, samples ``[start, end)``: ``--shard START:END``
    (:mod:`eagle3ops.stages.shards`)."""
    return ["--shard", f"{int(start)}:{int(end)}"]


def node_args(count: int, rank: int, rendezvous: str) -> list[str]:
    """The train stage's arguments for one node of a multi-node run: ``--nodes N --node-rank R
    --rendezvous HOST:PORT`` (:class:`eagle3ops.stages.train.Nodes`)."""
    return ["--nodes", str(int(count)), "--node-rank", str(int(rank)), "--rendezvous", rendezvous]


def run_dir(run: str) -> str:
    """The pipeline run directory inside stage containers."""
    return f"{DATA_MOUNT}/runs/{run}"


def ulimits(host: HostConfig) -> list[dict[str, Any]]:
    """Ulimits of stage containers (docker SDK ``Ulimit`` dicts): the inventory's ``stage_ulimits`` (name →
    ``soft:hard`` or one value for both), else unlimited ``memlock`` on GPU hosts (NCCL), else none.

    Raises:
        ValueError: a value that is not an integer or ``soft:hard`` of integers (names the inventory key).
    """
    if host.stage_ulimits is None:
        return [{"Name": "memlock", "Soft": -1, "Hard": -1}] if host.gpus else []
    out = []
    for name, value in host.stage_ulimits.items():
        soft, _, hard = str(value).partition(":")
        try:
            out.append({"Name": name, "Soft": int(soft), "Hard": int(hard or soft)})
        except ValueError:
            raise ValueError(f"hosts.{host.name}.stage_ulimits.{name}: {value!r} is not an integer or "
                             f"`soft:hard` of integers (-1 = unlimited)") from None
    return out


def stage_spec(host: HostConfig, *, image: str, stage: str, run: str, window_id: str) -> dict[str, Any]:
    """Container spec for one pipeline stage (docker SDK ``containers.run`` kwargs, JSON-serialisable).

    The stage sees the host's ``data_dir`` at ``/data`` and the target model at ``/model`` (read-only), runs on the
    host network, gets the inventory's ``stage_env`` exactly, all GPUs when the host has any, and the inventory's
    ``stage_runtime``, ``stage_ipc``, ``stage_shm_size`` and :func:`ulimits` (defaults on GPU hosts: what NCCL needs
    for multi-GPU, ``ipc=host`` and unlimited memlock). Preflight runs a throwaway container from this same spec
    (:func:`trial_spec`) before serving stops.
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
    if host.stage_runtime:
        spec["runtime"] = host.stage_runtime
    ipc = host.stage_ipc or ("host" if host.gpus else None)
    if ipc:
        spec["ipc_mode"] = ipc
    if host.stage_shm_size:
        spec["shm_size"] = host.stage_shm_size
    if lim := ulimits(host):
        spec["ulimits"] = lim
    return spec


#: Seconds preflight's throwaway stage container may take (engine start, image, ``import torch``) before it counts as
#: failed; it is removed afterwards either way.
TRIAL_TIMEOUT_S = 120


def trial_command(gpus: int, data: str = DATA_MOUNT, model: str = MODEL_MOUNT) -> list[str]:
    """Arguments to ``python3`` in preflight's throwaway stage container: the mounts are there, and on GPU hosts
    ``torch.cuda.device_count()`` sees at least ``gpus`` devices (exit 3 otherwise); GPU hosts also print the CUDA
    architectures the image's torch was built for (``cuda archs sm_90 sm_100 ...``, from
    ``torch.cuda.get_arch_list()``), which preflight compares with the GPUs' compute capability."""
    code = (f"import os,sys; ok=os.path.isdir({data!r}) and os.path.isdir({model!r}); "
            f"print('mounts', 'ok' if ok else {f'missing: {data} or {model}'!r}); ")
    if gpus:
        code += (f"import torch; n=torch.cuda.device_count(); print('cuda devices', n); "
                 f"print('cuda archs', ' '.join(torch.cuda.get_arch_list())); "
                 f"sys.exit(0 if ok and n >= {int(gpus)} else 3)")
    else:
        code += "sys.exit(0 if ok else 3)"
    return ["-c", code]


def trial_name(window_id: str) -> str:
    """Container name of preflight's throwaway stage container (:func:`trial_spec`)."""
    return f"eagle3ops-{window_id}-preflight"


def chunk_plan_name(window_id: str) -> str:
    """Container name of the chunked run's throwaway plan container (:func:`chunk_plan_argv`)."""
    return f"eagle3ops-{window_id}-chunkplan"


def trial_spec(host: HostConfig, *, image: str, run: str, window_id: str, stage: str) -> dict[str, Any]:
    """The spec of preflight's throwaway container: :func:`stage_spec` of ``stage`` exactly (image, device request,
    runtime, ipc, shm, ulimits, env, mounts, network, labels), with its own name and :func:`trial_command` as
    command."""
    spec = stage_spec(host, image=image, stage=stage, run=run, window_id=window_id)
    spec["name"] = trial_name(window_id)
    spec["command"] = trial_command(host.gpus)
    return spec


def trial_argv(host: HostConfig, spec: dict[str, Any]) -> Change:
    """``docker run --rm`` argv of preflight's throwaway container (:func:`trial_spec`): the argv the stage
    container's spec gives (:func:`eagle3ops.commands.serving.run_argv`, the one builder for both), attached and
    removed on exit instead of detached."""
    return Change(run_argv(host, spec, remove=True))


def chunk_plan_argv(host: HostConfig, *, image: str, run: str, window_id: str) -> Change:
    """``docker run --rm`` argv of a throwaway container that prints stage ``chunked``'s plan without running it
    (``--dry-run``: reads the run's prepare/, the target's config and the free space; writes nothing): the chunked
    stage's own container spec without its GPU request, attached and removed on exit."""
    spec = stage_spec(host, image=image, stage="chunked", run=run, window_id=window_id)
    spec["name"] = chunk_plan_name(window_id)
    spec["command"] = [*spec["command"], "--dry-run"]
    spec["device_requests"] = []
    return Change(run_argv(host, spec, remove=True))


#: The labels every supervisor container carries (:func:`supervisor_argv`): its role, and the window it runs.
SUPERVISOR_ROLE_LABEL = "io.eagle3ops.role=supervisor"
WINDOW_LABEL = "io.eagle3ops.window"


def left_supervisors(host: HostConfig) -> Read:
    """The supervisor containers that ended (``exited``, ``dead``) on the host's engine, one ``NAME<TAB>WINDOW``
    line each (the window from its :data:`WINDOW_LABEL` label)."""
    return containers_by_label(host, SUPERVISOR_ROLE_LABEL, ("exited", "dead"),
                             '{{.Names}}\t{{.Label "%s"}}' % WINDOW_LABEL)


def supervisor_name(window_id: str) -> str:
    """Container name of a window's supervisor."""
    return f"eagle3ops-supervisor-{window_id}"


#: Seconds `docker stop` gives the supervisor to stop a stage and bring serving back (start, not the full gate).
SUPERVISOR_STOP_TIMEOUT_S = 120


def supervisor_argv(host: HostConfig, *, image: str, window_id: str, plan_path: str) -> Change:
    """``docker run -d`` argv that starts the host-side supervisor for a window.

    The supervisor gets the engine socket, the state and data dirs at the same paths as on the host, host
    networking (health checks on 127.0.0.1), the serving API key file when the inventory names one (read-only), and a
    restart policy so a Docker daemon restart resumes it.
    """
    sock = socket_path(host)
    # The secret file of the serving API key (if any), read-only at the same path: the gate reads it on the host.
    secret = host.serving.api_key_file
    secret_mount = ["--volume", f"{secret}:{secret}:ro"] if secret else []
    return Change(docker(
        host, "run", "--detach", "--name", supervisor_name(window_id), "--network", "host",
        "--restart", "on-failure:5",
        # On `docker stop` the supervisor stops the running stage (up to 10 s) and restores serving before it exits.
        "--stop-timeout", str(int(SUPERVISOR_STOP_TIMEOUT_S)),
        "--label", SUPERVISOR_ROLE_LABEL, "--label", f"{WINDOW_LABEL}={window_id}",
        "--volume", f"{sock}:/var/run/docker.sock",
        "--volume", f"{host.state_dir}:{host.state_dir}",
        "--volume", f"{host.data_dir}:{host.data_dir}",
        *secret_mount,
        "--env", "PYTHONUNBUFFERED=1",
        "--entrypoint", "python3",
        image, "-m", "eagle3ops.supervisor", plan_path,
    ))
