"""speculators' VllmHiddenStatesGenerator (patched) on vLLM 0.16: attribution, order and tolerances.

Uses the probes' shared engines (tiny Llama with a remote-code tokenizer; tiny DeepSeek-V3) and the transformers
fp32 reference forward (:func:`eagle3ops.patches.probekit.reference_layer_states`). Tolerances are per token
quantile (bf16 target, MoE routing flips) as in :mod:`eagle3ops.patches.probes`.
"""

from __future__ import annotations

import pytest
import torch

from eagle3ops.patches import probekit

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llama():
    eng = probekit._engine("llama-remote-code")
    yield eng
    probekit.shutdown()


def test_same_prompt_same_states_alone_or_chunked_deep_in_a_large_batch(llama):
    gen = llama.generator
    target = probekit._random_sequences(1, 450, 450, seed=11)[0]
    alone = gen.generate([target])[0]["hidden_states"]
    batch = probekit._random_sequences(44, 100, 400, seed=12)
    batch.insert(37, target)  # past max_num_seqs (32); split over several 256-token steps
    res = gen.generate(batch)
    assert [r["input_ids"].tolist() for r in res] == batch
    for a, b in zip(alone, res[37]["hidden_states"]):
        assert a.shape == b.shape == (450, 128)
        assert torch.allclose(a.float(), b.float(), atol=2e-2, rtol=2e-2), float((a.float() - b.float()).abs().max())


def test_results_in_input_order_for_any_batch_size(llama):
    gen = llama.generator
    for n in (1, 11, 33, 70):  # 11+: text order of request ids differs from input order; 33+: over max_num_seqs
        seqs = [[6 + (i % 200)] * (3 + i) for i in range(n)]  # distinct lengths identify each sequence
        res = gen.generate(seqs)
        assert [r["input_ids"].tolist() for r in res] == seqs
        assert [r["hidden_states"][0].shape[0] for r in res] == [len(s) for s in seqs]


def test_llama_states_within_dense_tolerance_per_quantile(llama):
    seqs = probekit._random_sequences(12, 50, 500, seed=13)
    res = llama.generator.generate(seqs)
    refs = probekit.reference_layer_states(llama.model_dir, seqs, probekit.LLAMA_LAYERS)
    stats = probekit.hidden_state_errors(res, refs)
    print("llama bf16 vs fp32 reference:", stats)
    stats.check(probekit.DENSE_TOLERANCE, "tiny Llama")
    assert stats.median < 0.02 and stats.q99 < 0.06


def test_tolerance_check_rejects_states_of_another_sequence(llama):
    seqs = probekit._random_sequences(6, 60, 60, seed=14)
    res = llama.generator.generate(seqs)
    refs = probekit.reference_layer_states(llama.model_dir, seqs, probekit.LLAMA_LAYERS)
    probekit.hidden_state_errors(res, refs).check(probekit.DENSE_TOLERANCE, "aligned")
    swapped = [res[1], res[0], *res[2:]]
    stats = probekit.hidden_state_errors(swapped, refs)
    assert stats.worst_seq in (0, 1) and stats.worst_seq_median > 0.3
    with pytest.raises(probekit.ProbeFailed, match="another sequence"):
        stats.check(probekit.DENSE_TOLERANCE, "swapped")
    shifted = [{**r, "hidden_states": [torch.roll(h, 1, dims=0) for h in r["hidden_states"]]} for r in res]
    with pytest.raises(probekit.ProbeFailed):
        probekit.hidden_state_errors(shifted, refs).check(probekit.DENSE_TOLERANCE, "off by one position")


def test_deepseek_v3_states_within_moe_tolerance_per_quantile():
    eng = probekit._engine("deepseek-v3")
    try:
        seqs = probekit._random_sequences(16, 30, 500, seed=15)
        res = eng.generator.generate(seqs)
        stats = probekit.hidden_state_errors(
            res, probekit.reference_layer_states(eng.model_dir, seqs, probekit.DEEPSEEK_LAYERS)
        )
        print("deepseek-v3 bf16 vs fp32 reference:", stats)
        stats.check(probekit.MOE_TOLERANCE, "tiny DeepSeek-V3")
        assert stats.median < 0.02
        assert stats.frac_above_005 <= 0.03
        assert stats.worst_seq_median < 0.05
        # Dense layer 0: no routing noise; vLLM's faulty CPU rotary kernel on q_pe shows up here first.
        dense = probekit.hidden_state_errors(
            [{**r, "hidden_states": r["hidden_states"][:1]} for r in res],
            [ref[:1] for ref in probekit.reference_layer_states(eng.model_dir, seqs, probekit.DEEPSEEK_LAYERS[:1])],
        )
        print("deepseek-v3 dense layer 0:", dense)
        dense.check(probekit.MOE_DENSE_LAYER_TOLERANCE, "tiny DeepSeek-V3 layer 0")
    finally:
        probekit.shutdown()
