"""GPU memory per rank of the GPU stages and the GPUs' CUDA architecture against an image's (pure: no I/O).

Preflight (:mod:`eagle3ops.window.preflight`) reads the facts before serving stops — the target's ``config.json``,
the run's pipeline config, ``nvidia-smi --query-gpu=memory.total,compute_cap`` on the host and
``torch.cuda.get_arch_list()`` inside the throwaway stage container — and refuses a window whose stages cannot fit
or cannot run, naming the figures. Everything here is arithmetic on those facts; all sizes are bytes unless a name
says otherwise (``*_mib``: MiB as nvidia-smi reports them).

What is estimated, per GPU (per rank):

- **extract** (vLLM at tensor parallel size TP): ``weights / TP`` (+ the replicated part) + ``KV cache for the
  batch`` + ``activations of one forward step`` + :data:`RUNTIME_OVERHEAD_BYTES`; see :func:`extract_memory`.
- **train** (the draft head under FSDP over ``nproc`` ranks): ``head + AdamW states / nproc`` + ``the unsharded
  parameters of a forward`` + ``activations of one packed batch`` + :data:`RUNTIME_OVERHEAD_BYTES`; see
  :func:`train_memory`.

Both are estimates from the configs, built to be upper bounds for the parts they model (e.g. the draft's parameter
count is :func:`draft_param_count`'s bound); the constants are named below with what they stand for. They are not
measurements: a figure within a few GiB of the budget is a warning sign, not a guarantee either way.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from eagle3ops.stages.chunkplan import draft_param_count  # noqa: F401 - one formula (chunkplan's)

GIB = 2**30
MIB = 2**20

#: Bytes per value of the dtypes a ``config.json`` names (``torch_dtype`` / ``dtype``); unknown → 2 (bf16).
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8_e4m3fn": 1}
#: vLLM 0.16's per-step token budget when the generator passes none: ``max(8192, max_model_len)`` (speculators'
#: generator, as patched here, passes none; see ``stages/extract.py``).
VLLM_DEFAULT_BATCHED_TOKENS = 8192
#: Hidden-size-wide bf16 buffers alive per token during one decoder layer's forward in vLLM (residual, normed
#: input, attention output, MLP output, all-reduce buffers, ...): an assumed upper bound, not measured.
ACT_HIDDEN_COPIES = 8
#: Layers whose hidden states extraction keeps per token on the GPU until the step ends (3 aux + the last).
AUX_LAYERS_CAPTURED = 4
#: Hidden-size-wide bf16 activations kept for backward per token, per draft layer, per test-time-training step
#: (attention over 2H inputs, MLP, norms): an assumed upper bound. With it the estimate of a hidden-4096 head
#: (Llama-3.1-8B-sized, 4k-token batches, 1 layer, 3 ttt steps, one GPU) is ~17.8 GB before overhead, against the
#: 16.5 GB peak measured on an H200 (``train.compile`` in config/pipeline.py).
TRAIN_ACT_HIDDEN_COPIES = 20
#: Per rank, memory no tensor accounts for: CUDA context, NCCL buffers, cuBLAS workspaces, allocator slack. An
#: assumed figure (a CUDA context alone is ~0.5 GiB on recent GPUs), not measured here.
RUNTIME_OVERHEAD_BYTES = 2 * GIB
#: Bytes per trainable parameter while training: fp32 weights (4) + fp32 gradients (4) + AdamW's two fp32 moments
#: (8). Frozen parameters (embeddings, verifier lm_head) are fp32 weights only (4).
TRAIN_BYTES_PER_PARAM = 16
FROZEN_TRAIN_BYTES_PER_PARAM = 4


@dataclass(frozen=True)
class TargetShape:
    """What the memory estimate needs of a target, read from its ``config.json`` by :func:`target_shape`.

    Sizes are element counts; ``*_bytes`` are bytes per parameter (fractional for packed int4 with scales).
    MLA targets (DeepSeek-V3, Kimi-K2.5) have ``kv_lora_rank > 0``; MoE targets ``n_routed_experts > 0``.
    """

    hidden_size: int
    num_layers: int
    vocab_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    # MoE (DeepSeek-V3 names): routed and shared experts of moe_intermediate_size, the first
    # first_k_dense_replace layers dense.
    n_routed_experts: int = 0
    n_shared_experts: int = 0
    experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    first_k_dense_replace: int = 0
    # MLA (DeepSeek-V2/V3 names)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    #: bytes per value of activations, KV cache, embeddings and unquantized weights
    dtype_bytes: int = 2
    #: bytes per parameter of the routed experts' weights and of the other linear layers' weights
    expert_bytes: float = 2.0
    linear_bytes: float = 2.0
    #: how the weights' bytes were read, for messages: e.g. "bf16", "routed experts int4 (group 32), rest bf16"
    precision: str = "bf16"

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (the KV cache holds one latent per token and layer)."""
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        """Decoder layers with experts (0 for a dense model)."""
        return max(self.num_layers - self.first_k_dense_replace, 0) if self.n_routed_experts else 0


