"""Host-side tests of the stage plumbing that needs no torch: pipeline.yaml validation, chat data normalization,
manifests and the refusal of inconsistent inputs, and the stage CLI's error path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3ops.config.pipeline import PipelineConfig, PipelineConfigError, load_pipeline_config
from eagle3ops.stages.chatdata import ChatDataError, load_conversations, normalize_row, resolve_dataset
from eagle3ops.stages.cli import app
from eagle3ops.stages.manifest import StageInputError, check_inputs, file_entry, write_manifest


def _write(run: Path, text: str) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "pipeline.yaml").write_text(text)
    return run


def test_minimal_config_gets_documented_defaults(tmp_path):
    cfg = load_pipeline_config(_write(tmp_path, "target_model: /model\n"))
    assert cfg.target_model == "/model"
    assert cfg.prepare.datasets == ["builtin:sharegpt", "builtin:messages"]
    assert cfg.extract.aux_layer_ids is None and cfg.extract.tensor_parallel_size == "auto"
    assert cfg.vocab.draft_vocab_size == 32000
    assert cfg.train.nproc == "auto"  # one process per visible GPU
    assert load_pipeline_config(_write(tmp_path, "target_model: /m\ntrain: {nproc: 2}\n")).train.nproc == 2
    assert cfg.effective_max_model_len() == cfg.prepare.max_seq_len + 1


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("target_model: /m\ntrian: {steps: 3}\n", "unknown key `trian`"),
        ("target_model: /m\ntrain: {stepz: 3}\n", "unknown key `train.stepz`"),
        ("prepare: {max_seq_len: 64}\n", "missing required key `target_model`"),
        ("target_model: /m\nextract: {aux_layer_ids: [3, 1, 2]}\n", "key `extract.aux_layer_ids`"),
        ("target_model: /m\nextract: {aux_layer_ids: [1, 2]}\n", "needs exactly 3 layer ids"),
        ("target_model: /m\nprepare: {max_seq_len: 512}\nextract: {max_model_len: 512}\n", "max_seq_len + 1"),
        ("target_model: /m\ntrain: {lr: -1}\n", "key `train.lr`"),
        ("target_model: /m\nextract: {tensor_parallel_size: 0}\n", "key `extract.tensor_parallel_size`"),
        ("target_model: /m\ntrain: {nproc: 0}\n", "key `train.nproc`"),
        ("- a\n- b\n", "expected a mapping"),
    ],
)
def test_bad_config_names_file_and_key(tmp_path, text, needle):
    run = _write(tmp_path / "run", text)
    with pytest.raises(PipelineConfigError) as exc:
        load_pipeline_config(run)
    assert str(run / "pipeline.yaml") in str(exc.value)
    assert needle in str(exc.value)


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(PipelineConfigError, match=r"pipeline\.yaml: not found"):
        load_pipeline_config(tmp_path)


def test_both_chat_forms_normalize_to_the_same_messages():
    sharegpt = {"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "Q"},
                                  {"from": "gpt", "value": "A"}]}
    openai = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                           {"role": "assistant", "content": [{"type": "text", "text": "A"}]}]}
    want = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "A"}]
    assert normalize_row(sharegpt, "x") == want
    assert normalize_row(openai, "x") == want


TOOL_ROW = {
    "id": "tool-1",
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    "messages": [
        {"role": "user", "content": "Weather in Paris?", "weight": 1},
        {"role": "assistant", "content": None, "reasoning_content": "Ask the tool.",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "18 C, sunny"},
        {"role": "assistant", "content": "It is 18 C and sunny in Paris.", "tool_calls": []},
    ],
}


def test_openai_tool_messages_keep_every_field_the_template_can_render():
    """A message's tool_calls, tool_call_id, name and reasoning_content reach the template as vLLM passes them."""
    from collections import Counter

    from eagle3ops.stages.chatdata import row_tools

    ignored: Counter = Counter()
    msgs = normalize_row(TOOL_ROW, "t.jsonl:1", ignored)
    assert msgs[1] == {
        "role": "assistant", "content": "", "reasoning_content": "Ask the tool.", "reasoning": "Ask the tool.",
        # arguments parsed from the JSON string, as vLLM 0.16's _postprocess_messages does
        "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    }
    assert msgs[2] == {"role": "tool", "content": "18 C, sunny", "tool_call_id": "c1", "name": "get_weather"}
    assert msgs[3] == {"role": "assistant", "content": "It is 18 C and sunny in Paris."}  # empty list dropped
    assert ignored == {"weight": 1}  # a field the template never sees is counted, not silently lost
    assert row_tools(TOOL_ROW, "t.jsonl:1") == TOOL_ROW["tools"]


def test_tool_rows_from_a_file_carry_tools_and_ignored_fields(tmp_path):
    path = tmp_path / "tools.jsonl"
    path.write_text(json.dumps(TOOL_ROW) + "\n")
    (conv,) = load_conversations([path])
    assert conv["tools"] == TOOL_ROW["tools"] and conv["ignored_fields"] == {"weight": 1}
    assert conv["messages"][1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}


@pytest.mark.parametrize(
    ("turn", "needle"),
    [
        ({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]},
         r"x\.jsonl:4: turn 1: tool_calls\[0\]\.function\.arguments is not valid JSON"),
        ({"role": "assistant", "tool_calls": [{"name": "f"}]}, r"turn 1: tool_calls\[0\] needs a `function` object"),
        ({"role": "assistant", "tool_calls": {"name": "f"}}, r"turn 1: `tool_calls` must be a list"),
        ({"role": "tool", "content": "x", "tool_call_id": 7}, r"turn 1: `tool_call_id` must be a string"),
        ({"role": "assistant", "content": "a", "reasoning": "r1", "reasoning_content": "r2"},
         r"turn 1: `reasoning_content` and `reasoning` differ"),
    ],
)
def test_malformed_tool_fields_are_errors_naming_row_turn_and_field(turn, needle):
    with pytest.raises(ChatDataError, match=needle):
        normalize_row({"messages": [{"role": "user", "content": "q"}, turn]}, "x.jsonl:4")


