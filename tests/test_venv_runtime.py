"""The venv runtime (``stage_runtime: venv``): configuration, preflight and the ``--dry-run`` plan of a
host without a container engine. Pure or against the stand-in host of ``test_window_driver.py`` (what the host
answers is faked; the config, preflight, planner and window code are the real ones); the pid-file state script runs
in this machine's ``sh`` against real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from eagle3ops.commands import venv as vc
from eagle3ops.config import ConfigError, HostConfig
from eagle3ops.config.inventory import VENV_RUNTIME
from eagle3ops.window import preflight as wpreflight
from eagle3ops.window import run as wrun
from eagle3ops.window.common import PreflightFailed
from eagle3ops.window.planner import build_plan, supervisor_commands
from test_window_driver import TINY, StandInHost, StandInRemote

#: A stand-in pipeline environment digest (no tarball behind it: these tests fake the host's answers).
ENV_HEX = "b" * 64
ENV_IMAGE, ENV_ID = f"venv:sha256:{ENV_HEX}", f"sha256:{ENV_HEX}"


def venv_host(**kw) -> HostConfig:
    fields = dict(name="pod", hostname="127.0.0.1", port=2262, data_dir="/srv/e3/data", state_dir="/srv/e3/state",
                  model_path="/srv/models/target", serving={"kind": "none"}, stage_runtime=VENV_RUNTIME,
                  venv_python="/usr/bin/python3.12", stage_env={"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"})
    fields.update(kw)
    return HostConfig(**fields)


def _error(**kw) -> str:
    with pytest.raises(ValueError) as exc:
        venv_host(**kw)
    return str(exc.value)


def test_venv_runtime_config_is_checked_naming_the_key_and_fix():
    h = venv_host()
    assert h.uses_venv and h.venv_python == "/usr/bin/python3.12"
    assert "needs venv_python" in _error(venv_python=None)
    assert "absolute path" in _error(venv_python="python3")
    assert "serving.kind is 'container'" in _error(serving={"image": "vllm/vllm-openai:v0.16.0",
                                                            "served_model_name": "m"})
    assert "stage_ipc, stage_shm_size: container settings" in _error(stage_ipc="host", stage_shm_size="16g")
    assert "docker_host" in _error(docker_host="unix:///run/docker.sock")
    with pytest.raises(ValueError, match="venv_python is set but stage_runtime is None"):
        venv_host(stage_runtime=None)
    assert not venv_host(stage_runtime="nvidia", venv_python=None,
                         serving={"kind": "none"}).uses_venv  # a container runtime name, as before


def test_one_runtime_is_chosen_per_host_plan_and_stage_spec_and_both_keep_the_protocol():
    import inspect

    from eagle3ops.commands import runtime as rt

    h, c = venv_host(), venv_host(stage_runtime="nvidia", venv_python=None)  # an OCI runtime name: containers
    assert rt.for_host(h) is rt.VENV and rt.for_host(c) is rt.CONTAINER
    members = {n for n, _ in inspect.getmembers(rt.StageRuntime) if not n.startswith("_")} | {"name", "engine",
                                                                                             "supervisor_note"}
    for runtime in (rt.CONTAINER, rt.VENV):
        assert members <= set(dir(runtime)), members - set(dir(runtime))
        spec = runtime.stage_spec(h if runtime is rt.VENV else c, image=ENV_IMAGE, stage="extract", run="r1",
                                  window_id="w1", extra=["--restart"])
        assert rt.for_spec(spec) is runtime  # the supervisor's choice, from the spec the planner wrote
        assert (spec.get("argv") or spec["command"])[-1] == "--restart"
    plan = build_plan(h, kind="window", window_id="w1", image=ENV_IMAGE, command="extract", run="r1",
                      stages=["prepare"], serving_container=None)
    assert plan.runtime == "venv" and rt.for_plan(plan) is rt.VENV
    assert rt.named(None) is rt.CONTAINER
    with pytest.raises(ValueError, match="unknown stage runtime 'podman': expected one of container, venv"):
        rt.named("podman")
    # what differs is asked of the runtime: nothing to remove after a venv supervisor, a container's by its name
    assert rt.VENV.supervisor_rm(h, "w1") is None and rt.VENV.left_supervisors(h) is None
    assert list(rt.CONTAINER.supervisor_rm(c, "w1"))[-1] == "eagle3ops-supervisor-w1"
    assert rt.VENV.state_words(h, "w1")[-1] == "/srv/e3/state/windows/w1/supervisor.pid"


def test_venv_inventory_through_the_loader_names_the_file_and_key(tmp_path):
    from eagle3ops.config import load_inventory

    f = tmp_path / "hosts.yaml"
    f.write_text("hosts:\n  pod:\n    hostname: 127.0.0.1\n    data_dir: /d\n    state_dir: /s\n    model_path: /m\n"
                 "    serving: none\n    stage_runtime: venv\n")
    with pytest.raises(ConfigError) as exc:
        load_inventory(f)
    assert "hosts.yaml" in str(exc.value) and "venv_python" in str(exc.value)


class VenvHost(StandInHost):
    """A stand-in host with no container engine (every ``docker`` command fails as on such a host) and a Python at
    ``venv_python``; ``marker`` is the pipeline environment's :data:`ENV_MARKER` text ('' = not delivered)."""

    def __init__(self, host, marker=json.dumps({"digest": ENV_ID}), python=(0, "3.12.3\n", "")):
        super().__init__(host)
        self.marker, self.python, self.docker_calls = marker, python, []
        #: what the host says of the environment's mount and libraries (:func:`eagle3ops.commands.venv.env_health`)
        self.env_health = (0, "mount rw,relatime\n", "")
        self._mkdirs(host.data_dir)
        self._mkdirs(host.state_dir)

    def __call__(self, argv, stdin):
        a = list(argv)
        if a[0] == "docker":
            self.docker_calls.append(a)
            return 127, "", "bash: line 1: docker: command not found"
        if a[0] == self.host.venv_python:
            return self.python
        if a[:2] == ["sh", "-c"] and a[3] == "eagle3ops-env":
            assert a[4] == f"{self.host.state_dir}/env/{ENV_HEX}"
            return 0, self.marker, ""
        if a[:2] == ["sh", "-c"] and a[3] == "eagle3ops-env-health":
            assert a[4] == f"{self.host.state_dir}/env/{ENV_HEX}"
            return self.env_health
        if a[:2] == ["sh", "-c"] and a[3] == "eagle3ops-launch":
            return 0, "", ""
        if a[0] == "pgrep":  # process serving: not running on this stand-in host
            return 1, "", ""
        if a[0] == "env":  # preflight's throwaway stage process
            self.trials.append(a)
            return self.trial_answer
        return super().__call__(argv, stdin)


