"""The speculation gate's parts: vLLM's spec-decode counters as deltas, HumanEval prompts split and kept
disjoint from training, load replay against real vLLM serving on the sandbox, and the keep-or-rollback rule."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import threading
import time

import pytest

from eagle3ops.gate import decide as dec
from eagle3ops.gate import metrics
from eagle3ops.speculate import prompts
from eagle3ops.gate.replay import ANSWER_HEAD_CHARS, LevelResult, replay_level

#: Stand-in for a vLLM 0.16 /metrics body with speculation on (counter names from shared/FACTS.md; a `_created`
#: sample beside each counter, as prometheus_client exports them).
METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}
# HELP vllm:generation_tokens Number of generation tokens processed.
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{{engine="0",model_name="m"}} {gen}
vllm:generation_tokens_created{{engine="0",model_name="m"}} 1.7e9
# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_drafts_created{{engine="0",model_name="m"}} 1.7e9
# HELP vllm:spec_decode_num_draft_tokens Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {draft_tokens}
# HELP vllm:spec_decode_num_accepted_tokens Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
# HELP vllm:spec_decode_num_accepted_tokens_per_pos Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="2"}} {p2}
"""


def _scrape(**kw) -> metrics.SpecCounters:
    return metrics.parse(METRICS.format(**{"running": 0, "waiting": 0, "gen": 0, **kw}))


def test_deltas_give_vllms_acceptance_length_and_per_position_rates():
    before = _scrape(drafts=100, draft_tokens=300, accepted=150, p0=80, p1=45, p2=25)
    after = _scrape(drafts=300, draft_tokens=900, accepted=450, p0=260, p1=130, p2=60, running=2, waiting=3,
                    gen=1234)
    assert (after.requests_running, after.requests_waiting, after.generation_tokens) == (2, 3, 1234)
    assert after.accepted_per_pos == {0: 260, 1: 130, 2: 60}
    d = metrics.SpecDelta.between(before, after)
    assert (d.drafts, d.draft_tokens, d.accepted) == (200, 600, 300)
    assert d.mean_acceptance_length == pytest.approx(1 + 300 / 200)
    assert d.acceptance_rate == pytest.approx(0.5)
    assert d.per_position == pytest.approx({0: 0.9, 1: 0.425, 2: 0.175})
    with pytest.raises(ValueError, match="went down"):
        metrics.SpecDelta.between(after, before)


def test_a_server_without_speculation_has_no_acceptance_length():
    d = metrics.SpecDelta.between(metrics.parse(""), metrics.parse(""))
    assert d.mean_acceptance_length is None and d.per_position == {}


def test_humaneval_prompts_split_by_id_and_disjoint_from_training():
    he = prompts.humaneval()
    assert len(he) == 164 and he[0].id == "HumanEval/0" and "def " in he[0].text
    train, gate = prompts.split_by_id(he, 0.25)
    assert {p.id for p in train}.isdisjoint({p.id for p in gate}) and len(train) + len(gate) == 164
    assert 20 < len(gate) < 70
    train2, gate2 = prompts.split_by_id(list(reversed(he)), 0.25)  # by id: order does not matter
    assert {p.id for p in gate2} == {p.id for p in gate}
    rec = prompts.disjointness(gate, [p.text for p in train])
    assert rec["overlap"] == [] and rec["gate_prompts"] == len(gate) and len(rec["gate_sha256"]) == 64
    leaked = [p.text for p in train] + ["  " + gate[3].text.replace("\n", "\n  ") + "\n"]  # whitespace differs
    with pytest.raises(prompts.GatePromptsError, match=gate[3].id):
        prompts.disjointness(gate, leaked)


def _level(c: int, tps: float, foreign: float = 0, errors: int = 0, passes: int = 3,
           ttft: float = 100.0) -> list[LevelResult]:
    """``passes`` passes of 10 prompts x 64 tokens at ``tps`` tokens/s, the passes within ±1 % of each other and
    the prompts' request times apart (so the interval has something to resample)."""
    out = []
    for j in range(passes):
        v = tps * (1.0, 1.01, 0.99, 1.005, 0.995)[j % 5]
        out.append(LevelResult(c, 10, errors, 640, 640 / v, v, 20.0, 30.0, ttft, foreign, (64,) * 10,
                               tuple(64 / v * (0.8 + 0.04 * i) for i in range(10)), (ttft,) * 10))
    return out


def _spec(acc: float) -> metrics.SpecDelta:
    return metrics.SpecDelta(100, 300, (acc - 1) * 100, {0: (acc - 1) * 100})


