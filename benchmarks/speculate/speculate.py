"""Speculative decoding on a host: acceptance length (mean, per position) and the speculative/baseline output
throughput ratio at concurrency 1 and N, from one ``eagle3ops speculate`` run.

Either runs the gate once (``HOST --run RUN [--head DIR] [--margin M]``: baseline measurement, speculative
release, measurement, keep-or-rollback, exactly as ``eagle3ops speculate``), or, with ``--read``, reads the figures
a run already recorded (``<data_dir>/runs/<run>/speculate/result.json`` on the host; nothing changes). Prints the
figures and writes them as JSON (``--json PATH``, default ``benchmarks/speculate-<host>-<run>.json``).

Figures (all measured by the gate on the host, see :mod:`eagle3ops.speculate`): ``acceptance_length_mean`` =
1 + Δaccepted / Δdrafts over every level (vLLM's definition), ``acceptance_per_position`` = Δaccepted_pos /
Δdrafts, and per concurrency c in {first level (production), last level}: baseline and speculative output tokens/s
and ``ratio`` = speculative / baseline.

Measured (``benchmarks/speculate/speculate-cpu-tiny-llama.json``; sandbox: 2 shared cores, the random tiny Llama target of 4
layers x 128, the demo run's 20-step head uploaded with ``--head``, k = 3, 4 HumanEval gate prompts x 16 tokens): mean
acceptance length 1.0 (no proposal accepted), speculative/baseline output tokens/s 0.27 at concurrency 1 and 0.62 at
4, rolled back: a random target gives a head nothing to learn, and a 4-layer target costs about what a draft step
costs. On the trained 24-layer sandbox target (:mod:`eagle3ops_dev.tinytrained`, the demo's) with a head trained by the
demo's settings (``benchmarks/speculate/speculate-cpu-trained-target.json``, 8 prompts x 64 tokens): see
``benchmarks/sandbox-target/README.md`` — acceptance 1.93 (per position 0.43 / 0.28 / 0.21), x1.30 at
concurrency 1 and x1.00 at 4, kept. Throughput figures move by ~10 % between runs on the shared cores.

Usage::

    python benchmarks/speculate/speculate.py sandbox --run demo --head /tmp/head --prompts 8 --max-tokens 64
    python benchmarks/speculate/speculate.py sandbox --run demo-20261130T185849 --read   # what a make demo's gate measured
    python benchmarks/speculate/speculate.py gpu-01 --run r1 --read
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import write_result  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def summarize(result: dict) -> dict:
    """The benchmark's figures from a gate result (``speculate/result.json``)."""
    levels = result.get("levels") or {}
    cs = sorted(int(c) for c in levels)
    prod = int(result.get("production_concurrency") or (cs[0] if cs else 1))
    n = max(cs) if cs else prod
    sd = result.get("spec_decode") or {}

    def level(c: int) -> dict:
        lv = levels.get(str(c)) or {}
        b = (lv.get("baseline") or {}).get("output_tokens_per_s")
        s = (lv.get("speculative") or {}).get("output_tokens_per_s")
        return {"concurrency": c, "baseline_tokens_per_s": b, "speculative_tokens_per_s": s,
                "ratio": lv.get("throughput_ratio"),
                "baseline_itl_ms": (lv.get("baseline") or {}).get("itl_ms_median"),
                "speculative_itl_ms": (lv.get("speculative") or {}).get("itl_ms_median")}

    return {"host": result.get("host"), "run": result.get("run"), "verdict": result.get("verdict"),
            "reason": result.get("reason"), "margin": result.get("margin"),
            "num_speculative_tokens": result.get("num_speculative_tokens"),
            "acceptance_length_mean": sd.get("mean_acceptance_length"),
            "acceptance_per_position": sd.get("acceptance_per_position"),
            "offline_estimate": result.get("offline_estimate"),
            "prompts": {k: (result.get("prompts") or {}).get(k) for k in ("source", "count", "max_tokens")},
            "concurrency_1": level(prod), "concurrency_n": level(n)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("host")
    ap.add_argument("--run", required=True)
    ap.add_argument("--head", type=Path, help="a local head directory (default: the run's train/final)")
    ap.add_argument("--margin", type=float, help="override serving.gate_margin (negative: keep-branch tests only)")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--control", action="store_true", help="measure a control release as the baseline (the "
                    "speculative image without --speculative-config): needed when it differs from the live image")
    ap.add_argument("--prompts", type=int, help="override serving.gate_prompts")
    ap.add_argument("--max-tokens", type=int, help="override serving.gate_max_tokens")
    ap.add_argument("--read", action="store_true", help="read the run's recorded result; change nothing")
    ap.add_argument("--inventory", type=Path, default=REPO / "deploy/hosts.yaml")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    from eagle3ops.commands import host as hc
    from eagle3ops.config import load_inventory
    from eagle3ops.remote import Remote
    from eagle3ops.speculate import ship
    from eagle3ops.window.common import paths

    h = load_inventory(a.inventory).host(a.host)
    with Remote(h) as r:
        if a.read:
            out = r.run(hc.cat_if_exists(f"{h.data_dir}/runs/{a.run}/speculate/result.json"), check=False)
            if not out.stdout.strip():
                print(f"{a.host}: run {a.run} has no speculate/result.json", file=sys.stderr)
                return 1
            result = json.loads(out.stdout)
        else:
            dep = json.loads(r.run(hc.cat(paths(h)["deployed"])).stdout)
            result = ship.speculate(r, ship.SpeculateOptions(
                run=a.run, pipeline_image=h.pipeline_image or dep["image"], pipeline_image_id=dep.get("image_id"),
                head=a.head, force=a.force, margin=a.margin, prompts=a.prompts, max_tokens=a.max_tokens,
                control=a.control, command="benchmarks/speculate/speculate.py"),
                echo=lambda m: print(m, file=sys.stderr))
    fig = summarize(result)
    path = a.json or Path(__file__).resolve().parent / f"speculate-{a.host}-{a.run}.json"
    write_result(path, fig, indent=1)
    print(f"verdict {fig['verdict']}: {fig['reason']}")
    print(f"acceptance length {fig['acceptance_length_mean']} (k={fig['num_speculative_tokens']}), per position "
          f"{fig['acceptance_per_position']}; offline estimate {fig['offline_estimate']}")
    for key in ("concurrency_1", "concurrency_n"):
        lv = fig[key]
        print(f"concurrency {lv['concurrency']}: baseline {lv['baseline_tokens_per_s']} tok/s, speculative "
              f"{lv['speculative_tokens_per_s']} tok/s, ratio {lv['ratio']} (ITL {lv['baseline_itl_ms']} -> "
              f"{lv['speculative_itl_ms']} ms)")
    print(f"figures written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
