"""The supervisor's control flow under faults and resumes, against a stand-in Docker client.

The stand-in (``StandInClient``) stands in for the docker SDK's ``DockerClient`` on the host: containers are dicts
with a status, and hooks raise where a real engine or signal would (SIGTERM arriving as
:class:`~eagle3ops.supervisor.runner.Interrupted`, an ``nvidia-smi`` container failing). The health gate is replaced by
one that passes or fails on demand. The real-engine versions of these paths are in ``test_window_faults.py``; these
cover interleavings that are impractical to time there (a signal during the stop, a crash between two writes).
"""

from __future__ import annotations

import json

import docker.errors
import pytest

from eagle3ops.config.plan import HealthCheck, Plan, ReleaseChange, StageStep
from eagle3ops.health import GateFailed
from eagle3ops.supervisor.releases import Releases
from eagle3ops.supervisor.runner import Interrupted, Supervisor


class StandInContainer:
    def __init__(self, client, name, spec):
        self.client, self.name, self.spec, self.status = client, name, spec, "running"
        self.attrs = {"Id": "c" * 64, "Name": "/" + name, "Image": "sha256:" + spec["image"].removeprefix("sha256:"),
                      "Config": {"Image": spec["image"], "Cmd": spec.get("command", []),
                                 "Labels": spec.get("labels", {}), **spec.get("config", {})},
                      "HostConfig": {"NetworkMode": "host", **spec.get("host_config", {})},
                      "State": {"ExitCode": 0}, "RestartCount": 0}

    def stop(self, timeout=10):
        self.client.stop_timeouts.append((self.name, timeout))
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


class StandInAPI:
    """The low-level API calls the supervisor recreates serving with (Engine API ``POST /containers/create``)."""

    def __init__(self, client):
        self.client, self.bodies = client, []

    def create_container_from_config(self, body, name=None):
        self.bodies.append(body)
        hc = {k: v for k, v in body["HostConfig"].items()}
        cfg = {k: v for k, v in body.items() if k not in ("HostConfig", "NetworkingConfig", "Image", "Cmd", "Labels")}
        c = StandInContainer(self.client, name, {"image": body["Image"], "command": body.get("Cmd") or [],
                                                 "labels": body.get("Labels") or {}, "config": cfg,
                                                 "host_config": hc})
        c.status = "created"
        self.client.containers.by_name[name] = c
        self.client.created.append(body["Image"])
        return {"Id": name}

    def start(self, cid):
        self.client.containers.by_name[cid].status = "running"

    def connect_container_to_network(self, cid, net, **kw):
        pass


class StandInImage:
    def __init__(self, ref):
        self.id = ref if ref.startswith("sha256:") else "sha256:" + ref
        self.attrs = {"Config": {}}


class StandInImages:
    def get(self, ref):
        return StandInImage(ref)


class StandInClient:
    def __init__(self, serving_image="vllm:1", release: int | None = None):
        """Serving runs ``serving_image``; ``release``: the live container is that retained release (eagle3ops
        labelled it), as on a host where releases are recorded."""
        self.on_stop = self.on_wait = self.on_smi = None
        self.stage_exit, self.stage_runs, self.created = 0, [], []
        #: (container name, graceful timeout) of each ``stop``, in order
        self.stop_timeouts: list[tuple[str, int]] = []
        self.containers = StandInContainers(self)
        self.api, self.images = StandInAPI(self), StandInImages()
        labels = {"io.eagle3ops.release": str(release)} if release is not None else {}
        self.containers.run(serving_image, detach=True, name="vllm", labels=labels)
        self.created.clear()

    def ping(self):
        return True

    @property
    def serving(self):
        return self.containers.by_name.get("vllm")


def _rec(image, name="vllm"):
    """A release record (the whole container, as :func:`eagle3ops.commands.serving.container_record` keeps it)."""
    return {"Name": name, "ImageId": "sha256:" + image, "Config": {"Image": image, "Cmd": [], "Labels": {}},
            "HostConfig": {"NetworkMode": "host"}, "Networks": {}}


