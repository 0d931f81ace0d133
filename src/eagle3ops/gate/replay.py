"""Replay a fixed prompt set at a given concurrency against an OpenAI-compatible server (vLLM), measuring it.

Each level sends every prompt once (:func:`request_body`): a plain prompt through ``/v1/completions`` with
``stream: true``, greedy (``temperature 0``), ``max_tokens`` fixed and ``ignore_eos: true`` (a vLLM sampling
extension), so both sides of a comparison generate exactly the same number of tokens for the same prompts; a chat
body (``messages`` with e.g. ``tools`` or ``response_format``, as production clients send them) through
``/v1/chat/completions`` as given, the same settings on top, except ``ignore_eos`` on a body with ``tools`` or
``response_format``: there the grammar backend or the tool parser decides where the answer ends, as in production
(forcing generation past the end of a grammar's language is traffic no client sends). Greedy decoding makes both
sides' answers the same up to numerics, so their lengths match too. Per request: time to first token (the first
chunk carrying text, content, reasoning or a tool-call piece) and inter-token latency
``(t_last - t_first) / (n_tokens - 1)`` (a streamed chunk may carry several tokens under speculation, so the
latency is taken over the whole stream, not per chunk); per level: output tokens/s = Σ output tokens / wall time,
ITL and TTFT median and p90 (the nearest-rank value at 90 % of the sorted figures, rank rounded down).
Per prompt, in the prompts' own (fixed) order whatever the order of completion: output tokens, request seconds
(sent to last token) and time to first token: the gate checks that both sides sent the same prompts and cuts prompt
sets out of the passes (:func:`eagle3ops.gate.decide.ratio_interval`, :func:`eagle3ops.gate.decide.set_tables`).

Per prompt too, the answer itself (:func:`answer_text`): its SHA-256 (``answer_sha256``) and its first
:data:`ANSWER_HEAD_CHARS` characters (``answer_head``; None for a failed request), so that the gate can say how many
greedy answers the two releases share (:func:`eagle3ops.gate.answers.answer_agreement`): a release may be fast
because it answers garbage, and throughput alone never sees it.

A request fails (:class:`RequestFailed`; the level's ``errors`` and ``failures`` name it) on a non-2xx answer, an
error event in the stream (vLLM streams ``data: {"error": {...}}`` when generation fails), a stream that ends before
``data: [DONE]`` (the server closed it: it died), a transport error or timeout, or a grammar failure: a
``response_format`` ``json_object``/``json_schema`` answer, or a tool call's arguments, that is not JSON although
the answer ended on its own (``finish_reason`` other than ``length``). Every request failing, or the server no longer
answering, raises :class:`ReleaseFailed`.

Foreign traffic: a monitor thread scrapes ``/metrics`` while the level runs; ``vllm:num_requests_running`` above
the replay's own in-flight count means someone else's requests shared the server, and the level is marked
``foreign_requests`` (the most seen at once; ``foreign_mean``: their mean over the scrapes) so the gate waits or
refuses to decide instead of deciding on skewed figures. Before a level starts the server must be idle (bounded
wait), except with ``live`` (``serving.gate_traffic: live``): the level is measured beside the clients' traffic,
which is recorded the same way but not waited for (:func:`eagle3ops.gate.decide.decide` decides on it).

HTTP through ``httpx`` (sync client, one per worker thread).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Any

import httpx

from eagle3ops.gate.metrics import SpecCounters, parse
from eagle3ops.serving_http import auth_headers

__all__ = ["ANSWER_HEAD_CHARS", "CHAT", "COMPLETIONS", "LevelResult", "ReleaseFailed", "ReplayError",
           "RequestFailed", "answer_text", "endpoints", "percentile", "replay_level", "request_body", "summary",
           "wait_idle"]

#: The endpoints the replay sends to: plain prompts, chat bodies.
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
#: How many leading characters of each answer a level keeps beside its digest: enough to tell garbage from a
#: late one-token difference when reading a result, short enough that a pass's figures stay small. The answers
#: are the served model's to the operator's own gate prompts, which the job already carries in full.
ANSWER_HEAD_CHARS = 80


class ReplayError(RuntimeError):
    """The server could not be measured (not idle in time, requests failing); the message says which."""


class ReleaseFailed(ReplayError):
    """The measured release failed the gate's traffic: every request of a level failed, or the server stopped
    answering (``/metrics`` unreachable after a level whose requests failed, or throughout an idle wait). The
    message names the endpoint and the failures; ``failures`` holds ``(prompt index, why)`` of the level at
    ``concurrency`` (None: not known)."""

    def __init__(self, message: str, failures: Sequence[tuple[int, str]] = (), concurrency: int | None = None):
        super().__init__(message)
        self.failures = list(failures)
        self.concurrency = concurrency


class RequestFailed(Exception):
    """One request failed; the message says how, naming the endpoint (see the module doc)."""


def request_body(model: str, prompt: str | Mapping[str, Any], max_tokens: int) -> tuple[str, dict[str, Any]]:
    """``(endpoint path, JSON body)`` of one gate request (see the module doc).

    A string goes to :data:`COMPLETIONS` with ``model``, ``max_tokens``, ``temperature 0``, ``ignore_eos``,
    ``stream`` and ``stream_options.include_usage`` (the gate's settings, unchanged since the gate's first
    benchmarks). A mapping is a chat body sent to :data:`CHAT` as given, with ``model``, ``max_tokens`` (a given
    ``max_completion_tokens`` dropped: vLLM would take it over ``max_tokens``), ``temperature 0``, ``stream`` and
    ``stream_options`` set on top, and ``ignore_eos`` only when it has neither ``tools`` nor ``response_format``.
    """
    if isinstance(prompt, str):
        return COMPLETIONS, {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                             "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    body = {k: v for k, v in prompt.items() if k != "max_completion_tokens"}
    body.update(model=model, max_tokens=max_tokens, temperature=0.0, stream=True,
                stream_options={"include_usage": True})
    if not _constrained(prompt):
        body["ignore_eos"] = True
    return CHAT, body


def _constrained(prompt: Mapping[str, Any]) -> bool:
    """A chat body whose answer's end a tool parser or grammar backend decides."""
    return bool(prompt.get("tools")) or prompt.get("response_format") is not None


