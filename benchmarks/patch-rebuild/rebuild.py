#!/usr/bin/env python3
"""Full build of the pipeline image, then patch-only rebuilds; wall times and ratios to the full build.

Works on a copy of the repository's image inputs (the checkout is never modified). Builds, in order:

1. **full build** (``--no-cache``: every layer rebuilt; pip's BuildKit cache mount still serves downloaded
   wheels, as on any build host that has built once), ``VERIFY=probes``;
2. **header-only patch change**, ``VERIFY=probes``: a continuation line added to the first patch's DEP-3
   Description. The patch bytes (hence the content tag and the ``COPY patches`` layer) change, the applied files do
   not, so the probe-result cache may reuse every pass (``eagle3ops.patches.probecache``);
3. **code-changing patch change**, ``VERIFY=probes``: a new module-level statement added inside a hunk of the last
   patch (hunk header adjusted; the series still applies strictly and the probes pass). The patched code differs, so
   every probe whose inputs include it -- all of them -- runs again;
4. **header-only change, ``VERIFY=apply-only``** (dev iterations: no probes).

Everything below the patch step (base checks, GNU patch, speculators + extras, eagle3ops) comes from the layer
cache in 2-4. For each build the script reads the probe record the build wrote into the image
(``<site>/eagle3ops_patches/speculators.probes.json``) and prints how many probes ran and how many passes were
reused. The BuildKit cache mount with probe results persists across runs of this script; the full build re-runs
the probes anyway because its freshly built eagle3ops layer is part of every key (pip records the temporary source
dir in ``direct_url.json``), and the printed counts show it.

    .venv/bin/python benchmarks/patch-rebuild/rebuild.py [--base-image eagle3ops/vllm-openai-local:v0.16.0] [--profile P]
        [--no-full-no-cache] [--keep]

Prints one line per build and a summary with the ratios, and writes ``--out`` (default
``rebuild-<cpu vendor>.json`` here) through ``_shared/lab.py``'s ``write_result``: per build its wall time, the
BuildKit steps that ran and their seconds (from the build log), and the probe record (phases, how the fixtures were
got: built or reused from the fixture cache); exits non-zero if a build fails. The images it built are removed at
the end unless --keep (the layers stay in the engine's cache).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))

from lab import write_result  # noqa: E402

from eagle3ops import images  # noqa: E402
from eagle3ops.patches.series import read_series_file  # noqa: E402

TARGET_S = 15.0


def copy_inputs(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for rel in ("Dockerfile", "pyproject.toml", "README.md", "src", "patches", "requirements", "images"):
        src = REPO / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        elif src.exists():
            shutil.copy2(src, dest / rel)
    return dest


def touch_header(patch: Path, note: str) -> None:
    """Add a continuation line to the patch's Description (header only: the diff is unchanged)."""
    lines = patch.read_text().splitlines(keepends=True)
    i = next(k for k, line in enumerate(lines) if line.startswith("Description:")) + 1
    lines.insert(i, f" {note}\n")
    patch.write_text("".join(lines))


def add_code_line(patch: Path, line: str) -> None:
    """Insert ``line`` as a new added line after the first module-level assignment the patch adds; fix the hunk's
    new-side count and the new-side start of the file's later hunks (the diff still applies with zero fuzz)."""
    lines = patch.read_text().splitlines(keepends=True)
    i = next(k for k, ln in enumerate(lines) if re.match(r"^\+[A-Za-z_]\w* = ", ln))
    lines.insert(i + 1, f"+{line}\n")
    h = max(k for k in range(i) if lines[k].startswith("@@"))
    m = re.match(r"^@@ -(\d+(?:,\d+)?) \+(\d+),(\d+) @@(.*)$", lines[h], re.S)
    lines[h] = f"@@ -{m.group(1)} +{m.group(2)},{int(m.group(3)) + 1} @@{m.group(4)}"
    for k in range(i + 2, len(lines)):
        if lines[k].startswith(("diff ", "--- ")):
            break
        m = re.match(r"^@@ -(\d+(?:,\d+)?) \+(\d+)(,\d+)? @@(.*)$", lines[k], re.S)
        if m:
            lines[k] = f"@@ -{m.group(1)} +{int(m.group(2)) + 1}{m.group(3) or ''} @@{m.group(4)}"
    patch.write_text("".join(lines))


