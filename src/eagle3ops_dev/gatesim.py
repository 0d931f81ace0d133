"""The speculation gate's own decision (:func:`eagle3ops.gate.decide.decide`) on simulated gates: the noise model,
the scenarios and one cell of the grid (:func:`run_cell`). ``benchmarks/gate-simulation/gate_simulation.py`` runs
the whole grid and writes its JSON; ``tests/test_gate_simulation.py`` runs a small slice. Here, not in the script, so
that the test imports it like any module.

Grid (the benchmark's): each cell ``--gates`` gates, 20,000 by default; both designs of the passes
(:func:`eagle3ops.gate.decide.block_passes`): ``ab`` (baseline x n, restart, speculative x n: the live,
long-running server measured first) and ``aba`` (restart, baseline x a, restart, speculative x n, restart, baseline
x a, ``a = ceil(n/2)``: every block measured after a restart); 3 and 5 passes per side; true ratio 1.05 and 1.30 at
margin 0.05. Scenarios:

- **independent pass noise** at each pass CV the committed gates showed (0.7 %, 3 %, 16 %) and at the 10 % the plan
  assumes where a host has none recorded: every pass has its own log-normal speed factor (a host busier or quieter
  for a whole pass, shared by every prompt of the pass);
- **block shift sd 3 %** (3 % pass CV): the host's speed drifts linearly in time across the blocks, by a log-normal
  step of sd 3 % from one block to the next (one draw a gate); with two blocks it is one factor of sd 3 % on the
  speculative block, as CI logs showed (+5.8 to +7.0 %);
- **restart effect**: a server freshly restarted serves at a fixed factor of the long-running one's speed, the
  median throughput ratio of the sandbox's A/A (``benchmarks/gate-aa/gate-aa-smollm2.json``: a no-op change measured
  slower in 9 of 10 runs); the ``ab`` design measures the live server against a restarted one, ``aba`` restarted
  ones only;
- **block shift and restart effect** together;
- **independent block shifts sd 3 %**: every block its own log-normal factor (sd 3 %), not a trend: no fixed order
  of blocks cancels it, so neither design claims it (its rows show the risk the result states).

``covered_by_design`` says which scenarios each design claims: ``ab`` the independent-noise ones; ``aba`` those and
the linear block shift and the restart effect.

Every gate: ``prompts`` prompts x ``tokens`` output tokens per pass at concurrency 1, prompt ``i`` costing ``L_i``
(log-normal, sigma 0.3; the same in every block and pass) with per-request jitter (log-normal, sigma 0.05); a
request's seconds ``L_i * tokens / (rate * f * B) * e`` (``f`` the pass factor, ``B`` the block's factor),
``rate`` 100 tokens/s on the baseline and ``100 x ratio`` on the speculative release; acceptance (2.2) clears the
floor and the time to first token is the same on both sides, so the interval and the drift check decide.

Comparison column (not the product's method, labelled so): the plain percentile bootstrap over passes (no prompt
draws, no ``sqrt(n/(n-1))`` widening: the textbook form the old gate started from) with its pass multisets
**enumerated** (3 passes: 10 multisets per side, 100 pairs, each weighted by its multinomial probability;
at 3 passes of the ``ab`` design only), on the same gates: how often its 5th percentile lies above the truth.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np

from eagle3ops.gate import decide as dec
from eagle3ops.gate.metrics import SpecDelta
from eagle3ops.gate.replay import LevelResult

__all__ = ["AA_JSON", "ACCEPTANCE", "CELL_NOISE", "DESIGNS", "MARGIN", "PROMPTS", "PROMPT_SPREAD", "RESTART",
           "SCENARIOS", "TOKENS", "bootstrap_low_enumerated", "restart_factor", "run_cell", "simulate"]

#: The noise model's fixed parameters (see the module doc).
PROMPT_SPREAD, CELL_NOISE = 0.3, 0.05
PROMPTS, TOKENS, BASE_RATE = 8, 64, 100.0
MARGIN = 0.05
#: The comparison bootstrap is enumerated up to this many passes (3: 10 multisets a side; 5 would be 126, 15,876
#: pairs a gate: minutes a cell on a small machine, and the gate's question is the 3-pass case).
ENUMERATE_UP_TO = 3
ACCEPTANCE = SpecDelta(100, 300, 120, {0: 70, 1: 35, 2: 15})  # mean acceptance length 2.2
#: The restart effect: a freshly restarted server's speed over the long-running one's, the median throughput ratio
#: of the sandbox's A/A of a no-op change (read from its JSON).
AA_JSON = Path(__file__).resolve().parents[2] / "benchmarks" / "gate-aa" / "gate-aa-smollm2.json"


def restart_factor() -> float:
    """The median ``throughput_ratio`` of the A/A's runs (:data:`AA_JSON`)."""
    runs = json.loads(AA_JSON.read_text())["runs"]
    return float(np.median([r["throughput_ratio"] for r in runs if r.get("throughput_ratio")]))


