"""Commands are typed: a dry run runs each ``Read`` and only records each ``Change``; no call site says
which is which. Real parts: the local executor runs real programs; the SSH executor's dry run needs no host for a
change (it is never sent). The reader of a throwaway container's answer meets real processes through a stand-in
``docker`` client (:data:`DOCKER_STANDIN`)."""

from __future__ import annotations

import json
import os
import sys
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


# --- the one reader of a Python answer from a throwaway container (executor.read_in_image) ----------------------

#: TEST STAND-IN for the ``docker`` client: records its argv, then runs the ``-c`` script of ``docker run ...
#: --entrypoint python3 IMAGE -c SOURCE`` with this interpreter here (no container), its stdin passed through, so
#: the reader meets a real process's stdout, stderr and exit status.
DOCKER_STANDIN = """#!{python}
import json, os, sys
with open({log!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
a = sys.argv[1:]
os.execv(sys.executable, [sys.executable, "-c", a[a.index("--entrypoint") + 4]])
"""


@pytest.fixture
def docker_standin(tmp_path, monkeypatch):
    """``docker`` on PATH is :data:`DOCKER_STANDIN`; yields the file where it records each argv (one JSON line)."""
    log = tmp_path / "docker-argv.jsonl"
    exe = tmp_path / "bin" / "docker"
    exe.parent.mkdir()
    exe.write_text(DOCKER_STANDIN.format(python=sys.executable, log=str(log)))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{exe.parent}:{os.environ['PATH']}")
    yield lambda: [json.loads(ln) for ln in log.read_text().splitlines()]


def test_read_in_image_takes_the_last_json_line_and_quotes_the_tail_when_there_is_none(docker_standin):
    """The answer is the last stdout line starting with ``{`` (warnings before it, stdin read by the script); the
    container runs with no network and the mounts read-only; a script that prints no JSON, or a last ``{`` line
    that does not parse, gives no answer and a message naming the image, the exit status and stderr's last lines
    (stdout's when stderr is empty); a JSON line before a failing exit is kept with the exit status."""
    from eagle3ops.speculate.shmread import check_shm

    r = executor.local()
    got = executor.read_in_image(
        r, "img:1", "import json, sys\nprint('a warning {')\nprint(json.dumps({'got': sys.stdin.read()}))\n",
        timeout=30, mounts=(("/data/m", "/m"),), stdin="on stdin")
    assert (got.answer, got.ok, got.exited) == ({"got": "on stdin"}, True, 0)
    argv = docker_standin()[0]
    assert argv[:6] == ["run", "--rm", "-i", "--network", "none", "-v"] and argv[6] == "/data/m:/m:ro"
    assert argv[7:11] == ["--entrypoint", "python3", "img:1", "-c"]
    failed = executor.read_in_image(
        r, "img:2", "import sys\nprint('{\"ok\": 1}')\nprint('{half')\n"
                    "sys.stderr.write('one\\ntwo\\nthree\\nfour\\n')\nsys.exit(3)\n", timeout=30)
    assert failed.answer is None and not failed.ok
    assert failed.silence() == "img:2 did not answer (exit 3): two | three | four"
    quiet = executor.read_in_image(r, "img:3", "print('no json here')\nraise SystemExit(1)", timeout=30)
    assert (quiet.answer, quiet.tail) == (None, "no json here")
    kept = executor.read_in_image(r, "img:4", "print('{\"schema\": 1}')\nraise SystemExit(2)", timeout=30)
    assert kept.answer == {"schema": 1} and not kept.ok
    # a caller's note: the /dev/shm reading in an image without vLLM (here: this interpreter) is not compared
    note = check_shm(r, "img:5", {"HostConfig": {}})
    assert note is not None and note["not_compared"].startswith("img:5 did not answer (exit 1): ")
    assert "No module named 'vllm'" in note["not_compared"]
