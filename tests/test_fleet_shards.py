"""No host: the shard-aware extract stage's contract (``--shard START:END``, the shard manifest), run through
the STAND-IN stages of the venv tests (:mod:`eagle3ops_dev.standin_stages`, which share the product's
:mod:`eagle3ops.stages.shards`), merged by :mod:`eagle3ops.stages.merge`; and :func:`eagle3ops.fleet.execute.run_plan`'s
order and bounds with a recording ``run_one`` (no host, real threads)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from eagle3ops.config.inventory import FleetConfig
from eagle3ops.fleet.execute import merge_run, run_plan
from eagle3ops.stages.merge import MergeError, check_merged, merge_manifests
from eagle3ops.fleet.plan import FleetHost, plan_fleet
from eagle3ops.fleet.shard import shard_ranges
from eagle3ops.stages.shards import parse_shard, select
from eagle3ops_dev import standin_stages

PIPELINE = "target_model: /model\nprepare: {datasets: [builtin:sharegpt], max_samples: 11}\n"


def _stage(run_dir: Path, *args: str) -> int:
    try:
        return standin_stages.main([args[0], "--run-dir", str(run_dir), *args[1:]])
    except SystemExit as exc:  # the stand-in's configured failure
        return int(exc.code)


def _run_dir(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir()
    (d / "pipeline.yaml").write_text(PIPELINE)
    assert _stage(d, "prepare") == 0
    return d


def test_parse_shard_and_select_refuse_bad_ranges() -> None:
    assert parse_shard("3:7") == (3, 7)
    for bad in ("3", "7:3", "a:b", "-1:2"):
        with pytest.raises(ValueError, match="write START:END"):
            parse_shard(bad)
    rows = [{"i": i} for i in range(5)]
    assert select(rows, (1, 3)) == rows[1:3]
    from eagle3ops.stages.manifest import StageInputError

    with pytest.raises(StageInputError, match="ends past the 5 prepared samples"):
        select(rows, (3, 6))


def test_shards_on_three_hosts_merge_to_the_one_host_manifest_and_a_failed_shard_resumes(tmp_path, monkeypatch):
    one = _run_dir(tmp_path, "onehost")
    assert _stage(one, "extract") == 0
    whole = json.loads((one / "extract/manifest.json").read_text())
    hosts = {h: _run_dir(tmp_path, h) for h in ("a", "b", "c")}
    shards = shard_ranges(11, list(hosts))
    # b's shard fails after 2 new samples, then resumes: only the rest is written on the rerun
    monkeypatch.setenv("EAGLE3OPS_STANDIN_FAIL_AFTER", "2")
    assert _stage(hosts["b"], "extract", "--shard", f"{shards[1].start}:{shards[1].end}") == 2
    assert not (hosts["b"] / f"extract/shards/{shards[1].start}-{shards[1].end}.json").exists()
    monkeypatch.delenv("EAGLE3OPS_STANDIN_FAIL_AFTER")
    for s in shards:
        assert _stage(hosts[s.host], "extract", "--shard", f"{s.start}:{s.end}") == 0
    texts = {s.rank: (hosts[s.host] / f"extract/shards/{s.start}-{s.end}.json").read_text() for s in shards}
    assert json.loads(texts[1])["samples_this_run"] == shards[1].samples - 2
    # a finished shard is not redone
    assert _stage(hosts["b"], "extract", "--shard", f"{shards[1].start}:{shards[1].end}") == 0
    assert (hosts["b"] / f"extract/shards/{shards[1].start}-{shards[1].end}.json").read_text() == texts[1]
    merged = merge_manifests(shards, texts)
    assert merged["sample_files"] == whole["sample_files"] and merged["files"] == whole["files"]
    assert merged["tokens"] == whole["tokens"] and merged["samples"] == 11
    check_merged(merged, (hosts["a"] / "prepare/manifest.json").read_text())
    # another host's prepare with other samples is caught by content, not by the manifest's time
    other = json.loads((hosts["a"] / "prepare/manifest.json").read_text())
    other["files"]["samples.jsonl"]["sha256"] = "0" * 64
    with pytest.raises(MergeError, match="the hosts prepared other samples"):
        check_merged(merged, json.dumps(other))


def test_merge_run_reads_each_windows_manifest_and_binds_the_train_hosts_prepare(tmp_path):
    hosts = {h: _run_dir(tmp_path, h) for h in ("a", "b")}
    fleet = [FleetHost("a", None, 600, 0), FleetHost("b", None, 600, 0)]
    plan = plan_fleet("r", fleet, 11, 100, tokens_exact=True, limits={}, policy=FleetConfig())
    for s in plan.shards:
        assert _stage(hosts[s.host], "extract", "--shard", f"{s.start}:{s.end}") == 0

    def read(host: str, path: str) -> str | None:
        p = hosts[host] / path.split("/runs/r/", 1)[1]
        return p.read_text() if p.is_file() else None

    merged = merge_run(plan, read, {"a": "/d", "b": "/d"}, "b")
    import hashlib

    prep_sha = hashlib.sha256((hosts["b"] / "prepare/manifest.json").read_bytes()).hexdigest()
    assert merged["inputs"]["prepare"] == prep_sha
    assert merged["fleet"]["train_host"] == "b" and merged["samples"] == 11
    (hosts["b"] / f"extract/shards/{plan.shards[1].start}-{plan.shards[1].end}.json").unlink()
    with pytest.raises(MergeError, match="no extract manifest"):
        merge_run(plan, read, {"a": "/d", "b": "/d"}, "a")


def _plan(serving: dict[str, str | None], limit: int):
    fleet = [FleetHost(h, m, 600, 60) for h, m in serving.items()]
    return plan_fleet("r", fleet, 30, 300, tokens_exact=True, limits={"m": limit}, policy=FleetConfig())


def test_run_plan_keeps_the_down_at_once_limit_and_runs_hosts_without_serving_beside_the_waves() -> None:
    plan = _plan({"s0": "m", "s1": "m", "s2": "m", "free": None}, 1)
    spans: dict[str, tuple[float, float]] = {}
    lock = threading.Lock()
    last_wave = threading.Event()
    free_saw_last_wave = []

    def run_one(w):
        if w.serving is None:  # held until the last serving wave starts: the waves must not wait for this host
            free_saw_last_wave.append(last_wave.wait(timeout=10))
            return {"outcome": "ok"}
        if w.host == "s2":
            last_wave.set()
        t0 = time.monotonic()
        time.sleep(0.05)
        with lock:
            spans[w.host] = (t0, time.monotonic())
        return {"outcome": "ok"}

    res = run_plan(plan, run_one)
    assert res.ok and len(res.outcomes) == 4
    serving = sorted(spans[h] for h in ("s0", "s1", "s2"))
    assert all(a[1] <= b[0] for a, b in zip(serving, serving[1:])), serving  # never two down at once
    assert free_saw_last_wave == [True]


def test_run_plan_runs_no_window_of_no_samples() -> None:
    fleet = [FleetHost(h, "m", 600, 60) for h in ("s0", "s1", "s2")]
    plan = plan_fleet("r", fleet, 2, 20, tokens_exact=True, limits={"m": 2}, policy=FleetConfig())
    ran = []
    res = run_plan(plan, lambda w: ran.append(w.host) or {"outcome": "ok"})
    assert res.ok and sorted(ran) == ["s0", "s1"]  # s2's shard is empty: its serving is never stopped


def test_run_plan_stops_starting_waves_after_a_failed_one_and_says_which_did_not_start() -> None:
    plan = _plan({"s0": "m", "s1": "m", "s2": "m", "free": None}, 2)

    def run_one(w):
        if w.host == "s1":
            raise RuntimeError("preflight failed")
        return {"outcome": "ok"}

    res = run_plan(plan, run_one)
    assert not res.ok
    assert [w.host for w in res.not_started] == ["s2"]
    bad = [o for o in res.outcomes if not o.ok]
    assert [o.window.host for o in bad] == ["s1"] and "preflight failed" in bad[0].as_dict()["error"]
    assert {o.window.host for o in res.outcomes} == {"s0", "s1", "free"}


def test_measured_rates_come_from_a_venv_hosts_shard_window() -> None:
    """The planner's rates (:func:`eagle3ops.fleet.gather.measured_rates`) from a fleet window of a venv host: the run
    from its argv's ``--run-dir <data_dir>/runs/<run>``, the figures from its ``--shard`` manifest."""
    from types import SimpleNamespace

    from eagle3ops.fleet.gather import measured_rates

    host = SimpleNamespace(state_dir="/s", data_dir="/d")
    files = {
        "/s/windows/20261205T000000Z-extract-abc/result.json": {"outcome": "ok", "stage_seconds": {"prepare": 1.0,
                                                                "extract": 9.0}, "downtime_s": 14.0},
        "/s/windows/20261205T000000Z-extract-abc/plan.json": {"stages": [{"spec": {"argv": [
            "/s/env/x/bin/eagle3ops-stage", "extract", "--run-dir", "/d/runs/big", "--shard", "4:8"]}}]},
        "/d/runs/big/extract/shards/4-8.json": {"generate_s": 8.0, "generate_tokens_per_s": 50.0},
    }

    class Reader:
        def __init__(self):
            self.host = host

        def run(self, argv, check=True):
            path = argv[1]  # cat_if_exists: find PATH -maxdepth 0 ... -exec cat
            if argv[0] == "ls":
                return SimpleNamespace(ok=True, stdout="20261205T000000Z-extract-abc\n20261205T000001Z-train-d\n")
            text = json.dumps(files[path]) if path in files else ""
            return SimpleNamespace(ok=bool(text), stdout=text)

    rates = measured_rates(Reader())
    assert rates is not None and rates.tokens_per_s == 50.0
    assert rates.fixed_s == 14.0 - 8.0 and rates.stage_fixed_s == 10.0 - 8.0


