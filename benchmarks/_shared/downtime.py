"""What the downtime benchmarks share (``cycle-downtime``, ``group-rollout``): sandbox hosts' Docker sockets forwarded
to this machine's engine, the streaming chat client that measures production as its users see it, its records
written as they are made, and the analysis of those records (outages, failures, the longest span without an answer,
each with the journal step it fell in).

A script puts this folder on ``sys.path`` (``benchmarks/_shared``) and imports it (``from downtime import ...``).

The client's rules (as a careful user measures downtime): a request fails on a connection error, a non-2xx status,
an ``error`` event, a stream without ``data: [DONE]``, no token at all, or :data:`TOKEN_TIMEOUT_S` without a token.
"""

from __future__ import annotations

import asyncio
import grp
import json
import os
import ssl
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

import httpx

#: This machine's Docker engine, where the images are.
ENGINE_SOCK = "/var/run/docker.sock"
#: A probe every 0.5 s; a request failed after 30 s without a token.
PROBE_INTERVAL_S, TOKEN_TIMEOUT_S = 0.5, 30.0
#: The concurrent client's chat turns (short answers: the probe's ``max_tokens``), in turn.
PROMPTS = ["Say hello in three words.", "Write one sentence about the sea.", "Name three colours of a rainbow.",
           "What is the capital of France? Answer in one sentence.", "Give me a short tip for sleeping well."]
#: The concurrent client's most requests at once.
MAX_IN_FLIGHT = 16


def now() -> float:
    """Seconds since the epoch (the records' clock: the journals' timestamps are wall-clock too)."""
    return time.time()


def iso(t: float) -> str:
    """``t`` (epoch seconds) as ISO 8601 UTC with milliseconds."""
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")


def parse_iso(s: str) -> float:
    """An ISO 8601 time with offset (a journal's ``t``) as epoch seconds."""
    return datetime.fromisoformat(s).timestamp()


# ---- the hosts' Docker sockets -------------------------------------------------------------------------------


class DockerProxy:
    """Unix sockets ``paths`` (mode 0660, group ``e3ops``) forwarded byte for byte to ``target`` (this machine's
    Docker engine): a sandbox host's ``docker_host`` without a second engine (three full engines do not fit this
    machine's disk). Hijacked streams (attach, exec) pass as they are. :meth:`serve` runs it in the current event
    loop (the detached proxy process); :meth:`start` in a thread of its own."""

    def __init__(self, paths: Sequence[Path], target: str = ENGINE_SOCK):
        self.paths, self.target = list(paths), target
        self.ready = threading.Event()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            try:
                w.write_eof() if w.can_write_eof() else w.close()
            except (OSError, RuntimeError):
                pass

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            er, ew = await asyncio.open_unix_connection(self.target)
        except OSError:
            cw.close()
            return
        await asyncio.gather(self._pipe(cr, ew), self._pipe(er, cw))
        for w in (cw, ew):
            w.close()

    async def _listen(self) -> None:
        gid = grp.getgrnam("e3ops").gr_gid
        for p in self.paths:
            p.unlink(missing_ok=True)
            await asyncio.start_unix_server(self._handle, path=str(p))
            os.chown(p, 0, gid)
            os.chmod(p, 0o660)
        self.ready.set()

    async def serve(self) -> None:
        """Listen on every path and forward until cancelled."""
        await self._listen()
        await asyncio.Event().wait()

    def start(self) -> None:
        """:meth:`serve` in a daemon thread; ``RuntimeError`` when the sockets are not listening within 30 s."""
        threading.Thread(target=lambda: asyncio.run(self.serve()), daemon=True, name="docker-proxy").start()
        if not self.ready.wait(30):
            raise RuntimeError("the Docker socket proxy did not start in 30 s")


def proxy_answers(sock: Path) -> bool:
    """Whether the Docker API answers ``GET /_ping`` through ``sock`` within 5 s."""
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=5) as c:
            return c.get("http://docker/_ping").is_success
    except httpx.HTTPError:
        return False


