"""Driver side, against the stand-in host of ``test_window_driver.py``: what a window will
do is decided before serving stops (a finished run is a no-op: nothing stopped, nothing of the run rewritten), and
preflight's GPU/container check is a throwaway container with the stage container's own settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from eagle3ops.commands import serving as sv
from eagle3ops.commands import stages as st
from eagle3ops.config.pipeline import PipelineConfig, load_pipeline_config
from eagle3ops.stages.manifest import MANIFEST, STAGES, file_entry, stage_dir, write_manifest
from eagle3ops.window import planner as wplanner
from eagle3ops.window import preflight as wpreflight
from eagle3ops.window import run as wrun
from eagle3ops.window.common import PreflightFailed
from test_window_driver import IMAGE, IMAGE_ID, TINY, Launched, StandInRemote, _cli, _host_with_serving

WINDOW_STAGES = {"extract": ["prepare", "extract"], "train": ["vocab", "train"]}


def finished_run(tmp_path: Path, text: str = TINY, stages=("prepare", "extract")) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    """A run directory whose ``stages`` finished (stand-in outputs: one small file each, real manifests)."""
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "pipeline.yaml").write_text(text)
    cfg = load_pipeline_config(run)
    for stage in stages:
        d = stage_dir(run, stage)
        d.mkdir(exist_ok=True)
        (d / "out.bin").write_bytes(stage.encode() * 10)
        write_manifest(run, stage, cfg, {"out.bin": file_entry(d / "out.bin")}, tokens=100)
    return run


def state(run: Path) -> tuple[dict[str, str | None], dict[str, int]]:
    manifests = {s: (stage_dir(run, s) / MANIFEST).read_text() if (stage_dir(run, s) / MANIFEST).is_file() else None
                 for s in STAGES}
    sizes = {str(p.relative_to(run)): p.stat().st_size for p in run.rglob("*") if p.is_file()}
    return manifests, sizes


def cfg_of(text: str) -> PipelineConfig:
    return PipelineConfig.model_validate(yaml.safe_load(text))


# ---- the decision (pure) -----------------------------------------------------------------------------------------

def test_a_finished_window_has_nothing_to_do(tmp_path):
    manifests, sizes = state(finished_run(tmp_path))
    d = wplanner.decide_stages(WINDOW_STAGES["extract"], cfg_of(TINY), manifests, sizes)
    assert d.nothing_to_do and [s for s, _ in d.skip] == ["prepare", "extract"]
    assert all("already done for these inputs" in why for _, why in d.skip)


def test_partly_done_runs_the_rest_and_says_why(tmp_path):
    manifests, sizes = state(finished_run(tmp_path, stages=("prepare",)))
    d = wplanner.decide_stages(WINDOW_STAGES["extract"], cfg_of(TINY), manifests, sizes)
    assert [s for s, _ in d.skip] == ["prepare"] and d.run == [("extract", "extract: not finished (no manifest)")]
    assert not d.nothing_to_do
    # other extract settings: prepare is still done, extract runs again
    other = TINY + "extract: {batch_size: 2}\n"
    d = wplanner.decide_stages(WINDOW_STAGES["extract"], cfg_of(other), *state(finished_run(tmp_path)))
    assert [s for s, _ in d.skip] == ["prepare"] and "other settings of target_model, extract" in d.run[0][1]
    # other prepare settings: both run, extract because its input changes
    d = wplanner.decide_stages(WINDOW_STAGES["extract"], cfg_of(TINY.replace("256", "128")), manifests, sizes)
    assert [s for s, _ in d.run] == ["prepare", "extract"] and "runs after prepare" in d.run[1][1]


def test_a_listed_file_missing_or_resized_is_not_done(tmp_path):
    manifests, sizes = state(finished_run(tmp_path))
    sizes["extract/out.bin"] -= 1
    d = wplanner.decide_stages(WINDOW_STAGES["extract"], cfg_of(TINY), manifests, sizes)
    assert d.run == [("extract", "extract: 1 listed file(s) missing or of another size (e.g. extract/out.bin)")]


def test_restart_redoes_extract_but_not_a_done_prepare(tmp_path):
    manifests, sizes = state(finished_run(tmp_path))
    d = wplanner.decide_stages(WINDOW_STAGES["extract"], cfg_of(TINY), manifests, sizes, restart=True)
    assert [s for s, _ in d.skip] == ["prepare"] and [s for s, _ in d.run] == ["extract"]
    plan = wplanner.build_plan(_host(), kind="window", window_id="w", image=IMAGE, command="t", run="r",
                               stages=["extract"], restart=True)
    assert plan.stages[0].spec["command"][-1] == "--restart"


def test_train_window_refuses_when_extract_is_not_done(tmp_path):
    manifests, sizes = state(finished_run(tmp_path, stages=("prepare",)))
    d = wplanner.decide_stages(WINDOW_STAGES["train"], cfg_of(TINY), manifests, sizes, rerun_hint="`x`")
    assert d.refuse == "input `extract` of this window is not ready (extract: not finished (no manifest)): run `x` " \
                       "first" and not d.nothing_to_do


def _host():
    from eagle3ops.config import load_inventory

    return load_inventory(Path(__file__).resolve().parents[1] / "deploy/hosts.yaml").host("sandbox")


# ---- the window, on the stand-in host ------------------------------------------------------------------------------

def _put_run(world, host, run_dir: Path, name: str) -> str:
    rdir = f"{host.data_dir}/runs/{name}"
    for p in run_dir.rglob("*"):
        if p.is_file():
            world.files[f"{rdir}/{p.relative_to(run_dir)}"] = p.read_text()
    world._mkdirs(rdir)
    return rdir


def test_rerunning_a_finished_window_stops_nothing_and_writes_nothing_of_the_run(tmp_path, monkeypatch):
    host = _host()
    world = _host_with_serving(host)
    rdir = _put_run(world, host, finished_run(tmp_path), "done")
    before = {k: v for k, v in world.files.items() if k.startswith(rdir)}
    world.on_launch = lambda name: (_ for _ in ()).throw(Launched(name))
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(TINY)
    out = _cli(monkeypatch, world, "extract", "sandbox", "--run", "done", "--pipeline", str(pipeline))
    assert out.exit_code == 0, out.output
    assert "nothing to do" in out.output and "pass --restart" in out.output
    assert {k: v for k, v in world.files.items() if k.startswith(rdir)} == before
    assert not [w for w in world.writes if rdir in w], world.writes  # pipeline.yaml not rewritten either
    assert not [w for w in world.writes if " stop " in w or "--detach" in w], "serving untouched, no supervisor"
    assert not world.trials, "no stage will run: no throwaway container either"
    assert f"{host.state_dir}/lock" not in world.dirs, "lock released"
    audit = [json.loads(ln) for ln in world.files[f"{host.state_dir}/audit.jsonl"].splitlines()]
    assert audit[-1]["outcome"] == "nothing to do" and "prepare: already done" in audit[-1]["message"]


def test_partly_done_window_plans_only_the_rest_and_lists_the_skipped(tmp_path):
    host = _host()
    world = _host_with_serving(host)
    _put_run(world, host, finished_run(tmp_path, stages=("prepare",)), "half")
    plans = []

    def launched(name):
        plans.append(json.loads(next(v for k, v in world.files.items() if k.endswith("/plan.json"))))
        raise Launched(name)

    world.on_launch = launched
    events = []
    with pytest.raises(Exception, match="started on the host"):
        wrun.run_window(StandInRemote(host, world), kind="extract", image=IMAGE, expected_image_id=IMAGE_ID,
                        command="t", run="half", pipeline_text=TINY, on_event=events.append)
    assert [s["name"] for s in plans[0]["stages"]] == ["extract"]
    checks = {e["check"]: e["detail"] for e in events if e.get("step") == "preflight"}
    assert checks["stage prepare"].startswith("skip: prepare: already done for these inputs")
    assert checks["stage extract"] == "run: extract: not finished (no manifest)"
    assert checks["stage container"].startswith("extract stage's settings work")


def test_dry_run_shows_the_decision_and_the_trial(tmp_path, monkeypatch):
    host = _host()
    world = _host_with_serving(host)
    _put_run(world, host, finished_run(tmp_path, stages=("prepare",)), "half")
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(TINY)
    out = _cli(monkeypatch, world, "extract", "sandbox", "--run", "half", "--pipeline", str(pipeline), "--dry-run")
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "stage prepare" in text and "skip: prepare: already done" in text and "run: extract" in text
    assert "check=stage container detail=would run eagle3ops-" in text
    r = StandInRemote(host, world, dry_run=True)
    res = wrun.run_window(r, kind="extract", image=IMAGE, expected_image_id=IMAGE_ID, command="t", run="half",
                          pipeline_text=TINY)
    trial = [c for c in res["commands"] if " run --rm --name eagle3ops-" in c]
    assert len(trial) == 1 and "-preflight " in trial[0] and IMAGE in trial[0]
    assert [" ".join(c) for c in res["supervisor_commands"] if "--detach" in c][0].count("stage extract") == 1
    assert not world.trials, "a dry run prints the throwaway container, it does not start it"


# ---- the throwaway container is the stage container ---------------------------------------------------------------

@pytest.mark.parametrize("gpus", [0, 8])
def test_trial_argv_is_the_stage_argv_but_command_name_and_rm(gpus):
    h = _host().model_copy(update={"gpus": gpus, "stage_runtime": "nvidia", "stage_shm_size": "16g",
                                   "stage_ulimits": {"memlock": -1, "stack": "67108864"},
                                   "stage_env": {"NCCL_PROTO": "Simple"}})
    stage = st.stage_spec(h, image=IMAGE, stage="extract", run="r", window_id="w")
    stage_argv = sv.run_argv(h, stage)
    trial = st.trial_argv(h, st.trial_spec(h, image=IMAGE, run="r", window_id="w", stage="extract"))

    def strip(argv):
        a = list(argv)
        i = a.index("--name")
        del a[i:i + 2]
        a = [x for x in a if x not in ("--rm", "--detach")]
        return a[:a.index(IMAGE) + 1]  # the command follows the image

    assert strip(trial) == strip(stage_argv)
    assert "--rm" in trial and "--detach" not in trial and trial[trial.index("--name") + 1] == "eagle3ops-w-preflight"
    for flag in ("--runtime", "--shm-size", "--ulimit", "--env"):
        assert flag in trial
    assert ("--gpus" in trial and "--ipc" in trial) == bool(gpus)
    assert ("torch.cuda.device_count()" in trial[-1]) == bool(gpus) and f">= {gpus}" in trial[-1] or not gpus


def test_gpu_hosts_default_to_what_nccl_needs():
    spec = st.stage_spec(_host().model_copy(update={"gpus": 8}), image=IMAGE, stage="train", run="r", window_id="w")
    assert spec["ipc_mode"] == "host" and spec["ulimits"] == [{"Name": "memlock", "Soft": -1, "Hard": -1}]
    assert "runtime" not in spec and "shm_size" not in spec


def test_a_refused_stage_setting_fails_preflight_naming_the_inventory_key(tmp_path):
    host = _host().model_copy(update={"stage_runtime": "nvidia-nope"})
    world = _host_with_serving(host)
    world.trial_answer = (125, "", "docker: Error response from daemon: unknown or invalid runtime name: "
                                   "nvidia-nope.\n")
    world.on_launch = lambda name: (_ for _ in ()).throw(Launched(name))
    with pytest.raises(PreflightFailed) as e:
        wrun.run_window(StandInRemote(host, world), kind="extract", image=IMAGE, expected_image_id=IMAGE_ID,
                        command="t", run="new", pipeline_text=TINY)
    msg = str(e.value)
    assert "stage container" in msg and "unknown or invalid runtime name: nvidia-nope" in msg
    assert "stage_runtime" in msg and "hosts.sandbox" in msg and "nothing was stopped" in msg
    assert not [w for w in world.writes if " stop " in w or "--detach" in w]
    assert any(w.startswith("docker") and " rm --force eagle3ops-" in w for w in world.writes), "removed afterwards"


def test_trial_diagnosis_names_the_ulimit_key():
    h = _host().model_copy(update={"stage_ulimits": {"memlock": "99999999999"}})
    spec = st.stage_spec(h, image=IMAGE, stage="extract", run="r", window_id="w")
    msg = wpreflight.diagnose_trial(h, spec, 126, "docker: Error response from daemon: failed to create task for "
                                    "container: ... setrlimit(RLIMIT_MEMLOCK): operation not permitted: ulimit")
    assert "stage_ulimits" in msg and "exit 126" in msg and "memlock=99999999999:99999999999" in msg
    msg = wpreflight.diagnose_trial(h, spec, None, "")
    assert "timed out" in msg and "memlock=99999999999:99999999999" in msg


# ---- the summary carries each stage's reason ----------------------------------------------------------------------

def test_a_failed_stage_reason_is_what_the_stage_said():
    from eagle3ops.supervisor.runner import stage_error

    log = ("prepare: 8 samples\nerror: stage extract: /data/runs/r/extract holds hidden states made from other "
           "inputs; rerun with --restart\n")
    assert stage_error(log) == ("stage extract: /data/runs/r/extract holds hidden states made from other inputs; "
                                "rerun with --restart")
    tb = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n    f()\n"
          "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    assert stage_error(tb) == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert stage_error("loading model\n") == ""


def test_trial_diagnosis_blames_the_ulimit_not_the_oci_runtime():
    """runc's own words on this machine for memlock=-1 (measured on the sandbox) mention the OCI runtime too."""
    h = _host().model_copy(update={"stage_ulimits": {"memlock": -1}})
    spec = st.stage_spec(h, image=IMAGE, stage="extract", run="r", window_id="w")
    msg = wpreflight.diagnose_trial(h, spec, 125, (
        "docker: Error response from daemon: failed to create shim task: OCI runtime create failed: runc create "
        "failed: unable to start container process: error during container init: error setting rlimits for ready "
        "process: error setting rlimit type 8: operation not permitted: unknown"))
    assert "hosts.sandbox.stage_ulimits" in msg and "memlock=-1:-1" in msg and "stage_runtime" not in msg


