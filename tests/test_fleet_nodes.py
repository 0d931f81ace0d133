"""Multi-node training planned, pure: the node order from a fleet run's merged manifest, the refusals, the
train stage's node arguments and the cross-node trial's command on a venv host, and which node failed first."""

from __future__ import annotations

import pytest

from eagle3ops.commands import fleet as fc
from eagle3ops.commands import stages as st
from eagle3ops.config import HostConfig
from eagle3ops.fleet import nodes as fn

MERGED = {"fleet": {"shards": [{"rank": 0, "host": "b", "start": 0, "end": 10},
                               {"rank": 1, "host": "a", "start": 10, "end": 25},
                               {"rank": 2, "host": "c", "start": 25, "end": 30}]}}


def test_nodes_follow_the_shards_and_node0_holds_the_rendezvous():
    plan = fn.plan_nodes("r1", MERGED, ["a", "b", "c"], rendezvous_host="10.0.0.2", port=29511)
    assert plan.nodes == ("b", "a", "c") and plan.shards == ((0, 10), (10, 25), (25, 30))
    assert plan.node_args("c") == (3, 2, "10.0.0.2:29511")
    text = "\n".join(plan.lines())
    assert "node 0: b  samples [0, 10)" in text and "rank 0" in text and "before any serving stops" in text
    assert st.node_args(*plan.node_args("a")) == ["--nodes", "3", "--node-rank", "1", "--rendezvous",
                                                 "10.0.0.2:29511"]


@pytest.mark.parametrize("hosts,words", [
    (["a", "b"], "would not be trained: name every host"),
    (["a", "b", "c", "d"], "d hold(s) no shard"),
    (["a", "a", "c"], "named twice"),
])
def test_hosts_that_do_not_match_the_shards_are_refused_by_name(hosts, words):
    with pytest.raises(fn.NodePlanError) as exc:
        fn.plan_nodes("r1", MERGED, hosts, rendezvous_host="x", port=1)
    assert words in str(exc.value)


def test_a_one_host_extract_or_a_host_with_two_shards_is_refused():
    with pytest.raises(fn.NodePlanError, match="no fleet.shards"):
        fn.plan_nodes("r1", {"samples": 3}, ["a", "b"], rendezvous_host="x", port=1)
    two = {"fleet": {"shards": [{"host": "a", "start": 0, "end": 5}, {"host": "a", "start": 5, "end": 9},
                                {"host": "b", "start": 9, "end": 12}]}}
    with pytest.raises(fn.NodePlanError, match="more than one shard"):
        fn.plan_nodes("r1", two, ["a", "b"], rendezvous_host="x", port=1)


def test_the_killed_node_is_named_and_its_peers_followed():
    errors = {
        "n0": "exited 1: RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.1.2.2]:4000",
        "n1": "",
        "n2": "exited 1: RuntimeError: train: torchrun ...\n  exitcode  : -9 (pid: 77)\n  traceback : Signal 9 (SIGKILL)",
    }
    assert fn.blame(["n0", "n1", "n2"], errors) == (["n2"], ["n0"])
    own = {"n0": "exited 2: extract/hidden/x.pt is missing", "n1": "Connection reset by peer", "n2": ""}
    assert fn.blame(["n0", "n1", "n2"], own) == (["n0"], ["n1"])
    only_peers = {"n0": "Connection closed by peer", "n1": "recvBytes failed", "n2": ""}
    assert fn.blame(["n0", "n1", "n2"], only_peers) == (["n0", "n1"], [])
    assert fn.blame(["n0"], {"n0": ""}) == ([], [])