def test_content_parts_are_joined_as_vllm_joins_them():
    """vLLM's `string` content format joins text parts with a newline; training text must be the served text."""
    row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                        {"role": "assistant", "content": "c"}]}
    assert normalize_row(row, "x")[0]["content"] == "a\nb"


def test_null_fields_count_as_absent_as_parquet_rows_have_them():
    from eagle3ops.stages.chatdata import row_tools

    row = {"messages": [{"role": "user", "content": "q", "tool_calls": None, "name": None, "weight": None},
                        {"role": "assistant", "content": "a", "tool_call_id": None, "reasoning": None}],
           "tools": None}
    assert normalize_row(row, "x") == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert row_tools(row, "x") is None
    tools = [{"type": "function", "function": {"name": "f", "description": None, "parameters": {"type": "object"}}}]
    assert row_tools({"tools": tools}, "x") == [{"type": "function", "function": {"name": "f",
                                                                                  "parameters": {"type": "object"}}}]
    assert row_tools({"tools": json.dumps(tools)}, "x") == row_tools({"tools": tools}, "x")
    with pytest.raises(ChatDataError, match=r"x: `tools` must be a list of tool definitions"):
        row_tools({"tools": {"name": "f"}}, "x")


def test_unknown_role_and_missing_turns_are_errors_naming_the_row():
    with pytest.raises(ChatDataError, match=r"f\.jsonl:3: turn 1 has unknown role `narrator`"):
        normalize_row({"messages": [{"role": "user", "content": "q"}, {"role": "narrator", "content": "x"}]},
                      "f.jsonl:3")
    with pytest.raises(ChatDataError, match="no `conversations`"):
        normalize_row({"text": "hello"}, "f.jsonl:1")


def test_builtin_datasets_hold_both_forms_and_varied_conversations(tmp_path):
    paths = [resolve_dataset("builtin:sharegpt", tmp_path), resolve_dataset("builtin:messages", tmp_path)]
    first = json.loads(paths[0].read_text().splitlines()[0])
    second = json.loads(paths[1].read_text().splitlines()[0])
    assert "conversations" in first and "messages" in second
    convs = load_conversations(paths)
    assert len(convs) >= 40 and all(c["messages"] for c in convs)
    assert sum(1 for c in convs if sum(m["role"] == "assistant" for m in c["messages"]) > 1) >= 5  # multi-turn
    assert sum(1 for c in convs if c["messages"][0]["role"] == "system") >= 5
    assert len({c["messages"][-1]["content"] for c in convs}) == len(convs)
    with pytest.raises(ChatDataError, match="unknown builtin dataset"):
        resolve_dataset("builtin:nope", tmp_path)


def test_jsonl_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": []}\n{not json}\n')
    with pytest.raises(ChatDataError, match=r"bad\.jsonl:2: not valid JSON"):
        load_conversations([bad])
    rows = load_conversations([_one(tmp_path / "q.jsonl", [{"role": "user", "content": "only a question"}])])
    assert rows[0]["messages"] is None and rows[0]["reason"] == "no assistant turn"


def _one(path: Path, messages: list[dict]) -> Path:
    path.write_text(json.dumps({"messages": messages}) + "\n")
    return path


def _fake_stage(run: Path, cfg: PipelineConfig, stage: str, name: str, data: bytes) -> Path:
    d = run / stage
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)
    write_manifest(run, stage, cfg, {name: file_entry(d / name)}, samples=1)
    return d / name



