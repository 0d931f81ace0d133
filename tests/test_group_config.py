"""Serving groups without a balancer running: the inventory's ``groups:`` (bad input names the key and the fix), the
runtime API's command lines, HAProxy's answers read into states, the capacity check and the drain's rule (0
balancer sessions and 0 vLLM requests for the whole quiet span, bounded, undrained on timeout) on a scripted
balancer and clock. All pure; the real HAProxy is in tests/test_group_haproxy.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3ops.commands import haproxy as runtime_cmds
from eagle3ops.commands.types import Change, Read
from eagle3ops.config import ConfigError, load_inventory
from eagle3ops.group import drain as dr
from eagle3ops.group.balancer import ServerState
from eagle3ops.group.haproxy import parse_servers_state, parse_sessions, state_word

REPO = Path(__file__).resolve().parents[1]

HOST = """  {name}:
    hostname: {name}
    data_dir: /data
    state_dir: /var/lib/e3
    model_path: /models/m
    serving: {serving}
"""
SERVES = "{image: vllm/vllm-openai:v0.16.0, served_model_name: m}"
GROUP = """groups:
  g:
    hosts: [a, b]
    max_out: 1
    balancer: {kind: haproxy, socket: /run/haproxy/admin.sock, backend: vllm}
"""


def _inventory(tmp_path: Path, groups: str, *, lb_serving: str = "none") -> Path:
    text = "hosts:\n" + "".join(HOST.format(name=n, serving=SERVES) for n in ("a", "b", "c"))
    text += HOST.format(name="lb", serving=lb_serving) + groups
    p = tmp_path / "hosts.yaml"
    p.write_text(text)
    return p


def test_the_example_group_loads_with_its_server_names():
    inv = load_inventory(REPO / "deploy/hosts.group.example.yaml")
    g = inv.groups["kimi"]
    assert g.hosts == ["gpu-01", "gpu-02"] and g.max_out == 1
    assert [g.server(h) for h in g.hosts] == ["gpu01", "gpu02"]
    assert g.balancer.endpoint == "/run/haproxy/admin.sock" and g.balancer.host == "lb-01"


def test_a_group_defaults_server_names_to_host_names_and_takes_a_tcp_address(tmp_path):
    inv = load_inventory(_inventory(tmp_path, GROUP.replace("socket: /run/haproxy/admin.sock",
                                                            "address: '127.0.0.1:9999', host: lb")))
    g = inv.groups["g"]
    assert g.server("a") == "a" and g.balancer.endpoint == "127.0.0.1:9999" and g.balancer.host == "lb"
    assert load_inventory(REPO / "deploy/hosts.yaml").groups == {}  # no `groups:`: none


@pytest.mark.parametrize(("edit", "needles"), [
    (("[a, b]", "[a, zz]"), ["groups.g.hosts: 'zz' is not an inventory host", "add it under `hosts:`"]),
    (("[a, b]", "[a, lb]"), ["'lb' has no production serving", "remove it from the group"]),
    (("[a, b]", "[a]"), ["groups.g.hosts", "at least 2"]),
    (("[a, b]", "[a, a, b]"), ["a listed more than once"]),
    (("max_out: 1", "max_out: 2"), ["max_out 2 would let all 2 hosts be out", "at most 1"]),
    (("max_out: 1", "max_out: 0"), ["groups.g.max_out", "greater than or equal to 1"]),
    (("socket: /run/haproxy/admin.sock", "socket: admin.sock"), ["groups.g.balancer.socket", "absolute path"]),
    (("socket: /run/haproxy/admin.sock", "address: 'lb:99999'"), ["groups.g.balancer.address", "HOST:PORT"]),
    (("socket: /run/haproxy/admin.sock", "socket: /s, address: 'lb:9999'"), ["exactly one of `socket`"]),
    (("socket: /run/haproxy/admin.sock, ", ""), ["exactly one of `socket`"]),
    (("backend: vllm", "backend: 'vllm; shutdown'"), ["groups.g.balancer.backend", "not an HAProxy backend name"]),
    (("backend: vllm", "backend: vllm, servers: {c: s3}"), ["balancer.servers names c", "add it to `hosts`"]),
    (("backend: vllm", "backend: vllm, servers: {a: s1, b: s1}"), ["server name(s) s1 given to more than one"]),
    (("backend: vllm", "backend: vllm, host: nolb"), ["groups.g.balancer.host: 'nolb' is not an inventory host"]),
    (("backend: vllm", "backend: vllm, sockt: /x"), ["unknown key `groups.g.balancer.sockt`", "fix its spelling"]),
    (("kind: haproxy", "kind: nginx"), ["groups.g.balancer.kind", "'haproxy'"]),
])
def test_bad_groups_are_refused_naming_the_key_and_the_fix(tmp_path, edit, needles):
    p = _inventory(tmp_path, GROUP.replace(*edit))
    with pytest.raises(ConfigError) as e:
        load_inventory(p)
    msg = " ".join(str(e.value).split())
    assert str(p) in msg and all(n in msg for n in needles), msg


def test_a_host_in_two_groups_is_refused(tmp_path):
    second = GROUP.replace("groups:\n  g:", "  g2:").replace("[a, b]", "[b, c]")
    with pytest.raises(ConfigError, match=r"'b' is already in group 'g': a host serves in one group"):
        load_inventory(_inventory(tmp_path, GROUP + second))


def test_runtime_api_command_lines():
    assert runtime_cmds.show_servers_state("vllm") == "show servers state vllm"
    assert runtime_cmds.set_server_state("vllm", "gpu01", "drain") == "set server vllm/gpu01 state drain"
    with pytest.raises(ValueError, match="one of ready, drain, maint"):
        runtime_cmds.set_server_state("vllm", "gpu01", "down")
    with pytest.raises(ValueError, match="not an HAProxy name"):
        runtime_cmds.set_server_state("vllm", "a;shutdown", "ready")
    show = runtime_cmds.runtime_api("/run/haproxy/admin.sock", [runtime_cmds.show_stat()], 5)
    assert isinstance(show, Read) and show[:2] == ["python3", "-c"] and show[3:] == ["/run/haproxy/admin.sock", "5",
                                                                                     "show stat"]
    assert isinstance(runtime_cmds.runtime_api("127.0.0.1:9999", [runtime_cmds.set_server_state("b", "s", "maint")], 2.5), Change)


#: HAProxy 2.6.12's answers (Debian bookworm), copied from a run: s1 forced to maint, s2 forced to drain, s3 down by
#: its health check (nothing listens on its port); ``show stat`` cut after ``status``, s2 given 2 sessions and 1
#: queued.
SERVERS_STATE = """1
# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port
3 vllm 1 s1 127.0.0.1 0 1 1 1 0 15 3 0 14 0 0 0 - 48131 - 0 0 - - 0
3 vllm 2 s2 127.0.0.1 2 8 1 1 0 15 3 2 6 0 0 0 - 38535 - 0 0 - - 0
3 vllm 3 s3 127.0.0.1 0 0 1 1 2 8 2 0 6 0 0 0 - 44377 - 0 0 - - 0