def test_keep_only_when_faster_at_production_concurrency_and_acceptance_above_the_floor():
    # the rule: three passes per side with per-prompt figures; the reason names the interval
    base = {1: _level(1, 100), 8: _level(8, 400)}
    keep = dec.decide(base, {1: _level(1, 130), 8: _level(8, 380)}, _spec(2.2), production_concurrency=1,
                      margin=0.1, acceptance_floor=1.5)
    assert keep.keep and "x1.300" in keep.reason and "lower bound clears x1.100" in keep.reason
    assert keep.interval is not None and keep.interval.low >= 1.1 and keep.interval.high <= 1.4
    assert keep.figures["interval"]["low"] == round(keep.interval.low, 4)
    assert keep.figures["levels"]["8"]["throughput_ratio"] == pytest.approx(0.95, abs=1e-3)  # reported only
    assert len(keep.figures["levels"]["1"]["baseline"]["passes"]) == 3 and keep.figures["drift"]["exceeded"] is False
    slow = dec.decide(base, {1: _level(1, 95), 8: _level(8, 500)}, _spec(2.2), production_concurrency=1,
                      margin=0.1, acceptance_floor=1.5)
    assert slow.verdict == "rollback" and "upper bound below x1.100" in slow.reason
    low = dec.decide(base, {1: _level(1, 200), 8: _level(8, 500)}, _spec(1.2), production_concurrency=1,
                     margin=0.1, acceptance_floor=1.5)
    assert low.verdict == "rollback" and "below the floor" in low.reason
    skewed = dec.decide(base, {1: _level(1, 200, foreign=3), 8: _level(8, 500)}, _spec(2.2),
                        production_concurrency=1, margin=0.1, acceptance_floor=1.5)
    assert skewed.verdict == "undecided" and not skewed.keep and "speculative at 1" in skewed.reason
    neg = dec.decide(base, {1: _level(1, 95), 8: _level(8, 300)}, _spec(1.6), production_concurrency=1,
                     margin=-0.5, acceptance_floor=1.5)
    assert neg.keep and neg.figures["margin_is_negative_test_setting"] is True
    with pytest.raises(ValueError, match="production concurrency 4"):
        dec.decide(base, base, _spec(2), production_concurrency=4, margin=0, acceptance_floor=1)
    with pytest.raises(ValueError, match="at least 3 passes"):
        dec.decide({1: _level(1, 100, passes=2)}, {1: _level(1, 130)}, _spec(2), production_concurrency=1,
                   margin=0.1, acceptance_floor=1.5)


def test_a_straddling_interval_is_undecided_and_names_the_figure_that_would_have_decided():
    base = {1: _level(1, 100)}
    spec = _level(1, 108)
    # one slow speculative pass: the ratio's interval spans 1.05
    spec[1] = _level(1, 90)[1]
    d = dec.decide(base, {1: spec}, _spec(2.2), production_concurrency=1, margin=0.05, acceptance_floor=1.5)
    assert d.verdict == "undecided" and not d.keep
    assert d.interval is not None and d.interval.low < 1.05 <= d.interval.high
    assert d.deciding == {"figure": "lower bound of the 90% throughput-ratio interval",
                          "value": round(d.interval.low, 4), "needs": 1.05, "leans": "rollback",
                          "center": round(d.interval.center, 4), "passes_to_decide": d.deciding["passes_to_decide"]}
    assert d.figures["deciding"] == d.deciding and "would have to reach x1.050" in d.reason
    # inconclusive says which side the evidence leaned and what would decide it
    assert d.interval.center < 1.05 and "leans rollback" in d.reason and "rolled back" in d.reason
    more = d.deciding["passes_to_decide"]
    assert more is not None and more > 3 and f"--passes {more}" in d.reason
    # the figure is what it claims: at ``more`` passes the same centre and spread give an interval below 1.05,
    # at one pass fewer they still straddle it
    sp = d.interval.se_log / (2 / 3) ** 0.5
    upper = lambda n: math.log(d.interval.center) + dec.t_quantile(0.95, 2 * n - 2) * sp * (2 / n) ** 0.5
    assert upper(more) < math.log(1.05) <= upper(more - 1)
    # a straddle centred above the bar leans keep
    up = _level(1, 112)
    up[1] = _level(1, 95)[1]
    u = dec.decide(base, {1: up}, _spec(2.2), production_concurrency=1, margin=0.05, acceptance_floor=1.5)
    assert u.verdict == "undecided" and u.deciding["leans"] == "keep" and "leans keep" in u.reason
    # the passes ran in two blocks with a restart between: the result says the shift between them was not measured
    assert d.figures["design"]["block_shift_measured"] is False and "not seen" in d.figures["design"]["risk"]


