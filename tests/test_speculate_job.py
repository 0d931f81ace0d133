"""The ``speculate`` job carried out by the host's supervisor ("one host-side job"), fast: the real
window runner (:class:`eagle3ops.supervisor.runner.Supervisor`) with a ``speculate`` plan on a ``process`` host of
the serving-kind conformance suite (``test_serving_kinds.World``: the REAL restore agent), serving the STAND-IN
OpenAI server (``tests/data/standin_openai_server.py``, NOT vLLM: its speculation is simulated, a speculative
release streams ``--spec-speedup`` times faster and counts ``--spec-acceptance`` on ``/metrics``). The measurement
(:mod:`eagle3ops.gate.measure`) and the decision (:mod:`eagle3ops.gate.decide`) are the real ones.

Also pure: the serving restarts and expected downtime the plan prints (:mod:`eagle3ops.speculate.restarts`), the
journal's restart times, and the ``--dry-run`` plan of a speculate job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from eagle3ops.commands import process as pc
from eagle3ops.commands import speculate as sc
from eagle3ops.config.plan import SpeculateJob
from eagle3ops.speculate.restarts import parse_results, recorded_restart_seconds, restart_plan
from eagle3ops.supervisor.journal import restart_seconds
from secretscan import leaks, planted_args, planted_env, release_record, scan
from test_serving_kinds import MODEL, SERVER, World, _Engine, _up, _wait

KEY = planted_args()[1]  # serving's key, planted with the other secrets of secretscan


class JobWorld(World):
    """A ``process`` host whose serving is the stand-in server started with ``server_args`` (and an API key on its
    command line, as vLLM's ``--api-key``, beside the other planted secrets: ``--hf-token`` and an environment with
    ``VLLM_API_KEY``, ``HF_TOKEN`` and a name only the inventory lists)."""

    server_args: list[str] = []

    def _setup_process(self):
        bindir = self.tmp / "bin"
        bindir.mkdir()
        env = self._agent_env(bindir)
        self.pdir = self.wdir / "process"
        proc = subprocess.Popen([sys.executable, str(SERVER), "--port", str(self.port), "--model", MODEL,
                                 *planted_args(), *self.server_args],
                                cwd=self.tmp, env={"PATH": os.environ["PATH"], **planted_env()},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        threading.Thread(target=proc.wait, daemon=True).start()
        assert _wait(lambda: _up(self.port))
        subprocess.run(pc.record_process(proc.pid, str(self.pdir)), check=True, capture_output=True)
        subprocess.run(pc.start_agent(self._host(), pdir=str(self.pdir), pid=proc.pid, stop_timeout_s=5,
                                      supervisor="sup", limit_s=120), env=env, check=True, timeout=10)
        self.client = _Engine()
        self.serving = lambda: _up(self.port)
        self.extra = {"process_dir": str(self.pdir), "process_pid": proc.pid}
        self.cleanup.append(self._kill_servers)

    def live_argv(self) -> list[str]:
        for d in Path("/proc").iterdir():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if d.name.isdigit() and str(self.port).encode() in cmd and str(SERVER).encode() in cmd:
                return [c.decode() for c in cmd if c]
        return []


def stored_design(job: SpeculateJob, sup) -> dict:
    """The attempt's ``gate_design`` (the order the passes ran in), from its result file."""
    return json.loads((Path(job.results_dir) / sup.plan.window_id / "result.json").read_text())["gate_design"]


def _job(tmp: Path, **kw) -> SpeculateJob:
    results = tmp / "data/runs/r1/speculate/abcdef0123456789"
    results.mkdir(parents=True)
    return SpeculateJob(**{"run": "r1", "head": str(tmp / "head"), "head_sha256": "abcdef0123456789" * 4,
                           "results_dir": str(results), "latest": str(tmp / "data/runs/r1/speculate/result.json"),
                           "change": {"args": sc.speculative_args(num_speculative_tokens=3, cpu=True,
                                                                  model=str(tmp / "head"))},
                           "prompts": [f"def f{i}():" for i in range(4)], "levels": [1], "max_tokens": 16,
                           "passes": 3, "margin": JOB_MARGIN, "acceptance_floor": 1.5, "idle_timeout_s": 20,
                           # as serving.gate_warmup_prompts does by default: cold CI (three suites on two cores)
                           # had a freshly started speculative stand-in's first pass at 28 tok/s, the next two at
                           # 60 and 70, and the x3 "keep" undecided (interval x0.94 to x2.80)
                           "warmup_prompts": 2,
                           "request_timeout_s": 20, "figures": {"head_source": "test"}, **kw})


