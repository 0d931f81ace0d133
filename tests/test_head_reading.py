"""Heads that vLLM 0.16 reads differently from how they were trained, refused before any restart.

The comparison is pure (``speculate.headcheck.check_vllm_reading`` and ``check_vocab_values``); its input about vLLM
is what vLLM 0.16's own config loader made of the head in the pipeline image (``speculate.onhost.vllm_view``):
the draft's effective ``hf_config`` as a dict and the config keys vLLM's EAGLE-3 model code reads. The views below
are written the way that loader answers (speculators format: ``transformer_layer_config`` plus the eagle3 algo
updater's keys, ``norm_before_residual`` defaulted to True; flat format: the keys of ``config.json``).
"""

from __future__ import annotations

import numpy as np
import pytest

from eagle3ops.speculate.headcheck import HeadMismatch, check_vllm_reading, check_vocab_values

TARGET_LAYERS = 24
#: config keys vLLM 0.16's llama_eagle3 / llama model code and LlamaConfig read (as the in-image view lists them)
READ = ["architectures", "draft_vocab_size", "eagle_aux_hidden_state_layer_ids", "eagle_config", "hidden_act",
        "hidden_size", "intermediate_size", "max_position_embeddings", "norm_before_residual", "num_attention_heads",
        "num_hidden_layers", "num_key_value_heads", "rms_norm_eps", "target_hidden_size", "vocab_size",
        "speculators_config", "speculators_model_type", "speculators_version", "transformer_layer_config",
        "torch_dtype", "model_type", "rope_theta", "tie_word_embeddings"]


