"""Serving started through a shell (``bash -c "vllm serve ..."``, ``sh -c``, an Entrypoint of a
shell with ``-c``) takes no flag appended after the shell string: ``release --arg`` and speculate's
``--speculative-config`` would be recorded as a release and never reach vLLM. Such a container is refused by name,
with the fix, from its recorded configuration (``docker inspect``-shaped dicts here); the health gate still finds
an ``--api-key`` written inside the shell string.

The sandbox test (marked ``sandbox``) starts serving in shell form on the sandbox's real engine and runs a real
release through the supervisor: refused before anything is stopped, the container left as it was.
"""

from __future__ import annotations

import json

import pytest

from eagle3ops import health
from eagle3ops.commands import serving as sv
from eagle3ops.commands.speculate import speculative_args


def _inspect(entrypoint, cmd, name="vllm-serving", labels=None) -> dict:
    return {"Id": "0123456789abcdef" * 4, "Name": f"/{name}", "Image": "sha256:" + "1" * 64,
            "Config": {"Image": "vllm/vllm-openai:v0.16.0", "Entrypoint": entrypoint, "Cmd": cmd,
                       "Env": ["PATH=/usr/bin"], "Labels": labels or {}},
            "HostConfig": {"NetworkMode": "host", "Binds": ["/models:/models:ro"]},
            "NetworkSettings": {"Networks": {"host": {}}}}


SCRIPT = "vllm serve /models/m --port 8000 --max-num-seqs 16"
SHELL_FORMS = [
    pytest.param(["bash", "-c"], [SCRIPT], id="entrypoint-bash-c"),
    pytest.param(["/bin/sh", "-c"], [SCRIPT], id="entrypoint-sh-c (Dockerfile shell form)"),
    pytest.param(None, ["bash", "-c", SCRIPT], id="cmd-bash-c"),
    pytest.param(None, ["/usr/bin/env", "bash", "-lc", SCRIPT], id="cmd-env-bash-lc"),
    pytest.param(["/bin/bash"], ["-c", SCRIPT], id="entrypoint-bash cmd -c"),
    pytest.param(["dash", "-e", "-c"], [SCRIPT], id="entrypoint-dash-e-c"),
]


@pytest.mark.parametrize("entrypoint,cmd", SHELL_FORMS)
def test_release_args_on_a_shell_form_container_are_refused_by_name(entrypoint, cmd) -> None:
    rec = sv.container_record(_inspect(entrypoint, cmd))
    with pytest.raises(sv.ShellFormCommand) as e:
        sv.apply_change(rec, args=["--max-num-seqs", "8"])
    msg = str(e.value)
    assert "vllm-serving" in msg and "--max-num-seqs" in msg and "shell" in msg, msg
    assert "exec form" in msg and '"$@"' in msg, msg  # the fix: exec form, or a script that forwards its arguments


@pytest.mark.parametrize("entrypoint,cmd", SHELL_FORMS[:2])
def test_speculative_config_on_a_shell_form_container_is_refused(entrypoint, cmd) -> None:
    rec = sv.container_record(_inspect(entrypoint, cmd))
    with pytest.raises(sv.ShellFormCommand, match="--speculative-config"):
        sv.apply_change(rec, args=speculative_args(num_speculative_tokens=3, cpu=False))


def test_compose_shell_form_names_the_compose_keys() -> None:
    labels = {sv.COMPOSE_PROJECT_LABEL: "prod", sv.COMPOSE_SERVICE_LABEL: "vllm"}
    rec = sv.container_record(_inspect(["sh", "-c"], [SCRIPT], name="prod-vllm-1", labels=labels))
    with pytest.raises(sv.ShellFormCommand) as e:
        sv.apply_change(rec, args=["--max-num-seqs", "8"])
    assert "`command:`" in str(e.value) and "service vllm" in str(e.value), str(e.value)


