"""A fleet extract over three SERVING hosts with a down-at-once limit, checked from the hosts'
audit logs: each window's audit line carries serving's ``stopped_at``/``restored_at`` (the supervisor's), and with
``fleet.max_down_per_model: 1`` no two stop→restore intervals may overlap. The same run with limit 2 is the control
(the check sees overlaps when they are allowed: two hosts down at once). With no host of ``serving: none`` and no
host that has prepared the run, the fleet's prepare pass is a window of its own on the first host (its interval is
in the audit too, labelled ``prepare``).

Hosts: the fleet fixture (:mod:`eagle3ops_dev.fleet`): sandboxes ``bench-fleet0..2`` (sshd only, no engine), each in
namespace ``e3fbench<k>`` at 10.228.<k>.2 behind a veth limited to 100 mbit (``tc tbf``), SSH 2250+k; each a venv
host with the STAND-IN pipeline environment (stand-in stages: no hidden states) serving the STAND-IN OpenAI server of
``tests/data/standin_openai_server.py`` as ``serving: process`` on port 18050+k, all three one served model. The
stand-in extract takes ``--sample-s`` seconds per sample, so each window keeps serving down for a few seconds. The
real CLI runs as a subprocess. Everything this script creates is removed at the end (``--keep`` keeps it).

Measured 2026-12-05 on the 2-core machine (shared with a CI run; load ~0.4-3), 12 samples, 0.5 s a sample
(benchmarks/fleet-waves/fleet-waves.json): limit 1 → waves fleet0:0, fleet1:1, fleet2:2; the four audit intervals (the prepare
window on fleet0, then the three extract windows: 6.9-7.2 s of downtime each) never overlap, at most 1 host down at
once, 40.9 s wall. Limit 2 → fleet0 and fleet1 in wave 0, their intervals overlap (2 down at once), 31.5 s wall.

Usage (root): python benchmarks/fleet-waves/fleet_waves.py [--limits 1,2] [--samples 12] [--sample-s 0.5]
              [--json benchmarks/fleet-waves/fleet-waves.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import write_result  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NET = {"prefix": "bench-fleet", "ns_prefix": "e3fbench", "subnet": 228}
SSH_PORT, PORT0, MODEL = 2250, 18050, "standin-fleet"


def overlaps(intervals: list[tuple[str, float, float]]) -> list[list[str]]:
    """Pairs of hosts whose ``(host, start, end)`` intervals overlap (pure)."""
    return [[a[0], b[0]] for a, b in itertools.combinations(intervals, 2) if a[1] < b[2] and b[1] < a[2]]


def most_down_at_once(intervals: list[tuple[str, float, float]]) -> int:
    """The largest number of intervals covering one instant (pure)."""
    events = sorted([(s, 1) for _, s, _ in intervals] + [(e, -1) for _, _, e in intervals])
    cur = best = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def run_once(hosts, tmp: Path, limit: int, run: str, samples: int, sample_s: float) -> dict:
    """One fleet extract with ``fleet.max_down_per_model: limit``; the intervals read back from the audit logs."""
    from eagle3ops.remote import Remote
    from eagle3ops.window.common import audit_entries
    from eagle3ops_dev import fleet

    slow = [h.model_copy(update={"stage_env": {"EAGLE3OPS_STANDIN_SAMPLE_S": str(sample_s)}}) for h in hosts]
    inv = tmp / f"hosts-{limit}.yaml"
    inv.write_text(fleet.inventory_yaml(slow, {"max_down_per_model": limit}))
    pipe = tmp / "pipeline.yaml"
    pipe.write_text(f"target_model: /model\nprepare: {{datasets: [builtin:sharegpt], max_samples: {samples}}}\n")
    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "eagle3ops", "extract", *[h.name for h in hosts], "-i", str(inv),
                         "--pipeline", str(pipe), "--run", run, "--merged", str(tmp / f"merged-{run}.json")],
                        capture_output=True, text=True, timeout=600, cwd=REPO)
    wall = time.monotonic() - t0
    if cp.returncode:
        raise SystemExit(f"fleet extract (limit {limit}) failed:\n{cp.stdout[-3000:]}\n{cp.stderr[-2000:]}")
    intervals, downtimes = [], {}
    for h in hosts:
        with Remote(h) as r:
            mine = [e for e in audit_entries(r) if f"--run {run} " in f"{e.get('command', '')} "
                    and e.get("stopped_at")]
        for e in mine:
            kind = "prepare" if "-prepare-" in str(e.get("window")) else "extract"
            intervals.append((f"{h.name}:{kind}", float(e["stopped_at"]), float(e["restored_at"])))
            downtimes[f"{h.name}:{kind}"] = e.get("downtime_s")
    t_min = min(s for _, s, _ in intervals)
    plan = json.loads(cp.stdout[cp.stdout.index("\n{") + 1:cp.stdout.index("\n}") + 2])
    return {"max_down_per_model": limit, "windows_in_audit": len(intervals),
            "extract_windows": sum(h.endswith(":extract") for h, _, _ in intervals), "wall_s": round(wall, 1),
            "waves": {w["host"]: w["wave"] for w in plan["windows"]},
            "intervals_s": [{"host": h, "stop": round(s - t_min, 2), "restored": round(e - t_min, 2)}
                            for h, s, e in sorted(intervals, key=lambda x: x[1])],
            "downtime_s": downtimes, "overlapping_pairs": overlaps(intervals),
            "most_down_at_once": most_down_at_once(intervals)}


def main() -> int:
    """Bring the three hosts up, run the fleet extract once per limit, write the JSON, take everything down."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limits", default="1,2")
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--sample-s", type=float, default=0.5)
    ap.add_argument("--json", type=Path, default=REPO / "benchmarks/fleet-waves/fleet-waves.json")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    import tempfile
    import uuid

    from eagle3ops.commands import host as hc
    from eagle3ops.remote import Remote
    from eagle3ops.transfer.envdeliver import deliver_env
    from eagle3ops_dev import fleet, standin_env
    from eagle3ops_dev.standin_env import standin_server_pids

    tmp = Path(tempfile.mkdtemp(prefix="fleet-waves-"))
    nodes = fleet.up(3, ssh_port=SSH_PORT, **NET)
    report: dict = {"hosts": 3, "link": nodes[0].link.qdisc(), "samples": a.samples, "sample_s": a.sample_s,
                    "load_before": os.getloadavg()[0], "runs": []}
    try:
        tgz, image = standin_env.build("/usr/bin/python3")
        tag = uuid.uuid4().hex[:6]
        hosts = []
        for k, node in enumerate(nodes):
            port = PORT0 + k
            h = fleet.venv_host(node, f"fleet{k}", f"{node.info.data_dir}/bench-{tag}",
                                serving={"kind": "process", "process_match": f"standin_openai_server.py --port {port}",
                                         "port": port, "served_model_name": MODEL, "health_timeout_s": 60,
                                         "stop_timeout_s": 10})
            fleet.start_standin_server(h, node, REPO / "tests/data/standin_openai_server.py", port=port, model=MODEL)
            with Remote(h) as r:
                deliver_env(r, tgz, image=image)
                deadline = time.monotonic() + 30
                while r.run(hc.http_status(f"http://127.0.0.1:{port}/health"), check=False).stdout.strip() != "200":
                    if time.monotonic() > deadline:
                        raise SystemExit(f"fleet{k}: the stand-in server did not answer within 30 s")
                    time.sleep(0.5)
            hosts.append(h)
        for limit in [int(x) for x in a.limits.split(",")]:
            res = run_once(hosts, tmp, limit, f"waves{limit}", a.samples, a.sample_s)
            print(json.dumps(res), flush=True)
            report["runs"].append(res)
        report["load_after"] = os.getloadavg()[0]
        one = next((r for r in report["runs"] if r["max_down_per_model"] == 1), None)
        report["limit_1_held"] = None if one is None else (one["extract_windows"] == 3 and
                                                          not one["overlapping_pairs"])
        write_result(a.json, report, indent=2)
        print(f"wrote {a.json}: limit_1_held={report['limit_1_held']}")
    finally:
        if not a.keep:
            for k in range(3):
                for pid in standin_server_pids(PORT0 + k):
                    os.kill(pid, signal.SIGTERM)
            fleet.down(3, **NET)
    return 0 if report.get("limit_1_held") else 1


if __name__ == "__main__":
    raise SystemExit(main())
