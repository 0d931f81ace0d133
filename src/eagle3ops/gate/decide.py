"""Keep or roll back a speculative release, from figures measured on the host with the same prompts on both sides.

Rule (issue 24, "stated confidence"; pure: figures in, :class:`Decision` out, nothing read or written):

1. Every side brings at least :data:`MIN_PASSES` passes at the production concurrency; a pass sends the same
   prompts in the same (fixed) order and keeps each prompt's output tokens, request seconds and time to first token
   (:class:`~eagle3ops.gate.replay.LevelResult`). Fewer is a caller's error (``ValueError``).
2. Figures taken while other clients' requests shared the server, or with failed requests, are not decided on:
   ``undecided`` (rolled back like a loss).
3. No draft round (speculation not active) or a mean acceptance length below ``acceptance_floor`` → ``rollback``.
4. The speculative release's median time to first token over the baseline's above ``ttft_ratio_max`` →
   ``rollback`` (speculation that delays the first token is not shipped for throughput).
5. **Baseline drift**: the baseline's output tokens/s across its passes, as a first-to-last relative change from
   a least-squares line through the passes' log tokens/s, with its 90 % t interval (n - 2 degrees of freedom). A
   drift whose whole interval lies beyond half the margin (the host got confidently faster or slower while the
   gate measured) is reported and makes the run ``undecided``. The interval, not the point estimate, is compared:
   under the 10 % per-pass noise of ``benchmarks/gate_simulation.py`` a point-estimate rule leaves most drift-free
   gates undecided (the benchmark's JSON gives the share), and with three passes the trend has one degree of
   freedom.
6. **Throughput ratio with a 90 % interval** (speculative / baseline output tokens/s at the production
   concurrency; :func:`ratio_interval`): lower bound at least ``1 + margin`` → ``keep``; upper bound below it →
   ``rollback``; an interval that straddles it → ``undecided`` (rolled back), the result naming the figure that
   would have decided (the lower bound, against ``1 + margin``).

Other concurrency levels are reported beside it (speed-ups shrink as batch size grows) but do not decide.

``release --gate`` (issue 31) uses the same rule for any serving change with ``rule="not_slower"`` and no
acceptance floor: step 3 is skipped and step 6 compares against ``1 - margin`` (kept unless slower beyond the
margin).

The interval (:func:`ratio_interval`) is a seeded two-way ("pigeonhole") bootstrap over the passes x prompts
table of each side: every replicate draws prompt indices with replacement (one draw shared by both sides: the same
prompts in the same order were sent to both, so the pairing is kept) and, for each side independently, pass indices
with replacement; a side's replicate tokens/s is Σ tokens / Σ seconds over the drawn (pass, prompt) cells, a
prompt's seconds being its share of its pass's wall time (request seconds scaled so that a pass's shares sum to its
wall time: with every cell drawn once, a replicate's figure is the measured pass-pooled tokens/s). The 90 % interval
is the 5th and 95th percentiles of the replicates' ratios (the percentile interval). Sources: A. B. Owen (2007),
"The pigeonhole bootstrap", Annals of Applied Statistics 1(2):386-411 (resampling rows and columns of a crossed
table independently; mildly conservative) and P. McCullagh (2000), "Resampling and exchangeable arrays",
Bernoulli 6(2):285-301 (no bootstrap of a crossed table is exactly right; resampling only one index is too narrow,
which is why passes are resampled and not just prompts: per-pass noise shared by every prompt of a pass is
invisible to a prompt-only bootstrap). With a handful of passes the plain bootstrap of the pass means is narrow by
``(n-1)/n`` in variance (T. C. Hesterberg (2015), "What teachers should know about the bootstrap", The American
Statistician 69(4):371-386, "narrowness bias"); each side's per-pass log tokens/s deviations from their mean are
therefore widened by ``sqrt(n/(n-1))`` before resampling (the pass-level analogue of Davison & Hinkley (1997),
Bootstrap Methods and their Application, §2.3's variance-corrected residuals). The seed is fixed
(:data:`SEED`) and recorded: the interval is reproducible from the result's per-prompt figures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np

from eagle3ops.gate.metrics import SpecDelta
from eagle3ops.gate.replay import LevelResult

__all__ = ["LEVEL", "MIN_PASSES", "RESAMPLES", "SEED", "Decision", "Drift", "RatioInterval", "baseline_drift",
           "candidate_level", "decide", "pass_table", "pooled", "ratio_interval", "set_tables", "subset_pass"]

#: Least passes per side at the production concurrency.
MIN_PASSES = 3
#: Confidence level of the throughput interval and of the drift interval.
LEVEL = 0.90
#: Bootstrap replicates of the throughput interval.
RESAMPLES = 2000
#: The bootstrap's seed (fixed: the same figures give the same interval).
SEED = 24
#: Student t quantiles t(0.95; df) for df = 1..30 (two-sided 90 %), from the standard table; df > 30 takes df 30's
#: (slightly wider than the normal's 1.645: conservative).
_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
        1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697)

Verdict = Literal["keep", "rollback", "undecided"]


@dataclass(frozen=True)
class RatioInterval:
    """The throughput ratio (speculative / baseline output tokens/s) at one concurrency and its interval.

    ``point``: pass-pooled tokens/s ratio (Σ tokens / Σ wall over every pass of each side); ``low``/``high``: the
    ``level`` bootstrap percentile interval (:func:`ratio_interval`); ``resamples``/``seed``: the bootstrap's;
    ``baseline_passes``/``speculative_passes``/``prompts``: the table's shape."""

    point: float
    low: float
    high: float
    level: float
    resamples: int
    seed: int
    baseline_passes: int
    speculative_passes: int
    prompts: int
    method: str = "two-way (passes x prompts) percentile bootstrap, pass deviations widened by sqrt(n/(n-1))"

    def figures(self) -> dict[str, object]:
        """JSON-ready dict (ratios rounded to 4 places)."""
        d = asdict(self)
        for k in ("point", "low", "high"):
            d[k] = round(d[k], 4)
        return d