@pytest.fixture
def gate(monkeypatch):
    """Stand-in health gate: passes unless the serving image is listed in ``gate.bad``."""
    class Gate:
        bad: set[str] = set()
        calls = 0
        timeouts: list = []

    def fake_gate(self, timeout_s=None):
        Gate.calls += 1
        Gate.timeouts.append(timeout_s)
        c = self._serving()
        if c is None or c.status != "running" or c.spec["image"].split(":", 1)[-1] in Gate.bad or \
                c.spec["image"] in Gate.bad:
            raise GateFailed(f"gate failed for {c and c.spec['image']}")
        self.journal.log("health", "ok")

    monkeypatch.setattr(Supervisor, "gate", fake_gate)
    Gate.bad = set()
    Gate.timeouts = []
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
        rel.add(_rec(f"vllm:{n}"), "w0")
        rel.set_current(n)
    client = StandInClient("vllm:3", release=3)
    assert Supervisor(plan, client, wdir).replace_serving() == "serving release 2"
    # Killed before result.json; resumed: it must not pick "the one before current" again (3).
    assert Supervisor(plan, client, wdir).replace_serving() == "serving release 2"
    assert rel.current() == 2 and client.serving.spec["image"] == "vllm:2"
    assert rel.history() == [1, 2, 3, 2]


def test_resumed_release_adds_no_second_release(tmp_path, gate):
    plan, wdir = _plan(tmp_path, kind="release", change=ReleaseChange(image="vllm:new"))
    client = StandInClient()
    sup = Supervisor(plan, client, wdir)
    sup.record()
    target = sup.releases.add(sup._new_release(), "w1")
    sup.journal.log("switch", "start", to_release=target)  # died right after this
    assert Supervisor(plan, client, wdir).replace_serving() == f"serving release {target}"
    assert Releases(tmp_path / "state").numbers() == [1, 2] and client.serving.spec["image"] == "vllm:new"


def test_failed_release_rolls_back_to_last_live_and_is_never_a_target(tmp_path, gate):
    plan, wdir = _plan(tmp_path, kind="release", change=ReleaseChange(image="vllm:broken"))
    client = StandInClient()
    gate.bad = {"broken"}
    msg = Supervisor(plan, client, wdir).replace_serving()
    assert msg == "release 2 failed its health gate; rolled back to release 1"
    rel = Releases(tmp_path / "state")
    assert rel.current() == 1 and 2 not in rel.history() and client.serving.spec["image"] == "vllm:1"


def test_live_release_that_fails_a_restore_gate_is_skipped_later(tmp_path, gate):
    rel = Releases(tmp_path / "state")
    for n in (1, 2):
        rel.add(_rec(f"vllm:{n}"), "w0")
        rel.set_current(n)
    plan, wdir = _plan(tmp_path)
    client = StandInClient("vllm:2", release=2)
    gate.bad = {"2"}
    res = Supervisor(plan, client, wdir).run()
    assert res["release"] == 1 and "rolled back to release 1" in res["error"]
    assert rel.fallbacks(1) == [], "release 2 failed its gate: no rollback may pick it"


def test_torn_history_line_is_skipped(tmp_path):
    rel = Releases(tmp_path)
    for t in "ab":
        rel.set_current(rel.add(_rec(t), "w"))
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