def test_a_scheduler_tasks_shard_is_read_from_its_environment_like_shard() -> None:
    """``render``'s variables (the ranges, their count, the task's index) give the range ``--shard`` would: one
    resolution for both; a bad or disagreeing value is refused naming the variable."""
    from eagle3ops.stages.shards import resolve_shard

    env = {"EAGLE3OPS_SHARD_RANGES": "[[0,4],[4,7],[7,10]]", "EAGLE3OPS_SHARD_COUNT": "3",
           "EAGLE3OPS_SHARD_INDEX": "1"}
    assert resolve_shard(None, env) == (4, 7) == resolve_shard("4:7", env) == resolve_shard("4:7", {})
    assert resolve_shard(None, {}) is None
    for bad, match in ((dict(env, EAGLE3OPS_SHARD_INDEX="3"), "EAGLE3OPS_SHARD_INDEX 3: .* 0..2"),
                       ({k: v for k, v in env.items() if k != "EAGLE3OPS_SHARD_INDEX"}, "EAGLE3OPS_SHARD_INDEX"),
                       (dict(env, EAGLE3OPS_SHARD_COUNT="2"), "EAGLE3OPS_SHARD_COUNT 2 .* 3 ranges"),
                       (dict(env, EAGLE3OPS_SHARD_RANGES="[[0,4],[5,7]]"), "contiguous"),
                       (dict(env, EAGLE3OPS_SHARD_RANGES="0:4"), "EAGLE3OPS_SHARD_RANGES.*JSON")):
        with pytest.raises(ValueError, match=match):
            resolve_shard(None, bad)
    with pytest.raises(ValueError, match="--shard 0:4 .* EAGLE3OPS_SHARD_INDEX 1 .* 4:7"):
        resolve_shard("0:4", env)


