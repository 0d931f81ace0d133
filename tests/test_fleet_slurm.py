"""``eagle3ops render slurm``'s submit script runs as written on a real local Slurm (Debian's slurmctld + slurmd 22.05
with munge; :mod:`eagle3ops_dev.slurmlocal`): two extract tasks each extract their own shard, vocab beside them, train
after all (merging the shards first), and the merged shards equal a one-host extract of the same samples.

What runs: the script exactly as rendered, with the ``docker`` runtime (``fleet.slurm_container: docker``): each step
runs ``docker run`` of the pipeline image, named by its image id, on this machine's build engine. pyxis/enroot and
Apptainer cannot run here: neither is packaged in Debian bookworm (nor is ``singularity-container``), so their lines
are checked by rendering only (``tests/test_fleet_render.py`` and the last assertions below).

The run: the tiny target (``eagle3ops.fixtures.tinymodel``: a random 4-layer Llama) and stage prepare (16 samples) made
before the jobs, in one container (what a site does before it submits; prepare's count cuts the shards). The cluster's
one node (3 CPUs as configured) takes the extract array's two tasks and vocab (1 CPU each) at once; each extract task
extracts its 8 samples with the transformers engine on CPU (the cheapest real engine), into the one run directory (a
host directory mounted as ``/data``, the shared filesystem). Then the train job: stage merge, then torchrun on the one
node with 2 processes (gloo on CPU, a 2-process FSDP2 job) for 3 steps. The reference: a one-host extract of a copy of
the prepared samples, in the container that prepared them; the merge is compared with it as the fleet's check does
(sample ids, token counts, every file's sha256: ``torch.save`` of equal tensors under the same file name writes the
same bytes).
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import time
from pathlib import Path

import docker
import pytest

from eagle3ops.commands import fleet as fc
from eagle3ops.commands.quote import render as shjoin
from eagle3ops.commands.slurm import JOB_LABEL
from eagle3ops.fleet.render import RenderInput, image_by_digest, render_slurm
from eagle3ops.fleet.shard import shard_ranges
from eagle3ops_dev import provision
from eagle3ops_dev.slurmlocal import LocalSlurm

RUN, REF = "slurm-ci", "slurm-ref"
SAMPLES = 16
#: The run: the stand-in target, 16 samples, 3 train steps with a checkpoint at step 2.
PIPELINE = {"target_model": "/model", "prepare": {"max_seq_len": 256, "max_samples": SAMPLES},
            "extract": {"engine": "transformers", "aux_layer_ids": [0, 1, 2]}, "vocab": {"draft_vocab_size": 256},
            "train": {"steps": 3, "checkpoint_every": 2, "batch_max_tokens": 512, "device": "cpu"}}
@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The local one-node cluster (3 CPUs as configured: the two extract tasks and vocab at once), stopped after the
    module."""
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"), cpus=3)
    try:
        yield cluster.start(timeout_s=120)  # bounded; generous on a loaded 2-core CI machine
    finally:
        cluster.stop()


def _in_container(image_id: str, data: Path, model: Path, steps: list[list[str]]) -> str:
    """``steps`` (argv each) one after another in one container of the pipeline image; its output."""
    script = " && ".join(shjoin(a) for a in steps)
    out = docker.from_env().containers.run(
        image_id, entrypoint=["bash", "-c"], command=[script], remove=True, network_mode="host",
        environment={"HF_HUB_OFFLINE": "1"},
        volumes={str(data): {"bind": "/data", "mode": "rw"}, str(model): {"bind": "/model", "mode": "rw"}})
    return out.decode(errors="replace")


def _prepared_run(image_id: str, root: Path) -> tuple[Path, Path]:
    """``(data dir, model dir)``: the stand-in target built and stage prepare done in one container of the pipeline
    image (what a site does before it submits); in the same container the reference: the prepared samples copied to
    run REF and extracted there on one host (no shard)."""
    data, model = root / "data", root / "model"
    for r in (RUN, REF):
        (data / "runs" / r).mkdir(parents=True)
        (data / "runs" / r / "pipeline.yaml").write_text(json.dumps(PIPELINE))
    model.mkdir()
    _in_container(image_id, data, model, [provision.tiny_model("/model", "llama"), fc.stage_argv("prepare", RUN),
                                          ["cp", "-a", f"/data/runs/{RUN}/prepare", f"/data/runs/{REF}/prepare"],
                                          fc.stage_argv("extract", REF)])
    return data, model


