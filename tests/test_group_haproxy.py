"""A serving group's balancer with the REAL HAProxy (Debian's ``haproxy`` 2.6, ``eagle3ops_dev.haproxylocal``) in front
of two STAND-IN OpenAI servers on 127.0.0.1 (``tests/data/standin_openai_server.py``, NOT vLLM: it streams one token
every ``--token-ms`` and exports vLLM's ``vllm:num_requests_running``/``_waiting`` gauges on ``/metrics``), and a
third server whose port nothing listens on (down by HAProxy's own health check).

What is real here: HAProxy's runtime API (read through a unix socket from this process and through the host-side
client over TCP), its session counts, its health checks and its routing of a streaming request. The drain waits for
an open streaming session to end, fails and undrains when it does not end in time (the stream still finishes), and
the capacity check refuses and waits. Each test takes 1-4 s; the module ~9 s with the servers' start.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from eagle3ops import executor
from eagle3ops.group import drain as dr
from eagle3ops.group.haproxy import HaproxyBalancer, ShellRuntime, SocketRuntime
from eagle3ops_dev.haproxylocal import LocalHaproxy, free_port, haproxy_binary

REPO = Path(__file__).resolve().parents[1]
TOKEN_MS = 25


@pytest.fixture(scope="module")
def lb(tmp_path_factory):
    """HAProxy with servers s1, s2 (stand-ins) and s3 (nothing listens); yields it with the stand-ins' ports."""
    assert haproxy_binary(), "haproxy is not installed: run scripts/setup.sh (Debian package `haproxy`)"
    d = tmp_path_factory.mktemp("haproxy")
    ports = [free_port() for _ in range(3)]
    procs = [subprocess.Popen([sys.executable, str(REPO / "tests/data/standin_openai_server.py"), "--port", str(p),
                               "--model", "m", "--token-ms", str(TOKEN_MS)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in ports[:2]]
    try:
        for p in ports[:2]:
            _wait(lambda p=p: httpx.get(f"http://127.0.0.1:{p}/health", timeout=1).status_code == 200, 10)
        with LocalHaproxy(d, {"s1": ports[0], "s2": ports[1], "s3": ports[2]}, check_inter_ms=200) as h:
            h.ports = ports
            b = HaproxyBalancer(SocketRuntime(str(h.admin_socket)), "vllm", {"a": "s1", "b": "s2", "c": "s3"})
            _wait(lambda: b.states()["c"].state == "down" and b.states()["a"].state == "ready", 10)
            yield h
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def _wait(cond, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if cond():
                return
        except (httpx.HTTPError, OSError, RuntimeError):
            pass
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        time.sleep(0.05)


def _pair(h) -> HaproxyBalancer:
    """The group of hosts a (s1) and b (s2), read from this process through the unix socket."""
    return HaproxyBalancer(SocketRuntime(str(h.admin_socket)), "vllm", {"a": "s1", "b": "s2"})


class Stream(threading.Thread):
    """One streaming chat request of ``tokens`` tokens through HAProxy's frontend; ``done``: it ended with
    ``[DONE]``; ``ended``: when (monotonic)."""

    def __init__(self, port: int, tokens: int):
        super().__init__(daemon=True)
        self.port, self.tokens, self.done, self.ended, self.error = port, tokens, False, None, None

    def run(self) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": self.tokens,
                "stream": True}
        try:
            with httpx.stream("POST", f"http://127.0.0.1:{self.port}/v1/chat/completions", json=body,
                              timeout=30) as r:
                lines = [ln for ln in r.iter_lines() if ln]
            self.done = r.status_code == 200 and lines[-1] == "data: [DONE]"
        except httpx.HTTPError as exc:
            self.error = exc
        self.ended = time.monotonic()


def _stream_on_a(h, b: HaproxyBalancer, tokens: int) -> Stream:
    """A stream routed to host a: b in maintenance while it connects, ready again once a holds the session."""
    b.set_state("b", "maint")
    s = Stream(h.port, tokens)
    s.start()
    _wait(lambda: b.states()["a"].sessions == 1, 5)
    b.set_state("b", "ready")
    return s


def _served_by(h) -> int:
    """The pid of the stand-in that answers one plain request through HAProxy."""
    r = httpx.post(f"http://127.0.0.1:{h.port}/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1},
                   timeout=10)
    return r.json()["pid"]


def test_states_read_and_set_through_the_socket_and_the_host_side_client(lb):
    shell = HaproxyBalancer(ShellRuntime(f"127.0.0.1:{lb.stats_tcp}", executor.local()), "vllm",
                            {"a": "s1", "b": "s2", "c": "s3"})
    direct = HaproxyBalancer(SocketRuntime(str(lb.admin_socket)), "vllm", {"a": "s1", "b": "s2", "c": "s3"})
    assert {h: s.state for h, s in shell.states().items()} == {"a": "ready", "b": "ready", "c": "down"}
    shell.set_state("b", "maint")
    direct.set_state("a", "drain")
    try:
        assert {h: s.state for h, s in direct.states().items()} == {"a": "drain", "b": "maint", "c": "down"}
        assert {h: s.state for h, s in shell.states().items()} == {"a": "drain", "b": "maint", "c": "down"}
    finally:
        direct.set_state("a", "ready")
        shell.set_state("b", "ready")
    assert direct.states()["b"].state == "ready"
    with pytest.raises(RuntimeError, match=r"HAProxy backend 'vllm' has no server zz \(host d\)"):
        HaproxyBalancer(SocketRuntime(str(lb.admin_socket)), "vllm", {"d": "zz"}).states()


def test_drain_waits_for_the_open_stream_then_new_requests_go_elsewhere(lb):
    b = _pair(lb)
    stream = _stream_on_a(lb, b, tokens=50)  # ~1.25 s of tokens
    assert dr.metrics_requests(f"http://127.0.0.1:{lb.ports[0]}")() == 1.0  # the stand-in's vLLM gauge sees it
    got = dr.drain(b, "a", dr.metrics_requests(f"http://127.0.0.1:{lb.ports[0]}"), max_out=1, timeout_s=10,
                   quiet_s=0.5, poll_s=0.1)
    drained_at = time.monotonic()
    stream.join(10)
    try:
        assert stream.done and stream.error is None and stream.ended <= drained_at - 0.4
        assert got.seconds >= 0.5 and got.capacity.out == ()
        assert {h: (s.state, s.sessions) for h, s in b.states().items()} == {"a": ("drain", 0), "b": ("ready", 0)}
        while_drained = {_served_by(lb) for _ in range(4)}
        assert len(while_drained) == 1  # every new request goes to the one host left
    finally:
        dr.undrain(b, "a")
    assert len({_served_by(lb) for _ in range(4)} | while_drained) == 2  # a takes traffic again


def test_a_stream_longer_than_the_timeout_fails_the_drain_undrains_and_still_ends(lb):
    b = _pair(lb)
    stream = _stream_on_a(lb, b, tokens=120)  # ~3 s
    t0 = time.monotonic()
    with pytest.raises(dr.DrainTimeout) as e:
        dr.drain(b, "a", dr.metrics_requests(f"http://127.0.0.1:{lb.ports[0]}"), max_out=1, timeout_s=1.0,
                 quiet_s=0.5, poll_s=0.1)
    assert 1.0 <= time.monotonic() - t0 < 2.5
    msg = str(e.value)
    assert "a: not drained within 1 s (1 balancer sessions, 1 vLLM requests running or waiting)" in msg
    assert "set back to ready, nothing stopped" in msg
    assert b.states()["a"].state == "ready"
    stream.join(10)
    assert stream.done and stream.error is None  # nothing was cut


def test_capacity_refuses_over_max_out_counting_a_host_down_by_the_health_check_and_waits_for_room(lb):
    trio = HaproxyBalancer(SocketRuntime(str(lb.admin_socket)), "vllm", {"a": "s1", "b": "s2", "c": "s3"})
    with pytest.raises(dr.CapacityTimeout, match=r"out now: c \(down\); with a out: 2 of max_out 1"):
        dr.drain(trio, "a", lambda: 0.0, max_out=1, timeout_s=5, capacity_timeout_s=0.5, poll_s=0.1)
    assert trio.states()["a"].state == "ready"  # nothing changed
    assert dr.check_capacity(trio.states(), "a", 2).allowed

    b = _pair(lb)
    b.set_state("b", "maint")
    timer = threading.Timer(0.8, b.set_state, ("b", "ready"))
    t0 = time.monotonic()
    timer.start()
    try:
        cap = dr.wait_for_capacity(b, "a", 1, timeout_s=5, poll_s=0.1)
    finally:
        timer.join()
        b.set_state("b", "ready")
    assert 0.7 <= time.monotonic() - t0 < 3 and cap.allowed and cap.out == ()


def _group(lb, **balancer):
    from eagle3ops.config.groups import GroupConfig

    return GroupConfig(hosts=["a", "b"], max_out=1, balancer={"kind": "haproxy", "backend": "vllm",
                                                              "servers": {"a": "s1", "b": "s2"}, **balancer})


def test_open_balancer_from_this_machine_uses_the_socket(lb):
    from eagle3ops.config import load_inventory
    from eagle3ops.config.base import ConfigError
    from eagle3ops.group.haproxy import open_balancer

    inv = load_inventory(REPO / "deploy/hosts.yaml")
    inv = inv.model_copy(update={"groups": {"pair": _group(lb, socket=str(lb.admin_socket))}})
    with open_balancer(inv, "pair") as b:
        assert isinstance(b.runtime, SocketRuntime)
        assert {h: s.state for h, s in b.states().items()} == {"a": "ready", "b": "ready"}
    with pytest.raises(ConfigError, match=r"no group 'trio'. Known groups: pair"):
        with open_balancer(inv, "trio"):
            pass


def test_open_balancer_through_the_balancer_hosts_ssh_connection(lb, sandbox_host):
    """The balancer host is the sandbox (a real sshd on 127.0.0.1): the host-side client runs there with its
    python3 and reaches HAProxy's runtime API on TCP."""
    from eagle3ops.config import load_inventory
    from eagle3ops.group.haproxy import open_balancer

    inv = load_inventory(REPO / "deploy/hosts.yaml")
    inv = inv.model_copy(update={"groups": {"pair": _group(lb, address=f"127.0.0.1:{lb.stats_tcp}",
                                                           host="sandbox")}})
    with open_balancer(inv, "pair") as b:
        assert isinstance(b.runtime, ShellRuntime) and b.runtime.where == "sandbox"
        b.set_state("b", "maint")
        try:
            assert {h: s.state for h, s in b.states().items()} == {"a": "ready", "b": "maint"}
        finally:
            b.set_state("b", "ready")
        assert b.states()["b"].state == "ready"
