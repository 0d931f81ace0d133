"""The gate's traffic like production's: prompt sets that carry chat bodies (``messages`` with ``tools`` or
``response_format``), replayed through ``/v1/chat/completions`` while plain prompts stay on ``/v1/completions``; the
endpoint, TTFT p50/p90 and vLLM's prefix-cache hit rate recorded; a TTFT breach named in the decision's reason and
failed requests on the speculative release ending in a rollback that names them.

The replay test serves with the STAND-IN OpenAI server (``tests/data/standin_openai_server.py``, NOT vLLM: its
chat streams, its tool calls and JSON answers and its prefix-cache counters are simulated), started as a plain
process on loopback; the loader and the decision tests are pure.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from dataclasses import asdict
from pathlib import Path

import pytest

from eagle3ops.config.plan import SpeculateJob
from eagle3ops.gate import metrics
from eagle3ops.gate.replay import LevelResult
from eagle3ops.speculate import prompts as pr
from test_serving_kinds import SERVER, _free_port, _up, _wait

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
    "type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}}
TOOL_ROW = {"id": "tool-1", "set": "agent", "messages": [{"role": "system", "content": "Use the tools."},
                                                          {"role": "user", "content": "Weather in Oslo?"}],
            "tools": TOOLS, "tool_choice": "auto"}
JSON_ROW = {"id": "json-1", "set": "agent", "max_completion_tokens": 999, "response_format": SCHEMA,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Answer in JSON:"},
                                                      {"type": "text", "text": "what is 2+2?"}]}]}
CHAT_ROW = {"id": "chat-1", "set": "chat", "messages": [{"role": "user", "content": "Say hello."}]}


def _body(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("id", "set")}


def test_a_prompts_file_carries_chat_bodies_with_tools_and_response_format(tmp_path):
    f = tmp_path / "mixed.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in ({"id": "p-1", "prompt": "def f():"}, TOOL_ROW, JSON_ROW,
                                                   CHAT_ROW)) + "\n")
    got = pr.from_jsonl(f)
    assert [p.id for p in got] == ["p-1", "tool-1", "json-1", "chat-1"]
    assert [p.set for p in got] == ["mixed", "agent", "agent", "chat"]
    assert got[0].request == "def f():" and got[0].body is None
    # the chat bodies as given (tools, tool_choice, response_format, messages), id and set left out
    assert got[1].request == _body(TOOL_ROW) and got[2].request == _body(JSON_ROW)
    # the text checked for disjointness from training: the last user turn's
    assert got[1].text == "Weather in Oslo?" and got[2].text == "Answer in JSON:\nwhat is 2+2?"
    # the host job carries both kinds, in order, through its JSON plan
    job = SpeculateJob(results_dir="/r", change={"args": []}, prompts=[p.request for p in got], levels=[1],
                       max_tokens=8, passes=3, margin=0.1, acceptance_floor=1.5)
    assert SpeculateJob.model_validate_json(job.model_dump_json()).prompts == [p.request for p in got]
    for row, err in (({"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "either `prompt`"),
                     ({"messages": []}, "`messages` must be a non-empty list"),
                     ({"messages": [{"content": "x"}]}, "`messages`[0] must be an object with a string `role`"),
                     ({"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}, "`tools` must be a list"),
                     ({"messages": [{"role": "user", "content": "x"}], "response_format": "json"},
                      "`response_format` must be an object")):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps(row) + "\n")
        with pytest.raises(pr.GatePromptsError, match=rf"bad.jsonl:1: .*{re.escape(err)}"):
            pr.from_jsonl(bad)


@pytest.fixture
def standin(tmp_path):
    """The stand-in server on a free loopback port, logging every POST; yields (base URL, request log path)."""
    port, log = _free_port(), tmp_path / "requests.jsonl"
    proc = subprocess.Popen([sys.executable, str(SERVER), "--port", str(port), "--model", "m", "--token-ms", "3",
                             "--request-log", str(log)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    threading.Thread(target=proc.wait, daemon=True).start()
    try:
        assert _wait(lambda: _up(port))
        yield f"http://127.0.0.1:{port}", log
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_replay_sends_chat_bodies_to_chat_completions_and_records_what_it_measured(standin):
    from eagle3ops.gate.measure import measure, read_measurement

    base, log = standin
    prompts = ["def f():", _body(TOOL_ROW), _body(JSON_ROW), _body(CHAT_ROW)]
    ans = measure({"base_url": base, "model": "m", "prompts": prompts, "levels": [2], "max_tokens": 8,
                   "passes": 2, "api_key": None, "request_timeout_s": 20, "idle_timeout_s": 20})
    sent = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(sent) == 8
    by_prompt = {json.dumps(r["body"].get("prompt", r["body"].get("messages"))): r for r in sent}
    plain = by_prompt[json.dumps("def f():")]
    # plain prompts: the endpoint and body they always had (committed benchmarks stay comparable)
    assert plain["path"] == "/v1/completions" and plain["body"] == {
        "model": "m", "prompt": "def f():", "max_tokens": 8, "temperature": 0.0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}}
    for row in (TOOL_ROW, JSON_ROW, CHAT_ROW):
        got = next(r for r in sent if json.dumps(row["messages"]) in json.dumps(r["body"]))
        assert (got["path"], "prompt" in got["body"]) == ("/v1/chat/completions", False), got
        body = got["body"]
        # as given, with the gate's settings on top: the served model, greedy, the gate's max_tokens
        for k in ("messages", "tools", "tool_choice", "response_format"):
            assert body.get(k) == row.get(k)
        assert body["model"] == "m" and body["temperature"] == 0.0 and body["max_tokens"] == 8
        assert body["stream"] is True and "max_completion_tokens" not in body
        # ignore_eos only where no grammar or tool parser decides where the answer ends
        assert body.get("ignore_eos") is (True if row is CHAT_ROW else None)
    assert ans["traffic"]["endpoints"] == {"/v1/completions": 1, "/v1/chat/completions": 3}
    levels, _ = read_measurement(ans)
    for res in levels[2]:
        assert res.errors == 0 and res.failures == [] and res.output_tokens == 32
        assert all(t is not None for t in res.prompt_ttft_ms)  # tool-call deltas are tokens too
        assert res.ttft_ms_p90 is not None and res.ttft_ms_p90 >= res.ttft_ms_median
    # the stand-in counts a body seen before as a full prefix-cache hit: pass 1 none, pass 2 all
    from eagle3ops.gate.measure import prefix_cache

    pc = prefix_cache(ans)["2"]
    assert pc["queries"] > 0 and pc["hits"] == pc["queries"] / 2 and pc["hit_rate"] == 0.5


def _answer(levels: dict[int, list[LevelResult]], accepted: float = 100.0) -> dict:
    """A measurement answer (:func:`eagle3ops.gate.measure.measure`'s shape) of these passes; the speculative
    counters move by 100 drafts and ``accepted`` accepted tokens a pass."""
    def snap(n: int) -> dict:
        d = asdict(metrics.SpecCounters(100.0 * n, 300.0 * n, accepted * n, {0: accepted * n}, 0.0, 0.0, 0.0))
        d["accepted_per_pos"] = {str(k): v for k, v in d["accepted_per_pos"].items()}
        return d

    return {"levels": {str(c): [p.figures() for p in ps] for c, ps in levels.items()},
            "counters": {str(c): [[snap(i), snap(i + 1)] for i in range(len(ps))] for c, ps in levels.items()}}


def _passes(tps: float, ttft: float, failed: int | None = None) -> list[LevelResult]:
    out = []
    for j in range(3):
        v = tps * (1.0, 1.01, 0.99)[j]
        secs = [64 / v * (0.8 + 0.04 * i) for i in range(10)]
        ttfts = [ttft + i for i in range(10)]
        errs = 0
        if failed is not None and j == 1:
            secs[failed], ttfts[failed], errs = None, None, 1
        out.append(LevelResult(1, 10, errs, 640 - 64 * errs, 640 / v, v, 20.0, 30.0, ttft, 0.0,
                               tuple(0 if s is None else 64 for s in secs), tuple(secs), tuple(ttfts)))
    return out


def test_the_reason_names_a_ttft_breach_and_failed_speculative_requests_roll_back():
    from eagle3ops.supervisor.speculate import decide_measured

    job = SpeculateJob(results_dir="/r", change={"args": ["--speculative-config", "{}"]}, prompts=["p"] * 10,
                       levels=[1], max_tokens=64, passes=3, margin=0.1, acceptance_floor=1.5, ttft_ratio_max=1.5)
    base = _answer({1: _passes(100, 100.0)})
    # the acceptance floor decides (rule 3), the TTFT breach (rule 4) was recorded all the same: the reason names both
    low_acc = _answer({1: _passes(150, 200.0)}, accepted=10.0)
    verdict, reason, fig = decide_measured(job, base, low_acc)
    assert verdict == "rollback" and "below the floor" in reason
    assert fig["ttft_ratio"] > 1.5 and "time to first token x" in reason and "p90 x" in reason
    assert "(serving.gate_ttft_ratio_max)" in reason
    # TTFT p50 and p90 of each side, pooled over the passes
    side = fig["levels"]["1"]["speculative"]
    assert side["ttft_ms_median"] == pytest.approx(204.5) and side["ttft_ms_p90"] == pytest.approx(208.0)
    # passes recorded without answer digests (an older measurement) still decide; their answers are not compared
    assert fig["answer_agreement"]["1"]["not_recorded"].startswith("no answer digests in the baseline's figures")
    # one request failed on the speculative release: a rollback that names it, not "undecided"
    failed = _answer({1: _passes(150, 100.0, failed=3)})
    spec = json.loads(json.dumps(failed))
    spec["levels"]["1"][1]["failures"] = [[3, "HTTP 500 from /v1/chat/completions: grammar backend failed"]]
    verdict, reason, fig = decide_measured(job, base, spec)
    assert verdict == "rollback", reason
    assert "1 of 30 requests failed on the speculative release" in reason
    assert "HTTP 500 from /v1/chat/completions: grammar backend failed" in reason
    assert fig["failed_requests"]["speculative"] == [
        {"concurrency": 1, "pass": 1, "prompt": 3, "error": "HTTP 500 from /v1/chat/completions: grammar backend "
                                                            "failed"}]


#: The live serving's command on the stand-in host below (the sandbox's vLLM, no tool parser).
SERVED = ["vllm", "serve", "/models/tiny-llama", "--port", "18000"]


def _dry_speculate(monkeypatch, tmp_path: Path, r, rows) -> tuple[Path, str | None]:
    """Write ``rows`` as a prompts file and dry-run ``speculate`` on the fake remote ``r``: (the file, the refusal's
    message on one line; None when it was not refused, and then its one speculate window was planned). A refusal
    must come before any window is planned."""
    from eagle3ops.speculate import ship
    from eagle3ops.window import run as window_run

    f = tmp_path / "agent.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    r.dry_run = True
    kinds: list[str] = []
    monkeypatch.setattr(window_run, "run_window", lambda r_, *, kind, **kw: kinds.append(kind) or {"outcome": "dry"})
    opts = ship.SpeculateOptions(run="r1", pipeline_image="p:1", prompts_file=f, accept_low_power=True, force=True)
    try:
        out = ship.speculate(r, opts, echo=lambda *_: None)
    except ship.SpeculateError as exc:
        assert not kinds, f"a window was planned before the refusal: {kinds}"
        return f, " ".join(str(exc).split())
    assert out["verdict"] == "dry-run" and kinds == ["speculate"], (out, kinds)
    return f, None


@pytest.mark.parametrize("flags, choice, refused", [
    pytest.param([], None, True, id="no-parser-auto"),
    pytest.param([], "required", True, id="no-parser-required"),
    pytest.param(["--tool-call-parser=hermes"], "auto", True, id="parser-without-auto"),
    pytest.param([], "none", False, id="tool-choice-none"),
    pytest.param(["--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"], None, False, id="both-flags"),
    pytest.param(["--tokenizer-mode", "mistral"], "auto", False, id="mistral-tokenizer"),
])
def test_tool_rows_the_live_server_cannot_answer_are_refused_before_any_restart(monkeypatch, tmp_path, flags,
                                                                                 choice, refused):
    """A prompts file's chat body with ``tools`` (``tool_choice`` absent, ``auto``, ``required``) against a live
    server without a tool parser: vLLM 0.16 answers each with HTTP 400 ("auto" tool choice requires
    --enable-auto-tool-choice and --tool-call-parser), on the baseline and the speculative release alike, so the
    gate would spend its restarts on a rollback. The dry run (and the real run, same path) refuses it before any
    window is planned, naming the row, the live server's missing flags and both fixes; rows vLLM answers pass."""
    from eagle3ops.config import load_inventory
    from test_speculate_ship import TARGET, _FakeRemote, _Res

    h = load_inventory(Path(__file__).resolve().parents[1] / "deploy/hosts.yaml").host("sandbox")

    class _Served(_FakeRemote):
        """Also answers the serving container's lookup and its full ``docker container inspect``."""

        def run(self, argv, *, check=True, timeout=None, stdin=None, **_):
            a = list(argv)
            if "ps" in a and "--all" in a:
                return _Res(f"{h.serving.container}\n")
            if a[-3:] == ["container", "inspect", h.serving.container]:
                return _Res(json.dumps([{"Config": {"Entrypoint": None, "Cmd": SERVED + flags}}]))
            if a == ["cat", f"{h.model_path}/config.json"]:
                return _Res(json.dumps({**TARGET, "model_type": "llama"}))
            return super().run(argv, check=check, timeout=timeout, stdin=stdin)

    row = {k: v for k, v in TOOL_ROW.items() if k != "tool_choice"}
    if choice is not None:
        row["tool_choice"] = choice
    f, msg = _dry_speculate(monkeypatch, tmp_path, _Served(h, [7]), (CHAT_ROW, row))
    assert (msg is not None) == refused, msg
    if not refused:
        return
    assert f"{f}" in msg and "tool-1" in msg and "HTTP 400" in msg, msg
    assert "--enable-auto-tool-choice" in msg and "--tool-call-parser" in msg, msg
    assert '"tool_choice": "none"' in msg and "nothing was restarted" in msg, msg


@pytest.mark.parametrize("rows, levels, gpus, refused", [
    pytest.param((CHAT_ROW, JSON_ROW), [1, 4], "none", True, id="mixed-cpu-4"),
    pytest.param((CHAT_ROW, {**TOOL_ROW, "tool_choice": "required"}), [2], "none", True, id="required-tool-cpu"),
    pytest.param((CHAT_ROW, JSON_ROW), [1], "none", False, id="mixed-cpu-1"),
    pytest.param((CHAT_ROW, JSON_ROW), [1, 4], "all", False, id="mixed-gpu"),
    pytest.param((JSON_ROW, {**JSON_ROW, "id": "json-2"}), [4], "none", False, id="all-structured-cpu"),
    pytest.param((CHAT_ROW, {**JSON_ROW, "response_format": {"type": "text"}}), [4], "none", False,
                 id="text-format-cpu"),
])
def test_structured_rows_batched_beside_others_on_cpu_serving_are_refused_before_any_restart(
        monkeypatch, tmp_path, rows, levels, gpus, refused):
    """vLLM 0.16's CPU build kills its EngineCore when a request with a grammar (``response_format`` json_schema /
    json_object, a required or named tool call) is batched beside one without: ``apply_grammar_bitmask`` then
    builds its index tensor with ``pin_memory=True`` ("Found no NVIDIA driver on your system"), on the baseline and
    the speculative release alike (seen on the sandbox's CPU vLLM, docs/measured/faults-retried.md). A gate that
    replays such a mix at a concurrency above 1 on a CPU serving host would measure crashes and restart serving for a
    rollback: the dry run (the real run's path) refuses it before any window is planned, naming the rows, the cause
    and the fix. Concurrency 1, a GPU host, a set whose rows all carry a grammar and ``type: text`` pass."""
    from eagle3ops.config import load_inventory
    from test_speculate_ship import _FakeRemote

    h = load_inventory(Path(__file__).resolve().parents[1] / "deploy/hosts.yaml").host("sandbox")
    h = h.model_copy(update={"gpus": 0 if gpus == "none" else 8,
                             "serving": h.serving.model_copy(update={"gpus": gpus, "gate_concurrency": levels})})
    f, msg = _dry_speculate(monkeypatch, tmp_path, _FakeRemote(h, [7]), rows)
    assert (msg is not None) == refused, msg
    if not refused:
        return
    structured = [x["id"] for x in rows if x.get("response_format") or x.get("tool_choice") == "required"]
    assert f"{f}" in msg and all(i in msg for i in structured) and "chat-1" not in msg.split("(")[1], msg
    assert "Found no NVIDIA driver" in msg and "pin_memory" in msg and f"concurrency {max(levels)}" in msg, msg
    assert "gate_concurrency: [1]" in msg and "nothing was restarted" in msg, msg

