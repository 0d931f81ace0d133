"""The pure part: a release is the live container plus the intended change.

The record keeps every ``Config``/``HostConfig`` field of ``docker inspect``; the Engine API create request made
from it carries them all; a change touches only what it names; the supervisor recreates serving from it (stand-in
client). The real-engine check (a long ``docker run`` flag list, release, rollback, ``docker inspect`` diffs) is
``test_release_fidelity.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3ops.commands import serving as sv
from eagle3ops.commands import stages as st
from eagle3ops.config import load_inventory
from eagle3ops.config.plan import HealthCheck, Plan, ReleaseChange
from eagle3ops.supervisor.releases import Releases
from eagle3ops.supervisor.runner import Supervisor

REPO = Path(__file__).resolve().parents[1]

#: What `docker inspect` reports for serving started like a real 8-GPU vLLM deployment (trimmed to the fields that
#: matter; values as Docker 20.10 prints them).
LIVE = {
    "Id": "0123456789ab" + "c" * 52,
    "Name": "/vllm-serving",
    "Image": "sha256:" + "1" * 64,
    "Config": {
        "Hostname": "gpu-01", "User": "1000:1000", "WorkingDir": "/workspace", "StopSignal": "SIGINT",
        "StopTimeout": 90, "Tty": False, "OpenStdin": False,
        "Env": ["NCCL_IB_HCA=mlx5", "NCCL_SOCKET_IFNAME=eth0", "VLLM_API_KEY=s3cret", "PATH=/usr/bin"],
        "Cmd": ["/models/m", "--served-model-name", "m", "--tensor-parallel-size", "8", "--max-num-seqs", "16"],
        "Entrypoint": ["vllm", "serve"], "Image": "vllm/vllm-openai:v0.16.0",
        "Labels": {"io.eagle3ops.release": "1", "team": "inference"},
        "Healthcheck": {"Test": ["CMD", "curl", "-f", "http://127.0.0.1:8000/health"], "Interval": 30000000000},
    },
    "HostConfig": {
        "Binds": ["/mnt/nvme/models/m:/models/m:ro", "/root/.cache/huggingface:/root/.cache/huggingface"],
        "NetworkMode": "host", "IpcMode": "host", "ShmSize": 17179869184, "PidMode": "host",
        "RestartPolicy": {"Name": "always", "MaximumRetryCount": 0},
        "LogConfig": {"Type": "json-file", "Config": {"max-size": "100m", "max-file": "3"}},
        "CapAdd": ["IPC_LOCK", "SYS_NICE"], "SecurityOpt": ["seccomp=unconfined"], "Init": True,
        "Tmpfs": {"/tmp/scratch": "rw,size=1g"}, "GroupAdd": ["video"],
        "Ulimits": [{"Name": "memlock", "Soft": 8388608, "Hard": 8388608},
                    {"Name": "stack", "Soft": 67108864, "Hard": 67108864}],
        "Devices": [{"PathOnHost": "/dev/infiniband", "PathInContainer": "/dev/infiniband",
                     "CgroupPermissions": "rwm"}],
        "DeviceRequests": [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]],
                            "Options": {}}],
        "Memory": 0, "NanoCpus": 0, "PidsLimit": 4096, "OomScoreAdj": -500, "Runtime": "runc",
        "Mounts": [{"Type": "volume", "Source": "vllm-cache", "Target": "/cache"}],
    },
    "NetworkSettings": {"Networks": {"host": {"Aliases": None, "IPAddress": "", "EndpointID": "e" * 64}}},
    "State": {"Status": "running"},
}


def test_record_keeps_every_config_and_hostconfig_field():
    rec = sv.container_record(LIVE)
    assert rec["Config"] == LIVE["Config"] and rec["HostConfig"] == LIVE["HostConfig"]
    assert rec["Name"] == "vllm-serving" and rec["ImageId"] == LIVE["Image"]
    assert rec["Networks"] == {"host": {}}, "runtime endpoint state is not configuration"
    body, more = sv.create_request(rec)
    assert {k: v for k, v in body.items() if k not in ("HostConfig", "NetworkingConfig")} == LIVE["Config"]
    assert body["HostConfig"] == LIVE["HostConfig"] and "NetworkingConfig" not in body and more == {}


def test_a_change_touches_only_what_it_names():
    rec = sv.container_record(LIVE)
    new = sv.apply_change(rec, args=["--max-num-seqs", "8"])
    assert new["HostConfig"] == rec["HostConfig"]
    assert {k: v for k, v in new["Config"].items() if k != "Cmd"} == {k: v for k, v in rec["Config"].items()
                                                                       if k != "Cmd"}
    assert new["Config"]["Cmd"] == ["/models/m", "--served-model-name", "m", "--tensor-parallel-size", "8",
                                    "--max-num-seqs", "8"]
    # The same flag set twice does not pile up; --flag=value is the same flag.
    again = sv.apply_change(new, args=["--max-num-seqs=4"])
    assert again["Config"]["Cmd"][-1] == "--max-num-seqs=4" and "16" not in again["Config"]["Cmd"]
    assert again["Config"]["Cmd"].count("--max-num-seqs") == 0
    binds = sv.apply_change(rec, binds=["/mnt/copy:/models/m:ro"], env={"NCCL_IB_HCA": "mlx5_0"})
    assert binds["HostConfig"]["Binds"] == ["/root/.cache/huggingface:/root/.cache/huggingface",
                                            "/mnt/copy:/models/m:ro"]
    assert "NCCL_IB_HCA=mlx5_0" in binds["Config"]["Env"] and "NCCL_IB_HCA=mlx5" not in binds["Config"]["Env"]
    assert rec["Config"]["Cmd"][-1] == "16", "apply_change must not modify its input"


def test_a_new_image_drops_only_the_old_images_defaults():
    rec = sv.apply_change(sv.container_record(LIVE), image="vllm/vllm-openai:v0.17.0",
                          image_defaults={"Env": ["PATH=/usr/bin"], "Labels": {}, "Entrypoint": ["vllm", "serve"],
                                          "WorkingDir": "/workspace"})
    cfg = rec["Config"]
    assert cfg["Image"] == "vllm/vllm-openai:v0.17.0" and rec["ImageId"] is None
    assert "PATH=/usr/bin" not in cfg["Env"] and "NCCL_IB_HCA=mlx5" in cfg["Env"]
    assert cfg["Entrypoint"] is None and cfg["WorkingDir"] == "", "the new image's own defaults apply"
    assert cfg["User"] == "1000:1000" and cfg["Cmd"] == LIVE["Config"]["Cmd"]
    assert rec["HostConfig"] == LIVE["HostConfig"]


def test_user_networks_keep_their_aliases_but_not_the_old_id():
    live = json.loads(json.dumps(LIVE))
    live["HostConfig"]["NetworkMode"] = "inference"
    live["NetworkSettings"]["Networks"] = {
        "inference": {"Aliases": ["vllm", "0123456789ab"], "IPAMConfig": {"IPv4Address": "10.0.0.5"},
                      "IPAddress": "10.0.0.5", "NetworkID": "n" * 64},
        "metrics": {"Aliases": ["vllm-metrics"]}}
    body, more = sv.create_request(sv.container_record(live))
    assert body["NetworkingConfig"] == {"EndpointsConfig": {"inference": {
        "Aliases": ["vllm"], "IPAMConfig": {"IPv4Address": "10.0.0.5"}}}}
    assert more == {"metrics": {"Aliases": ["vllm-metrics"]}}


def test_config_check_shows_how_the_inventory_differs_from_the_live_container():
    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    diffs = sv.inventory_drift(h, LIVE)
    text = "\n".join(diffs)
    assert "image: inventory 'eagle3ops/vllm-openai-local:v0.16.0', live 'vllm/vllm-openai:v0.16.0'" in text
    assert "args: inventory" in text and "env VLLM_CPU_KVCACHE_SPACE: set in the inventory" in text
    assert "s3cret" not in text
    same = {"Config": {"Image": h.serving.image, "Cmd": list(h.serving.args),
                       "Env": [f"{k}={v}" for k, v in h.serving.env.items()]},
            "HostConfig": {"Binds": list(h.serving.volumes)}}
    assert sv.inventory_drift(h, same) == []
    keyed = {**same, "Config": {**same["Config"], "Cmd": [*h.serving.args, "--api-key", "k3y"]}}
    assert "k3y" not in "\n".join(sv.inventory_drift(h, keyed)) and "***" in "\n".join(sv.inventory_drift(h, keyed))


# ---- the supervisor recreates serving from the record (stand-in engine) ---------------------------------------

class _Container:
    def __init__(self, attrs, status="running"):
        self.attrs, self.status, self.name = attrs, status, attrs["Name"].lstrip("/")

    def reload(self):
        pass

    def stop(self, timeout=10):
        self.status = "exited"

    def remove(self, force=False):
        _Engine.current.by_name.pop(self.name, None)

    def logs(self, **kw):
        return b""


class _Engine:
    """Creates containers from Engine API bodies and reports them back the way ``docker inspect`` does."""

    current: "_Engine"

    def __init__(self, live):
        _Engine.current = self
        self.by_name = {"vllm-serving": _Container(json.loads(json.dumps(live)))}
        self.bodies, self.runs = [], []
        self.containers, self.api, self.images = self, self, self

    # containers
    def get(self, name):
        import docker.errors

        if name in self.by_name:
            return self.by_name[name]
        if name.startswith("vllm/") or name.startswith("sha256:"):
            return type("Img", (), {"id": LIVE["Image"], "attrs": {"Config": {}}})()
        raise docker.errors.NotFound(name)

    # api
    def create_container_from_config(self, body, name=None):
        self.bodies.append(json.loads(json.dumps(body)))
        cfg = {k: v for k, v in body.items() if k not in ("HostConfig", "NetworkingConfig")}
        self.by_name[name] = _Container({"Id": "f" * 64, "Name": "/" + name, "Image": LIVE["Image"], "Config": cfg,
                                         "HostConfig": body["HostConfig"], "State": {}}, status="created")
        return {"Id": name}

    def start(self, cid):
        self.by_name[cid].status = "running"

    def run(self, image, detach=False, name=None, **kw):  # the docker SDK path of older release records
        self.runs.append(image)
        self.create_container_from_config({"Image": image, "HostConfig": {}}, name=name)
        self.start(name)
        return self.by_name[name]

    def ping(self):
        return True


def _sup(tmp_path, kind, **kw):
    wdir = tmp_path / f"w-{kind}"
    n = 1
    while wdir.exists():  # a second window of the same kind in one test
        n += 1
        wdir = tmp_path / f"w-{kind}-{n}"
    wdir.mkdir()
    plan = Plan(window_id=wdir.name, kind=kind, host="h", user="u", command="c", state_dir=str(tmp_path / "state"),
                serving_container="vllm-serving", health=HealthCheck(port=1, model="m", timeout_s=1), **kw)
    return plan, wdir


def test_release_and_rollback_recreate_every_field(tmp_path, monkeypatch):
    monkeypatch.setattr(Supervisor, "gate", lambda self, timeout_s=None: self.journal.log("health", "ok"))
    engine = _Engine(LIVE)
    plan, wdir = _sup(tmp_path, "release", change=ReleaseChange(args=["--max-num-seqs", "8"]))
    res = Supervisor(plan, engine, wdir).run()
    assert res["outcome"] == "ok" and res["release"] == 2, res
    new = engine.by_name["vllm-serving"].attrs
    assert new["HostConfig"] == LIVE["HostConfig"]
    changed = {k for k in LIVE["Config"] if new["Config"].get(k) != LIVE["Config"][k]}
    assert changed == {"Cmd", "Labels"}, changed
    assert new["Config"]["Labels"] == {**LIVE["Config"]["Labels"], "io.eagle3ops.release": "2"}
    assert new["Config"]["Image"] == "vllm/vllm-openai:v0.16.0", "the reference is kept while it is the same image"

    plan, wdir = _sup(tmp_path, "rollback")
    res = Supervisor(plan, engine, wdir).run()
    assert res["outcome"] == "ok" and res["release"] == 1, res
    back = engine.by_name["vllm-serving"].attrs
    assert back["HostConfig"] == LIVE["HostConfig"] and back["Config"] == LIVE["Config"]
    assert Releases(tmp_path / "state").history() == [1, 2, 1]


def test_a_retagged_image_is_replaced_by_the_recorded_id(tmp_path, monkeypatch):
    monkeypatch.setattr(Supervisor, "gate", lambda self, timeout_s=None: self.journal.log("health", "ok"))
    engine = _Engine(LIVE)
    plan, wdir = _sup(tmp_path, "release", change=ReleaseChange())
    Supervisor(plan, engine, wdir).run()
    engine.get = lambda name, _g=engine.get: (
        type("Img", (), {"id": "sha256:" + "9" * 64, "attrs": {}})() if name.startswith("vllm/") else _g(name))
    plan, wdir = _sup(tmp_path, "rollback")
    assert Supervisor(plan, engine, wdir).run()["outcome"] == "ok"
    assert engine.bodies[-1]["Image"] == LIVE["Image"]


def test_releases_recorded_by_older_versions_still_roll_back(tmp_path, monkeypatch):
    """A host whose releases/NNNN.json hold the older docker SDK spec: rollback recreates them through it."""
    monkeypatch.setattr(Supervisor, "gate", lambda self, timeout_s=None: self.journal.log("health", "ok"))
    rel_dir = tmp_path / "state" / "releases"
    rel_dir.mkdir(parents=True)
    (rel_dir / "0001.json").write_text(json.dumps({"release": 1, "image_id": "sha256:old", "window": "w0",
                                                   "spec": {"image": "vllm:old", "name": "vllm-serving"}}))
    rels = Releases(tmp_path / "state")
    rels.set_current(1)
    rels.set_current(rels.add(sv.container_record(LIVE), "w1"))
    live = json.loads(json.dumps(LIVE))
    live["Config"]["Labels"]["io.eagle3ops.release"] = "2"  # release 2 is live: eagle3ops labelled it so
    engine = _Engine(live)
    plan, wdir = _sup(tmp_path, "rollback")
    res = Supervisor(plan, engine, wdir).run()
    assert res["outcome"] == "ok" and res["release"] == 1, res
    assert engine.runs == ["sha256:old"]


def test_serving_recreated_outside_eagle3ops_is_recorded_as_a_new_release(tmp_path, monkeypatch):
    """The state dir says release 1 is live, but serving was recreated by hand (another release label): the next
    window records the live container as a new release and makes it current (once: later windows find the same
    container adopted), so a rollback returns to what was really serving, never to the stale release 1."""
    monkeypatch.setattr(Supervisor, "gate", lambda self, timeout_s=None: self.journal.log("health", "ok"))
    engine = _Engine(LIVE)
    plan, wdir = _sup(tmp_path, "release", change=ReleaseChange(args=["--max-num-seqs", "8"]))
    assert Supervisor(plan, engine, wdir).run()["release"] == 2
    plan, wdir = _sup(tmp_path, "rollback")
    assert Supervisor(plan, engine, wdir).run()["release"] == 1
    by_hand = json.loads(json.dumps(LIVE))
    by_hand["Config"]["Labels"] = {"team": "inference"}  # `docker run` by hand: no release label
    by_hand["Config"]["Cmd"] = [*LIVE["Config"]["Cmd"], "--enable-prefix-caching"]
    engine.by_name["vllm-serving"] = _Container(by_hand)
    plan, wdir = _sup(tmp_path, "window")
    first = Supervisor(plan, engine, wdir)
    first.record()
    assert first.releases.current() == 3 and any("recreated outside eagle3ops" in w for w in first.warnings())
    plan, wdir = _sup(tmp_path, "window")  # the next window finds the same (stopped and started) container
    again = Supervisor(plan, engine, wdir)
    again.record()
    assert again.releases.current() == 3 and again.releases.numbers() == [1, 2, 3] and not again.warnings()
    plan, wdir = _sup(tmp_path, "release", change=ReleaseChange(args=["--max-num-seqs", "4"]))
    res = Supervisor(plan, engine, wdir).run()
    assert res["outcome"] == "ok" and res["release"] == 4 and res["release_before"] == 3, res
    rels = Releases(tmp_path / "state")
    assert rels.get(3)["container"]["Config"]["Cmd"] == by_hand["Config"]["Cmd"]
    plan, wdir = _sup(tmp_path, "rollback")
    res = Supervisor(plan, engine, wdir).run()
    assert res["outcome"] == "ok" and res["release"] == 3, res
    assert engine.by_name["vllm-serving"].attrs["Config"]["Cmd"] == by_hand["Config"]["Cmd"]
    assert rels.history() == [1, 2, 1, 3, 4, 3]


def test_an_older_record_is_compared_on_the_settings_eagle3ops_sets():
    """A release recorded before releases kept their container id: the container eagle3ops created from it differs
    only where the engine or the image fill in (a new image's Env, Labels and Cmd, the compile cache's binds), which
    still counts as that release; a setting changed by hand does not."""
    rec = sv.apply_change(sv.container_record(LIVE), image="vllm/vllm-openai:v0.17.0",
                          image_defaults={"Env": ["PATH=/usr/bin"], "Labels": {}, "Entrypoint": ["vllm", "serve"],
                                          "WorkingDir": "/workspace"})
    created = json.loads(json.dumps(LIVE))  # what `docker inspect` says of the container created from ``rec``
    created["Config"].update(Image="vllm/vllm-openai:v0.17.0", Entrypoint=["vllm", "serve"], WorkingDir="/vllm",
                             Env=[*rec["Config"]["Env"], "PATH=/usr/local/bin"],
                             Labels={**rec["Config"]["Labels"], "org.opencontainers.image.version": "0.17.0"})
    created["HostConfig"]["Binds"] = [*LIVE["HostConfig"]["Binds"], "/data/compile-cache/vllm:/root/.cache/vllm"]
    assert sv.settings_differ(rec, created) == []
    pinned = json.loads(json.dumps(created))
    pinned["HostConfig"]["CpusetCpus"] = "0-3"
    pinned["Config"]["Env"] = [e for e in created["Config"]["Env"] if not e.startswith("NCCL_IB_HCA=")]
    assert sv.settings_differ(rec, pinned) == ["HostConfig.CpusetCpus", "Config.Env"]


def test_state_written_by_an_earlier_version_keeps_working(tmp_path, monkeypatch):
    """Release files without a container id (an earlier eagle3ops): the live container carrying the current
    release's label and its recorded settings is that release (its id kept from then on: no new release, no
    warning); one carrying the label with another CPU set is recorded as a new release, the warning saying why; an
    ``adopted.json`` of an earlier version still names its container."""
    monkeypatch.setattr(Supervisor, "gate", lambda self, timeout_s=None: self.journal.log("health", "ok"))
    rels = Releases(tmp_path / "state")
    rels.set_current(rels.add(sv.container_record(LIVE), "w0"))  # release 1, labelled 1 as LIVE is
    assert "container_id" not in rels.get(1)
    engine = _Engine(LIVE)
    plan, wdir = _sup(tmp_path, "window")
    same = Supervisor(plan, engine, wdir)
    same.record()
    assert rels.current() == 1 and rels.numbers() == [1] and not same.warnings(), same.warnings()
    assert rels.get(1)["container_id"] == LIVE["Id"], "recognised once, known by its id from then on"

    (tmp_path / "state/releases/0001.json").write_text(json.dumps({**rels.get(1), "container_id": None}))
    pinned = json.loads(json.dumps(LIVE))
    pinned["Id"], pinned["HostConfig"]["CpusetCpus"] = "9" * 64, "0"  # provisioned again, the same label
    engine.by_name["vllm-serving"] = _Container(pinned)
    plan, wdir = _sup(tmp_path, "window")
    other = Supervisor(plan, engine, wdir)
    other.record()
    assert rels.current() == 2 and rels.get(2)["container"]["HostConfig"]["CpusetCpus"] == "0"
    assert any("recorded without a container id" in w and "HostConfig.CpusetCpus" in w for w in other.warnings())

    (tmp_path / "state/releases/0002.json").write_text(json.dumps({**rels.get(2), "container_id": None}))
    (tmp_path / "state/releases/adopted.json").write_text(json.dumps({"release": 2, "container_id": "9" * 64}))
    plan, wdir = _sup(tmp_path, "window")
    adopted = Supervisor(plan, engine, wdir)
    adopted.record()
    assert rels.current() == 2 and rels.numbers() == [1, 2] and not adopted.warnings(), adopted.warnings()


def test_the_supervisor_mounts_the_api_key_file_read_only():
    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    h = h.model_copy(update={"serving": h.serving.model_copy(update={"api_key_file": "/etc/vllm/key"})})
    argv = st.supervisor_argv(h, image="p:1", window_id="w1", plan_path="/s/plan.json")
    i = argv.index("/etc/vllm/key:/etc/vllm/key:ro")
    assert argv[i - 1] == "--volume"


@pytest.mark.parametrize("bad", ["relative/key", "key"])
def test_api_key_file_must_be_absolute(bad):
    from pydantic import ValidationError

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    with pytest.raises(ValidationError, match="absolute path"):
        h.serving.model_validate({**h.serving.model_dump(), "api_key_file": bad})


def test_recorded_configurations_are_private_to_the_state_dirs_owner(tmp_path):
    """A recorded container holds its env and command line (an API key, perhaps): 0600, never world-readable."""
    rel = Releases(tmp_path)
    n = rel.add(sv.container_record(LIVE), "w1")
    path = tmp_path / "releases" / f"{n:04d}.json"
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.stat().st_uid == (tmp_path / "releases").stat().st_uid
