"""Keep or roll back a speculative release, from figures measured on the host with the same prompts on both sides.

Rule ("stated confidence"; pure: figures in, :class:`Decision` out, nothing read or written):

1. Every side brings at least :data:`MIN_PASSES` passes at the production concurrency; a pass sends the same
   prompts in the same (fixed) order and keeps each prompt's output tokens, request seconds and time to first token
   (:class:`~eagle3ops.gate.replay.LevelResult`). Fewer is a caller's error (``ValueError``).
2. Figures taken while other clients' requests shared the server, or with failed requests, are not decided on:
   ``undecided`` (rolled back like a loss).
3. No draft round (speculation not active) or a mean acceptance length below ``acceptance_floor`` → ``rollback``.
4. The speculative release's median time to first token over the baseline's above ``ttft_ratio_max`` →
   ``rollback`` (speculation that delays the first token is not shipped for throughput).
5. **Baseline drift** (``aba``: the change from the baseline's block before the speculative release to its block
   after, :func:`block_drift`, with the same level and limit; made whenever both blocks ran). ``ab``: the
   baseline's output tokens/s across its passes, as a first-to-last relative change from
   a least-squares line through the passes' log tokens/s, with its 95 % t interval (n - 2 degrees of freedom;
   :data:`DRIFT_LEVEL`: two-sided, so a drift-free gate is flagged in at most 5 % of gates, 2.5 % each way). A
   drift whose whole interval lies beyond half the margin (the host got confidently faster or slower while the
   gate measured) is reported and makes the run ``undecided``. The interval, not the point estimate, is compared:
   under the 10 % per-pass noise of ``benchmarks/gate-simulation/gate_simulation.py`` a point-estimate rule leaves most drift-free
   gates undecided (the benchmark's JSON gives the share). The check is made only with at least
   :data:`MIN_DRIFT_PASSES` baseline passes: with three the trend has one degree of freedom, its interval is too wide
   to see real drift and still flags drift-free gates, so at three passes the result says the check was not made.
6. **Throughput ratio with a 90 % interval** (speculative / baseline output tokens/s at the production
   concurrency; :func:`ratio_interval`, over three blocks in the ``aba`` design): lower bound at least ``1 + margin`` → ``keep``; upper bound below it →
   ``rollback``; an interval that straddles it → ``undecided`` (rolled back), the result naming the figure that
   would have decided (the lower bound, against ``1 + margin``), the side the evidence leaned (the point estimate
   above or below ``1 + margin``) and the passes per side that would decide it were the point and the pass spread
   what they measured (:func:`passes_to_decide`).

Other concurrency levels are reported beside it (speed-ups shrink as batch size grows) but do not decide.

``release --gate`` uses the same rule for any serving change with ``rule="not_slower"`` and no
acceptance floor: step 3 is skipped and step 6 compares against ``1 - margin`` (kept unless slower beyond the
margin).

The interval (:func:`ratio_interval`) is Student's two-sample t interval on the passes' log output tokens/s
(each pass's Σ tokens / wall seconds): with ``x`` the baseline's ``n_b`` log pass rates and ``y`` the speculative
release's ``n_s``, the log ratio is ``mean(y) - mean(x)`` with standard error ``s_p * sqrt(1/n_b + 1/n_s)``
(``s_p²`` the pooled within-side variance, ``n_b + n_s - 2`` degrees of freedom), and the ``level`` interval is
``exp(mean(y) - mean(x) ± t((1+level)/2; n_b+n_s-2) * se)``. Sources: Student (1908), "The probable error of a
mean", Biometrika 6(1):1-25, and the pooled-variance two-sample t of the NIST/SEMATECH e-Handbook of Statistical
Methods, §7.3.1 ("Do two processes have the same mean?"), applied on the log scale (log-normal pass speeds: a
ratio of speeds is a difference of logs).
Why this and not a bootstrap: the pass, not the prompt, is the unit of independent noise (a host busier or quieter
for a whole pass moves every prompt of it together; the same prompts in the same order on both sides cancel the
prompts' own variation in the ratio), so the interval rests on a handful of passes per side, where a bootstrap has
only 10 distinct pass multisets per side at 3 passes and a percentile interval undercovers (its lower bound above
the truth 7.7 % of simulated gates at 3 passes against 5 % nominal; T. C. Hesterberg (2015), "What teachers should
know about the bootstrap", The American Statistician 69(4):371-386, on its narrowness with small samples). The t
interval is exact under independent log-normal pass noise of equal spread on both sides: its lower bound exceeds
the true ratio in ``(1 - level) / 2`` of gates at any number of passes (``benchmarks/gate-simulation/gate_simulation.py`` measures it
with this function). What it assumes, said in the result's ``method``: passes independent (no shift between the
baseline's block of passes and the speculative release's block: the two blocks are separated by a restart; a shift
there moves the ratio and no interval over passes sees it) and the same pass-to-pass spread on both sides (the
result reports each side's pass CV; with equal passes per side the pooled standard error equals Welch's). Nothing
is random: the same figures give the same interval.

**The order of the passes** (``design``; :func:`block_passes`, :data:`ABA_DESIGN`, :data:`BLOCK_DESIGN`). The
passes of a side run in a block between serving restarts, and two things move a whole block: the host's speed
changing over the gate's minutes (CI logs showed the baseline's three passes drift +5.8 to +7.0 %), and the restart
itself (the sandbox's A/A, ``benchmarks/gate-aa/gate-aa-smollm2.json``: the restarted release measured slower than the
long-running one in 9 of 10 runs, median x0.87). The two-block order ``ab`` (the live baseline, restart, the
speculative release) confounds both with the speed-up. The default ``aba`` order is: restart the baseline, measure
it (``a`` passes), restart into the speculative release, measure it (``n``), restart back to the baseline, measure
it again (``a``), and decide on the contrast ``mean(B) - (mean(A) + mean(A')) / 2`` of the blocks' log pass rates.
A speed drifting linearly in time moves the three blocks by ``-β, 0, +β`` and cancels from the contrast exactly;
every measured block follows a restart and the same warm-up, so a restarted server's own speed cancels too. This is
the bracketing used where an instrument drifts (a standard measured before and after each sample), and the
systematic arrangement balanced against a linear trend of D. R. Cox (1951), "Some systematic experimental
designs", Biometrika 38(3/4):312-323; that a freshly started process runs at its own level, so that a comparison
must sample process starts on both sides alike, is the execution-level variation of T. Kalibera & R. Jones (2013),
"Rigorous benchmarking in reasonable time", ISMM 2013, and of A. Georges, D. Buytaert & L. Eeckhout (2007),
"Statistically rigorous Java performance evaluation", OOPSLA 2007. Interleaving single passes (A. Abedi & T.
Brecht (2017), "Conducting repeatable experiments in highly variable cloud computing environments", ICPE 2017)
would need a restart per pass; ``aba`` needs two more than ``ab`` (3 to reject, serving then already on the
baseline; 4 to keep). The baseline's ``n`` passes are split between its two blocks, rounded up (``a =
ceil(n/2)``), so the measured time grows by at most one pass and a warm-up, and the contrast's standard error
is at most the two-block one's. What ``aba`` still assumes, said in its ``risk``: the shift is linear in time; one
block alone faster or slower (an independent jolt per block) is neither cancelled nor seen
(``benchmarks/gate-simulation/gate_simulation.py`` shows both). ``ab`` stays for hosts whose restarts are too slow
(``serving.gate_design: ab``) and for several candidates; its result states the shift it did not measure.

Why this module is long: the rule, its interval, the order of the passes the interval is computed over, the drift
check and the power the plan prints are one argument, each step resting on the one before (the same t, the same
blocks, the same figures); split, each module would restate the others' assumptions.

**Power** (:func:`power`): the chance that the interval's lower bound clears ``1 + margin`` when the true ratio is
x1.30, for ``n`` passes per side at a pass CV ``cv`` (the host's recorded one), computed from the same t interval:
``P(d - t * s_p * k >= log(1 + margin))`` with ``d ~ N(log 1.30, σ² k²)``, ``s_p² ~ σ² χ²_ν / ν`` independent
(``σ² = log(1 + cv²)``, ``k = sqrt(2/n)``, ``ν = 2n - 2``), integrated over ``χ²_ν`` numerically (the noncentral t
probability of the one-sided two-sample t test, written as an integral so that only the standard library's
``erf`` and ``lgamma`` are needed). The plan prints it before any restart.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np

from eagle3ops.gate.metrics import SpecDelta
from eagle3ops.gate.replay import LevelResult

__all__ = ["ABA_DESIGN", "BLOCK_DESIGN", "DESIGNS", "DRIFT_LEVEL", "LEVEL", "MIN_DRIFT_PASSES", "MIN_PASSES",
           "POWER_RATIO", "POWER_TARGET", "DEFAULT_PASS_CV", "Decision", "Drift", "RatioInterval", "baseline_drift",
           "block_drift", "block_passes", "candidate_level", "decide", "design_spread", "pass_cv", "passes_for_power",
           "passes_to_decide", "pass_table", "pooled", "power", "ratio_interval", "set_tables", "subset_pass",
           "t_quantile", "traffic_figures"]

#: Least passes per side at the production concurrency.
MIN_PASSES = 3
#: Least baseline passes for the drift check (its trend has ``n - 2`` degrees of freedom).
MIN_DRIFT_PASSES = 4
#: Confidence level of the throughput interval.
LEVEL = 0.90
#: Confidence level of the drift interval: the check flags a gate when the whole interval lies beyond half the
#: margin on either side, so a drift-free gate is flagged at most ``1 - DRIFT_LEVEL`` of the time (at 0.90 it was
#: up to 10 %: 7-8 % of drift-free simulated gates at 5 passes and 10-16 % pass CV, each an undecided good head).
DRIFT_LEVEL = 0.95
#: The speed-up the plan's power is computed at, and the power it asks for.
POWER_RATIO, POWER_TARGET = 1.30, 0.80
#: Pass CV (coefficient of variation of a pass's output tokens/s) assumed where a host has recorded no gate.
DEFAULT_PASS_CV = 0.10
#: Designs of the passes (:func:`block_passes`): ``ab``, the baseline's passes in one block and the speculative
#: release's in another, a serving restart between them; ``aba``, the baseline measured in a block before and a block
#: after the speculative release's (see :func:`ratio_interval`).
DESIGNS = ("aba", "ab")
#: The two-block design, as the result states it: a shift of the host's speed between the blocks, or a restarted
#: server's own speed, is not measured (no interval over passes can see it); the result says so rather than claim it.
BLOCK_DESIGN = {"design": "ab", "order": "baseline x n, restart, speculative x n", "block_shift_measured": False,
                "restart_effect_cancelled": False,
                "risk": "a change of the host's speed between the two blocks, or a restarted server serving at "
                        "another speed than the long-running one, moves the ratio and is not seen by the interval; "
                        "under a 3 % (sd) shift between blocks the lower bound exceeds the true ratio in 10-16 % of "
                        "simulated gates against 5 % nominal (benchmarks/gate-simulation/gate-simulation.json, design 'ab', scenario "
                        "'block shift sd 3% (cv 3%)'); the sandbox's A/A measured the restarted release slower than "
                        "the long-running one in 9 of 10 runs (benchmarks/gate-aa/gate-aa-smollm2.json)"}
#: The three-block design, as the result states it (what it cancels and what it still assumes).
ABA_DESIGN = {"design": "aba",
              "order": "restart, baseline x a, restart, speculative x n, restart, baseline x a",
              "block_shift_measured": True, "restart_effect_cancelled": True,
              "cancels": "a drift of the host's speed linear in time across the three blocks, and a restarted "
                         "server's own speed (every measured block follows a restart and the same warm-up)",
              "risk": "a shift that is not linear in time (one block alone faster or slower) is not cancelled and "
                      "not seen by the interval: under an independent 3 % (sd) shift of each block the lower bound "
                      "exceeds the true ratio in 14-19 % of simulated gates (benchmarks/gate-simulation/gate-simulation.json, design "
                      "'aba', scenario 'independent block shifts sd 3% (cv 3%)'); the drift check compares the "
                      "baseline's two blocks and leaves a gate undecided when they differ beyond half the margin"}
#: The interval's method, as the result names it (with what it assumes).
METHOD = ("Student two-sample t on log pass tokens/s (pooled variance, n_b + n_s - 2 df); assumes independent "
          "passes of equal spread on both sides, no shift between the baseline's and the speculative release's "
          "blocks of passes")
#: The three-block interval's method.
ABA_METHOD = ("Student t on the contrast mean(speculative) - (mean(baseline before) + mean(baseline after)) / 2 of "
              "log pass tokens/s (within-block pooled variance, passes - 3 df); assumes independent passes of equal "
              "spread within blocks and a speed change linear in time across the blocks")


def block_passes(passes: int, design: str) -> tuple[int, int, int]:
    """``(before, speculative, after)``: the passes each block of a gate runs for ``passes`` per side.

    ``ab``: ``(passes, passes, 0)``. ``aba``: the baseline's passes split between the blocks before and after,
    rounded up (``ceil(passes / 2)`` each): the contrast's variance ``σ² (1/n + 1/(4a) + 1/(4a))`` is then at most
    the two-block design's ``2σ²/n`` for the same ``n`` (equal for even ``n``; 3 passes: 2 + 3 + 2).

    Raises:
        ValueError: an unknown design or fewer than one pass.
    """
    if design not in DESIGNS or passes < 1:
        raise ValueError(f"gate design {design!r} with {passes} passes: the design is one of {', '.join(DESIGNS)} "
                         "and passes at least 1")
    if design == "ab":
        return passes, passes, 0
    a = (passes + 1) // 2
    return a, passes, a


def design_spread(passes: int, design: str) -> tuple[float, int]:
    """``(k, df)`` of a gate of ``passes`` per side in ``design``: the log ratio's standard error is ``σ k`` (``σ``
    the pass noise's log sd) and its t has ``df`` degrees of freedom (:func:`ratio_interval`)."""
    before, n, after = block_passes(passes, design)
    if design == "ab":
        return math.sqrt(1 / before + 1 / n), before + n - 2
    return math.sqrt(1 / n + 1 / (4 * before) + 1 / (4 * after)), before + n + after - 3


