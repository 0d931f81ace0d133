"""The record step on a real Docker engine (this machine's, no sandbox): which live container is the current release.

Serving is provisioned the way ``demo`` and the benchmarks provision it (``container_spec``: labelled
``io.eagle3ops.release=1``) and recorded by a window as release 1. Then it is recreated OUTSIDE eagle3ops with the
same label but another setting (``--cpuset-cpus 0``), as a provisioning script reusing an earlier state dir does.
The next window must record that container as a new release (its CPU set kept), so that a release and the rollback
after it bring back what was live, not the earlier release 1's record; and a window that finds the container
eagle3ops itself created must not record it again.

The supervisor runs in this process (the code under test) against ``docker.from_env()``, with the real health
gate; serving is the STAND-IN OpenAI server (``tests/data/standin_openai_server.py``, NOT vLLM: the subject is the
container's identity and settings) in the debootstrap minbase (python3 only), host network, so each restart takes
about a second.
"""

from __future__ import annotations

import json
import socket
import subprocess
import uuid
from pathlib import Path

import pytest

from eagle3ops import health as gate
from eagle3ops.commands import serving as sv
from eagle3ops.config.plan import HealthCheck, Plan, ReleaseChange
from eagle3ops.supervisor.releases import Releases

pytestmark = [pytest.mark.images]
REPO = Path(__file__).resolve().parents[1]
MODEL = "standin-label"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120, check=check)


def _inspect(name: str) -> dict:
    return json.loads(_docker("container", "inspect", name).stdout)[0]


@pytest.fixture
def serving():
    """``(name, port, provision)``: ``provision(*flags)`` (re)creates serving as provisioning does, labelled
    release 1, with extra ``docker run`` flags, and waits until it answers."""
    from eagle3ops_dev import bases

    image = bases.build_minbase()  # present already after `make prebuild`
    name, port = f"e3-label-{uuid.uuid4().hex[:6]}", _free_port()

    def provision(*flags: str) -> None:
        _docker("rm", "--force", name, check=False)
        _docker("run", "--detach", "--name", name, "--network", "host", *flags,
                "--label", f"{sv.ROLE_LABEL}=serving", "--label", f"{sv.RELEASE_LABEL}=1",
                "--volume", f"{REPO / 'tests/data'}:/standin:ro", "--entrypoint", "python3", image,
                "/standin/standin_openai_server.py", "--port", str(port), "--model", MODEL)
        gate.wait_healthy(f"http://127.0.0.1:{port}", MODEL, timeout_s=60, interval_s=0.2)

    try:
        yield name, port, provision
    finally:
        _docker("rm", "--force", name, check=False)


def _supervisor(tmp_path: Path, name: str, port: int, kind: str, **kw):
    import docker

    from eagle3ops.supervisor.runner import Supervisor

    wid = f"w{len(list(tmp_path.glob('w*')))}-{kind}"
    wdir = tmp_path / wid
    wdir.mkdir()
    plan = Plan(window_id=wid, kind=kind, host="local", user="pytest", command=f"pytest {kind}",
                state_dir=str(tmp_path / "state"), serving_container=name, stop_timeout_s=5, budget_s=300,
                health=HealthCheck(port=port, model=MODEL, timeout_s=60, interval_s=0.2), **kw)
    return Supervisor(plan, docker.from_env(timeout=120), wdir)


def test_serving_recreated_outside_with_the_same_label_is_a_new_release(serving, tmp_path):
    name, port, provision = serving
    provision()
    first = _supervisor(tmp_path, name, port, "window")
    first.record()
    rels = Releases(tmp_path / "state")
    assert rels.current() == 1 and rels.numbers() == [1], "the provisioned container recorded as release 1"
    assert not rels.get(1)["container"]["HostConfig"].get("CpusetCpus")

    # recreated by a provisioning script with the same label, pinned to CPU 0: not the container release 1 recorded
    provision("--cpuset-cpus", "0")
    res = _supervisor(tmp_path, name, port, "release", change=ReleaseChange(args=["--max-num-seqs", "8"])).run()
    assert res["outcome"] == "ok", res
    assert any("recreated outside eagle3ops" in w for w in res["warnings"]), res["warnings"]
    assert res["release_before"] == 2 and res["release"] == 3, res
    assert rels.get(2)["container"]["HostConfig"]["CpusetCpus"] == "0"
    assert _inspect(name)["HostConfig"]["CpusetCpus"] == "0", "the release keeps the live container's CPU set"

    res = _supervisor(tmp_path, name, port, "rollback").run()
    assert res["outcome"] == "ok" and res["release"] == 2, res
    back = _inspect(name)
    assert back["HostConfig"]["CpusetCpus"] == "0", "the rollback lost the CPU set that was live before the release"
    assert "--max-num-seqs" not in back["Config"]["Cmd"]

    # the container the rollback created is release 2: the next window finds it so, records nothing, warns nothing
    again = _supervisor(tmp_path, name, port, "window")
    again.record()
    assert rels.current() == 2 and rels.numbers() == [1, 2, 3] and not again.warnings(), again.warnings()

    # production as the cycle's acceptance step replays it: release 2's record while its container serves; the live
    # container once serving is recreated outside eagle3ops again (another CPU weight)
    from eagle3ops.speculate.cycleserve import production_serving

    pr = _LocalHost(tmp_path, name, port)
    assert production_serving(pr).source == "release 2"
    provision("--cpu-shares", "512")
    prod = production_serving(pr)
    assert prod.source.startswith(f"live container {name}") and prod.record["HostConfig"]["CpuShares"] == 512, prod


class _LocalHost:
    """STAND-IN for the SSH executor of a host: this machine's executor (``executor.local()``, its docker CLI on
    this machine's engine) with an inventory entry naming the test's serving container and state dir."""

    def __init__(self, tmp_path: Path, name: str, port: int):
        from eagle3ops import executor
        from eagle3ops.config import load_inventory

        inv = tmp_path / "hosts.yaml"
        inv.write_text(f"hosts:\n  local: {{hostname: 127.0.0.1, state_dir: {tmp_path}/state, data_dir: "
                       f"{tmp_path}/data, model_path: /m, serving: {{container: {name}, image: img, "
                       f"served_model_name: {MODEL}, port: {port}}}}}\n")
        self.host, self._local = load_inventory(inv).host("local"), executor.local()

    def run(self, *a, **kw):
        return self._local.run(*a, **kw)
