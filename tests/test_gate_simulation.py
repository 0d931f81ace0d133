"""The speculation gate's own decision on simulated gates (:mod:`eagle3ops_dev.gatesim`, whose cells this test runs;
``benchmarks/gate-simulation/gate_simulation.py`` runs the full grid, 20,000 gates a cell, and writes
``benchmarks/gate-simulation/gate-simulation.json``).

Here a small, fast slice: 3,000 gates per cell at 3 passes per side (the fewest the gate allows, where a small-sample
interval is most likely to undercover), true ratio exactly the keep threshold (1 + margin), under independent
per-pass noise at the committed gates' CVs 3 % and 16 %. The lower bound of a 90 % interval that attains its level
lies above the truth in 5 % of gates; with 3,000 gates the binomial's sd is 0.4 %, so the bound checked (6.5 %) is
3.7 sd above nominal and a method that undercovers as the old percentile bootstrap did (12 % on these gates, its pass
multisets enumerated) fails it. At x1.30 the simulated keep rate matches the plan's analytic power. Under a linear
block shift of sd 3 % with the restart effect the A/A measured, the three-block order (``aba``) attains the level
where the two-block order misses it.
"""

from __future__ import annotations

import pytest

from eagle3ops_dev import gatesim as sim


@pytest.mark.parametrize("scenario", ["independent cv 3%", "independent cv 16%"])
def test_at_the_threshold_the_interval_attains_its_level_and_the_gate_keeps_at_most_its_error(scenario):
    row = sim.run_cell(scenario, 3, 1.0 + sim.MARGIN, 3000, seed=7)
    assert row["lower_bound_above_truth_rate"] <= 0.065, row
    assert row["keep_rate"] <= row["lower_bound_above_truth_rate"] + 1e-9, row  # keeping needs low >= the truth
    assert row["lower_bound_above_truth_rate"] >= 0.035, row  # not a vacuous (too wide) interval either
    # the plain pass bootstrap, enumerated, on the same gates undercovers: the reason for the t interval
    assert row["comparison_enumerated_pass_bootstrap_low_above_truth_rate"] > 0.08, row


def test_simulated_power_at_x130_matches_the_plans_analytic_figure():
    row = sim.run_cell("independent cv 10% (assumed default)", 3, 1.30, 3000, seed=8)
    # the requests' jitter adds a little pass spread beyond the scenario's CV: the simulation is a bit lower
    assert row["analytic_keep_rate"] - 0.05 <= row["keep_rate"] <= row["analytic_keep_rate"] + 0.02, row
    assert row["keep_rate"] < 0.80, row  # 3 passes at 10 % CV: below the power the plan asks for


def test_the_three_block_order_attains_its_level_under_a_block_shift_and_the_restart_effect():
    name = next(n for n in sim.SCENARIOS if n.startswith("block shift sd 3% and restart effect"))
    aba = sim.run_cell(name, 3, 1.0 + sim.MARGIN, 3000, seed=9, design="aba")
    assert aba["covered_by_design"] and aba["block_passes"] == [2, 3, 2]
    assert 0.035 <= aba["lower_bound_above_truth_rate"] <= 0.065, aba
    assert aba["keep_rate"] <= 0.065 and aba["undecided_by_drift_rate"] > 0.05, aba  # the shift is seen, reported
    # the same shift alone, two blocks: the interval misses it (the risk the two-block result states)
    ab = sim.run_cell("block shift sd 3% (cv 3%)", 3, 1.0 + sim.MARGIN, 3000, seed=9, design="ab")
    assert not ab["covered_by_design"] and ab["lower_bound_above_truth_rate"] > 0.08, ab
