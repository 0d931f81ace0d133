"""No engine, no surprise: preflight recognises a host without a container engine (the `docker` command
missing, or the engine's socket not answering) and refuses in one line that says what is missing and what the host
can use instead — before the lock's window stops anything. Against the stand-in host of ``test_window_driver.py``
(what the host answers is faked; the preflight, window and CLI code are the real ones)."""

from __future__ import annotations

import pytest

from eagle3ops.window import preflight as wpreflight
from eagle3ops.window import run as wrun
from eagle3ops.window.common import PreflightFailed
from test_window_driver import IMAGE, IMAGE_ID, TINY, StandInHost, StandInRemote, _cli, _host_with_serving

#: What `docker version --format {{.Server.Version}}` answers over SSH on hosts without a working engine: the
#: shells' and the Docker CLIs' own words (bash, dash; Docker 20.10 and 28).
NO_CLI = [(127, "", "bash: line 1: docker: command not found"), (127, "", "sh: 1: docker: not found")]
NO_DAEMON = [
    (1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"),
    (1, "", "failed to connect to the docker API at unix:///var/run/docker.sock; check if the path is correct and "
            "if the daemon is running: dial unix /var/run/docker.sock: connect: no such file or directory"),
]
DENIED = (1, "", "permission denied while trying to connect to the Docker daemon socket at "
                 "unix:///var/run/docker.sock: Get \"http://%2Fvar%2Frun%2Fdocker.sock/v1.24/version\": dial unix "
                 "/var/run/docker.sock: connect: permission denied")


class NoEngineHost(StandInHost):
    """A stand-in host whose every `docker ...` command answers ``answer`` (the engine is missing)."""

    def __init__(self, host, answer, **kw):
        super().__init__(host, **kw)
        self.answer, self.docker_calls = answer, []

    def __call__(self, argv, stdin):
        if argv[0] == "docker":
            self.docker_calls.append(list(argv))
            return self.answer
        return super().__call__(argv, stdin)


def _world(host, answer):
    world = NoEngineHost(host, answer)
    world._mkdirs(host.data_dir)
    world._mkdirs(host.state_dir)
    return world


def _one_line(pf):
    assert not pf.ok and len(pf.checks) == 1, pf.checks  # nothing after the engine check: it would only repeat it
    text = pf.failures()
    assert "\n" not in text and text.startswith("  - docker engine: "), text
    return text


@pytest.mark.parametrize("answer", NO_CLI)
def test_no_docker_command_is_one_line_naming_what_is_missing_and_what_to_use(answer):
    from test_window_driver import REPO
    from eagle3ops.config import load_inventory

    host = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    world = _world(host, answer)
    pf = wpreflight.preflight(StandInRemote(host, world), image=IMAGE, expected_image_id=IMAGE_ID)
    text = _one_line(pf)
    assert f"no container engine on {host.name}: the `docker` command is not installed" in text
    assert answer[2] in text  # the host's own words
    assert "install Docker Engine" in text and f"hosts.{host.name}.docker_host" in text
    assert "`stage_runtime: venv` with `venv_python:" in text
    assert len(world.docker_calls) == 1  # only `docker version`: no image, container or trial commands


@pytest.mark.parametrize("answer", NO_DAEMON)
def test_engine_socket_not_answering_is_one_line_naming_the_socket(answer):
    from test_window_driver import REPO
    from eagle3ops.config import load_inventory

    host = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    pf = wpreflight.preflight(StandInRemote(host, _world(host, answer)), image=IMAGE, expected_image_id=IMAGE_ID)
    text = _one_line(pf)
    endpoint = host.docker_host or "unix:///var/run/docker.sock"
    assert f"no container engine answers on {host.name}: the `docker` command is there but {endpoint} does " \
           f"not answer" in text
    assert "start the engine" in text and "`stage_runtime: venv`" in text


def test_engine_refusing_the_ssh_user_names_the_docker_group():
    ok, line = wpreflight.engine_status(_seeds_host(), *DENIED)
    assert not ok and "may not use the container engine on rtxpro-01" in line and "`docker` group" in line
    assert "\n" not in line


def test_a_working_engine_passes_with_its_version():
    assert wpreflight.engine_status(_seeds_host(), 0, "27.0.0\n", "") == (True, "27.0.0")


def _seeds_host():
    from test_config_rtxpro6000 import INVENTORY
    from eagle3ops.config import load_inventory

    return load_inventory(INVENTORY).host("rtxpro-01")


def test_the_seeds_host_without_an_engine_is_refused_before_anything_stops(monkeypatch, tmp_path):
    """The seeds' host (serving kind process, 8 GPUs, a container without Docker): `eagle3ops extract` fails in
    preflight with exactly one failure line; the lock is released, nothing is written but the lock itself and the
    audit, serving (the process) is not asked to stop."""
    host = _seeds_host()
    world = _world(host, NO_CLI[0])
    world.files[f"{host.state_dir}/deployed.json"] = '{"image": "%s", "image_id": "%s"}' % (IMAGE, IMAGE_ID)
    monkeypatch.setattr("eagle3ops.cli_common.load_host", lambda inv, name: host)
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(TINY)
    out = _cli(monkeypatch, world, "extract", "rtxpro-01", "--pipeline", str(pipeline))
    assert out.exit_code != 0, out.output
    assert "preflight failed, nothing was stopped" in out.output
    fails = [ln for ln in out.output.splitlines() if ln.startswith("  - ")]
    assert len(fails) == 1 and "no container engine on rtxpro-01" in fails[0], out.output
    assert f"{host.state_dir}/lock" not in world.dirs, "lock released"
    assert not [w for w in world.writes if "kill" in w or "restore" in w or "runs/" in w], world.writes
    # preflight asked `docker version` only; afterwards the driver asks (read-only) whether a supervisor started
    assert [c[1] for c in world.docker_calls] == ["version", "inspect"], world.docker_calls
    assert "eagle3ops-supervisor-" in world.docker_calls[1][-1]


def test_a_window_on_a_host_without_an_engine_raises_preflight_failed(host=None):
    from test_window_driver import REPO
    from eagle3ops.config import load_inventory

    host = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    world = _host_with_serving(host)
    world.__class__ = NoEngineHost
    world.answer, world.docker_calls = NO_DAEMON[0], []
    with pytest.raises(PreflightFailed) as e:
        wrun.run_window(StandInRemote(host, world), kind="extract", image=IMAGE, expected_image_id=IMAGE_ID,
                        command="t", run="r1", pipeline_text=TINY)
    assert "no container engine answers on sandbox" in str(e.value)
    assert not [w for w in world.writes if "pipeline.yaml" in w], "nothing of the run written"


def test_missing_target_fails_naming_the_weights_command_but_passes_a_deploy_before_the_weights():
    """A work host is deployed before ``weights HOST --from PRODUCTION`` copies the target there: with
    ``target_later`` (deploy of a host without serving) the missing model directory passes, said so; otherwise it
    fails naming how to put the target there."""
    from test_window_driver import REPO, StandInHost
    from eagle3ops.config import load_inventory

    host = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    world = StandInHost(host)
    world.dirs.discard(host.model_path)
    pfs = {later: wpreflight.preflight(StandInRemote(host, world), image=IMAGE, expected_image_id=IMAGE_ID,
                                       need_serving=False, target_later=later) for later in (False, True)}
    for later, pf in pfs.items():
        check = next(c for c in pf.checks if c[0] == "model path")
        assert check[1] is later, pf.checks
        assert f"eagle3ops weights {host.name} --from" in check[2] and host.model_path in check[2]
    assert not pfs[False].ok and "fix hosts.sandbox.model_path" in pfs[False].failures()
    assert "not there yet" in next(c[2] for c in pfs[True].checks if c[0] == "model path")


def test_a_profile_that_disagrees_with_serving_version_is_refused_before_anything_stops():
    """The host's profile (``hosts.<h>.profile``, default: the registry's, vLLM 0.16.0) against serving's
    ``/version``: 0.16.0+cpu passes the default; 0.32.0+cpu is refused naming both versions and the key, and passes
    once the key names the vLLM 0.32 profile; a server without /version is not judged; an unknown profile fails."""
    from test_window_driver import REPO
    from eagle3ops.config import load_inventory
    from eagle3ops.window.servedversion import version_refusal

    host = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")

    def check(h, served):
        world = _host_with_serving(h)
        world.served_vllm = served
        pf = wpreflight.preflight(StandInRemote(h, world), image=IMAGE, expected_image_id=IMAGE_ID)
        return next(c for c in pf.checks if c[0] == "serving vLLM version")

    assert check(host, "0.16.0+cpu") == ("serving vLLM version", True,
                                         "0.16.0+cpu, as profile speculators-0.3.0-vllm-0.16.0 (vLLM 0.16.0)")
    ok, detail = check(host, "0.32.0+cpu")[1:]
    assert not ok and detail == (
        "live serving on sandbox reports vLLM 0.32.0+cpu (/version) but hosts.sandbox.profile is "
        "speculators-0.3.0-vllm-0.16.0 (vLLM 0.16.0): set hosts.sandbox.profile to a profile of vLLM 0.32.0 "
        "(docs/vllm-profiles.md), or roll serving back (`eagle3ops rollback sandbox`)")
    upgraded = host.model_copy(update={"profile": "vllm-0.32.0-serving"})
    assert check(upgraded, "0.32.0+cpu")[1] is True
    assert check(upgraded, None)[1:] == (True, "not judged: serving did not answer /version (profile "
                                               "vllm-0.32.0-serving)")
    bad = check(host.model_copy(update={"profile": "vllm-9"}), "0.16.0")
    assert not bad[1] and "hosts.sandbox.profile: no profile 'vllm-9'" in bad[2]
    assert version_refusal("h", "p", "0.32.0", "0.32.0") is None and version_refusal("h", "p", None, "1") is None


def test_without_a_registry_the_default_profile_is_not_judged_but_a_set_one_fails(monkeypatch, tmp_path):
    """A driver installed without the repository's patches/ (EAGLE3OPS_PATCHES_DIR pointing at an empty dir here):
    no profile set → the check passes, said not judged; a profile set → it fails naming the missing registry."""
    from test_window_driver import REPO
    from eagle3ops.config import load_inventory

    monkeypatch.setenv("EAGLE3OPS_PATCHES_DIR", str(tmp_path))
    host = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    for h, ok in ((host, True), (host.model_copy(update={"profile": "vllm-0.32.0-serving"}), False)):
        pf = wpreflight.preflight(StandInRemote(h, _host_with_serving(h)), image=IMAGE, expected_image_id=IMAGE_ID)
        check = next(c for c in pf.checks if c[0] == "serving vLLM version")
        assert check[1] is ok and "profiles.yaml" in check[2], check
        assert check[2].startswith("not judged: ") is ok