def ensure_proxy(socks: Sequence[Path], script: str, log: Path) -> str:
    """Start ``script --proxy`` detached (its own session, output appended to ``log``) unless every socket of
    ``socks`` answers already; the script's ``--proxy`` runs ``asyncio.run(DockerProxy(socks).serve())``. Detached
    because a window's supervisor reaches its engine through the socket and outlives the driver, as a host's
    dockerd would. Returns what it did; ``RuntimeError`` when the sockets do not answer within 30 s."""
    if all(proxy_answers(s) for s in socks):
        return "running already"
    with open(log, "ab") as out:
        p = subprocess.Popen([sys.executable, script, "--proxy"], stdout=out, stderr=out, start_new_session=True,
                             stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all(proxy_answers(s) for s in socks):
            return f"started, pid {p.pid}"
        time.sleep(0.3)
    raise RuntimeError("the Docker socket proxy did not answer in 30 s")


# ---- the client -------------------------------------------------------------------------------------------------


class RecordLog:
    """The client's records, kept in memory and appended to ``path`` (JSON Lines, one object a line, flushed each)
    as they are made, so that a run killed midway keeps every record it made (:func:`read_records` reads them back).
    Thread-safe. ``path`` None: memory only. A line with ``"event"`` is a marker (a drain, a phase's start), not a
    request."""

    def __init__(self, path: Path | None = None):
        self.records: list[dict[str, Any]] = []
        self.path = path
        self._lock = threading.Lock()
        self._f = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._f = path.open("a", buffering=1)

    def add(self, rec: dict[str, Any]) -> None:
        """Keep ``rec`` and append it to the file."""
        with self._lock:
            self.records.append(rec)
            if self._f is not None:
                self._f.write(json.dumps(rec) + "\n")
                self._f.flush()

    def mark(self, event: str, **fields: Any) -> None:
        """Append a marker line ``{"event": event, "t": now, ...}`` (not a request: :meth:`requests` leaves it out)."""
        self.add({"event": event, "t": now(), **fields})

    def requests(self) -> list[dict[str, Any]]:
        """The request records so far (markers left out)."""
        with self._lock:
            return [r for r in self.records if "event" not in r]

    def close(self) -> None:
        """Close the file (records stay in memory)."""
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record of a :class:`RecordLog` file, markers included; a last line cut by a kill is left out."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def chat_request(client: httpx.Client, url: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One streaming chat request (``POST {url}/v1/chat/completions``, temperature 0) judged by the module's rules;
    returns its record: ``t0``/``t1`` (epoch seconds), ``ok``, ``kind`` (why it failed), ``tokens`` (content
    deltas seen). The client's read timeout is the time allowed without a token."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    t0, tokens, done = now(), 0, False
    try:
        with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
            if not 200 <= resp.status_code < 300:
                return {"t0": t0, "t1": now(), "ok": False, "kind": f"http {resp.status_code}"}
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:].strip()
                if data == "[DONE]":
                    done = True
                    break
                ev = json.loads(data)
                if "error" in ev:
                    return {"t0": t0, "t1": now(), "ok": False, "kind": "error event", "tokens": tokens}
                if any((c.get("delta") or {}).get("content") for c in ev.get("choices") or []):
                    tokens += 1
    except httpx.ReadTimeout:
        return {"t0": t0, "t1": now(), "ok": False, "kind": f"{TOKEN_TIMEOUT_S:.0f} s without a token",
                "tokens": tokens}
    except (httpx.TransportError, ValueError) as exc:
        kind = "connection error" if isinstance(exc, (httpx.ConnectError, httpx.RemoteProtocolError,
                                                      httpx.ConnectTimeout)) else type(exc).__name__
        return {"t0": t0, "t1": now(), "ok": False, "kind": kind, "tokens": tokens}
    if not done:
        return {"t0": t0, "t1": now(), "ok": False, "kind": "stream without [DONE]", "tokens": tokens}
    if tokens == 0:
        return {"t0": t0, "t1": now(), "ok": False, "kind": "no token", "tokens": 0}
    return {"t0": t0, "t1": now(), "ok": True, "tokens": tokens}


def _timeout() -> httpx.Timeout:
    return httpx.Timeout(connect=5.0, read=TOKEN_TIMEOUT_S, write=5.0, pool=5.0)