def test_a_stage_containers_log_is_written_with_its_secrets_masked(tmp_path, gate):
    """A stage that prints serving's secrets (an engine echoing its arguments and environment: ``--api-key K``,
    ``--api-key=K``, ``--hf-token``, ``VLLM_API_KEY``, ``HF_TOKEN``, the inventory-named ``ORG_TOKEN``), a value cut
    between two chunks of the log stream and a last line without its newline: ``<stage>.log`` holds every line,
    each secret masked by the one redaction rule."""
    from secretscan import ORG_NAME, leaks, planted_args, planted_env

    plan, wdir = _plan(tmp_path, secret_env=[ORG_NAME])
    client = StandInClient()
    line = ("engine args: " + " ".join(planted_args()) + " env: "
            + " ".join(f"{k}={v}" for k, v in planted_env().items()) + "\n").encode()
    cut = line.index(planted_args()[1].encode()) + 5
    chunks = [b"loading\n", line[:cut], line[cut:], b"last words --api-key=" + planted_args()[1].encode()]

    def logs(self, **kw):
        if not kw.get("stream"):
            return b""
        self.status = "exited"
        return iter(chunks)

    orig = StandInContainer.logs
    StandInContainer.logs = logs
    try:
        assert Supervisor(plan, client, wdir).run_stage(plan.stages[0]) is True
    finally:
        StandInContainer.logs = orig
    text = (wdir / "prepare.log").read_text()
    assert leaks(text) == [], text
    assert text.startswith("loading\nengine args: --api-key *** --api-key=*** --hf-token *** env: VLLM_API_KEY=***")
    assert text.endswith("last words --api-key=***"), text


# ---- window faults ----------------------------------------------------------------------------------------------

class FlakyEngineClient(StandInClient):
    """A stand-in engine that goes away (a daemon restart) when :meth:`go_down` is called and answers again
    ``seconds`` later: meanwhile every API call is refused, as the docker SDK refuses it (requests ConnectionError)."""

    def __init__(self, serving_image="vllm:1"):
        super().__init__(serving_image)
        self.up_at = 0.0
        real_get, real_run = self.containers.get, self.containers.run

        def get(name):
            self._check()
            return real_get(name)

        def run(image, detach=False, **kw):
            self._check()
            return real_run(image, detach=detach, **kw)

        self.containers.get, self.containers.run = get, run

    def go_down(self, seconds=0.3):
        import time as _t
        self.up_at = _t.time() + seconds

    def _check(self):
        import time as _t
        import requests
        if _t.time() < self.up_at:
            raise requests.exceptions.ConnectionError("('Connection aborted.', ConnectionRefusedError(111, "
                                                      "'Connection refused'))")

    def ping(self):
        self._check()
        return True


def _history_lines(tmp_path):
    f = tmp_path / "state" / "releases" / "history.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def _fast(sup):
    sup.engine_poll_s = 0.05
    sup.engine_wait_s = 10
    return sup


def test_engine_restart_during_restore_is_waited_out_not_a_verdict(tmp_path, gate):
    """A daemon restart makes the restore see "connection refused"; the supervisor waits for the
    engine and restores the same release; no failure mark lands in the release history."""
    plan, wdir = _plan(tmp_path)
    client = FlakyEngineClient()
    stages_done = []

    def on_wait():
        stages_done.append(1)
        if len(stages_done) == 2:  # the engine restarts while the last stage ends
            client.go_down(3.0)

    client.on_wait = on_wait
    try:
        res = _fast(Supervisor(plan, client, wdir)).run()
    except SystemExit:
        res = None
    assert [e for e in _history_lines(tmp_path) if e.get("failed")] == [], "an engine error is not a verdict"
    assert res is not None and res["outcome"] == "ok" and res["serving_healthy"] is True, res
    assert ("rollback", "start") not in _steps(wdir)
    assert any("Docker engine unreachable" in w for w in res["warnings"])


