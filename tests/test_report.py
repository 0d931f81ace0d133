"""The run report: rendered from results recorded by a real `make demo` run on the sandbox
(tests/data/report/demo-run.json: what :func:`eagle3ops.report.collect` read from the host: two windows' plans,
journals and results, the train stage's metrics and manifest), plus a speculation-gate decision computed by
:func:`eagle3ops.gate.decide.decide`. The plotted numbers are checked against the source JSON."""

from __future__ import annotations

import dataclasses

import json
from pathlib import Path

import pytest

from eagle3ops import report
from eagle3ops.gate import decide as dec
from eagle3ops.gate.metrics import SpecDelta
from eagle3ops.gate.replay import LevelResult

DATA = Path(__file__).parent / "data/report/demo-run.json"


@pytest.fixture()
def recorded() -> dict:
    return json.loads(DATA.read_text())


def test_report_plots_exactly_the_recorded_numbers(tmp_path, recorded):
    plotted = report.render(recorded, tmp_path)
    for f in ("index.html", "timeline.png", "train.png", "acceptance.png", "throughput.png"):
        assert (tmp_path / f).stat().st_size > 1000 or f == "index.html"
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    metrics = recorded["train_metrics"]
    assert plotted["loss"] == [(m["step"], m["loss"]) for m in metrics]
    assert plotted["full_acc_2"] == [(m["step"], m["full_acc_2"]) for m in metrics]
    # timeline: every started-and-finished journal step of both windows, on one clock
    t0 = min(ev["epoch"] for w in recorded["windows"] for ev in w["journal"])
    expected = []
    for w in recorded["windows"]:
        starts = {}
        for ev in w["journal"]:
            if ev["event"] == "start":
                starts[ev["step"]] = ev["epoch"]
            elif ev["event"] in ("ok", "error", "failed") and ev["step"] in starts:
                expected.append((w["plan"]["window_id"], ev["step"], round(starts.pop(ev["step"]) - t0, 3),
                                 round(ev["epoch"] - t0, 3)))
    assert plotted["timeline"] == expected
    assert {s for _, s, *_ in expected} >= {"stop", "prepare", "extract", "vocab", "train", "restore", "health"}
    html = (tmp_path / "index.html").read_text()
    for w in recorded["windows"]:
        r = w["result"]
        assert r["window_id"] in html and str(r["downtime_s"]) in html
    assert "No speculative release was measured" in html


def test_report_shows_the_gate_decision_and_its_figures(tmp_path, recorded):
    # The decision takes three passes per side with per-prompt figures (identical passes here, so the
    # pooled tokens/s are the single pass's)
    def passes(lv: LevelResult) -> list[LevelResult]:
        return [dataclasses.replace(lv, prompt_tokens=(64,) * 8, prompt_seconds=(1.0,) * 8,
                                    prompt_ttft_ms=(lv.ttft_ms_median,) * 8)] * 3

    base = {1: passes(LevelResult(1, 8, 0, 512, 10.0, 51.2, 19.0, 22.0, 120.0, 0)),
            4: passes(LevelResult(4, 8, 0, 512, 4.0, 128.0, 30.0, 35.0, 150.0, 0))}
    spec = {1: passes(LevelResult(1, 8, 0, 512, 8.0, 64.0, 15.0, 18.0, 130.0, 0)),
            4: passes(LevelResult(4, 8, 0, 512, 4.2, 121.9, 33.0, 38.0, 160.0, 0))}
    d = dec.decide(base, spec, SpecDelta(100, 300, 120, {0: 70, 1: 35, 2: 15}), production_concurrency=1,
                   margin=0.1, acceptance_floor=1.5)
    recorded["speculate"] = {"verdict": d.verdict, "reason": d.reason, **d.figures,
                             "sets": dec.set_tables(base, spec, {"chat": [0, 1, 2, 3], "code": [4, 5, 6, 7]},
                                                    production_concurrency=1),
                             "control": True, "measured_releases": {
                                 "baseline": {"image": "serving:patched", "image_id": "sha256:" + "c" * 64,
                                              "vllm_version": "0.16.0"},
                                 "speculative": {"image": "serving:patched", "image_id": "sha256:" + "c" * 64,
                                                 "vllm_version": "0.16.0"}}}
    recorded["train_manifest"]["offline_estimate"] = {"acceptance_length": 2.1,
                                                      "per_position": {"0": 0.8, "1": 0.5, "2": 0.3}}
    plotted = report.render(recorded, tmp_path)
    # pass-pooled tokens/s (Σ tokens / Σ wall): 512 / 4.2 s = 121.905
    assert plotted["throughput"] == {"baseline": [(1, 51.2), (4, 128.0)], "speculative": [(1, 64.0), (4, 121.905)]}
    assert plotted["acceptance_measured"] == pytest.approx({0: 0.7, 1: 0.35, 2: 0.15})
    assert plotted["acceptance_offline"] == pytest.approx({0: 0.8, 1: 0.5, 2: 0.3})
    html = (tmp_path / "index.html").read_text()
    assert "keep" in html and d.reason in html and "2.1" in html
    # the interval, one row per prompt set and level, and what each measured release ran
    assert f"x{d.figures['interval']['low']} to x{d.figures['interval']['high']}" in html
    assert html.count("<tr><td>chat</td>") == 2 and html.count("<tr><td>code</td>") == 2
    assert "control release" in html and "sha256:cccccccccccc" in html and "0.16.0" in html