#: The gate margin of this test's job: wide (drift limit 15 %), because this tests the job, not the gate's
#: resolution. With 0.05 (drift limit 2.5 %) the side-by-side CI run (stop 36: the in-image suite on the same 2
#: cores) left a stand-in's x2 "keep" undecided: its baseline drifted +5.8 % to +7.0 % across three passes as the
#: other suite's load changed. x3 and x0.5 are far outside 1.3 either way.
JOB_MARGIN = 0.3


@pytest.fixture
def job_world(request, tmp_path):
    JobWorld.server_args = list(getattr(request, "param", []))
    w = JobWorld(tmp_path, "process")
    yield w
    for f in reversed(w.cleanup):
        f()


# Per-token times well above a loaded 2-core machine's scheduling jitter (tens of ms), and a clear x3 / x0.5 so the
# interval is decided either way: this tests the job, not the gate's resolution (tests/test_gate_simulation.py).
@pytest.mark.parametrize("job_world,verdict,design",
                         [(["--token-ms", "25", "--spec-speedup", "3"], "keep", "aba"),
                          (["--token-ms", "25", "--spec-speedup", "0.5"], "rollback", "aba")],
                         indirect=["job_world"], ids=["keep-aba", "rollback-aba"])
def test_the_supervisor_carries_out_the_whole_speculate_job(job_world, verdict, design, tmp_path, capfd):
    """record → baseline → switch → measure → decide → keep or switch back, journaled; the attempt folder, the
    latest copy, the window's result (restart times) and the audit line (verdict and figures) all written; the lock
    released; serving on the decided release; the keyed server measured with its key. In the three-block order
    (the two-block one runs in the sandbox's gate tests, whose inventory sets it) ``aba``: the baseline
    restarted and measured (2 passes), the speculative release measured (3), the baseline returned to and measured
    again (2), decided on the three blocks; a rejection stays on the baseline (3 restarts), a keep switches to the
    speculative release again (4).

    A production client sends requests throughout the job; ``serving.drain_hook`` takes it off (a STAND-IN load
    balancer: a file the client polls; the hooks are real argv run by the supervisor) after the record and before
    the first restart, so it never reaches a measured release (no foreign requests: the figures stay decidable), and
    ``undrain_hook`` brings it back after the decision, whichever it was. (One job for both subjects: a job of its own
    for the drain ran the same x3 stand-in for 24-33 s more of the suite.)"""
    drained = tmp_path / "lb-drained"
    stop, sent = threading.Event(), []
    client = threading.Thread(target=_client, args=(job_world.port, drained, stop, sent), daemon=True)
    client.start()
    try:
        _whole_job(job_world, verdict, design, tmp_path, capfd, drained, sent)
    finally:
        stop.set()
        client.join(15)