def _t_cdf(t: float, df: int) -> float:
    """Student t CDF at ``t`` for integer ``df`` >= 1, exact (M. Abramowitz & I. A. Stegun (1964), Handbook of
    Mathematical Functions, 26.7.3 (odd df) and 26.7.4 (even df): finite series in ``θ = atan(t / sqrt(df))``)."""
    th = math.atan(t / math.sqrt(df))
    c, sn = math.cos(th), math.sin(th)
    if df % 2:  # A(t|ν) = 2/π (θ + sinθ (cosθ + 2/3 cos³θ + ... + (2·4···(ν-3))/(1·3···(ν-2)) cos^(ν-2)θ))
        term, acc = c, (c if df > 1 else 0.0)
        for k in range(3, df - 1, 2):
            term *= c * c * (k - 1) / k
            acc += term
        a = 2 / math.pi * (th + sn * acc)
    else:  # A(t|ν) = sinθ (1 + 1/2 cos²θ + ... + (1·3···(ν-3))/(2·4···(ν-2)) cos^(ν-2)θ)
        term, acc = 1.0, 1.0
        for k in range(2, df - 1, 2):
            term *= c * c * (k - 1) / k
            acc += term
        a = sn * acc
    return 0.5 + a / 2  # A(t|ν) = P(|T| <= t) for t >= 0, odd in t