def test_baseline_drift_beyond_half_the_margin_is_undecided_and_reported():
    steady = dec.baseline_drift(_level(1, 100), 0.05)
    assert not steady.exceeded and abs(steady.change) <= 0.011
    drifting = [_level(1, v)[0] for v in (100.0, 104.0, 108.2, 112.5)]  # +4 % a pass, tightly
    d = dec.decide({1: drifting}, {1: _level(1, 150, passes=4)}, _spec(2.2), production_concurrency=1,
                   margin=0.05, acceptance_floor=1.5)
    assert d.verdict == "undecided" and "drifted +12.5%" in d.reason
    assert d.drift is not None and d.drift.exceeded and d.figures["drift"]["passes_tokens_per_s"][0] == 100.0
    # scatter without a trend is not drift: the interval of a noisy trend reaches inside ±margin/2
    noisy = [_level(1, v)[0] for v in (100.0, 112.0, 101.0, 113.0)]
    assert not dec.baseline_drift(noisy, 0.05).exceeded
    # three passes: a trend with one degree of freedom cannot see drift; the check is not made, and says so
    three = dec.baseline_drift([_level(1, v)[0] for v in (100.0, 104.0, 108.2)], 0.05)
    assert not three.made and not three.exceeded and "not made" in three.figures()["not_made"]


def test_a_slow_first_token_rolls_back_whatever_the_throughput():
    base = {1: _level(1, 100, ttft=100.0)}
    d = dec.decide(base, {1: _level(1, 150, ttft=170.0)}, _spec(2.2), production_concurrency=1, margin=0.05,
                   acceptance_floor=1.5, ttft_ratio_max=1.5)
    assert d.verdict == "rollback" and "time to first token x1.700" in d.reason and d.ttft_ratio == pytest.approx(1.7)
    ok = dec.decide(base, {1: _level(1, 150, ttft=140.0)}, _spec(2.2), production_concurrency=1, margin=0.05,
                    acceptance_floor=1.5, ttft_ratio_max=1.5)
    assert ok.keep


def test_the_interval_is_a_t_interval_on_log_pass_rates_and_names_its_method():
    base, spec = _level(1, 100), _level(1, 130)
    a = dec.ratio_interval(base, spec)
    assert a == dec.ratio_interval(base, spec)  # nothing random: the same figures give the same interval
    # by hand: Student's pooled two-sample t on the passes' log tokens/s, 3 + 3 passes -> 4 df, t(0.95; 4) = 2.132
    x = [math.log(p.output_tokens / p.wall_s) for p in base]
    y = [math.log(p.output_tokens / p.wall_s) for p in spec]
    var = lambda v: sum((e - sum(v) / len(v)) ** 2 for e in v) / (len(v) - 1)
    se = math.sqrt((var(x) + var(y)) / 2 * (2 / 3))
    d = sum(y) / 3 - sum(x) / 3
    assert a.df == 4 and a.se_log == pytest.approx(se)
    assert (a.low, a.high) == pytest.approx((math.exp(d - 2.132 * se), math.exp(d + 2.132 * se)), rel=1e-4)
    assert a.figures()["method"].startswith("Student two-sample t on log pass tokens/s")
    assert a.pass_cv_baseline == pytest.approx(math.sqrt(math.expm1(var(x))))
    # per-pass noise shared by every prompt of a pass widens the interval
    wide = [_level(1, v)[0] for v in (90.0, 100.0, 110.0)]
    assert dec.ratio_interval(wide, spec).high - dec.ratio_interval(wide, spec).low > 2 * (a.high - a.low)
    with pytest.raises(ValueError, match="same prompts"):
        short = [dataclasses.replace(p, prompt_tokens=p.prompt_tokens[:5], prompt_seconds=p.prompt_seconds[:5])
                 for p in spec]
        dec.ratio_interval(base, short)


