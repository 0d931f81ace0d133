"""P3: maintenance overhead of a window on the sandbox host.

overhead = serving downtime − time spent in stages − serving start time (restore → health gate passed)

i.e. what eagle3ops itself adds while production is down: recording the spec, stopping, starting stage containers,
journal writes, polling. Baseline in the same run: a bare `docker stop` + `docker start` of the serving container
and a wait for /health over the same SSH executor (the least any maintenance could cost). Target: ≤ 10 s.

Usage (after `make demo` or the test fixtures provisioned the sandbox):  .venv/bin/python benchmarks/window-overhead/window.py
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from eagle3ops_dev import demo  # noqa: E402
from eagle3ops.commands import docker as dk  # noqa: E402
from eagle3ops.commands import host as hc  # noqa: E402
from eagle3ops.config import load_inventory  # noqa: E402
from eagle3ops.remote import Remote  # noqa: E402
from eagle3ops.window.common import paths  # noqa: E402
from eagle3ops.window.run import run_window  # noqa: E402

PIPELINE = """target_model: /model
prepare: {datasets: [builtin:sharegpt], max_seq_len: 256, max_samples: 8}
extract: {batch_size: 8}
"""


def _epoch(ts: str) -> float:
    return datetime.fromisoformat(ts).timestamp()


def baseline(h) -> float:
    """Bare stop + start + wait for /health: seconds serving was down."""
    with Remote(h) as r:
        t0 = time.time()
        r.run(dk.docker(h, "stop", "--time", str(h.serving.stop_timeout_s), h.serving.container))
        r.run(dk.docker(h, "start", h.serving.container))
        while not demo.serving_healthy(h, timeout=2):
            time.sleep(0.5)
        return time.time() - t0


def main() -> int:
    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    if not demo.serving_healthy(h):
        print("sandbox serving is not healthy: run `make demo` first", file=sys.stderr)
        return 2
    with Remote(h) as r:
        dep = json.loads(r.run(hc.cat(paths(h)["deployed"])).stdout)
        run = f"bench-p3-{datetime.now():%Y%m%dT%H%M%S}"  # a fresh run: stages refuse outputs of other inputs
        res = run_window(r, kind="extract", image=dep["image"], expected_image_id=dep["image_id"],
                         command="benchmarks/window-overhead/window.py", run=run, pipeline_text=PIPELINE)
        journal = [json.loads(x) for x in r.run(hc.cat(paths(h, res["window_id"])["journal"])).stdout.splitlines()]
    if res["outcome"] != "ok":
        print(f"window failed: {res}", file=sys.stderr)
        return 1
    ev = {(e["step"], e["event"]): e["epoch"] for e in journal}
    downtime = res["downtime_s"]
    stages = sum(res["stage_seconds"].values())
    serving_start = ev[("health", "ok")] - ev[("restore", "start")]
    overhead = downtime - stages - serving_start
    base = baseline(h)
    print(f"P3 window (extract, tiny model, sandbox): downtime {downtime:.1f} s = stages {stages:.1f} s "
          f"+ serving start {serving_start:.1f} s + overhead {overhead:.1f} s")
    print(f"    stop phase (stop start → first stage start): "
          f"{ev[('prepare', 'start')] - ev[('stop', 'start')]:.1f} s")
    print(f"baseline: bare docker stop + start + /health over SSH: {base:.1f} s downtime (no stages)")
    print(f"P3 overhead {overhead:.1f} s (target ≤ 10 s): {'PASS' if overhead <= 10 else 'FAIL'}; "
          f"window downtime minus stages / baseline downtime = {(downtime - stages) / base:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
