"""Behavioural probes for the patch series (``X-Eagle3ops-Probe`` names -> callables, :data:`PROBES`): speculators'
here, the vLLM series' greedy EAGLE-3 identity probes in :mod:`eagle3ops.patches.specprobes` and the Kimi-K2.5
probe in :mod:`eagle3ops.patches.kimiprobe` (registered below).

Each probe exercises the *installed* (patched) speculators against the installed vLLM on tiny, locally built
models (:mod:`eagle3ops.patches.fixtures`, the seam to :mod:`eagle3ops.fixtures.tinymodel`) and raises
:class:`ProbeFailed` naming the wrong behaviour; it returns None on success. No probe looks at log text.
``eagle3ops patch probe`` runs them (``PROBES``).

What the probes share (the engine cache, the reference forward, the error statistic and its tolerances,
:class:`ProbeFailed`, :data:`LAST_RUN`) is :mod:`eagle3ops.patches.probekit`, re-exported here; each probe module
takes it from there, never from this registry, so the registry imports every one of them without an import circle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3ops.patches.probekit import (
    DEEPSEEK_LAYERS,
    DENSE_TOLERANCE,
    LAST_RUN,
    LLAMA_LAYERS,
    MOE_DENSE_LAYER_TOLERANCE,
    MOE_TOLERANCE,
    ErrorStats,
    ProbeFailed,
    Tolerance,
    _check_results_basic,
    _engine,
    _Engine,
    _is_cpu_platform,
    _random_sequences,
    finish,
    hidden_state_errors,
    prepare,
    reference_layer_states,
    shutdown,
    warm,
)

__all__ = [
    "DENSE_TOLERANCE",
    "LAST_RUN",
    "MOE_DENSE_LAYER_TOLERANCE",
    "MOE_TOLERANCE",
    "PROBES",
    "ErrorStats",
    "ProbeFailed",
    "Tolerance",
    "hidden_state_errors",
    "finish",
    "prepare",
    "reference_layer_states",
    "shutdown",
    "warm",
]

#: speculators' MAX_NUM_SEQS is 32; the attribution probe sends more sequences than that.
ATTRIBUTION_NUM_SEQS = 40


def probe_tokenizer_remote_code() -> None:
    """0001: the generator loads a tokenizer that needs trust_remote_code (slow, auto_map class)."""
    from transformers import PreTrainedTokenizerFast

    t0 = time.monotonic()
    eng = _engine("llama-remote-code")
    tok = eng.generator.tokenizer
    cls = type(tok)
    if cls.__name__ != "TinyTokenizer" or not cls.__module__.startswith("transformers_modules"):
        raise ProbeFailed(
            f"generator.tokenizer is {cls.__module__}.{cls.__name__}, not the model's remote-code TinyTokenizer"
        )
    if isinstance(tok, PreTrainedTokenizerFast):
        raise ProbeFailed("generator.tokenizer is a fast tokenizer; the remote slow class was not used")
    ids = tok("probe text", add_special_tokens=False)["input_ids"]
    if tok.decode(ids) != "probe text" or tok.eos_token_id != 2:
        raise ProbeFailed(f"remote tokenizer does not round-trip text (ids {ids}) or eos id {tok.eos_token_id} != 2")
    LAST_RUN["tokenizer-remote-code"] = {"seconds": time.monotonic() - t0, "engine_start_s": eng.start_s}


def probe_vllm_api() -> None:
    """0002: the generator runs on the installed vLLM: scheduler + KV cache set up, generate() twice."""
    t0 = time.monotonic()
    gen = _engine("llama-remote-code").generator
    first = _random_sequences(5, 20, 60, seed=1)
    second = [first[2], *_random_sequences(3, 10, 40, seed=2)]
    try:
        r1 = gen.generate(first)
        r2 = gen.generate(second)
    except Exception as e:
        raise ProbeFailed(f"generate() on the installed vLLM failed: {type(e).__name__}: {e}") from e
    _check_results_basic(r1, first, len(LLAMA_LAYERS), "first generate()")
    _check_results_basic(r2, second, len(LLAMA_LAYERS), "second generate()")
    import torch

    for a, b in zip(r1[2]["hidden_states"], r2[0]["hidden_states"]):
        if not torch.allclose(a.float(), b.float(), atol=1e-2, rtol=1e-2):
            raise ProbeFailed("the same prompt gave different hidden states in the second generate() call")
    LAST_RUN["vllm-0.16-api"] = {"seconds": time.monotonic() - t0}


def probe_cpu_device() -> None:
    """0003: KV-cache sizing and cache release work without CUDA (CPU) or through torch.accelerator."""
    import torch

    t0 = time.monotonic()
    gen = _engine("llama-remote-code").generator
    num_blocks = gen.vllm_config.cache_config.num_gpu_blocks
    if not num_blocks or num_blocks <= 0:
        raise ProbeFailed(f"KV cache has {num_blocks} blocks")
    if _is_cpu_platform():
        if torch.cuda.is_available():
            raise ProbeFailed("vLLM runs on CPU but torch sees CUDA; cannot tell the CPU path was used")
        # The KV cache the generator configured must be what the CPU workers report they can hold
        # (VLLM_CPU_KVCACHE_SPACE), not 0 (no accelerator to query) nor a device query's figure.
        expected = min(gen.executor.determine_available_memory())
        kv_bytes = sum(t.size for t in gen.scheduler.kv_cache_config.kv_cache_tensors)
        if not (0 < kv_bytes <= expected and kv_bytes >= 0.9 * expected):
            raise ProbeFailed(f"KV cache holds {kv_bytes} bytes, the CPU workers report {expected} available")
    seqs = _random_sequences(2, 8, 16, seed=3)
    try:
        res = gen.generate(seqs)  # ends with the device cache release
    except Exception as e:
        raise ProbeFailed(f"generate() failed on this device: {type(e).__name__}: {e}") from e
    _check_results_basic(res, seqs, len(LLAMA_LAYERS), "cpu-device generate()")
    attn = _check_attention_path(_engine("llama-remote-code"), "cpu-device (tiny Llama)")
    LAST_RUN["cpu-device"] = {"seconds": time.monotonic() - t0, "kv_blocks": num_blocks, "attention": attn}


def _check_attention_path(eng: "_Engine", what: str) -> dict[str, Any]:
    """On vLLM's CPU platform: the attention kernel this probe engine ran is one that works on this CPU and the
    one CPU serving takes with eagle3ops' settings (bf16, :data:`eagle3ops.cpuattn.CPU_BLOCK_SIZE`), so a kernel
    that fails at serving's first request fails the build here instead (AMX machines: shared/FACTS.md).

    vLLM decides with its own ``_get_attn_isa`` on the engine's dtype and block size; returns what was checked.
    """
    if not _is_cpu_platform():
        return {}
    import json

    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from eagle3ops import cpuattn

    vc = eng.generator.vllm_config
    dtype, block = vc.model_config.dtype, vc.cache_config.block_size
    head = cpuattn.head_size(json.loads((eng.model_dir / "config.json").read_text()))
    flags = cpuattn.cpu_flags(Path("/proc/cpuinfo").read_text())
    ran = _get_attn_isa(dtype, block, head)
    serving = _get_attn_isa(dtype, cpuattn.CPU_BLOCK_SIZE, head)
    path = cpuattn.check(str(dtype).removeprefix("torch."), block, head, flags)
    if ran != path.isa:
        raise ProbeFailed(f"{what}: vLLM picked CPU attention kernel {ran!r}, eagle3ops.cpuattn predicts {path.isa!r}")
    if not path.supported:
        raise ProbeFailed(f"{what}: {path.describe()}")
    if ran != serving:
        raise ProbeFailed(f"{what}: the probe engine ran kernel {ran!r} but CPU serving (block size "
                          f"{cpuattn.CPU_BLOCK_SIZE}) takes {serving!r}: the probe does not cover serving's path")
    return {"isa": ran, "dtype": str(dtype), "block_size": block, "head_size": head, "amx": path.amx}


def probe_prefill_attribution() -> None:
    """0004: >32 sequences, chunked prefill: every sequence gets its own states, in input order.

    40 sequences of 200..500 tokens: more than ``max_num_seqs`` (32), and the first 32 alone hold more than the
    generator's default 8192-token step budget, so prompts are split between steps even without the probe
    engine's 256-token budget (with it, most prompts are chunked). Compared token by token with the transformers
    reference; result ``i`` must be sequence ``i``'s.
    """
    t0 = time.monotonic()
    eng = _engine("llama-remote-code")
    seqs = _random_sequences(ATTRIBUTION_NUM_SEQS, 200, 500, seed=4)
    if sum(map(len, seqs[:32])) <= 8192:
        raise AssertionError("attribution probe: the first 32 sequences must exceed 8192 tokens")
    try:
        res = eng.generator.generate(seqs)
    except Exception as e:
        raise ProbeFailed(f"generate() of {len(seqs)} sequences failed: {type(e).__name__}: {e}") from e
    _check_results_basic(res, seqs, len(LLAMA_LAYERS), "prefill-attribution")
    stats = hidden_state_errors(res, reference_layer_states(eng.model_dir, seqs, LLAMA_LAYERS))
    stats.check(DENSE_TOLERANCE, f"tiny Llama, {len(seqs)} sequences, chunked prefill")
    LAST_RUN["prefill-attribution"] = {"seconds": time.monotonic() - t0, "stats": stats}


def probe_deepseek_capture() -> None:
    """0005: DeepSeek-V3 (MLA + MoE) target: capture accepted and states match the reference."""
    t0 = time.monotonic()
    eng = _engine("deepseek-v3")
    seqs = _random_sequences(10, 20, 250, seed=5)
    try:
        res = eng.generator.generate(seqs)
    except Exception as e:
        raise ProbeFailed(f"generate() on tiny DeepSeek-V3 failed: {type(e).__name__}: {e}") from e
    _check_results_basic(res, seqs, len(DEEPSEEK_LAYERS), "deepseek-capture")
    refs = reference_layer_states(eng.model_dir, seqs, DEEPSEEK_LAYERS)
    stats = hidden_state_errors(res, refs)
    stats.check(MOE_TOLERANCE, "tiny DeepSeek-V3, all layers")
    dense = hidden_state_errors(
        [{**r, "hidden_states": r["hidden_states"][:1]} for r in res], [ref[:1] for ref in refs]
    )
    dense.check(MOE_DENSE_LAYER_TOLERANCE, "tiny DeepSeek-V3, dense layer 0")
    attn = _check_attention_path(eng, "deepseek-capture (tiny DeepSeek-V3)")
    LAST_RUN["deepseek-capture"] = {
        "attention": attn,
        "seconds": time.monotonic() - t0,
        "engine_start_s": eng.start_s,
        "stats": stats,
        "dense_layer0_stats": dense,
    }


def probe_eagle3_greedy_identity_llama() -> None:
    """vLLM stand-in series (CPU): greedy EAGLE-3 on the tiny Llama reproduces greedy output (see
    :mod:`eagle3ops.patches.specprobes`)."""
    from eagle3ops.patches.specprobes import probe_eagle3_greedy_identity_llama as probe

    probe()

def probe_ngram_greedy_identity_llama() -> None:
    """vLLM stand-in series (CPU), 0002: greedy n-gram (prompt lookup) speculation on the tiny Llama reproduces greedy
    output and moves the spec-decode counters (see :mod:`eagle3ops.patches.specprobes`)."""
    from eagle3ops.patches.specprobes import probe_ngram_greedy_identity_llama as probe

    probe()


def probe_eagle3_greedy_identity_deepseek() -> None:
    """vLLM series 0001: the tiny DeepSeek-V3 target serves with a Llama-style EAGLE-3 draft, greedy output
    reproduced up to the first near-tie (see :mod:`eagle3ops.patches.specprobes`)."""
    from eagle3ops.patches.specprobes import probe_eagle3_greedy_identity_deepseek as probe

    probe()


def probe_eagle3_greedy_identity_kimi() -> None:
    """vLLM series 0001: the tiny Kimi-K2.5-class target (remote code, vision off) serves in float32 with a
    Llama-style EAGLE-3 draft, greedy output identical (see :mod:`eagle3ops.patches.specprobes`)."""
    from eagle3ops.patches.specprobes import probe_eagle3_greedy_identity_kimi as probe

    probe()


def probe_kimi_k25_targets() -> None:
    """speculators series: Kimi-K2.5 targets (tiny ``kimi-k25``): the generator runs the text backbone alone with
    the vision modality off, states match the ``language_model.*`` reference, the draft head reads the verifier's
    tensors under ``language_model.`` (see :mod:`eagle3ops.patches.kimiprobe`)."""
    from eagle3ops.patches.kimiprobe import probe_kimi_k25_targets as probe

    probe()


PROBES: dict[str, Callable[[], None]] = {
    "tokenizer-remote-code": probe_tokenizer_remote_code,
    "vllm-0.16-api": probe_vllm_api,
    "cpu-device": probe_cpu_device,
    "prefill-attribution": probe_prefill_attribution,
    "deepseek-capture": probe_deepseek_capture,
    # vLLM series (serving): each starts its own two engines (without and with the draft), none shared
    "eagle3-greedy-identity-llama": probe_eagle3_greedy_identity_llama,
    "ngram-greedy-identity-llama": probe_ngram_greedy_identity_llama,
    "eagle3-greedy-identity-deepseek": probe_eagle3_greedy_identity_deepseek,
    "eagle3-greedy-identity-kimi": probe_eagle3_greedy_identity_kimi,
    # speculators series: Kimi-K2.5 targets (shares the engine cache above)
    "kimi-k25-targets": probe_kimi_k25_targets,
}
