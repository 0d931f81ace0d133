"""``train --restart`` over a finished train: the new output is built beside it (``.train.restart/``) and swapped in
only once complete, in one process and under torchrun (2 gloo ranks, which write where the launching process says).
A restart that stops early leaves the finished head, its metrics and manifest byte for byte as they were.

Development: run in the pipeline image with this checkout's ``src/eagle3ops`` mounted over the installed package
(about 2 minutes on 2 cores).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from eagle3ops.config.pipeline import load_pipeline_config  # noqa: E402
from eagle3ops.stages.extract import run_extract  # noqa: E402
from eagle3ops.stages.manifest import restart_dir  # noqa: E402
from eagle3ops.stages.prepare import run_prepare  # noqa: E402
from eagle3ops.stages.train import NPROC_ENV, run_train  # noqa: E402
from eagle3ops.stages.vocab import run_vocab  # noqa: E402
from eagle3ops.fixtures.tinymodel import build_tiny_model  # noqa: E402

QUIET = lambda *_a, **_k: None  # noqa: E731


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """prepare, extract (reference engine), vocab and a finished one-process train on the tiny Llama."""
    root = tmp_path_factory.mktemp("restart")
    model = build_tiny_model(root / "llama", kind="llama")
    run = root / "base"
    run.mkdir()
    cfg = {"target_model": str(model), "prepare": {"max_seq_len": 256},
           "extract": {"engine": "transformers", "aux_layer_ids": [0, 1, 2]}, "vocab": {"draft_vocab_size": 256},
           "train": {"steps": 3, "checkpoint_every": 2, "batch_max_tokens": 512, "nproc": 1}}
    (run / "pipeline.yaml").write_text(json.dumps(cfg))
    for fn in (run_prepare, run_extract, run_vocab, run_train):
        fn(run, load_pipeline_config(run), log=QUIET)
    return run


def _tree(d: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``d``."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("nproc", [1, 2])
def test_train_restart_replaces_the_finished_head_only_once_the_new_one_is_complete(tmp_path, finished, monkeypatch,
                                                                                    nproc):
    run = Path(shutil.copytree(finished, tmp_path / "run"))
    monkeypatch.setenv(NPROC_ENV, str(nproc))
    (run / "train/marker").write_text("the finished output")  # gone only once the new output replaced it
    before = _tree(run / "train")
    assert "manifest.json" in before and "final/model.safetensors" in before

    # a restart that ends early (as a killed or time-boxed one): the finished train is untouched
    assert run_train(run, load_pipeline_config(run), log=QUIET, restart=True, stop_after=1) == {"stopped_at": 1}
    assert _tree(run / "train") == before
    staged = restart_dir(run, "train")
    state = json.loads((staged / "checkpoints/step_00000001/state.json").read_text())
    assert state["world_size"] == nproc  # every rank wrote beside the finished output, not into it
    assert not (staged / "manifest.json").exists()

    # a complete restart: from scratch (not resumed from the staged step 1), then swapped in
    fig = run_train(run, load_pipeline_config(run), log=QUIET, restart=True)
    assert fig["world_size"] == nproc and fig["resumed_from_step"] == 0 and fig["steps_this_run"] == 3
    assert not staged.exists() and not (run / ".train.replaced").exists()
    after = _tree(run / "train")
    manifest = json.loads((run / "train/manifest.json").read_text())
    assert "marker" not in after and manifest["world_size"] == nproc
    assert manifest["vllm_speculative_config"]["model"] == str((run / "train/final").resolve())
    for rel, entry in manifest["files"].items():  # what the manifest lists is what is in place
        assert (run / "train" / rel).stat().st_size == entry["bytes"], rel
        assert after[rel] == entry["sha256"], rel
    assert len((run / "train/metrics.jsonl").read_text().splitlines()) == 3
