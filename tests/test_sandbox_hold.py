"""One run on a sandbox at a time (:mod:`eagle3ops_dev.sandbox.hold`): stop 36's CI failed with ``LockHeld``
because a second ``.ci/run`` on this machine was still in its kill test on the same sandbox. Real ``flock`` between
real processes; a throwaway sandbox name, so no sandbox is touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from eagle3ops_dev.sandbox import SandboxError
from eagle3ops_dev.sandbox.hold import hold, hold_path, holder

HOLDER = """
import sys, time
from eagle3ops_dev.sandbox.hold import hold
f = hold(sys.argv[1], wait_s=5)
print("held", flush=True)
time.sleep(120)
"""


def test_a_second_run_waits_then_fails_naming_the_holder_and_a_killed_holder_frees_it():
    name = f"holdtest-{uuid.uuid4().hex[:6]}"
    first = subprocess.Popen([sys.executable, "-c", HOLDER, name], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held"
        assert holder(name)["pid"] == first.pid
        told: list[str] = []
        t0 = time.monotonic()
        with pytest.raises(SandboxError) as e:
            hold(name, wait_s=1.0, poll_s=0.1, log=told.append)
        assert time.monotonic() - t0 < 5
        assert f"pid {first.pid}" in str(e.value) and str(hold_path(name)) in str(e.value), e.value
        assert told and f"pid {first.pid}" in told[0], told
        os.kill(first.pid, signal.SIGKILL)  # a run killed mid-way: the kernel drops its flock
        first.wait(10)
        f = hold(name, wait_s=5.0, poll_s=0.1)
        try:
            assert holder(name)["pid"] == os.getpid()
        finally:
            f.close()
    finally:
        if first.poll() is None:
            first.kill()
        hold_path(name).unlink(missing_ok=True)
