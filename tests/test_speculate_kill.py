"""A ``speculate`` driver killed (SIGKILL) at each of four points of the job (CI runs two:
:data:`RUN_POINTS`) — the baseline
measurement, the speculative restart, the speculative measurement, the decision — leaves the host to finish every
time: the lock released, the attempt's result and the audit line complete, serving on the decided release.

On the sandbox, with serving of kind ``process`` running the STAND-IN OpenAI server
(``tests/data/standin_openai_server.py``, NOT vLLM: it starts in a second and simulates speculation, a speculative
release streaming ``--spec-speedup`` times faster with spec-decode counters on ``/metrics``), so each kill costs
seconds, not a vLLM start. The jobs run the default order of passes (``serving.gate_design: aba``): the baseline
restarted and measured, the speculative release measured, the baseline restarted and measured again, so a kept
release makes 4 restarts and a rejected one 3. The driver is the real CLI (``python -m eagle3ops speculate``) in a subprocess; the
supervisor, the restore agent, the measurement and the decision are the real ones. The one CI test of the job on
real vLLM is ``tests/test_speculate_ship.py``'s sandbox test.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from eagle3ops.config import load_inventory
from eagle3ops.health import wait_healthy
from eagle3ops.remote import Remote
from test_speculate_ship import _build_head

REPO = Path(__file__).resolve().parents[1]
PORT, MODEL = int(os.environ.get("EAGLE3OPS_TEST_KILL_PORT", "18079")), "standin-kill"

#: journal (step, event) at which the driver is killed, the stand-in's speculative speed-up, the output tokens per
#: gate request, the verdict expected.
POINTS = {"baseline": (("baseline", "start"), 10.0, 32, "keep"),
          "speculative-restart": (("switch", "start"), 10.0, 32, "keep"),
          "speculative-measurement": (("measure", "start"), 10.0, 32, "keep"),
          "decision": (("decide", "ok"), 0.5, 8, "rollback")}


#: The gate margin of the killed jobs: wide (drift limit 15 %), because this tests the kill, not the gate's
#: resolution. With the default 0.05 (drift limit 2.5 %) stop 36's CI (the in-image suite running beside this one
#: on the same 2 cores) left the x2 "speculative-restart" point undecided: "the baseline drifted ... (90 % interval
#: +5.8 % to +7.0 %), beyond half the margin (2.5 %)".
#: The stand-in streams a token every :data:`TOKEN_MS` ms (x10 faster on the keep points, 32 tokens a request):
#: with x2, 12 ms and 8 tokens a pass of 4 requests took 0.2-0.4 s, and with the host suite's two parts and the
#: in-image suite side by side (the CPUs 0-5 % idle) one speculative pass stalled a second outside its requests
#: (wall 1.97 s, requests 0.95 s): the "baseline" point ended undecided twice (lower bound x1.221, then x0.342 at
#: x3 and 25 ms). Now a baseline pass takes 3.2 s and a speculative one 0.3 s, so a 1 s stall leaves that pass at
#: x2.4, and the t interval over 3 + 3 passes with one such pass keeps its lower bound near x2.3, above x1.3.
KILL_MARGIN = 0.3
TOKEN_MS = 25


def _servers() -> list[tuple[int, list[str]]]:
    """(pid, argv) of every stand-in server on :data:`PORT` (read from /proc here: the sandbox shares this machine)."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if d.name.isdigit() and b"standin_openai_server" in cmd and f"--port\0{PORT}\0".encode() in cmd:
            found.append((int(d.name), [c.decode() for c in cmd.split(b"\0") if c]))
    return found


def _server() -> tuple[int | None, list[str]]:
    """(pid, argv) of the one stand-in server on :data:`PORT`; fails when more than one runs."""
    found = _servers()
    assert len(found) <= 1, f"more than one stand-in server on port {PORT}: {found}"
    return found[0] if found else (None, [])


@pytest.fixture(scope="module")
def kill_head(deployed, tmp_path_factory):
    h, dep = deployed
    return _build_head(dep.tag, h.model_path, tmp_path_factory.mktemp("head"), draft_vocab=None, seed=3)


