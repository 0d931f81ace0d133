"""``eagle3ops cycle``: the plan (pure), the journal's resume after a killed driver, a dead work host named, and a head
below the acceptance floor on the work host ending the cycle before production is reached.

STAND-INS (named): the step runners of ``test_killed_driver_*``, ``test_dead_work_host_*`` and ``test_head_below_*``
are STAND-IN runners that record which step ran instead of running the step's command (the commands are the existing
``regenerate``/``weights``/``extract``/``train``/``speculate``/``report``, each tested on its own); the head's served
acceptance is measured against the STAND-IN OpenAI server (``tests/data/standin_openai_server.py``, NOT vLLM: its
speculation is simulated with ``--spec-acceptance``) through the speed gate's real client and ``/metrics`` parser.
The acceptance step end to end (``test_served_acceptance_*``) replays that STAND-IN server, serving as production's
``process``, on a "work host" that is this machine (its real argv run through this machine's executor); the
stand-in head is a ``config.json`` only (the stand-in server does not read it).
The journal and its lock are real files written through this machine's executor (the same argv as on a host).
A step's command run through the real child runner (``StepChild``: its shell wrapper, log, status file, adoption)
is a STAND-IN command in ``test_killed_driver_*`` (``_STANDIN_SH``, an ``sh`` loop) and
``test_killed_drivers_running_command_*`` (``_STANDIN_STEP``, a Python script), NOT eagle3ops; the server a killed
driver left on the work host in ``test_served_acceptance_*`` is a STAND-IN ``sleep`` session. A dead work host in
``test_dead_work_host*`` is a STAND-IN ``alive`` answer (except ``..._is_named_and_the_rerun_leaves_it_out``: a real
SSH connection refused).
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from eagle3ops import executor
from eagle3ops.fleet.plan import FleetHost, HostRates, plan_fleet
from eagle3ops.config.inventory import FleetConfig
from eagle3ops.speculate import cycle as cy
from eagle3ops.speculate import cyclerun as cr
from eagle3ops.speculate.restarts import restart_plan

REPO = Path(__file__).resolve().parents[1]
RATES = HostRates(tokens_per_s=100.0, fixed_s=30.0, stage_fixed_s=20.0, window_id="w")


def _opts() -> cy.CycleOptions:
    return cy.CycleOptions(run="r1", inventory=Path("inv.yaml"), pipeline=Path("pipe.yaml"),
                           datasets=(Path("chats.jsonl"),), link_mbit=800.0)


def _facts(dead: tuple[str, ...] = (), recorded=(40.0, 50.0, 70.0)) -> cy.CycleFacts:
    hosts = [FleetHost("w1", None, 3600.0, 0.0, RATES), FleetHost("w2", None, 3600.0, 0.0, RATES)]
    ex = plan_fleet("r1", hosts, 100, 10_000, tokens_exact=True, limits={}, policy=FleetConfig())
    work = (cy.WorkFacts("w1", 0, 0, 0.0), cy.WorkFacts("w2", 2_000_000_000, 3, 20.5))
    return cy.CycleFacts("prod", work, restart_plan(list(recorded), bound_s=600.0), 1.3, ex, None, dead, 600.0)


def test_plan_is_a_pure_value_from_the_recorded_facts() -> None:
    plan = cy.plan_cycle(_facts(), _opts())
    keys = [s.key for s in plan.steps]
    assert keys == ["regenerate", "dataset", "weights:w1", "weights:w2", "extract", "train", "acceptance",
                    "speculate", "report"]
    assert cy.plan_cycle(_facts(), _opts()) == plan  # same facts, same plan
    # weights: present on w1 (skipped, no bytes), the copy plan's bytes and seconds on w2
    w1, w2 = plan.step("weights:w1"), plan.step("weights:w2")
    assert (w1.send_bytes, w1.expected_s) == (0, 0.0) and "skipped" in w1.note
    assert (w2.send_bytes, w2.expected_s) == (2_000_000_000, 20.5)
    assert list(w2.argv[3:]) == ["weights", "w2", "--from", "prod", "--link-mbit", "800.0", "--inventory", "inv.yaml"]
    # extract: two shards of 50 samples / 5,000 tokens at once on the two work hosts: 20 s + 5,000 / 100 tok/s
    assert plan.step("extract").expected_s == pytest.approx(20.0 + 5_000 / 100.0)
    assert plan.step("extract").hosts == ("w1", "w2") and "--merged" in plan.step("extract").argv
    assert plan.step("train").hosts == ("w1",) and "--from-fleet" in plan.step("train").argv
    assert plan.step("acceptance").hosts == ("w1",) and plan.step("acceptance").argv is None
    # production: only the speed gate restarts it; median of the recorded restarts (50 s)
    assert {s.key: s.restarts for s in plan.steps if any(s.restarts)} == {"speculate": (1, 2)}
    spec = plan.step("speculate")
    # --force: production holds no hidden states of the run to estimate the head on (the acceptance step measured
    # it served instead); no --control while production's speculative image is its live one
    assert list(spec.argv[3:11]) == ["speculate", "prod", "--run", "r1", "--head", "w1:r1", "--force", "--inventory"]
    f = _facts()
    unlike = cy.plan_cycle(cy.CycleFacts(f.production, f.work, f.restarts, 1.3, f.extract, control=True), _opts())
    assert list(unlike.step("speculate").argv[9:11]) == ["--force", "--control"]
    fig = plan.production_figures()
    assert (fig["expected_downtime_keep_s"], fig["expected_downtime_rollback_s"]) == (50.0, 100.0)
    assert (fig["restarts_below_floor"], fig["expected_downtime_below_floor_s"]) == (0, 0.0)
    doc = json.loads(json.dumps(plan.as_dict()))
    assert doc["steps"][3]["send_bytes"] == 2_000_000_000 and doc["steps"][3]["command"].startswith(sys.executable)
    assert doc["steps_without_estimate"] == ["regenerate", "dataset", "train", "acceptance", "speculate", "report"]
    assert (doc["steps"][7]["production_downtime_keep_s"], doc["steps"][7]["production_downtime_rollback_s"]) == (
        50.0, 100.0)
    text = "\n".join(plan.lines())
    assert "2.0 GB to move" in text and "expected downtime 50 s if kept, 100 s if rolled back" in text
    assert "production restarts 1 (kept) / 2 (rolled back), ~50 s / ~100 s down" in text
    assert text.count("production not restarted") == len(keys) - 1
    # nothing recorded on production: each restart bounded by its health gate, said so
    bare = cy.plan_cycle(_facts(recorded=()), _opts())
    assert bare.production_figures()["expected_downtime_keep_s"] is None
    assert "bounded by the health gate's 600 s" in "\n".join(bare.lines())


def test_regenerate_and_train_are_timed_by_what_the_hosts_recorded() -> None:
    old = {"created": "2026-01-01T00:00:00Z", "answered_now": 10, "wall_s": 100.0, "settings": {"concurrency": 4}}
    new = {"created": "2026-02-01T00:00:00Z", "answered_now": 20, "wall_s": 40.0, "settings": {"concurrency": 4}}
    none_now = {"created": "2026-03-01T00:00:00Z", "answered_now": 0, "wall_s": 1.0}  # a rerun that answered nothing
    trained = {"run": "old", "window_id": "w", "median_step_s": 0.5, "steps_this_run": 20, "wall_s": 30.0}
    f = _facts()
    timed = cy.CycleFacts(f.production, f.work, f.restarts, 1.3, f.extract, regenerate_todo=30,
                          regenerate_recorded=(old, none_now, new), train_steps=100, train_recorded=trained)
    plan = cy.plan_cycle(timed, _opts())
    # the newest regenerate that answered some: 40 s / 20 conversations; 30 to send
    assert plan.step("regenerate").expected_s == pytest.approx(30 * 2.0)
    assert "30 conversations at 2.0 s each" in plan.step("regenerate").note
    # 100 steps at the recorded median 0.5 s, plus that run's 30 - 20 x 0.5 = 20 s outside the steps; the hidden
    # states' move from w2 has no figure here (no target config read), so the step as a whole has none
    (_, moved_s, why), (_, fit_s, fit_note) = plan.step("train").parts
    assert fit_s == pytest.approx(20.0 + 100 * 0.5) and "assumed: the same batch size" in fit_note
    assert moved_s is None and "the target config was not read" in why and plan.step("train").expected_s is None
    one = cy.plan_cycle(dataclasses.replace(timed, work=timed.work[:1], extract=None), _opts())  # one work host
    assert one.step("train").expected_s == pytest.approx(70.0) and "assumed: the same batch" in one.step("train").note
    assert cy.regenerate_estimate(0, ()) == (0.0, "every conversation answered already (resume log)")
    assert cy.regenerate_estimate(5, (none_now,))[0] is None and cy.train_estimate(100, None)[0] is None


def test_plan_times_every_step_from_recorded_figures_or_says_none_is_recorded() -> None:
    """Every step of the plan has an expected time from what the hosts recorded (regenerate manifests, weights copy
    plan, measured extract rates, the train host's train, earlier cycles' journals on production, the train host's
    heads, production's speculate windows), or says "no recorded figure"."""
    journals = "\n".join(json.dumps({"t": f"2026-01-01T00:{m:02d}:{sec:02d}+00:00", "step": k, "event": e})
                         for m, sec, k, e in (
        (0, 0, "dataset", "start"), (0, 4, "dataset", "done"),  # 4 s
        (1, 0, "acceptance", "start"), (3, 30, "acceptance", "done"),  # 150 s
        (4, 0, "report", "start"), (4, 2, "report", "done"),  # 2 s
        (5, 0, "weights:w9", "start"), (5, 10, "weights:w9", "done"),  # keyed by kind
        (6, 0, "dataset", "start"), (6, 6, "dataset", "done"),  # 6 s: median 5 s
        (7, 0, "acceptance", "start"))) + "\n{cut by a cra"  # not finished: left out
    durations = cy.step_durations(journals + "\n" + json.dumps(
        {"t": "2026-01-02T00:00:00+00:00", "step": "acceptance", "event": "start"}) + "\n" + json.dumps(
        {"t": "2026-01-02T00:02:00+00:00", "step": "acceptance", "event": "ended"}))  # ended: measured, 120 s
    assert durations == {"dataset": [4.0, 6.0], "acceptance": [150.0, 120.0], "report": [2.0], "weights": [10.0]}
    manifest = {"created": "2026-02-01T00:00:00Z", "answered_now": 20, "wall_s": 40.0, "settings": {}}
    trained = {"run": "old", "median_step_s": 0.5, "steps_this_run": 20, "wall_s": 30.0}
    f = _facts()
    full = cy.CycleFacts(f.production, f.work, f.restarts, 1.3, f.extract, regenerate_todo=30,
                         regenerate_recorded=(manifest,), train_steps=100, train_recorded=trained,
                         cycles_recorded=durations, gate_recorded=(300.0, 200.0, 250.0), head_bytes=250_000_000,
                         link_mbit=800.0, hidden_bytes_per_token=4 * 7168 * 2)
    plan = cy.plan_cycle(full, _opts())
    assert plan.as_dict()["steps_without_estimate"] == []
    got = {s.key: s.expected_s for s in plan.steps}
    assert got["dataset"] == 5.0 and got["acceptance"] == 135.0 and got["report"] == 2.0
    # train on w1: w2's 5,000 tokens of hidden states (57,344 bytes each: Kimi-K2.5's 4 x 7168 x 2) at 800 Mbit/s
    # moved there first, then 20 s + 100 steps x 0.5 s
    move, fit = plan.step("train").parts
    assert move[:2] == ("hidden states to the train host", pytest.approx(5_000 * 57_344 / 1e8))
    assert "5000 tokens extracted on the other work hosts" in move[2] and fit[:2] == ("vocab + train", 70.0)
    assert got["train"] == pytest.approx(5_000 * 57_344 / 1e8 + 70.0)
    # the speculate step: the head (250 MB at 800 Mbit/s = 2.5 s) and the gate (median of the windows: 250 s)
    spec = plan.step("speculate")
    assert [(p, t) for p, t, _ in spec.parts] == [("head transfer", 2.5), ("the gate", 250.0)]
    assert got["speculate"] == pytest.approx(252.5)
    text = "\n".join(plan.lines())
    assert "no recorded figure" not in text and "head transfer: ~2 s; 250.0 MB" in text
    assert "the gate: ~250 s; median of 3 speculate window(s) recorded on production" in text
    # nothing recorded: each step says so, none invented
    bare = cy.plan_cycle(cy.CycleFacts(f.production, (cy.WorkFacts("w1"),), restart_plan([], bound_s=600.0), 1.3),
                         _opts())
    none = [s for s in bare.steps if s.expected_s is None]
    assert [s.key for s in none] == ["regenerate", "dataset", "weights:w1", "extract", "train", "acceptance",
                                     "speculate", "report"]
    assert all("no recorded figure" in s.note + " ".join(n for _, _, n in s.parts) for s in none)
    lines = bare.lines()
    assert sum("no recorded figure" in line for line in lines if line[:4].strip().rstrip(".").isdigit()) == 8
    doc = bare.as_dict()["steps"][-2]["parts"]
    assert [p["expected_s"] for p in doc] == [None, None] and "no recorded figure" in doc[1]["note"]


def test_plan_leaves_a_dead_work_host_out_and_refuses_bad_roles() -> None:
    plan = cy.plan_cycle(_facts(dead=("w1",)), _opts())
    assert "weights:w1" not in [s.key for s in plan.steps]
    assert plan.train_host == "w2" and plan.step("speculate").argv[8] == "w2:r1"
    ex = list(plan.step("extract").argv)
    assert ex[ex.index("--dead") + 1] == "w1"
    with pytest.raises(cy.CycleError, match="--dead w9: not among the work hosts"):
        cy.plan_cycle(_facts(dead=("w9",)), _opts())
    with pytest.raises(cy.CycleError, match="every work host is named dead"):
        cy.plan_cycle(_facts(dead=("w1", "w2")), _opts())
    f = _facts()
    with pytest.raises(cy.CycleError, match="w1 is production and also named with --work"):
        cy.plan_cycle(cy.CycleFacts("w1", f.work, f.restarts, 1.3), _opts())


class _Recorder:
    """STAND-IN step runners: record the step's key in a file (one line each) instead of running its command."""

    def __init__(self, path: Path, kill_at: str | None = None, fail_at: str | None = None):
        self.path, self.kill_at, self.fail_at = path, kill_at, fail_at

    def __call__(self, step: cy.CycleStep) -> dict:
        with self.path.open("a") as f:
            f.write(step.key + "\n")
        if step.key == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # the driver killed mid-step
        if step.key == self.fail_at:
            raise cy.StepFailed(f"`weights {step.hosts[0]}` exited 1", step.hosts)
        return {"ran": step.key}

    def ran(self) -> list[str]:
        return self.path.read_text().split() if self.path.exists() else []


def _runners(rec) -> dict:
    return {k: rec for k in ("regenerate", "dataset", "weights", "extract", "train", "acceptance", "speculate",
                             "report")}


#: STAND-IN step command (sh, NOT eagle3ops): appends its step's key to a file, then waits (bounded, 30 s) for a
#: "go" file and prints the JSON line a step prints last.
_STANDIN_SH = 'echo "$1" >> "$2"; i=0; while [ ! -e "$3" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; ' \
              'echo \'{"verdict": "keep"}\''


def test_killed_driver_rerun_resumes_without_repeating_finished_steps(tmp_path: Path) -> None:
    """The driver SIGKILLed at each step in turn, then rerun: the steps an existing command does run through the real
    child runner with a STAND-IN command (``_STANDIN_SH``), the cycle's own steps (dataset, acceptance) through the
    STAND-IN recorder. Nothing finished runs again; a killed command step is adopted (it ran once in all), a killed
    in-process step runs again; a third run has nothing to do."""
    import threading

    from eagle3ops.speculate import cyclechild as cchild

    base = cy.plan_cycle(_facts(), _opts())
    keys = [s.key for s in base.steps]
    own = {s.key for s in base.steps if s.argv is None}  # the cycle's own steps, run in-process
    assert own == {"dataset", "acceptance"}
    for i, k in enumerate(keys):
        d = tmp_path / f"kill-{i}"
        d.mkdir()
        ran, go = d / "ran.txt", d / "go"
        plan = dataclasses.replace(base, steps=tuple(
            s if s.argv is None else dataclasses.replace(s, argv=("sh", "-c", _STANDIN_SH, "standin", s.key, str(ran),
                                                                  str(go) if s.key == k else "/"))
            for s in base.steps))

        def runners(j, rec):
            return {**_runners(rec), **{kind: cchild.StepChild(j, d / "children", echo=lambda t: None, poll_s=0.02)
                                        for kind in ("regenerate", "weights", "extract", "train", "speculate",
                                                     "report")}}

        pid = os.fork()
        if pid == 0:  # the driver, killed at step k
            try:
                j = cr.CycleJournal(executor.local(), str(d / "cycle"))
                j.acquire("eagle3ops cycle prod --work w1 --work w2 --run r1")
                cr.run_cycle(plan, j, runners(j, _Recorder(ran, kill_at=k)), echo=lambda m: None)
            finally:
                os._exit(3)
        if k not in own:  # killed while its command runs
            _wait_for(lambda: ran.exists() and ran.read_text().split()[-1:] == [k], f"{k}'s command")
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        assert ran.read_text().split() == keys[:i + 1]
        j = cr.CycleJournal(executor.local(), str(d / "cycle"))
        assert j.read_holder()["pid"] == pid  # the dead driver's lock is still there
        taken = j.acquire("eagle3ops cycle prod --work w1 --work w2 --run r1")
        assert taken and f"pid {pid}" in taken and "that process is gone" in taken
        threading.Timer(0.3, go.touch).start()  # the killed command finishes while the rerun waits for it
        res = cr.run_cycle(plan, j, runners(j, _Recorder(ran)), echo=lambda m: None)
        # every step once; a killed step of the cycle's own runs again, a killed command is adopted
        assert ran.read_text().split() == keys[:i + 1] + keys[i + 1 if k not in own else i:], f"killed at {k}"
        assert res["outcome"] == "done" and [s for s, v in res["steps"].items() if v == "skipped"] == keys[:i]
        if k not in own:
            assert res["figures"][k]["verdict"] == "keep" and "adopted_pid" in res["figures"][k]
        j.release()
        # a third run has nothing left to do
        rec3 = _Recorder(d / "ran3.txt")
        assert set(cr.run_cycle(plan, j, runners(j, rec3), echo=lambda m: None)["steps"].values()) == {"skipped"}
        assert rec3.ran() == [] and len(ran.read_text().split()) == len(keys) + (k in own)


def test_a_live_drivers_lock_is_refused(tmp_path: Path) -> None:
    j = cr.CycleJournal(executor.local(), str(tmp_path / "cycle"))
    assert j.acquire("eagle3ops cycle prod --work w1 --run r1") is None
    # the refusal names the holder as every journal lock does (user@machine, pid, since, command)
    holder = re.escape(f"{getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()}) since ")
    with pytest.raises(cy.CycleLocked, match=f"{holder}.*: `eagle3ops cycle prod --work w1 --run r1`; wait for it, "
                                             f".*--take-over"):
        cr.CycleJournal(executor.local(), str(tmp_path / "cycle")).acquire("again")
    assert "--take-over" in cr.CycleJournal(executor.local(), str(tmp_path / "cycle")).acquire("x", take_over=True)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_work_host_is_named_and_the_rerun_leaves_it_out(tmp_path: Path) -> None:
    from eagle3ops import cycle_cli
    from eagle3ops.config import load_inventory

    # w2 is an inventory host on a port nobody listens on: the real SSH check finds it dead
    inv_file = tmp_path / "hosts.yaml"
    inv_file.write_text(f"""hosts:
  w2:
    hostname: 127.0.0.1
    port: {_closed_port()}
    user: nobody
    data_dir: {tmp_path}/data
    state_dir: {tmp_path}/state
    model_path: {tmp_path}/model
    serving: none
""")
    alive = cycle_cli._alive(load_inventory(inv_file))
    plan = cy.plan_cycle(_facts(), _opts())
    j = cr.CycleJournal(executor.local(), str(tmp_path / "cycle"))
    j.acquire("eagle3ops cycle prod --work w1 --work w2 --run r1")
    rec = _Recorder(tmp_path / "ran.txt", fail_at="weights:w2")
    t0 = time.monotonic()
    with pytest.raises(cy.CycleError) as err:
        cr.run_cycle(plan, j, _runners(rec), alive=lambda h: h == "w1" or alive(h), echo=lambda m: None)
    assert time.monotonic() - t0 < 60
    msg = str(err.value)
    assert "w2 did not answer (work host)" in msg and "--dead w2" in msg and "not repeated" in msg
    failed = [e for e in j.entries() if e["event"] == "failed"]
    assert [(e["step"], e["dead_hosts"]) for e in failed] == [("weights:w2", ["w2"])]
    # the rerun with --dead w2: what finished is skipped, w2 is in no step, its shard goes to w1
    plan2 = cy.plan_cycle(_facts(dead=("w2",)), _opts())
    rec2 = _Recorder(tmp_path / "ran2.txt")
    res = cr.run_cycle(plan2, j, _runners(rec2), echo=lambda m: None)
    assert rec2.ran() == ["extract", "train", "acceptance", "speculate", "report"]
    assert res["steps"]["weights:w1"] == "skipped" and "weights:w2" not in res["steps"]


def test_dead_work_hosts_step_moves_to_another_when_nothing_finished_is_lost(tmp_path: Path) -> None:
    """A work host that stops answering during regenerate's successors up to extract: its step moves to the live
    work host within the same run (the plan made again without it, the host journaled dead); STAND-IN runners."""
    for fail_at in ("dataset", "weights:w2", "extract"):
        plan = cy.plan_cycle(_facts(), _opts())
        j = cr.CycleJournal(executor.local(), str(tmp_path / fail_at.replace(":", "-")))
        j.acquire("eagle3ops cycle prod --work w1 --work w2 --run r1")
        rec, seen, lines = _Recorder(tmp_path / f"ran-{fail_at}.txt", fail_at=fail_at), [], []

        def runner(step: cy.CycleStep) -> dict:
            seen.append((step.key, step.hosts, tuple(step.argv or ())))
            return rec(step) if (step.key, step.hosts) != (fail_at, ("w1",)) else {"ran": step.key}

        rec.fail_at = fail_at
        res = cr.run_cycle(plan, j, {k: runner for k in _runners(rec)}, alive=lambda h: h != "w2",
                           replan=lambda dead: cy.plan_cycle(_facts(dead=dead), _opts()), echo=lines.append)
        assert res["outcome"] == "done", fail_at
        assert res["moved"] == [{"step": fail_at, "dead": ["w2"], "to": ["w1"]}]
        assert any(f"{fail_at}: work host(s) w2 did not answer: left out, the step moves to w1" in m for m in lines)
        keys = [k for k, _, _ in seen]
        assert keys.count(fail_at) == (1 if fail_at == "weights:w2" else 2)  # weights of a dead host: not needed
        assert all(k == "regenerate" or "w2" not in h for k, h, _ in seen[keys.index(fail_at) + 1:])
        ex = [a for k, _, a in seen if k == "extract"][-1]
        assert ex[ex.index("--dead") + 1] == "w2" and res["steps"]["train"] == "done"
        assert [e["hosts"] for e in j.entries() if e["event"] == "dead"] == [["w2"]]
        assert cr.journaled_dead(j.entries()) == ["w2"]
        failed = [e for e in j.entries() if e["event"] == "failed"]
        assert [(e["step"], e["dead_hosts"], e["moved_to"]) for e in failed] == [(fail_at, ["w2"], ["w1"])]
        moved = cy.plan_cycle(_facts(dead=("w2",)), _opts()).step("extract")  # the fleet plan had w2 live
        assert moved.expected_s is None and "made with w2 live" in moved.note
        before = keys[:keys.index(fail_at)]
        assert len(before) == len(set(before))  # nothing before the failed step ran twice


def test_dead_work_host_holding_finished_output_waits_for_the_rerun(tmp_path: Path) -> None:
    """A work host that dies after the extract finished (its hidden states there) or the train host (the head
    there): the step does not move; the message gives both reruns; with --dead the rerun redoes from the step whose
    output was lost, on the live host; the only work host dying waits too; STAND-IN runners."""
    replan = lambda dead: cy.plan_cycle(_facts(dead=dead), _opts())  # noqa: E731
    for fail_at, gone, redo in (("train", "w2", "extract"), ("acceptance", "w1", "extract")):
        plan = cy.plan_cycle(_facts(), _opts())
        j = cr.CycleJournal(executor.local(), str(tmp_path / fail_at))
        j.acquire("eagle3ops cycle prod --work w1 --work w2 --run r1")
        rec = _Recorder(tmp_path / f"ran-{fail_at}.txt", fail_at=fail_at)
        with pytest.raises(cy.CycleError) as err:
            cr.run_cycle(plan, j, _runners(rec), alive=lambda h: h != gone, replan=replan, echo=lambda m: None)
        msg = str(err.value)
        assert f"host(s) {gone} did not answer (work host)" in msg and "the finished step extract left hidden " \
            f"states there, so the step waits for the rerun" in msg and f"--dead {gone} to redo extract" in msg
        assert not [e for e in j.entries() if e["event"] == "dead"] and "moved_to" not in j.entries()[-1]
        # the rerun with --dead: the steps up to the lost output skipped, from it on run again on the live host
        rec2 = _Recorder(tmp_path / f"ran2-{fail_at}.txt")
        res = cr.run_cycle(replan((gone,)), j, _runners(rec2), echo=lambda m: None)
        keys = [s.key for s in replan((gone,)).steps]
        assert rec2.ran() == keys[keys.index(redo):] and res["outcome"] == "done"
        assert replan((gone,)).train_host != gone
    # the only work host dies: nowhere to move
    solo = cy.CycleFacts("prod", (cy.WorkFacts("w1", 0, 0, 0.0),), restart_plan([50.0], bound_s=600.0), 1.3)
    j = cr.CycleJournal(executor.local(), str(tmp_path / "solo"))
    j.acquire("eagle3ops cycle prod --work w1 --run r1")
    with pytest.raises(cy.CycleError, match="no other work host to move to: rerun once it is back"):
        cr.run_cycle(cy.plan_cycle(solo, _opts()), j, _runners(_Recorder(tmp_path / "s.txt", fail_at="extract")),
                     alive=lambda h: h != "w1", replan=replan, echo=lambda m: None)


@pytest.fixture
def standin_server(tmp_path: Path):
    """Start the STAND-IN OpenAI server as a head served on a work host (``--speculative-config``), simulating the
    mean acceptance length given; yields a function ``start(acceptance) -> base_url``."""
    procs = []

    def start(acceptance: float) -> str:
        port = _closed_port()
        p = subprocess.Popen([sys.executable, str(REPO / "tests/data/standin_openai_server.py"), "--port", str(port),
                              "--model", "tiny", "--token-ms", "0.5", "--speculative-config",
                              json.dumps({"method": "eagle3", "num_speculative_tokens": 3}),
                              "--spec-acceptance", str(acceptance)], stdout=subprocess.DEVNULL)
        procs.append(p)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError("the stand-in server did not start in 30 s")

    yield start
    for p in procs:
        p.terminate()
        p.wait(timeout=10)


def test_head_below_the_acceptance_floor_ends_the_cycle_with_production_never_restarted(tmp_path, standin_server):
    from eagle3ops.speculate.ship import gate_prompts

    plan = cy.plan_cycle(_facts(), _opts())
    prompts = [p.text for p in gate_prompts(4)]

    def served(url: str):
        def run(step: cy.CycleStep) -> dict:
            with (tmp_path / f"ran-{url.rsplit(':', 1)[1]}.txt").open("a") as f:
                f.write(step.key + "\n")
            return cr.measure_served(url, "tiny", prompts, plan.acceptance_floor, where=step.hosts[0],
                                     max_tokens=16)
        return run

    for acceptance, ends in ((1.1, True), (2.2, False)):
        url = standin_server(acceptance)
        rec = _Recorder(tmp_path / f"ran-{acceptance}.txt")
        j = cr.CycleJournal(executor.local(), str(tmp_path / f"cycle-{acceptance}"))
        j.acquire("eagle3ops cycle prod --work w1 --work w2 --run r1")
        res = cr.run_cycle(plan, j, {**_runners(rec), "acceptance": served(url)}, echo=lambda m: None)
        if ends:
            # production's only restarting step (speculate) never ran, nor anything after the acceptance
            assert res["outcome"] == "ended" and res["production_restarts"] == 0 and res["step"] == "acceptance"
            assert rec.ran() == ["regenerate", "dataset", "weights:w1", "weights:w2", "extract", "train"]
            end = j.entries()[-1]
            assert end["event"] == "ended" and "below the floor 1.3" in end["reason"]
            assert end["mean_acceptance_length"] == pytest.approx(1.1, abs=0.05) and end["passed"] is False
            assert res["figures"]["acceptance"]["passed"] is False and res["figures"]["train"] == {"ran": "train"}
            # a rerun does not measure again nor reach production
            again = cr.run_cycle(plan, j, _runners(rec), echo=lambda m: None)
            assert again["outcome"] == "ended" and rec.ran()[-1] == "train"
        else:  # a head above the floor goes on to production's speed gate
            assert res["outcome"] == "done" and rec.ran()[-2:] == ["speculate", "report"]
            assert res["figures"]["acceptance"]["mean_acceptance_length"] == pytest.approx(2.2, abs=0.05)
            done = [e for e in j.entries() if e["step"] == "acceptance" and e["event"] == "done"][0]
            assert done["mean_acceptance_length"] == pytest.approx(2.2, abs=0.05) and done["failed_requests"] == 0


def test_roles_and_the_pipeline_are_checked_before_any_host_is_read(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from eagle3ops.cli import app

    inv = tmp_path / "hosts.yaml"  # unreachable addresses: a check that read a host would fail otherwise
    inv.write_text("hosts:\n" + "".join(
        f"  {n}:\n    hostname: 192.0.2.{i}\n    data_dir: /d\n    state_dir: /s\n    model_path: /m\n    serving: "
        + ("none\n" if n != "prod" else "{image: vllm/vllm-openai:v0.16.0, served_model_name: m}\n")
        for i, n in enumerate(("prod", "w1"), 1)))
    pipe = tmp_path / "pipeline.yaml"
    pipe.write_text("target_model: /model\nprepare:\n  datasets: [builtin:sharegpt]\n")

    def cycle(*args: str):
        return CliRunner().invoke(app, ["cycle", *args, "--run", "r", "--pipeline", str(pipe), "-i", str(inv),
                                        "--dry-run"], env={"COLUMNS": "300"})

    res = cycle("w1", "--work", "prod")
    assert res.exit_code == 2 and "`hosts.w1.serving` is none" in " ".join(res.output.split())
    res = cycle("prod", "--work", "prod")
    assert res.exit_code == 2 and "`hosts.prod.serving` runs a server" in " ".join(res.output.split())
    res = cycle("prod", "--work", "w1")
    assert res.exit_code == 2 and "`prepare.datasets` does not name regenerated/dataset.jsonl" in " ".join(
        res.output.split())


# ---- the head's served acceptance on a work host -------------------------------------------------------------------

def _hosts(tmp_path: Path, serving: str):
    """(production, work) from an inventory file: production serving as ``serving`` (YAML flow), the work host
    ``serving: none``; distinct model/data/state roots, so every remapped path shows."""
    from eagle3ops.config import load_inventory

    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n" + "".join(
        f"  {n}:\n    hostname: 127.0.0.1\n    gpus: {g}\n    data_dir: {tmp_path}/{n}/data\n"
        f"    state_dir: {tmp_path}/{n}/state\n    model_path: {tmp_path}/{n}/model\n    serving: {s}\n"
        for n, g, s in (("prod", 8, serving), ("w1", 8, "none"))))
    i = load_inventory(inv)
    return i.host("prod"), i.host("w1")


