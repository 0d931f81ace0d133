"""Why the H200-trained SmolLM2 head accepts less when served than offline: its teacher-forced estimate
on hidden states that vLLM 0.16 CPU extracts on the sandbox, beside the served and the offline figures.

``benchmarks/gpu-head-served/speculate-smollm2-gpu-head.json`` (round 3 head): served mean acceptance length 1.534 (per position
0.355 / 0.129 / 0.051) against the offline 2.214 (0.609 / 0.370 / 0.234). Position 0 is teacher-forced in both (the
draft's first token sees the target's own hidden states), so a gap there is not the estimate's optimism. This
script measures the same head, with the same teacher-forced measure (:func:`eagle3ops.stages.estimate.estimate_head`,
what ``speculate --head`` now runs before a restart), on a run the sandbox made itself:

1. **data**: ``--conversations`` held-out ShareGPT V3 records (index >= 12,000 of ``benchmarks/gpu-head-smollm2/gpu_head_smollm2.py``,
   never trained on; first user turn only, at most 1,500 characters) answered by the sandbox's live SmolLM2
   (``eagle3ops regenerate``'s code: greedy, the served chat template);
2. **extract window** on the sandbox (real vLLM 0.16 CPU extraction, aux layers [2, 15, 27] = vLLM's [3, 16, 28],
   ``train.held_out_fraction: 0`` so that every sample is estimated on); ``--engine transformers``: the stage's
   transformers engine instead (the GPU run's way of extracting, here on CPU), to tell the engines apart;
3. **estimate** in a container of the pipeline image on this machine: the committed head
   (``benchmarks/gpu-head-smollm2/heads/smollm2-135m-instruct-eagle3``) on the run's hidden states;
4. writes ``--json`` (default ``benchmarks/gpu-head-cpu-states/gpu-head-smollm2-cpu-states.json``) with the three figures side by side.

Reading it: an estimate near the offline one says vLLM's CPU hidden states carry what the head learned on the GPU's
and the loss is in the served speculation path; one near the served figure says the hidden states (or the data)
differ. Needs the sandbox serving SmolLM2 (``make bench-speculate-gpu-head`` or ``make demo`` provisions it).

Usage: ``python benchmarks/gpu-head-cpu-states/gpu_head_cpu_states.py [--conversations 24]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import BENCH, REPO, use, write_result  # noqa: E402

HERE = Path(__file__).resolve().parent
HEAD = BENCH / "gpu-head-smollm2" / "heads" / "smollm2-135m-instruct-eagle3"
SERVED = BENCH / "gpu-head-served" / "speculate-smollm2-gpu-head.json"
R3 = BENCH / "gpu-head-smollm2" / "gpu-head-smollm2-h200-r3.json"
INVENTORY = REPO / "deploy" / "sandbox-smollm2.yaml"
HELD_OUT_FROM, PROMPT_CHARS = 12000, 1500


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=24)
    ap.add_argument("--engine", choices=["vllm", "transformers"], default="vllm",
                    help="the extract stage's engine (transformers: the GPU run's way, here on CPU)")
    ap.add_argument("--json", type=Path, default=None,
                    help="default benchmarks/gpu-head-cpu-states/gpu-head-smollm2-cpu-states.json (vllm), -transformers.json")
    a = ap.parse_args()
    a.json = a.json or HERE / ("gpu-head-smollm2-cpu-states.json" if a.engine == "vllm"
                                else "gpu-head-smollm2-cpu-states-transformers.json")

    import yaml

    from eagle3ops import executor
    from eagle3ops.cli_common import deployed_record
    from eagle3ops.config import load_inventory
    from eagle3ops.speculate import reach
    from eagle3ops.speculate import regenerate as rg
    from eagle3ops.window.run import run_window
    from eagle3ops_dev import sandbox
    from eagle3ops_dev.sandbox.hold import hold

    t0 = time.monotonic()
    h = load_inventory(INVENTORY).host("sandbox")
    held = hold(sandbox.name_of(h.docker_host or ""))  # noqa: F841  (the sandbox is this run's until it exits)
    items, left_out = rg.items_from_dataset(["builtin:sharegpt-v3"], truncated="keep-complete", max_turns=1)
    use("gpu-head-smollm2")
    import gpu_head_smollm2 as g

    from eagle3ops.stages.chatdata import resolve_dataset

    # held out by content: records from HELD_OUT_FROM on that share no user turn with the training pool
    held = {idx for idx, _r, _u in g.held_out_by_content(resolve_dataset("builtin:sharegpt-v3", REPO))[0]}
    chosen = [i for i in items if int(i.id.rsplit(":", 1)[1]) - 1 in held  # id: <file name>:<row from 1>
              and sum(len(c) for r, c in i.turns if r != "assistant") <= PROMPT_CHARS][: a.conversations]
    run = time.strftime("gpuhead-cpu-%Y%m%dT%H%M%S")
    plan = rg.plan(chosen, rg.settings_for(h), REPO / "regenerated" / f"sandbox-{run}", time_budget_s=900)
    with executor.for_host(h) as r:
        gen = reach.regenerate_for_host(r, run, plan, echo=print)
    cfg = yaml.safe_load((REPO / "deploy" / "pipeline.yaml").read_text())
    cfg["prepare"] = {**cfg.get("prepare", {}), "datasets": [f"{rg.HOST_FOLDER}/{rg.DATASET}"], "max_seq_len": 2048}
    cfg["extract"] = {**cfg.get("extract", {}), "aux_layer_ids": [2, 15, 27], "engine": a.engine}
    cfg["train"] = {**cfg.get("train", {}), "held_out_fraction": 0.0}
    with executor.for_host(h) as r:
        dep = deployed_record(r)
    t = time.monotonic()
    with executor.for_host(h) as r:
        res = run_window(r, kind="extract", image=dep["image"], expected_image_id=dep.get("image_id"),
                         command=f"benchmarks/gpu-head-cpu-states/gpu_head_cpu_states.py --run {run}", run=run,
                         pipeline_text=yaml.safe_dump(cfg, sort_keys=False))
    window_s = round(time.monotonic() - t, 1)
    if res.get("outcome") != "ok":
        raise SystemExit(f"extract window {res.get('window_id')}: {res.get('outcome')}: {res.get('error')}")
    run_dir = Path(h.data_dir) / "runs" / run
    code = ("import json; from pathlib import Path; from eagle3ops.stages.estimate import estimate_head; "
            "print('E3OPS-EST ' + json.dumps(estimate_head(Path('/head'), Path('/run'), Path('/target'), "
            f"max_tokens=10**7, name={run!r})))")
    out = subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{HEAD}:/head:ro",
                          "-v", f"{run_dir}:/run:ro", "-v", f"{h.model_path}:/target:ro", "--entrypoint", "python3",
                          dep["image"], "-c", code], capture_output=True, text=True, timeout=1800)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("E3OPS-EST ")), None)
    if line is None:
        raise SystemExit(f"estimate failed (exit {out.returncode}): {out.stderr[-2000:]}")
    est = json.loads(line[len("E3OPS-EST "):])
    served = json.loads(SERVED.read_text())
    offline = json.loads(R3.read_text())["offline_acceptance"]
    ext = json.loads((run_dir / "extract" / "manifest.json").read_text())
    fig = {
        "what": "benchmarks/gpu-head-cpu-states/gpu_head_cpu_states.py: the round-3 H200 head's teacher-forced acceptance on hidden "
                "states extracted by vLLM 0.16 CPU on the sandbox (why served < offline)",
        "run": run, "conversations": len(chosen), "regenerate": {k: gen.get(k) for k in (
            "answered", "conversations", "completion_tokens_now", "wall_s", "finish_reasons", "failed")},
        "extract": {"engine": ext.get("engine"), "aux_layer_ids": ext.get("aux_layer_ids"),
                    "tokens": ext.get("tokens"), "samples": len(ext.get("sample_files") or []),
                    "window_s": window_s, "window_id": res.get("window_id"), "downtime_s": res.get("downtime_s")},
        "estimate_on_cpu_states": est,
        "served": {"acceptance_length": served.get("acceptance_length"),
                   "per_position": served.get("acceptance_per_position"), "file": SERVED.name},
        "offline_on_gpu_states": {"acceptance_length": offline["acceptance_length"],
                                  "per_position": offline["per_position"], "file": R3.name},
        "head": str(HEAD.relative_to(REPO)), "pipeline_image": dep["image"],
        "machine": _cpu(), "wall_s": round(time.monotonic() - t0, 1),
    }
    write_result(a.json, fig, indent=1)
    print(json.dumps({k: fig[k] for k in ("estimate_on_cpu_states", "served", "offline_on_gpu_states")}, indent=1))
    print(f"figures written to {a.json}")
    return 0


def _cpu() -> str:
    from eagle3ops_dev.demo import cpu_model

    return cpu_model()


if __name__ == "__main__":
    sys.exit(main())