RESTART = restart_factor()
#: name -> (pass CV, linear block shift sd, restart factor, independent block shift sd, designs claiming it)
SCENARIOS = {"independent cv 0.7%": (0.007, 0.0, 1.0, 0.0, ("ab", "aba")),
             "independent cv 3%": (0.03, 0.0, 1.0, 0.0, ("ab", "aba")),
             "independent cv 10% (assumed default)": (0.10, 0.0, 1.0, 0.0, ("ab", "aba")),
             "independent cv 16%": (0.16, 0.0, 1.0, 0.0, ("ab", "aba")),
             "block shift sd 3% (cv 3%)": (0.03, 0.03, 1.0, 0.0, ("aba",)),
             f"restart effect x{RESTART:.3f} (cv 3%)": (0.03, 0.0, RESTART, 0.0, ("aba",)),
             f"block shift sd 3% and restart effect x{RESTART:.3f} (cv 3%)": (0.03, 0.03, RESTART, 0.0, ("aba",)),
             "independent block shifts sd 3% (cv 3%)": (0.03, 0.0, 1.0, 0.03, ())}
DESIGNS = ("ab", "aba")


def _sigma(cv: float) -> float:
    return math.sqrt(math.log1p(cv * cv))


def simulate(rng: np.random.Generator, gates: int, passes: int, ratio: float, cv: float, shift: float,
             design: str = "ab", restart: float = 1.0, jolt: float = 0.0) -> list[np.ndarray]:
    """Seconds of every request, one array ``(gates, passes_k, prompts)`` per block in time order (``ab``:
    baseline, speculative; ``aba``: baseline, speculative, baseline again; passes per block from
    :func:`eagle3ops.gate.decide.block_passes`). ``shift``: sd of the linear drift's step from one block to the
    next; ``restart``: speed factor of a restarted server (``ab``'s first block is the live server, not restarted);
    ``jolt``: sd of each block's own independent factor."""
    counts = dec.block_passes(passes, design)
    sides = (0, 1) if design == "ab" else (0, 1, 0)
    counts = counts[:2] if design == "ab" else counts
    lengths = rng.lognormal(0.0, PROMPT_SPREAD, (gates, PROMPTS))
    step = rng.normal(0.0, _sigma(shift), gates) if shift else np.zeros(gates)
    out = []
    for k, (side, n) in enumerate(zip(sides, counts)):
        restarted = design == "aba" or k > 0
        block = np.exp(step * k) * (restart if restarted else 1.0)
        if jolt:
            block = block * rng.lognormal(0.0, _sigma(jolt), gates)
        f = rng.lognormal(0.0, _sigma(cv), (gates, n))
        e = rng.lognormal(0.0, CELL_NOISE, (gates, n, PROMPTS))
        rate = BASE_RATE * (ratio if side else 1.0)
        out.append(lengths[:, None, :] * TOKENS / (rate * f[..., None] * block[:, None, None]) * e)
    return out


def _side(secs: np.ndarray) -> list[LevelResult]:
    out = []
    for row in secs:
        wall = float(row.sum())
        n = row.size
        out.append(LevelResult(1, n, 0, n * TOKENS, wall, n * TOKENS / wall, None, None, 50.0, 0.0,
                               (TOKENS,) * n, tuple(row.tolist()), (50.0,) * n))
    return out


