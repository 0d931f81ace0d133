"""A run whose hidden states are twice the data dir's free space, trained in chunks for two epochs
(bounded disk): the data dir's used bytes sampled every second stay within its size, and the chunked head's offline
estimate is compared with a one-chunk run's on the same held-out samples.

Two containers of the pipeline image (the product's stages; this checkout's ``src`` mounted over the installed
package, the commit recorded):

1. **one chunk** (work folder ``/w/one``): stages prepare, vocab, extract, train as usual, ``train.steps`` set to two
   epochs of its own packing (:func:`eagle3ops.stages.trainplan.epoch_plan`, epochs 0 and 1). Gives the bytes of
   every hidden-state file.
2. **chunked** (data dir ``/lim``: a tmpfs of ``prepare + vocab + hidden/2`` bytes, so the hidden states are twice
   the free space when the stage starts): ``prepare/`` and ``vocab/`` copied from run 1 (same config digests),
   ``chunks.count: auto`` with the default ``budget_fraction``, ``train.steps`` two epochs of the chunk-major order,
   then ``python -m eagle3ops stage chunked`` as window train runs it; a thread samples ``statvfs(/lim)`` every
   second. Then both heads' teacher-forced estimate on run 1's held-out hidden states
   (:func:`eagle3ops.stages.estimate.estimate_head`; the held-out ids are the same in both runs).

Target: the tests' tiny random Llama (``eagle3ops.fixtures.tinymodel``, hidden 128) — a STAND-IN: SmolLM2-135M's draft
checkpoints (190 MB each, measured) and its CPU training (2.2 s a 1,024-token step) would need ~1.5 GB of hidden
states and ~1 h here for the same ratio. Data: the first ``--conversations`` of
``regen.jsonl.gz`` (from ``benchmarks/gpu-head-smollm2/gpu_head_smollm2.py``)
(ShareGPT V3 first turns answered by SmolLM2 on the GPU).

Usage: ``python benchmarks/chunked-disk/chunked_disk.py [--conversations 500]``; writes ``--json`` (default
``benchmarks/chunked-disk/chunked-disk-cpu.json``). Needs the pipeline image and docker.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py, inimage.py
from inimage import epoch_steps, first_conversations, run_container  # noqa: E402
from lab import BENCH, REPO, use, write_result  # noqa: E402

HERE = Path(__file__).resolve().parent


def _pipeline(model: str, data: str, a: argparse.Namespace) -> dict[str, Any]:
    return {"target_model": model, "seed": 0,
            "prepare": {"datasets": [data], "max_seq_len": a.max_seq_len, "on_unmaskable": "skip"},
            "extract": {"engine": "transformers", **({} if a.target else {"aux_layer_ids": [0, 1, 2]})},
            "vocab": {"draft_vocab_size": a.draft_vocab},
            "train": {"steps": 1, "batch_max_tokens": a.batch_tokens, "lr": a.lr, "warmup_steps": 5, "compile": False,
                      "attention": "dense", "device": a.device, "checkpoint_every": 1000, "keep_checkpoints": 1,
                      "held_out_fraction": 0.1}}


def _stage(run: Path, *args: str) -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "eagle3ops.stages", *args, "--run-dir", str(run)], check=True)
    return round(time.monotonic() - t0, 1)


def _set_steps(run: Path, steps: int, **extra: Any) -> None:
    cfg = json.loads((run / "pipeline.yaml").read_text())
    cfg["train"]["steps"] = steps
    cfg.update(extra)
    (run / "pipeline.yaml").write_text(json.dumps(cfg, indent=1))


def inner_one(a: argparse.Namespace) -> None:
    w = Path(a.work)
    model = Path(a.target) if a.target else w / "model"
    if not model.exists():
        from eagle3ops.fixtures.tinymodel import build_tiny_model

        build_tiny_model(model, kind="llama")
    run = w / "one"
    run.mkdir()
    (run / "pipeline.yaml").write_text(json.dumps(_pipeline(str(model), str(w / "regen.jsonl"), a), indent=1))
    res: dict[str, Any] = {"stage_s": {}}
    for s in ("prepare", "vocab", "extract"):
        res["stage_s"][s] = _stage(run, s) if s == "extract" else _in_process(run, s)
    steps = epoch_steps(run, 2)
    _set_steps(run, steps)
    res["stage_s"]["train"] = _stage(run, "train")
    ext = json.loads((run / "extract/manifest.json").read_text())
    man = json.loads((run / "train/manifest.json").read_text())
    pv = sum(f.stat().st_size for d in ("prepare", "vocab") for f in (run / d).rglob("*") if f.is_file())
    res.update({"samples": ext["samples"], "tokens": ext["tokens"], "hidden_file_bytes": ext["file_bytes"],
                "prepare_vocab_bytes": pv, "steps": steps, "offline_estimate": man["offline_estimate"],
                "final_loss": man["final_metrics"].get("loss"), "train_wall_s": man["wall_s"]})
    (w / "one.json").write_text(json.dumps(res, indent=1))


def _in_process(run: Path, stage: str) -> float:
    """prepare/vocab in this process (the device machine has no ``datasets``: speculators' vocab mapping imports
    it for a type hint only, so gpu_head_smollm2's stand-in module takes its place there)."""
    from eagle3ops.config.pipeline import load_pipeline_config

    if stage == "vocab":
        try:
            import datasets  # noqa: F401
        except ImportError:
            use("gpu-head-smollm2")
            from gpu_head_smollm2 import _datasets_standin

            _datasets_standin()
    from eagle3ops.stages.prepare import run_prepare
    from eagle3ops.stages.vocab import run_vocab

    t0 = time.monotonic()
    (run_prepare if stage == "prepare" else run_vocab)(run, load_pipeline_config(run), log=print)
    return round(time.monotonic() - t0, 1)


def inner_chunked(a: argparse.Namespace) -> None:
    from eagle3ops.stages.chunked import make_plan
    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages.estimate import estimate_head

    w, lim = Path(a.work), Path(a.lim)
    run = lim / "run"
    series = w / "disk_samples.jsonl"  # outside the limited dir; appended, so a resumed phase keeps the series
    if not run.exists():  # a first start (a rerun after a kill resumes stage chunked where it stopped)
        run.mkdir()
        for part in ("prepare", "vocab"):
            shutil.copytree(w / "one" / part, run / part)
        shutil.copy(w / "one" / "pipeline.yaml", run / "pipeline.yaml")
        _set_steps(run, 1, chunks={"count": "auto"})
        st = os.statvfs(lim)
        plan = make_plan(run, load_pipeline_config(run))
        steps = epoch_steps(run, 2, [tuple(c) for c in plan.chunks])
        _set_steps(run, steps, chunks={"count": "auto"})
        (w / "chunked-start.json").write_text(json.dumps({"size": st.f_blocks * st.f_frsize,
                                                          "free": st.f_bavail * st.f_frsize, "steps": steps}))
        series.unlink(missing_ok=True)
    start = json.loads((w / "chunked-start.json").read_text())
    size, free0, steps = start["size"], start["free"], start["steps"]
    stop = threading.Event()

    def sample() -> None:
        with open(series, "a", encoding="utf-8") as f:
            while not stop.is_set():
                s = os.statvfs(lim)
                f.write(json.dumps([round(time.time(), 1), (s.f_blocks - s.f_bfree) * s.f_frsize]) + "\n")
                f.flush()
                stop.wait(1.0)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        wall = _stage(run, "chunked")
    finally:
        stop.set()
        th.join()
    t_first = json.loads(series.read_text().splitlines()[0])[0]
    samples = [(round(t - t_first, 1), u) for t, u in map(json.loads, series.read_text().splitlines())]
    man = json.loads((run / "train/manifest.json").read_text())
    passes = [json.loads(x) for x in (run / "chunks/passes.jsonl").read_text().splitlines()]
    rec = json.loads((run / "chunks/plan.json").read_text())
    target = Path(a.target) if a.target else w / "model"
    est = {"one_chunk_head": estimate_head(w / "one/train/final", w / "one", target, name="one"),
           "chunked_head": estimate_head(run / "train/final", w / "one", target, name="one")}
    peak = max(u for _t, u in samples)
    res = {"tmpfs_bytes": size, "free_at_start": free0, "steps": steps, "wall_s": wall,
           "pass_seconds": round(sum(p["extract_s"] + p["train_s"] for p in passes), 1),
           "plan": {k: rec[k] for k in ("chunks", "steps_per_epoch", "held_bytes", "chunk_bytes", "total_bytes",
                                        "budget_bytes", "peak_bytes", "basis", "epochs")},
           "passes": passes, "disk_samples": len(samples), "peak_used_bytes": peak,
           "peak_used_over_size": round(peak / size, 4), "used_series_every_10": samples[::10],
           "offline_estimate": man["offline_estimate"], "final_loss": man["final_metrics"].get("loss"),
           "estimate_on_one_chunk_held_out": est}
    res["wall_s_last_start"] = res.pop("wall_s")
    (w / "chunked.json").write_text(json.dumps(res, indent=1))


def _container(image: str, work: Path, phase: str, a: argparse.Namespace, tmpfs: int | None = None) -> None:
    argv = ["python3", "/bench/chunked-disk/chunked_disk.py", "--inner", phase, "--conversations", str(a.conversations),
            "--max-seq-len", str(a.max_seq_len), "--batch-tokens", str(a.batch_tokens), "--lr", str(a.lr),
            "--draft-vocab", str(a.draft_vocab)]
    vols = {str(BENCH): {"bind": "/bench", "mode": "ro"}, str(work): {"bind": "/w", "mode": "rw"}}
    rc = run_container(image, argv, vols, src=True, tmpfs={"/lim": f"size={tmpfs}"} if tmpfs else None)
    if rc != 0:
        raise SystemExit(f"phase {phase} in {image} failed (exit {rc}); its output is above")


def _result(a: argparse.Namespace, one: dict[str, Any], ch: dict[str, Any], **meta: Any) -> dict[str, Any]:
    e1 = ch["estimate_on_one_chunk_held_out"]["one_chunk_head"]["acceptance_length"]
    e2 = ch["estimate_on_one_chunk_held_out"]["chunked_head"]["acceptance_length"]
    out = {"what": __doc__.split("\n\n")[0].replace("\n", " "), **meta,
           "settings": {k: getattr(a, k) for k in ("max_seq_len", "batch_tokens", "lr", "draft_vocab")},
           "one_chunk": one, "chunked": ch,
           "hidden_over_free_at_start": round(one["hidden_file_bytes"] / ch["free_at_start"], 3),
           "peak_within_limit": ch["peak_used_bytes"] <= ch["tmpfs_bytes"],
           "estimate_difference": round(abs(e1 - e2), 6)}
    write_result(a.json, out, indent=1)
    print(json.dumps({k: out[k] for k in ("hidden_over_free_at_start", "peak_within_limit", "estimate_difference")}
                     | {"peak_used_bytes": ch["peak_used_bytes"], "tmpfs_bytes": ch["tmpfs_bytes"],
                        "chunks": len(ch["plan"]["chunks"]), "estimates": [e1, e2]}, indent=1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--regen", type=Path, default=REPO / ".whl/r4/4/regen.jsonl.gz")
    ap.add_argument("--conversations", type=int, default=500)
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--draft-vocab", type=int, default=256)
    ap.add_argument("--cache", type=Path, default=REPO / ".cache/bench-chunked")
    ap.add_argument("--json", type=Path, default=HERE / "chunked-disk-cpu.json")
    ap.add_argument("--image", help="a pipeline image (default: the one `make image` builds for this checkout)")
    ap.add_argument("--inner", choices=["one", "chunked"],
                    help="one phase where the stages run (in the container, or on the GPU machine: --work, --lim, "
                         "--target, --device)")
    ap.add_argument("--work", default="/w", help="--inner: the work folder (regen.jsonl, one/, the phases' JSON)")
    ap.add_argument("--lim", default="/lim", help="--inner chunked: the size-limited data dir (a tmpfs)")
    ap.add_argument("--target", help="--inner: the target's folder (default: the tiny Llama built in WORK/model)")
    ap.add_argument("--device", default="cpu", help="--inner: train.device (cpu, cuda, auto)")
    ap.add_argument("--from-dir", type=Path, help="write --json from the phases' one.json and chunked.json in this "
                                                  "folder (brought back from the GPU machine)")
    ap.add_argument("--meta", default="{}", help="--from-dir: JSON merged into the result (target, data, machine)")
    a = ap.parse_args()
    if a.inner == "one":
        inner_one(a)
        return
    if a.inner == "chunked":
        inner_chunked(a)
        return
    if a.from_dir:
        _result(a, json.loads((a.from_dir / "one.json").read_text()),
                json.loads((a.from_dir / "chunked.json").read_text()), **json.loads(a.meta))
        return
    use("served-acceptance-by-length")
    from served_acceptance_by_length import machine, pipeline_image

    if not a.regen.is_file():
        raise SystemExit(f"{a.regen}: missing (--regen: conversations in OpenAI messages form, .jsonl or .jsonl.gz)")
    t_start = time.monotonic()
    image = a.image or pipeline_image()
    work = a.cache / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    n = first_conversations(a.regen, work / "regen.jsonl", a.conversations)
    _container(image, work, "one", a)
    one = json.loads((work / "one.json").read_text())
    size = one["prepare_vocab_bytes"] + 64 * 1024 + one["hidden_file_bytes"] // 2
    _container(image, work, "chunked", a, tmpfs=size)
    ch = json.loads((work / "chunked.json").read_text())
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    _result(a, one, ch, target="STAND-IN: the tests' tiny random Llama (eagle3ops.fixtures.tinymodel, hidden 128, 4 layers)",
            data={"file": str(a.regen), "conversations": n,
                  "generated_by": "ShareGPT V3 first turns answered by SmolLM2 on the GPU"},
            pipeline_image=image, src=f"this checkout mounted over the image's package (HEAD {commit})",
            machine=machine(), wall_s=round(time.monotonic() - t_start, 1))


if __name__ == "__main__":
    main()