class SerialProbe(threading.Thread):
    """The one-backend client: streaming chat requests to ``url`` one at a time, a new one every
    :data:`PROBE_INTERVAL_S` (the next starts when the last ended if that took longer). While ``drained`` is set (a
    balancer took clients off the backend) it sends no chat request and checks ``GET /health`` instead (2 s
    timeout; no token generated, so a speed gate's idle check sees no foreign request): that tells whether the
    backend answers at all. ``log``: the records (:class:`RecordLog`; a health check's has ``drained: true``);
    ``load``: (time, 1-minute load average) every 10 s."""

    def __init__(self, url: str, model: str, log: RecordLog, drained: threading.Event | None = None,
                 max_tokens: int = 4, prompt: str = PROMPTS[0]):
        super().__init__(daemon=True, name="probe")
        self.url, self.model, self.max_tokens, self.prompt = url, model, max_tokens, prompt
        self.log, self.drained = log, drained or threading.Event()
        self.load: list[tuple[float, float]] = []
        self.stop = threading.Event()

    @property
    def records(self) -> list[dict[str, Any]]:
        """The request records so far."""
        return self.log.requests()

    def health(self, client: httpx.Client) -> dict[str, Any]:
        """One ``GET /health`` (2 s) as a record with ``drained: true``."""
        t0 = now()
        try:
            ok = client.get(f"{self.url}/health", timeout=2.0).status_code == 200
            return {"t0": t0, "t1": now(), "ok": ok, "kind": None if ok else "health non-200", "drained": True}
        except httpx.HTTPError:
            return {"t0": t0, "t1": now(), "ok": False, "kind": "health: connection error", "drained": True}

    def run(self) -> None:
        last_load = 0.0
        with httpx.Client(timeout=_timeout()) as client:
            while not self.stop.is_set():
                rec = (self.health(client) if self.drained.is_set()
                       else chat_request(client, self.url, self.model, self.prompt, self.max_tokens))
                self.log.add(rec)
                if rec["t1"] - last_load >= 10:
                    self.load.append((rec["t1"], os.getloadavg()[0]))
                    last_load = rec["t1"]
                self.stop.wait(max(0.0, rec["t0"] + PROBE_INTERVAL_S - now()))


#: The probes' one TLS context (:meth:`ConcurrentProbe._one_recorded`).
_TLS = ssl.create_default_context()


class ConcurrentProbe(threading.Thread):
    """The balanced client: a streaming chat request to ``url`` started every :data:`PROBE_INTERVAL_S` on a thread
    and connection of its own (so that the span without an answer measures whether the group answers, not how long
    one answer takes; a kept-alive connection would stay on one server), at most ``max_in_flight`` at once (a start
    skipped beyond that is counted: ``skipped``), the prompts of ``prompts`` in turn. ``log``: the records
    (:class:`RecordLog`; memory only when not given); ``load``: (time, 1-minute load average) every 10 s."""

    def __init__(self, url: str, model: str, max_tokens: int, log: RecordLog | None = None,
                 prompts: Sequence[str] = PROMPTS, max_in_flight: int = MAX_IN_FLIGHT):
        super().__init__(daemon=True, name="probe")
        self.url, self.model, self.max_tokens = url, model, max_tokens
        self.prompts, self.max_in_flight = list(prompts), max_in_flight
        self.log = log or RecordLog()
        self.load: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.in_flight: list[threading.Thread] = []
        self.skipped = 0

    @property
    def records(self) -> list[dict[str, Any]]:
        """The request records so far."""
        return self.log.requests()

    def _one_recorded(self, prompt: str) -> None:
        # one TLS context for every request (unused on http://, but httpx builds one per client: ~20 ms of CPU each,
        # taken from the serving it measures on a small machine)
        with httpx.Client(timeout=_timeout(), limits=httpx.Limits(max_keepalive_connections=0),
                          verify=_TLS) as client:
            self.log.add(chat_request(client, self.url, self.model, prompt, self.max_tokens))

    def run(self) -> None:
        last_load, n = 0.0, 0
        while not self.stop.is_set():
            t0 = now()
            with self.lock:
                self.in_flight = [t for t in self.in_flight if t.is_alive()]
                busy = len(self.in_flight) >= self.max_in_flight
            if busy:  # never more than max_in_flight at once: counted, a figure of its own
                self.skipped += 1
            else:
                t = threading.Thread(target=self._one_recorded, args=(self.prompts[n % len(self.prompts)],),
                                     daemon=True)
                t.start()
                with self.lock:
                    self.in_flight.append(t)
                n += 1
            if t0 - last_load >= 10:
                self.load.append((t0, os.getloadavg()[0]))
                last_load = t0
            self.stop.wait(max(0.0, t0 + PROBE_INTERVAL_S - now()))
        for t in list(self.in_flight):
            t.join(TOKEN_TIMEOUT_S + 10)