def test_plan_run_reads_the_stage_run_dir(recorded):
    assert {report.plan_run(w["plan"]) for w in recorded["windows"]} == {recorded["run"]}
    assert report.plan_run({"run": "r1"}) == "r1" and report.plan_run({"stages": []}) is None
    venv = {"spec": {"runtime": "venv", "argv": ["/s/env/d/bin/eagle3ops-stage", "extract", "--run-dir", "/d/runs/r2"]}}
    assert report.plan_run({"stages": [venv]}) == "r2"  # a venv host's stage process


def test_calibration_across_runs_plots_offline_gate_and_production(tmp_path):
    """Three runs' files as `speculate` (result.json) and `watch` (production.json) write them, with the
    host's audit log (tests/data/report/calibration/: written for this test in those formats, not from a live run),
    read through the real local executor by :func:`report.collect`, plotted in run order (each run at its latest
    speculate entry); a run never watched has no production point."""
    import shutil

    from eagle3ops.config import HostConfig
    from eagle3ops.executor import Local

    src = DATA.parent / "calibration"
    shutil.copytree(src, tmp_path / "host")
    h = HostConfig(name="sandbox", hostname="127.0.0.1", data_dir=str(tmp_path / "host/data"),
                   state_dir=str(tmp_path / "host/state"), model_path="/m",
                   serving={"image": "x", "served_model_name": "m"})
    r = Local()
    r.host = h
    data = report.collect(r, h, "r-2026-12-01")
    runs = ["r-2026-11-28", "r-2026-11-30", "r-2026-12-01"]
    assert [row["run"] for row in data["calibration"]] == runs
    plotted = report.render(data, tmp_path / "out")
    expected = {}
    for run in runs:
        res = json.loads((src / f"data/runs/{run}/speculate/result.json").read_text())
        expected.setdefault("offline", []).append((run, res["offline_estimate"]))
        expected.setdefault("gate", []).append((run, res["spec_decode"]["mean_acceptance_length"]))
        prod = src / f"data/runs/{run}/speculate/production.json"
        if prod.exists():
            expected.setdefault("production", []).append((run, json.loads(prod.read_text())["mean_acceptance_length"]))
    assert plotted["calibration"] == expected and len(expected["production"]) == 2
    assert (tmp_path / "out/calibration.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (tmp_path / "out/index.html").read_text()
    assert "Calibration across runs" in html and "r-2026-11-30" in html and "1.71" in html


def test_calibration_has_one_point_per_head_read_from_its_attempt_folder():
    """Two heads shipped on one run (the run's own and one from elsewhere) are two points, each
    read from the attempt folder its latest audit entry names (``result.json`` and the ``production.json`` that
    ``watch`` writes beside it); a re-run of the same head replaces its point; the offline estimate may be a
    record (``{"acceptance_length": ...}``)."""
    files = {
        "/d/runs/r1/speculate/aaaaaaaa11111111/w1/result.json": {"verdict": "keep", "offline_estimate": 2.1,
                                                                 "spec_decode": {"mean_acceptance_length": 1.9}},
        "/d/runs/r1/speculate/aaaaaaaa11111111/w3/result.json": {"verdict": "keep", "offline_estimate": 2.1,
                                                                 "spec_decode": {"mean_acceptance_length": 1.8}},
        "/d/runs/r1/speculate/aaaaaaaa11111111/w3/production.json": {"mean_acceptance_length": 1.6, "intervals": 5},
        "/d/runs/r1/speculate/bbbbbbbb22222222/w2/result.json": {
            "verdict": "rollback", "offline_estimate": {"acceptance_length": 1.4},
            "spec_decode": {"mean_acceptance_length": 1.2}},
    }
    audit = [{"kind": "speculate", "run": "r1", "t": t, "head_sha256": f"{sha}{n}" + "0" * 48,
              "attempt_dir": f"/d/runs/r1/speculate/{sha}{n}/{w}"}
             for t, sha, n, w in (("1", "aaaaaaaa", "11111111", "w1"), ("2", "bbbbbbbb", "22222222", "w2"),
                                  ("3", "aaaaaaaa", "11111111", "w3"))]
    rows = report.calibration_rows(audit, lambda p: json.dumps(files[p]) if p in files else "", "/d/runs")
    assert [(r["label"], r["offline"], r["gate"], r["production"]) for r in rows] == [
        ("r1:bbbbbbbb", 1.4, 1.2, None), ("r1:aaaaaaaa", 2.1, 1.8, 1.6)]


def test_a_cycle_runs_report_finds_its_gate_result_and_the_work_hosts_training(tmp_path):
    """A run of ``eagle3ops cycle``: production holds the gate's result of the head from the work host in the
    attempt folder its audit entry names (no ``speculate/result.json`` of the run's own head) and the cycle's
    journal; the training is on the work host the journal's finished ``train`` step names. Both hosts are folders
    read through the real local executor, laid out as those commands write them (files written for this test)."""
    from contextlib import contextmanager

    from eagle3ops.config import HostConfig
    from eagle3ops.executor import Local

    def host(name: str) -> HostConfig:
        return HostConfig(name=name, hostname="127.0.0.1", data_dir=str(tmp_path / name / "data"),
                          state_dir=str(tmp_path / name / "state"), model_path="/m",
                          serving={"image": "x", "served_model_name": "m"} if name == "prod" else "none")

    def write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    run, prod, work = "cyc-1", host("prod"), host("work")
    attempt = f"{prod.data_dir}/runs/{run}/speculate/{'ab' * 8}/w-20261207T1300"
    gate = {"verdict": "keep", "spec_decode": {"mean_acceptance_length": 1.42}, "head_sha256": "ab" * 32}
    write(Path(attempt) / "result.json", json.dumps(gate))
    write(Path(prod.state_dir) / "audit.jsonl", json.dumps({"kind": "speculate", "run": run, "verdict": "keep",
                                                             "head_sha256": "ab" * 32, "attempt_dir": attempt}) + "\n")
    journal = [{"t": "2026-12-07T12:00:00+00:00", "step": "train", "event": "start", "hosts": ["gone"]},
               {"t": "2026-12-07T12:01:00+00:00", "step": "train", "event": "failed", "hosts": ["gone"]},
               {"t": "2026-12-07T12:02:00+00:00", "step": "train", "event": "start", "hosts": ["work"]},
               {"t": "2026-12-07T12:05:00+00:00", "step": "train", "event": "done"}]
    write(Path(prod.state_dir) / "cycles" / run / "journal.jsonl", "".join(json.dumps(e) + "\n" for e in journal))
    metrics = [{"step": 1, "loss": 9.5, "full_acc_0": 0.1}, {"step": 2, "loss": 8.25, "full_acc_0": 0.2}]
    write(Path(work.data_dir) / "runs" / run / "train/metrics.jsonl", "".join(json.dumps(m) + "\n" for m in metrics))
    write(Path(work.data_dir) / "runs" / run / "train/manifest.json", json.dumps({"steps": 2}))
    opened = []

    @contextmanager
    def remote_for(name: str):
        opened.append(name)
        wr = Local()
        wr.host = {"work": work}[name]
        yield wr

    r = Local()
    r.host = prod
    alone = report.collect(r, prod, run)  # no way to the work host: the gate's result still found, training not
    assert alone["speculate"] == gate and alone["train_metrics"] == [] and alone["train_host"] == "work"
    data = report.collect(r, prod, run, remote_for=remote_for)
    assert opened == ["work"] and data["speculate"] == gate and data["train_manifest"] == {"steps": 2}
    plotted = report.render(data, tmp_path / "out")
    assert plotted["loss"] == [(1, 9.5), (2, 8.25)]
    assert "1.42" in (tmp_path / "out/index.html").read_text()
