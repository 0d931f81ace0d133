"""vLLM 0.16's speculative-decoding counters from ``/metrics``, read as deltas between two scrapes.

vLLM 0.16 exports (Prometheus text format; a ``_created`` series sits beside each counter and is ignored here):
``vllm:spec_decode_num_drafts_total``, ``vllm:spec_decode_num_draft_tokens_total``,
``vllm:spec_decode_num_accepted_tokens_total`` and ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position=k}``,
plus the gauges ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` and the counter
``vllm:generation_tokens_total`` (vLLM 0.16 ``vllm/v1/metrics/loggers.py``; shared/FACTS.md). Mean acceptance length, as vLLM's own
``SpecDecodingLogging`` reports it: ``1 + Δaccepted / Δdrafts`` (each draft round yields the accepted tokens plus one
token from the target); per-position acceptance rate ``Δaccepted_pos[k] / Δdrafts``.

Parsing uses ``prometheus_client.parser`` (the Prometheus project's own parser).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["SpecCounters", "SpecDelta", "parse"]

PREFIX = "vllm:spec_decode_"
_SUMMED = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total")


@dataclass(frozen=True)
class SpecCounters:
    """One scrape's spec-decode counters (summed over every label set except ``position``) and running requests.

    Attributes:
        drafts: draft rounds (``num_drafts``).
        draft_tokens: tokens proposed by the draft head.
        accepted: proposed tokens the target accepted.
        accepted_per_pos: position (0-based) -> accepted tokens at that position.
        requests_running: ``vllm:num_requests_running`` (gauge; summed over engines), None when absent.
        requests_waiting: ``vllm:num_requests_waiting`` (gauge; summed over engines), None when absent.
        generation_tokens: ``vllm:generation_tokens_total`` (counter; summed), None when absent. Two scrapes with
            the same value mean no request produced a token in between: the server is idle, not between requests.
    """

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    requests_running: float | None = None
    requests_waiting: float | None = None
    generation_tokens: float | None = None


def parse(text: str) -> SpecCounters:
    """Read :class:`SpecCounters` from Prometheus text (a ``GET /metrics`` body). Absent counters read as 0 (a
    server without speculation exports none).

    Raises:
        ValueError: the text is not Prometheus exposition format.
    """
    totals = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}
    per_pos: dict[int, float] = {}
    summed: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in _SUMMED:
                summed[s.name] = summed.get(s.name, 0.0) + s.value
            if not (s.name.startswith(PREFIX) and s.name.endswith("_total")):
                continue
            key = s.name[len(PREFIX):-len("_total")]
            if key == "num_accepted_tokens_per_pos":
                pos = int(s.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + s.value
            elif key in totals:
                totals[key] += s.value
    return SpecCounters(totals["num_drafts"], totals["num_draft_tokens"], totals["num_accepted_tokens"], per_pos,
                        summed.get("vllm:num_requests_running"), summed.get("vllm:num_requests_waiting"),
                        summed.get("vllm:generation_tokens_total"))


@dataclass(frozen=True)
class SpecDelta:
    """What happened between two scrapes. Ratios are None when no draft round ran."""

    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: dict[int, float]

    @classmethod
    def between(cls, before: SpecCounters, after: SpecCounters) -> SpecDelta:
        """``after - before``, per counter.

        Raises:
            ValueError: a counter went down (the server restarted between the scrapes: the delta means nothing).
        """
        d = cls(after.drafts - before.drafts, after.draft_tokens - before.draft_tokens,
                after.accepted - before.accepted,
                {k: v - before.accepted_per_pos.get(k, 0.0) for k, v in sorted(after.accepted_per_pos.items())})
        if min(d.drafts, d.draft_tokens, d.accepted, *d.accepted_per_pos.values(), 0.0) < 0:
            raise ValueError("a spec-decode counter went down between the scrapes (server restarted?)")
        return d

    @property
    def mean_acceptance_length(self) -> float | None:
        """``1 + Δaccepted / Δdrafts`` tokens per target forward (vLLM's definition)."""
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else None

    @property
    def acceptance_rate(self) -> float | None:
        """``Δaccepted / Δdraft_tokens``: the fraction of proposed tokens accepted."""
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else None

    @property
    def per_position(self) -> dict[int, float]:
        """position -> ``Δaccepted_pos / Δdrafts`` (acceptance rate at each draft position)."""
        return {k: v / self.drafts for k, v in self.accepted_per_pos.items()} if self.drafts > 0 else {}

    def figures(self) -> dict[str, object]:
        """JSON-ready figures for the audit log and results."""
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted": self.accepted,
                "mean_acceptance_length": self.mean_acceptance_length, "acceptance_rate": self.acceptance_rate,
                "acceptance_per_position": {str(k): round(v, 4) for k, v in self.per_position.items()}}
