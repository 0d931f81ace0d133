"""End to end: ``eagle3ops extract fleet0 fleet1 fleet2`` over three sandbox hosts, each in a network
namespace of its own with its own address behind a veth link limited to 100 mbit (``tc tbf``): the fleet fixture
:mod:`eagle3ops_dev.fleet` (sandboxes ``pytest-fleet0..2``, SSH 2240-2242, namespaces ``e3fleet0..2``, 10.229.k.0/24).
All three are venv hosts (no engine) with the STAND-IN pipeline environment (:mod:`eagle3ops_dev.standin_env`: the
product's supervisor and windows, stand-in stages that honour ``--shard`` but compute no hidden states); fleet0
serves the STAND-IN OpenAI server as ``serving: process`` (port 18040 in its namespace), fleet1 and fleet2 have
``serving: none``. The real CLI runs as a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from eagle3ops.commands import host as hc
from eagle3ops.remote import Remote
from eagle3ops.transfer.envdeliver import deliver_env
from eagle3ops.window.common import audit_entries
from eagle3ops_dev import fleet, standin_env
from eagle3ops_dev.standin_env import standin_server_pids

REPO = Path(__file__).resolve().parents[1]
NET = {"prefix": "pytest-fleet", "ns_prefix": "e3fleet", "subnet": 229}
SSH_PORT, PORT, MODEL = 2240, 18040, "standin-fleet"
PIPELINE = "target_model: /model\nprepare: {datasets: [builtin:sharegpt], max_seq_len: 256, max_samples: 11}\n"
CLI_TIMEOUT_S = 300

pytestmark = [pytest.mark.sandbox]
#: This module brings up sandboxes of its own (sshd only, in namespaces): its tests run in the "rest" part.
OWN_SANDBOX = "pytest-fleet0"


def _healthy(h) -> bool:
    with Remote(h) as r:  # the server listens on the namespace's loopback: asked on the host, over SSH
        return r.run(hc.http_status(f"http://127.0.0.1:{PORT}/health"), check=False).stdout.strip() == "200"


@pytest.fixture(scope="module")
def fleet_env(tmp_path_factory):
    """(hosts by name, inventory writer, pipeline file, tmp dir): the three nodes up, the stand-in environment
    delivered to each (deployed.json), the stand-in server serving on fleet0."""
    tmp = tmp_path_factory.mktemp("fleet")
    nodes = fleet.up(3, ssh_port=SSH_PORT, **NET)
    try:
        tgz, image = standin_env.build("/usr/bin/python3")
        tag = uuid.uuid4().hex[:6]
        hosts = {}
        for k, node in enumerate(nodes):
            serving = ({"kind": "process", "process_match": f"standin_openai_server.py --port {PORT}", "port": PORT,
                        "served_model_name": MODEL, "health_timeout_s": 60, "stop_timeout_s": 10} if k == 0 else "none")
            hosts[f"fleet{k}"] = fleet.venv_host(node, f"fleet{k}", f"{node.info.data_dir}/fleet-{tag}",
                                                 serving=serving)
        fleet.start_standin_server(hosts["fleet0"], nodes[0], REPO / "tests/data/standin_openai_server.py",
                                   port=PORT, model=MODEL)
        for h in hosts.values():
            fleet.make_dirs(h)
            with Remote(h) as r:
                deliver_env(r, tgz, image=image)
        deadline = time.monotonic() + 30
        while not _healthy(hosts["fleet0"]):
            assert time.monotonic() < deadline, "the stand-in server on fleet0 did not answer /health within 30 s"
            time.sleep(0.5)

        def inventory(name: str, **stage_env: dict[str, str]) -> Path:
            hs = [h.model_copy(update={"stage_env": stage_env.get(n, {})}) for n, h in hosts.items()]
            p = tmp / f"{name}.yaml"
            p.write_text(fleet.inventory_yaml(hs))
            return p

        pipeline = tmp / "pipeline.yaml"
        pipeline.write_text(PIPELINE)
        yield hosts, inventory, pipeline, tmp, nodes
    finally:
        for pid in standin_server_pids(PORT):
            os.kill(pid, signal.SIGTERM)
        fleet.down(3, **NET)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3ops", *args], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, cwd=REPO)


def _read(h, path: str) -> str:
    with Remote(h) as r:
        return r.run(hc.cat(path)).stdout


def test_fleet_extract_merges_to_the_one_host_manifest_resumes_a_killed_shard_and_moves_a_dead_hosts(fleet_env):
    hosts, inventory, pipeline, tmp, nodes = fleet_env
    assert "rate 100Mbit" in nodes[1].link.qdisc()
    plain = inventory("plain")
    # the reference: one host, the one-host path (no shard)
    one = _cli("extract", "fleet1", "-i", str(plain), "--pipeline", str(pipeline), "--run", "one")
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-2000:]
    whole = json.loads(_read(hosts["fleet1"], f"{hosts['fleet1'].data_dir}/runs/one/extract/manifest.json"))
    assert whole["samples"] == 11

    # the fleet run; fleet2's stage process is killed (SIGKILL) once it has written a sample of its shard
    pids_before = standin_server_pids(PORT)
    merged_path = tmp / "merged.json"
    args = ["extract", "fleet0", "fleet1", "fleet2", "--pipeline", str(pipeline), "--run", "fl",
            "--merged", str(merged_path)]
    hidden2 = Path(f"{hosts['fleet2'].data_dir}/runs/fl/extract/hidden")  # the sandbox's disk is this machine's
    slow = inventory("slow", fleet2={"EAGLE3OPS_STANDIN_SAMPLE_S": "0.5"})
    driver = subprocess.Popen([sys.executable, "-m", "eagle3ops", *args, "-i", str(slow)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=REPO)
    try:
        killed = _kill_stage_once(hosts["fleet2"].data_dir, hidden2, timeout_s=90)
        out = driver.communicate(timeout=CLI_TIMEOUT_S)[0]
    finally:
        driver.kill()
    assert killed, "fleet2's extract stage never started writing"
    written_before = len(list(hidden2.iterdir()))
    assert driver.returncode == 1, out[-3000:]
    assert "prepare runs first on fleet1" in out and "rerun the same command to resume" in " ".join(out.split())
    assert not merged_path.exists()
    pids_after = standin_server_pids(PORT)
    assert pids_after and set(pids_after).isdisjoint(pids_before)  # fleet0's serving stopped for its window...
    assert _healthy(hosts["fleet0"])  # ...and restored
    entries = [e for e in _audit(hosts["fleet0"]) if e.get("outcome") == "ok"]
    assert entries and entries[-1]["stopped_at"] < entries[-1]["restored_at"]  # the audit line has the interval

    # the rerun resumes: finished shards are no-op windows (serving not stopped again), fleet2 writes only the rest
    again = _cli(*args, "-i", str(plain))
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    # the plan printed before any stop estimates fleet0's window from the rates its first window measured
    line = next(x for x in again.stdout.splitlines() if "window on fleet0" in x)
    assert "est. downtime" in line, line
    assert standin_server_pids(PORT) == pids_after
    merged = json.loads(merged_path.read_text())
    assert merged["sample_files"] == whole["sample_files"]  # same sample ids, same token counts...
    assert merged["files"] == whole["files"]  # ...and the same token ids (the stand-in files hold them), by sha256
    assert merged["tokens"] == whole["tokens"] and merged["samples"] == 11
    shards = {s["host"]: s for s in merged["fleet"]["shards"]}
    s2 = shards["fleet2"]
    m2 = json.loads(_read(hosts["fleet2"], f"{hosts['fleet2'].data_dir}/runs/fl/extract/shards/"
                                           f"{s2['start']}-{s2['end']}.json"))
    assert 0 < written_before < s2["samples"]
    assert m2["samples_this_run"] == s2["samples"] - written_before  # what the killed stage wrote is not redone
    assert merged["fleet"]["train_host"] == "fleet0"

    # fleet2 marked dead: its shard moves to fleet1 (no serving) and is extracted there; fleet2 is never reached.
    # The driver is killed mid-window; the window goes on on fleet1, and the rerun waits for it, then merges.
    audit2 = len(_audit(hosts["fleet2"]))
    dead_path = tmp / "merged-dead.json"
    dead_args = [*args[:-1], str(dead_path), "--dead", "fleet2"]
    # fleet1's stand-in extract holds after its first sample while the hold file exists: the window is still running
    # when the rerun reaches fleet1's lock, however slow this machine is (the hold is removed once the rerun waits)
    hold = Path(f"{hosts['fleet1'].data_dir}/standin-hold")  # the sandbox's disk is this machine's
    hold.write_text("held by the test\n")
    slow1 = inventory("slow1", fleet1={"EAGLE3OPS_STANDIN_HOLD": str(hold)})
    first = Path(f"{hosts['fleet1'].data_dir}/runs/fl/extract/hidden/data_{s2['start']:06d}.standin.json")
    killed_driver = subprocess.Popen([sys.executable, "-m", "eagle3ops", *dead_args, "-i", str(slow1)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    try:
        deadline = time.monotonic() + 90
        while not first.exists():
            assert time.monotonic() < deadline and killed_driver.poll() is None, "the moved shard never started"
            time.sleep(0.1)
    finally:
        killed_driver.kill()
        killed_driver.wait(timeout=30)
    moved_log = tmp / "moved.log"
    with moved_log.open("w") as log:
        rerun = subprocess.Popen([sys.executable, "-m", "eagle3ops", *dead_args, "-i", str(plain)], stdout=log,
                                 stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            deadline = time.monotonic() + CLI_TIMEOUT_S
            while "[fleet1] lock wait" not in moved_log.read_text():
                assert rerun.poll() is None and time.monotonic() < deadline, moved_log.read_text()[-3000:]
                time.sleep(0.2)
            hold.unlink()  # the held window finishes; the rerun, waiting on its lock, goes on
            rerun.wait(timeout=CLI_TIMEOUT_S)
        finally:
            rerun.kill()
            hold.unlink(missing_ok=True)
    out = moved_log.read_text()
    assert rerun.returncode == 0, out[-3000:]
    assert "[fleet1] lock wait  waiting for window" in out, out[-3000:]
    assert f"shard 2 [{s2['start']}, {s2['end']}) moved to fleet1" in out
    md = json.loads(dead_path.read_text())
    assert md["sample_files"] == whole["sample_files"] and md["files"] == whole["files"]
    assert {s["host"] for s in md["fleet"]["shards"]} == {"fleet0", "fleet1"}
    assert len(_audit(hosts["fleet2"])) == audit2
    assert standin_server_pids(PORT) == pids_after and _healthy(hosts["fleet0"])


def _kill_stage_once(data_dir: str, hidden: Path, *, timeout_s: float) -> bool:
    """SIGKILL the stand-in extract stage process of the host whose data dir is ``data_dir`` once it has written a
    file into ``hidden``; False when that did not happen within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if hidden.is_dir() and any(hidden.iterdir()):
            for d in Path("/proc").iterdir():
                try:
                    cmd = (d / "cmdline").read_bytes() if d.name.isdigit() else b""
                except OSError:
                    continue
                if b"eagle3ops_standin_stages" in cmd and b"--shard" in cmd and data_dir.encode() in cmd:
                    os.kill(int(d.name), signal.SIGKILL)
                    return True
        time.sleep(0.1)
    return False


def _audit(h) -> list[dict]:
    with Remote(h) as r:
        return audit_entries(r)
