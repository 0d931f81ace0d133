"""The speculation gate's decision on simulated gates (issue 24, "Done when" (1)): how often it keeps a release
that is not faster (true ratio 1.00: must keep <= 5 % at margin 0.05) and one that is (true ratio 1.30: must keep
>= 80 %), under 10 % per-pass noise. Runs :func:`eagle3ops.gate.decide.decide` itself, nothing else.

Noise model of one simulated gate (per side ``passes`` passes of ``prompts`` prompts x ``tokens`` output tokens at
concurrency 1; the same prompts, in the same order, on both sides):

- **per-prompt variation**: prompt ``i`` costs ``L_i`` (log-normal, sigma 0.3) times the mean: prompts differ in
  length and difficulty; the same ``L_i`` on both sides and in every pass (it is the prompt's own);
- **per-pass noise** (the "10 %"): every pass of each side has one multiplicative speed factor ``f`` (log-normal,
  sigma 0.10, i.e. about 10 % CV), shared by all prompts of that pass: a host that is busier or quieter for the
  whole pass. A prompt-only bootstrap cannot see it (every prompt of a pass moves together), which is why the
  interval resamples passes too;
- **per-request jitter**: each (pass, prompt) cell has its own factor ``e`` (log-normal, sigma 0.05).

A request's seconds are ``L_i * tokens / (rate * f) * e`` with ``rate`` 100 tokens/s for the baseline and
``100 * ratio`` for the speculative release; a pass's wall time is the sum of its requests' (concurrency 1). The
acceptance length (2.2) clears the floor (1.5) and the time to first token is the same on both sides, so only the
throughput interval and the drift check decide.

The drift check is part of the decision: a drift-free gate left ``undecided`` by it counts as not kept. The JSON
also gives the share of drift-free gates a point-estimate drift rule (first-to-last change beyond half the margin,
no interval) would leave undecided — why the rule compares the drift's interval.

Usage::

    python benchmarks/gate_simulation.py                 # writes benchmarks/gate-simulation.json
    python benchmarks/gate_simulation.py --gates 200 --json /tmp/g.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from eagle3ops.config.inventory import ServingConfig
from eagle3ops.gate import decide as dec
from eagle3ops.gate.metrics import SpecDelta
from eagle3ops.gate.replay import LevelResult

REPO = Path(__file__).resolve().parents[1]
#: The noise model's parameters (see the module doc).
PASS_NOISE, PROMPT_SPREAD, CELL_NOISE = 0.10, 0.3, 0.05
PROMPTS, TOKENS, BASE_RATE = 16, 64, 100.0
ACCEPTANCE = SpecDelta(100, 300, 120, {0: 70, 1: 35, 2: 15})  # mean acceptance length 2.2


def simulate_side(rng: np.random.Generator, rate: float, lengths: np.ndarray, passes: int,
                  pass_noise: float = PASS_NOISE, cell_noise: float = CELL_NOISE) -> list[LevelResult]:
    """``passes`` passes at concurrency 1 of one side (the module doc's model); ``lengths``: the prompts' ``L_i``."""
    out = []
    for _ in range(passes):
        f = rng.lognormal(0.0, pass_noise)
        secs = lengths * TOKENS / (rate * f) * rng.lognormal(0.0, cell_noise, lengths.size)
        wall = float(secs.sum())
        n = lengths.size
        out.append(LevelResult(1, n, 0, n * TOKENS, wall, n * TOKENS / wall, None, None, 50.0, 0.0,
                               (TOKENS,) * n, tuple(float(x) for x in secs), (50.0,) * n))
    return out


def run(ratio: float, *, gates: int = 1000, passes: int = 5, margin: float = 0.05, seed: int = 1,
        resamples: int = dec.RESAMPLES) -> dict[str, object]:
    """``gates`` simulated gates at true ratio ``ratio``; the share of each verdict, and of drift-free gates a
    point-estimate drift rule would call undecided."""
    rng = np.random.default_rng(seed)
    counts = {"keep": 0, "rollback": 0, "undecided": 0}
    drift_undecided = point_rule_undecided = 0
    for _ in range(gates):
        lengths = rng.lognormal(0.0, PROMPT_SPREAD, PROMPTS)
        b = simulate_side(rng, BASE_RATE, lengths, passes)
        s = simulate_side(rng, BASE_RATE * ratio, lengths, passes)
        d = dec.decide({1: b}, {1: s}, ACCEPTANCE, production_concurrency=1, margin=margin, acceptance_floor=1.5,
                       ttft_ratio_max=1.5, resamples=resamples)
        counts[d.verdict] += 1
        drift_undecided += bool(d.drift and d.drift.exceeded)
        point_rule_undecided += bool(d.drift and abs(d.drift.change) > d.drift.limit)
    return {"true_ratio": ratio, "gates": gates, "passes_per_side": passes, "margin": margin, "seed": seed,
            "keep_rate": counts["keep"] / gates, "rollback_rate": counts["rollback"] / gates,
            "undecided_rate": counts["undecided"] / gates, "undecided_by_drift_rate": drift_undecided / gates,
            "point_estimate_drift_rule_undecided_rate": point_rule_undecided / gates}


def main(argv: list[str] | None = None) -> int:
    """Run the simulation at true ratios 1.00 and 1.30 for 3, 4, 5 passes (and the inventory's default); write the
    JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gates", type=int, default=1000)
    ap.add_argument("--json", type=Path, default=REPO / "benchmarks" / "gate-simulation.json")
    args = ap.parse_args(argv)
    default_passes = ServingConfig.model_fields["gate_passes"].default
    rows = []
    t0 = time.monotonic()
    for passes in sorted({3, 4, 5, default_passes}):
        for ratio in (1.00, 1.30):
            row = run(ratio, gates=args.gates, passes=passes)
            rows.append(row)
            print(f"passes {passes} ratio {ratio:.2f}: keep {row['keep_rate']:.3f} rollback {row['rollback_rate']:.3f}"
                  f" undecided {row['undecided_rate']:.3f} (drift {row['undecided_by_drift_rate']:.3f}; a "
                  f"point-estimate drift rule: {row['point_estimate_drift_rule_undecided_rate']:.3f})")
    out = {"what": "keep rate of the speculation gate's decision on simulated gates (issue 24 Done-when (1))",
           "model": {"pass_noise_sigma_log": PASS_NOISE, "prompt_spread_sigma_log": PROMPT_SPREAD,
                     "cell_noise_sigma_log": CELL_NOISE, "prompts": PROMPTS, "tokens": TOKENS,
                     "concurrency": 1},
           "decision": {"level": dec.LEVEL, "resamples": dec.RESAMPLES, "seed": dec.SEED,
                        "default_gate_passes": default_passes},
           "requirement": {"ratio_1.00_keep_at_most": 0.05, "ratio_1.30_keep_at_least": 0.80},
           "results": rows, "wall_s": round(time.monotonic() - t0, 1), "machine": platform.machine(),
           "python": platform.python_version()}
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
