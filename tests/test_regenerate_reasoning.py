"""`regenerate` against a server with a reasoning parser (SpecForge #544/PR #564, vllm #39103).

vLLM started with ``--reasoning-parser`` answers a chat request with the thinking in ``reasoning`` (older releases:
``reasoning_content``) and the reply in ``content``, which is ``null`` when ``max_tokens`` ran out inside the
thinking. The stand-in server below answers like that (a stand-in: ``httpx.MockTransport``, no vLLM).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from eagle3ops.speculate import regenerate as rg
from eagle3ops.speculate.prompts import Prompt

#: prompt → (reasoning field name, reasoning, content, finish_reason)
ANSWERS = {
    "ok": ("reasoning", "Two and two make four.", "4", "stop"),
    "old-name": ("reasoning_content", "Recall the capital.", "Paris", "stop"),
    "cut": ("reasoning", "Let me think about this for a very long time and", None, "length"),
    "empty": ("reasoning", None, None, "stop"),
}


class ReasoningServer:
    """Stand-in for vLLM 0.16 with a reasoning parser: the reply and the reasoning in separate fields."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/version":
            return httpx.Response(200, json={"version": "0.16.0-stand-in"})
        body = json.loads(request.content)
        self.bodies.append(body)
        name, reasoning, content, finish = ANSWERS[body["messages"][-1]["content"]]
        message = {"role": "assistant", "content": content, name: reasoning}
        return httpx.Response(200, json={"choices": [{"message": message, "finish_reason": finish}],
                                         "usage": {"completion_tokens": 16}})


def _regenerate(tmp_path: Path, **plan: object) -> tuple[dict, dict[str, dict]]:
    items = rg.items_from_prompts([Prompt(k, k) for k in ANSWERS])
    p = rg.plan(items, rg.GenSettings(model="m", max_tokens=16), tmp_path, **plan)
    man = rg.regenerate(p, "http://serving.invalid", progress=False, transport=httpx.MockTransport(ReasoningServer()))
    rows = {r["id"]: r for r in map(json.loads, (tmp_path / rg.DATASET).read_text().splitlines())}
    return man, rows


def test_no_empty_reply_is_written_and_reasoning_is_stripped_by_default_and_counted(tmp_path):
    man, rows = _regenerate(tmp_path)
    # never an empty assistant turn: `cut` (max_tokens ran out in the thinking) and `empty` are left out, counted
    assert sorted(rows) == ["ok", "old-name"]
    assert rows["ok"]["messages"][-1] == {"role": "assistant", "content": "4"}  # stripped: the default
    assert rows["old-name"]["messages"][-1] == {"role": "assistant", "content": "Paris"}
    r = man["reasoning"]
    assert r["mode"] == "strip" and "default" in r["mode_why"]
    assert r["replies_with_reasoning"] == 3 and r["cut_in_reasoning"] == 1
    assert man["skipped_turns"] == {"cut_in_reasoning": 1, "empty_reply": 1}
    assert man["skipped_conversations"] == 2 and man["answered"] == 2 and man["failed"] == 0
    assert man["finish_reasons"] == {"length": 1, "stop": 3}


def test_reasoning_is_kept_when_asked_under_the_name_prepare_passes_to_the_template(tmp_path):
    man, rows = _regenerate(tmp_path, reasoning="keep")
    assert rows["ok"]["messages"][-1] == {"role": "assistant", "content": "4",
                                          "reasoning_content": "Two and two make four."}
    assert rows["old-name"]["messages"][-1]["reasoning_content"] == "Recall the capital."
    assert man["reasoning"]["mode"] == "keep" and sorted(rows) == ["ok", "old-name"]


def test_a_rerun_does_not_ask_again_for_replies_skipped_as_empty(tmp_path):
    _regenerate(tmp_path)
    again = ReasoningServer()
    items = rg.items_from_prompts([Prompt(k, k) for k in ANSWERS])
    p = rg.plan(items, rg.GenSettings(model="m", max_tokens=16), tmp_path)
    man = rg.regenerate(p, "http://serving.invalid", progress=False, transport=httpx.MockTransport(again))
    assert again.bodies == [] and man["skipped_conversations"] == 2 and man["answered"] == 2
