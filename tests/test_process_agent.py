"""The restore agent of serving kind ``process`` (:data:`eagle3ops.commands.process.AGENT_SH`), run here as the
real POSIX sh script on this machine, its ``docker`` a stand-in script that reports the supervisor container's state:
it stops the recorded process with SIGTERM when asked, and restores it with the same command line, environment and
working directory even when nobody asks (the supervisor died), or stops nothing when the supervisor ends first.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from eagle3ops.commands import process as pc
from eagle3ops.config import load_inventory

REPO = Path(__file__).resolve().parents[1]


def _wait(pred, timeout=15.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _pids_of(marker: bytes) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and marker in (d / "cmdline").read_bytes() and _alive(int(d.name)):
                out.append(int(d.name))
        except OSError:
            pass
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _recorded(tmp_path: Path, pid: int, port: int, *, stop_timeout_s: float) -> dict:
    """Record process ``pid`` and build its restore agent's argv (not started): the sandbox's inventory entry with
    serving on ``port``, and a STAND-IN ``docker`` on PATH (a shell script, not Docker) that answers the
    supervisor's state from a file. Returns ``pdir``, ``state`` (that file, "running"), ``argv`` and ``env``."""
    pdir = tmp_path / "w" / "process"
    subprocess.run(pc.record_process(pid, str(pdir)), check=True, capture_output=True)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    state = tmp_path / "supervisor-state"
    state.write_text("running")
    (bindir / "docker").write_text(f"#!/bin/sh\ncat {state}\n")
    (bindir / "docker").chmod(0o755)
    base = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    host = base.model_copy(update={"docker_host": None, "serving": base.serving.model_copy(update={"port": port})})
    argv = pc.start_agent(host, pdir=str(pdir), pid=pid, stop_timeout_s=stop_timeout_s, supervisor="sup", limit_s=60)
    return {"pdir": pdir, "state": state, "argv": argv, "env": {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}}


@pytest.fixture
def world(tmp_path):
    """A served stand-in process (``sleep``, reaped at once by a thread so that no zombie stays), its record, a
    stand-in ``docker`` answering the supervisor's state from a file, and the agent's argv."""
    work = tmp_path / "work"
    work.mkdir()
    secs = str(9000 + os.getpid() % 997)  # a marker no other process has
    proc = subprocess.Popen(["sleep", secs], cwd=work, env={"PATH": os.environ["PATH"], "E3_MARK": "x y"},
                            start_new_session=True)
    threading.Thread(target=proc.wait, daemon=True).start()
    # A port nothing listens on: never the sandbox's serving port (the agent checks that port after the stop)
    yield {**_recorded(tmp_path, proc.pid, _free_port(), stop_timeout_s=5), "pid": proc.pid, "marker": secs.encode(),
           "work": work}
    for pid in _pids_of(b"sleep\0" + secs.encode()):
        os.kill(pid, 9)


def test_agent_stops_on_request_and_restores_when_the_supervisor_dies(world):
    pdir = world["pdir"]
    before = [(Path(f"/proc/{world['pid']}") / f).read_bytes() for f in ("cmdline", "environ")]
    subprocess.run(world["argv"], env=world["env"], check=True, timeout=10)  # returns at once: detached
    assert _wait(lambda: (pdir / "agent.pid").exists())
    assert _alive(world["pid"]), "nothing is stopped before the supervisor asks"
    (pdir / "stop-requested").write_text("now")
    assert _wait(lambda: (pdir / "stopped").exists()), (pdir / "agent.log").read_text()
    assert not _alive(world["pid"])
    world["state"].write_text("exited")  # the supervisor died without asking for the restore
    assert _wait(lambda: (pdir / "restored").exists()), (pdir / "agent.log").read_text()
    new = _pids_of(b"sleep\0" + world["marker"])
    assert len(new) == 1 and new[0] != world["pid"]
    after = [(Path(f"/proc/{new[0]}") / f).read_bytes() for f in ("cmdline", "environ")]
    assert after == before and b"E3_MARK=x y" in after[1]
    assert os.readlink(f"/proc/{new[0]}/cwd") == str(world["work"])
    assert "without asking for the restore: restoring" in (pdir / "agent.log").read_text()


