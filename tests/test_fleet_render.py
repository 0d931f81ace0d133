"""``eagle3ops render k8s|slurm`` and the cross-node trial's argv and verdict, pure: no scheduler, no
torch."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from eagle3ops.cli import app
from eagle3ops.commands.fleet import trial_argv
from eagle3ops.fleet.trial import TAG, parse_trial
from eagle3ops.fleet.render import RenderError, RenderInput, image_by_digest, render_k8s, render_slurm
from eagle3ops.fleet.shard import shard_ranges

REPO = Path(__file__).resolve().parents[1]
DIGEST = "sha256:" + "ab" * 32
DEPLOYED = {"image": "eagle3ops/pipeline:1a2b3c", "image_id": DIGEST}


def _input(container: str = "pyxis", hosts=("n1", "n2", "n3")) -> RenderInput:
    image, source = image_by_digest(DEPLOYED)
    return RenderInput("big run", image, source, tuple(shard_ranges(10, list(hosts))), "/srv/data", "/srv/models/k",
                       8, 8, 29500, container, "ml", cpus=32, shm="16Gi", claim="e3-data", model_claim="e3-models")


def test_image_named_by_digest_from_the_deploy_record() -> None:
    assert image_by_digest(DEPLOYED) == (f"eagle3ops/pipeline@{DIGEST}",
                                         "engine image id (config digest) from " + "deploy" + "ed.json `image_id`")
    reg = {"image": "reg.example:5000/e3/pipeline:x", "image_id": DIGEST,
           "repo_digest": f"reg.example:5000/e3/pipeline@{DIGEST}"}
    assert image_by_digest(reg)[0] == f"reg.example:5000/e3/pipeline@{DIGEST}"
    assert image_by_digest({"image": "reg.example:5000/e3/pipeline:x", "image_id": DIGEST})[0] == \
        f"reg.example:5000/e3/pipeline@{DIGEST}"
    with pytest.raises(RenderError, match="eagle3ops deploy HOST"):
        image_by_digest({"image": "x:y", "image_id": None})


def test_k8s_jobs_are_an_indexed_extract_and_a_train_job_by_digest() -> None:
    docs = list(yaml.safe_load_all(render_k8s(_input())))
    assert [d["kind"] for d in docs] == ["Job", "Job"] and all(d["apiVersion"] == "batch/v1" for d in docs)
    ex, tr = docs
    assert ex["metadata"]["name"] == "eagle3ops-big-run-extract" and ex["metadata"]["namespace"] == "ml"
    assert ex["spec"]["completionMode"] == "Indexed" and ex["spec"]["completions"] == 3
    c = ex["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == f"eagle3ops/pipeline@{DIGEST}"
    assert c["command"] == ["python3", "-m", "eagle3ops", "stage", "extract", "--run-dir", "/data/runs/big run"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert json.loads(env["EAGLE3OPS_SHARD_RANGES"]) == [[0, 4], [4, 7], [7, 10]] and env["EAGLE3OPS_SHARD_COUNT"] == "3"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    vols = {v["name"]: v for v in ex["spec"]["template"]["spec"]["volumes"]}
    assert vols["data"]["persistentVolumeClaim"]["claimName"] == "e3-data"
    assert vols["model"]["persistentVolumeClaim"]["claimName"] == "e3-models"
    assert tr["spec"]["template"]["spec"]["containers"][0]["image"] == f"eagle3ops/pipeline@{DIGEST}"
    _validate_jobs(docs)
    assert "WARNING: the kubelet pulls" in render_k8s(_input())  # an engine image id is not a registry's digest
    reg = {"image": "reg.example:5000/e3/pipeline:x", "image_id": DIGEST,
           "repo_digest": f"reg.example:5000/e3/pipeline@{DIGEST}"}
    text = render_k8s(RenderInput(**{**_input().__dict__, **dict(zip(("image", "digest_source"),
                                                                       image_by_digest(reg)))}))
    assert "WARNING" not in text and f"image: \"reg.example:5000/e3/pipeline@{DIGEST}\"" in text
    _validate_jobs(list(yaml.safe_load_all(text)))


#: The Kubernetes version the Jobs are validated against (kubernetes-validate's bundled OpenAPI schemas, strict: no
#: field the schema does not define). 1.33: the first with Indexed Jobs' per-index backoff (``backoffLimitPerIndex``,
#: ``maxFailedIndexes``) generally available.
K8S_VERSION = "1.33.0"


def _validate_jobs(docs: list[dict]) -> None:
    """Each document against Kubernetes' own schema for its kind (kubernetes-validate, strict, :data:`K8S_VERSION`),
    and the Job names against what the API server adds to the schema: a DNS-1123 label of at most 63 characters
    (the name becomes the pods' ``batch.kubernetes.io/job-name`` label)."""
    import kubernetes_validate

    for d in docs:
        try:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{d['kind']} {d['metadata']['name']}: {'.'.join(map(str, exc.path))}: "
                                 f"{exc.message}") from exc
        name = d["metadata"]["name"]
        assert len(name) <= 63 and name.replace("-", "").isalnum() and name == name.lower()


