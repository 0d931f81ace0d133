"""vLLM 0.16's speculative-decoding counters from ``/metrics``, read as deltas between two scrapes.

vLLM 0.16 exports (Prometheus text format; a ``_created`` series sits beside each counter and is ignored here):
``vllm:spec_decode_num_drafts_total``, ``vllm:spec_decode_num_draft_tokens_total``,
``vllm:spec_decode_num_accepted_tokens_total`` and ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position=k}``,
plus the gauges ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` and the counters
``vllm:generation_tokens_total``, ``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` (prompt
tokens looked up in / found in the prefix cache; vLLM 0.16 ``vllm/v1/metrics/loggers.py``; shared/FACTS.md). Mean acceptance length, as vLLM's own
``SpecDecodingLogging`` reports it: ``1 + Δaccepted / Δdrafts`` (each draft round yields the accepted tokens plus one
token from the target); per-position acceptance rate ``Δaccepted_pos[k] / Δdrafts``.

Parsing uses ``prometheus_client.parser`` (the Prometheus project's own parser), imported when a body is parsed, not
with the module: the CLI (``eagle3ops --help``, run at image build on bases without it) reaches this module through
``watch``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


__all__ = ["ServerSample", "SpecCounters", "SpecDelta", "interval_figures", "parse", "parse_server"]

PREFIX = "vllm:spec_decode_"
_SUMMED = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total",
           "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


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
        prefix_cache_queries: ``vllm:prefix_cache_queries_total`` (prompt tokens looked up in the prefix cache;
            counter, summed), None when absent.
        prefix_cache_hits: ``vllm:prefix_cache_hits_total`` (prompt tokens found there; counter, summed), None when
            absent.
    """

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    requests_running: float | None = None
    requests_waiting: float | None = None
    generation_tokens: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None


def parse(text: str) -> SpecCounters:
    """Read :class:`SpecCounters` from Prometheus text (a ``GET /metrics`` body). Absent counters read as 0 (a
    server without speculation exports none).

    Raises:
        ValueError: the text is not Prometheus exposition format.
    """
    totals = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}
    per_pos: dict[int, float] = {}
    summed: dict[str, float] = {}
    from prometheus_client.parser import text_string_to_metric_families  # lazy: `eagle3ops --help` needs none

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
                        summed.get("vllm:generation_tokens_total"), summed.get("vllm:prefix_cache_queries_total"),
                        summed.get("vllm:prefix_cache_hits_total"))


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


#: Server-wide counters and histogram sums (vLLM 0.16 ``vllm/v1/metrics/loggers.py``) read by ``eagle3ops watch``;
#: each summed over every label set (engines, ``finished_reason``, model name).
_SERVER = {"vllm:request_success_total": "requests_finished",
           "vllm:e2e_request_latency_seconds_sum": "e2e_seconds_sum",
           "vllm:e2e_request_latency_seconds_count": "e2e_count",
           "vllm:time_to_first_token_seconds_sum": "ttft_seconds_sum",
           "vllm:time_to_first_token_seconds_count": "ttft_count",
           "vllm:request_generation_tokens_sum": "request_generation_tokens_sum"}


@dataclass(frozen=True)
class ServerSample:
    """One scrape for ``eagle3ops watch``: the spec-decode counters (:class:`SpecCounters`, which also carries the
    running/waiting gauges and ``generation_tokens``) plus finished requests and the latency histograms' sums and
    counts. A histogram or counter the server does not export reads as None."""

    spec: SpecCounters
    requests_finished: float | None = None
    e2e_seconds_sum: float | None = None
    e2e_count: float | None = None
    ttft_seconds_sum: float | None = None
    ttft_count: float | None = None
    request_generation_tokens_sum: float | None = None

    def to_json(self) -> dict[str, object]:
        """JSON-ready (positions as strings), read back by :meth:`from_json`."""
        d = {k: getattr(self, k) for k in _SERVER.values()}
        spec = {k: getattr(self.spec, k) for k in SpecCounters.__dataclass_fields__}
        spec["accepted_per_pos"] = {str(k): v for k, v in self.spec.accepted_per_pos.items()}
        return {**d, "spec": spec}

    @classmethod
    def from_json(cls, d: dict) -> "ServerSample":
        """The inverse of :meth:`to_json`."""
        spec = dict(d["spec"])
        spec["accepted_per_pos"] = {int(k): float(v) for k, v in spec["accepted_per_pos"].items()}
        return cls(SpecCounters(**spec), **{k: d.get(k) for k in _SERVER.values()})


def parse_server(text: str) -> ServerSample:
    """Read a :class:`ServerSample` from Prometheus text (a ``GET /metrics`` body).

    Raises:
        ValueError: the text is not Prometheus exposition format.
    """
    found: dict[str, float] = {}
    from prometheus_client.parser import text_string_to_metric_families  # lazy: `eagle3ops --help` needs none

    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in _SERVER:
                found[_SERVER[s.name]] = found.get(_SERVER[s.name], 0.0) + s.value
    return ServerSample(parse(text), **found)


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def interval_figures(before: ServerSample, after: ServerSample, seconds: float) -> dict[str, object]:
    """What the server did between two scrapes ``seconds`` apart: the spec-decode figures (:meth:`SpecDelta.figures`:
    mean acceptance length, per-position rates) and throughput — ``output_tokens_per_s`` (Δ generation tokens /
    seconds), ``requests_per_s``, ``request_output_tokens_per_s`` (per-request speed: Δ request output tokens /
    Δ end-to-end seconds of the requests that finished), ``ttft_s_mean`` — and the queue (``requests_waiting``,
    ``requests_running`` at the second scrape). A figure whose inputs are absent or did not move is None.

    Raises:
        ValueError: a counter went down (the server restarted between the scrapes).
    """
    spec = SpecDelta.between(before.spec, after.spec)
    gen = _diff(before.spec.generation_tokens, after.spec.generation_tokens)
    done = _diff(before.requests_finished, after.requests_finished)
    e2e = _diff(before.e2e_seconds_sum, after.e2e_seconds_sum)
    req_tokens = _diff(before.request_generation_tokens_sum, after.request_generation_tokens_sum)
    ttft, ttft_n = (_diff(before.ttft_seconds_sum, after.ttft_seconds_sum),
                    _diff(before.ttft_count, after.ttft_count))
    if any(x is not None and x < 0 for x in (gen, done, e2e, req_tokens, ttft, ttft_n)):
        raise ValueError("a counter went down between the scrapes (server restarted?)")

    def rate(num: float | None, den: float | None) -> float | None:
        return round(num / den, 4) if num is not None and den else None

    return {"seconds": round(seconds, 3), **spec.figures(), "generation_tokens": gen, "requests_finished": done,
            "output_tokens_per_s": rate(gen, seconds), "requests_per_s": rate(done, seconds),
            "request_output_tokens_per_s": rate(req_tokens, e2e), "ttft_s_mean": rate(ttft, ttft_n),
            "requests_waiting": after.spec.requests_waiting, "requests_running": after.spec.requests_running}
