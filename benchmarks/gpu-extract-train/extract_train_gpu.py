"""The extract (reference engine) and train stages on a GPU with a small random Llama target.

vLLM does not travel to the lent GPU machine, so the hidden states there come from the ``transformers``
reference engine of the extract stage (a transformers forward of the same random target, hooks on the same
layers); everything else is the stage code as it runs in the pipeline image.

Two steps, because speculators' vocab module imports ``datasets`` (not on the GPU machine):

1. here (CPU): ``python benchmarks/gpu-extract-train/extract_train_gpu.py prep DIR`` writes ``/tmp/e3gpu/target`` (config and
   tokenizer only) and runs stages prepare and vocab into ``DIR/run``;
2. there (GPU): ``python benchmarks/gpu-extract-train/extract_train_gpu.py gpu DIR --out OUT`` builds the target's random weights
   (seeded) at the same path, runs stage extract, then stage train twice (eager and ``train.compile: true``,
   each in its own copy of the run directory and its own process) and writes ``OUT/figures.json``.

Target: Llama, hidden 4096, 32 heads / 8 KV heads, MLP 14336, vocabulary 128256 (Llama-3-8B's shapes), 4
layers (aux layers [0, 1, 2] + last 3); draft head: one Llama layer of the same width, draft vocabulary 32000.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py (the checkout goes to the device)
from lab import write_result  # noqa: E402

TARGET = Path("/tmp/e3gpu/target")
SHAPE = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=4,
             num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0,
             rms_norm_eps=1e-5, tie_word_embeddings=False)
DRAFT_VOCAB = 32000
TRAIN_TIMEOUT_S = int(os.environ.get("E3GPU_TRAIN_TIMEOUT_S", "200"))
if os.environ.get("E3GPU_SMOKE"):  # a CPU rehearsal of the same flow at tiny shapes
    SHAPE.update(vocab_size=4096, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
    DRAFT_VOCAB = 1024


def pipeline_yaml(steps: int, compile_: bool) -> str:
    return json.dumps({
        "target_model": str(TARGET),
        "seed": 0,
        "prepare": {"datasets": ["builtin:sharegpt", "builtin:messages"] * 8, "max_seq_len": 2048},
        "extract": {"engine": "transformers", "aux_layer_ids": [0, 1, 2], "batch_size": 8},
        "vocab": {"draft_vocab_size": DRAFT_VOCAB},
        "train": {"steps": steps, "checkpoint_every": steps, "keep_checkpoints": 1, "batch_max_tokens": 4096,
                  "lr": 1e-4, "warmup_steps": 2, "compile": compile_},
    }, indent=1)


def prep(dirpath: Path, steps: int) -> None:
    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages.prepare import run_prepare
    from eagle3ops.stages.vocab import run_vocab
    from eagle3ops.fixtures.tinymodel import build_shaped_llama_config, build_tiny_model

    tiny = build_tiny_model(dirpath / "tiny", kind="llama")
    build_shaped_llama_config(TARGET, tiny, **SHAPE)
    shutil.copytree(TARGET, dirpath / "target")  # travels with the run
    run = dirpath / "run"
    run.mkdir(parents=True, exist_ok=True)
    (run / "pipeline.yaml").write_text(pipeline_yaml(steps, False))
    c = load_pipeline_config(run)
    run_prepare(run, c)
    run_vocab(run, c)


def gpu(dirpath: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages.extract import run_extract

    smoke = bool(os.environ.get("E3GPU_SMOKE"))
    figures: dict = {"gpu": "none (smoke)" if smoke else torch.cuda.get_device_name(0), "torch": torch.__version__}
    t0 = time.monotonic()
    if TARGET.exists():
        shutil.rmtree(TARGET)
    shutil.copytree(dirpath / "target", TARGET)
    cfg = AutoConfig.from_pretrained(TARGET)
    torch.manual_seed(0)
    with torch.device("cpu" if smoke else "cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(TARGET)
    figures["target_params"] = sum(p.numel() for p in model.parameters())
    del model
    if not smoke:
        torch.cuda.empty_cache()
    figures["build_target_s"] = round(time.monotonic() - t0, 1)

    work = Path("/tmp/e3gpu/runs")
    shutil.rmtree(work, ignore_errors=True)
    base = work / "base"
    shutil.copytree(dirpath / "run", base)
    figures["extract"] = {k: v for k, v in run_extract(base, load_pipeline_config(base)).items()
                          if k != "samples_index"}
    write_result(out / "figures.json", figures, indent=1)
    for variant, compile_ in (("eager", False),) if smoke else (("eager", False), ("compiled", True)):
        run = work / variant
        shutil.copytree(base, run)
        steps = json.loads((run / "pipeline.yaml").read_text())["train"]["steps"]
        (run / "pipeline.yaml").write_text(pipeline_yaml(steps, compile_))
        try:
            r = subprocess.run([sys.executable, "-c", "from eagle3ops.stages.cli import app; app()", "train",
                                "--run-dir", str(run)], capture_output=True, text=True, timeout=TRAIN_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            figures[f"train_{variant}"] = {"failed": f"timed out after {TRAIN_TIMEOUT_S} s",
                                           "stdout": str(exc.stdout or "")[-1500:]}
            write_result(out / "figures.json", figures, indent=1)
            continue
        print(r.stdout[-4000:], r.stderr[-4000:], flush=True)
        if r.returncode == 0:
            m = json.loads((run / "train/manifest.json").read_text())
            figures[f"train_{variant}"] = {k: m[k] for k in (
                "steps", "steps_per_s", "steps_per_s_steady", "median_step_s", "tokens_per_step_mean",
                "peak_memory_bytes", "peak_memory_kind", "device", "first_loss", "final_metrics",
                "params_trainable", "wall_s")}
            shutil.copy(run / "train/metrics.jsonl", out / f"metrics_{variant}.jsonl")
        else:
            figures[f"train_{variant}"] = {"failed": r.stderr[-2000:]}
        write_result(out / "figures.json", figures, indent=1)
    write_result(out / "figures.json", figures, indent=1)
    print(json.dumps(figures, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("step", choices=["prep", "gpu"])
    p.add_argument("dir", type=Path)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    p.add_argument("--steps", type=int, default=60)
    a = p.parse_args()
    if a.step == "prep":
        prep(a.dir.resolve(), a.steps)
    else:
        gpu(a.dir.resolve(), a.out)


if __name__ == "__main__":
    main()