def test_the_k8s_validator_is_strict_and_pinned() -> None:
    """The validator refuses what the API server would: a misspelled field, a wrong type (so a passing check means
    something)."""
    docs = list(yaml.safe_load_all(render_k8s(_input())))
    bad = json.loads(json.dumps(docs[0]))
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(AssertionError, match="imagePullPolicyy"):
        _validate_jobs([bad])
    bad = json.loads(json.dumps(docs[1]))
    bad["spec"]["completions"] = "one"
    with pytest.raises(AssertionError, match="completions"):
        _validate_jobs([bad])


def test_k8s_jobs_without_gpus_ask_for_none() -> None:
    docs = list(yaml.safe_load_all(render_k8s(RenderInput(**{**_input().__dict__, "gpus": 0}))))
    _validate_jobs(docs)
    assert all("nvidia.com/gpu" not in d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
               for d in docs)


@pytest.mark.parametrize("container", ["pyxis", "apptainer"])
def test_slurm_script_runs_srun_and_torchrun_in_the_pinned_image(container: str) -> None:
    text = render_slurm(_input(container))
    assert text.startswith("#!/bin/bash\n")
    head = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    assert "#SBATCH --nodes=3" in head and "#SBATCH --gpus-per-node=8" in head
    assert "MASTER_PORT=29500" in text and "export EAGLE3OPS_SHARD_RANGES='[[0,4],[4,7],[7,10]]'" in text
    image = f"eagle3ops/pipeline@{DIGEST}"
    if container == "pyxis":
        assert f"--container-image={image}" in text
    else:
        assert f"apptainer exec --nv --bind /srv/data:/data,/srv/models/k:/model:ro docker://{image}" in text
    extract = next(ln for ln in text.splitlines() if "stage extract" in ln)
    assert extract.endswith(shlex.join(["python3", "-m", "eagle3ops", "stage", "extract", "--run-dir",
                                        "/data/runs/big run"]))
    train = next(ln for ln in text.splitlines() if "torch.distributed.run" in ln)
    assert "--nnodes=3 --nproc-per-node=8 --rdzv-backend=c10d" in train
    assert '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" -m eagle3ops stage train' in train
    bash = shutil.which("bash")
    assert bash, "bash is needed to check the script's syntax"
    cp = subprocess.run([bash, "-n"], input=text, text=True, capture_output=True)
    assert cp.returncode == 0, cp.stderr