def _whole_job(job_world, verdict, design, tmp_path, capfd, drained: Path, sent: list[float]) -> None:
    """The body of :func:`test_the_supervisor_carries_out_the_whole_speculate_job`, its client running."""
    for _ in range(100):  # production traffic flows before the job starts
        if len(sent) >= 2:
            break
        threading.Event().wait(0.1)
    job = _job(tmp_path, design=design, drain_hook=["touch", str(drained)], undrain_hook=["rm", "-f", str(drained)])
    sup = job_world.supervisor("speculate", speculate=job, change=job.change)
    # an older window's release of another process is the state dir's current one (as on the sandbox, where each
    # kill test serves its own server): the baseline's identity must be the process this window recorded
    from eagle3ops.supervisor.releases import Releases

    old = Releases(Path(sup.plan.state_dir))
    old_n = old.add_process({"argv": ["/usr/bin/python3", "/elsewhere/old_server.py"], "environ": [], "cwd": "/",
                             "uid": "0"}, "older-window")
    old.set_current(old_n)
    lock = Path(sup.plan.state_dir) / "lock"
    lock.mkdir()
    (lock / "details.json").write_text(json.dumps({"window_id": sup.plan.window_id}))
    res = sup.run()
    attempt = res["speculate"]
    if verdict == "rollback" and attempt["verdict"] == "undecided":  # a noisy baseline on a busy machine: rolled
        verdict = "undecided"                                          # back all the same
    assert attempt["verdict"] == verdict, attempt["reason"]
    assert res["outcome"] == "ok" and res["serving_healthy"] is True and not lock.exists()
    steps = [s for s, e in job_world.steps() if e == "ok"]
    assert "measure" in steps and "decide" in steps and ("keep" in steps) == (verdict == "keep")
    if design == "ab":
        assert steps[:4] == ["record", "baseline", "health", "switch"] or steps[:3] == ["record", "baseline", "stop"]
        assert ("rollback" in steps) == (verdict != "keep")
    else:  # the pass order: each block after its own restart, the decision on all three
        order = ["record", "restart-baseline", "baseline", "switch", "measure", "rollback", "baseline-after",
                 "decide"] + (["keep-switch", "keep"] if verdict == "keep" else [])
        assert [x for x in steps if x in order] == order, steps
        assert stored_design(job, sup)["used"] == "aba"
    folder = Path(job.results_dir) / sup.plan.window_id
    stored = json.loads((folder / "result.json").read_text())
    assert stored["verdict"] == verdict and stored["head_sha256"] == job.head_sha256 and stored["interval"]
    assert json.loads(Path(job.latest).read_text())["attempt_dir"] == str(folder)
    before = len(json.loads((folder / "baseline.json").read_text())["levels"]["1"])
    if design == "ab":
        assert before == 3 and not (folder / "baseline-after.json").exists()
        assert stored["design"]["design"] == "ab" and stored["design"]["block_shift_measured"] is False
    else:
        assert before == 2 and len(json.loads((folder / "baseline-after.json").read_text())["levels"]["1"]) == 2
        assert stored["design"]["design"] == "aba" and stored["passes"] == {"baseline": 4, "speculative": 3,
                                                                            "baseline_after": 2}
        assert stored["drift"]["kind"] == "blocks" and stored["drift"]["made"] is True
        assert stored["interval"]["design"] == "aba" and stored["interval"]["df"] == 4
        assert "baseline_after" in stored["levels"]["1"]
    assert stored["spec_decode"]["mean_acceptance_length"] == pytest.approx(2.0, abs=0.05)
    # like for like: what each measured release ran, the API key on its command line redacted
    rel = stored["measured_releases"]
    assert rel["baseline"]["image"] is None and rel["speculative"]["image"] is None  # a process: no image
    assert "--speculative-config" in rel["speculative"]["argv"] and "--speculative-config" not in rel["baseline"]["argv"]
    assert "--api-key" in rel["baseline"]["argv"] and KEY not in json.dumps(rel) and stored["control"] is False
    assert "/elsewhere/old_server.py" not in json.dumps(rel) and str(SERVER) in rel["baseline"]["argv"]
    argv = job_world.live_argv()
    assert argv and ("--speculative-config" in argv) == (verdict == "keep")
    assert stored["live_release"] == (stored["speculative_release"] if verdict == "keep"
                                      else stored["baseline_release"])
    restarts = {("ab", "keep"): 1, ("ab", "rollback"): 2, ("aba", "keep"): 4, ("aba", "rollback"): 3}
    assert len(res["restarts_s"]) == restarts[design, verdict if verdict == "keep" else "rollback"], res["restarts_s"]
    assert all(s > 0 for s in res["restarts_s"])
    from eagle3ops.speculate.restarts import restarts_for  # the plan's count is the one the job made
    assert restarts_for(design)[0 if verdict == "keep" else 1] == len(res["restarts_s"])
    # a plain rollback afterwards: after a keep, the release live before it; after a rollback (or undecided), the
    # release production kept before the recorded one: the speculative release, measured only, is passed over
    target, why = old.rollback_target(old.current())
    if verdict == "keep":
        assert target == stored["baseline_release"], why
    else:
        assert target == old_n and f"passed over: {stored['speculative_release']} (" in why, why
    audit = [json.loads(x) for x in (Path(sup.plan.state_dir) / "audit.jsonl").read_text().splitlines()]
    assert audit[-1]["kind"] == "speculate" and audit[-1]["verdict"] == verdict
    assert audit[-1]["figures"]["spec_decode"]["drafts"] > 0 and KEY not in json.dumps(audit)
    # the stand-in answers every prompt alike on both releases: every greedy answer agrees (result and audit)
    agree = stored["answer_agreement"]["1"]
    assert agree["identical"] == agree["prompts"] > 0 and agree["differing"] == []
    assert agree["baseline_self"]["share"] == 1
    assert audit[-1]["figures"]["answer_agreement"] == stored["answer_agreement"]
    assert KEY not in (folder / "result.json").read_text() + (folder / "baseline.json").read_text()
    # serving's planted secrets (secretscan): in no file of the state dir or of the run's data (the attempt folder)
    # but the release records, nor in the supervisor's log
    found = scan([tmp_path], allowed=lambda p: release_record(p) or p.name == "serving.log"
                 or p.parent.name == "bin" or p.name == "supervisor-state")
    assert found == {}, found
    assert leaks("".join(capfd.readouterr())) == []
    # the drain: no foreign request in any measured pass; the client served before the drain and after the undrain,
    # never in between (the hooks journaled: drain after the record and before the first restart, undrain after the
    # decision and its last restart)
    sides = [s for s in ("baseline", "speculative", "baseline_after") if s in attempt["levels"]["1"]]
    assert sides[:2] == ["baseline", "speculative"], attempt["levels"]["1"].keys()
    assert all(p["foreign_requests"] == 0 for lv in attempt["levels"].values() for s in sides for p in lv[s]["passes"])
    t = {f"{e['step']} {e['event']}": e["epoch"] for e in sup.journal.entries}
    assert t["record ok"] <= t["drain ok"] <= t["restart-baseline start"] <= t["baseline start"]
    assert max(t["decide ok"], t.get("keep ok", 0)) <= t["undrain start"] <= t["undrain ok"]
    assert any(x < t["drain start"] for x in sent)
    assert not [x for x in sent if t["drain ok"] < x < t["undrain start"]]
    deadline = t["undrain ok"] + 10
    while not any(x > t["undrain ok"] for x in sent) and time_now() < deadline:
        threading.Event().wait(0.1)
    assert any(x > t["undrain ok"] for x in sent) and not drained.exists()
    assert attempt["drain"]["undrain_error"] is None


