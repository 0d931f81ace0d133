"""The four pipeline stages on CPU with tiny targets (real tokenizers, real transformers/speculators/vLLM).

Runs inside the pipeline image (``/opt/venv``: vLLM 0.16, patched speculators 0.3.0, eagle3ops). For development:
``PYTHONPATH=<patched speculators overlay>:src /opt/e3/venv-ml/bin/python -m pytest tests/image/test_stages.py``.
Tests marked ``slow`` start vLLM engines (about a minute each on 2 cores).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # noqa: F841 - the image always has it; the host run leaves tests/image out

from eagle3ops.config.pipeline import PipelineConfig, load_pipeline_config  # noqa: E402
from eagle3ops.stages.draft import standardize_with_norm, target_final_norm  # noqa: E402
from eagle3ops.stages.extract import TransformersEngine, run_extract  # noqa: E402
from eagle3ops.stages.manifest import StageInputError  # noqa: E402
from eagle3ops.stages.prepare import (  # noqa: E402
    UnmaskableConversation,
    encode_conversation,
    load_tokenizer,
    read_samples,
    run_prepare,
)
from eagle3ops.stages.train import run_train  # noqa: E402
from eagle3ops.stages.vocab import run_vocab  # noqa: E402
from eagle3ops.fixtures.tinymodel import build_tiny_model  # noqa: E402

ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
QUIET = lambda *_a, **_k: None  # noqa: E731


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {k: build_tiny_model(root / k, kind=k) for k in ("llama", "llama-remote-code")}


def make_run(root: Path, model: Path, **sections) -> Path:
    cfg = {"target_model": str(model), "prepare": {"max_seq_len": 256}, "extract": {"engine": "transformers"},
           "vocab": {"draft_vocab_size": 256}, "train": {"steps": 4, "checkpoint_every": 2, "batch_max_tokens": 512}}
    for k, v in sections.items():
        cfg[k] = {**cfg.get(k, {}), **v} if isinstance(v, dict) else v
    root.mkdir(parents=True, exist_ok=True)
    (root / "pipeline.yaml").write_text(json.dumps(cfg))  # JSON is YAML
    return root


def cfg_of(run: Path) -> PipelineConfig:
    return load_pipeline_config(run)


def _eot_suffix(tok) -> str:
    """What the chat template writes after an assistant reply (its end-of-turn marker)."""
    text = tok.apply_chat_template([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "REPLY"}],
                                   tokenize=False)
    return text[text.index("REPLY") + len("REPLY"):]


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


# ---------------------------------------------------------------------------------------------------- prepare


@pytest.mark.parametrize("kind", ["llama", "llama-remote-code"])
def test_prepare_masks_cover_exactly_the_assistant_replies(tmp_path, models, kind):
    run = make_run(tmp_path / "run", models[kind], prepare={"max_seq_len": 2048})
    figures = run_prepare(run, cfg_of(run), log=QUIET)
    tok = load_tokenizer(str(models[kind]))
    assert figures["tokenizer"]["is_fast"] is (kind == "llama")  # the remote-code tokenizer is a slow one
    assert figures["samples"] == 42 and figures["truncated"] == 0
    suffix = _eot_suffix(tok)
    from eagle3ops.stages.chatdata import resolve_dataset

    by_source = {}
    for spec in {r["source"].rpartition(":")[0] for r in read_samples(run)}:  # the dataset as pipeline.yaml names it
        assert spec.startswith("builtin:"), spec  # not the path this host resolved it to
        for n, line in enumerate(resolve_dataset(spec, run).read_text().splitlines(), 1):
            by_source[f"{spec}:{n}"] = json.loads(line)
    for row in read_samples(run):
        raw = by_source[row["source"]]
        turns = raw.get("messages") or [{"role": t["from"], "content": t["value"]} for t in raw["conversations"]]
        replies = [t["content"] for t in turns if t["role"] in ("assistant", "gpt")]
        spans = _runs(row["loss_mask"])
        decoded = [tok.decode(row["input_ids"][a:b], skip_special_tokens=False, clean_up_tokenization_spaces=False)
                   for a, b in spans]
        assert decoded == [r + suffix for r in replies], row["source"]


def test_prepare_masks_agree_with_offset_mapping_of_the_fast_tokenizer(tmp_path, models):
    """Independent check: character spans of the replies mapped through the fast tokenizer's offsets."""
    tok = load_tokenizer(str(models["llama"]))
    run = make_run(tmp_path / "run", models["llama"], prepare={"max_seq_len": 2048})
    from eagle3ops.stages.chatdata import load_conversations, resolve_dataset

    convs = load_conversations([resolve_dataset("builtin:sharegpt", run), resolve_dataset("builtin:messages", run)])
    for conv in convs:
        msgs = conv["messages"]
        enc = encode_conversation(tok, msgs)
        ids, mask = enc.input_ids, enc.loss_mask
        full = tok.apply_chat_template(msgs, tokenize=False)
        enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
        assert enc["input_ids"] == ids
        want = [0] * len(ids)
        for k, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            a = len(tok.apply_chat_template(msgs[:k], tokenize=False, add_generation_prompt=True))
            b = len(tok.apply_chat_template(msgs[: k + 1], tokenize=False))
            for j, (s, e) in enumerate(enc["offset_mapping"]):
                if s >= a and e <= b and e > s:
                    want[j] = 1
        assert mask == want, conv["source"]


def test_prepare_reads_jsonl_and_parquet_in_both_forms_alike(tmp_path, models):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(x) for x in Path(
        str(__import__("importlib.resources").resources.files("eagle3ops.data") / "chat_messages.jsonl")
    ).read_text().splitlines()][:6]
    sharegpt = [{"conversations": [{"from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]),
                                    "value": m["content"]} for m in r["messages"]]} for r in rows]
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sharegpt))
    pq.write_table(pa.Table.from_pylist([{"messages": r["messages"]} for r in rows]), data / "b.parquet")
    out = []
    for name in ("a.jsonl", "b.parquet"):
        run = make_run(tmp_path / name, models["llama-remote-code"],
                       prepare={"datasets": [str(data / name)], "shuffle": False})
        run_prepare(run, cfg_of(run), log=QUIET)
        out.append([(r["input_ids"], r["loss_mask"]) for r in read_samples(run)])
    assert out[0] == out[1] and len(out[0]) == 6