@functools.lru_cache(maxsize=512)
def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with integer ``df`` degrees of freedom (bisection on :func:`_t_cdf`, to
    1e-9; cached: a gate asks for the same few). Raises ``ValueError`` for ``p`` outside (0, 1) or ``df`` below 1."""
    if not 0.0 < p < 1.0 or df < 1:
        raise ValueError(f"t quantile needs 0 < p < 1 and df >= 1 (got p {p}, df {df})")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2.0
    while hi - lo > 1e-9 * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


Verdict = Literal["keep", "rollback", "undecided"]


@dataclass(frozen=True)
class RatioInterval:
    """The throughput ratio (speculative / baseline output tokens/s) at one concurrency and its interval.

    ``point``: pass-pooled tokens/s ratio (Σ tokens / Σ wall over every pass of each side); ``low``/``high``: the
    ``level`` t interval (:func:`ratio_interval`; centred on ``center``, the ratio of the sides' geometric-mean
    pass rates); ``df``: its degrees of freedom; ``se_log``: its standard error on the log scale;
    ``pass_cv_baseline``/``pass_cv_speculative``: each side's pass-to-pass coefficient of variation
    (``sqrt(exp(s²) - 1)`` of its log pass rates); ``baseline_passes``/``speculative_passes``/``prompts``: the
    table's shape; ``method``: :data:`METHOD` (``aba``: :data:`ABA_METHOD`); ``after_passes``/``design``: the
    design's (:func:`block_passes`)."""

    point: float
    low: float
    high: float
    level: float
    center: float
    df: int
    se_log: float
    pass_cv_baseline: float
    pass_cv_speculative: float
    baseline_passes: int
    speculative_passes: int
    prompts: int
    method: str = METHOD
    #: Passes of the baseline's block after the speculative release's (``aba``; 0: ``ab``); ``baseline_passes``
    #: counts both baseline blocks.
    after_passes: int = 0
    design: str = "ab"

    def figures(self) -> dict[str, object]:
        """JSON-ready dict (ratios rounded to 4 places, the standard error and CVs to 5)."""
        d = asdict(self)
        for k in ("point", "low", "high", "center"):
            d[k] = round(d[k], 4)
        for k in ("se_log", "pass_cv_baseline", "pass_cv_speculative"):
            d[k] = round(d[k], 5)
        return d


@dataclass(frozen=True)
class Drift:
    """The baseline's change across its passes (drift above half the margin makes the run undecided).

    ``change``: relative first-to-last change of output tokens/s on a least-squares line through the passes' log
    tokens/s (``exp(slope * (n-1)) - 1``; +0.03 = 3 % faster by the last pass); ``low``/``high``: its 95 % t
    interval (n - 2 degrees of freedom; infinite for fewer than three passes); ``limit``: half the margin;
    ``passes``: every baseline pass's tokens/s, in order; ``made``: False with fewer than
    :data:`MIN_DRIFT_PASSES` passes (the check is not made: its trend would have one degree of freedom, too few to
    see drift; ``exceeded`` is then False and the figures say why)."""

    change: float
    low: float
    high: float
    limit: float
    passes: tuple[float, ...]
    made: bool = True
    #: ``trend`` (a line through one block's passes) or ``blocks`` (the baseline's block after the speculative
    #: release's against its block before: :func:`block_drift`).
    kind: str = "trend"

    @property
    def exceeded(self) -> bool:
        """True when the check was made and the whole interval lies beyond ``±limit`` (the drift is confidently
        above half the margin)."""
        return self.made and (self.low > self.limit or self.high < -self.limit)

    def figures(self) -> dict[str, object]:
        """JSON-ready dict."""
        r = (lambda x: round(x, 4) if math.isfinite(x) else None)
        out: dict[str, object] = {
            "change": r(self.change), "low": r(self.low), "high": r(self.high), "limit": round(self.limit, 4),
            "exceeded": self.exceeded, "made": self.made, "passes_tokens_per_s": [round(x, 3) for x in self.passes],
            "kind": self.kind}
        if self.kind == "blocks":
            out["compares"] = ("the baseline's passes after the speculative release's against its passes before "
                               "(the change between the two baseline blocks, both restarted the same way)")
        if not self.made:
            out["not_made"] = (f"{len(self.passes)} baseline passes: the drift check needs {MIN_DRIFT_PASSES} (a "
                               f"trend through {len(self.passes)} passes has {max(len(self.passes) - 2, 0)} degree(s) "
                               "of freedom, too few to see drift); not made")
        return out


