"""The host-side supervisor without an engine (a plan of the venv runtime, ``serving: none``): stages as
processes on this machine (no SSH, no Docker client at all): outcomes, the stage's own ``error:`` line, the stage
limit stopping the whole process group, the environment and cwd, resume of a finished stage, the pid file."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from eagle3ops.config.plan import Plan, StageStep
from eagle3ops.supervisor.runner import Supervisor


def _step(tmp_path: Path, name: str, code: str, timeout_s: float = 30, env: dict | None = None) -> StageStep:
    return StageStep(name=name, timeout_s=timeout_s, spec={
        "name": f"eagle3ops-w1-{name}", "runtime": "venv", "image": "venv:sha256:" + "b" * 64,
        "argv": [sys.executable, "-c", code], "environment": {"NCCL_PROTO": "LL", **(env or {})},
        "cwd": str(tmp_path / "data" / "runs" / "r1")})


def _run(tmp_path: Path, *steps: StageStep, secret_env: list[str] | None = None) -> tuple[dict, Path]:
    (tmp_path / "state").mkdir(exist_ok=True)
    wdir = tmp_path / "state" / "windows" / "w1"
    wdir.mkdir(parents=True, exist_ok=True)
    plan = Plan(window_id="w1", kind="window", host="h", user="u", command="c", state_dir=str(tmp_path / "state"),
                serving_container="", serving_kind="none", health=None, stages=list(steps), runtime="venv",
                secret_env=secret_env or [])
    return Supervisor(plan, None, wdir).run(), wdir


def test_stages_run_as_processes_with_their_environment_and_cwd(tmp_path):
    code = ("import json, os; json.dump({'cwd': os.getcwd(), 'nccl': os.environ['NCCL_PROTO'], "
            "'sid': os.getsid(0) == os.getpid()}, open('seen.json', 'w')); print('stage ran')")
    res, wdir = _run(tmp_path, _step(tmp_path, "prepare", code))
    assert res["outcome"] == "ok" and res["stages"] == {"prepare": "ok"}, res
    seen = json.loads((tmp_path / "data/runs/r1/seen.json").read_text())
    assert seen == {"cwd": str(tmp_path / "data/runs/r1"), "nccl": "LL", "sid": True}  # its own session
    assert "stage ran" in (wdir / "prepare.log").read_text()
    again, _ = _run(tmp_path, _step(tmp_path, "prepare", "raise SystemExit(9)"))  # resumed: done stays done
    assert again["outcome"] == "ok" and again["stages"] == {"prepare": "ok (earlier)"}


def test_a_failed_stage_carries_its_error_line_and_stops_the_window(tmp_path):
    bad = _step(tmp_path, "prepare", "print('error: datasets: x.jsonl not found; put it in the run dir'); "
                                     "raise SystemExit(2)")
    res, _ = _run(tmp_path, bad, _step(tmp_path, "extract", "pass"))
    assert res["outcome"] == "failed" and "extract" not in res["stages"], res
    assert res["stages"]["prepare"] == "failed (exited 2: datasets: x.jsonl not found; put it in the run dir)"


def test_the_stage_limit_stops_the_whole_process_group(tmp_path):
    child = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(60)']); open({str(child)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    t0 = time.monotonic()
    res, _ = _run(tmp_path, _step(tmp_path, "extract", code, timeout_s=2))
    assert res["stages"]["extract"] == "failed (timed out after 2s)", res
    assert time.monotonic() - t0 < 30
    pid = int(child.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            state = Path(f"/proc/{pid}/status").read_text()
            if "\nState:\tZ" in state:
                break
        except (ProcessLookupError, FileNotFoundError):
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the stage's child {pid} outlived the stage's limit")


def test_a_missing_environment_python_is_a_failed_stage_not_a_crash(tmp_path):
    step = _step(tmp_path, "prepare", "pass")
    step.spec["argv"] = [str(tmp_path / "env/bin/eagle3ops-stage"), "prepare"]
    res, _ = _run(tmp_path, step)
    assert res["outcome"] == "failed" and "could not start" in res["stages"]["prepare"], res


def test_the_supervisor_entry_point_writes_its_pid_file(tmp_path):
    from eagle3ops.supervisor.__main__ import main

    (tmp_path / "state").mkdir()
    wdir = tmp_path / "state/windows/w1"
    wdir.mkdir(parents=True)
    plan = Plan(window_id="w1", kind="window", host="h", user="u", command="c", state_dir=str(tmp_path / "state"),
                serving_container="", serving_kind="none", health=None, runtime="venv",
                stages=[_step(tmp_path, "vocab", "pass")])
    (wdir / "plan.json").write_text(plan.model_dump_json())
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert main([str(wdir / "plan.json")]) == 0
    finally:  # main() installs the supervisor's handlers: give pytest its own back
        for s, handler in saved.items():
            signal.signal(s, handler)
    assert (wdir / "supervisor.pid").read_text().strip() == str(os.getpid())
    assert json.loads((wdir / "result.json").read_text())["outcome"] == "ok"


def test_a_stage_process_log_is_written_with_its_secrets_masked(tmp_path):
    """A venv stage process that prints serving's secrets (its arguments and environment, as an engine echoing its
    configuration does) and fails naming one: ``<stage>.log`` holds every line with each secret masked by the one
    redaction rule (the inventory-named ``ORG_TOKEN`` included), and so does the window's result."""
    from secretscan import ORG_NAME, leaks, planted_args, planted_env

    words = " ".join(planted_args()) + " " + " ".join(f"{k}={v}" for k, v in planted_env().items())
    code = (f"import sys; print('engine args:', {words!r}); print('partial --hf-token', {planted_args()[-1]!r}, "
            f"end='', flush=True); print(file=sys.stderr); print('error: rejected --api-key=' + {planted_args()[1]!r});"
            " raise SystemExit(3)")
    step = _step(tmp_path, "prepare", code, env=planted_env())
    res, wdir = _run(tmp_path, step, secret_env=[ORG_NAME])
    text = (wdir / "prepare.log").read_text()
    assert "engine args: --api-key *** --api-key=*** --hf-token *** VLLM_API_KEY=***" in text, text
    assert leaks(text) == [] and leaks(json.dumps(res)) == [], (text, res)
    # (the rule masks a flag's value up to the next blank: the outcome's closing parenthesis goes with it)
    assert res["stages"]["prepare"].startswith("failed (exited 3: rejected --api-key=***"), res
