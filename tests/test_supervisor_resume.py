"""The supervisor's control flow under faults and resumes, against a stand-in Docker client.

The stand-in (``StandInClient``) stands in for the docker SDK's ``DockerClient`` on the host: containers are dicts
with a status, and hooks raise where a real engine or signal would (SIGTERM arriving as
:class:`~eagle3ops.supervisor.Interrupted`, an ``nvidia-smi`` container failing). The health gate is replaced by
one that passes or fails on demand. The real-engine versions of these paths are in ``test_window_faults.py``; these
cover interleavings that are impractical to time there (a signal during the stop, a crash between two writes).
"""

from __future__ import annotations

import json

import docker.errors
import pytest

from eagle3ops.supervisor import HealthCheck, Interrupted, Plan, Releases, StageStep, Supervisor


class StandInContainer:
    def __init__(self, client, name, spec):
        self.client, self.name, self.spec, self.status = client, name, spec, "running"
        self.attrs = {"Name": "/" + name, "Image": "sha256:" + spec["image"],
                      "Config": {"Image": spec["image"], "Cmd": spec.get("command", []),
                                 "Labels": spec.get("labels", {})},
                      "HostConfig": {"NetworkMode": "host"}, "State": {"ExitCode": 0}, "RestartCount": 0}

    def stop(self, timeout=10):
        self.status = "exited"
        if self.client.on_stop:
            self.client.on_stop(self)

    def start(self):
        self.status = "running"

    def remove(self, force=False):
        self.client.containers.by_name.pop(self.name, None)

    def reload(self):
        pass

    def logs(self, **kw):
        return iter([]) if kw.get("stream") else b""

    def wait(self, timeout=None):
        self.client.stage_runs.append(self.name)
        if self.client.on_wait:
            self.client.on_wait()
        self.status = "exited"
        return {"StatusCode": self.client.stage_exit}


class StandInContainers:
    def __init__(self, client):
        self.client, self.by_name = client, {}

    def get(self, name):
        if name not in self.by_name:
            raise docker.errors.NotFound("no such container")
        return self.by_name[name]

    def run(self, image, detach=False, **kw):
        if not detach:  # the nvidia-smi probe
            return self.client.on_smi() if self.client.on_smi else b""
        c = StandInContainer(self.client, kw["name"], {"image": image, **kw})
        self.by_name[kw["name"]] = c
        self.client.created.append(image)
        return c


class StandInClient:
    def __init__(self, serving_image="vllm:1"):
        self.on_stop = self.on_wait = self.on_smi = None
        self.stage_exit, self.stage_runs, self.created = 0, [], []
        self.containers = StandInContainers(self)
        self.containers.run(serving_image, detach=True, name="vllm")
        self.created.clear()

    def ping(self):
        return True

    @property
    def serving(self):
        return self.containers.by_name.get("vllm")


@pytest.fixture
def gate(monkeypatch):
    """Stand-in health gate: passes unless the serving image is listed in ``gate.bad``."""
    class Gate:
        bad: set[str] = set()
        calls = 0

    def fake_gate(self):
        Gate.calls += 1
        c = self._serving()
        if c is None or c.status != "running" or c.spec["image"].split(":", 1)[-1] in Gate.bad or \
                c.spec["image"] in Gate.bad:
            raise RuntimeError(f"gate failed for {c and c.spec['image']}")
        self.journal.log("health", "ok")

    monkeypatch.setattr(Supervisor, "gate", fake_gate)
    Gate.bad = set()
    return Gate


def _plan(tmp_path, kind="window", gpus=0, **kw):
    stages = [StageStep(name=n, spec={"image": "pipeline:1", "name": f"stage-{n}"}, timeout_s=10)
              for n in ("prepare", "extract")] if kind == "window" else []
    plan = Plan(window_id="w1", kind=kind, host="h", user="u", command="c", state_dir=str(tmp_path / "state"),
                serving_container="vllm", health=HealthCheck(port=1, model="m", timeout_s=1), gpus=gpus,
                stages=stages, **kw)
    wdir = tmp_path / "w1"
    wdir.mkdir(exist_ok=True)
    return plan, wdir


def _steps(wdir):
    return [(e["step"], e["event"]) for e in map(json.loads, (wdir / "journal.jsonl").read_text().splitlines())]


def _term(*_):
    raise Interrupted("supervisor received signal 15")


def test_signal_during_stop_still_restores_serving(tmp_path, gate):
    plan, wdir = _plan(tmp_path)
    client = StandInClient()
    client.on_stop = _term
    res = Supervisor(plan, client, wdir).run()
    assert res["outcome"] == "interrupted" and res["serving_running"] is True
    assert client.serving.status == "running" and client.stage_runs == []
    assert ("restore", "ok") in _steps(wdir)


def test_failing_gpu_check_does_not_keep_serving_down(tmp_path, gate):
    plan, wdir = _plan(tmp_path, gpus=8)
    client = StandInClient()

    def smi():
        raise docker.errors.ContainerError("smi", 9, "nvidia-smi", "pipeline:1", b"NVML error")

    client.on_smi = smi
    res = Supervisor(plan, client, wdir).run()
    assert res["outcome"] == "ok" and res["serving_running"] is True
    assert ("gpu-release", "warn") in _steps(wdir)


def test_signal_during_stage_is_interrupted_not_a_timeout(tmp_path, gate):
    plan, wdir = _plan(tmp_path)
    client = StandInClient()
    client.on_wait = _term
    res = Supervisor(plan, client, wdir).run()
    assert res["outcome"] == "interrupted" and "signal 15" in res["error"], res
    assert res["serving_running"] is True


