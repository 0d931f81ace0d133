"""The rented-host lifecycle: ``eagle3ops weights B --from A`` at a size where the link, not the per-file
SSH set-up, decides: two engine-less sandbox hosts of the fleet fixture (:mod:`eagle3ops_dev.fleet`: ``bench-rent0``
/``bench-rent1``, namespaces ``e3rbench<k>`` at 10.225.<k>.2 behind veth links limited by ``tc tbf``, SSH 2264+k).
Host A holds ``--files`` random files of ``--mib`` MiB each (a stand-in target: the copy never reads them as a
model); B has none. Measured: the plan's estimate against the copy's wall time and rate; a copy interrupted half way
through the first file (its ``.part`` truncated) and resumed: the bytes sent; a rerun with everything there (nothing
sent; the re-verification by size and mtime). The real CLI runs as a subprocess. Everything is removed at the end.

Usage (root): python benchmarks/weights-copy/weights_copy.py [--files 3] [--mib 64] [--rate 100mbit]
              [--json benchmarks/weights-copy/weights-copy.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NET = {"prefix": "bench-rent", "ns_prefix": "e3rbench", "subnet": 225}
SSH_PORT = 2264


def _cli(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "eagle3ops", *args], capture_output=True, text=True, timeout=900,
                        cwd=REPO)
    if cp.returncode != 0:
        raise SystemExit(f"`eagle3ops {' '.join(args)}` exited {cp.returncode}:\n{cp.stdout[-2000:]}{cp.stderr[-2000:]}")
    return cp, round(time.monotonic() - t0, 2)


def _rows(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main() -> int:
    """Bring two hosts up, copy, interrupt and resume, rerun; write the JSON; take everything down."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=3)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--json", type=Path, default=REPO / "benchmarks/weights-copy/weights-copy.json")
    a = ap.parse_args()
    from eagle3ops.commands import host as hc
    from eagle3ops.commands import weights as wc
    from eagle3ops.remote import Remote
    from eagle3ops_dev import fleet

    mbit = float(a.rate.removesuffix("mbit"))
    tmp = Path(tempfile.mkdtemp(prefix="weights-copy-"))
    nodes = fleet.up(2, ssh_port=SSH_PORT, rate=a.rate, **NET)
    try:
        hosts = [fleet.venv_host(n, f"rent{k}", f"{n.info.data_dir}/wbench") for k, n in enumerate(nodes)]
        for h in hosts:
            fleet.make_dirs(h)
        src, dst = hosts
        # written here (the sandbox's data dir is a folder of this machine), owned by its SSH user: a paramiko
        # channel's stdin would take minutes for this many bytes
        pw = pwd.getpwnam(nodes[0].info.user)
        for i in range(a.files):
            f = Path(f"{src.model_path}/model-{i:05d}.safetensors")
            f.write_bytes(os.urandom(a.mib << 20))
            os.chown(f, pw.pw_uid, pw.pw_gid)
        with Remote(dst) as r:
            r.run(hc.rm_rf(dst.model_path))
        inv = tmp / "hosts.yaml"
        inv.write_text(fleet.inventory_yaml(hosts))
        common = ["-i", str(inv), "--link-mbit", str(mbit)]
        report: dict = {"link": nodes[1].link.qdisc(), "files": a.files + 1, "mib_each": a.mib}

        dry, dry_s = _cli("weights", "rent1", "--from", "rent0", "--dry-run", *common)
        plan = next(p for p in _rows(dry.stdout) if "steps" in p)
        report["dry_run"] = {"wall_s": dry_s, "send_bytes": plan["send_bytes"], "estimate_s": plan["estimate_s"],
                             "source_manifest": "recorded by this run (first look)"}
        first, first_s = _cli("weights", "rent1", "--from", "rent0", *common)
        res = _rows(first.stdout)[-1]
        report["copy"] = {"cli_wall_s": first_s, **{k: res[k] for k in ("sent_bytes", "seconds", "rate_mbit",
                                                                          "estimate_s")}}
        big = Path(dst.model_path) / "model-00000.safetensors"
        part = big.with_name(big.name + wc.PART)
        big.rename(part)
        os.truncate(part, (a.mib << 20) // 2)
        again, again_s = _cli("weights", "rent1", "--from", "rent0", *common)
        files = [f for f in _rows(again.stdout) if "action" in f]
        report["resume"] = {"cli_wall_s": again_s, "files": files, "sent_bytes": _rows(again.stdout)[-1]["sent_bytes"],
                            "file_bytes": a.mib << 20}
        same, same_s = _cli("weights", "rent1", "--from", "rent0", *common)
        report["rerun_nothing_to_send"] = {"cli_wall_s": same_s,
                                           "said": "the weights are there already" in same.stdout}
        report["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        report["load_1min"] = os.getloadavg()[0]
        text = json.dumps(report, indent=2)
        print(text)
        a.json.write_text(text + "\n")
    finally:
        fleet.down(2, **NET)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