def _with_template(tmp_path: Path, model: Path, template: str) -> Path:
    """A copy of ``model`` whose tokenizer has ``template`` as its chat template."""
    out = tmp_path / f"{model.name}-template"
    shutil.copytree(model, out)
    tc = json.loads((out / "tokenizer_config.json").read_text())
    tc["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(tc))
    (out / "chat_template.jinja").unlink(missing_ok=True)
    return out


def test_prepare_renders_with_the_chat_template_serving_uses(tmp_path, models):
    """``prepare.chat_template`` as the extract window resolves it when serving runs with
    ``--chat-template`` (a file in the run directory, its sha256 and where it came from) renders the data with that
    template, not the tokenizer's own, and the manifest records which (sha256, source); the tokenizer's own
    otherwise; a missing file or one with another sha256 is refused naming the key."""
    import hashlib

    from eagle3ops.stages.prepare import SAMPLES

    template = ("{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}<<assistant>>{% endif %}")
    sha = hashlib.sha256(template.encode()).hexdigest()
    spec = {"file": "served-chat-template.jinja", "sha256": sha, "origin": "container 'vllm': --chat-template /t.j"}
    run = make_run(tmp_path / "served", models["llama"], prepare={"chat_template": spec})
    (run / "served-chat-template.jinja").write_text(template)
    run_prepare(run, cfg_of(run), log=QUIET)
    tok = load_tokenizer(str(models["llama"]))
    first = json.loads((run / "prepare" / SAMPLES).read_text().splitlines()[0])
    assert "<<assistant>>" in tok.decode(first["input_ids"])
    m = json.loads((run / "prepare/manifest.json").read_text())["tokenizer"]
    assert m["chat_template_sha256"] == sha and "served-chat-template.jinja" in m["chat_template_source"] \
        and spec["origin"] in m["chat_template_source"], m

    own = make_run(tmp_path / "own", models["llama"])
    run_prepare(own, cfg_of(own), log=QUIET)
    mo = json.loads((own / "prepare/manifest.json").read_text())["tokenizer"]
    assert mo["chat_template_sha256"] == hashlib.sha256(tok.chat_template.encode()).hexdigest() != sha
    assert mo["chat_template_source"].startswith("tokenizer"), mo
    assert "<<assistant>>" not in tok.decode(json.loads((own / "prepare" / SAMPLES).read_text().splitlines()[0])[
        "input_ids"])

    gone = make_run(tmp_path / "gone", models["llama"], prepare={"chat_template": spec})
    with pytest.raises(ValueError, match=r"prepare\.chat_template.*served-chat-template\.jinja"):
        run_prepare(gone, cfg_of(gone), log=QUIET)
    other = make_run(tmp_path / "other", models["llama"], prepare={"chat_template": spec})
    (other / "served-chat-template.jinja").write_text(template + " ")
    with pytest.raises(ValueError, match=r"prepare\.chat_template.*sha256"):
        run_prepare(other, cfg_of(other), log=QUIET)


def test_prepare_refuses_or_skips_a_template_without_the_prefix_property(tmp_path, models):
    # Earlier assistant turns are rendered as a placeholder (as templates that strip past reasoning do).
    model = _with_template(tmp_path, models["llama"], (
        "{% for m in messages %}<|{{ m.role }}|>\n"
        "{% if m.role == 'assistant' and not loop.last %}(earlier reply){% else %}{{ m.content }}{% endif %}"
        "<|eos|>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    ))
    run = make_run(tmp_path / "run", model)
    with pytest.raises(UnmaskableConversation, match=r"assistant turn 1: .*on_unmaskable: skip"):
        run_prepare(run, cfg_of(run), log=QUIET)
    run = make_run(tmp_path / "run2", model, prepare={"on_unmaskable": "skip", "max_seq_len": 2048})
    figures = run_prepare(run, cfg_of(run), log=QUIET)
    from eagle3ops.stages.chatdata import load_conversations, resolve_dataset

    specs = ("builtin:sharegpt", "builtin:messages")
    convs = [{**c, "source": f"{d}:{c['source'].rpartition(':')[2]}"}  # samples.jsonl names rows by the spec
             for d in specs for c in load_conversations([resolve_dataset(d, run)])]
    replies = [sum(m["role"] == "assistant" for m in c["messages"]) for c in convs]
    assert sum(1 for n in replies if n > 1) >= 5
    # Per turn: every conversation stays, its last reply is trained, only the earlier (rewritten) ones are not.
    assert figures["samples"] == 42 and figures["skipped"]["no_trained_turn"] == 0
    assert figures["turns"]["trained"] == 42 and figures["turns"]["not_trained"]["prefix_broken"] == sum(replies) - 42
    tok = load_tokenizer(str(model))
    by_source = {c["source"]: c["messages"] for c in convs}
    for row in read_samples(run):
        last = [m["content"] for m in by_source[row["source"]] if m["role"] == "assistant"][-1]
        assert _decoded_spans(tok, row) == [last + "<|eos|>\n"], row["source"]


#: Renders tools, tool calls, tool results (with the tool's name) and reasoning, the shape of Qwen2.5/Hermes
#: templates (tests/test_prepare_turns.py has the same one for the host tests).
TOOL_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}{{ '<|system|>\n# Tools\n' }}{% for t in tools %}{{ t | tojson }}{{ '\n' }}{% endfor %}"
    "{{ eos_token + '\n' }}{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' %}{{ '<|assistant|>\n' }}"
    "{% if m.reasoning_content %}{{ '<think>' + m.reasoning_content + '</think>\n' }}{% endif %}"
    "{{ m.content }}"
    "{% for c in m.tool_calls or [] %}"
    "{{ '<tool_call>' }}{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
    "{{ '</tool_call>' }}{% endfor %}"
    "{{ eos_token + '\n' }}"
    "{% elif m.role == 'tool' %}{{ '<|tool|>\n<tool_response name=\"' + (m.name or '') + '\">' + m.content }}"
    "{{ '</tool_response>' + eos_token + '\n' }}"
    "{% else %}{{ '<|' + m.role + '|>\n' + m.content + eos_token + '\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
TOOL_ROW = {
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": "Ask the tool.",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "18 C, sunny"},
        {"role": "assistant", "content": "It is 18 C and sunny in Paris."},
    ],
}
CALL_TEXT = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def _decoded_spans(tok, row) -> list[str]:
    return [tok.decode(row["input_ids"][a:b], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            for a, b in _runs(row["loss_mask"])]


def _prepare_rows(tmp_path: Path, model: Path, rows: list[dict], **prepare) -> tuple[dict, list[dict]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = make_run(tmp_path / "run", model, prepare={"datasets": [str(data)], "shuffle": False, **prepare})
    return run_prepare(run, cfg_of(run), log=QUIET), read_samples(run)


@pytest.mark.parametrize("kind", ["llama", "llama-remote-code"])
def test_prepare_trains_the_tool_call_turn_as_the_template_renders_it(tmp_path, models, kind):
    """The tool call stays in the training text and its turn is trained; the tool result is not."""
    model = _with_template(tmp_path, models[kind], TOOL_TEMPLATE)
    tok = load_tokenizer(str(model))
    figures, (row,) = _prepare_rows(tmp_path, model, [TOOL_ROW], max_seq_len=2048)
    text = tok.decode(row["input_ids"], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    assert CALL_TEXT in text and '<tool_response name="get_weather">18 C, sunny</tool_response>' in text
    assert _decoded_spans(tok, row) == [f"<think>Ask the tool.</think>\n{CALL_TEXT}<|eos|>\n",
                                        "It is 18 C and sunny in Paris.<|eos|>\n"]
    assert figures["turns"]["trained"] == 2 and figures["fields"]["not_rendered"] == {"tool_call_id": 1}
    if kind == "llama":  # independent check through the fast tokenizer's offsets
        full = tok.apply_chat_template([TOOL_ROW["messages"][0]], tokenize=False, tools=TOOL_ROW["tools"],
                                       add_generation_prompt=True)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        assert enc["input_ids"] == row["input_ids"]
        a = len(full)
        b = text.index("<|eos|>\n", a) + len("<|eos|>\n")
        assert [j for j, (s, e) in enumerate(enc["offset_mapping"]) if s >= a and e <= b and e > s] == \
            list(range(*_runs(row["loss_mask"])[0]))


def test_prepare_reads_tool_rows_from_parquet_as_from_jsonl(tmp_path, models):
    """Parquet gives every struct every field of the file's schema (as null): the training text must not change.

    (Struct fields take the order first seen in the file; a later definition whose keys come in another order is
    rendered in the file's order: the chatdata module doc says to store `tools` as a JSON string then.)
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    two_tools = {**TOOL_ROW, "tools": [{"type": "function", "function": {
        "name": "get_time", "description": "Local time of a city.", "parameters": {"type": "object"}}},
        *TOOL_ROW["tools"]]}  # get_weather has no description: null in Parquet
    rows = [two_tools, {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                                     {"role": "assistant", "content": "Hello."}]}]
    model = _with_template(tmp_path, models["llama-remote-code"], TOOL_TEMPLATE)
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), data / "b.parquet")
    out = []
    for name in ("a.jsonl", "b.parquet"):
        run = make_run(tmp_path / name, model,
                       prepare={"datasets": [str(data / name)], "shuffle": False, "max_seq_len": 2048})
        run_prepare(run, cfg_of(run), log=QUIET)
        out.append([(r["input_ids"], r["loss_mask"]) for r in read_samples(run)])
    assert out[0] == out[1] and len(out[0]) == 2


def test_prepare_reports_tool_fields_the_template_drops_and_does_not_train_the_emptied_turn(tmp_path, models):
    """With the tiny target's own template (role and content only)."""
    tok = load_tokenizer(str(models["llama"]))
    figures, (row,) = _prepare_rows(tmp_path, models["llama"], [TOOL_ROW])
    assert _decoded_spans(tok, row) == ["It is 18 C and sunny in Paris.<|eos|>\n"]
    assert figures["turns"]["not_trained"]["empty_reply"] == 1
    assert figures["fields"]["not_rendered"] == {"name": 1, "reasoning_content": 1, "tool_call_id": 1,
                                                 "tool_calls": 1, "tools": 1}


@pytest.mark.parametrize("kind", ["llama", "llama-remote-code"])
def test_prepare_keeps_the_replies_after_an_opening_assistant_turn(tmp_path, models, kind):
    """A ShareGPT conversation opened by the assistant no longer stops the stage or is dropped."""
    rows = [{"conversations": [{"from": "gpt", "value": "Hello! How can I help?"},
                               {"from": "human", "value": "Name one prime."}, {"from": "gpt", "value": "Seven."},
                               {"from": "human", "value": "And another?"}, {"from": "gpt", "value": "Eleven."}]}]
    tok = load_tokenizer(str(models[kind]))
    for mode in ("error", "skip"):
        figures, (row,) = _prepare_rows(tmp_path / mode, models[kind], rows, on_unmaskable=mode)
        assert _decoded_spans(tok, row) == ["Seven.<|eos|>\n", "Eleven.<|eos|>\n"]
        assert "Hello! How can I help?" not in tok.decode(row["input_ids"])
        assert figures["turns"]["trained"] == 2 and figures["turns"]["not_trained"]["no_prompt_before"] == 1


# ------------------------------------------------------------------------------------------------------ vocab


def test_vocab_sizes_t2d_from_the_target_config_and_keeps_speculators_convention(tmp_path, models):
    import numpy as np

    model = tmp_path / "wide"
    shutil.copytree(models["llama-remote-code"], model)
    conf = json.loads((model / "config.json").read_text())
    conf["vocab_size"] = 2304  # not the tokenizer's size: the stage must read the config
    (model / "config.json").write_text(json.dumps(conf))
    run = make_run(tmp_path / "run", model, vocab={"draft_vocab_size": 100})
    run_prepare(run, cfg_of(run), log=QUIET)
    figures = run_vocab(run, cfg_of(run), log=QUIET)
    d2t, t2d = np.load(run / "vocab/d2t.npy"), np.load(run / "vocab/t2d.npy")
    assert t2d.shape == (2304,) and t2d.dtype == bool and t2d.sum() == 100 == d2t.shape[0]
    assert (np.arange(100) + d2t == np.nonzero(t2d)[0]).all()  # target id = draft id + d2t[draft id]
    freq = {int(k): v for k, v in json.loads((run / "vocab/token_freq.json").read_text()).items()}
    top = sorted(freq, key=lambda t: (-freq[t], t))[:100]
    assert set(top) == set(np.nonzero(t2d)[0].tolist())
    assert figures["target_vocab_size"] == 2304 and 0 < figures["coverage"] < 1
    run_big = make_run(tmp_path / "run2", model, vocab={"draft_vocab_size": 5000})
    run_prepare(run_big, cfg_of(run_big), log=QUIET)
    with pytest.raises(ValueError, match=r"draft_vocab_size \(5000\) is larger than the target vocabulary \(2304"):
        run_vocab(run_big, cfg_of(run_big), log=QUIET)


# ---------------------------------------------------------------------------------------------------- extract


def _check_disk(run: Path, hidden: int) -> int:
    m = json.loads((run / "extract/manifest.json").read_text())
    assert m["hidden_bytes_per_token"] == 4 * hidden * 2
    total = 0
    for s in m["sample_files"]:
        d = torch.load(run / "extract" / s["file"], weights_only=True)
        assert len(d["hidden_states"]) == 4
        for h in d["hidden_states"]:
            assert h.dtype == torch.bfloat16 and tuple(h.shape) == (s["tokens"], hidden)
            assert h.untyped_storage().nbytes() == s["tokens"] * hidden * 2  # no oversized storage saved
        size = (run / "extract" / s["file"]).stat().st_size
        payload = s["tokens"] * (4 * hidden * 2 + 8 + 8)  # hidden states + long ids + long mask
        assert payload <= size <= payload + 4096, (s, size, payload)  # zip/pickle framing only
        total += s["tokens"] * 4 * hidden * 2
    assert total == m["hidden_bytes"] == m["tokens"] * 4 * hidden * 2
    return total


def test_extract_layer_convention_and_vllm_layer_ids(models):
    """Captured layer j = output of decoder layer j = transformers' hidden_states[j + 1] = what vLLM's EAGLE-3
    target captures for aux id j + 1 (the input of layer j + 1); the last layer is captured before the norm."""
    from transformers import AutoModelForCausalLM

    path = str(models["llama"])
    eng = TransformersEngine(path, [0, 1, 2, 3], device="cpu")
    ids = list(range(5, 60))
    got = eng.generate([ids])[0]["hidden_states"]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="eager")
    with torch.inference_mode():
        out = hf(torch.tensor([ids]), output_hidden_states=True)
    for j in range(3):
        assert torch.equal(got[j], out.hidden_states[j + 1][0])
    assert not torch.equal(got[3], out.hidden_states[4][0])  # transformers' last entry is after the final norm
    assert torch.allclose(hf.model.norm(got[3]).float(), out.hidden_states[4][0].float(), atol=1e-2)


def test_extract_writes_4_layers_bf16_per_token_and_resumes(tmp_path, models):
    run = make_run(tmp_path / "run", models["llama"], extract={"aux_layer_ids": [0, 1, 2], "batch_size": 8})
    run_prepare(run, cfg_of(run), log=QUIET)
    first = run_extract(run, cfg_of(run), log=QUIET)
    assert first["samples"] == 42 and first["layer_ids"] == [0, 1, 2, 3]
    _check_disk(run, 128)

    # A killed run: two files gone (one never written, one torn), manifest gone. The rerun redoes only those.
    files = sorted((run / "extract/hidden").iterdir())
    keep = {f: f.stat().st_mtime_ns for f in files[2:]}
    files[0].unlink()
    files[1].write_bytes(b"torn")
    (run / "extract/manifest.json").unlink()
    second = run_extract(run, cfg_of(run), log=QUIET)
    assert second["samples_this_run"] == 2 and second["samples"] == 42
    assert all(f.stat().st_mtime_ns == t for f, t in keep.items())
    _check_disk(run, 128)

    # Other layers asked for: the old files are not mixed in.
    cfg = json.loads((run / "pipeline.yaml").read_text())
    cfg["extract"]["aux_layer_ids"] = [0, 1, 2]
    cfg["extract"]["batch_size"] = 4  # extract section changed -> state differs
    (run / "pipeline.yaml").write_text(json.dumps(cfg))
    with pytest.raises(StageInputError, match="--restart"):
        run_extract(run, cfg_of(run), log=QUIET)
    assert run_extract(run, cfg_of(run), log=QUIET, restart=True)["samples_this_run"] == 42


def test_extract_shards_on_three_run_dirs_merge_to_the_one_host_run(tmp_path, models):
    """``--shard`` ranges extracted in three run directories (three hosts' data dirs) give, merged, the
    same samples, token ids and hidden states as one whole run; a shard rerun is a no-op, a shard past the prepared
    samples is refused."""
    from eagle3ops.stages.merge import check_merged, merge_manifests
    from eagle3ops.fleet.shard import shard_ranges
    from eagle3ops.stages.shards import finished_shard, manifest_path

    whole = make_run(tmp_path / "whole", models["llama"], extract={"aux_layer_ids": [0, 1, 2]})
    run_prepare(whole, cfg_of(whole), log=QUIET)
    one = run_extract(whole, cfg_of(whole), log=QUIET)
    shards = shard_ranges(one["samples"], ["a", "b", "c"])
    dirs = {}
    for s in shards:
        dirs[s.host] = make_run(tmp_path / s.host, models["llama"], extract={"aux_layer_ids": [0, 1, 2]})
        run_prepare(dirs[s.host], cfg_of(dirs[s.host]), log=QUIET)
        got = run_extract(dirs[s.host], cfg_of(dirs[s.host]), log=QUIET, shard=(s.start, s.end))
        assert got["samples"] == s.samples and not (dirs[s.host] / "extract/manifest.json").exists()
        assert finished_shard(dirs[s.host], cfg_of(dirs[s.host]), (s.start, s.end)) is not None
    texts = {s.rank: manifest_path(dirs[s.host], (s.start, s.end)).read_text() for s in shards}
    merged = merge_manifests(shards, texts)
    ref = json.loads((whole / "extract/manifest.json").read_text())
    assert merged["sample_files"] == ref["sample_files"] and merged["tokens"] == ref["tokens"]
    check_merged(merged, (dirs["a"] / "prepare/manifest.json").read_text())
    for rec in ref["sample_files"]:
        host = next(s.host for s in shards if s.start <= rec["i"] < s.end)
        a = torch.load(whole / "extract" / rec["file"])
        b = torch.load(dirs[host] / "extract" / rec["file"])
        assert torch.equal(a["input_ids"], b["input_ids"])
        assert all(torch.equal(x, y) for x, y in zip(a["hidden_states"], b["hidden_states"], strict=True))
    with pytest.raises(StageInputError, match="ends past the"):
        run_extract(dirs["c"], cfg_of(dirs["c"]), log=QUIET, shard=(shards[2].start, one["samples"] + 1))
    stage = [sys.executable, "-m", "eagle3ops", "stage", "extract", "--run-dir", str(dirs["b"])]
    again = subprocess.run([*stage, "--shard", f"{shards[1].start}:{shards[1].end}"], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0 and "shard already done" in again.stdout, again.stdout + again.stderr
    bad = subprocess.run([*stage, "--shard", "9:3"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "write START:END" in bad.stderr


def test_extract_default_aux_layers_follow_speculators_and_fix_shallow_targets(tmp_path, models):
    from eagle3ops.stages.extract import resolve_layer_ids

    run = make_run(tmp_path / "run", models["llama"])
    assert resolve_layer_ids(cfg_of(run)) == ([0, 1, 2], 4, 128)  # speculators' [2, 2, 1] repeats a layer
    model = tmp_path / "deep"
    shutil.copytree(models["llama"], model)
    conf = json.loads((model / "config.json").read_text())
    conf["num_hidden_layers"] = 32
    (model / "config.json").write_text(json.dumps(conf))
    assert resolve_layer_ids(cfg_of(make_run(tmp_path / "r2", model)))[0] == [2, 16, 29]
    with pytest.raises(ValueError, match=r"extract.aux_layer_ids = \[1, 2, 3\].*\[0, 2\]"):
        resolve_layer_ids(cfg_of(make_run(tmp_path / "r3", models["llama"], extract={"aux_layer_ids": [1, 2, 3]})))


@pytest.mark.slow
def test_extract_with_vllm_matches_the_reference_forward(tmp_path, models):
    """speculators' (patched) VllmHiddenStatesGenerator on vLLM 0.16 CPU, through the stage CLI, against a
    transformers forward of the same bf16 weights. Tolerance: per layer, max |vLLM - ref| <= 0.03 * max |ref|
    (a few bf16 ulps at the tensor's scale: the two engines order their bf16 matmuls differently)."""
    run = make_run(tmp_path / "run", models["llama-remote-code"],
                   extract={"engine": "vllm", "batch_size": 64, "aux_layer_ids": [0, 1, 2]})
    run_prepare(run, cfg_of(run), log=QUIET)
    r = subprocess.run([sys.executable, "-m", "eagle3ops", "stage", "extract", "--run-dir", str(run)],
                       env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    _check_disk(run, 128)
    eng = TransformersEngine(str(models["llama-remote-code"]), [0, 1, 2, 3], device="cpu")
    rows = read_samples(run)
    refs = eng.generate([row["input_ids"] for row in rows])
    for row, ref in zip(rows, refs, strict=True):
        d = torch.load(run / f"extract/hidden/data_{row['i']:06d}.pt", weights_only=True)
        assert d["input_ids"].tolist() == row["input_ids"] and d["loss_mask"].tolist() == row["loss_mask"]
        for got, want in zip(d["hidden_states"], ref["hidden_states"], strict=True):
            err = (got.float() - want.float()).abs().max().item()
            assert err <= 0.03 * want.float().abs().max().item(), (row["i"], err)


# ------------------------------------------------------------------------------------------------------ train


@pytest.fixture(scope="module")
def trained_base(tmp_path_factory, models) -> Path:
    """A run with prepare, extract (reference engine) and vocab done; train not yet."""
    run = make_run(tmp_path_factory.mktemp("train") / "base", models["llama"],
                   extract={"aux_layer_ids": [0, 1, 2]})
    cfg = cfg_of(run)
    run_prepare(run, cfg, log=QUIET)
    run_extract(run, cfg, log=QUIET)
    run_vocab(run, cfg, log=QUIET)
    return run


def _copy(run: Path, dst: Path) -> Path:
    shutil.copytree(run, dst)
    return dst


def test_teacher_logits_are_the_targets_real_logits(trained_base, models):
    """The training targets (lm_head of the normed last layer) equal the target model's own logits."""
    from transformers import AutoModelForCausalLM

    path = str(models["llama"])
    w, eps = target_final_norm(path)
    f = standardize_with_norm(w, eps)
    d = torch.load(trained_base / "extract/hidden/data_000000.pt", weights_only=True)
    std = f(d)
    assert std["hidden_states"].shape[-1] == 3 * 128
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.inference_mode():
        logits = hf(d["input_ids"][None]).logits[0]
        teacher = hf.lm_head(std["verifier_last_hidden_states"].float())
        raw = hf.lm_head(d["hidden_states"][-1].float())  # speculators 0.3.0's teacher (no final norm)
    scale = logits.abs().max().item()
    assert (teacher - logits).abs().max().item() < 0.05 * scale
    assert (raw - logits).abs().max().item() > 0.2 * scale  # the unnormed one is far off: the fix matters


def test_train_resumes_to_the_same_weights_as_an_uninterrupted_run(tmp_path, trained_base):
    from safetensors.torch import load_file

    straight = _copy(trained_base, tmp_path / "straight")
    fig = run_train(straight, cfg_of(straight), log=QUIET)
    assert fig["steps"] == 4 and fig["resumed_from_step"] == 0 and fig["device"] == "cpu"
    assert all(map(lambda x: x == x, [fig["first_loss"], fig["final_metrics"]["loss"]]))

    cut = _copy(trained_base, tmp_path / "cut")
    assert run_train(cut, cfg_of(cut), log=QUIET, stop_after=3) == {"stopped_at": 3}  # interrupted
    assert not (cut / "train/manifest.json").exists() and not (cut / "train/final").exists()
    fig2 = run_train(cut, cfg_of(cut), log=QUIET)
    assert fig2["resumed_from_step"] == 3 and fig2["steps_this_run"] == 1
    a, b = load_file(straight / "train/final/model.safetensors"), load_file(cut / "train/final/model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    losses = [json.loads(x)["loss"] for x in (cut / "train/metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 4
    assert sorted(p.name for p in (cut / "train/checkpoints").iterdir()) == ["best", "step_00000003", "step_00000004"]
    # the held-out curve carried across the resume: the same measurements and choice as the uninterrupted run
    choice = [json.loads((r / "train/manifest.json").read_text())["checkpoint_choice"] for r in (straight, cut)]
    assert choice[0] == choice[1] and [e["step"] for e in choice[0]["curve"]] == [2, 4]


def test_train_ships_the_best_held_out_checkpoint_and_the_lk_loss_trains_the_same_batches(tmp_path, trained_base):
    """``train.select_checkpoint: held_out`` (the default): every checkpoint is measured on the held-out samples
    and the final head is the best one's weights (bf16), its estimate the manifest's; ``train.loss: lk_hybrid``
    trains on the same batches, seed and steps as ``kl`` and reaches other weights; ``select_checkpoint: last``
    ships the last step, as before."""
    from safetensors.torch import load_file

    from eagle3ops.stages.trainplan import choose_checkpoint

    runs = {}
    for name, train in (("kl", {}), ("lk", {"loss": "lk_hybrid"}), ("last", {"select_checkpoint": "last"})):
        run = _copy(trained_base, tmp_path / name)
        raw = json.loads((run / "pipeline.yaml").read_text())
        raw["train"] = {**raw["train"], "steps": 6, "lr": 3e-3, **train}
        (run / "pipeline.yaml").write_text(json.dumps(raw))
        run_train(run, cfg_of(run), log=QUIET)
        runs[name] = (run, json.loads((run / "train/manifest.json").read_text()))
    for name in ("kl", "lk"):
        run, man = runs[name]
        choice = man["checkpoint_choice"]
        assert choice["by"] == "held-out acceptance length" and [e["step"] for e in choice["curve"]] == [2, 4, 6]
        best = choose_checkpoint(choice["curve"])
        assert choice["step"] == best["step"] and man["offline_estimate"]["acceptance_length"] == \
            best["acceptance_length"] and man["offline_estimate"]["per_position"] == best["per_position"]
        final = load_file(run / "train/final/model.safetensors")
        kept = load_file(run / "train/checkpoints/best/model.safetensors")
        assert json.loads((run / "train/checkpoints/best/state.json").read_text())["step"] == best["step"]
        for k, v in final.items():
            assert torch.equal(v, kept[k].to(torch.bfloat16) if kept[k].is_floating_point() else kept[k]), (name, k)
    assert runs["kl"][1]["loss"] == {"kind": "kl"} and runs["lk"][1]["loss"] == {"kind": "lk_hybrid", "lk_eta": 3.0}
    metrics = {n: [json.loads(x) for x in (r / "train/metrics.jsonl").read_text().splitlines()]
               for n, (r, _m) in runs.items()}
    assert [m["samples"] for m in metrics["kl"]] == [m["samples"] for m in metrics["lk"]]  # the same batches
    assert metrics["kl"][0]["loss"] != pytest.approx(metrics["lk"][0]["loss"], rel=1e-3)  # another objective
    assert [m["loss"] for m in metrics["kl"]] == [m["loss"] for m in metrics["last"]]  # measuring changes nothing
    last_run, last_man = runs["last"]
    assert last_man["checkpoint_choice"] == {"by": "last step", "step": 6}
    assert not (last_run / "train/checkpoints/best").exists()
    final = load_file(last_run / "train/final/model.safetensors")
    step6 = load_file(last_run / "train/checkpoints/step_00000006/model.safetensors")
    assert all(torch.equal(v, step6[k].to(torch.bfloat16)) for k, v in final.items() if v.is_floating_point())


def test_dense_attention_equals_speculators_flex_attention(trained_base):
    """train.attention: dense (the CPU default) gives speculators' flex-attention loss and gradients."""
    import numpy as np
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.data import Eagle3SampleFileDataset, create_collate_fn

    from eagle3ops.stages.draft import build_draft_config, register_dense_attention

    torch._dynamo.config.disable = True
    run, cfg = trained_base, cfg_of(trained_base)
    d2t = torch.from_numpy(np.load(run / "vocab/d2t.npy"))
    t2d = torch.from_numpy(np.load(run / "vocab/t2d.npy"))
    m = json.loads((run / "extract/manifest.json").read_text())
    w, eps = target_final_norm(cfg.target_model)
    ds = Eagle3SampleFileDataset(max_len=512, file_list=[str(run / "extract" / s["file"]) for s in m["sample_files"]],
                                 standardize_fn=standardize_with_norm(w, eps))
    batch = create_collate_fn(512)([ds[i] for i in range(6)])
    assert len(batch["lengths"]) > 1  # several packed documents: the document mask matters
    out = []
    for impl in ("simple_flex_attention", register_dense_attention()):
        torch.manual_seed(0)
        model = Eagle3DraftModel(build_draft_config(cfg, [0, 1, 2], 256, impl), t2d=t2d, d2t=d2t)
        _, loss, _ = model(**batch, ttt_steps=3)
        loss.backward()
        out.append((loss.detach(), model.fc.weight.grad.clone()))
    assert torch.allclose(out[0][0], out[1][0], rtol=1e-5, atol=1e-7)
    assert torch.allclose(out[0][1], out[1][1], rtol=1e-4, atol=1e-7)


def test_train_manifest_carries_the_offline_estimate_from_held_out_samples(tmp_path, trained_base):
    """The train manifest holds a teacher-forced acceptance-length estimate measured on samples the head
    never trained on: 1 + the sum of full_acc_k over positions, each a rate in [0, 1]."""
    from eagle3ops.stages.train import held_out_indices
    from eagle3ops.stages.trainplan import held_out_of

    run = _copy(trained_base, tmp_path / "run")
    fig = run_train(run, cfg_of(run), log=QUIET)
    est = json.loads((run / "train/manifest.json").read_text())["offline_estimate"]
    assert est == fig["offline_estimate"] and "optimistic" in est["kind"]
    samples = json.loads((run / "extract/manifest.json").read_text())["sample_files"]
    n = len(samples)
    assert all(isinstance(s["content"], list) for s in samples)  # prepare's content keys reach train
    held = held_out_of(samples, cfg_of(run).train.held_out_fraction, cfg_of(run).seed)
    assert held == held_out_indices(n, cfg_of(run).train.held_out_fraction, cfg_of(run).seed,
                                    [s["content"] for s in samples])  # held out by content
    split = json.loads((run / "train/manifest.json").read_text())["held_out_split"]
    assert split["by"] == "content" and split["held_out_samples"] == len(held) and split["conversations"] == n
    assert est["held_out_samples"] == len(held) >= 1 and est["held_out_tokens"] > 0
    per = {int(k): v for k, v in est["per_position"].items()}
    assert sorted(per) == list(range(cfg_of(run).train.ttt_steps)) and all(0 <= v <= 1 for v in per.values())
    assert est["acceptance_length"] == pytest.approx(1 + sum(per.values()), abs=1e-5)
    assert all(per[k] >= per[k + 1] - 1e-9 for k in range(len(per) - 1))  # all-correct-so-far cannot grow
    # the held-out samples are not in what the stage trained on
    assert held_out_indices(n, 0.0, 0) == set() and len(held_out_indices(n, 0.99, 0)) < n


def test_an_outside_heads_estimate_on_the_runs_held_out_hidden_states(tmp_path, models):
    """``speculate --head`` estimates a head from elsewhere before any restart, on the hidden states
    the host has from the run: the run's own head, shipped as an outside head travels (no ``embed_tokens``: vLLM
    takes the target's; its verifier path from another machine), gets the train manifest's estimate on the same
    held-out samples (bf16 weights vs the fp32 ones the manifest measured); the same head with its lm_head rows
    shifted gets less (the estimate reads the head's own weights); a token bound takes fewer samples; a head trained on
    other aux layers than the run extracted is not estimated on them, and the reason names both. 40 steps at lr
    3e-3 (16 s here) give the tiny target's head a held-out acceptance above 1 (4 steps: exactly 1.0, which any
    head would match)."""
    from safetensors.torch import load_file, save_file

    from eagle3ops.stages.estimate import estimate_head

    run = make_run(tmp_path / "run", models["llama"], extract={"aux_layer_ids": [0, 1, 2]},
                   train={"steps": 40, "lr": 3e-3, "checkpoint_every": 1000})
    cfg = cfg_of(run)
    for stage in (run_prepare, run_extract, run_vocab, run_train):
        stage(run, cfg, log=QUIET)
    manifest = json.loads((run / "train/manifest.json").read_text())["offline_estimate"]
    assert manifest["acceptance_length"] > 1.1, manifest  # else the comparison below shows nothing
    head = tmp_path / "head"
    head.mkdir()
    sd = load_file(run / "train/final/model.safetensors")
    save_file({k: v for k, v in sd.items() if not k.startswith("embed_tokens")}, head / "model.safetensors")
    conf = json.loads((run / "train/final/config.json").read_text())
    conf["speculators_config"]["verifier"]["name_or_path"] = "/elsewhere/target"
    (head / "config.json").write_text(json.dumps(conf))

    est = estimate_head(head, run, models["llama"], max_tokens=10**6)
    assert est["held_out_samples"] == manifest["held_out_samples"], est
    assert est["held_out_tokens"] == manifest["held_out_tokens"], est
    assert est["acceptance_length"] == pytest.approx(manifest["acceptance_length"], abs=0.05), (est, manifest)
    assert sorted(est["per_position"]) == sorted(manifest["per_position"])
    assert "held-out" in est["source"] and est["missing_from_head"] == ["embed_tokens.weight"], est
    from eagle3ops.speculate import onhost  # the inspect helper's glue: the run's name, the bound, no exception

    assert onhost._estimate({"run": "r1", "max_tokens": 10**6}, head, models["llama"], run) == {
        **est, "source": est["source"].replace(f"run {run.name}'s", "run r1's")}
    assert "no directory" in onhost._estimate({"run": "r1"}, head, models["llama"], tmp_path / "gone")["unavailable"]

    rolled = tmp_path / "rolled"  # its lm_head rows shifted by one: every draft token is the wrong one
    shutil.copytree(head, rolled)
    w = load_file(rolled / "model.safetensors")
    save_file({**w, "lm_head.weight": torch.roll(w["lm_head.weight"], 1, dims=0)}, rolled / "model.safetensors")
    assert estimate_head(rolled, run, models["llama"])["acceptance_length"] < est["acceptance_length"] - 0.1

    small = estimate_head(head, run, models["llama"], max_tokens=1)
    assert small["held_out_samples"] == 1 and small["held_out_tokens"] <= est["held_out_tokens"], small

    conf["eagle_aux_hidden_state_layer_ids"] = [1, 2, 4]
    (head / "config.json").write_text(json.dumps(conf))
    off = estimate_head(head, run, models["llama"], max_tokens=10**6)
    assert "eagle_aux_hidden_state_layer_ids" in off["unavailable"] and "[1, 2, 4]" in off["unavailable"] \
        and "[1, 2, 3]" in off["unavailable"], off


def test_train_final_checkpoint_format(tmp_path, trained_base):
    run = _copy(trained_base, tmp_path / "run")
    run_train(run, cfg_of(run), log=QUIET)
    final = run / "train/final"
    conf = json.loads((final / "config.json").read_text())
    assert conf["speculators_model_type"] == "eagle3" and conf["draft_vocab_size"] == 256
    assert conf["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # vLLM's convention: extracted ids + 1
    assert conf["speculators_config"]["verifier"]["name_or_path"] == cfg_of(run).target_model
    assert conf["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    from safetensors.torch import load_file

    sd = load_file(final / "model.safetensors")
    assert sd["fc.weight"].shape == (128, 384) and sd["lm_head.weight"].shape == (256, 128)
    assert sd["d2t"].shape == (256,) and sd["t2d"].shape == (2048,) and "verifier_lm_head.weight" not in sd
    assert sd["fc.weight"].dtype == torch.bfloat16 and conf["dtype"] == "bfloat16"


VLLM_LOAD = r"""
import json, sys
if __name__ == "__main__":
    import torch
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model
    target, draft, port = sys.argv[1], sys.argv[2], sys.argv[3]
    spec = {"method": "eagle3", "model": draft, "num_speculative_tokens": 3}
    vc = EngineArgs(model=target, speculative_config=spec, enforce_eager=True, max_model_len=512,
                    dtype="bfloat16").create_engine_config()
    sc = vc.speculative_config
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo")
        initialize_model_parallel(1, 1)
        m = get_model(vllm_config=vc, model_config=sc.draft_model_config)
    sd = load_file(draft + "/model.safetensors")
    p = dict(m.named_parameters())
    same = {
        "d2t": torch.equal(m.draft_id_to_target_id.cpu(), sd["d2t"].to(m.draft_id_to_target_id.dtype)),
        "fc": torch.equal(p["model.fc.weight"].cpu(), sd["fc.weight"]),
        "lm_head": torch.equal(p["lm_head.weight"].cpu(), sd["lm_head.weight"]),
        "qkv": torch.equal(p["model.layers.0.self_attn.qkv_proj.weight"].cpu(), torch.cat(
            [sd["layers.0.self_attn.q_proj.weight"], sd["layers.0.self_attn.k_proj.weight"],
             sd["layers.0.self_attn.v_proj.weight"]])),
        "embed": torch.equal(p["model.embed_tokens.weight"].cpu(), sd["embed_tokens.weight"]),
    }
    print("RESULT " + json.dumps({"method": sc.method, "k": sc.num_speculative_tokens, "cls": type(m).__name__,
          "aux": list(sc.draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids), "same": same}))
    from vllm import LLM
    try:
        LLM(model=target, speculative_config=spec, enforce_eager=True, max_model_len=512, dtype="bfloat16")
        print("SERVE ok")
    except Exception as exc:  # vLLM 0.16's CPU model runner has no spec decode
        print("SERVE failed " + repr(exc))
"""


@pytest.mark.slow
def test_final_checkpoint_loads_as_vllm_eagle3_draft(tmp_path, trained_base):
    """vLLM 0.16 parses the final checkpoint as an EAGLE-3 speculator and loads every weight into its
    Eagle3LlamaForCausalLM. Serving with it needs a GPU: vLLM 0.16's CPU model runner asserts
    ``speculative_config is None`` ("spec decode is not supported"), which this test records."""
    run = _copy(trained_base, tmp_path / "run")
    run_train(run, cfg_of(run), log=QUIET)
    script = tmp_path / "load.py"
    script.write_text(VLLM_LOAD)
    r = subprocess.run([sys.executable, str(script), cfg_of(run).target_model, str(run / "train/final"), "29541"],
                       env=ENV, capture_output=True, text=True, timeout=900)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(line.removeprefix("RESULT "))
    assert res["method"] == "eagle3" and res["k"] == 3 and res["cls"] == "Eagle3LlamaForCausalLM"
    assert res["aux"] == [1, 2, 3]
    assert all(res["same"].values()), res["same"]
    serve = next(x for x in r.stdout.splitlines() if x.startswith("SERVE "))
    # Recorded limit of vLLM 0.16 CPU. If a later CPU build runs spec decode this fails: then assert a real
    # generate() with the draft here instead.
    assert serve.startswith("SERVE failed"), serve
    assert "spec decode is not supported" in r.stdout + r.stderr


# ------------------------------------------------------------------------------------------------ end to end


@pytest.mark.slow
def test_deepseek_v3_target_extracts_with_vllm_and_trains(tmp_path, models):
    """A tiny DeepSeek-V3 (MLA + MoE, the class of Kimi-K2.5's backbone): vLLM extraction on CPU (MLA expanded:
    VLLM_MLA_DISABLE set by the stage) against the transformers reference, then vocab and train. Tolerance per
    token, as a quantile (FACTS.md: near-tied expert choices flip under bf16 rounding): per layer, the per-token
    max |vLLM - ref| / max |ref| has median <= 0.01 and exceeds 0.05 on at most 3 % of tokens."""
    model = build_tiny_model(tmp_path / "ds", kind="deepseek-v3")
    run = make_run(tmp_path / "run", model, prepare={"max_samples": 12},
                   extract={"engine": "vllm", "aux_layer_ids": [0, 1, 2]}, train={"steps": 2})
    run_prepare(run, cfg_of(run), log=QUIET)
    env = {k: v for k, v in ENV.items() if k != "VLLM_MLA_DISABLE"}
    r = subprocess.run([sys.executable, "-m", "eagle3ops", "stage", "extract", "--run-dir", str(run)],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    _check_disk(run, 128)
    eng = TransformersEngine(str(model), [0, 1, 2, 3], device="cpu")
    rows = read_samples(run)
    refs = eng.generate([row["input_ids"] for row in rows])
    per_layer: list[list] = [[], [], [], []]
    for row, ref in zip(rows, refs, strict=True):
        d = torch.load(run / f"extract/hidden/data_{row['i']:06d}.pt", weights_only=True)
        for j, (got, want) in enumerate(zip(d["hidden_states"], ref["hidden_states"], strict=True)):
            w = want.float()
            per_layer[j].append((got.float() - w).abs().amax(-1) / w.abs().amax().clamp_min(1e-6))
    for j, errs in enumerate(per_layer):
        e = torch.cat(errs)
        assert e.median().item() <= 0.01 and (e > 0.05).float().mean().item() <= 0.03, (j, e.median(), e.max())
    run_vocab(run, cfg_of(run), log=QUIET)
    fig = run_train(run, cfg_of(run), log=QUIET)
    assert fig["steps"] == 2
    layer = json.loads((run / "train/final/config.json").read_text())["transformer_layer_config"]
    assert layer["head_dim"] == 32 and layer["num_attention_heads"] == 4  # hidden / heads, not MLA's rope dim