def test_engine_down_during_rollback_retries_the_same_release(tmp_path, gate):
    """After a real gate failure of the live release, the engine goes away during the rollback: the
    rollback waits for it and brings back the most recently live release, not the next candidate within ms."""
    rel = Releases(tmp_path / "state")
    for n in (1, 2, 3):
        rel.add(_rec(f"vllm:{n}"), "w0")
        rel.set_current(n)
    plan, wdir = _plan(tmp_path)
    client = FlakyEngineClient("vllm:3")
    gate.bad = {"3"}
    real = Supervisor.gate

    def gate_then_engine_restart(self, timeout_s=None):
        try:
            real(self, timeout_s=timeout_s)
        except GateFailed:
            if not client.up_at:  # once: the engine restarts right after the live release failed its gate
                client.go_down(0.3)
            raise

    Supervisor.gate = gate_then_engine_restart
    try:
        res = _fast(Supervisor(plan, client, wdir)).run()
    finally:
        Supervisor.gate = real
    assert res["release"] == 2 and "rolled back to release 2" in res["error"], res
    assert [e["to_release"] for e in map(json.loads, (wdir / "journal.jsonl").read_text().splitlines())
            if e["step"] == "rollback" and e["event"] == "start"] == [2]
    assert [e["release"] for e in _history_lines(tmp_path) if e.get("failed")] == [3]


def _daemon_restart_mid_stage(client, sup_box, stage="stage-prepare"):
    """An ``on_wait`` hook: while ``stage`` runs, the daemon restarts as ``systemctl restart docker`` does it: its API
    goes away first, then it stops its containers, the supervisor's with SIGTERM (:class:`Interrupted`, as the
    signal handler raises it). The stage container is stopped by the daemon, not removed: while the engine is down
    neither ``stop`` nor ``remove`` reaches it."""
    def through_engine(method):
        def call(*a, **kw):
            client._check()
            return method(*a, **kw)
        return call

    def on_wait():
        if client.stage_runs.count(stage) != 1:
            return
        c = client.containers.by_name[stage]
        c.status = "exited"
        c.stop, c.remove = through_engine(c.stop), through_engine(c.remove)
        client.go_down(3600)
        sup_box[0].stop_requested = True
        raise Interrupted("supervisor received signal 15")

    return on_wait


def test_engine_restart_mid_stage_resumes_the_stage_in_the_same_window(tmp_path, gate):
    """A Docker daemon restart during a stage: the supervisor exits for its restart policy without beginning the
    restore (nothing can be restored while the engine is down); resumed once the engine is back, it removes the stage
    container the restart left, runs that stage again and the rest, restores serving once, and the result names the
    outage and how long it lasted."""
    plan, wdir = _plan(tmp_path)
    client, box = FlakyEngineClient(), []
    client.on_wait = _daemon_restart_mid_stage(client, box)
    box.append(_fast(Supervisor(plan, client, wdir)))
    with pytest.raises(SystemExit) as exited:
        box[0].run()
    assert exited.value.code == 75
    assert ("restore", "start") not in _steps(wdir), "no restore can begin while the engine is down"
    assert client.containers.by_name["stage-prepare"].status == "exited"
    client.up_at = 0.0  # the daemon is back and restarts the supervisor (restart policy on-failure)
    res = _fast(Supervisor(plan, client, wdir)).run()
    assert res["outcome"] == "ok" and res["stages"] == {"prepare": "ok", "extract": "ok"}, res
    assert client.stage_runs.count("stage-prepare") == 2 and client.stage_runs.count("stage-extract") == 1
    assert not [n for n in client.containers.by_name if n.startswith("stage-")], "no stage container is left"
    assert _steps(wdir).count(("restore", "start")) == 1 and res["serving_healthy"] is True
    [outage] = res["engine_outages"]
    assert outage["step"] == "prepare" and outage["seconds"] >= 0, outage
    assert "Docker engine" in res["outcome_note"] and "prepare" in res["outcome_note"], res
    audit = [json.loads(x) for x in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]
    assert audit[-1]["engine_outages"] == res["engine_outages"]