def test_preflight_of_a_venv_host_asks_no_engine_and_checks_python_and_environment():
    h = venv_host()
    world = VenvHost(h)
    pf = wpreflight.preflight(StandInRemote(h, world), image=ENV_IMAGE, expected_image_id=ENV_ID,
                              trial=("r1", "w1", "prepare"))
    checks = {n: (ok, d) for n, ok, d in pf.checks}
    assert pf.ok, pf.failures()
    assert world.docker_calls == []
    assert checks["venv runtime"] == (True, "/usr/bin/python3.12: Python 3.12.3 (no container engine needed)")
    assert checks["pipeline environment"][1].startswith(f"/srv/e3/state/env/{ENV_HEX} (sha256:")
    assert checks["stage process"] == (True, "the stages' environment works: mounts ok")
    trial = world.trials[0]
    assert trial[trial.index(f"/srv/e3/state/env/{ENV_HEX}/bin/python") + 1] == "-c" and "NCCL_PROTO=LL" in trial
    assert "'/srv/e3/data'" in trial[-1] and "'/srv/models/target'" in trial[-1]


def test_a_failing_stage_process_fails_preflight_naming_the_keys():
    h = venv_host()
    world = VenvHost(h)
    world.trial_answer = (1, "", "ModuleNotFoundError: No module named 'torch'")
    pf = wpreflight.preflight(StandInRemote(h, world), image=ENV_IMAGE, expected_image_id=ENV_ID,
                              trial=("r1", "w1", "prepare"))
    assert not pf.ok and "throwaway stage process of the pipeline environment failed (exit 1)" in pf.failures()
    assert "No module named 'torch'" in pf.failures() and "hosts.pod.stage_env" in pf.failures()


