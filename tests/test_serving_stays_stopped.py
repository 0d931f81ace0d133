"""On the sandbox's real Docker engine (moby #13275): serving that does not stay stopped.

An outside restarter (a cron or systemd job, a restart policy, an operator) starts serving again while a stage runs.
The supervisor must notice during the stage, stop serving again, and say so in the result; serving started again
more often than the window tolerates stops the stages safely (the stage container removed) and restores serving.

The supervisor runs in this process (the code under test) against the sandbox engine's socket, like
tests/test_release_fidelity.py; serving is the STAND-IN OpenAI server (tests/data/standin_openai_server.py, not
vLLM) in a container of the serving image, so that each test stays well under a minute; the stage is a container
that sleeps.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from eagle3ops import health as gate
from eagle3ops.config.plan import HealthCheck, Plan, StageStep

pytestmark = [pytest.mark.sandbox, pytest.mark.images, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
PORT, MODEL = 18093, "standin-tiny"


def _docker(h, *args, check=True):
    return subprocess.run(["docker", "-H", h.docker_host, *args], capture_output=True, text=True, timeout=120,
                          check=check)


def _status(h, name) -> str:
    return _docker(h, "inspect", "--format", "{{.State.Status}}", name, check=False).stdout.strip()


@pytest.fixture
def standin_serving(deployed, tmp_path):
    """(host, serving container name): the stand-in server in a container of the serving image, host network. Once
    started again (its ``--restart-dir`` holds ``started``), it does not act on SIGTERM for 60 s, as a vLLM still
    loading its weights did not when the window stopped it again."""
    h, _ = deployed
    name = f"e3-guard-{uuid.uuid4().hex[:6]}"
    restarts = tmp_path / "restarts"
    restarts.mkdir(mode=0o777)
    restarts.chmod(0o777)  # the container's user writes the marker
    _docker(h, "run", "--detach", "--name", name, "--network", "host",
            "--volume", f"{REPO / 'tests/data'}:/standin:ro", "--volume", f"{restarts}:/restarts",
            "--entrypoint", "python3", h.serving.image,
            "/standin/standin_openai_server.py", "--port", str(PORT), "--model", MODEL, "--restart-dir", "/restarts")
    try:
        gate.wait_healthy(f"http://127.0.0.1:{PORT}", MODEL, timeout_s=60, interval_s=0.5)
        yield h, name
    finally:
        _docker(h, "rm", "--force", name, check=False)


def _plan(h, tmp_path, name, stage_s: int, stop_timeout_s: int = 5) -> tuple[Plan, Path]:
    wid = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-extract-{uuid.uuid4().hex[:6]}"
    wdir = tmp_path / "state" / "windows" / wid
    wdir.mkdir(parents=True)
    stage = StageStep(name="prepare", timeout_s=300, spec={
        "name": f"{name}-stage", "image": h.serving.image, "entrypoint": ["sleep"], "command": [str(stage_s)],
        "network_mode": "host"})
    plan = Plan(window_id=wid, kind="window", host=h.name, user="pytest", command="pytest guard",
                state_dir=str(tmp_path / "state"), serving_container=name, stop_timeout_s=stop_timeout_s, budget_s=900,
                stages=[stage], health=HealthCheck(port=PORT, model=MODEL, timeout_s=60, interval_s=0.5))
    return plan, wdir


def _restarter(h, name, times: int, stop: threading.Event, seen: list[float],
               beside: list[float] | None = None) -> None:
    """An outside restarter: whenever serving is stopped while the stage runs, start it again (up to ``times``).
    ``beside``: for each start, the seconds serving then ran beside the stage (until it no longer runs)."""
    while not stop.is_set() and len(seen) < times:
        if _status(h, f"{name}-stage") == "running" and _status(h, name) == "exited":
            _docker(h, "start", name, check=False)
            seen.append(time.time())
            while beside is not None and _status(h, name) == "running" and time.time() - seen[-1] < 60:
                time.sleep(0.2)
            if beside is not None:
                beside.append(time.time() - seen[-1])
        time.sleep(0.5)


def _supervisor(plan, h, wdir):
    import docker

    from eagle3ops.supervisor.runner import Supervisor

    sup = Supervisor(plan, docker.DockerClient(base_url=h.docker_host, timeout=120), wdir)
    sup.guard_poll_s = 1.0  # the production default polls less often; the test's stage is short
    return sup


def test_serving_started_again_during_a_stage_is_stopped_again_and_said(standin_serving, tmp_path):
    h, name = standin_serving
    # a graceful timeout long enough to tell a wait on it from a kill (the window's own stop is answered at once)
    plan, wdir = _plan(h, tmp_path, name, stage_s=14, stop_timeout_s=15)
    stop, seen, beside = threading.Event(), [], []
    th = threading.Thread(target=_restarter, args=(h, name, 1, stop, seen, beside), daemon=True)
    th.start()
    try:
        res = _supervisor(plan, h, wdir).run()
    finally:
        stop.set()
        th.join(timeout=10)
    assert seen, "the outside restarter never saw the stage running"
    guard = [w for w in res["warnings"] if "started again" in w]
    assert guard and "prepare" in guard[0] and "killed it" in guard[0], res
    assert res["outcome"] == "ok" and res["serving_healthy"] is True, res
    assert res["outside_restarts"] == 1, res
    # killed, not waited for: the restarted server (deaf to SIGTERM while it starts) ran beside the stage for a poll
    # or two, not for the 15 s graceful timeout
    assert beside and beside[0] < 8, f"serving ran {beside[0]:.1f} s beside the stage"
    journal = [json.loads(x) for x in (wdir / "journal.jsonl").read_text().splitlines()]
    stopped_again = [e for e in journal if e["step"] == "serving-guard" and e["event"] == "warn"]
    assert stopped_again and stopped_again[0]["epoch"] - seen[0] < 10, "noticed within seconds"


def test_serving_that_keeps_being_started_stops_the_stages_safely(standin_serving, tmp_path):
    h, name = standin_serving
    plan, wdir = _plan(h, tmp_path, name, stage_s=120)
    stop, seen = threading.Event(), []
    th = threading.Thread(target=_restarter, args=(h, name, 10, stop, seen), daemon=True)
    th.start()
    t0 = time.time()
    try:
        res = _supervisor(plan, h, wdir).run()
    finally:
        stop.set()
        th.join(timeout=10)
    assert time.time() - t0 < 100, "the stage was stopped, not run to its end"
    assert res["outcome"] == "failed" and "kept being started" in res["error"], res
    assert res["stages"]["prepare"].startswith("failed") and res["serving_healthy"] is True, res
    assert _status(h, f"{name}-stage") == "", "no stage container left behind"
    assert _status(h, name) == "running"