def _spec_head(**top) -> dict:
    layer = {"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 1, "vocab_size": 1000,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 256, "rms_norm_eps": 1e-6}
    return {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"], "draft_vocab_size": 500,
            "norm_before_residual": False, "eagle_aux_hidden_state_layer_ids": [2, 12, 21],
            "transformer_layer_config": layer,
            "speculators_config": {"verifier": {"name_or_path": "/m", "architectures": ["LlamaForCausalLM"]}}, **top}


def _view(head: dict, *, drop: tuple[str, ...] = (), **over) -> dict:
    """What vLLM 0.16's SpeculatorsConfig makes of a speculators-format head (its eagle3 updater: norm_before_residual
    defaults to True, the top-level aux ids are copied when set)."""
    cfg = dict(head["transformer_layer_config"])
    cfg["draft_vocab_size"] = head.get("draft_vocab_size")
    cfg["norm_before_residual"] = head.get("norm_before_residual", True)
    if head.get("eagle_aux_hidden_state_layer_ids"):
        cfg["eagle_aux_hidden_state_layer_ids"] = head["eagle_aux_hidden_state_layer_ids"]
    cfg["architectures"] = ["Eagle3LlamaForCausalLM"]
    cfg.update(over)
    for k in drop:
        cfg.pop(k, None)
    return {"config": cfg, "read_keys": READ, "vllm_version": "0.16.0"}


def test_a_head_vllm_reads_as_trained_passes() -> None:
    head = _spec_head()
    facts = check_vllm_reading(head, _view(head), target_layers=TARGET_LAYERS)
    assert facts["eagle_aux_hidden_state_layer_ids"] == [2, 12, 21]


@pytest.mark.parametrize("key", ["norm_before_fc", "norm_output", "fc_norm"])
def test_a_key_vllm_016_does_not_read_is_named(key: str) -> None:
    head = _spec_head(**{key: True})
    with pytest.raises(HeadMismatch) as e:
        check_vllm_reading(head, _view(head), target_layers=TARGET_LAYERS)
    assert e.value.field == key and "vLLM 0.16" in str(e.value) and "does not read" in str(e.value), str(e.value)


def test_a_missing_norm_before_residual_is_defaulted_differently() -> None:
    head = _spec_head()
    del head["norm_before_residual"]  # speculators trained it with its default, False; vLLM 0.16 defaults to True
    with pytest.raises(HeadMismatch) as e:
        check_vllm_reading(head, _view(head), target_layers=TARGET_LAYERS)
    assert e.value.field == "norm_before_residual" and "True" in str(e.value) and "False" in str(e.value)


def test_aux_layer_ids_nested_where_vllm_016_does_not_read_them() -> None:
    head = _spec_head()
    del head["eagle_aux_hidden_state_layer_ids"]
    head["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 11, 20], "use_aux_hidden_state": True}
    with pytest.raises(HeadMismatch) as e:
        check_vllm_reading(head, _view(head), target_layers=TARGET_LAYERS)
    msg = str(e.value)
    assert e.value.field == "eagle_config.eagle_aux_hidden_state_layer_ids" and "[2, 12, 21]" in msg, msg


def test_a_number_of_aux_layers_other_than_three() -> None:
    head = _spec_head(eagle_aux_hidden_state_layer_ids=[2, 8, 14, 21])
    with pytest.raises(HeadMismatch) as e:
        check_vllm_reading(head, _view(head), target_layers=TARGET_LAYERS)
    assert e.value.field == "eagle_aux_hidden_state_layer_ids" and "three" in str(e.value)


def test_aux_layer_ids_in_the_other_convention() -> None:
    """Trained on the outputs of layers [1, 11, 20] (EAGLE/SpecForge count): vLLM must be told [2, 12, 21]."""
    head = _spec_head(eagle_aux_hidden_state_layer_ids=[1, 11, 20])
    manifest = {"aux_layer_ids_extracted": [1, 11, 20], "eagle_aux_hidden_state_layer_ids": [2, 12, 21]}
    with pytest.raises(HeadMismatch) as e:
        check_vllm_reading(head, _view(head), target_layers=TARGET_LAYERS, train_manifest=manifest)
    assert "convention" in str(e.value) and "[2, 12, 21]" in str(e.value)


# ---- d2t / t2d values -----------------------------------------------------------------------------------------------

def _mapping(nd=500, nt=1000, seed=0):
    ids = np.sort(np.random.default_rng(seed).choice(nt, nd, replace=False))
    d2t = ids - np.arange(nd)
    t2d = np.zeros(nt, dtype=bool)
    t2d[ids] = True
    return d2t, t2d


def test_good_vocab_mapping_passes() -> None:
    d2t, t2d = _mapping()
    check_vocab_values(d2t, t2d, target_vocab=1000)
    check_vocab_values(d2t, None, target_vocab=1000)


def test_all_zero_d2t_where_vocabularies_differ() -> None:
    _, t2d = _mapping()
    with pytest.raises(HeadMismatch, match="all zero") as e:
        check_vocab_values(np.zeros(500, dtype=np.int64), None, target_vocab=1000)
    assert e.value.field == "d2t"


def test_d2t_out_of_range_and_duplicated() -> None:
    d2t, _ = _mapping()
    bad = d2t.copy()
    bad[-1] = 1000  # target id 499 + 1000 >= vocab
    with pytest.raises(HeadMismatch, match="outside"):
        check_vocab_values(bad, None, target_vocab=1000)
    dup = d2t.copy()
    dup[1] = d2t[0] - 1  # draft 1 -> the same target id as draft 0
    with pytest.raises(HeadMismatch, match="same target id"):
        check_vocab_values(dup, None, target_vocab=1000)


def test_t2d_disagreeing_with_d2t() -> None:
    d2t, _ = _mapping(seed=0)
    _, other = _mapping(seed=1)
    with pytest.raises(HeadMismatch) as e:
        check_vocab_values(d2t, other, target_vocab=1000)
    assert e.value.field == "t2d" and "disagree" in str(e.value)


# ---- the inspect answer: values read in the image, checked on the host before any restart ------------------------------

def test_safetensors_vector_reads_d2t_and_t2d_without_torch(tmp_path) -> None:
    import json
    import struct

    from eagle3ops.speculate.onhost import safetensors_vector

    d2t, t2d = _mapping()
    blobs = {"d2t": (d2t.astype("<i8").tobytes(), "I64", [500]), "t2d": (t2d.tobytes(), "BOOL", [1000]),
             "fc.weight": (np.zeros((2, 3), dtype="<f4").tobytes(), "F32", [2, 3])}
    header, data, off = {}, b"", 0
    for name, (b, dt, shape) in blobs.items():
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        data, off = data + b, off + len(b)
    h = json.dumps(header).encode()
    f = tmp_path / "model.safetensors"
    f.write_bytes(struct.pack("<Q", len(h)) + h + data)
    assert safetensors_vector(f, "d2t") == d2t.tolist()
    assert safetensors_vector(f, "t2d") == t2d.astype(int).tolist()
    assert safetensors_vector(f, "missing") is None
    with pytest.raises(ValueError, match="F32"):
        safetensors_vector(f, "fc.weight")


def test_speculate_checks_the_inspect_answer_as_vllm_reads_it() -> None:
    from eagle3ops.speculate.headcheck import HeadFacts
    from eagle3ops.speculate.ship import check_as_vllm_reads

    facts = HeadFacts(128, 1000, 500, [2, 12, 21], TARGET_LAYERS)
    d2t, t2d = _mapping()
    head = _spec_head(norm_before_fc=True)
    info = {"head_config": head, "vllm_view": _view(head), "vocab": {"d2t": d2t.tolist(), "t2d": t2d.tolist()}}
    with pytest.raises(HeadMismatch, match="norm_before_fc"):
        check_as_vllm_reads(info, facts, own_run=True)
    head = _spec_head()
    info = {"head_config": head, "vllm_view": _view(head), "vocab": {"d2t": [0] * 500, "t2d": None}}
    with pytest.raises(HeadMismatch, match="all zero"):
        check_as_vllm_reads(info, facts, own_run=False)
    info = {"head_config": head, "vllm_view": {"error": "vLLM not importable here"}, "vocab": None}
    warnings = check_as_vllm_reads(info, facts, own_run=True)
    assert any("vLLM not importable" in w for w in warnings) and any("d2t/t2d" in w for w in warnings)