@dataclass(frozen=True)
class Drift:
    """The baseline's change across its passes (issue 24: drift above half the margin makes the run undecided).

    ``change``: relative first-to-last change of output tokens/s on a least-squares line through the passes' log
    tokens/s (``exp(slope * (n-1)) - 1``; +0.03 = 3 % faster by the last pass); ``low``/``high``: its 90 % t
    interval (n - 2 degrees of freedom; infinite for fewer than three passes); ``limit``: half the margin;
    ``passes``: every baseline pass's tokens/s, in order."""

    change: float
    low: float
    high: float
    limit: float
    passes: tuple[float, ...]

    @property
    def exceeded(self) -> bool:
        """True when the whole interval lies beyond ``±limit`` (the drift is confidently above half the margin)."""
        return self.low > self.limit or self.high < -self.limit

    def figures(self) -> dict[str, object]:
        """JSON-ready dict."""
        r = (lambda x: round(x, 4) if math.isfinite(x) else None)
        return {"change": r(self.change), "low": r(self.low), "high": r(self.high), "limit": round(self.limit, 4),
                "exceeded": self.exceeded, "passes_tokens_per_s": [round(x, 3) for x in self.passes]}


@dataclass(frozen=True)
class Decision:
    """``verdict``: ``keep``, ``rollback`` or ``undecided`` (rolled back); ``reason`` in one line; ``figures`` for
    the audit log and the run's results (JSON-ready: every field below is in it too).

    ``interval``: the throughput ratio and its interval at the production concurrency when the interval decided
    (None when an earlier rule did; ``figures["interval"]`` has it whenever the passes could be resampled); ``drift``: the baseline's drift; ``ttft_ratio``: speculative / baseline median time to first token;
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
        raise ValueError("a pass has a failed request (no per-prompt seconds): not resampled")
    secs = np.array([[float(s) for s in p.prompt_seconds] for p in passes])  # type: ignore[arg-type]
    walls = np.array([p.wall_s for p in passes])
    return tokens, secs * (walls / secs.sum(axis=1))[:, None]


def pooled(passes: Sequence[LevelResult]) -> float:
    """Pass-pooled output tokens/s: Σ output tokens / Σ wall seconds over ``passes``."""
    wall = sum(p.wall_s for p in passes)
    return sum(p.output_tokens for p in passes) / wall if wall > 0 else 0.0


def _widen(tokens: np.ndarray, secs: np.ndarray) -> np.ndarray:
    """Seconds with each pass's log tokens/s deviation from the side's mean widened by sqrt(n/(n-1))."""
    n = tokens.shape[0]
    if n < 2:
        return secs
    logs = np.log(tokens.sum(axis=1) / secs.sum(axis=1))
    wide = logs.mean() + (logs - logs.mean()) * math.sqrt(n / (n - 1))
    return secs * np.exp(logs - wide)[:, None]


def ratio_interval(baseline: Sequence[LevelResult], speculative: Sequence[LevelResult], *, level: float = LEVEL,
                   resamples: int = RESAMPLES, seed: int = SEED) -> RatioInterval:
    """The throughput ratio speculative / baseline and its ``level`` interval (the module doc's bootstrap).

    Shapes: every pass of both sides carries the same number of prompts (one fixed order); per side any number of
    passes. Cost: O(resamples x passes x prompts).

    Raises:
        ValueError: per-prompt figures missing or mismatched (:func:`pass_table`), or the two sides' prompt counts
            differ.
    """
    bt, bs = pass_table(baseline)
    st, ss = pass_table(speculative)
    if bt.shape[1] != st.shape[1]:
        raise ValueError(f"baseline passes carry {bt.shape[1]} prompts, speculative {st.shape[1]}: the same "
                         "prompts must be sent to both sides")
    bs_w, ss_w = _widen(bt, bs), _widen(st, ss)
    rng = np.random.default_rng(seed)
    n_prompts = bt.shape[1]
    # multiplicities: how often each prompt / pass is drawn in a replicate (indices drawn with replacement, counted);
    # Σ over drawn cells = u @ X @ w for pass counts u and prompt counts w
    def counts(n: int) -> np.ndarray:
        idx = rng.integers(0, n, (resamples, n)) + n * np.arange(resamples)[:, None]
        return np.bincount(idx.ravel(), minlength=resamples * n).reshape(resamples, n).astype(float)

    w = counts(n_prompts)
    ub, us = counts(bt.shape[0]), counts(st.shape[0])

    def rate(u: np.ndarray, tok: np.ndarray, sec: np.ndarray) -> np.ndarray:
        return ((u @ tok) * w).sum(axis=1) / ((u @ sec) * w).sum(axis=1)

    ratios = rate(us, st, ss_w) / rate(ub, bt, bs_w)
    low, high = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    b = pooled(baseline)
    point = pooled(speculative) / b if b else 0.0
    return RatioInterval(float(point), float(low), float(high), level, resamples, seed, bt.shape[0], st.shape[0],
                         n_prompts)


def baseline_drift(passes: Sequence[LevelResult], margin: float) -> Drift:
    """The baseline's first-to-last drift across ``passes`` (in order) and its 90 % t interval; see :class:`Drift`.

    A least-squares line through ``log(tokens/s)`` of each pass against its index; ``change = exp(slope*(n-1)) - 1``
    and the interval the same transform of ``slope ± t(0.95; n-2) * se(slope)``. ``limit = |margin| / 2``."""
    rates = [p.output_tokens_per_s for p in passes]
    n = len(rates)
    limit = abs(margin) / 2
    if n < 2 or min(rates) <= 0:
        return Drift(0.0, -math.inf, math.inf, limit, tuple(rates))
    x = np.arange(n, dtype=float)
    y = np.log(np.array(rates))
    sxx = float(((x - x.mean()) ** 2).sum())
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / sxx)
    if n < 3:
        return Drift(math.expm1(slope * (n - 1)), -math.inf, math.inf, limit, tuple(rates))
    resid = y - (y.mean() + slope * (x - x.mean()))
    se = math.sqrt(float((resid ** 2).sum()) / (n - 2) / sxx)
    t = _T95[min(n - 2, len(_T95)) - 1]
    span = n - 1
    return Drift(math.expm1(slope * span), math.expm1((slope - t * se) * span), math.expm1((slope + t * se) * span),
                 limit, tuple(rates))


def _ttft(passes: Sequence[LevelResult]) -> float | None:
    vals = [float(v) for p in passes for v in p.prompt_ttft_ms if v is not None]
    if not vals:
        vals = [float(p.ttft_ms_median) for p in passes if p.ttft_ms_median is not None]
    return float(np.median(vals)) if vals else None


def _level_figures(b: Sequence[LevelResult], s: Sequence[LevelResult]) -> dict[str, object]:
    """A level's figures for the report: each side pooled over its passes (``LevelResult`` keys; tokens/s pooled)
    plus every pass."""
    def side(ps: Sequence[LevelResult]) -> dict[str, object]:
        first = ps[0].figures()
        slim = {k: v for k, v in first.items() if not k.startswith("prompt_")}
        return {**slim, "requests": sum(p.requests for p in ps), "errors": sum(p.errors for p in ps),
                "output_tokens": sum(p.output_tokens for p in ps), "wall_s": round(sum(p.wall_s for p in ps), 3),
                "output_tokens_per_s": round(pooled(ps), 3), "ttft_ms_median": _ttft(ps),
                "foreign_requests": max(p.foreign_requests for p in ps), "passes": [p.figures() for p in ps]}

    bt = pooled(b)
    return {"baseline": side(b), "speculative": side(s),
            "throughput_ratio": round(pooled(s) / bt, 4) if bt else None}


def decide(baseline: Mapping[int, Sequence[LevelResult]], speculative: Mapping[int, Sequence[LevelResult]],
           spec: SpecDelta, *, production_concurrency: int, margin: float, acceptance_floor: float | None,
           ttft_ratio_max: float = math.inf, resamples: int = RESAMPLES, seed: int = SEED,
           rule: Literal["faster", "not_slower"] = "faster", level: float = LEVEL) -> Decision:
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
        resamples, seed: the bootstrap's.
        rule: ``faster`` (speculate: keep needs the lower bound at ``1 + margin``) or ``not_slower`` (``release
            --gate``: any serving change is kept unless slower beyond the margin: the lower bound at
            ``1 - margin``); the interval, drift and TTFT steps are the same.
        level: the throughput interval's confidence level (:data:`LEVEL`; a job choosing among ``m`` candidates
            decides each at ``1 - (1 - LEVEL) / m``: :func:`candidate_level`).

    Raises:
        ValueError: the production concurrency was not measured on both sides, fewer than :data:`MIN_PASSES`
            passes on a side there, or per-prompt figures missing there.
    """
    if production_concurrency not in baseline or production_concurrency not in speculative:
        raise ValueError(f"production concurrency {production_concurrency} was not measured on both releases "
                         f"(baseline {sorted(baseline)}, speculative {sorted(speculative)})")
    b, s = list(baseline[production_concurrency]), list(speculative[production_concurrency])
    if min(len(b), len(s)) < MIN_PASSES:
        raise ValueError(f"the decision needs at least {MIN_PASSES} passes per side at concurrency "
                         f"{production_concurrency} (baseline {len(b)}, speculative {len(s)})")
    levels = {str(c): _level_figures(baseline[c], speculative[c]) for c in sorted(set(baseline) & set(speculative))}
    acc = spec.mean_acceptance_length
    need = 1.0 + margin if rule == "faster" else 1.0 - margin
    tb, ts = _ttft(b), _ttft(s)
    ttft_ratio = ts / tb if tb and ts is not None else None
    drift = baseline_drift(b, margin)
    figures: dict[str, object] = {
        "production_concurrency": production_concurrency, "margin": margin,
        "margin_is_negative_test_setting": margin < 0, "acceptance_floor": acceptance_floor, "rule": rule,
        "ttft_ratio_max": ttft_ratio_max if math.isfinite(ttft_ratio_max) else None,
        "ttft_ratio": round(ttft_ratio, 4) if ttft_ratio is not None else None,
        "throughput_ratio": levels[str(production_concurrency)]["throughput_ratio"],
        "passes": {"baseline": len(b), "speculative": len(s)}, "drift": drift.figures(),
        "spec_decode": spec.figures(), "levels": levels}
    # The interval is computed (and reported) whatever rule decides, so that a rollback for acceptance, TTFT or
    # drift still shows how fast the speculative release was; only step 6 decides on it.
    try:
        iv = ratio_interval(b, s, level=level, resamples=resamples, seed=seed)
        figures["interval"] = iv.figures()
    except ValueError as e:  # failed requests (no per-prompt seconds): step 2 decides, nothing to resample
        iv = None
        figures["interval_unavailable"] = str(e)
    common = {"figures": figures, "drift": drift, "ttft_ratio": ttft_ratio}
    skewed = [f"{side} at {c}" for side, res in (("baseline", baseline), ("speculative", speculative))
              for c, rs in res.items() for r in rs if r.foreign_requests > 0 or r.errors]
    if skewed:
        return Decision("undecided", f"foreign requests or failed requests during {', '.join(sorted(set(skewed)))}: "
                                     "not deciding on skewed figures; rolled back", **common)
    if acc is None and acceptance_floor is not None:
        return Decision("rollback", "no draft round ran on the speculative release (speculation not active)",
                        **common)
    if acc is not None and acceptance_floor is not None and acc < acceptance_floor:
        return Decision("rollback", f"mean acceptance length {acc:.3f} below the floor {acceptance_floor}", **common)
    if ttft_ratio is not None and ttft_ratio > ttft_ratio_max:
        return Decision("rollback", f"median time to first token x{ttft_ratio:.3f} of the baseline's at "
                                    f"concurrency {production_concurrency}, at most x{ttft_ratio_max:g} "
                                    "(serving.gate_ttft_ratio_max)", **common)
    if drift.exceeded:
        return Decision("undecided", f"the baseline drifted {drift.change:+.1%} from its first to its last pass "
                                     f"(90 % interval {drift.low:+.1%} to {drift.high:+.1%}), beyond half the "
                                     f"margin ({drift.limit:.1%}): the host's speed changed while the gate "
                                     "measured; rolled back", **common)
    if iv is None:
        iv = ratio_interval(b, s, level=level, resamples=resamples, seed=seed)  # raises the ValueError of above
    where = (f"output tokens/s x{iv.point:.3f} of the baseline at concurrency {production_concurrency}, "
             f"{iv.level:.0%} interval x{iv.low:.3f} to x{iv.high:.3f} ({len(b)} + {len(s)} passes x {iv.prompts} "
             "prompts)")
    if iv.low >= need:
        tail = f"; mean acceptance length {acc:.3f}" if acc is not None else ""
        return Decision("keep", f"{where}: lower bound clears x{need:.3f}{tail}", interval=iv, **common)
    if iv.high < need:
        return Decision("rollback", f"{where}: upper bound below x{need:.3f}", interval=iv, **common)
    deciding = {"figure": f"lower bound of the {iv.level:.0%} throughput-ratio interval", "value": round(iv.low, 4),
                "needs": round(need, 4)}
    figures["deciding"] = deciding
    return Decision("undecided", f"{where} straddles x{need:.3f}: the lower bound x{iv.low:.3f} would have to reach "
                                 f"x{need:.3f} to keep; more passes (serving.gate_passes) narrow it; rolled back",
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
               sets: Mapping[str, Sequence[int]], *, production_concurrency: int, resamples: int = RESAMPLES,
               seed: int = SEED) -> dict[str, object]:
    """One table per prompt set (issue 24: e.g. ``chat`` = held-out chat turns, ``code`` = HumanEval's gate split),
    from the same passes the decision used: each set's prompts (``sets``: name -> indices into the prompts' fixed
    order) cut out of every pass with :func:`subset_pass`. Per level: each side's pass-pooled output tokens/s, the
    ratio, the median TTFT ratio; at the production concurrency also the 90 % interval of the ratio
    (:func:`ratio_interval` on the set's cells). Reported, never decided on: the decision is the whole set's.
    Acceptance is not split by set (vLLM 0.16's spec-decode counters are server-wide).

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
                bt, st = pooled(b), pooled(s)
                tb, ts = _ttft(b), _ttft(s)
                row: dict[str, object] = {
                    "baseline_tokens_per_s": round(bt, 3), "speculative_tokens_per_s": round(st, 3),
                    "throughput_ratio": round(st / bt, 4) if bt else None,
                    "ttft_ratio": round(ts / tb, 4) if tb and ts is not None else None}
                if c == production_concurrency and min(len(b), len(s)) >= 2:
                    row["interval"] = ratio_interval(b, s, resamples=resamples, seed=seed).figures()
                levels[str(c)] = row
            out[name] = {"prompts": len(idx), "levels": levels}
        except ValueError as e:
            out[name] = {"prompts": len(idx), "error": str(e)}
    return out
