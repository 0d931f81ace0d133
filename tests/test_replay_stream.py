"""One replayed request's stream read and judged (:mod:`eagle3ops.gate.replay`): what it measured (the answer's
digest included), and each way it fails (the module doc's list), against a **stand-in** server:
``httpx.MockTransport`` answering with canned server-sent events in vLLM's chunk format (NOT vLLM). Pure: no socket,
no thread.
"""

from __future__ import annotations

import hashlib
import json
import threading

import httpx
import pytest

from eagle3ops.gate import replay

TOOL = {"messages": [{"role": "user", "content": "weather?"}],
        "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]}
JSON_FORMAT = {"messages": [{"role": "user", "content": "json please"}], "response_format": {"type": "json_object"}}


def _sse(*events: object, done: bool = True) -> bytes:
    lines = [f"data: {json.dumps(e)}\n\n" for e in events] + (["data: [DONE]\n\n"] if done else [])
    return "".join(lines).encode()


def _chat(delta: dict, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


USAGE = {"choices": [], "usage": {"completion_tokens": 3}}


def _send(prompt, body: bytes, status: int = 200):
    """``_one`` against the stand-in answering ``body`` (status ``status``); returns its figures or raises."""
    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        return httpx.Response(status, content=body, headers={"content-type": "text/event-stream"})

    inflight = [0]
    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        try:
            return replay._one(client, "http://standin", "m", prompt, 8, inflight, threading.Lock()), seen
        finally:
            assert inflight == [0]  # the in-flight count is given back whatever happened


def test_a_completion_stream_is_timed_and_counted():
    body = _sse({"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}]}, {"choices": [{"text": "c"}]}, USAGE)
    (tokens, ttft, itl, secs, digest, head), seen = _send("def f():", body)
    assert seen[0][0] == replay.COMPLETIONS and tokens == 3
    assert ttft is not None and itl is not None and secs >= ttft >= 0
    # the digest is the joined text's, however the release split it into chunks (speculation: several a chunk)
    assert digest == hashlib.sha256(b"abc").hexdigest() and head == "abc"
    (_, _, _, _, one_chunk, _), _ = _send("def f():", _sse({"choices": [{"text": "abc"}]}, USAGE))
    assert one_chunk == digest


def test_the_answer_head_is_cut_and_a_chat_answer_digests_its_content():
    long = "x" * (replay.ANSWER_HEAD_CHARS + 20)
    (*_, digest, head), _ = _send("p", _sse({"choices": [{"text": long}]}, USAGE))
    assert head == long[:replay.ANSWER_HEAD_CHARS] and digest == hashlib.sha256(long.encode()).hexdigest()
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    (*_, digest, head), seen = _send(chat, _sse(_chat({"role": "assistant"}), _chat({"content": "hé"}),
                                                 _chat({"content": "llo"}, "length"), USAGE))
    assert seen[0][0] == replay.CHAT and head == "héllo"
    assert digest == hashlib.sha256("héllo".encode()).hexdigest()
    # reasoning (either field name) is part of the answer: the same content after other reasoning differs
    (*_, with_r, head_r), _ = _send(chat, _sse(_chat({"reasoning_content": "think"}), _chat({"content": "héllo"}),
                                               USAGE))
    (*_, with_r2, _), _ = _send(chat, _sse(_chat({"reasoning": "think"}), _chat({"content": "héllo"}), USAGE))
    assert with_r == with_r2 != digest
    assert head_r.startswith('{"content":"héllo","reasoning":"think"')


def test_tool_call_pieces_are_tokens_and_their_joined_arguments_must_be_json():
    ok = _sse(_chat({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
              _chat({"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]}, "tool_calls"), USAGE)
    (tokens, ttft, _, _, digest, _), seen = _send(TOOL, ok)
    assert seen[0][0] == replay.CHAT and tokens == 3 and ttft is not None
    said = replay.answer_text("", "", {0: ("", '{"city": "Oslo"}')})
    assert digest == hashlib.sha256(said.encode()).hexdigest() and json.loads(said)["tool_calls"] == [
        {"name": "", "arguments": '{"city": "Oslo"}'}]
    other = _sse(_chat({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Rome"}'}}]}, "tool_calls"),
                 USAGE)
    assert _send(TOOL, other)[0][4] != digest  # a call to another city is another answer
    bad = _sse(_chat({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}, "tool_calls"), USAGE)
    with pytest.raises(replay.RequestFailed, match="grammar failure on /v1/chat/completions: tool call 0's"):
        _send(TOOL, bad)


def test_a_response_format_answer_must_be_json_unless_cut_by_max_tokens():
    with pytest.raises(replay.RequestFailed, match="the response_format answer is not JSON"):
        _send(JSON_FORMAT, _sse(_chat({"content": '{"a": '}, "stop"), USAGE))
    (tokens, *_), _ = _send(JSON_FORMAT, _sse(_chat({"content": '{"a": '}, "length"), USAGE))
    assert tokens == 3  # cut by max_tokens: the grammar never got to close it


@pytest.mark.parametrize(("body", "status", "said"), [
    (b"boom", 500, "HTTP 500 from /v1/completions: boom"),
    (_sse({"error": {"message": "generation failed"}}), 200, "stream error from /v1/completions: generation failed"),
    (_sse({"choices": [{"text": "a"}]}, done=False), 200, "ended before data: [DONE]"),
    (b"data: {not json\n\n", 200, "unreadable stream from /v1/completions"),
], ids=["http-500", "error-event", "no-done", "not-json"])
def test_each_failure_names_the_endpoint(body, status, said):
    with pytest.raises(replay.RequestFailed, match=said.replace("[", r"\[").replace("]", r"\]")):
        _send("def f():", body, status)
