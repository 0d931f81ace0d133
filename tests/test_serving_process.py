"""Serving kind ``process`` (issue 12): vLLM run as a plain process on the host, stopped and restored by the
host-side restore agent, health-gated by the supervisor; releases (changed flags) and rollbacks of it.

The served process here is a STAND-IN (``tests/data/standin_openai_server.py``, a tiny OpenAI-compatible server,
not vLLM): the base image's vLLM virtualenv (8.1 GB) is too large to copy out of the image on this machine. It runs
on the sandbox host as the SSH user, started over SSH with its own working directory and an environment marker.
"""

from __future__ import annotations

import os
import pwd
import shutil
import time
import uuid
from pathlib import Path

import pytest
import yaml

from eagle3ops.config import load_inventory
from eagle3ops.health import probe
from eagle3ops.remote import Remote
from eagle3ops.window.common import audit_entries
from eagle3ops.window.lock import read_lock
from eagle3ops.window.planner import build_plan, supervisor_commands
from eagle3ops.window.run import run_window

REPO = Path(__file__).resolve().parents[1]
SANDBOX_ROOT = Path("/var/lib/eagle3ops-sandbox/sandbox")
PORT, MODEL = 18077, "standin-tiny"
#: An extract window on a fresh run whose dataset file is missing: its prepare stage runs for real and fails at once,
#: the cheapest real stage run between the stop and the restore (a train window on a fresh run is refused before
#: the stop: its input `extract` is not ready).
TINY = """target_model: /model
prepare: {datasets: [missing-stand-in.jsonl], max_seq_len: 256, max_samples: 8}
"""


def _proc(pid: int) -> tuple[bytes, bytes, str, str]:
    p = Path(f"/proc/{pid}")
    uid = next(ln.split()[1] for ln in (p / "status").read_text().splitlines() if ln.startswith("Uid:"))
    return (p / "cmdline").read_bytes(), (p / "environ").read_bytes(), os.readlink(p / "cwd"), uid


