"""The seeds' host as an inventory example: 8 x RTX PRO 6000 Blackwell on PCIe, vLLM 0.16 + speculators
in one virtualenv served as a plain process, the seeds' NCCL environment. Checked offline: `config check` accepts
it, and the stage containers built from it carry exactly that environment (no `NCCL_P2P_LEVEL: NVL`, which would
switch peer-to-peer off on a host without NVLink)."""

import re
from pathlib import Path

import yaml
from typer.testing import CliRunner

from eagle3ops.cli import app
from eagle3ops.commands.stages import WINDOWS, stage_spec
from eagle3ops.config import load_inventory
from eagle3ops.config.pipeline import PipelineConfig

REPO = Path(__file__).resolve().parents[1]
INVENTORY = REPO / "deploy/hosts.kimi-k25-rtxpro6000.example.yaml"
PIPELINE = REPO / "deploy/pipeline.kimi-k25-rtxpro6000.example.yaml"
SEEDS_NCCL = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
#: The seeds' serving command line as /proc/<pid>/cmdline shows it (NUL bytes as spaces), in its two usual forms:
#: the venv's `vllm` script started directly, and through the venv's interpreter.
SEEDS_CMDLINES = [
    "/root/ml-env/bin/vllm serve /workspace/models/Kimi-K2.5 --served-model-name kimi-k2.5 "
    "--tensor-parallel-size 8 --trust-remote-code --port 8000",
    "/root/ml-env/bin/python3 /root/ml-env/bin/vllm serve /workspace/models/Kimi-K2.5 --tensor-parallel-size 8 "
    "--trust-remote-code",
]


def test_config_check_accepts_the_seeds_host():
    res = CliRunner().invoke(app, ["config", "check", "-i", str(INVENTORY)])
    assert res.exit_code == 0, res.output
    assert "rtxpro-01" in res.output


def test_seeds_host_is_8_gpus_serving_kimi_as_a_process_matched_by_its_command_line():
    h = load_inventory(INVENTORY).host("rtxpro-01")
    assert h.gpus == 8 and h.user == "root"
    assert h.serving.kind == "process" and h.serving.served_model_name == "kimi-k2.5" and h.serving.port == 8000
    for cmdline in SEEDS_CMDLINES:  # pgrep -f's extended regex; this pattern reads the same in Python's re
        assert re.search(h.serving.process_match, cmdline), cmdline
        assert "--tensor-parallel-size 8" in cmdline and "--trust-remote-code" in cmdline
    assert not re.search(h.serving.process_match, "/root/ml-env/bin/vllm serve /models/Llama-3.1-8B")
    assert not re.search(h.serving.process_match, "/usr/bin/vllm serve /workspace/models/Kimi-K2.5")


def test_seeds_host_stage_containers_carry_the_seeds_nccl_env_and_no_nvlink_only_p2p():
    h = load_inventory(INVENTORY).host("rtxpro-01")
    assert {k: h.stage_env[k] for k in SEEDS_NCCL} == SEEDS_NCCL
    assert "NCCL_P2P_LEVEL" not in h.stage_env and "NCCL_P2P_DISABLE" not in h.stage_env
    for window, stages in WINDOWS.items():
        for stage in stages:
            spec = stage_spec(h, image="eagle3ops/pipeline:x", stage=stage, run="seeds", window_id=f"w-{window}")
            env = spec["environment"]
            assert {k: env[k] for k in SEEDS_NCCL} == SEEDS_NCCL and "NCCL_P2P_LEVEL" not in env
            assert spec["device_requests"] == [{"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}]
            assert spec["volumes"] == ["/workspace/eagle3ops:/data", "/workspace/models/Kimi-K2.5:/model:ro"]
    # the file says why NCCL_P2P_LEVEL is left out, in a comment (not a key)
    lines = INVENTORY.read_text().splitlines()
    nvl = [ln for ln in lines if "NCCL_P2P_LEVEL: NVL" in ln]
    assert nvl and all(ln.lstrip().startswith("#") for ln in nvl)
    assert any("switch P2P off" in ln for ln in lines)


def test_seeds_pipeline_example_validates_at_tp8():
    cfg = PipelineConfig.model_validate(yaml.safe_load(PIPELINE.read_text()))
    assert cfg.extract.tensor_parallel_size == 8 and cfg.extract.batch_size == 16
    assert cfg.effective_max_model_len() == 4097
    res = CliRunner().invoke(app, ["config", "check", "pipeline", str(PIPELINE)])
    assert res.exit_code == 0, res.output