@pytest.mark.parametrize("job_world", [["--token-ms", "5", "--spec-crash-on-grammar"]], indirect=True,
                         ids=["crash"])
def test_a_speculative_release_that_crashes_on_grammar_traffic_is_rolled_back_with_its_reason(job_world,
                                                                                               tmp_path):
    """The gate replays a chat body with ``response_format`` through ``/v1/chat/completions``; the stand-in's
    speculative release dies on it (as vLLM's engine does with EAGLE-3 and a grammar backend), the baseline
    answers it: the job rolls back, its reason naming the endpoint and the failure, serving back on the baseline."""
    chat = {"messages": [{"role": "user", "content": "Reply in JSON."}], "response_format": {"type": "json_object"}}
    job = _job(tmp_path, prompts=["def f0():", "def f1():", chat], max_tokens=8, warmup_prompts=0,
               idle_timeout_s=10)
    sup = job_world.supervisor("speculate", speculate=job, change=job.change)
    res = sup.run()
    attempt = res["speculate"]
    assert attempt["verdict"] == "rollback", attempt["reason"]
    assert "speculative release" in attempt["reason"] and "/v1/chat/completions" in attempt["reason"]
    assert res["outcome"] == "ok" and res["serving_healthy"] is True
    argv = job_world.live_argv()
    assert argv and "--speculative-config" not in argv  # back on the baseline
    assert attempt["live_release"] == attempt["baseline_release"]
    assert attempt["traffic"]["endpoints"] == {"/v1/completions": 2, "/v1/chat/completions": 1}
    steps = [s for s, e in job_world.steps() if e == "ok"]
    assert "baseline" in steps and "rollback" in steps and "keep" not in steps
    audit = json.loads((Path(sup.plan.state_dir) / "audit.jsonl").read_text().splitlines()[-1])
    assert audit["verdict"] == "rollback" and "/v1/chat/completions" in audit["reason"]


def test_a_second_attempt_of_the_same_head_keeps_the_first(tmp_path):
    """Attempts are folders under the head's sha256, one per window: a later window never overwrites one."""
    job = _job(tmp_path)
    first = Path(job.results_dir) / "20260101T000000Z-speculate-aaaaaa"
    first.mkdir()
    (first / "result.json").write_text('{"verdict": "keep"}')
    from eagle3ops.supervisor.speculate import SpeculateRun

    class Sup:
        plan = type("P", (), {"speculate": job, "window_id": "20260102T000000Z-speculate-bbbbbb", "secret_env": []})()

    run = SpeculateRun(Sup())  # type: ignore[arg-type]
    assert run.dir.parent == first.parent and run.dir != first
    run._write(run.dir / "result.json", {"verdict": "rollback"})
    assert json.loads((first / "result.json").read_text()) == {"verdict": "keep"}


# --- pure: restarts and expected downtime ------------------------------------------------------------------------

def test_restart_times_come_from_the_journal_and_the_results():
    j = [{"step": "restore", "event": "start", "epoch": 10.0}, {"step": "health", "event": "ok", "epoch": 30.0},
         {"step": "restore", "event": "ok", "epoch": 31.0}, {"step": "switch", "event": "start", "epoch": 40.0},
         {"step": "switch", "event": "error", "epoch": 45.0}, {"step": "rollback", "event": "start", "epoch": 46},
         {"step": "rollback", "event": "ok", "epoch": 60.0}]
    assert restart_seconds(j) == [21.0, 14.0]  # a failed switch is no restart time
    control = [{"step": "control", "event": "start", "epoch": 0.0}, {"step": "control", "event": "ok", "epoch": 30.0}]
    assert restart_seconds(control + j) == [30.0, 21.0, 14.0]  # a speculate job's control release is one
    text = (json.dumps({"window_id": "b", "restarts_s": [30.0, 50.0]}, indent=2) + "\n"
            + json.dumps({"window_id": "a", "downtime_s": 100.0, "stage_seconds": {"extract": 60.0}}) + "\n{cut")
    results = parse_results(text)
    assert [r["window_id"] for r in results] == ["b", "a"]
    assert recorded_restart_seconds(results) == [40.0, 30.0, 50.0]  # older window first, pre-field figure derived


