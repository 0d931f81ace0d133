"""Host tests of stage ``prepare``'s per-turn decisions and tool messages.

The target's tokenizer is replaced by :class:`CharTokenizer`: it renders chat templates the way transformers does
(jinja2 sandbox, ``trim_blocks``/``lstrip_blocks``, its ``tojson`` and ``raise_exception``) and gives each
character its own id, so a loss-mask span decodes to exactly the text it covers. The same cases run with real
tokenizers (fast and slow, remote code) in ``tests/image/test_stages.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from eagle3ops.config.pipeline import load_pipeline_config
from eagle3ops.stages import prepare as prepare_stage
from eagle3ops.stages.prepare import UnmaskableConversation, read_samples, run_prepare
from eagle3ops.fixtures.tinymodel import CHAT_TEMPLATE as PLAIN_TEMPLATE  # role + content only: drops tool fields

#: A template that renders tools, tool calls, tool results (with the tool's name) and reasoning (the shape of
#: Qwen2.5/Hermes templates); like them it does not render `tool_call_id`.
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

#: Earlier assistant turns are rendered as a placeholder (as templates that strip past reasoning do).
REWRITING_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>\n"
    "{% if m.role == 'assistant' and not loop.last %}(earlier reply){% else %}{{ m.content }}{% endif %}"
    "</s>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

#: Refuses conversations whose roles do not alternate user/assistant (as Gemma's and Mistral's templates do).
ALTERNATING_TEMPLATE = (
    "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<|{{ m.role }}|>\n{{ m.content }}</s>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

TOOL_ROW = {
    "id": "tool-1",
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    "messages": [
        {"role": "user", "content": "Weather in Paris?", "weight": 1},
        {"role": "assistant", "content": None, "reasoning_content": "Ask the tool.",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "18 C, sunny"},
        {"role": "assistant", "content": "It is 18 C and sunny in Paris."},
    ],
}
CALL_TEXT = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


class CharTokenizer:
    """Stand-in for a transformers tokenizer: transformers' template rendering, one id per character."""

    is_fast = False

    def __init__(self, chat_template: str) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
        env.globals["raise_exception"] = raise_exception
        self.chat_template = chat_template
        self._template = env.from_string(chat_template)

    def apply_chat_template(self, messages: list[dict[str, Any]], tokenize: bool = False,
                            add_generation_prompt: bool = False, tools: list | None = None) -> str:
        assert tokenize is False
        return self._template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                     bos_token="<s>", eos_token="</s>")

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


def _text(ids: list[int]) -> str:
    return "".join(map(chr, ids))


def _spans(row: dict[str, Any]) -> list[str]:
    """The texts under the loss mask, one per run of 1s."""
    out, start = [], None
    for i, m in enumerate([*row["loss_mask"], 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append(_text(row["input_ids"][start:i]))
            start = None
    return out


def _prepare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, template: str, rows: list[dict[str, Any]],
             **prepare: Any) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    cfg = {"target_model": "/models/char", "prepare": {"datasets": [str(data)], "shuffle": False, **prepare}}
    (run / "pipeline.yaml").write_text(json.dumps(cfg))
    monkeypatch.setattr(prepare_stage, "load_tokenizer", lambda _target: CharTokenizer(template))
    logs: list[str] = []
    figures = run_prepare(run, load_pipeline_config(run), log=logs.append)
    return figures, read_samples(run), logs


def _turns_add_up(figures: dict[str, Any]) -> bool:
    t = figures["turns"]
    return t["assistant"] == t["trained"] + sum(t["not_trained"].values())


# -------------------------------------------------------------------------------------------- tool messages


def test_tool_call_turn_is_rendered_and_trained_and_the_tool_result_is_context(tmp_path, monkeypatch):
    figures, (row,), logs = _prepare(tmp_path, monkeypatch, TOOL_TEMPLATE, [TOOL_ROW])
    text = _text(row["input_ids"])
    assert '{"type": "function", "function": {"name": "get_weather"' in text  # the row's `tools`
    assert CALL_TEXT in text and "<think>Ask the tool.</think>" in text
    assert '<tool_response name="get_weather">18 C, sunny</tool_response>' in text
    # Exactly the two replies are trained: the tool call turn (reasoning + call + end of turn) and the answer.
    assert _spans(row) == [f"<think>Ask the tool.</think>\n{CALL_TEXT}</s>\n", "It is 18 C and sunny in Paris.</s>\n"]
    assert figures["turns"]["trained"] == 2 and _turns_add_up(figures)
    assert figures["fields"]["kept"] == {"name": 1, "reasoning_content": 1, "tool_call_id": 1, "tool_calls": 1,
                                         "tools": 1}
    assert figures["fields"]["not_rendered"] == {"tool_call_id": 1}  # this template has no place for it
    assert figures["fields"]["not_passed"] == {"weight": 1}
    assert any("`weight` is not passed to the chat template" in line and "chat.jsonl:1" in line for line in logs)
    manifest = json.loads((tmp_path / "run" / "prepare" / "manifest.json").read_text())
    assert manifest["fields"] == figures["fields"] and manifest["turns"] == figures["turns"]


def test_fields_the_template_drops_are_reported_and_the_emptied_turn_is_not_trained(tmp_path, monkeypatch):
    figures, (row,), logs = _prepare(tmp_path, monkeypatch, PLAIN_TEMPLATE, [TOOL_ROW])
    # The tool call turn renders as "<|assistant|>\n</s>": training it would teach "end the turn at once".
    assert "<|assistant|>\n</s>\n" in _text(row["input_ids"])
    assert _spans(row) == ["It is 18 C and sunny in Paris.</s>\n"]
    assert figures["fields"]["not_rendered"] == {"name": 1, "reasoning_content": 1, "tool_call_id": 1,
                                                 "tool_calls": 1, "tools": 1}
    warning = next(line for line in logs if "does not render `tool_calls`" in line)
    assert "/models/char" in warning and "chat.jsonl:1" in warning
    assert figures["turns"]["not_trained"]["empty_reply"] == 1 and figures["turns"]["trained"] == 1
    assert figures["not_trained_turn_sources"] == [f"{tmp_path / 'chat.jsonl'}:1 turn 1: empty_reply"]
    assert _turns_add_up(figures)


def test_an_empty_reply_is_not_trained_even_without_tool_fields(tmp_path, monkeypatch):
    rows = [{"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": ""},
                          {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]}]
    figures, (row,), _ = _prepare(tmp_path, monkeypatch, PLAIN_TEMPLATE, rows)
    assert _spans(row) == ["a2</s>\n"] and figures["turns"]["not_trained"]["empty_reply"] == 1


