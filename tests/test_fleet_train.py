"""End to end: a fleet run's hidden states moved to the training host and trained on there:
``eagle3ops extract fleetT0 fleetT1 fleetT2 --merged M`` then ``eagle3ops train fleetT0 --from-fleet M`` over three
sandbox hosts, each in a network namespace of its own behind a veth link limited to 100 mbit (``tc tbf``): the fleet
fixture :mod:`eagle3ops_dev.fleet` (sandboxes ``pytest-fleetT0..2``, SSH 2270-2272, namespaces ``e3fleetT0..2``,
10.227.k.0/24). Venv hosts with the STAND-IN pipeline environment (:mod:`eagle3ops_dev.standin_env`: the product's
supervisor and windows; stand-in stages whose extract files hold the samples' token ids plus filler bytes, and whose
train checks its inputs' sha256 and records every sample file it read); fleetT0 serves the STAND-IN OpenAI server as
``serving: process`` (port 18070 in its namespace), fleetT1 and fleetT2 have ``serving: none``. The real CLI runs as a
subprocess, as a user runs it."""

from __future__ import annotations

import hashlib
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
from eagle3ops_dev import fleet, standin_env
from eagle3ops_dev.standin_env import standin_server_pids

REPO = Path(__file__).resolve().parents[1]
NET = {"prefix": "pytest-fleetT", "ns_prefix": "e3fleetT", "subnet": 227}
SSH_PORT, PORT, MODEL = 2270, 18070, "standin-fleet-train"
PIPELINE = "target_model: /model\nprepare: {datasets: [builtin:sharegpt], max_seq_len: 256, max_samples: 9}\n"
PAD = 1_000_000  # filler bytes per stand-in hidden-state file: the copy moves ~6 MB over the 100 mbit links
CLI_TIMEOUT_S = 300

pytestmark = [pytest.mark.sandbox]
#: This module brings up sandboxes of its own (sshd only, in namespaces): its tests run in the "rest" part.
OWN_SANDBOX = "pytest-fleetT0"


def _healthy(h) -> bool:
    with Remote(h) as r:
        return r.run(hc.http_status(f"http://127.0.0.1:{PORT}/health"), check=False).stdout.strip() == "200"


@pytest.fixture(scope="module")
def fleet_env(tmp_path_factory):
    """(hosts by name, inventory file, pipeline file, tmp dir, nodes): three nodes up, the stand-in environment
    delivered to each, the stand-in server serving on fleetT0."""
    tmp = tmp_path_factory.mktemp("fleettrain")
    nodes = fleet.up(3, ssh_port=SSH_PORT, **NET)
    try:
        tgz, image = standin_env.build("/usr/bin/python3")
        tag = uuid.uuid4().hex[:6]
        hosts = {}
        for k, node in enumerate(nodes):
            serving = ({"kind": "process", "process_match": f"standin_openai_server.py --port {PORT}", "port": PORT,
                        "served_model_name": MODEL, "health_timeout_s": 60, "stop_timeout_s": 10} if k == 0 else "none")
            hosts[f"fleetT{k}"] = fleet.venv_host(node, f"fleetT{k}", f"{node.info.data_dir}/fleet-{tag}",
                                                  serving=serving, stage_env={"EAGLE3OPS_STANDIN_PAD_BYTES": str(PAD)})
        fleet.start_standin_server(hosts["fleetT0"], nodes[0], REPO / "tests/data/standin_openai_server.py",
                                   port=PORT, model=MODEL)
        for h in hosts.values():
            fleet.make_dirs(h)
            with Remote(h) as r:
                deliver_env(r, tgz, image=image)
        deadline = time.monotonic() + 30
        while not _healthy(hosts["fleetT0"]):
            assert time.monotonic() < deadline, "the stand-in server on fleetT0 did not answer /health within 30 s"
            time.sleep(0.5)
        inv = tmp / "inventory.yaml"
        inv.write_text(fleet.inventory_yaml(list(hosts.values())))
        pipeline = tmp / "pipeline.yaml"
        pipeline.write_text(PIPELINE)
        yield hosts, inv, pipeline, tmp, nodes
    finally:
        for pid in standin_server_pids(PORT):
            os.kill(pid, signal.SIGTERM)
        fleet.down(3, **NET)