@dataclass(frozen=True)
class Decision:
    """``verdict``: ``keep``, ``rollback`` or ``undecided`` (rolled back); ``reason`` in one line; ``figures`` for
    the audit log and the run's results (JSON-ready: every field below is in it too).

    ``interval``: the throughput ratio and its interval at the production concurrency when the interval decided
    (None when an earlier rule did; ``figures["interval"]`` has it whenever the passes had per-prompt figures); ``drift``: the baseline's drift; ``ttft_ratio``: speculative / baseline median time to first token;
    ``deciding``: for an ``undecided`` straddle, the figure that would have decided (``{"figure", "value",
    "needs"}``)."""

    verdict: Verdict
    reason: str
    figures: dict[str, object] = field(default_factory=dict)
    interval: RatioInterval | None = None
    drift: Drift | None = None
    ttft_ratio: float | None = None
    deciding: dict[str, object] | None = None

    @property
    def keep(self) -> bool:
        """True only for ``keep``."""
        return self.verdict == "keep"


def pass_table(passes: Sequence[LevelResult]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, seconds), each ``(passes, prompts)``: prompt ``i``'s output tokens in pass ``j`` and its share of
    the pass's wall time (its request seconds scaled so that the pass's shares sum to ``wall_s``).

    Raises:
        ValueError: a pass without per-prompt figures, with a failed request (None), or passes of different
            prompt counts (prompts must be sent in one fixed order every pass).
    """
    n = {len(p.prompt_seconds) for p in passes}
    if len(n) != 1 or 0 in n:
        raise ValueError(f"passes at concurrency {passes[0].concurrency} need per-prompt figures for the same "
                         f"prompts in the same order (prompt counts {sorted(n)})")
    tokens = np.array([[float(t) for t in p.prompt_tokens] for p in passes])
    if any(s is None for p in passes for s in p.prompt_seconds):
        raise ValueError("a pass has a failed request (no per-prompt seconds): no interval")
    secs = np.array([[float(s) for s in p.prompt_seconds] for p in passes])
    walls = np.array([p.wall_s for p in passes])
    return tokens, secs * (walls / secs.sum(axis=1))[:, None]


def pooled(passes: Sequence[LevelResult]) -> float:
    """Pass-pooled output tokens/s: Σ output tokens / Σ wall seconds over ``passes``."""
    wall = sum(p.wall_s for p in passes)
    return sum(p.output_tokens for p in passes) / wall if wall > 0 else 0.0


def _log_rates(passes: Sequence[LevelResult]) -> np.ndarray:
    """Each pass's log output tokens/s (Σ tokens / wall seconds), ``(passes,)``."""
    return np.log(np.array([p.output_tokens / p.wall_s if p.wall_s > 0 else 0.0 for p in passes]))


def pass_cv(log_rates: Sequence[float]) -> float:
    """Pass-to-pass coefficient of variation of a side from its passes' log tokens/s (``sqrt(exp(s²) - 1)``, ``s``
    their sample standard deviation; the log-normal's CV); 0.0 for fewer than two passes."""
    x = np.asarray(log_rates, dtype=float)
    return math.sqrt(math.expm1(float(x.var(ddof=1)))) if x.size >= 2 else 0.0


def ratio_interval(baseline: Sequence[LevelResult], speculative: Sequence[LevelResult], *,
                   level: float = LEVEL, after: Sequence[LevelResult] | None = None) -> RatioInterval:
    """The throughput ratio speculative / baseline and its ``level`` t interval (the module doc's interval).

    ``after``: the baseline's passes measured after the speculative release's (the ``aba`` design); then the log
    ratio is the contrast ``mean(y) - (mean(x_before) + mean(x_after)) / 2`` of the three blocks' log pass rates,
    its standard error ``s_p * sqrt(1/n_s + 1/(4 n_before) + 1/(4 n_after))`` with ``s_p²`` the variance pooled
    within the three blocks (``n_before + n_s + n_after - 3`` degrees of freedom): the t interval of a linear
    contrast of group means (NIST/SEMATECH e-Handbook of Statistical Methods, §7.4.7.4, "Contrasts"; equal weights
    on the blocks before and after, so a speed change linear in time, which moves the blocks by ``-β, 0, +β``,
    cancels exactly). ``point`` is the pass-pooled speculative tokens/s over the pass-pooled tokens/s of both
    baseline blocks.

    Shapes: every pass of every block carries the same number of prompts (one fixed order: checked, the ratio is
    only like for like then); ``ab``: per side at least two passes; ``aba``: at least one pass a block and one degree
    of freedom. Cost: O(passes x prompts).

    Raises:
        ValueError: per-prompt figures missing or mismatched (:func:`pass_table`), the sides' prompt counts
            differ, too few passes, or a pass with no tokens or no time.
    """
    after = list(after or [])
    bt, _ = pass_table(baseline)
    st, _ = pass_table(speculative)
    counts = {bt.shape[1], st.shape[1]} | ({pass_table(after)[0].shape[1]} if after else set())
    if len(counts) != 1:
        raise ValueError(f"baseline passes carry {bt.shape[1]} prompts, speculative {st.shape[1]}"
                         + (f", baseline after {pass_table(after)[0].shape[1]}" if after else "")
                         + ": the same prompts must be sent to every block")
    nb, ns, na = len(baseline), len(speculative), len(after)
    if not after and min(nb, ns) < 2:
        raise ValueError(f"the t interval needs at least two passes per side (baseline {nb}, speculative {ns})")
    if after and (min(nb, ns, na) < 1 or nb + ns + na - 3 < 1):
        raise ValueError(f"the three-block t interval needs a pass in each block and one degree of freedom "
                         f"(baseline before {nb}, speculative {ns}, baseline after {na})")
    if any(p.wall_s <= 0 or p.output_tokens <= 0 for p in (*baseline, *speculative, *after)):
        raise ValueError("a pass has no output tokens or no wall time: no rate to compare")
    x, y = _log_rates(baseline), _log_rates(speculative)
    ss = lambda v: float(((v - v.mean()) ** 2).sum())  # noqa: E731
    if after:
        xa = _log_rates(after)
        df = nb + ns + na - 3
        sp2 = (ss(x) + ss(y) + ss(xa)) / df
        se = math.sqrt(sp2 * (1 / ns + 1 / (4 * nb) + 1 / (4 * na)))
        d = float(y.mean() - (x.mean() + xa.mean()) / 2)
        cv_b = math.sqrt(math.expm1((ss(x) + ss(xa)) / (nb + na - 2))) if nb + na > 2 else 0.0
    else:
        df = nb + ns - 2
        sp2 = (ss(x) + ss(y)) / df
        se = math.sqrt(sp2 * (1 / nb + 1 / ns))
        d = float(y.mean() - x.mean())
        cv_b = pass_cv(x)
    half = t_quantile((1 + level) / 2, df) * se
    b = pooled([*baseline, *after])
    point = pooled(speculative) / b if b else 0.0
    return RatioInterval(float(point), math.exp(d - half), math.exp(d + half), level, math.exp(d), df, se,
                         cv_b, pass_cv(y), nb + na, ns, int(bt.shape[1]),
                         ABA_METHOD if after else METHOD, na, "aba" if after else "ab")


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def power(passes: int, cv: float, margin: float, *, true_ratio: float = POWER_RATIO, level: float = LEVEL,
          speculative_passes: int | None = None, design: str = "ab") -> float:
    """Chance that the gate keeps a release whose true speed-up is ``true_ratio``: that the ``level`` interval's
    lower bound (:func:`ratio_interval`) reaches ``1 + margin``, with ``passes`` baseline passes
    (``speculative_passes``, default the same, on the other side) at pass CV ``cv`` (a fraction: 0.10 = 10 %);
    ``design`` ``aba``: ``passes`` per side split as :func:`block_passes` does, the standard error and degrees of
    freedom of :func:`design_spread`.
    The module doc's integral, over ``χ²_ν`` on 4,000 points (accurate to about 1e-4). ``cv`` 0: 1.0 when the
    ratio clears the bar, else 0.0.

    Raises:
        ValueError: fewer than two passes on a side, or a negative ``cv``.
    """
    ns = passes if speculative_passes is None else speculative_passes
    if min(passes, ns) < 2 or cv < 0:
        raise ValueError(f"power needs at least two passes per side and a CV of 0 or more (passes {passes}/{ns}, "
                         f"cv {cv})")
    gap = math.log(true_ratio) - math.log1p(margin)
    if cv == 0:
        return 1.0 if gap > 0 else 0.0
    if design == "ab":
        nu, k = passes + ns - 2, math.sqrt(1 / passes + 1 / ns)
    else:
        k, nu = design_spread(passes, design)
    sd = math.sqrt(math.log1p(cv * cv)) * k  # sd of the log-ratio estimate
    t = t_quantile((1 + level) / 2, nu)
    top = nu + 12.0 * math.sqrt(2.0 * nu) + 40.0  # χ²_ν's mass beyond is below 1e-8
    m = 4000
    h = top / m
    logc = -(nu / 2) * math.log(2.0) - math.lgamma(nu / 2)
    acc = 0.0
    for i in range(1, m + 1):  # the density is 0 at x = 0 for ν >= 2 (and integrable for ν = 1: midpoints)
        xv = (i - 0.5) * h
        dens = math.exp(logc + (nu / 2 - 1) * math.log(xv) - xv / 2)
        acc += dens * _phi((gap - t * sd * math.sqrt(xv / nu)) / sd)
    return min(1.0, max(0.0, acc * h))


