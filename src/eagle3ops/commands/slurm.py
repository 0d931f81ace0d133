"""How ``render slurm``'s batch script runs a stage in the pinned image on each task (argv only, pure).

Three container runtimes, chosen in the inventory (``fleet.slurm_container``):

- ``pyxis`` (NVIDIA's SPANK plugin, enroot underneath): options of ``srun`` itself,
  ``--container-image=IMAGE --container-mounts=SRC:DST,...``; the task's environment passes into the container.
- ``apptainer``: a command prefix, ``apptainer exec [--nv] --bind SRC:DST,... docker://IMAGE``; Apptainer passes
  the task's environment by default.
- ``docker`` (sites that run Docker on their Slurm nodes): a command prefix, ``docker run --rm --network host
  --pid host --ipc host --label io.eagle3ops.job=NAME --entrypoint= -e NAME ... -v SRC:DST ... IMAGE``. The host's
  network, process and IPC namespaces, as pyxis/enroot and Apptainer share them by default: torchrun's rendezvous
  tells its agents apart by host name and pid, so two tasks on one node in two containers that were each pid 1
  would be one agent to it and the rendezvous would never complete (measured: a 2-task job on one node hung until
  cancelled); the IPC namespace gives NCCL and torch's workers the host's shared memory. Docker passes only the
  variables named with ``-e NAME`` (:data:`TASK_ENV`, their values taken from the task). The container is a child
  of the node's Docker engine, not of the Slurm task: Slurm's cgroups (CPU, memory and GPU confinement) do not apply
  to it, and a cancelled job's ``docker run`` may leave its container running: the label finds them (``docker ps
  --filter label=io.eagle3ops.job=NAME``). With GPUs it gets ``--gpus all`` and the task's ``CUDA_VISIBLE_DEVICES``
  (right where Slurm does not renumber the devices in a cgroup, i.e. without ``ConstrainDevices=yes``).

pyxis and Apptainer pull the image from a registry, so they need the registry's manifest digest
(``deployed.json``'s ``repo_digest``); Docker runs the image the node's engine holds, named by its image id
(``sha256:<hex>``, what ``eagle3ops deploy`` loads there) or by a registry manifest digest.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The inventory's choices (``fleet.slurm_container``).
RUNTIMES = ("pyxis", "apptainer", "docker")

#: Variables a ``docker`` task passes into its container by name (``-e NAME``: the value is the task's): the shard
#: plan and the task's shard index, Slurm's task identity and the rendezvous address.
TASK_ENV = ("EAGLE3OPS_SHARD_COUNT", "EAGLE3OPS_SHARD_RANGES", "EAGLE3OPS_SHARD_INDEX", "SLURM_JOB_ID",
            "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NODEID",
            "SLURM_LOCALID", "MASTER_ADDR", "MASTER_PORT")


def enroot_reference(image: str) -> str:
    """``image`` as pyxis/enroot name it: ``REGISTRY#REPOSITORY@DIGEST`` (enroot's ``docker://[REGISTRY#]IMAGE``
    URI; without ``#`` enroot reads the whole name on Docker Hub). The registry is the first path component when it
    has a ``.`` or ``:`` or is ``localhost`` (Docker's rule for reference names)."""
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return image


@dataclass(frozen=True)
class InImage:
    """How a task runs a command in the image: ``srun`` options (pyxis) and a command prefix (Apptainer, Docker);
    either may be empty. A task's line is ``srun [OPTIONS] <srun_options> <prefix> COMMAND``."""

    srun_options: tuple[str, ...]
    prefix: tuple[str, ...]


#: The label of the containers a ``docker`` task starts (its value: the job's name).
JOB_LABEL = "io.eagle3ops.job"


def in_image(runtime: str, image: str, mounts: list[tuple[str, str, bool]], *, gpus: int, job: str) -> InImage:
    """The ``runtime``'s way to run a command in ``image`` with ``mounts`` (``(host path, container path,
    read-only)``) and, when ``gpus`` > 0, the node's GPUs; ``job`` (the batch job's name) labels Docker's
    containers (:data:`JOB_LABEL`).

    Raises:
        ValueError: an unknown runtime (names the inventory key and the choices), or a mount path with a ``,`` or
            ``:`` (pyxis and Apptainer separate mounts with them).
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"fleet.slurm_container {runtime!r}: use one of {', '.join(RUNTIMES)}")
    for src, dst, _ in mounts:
        if any(c in p for p in (src, dst) for c in ",:"):
            raise ValueError(f"mount {src!r} -> {dst!r}: a path with ',' or ':' cannot be named in a container "
                             f"mount list; move the directory (hosts' data_dir / model_path)")
    spec = [f"{src}:{dst}{':ro' if ro else ''}" for src, dst, ro in mounts]
    if runtime == "pyxis":
        return InImage((f"--container-image={enroot_reference(image)}", f"--container-mounts={','.join(spec)}"), ())
    if runtime == "apptainer":
        return InImage((), ("apptainer", "exec", *(["--nv"] if gpus else []), "--bind", ",".join(spec),
                            f"docker://{image}"))
    env = [a for name in (*TASK_ENV, *(["CUDA_VISIBLE_DEVICES"] if gpus else [])) for a in ("-e", name)]
    vols = [a for s in spec for a in ("-v", s)]
    return InImage((), ("docker", "run", "--rm", "--network", "host", "--pid", "host", "--ipc", "host", "--label",
                        f"{JOB_LABEL}={job}", "--entrypoint=",
                        *(["--gpus", "all"] if gpus else []), *env, *vols, image))
