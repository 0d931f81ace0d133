"""The order of the gate's passes (pure): the three-block design ``aba`` (the baseline restarted and measured before
and after the speculative release) against the two-block ``ab``: the passes each block runs, the restarts of each
path the plan prints, the decision on the blocks' contrast (a linear drift and a restarted server's own speed
cancel; ``ab`` is moved by both), the drift check between the baseline's two blocks, and the power per design.

The passes are built here from chosen rates (every prompt of a pass at the pass's rate): figures, not a server.
"""

from __future__ import annotations

import math

import pytest

from eagle3ops.gate import decide as dec
from eagle3ops.gate.metrics import SpecDelta
from eagle3ops.gate.replay import LevelResult
from eagle3ops.speculate.restarts import design_for, restart_plan, restarts_for

PROMPTS, TOKENS = 4, 32
ACC = SpecDelta(100, 300, 120, {0: 70, 1: 35, 2: 15})  # mean acceptance length 2.2


def _passes(rates: list[float]) -> list[LevelResult]:
    """One pass per rate (output tokens/s), each prompt ``TOKENS`` tokens at that rate."""
    out = []
    for r in rates:
        secs = (TOKENS / r,) * PROMPTS
        out.append(LevelResult(1, PROMPTS, 0, PROMPTS * TOKENS, sum(secs), r, None, None, 50.0, 0.0,
                               (TOKENS,) * PROMPTS, secs, (50.0,) * PROMPTS))
    return out


def test_block_passes_and_restarts_per_design():
    assert dec.block_passes(3, "ab") == (3, 3, 0) and dec.block_passes(3, "aba") == (2, 3, 2)
    assert dec.block_passes(4, "aba") == (2, 4, 2) and dec.block_passes(5, "aba") == (3, 5, 3)
    with pytest.raises(ValueError, match="gate design 'abba'"):
        dec.block_passes(3, "abba")
    # the contrast's standard error factor: at most the two-block one's, equal at even passes
    for n in (3, 4, 5, 6):
        k_ab, df_ab = dec.design_spread(n, "ab")
        k_aba, df_aba = dec.design_spread(n, "aba")
        assert k_aba <= k_ab + 1e-12 and df_aba == sum(dec.block_passes(n, "aba")) - 3
        assert (k_aba == pytest.approx(k_ab)) == (n % 2 == 0)
    # restarts (keep, rollback): aba rejects with serving already on the baseline, keeps with one more
    assert restarts_for("ab") == (1, 2) and restarts_for("ab", control=True) == (2, 3)
    assert restarts_for("aba") == (4, 3) and restarts_for("aba", control=True) == (4, 4)
    assert restarts_for("ab", candidates=3) == (4, 5)
    assert design_for("aba", candidates=3) == "ab" and design_for("aba", 1) == "aba" and design_for("ab") == "ab"


def test_the_plan_prints_the_order_and_the_restarts_of_each_path():
    keep, rollback = restarts_for("aba")
    lines = restart_plan([40.0, 50.0], bound_s=600, keep=keep, rollback=rollback, design="aba",
                         block_passes=dec.block_passes(3, "aba")).lines()
    assert lines[0].startswith("gate design aba: restart the baseline, measure it x 2, restart into the speculative "
                               "release, measure it x 3, restart back to the baseline, measure it again x 2")
    assert "serving restarts: 4 if kept, 3 if rolled back; expected downtime 180 s if kept, 135 s" in lines[1]
    ab = restart_plan([], bound_s=600, keep=1, rollback=2, design="ab", block_passes=dec.block_passes(3, "ab"))
    assert "not measured" in ab.lines()[0] and "serving.gate_design: aba" in ab.lines()[0]
    assert ab.figures()["design"] == "ab" and ab.figures()["block_passes"] == [3, 3, 0]


@pytest.mark.parametrize("drift,restart", [(0.03, 1.0), (0.0, 0.87), (-0.04, 0.87)],
                         ids=["linear drift", "restart effect", "both"])