def _pid_of(marker: str) -> int | None:
    """Oldest process whose command line holds ``marker`` (read from /proc here: the sandbox shares this machine)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes() and b"standin_openai_server" in \
                        (d / "cmdline").read_bytes():
                    found.append((d.stat().st_mtime, int(d.name)))
            except OSError:
                continue
    return min(found)[1] if found else None


def _wait_up(timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while True:
        try:
            probe(f"http://127.0.0.1:{PORT}", MODEL)
            return
        except Exception:  # noqa: BLE001 - not up yet
            if time.time() > deadline:
                raise
            time.sleep(0.3)


@pytest.fixture
def process_host(deployed, tmp_path):
    """(host with serving kind process, DeployResult, pid, its workdir): the stand-in server running as e3ops."""
    h, dep = deployed
    work = SANDBOX_ROOT / f"proc-{uuid.uuid4().hex[:8]}"
    pw = pwd.getpwnam(h.user or "e3ops")
    work.mkdir(mode=0o755)
    shutil.copy(REPO / "tests/data/standin_openai_server.py", work / "standin_openai_server.py")
    for p in (work, work / "standin_openai_server.py"):
        os.chown(p, pw.pw_uid, pw.pw_gid)
    raw = yaml.safe_load((REPO / "deploy/hosts.yaml").read_text())["hosts"]["sandbox"]
    raw.update(identity_file=str(h.identity_file), known_hosts=str(h.known_hosts), port=h.port,
               docker_host=h.docker_host, data_dir=h.data_dir, state_dir=h.state_dir, model_path=h.model_path,
               serving={"kind": "process", "process_match": f"standin_openai_server.py --port {PORT}",
                        "port": PORT, "served_model_name": MODEL, "health_timeout_s": 60, "stop_timeout_s": 10})
    inv = tmp_path / "hosts.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"sandbox": raw}}))
    host = load_inventory(inv).host("sandbox")
    start = (f"cd {work} && E3_STANDIN_MARK={work.name} setsid nohup /usr/bin/python3 {work}/standin_openai_server.py "
             f"--port {PORT} --model {MODEL} >{work}/first.log 2>&1 </dev/null &")
    with Remote(h) as r:
        r.run(["sh", "-c", start])
    _wait_up()
    pid = _pid_of(f"--port\0{PORT}")
    assert pid
    try:
        yield host, dep, pid, work
    finally:
        for _ in range(2):
            left = _pid_of(f"--port\0{PORT}")
            if left:
                with Remote(h) as r:
                    r.run(["kill", str(left)], check=False)
                time.sleep(1)
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.sandbox
@pytest.mark.images
def test_window_stops_and_restores_a_serving_process_as_recorded(process_host):
    host, dep, pid, work = process_host
    before = _proc(pid)
    with Remote(host, dry_run=True) as r:  # the plan shows the agent, the stop and the restore
        cmds = supervisor_commands(host, build_plan(host, kind="window", window_id="w", image=dep.tag, command="c",
                                                    stages=["prepare"], process_pid=pid))
    flat = [" ".join(c) for c in cmds]
    assert any("eagle3ops-restore-agent" in c for c in flat) and any(c.startswith(f"kill -TERM {pid}") for c in flat)
    t0 = time.time()
    with Remote(host) as r:
        res = run_window(r, kind="extract", image=dep.tag, expected_image_id=dep.image_id,
                         command="pytest process", run=f"proc-{uuid.uuid4().hex[:8]}", pipeline_text=TINY)
        assert read_lock(r) is None, res
        audit = [e for e in audit_entries(r) if e.get("window") == res["window_id"]]
    wall = time.time() - t0
    assert res["stages"]["prepare"].startswith("failed") and "extract" not in res["stages"], res
    assert "missing-stand-in.jsonl" in res["stages"]["prepare"], res
    assert res["serving_healthy"] is True and res["serving_running"] is True, res
    assert res["serving"] == "process" and res["release"] is None, res
    assert res["downtime_s"] and res["downtime_s"] > 0
    assert audit and audit[-1]["outcome"] == "failed"
    new = _pid_of(f"--port\0{PORT}")
    assert new and new != pid
    after = _proc(new)
    assert after[0] == before[0], "same command line"
    assert after[1] == before[1], "same environment"
    assert after[2] == before[2] == str(work), "same working directory"
    assert after[3] == before[3], "same user"
    assert b"E3_STANDIN_MARK=" + work.name.encode() in after[1]
    pdir = Path(host.state_dir) / "windows" / res["window_id"] / "process"
    assert "stand-in OpenAI server" in (pdir / "serving.log").read_text()
    assert "restored: pid" in (pdir / "agent.log").read_text()
    _wait_up(5)
    print(f"process window: wall {wall:.1f} s, downtime {res['downtime_s']} s")


@pytest.mark.sandbox
@pytest.mark.images
def test_release_rollback_and_failed_release_of_a_serving_process(process_host):
    """A release with a changed flag, a rollback, then a release whose process exits at once (an argument the
    stand-in rejects): each leaves the live process's command line as expected, gated, and the release history
    naming the live release. Its own state dir: the sandbox's container releases stay as they are."""
    from eagle3ops.config.plan import ReleaseChange
    from eagle3ops.supervisor.releases import Releases

    host, dep, pid, work = process_host
    state = work / "state"
    state.mkdir(mode=0o755)
    pw = pwd.getpwnam(host.user or "e3ops")
    os.chown(state, pw.pw_uid, pw.pw_gid)
    host = host.model_copy(update={"state_dir": str(state)})
    before = _proc(pid)
    argv0 = before[0].split(b"\0")[:-1]
    printed: list[str] = []
    with Remote(host, dry_run=True, echo=printed.append) as r:  # `release --dry-run`: the plan, nothing done
        res = run_window(r, kind="release", image=dep.tag, expected_image_id=dep.image_id, command="pytest dry",
                         change=ReleaseChange(args=["--label", "v2"]))
    assert res["outcome"] == "dry-run" and res["serving"] == "process", res
    flat = [" ".join(c) for c in res["supervisor_commands"]]
    assert any(c.startswith(f"kill -TERM {pid}") for c in flat), flat
    assert any("--label v2" in c for c in flat) and any("roll back to the recorded process" in c for c in flat), flat
    assert any("eagle3ops-restore-agent" in line for line in printed) and _pid_of(f"--port\0{PORT}") == pid
    assert not (state / "releases").exists() and not (state / "windows").exists(), "a dry run writes nothing"
    times = {}

    def window(kind: str, **kw):
        t0 = time.time()
        with Remote(host) as r:
            res = run_window(r, kind=kind, image=dep.tag, expected_image_id=dep.image_id, command=f"pytest {kind}",
                             **kw)
            assert read_lock(r) is None, res
        times[f"{kind} {len(times)}"] = round(time.time() - t0, 1)
        live = _pid_of(f"--port\0{PORT}")
        assert live, res
        _wait_up(5)
        return res, _proc(live)

    res, live = window("rollback")  # nothing was live before: refused by the supervisor, nothing stopped
    assert res["outcome"] == "failed" and "no release that was live before" in res["error"], res
    assert res["serving_healthy"] is True and live == before and _pid_of(f"--port\0{PORT}") == pid, res

    res, live = window("release", change=ReleaseChange(args=["--label", "v2"]))
    assert res["outcome"] == "ok" and res["serving_healthy"] is True, res
    assert live[0].split(b"\0")[:-1] == argv0 + [b"--label", b"v2"], live[0]
    assert live[1:] == before[1:], "same environment, working directory and user"
    rel = Releases(state)
    first, v2 = rel.history()[-2:]
    assert rel.current() == v2 == res["release"] and first < v2

    res, live = window("rollback")
    assert res["outcome"] == "ok" and res["serving_healthy"] is True and res["release"] == first, res
    assert live[0] == before[0] and live[1:] == before[1:]
    assert Releases(state).current() == first

    res, live = window("release", change=ReleaseChange(args=["--no-such-flag"]))
    assert res["outcome"] == "failed" and "rolled back to release" in res["error"], res
    assert res["serving_healthy"] is True and res["serving_running"] is True, res
    assert live[0] == before[0], "the recorded process is back"
    rel = Releases(state)
    assert rel.current() == first == res["release"]
    assert max(rel.numbers()) not in rel.history(), "the failed release never became live"
    pdir = state / "windows" / res["window_id"] / "process"
    assert (pdir / "exited").exists() and "unrecognized arguments" in (pdir / "serving.log").read_text()

    res, live = window("rollback", to_release=v2)  # a named release comes back, as it was recorded
    assert res["outcome"] == "ok" and res["release"] == v2, res
    assert live[0].split(b"\0")[:-1] == argv0 + [b"--label", b"v2"] and live[1:] == before[1:]
    assert Releases(state).history()[-1] == v2
    print(f"process release/rollback windows: {times}")


def test_release_changing_the_image_of_a_serving_process_is_refused_clearly():
    from types import SimpleNamespace

    from eagle3ops.config.plan import ReleaseChange
    from eagle3ops.window.common import WindowError

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    h = h.model_copy(update={"serving": type(h.serving)(kind="process", process_match="vllm serve",
                                                        served_model_name="m")})
    with pytest.raises(WindowError, match="serves with a process.*not the image or binds; drop --image"):
        run_window(SimpleNamespace(host=h), kind="release", image="i", expected_image_id=None, command="pytest",
                   change=ReleaseChange(image="other:tag"))
    with pytest.raises(ValueError, match="not --image"):
        build_plan(h, kind="release", window_id="w", image="i", command="c", change=ReleaseChange(image="o"))