def test_the_trial_on_a_venv_host_is_bounded_and_carries_the_stage_env():
    h = HostConfig(name="v", hostname="10.0.0.3", data_dir="/d", state_dir="/s", model_path="/m",
                   stage_runtime="venv", venv_python="/usr/bin/python3", stage_env={"GLOO_SOCKET_IFNAME": "eth1"},
                   serving="none")
    image = "venv:sha256:" + "ab" * 32
    argv = fc.trial_argv_venv(h, image, master_addr="10.0.0.2", port=29500, nnodes=3, node_rank=1, timeout_s=20)
    assert argv[:4] == ["timeout", "-s", "KILL", "50"] and "GLOO_SOCKET_IFNAME=eth1" in argv
    assert f"/s/env/{'ab' * 32}/bin/python" in argv
    assert argv[argv.index("torch.distributed.run"):] == [
        "torch.distributed.run", "--nnodes=3", "--nproc-per-node=1", "--node-rank=1", "--master-addr=10.0.0.2",
        "--master-port=29500", "-m", "eagle3ops.fleet.trial", "--timeout-s=20"]
    with pytest.raises(ValueError, match="node rank"):
        fc.trial_argv_venv(h, image, master_addr="x", port=1, nnodes=2, node_rank=2, timeout_s=5)


def test_the_reach_probe_connects_on_loopback_and_names_who_cannot(capsys):
    import socket
    import threading
    import time

    from eagle3ops.fleet import trial as ft

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = threading.Thread(target=ft.listen, args=(port, 30.0, 1))  # ends once the one connection came
    t.start()
    t0 = time.monotonic()
    assert ft.reach("127.0.0.1", port, 5.0) == 0  # tried again while the listener starts
    t.join(timeout=10)
    assert not t.is_alive() and time.monotonic() - t0 < 10
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # closed again: nothing listens there
    assert ft.reach("127.0.0.1", dead, 0.6) == 1
    out = capsys.readouterr().out.splitlines()
    ok_line = next(x for x in out if x.startswith(ft.REACH_TAG) and '"ok": true' in x)
    bad_line = next(x for x in out if x.startswith(ft.REACH_TAG) and '"ok": false' in x)
    assert '"accepted": 1' in "\n".join(out)
    verdict = ft.parse_reach(["n0", "n1", "n2"], {"n0": (0, ok_line), "n1": (1, bad_line), "n2": (137, "")})
    assert not verdict.ok and verdict.unreachable == ("n1", "n2")
    assert "refused" in verdict.detail[1].lower() and "exit 137" in verdict.detail[2]


