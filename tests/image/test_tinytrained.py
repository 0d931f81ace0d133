"""The trained, deepened sandbox target (:mod:`eagle3ops_dev.tinytrained`): the deep shell computes exactly what its
trained core computes, training lowers the loss, and the saved checkpoint loads, generates and records what it is.

Development: run in the pipeline image with this checkout's ``src/eagle3ops`` mounted over the installed package
(about 40 s on 2 cores).
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from eagle3ops.fixtures.tinymodel import build_tiny_model  # noqa: E402
from eagle3ops_dev.tinytrained import RECORD, build_trained_llama, deepen  # noqa: E402

#: A stand-in corpus (a few lines of code as chat turns): enough tokens for the training mechanics, nothing more.
ROWS = [{"prompt": f"def add_{i}(a, b):\n    \"\"\"Add {i} to a + b.\"\"\"\n",
         "completion": f"    return a + b + {i}\n"} for i in range(40)]


def test_deepen_keeps_the_core_function_and_zeroes_every_shell_layer_output(tmp_path):
    from transformers import LlamaForCausalLM

    core = LlamaForCausalLM.from_pretrained(build_tiny_model(tmp_path / "core", "llama"), torch_dtype=torch.float32)
    deep, positions = deepen(core, 9, seed=1)
    assert positions == [0, 2, 4, 7] and deep.config.num_hidden_layers == 9
    shells = [i for i in range(9) if i not in positions]
    for i in shells:
        layer = deep.model.layers[i]
        assert not layer.self_attn.o_proj.weight.any() and not layer.mlp.down_proj.weight.any()
        assert layer.self_attn.q_proj.weight.abs().sum() > 0  # the shell computes: its inputs are not zero
    x = torch.randint(0, core.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(core(x).logits, deep(x).logits)
    with pytest.raises(ValueError, match="at least the core's 4"):
        deepen(core, 3)


def test_build_trains_the_core_and_writes_a_loadable_deep_target_with_its_record(tmp_path):
    from transformers import AutoTokenizer, LlamaForCausalLM

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = build_trained_llama(tmp_path / "target", corpus, layers=8, steps=40, log=lambda *_: None)
    rec = json.loads((out / RECORD).read_text())
    assert rec["kind"] == "llama-trained" and rec["stand_in"] is True
    assert (rec["layers"], rec["core_layers"], rec["core_positions"]) == (8, 4, [0, 2, 4, 6])
    assert rec["corpus"]["rows"] == 40 and rec["training"]["steps"] == 40
    assert rec["training"]["loss_last20_mean"] < rec["training"]["loss_first"] - 1.0
    model = LlamaForCausalLM.from_pretrained(out, torch_dtype="auto")  # the stored dtype
    assert model.config.num_hidden_layers == 8 and model.dtype == torch.bfloat16
    tok = AutoTokenizer.from_pretrained(out)
    text = tok.apply_chat_template([{"role": "user", "content": ROWS[3]["prompt"]}], tokenize=False,
                                   add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        gen = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert gen.shape[1] > ids.shape[1]
    with pytest.raises(FileExistsError, match="not empty"):
        build_trained_llama(out, corpus, layers=8, steps=1)