def test_the_plan_prints_restarts_and_expected_downtime():
    p = restart_plan([40.0, 30.0, 50.0], bound_s=600)
    assert (p.keep, p.rollback, p.per_restart_s, p.downtime_s(1), p.downtime_s(2)) == (1, 2, 40.0, 40.0, 80.0)
    line = p.lines()[0]
    assert "1 if kept, 2 if rolled back" in line and "40 s if kept, 80 s if rolled back" in line
    assert "3 recorded restarts" in line
    none = restart_plan([], bound_s=600).lines()[0]
    assert "no serving restart recorded" in none and "600 s / 1200 s" in none


def _client(port: int, drained: Path, stop: threading.Event, sent: list[float]) -> None:
    """A production client: a short completion after another, except while ``drained`` exists (the stand-in load
    balancer's state: the drain hook creates it, the undrain hook removes it); ``sent`` gets each request's time."""
    import time

    import httpx

    while not stop.is_set():
        if drained.exists():
            time.sleep(0.05)
            continue
        sent.append(time.time())
        try:  # streamed, as vLLM clients do (the stand-in counts streamed requests as running, as vLLM does)
            with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", timeout=10,
                              headers={"Authorization": f"Bearer {KEY}"},
                              json={"model": MODEL, "prompt": "hello", "max_tokens": 8, "stream": True}) as r:
                for _ in r.iter_lines():
                    pass
        except httpx.HTTPError:
            time.sleep(0.1)  # serving restarting


def time_now() -> float:
    import time

    return time.time()


def test_a_failing_drain_hook_ends_the_job_before_any_restart(tmp_path):
    JobWorld.server_args = ["--token-ms", "5"]
    w = JobWorld(tmp_path, "process")
    try:
        undrained = tmp_path / "undrained"
        job = _job(tmp_path, drain_hook=["sh", "-c", "echo lb says no >&2; exit 3"],
                   undrain_hook=["touch", str(undrained)])
        sup = w.supervisor("speculate", speculate=job, change=job.change)
        res = sup.run()
        attempt = res["speculate"]
        assert attempt["verdict"] == "error" and "drain hook sh exited 3: lb says no" in attempt["reason"]
        assert res["outcome"] == "failed" and undrained.exists()  # undrain ran all the same
        steps = [s for s, e in w.steps() if e == "ok"]
        assert "switch" not in steps and "baseline" not in steps and w.serving()
        assert "--speculative-config" not in w.live_argv()
    finally:
        for f in reversed(w.cleanup):
            f()


# --- several candidates in one job ---------------------------------------------------------------------

def _candidate(name: str, speedup: str, ngram: bool = False) -> dict:
    """A candidate whose simulated speed-up is set by the STAND-IN server's ``--spec-speedup`` (vLLM has no such
    flag: it stands for what the method and k would do to throughput)."""
    args = (sc.ngram_args(num_speculative_tokens=3, cpu=True) if ngram
            else sc.speculative_args(num_speculative_tokens=int(name[-1]), cpu=True, model="/head"))
    return {"name": name, "change": {"args": [*args, "--spec-speedup", speedup]}}


# (A second job here, two candidates at x1 and x0.9 that none clears, took ~39 s: its decision and what it leaves are
# checked on the stand-in container host of test_a_candidate_that_fails_its_gate_does_not_stop_the_return_to_the_live_
# release, where no candidate clears either; its return to the recorded process is the kind's return_to, which the
# rollback job above runs on this process host.)
@pytest.mark.parametrize("job_world,speedups,winner", [
    (["--token-ms", "25"], {"eagle3-k2": "1.5", "eagle3-k3": "3", "ngram-k3": "1"}, "eagle3-k3")],
    indirect=["job_world"], ids=["best-of-three"])