@pytest.mark.parametrize("marker,python,expect", [
    ("", (0, "3.12.3\n", ""), f"no pipeline environment at /srv/e3/state/env/{ENV_HEX}"),
    (json.dumps({"digest": "sha256:" + "c" * 64}), (0, "3.12.3\n", ""), "expected sha256:bbbbbbbbbbbb: redeploy"),
    ("", (127, "", "sh: 1: /usr/bin/python3.12: not found"), "set hosts.pod.venv_python"),
])
def test_venv_preflight_refusals_name_the_fix(marker, python, expect):
    h = venv_host()
    pf = wpreflight.preflight(StandInRemote(h, VenvHost(h, marker=marker, python=python)), image=ENV_IMAGE,
                              expected_image_id=ENV_ID)
    assert not pf.ok and expect in pf.failures(), pf.failures()
    assert len(pf.checks) <= 2  # ends at the first failure, as the engine check does


TORCH_SO = f"/srv/e3/state/env/{ENV_HEX}/lib/python3.12/site-packages/torch/lib/libtorch_cpu.so"


@pytest.mark.parametrize("answer,expect", [
    ("mount rw,nosuid,nodev,noexec,relatime\n", ["is on a mount with noexec (rw,nosuid,nodev,noexec,relatime)",
                                                   "hosts.pod.state_dir", "eagle3ops deploy pod"]),
    (f"mount rw,relatime\nmissing {TORCH_SO}: libgomp.so.1 => not found\n",
     ["lacks system libraries the wheels load: libgomp.so.1 (needed by torch/lib/libtorch_cpu.so)",
      "install them on pod"]),
])
def test_venv_preflight_finds_an_environment_that_cannot_load_its_wheels(answer, expect):
    """Plan level (no GPU here): what the host says of the environment's mount (``findmnt``) and of its torch/vllm
    libraries (``ldd``) is faked; the check and its words are the real ones. Found before serving stops."""
    h = venv_host()
    world = VenvHost(h)
    world.env_health = (0, answer, "")
    pf = wpreflight.preflight(StandInRemote(h, world), image=ENV_IMAGE, expected_image_id=ENV_ID)
    assert not pf.ok, pf.checks
    for e in expect:
        assert e in pf.failures(), pf.failures()
    # the NVIDIA driver's own libraries are not the environment's to carry (a CPU host has none)
    world.env_health = (0, f"mount rw\nmissing {TORCH_SO}: libcuda.so.1 => not found\n", "")
    assert wpreflight.preflight(StandInRemote(h, world), image=ENV_IMAGE, expected_image_id=ENV_ID).ok


def test_a_host_without_engine_and_without_venv_runtime_is_refused_in_one_line_naming_the_venv_keys():
    h = venv_host(stage_runtime=None, venv_python=None)
    ok, line = wpreflight.engine_status(h, 127, "", "bash: line 1: docker: command not found")
    assert not ok and "\n" not in line
    assert "`stage_runtime: venv` with `venv_python:" in line and "--env-tarball PATH" in line
    assert "exports the pipeline image's venv" in line


def test_dry_run_plan_of_a_venv_extract_window_runs_stages_as_processes():
    h = venv_host()
    world = VenvHost(h)
    r = StandInRemote(h, world, dry_run=True)
    lines: list[str] = []
    r.echo = lines.append
    res = wrun.run_window(r, kind="extract", image=ENV_IMAGE, expected_image_id=ENV_ID, command="t", run="r1",
                          pipeline_text=TINY)
    assert res["outcome"] == "dry-run" and world.docker_calls == [] and world.writes == []
    launch = next(c for c in res["commands"] if "eagle3ops-launch" in c)
    assert f"/srv/e3/state/env/{ENV_HEX}/bin/python" in launch and "setsid nohup" in launch
    assert "supervisor.pid" in launch and "docker" not in launch
    on_host = res["supervisor_commands"]
    prog = f"/srv/e3/state/env/{ENV_HEX}/bin/eagle3ops-stage"
    assert [c[c.index(prog) + 1] for c in on_host if prog in c] == ["prepare", "extract"]
    prep = next(c for c in on_host if "prepare" in c)
    assert prep[:2] == ["cd", "/srv/e3/data/runs/r1"]
    assert "NCCL_PROTO=LL" in prep
    assert f'{vc.MOUNTS_ENV}={{"/data": "/srv/e3/data", "/model": "/srv/models/target"}}' in prep
    assert any("detached process of the pipeline environment" in ln for ln in lines)


