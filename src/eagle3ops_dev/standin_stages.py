"""Stand-in pipeline stages of the stand-in pipeline environment (:mod:`eagle3ops_dev.standin_env`): NOT the real
stages. ``eagle3ops-stage STAGE --run-dir DIR [--restart]`` as the real stage program is called (issue 28's venv
runtime), with no torch, transformers or model: it loads ``DIR/pipeline.yaml`` with the product's loader, skips a
stage finished for these inputs (the product's :func:`eagle3ops.stages.manifest.finished`), and otherwise writes
``DIR/<stage>/standin.json`` (what the stage saw: its environment's ``NCCL_*`` and ``EAGLE3OPS_*`` values, cwd, pid)
and a real manifest (:func:`eagle3ops.stages.manifest.write_manifest`), so the driver's decision that a rerun is a
no-op is the product's own. Copied into the stand-in environment as the top-level module
``eagle3ops_standin_stages``.

Knobs (environment, for tests): ``EAGLE3OPS_STANDIN_SLEEP_S`` (seconds each stage sleeps first, e.g. to kill the
driver mid-window), ``EAGLE3OPS_STANDIN_FAIL`` (a stage name that fails with an ``error:`` line, exit 2).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit 0 done, 2 usage or configured failure."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--run-dir":
        print("usage: eagle3ops-stage STAGE --run-dir DIR [--restart]  (stand-in stages)", file=sys.stderr)
        return 2
    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages.manifest import file_entry, finished, stage_dir, write_manifest

    stage, run_dir, restart = args[0], Path(args[2]), "--restart" in args[3:]
    config = load_pipeline_config(run_dir)
    if os.environ.get("EAGLE3OPS_MOUNTS"):  # as the real stage CLI does on a venv host
        from eagle3ops.config.pipeline import apply_mounts

        config = apply_mounts(config, json.loads(os.environ["EAGLE3OPS_MOUNTS"]))
    if not restart and finished(run_dir, stage, config) is not None:
        print(f"{stage}: already done for these inputs (stand-in stage); nothing to do", flush=True)
        return 0
    print(f"{stage}: stand-in stage starting (pid {os.getpid()})", flush=True)
    time.sleep(float(os.environ.get("EAGLE3OPS_STANDIN_SLEEP_S") or 0))
    if os.environ.get("EAGLE3OPS_STANDIN_FAIL") == stage:
        print(f"error: {stage}: failing as EAGLE3OPS_STANDIN_FAIL asks (stand-in stage)", flush=True)
        return 2
    out = stage_dir(run_dir, stage)
    out.mkdir(parents=True, exist_ok=True)
    seen = {"stage": stage, "pid": os.getpid(), "target_model": config.target_model, "cwd": os.getcwd(), "python": sys.executable,
            "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "EAGLE3OPS_", "HF_"))}}
    (out / "standin.json").write_text(json.dumps(seen, indent=2, sort_keys=True) + "\n")
    write_manifest(run_dir, stage, config, {"standin.json": file_entry(out / "standin.json")}, standin=True)
    print(f"{stage}: done (stand-in stage)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
