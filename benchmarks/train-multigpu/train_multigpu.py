"""The train stage on 1 and 2 GPUs (torchrun, FSDP2) and an NCCL all-reduce under an inventory's NCCL settings.

Measured on a lent 2-GPU machine (2 x H200). vLLM does not travel there, so the hidden states come
from the extract stage's ``transformers`` reference engine (a transformers forward of the same random target,
hooks on the same layers), as in ``benchmarks/gpu-extract-train/extract_train_gpu.py``; the training is the stage's own code,
launched the way the pipeline launches it: ``python -m eagle3ops stage train --run-dir RUN``, which relaunches
itself under torchrun with one process per visible GPU (``train.nproc: auto``) and stays a plain process on one.

Steps:

1. here (CPU): ``python benchmarks/train-multigpu/train_multigpu.py prep DIR`` writes the target's config and tokenizer to
   ``DIR/target`` and runs stages prepare and vocab into ``DIR/run``;
2. there (GPU): ``python benchmarks/train-multigpu/train_multigpu.py gpu DIR --out OUT``:

   a. ``torchrun --standalone --nproc_per_node 2 ... allreduce``: NCCL all-reduce (SUM) of float32 tensors where
      rank r contributes r + 1 everywhere; every element must be exactly 3 (world 2). Each rank reports the
      NCCL / multicast variables it saw (pass-through from the inventory-style ``STAGE_ENV`` below) and the
      all-reduce bus bandwidth of a 256 MiB tensor;
   b. builds the target's random weights (seeded), runs stage extract (1 GPU, its own process);
   c. stage train in a copy of the run on 1 GPU (``CUDA_VISIBLE_DEVICES=0``: a plain process) and in another
      copy on 2 GPUs (both visible: torchrun, 2 ranks, NCCL, FSDP2), same steps, each rank its own 4096-token
      packed batches; the same ``STAGE_ENV`` for both;
   d. if time is left: checkpoint resume across process counts (2 GPUs stop at step 10, 1 GPU resumes and
      stops at 20, 2 GPUs resume and finish at 30);
   e. writes ``OUT/figures.json`` (after every phase, so a killed run still returns what it has).

``E3MG_SMOKE=1`` rehearses the same flow on CPU (tiny shapes, gloo, ``EAGLE3OPS_TRAIN_NPROC=2`` for the
"2-GPU" run since no GPU is visible).

Target: Llama, hidden 2048, 16 heads / 8 KV heads, MLP 8192, vocabulary 128256 (Llama-3's tokenizer size), 4
layers (aux layers [0, 1, 2] + last 3); draft head: one Llama layer of the same width, draft vocabulary 32000.
Training: eager (``train.compile: false``) with the exact dense-mask attention (``train.attention: dense``), so
no torch.compile warm-up eats the lease; 60 steps of <= 4096 tokens per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py (the checkout goes to the device)
from lab import write_result  # noqa: E402

SMOKE = bool(os.environ.get("E3MG_SMOKE"))
TARGET = Path("/tmp/e3mg/target")
WORK = Path("/tmp/e3mg/runs")
SHAPE = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=4,
             num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0,
             rms_norm_eps=1e-5, tie_word_embeddings=False)
DRAFT_VOCAB = 32000
STEPS = 60
BATCH_TOKENS = 4096
if SMOKE:
    SHAPE.update(vocab_size=4096, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
    DRAFT_VOCAB, STEPS, BATCH_TOKENS = 1024, 8, 1024

# What a host's inventory entry would hold under ``stage_env`` (eagle3ops.config.HostConfig): passed through
# unchanged to every process. NVLink multicast stays off (the lender's machines require it: NCCL_NVLS_ENABLE=0,
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1).
STAGE_ENV = {
    "NCCL_PROTO": "Simple",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "NVL",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
# NCCL's own report of the variables it read (``NCCL_PROTO set by environment to Simple``) and the transports.
DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}
ENV_PREFIXES = ("NCCL_", "TORCH_SYMM_MEM_", "NVSHMEM_")
DEADLINE_S = float(os.environ.get("E3MG_DEADLINE_S", "500"))  # the whole gpu step; later phases are skipped
T0 = time.monotonic()


def pipeline_yaml(steps: int) -> str:
    """pipeline.yaml (JSON is YAML) of the benchmark run; ``train.nproc`` is left at ``auto``."""
    return json.dumps({
        "target_model": str(TARGET),
        "seed": 0,
        "prepare": {"datasets": ["builtin:sharegpt", "builtin:messages"] * (2 if SMOKE else 8),
                    "max_seq_len": 2048},
        "extract": {"engine": "transformers", "aux_layer_ids": [0, 1, 2], "batch_size": 8},
        "vocab": {"draft_vocab_size": DRAFT_VOCAB},
        "train": {"steps": steps, "checkpoint_every": steps, "keep_checkpoints": 1, "batch_max_tokens": BATCH_TOKENS,
                  "lr": 1e-4, "warmup_steps": 2, "compile": False, "attention": "dense"},
    }, indent=1)


def prep(dirpath: Path) -> None:
    """CPU side: target config + tokenizer, stages prepare and vocab."""
    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages.prepare import run_prepare
    from eagle3ops.stages.vocab import run_vocab
    from eagle3ops.fixtures.tinymodel import build_shaped_llama_config, build_tiny_model

    shutil.rmtree(dirpath, ignore_errors=True)
    shutil.rmtree("/tmp/e3mg/tiny", ignore_errors=True)
    tiny = build_tiny_model(Path("/tmp/e3mg/tiny"), kind="llama")
    build_shaped_llama_config(TARGET, tiny, **SHAPE)
    shutil.copytree(TARGET, dirpath / "target")  # travels with the run
    run = dirpath / "run"
    run.mkdir(parents=True)
    (run / "pipeline.yaml").write_text(pipeline_yaml(STEPS))
    c = load_pipeline_config(run)
    run_prepare(run, c)
    run_vocab(run, c)


def allreduce_worker(out: Path) -> None:
    """One torchrun rank: exact-sum check and bus bandwidth of an all-reduce; rank 0 writes ``allreduce.json``."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available() and not SMOKE
    local = int(os.environ["LOCAL_RANK"])
    if cuda:
        torch.cuda.set_device(local)
    dev = torch.device(f"cuda:{local}" if cuda else "cpu")
    dist.init_process_group("nccl" if cuda else "gloo", device_id=dev if cuda else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    want = world * (world + 1) // 2  # sum over ranks of (r + 1)
    checks = []
    for n in (1, 1000, 1 << 20, (64 << 20) if cuda else (1 << 22)):  # up to 256 MiB of float32
        x = torch.full((n,), float(rank + 1), dtype=torch.float32, device=dev)
        dist.all_reduce(x)
        ok = bool(torch.equal(x, torch.full_like(x, float(want))))
        checks.append({"elements": n, "dtype": "float32", "expected": want, "min": float(x.min()),
                       "max": float(x.max()), "exact": ok})
    # bus bandwidth (nccl-tests' definition for all-reduce: algbw * 2 (n - 1) / n) on the largest tensor
    iters = 20 if cuda else 3
    for _ in range(3):
        dist.all_reduce(x)
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    if cuda:
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / iters
    algbw = x.numel() * 4 / dt / 1e9
    mine = {
        "rank": rank,
        "device": torch.cuda.get_device_name(local) if cuda else "cpu",
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)
                or k in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")},
        "checks": checks,
        "bench_bytes": x.numel() * 4,
        "bench_time_s": round(dt, 6),
        "algbw_GBps": round(algbw, 1),
        "busbw_GBps": round(algbw * 2 * (world - 1) / world, 1),
    }
    ranks: list = [None] * world
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        res = {
            "backend": dist.get_backend(),
            "world_size": world,
            "nccl_version": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
            "all_exact": all(c["exact"] for r in ranks for c in r["checks"]),
            "env_passed_through": all(r["env"].get(k) == v for r in ranks for k, v in STAGE_ENV.items()),
            "ranks": ranks,
        }
        (out / "allreduce.json").write_text(json.dumps(res, indent=1))
        print(json.dumps({k: res[k] for k in ("backend", "world_size", "all_exact", "env_passed_through")}))
    dist.destroy_process_group()


