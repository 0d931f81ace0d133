"""The supervisor's guard during stages, fast (serving started again is stopped again and said;
serving that keeps being started stops the stages) with the stand-in Docker client of test_supervisor_resume (the
sandbox test is tests/test_serving_stays_stopped.py)."""

from __future__ import annotations

import json

import requests

from eagle3ops.supervisor.runner import GUARD_RESTARTS_MAX, Supervisor
from test_supervisor_resume import StandInClient, _plan, gate  # noqa: F401 - gate: the stand-in health gate


def _restarter(client, polls: int):
    """An outside restarter: serving is started again during each of the stages' first ``polls`` polls (the stage
    container's wait times out, as a real poll does, while the stage runs on)."""
    state = {"n": 0}

    def on_wait():
        state["n"] += 1
        if state["n"] <= polls:
            client.serving.start()
            raise requests.exceptions.ReadTimeout("poll")

    return on_wait


def test_serving_started_again_during_a_stage_is_stopped_again(tmp_path, gate, capsys):
    from eagle3ops.console import summary

    plan, wdir = _plan(tmp_path)
    client = StandInClient()
    client.on_wait = _restarter(client, 1)
    res = Supervisor(plan, client, wdir).run()
    said = [w for w in res["warnings"] if w.startswith("serving-guard:")]
    assert len(said) == 1 and "started again during stage" in said[0] and "killed it" in said[0], res
    assert res["outcome"] == "ok" and client.serving.status == "running", res
    # the window's own stop is graceful; serving started from outside once the window stopped it is killed at once
    # (a starting vLLM does not act on SIGTERM: a graceful stop would let it run beside the stage for its timeout)
    assert client.stop_timeouts == [("vllm", plan.stop_timeout_s), ("vllm", 0)], client.stop_timeouts
    # the result names the outside restart: not a plain ok
    assert res["outside_restarts"] == 1 and "started from outside 1 time" in res["outcome_note"], res
    summary(res)
    assert "ok (serving was started from outside 1 time" in " ".join(capsys.readouterr().out.split())


def test_serving_that_keeps_being_started_stops_the_stages(tmp_path, gate):
    plan, wdir = _plan(tmp_path)
    client = StandInClient()
    client.on_wait = _restarter(client, 100)
    res = Supervisor(plan, client, wdir).run()
    assert res["outcome"] == "failed" and "kept being started" in res["error"], res
    assert len(client.stage_runs) == GUARD_RESTARTS_MAX + 1, "stopped at the first restart past the limit"
    first = plan.stages[0].name
    assert res["stages"][first] == "failed (stopped: serving kept being started)", res
    assert not [n for n in client.containers.by_name if n != "vllm"], "no stage container left"
    assert client.serving.status == "running" and res["serving_healthy"] is True
    journal = [json.loads(x) for x in (wdir / "journal.jsonl").read_text().splitlines()]
    assert [e["step"] for e in journal if e["event"] == "warn"].count("serving-guard") == GUARD_RESTARTS_MAX
