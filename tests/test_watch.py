"""``eagle3ops watch``: the live release judged from ``/metrics`` over time.

The fast tests run the real watch loop — real HTTP, vLLM-format Prometheus text parsed by ``prometheus_client``,
records and state written through the real local executor with the same host commands an SSH host gets — against a
**stand-in** of vLLM's ``/metrics`` (:class:`StandinVllmMetrics`: a tiny ``http.server`` on 127.0.0.1 whose counters
the test advances; NOT vLLM). The clock is the test's: each ``sleep`` of the watch moves it and sends one interval
of stand-in traffic. The rollback path is stubbed at the module boundary (``eagle3ops.window.run.run_window``).
The last test needs the sandbox's live speculative release (marked ``sandbox``).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from eagle3ops.config import HostConfig
from eagle3ops.executor import Local
from eagle3ops.speculate import watch as w

KEY = "s3cret-watch"


@dataclass
class StandinVllmMetrics:
    """Stand-in for vLLM 0.16's ``/metrics`` (NOT vLLM): the counters, gauges and histograms ``watch`` reads, with
    vLLM's names and label sets (``_created`` series beside the counters), and ``/v1/models``. Requests without
    ``Authorization: Bearer KEY`` get 401, as vLLM with ``--api-key`` answers."""

    model: str = "standin-model"
    c: dict[str, float] = field(default_factory=lambda: {
        "drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "pos0": 0.0, "pos1": 0.0, "pos2": 0.0, "gen": 0.0,
        "success": 0.0, "e2e_sum": 0.0, "ttft_sum": 0.0, "req_tokens_sum": 0.0})
    waiting: float = 0.0
    unauthorized: int = 0

    def traffic(self, *, acceptance: float, requests: int = 10, tokens_each: int = 64, seconds_each: float = 2.0,
                k: int = 3) -> None:
        """One interval of requests: ``requests`` x ``tokens_each`` output tokens at mean acceptance length
        ``acceptance`` (accepted spread over ``k`` positions, falling off: 3:2:1)."""
        tokens = requests * tokens_each
        drafts = tokens / acceptance
        accepted = drafts * (acceptance - 1)
        c = self.c
        c["drafts"] += drafts
        c["draft_tokens"] += drafts * k
        c["accepted"] += accepted
        for i, share in enumerate((3 / 6, 2 / 6, 1 / 6)):
            c[f"pos{i}"] += accepted * share
        c["gen"] += tokens
        c["success"] += requests
        c["e2e_sum"] += requests * seconds_each
        c["ttft_sum"] += requests * 0.1
        c["req_tokens_sum"] += tokens

    def text(self) -> str:
        c, lab = self.c, f'engine="0",model_name="{self.model}"'
        out = []

        def counter(name: str, value: float, labels: str = lab) -> None:
            out.extend([f"# HELP {name} stand-in", f"# TYPE {name} counter", f"{name}_total{{{labels}}} {value}",
                        f"{name}_created{{{labels}}} 1.7e9"])

        counter("vllm:spec_decode_num_drafts", c["drafts"])
        counter("vllm:spec_decode_num_draft_tokens", c["draft_tokens"])
        counter("vllm:spec_decode_num_accepted_tokens", c["accepted"])
        out.extend(["# HELP vllm:spec_decode_num_accepted_tokens_per_pos stand-in",
                    "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter"])
        for i in range(3):
            out.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {c[f"pos{i}"]}')
        counter("vllm:generation_tokens", c["gen"])
        counter("vllm:request_success", c["success"], f'{lab},finished_reason="length"')
        for name, s, n in (("vllm:e2e_request_latency_seconds", c["e2e_sum"], c["success"]),
                           ("vllm:time_to_first_token_seconds", c["ttft_sum"], c["success"]),
                           ("vllm:request_generation_tokens", c["req_tokens_sum"], c["success"])):
            out.extend([f"# HELP {name} stand-in", f"# TYPE {name} histogram",
                        f'{name}_bucket{{{lab},le="+Inf"}} {n}', f"{name}_count{{{lab}}} {n}",
                        f"{name}_sum{{{lab}}} {s}"])
        for name, v in (("vllm:num_requests_running", 2.0), ("vllm:num_requests_waiting", self.waiting)):
            out.extend([f"# HELP {name} stand-in", f"# TYPE {name} gauge", f"{name}{{{lab}}} {v}"])
        return "\n".join(out) + "\n"

    def serve(self) -> tuple[ThreadingHTTPServer, int]:
        me = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):  # noqa: N802 - http.server's name
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    me.unauthorized += 1
                    self.send_response(401)
                    self.end_headers()
                    return
                if self.path == "/metrics":
                    body, ctype = me.text().encode(), "text/plain; version=0.0.4"
                elif self.path == "/v1/models":
                    body, ctype = json.dumps({"data": [{"id": me.model}]}).encode(), "application/json"
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return srv, srv.server_address[1]


class LocalHost(Local):
    """The real local executor with a ``host``: the watch's host commands (find/cat, tee, mkdir) run here, on a
    temporary state dir, exactly as they would over SSH."""

    def __init__(self, host: HostConfig):
        super().__init__()
        self.host = host


#: The gate's result that made release 2 live (figures as `speculate` writes them): acceptance 1.93 at x1.30.
GATE = {"run": "r1", "verdict": "keep", "spec_decode": {"mean_acceptance_length": 1.93}, "throughput_ratio": 1.3,
        "production_concurrency": 1, "baseline_release": 1, "speculative_release": 2,
        "levels": {"1": {"baseline": {"output_tokens_per_s": 40.0}, "speculative": {"output_tokens_per_s": 52.0}}}}


@pytest.fixture()
def standin(tmp_path):
    srv = StandinVllmMetrics()
    server, port = srv.serve()
    yield srv, port
    server.shutdown()


def _host(tmp_path: Path, port: int, **watch) -> HostConfig:
    (tmp_path / "key").write_text(KEY + "\n")
    state, data = tmp_path / "state", tmp_path / "data"
    (state / "releases").mkdir(parents=True, exist_ok=True)
    (state / "releases/current").write_text("2\n")
    (data / "runs/r1/speculate").mkdir(parents=True, exist_ok=True)
    (data / "runs/r1/speculate/result.json").write_text(json.dumps(GATE))
    (state / "audit.jsonl").write_text(json.dumps({"kind": "speculate", "run": "r1", "verdict": "keep", "figures": {
        "speculative_release": 2, "baseline_release": 1}}) + "\n")
    return HostConfig(name="standin", hostname="127.0.0.1", docker_host="unix:///nonexistent/docker.sock",
                      data_dir=str(data), state_dir=str(state), model_path=str(tmp_path / "model"),
                      serving={"image": "x", "served_model_name": "standin-model", "port": port,
                               "api_key_file": str(tmp_path / "key"),
                               "watch": {"sustained_minutes": 2, "throughput_drop": 0.5, **watch}})


class Clock:
    """The test's clock: ``sleep`` moves time and sends the next interval of stand-in traffic (``plan``: one mean
    acceptance length per interval, None = no traffic)."""

    def __init__(self, srv: StandinVllmMetrics, plan: list[float | None], t0: float = 1_800_000_000.0):
        self.t, self.srv, self.plan = t0, srv, list(plan)

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s
        acc = self.plan.pop(0) if self.plan else None
        if acc is not None:
            self.srv.traffic(acceptance=acc)


def _records(tmp_path: Path, release: int = 2) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / f"state/watch/{release}.jsonl").read_text().splitlines()]


def _audit(tmp_path: Path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "state/audit.jsonl").read_text().splitlines()]


def test_thresholds_break_even_and_throughput_from_the_gate():
    h = HostConfig(name="h", hostname="x", data_dir="/d", state_dir="/s", model_path="/m",
                   serving={"image": "x", "served_model_name": "m", "watch": {"throughput_drop": 0.25}})
    th = w.thresholds(h.serving.watch, h.serving, GATE)
    assert th.acceptance_floor == pytest.approx(1.93 / 1.3, abs=1e-4) and "break-even" in th.floor_source
    assert th.request_tokens_per_s_min == pytest.approx(0.75 * 40.0) and th.baseline_release == 1
    no_gate = w.thresholds(h.serving.watch, h.serving, None)  # falls back to serving.acceptance_floor
    assert no_gate.acceptance_floor == h.serving.acceptance_floor and no_gate.request_tokens_per_s_min is None
    assert w.judge({"mean_acceptance_length": None, "request_output_tokens_per_s": 10.0}, th) == {
        "acceptance": None, "throughput": True}


def test_watch_records_acceptance_per_interval_and_reports_a_sustained_breach(tmp_path, standin):
    srv, port = standin
    h = _host(tmp_path, port)
    # 3 good intervals (acceptance 2.0 > break-even 1.485), one idle, then 4 below it (1.2): the breach starts at
    # the 5th interval's start (t0+240) and is sustained (>= 2 min) at the end of the 6th (t0+360)
    clock = Clock(srv, [2.0, 2.0, 2.0, None, 1.2, 1.2, 1.2, 1.2])
    out = w.watch(LocalHost(h), w.WatchOptions(duration_s=480, interval_s=60), echo=lambda *_: None,
                  now=clock.now, sleep=clock.sleep)
    assert out["exit_code"] == w.EXIT_BREACH and out["rollback"] is None and out["intervals"] == 8
    recs = _records(tmp_path)
    assert [r["mean_acceptance_length"] for r in recs] == pytest.approx([2.0, 2.0, 2.0, None, 1.2, 1.2, 1.2, 1.2])
    assert recs[0]["acceptance_per_position"] == pytest.approx({"0": 0.5, "1": 1 / 3, "2": 1 / 6}, abs=1e-4)
    assert recs[0]["output_tokens_per_s"] == pytest.approx(640 / 60, abs=1e-3)
    assert recs[0]["request_output_tokens_per_s"] == pytest.approx(32.0) and recs[0]["requests_per_s"] == \
        pytest.approx(10 / 60, abs=1e-3)
    assert [r["checks"]["acceptance"] for r in recs] == [False, False, False, None, True, True, True, True]
    assert recs[3]["checks"]["throughput"] is None and recs[0]["checks"]["throughput"] is False  # 32 >= 20
    assert srv.unauthorized == 0  # the API key (from serving.api_key_file) went with every request
    # reported once, at the 6th interval, with the figures in the audit log
    assert len(out["breaches"]) == 1 and out["breaches"][0]["interval"]["epoch"] == clock.t - 120
    entry = [e for e in _audit(tmp_path) if e.get("kind") == "watch"]
    assert len(entry) == 1 and entry[0]["outcome"] == "breach" and entry[0]["figures"]["mean_acceptance_length"] \
        == pytest.approx(1.2) and entry[0]["thresholds"]["acceptance_floor"] == pytest.approx(1.4846, abs=1e-4)
    # calibration: production's pooled acceptance for run r1: (3 x 640 x (1-1/2) + 4 x 640 x (1-1/1.2)) / drafts
    prod = json.loads((tmp_path / "data/runs/r1/speculate/production.json").read_text())
    drafts = 3 * 640 / 2.0 + 4 * 640 / 1.2
    assert prod["mean_acceptance_length"] == pytest.approx(1 + (3 * 320 + 4 * 640 * (0.2 / 1.2)) / drafts, abs=1e-4)
    assert prod["intervals"] == 7 and prod["release"] == 2


def test_a_resumed_watch_continues_the_interval_and_the_breach(tmp_path, standin):
    srv, port = standin
    h = _host(tmp_path, port)
    clock = Clock(srv, [1.2, 1.2, 1.2])
    first = w.watch(LocalHost(h), w.WatchOptions(duration_s=60), echo=lambda *_: None, now=clock.now,
                    sleep=clock.sleep)
    assert first["exit_code"] == w.EXIT_OK and first["intervals"] == 1  # breaching for 60 s: not yet sustained
    second = w.watch(LocalHost(h), w.WatchOptions(duration_s=120), echo=lambda *_: None, now=clock.now,
                     sleep=clock.sleep)
    recs = _records(tmp_path)
    assert len(recs) == 3 and recs[1]["start"] == recs[0]["epoch"]  # no interval lost between the runs
    assert second["exit_code"] == w.EXIT_BREACH and recs[2]["breaching_since"]["acceptance"] == recs[0]["start"]


def test_with_rollback_enabled_a_sustained_breach_rolls_back_to_the_gates_baseline(tmp_path, standin, monkeypatch):
    import eagle3ops.window.run as window_run

    srv, port = standin
    h = _host(tmp_path, port, rollback=True)
    calls = []

    def stub_run_window(r, **kw):  # the module boundary: the locked, health-gated window is tested elsewhere
        calls.append(kw)
        return {"outcome": "ok", "window_id": "20261201T000000Z-rollback-abc123", "release": kw["to_release"]}

    monkeypatch.setattr(window_run, "run_window", stub_run_window)
    clock = Clock(srv, [1.1] * 10)
    out = w.watch(LocalHost(h), w.WatchOptions(duration_s=600, interval_s=60, pipeline_image="p:1",
                                               pipeline_image_id="sha256:1"), echo=lambda *_: None,
                  now=clock.now, sleep=clock.sleep)
    assert out["exit_code"] == w.EXIT_ROLLED_BACK and out["intervals"] == 2  # sustained at t0+120: stopped there
    assert len(calls) == 1 and calls[0]["kind"] == "rollback" and calls[0]["to_release"] == 1
    assert calls[0]["image"] == "p:1" and calls[0]["run"] == "r1" and "acceptance" in calls[0]["message"]
    entry = [e for e in _audit(tmp_path) if e.get("kind") == "watch"][-1]
    assert entry["rollback"]["outcome"] == "ok" and entry["rollback"]["release"] == 1
    assert json.loads((tmp_path / "state/watch/state.json").read_text()) == {}  # the next watch starts afresh
    # a failing rollback window is exit 5, not 4
    monkeypatch.setattr(window_run, "run_window", lambda r, **kw: {"outcome": "rolled back", "window_id": "w2",
                                                                    "error": "health gate failed"})
    clock2 = Clock(srv, [1.1] * 10, t0=clock.t + 10_000)
    assert w.watch(LocalHost(h), w.WatchOptions(duration_s=600, pipeline_image="p:1"), echo=lambda *_: None,
                   now=clock2.now, sleep=clock2.sleep)["exit_code"] == w.EXIT_ROLLBACK_FAILED


def test_one_watch_per_host_at_a_time():
    with w.watch_lock("h-lock-test"):
        with pytest.raises(w.WatchLocked, match="another `eagle3ops watch h-lock-test`"):
            with w.watch_lock("h-lock-test"):
                pass
    with w.watch_lock("h-lock-test"):  # released when the holder ends
        pass


def test_the_cli_exits_75_while_another_watch_of_the_host_runs(tmp_path):
    from typer.testing import CliRunner

    from eagle3ops.cli import app

    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n  lockedhost:\n    hostname: 127.0.0.1\n    data_dir: /d\n    state_dir: /s\n"
                   "    model_path: /m\n    serving: {image: x, served_model_name: m}\n")
    with w.watch_lock("lockedhost"):  # held by "another" watch: this one never reaches the host
        res = CliRunner().invoke(app, ["watch", "lockedhost", "-i", str(inv), "--duration", "5"])
    assert res.exit_code == w.EXIT_LOCKED and "another `eagle3ops watch lockedhost`" in res.output


def test_the_policy_is_validated_naming_the_key():
    from eagle3ops.config.base import ConfigError
    from eagle3ops.config.inventory import Inventory
    from eagle3ops.config.base import validate

    bad = {"hosts": {"g": {"name": "g", "hostname": "g", "data_dir": "/d", "state_dir": "/s", "model_path": "/m",
                           "serving": {"image": "x", "served_model_name": "m",
                                       "watch": {"acceptance_floor": 0.8, "rollbak": True}}}}}
    with pytest.raises(ConfigError) as ei:
        validate(Inventory, bad, Path("hosts.yaml"), what="inventory", section="inventory")
    msg = str(ei.value)
    assert "watch.acceptance_floor" in msg and "rollbak" in msg


def test_the_gate_result_is_read_from_the_attempt_the_audit_names(tmp_path):
    """A head from elsewhere keeps its result in its own folder, not in the run's
    ``speculate/result.json``: the watch reads the attempt folder the audit entry names."""
    h = _host(tmp_path, 1)
    attempt = Path(h.data_dir) / "runs/r1/speculate/0123456789abcdef/w-outside"
    attempt.mkdir(parents=True)
    outside = {**GATE, "throughput_ratio": 1.1, "head_sha256": "0123456789abcdef" * 4}
    (attempt / "result.json").write_text(json.dumps(outside))
    with open(Path(h.state_dir) / "audit.jsonl", "a") as f:
        f.write(json.dumps({"kind": "speculate", "run": "r1", "verdict": "keep", "attempt_dir": str(attempt),
                            "figures": {"speculative_release": 3, "baseline_release": 2}}) + "\n")
    r = LocalHost(h)
    assert w.gate_result_for(r, 3) == outside
    assert w.gate_result_for(r, 2) == GATE  # an entry without attempt_dir: the run's own result.json