def passes_for_power(cv: float, margin: float, *, target: float = POWER_TARGET, true_ratio: float = POWER_RATIO,
                     level: float = LEVEL, most: int = 50, design: str = "ab") -> int | None:
    """The fewest passes per side (at least :data:`MIN_PASSES`) whose :func:`power` reaches ``target``; None when
    even ``most`` do not (a margin at or above the speed-up, or a host too noisy for a gate)."""
    for n in range(MIN_PASSES, most + 1):
        if power(n, cv, margin, true_ratio=true_ratio, level=level, design=design) >= target:
            return n
    return None


def passes_to_decide(iv: RatioInterval, need: float, *, most: int = 50) -> int | None:
    """For a straddling interval: the fewest passes per side with which an interval around the same centre, at the
    same pooled pass spread, would no longer straddle ``need`` (the lower bound above it when the centre is above,
    the upper bound below it when below); None when ``most`` would not do (the centre within a hair of ``need``).
    A planning figure, not a promise: the next gate measures a new centre and spread."""
    gap = abs(math.log(iv.center) - math.log(need))
    if iv.design == "aba":
        before = iv.baseline_passes - iv.after_passes
        sp = iv.se_log / math.sqrt(1 / iv.speculative_passes + 1 / (4 * before) + 1 / (4 * iv.after_passes))
    else:
        sp = iv.se_log / math.sqrt(1 / iv.baseline_passes + 1 / iv.speculative_passes)
    for n in range(max(iv.speculative_passes, MIN_PASSES), most + 1):
        k, df = design_spread(n, iv.design)
        if t_quantile((1 + iv.level) / 2, df) * sp * k < gap:
            return n
    return None


def baseline_drift(passes: Sequence[LevelResult], margin: float) -> Drift:
    """The baseline's first-to-last drift across ``passes`` (in order) and its :data:`DRIFT_LEVEL` t interval; see
    :class:`Drift`.

    A least-squares line through ``log(tokens/s)`` of each pass against its index; ``change = exp(slope*(n-1)) - 1``
    and the interval the same transform of ``slope ± t((1+DRIFT_LEVEL)/2; n-2) * se(slope)``. ``limit = |margin| / 2``.
    Fewer than :data:`MIN_DRIFT_PASSES` passes: the figures with ``made`` False (see :class:`Drift`)."""
    rates = [p.output_tokens_per_s for p in passes]
    n = len(rates)
    limit = abs(margin) / 2
    if n < 2 or min(rates) <= 0:
        return Drift(0.0, -math.inf, math.inf, limit, tuple(rates), False)
    x = np.arange(n, dtype=float)
    y = np.log(np.array(rates))
    sxx = float(((x - x.mean()) ** 2).sum())
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / sxx)
    if n < 3:
        return Drift(math.expm1(slope * (n - 1)), -math.inf, math.inf, limit, tuple(rates), n >= MIN_DRIFT_PASSES)
    resid = y - (y.mean() + slope * (x - x.mean()))
    se = math.sqrt(float((resid ** 2).sum()) / (n - 2) / sxx)
    t = t_quantile((1 + DRIFT_LEVEL) / 2, n - 2)
    span = n - 1
    return Drift(math.expm1(slope * span), math.expm1((slope - t * se) * span), math.expm1((slope + t * se) * span),
                 limit, tuple(rates), n >= MIN_DRIFT_PASSES)


