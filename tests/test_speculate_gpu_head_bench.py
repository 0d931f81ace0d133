"""The GPU head's serving benchmark's pure parts (:mod:`eagle3ops_dev.gpuhead`, used by
``benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py``): the head reassembled from its split shard with
the recorded sha256 checked, and its figures (per-level throughput intervals by the gate's own method, the serving
targets' checks with their shortfalls) from a gate result made by the gate's real decision on synthetic passes.
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


def test_a_shard_joined_before_is_taken_only_with_the_recorded_sha256(tmp_path: Path) -> None:
    """finish-round leaves the split shard joined and its parts gone: the joined file is checked like a joined one."""
    src, r2 = _head(tmp_path)
    name = "model-00002-of-00002.safetensors"
    (src / name).write_bytes((src / f"{name}.part1").read_bytes() + (src / f"{name}.part2").read_bytes())
    for part in (1, 2):
        (src / f"{name}.part{part}").unlink()
    rec = b.assemble_head(src, tmp_path / "head", r2)
    assert rec["joined"] == {name: ["joined before"]} and rec["files"][name]["bytes"] == 10240
    (src / name).write_bytes(b"damaged")
    with pytest.raises(SystemExit, match="a part is damaged"):
        b.assemble_head(src, tmp_path / "again", r2)
    (src / name).unlink()
    with pytest.raises(SystemExit, match="and no joined"):
        b.assemble_head(src, tmp_path / "third", r2)


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