@pytest.fixture
def kill_host(deployed, tmp_path, request):
    """(inventory path, host): the sandbox with serving of kind process, the stand-in server running as the SSH
    user with ``--spec-speedup`` of the test's point."""
    h, dep = deployed
    _, speedup, max_tokens, _ = POINTS[request.node.callspec.params["point"]]
    work = Path(h.data_dir).parent / f"kill-{uuid.uuid4().hex[:8]}"
    pw = pwd.getpwnam(h.user or "e3ops")
    work.mkdir(mode=0o755)
    shutil.copy(REPO / "tests/data/standin_openai_server.py", work / "standin_openai_server.py")
    for p in (work, work / "standin_openai_server.py"):
        os.chown(p, pw.pw_uid, pw.pw_gid)
    raw = yaml.safe_load((REPO / "deploy/hosts.yaml").read_text())["hosts"]["sandbox"]
    raw.update(identity_file=str(h.identity_file), known_hosts=str(h.known_hosts), port=h.port,
               docker_host=h.docker_host, data_dir=h.data_dir, state_dir=h.state_dir, model_path=h.model_path,
               pipeline_image=dep.tag,
               serving={"kind": "process", "process_match": f"standin_openai_server.py --port {PORT}",
                        "port": PORT, "served_model_name": MODEL, "health_timeout_s": 60, "stop_timeout_s": 10,
                        "gate_concurrency": [1], "gate_prompts": 4, "gate_max_tokens": max_tokens, "gate_passes": 3,
                        "acceptance_floor": 1.5, "gate_margin": KILL_MARGIN,
                        # the plan's power is at x1.30, which a 0.3 margin cannot clear: this tests the kill (the
                        # stand-in is x2.4 or more faster), so the low power is accepted
                        "gate_accept_low_power": True})
    inv = tmp_path / "hosts.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"sandbox": raw}}))
    start = (f"cd {work} && setsid nohup /usr/bin/python3 {work}/standin_openai_server.py --port {PORT} --model "
             f"{MODEL} --token-ms {TOKEN_MS} --spec-speedup {speedup} >{work}/first.log 2>&1 </dev/null &")
    _stop_servers(h)  # a server left by an earlier test would answer for this one (its speed-up, its argv)
    with Remote(h) as r:
        r.run(["sh", "-c", start])
    wait_healthy(f"http://127.0.0.1:{PORT}", MODEL, timeout_s=30, interval_s=0.3)
    servers = _servers()
    assert len(servers) == 1 and f"--spec-speedup\0{speedup}\0" in "\0".join(servers[0][1]) + "\0", servers
    try:
        yield inv, load_inventory(inv).host("sandbox")
    finally:
        _stop_servers(h)
        shutil.rmtree(work, ignore_errors=True)


def _stop_servers(h, timeout_s: float = 30) -> None:
    """SIGTERM every stand-in server on :data:`PORT` (as the SSH user that started them) until none is left, bounded:
    each test starts from no server on the port."""
    deadline = time.time() + timeout_s
    while (pids := [pid for pid, _ in _servers()]) and time.time() < deadline:
        with Remote(h) as r:
            r.run(["kill", *map(str, pids)], check=False)
        time.sleep(0.5)
    assert not _servers(), f"stand-in servers on port {PORT} still run after {timeout_s:.0f} s: {_servers()}"


def _speculate_windows(state: Path) -> set[Path]:
    return set((state / "windows").glob("*-speculate-*"))


def _new_speculate(state: Path, before: set[Path]) -> Path | None:
    """The speculate window made since ``before`` was taken (the earlier points' windows are older, and may be
    seconds old: a test that picked one of them read that point's finished job, not its own)."""
    found = sorted(_speculate_windows(state) - before)
    return found[-1] if found else None


