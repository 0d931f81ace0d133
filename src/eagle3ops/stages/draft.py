"""The draft head of stage ``train``: speculators' ``Eagle3SpeculatorConfig`` for a target, the dense attention
used on CPU, and the transform that turns an extracted sample into training targets.

Why these differ from speculators 0.3.0 is told in :mod:`eagle3ops.stages.train` ("What is speculators' and what
is changed here"): teacher logits use the target's final norm (:func:`standardize_with_norm`), and the layer ids
are stored in vLLM's convention (:func:`build_draft_config`). Runs in the pipeline image (torch, transformers and
speculators imported lazily, inside the functions).
"""

from __future__ import annotations

from typing import Any

from eagle3ops.config.pipeline import PipelineConfig
from eagle3ops.stages.target import target_config, target_text_config

__all__ = ["DENSE_ATTENTION", "LOSSES", "SPECULATIVE_TOKENS", "build_draft_config", "install_loss", "lk_hybrid_loss",
           "register_dense_attention", "standardize_with_norm", "target_final_norm"]

#: Draft tokens per target forward that the head is configured (and vLLM told) to propose.
SPECULATIVE_TOKENS = 3


DENSE_ATTENTION = "eagle3ops_dense_sdpa"


def register_dense_attention() -> str:
    """Register (once) a dense-mask SDPA attention that takes speculators' BlockMask; returns its name.

    speculators' draft forward builds a flex-attention ``BlockMask`` (causal within each packed document, plus
    the diagonal over earlier TTT steps). Without ``torch.compile`` flex attention falls back to an unfused
    reference implementation that is slow on CPU (about 11 s per 1k-token step here, mostly its dense
    backward), and inductor cannot compile it on CPU (``InductorError: IndexError`` with torch 2.10). This
    evaluates the same ``mask_mod`` densely (``create_mask``: exact, the mask_mod is complete by itself) and
    calls ``torch.nn.functional.scaled_dot_product_attention``.
    """
    from torch.nn.attention.flex_attention import create_mask
    from torch.nn.functional import scaled_dot_product_attention
    from transformers.modeling_utils import AttentionInterface

    def dense_sdpa_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                           scaling: float | None = None, **_kwargs: Any) -> tuple[Any, None]:
        q_len, kv_len = query.shape[2], key.shape[2]
        mask = create_mask(attention_mask.mask_mod, None, None, q_len, kv_len, device=query.device)
        out = scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling,
                                           enable_gqa=query.shape[1] != key.shape[1])
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register(DENSE_ATTENTION, dense_sdpa_forward)
    return DENSE_ATTENTION


def build_draft_config(
    config: PipelineConfig, aux_layer_ids: list[int], draft_vocab_size: int, attention: str = "simple_flex_attention"
) -> Any:
    """speculators' ``Eagle3SpeculatorConfig`` for a one-or-more-layer Llama draft head of the target.

    The decoder layer copies the target's width, heads, activation, rope and norm eps (as speculators'
    training script does); ``eagle_aux_hidden_state_layer_ids`` is stored in vLLM's convention (see module doc).
    """
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    t = target_text_config(config.target_model)
    heads = t.num_attention_heads
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // heads
    if getattr(t, "kv_lora_rank", None):
        # MLA targets (DeepSeek-V2/V3, Kimi-K2.5): their `head_dim` is the rope part of a query head, not a
        # width for the draft's plain attention; use hidden_size // heads.
        head_dim = t.hidden_size // heads
    layer_cfg = LlamaConfig(
        vocab_size=t.vocab_size,
        hidden_size=t.hidden_size,
        intermediate_size=getattr(t, "intermediate_size", 4 * t.hidden_size),
        num_hidden_layers=config.train.num_layers,
        num_attention_heads=heads,
        num_key_value_heads=getattr(t, "num_key_value_heads", heads) or heads,
        head_dim=head_dim,
        hidden_act=getattr(t, "hidden_act", "silu"),
        max_position_embeddings=t.max_position_embeddings,
        rms_norm_eps=getattr(t, "rms_norm_eps", 1e-6),
        rope_theta=getattr(t, "rope_theta", 10000.0),
        rope_scaling=getattr(t, "rope_scaling", None),
        tie_word_embeddings=False,
    )
    # speculators registers flex attention under this name (models/eagle3/attention.py); its forward passes a
    # BlockMask, which only this attention function takes.
    layer_cfg._attn_implementation = attention
    # The verifier's own architectures (a wrapper's, e.g. KimiK25ForConditionalGeneration, not its backbone's).
    archs = list(getattr(target_config(config.target_model), "architectures", None) or [])
    return Eagle3SpeculatorConfig(
        transformer_layer_config=layer_cfg,
        draft_vocab_size=draft_vocab_size,
        norm_before_residual=False,
        eagle_aux_hidden_state_layer_ids=[j + 1 for j in aux_layer_ids],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=SPECULATIVE_TOKENS)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=config.target_model, architectures=archs),
        ),
    )