def _text(model_config: dict[str, Any]) -> dict[str, Any]:
    return model_config if "hidden_size" in model_config else (model_config.get("text_config") or {})


def _quantization(model_config: dict[str, Any], text: dict[str, Any], dtype_bytes: int) -> tuple[float, float, str]:
    """``(expert_bytes, linear_bytes, precision)`` from a ``quantization_config`` (top level or ``text_config``).

    - compressed-tensors weight groups (``config_groups.*.weights.num_bits`` b, ``group_size`` g; Kimi-K2.5's
      int4 routed experts, everything else in its ``ignore`` list): routed experts b/8 + dtype/g bytes per
      parameter (the packed weight plus one scale per group), the rest in the model's dtype;
    - ``quant_method: fp8`` (DeepSeek-V3's block-wise fp8): 1 byte per parameter of every linear layer
      (block scales are negligible), embeddings and lm_head in the model's dtype;
    - none, or a method not modelled: every weight in the model's dtype (an upper bound for a quantized model).
    """
    q = text.get("quantization_config") or model_config.get("quantization_config") or {}
    name = {2: "bf16", 4: "fp32", 1: "fp8"}.get(dtype_bytes, f"{dtype_bytes}-byte")
    if not q:
        return float(dtype_bytes), float(dtype_bytes), name
    groups = [g.get("weights") or {} for g in (q.get("config_groups") or {}).values() if isinstance(g, dict)]
    bits = [(int(w["num_bits"]), int(w.get("group_size") or 0)) for w in groups if w.get("num_bits")]
    if bits:
        b, g = bits[0]
        per = b / 8 + (dtype_bytes / g if g else 0.0)
        return per, float(dtype_bytes), f"routed experts int{b} (group {g}), rest {name}"
    if str(q.get("quant_method", "")).lower() == "fp8":
        return 1.0, 1.0, f"linear layers fp8, embeddings {name}"
    return float(dtype_bytes), float(dtype_bytes), f"{name} (quantization {q.get('quant_method')!r} not modelled)"


