"""``eagle3ops release --gate`` on a host: a slower serving flag change rolled back, a faster one kept.

Runs the user's commands, through the CLI, in this order, and records each one's exit status, verdict and figures
(the gate's result file on the host, read from the newest ``kind: release-gate`` audit entry's attempt folder):

1. ``eagle3ops release HOST --gate --arg=FLAG --arg=SLOW``: the live release against the same container with
   ``--max-num-seqs 1`` (the default ``FLAG``/``SLOW``): one request at a time, so at the production concurrency
   (``--production-concurrency``, default 4: the gate's deciding level, the first of ``serving.gate_concurrency``)
   requests queue and the change is slower -> expected: rolled back, exit 3, the original release live.
2. ``eagle3ops release HOST --arg=FLAG --arg=SLOW`` (no gate: how such a setting reaches production today).
3. ``eagle3ops release HOST --gate --arg=FLAG --arg=FAST``: the fix (``--max-num-seqs 64``), measured against that
   slow live release -> expected: kept, exit 0.
4. ``eagle3ops rollback HOST --to ORIGINAL``: the host as found.

The inventory is used as given except the deciding level: a copy with ``--production-concurrency`` first in
``serving.gate_concurrency`` is written beside it for the run (and removed after). Measured first with
``--max-num-batched-tokens 16`` at production concurrency 1 on the tiny Llama: not slower at all (x1.110, interval
x0.820 to x1.670: undecided, rolled back for that), since the tiny target's prefill is a few milliseconds whatever
the chunking; hence the default flag.

Prints each step and writes ``--json`` (default ``benchmarks/release-gate-<host>.json``): per gated step the
verdict, reason, throughput ratio at production concurrency with its 90 % interval, per-level tokens/s, TTFT ratio,
restarts, wall time; the machine's CPU. Nothing here is a stand-in: real vLLM (the sandbox's CPU build), the
inventory's target (``deploy/hosts.yaml``: the tests' tiny Llama; ``deploy/sandbox-smollm2.yaml``: SmolLM2).

Usage::

    python benchmarks/release-gate/release_gate.py sandbox                                   # deploy/hosts.yaml
    python benchmarks/release-gate/release_gate.py sandbox -i deploy/sandbox-smollm2.yaml --json benchmarks/release-gate/release-gate-smollm2.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import write_result  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _cpu() -> str:
    info = Path("/proc/cpuinfo").read_text()
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")),
                 platform.processor())
    return f"{model}, {'AVX-512 + AMX' if ' amx_tile' in info else 'no AMX'}"


def _cli(inventory: Path, *words: str, timeout: float) -> tuple[int, float, str]:
    """Run ``eagle3ops WORDS... --inventory INVENTORY``; (exit status, seconds, last 2,000 characters of output)."""
    t0 = time.monotonic()
    p = subprocess.run([str(REPO / ".venv/bin/eagle3ops"), *words, "--inventory", str(inventory)], cwd=REPO,
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, round(time.monotonic() - t0, 1), (p.stdout + p.stderr)[-2000:]


def _gate_figures(r, before: int) -> dict:
    """The newest ``release-gate`` result (audit entries after the first ``before``)."""
    from eagle3ops.commands import host as hc
    from eagle3ops.window.common import audit_entries

    entries = [e for e in audit_entries(r)[before:] if e.get("kind") == "release-gate"]
    if not entries:
        return {"error": "no release-gate audit entry was written"}
    e = entries[-1]
    res = json.loads(r.run(hc.cat(f"{e['attempt_dir']}/result.json")).stdout)
    c = str(res.get("production_concurrency"))
    return {"verdict": res.get("verdict"), "reason": res.get("reason"), "rule": res.get("rule"),
            "margin": res.get("margin"), "throughput_ratio": res.get("throughput_ratio"),
            "interval": res.get("interval"), "ttft_ratio": res.get("ttft_ratio"),
            "production_concurrency": res.get("production_concurrency"), "passes": res.get("passes"),
            "levels": {k: {"baseline_tokens_per_s": lv["baseline"].get("output_tokens_per_s"),
                           "changed_tokens_per_s": lv["speculative"].get("output_tokens_per_s"),
                           "ratio": lv.get("throughput_ratio")} for k, lv in (res.get("levels") or {}).items()},
            "baseline_release": res.get("baseline_release"), "changed_release": res.get("speculative_release"),
            "live_release": res.get("live_release"), "change": res.get("change"),
            "deciding_level": c, "result_file": f"{e['attempt_dir']}/result.json", "audit_window": e.get("window")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("host")
    ap.add_argument("-i", "--inventory", type=Path, default=REPO / "deploy/hosts.yaml")
    ap.add_argument("--flag", default="--max-num-seqs", help="the server flag changed")
    ap.add_argument("--slow", type=int, default=1, help="its slow value")
    ap.add_argument("--fast", type=int, default=64, help="the fix's value")
    ap.add_argument("--production-concurrency", type=int, default=4)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    import yaml

    doc = yaml.safe_load(a.inventory.read_text())
    levels = doc["hosts"][a.host]["serving"].get("gate_concurrency") or [1]
    doc["hosts"][a.host]["serving"]["gate_concurrency"] = [a.production_concurrency] + [
        c for c in levels if c != a.production_concurrency]
    inventory = a.inventory.with_name(f".release-gate-{a.host}.yaml")  # beside it: relative paths stay right
    inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        return _run(a, inventory, doc["hosts"][a.host]["serving"]["gate_concurrency"])
    finally:
        inventory.unlink()


def _run(a: argparse.Namespace, inventory: Path, levels: list[int]) -> int:
    from eagle3ops.config import load_inventory
    from eagle3ops.remote import Remote
    from eagle3ops.window.common import audit_entries, current_release

    FLAG = a.flag
    h = load_inventory(inventory).host(a.host)
    t0 = time.monotonic()
    steps = []
    with Remote(h) as r:
        original = current_release(r)

        def step(name: str, words: list[str], expect_exit: int, gated: bool) -> None:
            before = len(audit_entries(r))
            rc, wall, tail = _cli(inventory, *words, timeout=1800)
            st = {"step": name, "command": "eagle3ops " + " ".join(words), "exit": rc, "expected_exit": expect_exit,
                  "wall_s": wall, "live_release_after": current_release(r)}
            if gated:
                st.update(_gate_figures(r, before))
            if rc != expect_exit:
                st["output_tail"] = tail
            steps.append(st)
            print(json.dumps({k: st.get(k) for k in ("step", "exit", "verdict", "throughput_ratio", "interval",
                                                     "reason", "wall_s")}), flush=True)

        slow, fast = [f"--arg={FLAG}", f"--arg={a.slow}"], [f"--arg={FLAG}", f"--arg={a.fast}"]
        step("gated slower change", ["release", a.host, "--gate", *slow], 3, True)
        step("ungated slower change", ["release", a.host, *slow], 0, False)
        step("gated fix", ["release", a.host, "--gate", *fast], 0, True)
        step("back to the original release", ["rollback", a.host, "--to", str(original)], 0, False)
        end = current_release(r)
    ok = [s["exit"] == s["expected_exit"] for s in steps]
    out = {"what": "benchmarks/release-gate/release_gate.py: `eagle3ops release --gate` on the host's real vLLM: a "
                   f"slower flag change ({FLAG} {a.slow}) rolled back, the fix ({FLAG} {a.fast}) measured against "
                   "that slow release and kept",
           "host": a.host, "inventory": f"{a.inventory} with serving.gate_concurrency {levels}", "cpu": _cpu(),
           "cores": subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip(),
           "original_release": original, "release_at_end": end, "steps": steps,
           "all_as_expected": all(ok) and end == original, "wall_s": round(time.monotonic() - t0, 1),
           "t": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = a.json or Path(__file__).resolve().parent / f"release-gate-{a.host}.json"
    write_result(path, out, indent=1)
    print(f"all as expected: {out['all_as_expected']}; figures written to {path}")
    return 0 if out["all_as_expected"] else 1


if __name__ == "__main__":
    sys.exit(main())
