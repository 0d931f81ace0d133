"""Holes in the speculation gate, closed (fast, no sandbox):

- a negative ``gate_margin`` is refused by inventory validation (``eagle3ops config check``), by the CLI's
  ``speculate --margin`` and by :func:`eagle3ops.speculate.ship.speculate`, unless the test-only switch
  ``EAGLE3OPS_TEST_ALLOW_NEGATIVE_MARGIN=1`` is set;
- a stand-in image is refused by name on a host that is not a sandbox, at ``release --image`` (the release
  window) and at ``speculate``, by its reference or by its labels on the host; a sandbox takes it;
- the speculate path sends the serving API key (taken as the health gate takes it) to the measuring helper, in its
  stdin, and the helper sends it on every request and ``/metrics`` scrape;
- a level's "before" counter snapshot is taken after the idle wait: a foreign request that finishes during the
  wait is not counted in the speculative side's acceptance;
- requests that failed (warm-up or measured) followed by a silent ``/metrics`` end the measurement as the release's
  failure (it went down), not as a measured level.

The HTTP server below is a STAND-IN for vLLM's OpenAI server (stdlib ``http.server``): ``/metrics`` in vLLM 0.16's
names and ``/v1/completions`` streaming, both behind a bearer key.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from eagle3ops.config import ConfigError, load_inventory
from eagle3ops.config.inventory import NEGATIVE_MARGIN_ENV, HostConfig
from eagle3ops.config.plan import ReleaseChange
from eagle3ops.config.standin import is_sandbox, standin_reason
from eagle3ops.speculate import onhost
from eagle3ops.gate.metrics import SpecCounters, SpecDelta

REPO = Path(__file__).resolve().parents[1]
KEY = "sekret-key-24"


def _inventory(tmp_path: Path, **serving: object) -> Path:
    raw = yaml.safe_load((REPO / "deploy/hosts.yaml").read_text())
    raw["hosts"]["sandbox"]["serving"].update(serving)
    p = tmp_path / "hosts.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


def _production(h: HostConfig) -> HostConfig:
    """The sandbox entry as a production host: another Docker endpoint (not a sandbox engine's socket)."""
    return h.model_copy(update={"name": "gpu-01", "docker_host": "unix:///run/docker.sock"})


# --- negative margin ---------------------------------------------------------------------------------------------

def test_a_negative_gate_margin_is_refused_by_the_inventory_unless_the_test_switch_is_set(tmp_path, monkeypatch):
    monkeypatch.delenv(NEGATIVE_MARGIN_ENV, raising=False)
    inv = _inventory(tmp_path, gate_margin=-0.2)
    with pytest.raises(ConfigError, match=r"gate_margin.*-0.2 is negative.*EAGLE3OPS_TEST_ALLOW_NEGATIVE_MARGIN=1"):
        load_inventory(inv)
    from eagle3ops.cli import app

    r = CliRunner().invoke(app, ["config", "check", "--inventory", str(inv)])
    assert r.exit_code != 0 and "is negative" in r.output and "gate_margin" in r.output
    monkeypatch.setenv(NEGATIVE_MARGIN_ENV, "1")
    assert load_inventory(inv).host("sandbox").serving.gate_margin == -0.2
    monkeypatch.setenv(NEGATIVE_MARGIN_ENV, "yes")  # only the documented value opens it
    with pytest.raises(ConfigError, match="is negative"):
        load_inventory(inv)


def test_speculate_refuses_a_negative_margin_from_the_cli_and_the_api(monkeypatch):
    from eagle3ops import cli_common
    from eagle3ops.cli import app
    from eagle3ops.speculate import ship

    monkeypatch.delenv(NEGATIVE_MARGIN_ENV, raising=False)
    monkeypatch.setattr(cli_common, "remote", lambda *a, **k: pytest.fail("connected"))
    r = CliRunner().invoke(app, ["speculate", "sandbox", "--run", "r1", "--margin", "-0.1",
                                 "--inventory", str(REPO / "deploy/hosts.yaml")])
    assert r.exit_code == 2 and "--margin" in r.output and "is negative" in r.output  # a usage error, as --k abc
    for argv in (["speculate", "sandbox", "--run", "r1", "--k", "9"], ["speculate", "sandbox", "--run", "r1",
                 "--method", "foo"], ["release", "sandbox", "--gate", "--margin", "nan"]):
        r = CliRunner().invoke(app, [*argv, "--inventory", str(REPO / "deploy/hosts.yaml")])
        assert r.exit_code == 2 and "error" in r.output, (argv, r.output)  # refused before connecting
    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    fake = _Remote(h)
    with pytest.raises(ship.SpeculateError, match="is negative"):
        ship.speculate(fake, ship.SpeculateOptions(run="r1", pipeline_image="p:1", margin=-0.1))
    assert fake.calls == []  # refused before anything was read or written


# --- stand-in images ---------------------------------------------------------------------------------------------

class _Res:
    def __init__(self, stdout: str = "", ok: bool = True):
        self.stdout, self.stderr, self.ok = stdout, "", ok


class _Remote:
    """Answers ``docker image inspect`` with ``labels`` (absent when None) and ``docker container inspect`` with a
    serving container started with ``--api-key``; records every command."""

    def __init__(self, host: HostConfig, labels: dict | None = None, key: str | None = None):
        self.host, self.dry_run, self.labels, self.key, self.calls = host, False, labels, key, []

    def run(self, argv, *, check=True, timeout=None, stdin=None, **_):
        self.calls.append((argv, stdin))
        if "image" in argv and "inspect" in argv:
            return _Res(json.dumps([{"Config": {"Labels": self.labels}}])) if self.labels is not None \
                else _Res("", ok=False)
        if "container" in argv and "inspect" in argv:
            cmd = ["/models/m", "--api-key", self.key] if self.key else ["/models/m"]
            return _Res(json.dumps([{"Config": {"Cmd": cmd, "Env": []}}]))
        return _Res()


def test_stand_ins_are_known_by_reference_and_by_label():
    for ref in ("eagle3ops/vllm-openai-local:v0.16.0", "eagle3ops/serving:sandbox-cpu-standin",
                "registry.example/eagle3ops/vllm-openai-upstream-standin:v0.16.0", "eagle3ops/standin-vllm-base:abc"):
        assert standin_reason(ref), ref
    assert standin_reason("vllm/vllm-openai:v0.16.0") is None
    assert standin_reason("eagle3ops/serving:0.16.0-abc") is None
    assert "io.eagle3ops.stand-in-for" in standin_reason("eagle3ops/serving:0.16.0-abc",
                                                         {"io.eagle3ops.stand-in-for": "vllm/vllm-openai:v0.16.0"})
    # the names agree with the image code that builds the stand-ins
    from eagle3ops_dev import bases

    for ref in (bases.LOCAL_BASE_TAG, bases.UPSTREAM_BASE_TAG, f"{bases.STANDIN_REPO}:x"):
        assert standin_reason(ref)
    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    assert is_sandbox(h) and not is_sandbox(_production(h))
    assert not is_sandbox(h.model_copy(update={"docker_host": None}))


@pytest.mark.parametrize("image,labels", [("eagle3ops/serving:sandbox-cpu-standin", None),
                                          ("eagle3ops/vllm-openai-local:v0.16.0", None),
                                          ("eagle3ops/serving:0.16.0-abc", {"io.eagle3ops.standin": "true"})])
def test_release_refuses_a_stand_in_image_on_a_host_that_is_not_a_sandbox(image, labels):
    from eagle3ops.window.common import WindowError
    from eagle3ops.window.run import run_window

    h = _production(load_inventory(REPO / "deploy/hosts.yaml").host("sandbox"))
    r = _Remote(h, labels)
    with pytest.raises(WindowError, match=rf"gpu-01: release --image refused: {image} is a stand-in image"):
        run_window(r, kind="release", image="p:1", expected_image_id=None, command="t",
                   change=ReleaseChange(image=image))
    assert all("image" in argv and "inspect" in argv for argv, _ in r.calls)  # only the read: no lock taken


def test_a_sandbox_takes_a_stand_in_and_speculate_refuses_one_elsewhere(monkeypatch):
    from eagle3ops.speculate import ship
    from eagle3ops.window.common import WindowError
    from eagle3ops.window.standin import refuse_standin_image

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    refuse_standin_image(_Remote(h, {"io.eagle3ops.standin": "true"}), h.serving.speculative_image, "speculate")
    prod = _production(h)
    r = _Remote(prod)
    with pytest.raises(WindowError, match="gpu-01: speculate refused: eagle3ops/serving:sandbox-cpu-standin"):
        ship.speculate(r, ship.SpeculateOptions(run="r1", pipeline_image="p:1"))
    assert all("inspect" in argv for argv, _ in r.calls)  # refused before anything was written


# --- the API key and the counters' before snapshot ----------------------------------------------------------------

class _StandInVllm(BaseHTTPRequestHandler):
    """STAND-IN for vLLM's server (see the module doc). Class state: ``busy_until`` (a foreign request runs until
    then, adding draft rounds), ``drafts``, ``tokens``, ``seen_keys``."""

    busy_until = 0.0
    drafts = 0.0
    tokens = 0.0
    seen_keys: list[str | None] = []

    def log_message(self, *a):  # quiet
        pass

    def _auth(self) -> bool:
        got = self.headers.get("Authorization")
        type(self).seen_keys.append(got)
        if got != f"Bearer {KEY}":
            self.send_response(401)
            self.end_headers()
            return False
        return True

    def do_GET(self):
        if not self._auth():
            return
        cls = type(self)
        busy = time.monotonic() < cls.busy_until
        if busy:  # the foreign request makes progress: tokens and draft rounds
            cls.tokens += 5
            cls.drafts += 100
        body = (f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {1.0 if busy else 0.0}\n"
                f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0.0\n"
                f"# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total {cls.tokens}\n"
                f"# TYPE vllm:spec_decode_num_drafts counter\nvllm:spec_decode_num_drafts_total {cls.drafts}\n"
                f"# TYPE vllm:spec_decode_num_draft_tokens counter\n"
                f"vllm:spec_decode_num_draft_tokens_total {cls.drafts * 3}\n"
                f"# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
                f"vllm:spec_decode_num_accepted_tokens_total {cls.drafts}\n").encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if not self._auth():
            return
        cls = type(self)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(4):
            self.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\n')
            self.wfile.flush()
        cls.tokens += 4
        cls.drafts += 2  # two draft rounds per request
        self.wfile.write(b'data: {"choices": [], "usage": {"completion_tokens": 4}}\n\ndata: [DONE]\n\n')


def test_onhost_measure_sends_the_key_and_snapshots_counters_after_the_idle_wait():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _StandInVllm)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        _StandInVllm.seen_keys = []
        _StandInVllm.busy_until = time.monotonic() + 1.5  # a foreign request finishing during the idle wait
        ans = onhost.measure({"base_url": f"http://127.0.0.1:{srv.server_address[1]}", "model": "m",
                              "prompts": ["a", "b", "c"], "levels": [1], "max_tokens": 4, "passes": 1,
                              "api_key": KEY, "idle_timeout_s": 20})
    finally:
        srv.shutdown()
    assert _StandInVllm.seen_keys and set(_StandInVllm.seen_keys) == {f"Bearer {KEY}"}
    (level,) = ans["levels"]["1"]
    assert level["requests"] == 3 and level["errors"] == 0 and level["prompt_tokens"] == [4, 4, 4]
    (before, after), = ans["counters"]["1"]
    delta = SpecDelta.between(*(SpecCounters(d["drafts"], d["draft_tokens"], d["accepted"], {},
                                             d["requests_running"]) for d in (before, after)))
    assert delta.drafts == 6  # the replay's own 3 x 2 rounds, none of the foreign request's