def test_render_cli_reads_a_deploy_record(tmp_path) -> None:
    inv = tmp_path / "hosts.yaml"
    raw = yaml.safe_load((REPO / "deploy/hosts.kimi-k25.example.yaml").read_text())
    raw["fleet"] = {"slurm_container": "apptainer", "rendezvous_port": 29999}
    inv.write_text(yaml.safe_dump(raw))
    dep = tmp_path / "record.json"
    dep.write_text(json.dumps(DEPLOYED))
    res = CliRunner().invoke(app, ["render", "slurm", "r1", "-H", "kimi-01", "-i", str(inv), "--record", str(dep),
                                   "--samples", "5"])
    assert res.exit_code == 0, res.output
    assert "MASTER_PORT=29999" in res.output and "docker://eagle3ops/pipeline@" + DIGEST in res.output
    assert "#SBATCH --cpus-per-task=128" in res.output  # the inventory's cpus of kimi-01
    k8s = ["render", "k8s", "r1", "-H", "kimi-01", "-i", str(inv), "--record", str(dep), "--samples", "5"]
    res = CliRunner().invoke(app, k8s)
    assert res.exit_code == 2 and "stage_shm_size" in res.output  # a pod's 64 MiB default is not taken
    raw["hosts"]["kimi-01"]["stage_shm_size"] = "32g"
    inv.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(app, k8s)
    assert res.exit_code == 2 and "hostPath" in res.output
    res = CliRunner().invoke(app, [*k8s, "--claim", "e3-data"])
    assert res.exit_code == 2 and "fleet.k8s_model_claim" in res.output  # the model lies outside data_dir
    raw["fleet"]["k8s_model_claim"] = "kimi-weights"
    inv.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(app, [*k8s, "--claim", "e3-data"])
    assert res.exit_code == 0, res.output
    shm = next(v for v in list(yaml.safe_load_all(res.output))[0]["spec"]["template"]["spec"]["volumes"]
               if v["name"] == "shm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    res = CliRunner().invoke(app, ["render", "nomad", "r1", "-H", "kimi-01", "-i", str(inv), "--record", str(dep),
                                   "--samples", "5"])
    assert res.exit_code == 2


def test_trial_argv_is_a_static_rendezvous_in_the_image() -> None:
    cmd = trial_argv(f"eagle3ops/pipeline@{DIGEST}", master_addr="10.0.0.1", port=29500, nnodes=3, node_rank=2,
                     timeout_s=60, docker_host="unix:///run/docker.sock")
    assert list(cmd) == ["docker", "-H", "unix:///run/docker.sock", "run", "--rm", "--network", "host", "--entrypoint",
                         "python3", f"eagle3ops/pipeline@{DIGEST}", "-m", "torch.distributed.run", "--nnodes=3",
                         "--nproc-per-node=1", "--node-rank=2", "--master-addr=10.0.0.1", "--master-port=29500",
                         "-m", "eagle3ops.fleet.trial", "--timeout-s=60"]
    with pytest.raises(ValueError, match=r"node rank must be in \[0, 3\)"):
        trial_argv("i", master_addr="a", port=1, nnodes=3, node_rank=3, timeout_s=1)


def test_trial_verdict_names_the_node_that_did_not_join() -> None:
    ok = {n: (0, "x\n" + TAG + json.dumps({"rank": i, "world": 3, "seen": [0, 1, 2]}))
          for i, n in enumerate(["a", "b", "c"])}
    res = parse_trial(["a", "b", "c"], ok)
    assert res.ok and res.unreachable == () and "every node reached" in res.message()
    timed_out = dict(ok, c=(1, "trial failed: DistStoreError: Timed out after 60 seconds waiting for clients"),
                     b=(0, TAG + json.dumps({"rank": 1, "world": 3, "seen": [0, 1]})))
    res = parse_trial(["a", "b", "c"], timed_out)
    assert not res.ok and res.unreachable == ("b", "c")
    assert "b, c cannot reach the rendezvous" in res.message() and "fleet.rendezvous_port" in res.message()
    assert any("DistStoreError" in d for d in res.detail)
    assert parse_trial(["a", "b"], {"a": ok["a"]}).unreachable == ("a", "b")  # a saw world 3, b gave nothing


def _in_image(text: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith("IN_IMAGE=("))
    return shlex.split(line[len("IN_IMAGE=("):-1])