def build_and_extract(dirpath: Path, out: Path) -> None:
    """Own process: the target's seeded random weights (bf16) and stage extract (transformers engine)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages.extract import run_extract

    t0 = time.monotonic()
    shutil.rmtree(TARGET, ignore_errors=True)
    shutil.copytree(dirpath / "target", TARGET)
    cfg = AutoConfig.from_pretrained(TARGET)
    torch.manual_seed(0)
    with torch.device("cpu" if SMOKE else "cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(TARGET)
    res: dict = {"target_params": sum(p.numel() for p in model.parameters())}
    del model
    if not SMOKE:
        torch.cuda.empty_cache()
    res["build_target_s"] = round(time.monotonic() - t0, 1)
    shutil.rmtree(WORK, ignore_errors=True)
    base = WORK / "base"
    shutil.copytree(dirpath / "run", base)
    res["extract"] = {k: v for k, v in run_extract(base, load_pipeline_config(base)).items() if k != "samples_index"}
    (out / "extract.json").write_text(json.dumps(res, indent=1))


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **STAGE_ENV, **DEBUG_ENV, "PYTHONUNBUFFERED": "1", **extra}
    return env


def _run(argv: list[str], env: dict[str, str], log: Path, timeout: float) -> dict:
    """Run argv with stdout+stderr appended to ``log``; returns rc / wall / timed_out."""
    t = time.monotonic()
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"\n$ {' '.join(argv)}\n")
        f.flush()
        # own process group: a timeout ends torchrun's ranks too, so no later phase finds the GPUs held
        proc = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT,  # noqa: S603
                                start_new_session=True)
        try:
            rc, timed_out = proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc, timed_out = None, True
    return {"rc": rc, "timed_out": timed_out, "wall_s": round(time.monotonic() - t, 1)}


def _nccl_env_lines(text: str) -> dict[str, int]:
    """Count NCCL's ``<VAR> set by environment to <value>`` reports per variable=value."""
    seen: dict[str, int] = {}
    for m in re.finditer(r"(NCCL_\w+) set by environment to (\S+)", text):
        key = f"{m.group(1)}={m.group(2).rstrip('.')}"
        seen[key] = seen.get(key, 0) + 1
    return seen