def _upstream_made(tmp_path: Path) -> tuple[Path, PipelineConfig]:
    """A run whose prepare, extract and vocab outputs are made (stand-in files, one manifest each): train's inputs."""
    run = _write(tmp_path / "run", "target_model: /m\n")
    cfg = load_pipeline_config(run)
    _fake_stage(run, cfg, "prepare", "samples.jsonl", b"{}\n")
    _fake_stage(run, cfg, "extract", "data.pt", b"x")
    _fake_stage(run, cfg, "vocab", "d2t.npy", b"y")
    return run, cfg

def test_inputs_are_checked_and_refusals_name_file_and_stage(tmp_path):
    run = _write(tmp_path / "run", "target_model: /m\n")
    cfg = load_pipeline_config(run)
    with pytest.raises(StageInputError) as exc:
        check_inputs(run, "extract", cfg)
    assert f"{run / 'prepare' / 'manifest.json'} is missing" in str(exc.value)
    assert f"python -m eagle3ops stage prepare --run-dir {run}" in str(exc.value)

    samples = _fake_stage(run, cfg, "prepare", "samples.jsonl", b"{}\n")
    assert check_inputs(run, "extract", cfg, hash_files=True)["prepare"]["samples"] == 1

    samples.write_bytes(b"{}\n{}\n")  # another size
    with pytest.raises(StageInputError, match=r"samples\.jsonl has 6 bytes.*lists 3"):
        check_inputs(run, "extract", cfg)
    samples.write_bytes(b"[]\n")  # same size, other content
    check_inputs(run, "extract", cfg)  # sizes only: passes
    with pytest.raises(StageInputError, match="does not match the sha256"):
        check_inputs(run, "extract", cfg, hash_files=True)
    samples.write_bytes(b"{}\n")

    other = PipelineConfig.model_validate({"target_model": "/m", "prepare": {"max_seq_len": 64}})
    with pytest.raises(StageInputError, match="made with other settings of target_model, seed, prepare"):
        check_inputs(run, "extract", other)


def test_downstream_refuses_output_made_from_an_older_upstream(tmp_path):
    run, cfg = _upstream_made(tmp_path)
    assert set(check_inputs(run, "train", cfg)) == {"extract", "vocab"}
    _fake_stage(run, cfg, "prepare", "samples.jsonl", b"{}\n{}\n")  # prepare rerun: new manifest digest
    with pytest.raises(StageInputError, match=r"made from another `prepare` output.*rerun stage `extract`"):
        check_inputs(run, "train", cfg)


def test_stage_cli_exits_2_with_the_reason(tmp_path):
    run = _write(tmp_path / "run", "target_model: /m\n")
    result = CliRunner().invoke(app, ["train", "--run-dir", str(run)])
    assert result.exit_code == 2
    assert "extract/manifest.json is missing" in result.output or "extract/manifest.json is missing" in str(
        result.stderr_bytes or b"", "utf-8"
    )
    result = CliRunner().invoke(app, ["prepare", "--run-dir", str(tmp_path / "nope")])
    assert result.exit_code == 2


def test_a_changed_upstream_setting_is_caught_two_stages_down(tmp_path):
    run, cfg = _upstream_made(tmp_path)
    changed = _write(run, "target_model: /m\nprepare: {max_seq_len: 128}\n")
    with pytest.raises(StageInputError, match=r"prepare/manifest\.json \(input of `extract`\).*rerun stage `prepare`"):
        check_inputs(changed, "train", load_pipeline_config(changed))


def test_section_written_twice_is_refused_naming_file_line_and_key(tmp_path, capsys):
    """`prepare:` twice in pipeline.yaml: the last one would win silently; it is an error naming file, line, key,
    both when a stage loads it and when the driver validates it before the window (cli_common.read_pipeline)."""
    text = "target_model: /m\nprepare: {max_seq_len: 64}\nextract: {tensor_parallel_size: 1}\nprepare: {max_seq_len: 128}\n"
    run = _write(tmp_path / "run", text)
    with pytest.raises(PipelineConfigError) as exc:
        load_pipeline_config(run)
    assert f"{run / 'pipeline.yaml'}:4:1: duplicate key 'prepare' (first given at line 2" in str(exc.value)
    nested = _write(tmp_path / "run2", "target_model: /m\ntrain:\n  steps: 3\n  lr: 0.001\n  steps: 4\n")
    with pytest.raises(PipelineConfigError, match=r"pipeline\.yaml:5:3: duplicate key 'steps' \(first given at line 3"):
        load_pipeline_config(nested)

    import typer

    from eagle3ops import cli_common

    with pytest.raises(typer.Exit):
        cli_common.read_pipeline(run / "pipeline.yaml")
    out = " ".join(capsys.readouterr().err.split())
    assert "invalid pipeline config" in out and "duplicate key 'prepare'" in out
