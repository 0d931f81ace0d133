"""A deploy lock whose driver died before its window's supervisor started (killed in preflight or at launch: no plan
on the host yet). The lock names the driver (machine and pid); from that machine a dead driver's lock is stale at
once, and a lock still in its launch grace is described as a driver in preflight, not as a running window to
``attach`` to (``attach`` would follow the host's previous window). Pure: a stand-in executor answers the host's
reads from a dict (the lock's details file, no supervisor, no plan); the dead driver is a real child process of
this test, waited for.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from eagle3ops.config import load_inventory
from eagle3ops.window import lock as wl

REPO = Path(__file__).resolve().parents[1]


class _Res:
    def __init__(self, stdout: str = "", ok: bool = True):
        self.stdout, self.stderr, self.ok, self.exited = stdout, "", ok, 0 if ok else 1


class _Host:
    """Stand-in executor over the sandbox inventory entry: the lock's details file, no supervisor, no plan."""

    def __init__(self, details: dict | None = None):
        self.host = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
        self.dry_run, self.details, self.written = False, details, {}

    def run(self, argv, *, check=True, timeout=None, stdin=None, **_):
        a = list(argv)
        if a[0] == "find" and a[1].endswith("/lock/details.json"):
            return _Res(json.dumps(self.details) if self.details else "", ok=bool(self.details))
        if a[0] == "test" and a[-1].endswith("/lock"):
            return _Res(ok=self.details is not None)
        if a[0] == "tee":
            self.written[a[-1]] = stdin
        if a[0] == "mkdir":
            return _Res()
        if a[0] == "find":  # a plan or result: none
            return _Res(ok=False)
        return _Res(ok=False)  # the supervisor container: not there


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _details(pid: int, machine: str, age_s: float = 5.0) -> dict:
    since = (datetime.now(timezone.utc) - timedelta(seconds=age_s)).isoformat(timespec="seconds")
    return {"window_id": "20261207T151136Z-extract-0f44c2", "holder": "root@vm", "since": since,
            "command": "eagle3ops extract sandbox --run r1", "message": "",
            "driver": {"machine": machine, "pid": pid}}


def test_the_lock_names_its_driver():
    r = _Host()
    wl.acquire_lock(r, "20261207T151136Z-extract-0f44c2", "eagle3ops extract sandbox --run r1")
    [written] = [json.loads(v) for k, v in r.written.items() if k.endswith("/lock/details.json")]
    assert written["driver"] == {"machine": socket.gethostname(), "pid": os.getpid()}, written


def test_a_dead_drivers_lock_on_its_own_machine_is_stale_at_once():
    r = _Host(_details(_dead_pid(), socket.gethostname()))
    assert wl.lock_is_stale(r, r.details)
    text = " ".join(wl.describe_lock(r).split())
    assert "is not running" in text and "lock release sandbox --force" in text, text
    assert "still running" not in text, text


@pytest.mark.parametrize("machine, pid", [pytest.param("elsewhere", None, id="another-machine"),
                                          pytest.param(None, os.getpid(), id="alive-here")])
def test_a_lock_in_its_launch_grace_is_a_driver_in_preflight_not_a_window_to_attach_to(machine, pid):
    r = _Host(_details(pid if pid is not None else 12345, machine or socket.gethostname()))
    assert not wl.lock_is_stale(r, r.details)
    text = " ".join(wl.describe_lock(r).split())
    assert "preflight" in text and "attach" not in text, text
    assert f"pid {r.details['driver']['pid']} on {r.details['driver']['machine']}" in text, text