def test_work_host_container_is_productions_record_with_the_speculative_change(tmp_path: Path) -> None:
    from eagle3ops.commands import cycle as cyc
    from eagle3ops.commands import speculate as sc
    from eagle3ops.speculate import cycleserve as cserve
    from eagle3ops.window.kinds import driver_kind

    prod, work = _hosts(tmp_path, "{image: 'vllm/vllm-openai:v0.16.0', served_model_name: kimi, port: 8000}")
    record = {"Name": "vllm", "ImageId": "sha256:" + "a" * 64, "Networks": {},
              "Config": {"Image": "vllm/vllm-openai:v0.16.0", "Entrypoint": ["vllm", "serve"],
                         "Cmd": ["/model", "--served-model-name", "kimi", "--port", "8000", "--api-key", "s3cret",
                                 "-tp", "8"], "Env": ["PATH=/usr/bin", "HF_HOME=/hf"],
                         "Labels": {"io.eagle3ops.role": "serving", "io.eagle3ops.release": "4"}},
              "HostConfig": {"NetworkMode": "host", "Binds": [f"{prod.model_path}:/model:ro", "/srv/hf:/hf"],
                             "RestartPolicy": {"Name": "unless-stopped"}, "ShmSize": 17179869184, "IpcMode": "host",
                             "DeviceRequests": [{"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}]}}
    src = cserve.ProductionServing("container", record, "release 4")
    ws = cserve.plan_work_serving(prod, work, src, run="r1", k=3, port=8001, image="vllm/vllm-openai:v0.16.0",
                              image_id="sha256:" + "a" * 64)
    head = f"{work.data_dir}/runs/r1/train/final"
    want = driver_kind(prod).speculative_change(prod, head, 3, "vllm/vllm-openai:v0.16.0")  # speculate's own
    spec = ws.spec
    assert spec["image"] == "sha256:" + "a" * 64 and spec["network_mode"] == "host"  # the same image id
    assert spec["volumes"] == [f"{work.model_path}:/model:ro", "/srv/hf:/hf", f"{head}:{sc.HEAD_MOUNT}:ro"]
    assert ws.remapped == (f"{prod.model_path} -> {work.model_path} (bind of /model)",)
    cmd = spec["command"]
    assert cmd[:3] == ["/model", "--served-model-name", "kimi"] and "-tp" in cmd
    assert cmd[cmd.index("--port") + 1] == "8001" and cmd.count("--port") == 1
    spec_cfg = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert cmd[-2:] == list(want.args)  # exactly the speculate job's change, appended last
    assert spec_cfg == {"method": "eagle3", "model": sc.HEAD_MOUNT, "num_speculative_tokens": 3}
    assert "s3cret" not in cmd and "VLLM_API_KEY=s3cret" in ws.environ  # the key moved to the env file
    assert spec["labels"] == {"io.eagle3ops.role": cserve.ROLE} and "restart_policy" not in spec
    argv = list(cyc.serve_container(work, spec, "/x/env"))
    assert "s3cret" not in " ".join(argv) and argv[argv.index("--env-file") + 1] == "/x/env"
    assert argv[argv.index("--entrypoint") + 1] == "vllm" and argv[argv.index("--gpus") + 1] == "all"
    assert argv[argv.index("--ipc") + 1] == "host" and argv[argv.index("--name") + 1] == "eagle3ops-cycle-r1"
    assert argv[argv.index("sha256:" + "a" * 64) + 1:][:2] == ["serve", "/model"]
    # a bridge network: production's published port is remapped to the chosen one
    bridge = json.loads(json.dumps(record))
    bridge["HostConfig"].update(NetworkMode="bridge", PortBindings={"8000/tcp": [{"HostIp": "", "HostPort": "8000"}]})
    ws2 = cserve.plan_work_serving(prod, work, cserve.ProductionServing("container", bridge, "x"), run="r1", k=3, port=8005)
    assert ws2.spec["ports"] == {"8000/tcp": [("", 8005)]} and "8000" in ws2.spec["command"]
    pub = list(cyc.serve_container(work, ws2.spec, "/e"))
    assert pub[pub.index("--publish") + 1] == "8005:8000/tcp"
    # a speculative image: what production's live image put into the container gives way to the new image's own
    # defaults, as the speculate job's supervisor recreates it
    old_image = {"Entrypoint": ["vllm", "serve"], "Env": ["PATH=/usr/bin"], "Labels": {}}
    ws3 = cserve.plan_work_serving(prod, work, src, run="r1", k=3, port=8001, image="patched:1", image_id="sha256:b",
                                   image_defaults=old_image)
    assert ws3.spec["entrypoint"] is None and ws3.spec["image"] == "sha256:b"
    assert "PATH=/usr/bin" not in ws3.environ and "HF_HOME=/hf" in ws3.environ and ws3.image == "patched:1"
    assert ws3.spec["command"][-2:] == spec["command"][-2:]
    bridge["HostConfig"]["PortBindings"] = {}
    with pytest.raises(cy.StepFailed, match="publishes no port 8000"):
        cserve.plan_work_serving(prod, work, cserve.ProductionServing("container", bridge, "x"), run="r1", k=3, port=8005)


def test_work_host_process_is_productions_command_line_remapped(tmp_path: Path) -> None:
    from eagle3ops.commands import cycle as cyc
    from eagle3ops.speculate import cycleserve as cserve

    prod, work = _hosts(tmp_path, "{kind: process, process_match: 'vllm serve', served_model_name: m, port: 8000}")
    rec = {"argv": ["/opt/venv/bin/vllm", "serve", prod.model_path, "--port", "8000",
                    f"--chat-template={prod.data_dir}/t.jinja"], "environ": ["A=1", "HF_TOKEN=x"],
           "cwd": prod.data_dir}
    ws = cserve.plan_work_serving(prod, work, cserve.ProductionServing("process", rec, "live process 9"), run="r1", k=2,
                              port=8002)
    head = f"{work.data_dir}/runs/r1/train/final"
    assert ws.argv[:3] == ("/opt/venv/bin/vllm", "serve", work.model_path)
    assert f"--chat-template={work.data_dir}/t.jinja" in ws.argv and ws.cwd == work.data_dir
    assert ws.argv[ws.argv.index("--port") + 1] == "8002" and ws.argv.count("--port") == 1
    assert json.loads(ws.argv[ws.argv.index("--speculative-config") + 1])["model"] == head  # the head's path
    assert ws.environ == ("A=1", "HF_TOKEN=x") and ws.image is None and len(ws.remapped) == 3
    assert cserve.choose_port({8000, 8001}, 8000) == 8002 and cserve.choose_port(set(), 8000) == 8000
    assert cyc.parse_ports("0100007F:1F40\n00000000000000000000000000000000:1F41\n") == {8000, 8001}
    # On this machine's /proc: a connection's local port counts as in use (a listener cannot bind it), not only
    # the listener's.
    with socket.create_server(("127.0.0.1", 0)) as srv, socket.create_connection(srv.getsockname()) as cli:
        in_use = cyc.parse_ports(subprocess.run(list(cyc.bound_ports()), capture_output=True, text=True).stdout)
        assert {srv.getsockname()[1], cli.getsockname()[1]} <= in_use
        assert cserve.choose_port(in_use, cli.getsockname()[1]) != cli.getsockname()[1]
    # The work host's server is alive while its launcher's pid runs, before that pid leads a session of its own
    # (its setsid not run yet): a process of this test's session stands for it; gone once it has exited.
    sid_dir = Path(tmp_path, "alive")
    sid_dir.mkdir()
    launcher = subprocess.Popen(["sleep", "30"])
    try:
        Path(sid_dir, "sid").write_text(f"{launcher.pid}\n")
        assert subprocess.run(list(cyc.session_alive(str(sid_dir)))).returncode == 0
    finally:
        launcher.kill()
        launcher.wait()
    assert subprocess.run(list(cyc.session_alive(str(sid_dir)))).returncode != 0
    assert cserve.secrets_to_env(["a", "--api-key=k", "--hf-token", "t", "b"]) == (
        ["a", "b"], {"VLLM_API_KEY": "k", "HF_TOKEN": "t"})
    assert cserve.remap("/m2/x", [("/m", "/w")]) == "/m2/x" and cserve.remap("/m/x", [("/m", "/w"), ("/m/x", "/v")]) == "/v"


class _On:
    """This machine's executor as a host's (``.host``): the real argv of the step run here."""

    dry_run = False

    def __init__(self, host):
        self.host, self._x = host, executor.local()

    def run(self, argv, **kw):
        return self._x.run(argv, **kw)


def test_served_acceptance_runs_productions_process_on_the_work_host_and_leaves_nothing(tmp_path: Path) -> None:
    """The acceptance step end to end on this machine: production is the STAND-IN OpenAI server (NOT vLLM; its
    speculation simulated, acceptance 2.0 by default) serving as a ``process``; the step reads it from /proc, starts
    its command line remapped with ``--speculative-config`` on a free port (production's is taken here), measures,
    and stops it; production's process is never restarted; a floor above the head ends the cycle, stopped too (there,
    the server and lock a killed driver left, a STAND-IN ``sleep`` session, are stopped and taken over first; another
    run's lock is not); a server that exits fails the step at once with its log; no head is refused before anything
    starts."""
    from eagle3ops.speculate import cycleserve as cserve
    from eagle3ops.speculate.ship import gate_prompts

    port = _closed_port()
    prod, work = _hosts(tmp_path, f"{{kind: process, process_match: 'standin_openai_server.py --port {port}', "
                                  f"served_model_name: tiny, port: {port}, health_timeout_s: 30}}")
    for h in (prod, work):
        Path(h.model_path).mkdir(parents=True)
        Path(h.model_path, "config.json").write_text("{}")
    head = Path(cserve.head_dir(work, "r1"))
    head.mkdir(parents=True)
    (head / "config.json").write_text("{}")
    server = subprocess.Popen([sys.executable, str(REPO / "tests/data/standin_openai_server.py"), "--port", str(port),
                               "--model", "tiny", "--token-ms", "0.5", "--require-file",
                               f"{prod.model_path}/config.json"], stdout=subprocess.DEVNULL, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _answers(port):
            time.sleep(0.1)
        prompts = [p.request for p in gate_prompts(4)]
        lock, held = Path(work.state_dir, "lock"), []
        figs = cserve.serve_and_measure(_On(prod), _On(work), run="r1", k=3, prompts=prompts, floor=1.3, max_tokens=16,
                                    echo=lambda m: held.append(lock.is_dir()))
        # production's port is taken: the next one no socket holds (this machine's own connections may hold some)
        assert figs["source"].startswith("live process") and port < figs["port"] < port + 200
        assert figs["mean_acceptance_length"] == pytest.approx(2.0, abs=0.05) and figs["failed_requests"] == 0
        assert f"{work.model_path}/config.json" in figs["command"] and "--speculative-config" in figs["command"]
        assert figs["stopped"].startswith("stopped: session") and not _answers(figs["port"])
        assert held and all(held) and not lock.exists()  # the work host's deploy lock: held for the step only
        # a killed driver left its acceptance running (its lock on the work host, its server: a STAND-IN `sleep`
        # session): the next run stops that session, takes the lock over and measures afresh (here: a floor above
        # the head, so it ends the cycle)
        from eagle3ops.commands import cycle as cyc
        from eagle3ops.window.lock import acquire_lock

        d = f"{work.state_dir}/cycles/r1/serve"
        for name, body in (("cmdline.nul", b"sleep\x00300\x00"), ("environ.nul", b""), ("cwd", b"/")):
            Path(d, name).write_bytes(body)
        executor.local().run(cyc.start_process(d))
        left_sid = Path(d, "sid").read_text().strip()
        _wait_for(lambda: subprocess.run(["pgrep", "-s", left_sid], capture_output=True).returncode == 0, "sleep")
        acquire_lock(_On(work), "cycle-acceptance-left", "eagle3ops cycle ...",
                     "cycle r1: the head's served acceptance (a server on this host's GPUs)")
        said: list[str] = []
        with pytest.raises(cy.CycleEnded) as end:
            cserve.serve_and_measure(_On(prod), _On(work), run="r1", k=3, prompts=prompts, floor=2.5, max_tokens=16,
                                     echo=said.append)
        assert "left by a killed driver" in said[0] and f"stopped: session {left_sid}" in said[0]
        assert subprocess.run(["pgrep", "-s", left_sid], capture_output=True).returncode == 1  # gone
        assert end.value.figures["passed"] is False and port < end.value.figures["port"] < port + 200
        assert end.value.figures["stopped"].startswith("stopped: session")
        assert not _answers(end.value.figures["port"]) and server.poll() is None  # stopped; production untouched
        assert not lock.exists()  # released after a head below the floor too
        sid = Path(work.state_dir, "cycles/r1/serve/sid").read_text().strip()
        assert subprocess.run(["pgrep", "-s", sid], capture_output=True).returncode == 1  # nothing left
        # another run's acceptance lock is not this cycle's: refused, named, before anything starts
        acquire_lock(_On(work), "cycle-acceptance-other", "eagle3ops cycle ...", "cycle r2: the head's ...")
        with pytest.raises(cy.StepFailed, match="deploy lock held by .*rerun the cycle once that lock is free"):
            cserve.serve_and_measure(_On(prod), _On(work), run="r1", k=3, prompts=prompts, floor=1.3, max_tokens=16)
        shutil.rmtree(lock)
        # the work host lacks the target (the weights step did not put it there): the server exits, the step fails
        # at once with its log, not after the health timeout
        Path(work.model_path, "config.json").unlink()
        t0 = time.monotonic()
        with pytest.raises(cy.StepFailed, match="exited: .*not found: cannot load the model"):
            cserve.serve_and_measure(_On(prod), _On(work), run="r1", k=3, prompts=prompts, floor=1.3, max_tokens=16)
        assert time.monotonic() - t0 < 20 and not any(_answers(p) for p in range(port + 1, port + 4))
        assert not lock.exists()  # and after a server that exited
        # no head on the work host: refused before anything starts
        (head / "config.json").unlink()
        with pytest.raises(cy.StepFailed, match="no trained head"):
            cserve.serve_and_measure(_On(prod), _On(work), run="r1", k=3, prompts=prompts, floor=1.3, max_tokens=16)
    finally:
        server.terminate()
        server.wait(timeout=10)


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_acceptance_beside_shows_productions_only_after_a_keep() -> None:
    acc = {"mean_acceptance_length": 2.1, "where": "w1"}
    kept = cr.acceptance_beside({"acceptance": acc, "speculate": {"verdict": "keep", "mean_acceptance_length": 2.3}})
    assert kept["line"] == "mean acceptance length: 2.10 on work host w1, 2.30 on production (kept; +0.20)"
    assert (kept["work_host"], kept["production"]) == (2.1, 2.3)
    back = cr.acceptance_beside({"acceptance": acc, "speculate": {"verdict": "rollback", "mean_acceptance_length": 2}})
    assert back["production"] is None and "verdict rollback, nothing kept" in back["line"]
    assert cr.acceptance_beside({})["line"] is None


# ---- a step's command left running by a killed driver: adopted by the rerun, never started twice ----------------

#: STAND-IN step command (NOT eagle3ops): counts its starts in a file, waits (bounded) for a "go" file, prints the
#: JSON line a step prints last and exits with the status given.
_STANDIN_STEP = """
import json, sys, time, pathlib
starts, go, rc = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
with starts.open("a") as f:
    f.write("start\\n")
print("working", flush=True)
deadline = time.monotonic() + 60
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"verdict": "keep", "live_release": 7}), flush=True)
sys.exit(rc)
"""


def _wait_for(cond, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_killed_drivers_running_command_is_adopted_not_started_twice(tmp_path: Path) -> None:
    """The driver (a forked process) is killed with SIGKILL while the train step's command (a STAND-IN script, run
    through the real child runner and its shell wrapper) runs: the command goes on, the rerun adopts it (no second
    start), waits for it and journals its figures; a command that finished while no driver ran is taken as done; one
    that died with its driver is started again; an adopted command is waited for only up to its bound."""
    from eagle3ops.speculate import cyclechild as cchild

    base = cy.plan_cycle(_facts(), _opts())
    keys = [s.key for s in base.steps]

    def plan_for(d: Path, rc: int = 0) -> cy.CyclePlan:
        argv = (sys.executable, "-c", _STANDIN_STEP, str(d / "starts"), str(d / "go"), str(rc))
        return dataclasses.replace(base, steps=tuple(
            dataclasses.replace(s, argv=argv) if s.key == "train" else s for s in base.steps))

    def runners(j, rec, out: list[str], bound_s=cchild.adopt_bound_s):
        return {**_runners(rec), "train": cchild.StepChild(j, tmp_path / "children", echo=out.append, bound_s=bound_s,
                                                       poll_s=0.05)}

    def killed_driver(d: Path, plan) -> tuple[int, dict]:
        """Fork a driver, kill it once the train command runs; returns (pid, the journaled child event)."""
        d.mkdir()
        pid = os.fork()
        if pid == 0:
            try:
                j = cr.CycleJournal(executor.local(), str(d / "cycle"))
                j.acquire("eagle3ops cycle prod --work w1 --work w2 --run r1")
                cr.run_cycle(plan, j, runners(j, _Recorder(d / "ran.txt"), []), echo=lambda m: None)
            finally:
                os._exit(3)
        j = cr.CycleJournal(executor.local(), str(d / "cycle"))
        _wait_for(lambda: (d / "starts").exists() and (cchild.last_child(j.entries(), "train") or {}).get("pid"),
                  "the train command to start and its pid to be journaled")
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        child = cchild.last_child(j.entries(), "train")
        assert child is not None and cchild.proc_start(child["pid"]) == child["started"]  # still running
        return pid, child

    def rerun(d: Path, plan, **kw):
        j = cr.CycleJournal(executor.local(), str(d / "cycle"))
        taken = j.acquire("eagle3ops cycle prod --work w1 --work w2 --run r1")
        assert taken is None or "that process is gone" in taken
        rec, out = _Recorder(d / "ran2.txt"), []
        return cr.run_cycle(plan, j, runners(j, rec, out, **kw), echo=lambda m: None), rec, out, j

    # 1. still running at the rerun: adopted, followed until it exits, not started again
    d = tmp_path / "running"
    plan = plan_for(d)
    _, child = killed_driver(d, plan)
    go_later = subprocess.Popen([sys.executable, "-c", f"import time, pathlib; time.sleep(1.0); "
                                     f"pathlib.Path({str(d / 'go')!r}).touch()"])
    res, rec, out, j = rerun(d, plan)
    go_later.wait(timeout=10)
    assert (d / "starts").read_text().split() == ["start"]  # one start in all
    assert any("adopted, no second copy started" in o and f"pid {child['pid']}" in o for o in out)
    assert res["outcome"] == "done" and res["figures"]["train"] == {"rc": 0, "adopted_pid": child["pid"],
                                                                    "verdict": "keep", "live_release": 7}
    assert rec.ran() == keys[keys.index("acceptance"):]  # the steps after train ran; before it, none again
    assert [e["event"] for e in j.entries() if e["step"] == "train"] == ["start", "child", "child", "start", "done"]
    # 1b. killed after the start but before the pid was journaled (the entry before the start is the last): found by
    # the pid file its shell wrote, adopted, not started again
    d = tmp_path / "unjournaled"
    plan = plan_for(d)
    _, child = killed_driver(d, plan)
    journal = d / "cycle" / "journal.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(lines[:-1]))  # the pid's entry, as if the driver died before writing it
    assert cchild.last_child(cr.CycleJournal(executor.local(), str(d / "cycle")).entries(), "train")["pid"] is None
    (d / "go").touch()
    res, rec, out, _ = rerun(d, plan)
    assert (d / "starts").read_text().split() == ["start"] and res["figures"]["train"]["adopted_pid"] == child["pid"]
    # 2. finished while no driver ran: its result taken, nothing started
    d = tmp_path / "finished"
    plan = plan_for(d)
    _, child = killed_driver(d, plan)
    (d / "go").touch()
    _wait_for(lambda: Path(child["rc"]).exists(), "the orphaned command's status")
    res, rec, out, _ = rerun(d, plan)
    assert (d / "starts").read_text().split() == ["start"] and res["figures"]["train"]["verdict"] == "keep"
    assert any("finished with status 0 while no driver ran" in o for o in out)
    # 3. killed with its driver (no status written): started again, and it resumes
    d = tmp_path / "died"
    plan = plan_for(d)
    _, child = killed_driver(d, plan)
    os.kill(child["pid"], signal.SIGKILL)
    _wait_for(lambda: cchild.proc_start(child["pid"]) is None, "the command to die")
    (d / "go").touch()
    res, rec, out, _ = rerun(d, plan)
    assert (d / "starts").read_text().split() == ["start", "start"] and res["steps"]["train"] == "done"
    assert any("died with the driver (no exit status): started again" in o for o in out)
    # 4. the wait for an adopted command is bounded: it still runs after the bound, the rerun says so and stops
    d = tmp_path / "bounded"
    plan = plan_for(d, rc=1)
    _, child = killed_driver(d, plan)
    t0 = time.monotonic()
    with pytest.raises(cy.CycleError, match=f"pid {child['pid']}\\) still runs after 1 s: rerun the cycle to keep"):
        rerun(d, plan, bound_s=lambda s: 1.0)
    assert time.monotonic() - t0 < 10 and (d / "starts").read_text().split() == ["start"]
    cr.CycleJournal(executor.local(), str(d / "cycle")).release()  # as the CLI does when a step fails
    with pytest.raises(cy.CycleError, match="still runs after 1 s"):  # journaled failed: still found and waited for
        rerun(d, plan, bound_s=lambda s: 1.0)
    assert (d / "starts").read_text().split() == ["start"]
    cr.CycleJournal(executor.local(), str(d / "cycle")).release()
    (d / "go").touch()  # it exits 1 now: the next rerun starts it again, and that one fails as a step does
    _wait_for(lambda: Path(child["rc"]).exists(), "the status")
    with pytest.raises(cy.CycleError, match="exited 1"):
        rerun(d, plan)
    assert (d / "starts").read_text().split() == ["start", "start"]