"""
STAT = """# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status
fe,FRONTEND,,,1,1,9984,1,0,0,0,0,1,,,,,OPEN
vllm,s1,0,0,0,0,,0,0,0,,0,,0,0,0,0,MAINT
vllm,s2,1,1,2,2,,0,0,0,,0,,0,0,0,0,DRAIN
vllm,s3,0,0,0,0,,0,0,0,,0,,0,0,0,0,DOWN
vllm,BACKEND,0,0,2,2,999,0,0,0,0,0,,0,0,0,0,DOWN
"""


def test_haproxy_answers_read_as_states_and_sessions():
    raw = parse_servers_state(SERVERS_STATE, "vllm")
    assert {s: state_word(*v) for s, v in raw.items()} == {"s1": "maint", "s2": "drain", "s3": "down"}
    assert parse_sessions(STAT, "vllm") == {"s1": 0, "s2": 3, "s3": 0}  # s2: 2 open + 1 queued
    assert state_word(2, 0) == "ready" and state_word(1, 0) == "ready" and state_word(3, 0) == "drain"
    assert state_word(0, 8) == "down" and state_word(2, 0x10) == "drain" and state_word(2, 0x02) == "maint"
    with pytest.raises(RuntimeError, match=r"Can't find backend.*fix groups\.\*\.balancer\.backend"):
        parse_servers_state("Can't find backend.\n\n", "nope")


def _states(**kv: str) -> dict[str, ServerState]:
    return {h: ServerState(h, s, 0) for h, s in kv.items()}


def test_capacity_counts_every_host_that_is_not_ready():
    cap = dr.check_capacity(_states(a="ready", b="down", c="ready"), "a", 1)
    assert cap.out == (("b", "down"),) and cap.out_after == 2 and not cap.allowed
    assert "b (down)" in cap.describe() and "2 of max_out 1" in cap.describe()
    assert dr.check_capacity(_states(a="ready", b="down", c="ready"), "a", 2).allowed
    assert dr.check_capacity(_states(a="drain", b="ready"), "a", 1).allowed  # already out: counted once
    assert not dr.check_capacity(_states(a="ready", b="maint", c="drain"), "a", 2).allowed
    with pytest.raises(ValueError, match="zz: not a host of the group"):
        dr.check_capacity(_states(a="ready"), "zz", 1)


class Scripted:
    """A balancer whose sessions per host follow a script over the fake clock (``sessions(t)``); records every
    ``set_state``."""

    def __init__(self, clock, sessions, states=None):
        self.clock, self.sessions, self.sets = clock, sessions, []
        self.state = dict(states or {"a": "ready", "b": "ready"})

    def states(self):
        return {h: ServerState(h, s, self.sessions(h, self.clock.t)) for h, s in self.state.items()}

    def set_state(self, host, state):
        self.sets.append((host, state))
        self.state[host] = state


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def _drain(b, clock, requests, **kw):
    return dr.drain(b, "a", requests, max_out=1, clock=clock, sleep=clock.sleep, **{"timeout_s": 30.0, **kw})


def test_drained_means_both_zero_for_the_whole_quiet_span():
    """Sessions end at 2 s, vLLM's requests at 4 s but one more comes at 6-6.5 s: drained only 5 s after 6.5 s."""
    clock = Clock()
    b = Scripted(clock, lambda h, t: 1 if h == "a" and t < 2 else 0)
    got = _drain(b, clock, lambda: 1.0 if clock.t < 4 or 6 <= clock.t < 6.5 else 0.0)
    assert b.sets == [("a", "drain")] and b.state["a"] == "drain"
    assert got.seconds == pytest.approx(6.5 + dr.QUIET_S, abs=0.01)


