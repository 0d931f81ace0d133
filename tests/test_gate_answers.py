"""Answer agreement in the gate: how many greedy answers a measured release shares with the baseline
(:mod:`eagle3ops.gate.answers`), recorded by the replay per prompt and carried into the verdict's figures and the
printed result. Pure, except the end-to-end test: a real HTTP server on 127.0.0.1 (the stdlib's
``ThreadingHTTPServer``, a **stand-in** for vLLM, NOT vLLM: it streams an answer made from the prompt in vLLM's
chunk format, garbage for the prompts it is told to break, and answers ``/metrics`` idle)."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from eagle3ops.console import answer_lines
from eagle3ops.gate.answers import MOST_DIFFERING, answer_agreement, level_agreement
from eagle3ops.gate.replay import LevelResult


def _pass(answers: list[str | None], c: int = 1) -> LevelResult:
    """A pass whose prompt ``i`` was answered ``answers[i]`` (None: failed); its speed figures do not matter here."""
    n = len(answers)
    return LevelResult(c, n, answers.count(None), 8 * n, 1.0, 8.0 * n, None, None, 10.0, 0.0,
                       answer_sha256=tuple(hashlib.sha256(a.encode()).hexdigest() if a is not None else None
                                           for a in answers),
                       answer_head=tuple(a[:80] if a is not None else None for a in answers))


def test_agreement_counts_identical_answers_and_names_the_first_differing_prompts() -> None:
    base = [f"answer {i}" for i in range(10)]
    spec = [*base]
    for i in (1, 4, 5, 6, 7, 8, 9):
        spec[i] = "garbage"
    spec[2] = None  # failed on the speculative release: not compared, not counted as differing
    row = level_agreement(_pass(base), _pass(spec))
    assert row["prompts"] == 9 and row["identical"] == 2 and row["share"] == round(2 / 9, 4)
    assert row["not_compared"] == 1
    assert row["differing"] == [1, 4, 5, 6, 7] and len(row["differing"]) == MOST_DIFFERING
    assert row["examples"][0] == {"prompt": 1, "baseline": "answer 1", "speculative": "garbage"}
    same = level_agreement(_pass(base), _pass(base))
    assert same["identical"] == same["prompts"] == 10 and same["share"] == 1.0 and same["differing"] == []


def test_figures_without_answers_or_of_another_prompt_set_are_not_compared() -> None:
    old = LevelResult(1, 2, 0, 16, 1.0, 16.0, None, None, 10.0, 0.0)  # measured before answers were recorded
    assert "baseline's" in level_agreement(old, _pass(["a", "b"]))["not_recorded"]
    assert "speculative release's" in level_agreement(_pass(["a", "b"]), old)["not_recorded"]
    assert "2 and 3 prompts" in level_agreement(_pass(["a", "b"]), _pass(["a", "b", "c"]))["not_recorded"]
    assert answer_lines({"answer_agreement": {"1": level_agreement(old, old)}}) == [
        "greedy answers not compared at concurrency 1: no answer digests in the baseline's figures (measured "
        "before answers were recorded)"]
    assert answer_lines({}) == []  # a result recorded before answers were kept prints nothing


def test_each_level_compares_first_passes_and_the_baseline_with_itself() -> None:
    a = ["x", "y", "z"]
    base = {1: [_pass(a), _pass(["x", "y", "Z"])], 2: [_pass(a, 2)]}
    spec = {1: [_pass(["x", "q", "z"]), _pass(a)], 2: [_pass(a, 2)], 4: [_pass(a, 4)]}
    got = answer_agreement(base, spec)
    assert set(got) == {"1", "2"}  # a level measured on one side only is left out
    # the first passes decide (the speculative second pass, identical, does not count); the baseline's own
    # second pass is its self-agreement
    assert got["1"]["identical"] == 2 and got["1"]["differing"] == [1]
    assert got["1"]["baseline_self"]["identical"] == 2 and got["1"]["baseline_self"]["differing"] == [2]
    assert got["2"]["identical"] == 3 and got["2"]["baseline_self"] is None  # one baseline pass: nothing to compare
    # the aba design's block after the speculative release is preferred for the self-agreement
    after = answer_agreement(base, spec, after={1: [_pass(a)]})
    assert after["1"]["baseline_self"]["identical"] == 3
    assert answer_lines({"answer_agreement": got}) == [
        "greedy answers identical to the baseline's: 2/3 at concurrency 1 (first differing: prompt 1; the baseline "
        "against itself: 2/3)",
        "greedy answers identical to the baseline's: 3/3 at concurrency 2"]


class _Echo(BaseHTTPRequestHandler):
    """Stand-in vLLM: ``/metrics`` idle, ``/version`` 404; a completion streams ``"echo " + prompt`` two characters
    a chunk (a chat body: its last message's content), garbage for a prompt in the server's ``broken`` set."""

    disable_nagle_algorithm = True  # headers and body are two writes: without it each answer waits a delayed ACK

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path != "/metrics":
            self.send_error(404)
            return
        self._send("text/plain", b"vllm:num_requests_running 0.0\nvllm:num_requests_waiting 0.0\n"
                                 b"vllm:generation_tokens_total 0.0\n")

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        chat = self.path == "/v1/chat/completions"
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        text = "#$%&" * 5 if prompt in self.server.broken else f"echo {prompt}"
        pieces = [text[i:i + 2] for i in range(0, len(text), 2)]
        ev = [{"choices": [{"index": 0, "delta": {"content": p}} if chat else {"index": 0, "text": p}]}
              for p in pieces]
        ev.append({"choices": [], "usage": {"completion_tokens": len(pieces)}})
        self._send("text/event-stream",
                   "".join(f"data: {json.dumps(e)}\n\n" for e in ev).encode() + b"data: [DONE]\n\n")

    def _send(self, ctype: str, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _measure(prompts: list, broken: set[str]) -> dict:
    """:func:`eagle3ops.gate.measure.measure` of a stand-in serving that breaks the ``broken`` prompts: 3 passes
    (the decision's least) at concurrency 2. ``traffic: live`` skips the idle wait before each level (two scrapes
    a second apart; the stand-in serves nobody else and reads idle throughout)."""
    from eagle3ops.gate.measure import measure

    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    srv.broken = broken
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        return measure({"base_url": f"http://127.0.0.1:{srv.server_address[1]}", "model": "m", "prompts": prompts,
                        "levels": [2], "max_tokens": 8, "passes": 3, "traffic": "live"})
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_replay_records_answers_in_prompt_order_and_the_verdict_reports_their_agreement() -> None:
    from eagle3ops.config.plan import SpeculateJob
    from eagle3ops.supervisor.verdict import decide_measured

    prompts = [f"prompt {i}" for i in range(7)] + [{"messages": [{"role": "user", "content": "chat 7"}]}]
    base = _measure(prompts, set())
    spec = _measure(prompts, {"prompt 3", "chat 7"})
    # per prompt in the prompts' order whatever the order of completion, every pass
    for p in base["levels"]["2"]:
        assert p["answer_sha256"] == [hashlib.sha256(f"echo {x}".encode()).hexdigest()
                                      for x in [*prompts[:7], "chat 7"]]
        assert p["answer_head"][7] == "echo chat 7"
    assert spec["levels"]["2"][0]["answer_head"][3] == "#$%&" * 5
    job = SpeculateJob(results_dir="/r", rule="not_slower", change={"image": "new:1"}, prompts=prompts,
                       levels=[2], max_tokens=8, passes=3, margin=0.1, acceptance_floor=None)
    _, _, fig = decide_measured(job, base, spec)
    row = fig["answer_agreement"]["2"]
    assert (row["prompts"], row["identical"], row["differing"]) == (8, 6, [3, 7])
    assert row["examples"][0] == {"prompt": 3, "baseline": "echo prompt 3", "speculative": "#$%&" * 5}
    assert row["baseline_self"]["identical"] == 8  # the baseline's second pass answered as its first
    assert answer_lines(fig) == ["greedy answers identical to the baseline's: 6/8 at concurrency 2 (first "
                                 "differing: prompt 3, 7; the baseline against itself: 8/8)"]
    # the result's pass rows leave the per-prompt digests to the measurement
    assert "answer_sha256" not in fig["levels"]["2"]["baseline"]["passes"][0]
    assert "answer_head" not in fig["levels"]["2"]["speculative"]
