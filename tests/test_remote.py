"""The executor (:class:`eagle3ops.remote.Remote`) against the sandbox's real sshd: error paths, stdin, streaming,
reconnects, keepalive and connect timeouts.

Only this test's own SSH connections are ever killed (found by their client port with ``ss``): other sessions on
the shared sandbox, and its daemons, are left alone.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import paramiko
import pytest

from eagle3ops.remote import KEEPALIVE_S, TCP_KEEPCNT, HostUnreachable, Remote, RemoteCommandError, render

pytestmark = pytest.mark.sandbox


@pytest.fixture()
def scratch(sandbox_host):
    """A directory in the sandbox's data dir for this test (removed afterwards)."""
    d = f"{sandbox_host.data_dir}/test-remote-{uuid.uuid4().hex[:8]}"
    with Remote(sandbox_host) as r:
        r.run(["mkdir", "-p", d])
        yield d
        r.run(["rm", "-rf", d])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_server_side(r: Remote) -> list[int]:
    """SIGKILL the sshd processes serving this Remote's connection (and only them); returns their pids."""
    lport = r.connection.client.get_transport().sock.getsockname()[1]
    out = subprocess.run(["ss", "-Htnp", "state", "established", f"( sport = :{r.host.port} and dport = :{lport} )"],
                         capture_output=True, text=True, check=True).stdout
    pids = sorted({int(p) for p in re.findall(r"pid=(\d+)", out)})
    assert pids, f"no sshd found for client port {lport}: {out!r}"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return pids


