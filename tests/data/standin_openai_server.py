"""Stand-in for vLLM run as a plain process (serving kind ``process`` tests): a tiny OpenAI-compatible HTTP server.

NOT vLLM: the base image's vLLM virtualenv (8.1 GB, /opt/venv) is too large to copy out of the image on this
machine, so the process-kind sandbox test serves with this stand-in instead. It answers what the health gate asks:
``GET /health`` (200), ``GET /v1/models`` (the model given by ``--model``) and ``POST /v1/completions`` (a fixed
completion). Standard library only; stops on SIGTERM like vLLM does.
"""

import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--label", default="", help="harmless: only printed (release tests change it)")
    args = ap.parse_args()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": args.model, "object": "model"}]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            n = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(n)
            if self.path == "/v1/completions":
                self._send(200, {"object": "text_completion", "model": args.model,
                                 "choices": [{"index": 0, "text": " stand-in", "finish_reason": "length"}],
                                 "stand_in": True, "pid": os.getpid()})
            else:
                self._send(404, {"error": "not found"})

        def log_message(self, *a: object) -> None:
            pass

    print(f"stand-in OpenAI server (not vLLM) pid {os.getpid()} on 127.0.0.1:{args.port} label {args.label!r}",
          flush=True)
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
