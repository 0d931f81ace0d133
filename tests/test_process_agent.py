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
    pdir = tmp_path / "w" / "process"
    subprocess.run(pc.record_process(proc.pid, str(pdir)), check=True, capture_output=True)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    state = tmp_path / "supervisor-state"
    state.write_text("running")
    (bindir / "docker").write_text(f"#!/bin/sh\ncat {state}\n")
    (bindir / "docker").chmod(0o755)
    host = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox").model_copy(update={"docker_host": None})
    argv = pc.start_agent(host, pdir=str(pdir), pid=proc.pid, stop_timeout_s=5, supervisor="sup", limit_s=60)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    yield {"pid": proc.pid, "pdir": pdir, "state": state, "argv": argv, "env": env, "marker": secs.encode(),
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
