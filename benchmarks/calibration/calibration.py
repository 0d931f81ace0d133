"""Calibration across heads: offline estimate, speculation gate and watched production, per head shipped.

For each head (the run's own, or a head directory trained elsewhere, estimated on the run's held-out hidden states
on the host: ``speculate --head``), in order:

1. ``speculate`` (the host-side job, ``--control``: like for like) measures the head on the gate's prompts. On the
   2-core CPU sandbox speculation does not win (the SmolLM2 gate measured x0.57-x0.89), so to put each head live the
   job runs with the test-only negative margin (:data:`MARGIN`, switch ``EAGLE3OPS_TEST_ALLOW_NEGATIVE_MARGIN``),
   an acceptance floor of 1.0 and a TTFT bound of :data:`TTFT_RATIO_MAX`: **named test settings**, recorded in every
   result (``margin_is_negative_test_setting``). The figures themselves are measured.
2. "Production" traffic: held-out ShareGPT V3 first user turns that neither the run nor the gate used, through
   ``/v1/chat/completions`` (greedy, ``--max-tokens``), one request at a time, while ``eagle3ops watch`` (the
   library call the CLI makes; policy report-only) records ``--watch-s`` seconds in ``--interval`` intervals and
   writes ``production.json`` beside the gate's result.
3. The baseline release back (a rollback window).

Then ``eagle3ops report``'s collector reads every head's three figures from the host (:func:`report.calibration_rows`)
and renders ``calibration.png``; this script copies it and writes ``--json`` (default
``benchmarks/calibration-<host>.json``) with each head's offline estimate, gate and production acceptance, their
differences, and the per-interval production records.

Usage (the demo's sandbox must have a run with extracted hidden states and a trained head, e.g. after ``make demo``)::

    python benchmarks/calibration/calibration.py sandbox -i deploy/sandbox-smollm2.yaml --run demo-20261204T181943 \\
        --head own --head benchmarks/gpu-head-smollm2/heads/smollm2-135m-instruct-eagle3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import write_result  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
#: The test-only margin that keeps a slower head live (see the module doc).
MARGIN = -0.9
#: The TTFT bound of this benchmark's gates (``serving.gate_ttft_ratio_max``; default 1.5): a named test setting.
TTFT_RATIO_MAX = 6.0


def traffic_prompts(h, exclude: set[str], n: int) -> list[dict]:
    """``n`` held-out ShareGPT V3 first user turns (the demo's split: never regenerated or trained on) not in
    ``exclude`` (the gate's chat set), each ``{"id", "user"}``, at most the demo's prompt length."""
    from eagle3ops.speculate import regenerate as rg
    from eagle3ops_dev import demo

    items, _ = rg.items_from_dataset([demo.DEMO_DATASET], truncated="keep-complete", max_turns=demo.DEMO_MAX_TURNS)
    _, held, _ = rg.split_held_out(items, demo.DEMO_HELD_OUT)
    rows = []
    for it in held:
        users = [c for r, c in it.turns if r == "user"]
        if it.id not in exclude and users and len(users[0]) <= demo.DEMO_PROMPT_CHARS:
            rows.append({"id": it.id, "user": users[0]})
        if len(rows) >= n:
            break
    return rows


def drive(h, rows: list[dict], max_tokens: int, stop: threading.Event, sent: list[int]) -> None:
    """Send ``rows`` round robin, one request at a time, until ``stop`` (errors: wait a second, go on)."""
    import httpx

    s, i = h.serving, 0
    while not stop.is_set():
        try:
            httpx.post(f"http://127.0.0.1:{s.port}/v1/chat/completions", timeout=120, json={
                "model": s.served_model_name, "temperature": 0, "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": rows[i % len(rows)]["user"]}]}).raise_for_status()
            sent[0] += 1
        except httpx.HTTPError:
            stop.wait(1)
        i += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("host")
    ap.add_argument("-i", "--inventory", type=Path, default=REPO / "deploy/sandbox-smollm2.yaml")
    ap.add_argument("--run", required=True, help="the run whose hidden states and head are on the host")
    ap.add_argument("--head", action="append", required=True, help="`own` (the run's head) or a local head dir")
    ap.add_argument("--prompts-file", type=Path, help="the gate's chat set (default: the demo's, "
                    "reports/<host>-<run>/gate-chat.jsonl, with HumanEval's gate split beside it)")
    ap.add_argument("--watch-s", type=float, default=150)
    ap.add_argument("--interval", type=float, default=30)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    from eagle3ops import report
    from eagle3ops.commands import host as hc
    from eagle3ops.config import load_inventory
    from eagle3ops.config.inventory import NEGATIVE_MARGIN_ENV
    from eagle3ops.remote import Remote
    from eagle3ops.speculate import ship
    from eagle3ops.speculate import watch as w
    from eagle3ops.window.common import current_release, paths
    from eagle3ops.window.run import run_window

    os.environ[NEGATIVE_MARGIN_ENV] = "1"
    h = load_inventory(a.inventory).host(a.host)
    # the stand-in serving image's first token pays the draft's prefill on 2 shared cores (x2.18 measured for the
    # H200 head): the TTFT bound too is a named test setting here
    h = h.model_copy(update={"serving": h.serving.model_copy(update={"gate_ttft_ratio_max": TTFT_RATIO_MAX})})
    chat = a.prompts_file or REPO / "reports" / f"{a.host}-{a.run}" / "gate-chat.jsonl"
    gate_ids = {json.loads(x)["id"] for x in chat.read_text().splitlines() if x.strip()}
    rows = traffic_prompts(h, gate_ids, 40)
    t0 = time.monotonic()
    heads = []
    with Remote(h) as r:
        dep = json.loads(r.run(hc.cat(paths(h)["deployed"])).stdout)
        start_release = current_release(r)
        for head in a.head:
            name = "own" if head == "own" else Path(head).name
            print(f"== {name}: speculate", flush=True)
            res = ship.speculate(r, ship.SpeculateOptions(
                run=a.run, pipeline_image=dep["image"], pipeline_image_id=dep.get("image_id"),
                head=None if head == "own" else Path(head), force=True, control=True, margin=MARGIN,
                acceptance_floor=1.0, prompts_file=chat, with_humaneval=True,
                command=f"benchmarks/calibration/calibration.py speculate --run {a.run} --head {head} (margin {MARGIN}: test "
                        "setting)"), echo=lambda m: print(m, flush=True))
            one = {"head": head, "verdict": res["verdict"], "reason": res["reason"],
                   "attempt_dir": res.get("attempt_dir"), "head_sha256": res.get("head_sha256"),
                   "margin_is_negative_test_setting": res.get("margin_is_negative_test_setting")}
            if res["verdict"] == "keep":
                print(f"== {name}: watch {a.watch_s:.0f} s with held-out chat traffic", flush=True)
                stop, sent = threading.Event(), [0]
                t = threading.Thread(target=drive, args=(h, rows, a.max_tokens, stop, sent), daemon=True)
                t.start()
                try:
                    out = w.watch(r, w.WatchOptions(duration_s=a.watch_s, interval_s=a.interval,
                                                    pipeline_image=dep["image"], pipeline_image_id=dep.get("image_id"),
                                                    command="benchmarks/calibration/calibration.py watch"),
                                  echo=lambda m: print(m, flush=True))
                finally:
                    stop.set()
                    t.join(timeout=150)
                one.update(watch={"intervals": out["intervals"], "exit_code": out["exit_code"],
                                  "thresholds": out["thresholds"], "breaches": [b["reason"] for b in out["breaches"]],
                                  "production": out["production"], "requests_sent": sent[0]})
                rec = r.run(hc.cat_if_exists(f"{h.state_dir}/watch/{res['live_release']}.jsonl"), check=False)
                one["watch"]["records"] = [json.loads(x) for x in rec.stdout.splitlines() if x.strip()][-20:]
                back = run_window(r, kind="rollback", image=dep["image"], expected_image_id=dep.get("image_id"),
                                  command="benchmarks/calibration/calibration.py: back to the baseline release",
                                  to_release=res["baseline_release"])
                one["rollback"] = {"outcome": back["outcome"], "release": back.get("release")}
            heads.append(one)
        data = report.collect(r, h, a.run)
        end_release = current_release(r)
    out_dir = REPO / "reports" / f"{a.host}-calibration"
    plotted = report.render(data, out_dir)
    rows_by_label = {row["label"]: row for row in data["calibration"]}
    for one in heads:
        label = f"{a.run}:{(one.get('head_sha256') or '')[:8]}"
        row = rows_by_label.get(label) or {}
        one["calibration"] = {k: row.get(k) for k in ("label", "offline", "gate", "production",
                                                      "production_intervals")}
        g, o, p = row.get("gate"), row.get("offline"), row.get("production")
        one["calibration"].update(gate_minus_offline=round(g - o, 4) if g and o else None,
                                  production_minus_gate=round(p - g, 4) if p and g else None)
    png = Path(__file__).resolve().parent / f"calibration-{a.host}.png"
    shutil.copy(out_dir / "calibration.png", png)
    res = {"what": "benchmarks/calibration/calibration.py: per head shipped, the offline estimate, the speculation gate's and "
                   "the watched production's mean acceptance length",
           "host": a.host, "inventory": str(a.inventory), "run": a.run,
           "test_setting": f"margin {MARGIN}, acceptance floor 1.0, TTFT bound x{TTFT_RATIO_MAX} (named, to put each head "
                           "live on CPU)",
           "traffic": {"source": "held-out ShareGPT V3 first user turns not in the gate's chat set",
                       "prompts": len(rows), "max_tokens": a.max_tokens, "concurrency": 1},
           "heads": heads, "every_row_on_the_host": data["calibration"], "plotted": plotted.get("calibration"),
           "plot": str(png.relative_to(REPO)), "release_at_start": start_release, "release_at_end": end_release,
           "wall_s": round(time.monotonic() - t0, 1), "t": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = a.json or Path(__file__).resolve().parent / f"calibration-{a.host}.json"
    write_result(path, res, indent=1)
    for one in heads:
        print(f"{one['head']}: {one['verdict']}; {one['calibration']}")
    print(f"figures written to {path}, plot {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