# -------------------------------------------------------------------------------------- decisions per turn


@pytest.mark.parametrize("on_unmaskable", ["error", "skip"])
def test_a_sharegpt_conversation_opened_by_the_assistant_keeps_its_later_replies(tmp_path, monkeypatch,
                                                                                  on_unmaskable):
    rows = [
        {"conversations": [{"from": "gpt", "value": "Hello! How can I help?"},
                           {"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"},
                           {"from": "human", "value": "Q2"}, {"from": "gpt", "value": "A2"}]},
        {"conversations": [{"from": "gpt", "value": "only the assistant speaks"}]},
        {"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]},
    ]
    # Whatever on_unmaskable says (`error` is the default), a turn with no prompt before it is data to leave out,
    # not an error, and the conversation's later replies are trained.
    figures, samples, logs = _prepare(tmp_path, monkeypatch, PLAIN_TEMPLATE, rows, on_unmaskable=on_unmaskable)
    first = samples[0]
    assert _text(first["input_ids"]) == (
        "<s><|user|>\nQ1</s>\n<|assistant|>\nA1</s>\n<|user|>\nQ2</s>\n<|assistant|>\nA2</s>\n"
    )
    assert _spans(first) == ["A1</s>\n", "A2</s>\n"]
    assert [s["source"].rsplit(":", 1)[1] for s in samples] == ["1", "3"]
    assert figures["turns"] == {"assistant": 5, "trained": 3, "not_trained": {
        "no_prompt_before": 2, "empty_reply": 0, "prefix_broken": 0, "no_token": 0, "template_error": 0,
        "truncated": 0}}
    assert figures["skipped"]["no_trained_turn"] == 1
    assert f"{tmp_path / 'chat.jsonl'}:1 turn 0: no_prompt_before" in figures["not_trained_turn_sources"]
    assert any("3 of 5 assistant turns trained" in line and "no_prompt_before 2" in line for line in logs)


def _multi_turn_rows() -> list[dict[str, Any]]:
    return [{"messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                          {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}]},
            {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]}]


def test_on_unmaskable_skip_leaves_only_the_broken_turn_untrained(tmp_path, monkeypatch):
    figures, samples, _ = _prepare(tmp_path, monkeypatch, REWRITING_TEMPLATE, _multi_turn_rows(),
                                   on_unmaskable="skip")
    # The conversation stays; its first reply (rendered as a placeholder later on) is context, the last is trained.
    assert len(samples) == 2 and figures["samples"] == 2
    assert _text(samples[0]["input_ids"]).startswith("<|user|>\nQ1</s>\n<|assistant|>\n(earlier reply)</s>\n")
    assert _spans(samples[0]) == ["A2</s>\n"] and _spans(samples[1]) == ["A</s>\n"]
    assert figures["turns"]["not_trained"]["prefix_broken"] == 1 and figures["turns"]["trained"] == 2
    assert figures["not_trained_turn_sources"] == [f"{tmp_path / 'chat.jsonl'}:1 turn 1: prefix_broken"]


def test_on_unmaskable_error_names_the_conversation_the_turn_and_the_fix(tmp_path, monkeypatch):
    with pytest.raises(UnmaskableConversation) as exc:
        _prepare(tmp_path, monkeypatch, REWRITING_TEMPLATE, _multi_turn_rows())
    msg = str(exc.value)
    assert f"{tmp_path / 'chat.jsonl'}:1: assistant turn 1:" in msg and "not a prefix" in msg
    assert "prepare.on_unmaskable: skip" in msg


def test_a_conversation_the_template_refuses_is_counted_and_the_others_kept(tmp_path, monkeypatch):
    rows = [{"messages": [{"role": "user", "content": "Q1"}, {"role": "user", "content": "Q2"},
                          {"role": "assistant", "content": "A"}]}, *_multi_turn_rows()]
    refused = r"chat\.jsonl:1: the chat template fails on the whole conversation \(TemplateError: Conversation roles"
    with pytest.raises(UnmaskableConversation, match=refused):
        _prepare(tmp_path, monkeypatch, ALTERNATING_TEMPLATE, rows)
    figures, samples, _ = _prepare(tmp_path, monkeypatch, ALTERNATING_TEMPLATE, rows, on_unmaskable="skip")
    assert figures["skipped"]["unrenderable"] == 1
    assert figures["unrenderable_sources"] == [f"{tmp_path / 'chat.jsonl'}:1"]
    assert len(samples) == 2 and figures["turns"]["not_trained"]["template_error"] == 1 and _turns_add_up(figures)


def test_a_reply_cut_off_by_max_seq_len_is_counted_as_truncated(tmp_path, monkeypatch):
    rows = [{"messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                          {"role": "user", "content": "x" * 40}, {"role": "assistant", "content": "A2"}]}]
    figures, (row,), _ = _prepare(tmp_path, monkeypatch, PLAIN_TEMPLATE, rows, max_seq_len=48)
    assert len(row["input_ids"]) == 48 and _spans(row) == ["A1</s>\n"]
    assert figures["turns"]["trained"] == 1 and figures["turns"]["not_trained"]["truncated"] == 1
    assert figures["truncated"] == 1 and _turns_add_up(figures)


def test_the_stage_cli_no_longer_exits_2_on_a_conversation_opened_by_the_assistant(tmp_path, monkeypatch):
    """A conversation opened by the assistant through `python -m eagle3ops stage prepare` (it exited 2)."""
    from typer.testing import CliRunner

    from eagle3ops.stages.cli import app

    data = tmp_path / "sharegpt.jsonl"
    data.write_text(json.dumps({"conversations": [{"from": "gpt", "value": "Hi!"}, {"from": "human", "value": "Q"},
                                                  {"from": "gpt", "value": "A"}]}) + "\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "pipeline.yaml").write_text(json.dumps({"target_model": "/models/char",
                                                   "prepare": {"datasets": [str(data)]}}))
    monkeypatch.setattr(prepare_stage, "load_tokenizer", lambda _target: CharTokenizer(PLAIN_TEMPLATE))
    result = CliRunner().invoke(app, ["prepare", "--run-dir", str(run)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((run / "prepare" / "manifest.json").read_text())
    assert manifest["samples"] == 1 and manifest["turns"]["not_trained"]["no_prompt_before"] == 1


def test_samples_carry_their_user_turns_content_keys_and_the_manifest_counts_duplicates(tmp_path, monkeypatch):
    """Held out by content: each sample names its user turns by content key (what train groups by), and the
    manifest counts conversations that repeat another's user turn under another id or at another position."""
    from eagle3ops.stages.contentsplit import content_key

    def conv(*users: str) -> dict[str, Any]:
        return {"messages": [m for u in users for m in ({"role": "user", "content": u},
                                                          {"role": "assistant", "content": "ok"})]}

    rows = [conv("Hi"), conv("what is 2+2?"), conv("tell me more", " hi "), conv("Tell me more"), conv("other")]
    figures, samples, _ = _prepare(tmp_path, monkeypatch, PLAIN_TEMPLATE, rows)
    assert [s["content"] for s in samples][:2] == [[content_key("hi")], [content_key("What is 2+2?")]]
    cg = figures["content_groups"]
    assert (cg["conversations"], cg["groups"], cg["groups_with_duplicates"]) == (5, 3, 1)
    assert cg["duplicate_conversations"] == 2 and cg["largest_group"] == 3
    assert json.loads((tmp_path / "run/prepare/manifest.json").read_text())["content_groups"] == cg
