"""End to end: windows on a host without a container engine (``stage_runtime: venv``) over the sandbox's
real SSH, on a sandbox of this module's own with no Docker engine at all (``pytest-venv``, SSH 2236, engine ``none``):
the inventory entry has no ``docker_host``, the supervisor is a detached
process of the delivered pipeline environment, the stages are processes. The environment is the STAND-IN pipeline
environment (:mod:`eagle3ops_dev.standin_env`: this checkout's eagle3ops + stand-in stages, no torch/vLLM; ~4 MB,
built once per machine and cached), and production serving is the STAND-IN OpenAI server of
``tests/data/standin_openai_server.py`` run as a plain process (serving kind ``process``), not vLLM."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from eagle3ops.commands import host as hc
from eagle3ops.commands import venv as vc
from eagle3ops.health import wait_healthy
from eagle3ops.remote import Remote, RemoteError
from eagle3ops.transfer.envdeliver import deliver_env
from eagle3ops.window.common import audit_entries
from eagle3ops.window.lock import read_lock
from eagle3ops.window.run import run_window
from eagle3ops_dev.standin_env import standin_server_pids

REPO = Path(__file__).resolve().parents[1]
NAME, SSH_PORT, PORT = "pytest-venv", 2236, 18036
SANDBOX_ROOT = Path(f"/var/lib/eagle3ops-sandbox/{NAME}")
MODEL = "standin-venv"
TINY = """target_model: /model
prepare: {datasets: [builtin:sharegpt], max_seq_len: 256, max_samples: 8}
"""

pytestmark = [pytest.mark.sandbox]
#: This module brings up a sandbox of its own (sshd only, no engine): its tests run in the host suite's "rest" part.
OWN_SANDBOX = NAME


@pytest.fixture(scope="module")
def venv_env(tmp_path_factory):
    """(venv host config, pipeline environment image, serving workdir): the module's engine-less sandbox reached as
    a venv host with its own data/state dirs, the stand-in environment delivered, the stand-in server serving as
    e3ops."""
    from eagle3ops.config import HostConfig
    from eagle3ops_dev import sandbox, standin_env

    inf = sandbox.up(NAME, SSH_PORT, engine="none")
    assert not inf.docker_host and not (inf.root / "docker.sock").exists()  # no engine on this host
    base = f"{inf.data_dir}/venvhost-{uuid.uuid4().hex[:6]}"
    work = SANDBOX_ROOT / f"venvproc-{uuid.uuid4().hex[:6]}"
    pw = pwd.getpwnam(inf.user)
    work.mkdir(mode=0o755)
    shutil.copy(REPO / "tests/data/standin_openai_server.py", work / "standin_openai_server.py")
    for p in (work, work / "standin_openai_server.py"):
        os.chown(p, pw.pw_uid, pw.pw_gid)
    h = HostConfig(name="venvpod", hostname=inf.hostname, port=inf.ssh_port, user=inf.user,
                   identity_file=inf.identity_file, known_hosts=inf.known_hosts, data_dir=f"{base}/data",
                   state_dir=f"{base}/state", model_path=f"{base}/model", stage_runtime="venv",
                   venv_python="/usr/bin/python3", stage_env={"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"},
                   maintenance_budget_s=600, stage_timeout_s=120,
                   serving={"kind": "process", "process_match": f"standin_openai_server.py --port {PORT}",
                            "port": PORT, "served_model_name": MODEL, "health_timeout_s": 60, "stop_timeout_s": 10})
    tgz, image = standin_env.build("/usr/bin/python3")
    server = f"/usr/bin/python3 {work}/standin_openai_server.py --port {PORT} --model {MODEL}"
    with Remote(h) as r:
        for d in (h.data_dir, h.state_dir, h.model_path):
            r.run(hc.mkdir_p(d))
        r.run(hc.write_file(f"{h.model_path}/config.json"),
              stdin=json.dumps({"hidden_size": 64, "intermediate_size": 256, "vocab_size": 512}))
        r.run(["sh", "-c", f"cd {work} && setsid nohup {server} >{work}/first.log 2>&1 </dev/null &"])
    wait_healthy(f"http://127.0.0.1:{PORT}", MODEL, timeout_s=30, interval_s=0.3)
    try:
        yield h, tgz, image, work
    finally:
        for p in standin_server_pids(PORT):
            with Remote(h) as r:
                r.run(["kill", "-TERM", str(p)], check=False)
        shutil.rmtree(work, ignore_errors=True)
        sandbox.down(NAME)


def test_delivery_is_verified_by_digest_and_done_once(venv_env):
    h, tgz, image, _ = venv_env
    from eagle3ops import deployer

    # without --env-tarball deploy exports the pipeline image's venv (GBs: benchmarks/venv-real-window/venv_real_window.py), but first
    # asks the host's venv_python, before anything is built or sent
    with pytest.raises(deployer.DeployError, match=r"hosts.venvpod.venv_python \(/nonexistent/python3\) does not run"):
        deployer.deploy(h.model_copy(update={"venv_python": "/nonexistent/python3"}), echo=lambda _: None)
    # the same sshd as an entry that is not a sandbox (its state outside the sandbox root): the stand-in environment
    # is refused by name before the host is asked anything, and nothing was created there
    prod = h.model_copy(update={"name": "gpu-pod", "state_dir": f"/tmp/e3-not-a-sandbox-{uuid.uuid4().hex[:6]}"})
    with pytest.raises(deployer.DeployError, match=r"gpu-pod: deploy --env-tarball refused: .* is a stand-in "
                                                   r"pipeline environment \(it holds eagle3ops-standin.json"):
        deployer.deploy(prod, env_tarball=tgz, echo=lambda _: None)
    with Remote(h) as r:
        assert not r.run(hc.test_dir(prod.state_dir), check=False).ok
        first = deliver_env(r, tgz, image=image)
    again = deployer.deploy(h, env_tarball=tgz, echo=lambda _: None)
    assert "nothing sent" in again.push_summary and again.image_id == image.removeprefix("venv:")
    with Remote(h) as r:
        with pytest.raises(RemoteError, match="digest mismatch"):
            r.run(vc.receive_env(h, "venv:sha256:" + "0" * 64), stdin=b"not the environment")
        gone = r.run(hc.test_dir(f"{h.state_dir}/env/{'0' * 64}"), check=False)
        deployed = json.loads(r.run(hc.cat(f"{h.state_dir}/deployed.json")).stdout)
    assert first.sent_bytes == tgz.stat().st_size
    assert not gone.ok
    assert deployed["image"] == image and deployed["runtime"] == "venv"


def test_extract_and_train_windows_run_as_processes_with_serving_restored_and_a_rerun_is_a_noop(venv_env):
    h, tgz, image, work = venv_env
    events: list[dict] = []
    with Remote(h) as r:
        deliver_env(r, tgz, image=image)
        before = standin_server_pids(PORT)
        res = run_window(r, kind="extract", image=image, expected_image_id=image.removeprefix("venv:"),
                         command="test extract", run="r1", pipeline_text=TINY, on_event=events.append)
        assert res["outcome"] == "ok", res
        assert res["stages"] == {"prepare": "ok", "extract": "ok"}
        checks = {e["check"]: e["event"] for e in events if e.get("step") == "preflight"}
        assert checks["venv runtime"] == checks["pipeline environment"] == checks["stage process"] == "ok", checks
        assert res["serving_running"] and res["serving_healthy"] and res["downtime_s"] is not None
        assert not any(c.startswith("docker") for c in r.history), [c for c in r.history if "docker" in c]
        after = standin_server_pids(PORT)
        assert after and set(after).isdisjoint(before)  # stopped, then restored as a new process
        seen = json.loads(r.run(hc.cat(f"{h.data_dir}/runs/r1/extract/standin.json")).stdout)
        assert seen["env"]["NCCL_PROTO"] == "LL" and seen["env"]["NCCL_ALGO"] == "Ring"
        assert seen["cwd"] == f"{h.data_dir}/runs/r1" and seen["python"].startswith(f"{h.state_dir}/env/")
        assert seen["target_model"] == h.model_path  # /model mapped to the host's model_path (EAGLE3OPS_MOUNTS)
        assert read_lock(r) is None
        mpath, deadline = f"{h.state_dir}/weights/manifest.txt", time.monotonic() + 30  # the serving
        while not r.run(hc.exists(mpath), check=False).ok:  # host's first window records its weights manifest
            assert time.monotonic() < deadline, f"{mpath} was not recorded within 30 s of the first window"
            time.sleep(0.2)
        assert r.run(hc.cat(mpath)).stdout.splitlines()[-1].endswith(" config.json")
        again = run_window(r, kind="extract", image=image, expected_image_id=image.removeprefix("venv:"),
                           command="test extract again", run="r1", pipeline_text=TINY)
        assert again["outcome"] == "nothing to do", again
        assert standin_server_pids(PORT) == after  # not stopped
        train = run_window(r, kind="train", image=image, expected_image_id=image.removeprefix("venv:"),
                           command="test train", run="r1", pipeline_text=TINY)
        assert train["outcome"] == "ok" and train["stages"] == {"vocab": "ok", "train": "ok"}, train
        outcomes = [e["outcome"] for e in audit_entries(r)]
    assert outcomes[-3:] == ["ok", "nothing to do", "ok"]
    assert sum("e3-weights-record" in c for c in r.history) == 1  # recorded once, not by the later windows
    wait_healthy(f"http://127.0.0.1:{PORT}", MODEL, timeout_s=30, interval_s=0.5)


def test_killing_the_driver_mid_window_leaves_the_host_to_finish(venv_env, tmp_path):
    h, tgz, image, work = venv_env
    slow = h.model_copy(update={"stage_env": {**h.stage_env, "EAGLE3OPS_STANDIN_SLEEP_S": "3"}})
    with Remote(h) as r:
        deliver_env(r, tgz, image=image)
    script = tmp_path / "driver.py"
    script.write_text(
        "import sys, json\nfrom eagle3ops.config import HostConfig\nfrom eagle3ops.remote import Remote\n"
        "from eagle3ops.window.run import run_window\n"
        "h = HostConfig.model_validate_json(open(sys.argv[1]).read())\n"
        "with Remote(h) as r:\n"
        f"    run_window(r, kind='extract', image={image!r}, expected_image_id=None, command='killed driver', "
        f"run='r2', pipeline_text={TINY!r}, on_event=lambda e: print(json.dumps(e), flush=True))\n")
    (tmp_path / "host.json").write_text(slow.model_dump_json())
    driver = subprocess.Popen([sys.executable, str(script), str(tmp_path / "host.json")], stdout=subprocess.PIPE,
                              text=True)
    try:
        for line in driver.stdout:  # bounded: the driver ends when the window does
            if '"prepare"' in line and '"start"' in line:
                break
    finally:
        driver.kill()
        driver.wait(timeout=30)
    with Remote(h) as r:
        lock = read_lock(r)
        assert lock and lock["window_id"], "the window had started on the host"
        wid = lock["window_id"]
        deadline = time.monotonic() + 120
        result = ""
        while time.monotonic() < deadline and not result.strip():
            result = r.run(hc.cat_if_exists(f"{h.state_dir}/windows/{wid}/result.json"), check=False).stdout
            time.sleep(1)
        assert result.strip(), "the supervisor did not finish within 120 s"
        res = json.loads(result)
        assert res["outcome"] == "ok" and res["stages"] == {"prepare": "ok", "extract": "ok"}, res
        assert read_lock(r) is None
    wait_healthy(f"http://127.0.0.1:{PORT}", MODEL, timeout_s=30, interval_s=0.5)


def _live_argv(work: Path) -> list[bytes]:
    pids = standin_server_pids(PORT)
    assert len(pids) == 1, pids
    return Path(f"/proc/{pids[0]}/cmdline").read_bytes().split(b"\0")[:-1]


def test_release_rollback_and_failed_release_of_process_serving_on_a_venv_host(venv_env):
    from eagle3ops.config.plan import ReleaseChange
    from eagle3ops.supervisor.releases import Releases

    h, tgz, image, work = venv_env
    before = _live_argv(work)

    def window(kind: str, **kw):
        with Remote(h) as r:
            deliver_env(r, tgz, image=image)
            res = run_window(r, kind=kind, image=image, expected_image_id=image.removeprefix("venv:"),
                             command=f"test {kind}", **kw)
            assert read_lock(r) is None, res
            assert not any(c.startswith("docker") for c in r.history)
        wait_healthy(f"http://127.0.0.1:{PORT}", MODEL, timeout_s=10, interval_s=0.3)
        return res, _live_argv(work)

    res, live = window("release", change=ReleaseChange(args=["--label", "v2"]))
    assert res["outcome"] == "ok" and res["serving_healthy"] is True, res
    assert live == before + [b"--label", b"v2"]
    state = Path(h.state_dir)  # the sandbox shares this machine: read its releases directly
    first, v2 = Releases(state).history()[-2:]
    res, live = window("rollback")
    assert res["outcome"] == "ok" and res["release"] == first and live == before, res
    res, live = window("release", change=ReleaseChange(args=["--token-ms", "not-a-number"]))
    assert res["outcome"] == "failed" and "rolled back to release" in res["error"], res
    assert res["serving_healthy"] is True and live == before
    assert Releases(state).current() == first
