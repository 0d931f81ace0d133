"""An A/A benchmark of ``eagle3ops release --gate``: a change that changes nothing the gate measures, gated again and
again on the sandbox's real vLLM serving real SmolLM2, to see how often the gate's 90 % interval excludes 1.0 (a
false difference) and how often the no-op change is kept.

Each run, in order, through the CLI (the user's commands):

1. ``eagle3ops release HOST --gate --arg=NOOP`` (default ``--uvicorn-log-level=warning``: the HTTP server's log
   level, nothing the engine or the measured requests see) at the inventory's gate settings as given
   (``serving.gate_passes``, ``gate_prompts``, ``gate_max_tokens``, ``gate_concurrency``: the first level
   decides, ``gate_margin``); its result file on the host (the newest ``kind: release-gate`` audit entry's
   attempt folder) gives the verdict, the passes, the throughput ratio at the deciding level and its interval;
2. ``eagle3ops rollback HOST --dry-run``: the release a plain rollback would bring back, as the CLI names it before
   anything stops (a gate's changed release, kept or rejected, must not be the target after a rejection);
3. when the change was kept: ``eagle3ops rollback HOST --to ORIGINAL`` (the first gate's baseline release), so that
   every run measures the same release against the same no-op change (the restore is recorded, not measured).

The target is the gate's design: its two-sided 90 % interval excludes 1.0 in about 1 run in 10 when nothing
changed (5 % each side). The JSON (``--json``, default ``benchmarks/gate-aa/gate-aa-smollm2.json``) holds every run's
figures, how often the interval excluded 1.0 and how often the change was kept, whether the measured share meets
"at most 1 run in 10" (``meets_at_most_1_in_10``; when it does not, ``design_note`` says so and the figure stands
as measured), the CPU (model, AMX or not, cores) and the gate settings. Nothing here is a stand-in: real vLLM (the
sandbox's CPU build), SmolLM2-135M-Instruct as the demo serves it (:mod:`eagle3ops_dev.demo`).

Usage (holds the sandbox for the whole run, ~3-4 minutes a run on a 2-core machine; the first call provisions
like the demo's steps 1-4: sandbox up, images, SmolLM2 served, deploy)::

    python benchmarks/gate-aa/gate_aa.py --runs 10                 # make bench-gate-aa
    python benchmarks/gate-aa/gate_aa.py --runs 2 --json /tmp/gate-aa-check.json
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import use, write_result  # noqa: E402

use("release-gate")

import release_gate as gatebench  # noqa: E402  (the CPU line, the CLI runner and the gate's result reader)

#: The most runs in ten whose interval may exclude 1.0 (the gate's two-sided 90 % interval: 1 in 10 by design).
TARGET_PER_10 = 1
#: What the CLI says first on ``rollback`` (:func:`eagle3ops.window.run.run_window`): the target and why, or why none.
TARGET_LINE = re.compile(r"^(?:rolling back to release (\d+) \((.*)\)|rollback: (.*))$", re.M)

#: The sandbox's hold, open until the script exits.
_HELD: list[Any] = []


def provision(h: Any) -> dict[str, Any]:
    """The demo's steps 1-4 (:func:`eagle3ops_dev.demo.run`): the sandbox up and held, the local vLLM base and the
    pipeline image, SmolLM2 served as release 1 unless it already serves, deploy. Returns each step's seconds."""
    from eagle3ops import deployer, images
    from eagle3ops_dev import bases, demo, sandbox
    from eagle3ops_dev.sandbox.hold import hold

    out: dict[str, Any] = {}
    t = time.monotonic()
    _HELD.append(hold(sandbox.name_of(h.docker_host or "")))
    sandbox.up_for(h)
    out["sandbox_up_s"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    ca = images.default_ca_bundle()
    base = bases.build_local_base(ca_bundle=ca)
    built = images.build_image("pipeline", base_image=base, ca_bundle=ca)
    out["images_s"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    print(deployer.push_image(h.serving.image, h), flush=True)
    replaced = demo.build_tiny_model(built.tag, h.model_path, demo.DEMO_TARGET)
    out["serving_start_s"] = round(demo.start_serving(h, restart=replaced), 1)
    t = time.monotonic()
    deployer.deploy(h, base_image=base, echo=print)
    out["deploy_s"] = round(time.monotonic() - t, 1)
    return out


def _interval_excludes_one(interval: dict[str, Any] | None) -> bool | None:
    """Whether the interval ``{"low", "high"}`` lies wholly above or below 1.0; None without an interval."""
    if not interval or interval.get("low") is None or interval.get("high") is None:
        return None
    return interval["low"] > 1.0 or interval["high"] < 1.0


def one_run(i: int, h: Any, inventory: Path, noop: str, original: int | None) -> dict[str, Any]:
    """Run ``i``: the gated no-op release, the rollback target the CLI names after it, the restore after a keep."""
    from eagle3ops import executor
    from eagle3ops.commands import host as hc
    from eagle3ops.window.common import audit_entries, current_release

    with executor.for_host(h) as r:
        before = len(audit_entries(r))
    rc, wall, tail = gatebench._cli(inventory, "release", h.name, "--gate", f"--arg={noop}", timeout=3600)
    run: dict[str, Any] = {"run": i, "exit": rc, "wall_s": wall}
    with executor.for_host(h) as r:
        fig = gatebench._gate_figures(r, before)
        res = {}
        if fig.get("result_file"):
            res = json.loads(r.run(hc.cat_if_exists(fig["result_file"]), check=False).stdout or "{}")
        run.update(verdict=fig.get("verdict"), reason=fig.get("reason"), passes=res.get("gate_passes"),
                   deciding_level=fig.get("deciding_level"), throughput_ratio=fig.get("throughput_ratio"),
                   interval=fig.get("interval"), interval_excludes_1=_interval_excludes_one(fig.get("interval")),
                   drift=res.get("drift"), ttft_ratio=fig.get("ttft_ratio"), levels=fig.get("levels"),
                   baseline_release=fig.get("baseline_release"), changed_release=fig.get("changed_release"),
                   live_release_after=current_release(r), kept=fig.get("verdict") == "keep",
                   result_file=fig.get("result_file"))
    if rc not in (0, 3) or "error" in fig:
        run["output_tail"] = tail
    dry = subprocess.run([str(REPO / ".venv/bin/eagle3ops"), "rollback", h.name, "--dry-run", "--inventory",
                          str(inventory)], cwd=REPO, capture_output=True, text=True, timeout=600)
    drc, dtail = dry.returncode, dry.stderr  # the line is the first on stderr (the plan's commands are on stdout)
    m = TARGET_LINE.search(dtail)
    run["rollback_default"] = {"exit": drc, "target": int(m.group(1)) if m and m.group(1) else None,
                               "why": (m.group(2) or m.group(3)) if m else None,
                               **({} if m else {"output_tail": dtail[-600:]})}
    if not run["kept"] and run.get("changed_release") is not None:  # the rejected change is never the target
        run["rollback_default"]["skips_the_rejected_change"] = run["rollback_default"]["target"] != run[
            "changed_release"]
    original = original if original is not None else run.get("baseline_release")
    if run["kept"] and original is not None:  # the next run measures the same release again
        rrc, rwall, rtail = gatebench._cli(inventory, "rollback", h.name, "--to", str(original), timeout=1800)
        run["restore"] = {"command": f"eagle3ops rollback {h.name} --to {original}", "exit": rrc, "wall_s": rwall,
                          **({} if rrc == 0 else {"output_tail": rtail})}
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="sandbox")
    ap.add_argument("-i", "--inventory", type=Path, default=REPO / "deploy/sandbox-smollm2.yaml")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--noop", default="--uvicorn-log-level=warning", help="the no-op server flag (one argv word)")
    ap.add_argument("--no-provision", action="store_true", help="serving and the deploy are already up (the demo ran)")
    ap.add_argument("--json", type=Path, default=REPO / "benchmarks/gate-aa/gate-aa-smollm2.json")
    a = ap.parse_args()
    if a.runs < 1:
        ap.error("--runs must be at least 1")

    from eagle3ops.config import load_inventory

    h = load_inventory(a.inventory).host(a.host)
    t0 = time.monotonic()
    prov = {} if a.no_provision else provision(h)
    # what the first gate measured as live (its record step may adopt a container this state dir never recorded:
    # the tests' inventory shares it), restored after every keep
    original: int | None = None
    runs = []
    for i in range(1, a.runs + 1):
        run = one_run(i, h, a.inventory, a.noop, original)
        original = original if original is not None else run.get("baseline_release")
        runs.append(run)
        print(json.dumps({k: run.get(k) for k in ("run", "exit", "verdict", "passes", "throughput_ratio", "interval",
                                                  "interval_excludes_1", "rollback_default", "wall_s")}), flush=True)
    decided = [r for r in runs if r["interval_excludes_1"] is not None]
    excl = sum(1 for r in decided if r["interval_excludes_1"])
    kept = sum(1 for r in runs if r["kept"])
    meets = bool(decided) and excl * 10 <= TARGET_PER_10 * len(decided)
    s = h.serving
    out = {"what": "benchmarks/gate-aa/gate_aa.py: an A/A benchmark of `eagle3ops release --gate` with a no-op flag "
                   f"({a.noop}) on the sandbox's real vLLM 0.16 (CPU build) serving SmolLM2-135M-Instruct",
           "host": a.host, "inventory": str(a.inventory.relative_to(REPO) if a.inventory.is_relative_to(REPO)
                                            else a.inventory),
           "cpu": gatebench._cpu(), "cores": subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip(),
           "gate_settings": {"passes": s.gate_passes, "prompts": s.gate_prompts, "max_tokens": s.gate_max_tokens,
                             "warmup_prompts": s.gate_warmup_prompts, "concurrency": s.gate_concurrency,
                             "deciding_level": (s.gate_concurrency or [1])[0], "margin": s.gate_margin,
                             "ttft_ratio_max": s.gate_ttft_ratio_max,
                             "rule": "not_slower: kept when the 90 % interval's lower bound reaches 1 - margin, "
                                     "rolled back when its upper bound is below it, else undecided (rolled back); "
                                     "rolled back too when the median time to first token exceeds ttft_ratio_max "
                                     "x the baseline's",
                             "interval": "two-sided 90 %: excludes 1.0 in 1 run in 10 when nothing changed"},
           "noop_change": a.noop, "original_release": original, "provision": prov,
           "runs": runs, "runs_count": len(runs), "runs_with_interval": len(decided),
           "interval_excluded_1": excl, "interval_excluded_1_share": round(excl / len(decided), 3) if decided else None,
           "kept": kept, "kept_share": round(kept / len(runs), 3),
           "verdicts": {v: sum(1 for r in runs if r["verdict"] == v) for v in sorted({str(r["verdict"]) for r in runs})},
           "target": f"at most {TARGET_PER_10} run in 10 whose interval excludes 1.0",
           "meets_at_most_1_in_10": meets,
           "rollback_never_targets_a_rejected_change": all(
               r["rollback_default"].get("skips_the_rejected_change", True) for r in runs),
           "wall_s": round(time.monotonic() - t0, 1), "t": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if not meets:
        out["design_note"] = (f"the gate's design as it ran does not meet the target here: {excl} of {len(decided)} "
                              "runs' intervals excluded 1.0 with nothing changed; the figure is reported as measured"
                              + ("" if len(decided) >= 10 else f" (only {len(decided)} runs: too few to judge)"))
    write_result(a.json, out, indent=1)
    print(f"interval excluded 1.0 in {excl} of {len(decided)} runs; kept {kept} of {len(runs)}; "
          f"meets the target: {meets}; written to {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