def endpoints(prompts: Sequence[str | Mapping[str, Any]]) -> dict[str, int]:
    """Endpoint path -> how many of ``prompts`` go to it (those with at least one)."""
    out: dict[str, int] = {}
    for p in prompts:
        path = COMPLETIONS if isinstance(p, str) else CHAT
        out[path] = out.get(path, 0) + 1
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank value at ``q`` (0..1) of ``values`` (rank ``int(q * (n - 1))`` of the sorted values, the
    replay's ITL p90 rule); None when empty."""
    v = sorted(values)
    return v[int(q * (len(v) - 1))] if v else None


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
    #: time to first token p90 (ms; :func:`percentile`), None when no request produced a token
    ttft_ms_p90: float | None = None
    #: the failed requests: (prompt index, why), in the prompts' order
    failures: tuple[tuple[int, str], ...] | list = ()
    #: mean requests running beyond the replay's own over the monitor's scrapes (0.0: none seen, or not scraped)
    foreign_mean: float = 0.0
    #: per prompt, in the prompts' order: SHA-256 (hex) of the answer's :func:`answer_text`, and its first
    #: :data:`ANSWER_HEAD_CHARS` characters (None: failed; both empty in figures recorded before answers were kept)
    answer_sha256: tuple[str | None, ...] | list[str | None] = ()
    answer_head: tuple[str | None, ...] | list[str | None] = ()

    def figures(self, answers: bool = True) -> dict[str, object]:
        """JSON-ready dict (per-prompt figures as lists); ``answers=False`` leaves out ``answer_sha256`` and
        ``answer_head`` (a report row that carries the agreement's summary instead)."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)
                if answers or not f.name.startswith("answer_")}


def wait_idle(base_url: str, timeout_s: float = 120.0, api_key: str | None = None, settle_s: float = 1.0) -> None:
    """Wait until the server is idle, at most ``timeout_s`` seconds.

    Idle means two ``/metrics`` scrapes ``settle_s`` seconds apart both show ``vllm:num_requests_running`` and
    ``vllm:num_requests_waiting`` at 0 and ``vllm:generation_tokens_total`` unchanged: one scrape of the running
    gauge alone reads 0 in the gap between another client's back-to-back requests.

    Raises:
        ReplayError: still busy (someone else's traffic) at the deadline, or answering with errors.
        ReleaseFailed: no scrape got through at all (the server is down).
    """
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    answered = False
    prev: SpecCounters | None = None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{base_url}/metrics", headers=auth_headers(api_key), timeout=10)
            answered = True
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
    if not answered:
        raise ReleaseFailed(f"{base_url} did not answer /metrics for {timeout_s:.0f} s ({last}): the server is down")
    raise ReplayError(f"{base_url} not idle within {timeout_s:.0f} s ({last}): not measuring on a shared server")


def _check_json(what: str, text: str, path: str) -> None:
    try:
        json.loads(text)
    except ValueError:
        raise RequestFailed(f"grammar failure on {path}: {what} is not JSON although the answer ended on its own "
                            f"({text[:80]!r})") from None


def answer_text(content: str, reasoning: str = "", calls: Mapping[int, tuple[str, str]] | None = None) -> str:
    """The answer a level digests and compares: a completion's text, or a chat answer's content, joined from the
    streamed pieces. A chat answer that also streamed reasoning or tool calls is the compact JSON
    ``{"content", "reasoning", "tool_calls": [{"name", "arguments"}, ...]}`` (keys sorted, calls by index, not
    ASCII-escaped), so that an answer differing only in a tool call's arguments differs here too.

    Text, not token ids: the streamed chunks carry text (token ids only with a vLLM request extension the gate does
    not send, as production's clients do not), and the joined text is the same however a release splits it into
    chunks (under speculation one chunk carries several tokens). Two id sequences that decode to the same text
    compare equal; for a report of whether the answers changed, that is the difference that matters to a client."""
    if not reasoning and not calls:
        return content
    return json.dumps({"content": content, "reasoning": reasoning,
                       "tool_calls": [{"name": n, "arguments": a} for _, (n, a) in sorted((calls or {}).items())]},
                      sort_keys=True, ensure_ascii=False, separators=(",", ":"))


@dataclass
class _Streamed:
    """What one request's stream carried: ``first``/``last`` (monotonic seconds of the first and last chunk with
    text, content, reasoning or a tool-call piece; None without one), ``tokens`` (the usage's completion tokens),
    ``done`` (``data: [DONE]`` seen), ``finish`` (the last finish reason), ``content`` (a completion's text or a chat
    answer's content pieces), ``reasoning`` (a chat answer's reasoning pieces), ``calls`` and ``names`` (each tool
    call's argument pieces and name pieces by index)."""

    first: float | None = None
    last: float | None = None
    tokens: int = 0
    done: bool = False
    finish: str | None = None
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, list[str]] = field(default_factory=dict)
    names: dict[int, list[str]] = field(default_factory=dict)

    def take(self, ev: Mapping[str, Any], chat: bool) -> None:
        """One ``data:`` event of the stream (a completions or chat completions chunk), timed on arrival."""
        choice = (ev.get("choices") or [{}])[0]
        if chat:
            delta = choice.get("delta") or {}
            got = any(delta.get(k) for k in ("content", "reasoning_content", "reasoning", "tool_calls"))
            self.content.append(delta.get("content") or "")
            # vLLM 0.16 streams reasoning_content; later versions name it reasoning (one of the two per chunk)
            self.reasoning.append(delta.get("reasoning_content") or delta.get("reasoning") or "")
            for tc in delta.get("tool_calls") or []:
                i, fn = int(tc.get("index", 0)), tc.get("function") or {}
                self.calls.setdefault(i, []).append(fn.get("arguments") or "")
                self.names.setdefault(i, []).append(fn.get("name") or "")
        else:
            got = bool(choice.get("text"))
            self.content.append(choice.get("text") or "")
        self.finish = choice.get("finish_reason") or self.finish
        if got:
            now = time.monotonic()
            self.first = self.first or now
            self.last = now
        if ev.get("usage"):
            self.tokens = int(ev["usage"]["completion_tokens"])

    def answer(self) -> str:
        """The stream's :func:`answer_text`."""
        return answer_text("".join(self.content), "".join(self.reasoning),
                           {i: ("".join(self.names.get(i, [])), "".join(parts)) for i, parts in self.calls.items()})


def _read_stream(client: httpx.Client, url: str, path: str, body: Mapping[str, Any]) -> _Streamed:
    """POST ``body`` to ``url`` and read its server-sent events to the end.

    Raises:
        RequestFailed: a non-2xx answer, an error event, a transport error or timeout, a data line that is not
            JSON, or a stream that ended before ``data: [DONE]``.
    """
    got = _Streamed()
    try:
        with client.stream("POST", url, json=body) as r:
            if not r.is_success:
                r.read()
                raise RequestFailed(f"HTTP {r.status_code} from {path}: {r.text.strip()[:200]}")
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    got.done = True
                    continue
                if not line.startswith("data: "):
                    continue
                ev = json.loads(line[6:])
                if ev.get("error"):
                    err = ev["error"]
                    raise RequestFailed(f"stream error from {path}: "
                                        f"{(err.get('message') if isinstance(err, dict) else err)}"[:300])
                got.take(ev, path == CHAT)
    except httpx.HTTPError as e:
        raise RequestFailed(f"{type(e).__name__} from {path}: {e}"[:300]) from None
    except ValueError as e:  # a data line that is not JSON
        raise RequestFailed(f"unreadable stream from {path}: {e}"[:300]) from None
    if not got.done:
        raise RequestFailed(f"the stream from {path} ended before data: [DONE] (the server closed it)")
    return got


def _check_structured(prompt: str | Mapping[str, Any], got: _Streamed, path: str) -> None:
    """A chat answer that ended on its own (finish reason other than ``length``): its ``response_format``
    ``json_object``/``json_schema`` content, and each tool call's arguments, must be JSON.

    Raises:
        RequestFailed: a grammar failure, naming what is not JSON.
    """
    if got.finish in (None, "length"):
        return
    rf = (prompt.get("response_format") or {}) if isinstance(prompt, Mapping) else {}
    if rf.get("type") in ("json_object", "json_schema") and not got.calls:
        _check_json("the response_format answer", "".join(got.content), path)
    for i, parts in sorted(got.calls.items()):
        _check_json(f"tool call {i}'s arguments", "".join(parts), path)


#: One request's figures: (output tokens, ttft s, itl s, request s, answer SHA-256 hex, answer's first characters).
_Figures = tuple[int, float | None, float | None, float, str, str]


def _one(client: httpx.Client, base_url: str, model: str, prompt: str | Mapping[str, Any], max_tokens: int,
         inflight: list[int], lock: threading.Lock) -> _Figures:
    """Send one streamed request (:func:`request_body`); returns (output tokens, ttft s, itl s, request s, the
    SHA-256 hex of its :func:`answer_text`, that text's first :data:`ANSWER_HEAD_CHARS` characters).

    Raises:
        RequestFailed: the module doc's failures, naming the endpoint.
    """
    path, body = request_body(model, prompt, max_tokens)
    with lock:
        inflight[0] += 1
    try:
        t0 = time.monotonic()
        got = _read_stream(client, f"{base_url}{path}", path, body)
        if path == CHAT:
            _check_structured(prompt, got, path)
        first, last, tokens = got.first, got.last, got.tokens
        ttft = (first - t0) if first else None
        itl = (last - first) / (tokens - 1) if first and last and tokens > 1 else None
        text = got.answer()
        return (tokens, ttft, itl, (last or time.monotonic()) - t0, hashlib.sha256(text.encode()).hexdigest(),
                text[:ANSWER_HEAD_CHARS])
    finally:
        with lock:
            inflight[0] -= 1


def replay_level(base_url: str, model: str, prompts: Sequence[str | Mapping[str, Any]], concurrency: int, *,
                 max_tokens: int = 64,
                 api_key: str | None = None, request_timeout_s: float = 300.0, idle_timeout_s: float = 120.0,
                 on_idle: Callable[[], object] | None = None, live: bool = False) -> LevelResult:
    """Send every prompt once with ``concurrency`` requests in flight; measure (see the module doc).

    ``prompts``: strings (plain prompts) and chat bodies, :func:`request_body`. ``api_key``: sent as
    ``Authorization: Bearer`` on every request, ``/metrics`` scrapes included. ``on_idle``: called once the server is
    idle, right before the first request (the gate takes its "before" counter snapshot there: after the idle wait,
    so a foreign request finishing during the wait is not counted). ``live``: no idle wait (the server carries its
    clients' traffic; the monitor records it as ``foreign_requests`` / ``foreign_mean``).

    Raises:
        ReplayError: the server is not idle before the level (not with ``live``).
        ReleaseFailed: every request failed, or the server did not answer the idle wait at all.
    """
    if not live:
        wait_idle(base_url, idle_timeout_s, api_key)
    lock = threading.Lock()
    inflight = [0]
    foreign = [0.0]
    seen: list[float] = []  # foreign requests per scrape, for their mean
    stop = threading.Event()

    def monitor() -> None:
        with httpx.Client(headers=auth_headers(api_key), timeout=10) as c:
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
                seen.append(max(0.0, running - own))

    results: list[_Figures | None] = []
    failures: list[tuple[int, str]] = []
    mon = threading.Thread(target=monitor, daemon=True)
    local = threading.local()

    def work(prompt: str | Mapping[str, Any]) -> _Figures:
        if not hasattr(local, "client"):
            local.client = httpx.Client(headers=auth_headers(api_key), timeout=request_timeout_s)
        return _one(local.client, base_url, model, prompt, max_tokens, inflight, lock)

    if on_idle is not None:
        on_idle()
    t0 = time.monotonic()
    mon.start()
    try:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            for i, fut in enumerate([pool.submit(work, p) for p in prompts]):
                try:
                    results.append(fut.result())
                except (RequestFailed, httpx.HTTPError, ValueError, KeyError) as e:
                    results.append(None)
                    failures.append((i, str(e) if isinstance(e, RequestFailed) else f"{type(e).__name__}: {e}"))
    finally:
        stop.set()
        mon.join(timeout=15)
    wall = time.monotonic() - t0
    if not any(x is not None for x in results):
        raise ReleaseFailed(f"all {len(prompts)} requests to {base_url} failed: {summary(failures)}", failures,
                            concurrency)
    return _level_result(concurrency, results, failures, wall, foreign[0], seen)


def _level_result(concurrency: int, results: Sequence[_Figures | None], failures: Sequence[tuple[int, str]],
                  wall: float, foreign: float, seen: Sequence[float]) -> LevelResult:
    """A level's figures from its requests' :func:`_one` figures (None: failed, in the prompts' order), its wall
    seconds and the monitor's foreign requests (the most at once; ``seen``: per scrape)."""
    done = [x for x in results if x is not None]
    errors = len(results) - len(done)
    itls = sorted(x[2] * 1000 for x in done if x[2] is not None)
    ttfts = [x[1] * 1000 for x in done if x[1] is not None]
    p90 = percentile(ttfts, 0.9)
    out = sum(x[0] for x in done)
    return LevelResult(concurrency, len(results), errors, out, round(wall, 3), round(out / wall, 3),
                       round(statistics.median(itls), 3) if itls else None,
                       round(itls[int(0.9 * (len(itls) - 1))], 3) if itls else None,
                       round(statistics.median(ttfts), 3) if ttfts else None, foreign,
                       tuple(x[0] if x else 0 for x in results),
                       tuple(round(x[3], 6) if x else None for x in results),
                       tuple(round(x[1] * 1000, 3) if x and x[1] is not None else None for x in results),
                       round(p90, 3) if p90 is not None else None, tuple(failures),
                       round(statistics.fmean(seen), 4) if seen else 0.0,
                       tuple(x[4] if x else None for x in results), tuple(x[5] if x else None for x in results))


def summary(failures: Sequence[tuple[int, str] | Sequence[Any]], most: int = 3) -> str:
    """One line naming up to ``most`` distinct failures (``why (prompt i, j)``) and how many more."""
    by: dict[str, list[int]] = {}
    for i, why in failures:
        by.setdefault(str(why), []).append(int(i))
    parts = [f"{why} (prompt {', '.join(map(str, ix[:5]))}{' ...' if len(ix) > 5 else ''})"
             for why, ix in list(by.items())[:most]]
    more = len(by) - most
    return "; ".join(parts) + (f"; {more} other failure(s)" if more > 0 else "")
