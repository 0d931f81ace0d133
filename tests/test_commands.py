"""Command builders are pure data; quoting happens once, in remote.render, so inventory values cannot inject."""

import shlex
import subprocess
from pathlib import Path

import pytest

from eagle3ops.commands import docker as dk
from eagle3ops.commands import serving as sv
from eagle3ops.commands import stages as st
from eagle3ops.config import load_inventory
from eagle3ops.remote import render

REPO = Path(__file__).resolve().parents[1]
EVIL = "x; touch /tmp/eagle3ops-pwned $(id) `id` 'q' \"dq\" \\ *"


@pytest.fixture
def host():
    return load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")


def test_docker_uses_endpoint(host):
    assert dk.image_id(host, "img:1")[:3] == ["docker", "-H", host.docker_host]


def test_render_rejects_non_str():
    with pytest.raises(TypeError, match="argv elements must be str"):
        render(["echo", 3])  # type: ignore[list-item]


def test_render_round_trips_hostile_values_through_a_real_shell(tmp_path):
    argv = ["printf", "%s\\n", EVIL, "a b", "", "$HOME"]
    out = subprocess.run(["sh", "-c", render(argv)], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:4] == [EVIL, "a b", "", "$HOME"]
    assert not Path("/tmp/eagle3ops-pwned").exists()


def test_serving_spec_with_hostile_values_stays_literal(host):
    h = host.model_copy(update={"serving": host.serving.model_copy(
        update={"args": ["--served-model-name", EVIL], "env": {"K": EVIL}})})
    argv = sv.run_argv(h, sv.container_spec(h, release=3))
    words = shlex.split(render(argv))
    assert words == argv
    assert EVIL in words and f"K={EVIL}" in words
    assert "io.eagle3ops.release=3" in words


def test_stage_spec_mounts_and_env(host):
    spec = st.stage_spec(host, image="p:1", stage="extract", run="r1", window_id="w")
    assert spec["command"] == ["-m", "eagle3ops", "stage", "extract", "--run-dir", "/data/runs/r1"]
    assert f"{host.data_dir}:/data" in spec["volumes"] and f"{host.model_path}:/model:ro" in spec["volumes"]
    assert spec["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert spec["device_requests"] == [] and "ipc_mode" not in spec
    gpu = host.model_copy(update={"gpus": 2, "stage_env": {"NCCL_PROTO": "Simple"}})
    gspec = st.stage_spec(gpu, image="p:1", stage="train", run="r1", window_id="w")
    assert gspec["environment"]["NCCL_PROTO"] == "Simple"
    assert gspec["ipc_mode"] == "host" and gspec["ulimits"][0]["Name"] == "memlock"


def test_supervisor_argv_mounts_socket(host):
    argv = st.supervisor_argv(host, image="p:1", window_id="w1", plan_path="/s/windows/w1/plan.json")
    assert "/var/lib/eagle3ops-sandbox/sandbox/docker.sock:/var/run/docker.sock" in argv
    assert argv[-4:] == ["p:1", "-m", "eagle3ops.supervisor", "/s/windows/w1/plan.json"]
    tcp = host.model_copy(update={"docker_host": "tcp://10.0.0.1:2375"})
    with pytest.raises(ValueError, match="docker_host"):
        st.supervisor_argv(tcp, image="p", window_id="w", plan_path="/p")


def test_compose_serving_is_found_by_labels_and_keeps_them(host):
    h = host.model_copy(update={"serving": host.serving.model_copy(
        update={"kind": "compose", "compose_project": "prod; rm -rf /", "compose_service": "vllm"})})
    argv = sv.find_container_argv(h)
    assert "label=com.docker.compose.project=prod; rm -rf /" in argv
    assert shlex.split(render(argv)) == argv
    spec = sv.container_spec(h, release=2)
    assert spec["name"] == "prod; rm -rf /-vllm-1"
    assert spec["labels"]["com.docker.compose.service"] == "vllm"
    assert spec["labels"]["com.docker.compose.oneoff"] == "False"
    plain = sv.container_spec(host, release=2)
    assert not any(k.startswith("com.docker.compose") for k in plain["labels"])
    assert "name=^/?vllm\\-serving$" in sv.find_container_argv(host)


def test_serving_cpuset_is_given_at_provisioning_kept_by_releases_and_checked(host):
    h = host.model_copy(update={"serving": host.serving.model_copy(update={"cpuset_cpus": "1"})})
    argv = sv.run_argv(h, sv.container_spec(h, release=1))
    assert argv[argv.index("--cpuset-cpus") + 1] == "1" and argv.index("--cpuset-cpus") < argv.index(h.serving.image)
    assert "--cpuset-cpus" not in sv.run_argv(host, sv.container_spec(host, release=1))
    # a release is the live container plus the change: the engine's CpusetCpus goes into the new container as it was
    live = {"Name": "/vllm-serving", "Config": {"Image": h.serving.image, "Cmd": list(h.serving.args), "Env": []},
            "HostConfig": {"CpusetCpus": "1", "NetworkMode": "host"}}
    new = sv.apply_change(sv.container_record(live), args=["--max-num-seqs", "8"], image="serving:2")
    body, _ = sv.create_request(new)
    assert body["HostConfig"]["CpusetCpus"] == "1" and body["Image"] == "serving:2"
    # config check: the inventory's set against the live one, by CPUs (0-1 is 0,1)
    assert not [d for d in sv.inventory_drift(h, live) if d.startswith("cpuset_cpus")]
    two = h.model_copy(update={"serving": h.serving.model_copy(update={"cpuset_cpus": "0,1"})})
    assert not [d for d in sv.inventory_drift(two, {**live, "HostConfig": {"CpusetCpus": "0-1"}})
                if d.startswith("cpuset_cpus")]
    drift = [d for d in sv.inventory_drift(h, {**live, "HostConfig": {"CpusetCpus": ""}}) if d.startswith("cpuset")]
    assert drift == ["cpuset_cpus: inventory 1, live every CPU (a release keeps the live set: `docker update "
                     "--cpuset-cpus`, then a release restarts vLLM on it)"]
