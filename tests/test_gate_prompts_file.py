"""`speculate --prompts-file`: the gate replays a user's JSONL prompts (e.g. held-out chat turns rendered with the
served chat template) instead of HumanEval's gate split; a bad file is refused before any host is reached, naming
the file, the line and the fix. Pure tests (no host, no image)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3ops.speculate import prompts as pr
from eagle3ops.speculate import ship


def _write(tmp_path: Path, lines: list[str]) -> Path:
    f = tmp_path / "gate.jsonl"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return f


def test_a_prompts_file_is_read_in_order_with_its_ids_or_line_numbers(tmp_path: Path) -> None:
    chat = "<|im_start|>user\nWhat is a monad?<|im_end|>\n<|im_start|>assistant\n"
    f = _write(tmp_path, [json.dumps({"id": "sharegpt/12003", "prompt": chat}), "",
                          json.dumps({"prompt": "def add(a, b):\n"})])
    got = pr.from_jsonl(f)
    assert got == [pr.Prompt("sharegpt/12003", chat, "gate"), pr.Prompt("gate.jsonl:3", "def add(a, b):\n", "gate")]


@pytest.mark.parametrize(("line", "needle"), [
    ("not json", "gate.jsonl:2: not JSON"),
    ("[1, 2]", "gate.jsonl:2: expected a JSON object, got list"),
    ('{"text": "hi"}', "gate.jsonl:2: `prompt` must be a non-empty string"),
    ('{"prompt": "   "}', "gate.jsonl:2: `prompt` must be a non-empty string"),
    ('{"prompt": "x", "id": 7}', "gate.jsonl:2: `id` must be a non-empty string"),
    ('{"prompt": "x", "id": "a"}', "gate.jsonl:2: id 'a' is also on line 1"),
])
def test_a_bad_line_is_refused_naming_file_line_and_fix(tmp_path: Path, line: str, needle: str) -> None:
    f = _write(tmp_path, [json.dumps({"id": "a", "prompt": "first"}), line])
    with pytest.raises(pr.GatePromptsError) as e:
        pr.from_jsonl(f)
    assert needle in str(e.value) and str(tmp_path) in str(e.value)


def test_an_empty_or_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(pr.GatePromptsError, match="no prompts; one JSON object a line"):
        pr.from_jsonl(_write(tmp_path, ["", "  "]))
    with pytest.raises(pr.GatePromptsError, match="cannot read the prompts file"):
        pr.from_jsonl(tmp_path / "absent.jsonl")


def test_select_gate_takes_every_file_prompt_and_records_the_file_else_humaneval(tmp_path: Path) -> None:
    f = _write(tmp_path, [json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) for i in range(5)])
    opts = ship.SpeculateOptions(run="r", pipeline_image="img", prompts_file=f)
    gate, source = ship.select_gate(opts, 2)  # a file's prompts all go: the count applies to HumanEval only
    assert [p.id for p in gate] == [f"p{i}" for i in range(5)]
    assert source == {"source": "prompts file", "file": str(f),
                      "file_sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
    he, he_source = ship.select_gate(ship.SpeculateOptions(run="r", pipeline_image="img"), 3)
    assert [p.id for p in he] == [p.id for p in ship.gate_prompts(3)] and he_source["source"] == "HumanEval gate split"
    bad = ship.SpeculateOptions(run="r", pipeline_image="img", prompts_file=_write(tmp_path, ["{}"]))
    with pytest.raises(ship.SpeculateError, match="--prompts-file: .*gate.jsonl:1"):
        ship.select_gate(bad, 3)


def test_the_cli_refuses_a_bad_prompts_file_before_reading_the_inventory(tmp_path: Path) -> None:
    from eagle3ops.cli import app

    f = _write(tmp_path, ['{"prompt": ""}'])
    r = CliRunner().invoke(app, ["speculate", "nohost", "--run", "r", "--prompts-file", str(f),
                                 "--inventory", str(tmp_path / "no-inventory.yaml")])
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and "--prompts-file" in out and "gate.jsonl:1" in out and "inventory" not in out
