"""``eagle3ops extract HOST HOST...`` through the real CLI (typer's runner), offline: the fleet plan is printed
before anything stops, no host is reached; a dead host's shard moves. The real run over several hosts:
tests/test_fleet_extract.py. One host keeps today's
path (tests/test_config_kimi.py runs it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from eagle3ops.cli import app

REPO = Path(__file__).resolve().parents[1]
INVENTORY = REPO / "deploy/hosts.kimi-k25.example.yaml"
PIPELINE = REPO / "deploy/pipeline.kimi-k25.example.yaml"


@pytest.fixture()
def fleet_files(tmp_path, monkeypatch):
    """A three-host inventory (two serving Kimi, one `serving: none`, each unreachable) with `fleet:` limit 1, and a
    pipeline with prepare.max_samples 1000; any socket connection fails the test."""
    import socket

    def refuse(*a, **k):
        raise AssertionError("an offline fleet dry run tried to connect")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    raw = yaml.safe_load(INVENTORY.read_text())
    base = raw["hosts"]["kimi-01"]
    base.update(hostname="kimi-01.invalid", port=9)
    raw["hosts"]["kimi-02"] = {**base, "hostname": "kimi-02.invalid"}
    raw["hosts"]["rent-01"] = {k: v for k, v in base.items() if k != "serving"} | {"hostname": "rent-01.invalid",
                                                                                  "serving": "none"}
    raw["fleet"] = {"max_down_per_model": 1}
    inv = tmp_path / "hosts.yaml"
    inv.write_text(yaml.safe_dump(raw))
    pipe = yaml.safe_load(PIPELINE.read_text())
    pipe.setdefault("prepare", {})["max_samples"] = 1000
    pf = tmp_path / "pipeline.yaml"
    pf.write_text(yaml.safe_dump(pipe))
    return inv, pf


def test_offline_fleet_dry_run_prints_shards_and_waves(fleet_files):
    inv, pf = fleet_files
    res = CliRunner().invoke(app, ["extract", "kimi-01", "kimi-02", "rent-01", "-i", str(inv), "--pipeline", str(pf),
                                   "--run", "big", "--dry-run", "--offline"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "shard 0: samples [0, 334) (334) on kimi-01" in out
    assert "shard 2: samples [667, 1000) (333) on rent-01" in out
    assert "rent-01 (serving: none, no window)" in out
    assert "kimi-01: no finished extract window measured yet" in out
    plan = json.loads(out[out.index("\n{") + 1:])
    waves = {w["host"]: w["wave"] for w in plan["windows"]}
    assert waves == {"kimi-01": 0, "rent-01": 0, "kimi-02": 1}  # limit 1: the two Kimi hosts never down together
    assert plan["tokens_exact"] is False and plan["max_down_per_model"] == {"kimi-k2.5": 1}


def test_fleet_run_offline_is_refused_and_dead_hosts_are_checked(fleet_files):
    inv, pf = fleet_files
    res = CliRunner().invoke(app, ["extract", "kimi-01", "rent-01", "-i", str(inv), "--pipeline", str(pf),
                                   "--offline"])
    assert res.exit_code == 2 and "--offline needs --dry-run" in " ".join(res.output.split())
    res = CliRunner().invoke(app, ["extract", "kimi-01", "rent-01", "-i", str(inv), "--pipeline", str(pf),
                                   "--dry-run", "--offline", "--dead", "kimi-02"])
    assert res.exit_code == 2 and "--dead kimi-02: not among this run's hosts" in " ".join(res.output.split())
    res = CliRunner().invoke(app, ["extract", "kimi-01", "--dead", "kimi-01", "-i", str(inv), "--pipeline", str(pf)])
    assert res.exit_code == 2 and "for a run over several hosts" in " ".join(res.output.split())


def test_offline_dry_run_with_a_dead_host_moves_its_shard_to_the_host_without_serving(fleet_files):
    inv, pf = fleet_files
    res = CliRunner().invoke(app, ["extract", "kimi-01", "kimi-02", "rent-01", "-i", str(inv), "--pipeline", str(pf),
                                   "--run", "big", "--dry-run", "--offline", "--dead", "kimi-02"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output[res.output.index("\n{") + 1:])
    assert [(s["rank"], s["host"], s["start"], s["end"]) for s in plan["shards"]] == [
        (0, "kimi-01", 0, 334), (1, "rent-01", 334, 667), (2, "rent-01", 667, 1000)]
    assert "kimi-02" not in {w["host"] for w in plan["windows"]}
    assert "shard 1 [334, 667) moved to rent-01" in plan["notes"]


def test_unknown_host_and_repeated_host_are_refused(fleet_files):
    inv, pf = fleet_files
    res = CliRunner().invoke(app, ["extract", "kimi-01", "nope", "-i", str(inv), "--pipeline", str(pf),
                                   "--dry-run", "--offline"])
    assert res.exit_code == 2 and "no host 'nope'" in " ".join(res.output.split())
    res = CliRunner().invoke(app, ["extract", "kimi-01", "kimi-01", "-i", str(inv), "--pipeline", str(pf),
                                   "--dry-run", "--offline"])
    assert res.exit_code == 2 and "kimi-01 named more than once" in " ".join(res.output.split())


def test_train_from_fleet_refuses_offline_and_a_manifest_naming_an_unknown_host(fleet_files, tmp_path):
    inv, pf = fleet_files
    merged = tmp_path / "merged.json"
    merged.write_text(json.dumps({"fleet": {"shards": [{"rank": 0, "host": "gone-07", "start": 0, "end": 1}]}}))
    res = CliRunner().invoke(app, ["train", "kimi-01", "-i", str(inv), "--pipeline", str(pf), "--from-fleet",
                                   str(merged), "--dry-run", "--offline"])
    assert res.exit_code == 2 and "--offline does not go with --from-fleet" in res.output
    res = CliRunner().invoke(app, ["train", "kimi-01", "-i", str(inv), "--pipeline", str(pf), "--from-fleet",
                                   str(merged), "--dry-run"])
    assert res.exit_code == 2 and "gone-07" in res.output, res.output  # refused before any host is reached
    merged.write_text(json.dumps({"samples": 3}))  # not a merged fleet manifest: refused by name, no traceback
    res = CliRunner().invoke(app, ["train", "kimi-01", "-i", str(inv), "--pipeline", str(pf), "--from-fleet",
                                   str(merged), "--dry-run"], catch_exceptions=False)
    assert res.exit_code == 2 and "no `fleet.shards`" in res.output, res.output