def test_the_three_block_contrast_cancels_a_linear_drift_and_the_restart_effect(drift, restart):
    """Passes with a small alternating spread; every block moved by the drift (linear in block time) and the
    restarted blocks by the restart factor. ``aba`` centres on the true ratio; ``ab`` (the live baseline first, not
    restarted) is moved by both."""
    truth, base = 1.20, 50.0
    wiggle = [1.01, 0.99, 1.0]

    def block(k: int, rate: float, n: int, restarted: bool) -> list[LevelResult]:
        f = math.exp(drift * k) * (restart if restarted else 1.0)
        return _passes([rate * f * wiggle[i % 3] for i in range(n)])

    a, b, a2 = block(0, base, 2, True), block(1, base * truth, 3, True), block(2, base, 2, True)
    iv = dec.ratio_interval(a, b, after=a2)
    assert iv.center == pytest.approx(truth, rel=0.01) and iv.low < truth < iv.high
    assert iv.design == "aba" and iv.after_passes == 2 and iv.baseline_passes == 4 and iv.df == 4
    assert iv.method == dec.ABA_METHOD
    ab = dec.ratio_interval(block(0, base, 3, False), block(1, base * truth, 3, True))
    assert abs(ab.center / truth - 1) > 0.025  # the two-block ratio is off by the drift and the restart
    d = dec.decide({1: a}, {1: b}, ACC, production_concurrency=1, margin=0.05, acceptance_floor=1.5, after={1: a2})
    assert d.figures["design"] == dec.ABA_DESIGN and d.figures["passes"] == {"baseline": 4, "speculative": 3,
                                                                            "baseline_after": 2}
    assert d.drift is not None and d.drift.kind == "blocks" and d.drift.made
    assert d.drift.change == pytest.approx(math.expm1(2 * drift), abs=0.01)
    assert d.figures["levels"]["1"]["baseline_after"]["passes"] and d.figures["interval"]["design"] == "aba"
    if drift:  # a shift between the baseline's blocks beyond half the margin (2.5 %): reported, undecided
        assert d.verdict == "undecided" and "from its block before the speculative release to its block after" \
            in d.reason, d.reason
    else:  # the restart effect alone: every block restarted, nothing drifted, the true x1.20 kept
        assert d.verdict == "keep" and "2 + 3 + 2 passes (baseline, speculative, baseline again)" in d.reason


def test_the_block_drift_check_flags_only_a_shift_between_the_baselines_blocks():
    a, b = _passes([50.0, 50.5]), _passes([60.0, 60.6, 59.4])
    same = dec.block_drift(a, _passes([49.8, 50.4]), b, 0.05)
    assert same.made and not same.exceeded and same.low < 0 < same.high
    moved = dec.block_drift(a, _passes([45.0, 45.4]), b, 0.05)
    assert moved.exceeded and moved.change == pytest.approx(-0.1, abs=0.01) and moved.figures()["kind"] == "blocks"
    assert "after the speculative release" in moved.figures()["compares"]
    # the two-block design at three passes: the trend check is not made (one degree of freedom)
    assert not dec.baseline_drift(_passes([50.0, 50.5, 49.5]), 0.05).made


def test_the_power_is_computed_for_the_design():
    ab, aba = dec.power(3, 0.10, 0.05), dec.power(3, 0.10, 0.05, design="aba")
    assert round(ab, 2) == 0.70 and round(aba, 2) == 0.74  # 2 + 3 + 2 passes: a smaller standard error
    assert dec.passes_for_power(0.10, 0.05, design="aba") == 4
    # passes_to_decide follows the design: a straddle of the three-block interval names passes that would decide
    a, b, a2 = _passes([50.0, 54.0]), _passes([51.0, 58.0, 55.0]), _passes([52.0, 48.0])
    iv = dec.ratio_interval(a, b, after=a2)
    assert iv.low < 1.05 < iv.high
    n = dec.passes_to_decide(iv, 1.05)
    assert n is not None and n > 3
    k, df = dec.design_spread(n, "aba")
    sp = iv.se_log / math.sqrt(1 / 3 + 1 / 8 + 1 / 8)
    assert dec.t_quantile(0.95, df) * sp * k < abs(math.log(iv.center / 1.05))


def test_the_job_bounds_count_the_three_block_orders_restarts_and_block():
    from eagle3ops.config.plan import SpeculateJob
    from eagle3ops.window.watch import watch_limit_s

    base = {"results_dir": "/r", "change": {"args": ["--x"]}, "prompts": ["a"], "levels": [1], "max_tokens": 8,
            "passes": 3, "margin": 0.05, "acceptance_floor": 1.3}
    ab, aba = SpeculateJob(**base), SpeculateJob(**base, design="aba")
    assert ab.design == "ab" and (ab.measurements(), ab.extra_restarts()) == (2, 0)  # a plan without it: ab
    assert (aba.measurements(), aba.extra_restarts()) == (3, 2)
    many = SpeculateJob(**base, design="aba", candidates=[{"name": n, "change": {"args": [n]}} for n in ("a", "b")])
    assert many.extra_restarts() == 0 and many.measurements() == 4  # several candidates: measured ab
    plan = {"budget_s": 600, "stop_timeout_s": 30}
    assert watch_limit_s({**plan, "speculate": aba.model_dump()}) > watch_limit_s({**plan, "speculate": ab.model_dump()}
                                                                                  ) + aba.measure_bound_s()