def target_final_norm(target_model: str) -> tuple[Any, float]:
    """Weight (fp32, ``[H]``) and eps of the target's final RMSNorm: ``model.norm.weight``, or
    ``language_model.model.norm.weight`` for wrappers such as Kimi-K2.5 (:mod:`eagle3ops.stages.target`).

    Raises:
        ValueError: the checkpoint has no final-norm tensor under its text backbone prefix.
    """
    from eagle3ops.stages.target import load_backbone_tensors

    t = target_text_config(target_model)
    try:
        weight = load_backbone_tensors(target_model, ["final_norm"])["final_norm"]
    except KeyError as exc:
        raise ValueError(f"{exc.args[0]}; cannot form the teacher logits") from exc
    return weight.float(), float(getattr(t, "rms_norm_eps", 1e-6))


def dequantize(data: dict[str, Any]) -> dict[str, Any]:
    """A sample file's dict with fp8 ``hidden_states`` (``extract.hidden_dtype: float8_e4m3fn``: ``hidden_scales``
    present) read back as bf16 ``q * scale``; a bf16 sample unchanged."""
    scales = data.get("hidden_scales")
    if scales is None:
        return data
    import torch

    states = [(q.float() * s).to(torch.bfloat16) for q, s in zip(data["hidden_states"], scales, strict=True)]
    return {k: v for k, v in data.items() if k != "hidden_scales"} | {"hidden_states": states}


def standardize_with_norm(norm_weight: Any, eps: float):
    """speculators' ``standardize_data_v1`` + the target's final RMSNorm on the last layer (see
    :mod:`eagle3ops.stages.train`'s module doc); fp8 samples are read back first (:func:`dequantize`)."""
    import torch
    from speculators.train.data import standardize_data_v1

    def fn(data: dict[str, Any]) -> dict[str, Any]:
        out = standardize_data_v1(dequantize(data))
        h = out["verifier_last_hidden_states"].float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * norm_weight
        out["verifier_last_hidden_states"] = h
        return out

    return fn


#: The draft-head losses ``train.loss`` may name: ``kl`` = speculators' forward KL (its ``loss_function``, as is);
#: ``lk_hybrid`` = :func:`lk_hybrid_loss`.
LOSSES = ("kl", "lk_hybrid")


