"""Stand-in pipeline stages of the stand-in pipeline environment (:mod:`eagle3ops_dev.standin_env`): NOT the real
stages. ``eagle3ops-stage STAGE --run-dir DIR [--restart] [--shard START:END]`` as the real stage program is called
(the venv runtime), with no torch, transformers or model: it loads ``DIR/pipeline.yaml`` with the product's
loader, skips a stage finished for these inputs (the product's :func:`eagle3ops.stages.manifest.finished`, or
:func:`eagle3ops.stages.shards.finished_shard` for a shard), and otherwise writes ``DIR/<stage>/standin.json`` (what
the stage saw: its environment's ``NCCL_*`` and ``EAGLE3OPS_*`` values, cwd, pid) and a real manifest
(:func:`eagle3ops.stages.manifest.write_manifest`), so the driver's decision that a rerun is a no-op is the product's
own. Copied into the stand-in environment as the top-level module ``eagle3ops_standin_stages``.

``prepare`` writes ``prepare/samples.jsonl`` as the real stage lays it out (``i``, ``input_ids``, ``loss_mask``):
``prepare.max_samples`` (default 8) rows of stand-in token ids, a pure function of ``seed`` and ``i`` (so every host
prepares the same samples). ``extract`` honours ``--shard`` like the real stage (:mod:`eagle3ops.stages.shards`): one
stand-in "hidden states" file per sample, ``extract/hidden/data_NNNNNN.standin.json`` (the sample's token ids and
loss mask as JSON: not hidden states), skipping files already written (resume), and the shard's manifest. ``train``
checks its inputs as the real stage does (files' sha256 included) and reads every sample file the extract manifest
lists, as the real train does (a fleet run's merged manifest: the union of the shards), recording them under
``train`` in ``train/standin.json`` (``read``: ``{i, file, tokens}`` each; ``fleet_shards``).

Knobs (environment, for tests): ``EAGLE3OPS_STANDIN_SLEEP_S`` (seconds each stage sleeps first, e.g. to kill the
driver mid-window), ``EAGLE3OPS_STANDIN_FAIL`` (a stage name that fails with an ``error:`` line, exit 2),
``EAGLE3OPS_STANDIN_FAIL_AFTER`` (extract fails, exit 2, after writing this many new sample files: a shard
interrupted part-way), ``EAGLE3OPS_STANDIN_SAMPLE_S`` (seconds extract takes per sample written),
``EAGLE3OPS_STANDIN_PAD_BYTES`` (filler bytes in each extract file, so a copy of them measures a link),
``EAGLE3OPS_STANDIN_HOLD`` (a file's path: after each sample written, extract waits while that file exists, at most
``EAGLE3OPS_STANDIN_HOLD_MAX_S``, default 300 s, then fails with an ``error:`` line: a window kept running until the
test has seen what it waits for, whatever the machine's load).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _prepare(run_dir: Path, config: Any) -> dict[str, Any]:
    """Stand-in token ids: ``3 + (7 i + seed) % 13`` tokens per sample, a pure function of ``seed`` and ``i``."""
    from eagle3ops.stages.manifest import atomic_write_text, file_entry, stage_dir

    n = config.prepare.max_samples or 8
    rows = []
    for i in range(n):
        length = 3 + (7 * i + config.seed) % 13
        ids = [(31 * i + 17 * k + config.seed) % 1000 for k in range(length)]
        rows.append({"i": i, "input_ids": ids, "loss_mask": [0] + [1] * (length - 1)})
    path = stage_dir(run_dir, "prepare") / "samples.jsonl"
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    return {"files": {"samples.jsonl": file_entry(path)}, "samples": n,
            "tokens": sum(len(r["input_ids"]) for r in rows)}


def _extract(run_dir: Path, config: Any, shard: tuple[int, int] | None, restart: bool) -> dict[str, Any]:
    """Stand-in hidden-state files for the shard's samples (all without a shard); resumes files already written."""
    from eagle3ops.stages import shards
    from eagle3ops.stages.manifest import atomic_write_text, check_inputs, file_entry, stage_dir

    check_inputs(run_dir, "extract", config, hash_files=True)
    prep = stage_dir(run_dir, "prepare") / "samples.jsonl"
    samples = [json.loads(x) for x in prep.read_text().splitlines() if x.strip()]
    rows = shards.select(samples, shard)
    out = stage_dir(run_dir, "extract")
    (out / "hidden").mkdir(parents=True, exist_ok=True)
    fail_after = os.environ.get("EAGLE3OPS_STANDIN_FAIL_AFTER")
    per_sample = float(os.environ.get("EAGLE3OPS_STANDIN_SAMPLE_S") or 0)
    pad = int(os.environ.get("EAGLE3OPS_STANDIN_PAD_BYTES") or 0)
    hold = os.environ.get("EAGLE3OPS_STANDIN_HOLD")
    hold_max_s = float(os.environ.get("EAGLE3OPS_STANDIN_HOLD_MAX_S") or 300)
    files, sample_files, written, written_tokens = {}, [], 0, 0
    t0 = time.monotonic()
    for s in rows:
        rel = f"hidden/data_{int(s['i']):06d}.standin.json"
        text = json.dumps({"standin": True, "input_ids": s["input_ids"], "loss_mask": s["loss_mask"],
                           **({"pad": "x" * pad} if pad else {})}) + "\n"
        if restart or not (out / rel).is_file() or (out / rel).read_text() != text:
            if fail_after is not None and written >= int(fail_after):
                print(f"error: extract: failing after {written} new samples as EAGLE3OPS_STANDIN_FAIL_AFTER asks "
                      f"(stand-in stage)", flush=True)
                raise SystemExit(2)
            time.sleep(per_sample)
            atomic_write_text(out / rel, text)
            written += 1
            written_tokens += len(s["input_ids"])
            held = time.monotonic()
            while hold and os.path.exists(hold):
                if time.monotonic() - held > hold_max_s:
                    print(f"error: extract: {hold} still exists after {hold_max_s:.0f} s "
                          f"(EAGLE3OPS_STANDIN_HOLD; stand-in stage)", flush=True)
                    raise SystemExit(2)
                time.sleep(0.1)
        files[rel] = file_entry(out / rel)
        sample_files.append({"i": int(s["i"]), "file": rel, "tokens": len(s["input_ids"])})
    tokens = sum(r["tokens"] for r in sample_files)
    gen_s = time.monotonic() - t0  # the stand-in's "generation": writing its files (the planner's measured rate)
    return {"files": files, "sample_files": sample_files, "samples": len(rows), "tokens": tokens,
            "dtype": "standin", "engine": "standin", "hidden_size": None, "num_layers": None, "aux_layer_ids": None,
            "layer_ids": None, "hidden_bytes_per_token": 0, "hidden_bytes": 0, "layer_convention": "standin",
            "file_bytes": sum(f["bytes"] for f in files.values()), "samples_this_run": written,
            "generate_s": round(gen_s, 3),
            "generate_tokens_per_s": round(written_tokens / gen_s, 1) if written and gen_s > 0 else None}