def block_drift(before: Sequence[LevelResult], after: Sequence[LevelResult], speculative: Sequence[LevelResult],
                margin: float) -> Drift:
    """The baseline's change from its block before the speculative release to its block after (the ``aba``
    design), and its :data:`DRIFT_LEVEL` t interval; see :class:`Drift` (``kind`` ``blocks``).

    ``change = exp(mean(log after) - mean(log before)) - 1``; its standard error ``s_p * sqrt(1/n_before +
    1/n_after)`` with ``s_p²`` the variance pooled within the three blocks (``speculative`` gives its passes' spread
    too: ``n_before + n_s + n_after - 3`` degrees of freedom, the interval's own). ``limit = |margin| / 2``. Made
    whenever each baseline block has a pass and there is a degree of freedom: it sees the shift between the
    blocks, which is what moves the ratio (a trend within one block of two or three passes it cannot see)."""
    rates = [p.output_tokens_per_s for p in (*before, *after)]
    limit = abs(margin) / 2
    nb, na, ns = len(before), len(after), len(speculative)
    df = nb + na + ns - 3
    if min(nb, na) < 1 or df < 1 or min(rates) <= 0 or any(p.wall_s <= 0 or p.output_tokens <= 0
                                                            for p in speculative):
        return Drift(0.0, -math.inf, math.inf, limit, tuple(rates), False, "blocks")
    x, xa, y = _log_rates(before), _log_rates(after), _log_rates(speculative)
    ss = sum(float(((v - v.mean()) ** 2).sum()) for v in (x, xa, y))
    se = math.sqrt(ss / df * (1 / nb + 1 / na))
    d = float(xa.mean() - x.mean())
    t = t_quantile((1 + DRIFT_LEVEL) / 2, df)
    return Drift(math.expm1(d), math.expm1(d - t * se), math.expm1(d + t * se), limit, tuple(rates), True, "blocks")


def _ttft(passes: Sequence[LevelResult]) -> float | None:
    vals = [float(v) for p in passes for v in p.prompt_ttft_ms if v is not None]
    if not vals:
        vals = [float(p.ttft_ms_median) for p in passes if p.ttft_ms_median is not None]
    return float(np.median(vals)) if vals else None


def _level_figures(b: Sequence[LevelResult], s: Sequence[LevelResult],
                   a: Sequence[LevelResult] = ()) -> dict[str, object]:
    """A level's figures for the report: each side pooled over its passes (``LevelResult`` keys; tokens/s pooled)
    plus every pass; ``a``: the baseline's block after the speculative release's (``baseline_after``; the ratio
    then pools both baseline blocks)."""
    def side(ps: Sequence[LevelResult]) -> dict[str, object]:
        first = ps[0].figures(answers=False)
        slim = {k: v for k, v in first.items() if not k.startswith("prompt_")}
        return {**slim, "requests": sum(p.requests for p in ps), "errors": sum(p.errors for p in ps),
                "output_tokens": sum(p.output_tokens for p in ps), "wall_s": round(sum(p.wall_s for p in ps), 3),
                "output_tokens_per_s": round(pooled(ps), 3), "ttft_ms_median": _ttft(ps),
                "foreign_requests": max(p.foreign_requests for p in ps),
                "foreign_mean": round(sum(p.foreign_mean for p in ps) / len(ps), 4),
                # the answers' digests stay in the measurement; the result carries their agreement
                "passes": [p.figures(answers=False) for p in ps]}

    bt = pooled([*b, *a])
    return {"baseline": side(b), "speculative": side(s), **({"baseline_after": side(a)} if a else {}),
            "throughput_ratio": round(pooled(s) / bt, 4) if bt else None}


def decide(baseline: Mapping[int, Sequence[LevelResult]], speculative: Mapping[int, Sequence[LevelResult]],
           spec: SpecDelta, *, production_concurrency: int, margin: float, acceptance_floor: float | None,
           ttft_ratio_max: float = math.inf, rule: Literal["faster", "not_slower"] = "faster",
           level: float = LEVEL, after: Mapping[int, Sequence[LevelResult]] | None = None,
           traffic: Literal["idle", "live"] = "idle") -> Decision:
    """Decide from both releases' passes per concurrency and the speculative side's counter deltas (the module
    doc's rule, in its order).

    Args:
        baseline, speculative: concurrency -> that level's passes, in the order they ran.
        spec: the speculative side's spec-decode counter deltas over its measurement.
        production_concurrency: the deciding level.
        margin: keep needs the interval's lower bound at ``1 + margin`` or more (negative only in tests: the
            figures name it).
        acceptance_floor: least mean acceptance length; None for a change that need not speculate (``release
            --gate``: step 3 is skipped).
        ttft_ratio_max: most speculative / baseline median time to first token.
        rule: ``faster`` (speculate: keep needs the lower bound at ``1 + margin``) or ``not_slower`` (``release
            --gate``: any serving change is kept unless slower beyond the margin: the lower bound at
            ``1 - margin``); the interval, drift and TTFT steps are the same.
        level: the throughput interval's confidence level (:data:`LEVEL`; a job choosing among ``m`` candidates
            decides each at ``1 - (1 - LEVEL) / m``: :func:`candidate_level`).
        after: the ``aba`` design's baseline passes measured after the speculative release's, per concurrency
            (None: ``ab``). Then the interval is the three-block contrast (:func:`ratio_interval`), the drift check
            compares the baseline's two blocks (:func:`block_drift`), the TTFT ratio's baseline pools both blocks,
            and ``figures["design"]`` is :data:`ABA_DESIGN` (else :data:`BLOCK_DESIGN`, its risk stated).
        traffic: ``idle`` (the default): a pass that saw another client's request (``foreign_requests``) is skewed
            and the verdict ``undecided``. ``live`` (``serving.gate_traffic``), with ``after`` only: the passes were
            measured beside the clients' traffic, so other requests are the condition measured, not a skew; the
            clients' load is assumed about the same through the three blocks, which the block drift check tests (a
            load that changed between the baseline's two blocks moves its tokens/s: ``undecided``), and its noise
            widens the interval. ``figures["clients"]`` records each block's mean and most foreign requests.
            Without ``after`` (``ab``: no second baseline block) ``live`` decides as ``idle`` does. Failed requests
            skew either way.

    Raises:
        ValueError: the production concurrency was not measured on both sides, fewer than :data:`MIN_PASSES`
            passes on a side there, or per-prompt figures missing there.
    """
    pc = production_concurrency
    b, s, a = _deciding_passes(baseline, speculative, after, pc)
    after = dict(after or {})
    levels = {str(c): _level_figures(baseline[c], speculative[c], after.get(c) or ())
              for c in sorted(set(baseline) & set(speculative))}
    acc = spec.mean_acceptance_length
    need = 1.0 + margin if rule == "faster" else 1.0 - margin
    tb, ts = _ttft([*b, *a]), _ttft(s)
    ttft_ratio = ts / tb if tb and ts is not None else None
    drift = block_drift(b, a, s, margin) if a else baseline_drift(b, margin)
    figures: dict[str, object] = {
        "production_concurrency": pc, "margin": margin,
        "margin_is_negative_test_setting": margin < 0, "acceptance_floor": acceptance_floor, "rule": rule,
        "ttft_ratio_max": ttft_ratio_max if math.isfinite(ttft_ratio_max) else None,
        "ttft_ratio": round(ttft_ratio, 4) if ttft_ratio is not None else None,
        "throughput_ratio": levels[str(pc)]["throughput_ratio"],
        "passes": {"baseline": len(b) + len(a), "speculative": len(s), **({"baseline_after": len(a)} if a else {})},
        "drift": drift.figures(), "design": ABA_DESIGN if a else BLOCK_DESIGN,
        "spec_decode": spec.figures(), "levels": levels}
    # The interval is computed (and reported) whatever rule decides, so that a rollback for acceptance, TTFT or
    # drift still shows how fast the speculative release was; only step 6 decides on it.
    try:
        iv = ratio_interval(b, s, level=level, after=a)
        figures["interval"] = iv.figures()
    except ValueError as e:  # failed requests (no per-prompt seconds): step 2 decides, no interval
        iv = None
        figures["interval_unavailable"] = str(e)
    common = {"figures": figures, "drift": drift, "ttft_ratio": ttft_ratio}
    live = traffic == "live" and bool(a)
    figures["clients"] = traffic_figures(b, s, a, traffic, live)
    early = _rule_before_interval(baseline, speculative, pc, acc, acceptance_floor, ttft_ratio, ttft_ratio_max,
                                  drift, live=live)
    if early is not None:
        return Decision(*early, **common)
    if iv is None:
        iv = ratio_interval(b, s, level=level, after=a)  # raises the ValueError of above
    return _interval_decision(iv, b, s, a, pc, need, acc, figures, common)


