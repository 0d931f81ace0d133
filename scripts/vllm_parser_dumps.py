"""Write the `vllm serve` parser dumps of local serving images as test data (tests/data/vllm-parser/<vllm>.json),
and how each image's own vLLM reads a draft head (head-view-<vllm>.json: eagle3ops.speculate.crossread's reader).

Each image runs eagle3ops's in-image dump script once (the same command ``release --gate --image`` runs on a host:
``eagle3ops.commands.docker.run_python_stdin``), parsing the sandbox demo's serving command line (``vllm serve`` +
``serving.args`` of deploy/sandbox-smollm2.yaml). Run under the heavy lock, as every step importing vLLM:

    flock /tmp/eagle3ops-heavy.lock .venv/bin/python scripts/vllm_parser_dumps.py \\
        eagle3ops/vllm-openai-local:v0.16.0 eagle3ops/vllm-openai-local:v0.32.0
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from eagle3ops.commands import docker as dk
from eagle3ops.config import load_inventory
from eagle3ops.images.vllmflags import DUMP_SOURCE, DUMP_TIMEOUT_S, SCHEMA
from eagle3ops.speculate.crossread import HEAD_VIEW_SOURCE, READ_TIMEOUT_S

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("images", nargs="+", help="local serving images (the default engine)")
    ap.add_argument("--inventory", type=Path, default=REPO / "deploy" / "sandbox-smollm2.yaml")
    ap.add_argument("--host", default="sandbox")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "vllm-parser")
    ap.add_argument("--head", type=Path, default=REPO / "benchmarks/gpu-head-smollm2/heads/smollm2-135m-instruct-eagle3",
                    help="a draft head read by each image's own vLLM config loader (head-view-<vllm>.json)")
    a = ap.parse_args()
    argv = ["vllm", "serve", *load_inventory(a.inventory).host(a.host).serving.args]
    a.out.mkdir(parents=True, exist_ok=True)
    for image in a.images:
        image_id = json.loads(subprocess.run(dk.inspect_images(None, [image]), capture_output=True, text=True,
                                             check=True).stdout)[0]["Id"]
        cp = subprocess.run(dk.run_python_stdin(None, image, DUMP_SOURCE), input=json.dumps({"argv": argv}),
                            capture_output=True, text=True, timeout=DUMP_TIMEOUT_S)
        line = next((ln for ln in reversed(cp.stdout.splitlines()) if ln.startswith("{")), "")
        if cp.returncode or not line:
            print(f"{image}: dump failed (exit {cp.returncode}): {cp.stderr[-1500:]}", file=sys.stderr)
            return 1
        dump = json.loads(line)
        assert dump["schema"] == SCHEMA
        version = str(dump["vllm"]).split("+", 1)[0]
        dump = {**dump, "image": image, "image_id": image_id, "argv": argv,
                "written_by": "scripts/vllm_parser_dumps.py"}
        path = a.out / f"{version}.json"
        path.write_text(json.dumps(dump, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"{image} (vLLM {dump['vllm']}): {len(dump['options'])} options, parse {dump['parse']} -> {path}")
        cp = subprocess.run(dk.run_python_stdin(None, image, HEAD_VIEW_SOURCE, mounts=((str(a.head.resolve()),
                            "/head"),)), input="", capture_output=True, text=True, timeout=READ_TIMEOUT_S)
        line = next((ln for ln in reversed(cp.stdout.splitlines()) if ln.startswith("{")), "")
        if cp.returncode or not line:
            print(f"{image}: head view failed (exit {cp.returncode}): {cp.stderr[-1500:]}", file=sys.stderr)
            return 1
        view = {**json.loads(line), "image": image, "head": a.head.resolve().relative_to(REPO).as_posix(),
                "written_by": "scripts/vllm_parser_dumps.py"}
        path = a.out / f"head-view-{version}.json"
        path.write_text(json.dumps(view, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"{image}: head view {view.get('error') or 'read'} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