# --- host keys and connection failures -------------------------------------------------------------------------
def test_unknown_host_key_is_refused_and_never_added(sandbox_host, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = sandbox_host.model_copy(update={"known_hosts": empty})
    with pytest.raises(HostUnreachable) as ei:
        Remote(host).run(["true"])
    msg = str(ei.value)
    assert msg.startswith("sandbox: host key of e3ops@127.0.0.1:") and "not in known_hosts" in msg, msg
    assert f"[127.0.0.1]:{sandbox_host.port}" in msg and "fingerprint" in msg and str(empty) in msg
    assert empty.read_text() == ""
    assert not Path("~/.ssh/known_hosts").expanduser().exists() or \
        f"[127.0.0.1]:{sandbox_host.port}" not in Path("~/.ssh/known_hosts").expanduser().read_text()


def test_missing_known_hosts_file_names_the_key(sandbox_host, tmp_path):
    host = sandbox_host.model_copy(update={"known_hosts": tmp_path / "nope"})
    with pytest.raises(HostUnreachable, match=r"known_hosts file .*nope \(inventory key `known_hosts`\) does not"):
        Remote(host).run(["true"])


def test_connection_refused_names_host_and_reason(sandbox_host):
    port = _free_port()  # nothing listens there
    host = sandbox_host.model_copy(update={"port": port})
    t0 = time.monotonic()
    with pytest.raises(HostUnreachable) as ei:
        Remote(host).run(["true"])
    msg = str(ei.value)
    assert msg.startswith(f"sandbox: cannot connect to e3ops@127.0.0.1:{port}: connection refused"), msg
    assert time.monotonic() - t0 < 10


def test_silent_port_times_out_at_the_banner(sandbox_host):
    """A peer that accepts TCP but never sends the SSH banner: HostUnreachable after connect_timeout, not a hang."""
    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(4)  # the kernel completes the handshake; nobody ever accepts or answers
        port = blackhole.getsockname()[1]
        host = sandbox_host.model_copy(update={"port": port})
        t0 = time.monotonic()
        with pytest.raises(HostUnreachable) as ei:
            Remote(host, connect_timeout=2).run(["true"])
        took = time.monotonic() - t0
    msg = str(ei.value)
    assert f"e3ops@127.0.0.1:{port}" in msg and "banner" in msg, msg
    assert 1.5 <= took < 10, took


def test_keepalive_on_transport_and_socket(sandbox_host):
    with Remote(sandbox_host) as r:
        r.run(["true"])
        t = r.connection.client.get_transport()
        assert t.packetizer._Packetizer__keepalive_interval == KEEPALIVE_S
        assert t.sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert t.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE_S
        assert t.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == TCP_KEEPCNT
        assert isinstance(r.connection.client._policy, paramiko.RejectPolicy)


# --- command results -------------------------------------------------------------------------------------------
def test_nonzero_exit_names_host_command_and_stderr_tail(sandbox_host):
    argv = ["sh", "-c", "echo to-stdout; for i in 1 2 3 4 5 6 7 8 9 10; do echo err-$i >&2; done; exit 3",
            "arg with 'quotes' and $(touch /tmp/pwned)"]
    with Remote(sandbox_host) as r:
        with pytest.raises(RemoteCommandError) as ei:
            r.run(argv)
        res = r.run(argv, check=False)
    e = ei.value
    msg = str(e)
    assert msg.startswith(f"sandbox: `{render(argv)}` exited 3\n"), msg
    assert msg.splitlines()[-1] == "err-10" and "err-3" in msg and "err-2\n" not in msg  # the last 8 lines
    assert e.exited == 3 and e.host == "sandbox" and e.stdout == "to-stdout\n"
    assert res.exited == 3 and not res.ok and res.stderr.count("err-") == 10
    assert not Path("/tmp/pwned").exists()


def test_command_timeout_then_the_connection_still_works(sandbox_host):
    with Remote(sandbox_host) as r:
        t0 = time.monotonic()
        with pytest.raises(RemoteCommandError, match=r"`sh -c 'echo started; sleep 30'` timed out after 1.5s"):
            r.run(["sh", "-c", "echo started; sleep 30"], timeout=1.5)
        assert time.monotonic() - t0 < 8
        assert r.run(["echo", "after"]).stdout == "after\n"


# --- stdin and streaming ----------------------------------------------------------------------------------------
def test_stdin_bytes_round_trip_1mb(sandbox_host, scratch):
    data = os.urandom(1 << 20)  # not valid UTF-8: must arrive byte for byte
    f = f"{scratch}/blob"
    with Remote(sandbox_host) as r:
        t0 = time.monotonic()
        r.run(["tee", f], stdin=data, stream=lambda _: None)
        took = time.monotonic() - t0
        remote_sum = r.run(["sha256sum", f]).stdout.split()[0]
        size = r.run(["stat", "-c", "%s", f]).stdout.strip()
    assert remote_sum == hashlib.sha256(data).hexdigest() and size == str(len(data))
    assert took < 15, f"1 MiB over stdin took {took:.1f}s"


def test_stdin_text_and_file_objects(sandbox_host, scratch, tmp_path):
    text = "héllo ✓ 'quoted' $(not run)\nline 2\n"
    with Remote(sandbox_host) as r:
        assert r.run(["cat"], stdin=text).stdout == text
        local = tmp_path / "in.bin"
        local.write_bytes(b"\x00\xff\xfe" * 1000)
        with local.open("rb") as fh:
            r.run(["tee", f"{scratch}/f"], stdin=fh)
        assert r.run(["sha256sum", f"{scratch}/f"]).stdout.split()[0] == hashlib.sha256(local.read_bytes()).hexdigest()
        # No stdin given: the command sees EOF at once instead of waiting for input.
        t0 = time.monotonic()
        assert r.run(["cat"], timeout=10).stdout == ""
        assert time.monotonic() - t0 < 5


def test_stream_callback_gets_output_live(sandbox_host):
    chunks: list[tuple[float, str]] = []
    with Remote(sandbox_host) as r:
        r.run(["true"])
        t0 = time.monotonic()
        res = r.run(["sh", "-c", "echo first; sleep 2; echo second"],
                    stream=lambda s: chunks.append((time.monotonic() - t0, s)))
        total = time.monotonic() - t0
    assert "".join(s for _, s in chunks) == res.stdout == "first\nsecond\n"
    first_at = next(t for t, s in chunks if "first" in s)
    assert first_at < total - 1.5, (chunks, total)  # arrived while the command was still sleeping


# --- reconnects -------------------------------------------------------------------------------------------------
def test_reconnects_after_the_connection_is_killed(sandbox_host):
    with Remote(sandbox_host) as r:
        assert r.run(["id", "-un"]).stdout == "e3ops\n"
        old = r.connection.client.get_transport()
        _kill_server_side(r)
        # Straight away: the transport may still look alive; the session open fails and the run reconnects.
        assert r.run(["id", "-un"]).stdout == "e3ops\n"
        assert r.connection.client.get_transport() is not old
        # And once more after the dead connection has surely been noticed.
        _kill_server_side(r)
        time.sleep(1)
        assert r.run(["echo", "ok"]).stdout == "ok\n"


def test_connection_lost_mid_command_is_host_unreachable(sandbox_host):
    with Remote(sandbox_host) as r:
        r.run(["true"])
        killer = threading.Timer(1.0, _kill_server_side, args=(r,))
        killer.start()
        t0 = time.monotonic()
        with pytest.raises(HostUnreachable, match=r"connection lost while running `sleep 20`"):
            r.run(["sleep", "20"])
        killer.join()
        assert time.monotonic() - t0 < 10
        assert r.run(["echo", "back"]).stdout == "back\n"