def test_engine_back_after_the_budget_ends_the_window_restored_and_named(tmp_path, gate):
    """The bounded side: the engine comes back once the maintenance budget is spent: no stage is run again, the
    stage container the restart left is removed, serving is restored and the result names the outage."""
    plan, wdir = _plan(tmp_path, budget_s=30)
    client, box = FlakyEngineClient(), []
    client.on_wait = _daemon_restart_mid_stage(client, box)
    box.append(_fast(Supervisor(plan, client, wdir)))
    with pytest.raises(SystemExit):
        box[0].run()
    client.up_at = 0.0
    late = _fast(Supervisor(plan, client, wdir))
    late.deadline = 0.0  # the engine came back after the budget ended
    res = late.run()
    assert res["outcome"] == "failed" and res["stages"] == {"prepare": "not run (budget)"}, res
    assert client.stage_runs.count("stage-prepare") == 1
    assert not [n for n in client.containers.by_name if n.startswith("stage-")], "no stage container is left"
    assert res["serving_healthy"] is True and client.serving.status == "running"
    assert [o["step"] for o in res["engine_outages"]] == ["prepare"] and "Docker engine" in res["outcome_note"]


def test_a_passed_restore_gate_clears_an_earlier_failure_mark(tmp_path, gate):
    """A release marked failed earlier that passes its restore gate is live again: the next rollback may
    pick it (main kept skipping it and rolled back to an older release)."""
    rel = Releases(tmp_path / "state")
    for n in (1, 2):
        rel.add(_rec(f"vllm:{n}"), "w0")
        rel.set_current(n)
    rel.mark_failed(2, "connection refused (a daemon restart, recorded by an older supervisor)")
    plan, wdir = _plan(tmp_path)
    res = Supervisor(plan, StandInClient("vllm:2", release=2), wdir).run()
    assert res["outcome"] == "ok"
    rel.set_current(rel.add(_rec("vllm:3"), "w2"))
    assert rel.fallbacks(3) == [2, 1]


def test_a_created_container_is_not_recorded_as_a_live_release(tmp_path, gate):
    """Serving left in state "created" (never started) is retained as a release but never live: a later
    rollback does not "succeed" to it."""
    plan, wdir = _plan(tmp_path, kind="release", change=ReleaseChange(image="vllm:new"))
    client = StandInClient()
    client.serving.status = "created"
    res = Supervisor(plan, client, wdir).run()
    assert res["outcome"] == "ok" and res["release"] == 2, res
    rel = Releases(tmp_path / "state")
    assert rel.history() == [2], "only a running container that passed its gate becomes a live release"
    assert any("'created'" in w for w in res["warnings"])
    plan2 = plan.model_copy(update={"window_id": "w2", "kind": "rollback", "change": None})
    (tmp_path / "w2").mkdir()
    res2 = Supervisor(plan2, client, tmp_path / "w2").run()
    assert res2["outcome"] == "failed" and "no release that was live before" in res2["error"], res2
    assert client.serving.spec["image"] == "vllm:new" and rel.current() == 2


def test_every_warning_is_in_the_result_and_the_audit_entry(tmp_path, gate):
    """A stage container whose removal failed after a successful window is reported, whole, in
    result.json and the audit entry."""
    plan, wdir = _plan(tmp_path)
    client = StandInClient()
    why = "removal of container stage-prepare is already in progress " + "x" * 600
    orig = StandInContainer.remove

    def remove(self, force=False):
        if self.name == "stage-prepare":
            raise docker.errors.APIError(why)
        orig(self, force)

    StandInContainer.remove = remove
    try:
        res = Supervisor(plan, client, wdir).run()
    finally:
        StandInContainer.remove = orig
    assert res["outcome"] == "ok"
    [w] = [w for w in res.get("warnings", []) if "stage-prepare" in w]
    assert why in w and "docker rm --force stage-prepare" in w
    audit = [json.loads(x) for x in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]
    assert audit[-1]["warnings"] == res["warnings"]
    assert json.loads((wdir / "result.json").read_text())["warnings"] == res["warnings"]


