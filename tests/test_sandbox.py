"""The sandbox host for real: sshd on 127.0.0.1 + its own dockerd, reached through :class:`eagle3ops.remote.Remote`.

Uses its own sandbox name and port (``pytest-sbx`` on 2231) so it never disturbs the demo's ``sandbox``.
Needs root, ``sshd`` and ``dockerd`` (installed by ``.ci/run``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from eagle3ops_dev import sandbox
from eagle3ops.remote import HostUnreachable, Remote

pytestmark = pytest.mark.sandbox
#: This module brings up a sandbox of its own (pytest-sbx): its tests run in the host suite's "rest" part
#: (tests/conftest.py), the module whole in one process.
OWN_SANDBOX = "pytest-sbx"

NAME, PORT = "pytest-sbx", 2231


@pytest.fixture(scope="module")
def sbx():
    info = sandbox.up(NAME, PORT)
    yield info
    sandbox.down(NAME)


def test_up_twice_is_idempotent(sbx):
    again = sandbox.up(NAME, PORT)
    assert again.started == ()  # nothing restarted: both daemons were healthy
    assert again.docker_version == sbx.docker_version and again.docker_version
    assert again.known_hosts.read_text().startswith(f"[127.0.0.1]:{PORT} ssh-ed25519 ")
    st = sandbox.status(NAME, PORT)
    assert st["dockerd"] and st["sshd"] and st["ssh_listening"]


def test_up_restarts_a_dead_dockerd(sbx):
    pid = int((sbx.root / "docker.pid").read_text())
    os.kill(pid, 15)
    for _ in range(100):
        if sandbox.status(NAME, PORT)["dockerd"] is None:
            break
        import time
        time.sleep(0.2)
    again = sandbox.up(NAME, PORT)
    assert again.started == ("dockerd",)
    assert int((sbx.root / "docker.pid").read_text()) != pid


def test_remote_runs_docker_as_e3ops_over_ssh(sbx):
    host = sbx.host_config()
    with Remote(host) as r:
        who = r.run(["id", "-un"]).stdout.strip()
        out = r.run(["docker", "-H", sbx.docker_host, "info", "--format", "{{.Name}} {{.DockerRootDir}}"]).stdout
    assert who == "e3ops"
    assert str(sbx.root / "docker") in out  # the sandbox's own engine, not the build engine
    build_root = subprocess.run(["docker", "info", "--format", "{{.DockerRootDir}}"], capture_output=True,
                                text=True, check=True).stdout.strip()
    assert build_root != str(sbx.root / "docker")


def test_data_and_state_dirs_writable_by_e3ops(sbx):
    with Remote(sbx.host_config()) as r:
        r.run(["touch", f"{sbx.data_dir}/probe", f"{sbx.state_dir}/probe"])
    assert (sbx.data_dir / "probe").stat().st_uid == (sbx.state_dir / "probe").stat().st_uid != 0


def test_wrong_known_hosts_entry_is_refused(sbx, tmp_path: Path):
    # A syntactically valid but different ed25519 key for the same [127.0.0.1]:PORT.
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    kind, key = (tmp_path / "other.pub").read_text().split()[:2]
    bad = tmp_path / "known_hosts"
    bad.write_text(f"[127.0.0.1]:{PORT} {kind} {key}\n")
    with pytest.raises(HostUnreachable, match="host key"):
        Remote(sbx.host_config(known_hosts=bad)).run(["true"])
    # And an empty known_hosts (unknown host) is refused too, never auto-added.
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(HostUnreachable):
        Remote(sbx.host_config(known_hosts=empty)).run(["true"])
    assert empty.read_text() == ""
    # The OpenSSH client with the same files refuses as well.
    cp = subprocess.run(["ssh", "-F", "/dev/null", "-p", str(PORT), "-i", str(sbx.identity_file),
                         "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                         "-o", f"UserKnownHostsFile={bad}", "e3ops@127.0.0.1", "true"],
                        capture_output=True, text=True, timeout=30)
    assert cp.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in cp.stderr


def test_only_e3ops_may_log_in(sbx):
    cp = subprocess.run(["ssh", "-F", "/dev/null", "-p", str(PORT), "-i", str(sbx.identity_file),
                         "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                         "-o", f"UserKnownHostsFile={sbx.known_hosts}", "root@127.0.0.1", "true"],
                        capture_output=True, text=True, timeout=30)
    assert cp.returncode == 255 and "Permission denied" in cp.stderr


def test_a_second_checkout_does_not_lock_the_first_out(sbx, tmp_path: Path, monkeypatch):
    """``sandbox up`` from a second clone (its own client dir and key) adds its key to the
    sandbox; the first clone's key still logs in afterwards."""
    monkeypatch.setenv("EAGLE3OPS_SANDBOX_CLIENT_DIR", str(tmp_path / "second-clone"))
    second = sandbox.up(NAME, PORT)
    assert second.identity_file != sbx.identity_file
    with Remote(second.host_config()) as r:
        assert r.run(["id", "-un"]).stdout.strip() == "e3ops"
    monkeypatch.delenv("EAGLE3OPS_SANDBOX_CLIENT_DIR")
    with Remote(sbx.host_config()) as r:  # the first clone's key and known_hosts
        assert r.run(["id", "-un"]).stdout.strip() == "e3ops"
    keys = (sbx.root / "ssh" / "authorized_keys").read_text().splitlines()
    assert len(keys) == len(set(keys)) >= 2