def _deciding_passes(baseline: Mapping[int, Sequence[LevelResult]], speculative: Mapping[int, Sequence[LevelResult]],
                     after: Mapping[int, Sequence[LevelResult]] | None, production_concurrency: int
                     ) -> tuple[list[LevelResult], list[LevelResult], list[LevelResult]]:
    """The passes at the production concurrency that :func:`decide` decides on: (baseline, speculative, baseline
    after; empty for the ``ab`` design).

    Raises:
        ValueError: the production concurrency not measured on both sides (or, with ``after``, on the baseline
            after), or fewer than :data:`MIN_PASSES` passes on a side there.
    """
    if production_concurrency not in baseline or production_concurrency not in speculative:
        raise ValueError(f"production concurrency {production_concurrency} was not measured on both releases "
                         f"(baseline {sorted(baseline)}, speculative {sorted(speculative)})")
    b, s = list(baseline[production_concurrency]), list(speculative[production_concurrency])
    after = dict(after or {})
    if after and production_concurrency not in after:
        raise ValueError(f"production concurrency {production_concurrency} was not measured on the baseline after "
                         f"the speculative release (measured: {sorted(after)})")
    a = list(after.get(production_concurrency) or [])
    if min(len(b) + len(a), len(s)) < MIN_PASSES:
        raise ValueError(f"the decision needs at least {MIN_PASSES} passes per side at concurrency "
                         f"{production_concurrency} (baseline {len(b) + len(a)}, speculative {len(s)})")
    return b, s, a


def _rule_before_interval(baseline: Mapping[int, Sequence[LevelResult]],
                          speculative: Mapping[int, Sequence[LevelResult]], production_concurrency: int,
                          acc: float | None, acceptance_floor: float | None, ttft_ratio: float | None,
                          ttft_ratio_max: float, drift: Drift, live: bool = False) -> tuple[Verdict, str] | None:
    """Steps 1 to 5 of the module doc's rule, in order: (verdict, reason) when one decides (skewed passes,
    no draft round or acceptance below the floor, TTFT ratio above its most, the baseline drifted), else None
    (the interval decides). ``live``: measured beside the clients' traffic (:func:`decide`'s ``traffic``), so
    foreign requests do not skew; failed requests still do."""
    skewed = [f"{side} at {c}" for side, res in (("baseline", baseline), ("speculative", speculative))
              for c, rs in res.items() for r in rs if (r.foreign_requests > 0 and not live) or r.errors]
    if skewed:
        what = "failed requests" if live else "foreign requests or failed requests"
        return "undecided", (f"{what} during {', '.join(sorted(set(skewed)))}: "
                             "not deciding on skewed figures; rolled back")
    if acc is None and acceptance_floor is not None:
        return "rollback", "no draft round ran on the speculative release (speculation not active)"
    if acc is not None and acceptance_floor is not None and acc < acceptance_floor:
        return "rollback", f"mean acceptance length {acc:.3f} below the floor {acceptance_floor}"
    if ttft_ratio is not None and ttft_ratio > ttft_ratio_max:
        return "rollback", (f"median time to first token x{ttft_ratio:.3f} of the baseline's at "
                            f"concurrency {production_concurrency}, at most x{ttft_ratio_max:g} "
                            "(serving.gate_ttft_ratio_max)")
    if drift.exceeded:
        span = ("from its block before the speculative release to its block after" if drift.kind == "blocks"
                else "from its first to its last pass")
        return "undecided", (f"the baseline drifted {drift.change:+.1%} {span} "
                             f"({DRIFT_LEVEL:.0%} interval {drift.low:+.1%} to {drift.high:+.1%}), beyond "
                             f"half the margin ({drift.limit:.1%}): the host's speed changed while the gate "
                             "measured; rolled back")
    return None


def traffic_figures(b: Sequence[LevelResult], s: Sequence[LevelResult], a: Sequence[LevelResult], traffic: str,
                    live: bool) -> dict[str, object]:
    """The other clients' requests the deciding passes ran beside (pure): per block (``baseline``, ``speculative``,
    ``baseline_after`` with ``aba``) the mean of the passes' ``foreign_mean`` and the most ``foreign_requests`` seen
    at once; ``mode`` (``serving.gate_traffic``), ``measured_beside_clients`` (``live`` with the ``aba`` order:
    foreign requests were not refused) and the assumption that makes such a verdict fair."""
    def block(ps: Sequence[LevelResult]) -> dict[str, float]:
        return {"foreign_mean": round(sum(p.foreign_mean for p in ps) / len(ps), 4) if ps else 0.0,
                "foreign_most": max((p.foreign_requests for p in ps), default=0.0)}

    out: dict[str, object] = {"mode": traffic, "measured_beside_clients": live, "baseline": block(b),
                              "speculative": block(s), **({"baseline_after": block(a)} if a else {})}
    if live:
        out["assumption"] = ("the clients' load about the same through the three blocks (checked by the baseline "
                             "blocks' drift); their requests' noise is in the interval")
    elif traffic == "live":
        out["assumption"] = "no second baseline block (ab order): foreign requests refused as with idle"
    return out