def test_process_serving_plan_on_a_venv_host_gives_the_agent_the_pid_file_state():
    h = venv_host(serving={"kind": "process", "process_match": "vllm serve", "port": 8000,
                           "served_model_name": "m"})
    plan = build_plan(h, kind="window", window_id="w1", image=ENV_IMAGE, command="t", run="r1",
                      stages=["prepare"], process_pid=4242)
    assert plan.runtime == "venv" and plan.stages[0].spec["runtime"] == "venv"
    cmds = supervisor_commands(h, plan)
    agent = next(c for c in cmds if "eagle3ops-restore-agent" in " ".join(c))
    assert "docker" not in agent and vc.pid_file("/srv/e3/state/windows/w1") in agent


def test_restart_reaches_a_venv_stages_argv():
    plan = build_plan(venv_host(), kind="window", window_id="w1", image=ENV_IMAGE, command="t", run="r1",
                      stages=["extract"], restart=True)
    assert plan.stages[0].spec["argv"][-1] == "--restart"


def test_supervisor_state_words_answer_like_docker_inspect(tmp_path):
    pidf = tmp_path / "supervisor.pid"
    words = vc.state_words(str(tmp_path))

    def state():
        cp = subprocess.run([*words, "inspect", "--format", "{{.State.Status}}", "x"], capture_output=True,
                            text=True, timeout=10)
        return cp.stdout.strip()

    assert state().startswith("No such supervisor")
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "eagle3ops.supervisor"])
    try:
        pidf.write_text(f"{p.pid}\n")
        assert state() == "running"
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        pidf.write_text(f"{other.pid}\n")  # a reused pid: another program's
        assert state() == "exited"
        other.kill()
        other.wait(timeout=10)
        pidf.write_text(f"{p.pid}\n")
    finally:
        p.kill()
        p.wait(timeout=10)
    time.sleep(0.1)
    assert state() == "exited"


def test_env_paths_need_a_digest():
    h = venv_host()
    assert vc.env_python(h, ENV_IMAGE) == f"/srv/e3/state/env/{ENV_HEX}/bin/python"
    with pytest.raises(ValueError, match="does not name a pipeline environment"):
        vc.env_dir(h, "eagle3ops/pipeline:t")


def test_mounts_map_container_paths_to_the_host_and_keep_the_written_digests():
    from eagle3ops.config.pipeline import apply_mounts, parse_pipeline_config

    cfg = parse_pipeline_config("target_model: /model\nprepare: {datasets: [builtin:sharegpt, /data/x.jsonl, "
                                "rel.jsonl, /elsewhere/y.jsonl], chat_template: {file: /data/t.jinja}}\n", "p.yaml")
    mapped = apply_mounts(cfg, json.loads(vc.mounts_value(venv_host())))
    assert mapped.target_model == "/srv/models/target"
    assert mapped.prepare.datasets == ["builtin:sharegpt", "/srv/e3/data/x.jsonl", "rel.jsonl", "/elsewhere/y.jsonl"]
    assert mapped.prepare.chat_template.file == "/srv/e3/data/t.jinja"
    for sections in (("target_model", "prepare"), ("target_model", "extract"), ("target_model", "seed", "train")):
        assert mapped.section_digest(*sections) == cfg.section_digest(*sections)
    assert apply_mounts(cfg, {"/data": "/d"}).target_model == "/model"  # not under a mapped path: kept