def test_a_drain_past_its_timeout_undrains_and_fails_naming_what_it_read():
    clock = Clock()
    b = Scripted(clock, lambda h, t: 1 if h == "a" else 0)
    with pytest.raises(dr.DrainTimeout) as e:
        _drain(b, clock, lambda: 0.0, timeout_s=10.0)
    assert b.sets == [("a", "drain"), ("a", "ready")] and b.state["a"] == "ready"
    assert "a: not drained within 10 s (1 balancer sessions, 0 vLLM requests" in str(e.value)
    assert "set back to ready, nothing stopped" in str(e.value) and clock.t == pytest.approx(10.0)


def test_unreadable_metrics_are_not_quiet_and_a_failing_balancer_undrains():
    clock = Clock()
    b = Scripted(clock, lambda h, t: 0)

    def refused():
        raise OSError("connection refused")

    with pytest.raises(dr.DrainTimeout, match=r"vLLM requests unread \(connection refused\)"):
        _drain(b, clock, refused, timeout_s=3.0)
    b.sets.clear()
    clock.t = 0.0

    def breaks(h, t):
        if t >= 1.0:
            raise RuntimeError("HAProxy runtime API /x: gone")
        return 1

    b.sessions = breaks
    with pytest.raises(RuntimeError, match="gone"):
        _drain(b, clock, lambda: 0.0)
    assert b.sets == [("a", "drain"), ("a", "ready")]


def test_no_room_under_max_out_changes_nothing():
    clock = Clock()
    b = Scripted(clock, lambda h, t: 0, states={"a": "ready", "b": "down"})
    said = []
    with pytest.raises(dr.CapacityTimeout) as e:
        dr.drain(b, "a", lambda: 0.0, max_out=1, timeout_s=30, capacity_timeout_s=20, clock=clock, sleep=clock.sleep,
                 echo=said.append)
    assert b.sets == [] and clock.t == pytest.approx(20.0)
    assert "a: not taken out: out now: b (down); with a out: 2 of max_out 1, still after 20 s" in str(e.value)
    assert "nothing was changed" in str(e.value) and said and "waiting up to 20 s for room" in said[0]
