"""The inventory and pipeline examples for a real 8-GPU Kimi-K2.5 host (issue 17): `config check` accepts them, and
the commands built from them (stage containers, the serving container) carry the GPU flags and environment exactly."""

from pathlib import Path

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
