"""Bounded disk, in the pipeline image, on the tiny Llama target. Stage ``chunked`` through the CLI: a run
whose hidden states are over its budget is extracted and trained in two chunks; the sample
files on disk never exceed the budget, every training step reads only its pass's chunk, every training sample is
trained once in the epoch, and the head, the train manifest and the offline estimate come out as in a one-chunk run. And
``extract.hidden_dtype: float8_e4m3fn``: about half the bytes, read back within fp8's error, trained on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from eagle3ops.config.pipeline import load_pipeline_config  # noqa: E402
from eagle3ops.stages import chunkplan  # noqa: E402
from eagle3ops.stages.chunked import make_plan  # noqa: E402
from eagle3ops.stages.prepare import run_prepare  # noqa: E402
from eagle3ops.stages.vocab import run_vocab  # noqa: E402
from eagle3ops.fixtures.tinymodel import build_tiny_model  # noqa: E402

QUIET = lambda *_a, **_k: None  # noqa: E731


def _stage(run: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3ops", "stage", *args, "--run-dir", str(run)],
                          capture_output=True, text=True, timeout=540, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", kind="llama")


def test_a_run_over_its_budget_trains_in_chunks_within_the_budget(tmp_path: Path, model: Path) -> None:
    from eagle3ops.stages.chunked import run_chunked

    run = tmp_path / "run"
    run.mkdir()
    cfg = {"target_model": str(model), "prepare": {"max_seq_len": 256, "max_samples": 16},
           "extract": {"engine": "transformers", "aux_layer_ids": [0, 1, 2]}, "vocab": {"draft_vocab_size": 256},
           "train": {"steps": 1, "checkpoint_every": 100, "batch_max_tokens": 384, "held_out_fraction": 0.15},
           "chunks": {"count": 2, "budget_bytes": 1}}
    (run / "pipeline.yaml").write_text(json.dumps(cfg))
    c = load_pipeline_config(run)
    run_prepare(run, c, log=QUIET)
    run_vocab(run, c, log=QUIET)
    # two chunks, one epoch (2 passes: CI's cost; the benchmarks run two epochs); the budget: 60 % of every sample
    # file's bytes, which the held-out samples and the larger chunk fit
    tokens = [len(json.loads(x)["input_ids"]) for x in (run / "prepare/samples.jsonl").read_text().splitlines()]
    total = sum(chunkplan.sample_bytes(t, 128) for t in tokens)
    budget = int(total * 0.6)
    cfg["chunks"]["budget_bytes"] = budget
    (run / "pipeline.yaml").write_text(json.dumps(cfg))
    one = make_plan(run, load_pipeline_config(run))
    cfg["train"]["steps"] = one.steps_per_epoch
    (run / "pipeline.yaml").write_text(json.dumps(cfg))

    said: list[str] = []
    dry = run_chunked(run, load_pipeline_config(run), log=said.append, dry_run=True)
    assert dry["passes_run"] == 0 and "pass epoch 0 chunk 1: extract" in "\n".join(said)
    assert not (run / "chunks").exists() and not (run / "extract").exists()  # the dry run wrote nothing

    r = _stage(run, "chunked")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    plan = chunkplan.from_json(json.loads((run / "chunks/plan.json").read_text()))
    assert len(plan.chunks) == 2 and plan.peak_bytes <= budget < plan.total_bytes and not plan.notes
    passes = [json.loads(x) for x in (run / "chunks/passes.jsonl").read_text().splitlines()]
    assert [(p["epoch"], p["chunk"]) for p in passes] == [(0, 0), (0, 1)]
    assert max(p["sample_bytes_on_disk"] for p in passes) <= budget  # measured after each pass's extract
    man = json.loads((run / "train/manifest.json").read_text())
    assert man["steps"] == cfg["train"]["steps"] and (run / "train/final/model.safetensors").is_file()
    # readable by the host's SSH user, who sizes them before a window and copies them (safetensors writes 0600)
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in (run / "train/final").iterdir())
    est = man["offline_estimate"]
    assert est["held_out_samples"] == len(plan.held) and est["acceptance_length"] >= 1.0
    # each step inside its pass's chunk; every training sample once in the epoch
    steps = [json.loads(x) for x in (run / "train/metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, cfg["train"]["steps"] + 1))
    seen: dict[int, list[int]] = {0: []}
    for x in plan.passes:
        for s in steps[x.step_start: x.step_end]:
            ids = [i for b in s["samples"] if b for i in b]
            assert all(x.start <= i < x.end for i in ids), (x, s["samples"])
            seen[x.epoch] += ids
    train_ids = sorted(set(range(len(tokens))) - set(plan.held))
    assert sorted(seen[0]) == train_ids
    # what is left on disk: the held-out samples and the last chunk's
    left = {int(p.stem.split("_")[1]) for p in (run / "extract/hidden").glob("data_*.pt")}
    a, b = plan.chunks[-1]
    assert left == set(plan.held) | set(range(a, b))
    # a rerun is a no-op (every pass's last step reached)
    said.clear()
    again = run_chunked(run, load_pipeline_config(run), log=said.append)
    assert again["passes_run"] == 0 and any("resuming the recorded plan" in x for x in said)
    # stage train alone cannot redo a chunked run (its first step needs a deleted chunk): refused, the head kept
    head = (run / "train/final/model.safetensors").read_bytes()
    bad = _stage(run, "train", "--restart")
    assert bad.returncode == 2 and "outside the current chunk" in bad.stderr, bad.stderr[-2000:]
    assert (run / "train/final/model.safetensors").read_bytes() == head


def test_fp8_hidden_states_take_about_half_the_bytes_and_read_back_within_fp8_error(tmp_path: Path, model: Path):
    import torch

    from eagle3ops.stages.draft import dequantize
    from eagle3ops.stages.extract import run_extract
    from eagle3ops.stages.train import run_train

    runs = {}
    for dtype in ("bfloat16", "float8_e4m3fn"):
        run = tmp_path / dtype
        run.mkdir()
        (run / "pipeline.yaml").write_text(json.dumps({
            "target_model": str(model), "prepare": {"max_seq_len": 256, "max_samples": 6},
            "extract": {"engine": "transformers", "aux_layer_ids": [0, 1, 2], "hidden_dtype": dtype},
            "vocab": {"draft_vocab_size": 256}, "train": {"steps": 2, "batch_max_tokens": 384}}))
        c = load_pipeline_config(run)
        run_prepare(run, c, log=QUIET)
        run_vocab(run, c, log=QUIET)
        runs[dtype] = run_extract(run, c, log=QUIET)
    a, b = runs["bfloat16"], runs["float8_e4m3fn"]
    assert b["dtype"] == "float8_e4m3fn" and b["tokens"] == a["tokens"]
    assert 0.45 < b["file_bytes"] / a["file_bytes"] < 0.62, (a["file_bytes"], b["file_bytes"])
    assert b["hidden_bytes"] == a["tokens"] * 4 * (128 + 4)
    f = "hidden/data_000000.pt"
    ref = torch.load(tmp_path / "bfloat16/extract" / f, weights_only=True)
    q = torch.load(tmp_path / "float8_e4m3fn/extract" / f, weights_only=True)
    assert q["hidden_states"][0].dtype == torch.float8_e4m3fn and len(q["hidden_scales"]) == 4
    back = dequantize(q)
    for h, r in zip(back["hidden_states"], ref["hidden_states"]):
        err = (h.float() - r.float()).norm() / r.float().norm()
        assert h.dtype == torch.bfloat16 and float(err) < 0.05  # e4m3: 3 mantissa bits, ~2-4 % per value
    fig = run_train(tmp_path / "float8_e4m3fn", load_pipeline_config(tmp_path / "float8_e4m3fn"), log=QUIET)
    assert fig["steps"] == 2 and fig["final_metrics"]["loss"] == fig["final_metrics"]["loss"]  # finite, trained
