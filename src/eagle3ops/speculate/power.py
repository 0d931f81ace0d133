"""The speculation gate's power, planned before any restart (pure; the plan and ``--dry-run`` print it).

Power: the chance that the gate keeps a release that is truly x1.30 faster
(:data:`eagle3ops.gate.decide.POWER_RATIO`), i.e. that the throughput interval's lower bound clears ``1 + margin``
(:func:`eagle3ops.gate.decide.power`, from the same t interval the gate decides with), for the configured passes per
side at this host's recorded pass CV. The CV is pooled from the host's recorded gates (every speculate window's
result carries each side's passes at the production concurrency): the pooled within-side variance of the passes'
log output tokens/s over the newest :data:`NEWEST` gates, ``sqrt(exp(s²) - 1)``; with none recorded, 10 %
(:data:`eagle3ops.gate.decide.DEFAULT_PASS_CV`), said so. Below :data:`eagle3ops.gate.decide.POWER_TARGET` (80 %)
the plan names the passes per side that would reach it and the job is refused unless the operator chose the low
power (``--accept-low-power`` or ``serving.gate_accept_low_power``): a gate that would most likely roll back a good
head is not worth its restarts.

The figure is the interval's alone: from :data:`eagle3ops.gate.decide.MIN_DRIFT_PASSES` passes the drift check
also leaves up to 5 % of drift-free gates undecided, so the gate's keep rate at x1.30 is a few points lower
(``benchmarks/gate-simulation/gate-simulation.json`` gives both, the simulated keep rate beside this analytic one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from eagle3ops.gate import decide as dec

__all__ = ["NEWEST", "PowerPlan", "power_plan", "recorded_pass_cv"]

#: How many of the newest recorded gates the pass CV pools.
NEWEST = 10


def recorded_pass_cv(results: list[dict[str, Any]], newest: int = NEWEST) -> tuple[float | None, int]:
    """``(cv, gates)``: the pass CV pooled over the newest ``newest`` recorded gates (window results, any order,
    sorted by ``window_id``) and how many gates it comes from; ``(None, 0)`` when none recorded passes.

    A gate counts when its window result has ``speculate.levels[<production_concurrency>]`` with at least two
    passes' ``output_tokens_per_s`` (all positive) on a side; each side adds its passes' sum of squared log
    deviations and ``passes - 1`` degrees of freedom to the pool."""
    ss = df = 0.0
    gates = 0
    for res in sorted(results, key=lambda r: str(r.get("window_id", "")))[::-1]:
        spec = res.get("speculate")
        if not isinstance(spec, dict) or gates >= newest:
            continue
        level = (spec.get("levels") or {}).get(str(spec.get("production_concurrency")))
        if not isinstance(level, dict):
            continue
        used = False
        for side in ("baseline", "speculative"):
            passes = ((level.get(side) or {}).get("passes")) or []
            rates = [p.get("output_tokens_per_s") for p in passes if isinstance(p, dict)]
            if len(rates) < 2 or not all(isinstance(x, (int, float)) and x > 0 for x in rates):
                continue
            logs = [math.log(x) for x in rates]
            m = sum(logs) / len(logs)
            ss += sum((v - m) ** 2 for v in logs)
            df += len(logs) - 1
            used = True
        gates += used
    if not df:
        return None, 0
    return math.sqrt(math.expm1(ss / df)), gates


@dataclass(frozen=True)
class PowerPlan:
    """The gate's planned power.

    Attributes:
        passes: passes per side the job will run.
        cv: pass CV the power is computed at (a fraction).
        recorded_gates: recorded gates the CV pools (0: the default CV assumed).
        margin: the keep bar is ``1 + margin``.
        level: the interval's level (lower with several candidates: Bonferroni).
        power: chance of keeping a truly x1.30 faster release.
        needed: the fewest passes per side reaching the target (None: no practical number does).
        accepted: the operator accepted a low power (``--accept-low-power`` / ``serving.gate_accept_low_power``).
        design: the order of the passes the power is computed for (``aba`` or ``ab``).
    """

    passes: int
    cv: float
    recorded_gates: int
    margin: float
    level: float
    power: float
    needed: int | None
    accepted: bool
    design: str = "ab"

    @property
    def low(self) -> bool:
        """True below :data:`eagle3ops.gate.decide.POWER_TARGET`."""
        return self.power < dec.POWER_TARGET

    def figures(self) -> dict[str, Any]:
        """JSON-ready figures (for the result and the dry run)."""
        return {"passes": self.passes, "pass_cv": round(self.cv, 4), "pass_cv_recorded_gates": self.recorded_gates,
                "true_ratio": dec.POWER_RATIO, "margin": self.margin, "level": round(self.level, 4),
                "power": round(self.power, 4), "target": dec.POWER_TARGET, "passes_needed": self.needed,
                "low": self.low, "accepted_low_power": self.accepted and self.low, "design": self.design}

    def lines(self) -> list[str]:
        """What the plan prints."""
        where = (f"this host's pass CV {self.cv:.1%} (from its {self.recorded_gates} recorded gate"
                 f"{'s' if self.recorded_gates != 1 else ''})" if self.recorded_gates
                 else f"an assumed pass CV of {self.cv:.0%} (no gate recorded on this host)")
        line = (f"gate power: {self.power:.0%} chance to keep a release truly x{dec.POWER_RATIO:.2f} faster, "
                f"with {self.passes} passes per side ({self.design}) at {where}, margin {self.margin:g}")
        if not self.low:
            return [line]
        need = (f"{self.needed} passes per side reach {dec.POWER_TARGET:.0%} (--passes {self.needed})"
                if self.needed else f"no practical number of passes reaches {dec.POWER_TARGET:.0%}")
        tail = ("; accepted (--accept-low-power / serving.gate_accept_low_power): a straddling interval is the "
                "likely outcome" if self.accepted else "")
        return [f"{line}: below {dec.POWER_TARGET:.0%}; {need}{tail}"]

    def refusal(self, host: str) -> str | None:
        """The refusal's message when the power is low and not accepted; else None."""
        if not self.low or self.accepted:
            return None
        fix = (f"run with --passes {self.needed}" if self.needed else "lower the host's pass noise first")
        return (f"{host}: {self.lines()[0]}; {fix}, or --accept-low-power (serving.gate_accept_low_power) to measure "
                "anyway; nothing was restarted")


def power_plan(results: list[dict[str, Any]], *, passes: int, margin: float, accepted: bool,
               candidates: int = 1, design: str = "ab") -> PowerPlan:
    """The :class:`PowerPlan` of a speculate job from the host's window results (read-only, any order).
    ``candidates``: several candidates are each decided at the Bonferroni level
    (:func:`eagle3ops.gate.decide.candidate_level`), so their power is lower; ``design``: the order of the passes
    (``aba``: the baseline's passes split between two blocks, :func:`eagle3ops.gate.decide.design_spread`)."""
    cv, gates = recorded_pass_cv(results)
    cv = dec.DEFAULT_PASS_CV if cv is None else cv
    level = dec.candidate_level(max(candidates, 1))
    pw = dec.power(passes, cv, margin, level=level, design=design)
    needed = passes if pw >= dec.POWER_TARGET else dec.passes_for_power(cv, margin, level=level, design=design)
    return PowerPlan(passes, cv, gates, margin, level, pw, needed, accepted, design)