def test_slurm_runtimes_name_the_image_by_digest_as_each_one_finds_it() -> None:
    """pyxis/enroot take a registry as ``REGISTRY#`` (else Docker Hub); Docker runs an engine image id as
    ``sha256:<hex>`` (``repository@<image id>`` would be looked up in a registry) or a registry's manifest digest;
    a runtime outside the three is refused naming the inventory key."""
    reg = {"image": "reg.example:5000/e3/pipeline:x", "image_id": DIGEST,
           "repo_digest": f"reg.example:5000/e3/pipeline@{DIGEST}"}
    image, source = image_by_digest(reg)
    by_repo = {**_input().__dict__, "image": image, "digest_source": source}
    pyxis = render_slurm(RenderInput(**{**by_repo, "container": "pyxis"}))
    assert f"--container-image=reg.example:5000#e3/pipeline@{DIGEST}" in pyxis and "WARNING" not in pyxis
    docker = render_slurm(RenderInput(**{**by_repo, "container": "docker"}))
    assert _in_image(docker)[-1] == f"reg.example:5000/e3/pipeline@{DIGEST}"
    by_id = render_slurm(_input("docker"))
    argv = _in_image(by_id)
    assert argv[-1] == DIGEST and "WARNING" not in by_id
    assert argv[:9] == ["docker", "run", "--rm", "--network", "host", "--pid", "host", "--ipc", "host"]
    assert "io.eagle3ops.job=eagle3ops-big-run" in argv and ["--gpus", "all"] == argv[argv.index("--gpus"):][:2]
    with pytest.raises(RenderError, match="fleet.slurm_container 'podman'"):
        render_slurm(_input("podman"))


# --- renders that run: a shard per task, a vocab step, train after both, CPUs, /dev/shm and a shared claim ---------

def _running(container: str = "pyxis", **over) -> RenderInput:
    """The 3-shard run with what a running render needs from the inventory: 32 CPUs a task, a 16 GiB ``/dev/shm``,
    the claim ``e3-data`` holding ``data_dir`` (the model inside it), 2 training nodes."""
    base = {**_input(container).__dict__, "model_claim": None, "train_nodes": 2, "model_path": "/srv/data/models/k",
            "stage_timeout_s": 7200.0}
    return RenderInput(**{**base, **over})


def _pod(job: dict) -> dict:
    return job["spec"]["template"]["spec"]