def _transports(text: str) -> list[str]:
    return sorted({m.group(0) for m in re.finditer(r"via (P2P/\S+|SHM/\S+|NET/\S+|P2P\S*)", text)})


def _steady(metrics_path: Path, skip: int) -> dict:
    """Steady-state figures from metrics.jsonl, leaving out the first ``skip`` steps (warm-up)."""
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["step"] > skip]
    s = sorted(r["step_s"] for r in rows)
    total = sum(s)
    return {"steps_counted": len(s), "mean_step_s": round(total / len(s), 5), "median_step_s": s[len(s) // 2],
            "steps_per_s": round(len(s) / total, 4), "tokens_per_s": round(sum(r["tokens"] for r in rows) / total, 1),
            "tokens_per_step": round(sum(r["tokens"] for r in rows) / len(s), 1)}


def train_run(name: str, extra_env: dict[str, str], out: Path, figures: dict, steps: int = STEPS,
              stop_after: int | None = None, run: Path | None = None, timeout: float = 200) -> dict:
    """Stage train of a copy of the base run (or ``run``) in its own process tree; returns its figure entry."""
    if run is None:
        run = WORK / name
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(WORK / "base", run, ignore=shutil.ignore_patterns("train"))
        (run / "pipeline.yaml").write_text(pipeline_yaml(steps))
    log = out / f"log_{name.split('_')[0]}.txt"
    argv = [sys.executable, "-m", "eagle3ops", "stage", "train", "--run-dir", str(run)]
    if stop_after is not None:
        argv += ["--stop-after", str(stop_after)]
    start = log.stat().st_size if log.exists() else 0
    r = _run(argv, _env(extra_env), log, min(timeout, max(30.0, DEADLINE_S - (time.monotonic() - T0))))
    text = log.read_text(errors="replace")[start:]
    entry: dict = {"argv": argv[1:], "env_extra": extra_env, **r, "nccl_env_reports": _nccl_env_lines(text),
                   "nccl_transports": _transports(text)}
    mpath = run / "train/manifest.json"
    if r["rc"] == 0 and mpath.is_file() and stop_after is None:
        m = json.loads(mpath.read_text())
        entry["manifest"] = {k: m.get(k) for k in (
            "steps", "steps_this_run", "resumed_from_step", "world_size", "distributed", "device", "compile",
            "attention", "steps_per_s", "steps_per_s_steady", "median_step_s", "tokens_per_step_mean",
            "peak_memory_bytes", "peak_memory_bytes_per_rank", "peak_memory_kind", "first_loss", "final_metrics",
            "params_trainable", "wall_s")}
        entry["steady"] = _steady(run / "train/metrics.jsonl", skip=5 if not SMOKE else 2)
    elif r["rc"] == 0:
        ckpts = sorted((run / "train/checkpoints").glob("step_*/state.json"))
        entry["checkpoint"] = json.loads(ckpts[-1].read_text()) if ckpts else None
        if entry["checkpoint"]:
            entry["checkpoint"].pop("torch_rng", None)
    else:
        entry["log_tail"] = text[-3000:]
    figures[name] = entry
    write_result(out / "figures.json", figures, indent=1)
    return entry


def gpu(dirpath: Path, out: Path) -> None:
    """GPU side: phases a-e of the module doc."""
    out.mkdir(parents=True, exist_ok=True)
    figures: dict = {"what": "benchmarks/train-multigpu/train_multigpu.py" + (" (CPU smoke)" if SMOKE else ""),
                     "stage_env": STAGE_ENV, "debug_env": DEBUG_ENV, "steps": STEPS, "batch_max_tokens": BATCH_TOKENS,
                     "shape": SHAPE, "draft_vocab": DRAFT_VOCAB}

    def save() -> None:
        figures["elapsed_s"] = round(time.monotonic() - T0, 1)
        write_result(out / "figures.json", figures, indent=1)

    if not SMOKE:
        for cmd in (["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader"],
                    ["nvidia-smi", "topo", "-m"]):
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603
            figures.setdefault("nvidia_smi", []).append(r.stdout.strip() or r.stderr.strip())
    import importlib.metadata as md

    figures["software"] = {}
    for pkg in ("torch", "transformers", "speculators", "typer", "pydantic", "nvidia-nccl-cu13"):
        try:
            figures["software"][pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            figures["software"][pkg] = None
    save()

    # a. all-reduce, 2 ranks, inventory NCCL environment
    me = str(Path(__file__).resolve())
    r = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", me, "allreduce",
              str(dirpath), "--out", str(out)], _env({}), out / "log_allreduce.txt", 120)
    text = (out / "log_allreduce.txt").read_text(errors="replace")
    figures["allreduce"] = {**r, "nccl_env_reports": _nccl_env_lines(text), "nccl_transports": _transports(text)}
    if (out / "allreduce.json").is_file():
        figures["allreduce"].update(json.loads((out / "allreduce.json").read_text()))
        (out / "allreduce.json").unlink()
    save()
    print("allreduce:", {k: figures["allreduce"].get(k) for k in ("rc", "all_exact", "env_passed_through")}, flush=True)

    # b. target + extract (own process, 1 GPU)
    r = _run([sys.executable, me, "extract", str(dirpath), "--out", str(out)], _env({"CUDA_VISIBLE_DEVICES": "0"}),
             out / "log_extract.txt", 150)
    figures["extract"] = r
    if (out / "extract.json").is_file():
        figures["extract"].update(json.loads((out / "extract.json").read_text()))
        (out / "extract.json").unlink()
        (out / "log_extract.txt").unlink()  # no NCCL in it; keeps the returned files under the lender's count
    save()
    if r["rc"] != 0:
        print((out / "log_extract.txt").read_text()[-3000:])
        return

    # c. 1 GPU (plain process) vs 2 GPUs (torchrun via the stage's own launcher: nproc auto = visible GPUs)
    one = {"CUDA_VISIBLE_DEVICES": "0"} if not SMOKE else {"EAGLE3OPS_TRAIN_NPROC": "1"}
    two = {"CUDA_VISIBLE_DEVICES": "0,1"} if not SMOKE else {"EAGLE3OPS_TRAIN_NPROC": "2"}
    e1 = train_run("train1", one, out, figures)
    print("train 1:", e1.get("steady"), e1.get("rc"), flush=True)
    e2 = train_run("train2", two, out, figures)
    print("train 2:", e2.get("steady"), e2.get("rc"), flush=True)
    for name in ("train1", "train2"):
        mp = WORK / name / "train/metrics.jsonl"
        if mp.is_file():
            shutil.copy(mp, out / f"metrics_{name}.jsonl")
    if "steady" in e1 and "steady" in e2:
        s1, s2 = e1["steady"], e2["steady"]
        figures["scaling"] = {
            "steps_per_s_1": s1["steps_per_s"], "steps_per_s_2": s2["steps_per_s"],
            "steps_per_s_ratio_2_over_1": round(s2["steps_per_s"] / s1["steps_per_s"], 3),
            "tokens_per_s_1": s1["tokens_per_s"], "tokens_per_s_2": s2["tokens_per_s"],
            "tokens_per_s_ratio_2_over_1": round(s2["tokens_per_s"] / s1["tokens_per_s"], 3),
            "note": "each rank trains on its own packed batches of <= batch_max_tokens, so a 2-GPU step sees about "
                    "twice the tokens: tokens/s ratio = throughput scaling (ideal 2.0), steps/s ratio ideal 1.0",
            "peak_memory_bytes_per_gpu_1": e1["manifest"]["peak_memory_bytes_per_rank"],
            "peak_memory_bytes_per_gpu_2": e2["manifest"]["peak_memory_bytes_per_rank"],
        }
    save()

    # d. resume across process counts, if time is left
    if os.environ.get("E3MG_RESUME", "1") != "0" and time.monotonic() - T0 < DEADLINE_S - 150:
        run = WORK / "resume"
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(WORK / "base", run, ignore=shutil.ignore_patterns("train"))
        (run / "pipeline.yaml").write_text(pipeline_yaml(30 if not SMOKE else 6))
        k = 10 if not SMOKE else 2
        res = {}
        for i, (env, stop) in enumerate(((two, k), (one, k), (two, None))):
            e = train_run(f"resume_{i}", env, out, figures, run=run, stop_after=stop, timeout=120)
            figures.pop(f"resume_{i}", None)
            res[f"{i}: {'2' if env is two else '1'} proc, stop_after={stop}"] = {
                "rc": e["rc"], "wall_s": e["wall_s"], "checkpoint": e.get("checkpoint"),
                "manifest": {kk: e["manifest"].get(kk) for kk in ("steps", "steps_this_run", "resumed_from_step",
                                                                    "world_size", "final_metrics")}
                if "manifest" in e else None, "log_tail": e.get("log_tail")}
            if e["rc"] != 0:
                break
        figures["resume_across_nproc"] = res
    else:
        figures["resume_across_nproc"] = "skipped (E3MG_RESUME=0 or not enough time left)"
    save()
    print(json.dumps(figures, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("step", choices=["prep", "gpu", "allreduce", "extract"])
    p.add_argument("dir", type=Path)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    a = p.parse_args()
    {"prep": lambda: prep(a.dir.resolve()), "gpu": lambda: gpu(a.dir.resolve(), a.out.resolve()),
     "allreduce": lambda: allreduce_worker(a.out.resolve()),
     "extract": lambda: build_and_extract(a.dir.resolve(), a.out.resolve())}[a.step]()


if __name__ == "__main__":
    main()