def load_figures(load: Sequence[tuple[float, float]]) -> dict[str, Any]:
    """The 1-minute load average samples summarised (``samples``, ``mean``, ``max``)."""
    ld = [x for _, x in load]
    return {"samples": len(ld), "mean": round(sum(ld) / len(ld), 2) if ld else None, "max": max(ld) if ld else None,
            "note": "this machine's 2 cores are shared with other sessions' work"}


# ---- the analysis ---------------------------------------------------------------------------------------------


#: The journal events that end a step (the cycle's and the group's journals); others (``child``: a step's child
#: process started) fall inside it.
CLOSING_EVENTS = frozenset({"done", "failed", "ended", "busy"})


def journal_spans(entries: Sequence[dict[str, Any]], end: float,
                  closing: Callable[[dict[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
    """Steps of a journal (``{"step", "event", "t"}`` entries; ``event == "start"`` opens a step, an entry for which
    ``closing`` holds closes it: by default one whose event is in :data:`CLOSING_EVENTS`) as ``{"name", "from",
    "to"}`` (epoch seconds); a step still open ends at ``end``. The journals' times are whole seconds: each span is
    widened by one on both sides so that an outage at a step's edge counts there."""
    spans, open_ = [], {}
    for e in entries:
        step = e.get("step")
        if e.get("event") == "start":
            open_[step] = parse_iso(e["t"])
        elif step in open_ and (closing(e) if closing else e.get("event") in CLOSING_EVENTS):
            spans.append({"name": step, "from": open_.pop(step) - 1, "to": parse_iso(e["t"]) + 1})
    for k, t0 in open_.items():
        spans.append({"name": k, "from": t0 - 1, "to": end})
    return spans


def span_of(spans: Sequence[dict[str, Any]], t: float) -> str | None:
    """The name of the last span holding ``t`` (None: none)."""
    inside = [s["name"] for s in spans if s["from"] <= t <= s["to"]]
    return inside[-1] if inside else None


def outages(records: Sequence[dict[str, Any]], start: float, end: float) -> list[dict[str, Any]]:
    """Runs of failed probes in ``[start, end]`` (records ordered by start): each from the first failed probe's
    start to the next successful probe's start (or ``end``), with ``failed`` (count), ``failed_chat`` (those that
    were chat requests, not a drained health check) and ``kinds``."""
    out, cur = [], None
    for r in sorted((r for r in records if start <= r["t0"] <= end), key=lambda r: r["t0"]):
        if not r["ok"]:
            if cur is None:
                cur = {"from": r["t0"], "failed": 0, "failed_chat": 0, "kinds": set()}
            cur["failed"] += 1
            cur["failed_chat"] += 0 if r.get("drained") else 1
            cur["kinds"].add(r["kind"])
        elif cur is not None:
            cur["to"] = r["t0"]
            out.append(cur)
            cur = None
    if cur is not None:
        cur["to"] = end
        out.append(cur)
    return out


def analyse_outages(records: Sequence[dict[str, Any]], start: float, end: float, spans: Sequence[dict[str, Any]],
                    drained: Sequence[tuple[float, float]]) -> dict[str, Any]:
    """The one-backend client's view of ``[start, end]`` (:class:`SerialProbe`'s records): failed chat requests by
    kind, the longest span without a successful chat answer (between the ends of successful requests; the phase's
    edges count; drained time counts: no client got an answer from production then), outages (:func:`outages` of
    every probe, chat or the drained health check) each with the span (step) it began in and whether it fell in a
    drain, production's seconds not answering (their sum), and the seconds drained (``drained``: (from, to))."""
    rs = [r for r in records if start <= r["t0"] <= end]
    ok_ends = [start] + sorted(r["t1"] for r in rs if r["ok"] and not r.get("drained")) + [end]
    longest = max(b - a for a, b in zip(ok_ends, ok_ends[1:]))
    kinds: dict[str, int] = {}
    for r in rs:
        if not r["ok"] and not r.get("drained"):
            kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    drains = [(max(a, start), min(b, end)) for a, b in drained if b >= start and a <= end]
    out = [{"from": iso(o["from"]), "seconds": round(o["to"] - o["from"], 2), "failed_probes": o["failed"],
            "failed_chat_requests": o["failed_chat"], "kinds": sorted(o["kinds"]), "during": span_of(spans, o["from"]),
            "drained": any(a <= o["from"] <= b for a, b in drains)} for o in outages(rs, start, end)]
    lat = sorted(r["t1"] - r["t0"] for r in rs if r["ok"] and not r.get("drained"))
    chat = [r for r in rs if not r.get("drained")]
    return {"from": iso(start), "to": iso(end), "wall_s": round(end - start, 1), "chat_requests": len(chat),
            "answered": sum(1 for r in chat if r["ok"]), "failed_requests": sum(kinds.values()),
            "failed_by_kind": kinds, "longest_span_without_answer_s": round(longest, 2),
            "drained_s": round(sum(b - a for a, b in drains), 1),
            "drains": [{"from": iso(a), "seconds": round(b - a, 1), "during": span_of(spans, a)} for a, b in drains],
            "health_checks_while_drained": sum(1 for r in rs if r.get("drained")),
            "seconds_not_answering": round(sum(o["seconds"] for o in out), 2), "outages": out,
            "answer_seconds_median": round(lat[len(lat) // 2], 3) if lat else None,
            "answer_seconds_max": round(lat[-1], 3) if lat else None,
            "spans": [{"name": s["name"], "from": iso(s["from"]), "seconds": round(s["to"] - s["from"], 1)}
                      for s in spans]}


def analyse_failures(records: Sequence[dict[str, Any]], start: float, end: float, spans: Sequence[dict[str, Any]]
                     ) -> dict[str, Any]:
    """The balanced client's view of ``[start, end]`` (:class:`ConcurrentProbe`'s records): requests, failed by
    kind, each failure with the step it fell in (the first 50), the longest span without a successful answer
    (between the ends of successful requests; the phase's edges count), answer seconds (median, p99, max)."""
    rs = sorted((r for r in list(records) if start <= r["t0"] <= end), key=lambda r: r["t0"])
    ok_ends = [start] + sorted(min(r["t1"], end) for r in rs if r["ok"]) + [end]
    gaps = [(b - a, a) for a, b in zip(ok_ends, ok_ends[1:])]
    longest, at = max(gaps)
    kinds: dict[str, int] = {}
    for r in rs:
        if not r["ok"]:
            kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    lat = sorted(r["t1"] - r["t0"] for r in rs if r["ok"])
    return {"from": iso(start), "to": iso(end), "wall_s": round(end - start, 1), "requests": len(rs),
            "answered": sum(1 for r in rs if r["ok"]), "failed_requests": sum(kinds.values()),
            "failed_by_kind": kinds,
            "failures": [{"at": iso(r["t0"]), "kind": r["kind"], "during": span_of(spans, r["t0"])} for r in rs
                         if not r["ok"]][:50],
            "longest_span_without_answer_s": round(longest, 2),
            "note": "a request is started every 0.5 s, each on its own connection; the span is between the ends of "
                    "two successful answers",
            "longest_span_at": {"from": iso(at), "during": span_of(spans, at)},
            "spans_over_1s_without_answer": sum(1 for g, _ in gaps if g > 1.0),
            "answer_seconds_median": round(lat[len(lat) // 2], 3) if lat else None,
            "answer_seconds_p99": round(lat[int(len(lat) * 0.99)], 3) if lat else None,
            "answer_seconds_max": round(lat[-1], 3) if lat else None,
            "steps": [{"name": s["name"], "from": iso(s["from"]), "seconds": round(s["to"] - s["from"], 1)}
                      for s in spans]}
