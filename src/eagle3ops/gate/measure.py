"""The speculation gate's measurement, host side: the same code whether it runs in the gate helper container
(:mod:`eagle3ops.speculate.onhost` ``measure``) or in the host's supervisor during a ``speculate`` job
(:mod:`eagle3ops.supervisor.speculate`); and the pure reading of its answer into per-pass figures and spec-decode
counter deltas.

Only the standard library, httpx and prometheus_client are imported (both in the pipeline image).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from eagle3ops.gate.metrics import SpecCounters, SpecDelta, parse
from eagle3ops.gate.replay import LevelResult, ReleaseFailed, endpoints, replay_level, summary

__all__ = ["measure", "prefix_cache", "read_measurement", "sum_deltas"]


def measure(req: dict[str, Any]) -> dict[str, Any]:
    """Replay the request's prompts at each level, ``passes`` times; raw figures and counter snapshots.

    Returns:
        ``{"levels": {c: [LevelResult figures, one per pass]}, "counters": {c: [[before, after], one per pass]},
        "server": {"version": GET /version's, or None}, "traffic": {"endpoints": {path: prompts sent there},
        "base_url"}}`` where counters are :class:`~eagle3ops.gate.metrics.SpecCounters` as dicts (the prefix-cache
        counters with them: :func:`prefix_cache`).

    Request: ``{"base_url", "model", "prompts" (sent in this order every pass: strings and chat bodies,
    :func:`~eagle3ops.gate.replay.request_body`), "levels", "max_tokens", "passes"
    (default 1), "api_key" (or null: sent on every request and scrape, never in argv), "request_timeout_s",
    "idle_timeout_s", "warmup_prompts" (default 0), "traffic" (``live``: no idle wait before a level, the
    clients' requests recorded as foreign; default ``idle``)}``. With ``warmup_prompts`` N > 0, the first N prompts are sent
    once at each level before the passes and not measured (a freshly started server's first requests are slower;
    their spec-decode counters fall before the first pass's "before" snapshot); the answer's ``warmup`` says what was
    sent and how fast, and ``warmup["failures"]`` (concurrency -> ``[prompt index, why]``) any request that
    failed. Passes run one after the other, each going through every level in order (a slow drift of the host then
    touches every level alike). A level's "before" snapshot is taken after its idle wait, right
    before its first request (:func:`~eagle3ops.gate.replay.replay_level`'s ``on_idle``).

    Raises:
        ReplayError: the server was busy before a level.
        ReleaseFailed: every request of a level failed, or the server stopped answering (``/metrics`` unreachable
            after a level whose requests failed, or for a whole idle wait): the release failed the gate's traffic.
    """
    import httpx

    from eagle3ops.serving_http import ServingClient, auth_headers

    base, model, key = req["base_url"], req["model"], req.get("api_key")
    headers = auth_headers(key)
    out: dict[str, Any] = {"levels": {str(c): [] for c in req["levels"]},
                           "counters": {str(c): [] for c in req["levels"]},
                           "traffic": {"endpoints": endpoints(req["prompts"]), "base_url": base}}

    def scrape() -> dict[str, Any]:
        d = asdict(parse(httpx.get(f"{base}/metrics", headers=headers, timeout=30).text))
        d["accepted_per_pos"] = {str(k): v for k, v in d["accepted_per_pos"].items()}
        return d

    # vLLM's GET /version: the like-for-like record; a server without it answers None
    out["server"] = {"version": ServingClient(base, key, timeout_s=30).version()}
    live = req.get("traffic") == "live"  # serving.gate_traffic: measured beside the clients, no idle wait
    warm = req["prompts"][: int(req.get("warmup_prompts") or 0)]
    if warm:
        out["warmup"] = _warm_up(req, warm, live, scrape)
    for _ in range(int(req.get("passes", 1))):
        for c in req["levels"]:
            before: list[dict[str, Any]] = []
            res = replay_level(base, model, req["prompts"], int(c), **_replay_settings(req),
                               on_idle=lambda: before.append(scrape()), live=live)
            out["levels"][str(c)].append(res.figures())
            try:
                after = scrape()
            except (httpx.HTTPError, ValueError) as e:
                if not res.errors:
                    raise
                raise _went_down(res, int(c), e, "requests") from None
            out["counters"][str(c)].append([before[0], after])
    return out


def _replay_settings(req: dict[str, Any]) -> dict[str, Any]:
    """The request's per-request settings as :func:`~eagle3ops.gate.replay.replay_level` takes them: ``max_tokens``,
    ``api_key``, ``request_timeout_s`` (default 300 s) and ``idle_timeout_s`` (default 120 s), for the warm-up and
    the passes alike."""
    return {"max_tokens": int(req["max_tokens"]), "api_key": req.get("api_key"),
            "request_timeout_s": float(req.get("request_timeout_s", 300)),
            "idle_timeout_s": float(req.get("idle_timeout_s", 120))}


def _went_down(res: LevelResult, c: int, exc: Exception, what: str) -> ReleaseFailed:
    """The gate's verdict on a level whose ``what`` (``requests``, ``warm-up requests``) failed and after which
    ``/metrics`` did not answer (``exc``): the release went down under the gate's traffic."""
    return ReleaseFailed(f"{res.errors} of {res.requests} {what} failed at concurrency {c} ({summary(res.failures)}) "
                         f"and the server no longer answers /metrics ({type(exc).__name__}: {exc}): it went down",
                         res.failures, c)


def _warm_up(req: dict[str, Any], warm: list[Any], live: bool, scrape: Any) -> dict[str, Any]:
    """The ``warm`` prompts sent once at each level of ``req`` before its passes, not measured (:func:`measure`'s
    doc); returns its answer's ``warmup``: ``{"prompts": N, "output_tokens_per_s": {c: figure}}``, with
    ``"failures"`` (``{c: [[prompt index, why], ...]}``) when requests failed.

    Raises:
        ReleaseFailed: requests failed and ``scrape`` (``/metrics``) no longer answers: the server went down.
    """
    import httpx

    got: dict[str, Any] = {"prompts": len(warm), "output_tokens_per_s": {}}
    for c in req["levels"]:
        res = replay_level(req["base_url"], req["model"], warm, int(c), **_replay_settings(req), live=live)
        got["output_tokens_per_s"][str(c)] = res.figures().get("output_tokens_per_s")
        if res.errors:  # failed requests are the release's, measured or not
            got.setdefault("failures", {})[str(c)] = [list(f) for f in res.failures]
            try:
                scrape()
            except (httpx.HTTPError, ValueError) as e:
                raise _went_down(res, int(c), e, "warm-up requests") from None
    return got


def prefix_cache(ans: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Per level of a :func:`measure` answer (pure): vLLM's prefix-cache ``queries`` and ``hits`` (prompt tokens)
    summed over the level's passes (each pass from after its idle wait to after its last request) and ``hit_rate``
    = hits / queries; every figure None when the server exports no prefix-cache counters (or a measurement from
    before they were read)."""
    out: dict[str, dict[str, float | None]] = {}
    for c, pairs in ans.get("counters", {}).items():
        q = h = 0.0
        known = bool(pairs)
        for before, after in pairs:
            vals = [d.get(k) for d in (before, after) for k in ("prefix_cache_queries", "prefix_cache_hits")]
            if any(v is None for v in vals):
                known = False
                break
            q += vals[2] - vals[0]
            h += vals[3] - vals[1]
        out[c] = ({"queries": q, "hits": h, "hit_rate": round(h / q, 4) if q > 0 else None} if known
                  else {"queries": None, "hits": None, "hit_rate": None})
    return out


def sum_deltas(deltas: list[SpecDelta]) -> SpecDelta:
    """The sum of counter deltas (per position too)."""
    pos: dict[int, float] = {}
    for d in deltas:
        for k, v in d.accepted_per_pos.items():
            pos[k] = pos.get(k, 0.0) + v
    return SpecDelta(sum(d.drafts for d in deltas), sum(d.draft_tokens for d in deltas),
                     sum(d.accepted for d in deltas), dict(sorted(pos.items())))


def read_measurement(ans: dict[str, Any]) -> tuple[dict[int, list[LevelResult]], dict[int, SpecDelta]]:
    """A :func:`measure` answer (pure) → (concurrency -> its passes in order, concurrency -> spec-decode counter
    delta summed over its passes; each pass's delta runs from after its idle wait to after its last request).

    Raises:
        KeyError, TypeError: not a :func:`measure` answer.
    """
    out: dict[int, list[LevelResult]] = {}
    deltas: dict[int, SpecDelta] = {}
    for c, figs in ans["levels"].items():
        out[int(c)] = [LevelResult(**fig) for fig in figs]
        per_pass = []
        for pair in ans["counters"][c]:
            before, after = (SpecCounters(d["drafts"], d["draft_tokens"], d["accepted"],
                                          {int(k): v for k, v in d["accepted_per_pos"].items()},
                                          d["requests_running"]) for d in pair)
            per_pass.append(SpecDelta.between(before, after))
        deltas[int(c)] = sum_deltas(per_pass)
    return out, deltas
