"""The downtime benchmarks' shared client records and analysis (``benchmarks/_shared/downtime.py``).

Pure: records made up here and one real streaming client against a real local HTTP server of the test (no vLLM).
"""

from __future__ import annotations

import json
import sys
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "_shared"))
from downtime import (RecordLog, analyse_outages, chat_request, journal_spans, outages,  # noqa: E402
                      read_records)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def test_records_are_on_disk_as_they_are_made_and_a_cut_last_line_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "x.records.jsonl"
    log = RecordLog(path)
    log.add({"t0": 1.0, "t1": 1.2, "ok": True, "tokens": 4})
    log.mark("drain")
    # read while the log is still open: a killed run keeps what was written so far
    got = read_records(path)
    assert [r.get("ok") for r in got] == [True, None] and got[1]["event"] == "drain"
    with path.open("a") as f:
        f.write('{"t0": 3.0, "t1"')  # a line cut by a kill
    assert len(read_records(path)) == 2
    assert log.requests() == [{"t0": 1.0, "t1": 1.2, "ok": True, "tokens": 4}]
    log.close()


def test_outages_run_from_the_first_failure_to_the_next_success_and_name_their_step_and_drain() -> None:
    base = 1_800_000_000.0
    ok = lambda t: {"t0": base + t, "t1": base + t + 0.2, "ok": True, "tokens": 4}  # noqa: E731
    bad = lambda t, k="connection error", **kw: {"t0": base + t, "t1": base + t + 0.1, "ok": False,  # noqa: E731
                                                  "kind": k, **kw}
    records = [ok(0), ok(1), bad(2), bad(3), ok(4),  # 2 s down in "extract window", clients get errors
               {**ok(10), "drained": True}, bad(11, "health: connection error", drained=True),
               bad(12, "health: connection error", drained=True), {**ok(15), "drained": True}, ok(20)]
    spans = journal_spans([{"step": "extract", "event": "start", "t": _iso(base + 1)},
                           {"step": "extract", "event": "child", "t": _iso(base + 1)},  # inside the step
                           {"step": "extract", "event": "done", "t": _iso(base + 5)},
                           {"step": "speculate", "event": "start", "t": _iso(base + 9)}], end=base + 21)
    assert [s["name"] for s in spans] == ["extract", "speculate"] and spans[1]["to"] == base + 21
    got = outages(records, base, base + 21)
    assert [(o["from"] - base, o["to"] - base, o["failed"], o["failed_chat"]) for o in got] == [
        (2, 4, 2, 2), (11, 15, 2, 0)]
    a = analyse_outages(records, base, base + 21, spans, drained=[(base + 9.5, base + 16)])
    assert a["seconds_not_answering"] == 6.0
    assert [(o["during"], o["drained"]) for o in a["outages"]] == [("extract", False), ("speculate", True)]
    assert a["failed_requests"] == 2 and a["failed_by_kind"] == {"connection error": 2}  # health checks are no chat
    assert a["drained_s"] == 6.5 and a["health_checks_while_drained"] == 4
    # longest span without a chat answer: from the answer ending at 4.2 to the one ending at 20.2 (drained counts)
    assert a["longest_span_without_answer_s"] == 16.0


def test_a_stream_without_done_fails_and_a_whole_one_answers() -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n')
            if body["messages"][0]["content"] == "whole":
                self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        with httpx.Client(timeout=5) as c:
            whole = chat_request(c, url, "m", "whole", 4)
            cut = chat_request(c, url, "m", "cut", 4)
    finally:
        srv.shutdown()
    assert whole["ok"] and whole["tokens"] == 1
    assert not cut["ok"] and cut["kind"] == "stream without [DONE]"
