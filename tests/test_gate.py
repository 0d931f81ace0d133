"""The one health gate (:mod:`eagle3ops.health`) against a local stand-in of an OpenAI-compatible server.

A server started with ``--api-key`` (or ``VLLM_API_KEY``) answers 401 without it; the gate sends
the key it finds in the serving container's own configuration, or in the secret file the inventory names, and the
key appears in no journal entry or error. The real-vLLM check is ``test_release_fidelity.py``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from eagle3ops_dev import demo
from eagle3ops.config import load_inventory
from eagle3ops.config.plan import HealthCheck, Plan
from eagle3ops import health as gate
from eagle3ops.supervisor.runner import Supervisor

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-test-Zq81"


class _Server:
    """Answers like ``vllm serve --api-key KEY``: /health open, /v1/* need ``Authorization: Bearer KEY``."""

    def __init__(self, key: str | None):
        outer = self
        self.key, self.seen = key, []

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body=None):
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self):
                outer.seen.append(self.headers.get("Authorization"))
                return outer.key is None or self.headers.get("Authorization") == f"Bearer {outer.key}"

            def do_GET(self):
                if self.path == "/health":
                    return self._send(200)
                if not self._authorized():
                    return self._send(401, {"error": "Unauthorized"})
                if self.path == "/metrics":  # Prometheus text, as vLLM's
                    data = b"vllm:num_requests_running 0.0\n"
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    return self.wfile.write(data)
                if self.path == "/version":
                    return self._send(200, {"version": "0.16.0"})
                return self._send(200, {"data": [{"id": "m"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if not self._authorized():
                    return self._send(401, {"error": "Unauthorized"})
                if self.path == "/tokenize":  # one id per word of the prompt, or of the messages' contents
                    words = body.get("prompt") or " ".join(m["content"] for m in body.get("messages", []))
                    return self._send(200, {"tokens": list(range(len(words.split())))})
                return self._send(200, {"choices": [{"text": " hi"}]})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server(KEY)
    yield s
    s.close()


def test_probe_sends_the_key_and_says_why_a_401(server):
    with pytest.raises(gate.ProbeFailed) as e:
        gate.probe(server.url, "m")
    assert "401" in str(e.value) and "found none" in str(e.value) and "--api-key" in str(e.value)
    with pytest.raises(gate.ProbeFailed) as e:
        gate.probe(server.url, "m", api_key="wrong-key")
    assert "refused" in str(e.value) and "wrong-key" not in str(e.value)
    assert gate.probe(server.url, "m", api_key=KEY) == ["m"]


def test_the_serving_client_asks_every_endpoint_with_the_key_and_names_the_failure(server):
    from eagle3ops.serving_http import ServingClient, ServingHTTPError, auth_headers

    c = ServingClient(server.url + "/", KEY)
    assert auth_headers(KEY) == {"Authorization": f"Bearer {KEY}"} and auth_headers("") == {}
    c.health()
    assert c.models() == ["m"] and c.completion("m", "Hello", 4)["choices"][0]["text"] == " hi"
    assert "vllm:num_requests_running" in c.metrics() and c.version() == "0.16.0"
    assert c.tokenize("m", prompt="a b c") == [0, 1, 2]
    assert c.tokenize("m", messages=[{"role": "user", "content": "x y"}]) == [0, 1]
    assert set(server.seen) == {f"Bearer {KEY}"}  # every request but /health was asked for the key, and had it
    with pytest.raises(ValueError, match="a prompt or messages"):
        c.tokenize("m")
    with pytest.raises(ServingHTTPError) as e:
        ServingClient(server.url, "wrong-key").models()
    assert (e.value.status, str(e.value)) == (401, "/v1/models returned 401 Unauthorized")
    assert ServingClient(server.url).version() is None  # refused: no version, no error
    server.close()
    with pytest.raises(ServingHTTPError) as e:
        c.health()
    assert e.value.status is None and str(e.value).startswith("/health: ")


def test_key_from_the_containers_own_configuration():
    assert gate.api_key_from_args(["/m", "--api-key", "a", "--port", "1"]) == "a"
    assert gate.api_key_from_args(["/m", "--api-key=b"]) == "b"
    assert gate.api_key_from_args(["/m", "--port", "1"]) is None
    cfg = {"Config": {"Entrypoint": ["vllm", "serve"], "Cmd": ["/m"], "Env": ["PATH=/bin", "VLLM_API_KEY=e"]}}
    assert gate.api_key_from_inspect(cfg) == "e"
    cfg["Config"]["Cmd"] = ["/m", "--api-key", "flag"]
    assert gate.api_key_from_inspect(cfg) == "flag", "--api-key wins over the environment, as in vLLM"
    assert gate.api_key_from_inspect({"Config": {"Cmd": ["/m"], "Env": None}}) is None


def test_wait_healthy_fails_at_once_on_a_crash(server):
    with pytest.raises(gate.GateFailed, match="crashed"):
        gate.wait_healthy(server.url, "m", timeout_s=30, crashed=lambda: "container crashed")


class _Serving:
    status = "running"

    def __init__(self, env=(), cmd=()):
        self.attrs = {"Config": {"Cmd": list(cmd), "Env": list(env)}, "State": {"ExitCode": 0}, "RestartCount": 0}

    def reload(self):
        pass


class _Client:
    def __init__(self, serving):
        self.containers = self
        self.serving = serving

    def get(self, name):
        return self.serving


def _gate(tmp_path, port, container, key_file=None):
    wdir = tmp_path / "w"
    wdir.mkdir()
    plan = Plan(window_id="w", kind="rollback", host="h", user="u", command="c", state_dir=str(tmp_path / "s"),
                serving_container="vllm", health=HealthCheck(port=port, model="m", timeout_s=3, interval_s=0.2,
                                                             api_key_file=key_file))
    sup = Supervisor(plan, _Client(container), wdir)
    return sup, wdir


@pytest.mark.parametrize("where", ["env", "args"])
def test_supervisor_gate_uses_the_serving_containers_key(tmp_path, server, where):
    c = _Serving(env=[f"VLLM_API_KEY={KEY}"]) if where == "env" else _Serving(cmd=["/m", "--api-key", KEY])
    sup, wdir = _gate(tmp_path, server.port, c)
    sup.gate()
    journal = (wdir / "journal.jsonl").read_text()
    assert '"event": "ok"' in journal and KEY not in journal
    assert f"Bearer {KEY}" in server.seen


def test_supervisor_gate_uses_the_inventorys_secret_file(tmp_path, server):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    sup, wdir = _gate(tmp_path, server.port, _Serving(), key_file=str(key_file))
    sup.gate()
    assert KEY not in (wdir / "journal.jsonl").read_text()


def test_supervisor_gate_without_a_key_fails_with_the_cause(tmp_path, server):
    sup, wdir = _gate(tmp_path, server.port, _Serving(), key_file=str(tmp_path / "missing"))
    with pytest.raises(gate.GateFailed) as e:
        sup.gate()
    assert "cannot read the API key file" in str(e.value) and "serving.api_key_file" in str(e.value)
    (tmp_path / "b").mkdir()
    sup2, _ = _gate(tmp_path / "b", server.port, _Serving())
    with pytest.raises(gate.GateFailed, match="401 Unauthorized: the server requires an API key"):
        sup2.gate()


def test_demo_polls_through_the_same_gate(server, tmp_path):
    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    s = h.serving.model_copy(update={"port": server.port, "served_model_name": "m"})
    assert not demo.serving_healthy(h.model_copy(update={"serving": s}), completion=True)
    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    keyed = h.model_copy(update={"serving": s.model_copy(update={"api_key_file": str(key_file)})})
    assert demo.serving_healthy(keyed, completion=True)
