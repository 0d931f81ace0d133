"""``eagle3ops render k8s|slurm RUN``: the run's stages for a scheduler, from jinja2 templates
(``templates/k8s-jobs.yaml.j2``, ``templates/slurm.sh.j2``; pure).

- **k8s**: two ``batch/v1`` Jobs: extract as an Indexed Job (``completionMode: Indexed``, one completion per shard,
  ``JOB_COMPLETION_INDEX`` = shard rank), train as one pod; ``hostPath`` volumes for ``data_dir`` and ``model_path``.
- **slurm**: one batch script: ``srun`` per stage, train through torchrun with the c10d rendezvous on the first node
  (``fleet.rendezvous_port``); the image through pyxis (``srun --container-image``), Apptainer (``apptainer exec
  docker://...``) or Docker (``docker run`` on the node's engine), as the inventory's ``fleet.slurm_container``
  says (each runtime's argv: :mod:`eagle3ops.commands.slurm`). Docker names an engine image id as ``sha256:<hex>``
  (Docker resolves ``repository@digest`` only through a registry's manifest digest); pyxis and Apptainer pull from
  a registry, and the script says so in a warning comment when the record has only the engine's image id.

The image is named by digest: ``<repository>@<digest>`` from the host's ``deployed.json`` (``repo_digest`` when the
record has one, else ``image_id``, the engine's image id: the config digest on Docker's classic store; the comment
at the top of the output says which). The shard ranges are passed as ``EAGLE3OPS_SHARD_RANGES`` (JSON) and
``EAGLE3OPS_SHARD_COUNT``; the extract stage does not read them yet (issue 29's shard-aware stage).
"""

from __future__ import annotations

import json
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
    Kubernetes namespace."""

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
    return {"run": inp.run, "name": _name(inp.run), "run_label": _name(inp.run)[:63], "image": inp.image,
            "digest_source": inp.digest_source, "shards": list(inp.shards), "ranges": ranges,
            "extract_command": fc.stage_argv("extract", inp.run), "data_dir": inp.data_dir,
            "model_path": inp.model_path, "gpus": inp.gpus}


def render_k8s(inp: RenderInput) -> str:
    """The Jobs as one multi-document YAML text (a warning comment when the record has only the engine's image id:
    the kubelet pulls by a registry's manifest digest)."""
    return _env().get_template("k8s-jobs.yaml.j2").render(
        **_common(inp), namespace=inp.namespace, train_command=fc.stage_argv("train", inp.run),
        registry_needed=inp.digest_source == FROM_IMAGE_ID)


def render_slurm(inp: RenderInput) -> str:
    """The batch script (bash): the stages in the pinned image through the runtime ``inp.container`` names."""
    if inp.container not in slc.RUNTIMES:
        raise RenderError(f"fleet.slurm_container {inp.container!r}: use one of {', '.join(slc.RUNTIMES)}")
    common = _common(inp)
    stage = fc.stage_argv("train", inp.run)
    by_id = inp.digest_source == FROM_IMAGE_ID
    # Docker runs what the node's engine holds: an engine image id is named as such (sha256:<hex>).
    image = inp.image.rsplit("@", 1)[1] if inp.container == "docker" and by_id else inp.image
    try:
        run = slc.in_image(inp.container, image, [(inp.data_dir, "/data", False), (inp.model_path, "/model", True)],
                          gpus=inp.gpus, job=str(common["name"]))
    except ValueError as exc:
        raise RenderError(str(exc)) from exc
    return _env().get_template("slurm.sh.j2").render(
        **common, nodes=len(inp.shards), port=inp.port, container=inp.container, runtime_image=image,
        registry_needed=by_id and inp.container != "docker", srun_options=list(run.srun_options),
        prefix=list(run.prefix),
        torchrun=fc.torchrun_c10d(len(inp.shards), inp.nproc, str(common["name"])), train_args=stage[1:])
