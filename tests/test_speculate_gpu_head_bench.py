"""The GPU head's serving benchmark's pure parts (:mod:`eagle3ops_dev.gpuhead`, used by
``benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py``): the head reassembled from its split shard with
the recorded sha256 checked, and its figures (per-level throughput intervals by the gate's own method, the serving
targets' checks with their shortfalls) from a gate result made by the gate's real decision on synthetic passes; the
same head under two vLLM versions judged (:mod:`eagle3ops_dev.headversions`, ``--compare-with``).
No host, no image, no head from the device machine (a tiny one is written here)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from eagle3ops.gate import decide as dec
from eagle3ops.gate.metrics import SpecDelta
from eagle3ops.gate.replay import LevelResult
from eagle3ops_dev import gpuhead as b
from eagle3ops_dev import headversions as hv

REPO = Path(__file__).resolve().parents[1]
#: The round-3 head committed in the lab, and the round's training JSON (its provenance's figures).
R3_HEAD = REPO / "benchmarks" / "gpu-head-smollm2" / "heads" / "smollm2-135m-instruct-eagle3"
R3_JSON = REPO / "benchmarks" / "gpu-head-smollm2" / "gpu-head-smollm2-h200-r3.json"


def _head(tmp_path: Path) -> tuple[Path, dict]:
    src = tmp_path / "src"
    src.mkdir()
    whole = bytes(range(256)) * 40
    (src / "config.json").write_text("{}")
    (src / "model-00001-of-00002.safetensors").write_bytes(b"one")
    (src / "model-00002-of-00002.safetensors.part1").write_bytes(whole[:4000])
    (src / "model-00002-of-00002.safetensors.part2").write_bytes(whole[4000:])
    (src / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 10243}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                                           "b": "model-00002-of-00002.safetensors"}}))
    r2 = {"head": {"files": ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"],
                   "bytes": 10243, "split": {"model-00002-of-00002.safetensors": {
                       "parts": ["model-00002-of-00002.safetensors.part1", "model-00002-of-00002.safetensors.part2"],
                       "sha256": hashlib.sha256(whole).hexdigest(), "bytes": len(whole)}}}}
    return src, r2


def test_the_head_is_joined_and_checked_against_the_recorded_sha256(tmp_path: Path) -> None:
    src, r2 = _head(tmp_path)
    rec = b.assemble_head(src, tmp_path / "head", r2)
    joined = tmp_path / "head" / "model-00002-of-00002.safetensors"
    assert joined.read_bytes() == bytes(range(256)) * 40 and rec["sha256_checked"] == [joined.name]
    assert sorted(p.name for p in (tmp_path / "head").iterdir()) == sorted(rec["files"])
    assert not any(".part" in n for n in rec["files"])
    (src / "model-00002-of-00002.safetensors.part2").write_bytes(b"damaged")
    with pytest.raises(SystemExit, match="a part is damaged"):
        b.assemble_head(src, tmp_path / "again", r2)
    # rejoined already (gpu-round-finish's head folder): the whole shard taken, its sha256 checked all the same
    for part in src.glob("*.part*"):
        part.unlink()
    with pytest.raises(SystemExit, match="parts of model-00002-of-00002.safetensors missing.*no joined"):
        b.assemble_head(src, tmp_path / "none", r2)
    (src / joined.name).write_bytes(joined.read_bytes())
    rec = b.assemble_head(src, tmp_path / "whole", r2)
    assert rec["joined"] == {joined.name: ["joined already"]} and rec["sha256_checked"] == [joined.name]
    assert (tmp_path / "whole" / joined.name).read_bytes() == joined.read_bytes()
    (src / joined.name).write_bytes(b"x" + joined.read_bytes()[1:])
    with pytest.raises(SystemExit, match="the joined shard differs"):
        b.assemble_head(src, tmp_path / "bad", r2)


def _passes(c: int, tps: float, n: int = 3) -> list[LevelResult]:
    out = []
    for j in range(n):
        v = tps * (1.0, 1.004, 0.996)[j]
        out.append(LevelResult(c, 8, 0, 512, 512 / v, v, 20.0, 30.0, 100.0, 0, (64,) * 8,
                               tuple(64 / v * (0.8 + 0.05 * i) for i in range(8)), (100.0,) * 8))
    return out


def test_figures_give_each_levels_interval_and_the_done_when_shortfalls() -> None:
    base, spec = {1: _passes(1, 20.0), 4: _passes(4, 50.0)}, {1: _passes(1, 30.0), 4: _passes(4, 55.0)}
    d = dec.decide(base, spec, SpecDelta(100, 300, 140, {0: 70, 1: 45, 2: 25}), production_concurrency=1,
                   margin=0.05, acceptance_floor=1.3)
    result = {"verdict": d.verdict, "reason": d.reason, **d.figures, "prompts": {"source": "prompts file",
                                                                                 "count": 8, "max_tokens": 64}}
    r2 = json.loads((REPO / "benchmarks" / "gpu-head-smollm2" / "gpu-head-smollm2-h200-r2.json").read_text())
    fig = b.figures(result, r2, head=None, prompts=None, levels={"measured": [1, 4]}, timing={}, target=None,
                    gate_wall_s=None)
    assert fig["verdict"] == "keep" and fig["acceptance_length"] == pytest.approx(2.4)
    assert fig["per_level"]["1"]["interval"]["low"] == fig["interval_at_production"]["low"] > 1.4
    assert fig["per_level"]["4"]["interval"]["low"] < fig["per_level"]["4"]["throughput_ratio"] \
        < fig["per_level"]["4"]["interval"]["high"]
    done = fig["done_when"]
    assert done["acceptance_length"]["holds"] is False and done["acceptance_length"]["short_by"] == pytest.approx(0.1)
    assert done["kept"]["holds"] and done["interval_low_at_1"]["holds"] and done["prompts"]["holds"] is False
    assert fig["served_minus_offline"] == pytest.approx(2.4 - 2.803669, abs=1e-4)
    assert done["offline_within_0.3"]["holds"] is False
    assert fig["served_minus_offline_per_position"]["0"] == pytest.approx(0.7 - 0.759811, abs=1e-4)
    # a gate image that predates answer digests says so; one that has them is carried as the gate wrote it
    assert fig["answer_agreement"] == "not recorded by this gate's image"
    agree = {"1": {"compared": 8, "identical": 8}}
    assert b.figures({**result, "answer_agreement": agree}, r2, head=None, prompts=None, levels={"measured": [1]},
                     timing={}, target=None, gate_wall_s=None)["answer_agreement"] == agree


def test_the_committed_round_3_head_matches_its_provenance_and_record(tmp_path: Path) -> None:
    """The head committed under ``benchmarks/gpu-head-smollm2/heads/`` (round 3): every file's sha256 and size as its
    ``provenance.json`` records them, its shards those of the round's JSON, at most 20 MB in all, no
    ``embed_tokens`` (vLLM takes the target's); ``assemble_head`` takes it."""
    record, src = R3_JSON, R3_HEAD
    prov = json.loads((src / "provenance.json").read_text())
    for name, rec in prov["files"].items():
        assert hashlib.sha256((src / name).read_bytes()).hexdigest() == rec["sha256"], name
        assert (src / name).stat().st_size == rec["bytes"], name
    assert sum(p.stat().st_size for p in src.iterdir()) <= 20 * 10**6
    r3 = json.loads(record.read_text())
    got = b.assemble_head(src, tmp_path / "head", r3)
    assert sorted(n for n in got["files"] if n.endswith(".safetensors")) == sorted(r3["head"]["files"])
    index = json.loads((src / "model.safetensors.index.json").read_text())
    assert not any(k.startswith("embed_tokens") for k in index["weight_map"])
    cfg = json.loads((src / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 8192 and cfg["eagle_aux_hidden_state_layer_ids"] == [3, 16, 28]


def test_whole_answer_acceptance_is_added_only_for_the_gates_own_head() -> None:
    """``--add-whole-answers``: the by-length benchmark's longest run (the same head, sha256 checked) becomes the
    issue's served-over-whole-answers figure beside the gate's own (the gate's entries are kept, the input is not
    changed); a by-length run of another head, or a gate record without head files, is refused by name."""
    fig = {"head": {"files": {"config.json": {"sha256": "c"}, "model.safetensors": {"sha256": "aa"}}},
           "offline_estimate": {"acceptance_length": 2.65, "file": "gpu-head-smollm2-h100-r5.json"},
           "what": "old", "done_when": {"acceptance_length": {"value": 1.87, "holds": False}}}
    bylen = {"concurrency": 8, "prompts": {"n": 64}, "machine": "m",  # the longest run first: picked by max_tokens
             "runs": [{"max_tokens": 512, "mean_acceptance_length": 2.51, "per_position": {"0": 0.67},
                       "mean_completion_tokens": 338.5, "finish_reasons": {"length": 34, "stop": 30}},
                      {"max_tokens": 64, "mean_acceptance_length": 1.76, "per_position": {},
                       "mean_completion_tokens": 56, "finish_reasons": {}}],
             "segments": [{"tokens": "65-512", "mean_acceptance_length": 2.9}]}
    out = b.add_whole_answers(fig, bylen, "by-length.json", {"model.safetensors": "aa"}, "NVIDIA H100 80GB HBM3")
    w, done = out["served_whole_answers"], out["done_when"]
    assert w["max_tokens"] == 512 and w["acceptance_length"] == 2.51 and w["by_max_tokens"] == {"512": 2.51, "64": 1.76}
    assert w["segments"] == {"65-512": 2.9} and w["served_minus_offline"] == pytest.approx(-0.14)
    assert done["acceptance_length_whole_answers"]["holds"] and done["acceptance_length"]["holds"] is False
    assert done["offline_within_0.3_whole_answers"]["value"] == pytest.approx(-0.14)
    assert "H100" in out["what"] and fig["what"] == "old"
    assert "acceptance_length_whole_answers" not in fig["done_when"] and "served_whole_answers" not in fig
    bylen["runs"][0]["mean_acceptance_length"] = 2.5  # the bound itself holds
    edge = b.add_whole_answers(fig, bylen, "by-length.json", {"model.safetensors": "aa"})
    assert edge["done_when"]["acceptance_length_whole_answers"]["holds"] and edge["what"] == "old"
    bylen["runs"][0]["mean_acceptance_length"] = 2.2
    low = b.add_whole_answers(fig, bylen, "by-length.json", {"model.safetensors": "aa"})
    assert low["done_when"]["acceptance_length_whole_answers"]["short_by"] == pytest.approx(0.3)
    assert low["done_when"]["offline_within_0.3_whole_answers"]["holds"] is False
    for files in ({"model.safetensors": "bb"}, {}):
        with pytest.raises(SystemExit, match="by-length.json: served another head"):
            b.add_whole_answers(fig, bylen, "by-length.json", files)
    with pytest.raises(SystemExit, match="no head files recorded"):
        b.add_whole_answers({**fig, "head": None}, bylen, "by-length.json", {"model.safetensors": "aa"})


def test_the_repeat_count_goes_beside_both_acceptance_figures_and_only_for_the_gates_prompts() -> None:
    """``--add-repeats``: ``benchmarks/heldout-repeats/heldout_repeats.py``'s counts of prompts repeating a trained user turn go into
    ``held_out_repeats``, and the gate's own acceptance (at its measured ``max_tokens``) sits beside the whole-answer
    figure; counts made on other prompts are refused by name (the input is not changed)."""
    fig = {"acceptance_length": 1.87132, "prompts": {"indices": [12000, 12005, 12009]},
           "levels": {"gate_max_tokens": {"inventory": 32, "measured": 128}},
           "served_whole_answers": {"acceptance_length": 2.51},
           "done_when": {"acceptance_length": {"value": 1.87}, "acceptance_length_whole_answers": {"value": 2.51}}}
    rep = {"gate": {"prompts": 3, "first_index": 12000, "last_index": 12009, "repeat_a_trained_first_turn": 2,
                    "repeat_any_trained_user_turn": 2, "repeating": [{"index": 12005}, {"index": 12009}]},
           "whole_answers": {"prompts": 3, "repeat_a_trained_first_turn": 1, "repeat_any_trained_user_turn": 1,
                             "repeating": [{"index": 12005}]}}
    out = b.add_repeats(fig, rep, "rep.json")
    assert out["held_out_repeats"]["gate"]["indices"] == [12005, 12009]
    own = out["served_whole_answers"]["gate_own"]
    assert own == {"acceptance_length": 1.8713, "max_tokens": 128, "prompts": 3, "prompts_repeating_trained": 2}
    assert out["done_when"]["acceptance_length_whole_answers"]["gate_own"] == own
    assert out["done_when"]["acceptance_length"]["prompts_repeating_trained"] == 2
    assert "gate_own" not in fig["done_when"]["acceptance_length_whole_answers"]  # the input is not changed
    rep["gate"]["repeating"].append({"index": 12001})
    with pytest.raises(SystemExit, match="rep.json: counted on other prompts"):
        b.add_repeats(fig, rep, "rep.json")


def test_a_finished_round_is_found_by_tag_and_a_missing_one_names_the_fix(tmp_path: Path) -> None:
    """``--round r7kl``: the round's JSON by glob whatever GPU trained it, the head where ``gpu-round-finish`` put it;
    no JSON, two JSONs or no head refuse by name (``make gpu-round-finish``), the JSON alone serves ``--read``."""
    js, heads = tmp_path / "rounds", tmp_path / "heads"
    js.mkdir()
    with pytest.raises(SystemExit, match=r"gpu-head-smollm2-\*-r7kl.json: no round JSON .*make gpu-round-finish"):
        b.round_files("r7kl", js, heads)
    (js / "gpu-head-smollm2-h200-r7kl.json").write_text("{}")
    (js / "gpu-head-smollm2-h100-r7lk.json").write_text("{}")  # the other head of the round: not taken
    with pytest.raises(SystemExit, match=r"smollm2-r7kl: no head of round r7kl .*make gpu-round-finish.*--head-src"):
        b.round_files("r7kl", js, heads)
    assert b.round_files("r7kl", js, heads, need_head=False) == (js / "gpu-head-smollm2-h200-r7kl.json",
                                                                 heads / "smollm2-r7kl")
    (heads / "smollm2-r7kl").mkdir(parents=True)
    (heads / "smollm2-r7kl" / "model.safetensors.index.json").write_text("{}")
    assert b.round_files("r7kl", js, heads)[0].name == "gpu-head-smollm2-h200-r7kl.json"
    (js / "gpu-head-smollm2-h100-r7kl.json").write_text("{}")
    with pytest.raises(SystemExit, match="2 round JSONs for r7kl .*h100-r7kl.json, gpu-head-smollm2-h200-r7kl"):
        b.round_files("r7kl", js, heads)
    # round 6 as committed, found the same way
    assert b.round_files("r6lk", R3_JSON.parent, heads, need_head=False)[0].name == "gpu-head-smollm2-h100-r6lk.json"


def test_each_prompt_set_writes_its_own_file() -> None:
    assert b.out_json_name("r7kl", "chat") == "speculate-smollm2-gpu-head-r7kl-chat.json"
    assert b.out_json_name("r7lk", "code") == "speculate-smollm2-gpu-head-r7lk-code.json"
    with pytest.raises(ValueError, match="one of"):
        b.out_json_name("r7kl", "both")
    chat, code = {"prompts": {"source": "prompts file"}}, {"prompts": {"source": "HumanEval gate split"}}
    b.check_result_set(chat, "chat")
    b.check_result_set(code, "code")
    with pytest.raises(SystemExit, match="replayed 'HumanEval gate split', not the chat set.*give --set code"):
        b.check_result_set(code, "chat")
    with pytest.raises(SystemExit, match="counters mix the sets"):
        b.check_result_set({"prompts": {"source": "prompts file + HumanEval gate split"}}, "chat")


def _pack(tmp_path: Path, rows: list[dict]) -> Path:
    """A stand-in round pack's prompts.jsonl.gz (the shape gpu_head_smollm2.py's prep writes; user turns cut at
    40 characters here instead of 3,000)."""
    import gzip

    path = tmp_path / "g3" / "prompts.jsonl.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def test_a_gate_prompt_equal_to_a_trained_user_turn_refuses_and_none_equal_is_recorded(tmp_path: Path) -> None:
    """Every gate prompt against every user turn of the round's pack, normalized as held_out_by_content does: one
    equal (case, width and whitespace aside; at any turn of a record) refuses naming the prompt and the record;
    a prompt longer than the pack's cut is compared cut; none equal records the counts and the file's sha256."""
    pack = _pack(tmp_path, [{"id": "a", "index": 3, "users": ["Write a poem", "Now shorter"]},
                            {"id": "b", "index": 7, "users": ["x" * 40]}])
    ok = b.trained_turn_check([("sharegpt-v3/12000", "Write a poem about tea"), ("HumanEval/6", "def f():")],
                              pack, "g3/prompts.jsonl.gz")
    assert ok["equal"] == 0 and ok["user_turns"] == 3 and ok["records"] == 2 and ok["gate_prompts"] == 2
    assert ok["sha256"] == hashlib.sha256(pack.read_bytes()).hexdigest() and "NFKC" in ok["normalization"]
    assert ok["checked_against"] == "g3/prompts.jsonl.gz"
    with pytest.raises(SystemExit, match=r"1 of 2 gate prompts equal a trained user turn.*sharegpt-v3/12005 = "
                                         r"record 3"):
        b.trained_turn_check([("sharegpt-v3/12000", "tea"), ("sharegpt-v3/12005", "  NOW   ｓhorter\n")], pack)
    with pytest.raises(SystemExit, match="HumanEval/9 = record 7"):
        b.trained_turn_check([("HumanEval/9", "x" * 55)], pack)
    with pytest.raises(SystemExit, match=r"missing.gz: the round pack's prompts .*--pack-prompts"):
        b.trained_turn_check([("p", "t")], tmp_path / "missing.gz")
    man = tmp_path / "script" / "pack.json"
    man.parent.mkdir()
    man.write_text(json.dumps({"round": "r7", "made_at": "T", "recipe": {"conversations": 12000},
                               "files": {"g3/prompts.jsonl.gz": {"sha256": ok["sha256"]}}}))
    rec = b.pack_provenance(ok, man, {"pack": {"made_at": "T"}}, "r7kl")["pack"]
    assert rec["sha256_matches_manifest"] and rec["same_pack_as_round_json"] and "note" not in rec
    old = b.pack_provenance(ok, man, {}, "r6lk")["pack"]
    assert old["same_pack_as_round_json"] is None and "round r7's, the head round r6's" in old["note"]


def _result(acc_counts: dict, *, k: int = 3, count: int = 64, max_tokens: int = 128, source: str = "prompts file"
            ) -> dict:
    base, spec = {1: _passes(1, 20.0), 4: _passes(4, 50.0)}, {1: _passes(1, 30.0), 4: _passes(4, 55.0)}
    d = dec.decide(base, spec, SpecDelta(100, 300, sum(acc_counts.values()), acc_counts), production_concurrency=1,
                   margin=0.05, acceptance_floor=1.3)
    return {"verdict": d.verdict, "reason": d.reason, **d.figures, "num_speculative_tokens": k, "gate_passes": 3,
            "prompts": {"source": source, "count": count, "max_tokens": max_tokens}}


def test_the_chat_target_is_2_3_at_k_3_and_the_code_set_is_reported_beside_it() -> None:
    """``done_when.chat_acceptance_at_k3``: 2.3 on the chat set at k = 3, 128 tokens, 3 passes, 64 prompts (each
    condition recorded); the code set is reported without a target; both levels (1 and 4) have their figures; the
    speed verdict carries the CPU and whether it has AMX; the offline estimate says how its samples were split."""
    r6 = json.loads((R3_JSON.parent / "gpu-head-smollm2-h100-r6kl.json").read_text())
    kw = dict(head=None, prompts=None, levels={"measured": [1, 4]}, timing={}, target=None, gate_wall_s=None,
              record=R3_JSON.parent / "gpu-head-smollm2-h100-r6kl.json")
    hit = b.figures(_result({0: 70, 1: 45, 2: 25}), r6, prompt_set="chat", amx=False, trained_check={"equal": 0},
                    **kw)  # 1 + 1.40 = 2.40
    e = hit["done_when"]["chat_acceptance_at_k3"]
    assert hit["set"] == "chat" and e["holds"] is True and e["value"] == pytest.approx(2.4) and e["short_by"] == 0.0
    assert sorted(hit["per_level"]) == ["1", "4"] and all(lv["interval"] for lv in hit["per_level"].values())
    assert all("holds" in v for v in hit["done_when"].values()) and "learning_curve" not in e
    assert hit["done_when"]["speed_verdict"]["amx"] is False and "keep is not expected" in \
        hit["done_when"]["speed_verdict"]["note"] and hit["machine"]["amx"] is False
    assert hit["offline_estimate"]["held_out_split"]["held_out_samples"] == 140
    assert hit["prompts"]["set"] == "chat" and "chat set" in hit["what"]
    low = b.figures(_result({0: 60, 1: 40, 2: 20}), r6, prompt_set="chat", amx=True, **kw)  # 2.20
    assert low["done_when"]["chat_acceptance_at_k3"]["holds"] is False
    assert low["done_when"]["chat_acceptance_at_k3"]["short_by"] == pytest.approx(0.1)
    curve = low["done_when"]["chat_acceptance_at_k3"]["learning_curve"]["points"]  # missed: the round's curve
    assert len(curve) >= 3 and curve == [{"tokens_seen": c["tokens_seen"], "step": c["step"],
                                          "acceptance_length": c["acceptance_length"]} for c in r6["learning_curve"]]
    short = b.figures(_result({0: 70, 1: 45, 2: 25}, max_tokens=32, count=8), r6, prompt_set="chat", amx=True, **kw)
    s = short["done_when"]["chat_acceptance_at_k3"]
    assert s["holds"] is False and s["conditions"]["max_tokens 128"] is False and s["conditions"]["prompts >= 64"] \
        is False and s["conditions"]["k = 3"] is True
    assert s["conditions"]["no prompt equals a trained user turn (checked)"] is False  # not checked: not held
    code = b.figures(_result({0: 70, 1: 45, 2: 25}, count=39, source="HumanEval gate split"), r6, prompt_set="code",
                     amx=True, trained_check={"equal": 0}, **kw)
    c = code["done_when"]["chat_acceptance_at_k3"]
    assert code["set"] == "code" and c["holds"] is None and c["value"] == pytest.approx(2.4)
    assert "HumanEval" in code["what"]
    assert code["prompts"]["trained_user_turns"] == {"equal": 0}


def test_the_script_refuses_a_code_set_repeating_a_trained_turn_before_building_anything(tmp_path: Path) -> None:
    """The script as the lead runs it (``--round r6kl --set code``), up to its first check: HumanEval's gate split
    (39 prompts, the whole split: the count the derived inventory gives ``serving.gate_prompts``) against a
    stand-in pack (one record whose second user turn is HumanEval/15's prompt, upper-cased) stops it with the
    prompt named, before the head is copied, an image built or the sandbox reached; ``--prompts`` past the split
    is refused by name, and so is ``--read --pre-gate`` with another set's record (before the host is read)."""
    import gzip
    import subprocess
    import sys

    from eagle3ops.speculate.ship import gate_prompts

    split = gate_prompts(10**6)
    hit = next(p for p in split if p.id == "HumanEval/15")
    pack = tmp_path / "prompts.jsonl.gz"
    with gzip.open(pack, "wt", encoding="utf-8") as f:
        f.write(json.dumps({"id": "z", "index": 42, "users": ["hi", hit.text.upper()]}) + "\n")
    script = REPO / "benchmarks" / "gpu-head-served" / "speculate_smollm2_gpu_head.py"
    base = [sys.executable, str(script), "--round", "r6kl", "--set", "code", "--head-src", str(tmp_path / "none"),
            "--pack-prompts", str(pack), "--levels", "1,4", "--max-tokens", "128"]
    r = subprocess.run(base, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and len(split) == 39, r.stderr[-2000:]
    assert f"1 of {len(split)} gate prompts equal a trained user turn" in r.stderr
    assert "HumanEval/15 = record 42" in r.stderr and "head:" not in r.stdout
    r = subprocess.run([*base, "--prompts", "40"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "--prompts 40: HumanEval's gate split holds 39 prompts" in r.stderr
    pre = tmp_path / "pre-gate.json"  # another set's record is not merged into this set's figures
    pre.write_text(json.dumps({"round": "r6kl", "set": "chat", "head": None, "prompts": {}, "trained_user_turns": {}}))
    r = subprocess.run([*base[:6], "--read", "--pre-gate", str(pre)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "recorded for round r6kl set chat, not --round r6kl --set code" in r.stderr


def _script():
    """The benchmark script imported as a module (its pure helpers: the derived inventory)."""
    import importlib.util

    path = REPO / "benchmarks" / "gpu-head-served" / "speculate_smollm2_gpu_head.py"
    spec = importlib.util.spec_from_file_location("speculate_smollm2_gpu_head", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_derived_inventory_serves_the_head_on_the_given_image(tmp_path: Path) -> None:
    """``--speculative-image``: the derived copy of the sandbox inventory names IMAGE as
    ``serving.speculative_image`` (read back by the real inventory loader), the other settings as asked; without it
    the inventory's own (the 0.16 stand-in) stays. The image's vLLM comes from its pins label and names the file."""
    from eagle3ops.config import load_inventory

    mod = _script()
    src = REPO / "deploy" / "sandbox-smollm2.yaml"
    own = load_inventory(src).host("sandbox").serving.speculative_image
    img = "eagle3ops/serving:0.32.0-0.9.0-30dcddcb3010"
    h = load_inventory(mod.derived_inventory(src, [1, 4], tmp_path / "a.yaml", 128, None, img)).host("sandbox")
    assert h.serving.speculative_image == img != own
    assert list(h.serving.gate_concurrency) == [1, 4] and h.serving.gate_max_tokens == 128
    h = load_inventory(mod.derived_inventory(src, [1], tmp_path / "b.yaml")).host("sandbox")
    assert h.serving.speculative_image == own
    rec = hv.image_record(img, {"io.eagle3ops.pins": '{"speculators": "0.9.0", "vllm": "0.32.0"}',
                               "io.eagle3ops.profile": "vllm-0.32.0-serving",
                               "org.opencontainers.image.base.name": "eagle3ops/vllm-openai-local:v0.32.0"})
    assert rec["vllm"] == "0.32.0" and rec["profile"] == "vllm-0.32.0-serving"
    assert b.out_json_name("r6kl", "chat", rec["vllm"]) == "speculate-smollm2-gpu-head-r6kl-chat-vllm032.json"
    with pytest.raises(SystemExit, match="no vLLM version in its label io.eagle3ops.pins.*--profile vllm-0.32.0"):
        hv.image_record("some/image:1", {"io.eagle3ops.profile": "x"})
    with pytest.raises(ValueError, match="MAJOR.MINOR"):
        b.vllm_suffix("latest")


def _versions(acc: float, *, agree: dict | None = None, sha: str = "s" * 64, head: str = "h" * 64,
              base_image: str | None = None) -> tuple[dict, dict]:
    """A --speculative-image run's figures (vLLM 0.32, the baseline the same image: --control) and the 0.16 run's
    (acceptance 1.90), with the keys figures() writes."""
    img = "eagle3ops/serving:0.32.0-0.9.0-30dcddcb3010"

    def fig(a: float, vllm: str | None, image: str) -> dict:
        return {"set": "chat", "acceptance_length": a, "head_sha256": "h" * 64, "num_speculative_tokens": 3,
                "levels": {"measured": [1, 4]},
                "prompts": {"gate": {"file_sha256": "s" * 64, "count": 64, "max_tokens": 128}},
                "measured_releases": {"baseline": {"image": base_image or image, "vllm_version": vllm},
                                      "speculative": {"image": image, "vllm_version": vllm}},
                "answer_agreement": {"1": {"prompts": 64, "identical": 64, "not_compared": 0},
                                     "4": {"prompts": 64, "identical": 64, "not_compared": 0}}}

    new = {**fig(acc, "0.32.0", img), "speculative_image": {"tag": img, "vllm": "0.32.0"}}
    new["prompts"]["gate"]["file_sha256"], new["head_sha256"] = sha, head
    if agree is not None:
        new["answer_agreement"] = agree
    return new, fig(1.90, "0.16.0", "eagle3ops/serving:sandbox-cpu-standin")


def test_the_head_under_032_holds_within_005_with_identical_answers_on_the_same_prompts() -> None:
    """``--compare-with``: acceptance within 0.05 of the 0.16 run's, every answer identical to no speculation at
    both levels, the same prompts file, head and settings -> holds, each figure given; 0.06 apart -> the
    acceptance condition (and the whole) does not hold, the others still do."""
    key, e = hv.head_across_versions(*_versions(1.94), "speculate-smollm2-gpu-head-r6kl-chat.json")
    assert key == "head_under_032" and e["holds"] is True
    assert e["acceptance"] == {"this": 1.94, "other": 1.90, "difference": 0.04, "needs": "|difference| <= 0.05",
                               "holds": True}
    assert e["answers_identical_to_no_speculation"]["value"] == {"1": "64/64", "4": "64/64"}
    assert e["vllm"] == {"this": "0.32.0", "other": "0.16.0"} and e["same_prompts"]["holds"]
    assert hv.head_across_versions(*_versions(1.85), "x.json")[1]["holds"] is True  # -0.05: the boundary holds
    _, e = hv.head_across_versions(*_versions(1.84), "x.json")
    assert e["holds"] is False and e["acceptance"]["holds"] is False and e["acceptance"]["difference"] == -0.06
    assert e["answers_identical_to_no_speculation"]["holds"] and e["same_head"]["holds"]


def test_a_differing_answer_other_prompts_or_another_baseline_do_not_hold_and_are_named() -> None:
    """One differing greedy answer at concurrency 4, a prompts file of another sha256, a baseline on another image
    than the speculative release (not --control), an agreement the gate did not record, or a JSON of another prompt
    set: each stops the entry from holding (or is refused), named."""
    agree = {"1": {"prompts": 64, "identical": 64, "not_compared": 0},
             "4": {"prompts": 64, "identical": 63, "differing": [17], "not_compared": 0}}
    _, e = hv.head_across_versions(*_versions(1.92, agree=agree), "x.json")
    a = e["answers_identical_to_no_speculation"]
    assert e["holds"] is False and a["holds"] is False and a["value"]["4"] == "63/64"
    assert a["why"] == "concurrency 4: 1 of 64 greedy answers differ (first prompts [17])"
    assert e["acceptance"]["holds"] and e["same_prompts"]["holds"]
    _, e = hv.head_across_versions(*_versions(1.92, sha="t" * 64), "x.json")
    assert e["holds"] is False and e["same_prompts"]["holds"] is False
    assert e["same_prompts"]["this"]["file_sha256"] != e["same_prompts"]["other"]["file_sha256"]
    _, e = hv.head_across_versions(*_versions(1.92, base_image="eagle3ops/vllm-openai-local:v0.16.0"), "x.json")
    assert e["holds"] is False and "not the same image" in e["answers_identical_to_no_speculation"]["why"]
    _, e = hv.head_across_versions(*_versions(1.92, agree={}), "x.json")
    assert e["answers_identical_to_no_speculation"]["why"].startswith("the gate recorded no answer agreement")
    _, e = hv.head_across_versions(*_versions(1.92, head="g" * 64), "x.json")
    assert e["holds"] is False and e["same_head"]["holds"] is False
    new, old = _versions(1.92)
    with pytest.raises(SystemExit, match="prompt set 'code', this run's is 'chat'"):
        hv.head_across_versions(new, {**old, "set": "code"}, "x.json")
    with pytest.raises(SystemExit, match="records no --speculative-image"):
        hv.head_across_versions(old, new, "x.json")


def test_compare_with_rewrites_the_json_with_the_entry(tmp_path: Path) -> None:
    """The script's ``--compare-with JSON_016`` (pure: no image, no host): ``--json``'s other keys kept,
    ``done_when.head_under_032`` added with its figures; the 0.16 file is not changed."""
    import subprocess
    import sys

    new, old = _versions(1.93)
    new["done_when"] = {"kept": {"holds": True}}
    j32, j16 = tmp_path / "r6kl-chat-vllm032.json", tmp_path / "r6kl-chat.json"
    j32.write_text(json.dumps(new))
    j16.write_text(json.dumps(old))
    script = REPO / "benchmarks" / "gpu-head-served" / "speculate_smollm2_gpu_head.py"
    r = subprocess.run([sys.executable, str(script), "--round", "r6kl", "--set", "chat", "--json", str(j32),
                        "--speculative-image", "eagle3ops/serving:0.32.0-0.9.0-30dcddcb3010",
                        "--compare-with", str(j16)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "head_under_032: holds True" in r.stdout
    got = json.loads(j32.read_text())
    assert got["done_when"]["kept"] == {"holds": True} and got["acceptance_length"] == 1.93
    assert got["done_when"]["head_under_032"]["acceptance"]["difference"] == 0.03
    assert got["done_when"]["head_under_032"]["compared_with"] == j16.name
    assert json.loads(j16.read_text()) == old