def _train(run_dir: Path) -> dict[str, Any]:
    """What the stand-in train read: every sample file the extract manifest lists (a merged fleet run's union, or a
    one-host run's), checked against the manifest's sha256 (:func:`eagle3ops.stages.manifest.check_inputs`) and its
    token count, as the real train reads them (``sample_files`` of ``extract/manifest.json``)."""
    from eagle3ops.stages.manifest import stage_dir

    ext = json.loads((stage_dir(run_dir, "extract") / "manifest.json").read_text())
    read = []
    for rec in ext["sample_files"]:
        data = json.loads((stage_dir(run_dir, "extract") / rec["file"]).read_text())
        if len(data["input_ids"]) != int(rec["tokens"]):
            print(f"error: train: {rec['file']} holds {len(data['input_ids'])} tokens, the extract manifest says "
                  f"{rec['tokens']}; rerun extract (stand-in stage)", flush=True)
            raise SystemExit(2)
        read.append({"i": int(rec["i"]), "file": rec["file"], "tokens": len(data["input_ids"])})
    return {"read": read, "read_tokens": sum(r["tokens"] for r in read),
            "fleet_shards": (ext.get("fleet") or {}).get("shards")}


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit 0 done, 2 usage or configured failure."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--run-dir":
        print("usage: eagle3ops-stage STAGE --run-dir DIR [--restart] [--shard START:END]  (stand-in stages)",
              file=sys.stderr)
        return 2
    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages import shards
    from eagle3ops.stages.manifest import file_entry, finished, stage_dir, write_manifest

    stage, run_dir, rest = args[0], Path(args[2]), args[3:]
    restart = "--restart" in rest
    shard = shards.parse_shard(rest[rest.index("--shard") + 1]) if "--shard" in rest else None
    config = load_pipeline_config(run_dir)
    if os.environ.get("EAGLE3OPS_MOUNTS"):  # as the real stage CLI does on a venv host
        from eagle3ops.config.pipeline import apply_mounts

        config = apply_mounts(config, json.loads(os.environ["EAGLE3OPS_MOUNTS"]))
    done = (shards.finished_shard(run_dir, config, shard) if shard is not None else finished(run_dir, stage, config))
    if not restart and done is not None:
        print(f"{stage}: already done for these inputs (stand-in stage); nothing to do", flush=True)
        return 0
    print(f"{stage}: stand-in stage starting (pid {os.getpid()})", flush=True)
    time.sleep(float(os.environ.get("EAGLE3OPS_STANDIN_SLEEP_S") or 0))
    if os.environ.get("EAGLE3OPS_STANDIN_FAIL") == stage:
        print(f"error: {stage}: failing as EAGLE3OPS_STANDIN_FAIL asks (stand-in stage)", flush=True)
        return 2
    out = stage_dir(run_dir, stage)
    out.mkdir(parents=True, exist_ok=True)
    seen = {"stage": stage, "pid": os.getpid(), "target_model": config.target_model, "cwd": os.getcwd(),
            "python": sys.executable, "shard": list(shard) if shard else None,
            "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "EAGLE3OPS_", "HF_"))}}
    if stage == "train":  # its inputs checked as the real stage checks them, the files' sha256 too
        from eagle3ops.stages.manifest import StageInputError, check_inputs

        try:
            check_inputs(run_dir, "train", config, hash_files=True)
        except StageInputError as exc:
            print(f"error: {exc}", flush=True)
            return 2
        seen["train"] = _train(run_dir)
    (out / "standin.json").write_text(json.dumps(seen, indent=2, sort_keys=True) + "\n")
    if stage == "prepare":
        figures = _prepare(run_dir, config)
    elif stage == "extract":
        figures = _extract(run_dir, config, shard, restart)
    else:
        figures = {"files": {"standin.json": file_entry(out / "standin.json")}}
    files = figures.pop("files")
    if shard is not None:
        shards.write_shard_manifest(run_dir, config, shard, files, standin=True, **figures)
    else:
        write_manifest(run_dir, stage, config, files, standin=True, **figures)
    print(f"{stage}: done (stand-in stage)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
