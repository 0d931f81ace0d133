"""Memory and architecture preflight, with the numbers of the seeds' host: Kimi-K2.5 at TP 8 on 8 x RTX PRO
6000 Blackwell. The estimate is pure arithmetic (``window/estimate.py``); the preflight checks run against the
stand-in host of ``test_window_driver.py``, whose nvidia-smi and throwaway stage container answer with stand-ins.

STAND-IN values (what nvidia-smi would report on the seeds' host; not read from one here): ``memory.total`` 97,887
MiB and ``compute_cap`` 12.0 per GPU. Kimi-K2.5's config values are the published ones of moonshotai/Kimi-K2.5's
``config.json`` (``text_config``; the same in several public copies): hidden 7168, 61 layers, 64 heads, MLA
(q_lora_rank 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128), 384 routed experts of 2048 + 1 shared, 8
per token, the first layer dense (18432), vocab 163,840, bf16 with int4 routed experts (compressed-tensors, group
size 32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from eagle3ops.commands import host as hc
from eagle3ops.config import load_inventory
from eagle3ops.config.pipeline import PipelineConfig
from eagle3ops.window import estimate as est
from eagle3ops.window import run as wrun
from eagle3ops.window.common import PreflightFailed, WindowError
from test_window_driver import IMAGE, IMAGE_ID, Launched, StandInRemote, _host_with_serving

REPO = Path(__file__).resolve().parents[1]
KIMI_K25 = {
    "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "tie_word_embeddings": False,
    "text_config": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "torch_dtype": "bfloat16",
        "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
        "num_attention_heads": 64, "num_key_value_heads": 64, "n_routed_experts": 384, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "first_k_dense_replace": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 163840,
        "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": 32, "type": "int",
                                                           "strategy": "group", "symmetric": True}}}},
    },
}
#: STAND-IN: nvidia-smi --query-gpu=memory.total,compute_cap on 8 x RTX PRO 6000 Blackwell (96 GB, sm_120).
RTXPRO6000_MIB, RTXPRO6000_CAP = 97887, "12.0"
#: Read on the lent H200 machine (2026-12-01), not stand-ins: the nvidia-smi query preflight runs, and what the
#: throwaway stage container's one-liner printed there with torch 2.11.0+cu130.
H200_SMI = "143771, 9.0\n"
H200_TRIAL = "mounts missing: /data or /model\ncuda devices 1\ncuda archs sm_75 sm_80 sm_86 sm_90 sm_100 sm_120\n"
SEEDS_PIPELINE = REPO / "deploy/pipeline.kimi-k25-rtxpro6000.example.yaml"
H200_PIPELINE = REPO / "deploy/pipeline.kimi-k25.example.yaml"  # batch 64: sized for 141 GB GPUs


def _cfg(path: Path, **over) -> PipelineConfig:
    raw = yaml.safe_load(path.read_text())
    for section, values in over.items():
        raw.setdefault(section, {}).update(values)
    return PipelineConfig.model_validate(raw)


# ---- the estimate (pure) -------------------------------------------------------------------------------------------

def test_kimi_k25_shape_weights_and_kv_from_its_config():
    s = est.target_shape(KIMI_K25)
    assert s.mla and s.moe_layers == 60 and s.hidden_size == 7168 and s.vocab_size == 163840
    assert s.expert_bytes == 4 / 8 + 2 / 32 and s.linear_bytes == 2  # int4 + a bf16 scale per 32 weights
    sharded, replicated = est.weight_bytes(s, 8)
    # ~1.03 T parameters, 594 GB in all: the size of the published int4 checkpoint (~595 GB)
    assert 590e9 < sharded + replicated < 600e9
    assert 70.5 * est.GIB < sharded / 8 + replicated < 71.5 * est.GIB  # per GPU at TP 8
    # MLA caches one latent of 512 + 64 values per layer and token, the same on every rank
    assert est.kv_bytes_per_token(s, 8) == 61 * 576 * 2 == est.kv_bytes_per_token(s, 1)


def test_a_dense_gqa_target_shards_kv_heads():
    llama = {"hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "torch_dtype": "bfloat16"}
    s = est.target_shape(llama)
    assert not s.mla and s.moe_layers == 0
    assert est.kv_bytes_per_token(s, 1) == 32 * 2 * 8 * 128 * 2 and est.kv_bytes_per_token(s, 8) == 32 * 2 * 128 * 2
    sharded, replicated = est.weight_bytes(s, 1)
    assert replicated == 0 and 15.5e9 < sharded < 16.5e9  # Llama-3.1-8B: 8.0 B parameters in bf16 (16.1 GB)


def test_extract_on_the_seeds_host_accepts_a_batch_of_16_and_refuses_the_h200_examples_64():
    s, gpus = est.target_shape(KIMI_K25), [RTXPRO6000_MIB] * 8
    accept = est.extract_memory(s, _cfg(SEEDS_PIPELINE), gpus=8)
    assert accept.ranks == 8
    assert accept.parts["kv cache"] == 16 * 4097 * 61 * 576 * 2
    ok, line = est.memory_fits(accept, gpus, 0.85)
    assert ok, line
    assert "= 79.6 GiB per GPU" in line and "budget 0.85 × 97887 MiB = 81.3 GiB" in line
    refuse = est.extract_memory(s, _cfg(H200_PIPELINE), gpus=8)
    ok, line = est.memory_fits(refuse, gpus, 0.85)
    assert not ok
    assert "= 92.4 GiB per GPU" in line and "over by 11.2 GiB" in line and "extract.batch_size" in line
    # the same batch fits 8 x H200 (memory.total 143,771 MiB: H200_SMI, read on a real H200)
    assert est.memory_fits(refuse, [hc.parse_gpu_memory_and_capability(H200_SMI)[0][0]] * 8, 0.85)[0]


def test_train_on_the_seeds_host_fits_over_8_ranks_not_on_one():
    s, gpus = est.target_shape(KIMI_K25), [RTXPRO6000_MIB] * 8
    fsdp = est.train_memory(s, _cfg(SEEDS_PIPELINE), gpus=8)
    assert fsdp.ranks == 8 and est.memory_fits(fsdp, gpus, 0.85)[0]
    one = est.train_memory(s, _cfg(SEEDS_PIPELINE, train={"nproc": 1, "batch_max_tokens": 32768}), gpus=8)
    ok, line = est.memory_fits(one, gpus, 0.85)
    assert not ok and "train.batch_max_tokens" in line and "on 1 GPU(s)" in line
    # more ranks than GPUs: said as such
    ok, line = est.memory_fits(fsdp, gpus[:4], 0.85)
    assert not ok and "needs 8 GPUs, nvidia-smi reports 4" in line


def test_train_estimate_bounds_the_measured_h200_peak():
    """A hidden-4096 head on one GPU, 4k-token batches: measured 16.5 GB peak on an H200 (config/pipeline.py's
    `train.compile` note); the estimate, before the runtime overhead, is above it and within 10 %."""
    llama = {"hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8}
    cfg = PipelineConfig.model_validate({"target_model": "/m", "train": {"batch_max_tokens": 4096, "nproc": 1}})
    t = est.train_memory(est.target_shape(llama), cfg, gpus=1)
    tensors = t.total - est.RUNTIME_OVERHEAD_BYTES
    assert 16.5e9 < tensors < 16.5e9 * 1.1


def test_architecture_refusal_names_both_and_torchs_rule_is_mirrored():
    ok, line = est.arch_check([RTXPRO6000_CAP] * 8, ["sm_90", "sm_100"])
    assert not ok
    assert "sm_120 (compute_cap 12.0)" in line and "built for sm_90 sm_100" in line
    assert est.arch_check([RTXPRO6000_CAP], ["sm_80", "sm_90", "sm_100", "sm_120", "compute_120"])[0]
    # torch: "backward compatible within major version" — sm_100 kernels run on a B300 (sm_103)
    assert est.arch_check(["10.3"], ["sm_90", "sm_100"])[0]
    assert not est.arch_check(["10.0"], ["sm_90a", "compute_100"])[0]  # PTX entries are not counted, as in torch


def test_real_h200_answers_parse_and_pass_the_architecture_check():
    from eagle3ops.window.gpucheck import trial_arch_list

    gpus = hc.parse_gpu_memory_and_capability(H200_SMI)
    archs = trial_arch_list(H200_TRIAL)
    assert gpus == [(143771, "9.0")] and archs == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    assert est.arch_check([c for _, c in gpus], archs) == (
        True, "GPUs sm_90 (compute_cap 9.0); image built for sm_75 sm_80 sm_86 sm_90 sm_100 sm_120")
    assert est.arch_check([RTXPRO6000_CAP], archs)[0]  # that torch build also carries sm_120 kernels


def test_nvidia_smi_query_argv_and_parse():
    assert hc.gpu_memory_and_capability() == ["nvidia-smi", "--query-gpu=memory.total,compute_cap",
                                              "--format=csv,noheader,nounits"]
    assert hc.parse_gpu_memory_and_capability("97887, 12.0\n97887, 12.0\n") == [(97887, "12.0")] * 2
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        hc.parse_gpu_memory_and_capability("[N/A], 12.0\n")


# ---- preflight on the stand-in host ------------------------------------------------------------------------------

def _gpu_world(archs: str, gpus: int = 8):
    """The sandbox inventory entry with 8 GPUs over the stand-in host: Kimi-K2.5's config.json, nvidia-smi
    answering the STAND-IN figures, and a throwaway stage container that prints ``archs``."""
    host = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox").model_copy(update={"gpus": gpus})
    world = _host_with_serving(host)
    world.files[f"{host.model_path}/config.json"] = json.dumps(KIMI_K25)
    world.files[f"{host.data_dir}/datasets/chat.jsonl"] = "{}\n" * 10
    world.trial_answer = (0, f"mounts ok\ncuda devices {gpus}\ncuda archs {archs}\n", "")
    world.smi_calls, world.smi = [], (0, f"{RTXPRO6000_MIB}, {RTXPRO6000_CAP}\n" * gpus, "")
    inner = world.__call__

    class World(type(world)):
        def __call__(self, argv, stdin):
            if argv[0] == "nvidia-smi":
                self.smi_calls.append(list(argv))
                return self.smi
            return inner(argv, stdin)

    world.__class__ = World
    world.on_launch = lambda name: (_ for _ in ()).throw(Launched(name))
    return host, world


def _extract(host, world, pipeline: Path):
    return wrun.run_window(StandInRemote(host, world), kind="extract", image=IMAGE, expected_image_id=IMAGE_ID,
                           command="t", run="seeds", pipeline_text=pipeline.read_text())


def test_preflight_refuses_the_h200_batch_and_an_sm90_sm100_image_before_the_stop():
    host, world = _gpu_world("sm_90 sm_100")
    with pytest.raises(PreflightFailed) as e:
        _extract(host, world, H200_PIPELINE)
    msg = str(e.value)
    assert "nothing was stopped" in msg
    mem = next(ln for ln in msg.splitlines() if ln.startswith("  - gpu memory:"))
    assert "extract:" in mem and "over by 11.2 GiB" in mem and "97887 MiB" in mem
    arch = next(ln for ln in msg.splitlines() if ln.startswith("  - gpu architecture:"))
    assert "sm_120 (compute_cap 12.0)" in arch and "sm_90 sm_100" in arch
    assert world.smi_calls == [hc.gpu_memory_and_capability()]
    assert not [w for w in world.writes if "eagle3ops-supervisor-" in w], "serving would stop"


def test_preflight_passes_the_seeds_pipeline_on_an_image_with_sm120():
    host, world = _gpu_world("sm_80 sm_90 sm_100 sm_120")
    # preflight passed: the supervisor starts (the window would stop serving now)
    with pytest.raises(WindowError, match="started on the host"):
        _extract(host, world, SEEDS_PIPELINE)
    assert any("eagle3ops-supervisor-" in w and " run " in w for w in world.writes)
    assert len(world.trials) == 1 and "get_arch_list" in world.trials[0][-1]


def test_preflight_names_a_missing_nvidia_smi():
    host, world = _gpu_world("sm_120")
    world.smi = (127, "", "bash: nvidia-smi: command not found")
    with pytest.raises(PreflightFailed) as e:
        _extract(host, world, SEEDS_PIPELINE)
    assert "gpu memory: cannot read the GPUs' memory and compute capability" in str(e.value)
    assert "nvidia-smi: command not found" in str(e.value)
