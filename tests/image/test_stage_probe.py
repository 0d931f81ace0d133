"""``eagle3ops stage probe``: the hidden-state correctness probe on the tiny Llama (real vLLM 0.16 CPU, real
transformers reference), and its failure path on misattributed states.

Development: ``PYTHONPATH=<patched speculators overlay>:src /opt/e3/venv-ml/bin/python -m pytest
tests/image/test_stage_probe.py`` (``-m slow`` for the vLLM run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from eagle3ops.stages.cli import app  # noqa: E402
from eagle3ops.stages.extract import TransformersEngine  # noqa: E402
from eagle3ops.fixtures.tinymodel import build_tiny_model  # noqa: E402

ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("probe")
    model = build_tiny_model(root / "llama", kind="llama")
    run = root / "run"
    run.mkdir()
    cfg = {"target_model": str(model), "prepare": {"max_seq_len": 256}, "extract": {"aux_layer_ids": [0, 1, 2]}}
    (run / "pipeline.yaml").write_text(json.dumps(cfg))
    return run


@pytest.mark.slow
def test_probe_command_passes_on_the_tiny_llama_with_chunked_prefill_and_two_calls(run):
    r = subprocess.run([sys.executable, "-m", "eagle3ops", "stage", "probe", "--run-dir", str(run)],
                       env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads((run / "probe/report.json").read_text())
    assert rep["passed"] is True and rep["dtype"] == "bfloat16" and rep["layer_ids"] == [0, 1, 2, 3]
    assert rep["calls"] == [40, 9]  # first call above speculators' 32-sequence scheduler limit; then a second
    # max_model_len 257 -> a 128-token step budget; sequences of up to 256 tokens are prefilled in chunks
    assert rep["max_num_batched_tokens"] == 128 and rep["chunked_sequences"] >= 10
    assert rep["token_source"] == "random ids"  # no prepare/ in this run
    assert rep["median"] <= 0.02 and rep["p99"] <= 0.06 and rep["frac_above_0.05"] <= 0.01
    assert 0 < rep["median"] < rep["p99"] <= rep["max"]  # real bf16 rounding differences, not identical engines
    assert "PASS" in r.stdout and "p99" in r.stdout


def test_probe_fails_with_a_clear_message_on_states_of_the_wrong_position(run, monkeypatch):
    """An engine whose states are one token late (the class of speculators #279: states attributed to the wrong
    position) fails the probe: exit 1, a message naming the limits crossed, and a report saying so."""

    class Shifted(TransformersEngine):
        def generate(self, token_ids):
            out = super().generate(token_ids)
            for r in out:
                r["hidden_states"] = [torch.roll(h, 1, dims=0) for h in r["hidden_states"]]
            return out

    monkeypatch.setattr("eagle3ops.stages.extract.make_vllm_generator",
                        lambda config, layer_ids, **_kw: Shifted(config.target_model, layer_ids, device="cpu"))
    res = CliRunner().invoke(app, ["probe", "--run-dir", str(run), "--num-seqs", "41",
                                   "--max-num-batched-tokens", "32"])
    assert res.exit_code == 1, res.output
    err = res.stderr if hasattr(res, "stderr") else res.output
    assert "stage probe FAILED" in err and "median" in err and "report.json" in err
    rep = json.loads((run / "probe/report.json").read_text())
    assert rep["passed"] is False and rep["median"] > 0.3 and rep["calls"] == [33, 9]


def test_probe_refuses_a_batch_within_the_scheduler_limit(run):
    res = CliRunner().invoke(app, ["probe", "--run-dir", str(run), "--num-seqs", "32"])
    assert res.exit_code == 2 and "num-seqs" in res.output