def test_stages_leave_the_restore_its_reserved_share_of_the_budget(tmp_path, gate):
    """One budget for the whole downtime: stages end by budget - restore reserve (here 100 - 30 s)."""
    plan, wdir = _plan(tmp_path, budget_s=100)
    plan = plan.model_copy(update={
        "health": HealthCheck(port=1, model="m", timeout_s=30),
        "stages": [s.model_copy(update={"timeout_s": 1000}) for s in plan.stages]})
    client = StandInClient()
    res = Supervisor(plan, client, wdir).run()
    assert res["outcome"] == "ok"
    limits = [e["limit_s"] for e in map(json.loads, (wdir / "journal.jsonl").read_text().splitlines())
              if e["event"] == "start" and e["step"] in ("prepare", "extract")]
    assert limits and all(lim <= 70 for lim in limits), limits


def test_restore_gate_waits_only_for_what_is_left_of_the_budget(tmp_path, gate, monkeypatch):
    """The restore's health gate is cut to the rest of the budget, not the full health timeout; once the
    budget is spent a bounded floor still brings serving back, recorded as a warning."""
    import eagle3ops.supervisor.runner as supmod

    monkeypatch.setattr(supmod, "MIN_GATE_S", 1.0, raising=False)
    plan, wdir = _plan(tmp_path, budget_s=5)
    plan = plan.model_copy(update={"health": HealthCheck(port=1, model="m", timeout_s=600)})
    res = Supervisor(plan, StandInClient(), wdir).run()
    assert res["outcome"] == "ok"
    # gate.timeouts[0] is the record gate (before the stop, not downtime); the last one is the restore's.
    assert gate.timeouts[-1] is not None and gate.timeouts[-1] <= 5, gate.timeouts
    # Budget already spent when the restore starts: the gate gets the floor and the overrun is a warning.
    plan2, wdir2 = _plan(tmp_path, budget_s=0.001)
    gate.timeouts.clear()
    res2 = Supervisor(plan2.model_copy(update={"window_id": "w3"}), StandInClient(), wdir2).run()
    assert res2["serving_healthy"] is True and gate.timeouts[-1] == 1.0
    assert any("budget" in w for w in res2["warnings"]), res2


def test_a_stop_request_while_the_engine_is_down_exits_at_once(tmp_path):
    """A daemon restart stops its containers (SIGTERM) and the new daemon loads containers only once they exit: a
    supervisor that then waited for the engine (up to 180 s) held the restart up that long. It exits at once
    (EngineUnavailable -> exit 75) and its restart policy resumes the window."""
    import time as _time

    from eagle3ops.supervisor.runner import EngineUnavailable, Supervisor

    from eagle3ops.supervisor.journal import Journal

    sup = Supervisor.__new__(Supervisor)
    sup.stop_requested, sup.engine_waits, sup.engine_wait_s, sup.engine_poll_s = True, 0, 180.0, 1.0
    sup.journal = Journal(tmp_path / "journal.jsonl")
    sup.engine_up = lambda: False  # type: ignore[method-assign]
    t0 = _time.monotonic()
    with pytest.raises(EngineUnavailable, match="stop requested while the Docker engine is down"):
        sup._wait_out_engine("restore", ConnectionError("refused"))
    assert _time.monotonic() - t0 < 1.0
    # the outage is journaled before the exit: the restarted supervisor names its length in the result
    assert [(e["step"], e["event"], e["during"]) for e in sup.journal.entries] == [("engine", "down", "restore")]


def test_an_engine_whose_listener_closed_is_down_though_its_ping_passes(tmp_path):
    """A restarting dockerd closes its listener first and serves the connections already open until it exits: the
    supervisor's pooled ping then still passed while every new request was refused, and the daemon's restart became
    a failed restore with rollbacks. The engine is up only while its socket (a real unix socket here) accepts."""
    import socket

    from eagle3ops.supervisor.runner import Supervisor

    plan, wdir = _plan(tmp_path)
    sup = Supervisor(plan, StandInClient(), wdir)  # its ping always passes
    path = str(tmp_path / "docker.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    sup.engine_socket = path
    assert sup.engine_up() is True
    listener.close()
    assert sup.engine_up() is False, "a closed listener is an engine going down, whatever the ping says"