def test_the_job_measures_every_candidate_and_confirms_the_best(job_world, speedups, winner, tmp_path):
    """Each candidate switched to (never the live release) and measured against one baseline at the corrected level
    (1 - 0.10 / m), the best that clears the rule switched to again and measured afresh (the confirmation decides);
    when none clears, serving goes back to the recorded process. On a ``process`` host: each switch is the restore
    agent's next round."""
    from eagle3ops.gate.decide import candidate_level

    cands = [_candidate(n, x, ngram=n.startswith("ngram")) for n, x in speedups.items()]
    job = _job(tmp_path, candidates=cands, change=cands[0]["change"])
    sup = job_world.supervisor("speculate", speculate=job, change=job.change)
    res = sup.run()
    attempt = res["speculate"]
    rows = {r["name"]: r for r in attempt["candidates"]["rows"]}
    assert list(rows) == list(speedups) and attempt["candidates"]["level"] == pytest.approx(candidate_level(len(cands)))
    assert all(r["interval"]["level"] == pytest.approx(candidate_level(len(cands))) for r in rows.values())
    from eagle3ops.supervisor.speculate import choose_candidate

    # The job picks by the rule from what it measured; a stall on a loaded CI machine can only widen an interval
    # downwards (one slow pass), never keep a candidate at or below x1. A widened interval can leave the expected
    # winner undecided (CI stop 38: the x3 candidate's passes 94, 24 and 87 tok/s, x0.51 to x2.80, so the x1.5 one
    # won) or kept with a lower bound below another kept candidate's (CI stop 43: passes 86, 61 and 91 tok/s against
    # 36, its lower bound under the x1.5 one's x1.395, so the rule chose that one). Either way its upper bound stays
    # above the winner's: a job that measured the x3 candidate as slow as the x1.5 one (the wrong release, a pass
    # before its restart) fails here, not excused as noise.
    chosen = choose_candidate(list(rows.values()))
    assert attempt["candidates"]["winner"] == (chosen["name"] if chosen else None) and res["serving_healthy"] is True
    assert all(rows[n]["verdict"] != "keep" for n, x in speedups.items() if float(x) <= 1.0)
    if winner and attempt["candidates"]["winner"] != winner:
        got = attempt["candidates"]["winner"]
        print(f"noise: the x{speedups[winner]} candidate {winner} measured {rows[winner]['verdict']} "
              f"({rows[winner]['reason']}); the job chose {got} by the rule")
        if got is None:
            assert rows[winner]["verdict"] == "undecided", rows[winner]["reason"]
        else:
            assert float(speedups[got]) > 1.0
            assert rows[winner]["interval"]["high"] > rows[got]["interval"]["high"], (rows[winner], rows[got])
        winner = got
    assert attempt["candidates"]["winner"] == winner
    folder = Path(job.results_dir) / sup.plan.window_id
    assert all((folder / f"candidate-{n}.json").is_file() for n in speedups)
    argv = job_world.live_argv()
    steps = [s for s, e in job_world.steps() if e == "ok"]
    assert [s for s in steps if s.startswith("candidate-")] == [f"candidate-{n}" for n in speedups]
    if winner:
        assert attempt["reason"].startswith(f"candidate {winner}, confirmed afresh")
        assert (folder / "speculative.json").is_file() and attempt["interval"]["level"] == pytest.approx(0.9)
        if attempt["verdict"] == "undecided":  # the confirmation widened by a stall, as above: rolled back
            # (CI run of 2026-12-06: the x3 confirmation's passes 97, 98 and 30 tok/s, x0.564 to x2.928)
            print(f"noise: the confirmation of {winner} measured undecided ({attempt['reason']})")
            assert "--spec-speedup" not in argv and "--speculative-config" not in argv
            # each candidate, the winner again, then back to the recorded process
            assert len(res["restarts_s"]) == len(cands) + 2
        else:
            assert len(res["restarts_s"]) == len(cands) + 1  # each candidate, then the winner again
            assert attempt["verdict"] == "keep", attempt["reason"]
            assert argv[argv.index("--spec-speedup") + 1] == speedups[winner]
    else:
        assert attempt["verdict"] == "rollback" and "no candidate cleared the gate" in attempt["reason"]
        assert "--spec-speedup" not in argv and "--speculative-config" not in argv
        assert not (folder / "speculative.json").exists()
        assert len(res["restarts_s"]) == len(cands) + 1  # each candidate, then back to the recorded process
    audit = json.loads((Path(sup.plan.state_dir) / "audit.jsonl").read_text().splitlines()[-1])
    assert audit["figures"]["candidates"]["winner"] == winner
    # candidates never become live; the confirmed one counts only when kept: a plain rollback afterwards returns to
    # the release live before the job when it was kept, and else finds nothing production kept before that one
    from eagle3ops.supervisor.releases import Releases

    rels = Releases(Path(sup.plan.state_dir))
    target, why = rels.rollback_target(rels.current())
    if attempt["verdict"] == "keep":
        assert target == attempt["baseline_release"] and target != attempt["speculative_release"], why
    else:
        assert target is None and why.endswith("name one with --to N"), why


def test_the_candidate_with_the_highest_lower_bound_is_chosen():
    from eagle3ops.supervisor.speculate import choose_candidate

    rows = [{"name": "a", "verdict": "keep", "interval": {"low": 1.10}, "throughput_ratio": 1.5},
            {"name": "b", "verdict": "keep", "interval": {"low": 1.20}, "throughput_ratio": 1.3},
            {"name": "c", "verdict": "undecided", "interval": {"low": 1.40}, "throughput_ratio": 2.0}]
    assert choose_candidate(rows)["name"] == "b"  # c is not kept at the corrected level, whatever its point
    assert choose_candidate([rows[2]]) is None and choose_candidate([]) is None


