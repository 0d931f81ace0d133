"""Stand-ins are marked and refused by name on a host that is not a sandbox, before anything reaches it (fast, no
sandbox): ``deploy`` of the pipeline image built on the local stand-in base (its label ``io.eagle3ops.stand-in-for``,
inherited from the base, read through the build plan before anything is built), ``deploy --env-tarball`` of the
stand-in pipeline environment (:mod:`eagle3ops_dev.standin_env`, its marker file read from the tarball's head), and
``push`` of an image carrying the inherited label under a name that says nothing; each also with ``--dry-run``.
``release --image`` and ``speculate`` are ``tests/test_gate_holes.py``'s; the marker of an environment exported from
a stand-in image is ``tests/test_venv_envbuild.py``'s.

The build engine, the local stand-in base on it and the stand-in environment's tarball are the real ones (built by
``tests/prebuild.py`` / cached under ``.cache/standin-env``). The host is a NAMED STAND-IN: :class:`_NoHost`, the
executor ``executor.for_host`` makes in these tests, fails the test on any command run on the host, so "refused before
anything reached the host" is what passing means (a reachability check may open the connection, nothing more).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3ops import executor
from eagle3ops.config import HostConfig, load_inventory
from eagle3ops.config.standin import is_sandbox, standin_refusal


REPO = Path(__file__).resolve().parents[1]
WIDE = {"COLUMNS": "400"}  # rich wraps error lines at the terminal width: keep each on one line


class _NoHost:
    """STAND-IN for the SSH executor of a production host: the connection opens (reachability), and any command run
    on the host fails the test naming it."""

    def __init__(self, host: HostConfig, *_, **kw):
        self.host, self.dry_run, self.history, self.changes = host, bool(kw.get("dry_run")), [], []

    @property
    def connection(self):
        return self

    def run(self, argv, **_):
        pytest.fail(f"{self.host.name}: a command reached the host before the stand-in was refused: {argv}")

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


@pytest.fixture
def no_host(monkeypatch):
    monkeypatch.setattr(executor, "for_host", _NoHost)


def _sandbox() -> HostConfig:
    return load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")


def _production() -> HostConfig:
    """The sandbox's inventory entry as a production GPU host: another Docker endpoint (not a sandbox engine's)."""
    return _sandbox().model_copy(update={"name": "gpu-01", "docker_host": "unix:///run/docker.sock", "gpus": 1})


def _venv_host(state_root: str) -> HostConfig:
    return HostConfig(name="pod", hostname="127.0.0.1", data_dir=f"{state_root}/data", state_dir=f"{state_root}/state",
                      model_path=f"{state_root}/model", stage_runtime="venv", venv_python="/usr/bin/python3",
                      serving="none")


def _inventory(tmp_path: Path, *hosts: HostConfig) -> Path:
    from eagle3ops_dev.fleet import inventory_yaml

    p = tmp_path / "hosts.yaml"
    p.write_text(inventory_yaml(list(hosts)))
    return p


def _never_build(monkeypatch):
    from eagle3ops.images import build as build_mod

    def refuse(*a, **k):
        raise AssertionError("a stand-in was built for a host that refuses it")

    monkeypatch.setattr(build_mod, "buildkit_build", refuse)
    monkeypatch.setattr(build_mod, "_sdk_build", refuse)


def test_a_venv_host_is_a_sandbox_only_with_its_state_under_a_sandbox_root():
    assert is_sandbox(_venv_host("/var/lib/eagle3ops-sandbox/fleet0/data/venvhost-1"))
    assert not is_sandbox(_venv_host("/srv/eagle3ops"))
    assert not is_sandbox(_venv_host("/var/lib/eagle3ops-sandbox"))  # no sandbox name under the root
    assert not is_sandbox(_venv_host("/var/lib/eagle3ops-sandbox/../eagle3ops"))


def test_deploy_refuses_the_pipeline_image_on_the_local_stand_in_base_before_building_or_sending(
        monkeypatch, tmp_path, no_host):
    from eagle3ops import cli, deployer, images

    _never_build(monkeypatch)
    bp = images.plan_build("pipeline", base_image=images.LOCAL_BASE_TAG)
    h = _production()
    with pytest.raises(deployer.DeployError) as exc:
        deployer.deploy(h, base_image=images.LOCAL_BASE_TAG, echo=lambda _: None)
    msg = str(exc.value)
    assert msg.startswith("gpu-01: deploy refused: ") and bp.tag in msg, msg
    assert f"built on {images.LOCAL_BASE_TAG}" in msg and "io.eagle3ops.stand-in-for" in msg, msg
    assert "vllm/vllm-openai:v0.16.0" in msg and "`eagle3ops deploy gpu-01` without --base-image" in msg, msg
    # --dry-run shows the same refusal (exit 1), nothing planned past it
    inv = _inventory(tmp_path, h)
    res = CliRunner().invoke(cli.app, ["deploy", "gpu-01", "--dry-run", "--base-image", images.LOCAL_BASE_TAG,
                                       "--inventory", str(inv)], env=WIDE)
    assert res.exit_code == 1 and "gpu-01: deploy refused: " in res.output and bp.tag in res.output, res.output
    assert "# push" not in res.output
    deployer.refuse_standin_build(_sandbox(), bp, "deploy")  # the sandbox takes it (the suite's and the demo's deploy)


def test_deploy_refuses_the_stand_in_environment_on_a_venv_host_that_is_not_a_sandbox(tmp_path, no_host):
    from eagle3ops import cli, deployer
    from eagle3ops_dev import standin_env

    tgz, image = standin_env.build("/usr/bin/python3")
    h = _venv_host("/srv/eagle3ops")
    with pytest.raises(deployer.DeployError) as exc:
        deployer.deploy(h, env_tarball=tgz, echo=lambda _: None)
    from eagle3ops.config.standin import STANDIN_ENV_MARKER

    msg = str(exc.value)
    assert msg.startswith("pod: deploy --env-tarball refused: ") and image in msg and str(tgz) in msg, msg
    assert STANDIN_ENV_MARKER in msg and standin_env.NAME in msg, msg
    assert "`eagle3ops deploy pod` without --env-tarball" in msg, msg
    res = CliRunner().invoke(cli.app, ["deploy", "pod", "--dry-run", "--env-tarball", str(tgz),
                                       "--inventory", str(_inventory(tmp_path, h))], env=WIDE)
    assert res.exit_code == 1 and "pod: deploy --env-tarball refused: " in res.output, res.output
    from eagle3ops.transfer.envdeliver import refuse_standin_env

    # a venv host of a sandbox takes it (the venv and fleet tests' hosts)
    refuse_standin_env(_venv_host("/var/lib/eagle3ops-sandbox/fleet0/data/f"), tgz, image, "deploy --env-tarball")


def test_push_refuses_an_image_whose_label_marks_it_a_stand_in_whatever_its_name(tmp_path, no_host):
    from eagle3ops import cli, images, transfer

    client = images.docker_client()
    neutral = f"e3ops-test/neutral:{uuid.uuid4().hex[:8]}"  # the local base under a name that says nothing
    client.images.get(images.LOCAL_BASE_TAG).tag(neutral)
    try:
        r = transfer.push(neutral, _production())
        assert r.status == "failed" and r.reason.startswith(f"gpu-01: push refused: {neutral} is a stand-in image")
        assert "io.eagle3ops.stand-in-for" in r.reason and r.commands == [] and r.bytes_sent == 0, r
        res = CliRunner().invoke(cli.app, ["push", neutral, "gpu-01", "--dry-run",
                                           "--inventory", str(_inventory(tmp_path, _production()))], env=WIDE)
        assert res.exit_code == 1 and f"gpu-01: push refused: {neutral} is a stand-in image" in res.output, \
            res.output
    finally:
        client.images.remove(neutral)
    # a pipeline image (its own label says so) is told to be built on the real base; a sandbox takes either
    pipeline = {"io.eagle3ops.image": "eagle3ops/pipeline", "io.eagle3ops.stand-in-for": "vllm/vllm-openai:v0.16.0"}
    assert "`eagle3ops deploy gpu-01` without --base-image" in standin_refusal(_production(), "p:1", pipeline, "push")
    assert standin_refusal(_sandbox(), "p:1", pipeline, "push") is None
