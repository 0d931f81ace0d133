"""A host that accepts TCP and never speaks SSH: it fails once, within the connect bound, with
one line naming the host and the cause, and no traceback.

No sandbox needed: a listener on 127.0.0.1 accepts connections and never sends a byte. The connect bound is
lowered to :data:`CONNECT_S` for speed; each phase (TCP connect, SSH banner, authentication) is bounded by it.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from eagle3ops import cli, remote, transfer
from eagle3ops.config import load_inventory
from eagle3ops.remote import ConnectFailed, HostUnreachable, Remote
from eagle3ops.transfer.sources import LayerSource

REPO = Path(__file__).resolve().parents[1]
CONNECT_S = 2


@contextlib.contextmanager
def silent_listener(backlog: int = 16):
    """(port, accepted sockets) of a listener on 127.0.0.1 that accepts connections and never sends a byte."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(backlog)
    srv.settimeout(0.1)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except socket.timeout:
                continue
            except OSError:
                return

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1], conns
    finally:
        stop.set()
        t.join()
        for c in conns:
            c.close()
        srv.close()


@pytest.fixture
def silent_port():
    """(port, accepted sockets) of a listener that accepts and never speaks."""
    with silent_listener() as listener:
        yield listener


@pytest.fixture
def inventory(tmp_path, silent_port, monkeypatch) -> Path:
    monkeypatch.setattr(remote, "CONNECT_TIMEOUT_S", CONNECT_S)
    (tmp_path / "known_hosts").write_text("")
    inv = tmp_path / "hosts.yaml"
    inv.write_text(f"""hosts:
  deadhost:
    hostname: 127.0.0.1
    port: {silent_port[0]}
    user: nobody
    known_hosts: known_hosts
    data_dir: /srv/e3/data
    state_dir: /srv/e3/state
    model_path: /srv/e3/models/m
    serving:
      image: vllm/vllm-openai:v0.16.0
      served_model_name: m
""")
    return inv


class _Unread(LayerSource):
    """A layer source that must never be read (the host is never reached)."""

    kind = "test"

    def config_bytes(self) -> bytes:
        raise AssertionError("read a layer source for an unreachable host")

    def layer_size(self, i: int) -> int:
        raise AssertionError("read a layer source for an unreachable host")

    def _raw_layer(self, i: int):
        raise AssertionError("read a layer source for an unreachable host")


def _one_line_naming_host_and_cause(msg: str, port: int) -> None:
    assert "\n" not in msg.strip() and "Traceback" not in msg, msg
    assert "deadhost: SSH handshake with nobody@127.0.0.1:" + str(port) in msg and "banner" in msg, msg


def test_remote_connect_fails_within_the_bound_as_connect_failed(inventory, silent_port):
    host = load_inventory(inventory).host("deadhost")
    t0 = time.monotonic()
    with pytest.raises(ConnectFailed) as ei:
        Remote(host).run(["true"])
    took = time.monotonic() - t0
    assert isinstance(ei.value, HostUnreachable)
    assert CONNECT_S - 0.5 <= took < CONNECT_S + 5, took
    _one_line_naming_host_and_cause(str(ei.value), silent_port[0])


def test_push_fails_once_within_the_bound(inventory, silent_port):
    port, conns = silent_port
    host = load_inventory(inventory).host("deadhost")
    img = transfer.LocalImage(ref="e3ops-test/x:1", id="sha256:" + "0" * 64, diff_ids=("sha256:" + "1" * 64,),
                              repo_tags=("e3ops-test/x:1",))
    t0 = time.monotonic()
    r = transfer.push(img, host, source=_Unread(img), options=transfer.PushOptions(attempts=3))
    took = time.monotonic() - t0
    assert r.status == "failed" and r.attempts == 1, r
    assert took < CONNECT_S + 5, took  # before: three attempts with back-off (64 s with the default bound)
    assert len(conns) == 1  # one connection: no retry
    _one_line_naming_host_and_cause(r.reason, port)


@pytest.mark.parametrize("argv", [["status", "deadhost"], ["lock", "status", "deadhost"],
                                  ["extract", "deadhost", "--pipeline", str(REPO / "deploy/pipeline.yaml")]],
                         ids=["status", "lock-status", "extract"])
def test_cli_names_host_and_cause_in_one_line(argv, inventory, silent_port, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["eagle3ops", *argv, "--inventory", str(inventory)])
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as ei:
        cli.main()
    took = time.monotonic() - t0
    out = capsys.readouterr()
    assert ei.value.code == 1, (out.out, out.err)
    assert took < CONNECT_S + 5, took
    assert out.err.startswith("error: deadhost: ") and out.err.count("\n") == 1, out.err
    _one_line_naming_host_and_cause(out.err, silent_port[0])
