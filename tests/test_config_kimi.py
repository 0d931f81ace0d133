"""The inventory and pipeline examples for a real 8-GPU Kimi-K2.5 host: `config check` accepts them, and
the commands built from them (stage containers, the serving container) carry the GPU flags and environment exactly."""

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from eagle3ops.cli import app
from eagle3ops.commands.serving import container_spec, run_argv
from eagle3ops.commands.stages import WINDOWS, stage_spec
from eagle3ops.config import load_inventory
from eagle3ops.config.pipeline import PipelineConfig

REPO = Path(__file__).resolve().parents[1]
INVENTORY = REPO / "deploy/hosts.kimi-k25.example.yaml"
PIPELINE = REPO / "deploy/pipeline.kimi-k25.example.yaml"
NCCL = {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring", "NCCL_NVLS_ENABLE": "0", "NCCL_P2P_LEVEL": "NVL",
        "NCCL_DEBUG": "WARN"}


def test_config_check_accepts_the_kimi_example():
    res = CliRunner().invoke(app, ["config", "check", "-i", str(INVENTORY)])
    assert res.exit_code == 0, res.output
    assert "kimi-01" in res.output


def test_kimi_host_stage_containers_get_every_gpu_ipc_memlock_and_the_stage_env_exactly():
    h = load_inventory(INVENTORY).host("kimi-01")
    assert h.gpus == 8
    for window, stages in WINDOWS.items():
        for stage in stages:
            spec = stage_spec(h, image="eagle3ops/pipeline:x", stage=stage, run="kimi", window_id=f"w-{window}")
            assert spec["device_requests"] == [{"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}]
            assert spec["ipc_mode"] == "host" and spec["network_mode"] == "host"
            assert spec["ulimits"] == [{"Name": "memlock", "Soft": -1, "Hard": -1}]
            env = spec["environment"]
            assert {k: env[k] for k in NCCL} == NCCL
            assert env["EAGLE3OPS_PREPARE_PROCS"] == "16" and env["HF_HUB_OFFLINE"] == "1"
            assert set(env) == set(h.stage_env) | {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "PYTHONUNBUFFERED"}
            assert spec["volumes"] == ["/mnt/nvme/eagle3ops:/data", "/mnt/nvme/models/Kimi-K2.5:/model:ro"]


def test_kimi_serving_argv_carries_tp8_gpus_shm_and_nccl_env():
    h = load_inventory(INVENTORY).host("kimi-01")
    argv = run_argv(h, container_spec(h, release=1))
    joined = " ".join(argv)
    assert "--gpus all" in joined and "--shm-size 64g" in joined
    assert "--tensor-parallel-size 8" in joined and "--trust-remote-code" in joined
    for k, v in NCCL.items():
        assert f"--env {k}={v}" in joined
    assert argv[argv.index("vllm/vllm-openai:v0.16.0") + 1] == "/models/Kimi-K2.5"


def test_kimi_pipeline_example_validates_with_tp8_and_32000_draft_ids():
    cfg = PipelineConfig.model_validate(yaml.safe_load(PIPELINE.read_text()))
    assert cfg.extract.tensor_parallel_size == 8 and cfg.vocab.draft_vocab_size == 32000
    assert cfg.target_model == "/model" and cfg.effective_max_model_len() == 4097


def test_kimi_window_dry_run_commands_carry_gpu_flags_and_env_exactly():
    """What `--dry-run` prints for the supervisor's part of an extract and a train window on the Kimi host (the
    plan and its docker-CLI equivalents are pure: no SSH): each stage's `docker run` carries `--gpus all`,
    `--ipc host`, `--ulimit memlock=-1:-1` and exactly the stage environment."""
    from eagle3ops.commands.quote import render
    from eagle3ops.window.planner import build_plan, supervisor_commands

    h = load_inventory(INVENTORY).host("kimi-01")
    want_env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **h.stage_env}
    for kind, stages in WINDOWS.items():
        plan = build_plan(h, kind="window", window_id=f"w-{kind}", image="eagle3ops/pipeline:t", command=kind,
                          run="kimi", stages=stages, user="ops")
        cmds = supervisor_commands(h, plan)
        assert cmds[0][-4:] == ["stop", "--time", "300", "vllm-kimi"] and cmds[-2][-2:] == ["start", "vllm-kimi"]
        runs = cmds[1:-2]
        assert len(runs) == len(stages)
        for stage, argv in zip(stages, runs):
            line = render(argv)
            assert "--gpus all" in line and "--ipc host" in line and "--ulimit memlock=-1:-1" in line, line
            env = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--env")
            assert env == want_env, stage
            assert argv[-6:] == ["-m", "eagle3ops", "stage", stage, "--run-dir", "/data/runs/kimi"]


def _unreachable_inventory(tmp_path: Path) -> Path:
    """The Kimi example with a hostname that cannot resolve and an SSH port nothing listens on."""
    raw = yaml.safe_load(INVENTORY.read_text())
    raw["hosts"]["kimi-01"].update(hostname="kimi-01.invalid", port=9)
    inv = tmp_path / "hosts.yaml"
    inv.write_text(yaml.safe_dump(raw))
    return inv


@pytest.fixture()
def no_network(monkeypatch):
    """Any SSH client or socket connection fails the test (an offline dry run opens none)."""
    import socket

    import eagle3ops.remote

    def refuse(*a, **k):
        raise AssertionError("an offline dry run tried to connect")

    monkeypatch.setattr(eagle3ops.remote.Remote, "__init__", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.mark.parametrize("kind", ["extract", "train"])
def test_offline_dry_run_of_the_kimi_host_prints_stage_argv_with_gpus_and_nccl_env_exactly(tmp_path, no_network, kind):
    inv = _unreachable_inventory(tmp_path)
    h = load_inventory(inv).host("kimi-01")
    res = CliRunner().invoke(app, [kind, "kimi-01", "-i", str(inv), "--pipeline", str(PIPELINE), "--run", "kimi",
                                   "--dry-run", "--offline", "--restart"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert "#   assumed gpus: 8 (inventory `gpus`; not counted on the host)" in lines
    assert any(ln.startswith("#   assumed free space: unknown") for ln in lines)
    assert any(ln.startswith("#   assumed serving container: vllm-kimi (inventory `serving`") for ln in lines)
    assert "#   assumed extract tensor parallel: 8 (pipeline extract.tensor_parallel_size)" in lines
    stage_lines = [ln for ln in lines if ln.startswith("docker run --detach --name eagle3ops-")]
    assert [ln.split(" -m eagle3ops stage ")[1].split()[0] for ln in stage_lines] == WINDOWS[kind]
    for ln in stage_lines:
        argv = ln.split()
        assert argv[argv.index("--gpus") + 1] == "all" and argv[argv.index("--ipc") + 1] == "host"
        assert argv[argv.index("--ulimit") + 1] == "memlock=-1:-1"
        envs = {a.partition("=")[0]: a.partition("=")[2] for a, flag in zip(argv[1:], argv) if flag == "--env"}
        assert {k: envs[k] for k in NCCL} == NCCL
        assert {k: v for k, v in envs.items() if k in h.stage_env} == h.stage_env
    assert stage_lines[-1].endswith(f"{WINDOWS[kind][-1]} --run-dir /data/runs/kimi --restart")
    stop, start = lines.index("docker stop --time 300 vllm-kimi"), lines.index("docker start vllm-kimi")
    assert stop < lines.index(stage_lines[0]) and lines.index(stage_lines[-1]) < start
    serving = next(ln for ln in lines if ln.startswith("#   docker run --detach --name vllm-kimi "))
    assert "--gpus all" in serving and "--shm-size 64g" in serving and "--tensor-parallel-size 8" in serving


def test_offline_without_dry_run_is_refused(tmp_path, no_network):
    inv = _unreachable_inventory(tmp_path)
    res = CliRunner().invoke(app, ["train", "kimi-01", "-i", str(inv), "--pipeline", str(PIPELINE), "--offline"])
    assert res.exit_code == 2
    assert "--offline needs --dry-run" in res.output


def test_offline_dry_run_of_a_chunked_kimi_run_plans_prepare_then_vocab_and_chunked(tmp_path, no_network):
    """With `chunks.count: auto` window extract only prepares, and window train runs vocab and stage
    chunked (extract + train chunk by chunk) with the same stage container settings."""
    inv = _unreachable_inventory(tmp_path)
    cfg = yaml.safe_load(PIPELINE.read_text())
    cfg["chunks"] = {"count": "auto"}
    chunked = tmp_path / "pipeline.chunked.yaml"
    chunked.write_text(yaml.safe_dump(cfg))
    got = {}
    for kind in ("extract", "train"):
        res = CliRunner().invoke(app, [kind, "kimi-01", "-i", str(inv), "--pipeline", str(chunked), "--run", "kimi",
                                       "--dry-run", "--offline"])
        assert res.exit_code == 0, res.output
        lines = res.output.splitlines()
        got[kind] = [ln.split(" -m eagle3ops stage ")[1].split()[0] for ln in lines
                     if ln.startswith("docker run --detach --name eagle3ops-")]
        if kind == "train":
            assert any("stage chunked extracts and trains chunk by chunk" in ln for ln in lines)
            assert any(ln.endswith("chunked --run-dir /data/runs/kimi") and "--gpus all" in ln for ln in lines)
    assert got == {"extract": ["prepare"], "train": ["vocab", "chunked"]}


def test_the_chunk_plan_before_the_stop_is_a_throwaway_stage_container_without_gpus(tmp_path):
    """Window train of a chunked run prints stage chunked's plan (``--dry-run``) from a throwaway container
    with the stage's own mounts and environment but no GPU request (serving still holds them), removed on exit."""
    from eagle3ops.commands.stages import chunk_plan_argv

    h = load_inventory(_unreachable_inventory(tmp_path)).host("kimi-01")
    argv = list(chunk_plan_argv(h, image="img:1", run="kimi", window_id="w1").argv)
    assert argv[:3] == ["docker", "run", "--rm"] and "--detach" not in argv and "--gpus" not in argv
    assert argv[argv.index("--name") + 1] == "eagle3ops-w1-chunkplan"
    assert argv[-4:] == ["chunked", "--run-dir", "/data/runs/kimi", "--dry-run"]
    assert f"{h.data_dir}:/data" in argv