def test_stage_merge_joins_a_shared_run_dirs_shards_and_refuses_an_unfinished_one(tmp_path):
    """A scheduler's run: every task's shard in one run directory; ``stage merge`` (the real stage command, the
    ranges from render's variables) refuses while a shard is unfinished, then writes the one-host manifest, and
    leaves an equal one untouched (a train made from it stays current)."""
    from typer.testing import CliRunner

    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages.cli import app as stage_app
    from eagle3ops.stages.manifest import finished

    one = _run_dir(tmp_path, "onehost")
    assert _stage(one, "extract") == 0
    whole = json.loads((one / "extract/manifest.json").read_text())
    run = _run_dir(tmp_path, "shared")
    shards = shard_ranges(11, ["t0", "t1", "t2"])
    env = {"EAGLE3OPS_SHARD_RANGES": json.dumps([[s.start, s.end] for s in shards]), "EAGLE3OPS_SHARD_COUNT": "3"}
    for s in shards[:2]:
        assert _stage(run, "extract", "--shard", f"{s.start}:{s.end}") == 0
    merge = ["merge", "--run-dir", str(run)]
    res = CliRunner().invoke(stage_app, merge, env=env)
    assert res.exit_code == 2 and "task(s) 2 ([8, 11)" in res.output and "rerun those extract tasks" in res.output
    assert not (run / "extract/manifest.json").exists()
    assert _stage(run, "extract", "--shard", f"{shards[2].start}:{shards[2].end}") == 0
    res = CliRunner().invoke(stage_app, merge, env=env)
    assert res.exit_code == 0 and "merge: 3 shards, 11 samples" in res.output, res.output
    merged = json.loads((run / "extract/manifest.json").read_text())
    assert merged["sample_files"] == whole["sample_files"] and merged["files"] == whole["files"]
    assert finished(run, "extract", load_pipeline_config(run)) is not None  # what train checks: a finished extract
    before = (run / "extract/manifest.json").stat().st_mtime_ns
    res = CliRunner().invoke(stage_app, merge, env=env)
    assert res.exit_code == 0 and "already holds" in res.output
    assert (run / "extract/manifest.json").stat().st_mtime_ns == before
    res = CliRunner().invoke(stage_app, merge, env={})
    assert res.exit_code == 2 and "EAGLE3OPS_SHARD_RANGES is not set" in res.output