def lk_hybrid_loss(logits: Any, targets: Any, loss_mask: Any, eta: float = 3.0) -> Any:
    """The hybrid LK loss of Samarin et al., "LK Losses: Direct Acceptance Rate Optimization for Speculative
    Decoding" (arXiv 2602.23881): per position, with ``p`` = softmax(target logits), ``q`` = softmax(draft logits)
    and the acceptance rate ``alpha = sum_v min(p_v, q_v)`` (speculative sampling accepts with probability
    ``alpha``: 1 - the total variation distance),

        ``L = lambda * KL(p || q) + (1 - lambda) * (1 - alpha)``, ``lambda = exp(-eta * sg[alpha])``

    (``sg``: stop-gradient; the weight steers, it is not differentiated). A cold head (alpha near 0) trains on
    KL's strong gradient, a good one on the acceptance rate itself. Where this comes from: the paper's text was not
    reachable from here, so no equation number is cited; the form, the detached weight and ``eta = 3`` are those of
    speculators' reference implementation of the paper's hybrid objective (``speculators/losses/eager.py``,
    ``lk_hybrid_loss``; its docs: ``lambda * KL + (1 - lambda) * TV`` with ``lambda = exp(-3 * alpha)``, detached)
    and of NVIDIA ModelOpt's ``masked_lk_lambda_loss`` (which cites the paper's sections 4.2 and 4.4).

    Reduced as speculators 0.3.0 reduces its KL (``models/eagle3/core.py``, ``loss_function``): the per-position
    losses times ``loss_mask``, summed, over ``loss_mask.sum() + 1e-5`` (all positions without a mask), mean over
    the batch rows, so ``train.loss`` swaps the objective and nothing else (TTT steps, decay, metrics unchanged).

    Args:
        logits: draft logits ``[B, T, V]`` (V = draft vocabulary).
        targets: teacher (target) logits ``[B, T, V]``, no gradient needed.
        loss_mask: ``[B, T]`` (1 = a trained position) or None.
        eta: the weight's decay rate (``>= 0``; 0 gives plain KL).

    Returns:
        A scalar tensor (fp32).
    """
    import torch

    logq = torch.nn.functional.log_softmax(logits.float(), dim=-1)
    logp = torch.nn.functional.log_softmax(targets.float(), dim=-1)
    p, q = logp.exp(), logq.exp()
    kl = (p * (logp - logq)).sum(-1)  # [B, T]
    alpha = torch.minimum(p, q).sum(-1)  # [B, T]
    lam = torch.exp(-eta * alpha.detach())
    per_pos = lam * kl + (1.0 - lam) * (1.0 - alpha)
    if loss_mask is not None:
        per_pos = per_pos * loss_mask
        denominator: Any = loss_mask.sum(dim=1) + 1e-5
    else:
        denominator = per_pos.shape[1]
    return (per_pos.sum(dim=1) / denominator).mean()


_SPECULATORS_KL: list[Any] = []  # speculators' own loss_function, saved before the first swap


def install_loss(kind: str, eta: float = 3.0) -> None:
    """Make speculators' EAGLE-3 draft model train with ``kind`` (one of :data:`LOSSES`) in this process.

    speculators 0.3.0 computes each TTT step's loss with the module function ``loss_function(logits, targets,
    loss_mask)`` of ``speculators.models.eagle3.core`` (looked up at call time by ``compute_metrics``), so the stage
    sets that name before the first forward: ``kl`` restores speculators' own, ``lk_hybrid`` puts
    :func:`lk_hybrid_loss` there. Called by every training run, so one process never keeps another run's choice.

    Raises:
        ValueError: ``kind`` is not in :data:`LOSSES`, or the installed speculators has no ``loss_function`` to
            replace (then ``train.loss: lk_hybrid`` cannot be honoured: use ``kl`` or the speculators 0.3.0 profile).
    """
    from speculators.models.eagle3 import core

    if kind not in LOSSES:
        raise ValueError(f"train.loss: {kind!r} is not one of {', '.join(LOSSES)}")
    current = getattr(core, "loss_function", None)
    if current is None:
        raise ValueError("train.loss: this speculators has no models.eagle3.core.loss_function to replace; set "
                         "train.loss: kl")
    if not _SPECULATORS_KL:
        _SPECULATORS_KL.append(current)
    if kind == "kl":
        core.loss_function = _SPECULATORS_KL[0]
        return

    def loss_function(logits: Any, targets: Any, loss_mask: Any) -> Any:
        return lk_hybrid_loss(logits, targets, loss_mask, eta)

    loss_function.__doc__ = f"eagle3ops: the hybrid LK loss, eta {eta} (eagle3ops.stages.draft.lk_hybrid_loss)"
    core.loss_function = loss_function