def test_agent_stops_nothing_when_the_supervisor_ends_before_the_stop(world):
    world["state"].write_text("exited")
    subprocess.run(world["argv"], env=world["env"], check=True, timeout=10)
    assert _wait(lambda: "nothing stopped" in ((world["pdir"] / "agent.log").read_text()
                                             if (world["pdir"] / "agent.log").exists() else ""))
    assert _alive(world["pid"]) and not (world["pdir"] / "stopped").exists()


def test_agent_switch_restores_the_recorded_process_when_the_started_one_exits_and_the_supervisor_dies(world):
    """A release (``switch``): the agent stops the live process, starts the ``next.`` record (here a command that
    exits at once), reports its exit, and when the supervisor then dies without a rollback, starts the recorded
    process again by itself, same command line, environment and working directory."""
    pdir = world["pdir"]
    before = [(Path(f"/proc/{world['pid']}") / f).read_bytes() for f in ("cmdline", "environ")]
    (pdir / "next.cmdline.nul").write_bytes(b"sh\0-c\0exit 3\0")
    (pdir / "next.environ.nul").write_bytes(b"PATH=" + os.environ["PATH"].encode() + b"\0")
    (pdir / "next.cwd").write_text("/")
    (pdir / "switch").write_text("release")
    subprocess.run(world["argv"], env=world["env"], check=True, timeout=10)
    (pdir / "stop-requested").write_text("now")
    assert _wait(lambda: (pdir / "stopped").exists()), (pdir / "agent.log").read_text()
    (pdir / "restore-requested").write_text("next.")
    assert _wait(lambda: (pdir / "restored").exists()), (pdir / "agent.log").read_text()
    assert _wait(lambda: (pdir / "exited").exists()), (pdir / "agent.log").read_text()
    assert not _pids_of(b"sleep\0" + world["marker"]), "the recorded process is stopped during the switch"
    world["state"].write_text("exited")  # the supervisor died before rolling back
    assert _wait(lambda: (pdir / "restored.2").exists()), (pdir / "agent.log").read_text()
    new = _pids_of(b"sleep\0" + world["marker"])
    assert len(new) == 1 and new[0] != world["pid"]
    after = [(Path(f"/proc/{new[0]}") / f).read_bytes() for f in ("cmdline", "environ")]
    assert after == before
    assert "is not running: restoring the recorded process" in (pdir / "agent.log").read_text()