def test_t_quantiles_and_power_match_the_tables():
    # Student's t table (two-sided 90 % and 95 %)
    for df, t95, t975 in ((1, 6.314, 12.706), (2, 2.920, 4.303), (4, 2.132, 2.776), (8, 1.860, 2.306),
                          (30, 1.697, 2.042)):
        assert dec.t_quantile(0.95, df) == pytest.approx(t95, abs=1e-3)
        assert dec.t_quantile(0.975, df) == pytest.approx(t975, abs=1e-3)
    # power at x1.30, margin 0.05, 10 % pass CV: rises with the passes and crosses 80 % at 4
    pw = [dec.power(n, 0.10, 0.05) for n in (3, 4, 5)]
    assert pw[0] < 0.80 <= pw[1] < pw[2] and dec.passes_for_power(0.10, 0.05) == 4
    assert dec.power(3, 0.007, 0.05) == pytest.approx(1.0) and dec.power(3, 0.10, 0.30) < 0.5
    assert dec.passes_for_power(0.10, 0.40) is None  # a bar above the speed-up: no number of passes


@pytest.mark.sandbox
def test_replay_measures_real_vllm_serving_and_sees_foreign_requests(deployed):
    """Against the sandbox's real vLLM server: exact token counts (ignore_eos), chat bodies (one with
    ``response_format``) through ``/v1/chat/completions``, then a level during which another client sends requests is
    marked as shared."""
    import httpx

    h, _ = deployed
    base = f"http://127.0.0.1:{h.serving.port}"
    gate = [p.text for p in prompts.humaneval()[:4]]
    r1 = replay_level(base, h.serving.served_model_name, gate, 1, max_tokens=8)
    r2 = replay_level(base, h.serving.served_model_name, gate, 2, max_tokens=8)
    for r in (r1, r2):
        assert r.errors == 0 and r.output_tokens == 4 * 8 and r.output_tokens_per_s > 0
        assert r.itl_ms_median is not None and r.ttft_ms_median is not None and r.foreign_requests == 0
        assert r.ttft_ms_p90 is not None and r.failures == ()
        # vLLM's streamed text digested per prompt in the prompts' order (8 tokens: a head shorter than its cut is
        # the whole answer, so its digest is the head's)
        assert len(r.answer_sha256) == len(r.answer_head) == 4 and None not in r.answer_sha256
        assert all(hashlib.sha256(t.encode()).hexdigest() == d for t, d in zip(r.answer_head, r.answer_sha256,
                                                                                strict=True)
                   if len(t) < ANSWER_HEAD_CHARS)
    # chat bodies through vLLM's own /v1/chat/completions (its chat template; xgrammar for response_format): the
    # replay reads vLLM's chat stream (delta content, usage, [DONE]); ignore_eos only on the unconstrained body
    chat = [{"messages": [{"role": "user", "content": "Say hi."}]},
            {"messages": [{"role": "user", "content": "Reply in JSON."}], "response_format": {"type": "json_object"}}]
    rc = replay_level(base, h.serving.served_model_name, chat, 1, max_tokens=8)
    assert rc.errors == 0, rc.failures
    assert rc.prompt_tokens[0] == 8 and 0 < rc.prompt_tokens[1] <= 8
    assert all(t is not None for t in rc.prompt_ttft_ms) and rc.ttft_ms_p90 is not None
    stop = threading.Event()

    def other_client() -> None:
        body = {"model": h.serving.served_model_name, "prompt": "x", "max_tokens": 64, "ignore_eos": True}
        while not stop.is_set():
            httpx.post(f"{base}/v1/completions", json=body, timeout=120)

    threads = [threading.Thread(target=other_client, daemon=True) for _ in range(2)]
    holder: dict[str, LevelResult] = {}
    # A level long enough to be running when the other client starts (idle here: ~260 tokens/s at concurrency 1,
    # so 16 x 64 tokens take ~4 s; 6 x 32 once finished in 0.7 s, before the other requests came)
    level = threading.Thread(target=lambda: holder.update(r=replay_level(
        base, h.serving.served_model_name, [p.text for p in prompts.humaneval()[:16]], 1, max_tokens=64)))
    level.start()
    deadline = time.monotonic() + 120  # the level is running (its own idle check passed, a request is in flight) ...
    while not (metrics.parse(httpx.get(f"{base}/metrics", timeout=10).text).requests_running or 0):
        assert time.monotonic() < deadline and level.is_alive(), "the level never started sending"
        time.sleep(0.1)
    # ... now someone else's requests arrive
    for t in threads:
        t.start()
    try:
        level.join(timeout=600)
        assert holder["r"].foreign_requests >= 1, holder["r"]
        with pytest.raises(Exception, match="not idle"):  # and a new level refuses to start on the busy server
            replay_level(base, h.serving.served_model_name, gate, 1, max_tokens=8, idle_timeout_s=3)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=180)