def _entries(journal: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in journal.read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []


#: The points CI runs: two of the four, ``E3_TEST_KILL_POINTS=all`` runs all four (``make test`` by hand, when the
#: job's steps change). The host-side job does not know where its driver died (the supervisor is detached before the
#: record step), so the points differ only in what the host is doing at the kill: a measurement ("baseline",
#: "speculative-measurement": the same replay), a restart ("speculative-restart") or the end ("decision", the
#: rollback branch). CI keeps the restart and the decision, whose verdicts differ (keep, rollback); the two
#: measurement points cost ~45 s each of the sandbox part, then the critical path of ``make test`` (CI stop 43:
#: 1,598 s, sandbox part 1,532 s). Unset (README's ``make test``, CI), two points run.
#: In the first runs, killed at "speculative-restart" the job ended "keep"
#: while the stand-in found on the port had no --speculative-config, and at "decision" (0.5x speculative speed) the
#: verdict was "keep" at x1.72-1.89: the test took the newest speculate window whose folder was at most 2 s older
#: than its start, i.e. the previous point's finished window (its journal already past the kill point, its result
#: "keep"), killed its own driver at once and read that result. It now takes only a window made after its start; the
#: fixture also starts each point with no stand-in server on the port.
RUN_POINTS = (list(POINTS) if os.environ.get("E3_TEST_KILL_POINTS") == "all"
              else ["speculative-restart", "decision"])


@pytest.mark.sandbox
@pytest.mark.images
@pytest.mark.parametrize("point", RUN_POINTS)
def test_a_driver_killed_during_the_job_leaves_the_host_to_finish(point, kill_host, kill_head):
    inv, host = kill_host
    (step, event), _, _, verdict = POINTS[point]
    state = Path(host.state_dir)
    run_id = f"kill-{uuid.uuid4().hex[:6]}"
    t0, before = time.time(), _speculate_windows(state)
    driver = subprocess.Popen([sys.executable, "-m", "eagle3ops", "speculate", "sandbox", "--run", run_id,
                               "--head", str(kill_head), "--force", "--inventory", str(inv)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wdir, deadline = None, time.time() + 240
        while time.time() < deadline:
            wdir = wdir or _new_speculate(state, before)
            if wdir and any(e["step"] == step and e["event"] == event for e in _entries(wdir / "journal.jsonl")):
                break
            assert driver.poll() is None, f"the driver ended before {step} {event}"
            time.sleep(0.05)
        else:
            pytest.fail(f"no {step} {event} in the job's journal within 240 s")
        os.kill(driver.pid, signal.SIGKILL)  # the driver dies here; the host goes on
        driver.wait(10)
        assert wdir is not None
        deadline = time.time() + 180
        while time.time() < deadline and not (wdir / "result.json").exists():
            time.sleep(0.5)
        res = json.loads((wdir / "result.json").read_text())
    finally:
        if driver.poll() is None:
            os.kill(driver.pid, signal.SIGKILL)
    attempt = res["speculate"]
    assert res["outcome"] == "ok" and res["serving_healthy"] is True, res
    assert attempt["verdict"] == verdict or (verdict == "rollback" and attempt["verdict"] == "undecided"), attempt
    assert attempt["gate_design"]["used"] == "aba" and attempt["passes"]["baseline_after"] == 2, attempt
    assert len(res["restarts_s"]) == (4 if attempt["verdict"] == "keep" else 3), res["restarts_s"]
    assert not (state / "lock").exists(), "the supervisor released the lock"
    stored = json.loads((Path(attempt["attempt_dir"]) / "result.json").read_text())
    assert stored["verdict"] == attempt["verdict"] and stored["levels"]["1"]["speculative"]
    audit = [json.loads(x) for x in (state / "audit.jsonl").read_text().splitlines()]
    mine = [e for e in audit if e.get("window") == wdir.name]
    assert mine and mine[-1]["verdict"] == attempt["verdict"] and mine[-1]["figures"]["levels"]
    _, argv = _server()
    agent = wdir / "process" / "agent.log"
    assert argv and ("--speculative-config" in argv) == (attempt["verdict"] == "keep"), (
        argv, agent.read_text() if agent.exists() else "no agent.log", _entries(wdir / "journal.jsonl")[-8:])
    wait_healthy(f"http://127.0.0.1:{PORT}", MODEL, timeout_s=10, interval_s=0.3)
    print(f"{point}: killed at {step} {event}; host finished with {attempt['verdict']} in {time.time() - t0:.1f} s")
