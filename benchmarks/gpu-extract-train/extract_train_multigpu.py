"""The train stage on 1 and 2 GPUs (torchrun, FSDP2, NCCL) with checkpoints resumed across world sizes.

Run on a 2-GPU machine after ``benchmarks/gpu-extract-train/extract_train_gpu.py prep DIR`` made ``DIR`` (random Llama-3-8B-shaped
4-layer target, prepare + vocab done):
``NCCL_PROTO=Simple NCCL_ALGO=Ring NCCL_P2P_LEVEL=NVL NCCL_NVLS_ENABLE=0 python benchmarks/gpu-extract-train/extract_train_multigpu.py
DIR --out OUT``. The NCCL variables stand for an inventory's ``stage_env``; they pass through torchrun unchanged.

Steps: build the target's weights and run stage extract (transformers engine, GPU 0); an NCCL all-reduce with
those settings (2 ranks, sum checked); then two train runs of ``STEPS`` steps (eager): ``a`` = 1 GPU for the
first ``CUT`` steps, resumed on 2 GPUs; ``b`` = 2 GPUs first, resumed on 1 GPU. Writes ``OUT/figures.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import extract_train_gpu as single  # noqa: E402

STEPS, CUT = 30, 20
ALLREDUCE = r"""
import os, torch, torch.distributed as dist
dist.init_process_group("nccl"); r = dist.get_rank(); torch.cuda.set_device(r)
x = torch.full((1 << 20,), float(r + 1), device="cuda"); dist.all_reduce(x)
ok = bool((x == 3.0).all())
if r == 0:
    print("ALLREDUCE", ok, {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}, flush=True)
dist.destroy_process_group()
"""


def train(run: Path, nproc: int, stop_after: int | None) -> float:
    env = {**os.environ, "EAGLE3OPS_TRAIN_NPROC": str(nproc)}
    argv = [sys.executable, "-m", "eagle3ops.stages", "train", "--run-dir", str(run)]
    if stop_after:
        argv += ["--stop-after", str(stop_after)]
    t = time.monotonic()
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=400)
    print(r.stdout[-2500:], r.stderr[-2500:], flush=True)
    if r.returncode:
        raise RuntimeError(f"train nproc={nproc} failed: {r.stderr[-1500:]}")
    return time.monotonic() - t


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dir", type=Path)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    p.add_argument("--allreduce-only", action="store_true")
    a = p.parse_args()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages.extract import run_extract

    figs: dict = {"gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                  "torch": torch.__version__}
    save = lambda: single.write_result(a.out / "figures.json", figs, indent=1)  # noqa: E731
    script = a.out / "allreduce.py"
    script.write_text(ALLREDUCE)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(script)], capture_output=True, text=True, timeout=120)
    script.unlink()
    figs["allreduce"] = next((x for x in r.stdout.splitlines() if x.startswith("ALLREDUCE")), r.stderr[-800:])
    save()
    if a.allreduce_only:
        print(figs["allreduce"])
        return
    shutil.rmtree(single.TARGET, ignore_errors=True)
    shutil.copytree(a.dir / "target", single.TARGET)
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(single.TARGET), dtype=torch.bfloat16)
    m.save_pretrained(single.TARGET)
    del m
    torch.cuda.empty_cache()
    work = Path("/tmp/e3gpu/mruns")
    shutil.rmtree(work, ignore_errors=True)
    base = work / "base"
    shutil.copytree(a.dir / "run", base)
    (base / "pipeline.yaml").write_text(single.pipeline_yaml(STEPS, False))
    ext = run_extract(base, load_pipeline_config(base))
    figs["extract_tokens"] = ext["tokens"]
    save()
    for name, first, second in (("a_1gpu_then_2gpu", 1, 2), ("b_2gpu_then_1gpu", 2, 1)):
        run = work / name
        shutil.copytree(base, run)
        w1 = train(run, first, CUT)
        w2 = train(run, second, None)
        hist = [json.loads(x) for x in (run / "train/metrics.jsonl").read_text().splitlines()]
        man = json.loads((run / "train/manifest.json").read_text())
        part = lambda lo, hi: [h for h in hist if lo < h["step"] <= hi]  # noqa: E731
        fig = {}
        for label, n, rows in ((f"{first}gpu", first, part(3, CUT)), (f"{second}gpu", second, part(CUT + 2, STEPS))):
            med = statistics.median(h["step_s"] for h in rows)
            tok = statistics.mean(h["tokens"] for h in rows)
            fig[label] = {"median_step_s": round(med, 4), "steps_per_s": round(1 / med, 3),
                          "tokens_per_step": round(tok), "tokens_per_s": round(tok / med)}
        fig.update(wall_s=[round(w1, 1), round(w2, 1)], resumed_from_step=man["resumed_from_step"],
                   world_size_at_end=man["world_size"], peak_memory_bytes_per_rank_at_end=man["peak_memory_bytes_per_rank"],
                   losses_first_last=[hist[0]["loss"], hist[-1]["loss"]], loss_at_cut=[hist[CUT - 1]["loss"], hist[CUT]["loss"]])
        figs[name] = fig
        save()
        shutil.copy(run / "train/metrics.jsonl", a.out / f"metrics_{name}.jsonl")
    print(json.dumps(figs, indent=1))


if __name__ == "__main__":
    main()
