"""``eagle3ops probe HOST`` as data: the host-probe container's ``docker run`` argv and the record paths.

Pure builders (no I/O); :mod:`eagle3ops.hostprobe` runs them through :class:`eagle3ops.remote.Remote`.
"""

from __future__ import annotations

from typing import Any

from eagle3ops.commands.docker import docker
from eagle3ops.commands.stages import stage_spec
from eagle3ops.commands.types import Change, Read
from eagle3ops.config import HostConfig


def probes_dir(host: HostConfig) -> str:
    """Where host-probe results live on the host: ``<state_dir>/probes``."""
    return f"{host.state_dir}/probes"


def legacy_dir(host: HostConfig) -> str:
    """Where versions before the rename (``eagle3ops verify HOST``) recorded them: ``<state_dir>/verify``; read,
    never written, so that a host deployed by an older version keeps its recorded pass."""
    return f"{host.state_dir}/verify"


def result_path(host: HostConfig, image_id: str, *, legacy: bool = False) -> str:
    """The recorded result for one image id: ``<state_dir>/probes/<id hex>.json`` (``sha256:`` stripped); with
    ``legacy`` the same name under :func:`legacy_dir`."""
    return f"{legacy_dir(host) if legacy else probes_dir(host)}/{image_id.split(':', 1)[-1]}.json"


def container_name(image_id: str) -> str:
    """Name of the host-probe container of an image (one at a time per image on a host)."""
    return f"eagle3ops-probe-{image_id.split(':', 1)[-1][:12]}"


def run_options(spec: dict[str, Any]) -> list[str]:
    """``docker run`` options equal to a stage container spec's settings (:func:`stage_spec`): environment, network,
    GPUs (``device_requests`` → ``--gpus all``), IPC mode and ulimits. Volumes, name and labels are not taken: the
    probes read nothing from the host."""
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


#: fraction of one GPU's memory the probe engines ask vLLM for (``gpu_memory_utilization`` in
#: eagle3ops.patches.probes); vLLM refuses to start when less than that is free on its GPU
PROBE_GPU_FRACTION = 0.5


def gpu_memory() -> Read:
    """``nvidia-smi`` query of each GPU's index, used and total memory (MiB), one CSV line per GPU."""
    return Read(["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"])


def parse_gpu_memory(output: str) -> list[tuple[int, int, int]]:
    """``[(index, used MiB, total MiB), ...]`` from :func:`gpu_memory`'s output.

    Raises:
        ValueError: a line is not ``index, used, total``.
    """
    rows = []
    for line in output.strip().splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) != 3:
            raise ValueError(f"unexpected nvidia-smi line {line!r} (expected: index, memory.used, memory.total)")
        rows.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return rows


def pick_gpu(rows: list[tuple[int, int, int]], fraction: float = PROBE_GPU_FRACTION) -> int | None:
    """The GPU (nvidia-smi index, PCI bus order) with the most free memory, if at least ``fraction`` of its total
    plus 5 % headroom is free; else None (production serving holds the GPUs: run the probes while it is stopped)."""
    best = max(rows, key=lambda r: r[2] - r[1], default=None)
    if best is None or (best[2] - best[1]) < (fraction + 0.05) * best[2]:
        return None
    return best[0]


def probe_argv(host: HostConfig, *, image: str, image_id: str, gpu: int | None = None) -> Change:
    """``docker run --rm`` of the pipeline image that runs its deferred probes (``python3 -m eagle3ops.hostprobe``:
    every applied patch's probe, on vLLM engines) with the stage containers' settings of this host: all
    GPUs, host IPC and unlimited memlock on a GPU host, the inventory's ``stage_env``, host network. ``image`` is
    pinned by id (``image_id``), so the probes run on exactly the deployed image. ``gpu`` (an nvidia-smi index,
    :func:`pick_gpu`) is made the engines' device with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (nvidia-smi's order) and
    ``CUDA_VISIBLE_DEVICES``."""
    spec = stage_spec(host, image=image, stage="probe", run="probe", window_id="probe")
    pick = ["--env", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "--env", f"CUDA_VISIBLE_DEVICES={gpu}"] if gpu is not None else []
    return Change(docker(host, "run", "--rm", "--name", container_name(image_id),
                  "--label", "io.eagle3ops.role=probe", "--label", f"io.eagle3ops.image={image}",
                  *run_options(spec), *pick, "--entrypoint", "python3", image_id, "-m", "eagle3ops.hostprobe"))