def _fake_answer(tok_s: float, accepted: float) -> dict:
    """A :func:`eagle3ops.gate.measure.measure` answer: 3 passes of 4 prompts x 16 tokens at concurrency 1 at
    ``tok_s`` (+-1 % per pass), the spec-decode counters moving by ``accepted`` over 10 drafts of 3 tokens."""
    from dataclasses import asdict

    from eagle3ops.gate.replay import LevelResult

    levels, counters = [], []
    for i, n in enumerate((1.0, 1.01, 0.99)):
        wall = 64 / (tok_s * n)
        levels.append(asdict(LevelResult(1, 4, 0, 64, wall, round(64 / wall, 3), 20.0, 25.0, 100.0, 0, (16,) * 4,
                                         (wall / 4,) * 4, (100.0,) * 4)))
        zero = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "accepted_per_pos": {}, "requests_running": 0}
        counters.append([zero, {"drafts": 10.0, "draft_tokens": 30.0, "accepted": accepted,
                                "accepted_per_pos": {"0": accepted}, "requests_running": 0}])
    return {"levels": {"1": levels}, "counters": {"1": counters}, "server": {"version": "0.16.0"}}


def test_a_candidate_that_fails_its_gate_does_not_stop_the_return_to_the_live_release(tmp_path, monkeypatch):
    """Container serving (the STAND-IN Docker client and health gate of tests/test_supervisor_resume.py; the
    measurement replaced by figures that depend on the serving image): candidate ``a`` fails its health gate (the
    kind rolls it back), ``b`` passes it and is measured slower; no candidate clears the gate, so the job must
    recreate the release live before, although the journal already holds ``a``'s rollback."""
    import eagle3ops.supervisor.speculate as supspec
    from eagle3ops.config.plan import Plan, HealthCheck
    from eagle3ops.health import GateFailed
    from eagle3ops.supervisor.runner import Supervisor
    from test_supervisor_resume import StandInClient

    def fake_gate(self, timeout_s=None):
        c = self._serving()
        if c is None or c.status != "running" or c.spec["image"] == "cand-a:1":
            raise GateFailed(f"gate failed for {c and c.spec['image']}")
        self.journal.log("health", "ok")

    monkeypatch.setattr(Supervisor, "gate", fake_gate)
    speeds = {"vllm:1": 50.0, "cand-b:1": 30.0}
    monkeypatch.setattr(supspec, "measure_serving", lambda sup, job, passes=None: _fake_answer(
        speeds[sup.client.serving.spec["image"]], 5.0))
    cands = [{"name": "a", "change": {"image": "cand-a:1", "args": ["--speculative-config", "{}"]}},
             {"name": "b", "change": {"image": "cand-b:1", "args": ["--speculative-config", "{}"]}}]
    job = _job(tmp_path, candidates=cands, change=cands[0]["change"], levels=[1], acceptance_floor=1.0)
    plan = Plan(window_id="w1", kind="speculate", host="h", user="u", command="c", state_dir=str(tmp_path / "state"),
                serving_container="vllm", health=HealthCheck(port=1, model="m", timeout_s=1), speculate=job,
                change=job.change)
    (tmp_path / "w1").mkdir()
    client = StandInClient("vllm:1")
    sup = Supervisor(plan, client, tmp_path / "w1")
    res = sup.run()
    attempt = res["speculate"]
    rows = {r["name"]: r["verdict"] for r in attempt["candidates"]["rows"]}
    assert rows == {"a": "rollback", "b": "undecided"} and attempt["verdict"] == "rollback", attempt["reason"]
    assert client.serving.spec["image"] == "vllm:1" and client.serving.status == "running"
    assert attempt["live_release"] == attempt["baseline_release"]
    # none cleared: the decision and what it leaves (the process host's own run of it measured two more candidates
    # for ~39 s; its return to the recorded process is the kind's return_to, run on a process host by the rollback
    # job above, and the candidates' rounds there by the best-of-three job below)
    assert attempt["reason"].startswith("no candidate cleared the gate at the corrected 95.0% level: a: rollback; "
                                        "b: undecided"), attempt["reason"]
    assert attempt["candidates"]["winner"] is None
    folder = Path(job.results_dir) / "w1"
    assert (folder / "candidate-b.json").is_file() and not (folder / "speculative.json").exists()
    # a's rollback (its failed switch is no restart), b's switch, then the return to the release live before
    assert len(res["restarts_s"]) == 3, res["restarts_s"]
    steps = [e["step"] for e in sup.journal.entries if e["event"] == "start"]
    assert steps.count("rollback") == 2 and "keep" not in steps and "switch" not in steps, steps