def test_resume_after_restore_began_does_not_rerun_stages(tmp_path, gate):
    plan, wdir = _plan(tmp_path)
    client = StandInClient()
    client.stage_exit = 3
    sup = Supervisor(plan, client, wdir)
    sup.record()
    sup.stop_serving()
    assert sup.run_stage(plan.stages[0]) is False
    sup.journal.log("restore", "start")  # the supervisor died here (e.g. a daemon restart during the restore)
    client.stage_runs.clear()
    res = Supervisor(plan, client, wdir).run()  # resumed by the restart policy
    assert client.stage_runs == [], "no stage may run once serving is being restored"
    assert res["outcome"] == "failed" and "stage prepare" in res["error"] and res["serving_running"] is True


def test_serving_not_running_keeps_the_lock(tmp_path, gate):
    plan, wdir = _plan(tmp_path)
    (tmp_path / "state" / "lock").mkdir(parents=True)
    (tmp_path / "state" / "lock" / "details.json").write_text(json.dumps({"window_id": "w1"}))
    client = StandInClient()
    gate.bad = {"1"}  # vllm:1 never passes: restore fails, and no earlier release exists
    res = Supervisor(plan, client, wdir).run()
    assert res["outcome"] == "failed" and "SERVING IS NOT HEALTHY" in res["error"]
    assert res["serving_healthy"] is False
    assert (tmp_path / "state" / "lock").exists()


def test_resumed_rollback_keeps_its_target(tmp_path, gate):
    plan, wdir = _plan(tmp_path, kind="rollback")
    rel = Releases(tmp_path / "state")
    for n in (1, 2, 3):
        rel.add({"image": f"vllm:{n}", "name": "vllm"}, None, "w0")
        rel.set_current(n)
    client = StandInClient("vllm:3")
    assert Supervisor(plan, client, wdir).replace_serving() == "serving release 2"
    # Killed before result.json; resumed: it must not pick "the one before current" again (3).
    assert Supervisor(plan, client, wdir).replace_serving() == "serving release 2"
    assert rel.current() == 2 and client.serving.spec["image"] == "vllm:2"
    assert rel.history() == [1, 2, 3, 2]


def test_resumed_release_adds_no_second_release(tmp_path, gate):
    plan, wdir = _plan(tmp_path, kind="release", new_spec={"image": "vllm:new", "name": "vllm"})
    client = StandInClient()
    sup = Supervisor(plan, client, wdir)
    sup.record()
    target = sup.releases.add(plan.new_spec, None, "w1")
    sup.journal.log("switch", "start", to_release=target)  # died right after this
    assert Supervisor(plan, client, wdir).replace_serving() == f"serving release {target}"
    assert Releases(tmp_path / "state").numbers() == [1, 2] and client.serving.spec["image"] == "vllm:new"


def test_failed_release_rolls_back_to_last_live_and_is_never_a_target(tmp_path, gate):
    plan, wdir = _plan(tmp_path, kind="release", new_spec={"image": "vllm:broken", "name": "vllm"})
    client = StandInClient()
    gate.bad = {"broken"}
    msg = Supervisor(plan, client, wdir).replace_serving()
    assert msg == "release 2 failed its health gate; rolled back to release 1"
    rel = Releases(tmp_path / "state")
    assert rel.current() == 1 and 2 not in rel.history() and client.serving.spec["image"] == "sha256:vllm:1"


def test_live_release_that_fails_a_restore_gate_is_skipped_later(tmp_path, gate):
    rel = Releases(tmp_path / "state")
    for n in (1, 2):
        rel.add({"image": f"vllm:{n}", "name": "vllm"}, None, "w0")
        rel.set_current(n)
    plan, wdir = _plan(tmp_path)
    client = StandInClient("vllm:2")
    gate.bad = {"2"}
    res = Supervisor(plan, client, wdir).run()
    assert res["release"] == 1 and "rolled back to release 1" in res["error"]
    assert rel.fallbacks(1) == [], "release 2 failed its gate: no rollback may pick it"


def test_torn_history_line_is_skipped(tmp_path):
    rel = Releases(tmp_path)
    for t in "ab":
        rel.set_current(rel.add({"image": t}, None, "w"))
    with rel.history_file.open("a") as f:
        f.write('{"release": 1, "t"')
    assert rel.fallbacks(2) == [1]


def test_stage_log_survives_a_silent_stretch(tmp_path, gate):
    """A follow stream that ends while the stage still runs (the client's read timeout after a silent stretch) is
    followed again, so later output still reaches ``<stage>.log``."""
    plan, wdir = _plan(tmp_path)
    client = StandInClient()
    streams = [[b"before the silence\n"], [], [b"after the silence\n"]]
    calls = []

    def logs(self, **kw):
        if not kw.get("stream"):
            return b""
        calls.append(kw.get("since"))
        chunks = streams.pop(0) if streams else []
        if not streams:
            self.status = "exited"
        return iter(chunks)

    def wait(self, timeout=None):
        import time as _t
        deadline = _t.time() + 10
        while self.status == "running" and _t.time() < deadline:
            _t.sleep(0.05)
        return {"StatusCode": 0}

    StandIn = StandInContainer
    orig_logs, orig_wait = StandIn.logs, StandIn.wait
    StandIn.logs, StandIn.wait = logs, wait
    try:
        sup = Supervisor(plan, client, wdir)
        assert sup.run_stage(plan.stages[0]) is True
    finally:
        StandIn.logs, StandIn.wait = orig_logs, orig_wait
    text = (wdir / "prepare.log").read_text()
    assert "before the silence" in text and "after the silence" in text
    assert calls[0] is None and all(c is not None for c in calls[1:])