def test_the_socket_interface_is_named_in_the_plan_and_required_where_hosts_have_several():
    """Plan level (no second host with GPUs here): each node's stage_env and its interfaces (``/sys/class/net``) are
    given; NCCL and gloo pick an interface on their own where none is named, and on a host with several they may
    pick one the peers cannot reach (the run then hangs in its first collective)."""
    plan = fn.plan_nodes("r1", MERGED, ["a", "b", "c"], rendezvous_host="10.0.0.2", port=29511)
    ifaces = {"a": ["lo", "eth0", "ib0", "docker0"], "b": ["lo", "eth0"], "c": ["lo", "eth0", "veth12ab"]}
    with pytest.raises(fn.NodePlanError) as exc:
        fn.socket_interfaces(plan, {"a": {}, "b": {}, "c": {}}, ifaces)
    msg = str(exc.value)
    assert "a has several network interfaces (eth0, ib0)" in msg and "hosts.a.stage_env.NCCL_SOCKET_IFNAME" in msg
    assert "GLOO_SOCKET_IFNAME" in msg, msg
    envs = {n: {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"} for n in "abc"}
    lines = fn.socket_interfaces(plan, envs, ifaces)
    assert any("node 1: a  NCCL_SOCKET_IFNAME=eth0 GLOO_SOCKET_IFNAME=eth0" in ln for ln in lines), lines
    # one interface each (the virtual ones of the engine not counted): nothing to choose, said so
    one = {"a": ["lo", "eth0", "docker0"], "b": ["lo", "eth0"], "c": ["eth0"]}
    assert any("not set" in ln and "one interface" in ln for ln in fn.socket_interfaces(plan, {}, one))
    # named, but not on that host
    with pytest.raises(fn.NodePlanError, match=r"hosts.c.stage_env.NCCL_SOCKET_IFNAME is ib0, not an interface of c"):
        fn.socket_interfaces(plan, {**envs, "c": {"NCCL_SOCKET_IFNAME": "ib0"}}, ifaces)


@pytest.mark.parametrize("named", ["GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"])
def test_a_host_with_several_interfaces_must_name_both_socket_settings(named):
    """The trial's all-reduce runs on gloo, so a host that names only ``GLOO_SOCKET_IFNAME`` passes it while NCCL (the
    GPU collectives of the train itself) still picks an interface on its own, maybe one the peers cannot reach; the
    other way round the trial itself may pick the wrong one. Either half alone is refused, naming the missing key."""
    plan = fn.plan_nodes("r1", MERGED, ["a", "b", "c"], rendezvous_host="10.0.0.2", port=29511)
    ifaces = {"a": ["lo", "eth0", "ib0"], "b": ["lo", "eth0"], "c": ["lo", "eth0"]}
    missing = next(k for k in fn.SOCKET_ENV if k != named)
    with pytest.raises(fn.NodePlanError, match=rf"hosts\.a\.stage_env\.{missing}"):
        fn.socket_interfaces(plan, {"a": {named: "eth0"}}, ifaces)


@pytest.mark.images
def test_a_pipeline_without_torch_or_eagle3ops_is_named_not_the_route():
    """The trial and the reach probe run, through their own argv builders, in a pipeline image that has python3
    but neither torch nor eagle3ops: the STAND-IN pipeline image is the debootstrap minbase (``python3`` only), on
    this machine's engine. Each node's real exit status and output go to the verdicts, which must name the import,
    the image and the fix, and must not send the user to the network route or the rendezvous port."""
    import socket
    import subprocess

    from eagle3ops.fleet import trial as ft
    from eagle3ops_dev import bases

    image = bases.build_minbase()  # present already after `make prebuild`
    h = HostConfig(name="n0", hostname="127.0.0.1", data_dir="/d", state_dir="/s", model_path="/m", serving="none")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def run(argv):
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=120)
        return p.returncode, p.stdout + p.stderr

    no_torch = run(fc.trial_argv(image, master_addr="127.0.0.1", port=port, nnodes=2, node_rank=0, timeout_s=5))
    ok = (0, ft.TAG + '{"rank": 1, "world": 2, "seen": [0, 1]}')
    verdict = ft.parse_trial(["n0", "n1"], {"n0": no_torch, "n1": ok}, {"n0": image, "n1": image})
    msg = verdict.message()
    assert not verdict.ok and verdict.unreachable == () and list(verdict.not_started) == ["n0"], verdict
    assert "No module named 'torch'" in msg and f"in its pipeline {image}" in msg, msg
    assert "eagle3ops deploy NODE" in msg and "route" not in msg and "rendezvous_port" not in msg, msg

    no_e3 = run(fc.reach_argv(h, image, addr="127.0.0.1", port=port, timeout_s=1))
    listener = run(fc.reach_listen_argv(h, image, port=port, seconds=1, expect=2))
    rv = ft.parse_reach(["n0", "n1"], {"n0": no_e3, "n1": no_e3}, {"n0": image, "n1": image}, listener=listener)
    assert not rv.ok and rv.unreachable == () and list(rv.not_started) == ["n0", "n1"], rv
    assert "No module named 'eagle3ops'" in rv.message() and "route" not in rv.message(), rv.message()
    # a node that ran and could not connect is still the route's: the same words as before
    refused = (1, ft.REACH_TAG + '{"ok": false, "error": "127.0.0.1:1: [Errno 111] Connection refused"}')
    assert ft.start_failure(*refused) is None and ft.parse_reach(["n0"], {"n0": refused}).unreachable == ("n0",)
