"""On the sandbox (real sshd, real dockerd): the truth about serving is the live server.

``status`` and ``recover`` read the live serving container and its ``/health`` on the host and say when the newest
window's record disagrees; ``recover`` starts serving that was stopped outside a window and health-gates it (on the
STAND-IN serving container of ``standin_deployed``, NOT vLLM: the subject is the live container and the record, and
a recover of the real vLLM container cost a vLLM start of every CI run); a release never switches serving when the
live container failed its own health gate at the record step.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3ops_dev import demo
from eagle3ops.cli import app
from eagle3ops.config.plan import HealthCheck, Plan, ReleaseChange
from eagle3ops.supervisor.runner import Supervisor
from eagle3ops.window.common import paths

pytestmark = [pytest.mark.sandbox, pytest.mark.images, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
INVENTORY = REPO / "deploy/hosts.yaml"


def _docker(h, *args, check=True):
    return subprocess.run(["docker", "-H", h.docker_host, *args], capture_output=True, text=True, timeout=300,
                          check=check)


def _cli(*args, inventory: Path = INVENTORY):
    r = CliRunner().invoke(app, [*args, "--inventory", str(inventory)])
    return r.exit_code, r.output


@pytest.fixture
def recorded_ok_window(standin_deployed):
    """The newest window of the stand-in serving host: one that finished ok with serving running (its record),
    removed after."""
    h, _ = standin_deployed
    wid = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-extract-{uuid.uuid4().hex[:6]}"
    wdir = Path(paths(h, wid)["window"])
    windows_existed = wdir.parent.exists()
    wdir.mkdir(parents=True)
    (wdir / "journal.jsonl").write_text("")
    (wdir / "result.json").write_text(json.dumps({
        "window_id": wid, "kind": "window", "outcome": "ok", "error": "", "stages": {}, "stage_seconds": {},
        "downtime_s": 1.0, "wall_s": 2.0, "serving_running": True, "serving_healthy": True, "serving": "container",
        "release": None, "warnings": []}))
    owner = Path(h.state_dir).stat()  # as the supervisor leaves them: owned by the state dir's owner (the SSH user)
    for p in (wdir.parent, wdir, wdir / "journal.jsonl", wdir / "result.json"):
        os.chown(p, owner.st_uid, owner.st_gid)
    try:
        yield h, wid
    finally:
        import shutil

        shutil.rmtree(wdir if windows_existed else wdir.parent, ignore_errors=True)
        if _docker(h, "inspect", "--format", "{{.State.Status}}", h.serving.container,
                   check=False).stdout.strip() != "running":
            import standin_serving

            standin_serving.start_container(h, timeout_s=60)  # made again from its spec, health-gated


def test_status_and_recover_read_the_live_container(recorded_ok_window, standin_inventory):
    h, wid = recorded_ok_window
    assert demo.serving_healthy(h, timeout=10)
    _docker(h, "stop", "--time", "30", h.serving.container)  # stopped outside any window (an operator)

    code, out = _cli("status", h.name, inventory=standin_inventory)
    assert code == 0, out
    assert f"live serving: container {h.serving.container!r} is exited" in out, out
    assert "DISAGREES" in out and wid in out, out

    code, out = _cli("recover", h.name, inventory=standin_inventory)
    assert code == 0, out
    assert "DISAGREES" in out and f"starting {h.serving.container!r}" in out, out
    assert "serving is running and healthy" in out, out
    assert demo.serving_healthy(h, timeout=10, completion=True)

    code, out = _cli("status", h.name, inventory=standin_inventory)
    assert code == 0 and "is running, /health 200" in out and "DISAGREES" not in out, out


def test_release_refused_when_the_live_container_failed_its_own_gate(deployed, tmp_path):
    """A live container that is not the current release is gated at the record step; when it fails that gate a
    release must not go on to remove it and switch serving (the release is a change of a container known bad)."""
    import docker

    h, _ = deployed
    name, port = f"e3-livefail-{uuid.uuid4().hex[:6]}", 18097
    # A "server" that crashes 3 s after it starts: running when recorded, crashed during its own gate.
    _docker(h, "run", "--detach", "--name", name, "--network", "host", "--entrypoint", "sleep",
            h.serving.image, "3")
    try:
        before = json.loads(_docker(h, "inspect", name).stdout)[0]["Id"]
        wid = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-release-{uuid.uuid4().hex[:6]}"
        wdir = tmp_path / "state" / "windows" / wid
        wdir.mkdir(parents=True)
        plan = Plan(window_id=wid, kind="release", host=h.name, user="pytest", command="pytest release",
                    state_dir=str(tmp_path / "state"), serving_container=name, stop_timeout_s=5, budget_s=600,
                    health=HealthCheck(port=port, model="tiny-llama", timeout_s=30),
                    change=ReleaseChange(env={"E3_TRY": "1"}))
        res = Supervisor(plan, docker.DockerClient(base_url=h.docker_host, timeout=120), wdir).run()
        after = json.loads(_docker(h, "inspect", name).stdout)[0]["Id"]
        assert after == before, "the release removed the live container and switched serving"
        assert res["outcome"] == "failed", res
        assert "failed its own health gate" in res["error"] and "not switched" in res["error"], res
        journal = [json.loads(x) for x in (wdir / "journal.jsonl").read_text().splitlines()]
        assert not [e for e in journal if e["step"] == "switch"], journal
    finally:
        _docker(h, "rm", "--force", name, check=False)