def test_k8s_jobs_carry_the_shard_index_shm_cpus_and_a_claim() -> None:
    text = render_k8s(_running())
    docs = list(yaml.safe_load_all(text))
    _validate_jobs(docs)
    ex, tr = docs
    assert ex["spec"]["completionMode"] == "Indexed" and ex["spec"]["completions"] == 3
    assert ex["spec"]["activeDeadlineSeconds"] == 7200
    c = _pod(ex)["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    # each pod's shard: its completion index, read by the stage with the ranges (the same path as --shard)
    assert env["EAGLE3OPS_SHARD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert json.loads(env["EAGLE3OPS_SHARD_RANGES"]["value"]) == [[0, 4], [4, 7], [7, 10]]
    assert env["EAGLE3OPS_SHARD_COUNT"]["value"] == "3"
    for pod in (_pod(ex), _pod(tr)):
        vols = {v["name"]: v for v in pod["volumes"]}
        assert not any("hostPath" in v for v in vols.values())  # per-node paths: never across nodes
        assert vols["data"]["persistentVolumeClaim"] == {"claimName": "e3-data"}
        assert vols["model"]["persistentVolumeClaim"] == {"claimName": "e3-data", "readOnly": True}
        assert vols["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
        for k in [*pod.get("initContainers", []), *pod["containers"]]:
            mounts = {m["name"]: m for m in k["volumeMounts"]}
            assert mounts["shm"]["mountPath"] == "/dev/shm" and mounts["data"]["mountPath"] == "/data"
            assert mounts["model"] == {"name": "model", "mountPath": "/model", "subPath": "models/k",
                                       "readOnly": True}
            assert k["resources"]["requests"]["cpu"] == 32 and k["resources"]["limits"]["cpu"] == 32
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    # train after extract: merge (refuses unfinished shards) and vocab run first, as init containers, in order
    inits = _pod(tr)["initContainers"]
    assert [i["name"] for i in inits] == ["merge", "vocab"]
    assert inits[0]["command"][3:5] == ["stage", "merge"] and inits[1]["command"][3:5] == ["stage", "vocab"]
    assert {e["name"]: e["value"] for e in inits[0]["env"]}["EAGLE3OPS_SHARD_RANGES"] == "[[0,4],[4,7],[7,10]]"
    assert _pod(tr)["containers"][0]["command"][3:5] == ["stage", "train"]
    assert "nvidia.com/gpu" not in inits[0]["resources"]["limits"]  # GPUs only where they are used
    # the documented order: extract applied, waited for (bounded), then train
    assert "kubectl apply -f FILE -l io.eagle3ops/stage=extract" in text
    assert "kubectl wait -n ml --for=condition=complete job/eagle3ops-big-run-extract --timeout=7200s" in text



def test_k8s_refuses_host_paths_and_a_model_outside_the_claim() -> None:
    with pytest.raises(RenderError, match="hostPath.*fleet.k8s_claim"):
        render_k8s(_running(claim=None))
    with pytest.raises(RenderError, match="model_path /srv/models/k.*fleet.k8s_model_claim"):
        render_k8s(_running(model_path="/srv/models/k"))
    docs = list(yaml.safe_load_all(render_k8s(_running(model_path="/srv/models/k", model_claim="e3-models"))))
    vols = {v["name"]: v for v in _pod(docs[0])["volumes"]}
    assert vols["model"]["persistentVolumeClaim"] == {"claimName": "e3-models", "readOnly": True}
    assert "subPath" not in _pod(docs[0])["containers"][0]["volumeMounts"][1]



@pytest.mark.parametrize("container", ["pyxis", "docker"])
def test_slurm_submits_an_extract_array_and_vocab_then_merge_and_train(container: str) -> None:
    text = render_slurm(_running(container))
    cp = subprocess.run([shutil.which("bash") or "bash", "-n"], input=text, text=True, capture_output=True)
    assert cp.returncode == 0, cp.stderr
    subs = [ln for ln in text.splitlines() if "$(sbatch " in ln]
    assert [ln.split("=", 1)[0] for ln in subs] == ["EXTRACT", "VOCAB", "TRAIN"]
    assert "--dependency" not in subs[1]  # vocab reads only prepare's samples: beside extract
    assert "--dependency=afterok:${EXTRACT}:${VOCAB}" in subs[2] and "--kill-on-invalid-dep=yes" in subs[2]
    extract, vocab, train = text.split("$(sbatch ")[1:]
    assert "#SBATCH --array=0-2" in extract and "#SBATCH --cpus-per-task=32" in extract
    assert "#SBATCH --nodes=1" in extract and "#SBATCH --gpus-per-node=8" in extract
    assert "export EAGLE3OPS_SHARD_INDEX=$SLURM_ARRAY_TASK_ID" in extract
    assert "export EAGLE3OPS_SHARD_RANGES='[[0,4],[4,7],[7,10]]'" in extract
    # srun (22.05+) does not inherit sbatch's --cpus-per-task: each step asks again
    steps = [ln for part in (extract, vocab, train) for ln in part.splitlines() if ln.startswith("srun ")]
    assert len(steps) == 4 and all("--cpus-per-task=32" in ln for ln in steps)
    assert "stage extract" in extract and "stage vocab" in vocab and "gpu" not in vocab.lower()
    assert "stage merge" in train and train.index("stage merge") < train.index("torch.distributed.run")
    assert "export EAGLE3OPS_SHARD_RANGES='[[0,4],[4,7],[7,10]]'" in train  # what merge merges
    assert "#SBATCH --nodes=2" in train and "--nnodes=2 --nproc-per-node=8" in train
    if container == "docker":  # the task's shard index passes into the container by name
        argv = _in_image(extract)
        assert argv[argv.index("EAGLE3OPS_SHARD_INDEX") - 1] == "-e"