def _multisets(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every multiset of ``n`` draws from ``n`` passes as counts ``(m, n)`` and its multinomial probability ``(m,)``."""
    rows, probs = [], []
    for combo in itertools.combinations_with_replacement(range(n), n):
        c = np.bincount(combo, minlength=n)
        rows.append(c)
        probs.append(math.factorial(n) / math.prod(math.factorial(int(k)) for k in c) / n ** n)
    return np.array(rows, dtype=float), np.array(probs)


def bootstrap_low_enumerated(base: np.ndarray, spec: np.ndarray, level: float = dec.LEVEL) -> np.ndarray:
    """Comparison only: each gate's lower percentile of the pass-level bootstrap ratio, its pass multisets
    enumerated (every (baseline, speculative) pair, weighted), ``(gates,)``; ``base``/``spec``: one block each,
    ``(gates, passes, prompts)``."""
    passes = base.shape[1]
    counts, probs = _multisets(passes)
    tok = float(PROMPTS * TOKENS)
    rate_b = (counts.sum(1) * tok)[None, :] / (base.sum(axis=2) @ counts.T)  # (g, m)
    rate_s = (counts.sum(1) * tok)[None, :] / (spec.sum(axis=2) @ counts.T)
    ratios = (rate_s[:, None, :] / rate_b[:, :, None]).reshape(len(base), -1)  # (g, m*m)
    w = (probs[:, None] * probs[None, :]).ravel()
    order = np.argsort(ratios, axis=1)
    cum = np.cumsum(w[order], axis=1)
    idx = (cum < (1 - level) / 2).sum(axis=1)
    return np.take_along_axis(ratios, order, axis=1)[np.arange(len(base)), idx]


def run_cell(name: str, passes: int, ratio: float, gates: int, seed: int, design: str = "ab") -> dict[str, object]:
    """One scenario cell: ``gates`` simulated gates of ``design`` through :func:`decide`; the shares of interest."""
    cv, shift, restart, jolt, claimed = SCENARIOS[name]
    rng = np.random.default_rng(seed)
    blocks = simulate(rng, gates, passes, ratio, cv, shift, design, restart, jolt)
    keep = low_above = undecided = drift_undecided = 0
    for g in range(gates):
        b, s = _side(blocks[0][g]), _side(blocks[1][g])
        a = _side(blocks[2][g]) if design == "aba" else []
        d = dec.decide({1: b}, {1: s}, ACCEPTANCE, production_concurrency=1, margin=MARGIN, acceptance_floor=1.5,
                       ttft_ratio_max=1.5, after={1: a} if a else None)
        keep += d.keep
        undecided += d.verdict == "undecided"
        drift_undecided += bool(d.drift and d.drift.exceeded)
        iv = d.interval or dec.ratio_interval(b, s, after=a)  # unrounded (the figures round to 4 places)
        low_above += iv.low > ratio
    boot = (np.concatenate([bootstrap_low_enumerated(blocks[0][i:i + 500], blocks[1][i:i + 500])
                            for i in range(0, gates, 500)])
            if passes <= ENUMERATE_UP_TO and design == "ab" else None)
    independent = not shift and restart == 1.0 and not jolt
    return {"scenario": name, "design": design, "pass_cv": cv, "block_shift_sd": shift,
            "restart_factor": restart, "independent_block_shift_sd": jolt,
            "covered_by_design": design in claimed, "passes_per_side": passes,
            "block_passes": list(dec.block_passes(passes, design)), "true_ratio": ratio, "gates": gates,
            "seed": seed, "lower_bound_above_truth_rate": low_above / gates, "keep_rate": keep / gates,
            "undecided_rate": undecided / gates, "undecided_by_drift_rate": drift_undecided / gates,
            # the plan's figure at the scenario's pass CV (the requests' jitter adds a little spread beyond it)
            "analytic_keep_rate": (round(dec.power(passes, cv, MARGIN, true_ratio=ratio, design=design), 4)
                                   if independent else None),
            "comparison_enumerated_pass_bootstrap_low_above_truth_rate": (None if boot is None
                                                                           else float((boot > ratio).mean()))}
