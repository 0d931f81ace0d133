"""Stage side: a finished stage is a no-op for the same inputs, its output never touched; the
decision is made from manifest texts alone, so the driver can make it before a window stops serving."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3ops.config.pipeline import load_pipeline_config
from eagle3ops.stages.manifest import MANIFEST, done_status, file_entry, finished, stage_dir, write_manifest


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "pipeline.yaml").write_text("target_model: /model\nprepare: {max_seq_len: 64}\n")
    cfg = load_pipeline_config(run)
    for stage in ("prepare", "extract"):
        d = stage_dir(run, stage)
        d.mkdir()
        (d / "out.bin").write_bytes(stage.encode() * 10)
        write_manifest(run, stage, cfg, {"out.bin": file_entry(d / "out.bin")}, samples=3)
    return run


def _texts(run: Path) -> dict[str, str | None]:
    return {s: (stage_dir(run, s) / MANIFEST).read_text() for s in ("prepare", "extract")}


def test_finished_stage_with_the_same_inputs_is_done(run):
    cfg = load_pipeline_config(run)
    assert done_status("extract", cfg, _texts(run))[0]
    assert finished(run, "prepare", cfg)["samples"] == 3 and finished(run, "extract", cfg) is not None


def test_other_settings_or_other_inputs_are_not_done(run):
    (run / "pipeline.yaml").write_text("target_model: /model\nprepare: {max_seq_len: 128}\n")
    cfg = load_pipeline_config(run)
    ok, why = done_status("prepare", cfg, _texts(run))
    assert not ok and "other settings of target_model, seed, prepare" in why
    ok, why = done_status("extract", cfg, _texts(run))  # extract's own settings are unchanged, its input is stale
    assert not ok and why.startswith("prepare: made with other settings")
    (run / "pipeline.yaml").write_text("target_model: /model\nprepare: {max_seq_len: 64}\n")
    cfg = load_pipeline_config(run)
    texts = _texts(run)
    texts["prepare"] = texts["prepare"].replace('"samples": 3', '"samples": 4')  # another prepare output
    ok, why = done_status("extract", cfg, texts)
    assert not ok and "another `prepare` output" in why
    assert not done_status("vocab", cfg, {**texts, "vocab": None})[0]
    (stage_dir(run, "extract") / "out.bin").write_bytes(b"short")  # a listed file changed size
    assert finished(run, "extract", cfg) is None


def test_rerunning_a_finished_stage_through_the_cli_touches_nothing(run):
    d = stage_dir(run, "extract")
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in d.iterdir()}
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    cp = subprocess.run([sys.executable, "-m", "eagle3ops", "stage", "extract", "--run-dir", str(run)],
                        capture_output=True, text=True, timeout=120, env=env)
    assert cp.returncode == 0, cp.stderr
    assert "already done for these inputs" in cp.stdout + cp.stderr
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in d.iterdir()} == before
    assert json.loads((d / MANIFEST).read_text())["samples"] == 3


def test_restart_replaces_a_finished_output_only_once_the_new_one_is_complete(run):
    """``--restart`` over a finished stage builds the new output beside it; until it is promoted,
    the finished output (and its manifest) is whole, so a restart that fails leaves it usable."""
    from eagle3ops.stages.manifest import output_dir, promote, restart_dir

    cfg = load_pipeline_config(run)
    final = stage_dir(run, "extract")
    before = {p.name: p.read_bytes() for p in final.iterdir()}
    out = output_dir(run, "extract", restart=True)
    assert out == restart_dir(run, "extract") and out != final
    out.mkdir()
    (out / "out.bin").write_bytes(b"new" * 7)
    # the new run dies here: the finished output is untouched and still done
    assert {p.name: p.read_bytes() for p in final.iterdir()} == before and finished(run, "extract", cfg)
    out = output_dir(run, "extract", restart=True)  # the restart again starts from scratch
    assert not out.exists()
    out.mkdir()
    (out / "out.bin").write_bytes(b"new" * 7)
    promote(run, "extract", out)
    write_manifest(run, "extract", cfg, {"out.bin": file_entry(final / "out.bin")})
    assert (final / "out.bin").read_bytes() == b"new" * 7 and not out.exists()
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []
    assert finished(run, "extract", cfg)["files"]["out.bin"]["bytes"] == 21
    # without a finished output a restart writes in place; without --restart, always in place
    assert output_dir(run, "vocab", restart=True) == stage_dir(run, "vocab")
    assert output_dir(run, "extract", restart=False) == final