@pytest.mark.parametrize("methods,ks,error", [
    (("foo",), (), "--method foo: name one or more of eagle3, ngram"),
    ((), (), "--method (none)"),
    (("eagle3",), (0,), "--k 0: each speculative length from 1 to 8"),
    (("eagle3",), (9,), "--k 9"),
    (("eagle3",), (2, 2), "2 given twice"),
    (("ngram",), (3,), "to gate n-gram alone, with no head: `eagle3ops release HOST --gate"),
    (("eagle3", "ngram"), (1, 2, 3, 4), "8 candidates; at most 6"),
], ids=["unknown", "none", "k0", "k9", "twice", "ngram-alone", "too-many"])
def test_methods_and_lengths_are_refused_before_the_host_is_read(methods, ks, error):
    from eagle3ops.speculate.ship import SpeculateError, SpeculateOptions, check_candidate_options

    opts = SpeculateOptions(run="r1", pipeline_image="p", methods=methods, ks=ks)
    with pytest.raises(SpeculateError, match=error.replace("(", r"\(").replace(")", r"\)")):
        check_candidate_options("h", opts)
    assert check_candidate_options("h", SpeculateOptions(run="r1", pipeline_image="p", methods=("eagle3", "ngram"),
                                                         ks=(2, 3))) == 4


def test_draft_tp_candidates_are_eagle3_only_and_one_or_the_targets_tp():
    """``--draft-tp 1,8`` (on a PCIe host like the seeds' the draft's TP matters most): one EAGLE-3
    candidate per draft TP, each ``--speculative-config`` carrying ``draft_tensor_parallel_size``; n-gram has no
    draft model, so it stays one candidate per k; a TP other than 1 or the target's (from serving.args) is refused
    naming both, and the count bound covers the product."""
    from eagle3ops.config import load_inventory
    from eagle3ops.speculate.ship import SpeculateError, SpeculateOptions, candidates_for, check_candidate_options

    h = load_inventory(Path(__file__).resolve().parents[1] / "deploy/hosts.yaml").host("sandbox")
    h8 = h.model_copy(update={"serving": h.serving.model_copy(update={"args": [*h.serving.args,
                                                                              "--tensor-parallel-size", "8"]})})
    opts = SpeculateOptions(run="r1", pipeline_image="p", methods=("eagle3", "ngram"), ks=(3,), draft_tps=(1, 8))
    assert check_candidate_options("h", opts) == 3
    cands = candidates_for(h8, opts, "/heads/x", 3, "img")
    assert [c.name for c in cands] == ["eagle3-k3-dtp1", "eagle3-k3-dtp8", "ngram-k3"]
    cfgs = [json.loads(c.change.args[c.change.args.index("--speculative-config") + 1]) for c in cands]
    assert [c.get("draft_tensor_parallel_size") for c in cfgs] == [1, 8, None]
    assert cfgs[2]["method"] == "ngram" and cfgs[0]["num_speculative_tokens"] == 3
    with pytest.raises(SpeculateError, match=r"--draft-tp 4: .* 1 or the target's \(8, from hosts.sandbox."):
        candidates_for(h8, SpeculateOptions(run="r1", pipeline_image="p", draft_tps=(1, 4)), "/heads/x", 3, "img")
    with pytest.raises(SpeculateError, match="--draft-tp 8: .* target's \\(1"):
        candidates_for(h, SpeculateOptions(run="r1", pipeline_image="p", draft_tps=(8,)), "/heads/x", 3, "img")
    with pytest.raises(SpeculateError, match="8 candidates; at most 6"):
        check_candidate_options("h", SpeculateOptions(run="r1", pipeline_image="p", ks=(1, 2, 3, 4),
                                                      draft_tps=(1, 8)))
    assert [c.name for c in candidates_for(h, SpeculateOptions(run="r1", pipeline_image="p"), "/x", 2, "i")] == \
        ["eagle3-k2"]


def test_the_speculate_command_refuses_bad_lists_before_the_host(tmp_path):
    """``--k 2,`` and ``--draft-tp x`` are usage errors (exit 2) naming the option, before the inventory is read."""
    from typer.testing import CliRunner

    from eagle3ops import cli

    for words, option in ((["--k", "2,"], "--k"), (["--draft-tp", "x"], "--draft-tp"),
                          (["--draft-tp", "0"], "--draft-tp")):
        res = CliRunner().invoke(cli.app, ["speculate", "h", "--run", "r", *words, "--inventory",
                                           str(tmp_path / "missing.yaml")])
        assert res.exit_code == 2 and option in res.output, res.output
