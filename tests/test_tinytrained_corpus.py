"""The sandbox target's training corpus: HumanEval's train split only (the gate's prompts never in it), and clear
errors for a bad corpus file (:func:`eagle3ops_dev.tinytrained.load_corpus`; pure, no torch)."""

from __future__ import annotations

import pytest

from eagle3ops.speculate import prompts as pr
from eagle3ops.speculate.regensource import write_humaneval_train_corpus
from eagle3ops.speculate.prompts import GATE_FRACTION
from eagle3ops_dev.tinytrained import TrainedTargetError, load_corpus


def test_the_corpus_is_the_train_split_with_solutions_and_holds_no_gate_prompt(tmp_path):
    path = tmp_path / "corpus.jsonl"
    rec = write_humaneval_train_corpus(path)
    rows = load_corpus(path)
    train, gate = pr.split_by_id(pr.humaneval(), GATE_FRACTION)
    assert rec["rows"] == len(rows) == len(train) and rec["disjointness"]["overlap"] == []
    gate_hashes = {pr.prompt_sha256(p.text) for p in gate}
    assert not gate_hashes & {pr.prompt_sha256(r["prompt"]) for r in rows}
    solutions = {r["task_id"]: r["canonical_solution"] for r in pr.humaneval_rows()}
    assert rows[0] == {"prompt": train[0].text, "completion": solutions[train[0].id]}


@pytest.mark.parametrize(("text", "match"), [
    ("", "has no rows"),
    ('{"prompt": "a", "completion": "b"}\nnot json\n', r":2: not JSON"),
    ('{"prompt": "a"}\n', r":1: expected an object with string keys 'prompt' and 'completion'"),
    ('[1, 2]\n', r":1: expected an object"),
])
def test_a_bad_corpus_names_the_file_and_line(tmp_path, text, match):
    path = tmp_path / "c.jsonl"
    path.write_text(text)
    with pytest.raises(TrainedTargetError, match=match) as e:
        load_corpus(path)
    assert str(path) in str(e.value)


def test_a_missing_corpus_says_what_to_pass(tmp_path):
    with pytest.raises(TrainedTargetError, match="corpus file not found; pass a JSONL"):
        load_corpus(tmp_path / "nope.jsonl")
