"""The speed gate measured beside production's clients (``serving.gate_traffic: live``): the inventory's rules, the
decision's handling of other requests (no refusal with the ``aba`` order, refusal without it, failed requests
always), the replay's skipped idle wait, the job's request, and the cycle plan's time clients get no answer. Pure,
except the replay test: a real HTTP server on 127.0.0.1 (the stdlib's ``ThreadingHTTPServer``, a **stand-in** for
vLLM that answers ``/metrics`` with a client's request running beside the replay's and streams a fixed completion)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import ValidationError

from eagle3ops.config.inventory import ServingConfig
from eagle3ops.gate import decide as dec
from eagle3ops.gate import replay
from eagle3ops.gate.metrics import SpecDelta
from eagle3ops.gate.replay import LevelResult
from eagle3ops.speculate import cycle as cy
from eagle3ops.speculate.restarts import restart_plan

PROMPTS, TOKENS = 4, 32
ACC = SpecDelta(100, 300, 120, {0: 70, 1: 35, 2: 15})  # mean acceptance length 2.2


def _passes(rates: list[float], foreign: float = 0.0, errors: int = 0) -> list[LevelResult]:
    """One pass per rate (output tokens/s), each prompt ``TOKENS`` tokens; ``foreign``: another client's request
    seen running in every pass (its mean a third of it)."""
    out = []
    for r in rates:
        secs = (TOKENS / r,) * PROMPTS
        out.append(LevelResult(1, PROMPTS, errors, PROMPTS * TOKENS, sum(secs), r, None, None, 50.0, foreign,
                               (TOKENS,) * PROMPTS, secs, (50.0,) * PROMPTS, foreign_mean=foreign / 3))
    return out


def _decide(traffic: str, foreign: float, aba: bool = True, errors: int = 0) -> dec.Decision:
    before = {1: _passes([10.0, 10.2], foreign)}
    spec = {1: _passes([15.0, 15.3, 14.9, 15.1], foreign, errors)}
    after = {1: _passes([10.1, 9.9], foreign)} if aba else None
    if not aba:
        before = {1: _passes([10.0, 10.2, 10.1, 9.9], foreign)}
    return dec.decide(before, spec, ACC, production_concurrency=1, margin=0.1, acceptance_floor=1.5, after=after,
                      traffic=traffic)


def test_live_traffic_is_measured_beside_not_refused_and_recorded() -> None:
    idle = _decide("idle", foreign=1.0)
    assert idle.verdict == "undecided" and "foreign requests" in idle.reason
    live = _decide("live", foreign=1.0)
    assert live.verdict == "keep", live.reason  # x1.5 faster, the same clients' load on every block
    t = live.figures["clients"]
    assert t["mode"] == "live" and t["measured_beside_clients"] is True and "assumption" in t
    assert t["speculative"] == {"foreign_mean": pytest.approx(1 / 3, abs=1e-3), "foreign_most": 1.0}
    assert set(t) >= {"baseline", "baseline_after"}
    assert live.figures["levels"]["1"]["speculative"]["foreign_mean"] == pytest.approx(1 / 3, abs=1e-3)


def test_live_traffic_keeps_the_gate_honest() -> None:
    # without the baseline's second block nothing shows whether the clients' load changed: refused as idle
    ab = _decide("live", foreign=1.0, aba=False)
    assert ab.verdict == "undecided" and "foreign requests" in ab.reason
    assert ab.figures["clients"]["measured_beside_clients"] is False
    # a failed request is the release's, clients or not
    failed = _decide("live", foreign=1.0, errors=1)
    assert failed.verdict == "undecided" and "failed requests" in failed.reason
    # a load that changed between the baseline's blocks shows as their drift: undecided, not a keep
    drifted = dec.decide({1: _passes([10.0, 10.2], 1.0)}, {1: _passes([15.0, 15.3, 14.9, 15.1], 1.0)}, ACC,
                         production_concurrency=1, margin=0.1, acceptance_floor=1.5,
                         after={1: _passes([7.0, 7.1], 3.0)}, traffic="live")
    assert drifted.verdict == "undecided" and "drifted" in drifted.reason


def test_inventory_refuses_live_traffic_with_the_ab_order_or_a_drain_hook() -> None:
    ok = ServingConfig(image="x", served_model_name="m", gate_traffic="live")
    assert ok.gate_traffic == "live" and ok.gate_design == "aba"
    assert ServingConfig(image="x", served_model_name="m").gate_traffic == "idle"
    with pytest.raises(ValidationError, match="gate_design: aba"):
        ServingConfig(image="x", served_model_name="m", gate_traffic="live", gate_design="ab")
    with pytest.raises(ValidationError, match="remove the hooks"):
        ServingConfig(image="x", served_model_name="m", gate_traffic="live", drain_hook=["true"])


class _Busy(BaseHTTPRequestHandler):
    """Stand-in vLLM: ``/metrics`` always shows two requests running (the replay's own and a client's), a
    completion streams 3 tokens after 30 ms."""

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        body = b"vllm:num_requests_running 2.0\nvllm:num_requests_waiting 0.0\nvllm:generation_tokens_total 5.0\n"
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["content-length"]))
        time.sleep(0.03)
        ev = [{"choices": [{"text": t, "finish_reason": None}]} for t in ("a", "b", "c")]
        ev.append({"choices": [], "usage": {"completion_tokens": 3}})
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in ev).encode() + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_replay_measures_a_busy_server_only_when_live() -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Busy)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        with pytest.raises(replay.ReplayError, match="not idle"):
            replay.replay_level(url, "m", ["p"], 1, idle_timeout_s=1.5)
        # 40 requests of 30 ms: the monitor's 0.5 s scrapes see the client's request
        res = replay.replay_level(url, "m", ["p"] * 40, 1, live=True)
    finally:
        srv.shutdown()
    assert res.errors == 0 and res.output_tokens == 120
    assert res.wall_s > 1.0 and res.foreign_requests >= 1.0 and res.foreign_mean >= 1.0


def test_the_job_asks_the_measurement_for_live_traffic(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    import eagle3ops.gate.measure as gm
    from eagle3ops.supervisor import speculate as sp

    sent: dict = {}
    job = SimpleNamespace(prompts=["p"], levels=[1], max_tokens=4, passes=1, request_timeout_s=5.0,
                          idle_timeout_s=5.0, warmup_prompts=0, traffic="live")
    sup = SimpleNamespace(plan=SimpleNamespace(health=SimpleNamespace(port=1, model="m")), api_key=lambda: None)
    monkeypatch.setattr(gm, "measure", lambda req: sent.update(req) or {})
    sp.measure_serving(sup, job)
    assert sent["traffic"] == "live"


def _plan(traffic: str, drain: bool) -> cy.CyclePlan:
    work = (cy.WorkFacts("w1", 0, 0, 0.0),)
    facts = cy.CycleFacts("prod", work, restart_plan([30.0, 34.0, 40.0], bound_s=600.0, keep=4, rollback=3, design="aba"), 1.3,
                          gate_recorded=(400.0, 460.0, 500.0), head_bytes=10_000_000, gate_traffic=traffic,
                          drain=drain)
    return cy.plan_cycle(facts, cy.CycleOptions(run="r1", inventory=Path("inv.yaml"), pipeline=Path("pipe.yaml"),
                                                datasets=(Path("chats.jsonl"),), link_mbit=800.0))


def test_the_cycle_plan_says_how_long_clients_get_no_answer() -> None:
    live = _plan("live", drain=False).as_dict()["production_serving"]
    assert live["gate_traffic"] == "live"
    # only the restarts: 4 to keep, 3 to reject (aba) x the median recorded restart
    assert live["clients_held_off_keep_s"] == live["expected_downtime_keep_s"] == pytest.approx(4 * 34.0)
    assert live["clients_held_off_rollback_s"] == pytest.approx(3 * 34.0)
    drained = _plan("idle", drain=True)
    figs = drained.as_dict()["production_serving"]
    assert figs["clients_held_off_keep_s"] == figs["clients_held_off_rollback_s"] == pytest.approx(460.0)
    assert figs["expected_downtime_keep_s"] == pytest.approx(4 * 34.0)
    assert any("no answer for ~460 s" in line and "drain_hook" in line for line in drained.lines())
    bare = _plan("idle", drain=False).as_dict()["production_serving"]
    assert "gate_traffic: live" in bare["clients_held_off_note"]


def test_the_jobs_verdict_keeps_the_clients_figures_beside_the_endpoints() -> None:
    from types import SimpleNamespace

    from eagle3ops.supervisor.verdict import decide_figures

    def answer(rates: list[float], drafts: float) -> dict:
        c0 = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "accepted_per_pos": {}, "requests_running": 1.0}
        c1 = {**c0, "drafts": drafts, "draft_tokens": 3 * drafts, "accepted": 1.2 * drafts,
              "accepted_per_pos": {"0": drafts}}
        return {"levels": {"1": [p.figures() for p in _passes(rates, 1.0)]},
                "counters": {"1": [[c0, c1] for _ in rates]},
                "traffic": {"endpoints": {"/v1/completions": PROMPTS}, "base_url": "http://127.0.0.1:1"}}

    job = SimpleNamespace(levels=[1], margin=0.1, acceptance_floor=1.5, ttft_ratio_max=None, rule="faster",
                          traffic="live")
    d = decide_figures(job, answer([10.0, 10.2], 0.0), answer([15.0, 15.3, 14.9, 15.1], 100.0), None,
                       answer([10.1, 9.9], 0.0))
    assert d.verdict == "keep", d.reason
    assert d.figures["traffic"]["endpoints"] == {"/v1/completions": PROMPTS}
    assert d.figures["clients"]["measured_beside_clients"] is True