def test_warmup_prompts_are_sent_first_and_never_measured():
    """``serving.gate_warmup_prompts``: a freshly started server's first requests are slower (the sandbox's
    SmolLM2: first baseline pass 22.1 tokens/s, then 30.0 and 29.7), so the first N prompts go once to each level
    before the passes; neither their figures nor their spec-decode counters are in any pass."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _StandInVllm)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    posts = []
    orig = _StandInVllm.do_POST

    def counting(self):
        posts.append(time.monotonic())
        orig(self)

    _StandInVllm.do_POST = counting
    try:
        _StandInVllm.busy_until = 0.0
        ans = onhost.measure({"base_url": f"http://127.0.0.1:{srv.server_address[1]}", "model": "m",
                              "prompts": ["a", "b", "c"], "levels": [1, 2], "max_tokens": 4, "passes": 1,
                              "api_key": KEY, "idle_timeout_s": 20, "warmup_prompts": 2})
    finally:
        _StandInVllm.do_POST = orig
        srv.shutdown()
    assert len(posts) == 2 * 2 + 3 * 2  # two warm-up prompts at each of two levels, then the pass at each
    assert ans["warmup"]["prompts"] == 2 and set(ans["warmup"]["output_tokens_per_s"]) == {"1", "2"}
    for c in ("1", "2"):
        (level,) = ans["levels"][c]
        assert level["requests"] == 3
        (before, after), = ans["counters"][c]
        assert after["drafts"] - before["drafts"] == 6  # the pass's 3 x 2 rounds only


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1.0, 5.0])
def test_a_margin_that_would_keep_anything_is_refused(value):
    """release --gate keeps what is not slower than ``1 - margin``: a margin of 1 or more, infinite or NaN keeps
    every change (helper-2 found `--margin nan` accepted)."""
    from eagle3ops.config.inventory import check_gate_margin

    with pytest.raises(ValueError, match="must be a number from 0 to below 1"):
        check_gate_margin(value)


@pytest.mark.parametrize("warmup", [2, 0], ids=["in-the-warm-up", "in-a-pass"])
def test_failed_requests_then_no_metrics_is_the_release_going_down(monkeypatch, warmup):
    """A level whose requests failed, after which ``/metrics`` does not answer (nothing listens any more), ends the
    measurement as the release's failure, naming the level, the failures and what was sent (warm-up or measured).
    STAND-IN: the replay (a level whose two requests failed); the server is a port nobody listens on."""
    import socket

    from eagle3ops.gate import measure as gm
    from eagle3ops.gate.replay import LevelResult, ReleaseFailed

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    failed = LevelResult(1, 2, 2, 0, 0.1, 0.0, None, None, None, 0.0, failures=((0, "HTTP 500"), (1, "HTTP 500")))
    monkeypatch.setattr(gm, "replay_level", lambda *a, **k: failed)
    with pytest.raises(ReleaseFailed) as got:
        gm.measure({"base_url": f"http://127.0.0.1:{port}", "model": "m", "prompts": ["a", "b"], "levels": [1],
                    "max_tokens": 4, "warmup_prompts": warmup, "request_timeout_s": 2})
    said = str(got.value)
    assert said.startswith(f"2 of 2 {'warm-up requests' if warmup else 'requests'} failed at concurrency 1")
    assert "HTTP 500 (prompt 0, 1)" in said and "no longer answers /metrics" in said and "it went down" in said
    assert got.value.concurrency == 1 and got.value.failures == [(0, "HTTP 500"), (1, "HTTP 500")]
