"""A randomly initialised Llama-style EAGLE-3 draft head for a tiny target (probes and tests of speculative serving).

Greedy speculative decoding must reproduce the target's greedy output whatever the draft proposes, so a random
draft is enough to check that property; what the draft changes is how many of its tokens are accepted. The head is
laid out the way vLLM 0.16 loads a Llama EAGLE-3 draft (``vllm/model_executor/models/llama_eagle3.py``,
``Eagle3LlamaForCausalLM``; the architecture name ``LlamaForCausalLMEagle3`` as speculators and the EAGLE
reference write it):

* one decoder layer whose attention reads ``[input_layernorm(embed), hidden_norm(fc(aux))]`` (2 x hidden wide);
* ``fc``: ``[hidden, 3 * target_hidden]``, fusing the three aux hidden states of the target;
* ``lm_head``: ``[draft_vocab_size, hidden]`` over a reduced draft vocabulary, and ``d2t`` (int64,
  ``[draft_vocab_size]``) with *offsets*: draft id ``i`` is target id ``i + d2t[i]`` (vLLM reads ``d2t`` this way;
  ``t2d`` is skipped by vLLM and not written);
* no ``embed_tokens``: vLLM shares the target's embedding with the draft when the checkpoint has none.

The draft vocabulary is a parameter: the probes pass the target tokens they expect most often (the vocab stage
keeps the most frequent target tokens the same way), which makes some proposals acceptable even with random weights.
torch and safetensors are imported lazily.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

__all__ = ["DRAFT_ARCHITECTURE", "build_tiny_eagle3_draft"]

DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3"


def build_tiny_eagle3_draft(
    out_dir: str | Path,
    target_dir: str | Path,
    *,
    draft_vocab: Sequence[int] | None = None,
    seed: int = 0,
    aux_layer_ids: Sequence[int] | None = None,
) -> Path:
    """Write a random Llama-style EAGLE-3 draft head for the target in ``target_dir`` into ``out_dir``.

    Args:
        out_dir: new or empty directory; receives ``config.json`` and ``model.safetensors`` (float32).
        target_dir: the target checkpoint (its ``config.json`` gives hidden size, heads, vocab, rope settings;
            a nested ``text_config`` is used when present).
        draft_vocab: target token ids the draft can propose (distinct, each in ``[0, target vocab)``); stored
            sorted, as ``d2t`` offsets. None: the whole target vocabulary (no ``d2t`` written).
        seed: torch seed of the random weights.
        aux_layer_ids: written as ``eagle_aux_hidden_state_layer_ids`` (vLLM 0.16 then captures the input of these
            target layers); None leaves the target model's default ((2, L // 2, L - 3)).

    Returns:
        ``out_dir`` as a Path.

    Raises:
        FileExistsError: ``out_dir`` exists and is not empty.
        ValueError: ``draft_vocab`` is empty, has duplicates or ids outside the target vocabulary.
    """
    import torch
    from safetensors.torch import save_file

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out}: output directory is not empty; pass a new or empty directory")
    tcfg = json.loads((Path(target_dir) / "config.json").read_text())
    text = tcfg.get("text_config") or tcfg
    hidden = int(text["hidden_size"])
    vocab = int(text["vocab_size"])
    heads = 4
    kv_heads = 2
    head_dim = hidden // heads
    inter = 2 * hidden
    if draft_vocab is None:
        ids = list(range(vocab))
    else:
        ids = sorted(int(i) for i in draft_vocab)
        if not ids or len(set(ids)) != len(ids) or ids[0] < 0 or ids[-1] >= vocab:
            raise ValueError(f"draft_vocab must be distinct target ids in [0, {vocab}); got {list(draft_vocab)[:10]}")
    nd = len(ids)
    config = {
        "architectures": [DRAFT_ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": hidden,
        "target_hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(text.get("max_position_embeddings", 4096)),
        "rms_norm_eps": 1e-6,
        "rope_theta": float(text.get("rope_theta", 10000.0)),
        "vocab_size": vocab,
        "draft_vocab_size": nd,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": text.get("bos_token_id", 1),
        "eos_token_id": text.get("eos_token_id", 2),
    }
    if aux_layer_ids is not None:
        config["eagle_aux_hidden_state_layer_ids"] = [int(i) for i in aux_layer_ids]
    g = torch.Generator().manual_seed(seed)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.02

    p = "layers.0."
    tensors = {
        p + "self_attn.q_proj.weight": w(heads * head_dim, 2 * hidden),
        p + "self_attn.k_proj.weight": w(kv_heads * head_dim, 2 * hidden),
        p + "self_attn.v_proj.weight": w(kv_heads * head_dim, 2 * hidden),
        p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
        p + "mlp.gate_proj.weight": w(inter, hidden),
        p + "mlp.up_proj.weight": w(inter, hidden),
        p + "mlp.down_proj.weight": w(hidden, inter),
        p + "input_layernorm.weight": torch.ones(hidden),
        p + "hidden_norm.weight": torch.ones(hidden),
        p + "post_attention_layernorm.weight": torch.ones(hidden),
        "fc.weight": w(hidden, 3 * hidden),
        "norm.weight": torch.ones(hidden),
        "lm_head.weight": w(nd, hidden),
    }
    if draft_vocab is not None:
        tensors["d2t"] = torch.tensor(ids, dtype=torch.long) - torch.arange(nd, dtype=torch.long)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    return out
