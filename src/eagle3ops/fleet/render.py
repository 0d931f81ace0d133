"""``eagle3ops render k8s|slurm RUN``: the run's stages for a scheduler, from jinja2 templates
(``templates/k8s-jobs.yaml.j2``, ``templates/slurm.sh.j2``; pure).

Both run what ``eagle3ops extract HOST...`` runs, from a prepared run (``stage prepare`` done; its sample count cut
into the shards): each task extracts its own shard, ``stage merge`` writes the shards' manifests as the run's
``extract/manifest.json`` (refusing any shard not finished), ``stage vocab``, and train only after extract and
vocab.

- **k8s**: two ``batch/v1`` Jobs. Extract: an Indexed Job (``completionMode: Indexed``), one completion per shard;
  each pod's ``EAGLE3OPS_SHARD_INDEX`` is its completion index (the ``batch.kubernetes.io/job-completion-index``
  annotation, through the downward API), ``activeDeadlineSeconds`` the host's ``stage_timeout_s``. Train: one pod
  whose init containers run ``merge`` then ``vocab``, in that order, before the ``train`` container. The order
  between the Jobs is documented in the file's head (apply extract, ``kubectl wait`` bounded by the same seconds,
  apply train): a train pod waiting in the cluster would hold its GPUs while extract needs them. Every pod mounts
  the run's data from a PersistentVolumeClaim (``fleet.k8s_claim`` or ``render --claim``; the model from the same
  claim below ``data_dir``, or from ``fleet.k8s_model_claim``): the pods of one Job land on different nodes, where a
  ``hostPath`` is another directory, so ``hostPath`` is refused. ``/dev/shm`` is a memory ``emptyDir`` of the
  host's ``stage_shm_size`` (the container runtime's default is 64 MiB: too small for NCCL and vLLM's workers); CPU
  requests and limits are the host's ``cpus``.
- **slurm**: a submit script for the login node: three ``sbatch`` jobs (their scripts on stdin): extract as a job
  array (``--array=0-N-1``, one node each; ``EAGLE3OPS_SHARD_INDEX=$SLURM_ARRAY_TASK_ID``), vocab beside it (it
  reads only prepare's samples), train with ``--dependency=afterok`` on every array task and on vocab: ``stage
  merge`` once, then torchrun with the c10d rendezvous on the first node (``fleet.rendezvous_port``);
  ``--kill-on-invalid-dep=yes``, so a failed extract or vocab cancels the train that waits on it. Every job and
  step asks ``--cpus-per-task`` = the host's ``cpus`` (srun does not inherit sbatch's since Slurm 22.05). The image
  through pyxis (``srun --container-image``), Apptainer (``apptainer exec docker://...``) or Docker (``docker run`` on
  the node's engine), as the inventory's ``fleet.slurm_container`` says (each runtime's argv:
  :mod:`eagle3ops.commands.slurm`; all three share the host's ``/dev/shm``). Docker names an engine image id as
  ``sha256:<hex>`` (Docker resolves ``repository@digest`` only through a registry's manifest digest); pyxis and
  Apptainer pull from a registry, and the script says so in a warning comment when the record has only the engine's
  image id.

The image is named by digest: ``<repository>@<digest>`` from the host's ``deployed.json`` (``repo_digest`` when the
record has one, else ``image_id``, the engine's image id: the config digest on Docker's classic store; the comment
at the top of the output says which). The shard ranges are passed as ``EAGLE3OPS_SHARD_RANGES`` (JSON) and
``EAGLE3OPS_SHARD_COUNT``, the task's index as ``EAGLE3OPS_SHARD_INDEX``: the extract stage resolves them as it does
``--shard`` (:func:`eagle3ops.stages.shards.resolve_shard`).
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from eagle3ops.commands import fleet as fc
from eagle3ops.commands import slurm as slc
from eagle3ops.commands.quote import render as shjoin
from eagle3ops.fleet.shard import Shard

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


#: Where :func:`image_by_digest` found the digest (its second value; the rendered file's first comment says it).
FROM_REPO_DIGEST = "registry manifest digest from deployed.json `repo_digest`"
FROM_IMAGE_ID = "engine image id (config digest) from deployed.json `image_id`"


class RenderError(ValueError):
    """The run cannot be rendered (no digest recorded, an unknown target); the message names the fix."""


def image_by_digest(deployed: dict[str, object]) -> tuple[str, str]:
    """``(repository@digest, where the digest came from)`` of a ``deployed.json`` record.

    Raises:
        RenderError: no ``image`` or no digest in the record (deploy first, or a record from an older version).
    """
    image = str(deployed.get("image") or "")
    for key, what in (("repo_digest", FROM_REPO_DIGEST), ("image_id", FROM_IMAGE_ID)):
        value = deployed.get(key)
        if isinstance(value, str) and "@" in value and key == "repo_digest":
            return value, what
        if isinstance(value, str) and _DIGEST.fullmatch(value) and image:
            repo = image.rsplit("@", 1)[0]
            repo = repo if ":" not in repo.rsplit("/", 1)[-1] else repo.rsplit(":", 1)[0]
            return f"{repo}@{value}", what
    raise RenderError(f"deployed.json names no image digest ({sorted(deployed)}): run `eagle3ops deploy HOST` "
                      f"first, so the pipeline image is pinned by digest")


@dataclass(frozen=True)
class RenderInput:
    """What both renderings need: run, image (by digest) and its source, shards, the data and model paths on the
    nodes, GPUs per node, training processes per node, the rendezvous port, the Slurm container runtime and the
    Kubernetes namespace; then CPUs per task (each task has its node: vLLM's and torchrun's workers share them),
    the ``/dev/shm`` size as a Kubernetes quantity (:func:`shm_quantity`), the PersistentVolumeClaims of the data
    and of the model (None: the model lies in the data claim, below ``data_dir``), training nodes (Slurm; 0: one
    per shard) and the longest a stage may run, in seconds (the extract Job's deadline and the documented wait)."""

    run: str
    image: str
    digest_source: str
    shards: tuple[Shard, ...]
    data_dir: str
    model_path: str
    gpus: int
    nproc: int
    port: int
    container: str
    namespace: str
    cpus: int = 0
    shm: str | None = None
    claim: str | None = None
    model_claim: str | None = None
    train_nodes: int = 0
    stage_timeout_s: float = 3600.0


_SIZE = re.compile(r"(\d+)([bkmg]?)b?", re.IGNORECASE)


def shm_bytes(size: str) -> int:
    """Bytes of a size in Docker's ``--shm-size`` form (``stage_shm_size``: an integer with an optional unit
    ``b``/``k``/``m``/``g``, binary multiples, as ``docker run`` reads it).

    Raises:
        RenderError: not that form (names the inventory key and an example).
    """
    m = _SIZE.fullmatch(size.strip())
    if not m or int(m.group(1)) <= 0:
        raise RenderError(f"stage_shm_size {size!r}: write a size as `docker run --shm-size` takes it, e.g. 16g")
    return int(m.group(1)) << {"": 0, "b": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def shm_quantity(size: str) -> str:
    """:func:`shm_bytes` of ``size`` as a Kubernetes quantity (``Gi``/``Mi``/``Ki``, the largest exact unit; else
    bytes). Raises RenderError as :func:`shm_bytes` does."""
    n = shm_bytes(size)
    for unit, shift in (("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    env.filters["shjoin"] = shjoin
    env.filters["shq"] = lambda s: shjoin([str(s)])
    return env


def _name(run: str) -> str:
    """A DNS-1123 name for the Jobs (lowercase alphanumerics and '-', ≤ 52 characters beside the suffixes)."""
    n = re.sub(r"[^a-z0-9-]+", "-", f"eagle3ops-{run}".lower()).strip("-")
    return n[:52].rstrip("-")


def _common(inp: RenderInput) -> dict[str, object]:
    if not inp.shards:
        raise RenderError("no shard to render: name at least one host")
    ranges = json.dumps([[s.start, s.end] for s in inp.shards], separators=(",", ":"))
    if inp.cpus < 1:
        raise RenderError("no CPUs per task: set the hosts' `cpus` in the inventory (the cores a task of the node may "
                          "use, e.g. cpus: 64): a task given one core runs vLLM's and torchrun's workers on it")
    return {"run": inp.run, "name": _name(inp.run), "run_label": _name(inp.run)[:63], "image": inp.image,
            "digest_source": inp.digest_source, "shards": list(inp.shards), "ranges": ranges,
            "extract_command": fc.stage_argv("extract", inp.run), "merge_command": fc.stage_argv("merge", inp.run),
            "vocab_command": fc.stage_argv("vocab", inp.run), "data_dir": inp.data_dir,
            "model_path": inp.model_path, "gpus": inp.gpus, "cpus": inp.cpus,
            "train_nodes": inp.train_nodes or len(inp.shards), "timeout_s": int(inp.stage_timeout_s)}


def _model_volume(inp: RenderInput) -> tuple[str, str | None]:
    """``(claim, subPath or None)`` of the target's weights: ``model_claim``, else the data claim with the model's
    path below ``data_dir``.

    Raises:
        RenderError: no model claim and the model outside ``data_dir`` (names both keys)."""
    if inp.model_claim:
        return inp.model_claim, None
    data, model = posixpath.normpath(inp.data_dir), posixpath.normpath(inp.model_path)
    if posixpath.commonpath([data, model]) != data or model == data:
        raise RenderError(f"model_path {inp.model_path} lies outside data_dir {inp.data_dir}, the claim "
                          f"{inp.claim}'s root: name the claim holding the target's weights in fleet.k8s_model_claim "
                          f"(or move the model below data_dir)")
    return str(inp.claim), posixpath.relpath(model, data)


def render_k8s(inp: RenderInput) -> str:
    """The Jobs as one multi-document YAML text (a warning comment when the record has only the engine's image id:
    the kubelet pulls by a registry's manifest digest).

    Raises:
        RenderError: no claim (a ``hostPath`` is another directory on each node the pods land on), no ``/dev/shm``
            size, no CPUs, or the model outside the claim without ``model_claim``.
    """
    if not inp.claim:
        raise RenderError("render k8s: the pods of a Job run on several nodes, where a hostPath volume is a "
                          "different directory on each (shards written apart, train reading none of them): name a "
                          "ReadWriteMany PersistentVolumeClaim holding data_dir in fleet.k8s_claim (or --claim)")
    if not inp.shm:
        raise RenderError("render k8s: no /dev/shm size (a pod's default is 64 MiB, too small for NCCL and vLLM's "
                          "workers): set the hosts' stage_shm_size in the inventory, e.g. 16g")
    model_claim, model_sub = _model_volume(inp)
    return _env().get_template("k8s-jobs.yaml.j2").render(
        **_common(inp), namespace=inp.namespace, train_command=fc.stage_argv("train", inp.run),
        registry_needed=inp.digest_source == FROM_IMAGE_ID, claim=inp.claim, model_claim=model_claim,
        model_sub=model_sub, shm=inp.shm)


def render_slurm(inp: RenderInput) -> str:
    """The submit script (bash, for the login node): the stages' batch jobs in the pinned image through the runtime
    ``inp.container`` names (module doc).

    Raises:
        RenderError: an unknown runtime, no CPUs, or a mount path the runtime cannot name.
    """
    if inp.container not in slc.RUNTIMES:
        raise RenderError(f"fleet.slurm_container {inp.container!r}: use one of {', '.join(slc.RUNTIMES)}")
    common = _common(inp)
    stage = fc.stage_argv("train", inp.run)
    by_id = inp.digest_source == FROM_IMAGE_ID
    # Docker runs what the node's engine holds: an engine image id is named as such (sha256:<hex>).
    image = inp.image.rsplit("@", 1)[1] if inp.container == "docker" and by_id else inp.image
    mounts = [(inp.data_dir, "/data", False), (inp.model_path, "/model", True)]
    try:  # the GPU stages' way into the image, and merge + vocab's (a job that asks for no GPU claims none)
        run, cpu = (slc.in_image(inp.container, image, mounts, gpus=g, job=str(common["name"])) for g in (inp.gpus, 0))
    except ValueError as exc:
        raise RenderError(str(exc)) from exc
    return _env().get_template("slurm.sh.j2").render(
        **common, nodes=len(inp.shards), port=inp.port, container=inp.container, runtime_image=image,
        registry_needed=by_id and inp.container != "docker",
        gpu_image=(list(run.srun_options), list(run.prefix)), cpu_image=(list(cpu.srun_options), list(cpu.prefix)),
        torchrun=fc.torchrun_c10d(inp.train_nodes or len(inp.shards), inp.nproc, str(common["name"])),
        train_args=stage[1:])