@pytest.mark.parametrize("entrypoint,cmd", [
    pytest.param(["vllm", "serve"], ["/models/m", "--port", "8000"], id="exec-form"),
    pytest.param(None, ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"], id="exec-cmd"),
    pytest.param(["bash", "-c", 'exec vllm serve /models/m "$@"', "--"], ["--port", "8000"],
                 id="shell forwarding its arguments"),
    pytest.param(["/bin/sh", "-c", 'vllm serve /models/m "$@"', "sh"], [], id="sh forwarding, no args yet"),
])
def test_exec_form_and_forwarding_scripts_take_release_args(entrypoint, cmd) -> None:
    rec = sv.container_record(_inspect(entrypoint, cmd))
    new = sv.apply_change(rec, args=["--max-num-seqs", "8"])
    assert new["Config"]["Cmd"][-2:] == ["--max-num-seqs", "8"]


def test_shell_form_without_a_change_of_flags_is_still_recreatable() -> None:
    """A release that changes only the environment, or a rollback, does not depend on appended flags."""
    rec = sv.container_record(_inspect(["bash", "-c"], [SCRIPT]))
    new = sv.apply_change(rec, env={"A": "1"})
    assert new["Config"]["Cmd"] == [SCRIPT] and "A=1" in new["Config"]["Env"]


@pytest.mark.parametrize("entrypoint,cmd", [
    (["bash", "-c"], ["vllm serve /m --api-key sk-in-the-string --port 8000"]),
    (None, ["sh", "-c", "exec vllm serve /m --api-key=sk-in-the-string"]),
])
def test_gate_finds_the_api_key_inside_a_shell_string(entrypoint, cmd) -> None:
    assert health.api_key_from_inspect(_inspect(entrypoint, cmd)) == "sk-in-the-string"


def test_shell_form_detection_reports_the_script() -> None:
    found = health.shell_form(_inspect(None, ["/usr/bin/env", "bash", "-lc", SCRIPT])["Config"])
    assert found is not None and found.script == SCRIPT and not found.forwards_args
    assert health.shell_form({"Entrypoint": ["vllm", "serve"], "Cmd": ["-c", "x"]}) is None


# ---- on the sandbox's real engine -----------------------------------------------------------------------------------

PORT = 18011
NAME = "e3-shellform-serving"


@pytest.mark.sandbox
@pytest.mark.slow
def test_sandbox_release_of_shell_form_serving_is_refused_and_serving_untouched(sandbox_host, tmp_path) -> None:
    """Serving started as ``sh -c "<entrypoint> <args>"`` on the sandbox engine; a real release through the
    supervisor (this process, the sandbox engine's socket) is refused before the stop: the same container keeps
    running, no release beyond the recorded one is kept, and the result names the shell form and the fix."""
    import shlex
    import subprocess
    import time
    import uuid

    import docker
    import standin_serving

    from eagle3ops.config.plan import HealthCheck, Plan, ReleaseChange
    from eagle3ops.supervisor.releases import Releases
    from eagle3ops.supervisor.runner import Supervisor

    h = sandbox_host

    def dk(*args, check=True):
        return subprocess.run(["docker", "-H", h.docker_host, *args], capture_output=True, text=True, timeout=300,
                              check=check)

    # The server: the STAND-IN OpenAI server (standin_serving; the subject is the shell form, not vLLM).
    script = "exec " + shlex.join([*standin_serving.ENTRYPOINT, *standin_serving.args(PORT, h.serving.served_model_name),
                                   "--api-key", "sk-shellform"])
    env = [f"--env={k}={v}" for k, v in h.serving.env.items()]
    dk("rm", "--force", NAME, check=False)
    dk("run", "--detach", "--name", NAME, "--network", "host", *env,
       *[f"--volume={v}" for v in [*h.serving.volumes, standin_serving.script_volume(h)]], "--entrypoint", "/bin/sh",
       h.serving.image, "-c", script)
    try:
        before = json.loads(dk("container", "inspect", NAME).stdout)[0]
        assert health.api_key_from_inspect(before) == "sk-shellform"
        health.wait_healthy(f"http://127.0.0.1:{PORT}", h.serving.served_model_name, api_key="sk-shellform",
                            timeout_s=900, crashed=lambda: None)
        wid = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-release-{uuid.uuid4().hex[:6]}"
        wdir = tmp_path / "state" / "windows" / wid
        wdir.mkdir(parents=True)
        plan = Plan(window_id=wid, kind="release", host=h.name, user="pytest", command="pytest release",
                    state_dir=str(tmp_path / "state"), serving_container=NAME, stop_timeout_s=30, budget_s=1800,
                    health=HealthCheck(port=PORT, model=h.serving.served_model_name, timeout_s=900),
                    change=ReleaseChange(args=["--max-num-seqs", "8"]))
        client = docker.DockerClient(base_url=h.docker_host, timeout=600)
        res = Supervisor(plan, client, wdir).run()
        assert res["outcome"] == "failed" and "shell" in res["error"] and "exec form" in res["error"], res
        after = json.loads(dk("container", "inspect", NAME).stdout)[0]
        assert after["Id"] == before["Id"] and after["State"]["Running"], "serving was touched"
        assert Releases(tmp_path / "state").numbers() == [1]
    finally:
        dk("rm", "--force", NAME, check=False)


def test_driver_refuses_the_release_before_the_stop_and_in_dry_run() -> None:
    """The window's preflight step (``check_release_flags``) reads the live container (read-only ``docker inspect``
    over a stand-in executor giving a recorded answer) and fails the check by name."""
    from types import SimpleNamespace

    from eagle3ops.window.preflight import Preflight
    from eagle3ops.window.run import check_release_flags

    class RecordedRemote:  # stand-in for eagle3ops.remote.Remote: answers the one read with a recorded inspect
        host = SimpleNamespace(name="h1", docker_host=None)
        dry_run = True

        def __init__(self, inspect: dict) -> None:
            self.inspect, self.calls = inspect, []

        def run(self, argv, check=True):
            self.calls.append(argv)
            return SimpleNamespace(ok=True, stdout=json.dumps([self.inspect]), stderr="")

    r = RecordedRemote(_inspect(["bash", "-c"], [SCRIPT]))
    pf = Preflight()
    pf.serving_container = "vllm-serving"
    check_release_flags(r, pf, ["--max-num-seqs", "8"])
    assert not pf.ok and "vllm-serving runs its server through a shell" in pf.failures(), pf.failures()
    from eagle3ops.commands.types import Read

    assert all(isinstance(a, Read) for a in r.calls) and r.calls[0][-3:] == ["container", "inspect", "vllm-serving"]
    pf = Preflight()
    pf.serving_container = "vllm-serving"
    check_release_flags(RecordedRemote(_inspect(["vllm", "serve"], ["/m"])), pf, ["--max-num-seqs", "8"])
    assert pf.ok