def _interval_decision(iv: RatioInterval, b: Sequence[LevelResult], s: Sequence[LevelResult],
                       a: Sequence[LevelResult], production_concurrency: int, need: float, acc: float | None,
                       figures: dict[str, object], common: dict[str, object]) -> Decision:
    """Step 6 of the module doc's rule: keep when the throughput interval's lower bound clears ``need``, roll back
    when its upper bound is below it, else ``undecided`` with the figure that would decide (``figures["deciding"]``,
    the passes per side that would: :func:`passes_to_decide`)."""
    where = (f"output tokens/s x{iv.point:.3f} of the baseline at concurrency {production_concurrency}, "
             f"{iv.level:.0%} interval x{iv.low:.3f} to x{iv.high:.3f} ("
             + (f"{len(b)} + {len(s)} + {len(a)} passes (baseline, speculative, baseline again)" if a
                else f"{len(b)} + {len(s)} passes") + f" x {iv.prompts} prompts)")
    if iv.low >= need:
        tail = f"; mean acceptance length {acc:.3f}" if acc is not None else ""
        return Decision("keep", f"{where}: lower bound clears x{need:.3f}{tail}", interval=iv, **common)
    if iv.high < need:
        return Decision("rollback", f"{where}: upper bound below x{need:.3f}", interval=iv, **common)
    leans = "keep" if iv.center >= need else "rollback"
    more = passes_to_decide(iv, need)
    deciding = {"figure": f"lower bound of the {iv.level:.0%} throughput-ratio interval", "value": round(iv.low, 4),
                "needs": round(need, 4), "leans": leans, "center": round(iv.center, 4),
                "passes_to_decide": more}
    figures["deciding"] = deciding
    lean = (f"the evidence leans {leans} (centre x{iv.center:.3f} {'above' if leans == 'keep' else 'below'} "
            f"x{need:.3f})")
    would = (f"about {more} passes per side at this spread would decide it (--passes {more})" if more is not None
             else "the centre is too close to the bar for any practical number of passes to decide it")
    return Decision("undecided", f"{where} straddles x{need:.3f}: the lower bound x{iv.low:.3f} would have to reach "
                                 f"x{need:.3f} to keep; {lean}; {would}; rolled back to the release live before",
                    interval=iv, deciding=deciding, **common)


def candidate_level(candidates: int, level: float = LEVEL) -> float:
    """The interval level each of ``candidates`` releases measured against one baseline is decided at, so that the
    chance that *any* of them clears the bar by luck stays at most ``1 - level`` (Bonferroni's correction: the error
    ``1 - level`` shared equally, ``1 - (1 - level) / m``; C. E. Bonferroni (1936), "Teoria statistica delle classi e
    calcolo delle probabilità"; conservative, valid whatever the candidates' dependence). One candidate: ``level``.

    Raises:
        ValueError: ``candidates`` below 1.
    """
    if candidates < 1:
        raise ValueError(f"{candidates} candidates: at least one")
    return 1.0 - (1.0 - level) / candidates


def subset_pass(p: LevelResult, idx: Sequence[int]) -> LevelResult:
    """Pass ``p`` restricted to prompts ``idx`` (indices into its prompt order): their tokens, their shares of the
    pass's wall time (:func:`pass_table`'s scaling) as seconds, and a wall time that is the sum of those shares.
    At concurrency 1 a share is the prompt's own time; above it, the pass's wall time split by request seconds.

    Raises:
        ValueError: the pass has no per-prompt figures, a failed request, or an index out of range.
    """
    tok, sec = pass_table([p])
    if not idx or max(idx) >= tok.shape[1] or min(idx) < 0:
        raise ValueError(f"prompt indices {list(idx)[:5]}... outside the pass's {tok.shape[1]} prompts")
    toks = [int(tok[0, i]) for i in idx]
    shares = [float(sec[0, i]) for i in idx]
    wall = sum(shares)
    ttft = [p.prompt_ttft_ms[i] for i in idx] if p.prompt_ttft_ms else []
    known = [float(v) for v in ttft if v is not None]
    return LevelResult(concurrency=p.concurrency, requests=len(idx), errors=0, output_tokens=sum(toks), wall_s=wall,
                       output_tokens_per_s=sum(toks) / wall if wall > 0 else 0.0, itl_ms_median=None,
                       itl_ms_p90=None, ttft_ms_median=float(np.median(known)) if known else None,
                       foreign_requests=p.foreign_requests, prompt_tokens=tuple(toks), prompt_seconds=tuple(shares),
                       prompt_ttft_ms=tuple(ttft))


def set_tables(baseline: Mapping[int, Sequence[LevelResult]], speculative: Mapping[int, Sequence[LevelResult]],
               sets: Mapping[str, Sequence[int]], *, production_concurrency: int,
               after: Mapping[int, Sequence[LevelResult]] | None = None) -> dict[str, object]:
    """One table per prompt set (e.g. ``chat`` = held-out chat turns, ``code`` = HumanEval's gate split),
    from the same passes the decision used: each set's prompts (``sets``: name -> indices into the prompts' fixed
    order) cut out of every pass with :func:`subset_pass`. Per level: each side's pass-pooled output tokens/s, the
    ratio, the median TTFT ratio; at the production concurrency also the 90 % interval of the ratio
    (:func:`ratio_interval` on the set's cells). Reported, never decided on: the decision is the whole set's.
    Acceptance is not split by set (vLLM 0.16's spec-decode counters are server-wide). ``after``: the ``aba``
    design's baseline block after the speculative release's (its cells pooled into the baseline's tokens/s and the
    interval's contrast).

    Returns:
        ``{name: {"prompts": n, "levels": {"c": {...}}}}``; a set whose figures cannot be cut (a failed request)
        carries ``"error"`` instead of ``"levels"``.
    """
    out: dict[str, object] = {}
    for name, idx in sets.items():
        idx = list(idx)
        try:
            levels: dict[str, object] = {}
            for c in sorted(set(baseline) & set(speculative)):
                b = [subset_pass(p, idx) for p in baseline[c]]
                s = [subset_pass(p, idx) for p in speculative[c]]
                a = [subset_pass(p, idx) for p in (after or {}).get(c) or ()]
                bt, st = pooled([*b, *a]), pooled(s)
                tb, ts = _ttft([*b, *a]), _ttft(s)
                row: dict[str, object] = {
                    "baseline_tokens_per_s": round(bt, 3), "speculative_tokens_per_s": round(st, 3),
                    "throughput_ratio": round(st / bt, 4) if bt else None,
                    "ttft_ratio": round(ts / tb, 4) if tb and ts is not None else None}
                if c == production_concurrency and min(len(b), len(s)) >= 2:
                    row["interval"] = ratio_interval(b, s, after=a).figures()
                levels[str(c)] = row
            out[name] = {"prompts": len(idx), "levels": levels}
        except ValueError as e:
            out[name] = {"prompts": len(idx), "error": str(e)}
    return out
