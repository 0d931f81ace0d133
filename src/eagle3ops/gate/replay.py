"""Replay a fixed prompt set at a given concurrency against an OpenAI-compatible server (vLLM), measuring it.

Each level sends every prompt once through ``/v1/completions`` with ``stream: true``, greedy (``temperature 0``),
``max_tokens`` fixed and ``ignore_eos: true`` (a vLLM sampling extension), so both sides of a comparison generate
exactly the same number of tokens for the same prompts. Per request: time to first token and inter-token latency
``(t_last - t_first) / (n_tokens - 1)`` (a streamed chunk may carry several tokens under speculation, so the
latency is taken over the whole stream, not per chunk); per level: output tokens/s = Σ output tokens / wall time.
Per prompt, in the prompts' own (fixed) order whatever the order of completion: output tokens, request seconds
(sent to last token) and time to first token: the gate checks that both sides sent the same prompts and cuts prompt
sets out of the passes (:func:`eagle3ops.gate.decide.ratio_interval`, :func:`eagle3ops.gate.decide.set_tables`).

Foreign traffic: a monitor thread scrapes ``/metrics`` while the level runs; ``vllm:num_requests_running`` above
the replay's own in-flight count means someone else's requests shared the server, and the level is marked
``foreign_requests`` so the gate waits or refuses to decide instead of deciding on skewed figures. Before a level
starts the server must be idle (bounded wait).

HTTP through ``httpx`` (sync client, one per worker thread).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields

import httpx

from eagle3ops.gate.metrics import SpecCounters, parse

__all__ = ["LevelResult", "ReplayError", "replay_level", "wait_idle"]


class ReplayError(RuntimeError):
    """The server could not be measured (not idle in time, requests failing); the message says which."""


@dataclass(frozen=True)
class LevelResult:
    """Figures of one concurrency level. Times in seconds unless the name says ms."""

    concurrency: int
    requests: int
    errors: int
    output_tokens: int
    wall_s: float
    output_tokens_per_s: float
    itl_ms_median: float | None
    itl_ms_p90: float | None
    ttft_ms_median: float | None
    foreign_requests: float  # most requests running beyond the replay's own in-flight ones, seen by the monitor
    #: per prompt, in the prompts' order: output tokens, request seconds (sent to last token; None: failed), time
    #: to first token in ms (None: failed or no token)
    prompt_tokens: tuple[int, ...] | list[int] = ()
    prompt_seconds: tuple[float | None, ...] | list[float | None] = ()
    prompt_ttft_ms: tuple[float | None, ...] | list[float | None] = ()

    def figures(self) -> dict[str, object]:
        """JSON-ready dict (per-prompt figures as lists)."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def wait_idle(base_url: str, timeout_s: float = 120.0, api_key: str | None = None, settle_s: float = 1.0) -> None:
    """Wait until the server is idle, at most ``timeout_s`` seconds.

    Idle means two ``/metrics`` scrapes ``settle_s`` seconds apart both show ``vllm:num_requests_running`` and
    ``vllm:num_requests_waiting`` at 0 and ``vllm:generation_tokens_total`` unchanged: one scrape of the running
    gauge alone reads 0 in the gap between another client's back-to-back requests.

    Raises:
        ReplayError: still busy (someone else's traffic) or unreachable at the deadline.
    """
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    prev: SpecCounters | None = None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{base_url}/metrics", headers=_headers(api_key), timeout=10)
            now = parse(r.text)
            busy = (now.requests_running or 0.0) + (now.requests_waiting or 0.0)
            if busy:
                last, prev = f"{busy:g} requests running or waiting", None
            elif prev is not None and prev.generation_tokens == now.generation_tokens:
                return
            else:
                if prev is not None:
                    last = "tokens generated between two scrapes"
                prev = now
        except httpx.HTTPError as e:
            last, prev = f"{type(e).__name__}: {e}", None
        time.sleep(settle_s)
    raise ReplayError(f"{base_url} not idle within {timeout_s:.0f} s ({last}): not measuring on a shared server")


