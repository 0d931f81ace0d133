"""The train stage's distributed path on CPU: torchrun with 2 gloo processes (FSDP2), and checkpoints that resume
across world sizes (2 -> 1 and 1 -> 2). Real speculators draft head on the tiny Llama's extracted hidden states.

Development: ``PYTHONPATH=<patched speculators overlay>:src /opt/e3/venv-ml/bin/python -m pytest
tests/image/test_stages_distributed.py`` (about 2 minutes on 2 cores).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from eagle3ops.config.pipeline import load_pipeline_config  # noqa: E402
from eagle3ops.stages.extract import run_extract  # noqa: E402
from eagle3ops.stages.prepare import run_prepare  # noqa: E402
from eagle3ops.stages.train import NPROC_ENV, resolve_nproc, run_train  # noqa: E402
from eagle3ops.stages.vocab import run_vocab  # noqa: E402
from eagle3ops_dev.tinymodel import build_tiny_model  # noqa: E402

QUIET = lambda *_a, **_k: None  # noqa: E731


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """prepare (42 samples), extract (reference engine) and vocab done on the tiny Llama; train not yet."""
    root = tmp_path_factory.mktemp("dist")
    model = build_tiny_model(root / "llama", kind="llama")
    run = root / "base"
    run.mkdir()
    cfg = {"target_model": str(model), "prepare": {"max_seq_len": 256},
           "extract": {"engine": "transformers", "aux_layer_ids": [0, 1, 2]}, "vocab": {"draft_vocab_size": 256},
           "train": {"steps": 4, "checkpoint_every": 2, "batch_max_tokens": 512}}
    (run / "pipeline.yaml").write_text(json.dumps(cfg))
    for fn in (run_prepare, run_extract, run_vocab):
        fn(run, load_pipeline_config(run), log=QUIET)
    return run


def _losses(run: Path) -> list[float]:
    return [json.loads(x)["loss"] for x in (run / "train/metrics.jsonl").read_text().splitlines()]


def _ckpt(run: Path, step: int) -> Path:
    return run / f"train/checkpoints/step_{step:08d}"


def _tamper(ckpt: Path) -> torch.Tensor:
    """Shift fc.weight by 0.01 and give it a zero first moment and a huge second moment: a resume that loads
    both the weights and the optimizer state then leaves fc.weight where it is (updates ~1e-9); one that loads
    neither, or only one, moves it by ~1e-4 (a fresh Adam step) or lands 0.01 away. Returns the new fc.weight."""
    from safetensors.torch import load_file, save_file

    sd = load_file(ckpt / "model.safetensors")
    sd["fc.weight"] = sd["fc.weight"] + 0.01
    save_file(sd, ckpt / "model.safetensors", metadata={"format": "pt"})
    osd = torch.load(ckpt / "optimizer.pt", weights_only=True)
    st = osd["state"]["fc.weight"]
    st["exp_avg"], st["exp_avg_sq"] = torch.zeros_like(st["exp_avg"]), torch.full_like(st["exp_avg_sq"], 1e8)
    torch.save(osd, ckpt / "optimizer.pt")
    return sd["fc.weight"]


def _assert_resumed_from(run: Path, tampered: torch.Tensor) -> None:
    from safetensors.torch import load_file

    w4 = load_file(_ckpt(run, 4) / "model.safetensors")["fc.weight"]  # fp32 checkpoint after 2 more steps
    assert (w4 - tampered).abs().max().item() < 2e-5  # AdamW decay moves it ~1e-6 per step, nothing else


def test_nproc_from_env_config_and_devices(base, monkeypatch):
    cfg = load_pipeline_config(base)
    monkeypatch.delenv(NPROC_ENV, raising=False)
    assert resolve_nproc(cfg) == (torch.cuda.device_count() if torch.cuda.is_available() else 1)  # auto
    assert resolve_nproc(cfg.model_copy(update={"train": cfg.train.model_copy(update={"nproc": 3})})) == 3
    monkeypatch.setenv(NPROC_ENV, "2")
    assert resolve_nproc(cfg) == 2
    monkeypatch.setenv(NPROC_ENV, "two")
    with pytest.raises(ValueError, match=NPROC_ENV):
        resolve_nproc(cfg)


def test_two_gloo_processes_checkpoint_resumes_in_one(tmp_path, base, monkeypatch):
    run = Path(shutil.copytree(base, tmp_path / "run"))
    monkeypatch.setenv(NPROC_ENV, "2")
    assert run_train(run, load_pipeline_config(run), log=QUIET, stop_after=2) == {"stopped_at": 2}
    state = json.loads((_ckpt(run, 2) / "state.json").read_text())
    assert state["world_size"] == 2 and not (run / "train/manifest.json").exists()
    osd = torch.load(_ckpt(run, 2) / "optimizer.pt", weights_only=True)
    assert "fc.weight" in osd["state"] and osd["state"]["fc.weight"]["exp_avg"].shape == (128, 384)  # full, unsharded
    tampered = _tamper(_ckpt(run, 2))
    monkeypatch.setenv(NPROC_ENV, "1")
    fig = run_train(run, load_pipeline_config(run), log=QUIET)
    assert fig["world_size"] == 1 and fig["resumed_from_step"] == 2 and fig["steps_this_run"] == 2
    assert fig["steps"] == 4 and len(_losses(run)) == 4 and all(math.isfinite(x) for x in _losses(run))
    assert (run / "train/final/model.safetensors").is_file()
    _assert_resumed_from(run, tampered)


def test_one_process_checkpoint_resumes_in_two_gloo_processes(tmp_path, base, monkeypatch):
    run = Path(shutil.copytree(base, tmp_path / "run"))
    monkeypatch.setenv(NPROC_ENV, "1")
    assert run_train(run, load_pipeline_config(run), log=QUIET, stop_after=2) == {"stopped_at": 2}
    tampered = _tamper(_ckpt(run, 2))
    monkeypatch.setenv(NPROC_ENV, "2")
    fig = run_train(run, load_pipeline_config(run), log=QUIET)
    assert fig["world_size"] == 2 and fig["distributed"] == "FSDP2 fully_shard, gloo"
    assert fig["resumed_from_step"] == 2 and fig["steps_this_run"] == 2 and fig["steps"] == 4
    losses = _losses(run)
    assert len(losses) == 4 and all(math.isfinite(x) and x > 0 for x in losses)
    assert len(fig["peak_memory_bytes_per_rank"]) == 2 and min(fig["peak_memory_bytes_per_rank"]) > 0
    # 2 ranks pack 2 batches per step: about twice the tokens of a 1-process step
    steps = [json.loads(x) for x in (run / "train/metrics.jsonl").read_text().splitlines()]
    assert sum(s["tokens"] for s in steps[2:]) > 1.4 * sum(s["tokens"] for s in steps[:2])
    _assert_resumed_from(run, tampered)