def target_shape(model_config: dict[str, Any]) -> TargetShape:
    """The :class:`TargetShape` of a target's ``config.json`` (the ``text_config`` of multimodal wrappers such as
    Kimi-K2.5's ``KimiK25ForConditionalGeneration``; DeepSeek-V3's key names for MoE and MLA).

    Raises:
        ValueError: ``hidden_size`` or ``num_hidden_layers`` missing (the file is not a transformer config).
    """
    t = _text(model_config)
    if not t.get("hidden_size") or not t.get("num_hidden_layers"):
        raise ValueError("config.json has no hidden_size / num_hidden_layers (nor under text_config)")
    h, heads = int(t["hidden_size"]), int(t.get("num_attention_heads") or 1)
    dtype = str(t.get("torch_dtype") or t.get("dtype") or model_config.get("torch_dtype")
                or model_config.get("dtype") or "bfloat16").removeprefix("torch.")
    db = DTYPE_BYTES.get(dtype, 2)
    expert_b, linear_b, precision = _quantization(model_config, t, db)
    experts = int(t.get("n_routed_experts") or t.get("num_local_experts") or t.get("num_experts") or 0)
    return TargetShape(
        hidden_size=h, num_layers=int(t["num_hidden_layers"]),
        vocab_size=int(t.get("vocab_size") or model_config.get("vocab_size") or 0),
        intermediate_size=int(t.get("intermediate_size") or 4 * h), num_heads=heads,
        num_kv_heads=int(t.get("num_key_value_heads") or heads), head_dim=int(t.get("head_dim") or h // heads),
        tie_word_embeddings=bool(t.get("tie_word_embeddings", model_config.get("tie_word_embeddings", False))),
        n_routed_experts=experts, n_shared_experts=int(t.get("n_shared_experts") or 0),
        experts_per_tok=int(t.get("num_experts_per_tok") or 0),
        moe_intermediate_size=int(t.get("moe_intermediate_size") or t.get("intermediate_size") or 4 * h),
        first_k_dense_replace=int(t.get("first_k_dense_replace") or 0),
        q_lora_rank=int(t.get("q_lora_rank") or 0), kv_lora_rank=int(t.get("kv_lora_rank") or 0),
        qk_nope_head_dim=int(t.get("qk_nope_head_dim") or 0), qk_rope_head_dim=int(t.get("qk_rope_head_dim") or 0),
        v_head_dim=int(t.get("v_head_dim") or 0), dtype_bytes=db, expert_bytes=expert_b, linear_bytes=linear_b,
        precision=precision)


def weight_bytes(s: TargetShape, tp: int) -> tuple[float, float]:
    """``(sharded, replicated)`` weight bytes of the target as vLLM 0.16 lays it out at tensor parallel size
    ``tp``: each rank holds ``sharded / tp + replicated``.

    Sharded (split by TP): embeddings and lm_head (vocab-parallel), attention's head-wise projections (GQA: q, k, v,
    o; MLA: q_b (or q), kv_b, o), dense MLPs (3·H·I each), routed and shared experts (3·H·moe_I each; split by TP,
    or by expert parallelism, the same total per rank). Replicated on every rank: MLA's down projections q_a
    (H·q_lora_rank) and kv_a (H·(kv_lora_rank + rope)) and the routers (experts·H). Norms are left out.
    """
    h, db = s.hidden_size, s.dtype_bytes
    if s.mla:
        qk = s.qk_nope_head_dim + s.qk_rope_head_dim
        q = s.q_lora_rank * s.num_heads * qk if s.q_lora_rank else h * s.num_heads * qk
        attn_shard = q + s.kv_lora_rank * s.num_heads * (s.qk_nope_head_dim + s.v_head_dim) \
            + s.num_heads * s.v_head_dim * h
        attn_repl = h * s.q_lora_rank + h * (s.kv_lora_rank + s.qk_rope_head_dim)
    else:
        attn_shard = h * (s.num_heads + 2 * s.num_kv_heads) * s.head_dim + s.num_heads * s.head_dim * h
        attn_repl = 0
    dense_layers = s.num_layers - s.moe_layers
    expert = 3 * h * s.moe_intermediate_size
    sharded = (s.num_layers * attn_shard * s.linear_bytes
               + dense_layers * 3 * h * s.intermediate_size * s.linear_bytes
               + s.moe_layers * (s.n_routed_experts * expert * s.expert_bytes
                                 + s.n_shared_experts * expert * s.linear_bytes)
               + s.vocab_size * h * db * (1 if s.tie_word_embeddings else 2))
    replicated = s.num_layers * attn_repl * s.linear_bytes + s.moe_layers * s.n_routed_experts * h * db
    return sharded, replicated


def kv_bytes_per_token(s: TargetShape, tp: int) -> int:
    """KV-cache bytes per token on each rank (vLLM, cache dtype = the model's).

    MLA: ``layers × (kv_lora_rank + qk_rope_head_dim) × dtype`` — the latent is shared by all heads, so every rank
    holds all of it (576 values per layer for DeepSeek-V3/Kimi-K2.5). GQA/MHA: ``layers × 2 × max(1,
    kv_heads / tp) × head_dim × dtype`` (K and V heads split by TP, replicated when fewer than TP).
    """
    if s.mla:
        return s.num_layers * (s.kv_lora_rank + s.qk_rope_head_dim) * s.dtype_bytes
    return s.num_layers * 2 * max(1, s.num_kv_heads // tp) * s.head_dim * s.dtype_bytes


@dataclass
class MemoryEstimate:
    """GPU memory one rank of a stage needs, by part, and how many ranks (GPUs) the stage uses."""

    stage: str
    ranks: int
    parts: dict[str, int] = field(default_factory=dict)
    basis: str = ""

    @property
    def total(self) -> int:
        """Bytes per GPU, all parts together."""
        return sum(self.parts.values())

    def describe(self) -> str:
        """One line: each part and the total in GiB per GPU, and the basis."""
        parts = " + ".join(f"{k} {v / GIB:.1f}" for k, v in self.parts.items())
        return f"{self.stage}: {parts} = {self.total / GIB:.1f} GiB per GPU on {self.ranks} GPU(s) ({self.basis})"


def _ranks(setting: int | str, gpus: int) -> int:
    return gpus if setting == "auto" else int(setting)


def extract_memory(s: TargetShape, cfg: Any, *, gpus: int) -> MemoryEstimate:
    """GPU memory per rank of stage extract (vLLM, tensor parallel size TP = ``extract.tensor_parallel_size``,
    ``auto`` = ``gpus``).

    Formula, in bytes per GPU:

    - weights: ``sharded / TP + replicated`` (:func:`weight_bytes`);
    - KV cache for the batch: ``extract.batch_size × max_model_len × kv_bytes_per_token``
      (:func:`kv_bytes_per_token`; ``max_model_len`` = ``PipelineConfig.effective_max_model_len()``): the whole batch
      in the cache at once, as the generator hands it to vLLM (less makes vLLM queue and preempt);
    - activations of one step of ``T = max(8192, max_model_len)`` tokens (vLLM's default budget):
      ``T × dtype × (ACT_HIDDEN_COPIES·H + 4·H captured + FFN + attention)`` with FFN =
      ``experts_per_tok × (3·moe_I / TP + H)`` for MoE layers (fused-MoE intermediate caches) or ``3·I / TP`` for
      dense ones, attention = ``heads / TP × (qk + v head dims)`` (MLA) or ``(heads + 2·kv_heads) / TP × head_dim``;
      plus fp32 logits of the last token of each sequence, ``batch_size × V / TP × 4``;
    - :data:`RUNTIME_OVERHEAD_BYTES`.
    """
    tp = _ranks(cfg.extract.tensor_parallel_size, gpus)
    sharded, replicated = weight_bytes(s, tp)
    mml = cfg.effective_max_model_len()
    batch = cfg.extract.batch_size
    t = max(VLLM_DEFAULT_BATCHED_TOKENS, mml)
    h = s.hidden_size
    if s.n_routed_experts:
        ffn = s.experts_per_tok * (3 * math.ceil(s.moe_intermediate_size / tp) + h)
    else:
        ffn = 3 * math.ceil(s.intermediate_size / tp)
    if s.mla:
        attn = math.ceil(s.num_heads / tp) * (s.qk_nope_head_dim + s.qk_rope_head_dim + s.qk_nope_head_dim
                                              + s.v_head_dim)
    else:
        attn = math.ceil((s.num_heads + 2 * s.num_kv_heads) / tp) * s.head_dim
    act = t * s.dtype_bytes * (ACT_HIDDEN_COPIES * h + AUX_LAYERS_CAPTURED * h + ffn + attn) \
        + batch * math.ceil(s.vocab_size / tp) * 4
    parts = {"weights": int(sharded / tp + replicated),
             "kv cache": batch * mml * kv_bytes_per_token(s, tp),
             "activations": int(act), "runtime overhead": RUNTIME_OVERHEAD_BYTES}
    basis = (f"{s.precision} weights at TP {tp}, {'MLA' if s.mla else 'GQA'} KV for {batch} × {mml} tokens, "
             f"{t}-token steps")
    return MemoryEstimate("extract", tp, parts, basis)


def train_memory(s: TargetShape, cfg: Any, *, gpus: int) -> MemoryEstimate:
    """GPU memory per rank of stage train (the draft head under FSDP2 over ``train.nproc`` ranks, ``auto`` =
    ``gpus``; one rank trains alone).

    Formula, in bytes per GPU, with ``(P, F)`` = :func:`draft_param_count` (trainable, frozen) and
    ``T = train.batch_max_tokens`` (each rank packs its own batch):

    - head and optimizer, sharded: ``(P × 16 + F × 4) / nproc`` (fp32 weights, gradients and AdamW moments;
      frozen fp32 weights);
    - unsharded for compute (nproc > 1): ``(P + F) × 4`` — FSDP gathers the parameters for forward and backward (an
      upper bound: all of them at once);
    - activations: inputs ``T × 4·H × dtype`` (3 aux + last hidden states) + logits
      ``T × draft_vocab × 4 × (2·ttt_steps + 1)`` (fp32 draft logits and their gradients per step, the teacher's
      once) + layers ``T × num_layers × ttt_steps × TRAIN_ACT_HIDDEN_COPIES·H × 2``;
    - :data:`RUNTIME_OVERHEAD_BYTES`.
    """
    n = _ranks(cfg.train.nproc, gpus)
    dims = {"hidden_size": s.hidden_size, "intermediate_size": s.intermediate_size, "vocab_size": s.vocab_size}
    p, f = draft_param_count(dims, num_layers=cfg.train.num_layers, draft_vocab_size=cfg.vocab.draft_vocab_size)
    t, h, ttt = cfg.train.batch_max_tokens, s.hidden_size, cfg.train.ttt_steps
    act = (t * AUX_LAYERS_CAPTURED * h * s.dtype_bytes
           + t * cfg.vocab.draft_vocab_size * 4 * (2 * ttt + 1)
           + t * cfg.train.num_layers * ttt * TRAIN_ACT_HIDDEN_COPIES * h * 2)
    parts = {"head + optimizer": (p * TRAIN_BYTES_PER_PARAM + f * FROZEN_TRAIN_BYTES_PER_PARAM) // n}
    if n > 1:
        parts["gathered parameters"] = (p + f) * 4
    parts |= {"activations": act, "runtime overhead": RUNTIME_OVERHEAD_BYTES}
    basis = (f"{p / 1e9:.2f} B trainable + {f / 1e9:.2f} B frozen parameters over {n} rank(s), {t}-token batches, "
             f"{ttt} ttt steps")
    return MemoryEstimate("train", n, parts, basis)


def stage_memory(stage: str, s: TargetShape, cfg: Any, *, gpus: int) -> MemoryEstimate | None:
    """:func:`extract_memory` or :func:`train_memory` for a GPU stage; None for prepare and vocab (CPU only)."""
    if stage == "extract":
        return extract_memory(s, cfg, gpus=gpus)
    if stage == "train":
        return train_memory(s, cfg, gpus=gpus)
    return None


def memory_fits(est: MemoryEstimate, gpu_total_mib: list[int], utilization: float) -> tuple[bool, str]:
    """Whether a stage's per-GPU estimate fits ``utilization × memory.total`` of the smallest GPU it uses (pure).

    Args:
        est: the stage's estimate.
        gpu_total_mib: ``memory.total`` of each GPU as nvidia-smi reports it, in MiB.
        utilization: the fraction the stage may use (``extract.gpu_memory_utilization``).

    Returns:
        ``(ok, one line)``: the estimate against the budget, or why it cannot run (fewer GPUs than ranks).
    """
    if len(gpu_total_mib) < est.ranks:
        return False, (f"{est.stage} needs {est.ranks} GPUs, nvidia-smi reports {len(gpu_total_mib)}: lower "
                       f"{'extract.tensor_parallel_size' if est.stage == 'extract' else 'train.nproc'}")
    smallest = min(sorted(gpu_total_mib)[:est.ranks] if est.ranks else gpu_total_mib)
    budget = int(utilization * smallest * MIB)
    ok = est.total <= budget
    line = (f"{est.describe()}; budget {utilization:g} × {smallest} MiB = {budget / GIB:.1f} GiB per GPU")
    if not ok:
        fix = ("extract.batch_size, prepare.max_seq_len / extract.max_model_len, or raise "
               "extract.gpu_memory_utilization, or use more GPUs (extract.tensor_parallel_size)"
               if est.stage == "extract" else
               "train.batch_max_tokens, or use more GPUs (train.nproc)")
        line += f": over by {(est.total - budget) / GIB:.1f} GiB; lower {fix}"
    return ok, line


_SM = re.compile(r"^sm_(\d+)[a-z]?$")


def arch_versions(arch_list: list[str]) -> list[int]:
    """The ``sm_XY`` entries of ``torch.cuda.get_arch_list()`` as integers (``sm_90a`` → 90, ``sm_120`` → 120);
    PTX entries (``compute_XY``) are left out, as torch's own check leaves them out."""
    return [int(m.group(1)) for a in arch_list if (m := _SM.match(a.strip()))]


def arch_supported(compute_cap: str, arch_list: list[str]) -> bool:
    """Whether an image built for ``arch_list`` runs on a GPU of ``compute_cap`` (nvidia-smi's ``12.0``).

    Mirrors torch's ``torch.cuda._check_cubins``: "NVIDIA GPU compute architectures are backward compatible within
    major version" — supported when any ``sm_XY`` has ``XY // 10`` equal to the GPU's major version. An empty list
    (torch built without CUDA) is not judged here, as torch does not judge it (True).

    Raises:
        ValueError: ``compute_cap`` is not ``MAJOR.MINOR``.
    """
    major = int(compute_cap.strip().split(".")[0])
    versions = arch_versions(arch_list)
    return not arch_list or any(v // 10 == major for v in versions)


def arch_check(compute_caps: list[str], arch_list: list[str]) -> tuple[bool, str]:
    """The GPUs' compute capabilities against the architectures the image was built for (pure): ``(ok, one line)``
    naming both, e.g. ``GPUs sm_120 (compute_cap 12.0) ... image built for sm_90 sm_100``."""
    caps = sorted(set(c.strip() for c in compute_caps if c.strip()))
    built = " ".join(arch_list) or "(none reported)"
    bad = [c for c in caps if not arch_supported(c, arch_list)]
    gpus = ", ".join(f"sm_{c.replace('.', '')} (compute_cap {c})" for c in caps)
    if bad:
        return False, (f"the GPUs are {gpus}, the pipeline image's torch was built for {built}: no kernel for "
                       f"compute capability {', '.join(bad)}; build the image for this architecture (a base with "
                       f"CUDA kernels for sm_{bad[0].replace('.', '')}) or run on GPUs it was built for")
    return True, f"GPUs {gpus}; image built for {built}"


@dataclass
class GpuMemoryPlan:
    """The GPU stages' estimates of a window and the fraction of each GPU they may use, or why there are none
    (the target's ``config.json`` could not be read)."""

    estimates: list[MemoryEstimate] = field(default_factory=list)
    #: ``extract.gpu_memory_utilization``: vLLM's share of each GPU, and the training stage's budget as well.
    utilization: float = 0.9
    error: str = ""