def _one(client: httpx.Client, base_url: str, model: str, prompt: str, max_tokens: int, inflight: list[int],
         lock: threading.Lock) -> tuple[int, float | None, float | None, float]:
    """Send one streamed completion; returns (output tokens, ttft s, itl s, request s)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    with lock:
        inflight[0] += 1
    try:
        t0 = time.monotonic()
        first = last = None
        tokens = 0
        with client.stream("POST", f"{base_url}/v1/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if ev.get("choices") and ev["choices"][0].get("text"):
                    now = time.monotonic()
                    first = first or now
                    last = now
                if ev.get("usage"):
                    tokens = int(ev["usage"]["completion_tokens"])
        ttft = (first - t0) if first else None
        itl = (last - first) / (tokens - 1) if first and last and tokens > 1 else None
        return tokens, ttft, itl, (last or time.monotonic()) - t0
    finally:
        with lock:
            inflight[0] -= 1


def replay_level(base_url: str, model: str, prompts: Sequence[str], concurrency: int, *, max_tokens: int = 64,
                 api_key: str | None = None, request_timeout_s: float = 300.0, idle_timeout_s: float = 120.0,
                 on_idle: Callable[[], object] | None = None) -> LevelResult:
    """Send every prompt once with ``concurrency`` requests in flight; measure (see the module doc).

    ``api_key``: sent as ``Authorization: Bearer`` on every request, ``/metrics`` scrapes included. ``on_idle``:
    called once the server is idle, right before the first request (the gate takes its "before" counter snapshot
    there: after the idle wait, so a foreign request finishing during the wait is not counted).

    Raises:
        ReplayError: the server is not idle before the level, or every request failed.
    """
    wait_idle(base_url, idle_timeout_s, api_key)
    lock = threading.Lock()
    inflight = [0]
    foreign = [0.0]
    stop = threading.Event()

    def monitor() -> None:
        with httpx.Client(headers=_headers(api_key), timeout=10) as c:
            while not stop.wait(0.5):
                with lock:
                    own_before = inflight[0]
                try:
                    running = parse(c.get(f"{base_url}/metrics").text).requests_running or 0.0
                except (httpx.HTTPError, ValueError):
                    continue
                with lock:
                    own = max(own_before, inflight[0])
                foreign[0] = max(foreign[0], running - own)

    results: list[tuple[int, float | None, float | None, float] | None] = []
    errors = 0
    mon = threading.Thread(target=monitor, daemon=True)
    local = threading.local()

    def work(prompt: str) -> tuple[int, float | None, float | None, float]:
        if not hasattr(local, "client"):
            local.client = httpx.Client(headers=_headers(api_key), timeout=request_timeout_s)
        return _one(local.client, base_url, model, prompt, max_tokens, inflight, lock)

    if on_idle is not None:
        on_idle()
    t0 = time.monotonic()
    mon.start()
    try:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            for fut in [pool.submit(work, p) for p in prompts]:
                try:
                    results.append(fut.result())
                except (httpx.HTTPError, ValueError, KeyError):
                    results.append(None)
                    errors += 1
    finally:
        stop.set()
        mon.join(timeout=15)
    wall = time.monotonic() - t0
    done = [x for x in results if x is not None]
    if not done:
        raise ReplayError(f"all {len(prompts)} requests to {base_url} failed")
    itls = sorted(x[2] * 1000 for x in done if x[2] is not None)
    ttfts = [x[1] * 1000 for x in done if x[1] is not None]
    out = sum(x[0] for x in done)
    return LevelResult(concurrency, len(prompts), errors, out, round(wall, 3), round(out / wall, 3),
                       round(statistics.median(itls), 3) if itls else None,
                       round(itls[int(0.9 * (len(itls) - 1))], 3) if itls else None,
                       round(statistics.median(ttfts), 3) if ttfts else None, foreign[0],
                       tuple(x[0] if x else 0 for x in results),
                       tuple(round(x[3], 6) if x else None for x in results),
                       tuple(round(x[1] * 1000, 3) if x and x[1] is not None else None for x in results))