def test_rendered_slurm_jobs_extract_a_shard_per_task_merge_to_the_one_host_run_and_train(slurm, built_images,
                                                                                           tmp_path):
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
                      0, 2, port, "docker", "default", cpus=1, train_nodes=1)
    text = render_slurm(inp)
    # The container line names the pinned image by digest: the engine's image id (Docker runs what its engine holds).
    line = next(ln for ln in text.splitlines() if ln.startswith("IN_IMAGE=("))
    assert shlex.split(line[len("IN_IMAGE=("):-1])[-1] == built.image_id
    assert built.tag not in text  # never the moving tag
    script = tmp_path / "submit.sh"
    script.write_text(text)

    t1 = time.monotonic()
    try:  # the script as rendered: it submits the three jobs and prints their ids
        sub = subprocess.run(["bash", str(script)], cwd=tmp_path, env=slurm.env, capture_output=True, text=True,
                             timeout=60)
        assert sub.returncode == 0, sub.stdout + sub.stderr
        ids = re.fullmatch(r"extract (\d+) \(array of 2\), vocab (\d+), train (\d+)\n", sub.stdout)
        assert ids, sub.stdout
        extract, vocab, train = ids.groups()
        res = slurm.wait(train, timeout_s=480, since=t1, where=tmp_path)
    finally:  # a cancelled job's `docker run` leaves its container: found by the job's label
        for c in docker.from_env().containers.list(all=True, filters={"label": f"{JOB_LABEL}=eagle3ops-{RUN}"}):
            c.remove(force=True)
    logs = {p.name: p.read_text() for p in sorted(tmp_path.glob(f"eagle3ops-{RUN}-*.out"))}
    tail = "\n".join(f"--- {n}\n{t[-2500:]}" for n, t in logs.items())
    assert (res.state, res.returncode) == ("COMPLETED", 0), f"train job {train} {res.state}:\n{tail}"
    # two array tasks, each its own shard, both finished before vocab and train started (afterok)
    tasks = slurm.records(extract)
    assert sorted(r["ArrayTaskId"] for r in tasks) == ["0", "1"] and {r["JobState"] for r in tasks} == {"COMPLETED"}
    shards = sorted(re.search(r"extract: 8 samples of shard \[(\d+), (\d+)\)", logs[f"eagle3ops-{RUN}-extract-"
                                                                                     f"{extract}_{k}.out"]).groups()
                    for k in (0, 1))
    assert shards == [("0", "8"), ("8", "16")], tail
    (v,) = slurm.records(vocab)
    (t,) = slurm.records(train)
    ends = max(time.strptime(r["EndTime"], "%Y-%m-%dT%H:%M:%S") for r in [*tasks, v])
    assert v["JobState"] == "COMPLETED" and time.strptime(t["StartTime"], "%Y-%m-%dT%H:%M:%S") >= ends  # afterok
    assert "merge: 2 shards, 16 samples" in logs[f"eagle3ops-{RUN}-train-{train}.out"]
    run = data / "runs" / RUN
    for a, b in (("0", "8"), ("8", "16")):
        assert json.loads((run / f"extract/shards/{a}-{b}.json").read_text())["shard"] == {"start": int(a),
                                                                                          "end": int(b)}
    merged = json.loads((run / "extract/manifest.json").read_text())
    assert [(s["start"], s["end"]) for s in merged["fleet"]["shards"]] == [(0, 8), (8, 16)]

    # the merge equals a one-host extract of the same samples, as the fleet's check compares them: the same sample ids
    # and token counts, and every file byte for byte (sha256): the same token ids, loss masks and hidden states
    one = json.loads((data / "runs" / REF / "extract/manifest.json").read_text())
    assert "fleet" not in one and one["samples"] == SAMPLES and len(one["files"]) == SAMPLES
    assert merged["sample_files"] == one["sample_files"] and merged["tokens"] == one["tokens"]
    assert merged["files"] == one["files"]

    train_dir = run / "train"
    state = json.loads((train_dir / "checkpoints/step_00000002/state.json").read_text())
    assert state["step"] == 2 and state["world_size"] == 2  # one checkpoint of a 2-process training
    manifest = json.loads((train_dir / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["distributed"] == "FSDP2 fully_shard, gloo"
    assert manifest["inputs"]["extract"]  # trained on the merged manifest
    assert (train_dir / "final/model.safetensors").is_file()
    spans = [(f"{r['JobName'].rsplit('-', 1)[1]}{'_' + r['ArrayTaskId'] if 'ArrayTaskId' in r else ''}",
              r["StartTime"][11:], r["EndTime"][11:]) for j in (extract, vocab, train) for r in slurm.records(j)]
    print(f"model+prepare+one-host extract {t_prep:.1f} s; jobs {extract}/{vocab}/{train}: {res.seconds:.1f} s "
          f"({', '.join(f'{n} {a}-{b}' for n, a, b in spans)})")

    # pyxis and Apptainer, by rendering only (neither runs here): the same image by digest, as each names it.
    for runtime, expect in (("pyxis", f"--container-image={image}"), ("apptainer", f"docker://{image}")):
        other = render_slurm(RenderInput(**{**inp.__dict__, "container": runtime}))
        assert expect in other and "WARNING: " + runtime in other  # an engine image id is not a registry's digest