@pytest.fixture
def wrapped(tmp_path):
    """Serving behind a wrapper that does not forward SIGTERM (a conda-run or shell wrapper): ``sh -c 'trap "" TERM;
    python3 standin_openai_server.py ...'``, the stand-in server (NOT vLLM) its child. Recorded like ``world``; the
    inventory's serving port is the server's port."""
    port = _free_port()
    mark = f"e3wrap{os.getpid()}x{port}"
    server = REPO / "tests/data/standin_openai_server.py"
    script = f'trap "" TERM; python3 {server} --port {port} --model tiny --label {mark}; echo wrapper-end'
    proc = subprocess.Popen(["sh", "-c", script], cwd=tmp_path, env={"PATH": os.environ["PATH"]},
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    threading.Thread(target=proc.wait, daemon=True).start()
    assert _wait(lambda: _listening(port), 30), "the stand-in server did not start"
    yield {**_recorded(tmp_path, proc.pid, port, stop_timeout_s=2), "pid": proc.pid, "port": port,
           "marker": mark.encode(), "server": server}
    for pid in _pids_of(mark.encode()):
        os.kill(pid, 9)


def test_agent_stops_the_whole_tree_behind_a_wrapper_that_ignores_sigterm(wrapped):
    """The oldest matching process is a wrapper that ignores SIGTERM; its child, the real server,
    must not survive the stop (it would keep the port and the GPUs, and answer the restore's gate)."""
    w, pdir = wrapped, wrapped["pdir"]
    server_pids = [p for p in _pids_of(w["marker"]) if p != w["pid"]]
    assert server_pids, "the server runs as the wrapper's child"
    subprocess.run(w["argv"], env=w["env"], check=True, timeout=10)
    (pdir / "stop-requested").write_text("now")
    assert _wait(lambda: (pdir / "stopped").exists(), 30), (pdir / "agent.log").read_text()
    assert not [p for p in server_pids if _alive(p)], "the wrapper's child (the real server) survived the stop"
    assert not _alive(w["pid"]) and not _listening(w["port"]), "the port must be closed before the stages"
    w["state"].write_text("exited")  # the supervisor died: the agent restores the wrapper and its server
    assert _wait(lambda: (pdir / "restored").exists()), (pdir / "agent.log").read_text()
    assert _wait(lambda: _listening(w["port"]), 30), (pdir / "serving.log").read_text()


def test_the_restore_gate_counts_only_the_process_the_restore_started(wrapped):
    """After the stop, another server takes serving's port (an outside restarter). The process the
    restore starts cannot bind and exits: the agent reports both (``port-held``, ``exited``) so the supervisor's gate
    fails at once instead of passing on the other server (nothing is killed by port: it may be anything)."""
    w, pdir = wrapped, wrapped["pdir"]
    subprocess.run(w["argv"], env=w["env"], check=True, timeout=10)
    (pdir / "stop-requested").write_text("now")
    assert _wait(lambda: (pdir / "stopped").exists(), 30), (pdir / "agent.log").read_text()
    other = subprocess.Popen(["python3", str(w["server"]), "--port", str(w["port"]), "--model", "tiny", "--label",
                              w["marker"].decode() + "-other"], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait(lambda: _listening(w["port"]), 30)
        (pdir / "restore-requested").write_text("")
        assert _wait(lambda: (pdir / "restored").exists()), (pdir / "agent.log").read_text()
        assert (pdir / "port-held").exists() and str(other.pid) in (pdir / "port-held").read_text(), \
            "the gate must know another server holds the port: " + (pdir / "agent.log").read_text()
        assert _wait(lambda: (pdir / "exited").exists(), 30), (pdir / "agent.log").read_text()
        assert other.poll() is None, "the other server is never killed by port"
    finally:
        other.kill()
        other.wait()


def test_a_windows_stop_and_restore_requests_are_what_the_agent_reads(world):
    """The supervisor's side of a window (:class:`eagle3ops.supervisor.kinds.process.ProcessServing`: ``stop``, then
    ``restore``) against the real agent: ``restore-requested`` names the record to start (``''``: the process as
    recorded), so the agent starts the recorded process and its log says nothing of a bad request. The supervisor's
    health gate is a stand-in here (it passes); the subject is the request files."""
    from types import SimpleNamespace

    from eagle3ops.supervisor.kinds.process import ProcessServing

    pdir = world["pdir"]
    sup = SimpleNamespace(plan=SimpleNamespace(process_dir=str(pdir), process_pid=world["pid"], stop_timeout_s=5),
                          journal=SimpleNamespace(log=lambda *a, **k: None), gate_through_signal=lambda: None,
                          unhealthy=False)
    subprocess.run(world["argv"], env=world["env"], check=True, timeout=10)
    assert _wait(lambda: (pdir / "agent.pid").exists())
    kind = ProcessServing(sup)
    kind.stop()
    assert not _alive(world["pid"])
    assert kind.restore() == "restored"
    new = int((pdir / "restored").read_text())  # the process the agent started (other tests' agents may start more)
    log = (pdir / "agent.log").read_text()
    assert new != world["pid"] and _alive(new), log
    assert Path(f"/proc/{new}/cmdline").read_bytes() == b"sleep\0" + world["marker"] + b"\0", log
    assert "bad record prefix" not in log and "record 'recorded'" in log, log
