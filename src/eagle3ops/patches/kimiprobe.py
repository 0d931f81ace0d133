"""Behavioural probe of the speculators series' Kimi-K2.5 patches (``X-Eagle3ops-Probe: kimi-k25-targets``).

Runs on the shared probe engines of :mod:`eagle3ops.patches.probekit` (engine kind ``kimi-k25``: the tiny
Kimi-K2.5-class target of :mod:`eagle3ops.fixtures.tinykimi`), with its tolerances and error statistics.
"""

from __future__ import annotations

import time

from eagle3ops.patches.probekit import (
    DEEPSEEK_LAYERS,
    LAST_RUN,
    MOE_TOLERANCE,
    ProbeFailed,
    _check_results_basic,
    _engine,
    cached_reference,
    hidden_state_errors,
)

__all__ = ["probe_kimi_k25_targets"]


def probe_kimi_k25_targets() -> None:
    """Kimi-K2.5 targets (tiny ``kimi-k25``): the generator runs the text backbone alone with the vision modality
    off and its states match the reference forward of the ``language_model.*`` tensors; the draft head reads the
    verifier's embeddings and lm_head under ``language_model.`` (its config is remote code)."""
    import torch

    from eagle3ops.stages.extract import TransformersEngine

    t0 = time.monotonic()
    eng = _engine("kimi-k25")
    mm = getattr(eng.generator.vllm_config.model_config, "multimodal_config", None)
    if mm is None or mm.get_limit_per_prompt("vision_chunk") != 0:
        raise ProbeFailed("kimi-k25-targets: the generator's vLLM config leaves the vision modality on "
                          "(limit_mm_per_prompt vision_chunk is not 0)")
    g = torch.Generator().manual_seed(6)
    seqs = [torch.randint(300, 150_000, (int(n),), generator=g).tolist()
            for n in torch.randint(20, 200, (8,), generator=g)]
    try:
        res = eng.generator.generate(seqs)
    except Exception as e:
        raise ProbeFailed(f"generate() on tiny Kimi-K2.5 failed: {type(e).__name__}: {e}") from e
    _check_results_basic(res, seqs, len(DEEPSEEK_LAYERS), "kimi-k25-targets")

    def reference() -> list[list[torch.Tensor]]:
        ref = TransformersEngine(str(eng.model_dir), list(DEEPSEEK_LAYERS), device="cpu", dtype=torch.float32)
        return [[h.float() for h in r["hidden_states"]] for r in ref.generate(seqs)]

    refs = cached_reference(eng.model_dir, "kimi-language-model-states", seqs, DEEPSEEK_LAYERS, reference)
    stats = hidden_state_errors(res, refs)
    stats.check(MOE_TOLERANCE, "tiny Kimi-K2.5 (language_model backbone), all layers")

    from safetensors import safe_open
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    vocab, draft = 163_840, 64
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[torch.arange(1000, 1000 + draft)] = True
    d2t = torch.full((draft,), 1000, dtype=torch.long)
    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256,
                                             num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4),
        draft_vocab_size=draft,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=str(eng.model_dir), architectures=["KimiK25ForConditionalGeneration"]),
        ),
    )
    try:
        model = Eagle3DraftModel(cfg, t2d=t2d, d2t=d2t)
    except Exception as e:
        raise ProbeFailed(f"Eagle3DraftModel on a Kimi-K2.5 verifier: {type(e).__name__}: {e}") from e
    with safe_open(str(eng.model_dir / "model.safetensors"), "pt") as f:
        embed = f.get_tensor("language_model.model.embed_tokens.weight").float()
        head = f.get_tensor("language_model.lm_head.weight").float()
    if not torch.equal(model.embed_tokens.weight.float(), embed):
        raise ProbeFailed("kimi-k25-targets: draft embed_tokens != language_model.model.embed_tokens.weight")
    if not torch.equal(model.verifier_lm_head.weight.float(), head[t2d]):
        raise ProbeFailed("kimi-k25-targets: draft verifier_lm_head != language_model.lm_head.weight[t2d]")
    LAST_RUN["kimi-k25-targets"] = {"seconds": time.monotonic() - t0, "engine_start_s": eng.start_s,
                                    "stats": stats, "draft_rows": draft}
