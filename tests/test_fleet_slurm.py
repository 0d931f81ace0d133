"""Issue 30, done-when (4), Slurm half: ``eagle3ops render slurm``'s batch script runs as a 2-task job on a real
local Slurm (Debian's slurmctld + slurmd 22.05 with munge; :mod:`eagle3ops_dev.slurmlocal`) and trains.

What runs: the script exactly as rendered, with the ``docker`` runtime (``fleet.slurm_container: docker``): each
``srun`` task runs ``docker run`` of the pipeline image, named by its image id, on this machine's build engine.
pyxis/enroot and Apptainer cannot run here: neither is packaged in Debian bookworm (nor is ``singularity-container``),
so their lines are checked by rendering only (``tests/test_fleet_render.py`` and the last assertions below).

The job: two shards ("nodes" of torchrun's c10d rendezvous) placed as two tasks on the cluster's one node (2 CPUs):
sbatch's ``--nodes=1 --ntasks-per-node=2`` on its command line take precedence over the script's ``#SBATCH`` lines,
the only change to what was rendered. Step extract finds the stage done (prepare, extract and vocab ran before the job,
in one container; the stage does not read its shard yet, issue 29); step train runs torchrun on both tasks, gloo on
CPU, a 2-process FSDP2 job on the tiny stand-in target (``eagle3ops_dev.tinymodel``: a random 4-layer Llama) for 3
steps, and writes its checkpoints into the run directory (a host directory mounted as ``/data``).
"""

from __future__ import annotations

import json
import shlex
import socket
import time
from pathlib import Path

import docker
import pytest

from eagle3ops.commands.quote import render as shjoin
from eagle3ops.commands import fleet as fc
from eagle3ops.commands.slurm import JOB_LABEL
from eagle3ops.fleet.render import RenderInput, image_by_digest, render_slurm
from eagle3ops.fleet.shard import shard_ranges
from eagle3ops_dev import provision
from eagle3ops_dev.slurmlocal import LocalSlurm

RUN = "slurm-ci"
SAMPLES = 16
#: The run: the stand-in target, 16 samples, 3 train steps with a checkpoint at step 2.
PIPELINE = {"target_model": "/model", "prepare": {"max_seq_len": 256, "max_samples": SAMPLES},
            "extract": {"engine": "transformers", "aux_layer_ids": [0, 1, 2]}, "vocab": {"draft_vocab_size": 256},
            "train": {"steps": 3, "checkpoint_every": 2, "batch_max_tokens": 512, "device": "cpu"}}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The local one-node cluster (2 CPUs), stopped after the module."""
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"), cpus=2)
    try:
        yield cluster.start(timeout_s=120)  # bounded; generous on a loaded 2-core CI machine
    finally:
        cluster.stop()


def _prepared_run(image_id: str, root: Path) -> tuple[Path, Path]:
    """``(data dir, model dir)``: the stand-in target built and stages prepare, extract and vocab done in one
    container of the pipeline image (what a site does before the scheduled training)."""
    data, model = root / "data", root / "model"
    run = data / "runs" / RUN
    run.mkdir(parents=True)
    model.mkdir()
    (run / "pipeline.yaml").write_text(json.dumps(PIPELINE))
    steps = [provision.tiny_model("/model", "llama"),
             *(fc.stage_argv(s, RUN) for s in ("prepare", "extract", "vocab"))]
    script = " && ".join(shjoin(a) for a in steps)
    docker.from_env().containers.run(
        image_id, entrypoint=["bash", "-c"], command=[script], remove=True, network_mode="host",
        environment={"HF_HUB_OFFLINE": "1"},
        volumes={str(data): {"bind": "/data", "mode": "rw"}, str(model): {"bind": "/model", "mode": "rw"}})
    assert (run / "vocab/manifest.json").is_file()
    return data, model


def test_rendered_slurm_script_trains_as_a_two_task_job_in_the_pinned_image(slurm, built_images, tmp_path):
    _, built = built_images
    t0 = time.monotonic()
    data, model = _prepared_run(built.image_id, tmp_path)
    t_prep = time.monotonic() - t0
    record = {"image": built.tag, "image_id": built.image_id}  # what `eagle3ops deploy` records
    image, source = image_by_digest(record)
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inp = RenderInput(RUN, image, source, tuple(shard_ranges(SAMPLES, ["node-a", "node-b"])), str(data), str(model),
                      0, 1, port, "docker", "default")
    text = render_slurm(inp)
    # The container line names the pinned image by digest: the engine's image id (Docker runs what its engine holds).
    line = next(ln for ln in text.splitlines() if ln.startswith("IN_IMAGE=("))
    assert shlex.split(line[len("IN_IMAGE=("):-1])[-1] == built.image_id
    assert built.tag not in line  # never the moving tag
    script = tmp_path / "job.sh"
    script.write_text(text)

    try:
        res = slurm.sbatch(script, nodes=1, ntasks_per_node=2, chdir=tmp_path, timeout_s=480)
    finally:  # a cancelled job's `docker run` leaves its container: found by the job's label
        for c in docker.from_env().containers.list(all=True, filters={"label": f"{JOB_LABEL}=eagle3ops-{RUN}"}):
            c.remove(force=True)
    out = tmp_path / f"eagle3ops-{RUN}-{res.job}.out"
    log = out.read_text() if out.exists() else "(no job output)"
    assert (res.state, res.returncode) == ("COMPLETED", 0), f"job {res.job} {res.state}:\n{log[-4000:]}"
    assert log.count("extract: already done for these inputs") == 2  # both tasks ran the extract step
    train = data / "runs" / RUN / "train"
    state = json.loads((train / "checkpoints/step_00000002/state.json").read_text())
    assert state["step"] == 2 and state["world_size"] == 2  # one checkpoint of a 2-process (2-task) training
    manifest = json.loads((train / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["distributed"] == "FSDP2 fully_shard, gloo"
    assert (train / "final/model.safetensors").is_file()
    print(f"prepare+extract+vocab {t_prep:.1f} s; job {res.job}: {res.seconds:.1f} s")

    # pyxis and Apptainer, by rendering only (neither runs here): the same image by digest, as each names it.
    for runtime, expect in (("pyxis", f"--container-image={image}"), ("apptainer", f"docker://{image}")):
        other = render_slurm(RenderInput(**{**inp.__dict__, "container": runtime}))
        assert expect in other and "WARNING: " + runtime in other  # an engine image id is not a registry's digest