def test_a_bad_ulimit_in_the_inventory_is_a_config_error_naming_the_key(tmp_path):
    from eagle3ops.config import ConfigError, load_inventory

    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "deploy/hosts.yaml").read_text())
    raw["hosts"]["sandbox"]["stage_ulimits"] = {"memlock": "lots"}
    inv = tmp_path / "hosts.yaml"
    inv.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as e:
        load_inventory(inv)
    assert "stage_ulimits" in str(e.value) and "memlock" in str(e.value) and "soft:hard" in str(e.value)


def test_a_finished_window_is_a_no_op_even_on_a_full_disk_and_estimates_only_what_runs(tmp_path):
    host = _host()
    world = _host_with_serving(host, free_bytes=2**20)  # 1 MiB free: any window that runs fails preflight
    _put_run(world, host, finished_run(tmp_path), "done")
    res = wrun.run_window(StandInRemote(host, world), kind="extract", image=IMAGE, expected_image_id=IMAGE_ID,
                          command="t", run="done", pipeline_text=TINY)
    assert res["outcome"] == "nothing to do"
    world = _host_with_serving(host)
    _put_run(world, host, finished_run(tmp_path / "half", stages=("prepare",)), "half")
    est = wpreflight.estimate_disk(StandInRemote(host, world), kind="extract", run="half", pipeline_text=TINY,
                                   stages=["extract"])
    assert list(est.by_stage) == ["extract"] and "100 prepared tokens" in est.basis