def test_offline_dry_run_of_a_venv_host_plans_processes_without_ssh():
    from eagle3ops.window.offline import offline_dry_run

    h = venv_host(serving={"kind": "process", "process_match": "vllm serve", "port": 8000, "served_model_name": "m"})
    lines: list[str] = []
    res = offline_dry_run(h, kind="train", run="r1", pipeline_text=TINY, command="t", echo=lines.append)
    assert res["trial_command"] is None and res["stages"] == ["vocab", "train"]
    text = "\n".join(lines)
    assert "pipeline environment: venv:<sha256 from the host's deployed.json>" in text
    prog = "/srv/e3/state/env/<sha256 from the host's deployed.json>/bin/eagle3ops-stage"
    assert [c[c.index(prog) + 1] for c in res["supervisor_commands"] if prog in c] == ["vocab", "train"]
    assert "docker run" not in text and "throwaway container" not in text


def test_dry_run_with_process_serving_not_running_says_preflight_would_fail():
    h = venv_host(serving={"kind": "process", "process_match": "vllm serve", "port": 8000, "served_model_name": "m"})
    r = StandInRemote(h, VenvHost(h), dry_run=True)
    with pytest.raises(PreflightFailed, match="no process matches 'vllm serve'"):
        wrun.run_window(r, kind="extract", image=ENV_IMAGE, expected_image_id=ENV_ID, command="t", run="r1",
                        pipeline_text=TINY)


def test_speculate_and_the_host_relay_are_refused_on_a_venv_host_before_anything_runs():
    from types import SimpleNamespace

    from eagle3ops.speculate.reach import RegenerateError, host_relay
    from eagle3ops.speculate.ship import SpeculateError, speculate

    h = venv_host(serving={"kind": "process", "process_match": "vllm serve", "port": 8000, "served_model_name": "m"})
    world = VenvHost(h)
    r = StandInRemote(h, world)
    with pytest.raises(SpeculateError, match="not done yet: .*nothing was done"):
        speculate(r, SimpleNamespace())
    with pytest.raises(RegenerateError, match="--endpoint URL or --ssh-forward"):
        host_relay(r, ENV_IMAGE, None, None)
    assert r.history == []


class LogindVenvHost(VenvHost):
    """A :class:`VenvHost` whose systemd-logind ends the SSH user's session processes at logout
    (``KillUserProcesses=yes``, the user not exempt), the user lingering or not."""

    def __init__(self, host, linger: str):
        super().__init__(host)
        self.logind = f"user=e3ops\nprop=b true\nprop=as 0\nprop=as 0\nlinger={linger}\nsystemd_run=yes\n"

    def __call__(self, argv, stdin):
        a = list(argv)
        if a[:2] == ["sh", "-c"] and a[3] == "eagle3ops-logind":
            return 0, self.logind, ""
        return super().__call__(argv, stdin)


def test_where_logind_ends_the_session_the_venv_supervisor_runs_as_a_user_service():
    """On a venv host the window's supervisor is a process started over SSH: where logind's ``KillUserProcesses=yes``
    applies it must run as a user service (``systemd-run --user``, the user lingering), as the restore agent does,
    or the window is refused before anything stops. Measured on a real systemd 252 (docs/measured/faults-retried.md):
    with the agent a user service and the supervisor ``setsid nohup``, a driver killed mid-stage ended the window
    ``interrupted`` (logind stopped the session scope; the agent restored serving)."""
    h = venv_host()
    r = StandInRemote(h, LogindVenvHost(h, linger="yes"), dry_run=True)
    res = wrun.run_window(r, kind="extract", image=ENV_IMAGE, expected_image_id=ENV_ID, command="t", run="r1",
                          pipeline_text=TINY)
    launch = next(c for c in res["commands"] if "eagle3ops.supervisor" in c)
    assert launch.startswith("systemd-run --user") and "setsid" not in launch, launch
    assert "--unit eagle3ops-supervisor-" in launch and "supervisor.pid" in launch and "supervisor.log" in launch
    r = StandInRemote(h, LogindVenvHost(h, linger="no"), dry_run=True)
    with pytest.raises(PreflightFailed, match="supervisor.*loginctl enable-linger e3ops"):
        wrun.run_window(r, kind="extract", image=ENV_IMAGE, expected_image_id=ENV_ID, command="t", run="r1",
                        pipeline_text=TINY)