def probe_record(tag: str) -> dict | None:
    """The probe record inside the image (None for apply-only builds)."""
    script = ("import json, pathlib, sysconfig; p = pathlib.Path(sysconfig.get_paths()['purelib']) / "
              "'eagle3ops_patches/speculators.probes.json'; print(p.read_text() if p.is_file() else 'null')")
    out = subprocess.run(["docker", "run", "--rm", "--network", "host", "--entrypoint", "python3", tag, "-c", script],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def probe_summary(rec: dict | None) -> str:
    if rec is None:
        return "probes not run (apply-only)"
    outs = rec["outcomes"]
    ran = [o for o in outs if not o["reused"]]
    phases = ", ".join(f"{k} {v:.1f}" for k, v in rec.get("phases_s", {}).items())
    return (f"{len(ran)} probe(s) run, {len(outs) - len(ran)} reused; probe run {rec.get('seconds', 0):.1f} s "
            f"({phases})")


def build_steps(tag: str) -> list[dict]:
    """The BuildKit steps of the build of ``tag`` that ran (not ``CACHED``) and their seconds, from its plain
    progress log (``/tmp/eagle3ops-build-<tag>.log``: ``#N [k/n] RUN ...`` names a step, ``#N DONE 1.2s`` ends it)."""
    log = Path(tempfile.gettempdir()) / f"eagle3ops-build-{re.sub(r'[^A-Za-z0-9.-]+', '_', tag)}.log"
    if not log.is_file():
        return []
    names: dict[str, str] = {}
    steps = []
    marks: dict[str, list] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = re.match(r"^#(\d+) (\[.*|exporting .*|writing .*|naming .*)$", line)
        if m and m.group(1) not in names:
            names[m.group(1)] = m.group(2)[:100]
        # the patch step's own output, with BuildKit's offset: where its seconds go
        m = re.match(r"^#(\d+) ([\d.]+) (check \w+|ok   import|ok   verify|ok   \S+: probe|speculators: |checks at build)(.*)$", line)
        if m:
            marks.setdefault(m.group(1), []).append([float(m.group(2)), (m.group(3) + m.group(4))[:110]])
        m = re.match(r"^#(\d+) DONE ([\d.]+)s$", line)
        if m and m.group(1) in names:
            steps.append({"step": names[m.group(1)], "seconds": float(m.group(2)), **(
                {"output_at_s": marks[m.group(1)]} if m.group(1) in marks else {})})
    return [s for s in steps if s["seconds"] >= 0.05]


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-image", default=images.LOCAL_BASE_TAG)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--no-full-no-cache", action="store_true", help="full build from the layer cache (not a real full build)")
    ap.add_argument("--keep", action="store_true", help="keep the built images")
    ap.add_argument("--out", type=Path, default=None, help="result JSON (default: rebuild-<cpu vendor>.json here)")
    args = ap.parse_args()
    cpu = cpu_model()
    out = args.out or Path(__file__).resolve().parent / f"rebuild-{'amd' if 'AMD' in cpu else 'intel' if 'Intel' in cpu else 'cpu'}.json"
    records: list[dict] = []

    ca = images.default_ca_bundle()
    defn = images.load_def("pipeline")
    pname, spec = defn.profile(args.profile)
    series_dir_rel = spec.series[0]
    results: list[tuple[str, str, float, str]] = []
    tags: list[str] = []
    stamp = f"{time.time():.0f}"
    try:
        with tempfile.TemporaryDirectory(prefix="e3-rebuild-") as tmp:
            root = copy_inputs(Path(tmp) / "repo")
            sdir = root / series_dir_rel
            names = read_series_file(sdir / "series")
            print(f"base {args.base_image}; profile {pname}; CA bundle {ca or 'none'}; load {load()}", flush=True)

            def build(what: str, verify: str, no_cache: bool = False) -> None:
                la = load()
                b = images.build_image("pipeline", args.base_image, pname, ca, root=root, verify=verify,
                                       no_cache=no_cache, quiet=True)
                tags.append(b.tag)
                rec = probe_record(b.tag)
                summary = probe_summary(rec)
                results.append((what, b.tag, b.seconds, f"{summary}; load before {la}"))
                records.append({"build": what, "verify": verify, "seconds": round(b.seconds, 1), "load_before": la,
                                "load_after": load(), "meets_target": b.seconds <= TARGET_S,
                                "steps_run": build_steps(b.tag), "probe_record": rec and {
                                    k: rec.get(k) for k in ("seconds", "phases_s", "fixtures")} | {
                                    "ran": sum(not o["reused"] for o in rec["outcomes"]),
                                    "reused": sum(o["reused"] for o in rec["outcomes"])}})
                print(f"{b.seconds:7.1f} s  {what}  [{summary}; load {la}]  {b.tag}", flush=True)

            build("full build" + ("" if args.no_full_no_cache else " (--no-cache)") + ", verify=probes", "probes",
                  no_cache=not args.no_full_no_cache)
            touch_header(sdir / names[0], f"(benchmarks/patch-rebuild/rebuild.py {stamp}.1: header-only change)")
            build(f"patch-only rebuild, header-only change ({names[0]}), verify=probes", "probes")
            add_code_line(sdir / names[-1], f'_EAGLE3OPS_REBUILD_BENCH = "{stamp}"  # benchmarks/patch-rebuild/rebuild.py code change')
            build(f"patch-only rebuild, code change in a hunk ({names[-1]}), verify=probes", "probes")
            touch_header(sdir / names[0], f"(benchmarks/patch-rebuild/rebuild.py {stamp}.2: header-only change)")
            build(f"patch-only rebuild, header-only change ({names[0]}), verify=apply-only", "apply-only")
            assert len(set(tags)) == len(tags), f"each change must give a new tag: {tags}"
    finally:
        if not args.keep:
            for t in tags:
                subprocess.run(["docker", "image", "rm", t], capture_output=True)
    full = results[0][2]
    print("\nP4 rebuild benchmark (wall time of the docker build, this machine; "
          f"{os.cpu_count()} cores, shared)")
    for what, tag, secs, note in results:
        print(f"  {what:78s} {secs:7.1f} s  ({note})")
    for what, _, secs, _ in results[1:]:
        print(f"  ratio to the full build: {secs / full:6.3f}  {what}  "
              f"({'meets' if secs <= TARGET_S else 'misses'} the {TARGET_S:.0f} s target)")
    for r in records[1:]:
        r["ratio_to_full"] = round(r["seconds"] / full, 3)
    write_result(out, {"question": "how long does a patch-only rebuild of the pipeline image take against a full build",
                       "command": "make bench-rebuild", "target_s": TARGET_S, "base_image": args.base_image,
                       "profile": pname, "measured_on": {"cpu": cpu, "cores": os.cpu_count(),
                                                         "note": "cores shared with other work"},
                       "builds": records}, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
