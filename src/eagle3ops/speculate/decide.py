"""Keep or roll back a speculative release, from figures measured on the host with the same prompts on both sides.

Rule (issue 18): keep only when, at the host's production concurrency, the speculative release's output tokens/s
beat the baseline's by at least ``margin`` (``spec >= baseline * (1 + margin)``; a negative margin is allowed only
in tests, to exercise the keep branch, and is named so in the decision) and its mean acceptance length is at least
``acceptance_floor``. Figures taken while other clients' requests shared the server, or with failed requests, are
not decided on: the decision is ``undecided`` and the release is rolled back like a loss. Other concurrency levels
are reported beside it (speed-ups shrink as batch size grows) but do not decide.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from eagle3ops.speculate.metrics import SpecDelta
from eagle3ops.speculate.replay import LevelResult

__all__ = ["Decision", "decide"]


@dataclass(frozen=True)
class Decision:
    """``verdict``: ``keep``, ``rollback`` or ``undecided`` (rolled back); ``reason`` in one line; ``figures`` for
    the audit log and the run's results."""

    verdict: str
    reason: str
    figures: dict[str, object] = field(default_factory=dict)

    @property
    def keep(self) -> bool:
        """True only for ``keep``."""
        return self.verdict == "keep"


def decide(baseline: Mapping[int, LevelResult], speculative: Mapping[int, LevelResult], spec: SpecDelta, *,
           production_concurrency: int, margin: float, acceptance_floor: float) -> Decision:
    """Decide from per-concurrency results of both releases and the speculative side's counter deltas.

    Raises:
        ValueError: ``production_concurrency`` was not measured on both sides.
    """
    if production_concurrency not in baseline or production_concurrency not in speculative:
        raise ValueError(f"production concurrency {production_concurrency} was not measured on both releases "
                         f"(baseline {sorted(baseline)}, speculative {sorted(speculative)})")
    levels = {}
    for c in sorted(set(baseline) & set(speculative)):
        b, s = baseline[c], speculative[c]
        levels[str(c)] = {"baseline": b.figures(), "speculative": s.figures(),
                          "throughput_ratio": round(s.output_tokens_per_s / b.output_tokens_per_s, 4)
                          if b.output_tokens_per_s else None}
    b, s = baseline[production_concurrency], speculative[production_concurrency]
    ratio = s.output_tokens_per_s / b.output_tokens_per_s if b.output_tokens_per_s else 0.0
    acc = spec.mean_acceptance_length
    figures = {"production_concurrency": production_concurrency, "margin": margin,
               "margin_is_negative_test_setting": margin < 0, "acceptance_floor": acceptance_floor,
               "throughput_ratio": round(ratio, 4), "spec_decode": spec.figures(), "levels": levels}
    skewed = [f"{side} at {c}" for side, res in (("baseline", baseline), ("speculative", speculative))
              for c, r in res.items() if r.foreign_requests > 0 or r.errors]
    if skewed:
        return Decision("undecided", f"foreign requests or failed requests during {', '.join(skewed)}: not "
                                     "deciding on skewed figures; rolled back", figures)
    if acc is None:
        return Decision("rollback", "no draft round ran on the speculative release (speculation not active)",
                        figures)
    if acc < acceptance_floor:
        return Decision("rollback", f"mean acceptance length {acc:.3f} below the floor {acceptance_floor}",
                        figures)
    if ratio < 1.0 + margin:
        return Decision("rollback", f"output tokens/s x{ratio:.3f} of the baseline at concurrency "
                                    f"{production_concurrency}, needs x{1 + margin:.3f}", figures)
    return Decision("keep", f"output tokens/s x{ratio:.3f} of the baseline at concurrency {production_concurrency} "
                            f"(needs x{1 + margin:.3f}), mean acceptance length {acc:.3f}", figures)
