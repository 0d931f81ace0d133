"""`regenerate` multi-turn: the live target answers every assistant turn of a conversation in turn, given
the conversation so far with its own earlier answers; bounded by count, tokens, turns and time; held-out splits
disjoint by hash from what is trained. The server is :class:`test_regenerate.StandInServer` (``httpx.MockTransport``,
a stand-in for vLLM's chat endpoint); ShareGPT V3 is the real packaged file.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from test_regenerate import StandInServer

from eagle3ops.speculate import regenerate as rg
from eagle3ops.speculate.prompts import GatePromptsError, prompt_sha256

ROWS = [
    # opens with the assistant (ShareGPT has 6,358 such rows), then two exchanges
    {"conversations": [{"from": "gpt", "value": "Hi! How can I help?"}, {"from": "human", "value": "q one"},
                       {"from": "gpt", "value": "written one"}, {"from": "human", "value": "q two"},
                       {"from": "chatgpt", "value": "written two"}]},
    # two assistant turns in a row, a system prompt, and a bard answer
    {"conversations": [{"from": "system", "value": "be kind"}, {"from": "human", "value": "q three"},
                       {"from": "bard", "value": "written three"}, {"from": "gpt", "value": "written four"},
                       {"from": "human", "value": "q five"}, {"from": "gpt", "value": "written five"}]},
    # only the assistant speaks
    {"conversations": [{"from": "gpt", "value": "alone"}]},
]


def _chats(tmp_path: Path) -> Path:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(ROWS))
    return path


def _regenerate(tmp_path: Path, items: list[rg.Item], server: StandInServer, **kw) -> dict:
    p = rg.plan(items, rg.GenSettings(model="m", max_tokens=8, concurrency=1), tmp_path / "out")
    return rg.regenerate(p, "http://x.invalid", progress=False, transport=httpx.MockTransport(server), **kw)


def test_every_assistant_turn_is_answered_in_turn_with_the_targets_own_earlier_answers(tmp_path):
    items, left_out = rg.items_from_dataset([_chats(tmp_path)])
    assert [i.id for i in items] == ["sharegpt.json:1", "sharegpt.json:2"]
    assert items[0].turns == (("user", "q one"), ("assistant", ""), ("user", "q two"), ("assistant", ""))
    assert left_out == {"tool_use": 0, "no_user_turn": 1, "leading_assistant_turns": 2,
                        "consecutive_assistant_turns": 1, "turns_beyond_max_turns": 0}
    server = StandInServer()
    man = _regenerate(tmp_path, items, server)
    sent = [[m["content"] for m in b["messages"]] for b in server.bodies]
    assert sent == [["q one"], ["q one", "m says 1: q one", "q two"],
                    ["be kind", "q three"], ["be kind", "q three", "m says 1: q three", "q five"]]
    out = [json.loads(x) for x in (tmp_path / "out" / rg.DATASET).read_text().splitlines()]
    assert [[m["role"] for m in r["messages"]] for r in out] == [
        ["user", "assistant", "user", "assistant"], ["system", "user", "assistant", "user", "assistant"]]
    assert "written" not in json.dumps(out) and man["answered"] == 2


def test_max_turns_bounds_the_answers_per_conversation(tmp_path):
    items, left_out = rg.items_from_dataset([_chats(tmp_path)], max_turns=1)
    assert [i.turns[-1] for i in items] == [("assistant", ""), ("assistant", "")]
    assert left_out["turns_beyond_max_turns"] == 2
    server = StandInServer()
    _regenerate(tmp_path, items, server)
    assert len(server.bodies) == 2  # one answer per conversation


def test_the_time_budget_starts_nothing_after_it_and_a_rerun_answers_the_rest(tmp_path):
    items, _ = rg.items_from_dataset([_chats(tmp_path)])
    server = StandInServer()
    man = _regenerate(tmp_path, items, server, time_budget_s=0)
    assert server.bodies == [] and man["not_started_time_budget"] == 2 and man["answered"] == 0
    man = _regenerate(tmp_path, items, StandInServer())
    assert man["answered"] == 2 and man["not_started_time_budget"] == 0


def test_held_out_conversations_are_disjoint_by_hash_from_every_trained_prompt(tmp_path):
    rows = [{"conversations": [{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": "a"}]}
            for i in range(40)]
    rows.append({"conversations": [{"from": "human", "value": "question  7"}, {"from": "gpt", "value": "a"}]})
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    items, _ = rg.items_from_dataset([path])
    train, held, record = rg.split_held_out(items, 0.25)
    assert len(train) + len(held) == len(items) and held
    trained = {prompt_sha256(c) for i in train for r, c in i.turns if r == "user"}
    assert not {prompt_sha256(c) for i in held for r, c in i.turns if r == "user"} & trained
    assert record["disjointness"]["overlap"] == [] and record["held_out_ids"] == [i.id for i in held]
    # the same text under two ids ("question 7" / "question  7"): one group, never on both sides
    sides = {i.id: ("held" if i in held else "train") for i in items}
    assert sides["many.jsonl:8"] == sides["many.jsonl:41"] and record["content"]["duplicate_conversations"] == 1
    again = rg.split_held_out(list(reversed(items)), 0.25)[1]
    assert sorted(i.id for i in again) == sorted(i.id for i in held)  # by hash of the content, not by order
    with pytest.raises(GatePromptsError):
        rg.split_held_out(items, 1.5)


def test_sharegpt_v3_from_its_package_gives_multi_turn_items(tmp_path):
    items, left_out = rg.items_from_dataset(["builtin:sharegpt-v3"], truncated="keep-complete", max_turns=4)
    assert len(items) > 17_000 and left_out["leading_assistant_turns"] > 0
    first = items[:100]
    assert sum(1 for i in first if sum(r == "assistant" for r, _ in i.turns) > 1) >= 50  # multi-turn
    assert all(i.turns[0][0] in ("system", "user") and sum(r == "assistant" for r, _ in i.turns) <= 4
               for i in items)