def _cli(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "eagle3ops", *args], capture_output=True, text=True,
                         timeout=CLI_TIMEOUT_S, cwd=REPO)
    return out, round(time.monotonic() - t0, 1)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_train_from_fleet_moves_verifies_resumes_and_trains_on_the_union(fleet_env):
    hosts, inv, pipeline, tmp, nodes = fleet_env
    assert "rate 100Mbit" in nodes[2].link.qdisc()
    merged_path = tmp / "merged.json"
    common = ["-i", str(inv), "--pipeline", str(pipeline), "--run", "fl"]
    ext, ext_s = _cli("extract", "fleetT0", "fleetT1", "fleetT2", *common, "--merged", str(merged_path))
    assert ext.returncode == 0, (ext.stdout + ext.stderr)[-3000:]
    merged = json.loads(merged_path.read_text())
    shards = {s["host"]: s for s in merged["fleet"]["shards"]}
    assert merged["samples"] == 9 and set(shards) == {"fleetT0", "fleetT1", "fleetT2"}
    run = {n: Path(f"{h.data_dir}/runs/fl/extract") for n, h in hosts.items()}  # the sandboxes' disk is this machine's

    def files_of(host: str) -> list[str]:
        s = shards[host]
        return [r["file"] for r in merged["sample_files"] if s["start"] <= r["i"] < s["end"]]

    assert not any((run["fleetT0"] / f).exists() for f in files_of("fleetT1") + files_of("fleetT2"))
    train = ["train", "fleetT0", *common, "--from-fleet", str(merged_path)]

    # --dry-run: the plan only (bytes per source host, from the manifest), nothing written on the training host
    dry, _ = _cli(*train, "--dry-run")
    assert dry.returncode == 0, (dry.stdout + dry.stderr)[-3000:]
    plan = json.loads(dry.stdout[dry.stdout.index("{"):dry.stdout.index("\nthen the train window")])
    moves = {m["host"]: m for m in plan["moves"]}
    for src in ("fleetT1", "fleetT2"):
        assert moves[src]["bytes"] == sum(merged["files"][f]["bytes"] for f in files_of(src))
        assert moves[src]["files"] == len(files_of(src)) and moves[src]["estimated_s"] > 0
    assert not (run["fleetT0"] / ".incoming").exists() and not (run["fleetT0"] / "manifest.json").exists()

    # a shard file missing on its host: refused by name; the files that did arrive are verified and kept
    gone = run["fleetT1"] / files_of("fleetT1")[1]
    saved = gone.read_bytes()
    gone.unlink()
    pids = standin_server_pids(PORT)
    miss, _ = _cli(*train)
    assert miss.returncode == 1, (miss.stdout + miss.stderr)[-3000:]
    assert f"extract/{files_of('fleetT1')[1]} did not arrive" in " ".join(miss.stderr.split()), miss.stderr[-2000:]
    kept = [f for f in files_of("fleetT1") if f != files_of("fleetT1")[1]]
    assert all(_sha(run["fleetT0"] / f) == merged["files"][f]["sha256"] for f in kept)
    gone.write_bytes(saved)

    # a corrupted shard file (same size, one byte changed): refused by name, never placed, nothing else lost
    bad = run["fleetT2"] / files_of("fleetT2")[0]
    good_bytes = bad.read_bytes()
    bad.write_bytes(good_bytes[:-2] + b"y\n")
    corrupt, _ = _cli(*train)
    assert corrupt.returncode == 1, (corrupt.stdout + corrupt.stderr)[-3000:]
    said = " ".join(corrupt.stderr.split())
    assert f"extract/{files_of('fleetT2')[0]} (from fleetT2)" in said and "rerun the fleet extract" in said, said
    assert "from fleetT1: 1 file(s)" in corrupt.stdout, corrupt.stdout[-2000:]  # only the one missing before
    assert not (run["fleetT0"] / files_of("fleetT2")[0]).exists()
    assert not (run["fleetT0"] / "manifest.json").exists()  # no merged manifest before every file checks
    assert standin_server_pids(PORT) == pids and _healthy(hosts["fleetT0"])  # no window ran: serving untouched
    bad.write_bytes(good_bytes)

    # the real run: only the corrupted file is sent again; the train window runs on the union
    ok, ok_s = _cli(*train)
    assert ok.returncode == 0, (ok.stdout + ok.stderr)[-3000:]
    assert "from fleetT1: 0 file(s), 0 bytes to send" in ok.stdout and "from fleetT2: 1 file(s)" in ok.stdout
    for f, e in merged["files"].items():
        assert _sha(run["fleetT0"] / f) == e["sha256"], f
    placed = json.loads((run["fleetT0"] / "manifest.json").read_text())
    prep = (run["fleetT0"].parent / "prepare/manifest.json").read_bytes()
    assert placed["inputs"]["prepare"] == hashlib.sha256(prep).hexdigest()
    seen = json.loads((run["fleetT0"].parent / "train/standin.json").read_text())["train"]
    assert [r["i"] for r in seen["read"]] == list(range(9))  # the stand-in train read every shard's samples
    assert [r["file"] for r in seen["read"]] == [r["file"] for r in merged["sample_files"]]
    assert seen["read_tokens"] == merged["tokens"]
    assert standin_server_pids(PORT) != pids and _healthy(hosts["fleetT0"])  # the window stopped and restored serving
    record = json.loads((run["fleetT0"] / "fleet-copy.json").read_text())

    # a rerun sends nothing and the train window is a no-op
    again, again_s = _cli(*train)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert "total: 0 bytes" in again.stdout and "verified and placed" not in again.stdout
    line = next(x for x in again.stdout.splitlines() if "from fleetT2:" in x)
    assert "0 file(s), 0 bytes to send" in line and "measured by the copy" in line, line  # the rate it measured
    assert "nothing to do" in again.stdout + again.stderr
    print(json.dumps({"extract_s": ext_s, "train_from_fleet_s": ok_s, "rerun_s": again_s,
                      "moved_bytes_total": sum(moves[s]["bytes"] for s in moves),
                      "measured": record["sources"], "planned_s": {s: m["estimated_s"] for s, m in moves.items()}}))
