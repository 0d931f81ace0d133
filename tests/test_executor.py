"""Commands are typed: a dry run runs each ``Read`` and only records each ``Change``; no call site says
which is which. Real parts: the local executor runs real programs; the SSH executor's dry run needs no host for a
change (it is never sent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3ops import executor
from eagle3ops.commands import host as hc
from eagle3ops.commands.types import Change, Read, is_read
from eagle3ops.config import load_inventory

REPO = Path(__file__).resolve().parents[1]


def test_commands_are_frozen_typed_argv():
    r, c = hc.cat("/etc/hostname"), hc.mkdir_p("/x y")
    assert isinstance(r, Read) and isinstance(c, Change) and is_read(r) and not is_read(c)
    assert r == ["cat", "/etc/hostname"] and r[:1] == ["cat"] and "cat" in r and list(r) == r
    assert Read(["a"]) != Change(["a"]) and not is_read(["cat", "/x"])  # a plain list counts as a change
    with pytest.raises(TypeError, match="not a string"):
        Read("cat /x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be str"):
        Change(["mkdir", 3])  # type: ignore[list-item]
    with pytest.raises(AttributeError):
        r.argv = ("rm",)  # type: ignore[misc]


def test_a_local_dry_run_runs_reads_and_records_changes(tmp_path):
    target = tmp_path / "made"
    ex = executor.local(dry_run=True)
    assert ex.run(Read(["sh", "-c", "echo hi"])).stdout == "hi\n"  # a read runs, even in a dry run
    assert ex.run(hc.mkdir_p(str(target))).ok and not target.exists()  # a change is recorded, not run
    assert ex.changes == [f"mkdir -p {target}"] and len(ex.history) == 2
    real = executor.local()
    real.run(hc.mkdir_p(str(target)))
    assert target.is_dir() and real.changes == ex.changes
    with pytest.raises(RuntimeError, match="not started"):
        ex.popen(hc.rm_rf(str(target)))  # a dry run never starts a stream that changes something
    assert target.is_dir()


def test_a_local_failure_names_the_command():
    with pytest.raises(executor.LocalCommandError, match="`sh -c 'exit 3'` exited 3"):
        executor.local().run(Read(["sh", "-c", "exit 3"]))


def test_the_ssh_executors_dry_run_records_a_change_without_a_connection():
    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    seen: list[str] = []
    with executor.for_host(h, dry_run=True, echo=seen.append) as r:
        res = r.run(hc.rm_rf("/tmp/never"))
        assert res.ok and r._conn is None  # never connected
    assert seen == r.history == r.changes == ["rm -rf -- /tmp/never"]
    with pytest.raises(TypeError, match="polls a Read"):
        r.wait_for(hc.mkdir_p("/x"), timeout=1)
