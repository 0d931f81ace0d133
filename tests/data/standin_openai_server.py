"""STAND-IN for vLLM run as a plain process (serving kind ``process`` tests): a tiny OpenAI-compatible HTTP server.

NOT vLLM: the base image's vLLM virtualenv (8.1 GB, /opt/venv) is too large to copy out of the image on this
machine, so the process-kind sandbox tests serve with this stand-in instead. It answers what the health gate asks:
``GET /health`` (200), ``GET /v1/models`` (the model given by ``--model``) and ``POST /v1/completions`` (a fixed
completion), and what the speculation gate measures (``speculate`` job tests):

- ``POST /v1/completions`` with ``stream: true``: ``max_tokens`` chunks of one token each, ``--token-ms``
  milliseconds apart, then a usage chunk and ``data: [DONE]``, as vLLM streams them;
- ``POST /v1/chat/completions`` with ``stream: true``: the same, the text in ``choices[0].delta.content`` (the
  first chunk carries ``role``); a body with ``response_format`` of type ``json_object``/``json_schema`` streams a
  JSON object (``{"a": "w...w"}``, one piece a token) ending with ``finish_reason: stop``, and a body with ``tools``
  streams one call of the first tool (``delta.tool_calls``, its JSON arguments in pieces) ending with
  ``finish_reason: tool_calls``, as vLLM's grammar backends and tool parsers stream them;
- ``GET /metrics``: vLLM 0.16's gauges ``vllm:num_requests_running`` / ``vllm:num_requests_waiting``, the counters
  ``vllm:generation_tokens_total``, ``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total``
  (prompt tokens; SIMULATED: a request body seen before counts every prompt token as a hit, a new one none) and,
  when started with ``--speculative-config`` (a "speculative release"), the spec-decode counters
  ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total`` and
  ``..._num_accepted_tokens_per_pos_total{position}``.

``--spec-crash-on-grammar``: a speculative release dies (the process exits 1 at once, mid-stream) on the first
chat request carrying ``response_format`` or ``tools``, as vLLM's engine does when EAGLE-3's draft tokens meet a
grammar backend's bitmask (vllm #27969 and #51660: the engine core dies and the API server with
it). ``--request-log PATH``: every POST's path and JSON body is appended to PATH (one JSON object a line) for
tests to read what was sent.

Speculation here is SIMULATED, not measured: a server started with ``--speculative-config`` streams
``--spec-speedup`` times faster and counts ``--spec-acceptance`` (mean acceptance length) per draft round. Unknown
arguments (vLLM's own flags such as ``--override-generation-config``) are accepted and ignored. With
``--require-file PATH`` (the served model's ``config.json``) it exits 1 at start when PATH is missing, as vLLM
fails when its model directory is gone. The API key
(``--api-key``), when given, is required on every request, ``/health`` excepted (as vLLM does). Standard library
only; stops on SIGTERM like vLLM does.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--bind", default="127.0.0.1", help="address to listen on (0.0.0.0: reachable from outside, as "
                    "production serving may be)")
    ap.add_argument("--label", default="", help="harmless: only printed (release tests change it)")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--token-ms", type=float, default=2.0, help="milliseconds between streamed tokens")
    ap.add_argument("--speculative-config", default=None, help="JSON: present = a simulated speculative release")
    ap.add_argument("--spec-speedup", type=float, default=2.0, help="how much faster a speculative release streams")
    ap.add_argument("--spec-acceptance", type=float, default=2.0, help="simulated mean acceptance length")
    ap.add_argument("--spec-crash-on-grammar", action="store_true",
                    help="a speculative release exits 1 on a chat request with response_format or tools")
    ap.add_argument("--request-log", default=None, help="append every POST's path and body to this JSONL file")
    ap.add_argument("--require-file", default=None,
                    help="exit 1 at start when this file is missing (as vLLM does when its model cannot be loaded)")
    ap.add_argument("--restart-dir", default=None,
                    help="a start that finds DIR/started (a restart) does not act on SIGTERM for 60 s, as a vLLM "
                         "still loading its weights did not when a window stopped it again")
    args, _unknown = ap.parse_known_args()
    if args.require_file and not os.path.isfile(args.require_file):
        print(f"stand-in OpenAI server: {args.require_file} not found: cannot load the model", file=sys.stderr,
              flush=True)
        sys.exit(1)
    spec = json.loads(args.speculative_config) if args.speculative_config else None
    k = int((spec or {}).get("num_speculative_tokens", 3))
    token_s = args.token_ms / 1000.0 / (args.spec_speedup if spec else 1.0)
    lock = threading.Lock()
    state = {"running": 0, "tokens": 0.0, "drafts": 0.0, "accepted": 0.0, "pc_queries": 0.0, "pc_hits": 0.0}
    seen: set[str] = set()  # request bodies served before (the simulated prefix cache)

    def pieces(body: dict, chat: bool, n: int) -> tuple[list[dict], str]:
        """The ``n`` streamed deltas of one request and its finish reason."""
        if not chat:
            return [{"text": " w"}] * n, "length"
        rf = body.get("response_format") or {}
        if body.get("tools"):
            name = ((body["tools"][0] or {}).get("function") or {}).get("name", "tool")
            args = ['{"q": "'] + ["w"] * max(n - 3, 0) + ['"}']
            first = {"tool_calls": [{"index": 0, "id": "call-0", "type": "function",
                                     "function": {"name": name, "arguments": ""}}]}
            return [first] + [{"tool_calls": [{"index": 0, "function": {"arguments": a}}]} for a in args], \
                "tool_calls"
        if rf.get("type") in ("json_object", "json_schema"):
            return [{"content": c} for c in ['{"a": "'] + ["w"] * max(n - 2, 0) + ['"}']], "stop"
        return [{"content": " w"}] * n, "length"

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, code: int, body: object, ctype: str = "application/json") -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if args.api_key and self.headers.get("Authorization") != f"Bearer {args.api_key}":
                self._send(401, {"error": "Unauthorized"})
                return False
            return True

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/health":
                self._send(200, {})
            elif not self._authorized():
                return
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": args.model, "object": "model"}]})
            elif self.path == "/metrics":
                with lock:
                    s = dict(state)
                lines = ["# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running {float(s['running'])}",
                         "# TYPE vllm:num_requests_waiting gauge", "vllm:num_requests_waiting 0.0",
                         "# TYPE vllm:generation_tokens counter", f"vllm:generation_tokens_total {s['tokens']}",
                         "# TYPE vllm:prefix_cache_queries counter",
                         f"vllm:prefix_cache_queries_total {s['pc_queries']}",
                         "# TYPE vllm:prefix_cache_hits counter", f"vllm:prefix_cache_hits_total {s['pc_hits']}"]
                if spec:
                    lines += ["# TYPE vllm:spec_decode_num_drafts counter",
                              f"vllm:spec_decode_num_drafts_total {s['drafts']}",
                              "# TYPE vllm:spec_decode_num_draft_tokens counter",
                              f"vllm:spec_decode_num_draft_tokens_total {s['drafts'] * k}",
                              "# TYPE vllm:spec_decode_num_accepted_tokens counter",
                              f"vllm:spec_decode_num_accepted_tokens_total {s['accepted']}",
                              "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
                              f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {s["accepted"]}']
                self._send(200, "\n".join(lines) + "\n", "text/plain; version=0.0.4")
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n)
            if not self._authorized():
                return
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self._send(404, {"error": "not found"})
                return
            body = json.loads(raw or b"{}")
            if args.request_log:
                with lock, open(args.request_log, "a") as f:
                    f.write(json.dumps({"path": self.path, "body": body}) + "\n")
            chat = self.path == "/v1/chat/completions"
            obj = "chat.completion.chunk" if chat else "text_completion"
            if not body.get("stream"):
                choice = ({"index": 0, "message": {"role": "assistant", "content": " stand-in"},
                           "finish_reason": "length"} if chat else
                          {"index": 0, "text": " stand-in", "finish_reason": "length"})
                self._send(200, {"object": obj.removesuffix(".chunk"), "model": args.model, "choices": [choice],
                                 "stand_in": True, "pid": os.getpid()})
                return
            crash = bool(spec and args.spec_crash_on_grammar and chat
                         and (body.get("response_format") or body.get("tools")))
            deltas, finish = pieces(body, chat, int(body.get("max_tokens") or 16))
            key = json.dumps(body.get("messages") if chat else body.get("prompt"), sort_keys=True)
            prompt_tokens = max(len(key) // 4, 1)
            with lock:
                state["running"] += 1
                state["pc_queries"] += prompt_tokens
                state["pc_hits"] += prompt_tokens if key in seen else 0
                seen.add(key)
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for i, d in enumerate(deltas):
                    time.sleep(token_s)
                    if crash:  # the engine core dies on the grammar's first bitmask: the server goes with it
                        print("stand-in OpenAI server: speculative release crashed on a grammar request "
                              "(simulated)", file=sys.stderr, flush=True)
                        os._exit(1)
                    delta = {**d, "role": "assistant"} if chat and i == 0 else d
                    last = i == len(deltas) - 1
                    choice = ({"index": 0, "delta": delta, "finish_reason": finish if last else None} if chat
                              else {"index": 0, **delta, "finish_reason": finish if last else None})
                    self.wfile.write(f"data: {json.dumps({'object': obj, 'choices': [choice]})}\n\n".encode())
                    self.wfile.flush()
                    with lock:
                        state["tokens"] += 1
                tokens = len(deltas)
                usage = {"object": obj, "choices": [],
                         "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                                   "total_tokens": tokens + prompt_tokens}}
                self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
                self.wfile.flush()
                if spec:
                    drafts = tokens / args.spec_acceptance
                    with lock:
                        state["drafts"] += drafts
                        state["accepted"] += tokens - drafts
            finally:
                with lock:
                    state["running"] -= 1
            self.close_connection = True

        def log_message(self, *a: object) -> None:
            pass

    print(f"stand-in OpenAI server (not vLLM) pid {os.getpid()} on 127.0.0.1:{args.port} label {args.label!r}"
          f"{' speculative (simulated)' if spec else ''}", flush=True)
    # SIGTERM ends the server at once, as vLLM's handler does; without a handler a server that is a container's PID 1
    # would ignore it (the kernel drops default-action signals to PID 1) and `docker stop` would wait its timeout.
    deaf_until = 0.0
    if args.restart_dir:
        marker = os.path.join(args.restart_dir, "started")
        if os.path.exists(marker):
            deaf_until = time.time() + 60
        else:
            open(marker, "w").close()

    def on_term(*_: object) -> None:
        if time.time() < deaf_until:
            print("stand-in OpenAI server: SIGTERM while starting: not acted on", flush=True)
            return
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    ThreadingHTTPServer((args.bind, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
