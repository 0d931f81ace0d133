"""``eagle3ops speculate``: the head check (pure), the gate's host commands, the inventory keys, the host-side
helper's file readers; and, on the sandbox, both branches of the gate end to end (random heads; the keep branch
with a margin named as negative)."""

from __future__ import annotations

import json
import shlex
import struct
from pathlib import Path

import pytest

from eagle3ops.commands import speculate as sc
from eagle3ops.config import load_inventory
from eagle3ops.speculate import headcheck as hk
from eagle3ops.speculate import onhost

REPO = Path(__file__).resolve().parents[1]
TARGET = {"architectures": ["LlamaForCausalLM"], "hidden_size": 128, "vocab_size": 2048, "num_hidden_layers": 4}
#: The layout of a head the train stage writes (speculators 0.3.0 save_pretrained, as on the sandbox).
HEAD = {"architectures": ["Eagle3DraftModel"], "draft_vocab_size": 1024, "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
        "speculators_model_type": "eagle3", "target_hidden_size": None,
        "speculators_config": {"algorithm": "eagle3", "verifier": {"architectures": ["LlamaForCausalLM"],
                                                                    "name_or_path": "/model"}},
        "transformer_layer_config": {"hidden_size": 128, "vocab_size": 2048, "num_hidden_layers": 1}}
SHAPES = {"d2t": [1024], "t2d": [2048], "lm_head.weight": [1024, 128], "fc.weight": [128, 384]}


def _with(d: dict, path: str, value) -> dict:
    out = json.loads(json.dumps(d))
    cur = out
    *parents, last = path.split(".")
    for p in parents:
        cur = cur[p]
    cur[last] = value
    return out


def test_a_trained_head_fits_its_target():
    facts = hk.check_head(HEAD, SHAPES, TARGET)
    assert (facts.hidden_size, facts.draft_vocab_size, facts.aux_layer_ids) == (128, 1024, [1, 2, 3])
    assert facts.verifier_architectures == ["LlamaForCausalLM"] and facts.warnings == []
    nested = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": TARGET}  # wrapper targets
    hk.check_head(_with(HEAD, "speculators_config.verifier.architectures", nested["architectures"]), SHAPES, nested)


@pytest.mark.parametrize("head,shapes,field,fix", [
    (_with(HEAD, "transformer_layer_config.hidden_size", 256), SHAPES, "hidden_size", "train the head"),
    (_with(HEAD, "target_hidden_size", 7168), SHAPES, "target_hidden_size", "train the head"),
    (_with(HEAD, "transformer_layer_config.vocab_size", 32000), SHAPES, "vocab_size", "train the head"),
    (HEAD, {**SHAPES, "d2t": [512]}, "d2t", "vocabulary mapping"),
    (HEAD, {**SHAPES, "t2d": [32000]}, "t2d", "vocabulary mapping"),
    (HEAD, {k: v for k, v in SHAPES.items() if k not in ("d2t", "t2d")}, "d2t", "d2t tensor"),
    (HEAD, {**SHAPES, "lm_head.weight": [2048, 128]}, "lm_head.weight", "draft_vocab_size"),
    (_with(HEAD, "eagle_aux_hidden_state_layer_ids", [1, 2, 4]), SHAPES, "eagle_aux_hidden_state_layer_ids",
     "train the head"),
    (HEAD, {**SHAPES, "fc.weight": [128, 256]}, "fc.weight", "train the head"),
    (_with(HEAD, "speculators_config.verifier.architectures", ["DeepseekV3ForCausalLM"]), SHAPES,
     "speculators_config.verifier.architectures", "train the head"),
])
def test_a_misfit_head_is_refused_naming_the_field_and_the_fix(head, shapes, field, fix):
    with pytest.raises(hk.HeadMismatch) as ei:
        hk.check_head(head, shapes, TARGET)
    assert ei.value.field == field and f"`{field}`" in str(ei.value) and "fix:" in str(ei.value) and fix in str(ei.value)


def test_a_flat_eagle3_llama_head_without_aux_ids_takes_vllms_default():
    flat = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 128, "target_hidden_size": 128,
            "vocab_size": 2048, "draft_vocab_size": 2048}
    facts = hk.check_head(flat, {"lm_head.weight": [2048, 128], "fc.weight": [128, 384]}, TARGET)
    assert facts.aux_layer_ids == [2, 2, 1] and "default" in facts.warnings[0]


def test_offline_estimate_is_read_from_the_train_manifest():
    assert hk.offline_acceptance({"offline_estimate": {"acceptance_length": 1.8, "per_position": {}}}) == 1.8
    assert hk.offline_acceptance({"offline_estimate": None}) is None and hk.offline_acceptance(None) is None


def test_speculative_config_and_the_gate_helper_argv():
    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    args = sc.speculative_args(num_speculative_tokens=3, cpu=True)
    assert args[0] == "--speculative-config" and json.loads(args[1]) == {
        "method": "eagle3", "model": sc.HEAD_MOUNT, "num_speculative_tokens": 3, "disable_padded_drafter_batch": True}
    assert "disable_padded_drafter_batch" not in sc.speculative_args(num_speculative_tokens=4, cpu=False)[1]
    argv = sc.gate_helper(h, "img:1", "inspect", head_dir="/d/h ead", run_dir="/d/runs/r")
    assert argv[:3] == ["docker", "-H", h.docker_host] and argv[-3:] == ["-m", "eagle3ops.speculate.onhost", "inspect"]
    assert "/d/h ead:/head:ro" in argv and f"{h.model_path}:/target:ro" in argv and "/d/runs/r:/run:ro" in argv
    assert shlex.split(shlex.join(argv)) == argv  # quoted once, by remote.render
    m = sc.gate_helper(h, "img:1", "measure")
    assert "--volume" not in m and m[m.index("--network") + 1] == "host"
    with pytest.raises(ValueError):
        sc.gate_helper(h, "img:1", "rm -rf /")


def test_inventory_gate_keys():
    s = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox").serving
    assert s.gate_concurrency[0] == 1 and s.gate_max_tokens == 16 and s.speculative_image
    from eagle3ops.config import ServingConfig
    with pytest.raises(Exception, match="gate_concurrency"):
        ServingConfig(image="x", served_model_name="m", gate_concurrency=[4, 4])


def test_onhost_reads_safetensors_headers_and_checks_the_runs_chats(tmp_path):
    head, target, run = tmp_path / "head", tmp_path / "target", tmp_path / "run"
    for d in (head, target, run):
        d.mkdir()
    hdr = json.dumps({"__metadata__": {"format": "pt"}, "d2t": {"dtype": "I64", "shape": [1024], "data_offsets":
                                                                 [0, 8192]}}).encode()
    (head / "model.safetensors").write_bytes(struct.pack("<Q", len(hdr)) + hdr + b"\0" * 8192)
    (head / "config.json").write_text(json.dumps(HEAD))
    (target / "config.json").write_text(json.dumps(TARGET))
    (run / "pipeline.yaml").write_text("prepare:\n  datasets: [chats.jsonl]\n")
    from eagle3ops.speculate.prompts import humaneval
    he = humaneval()
    (run / "chats.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hello"}]}) + "\n")
    req = {"gate": [{"id": p.id, "text": p.text} for p in he[:3]]}
    ans = onhost.inspect(req, head, target, run)
    assert ans["shapes"] == {"d2t": [1024]} and ans["head_config"] == HEAD and ans["target_config"] == TARGET
    assert ans["disjointness"]["overlap"] == [] and ans["disjointness"]["contained_in_training"] == []
    (run / "chats.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "Complete:\n"
                                                               + he[1].text}]}) + "\n")
    assert onhost.inspect(req, head, target, run)["disjointness"]["contained_in_training"] == [he[1].id]
    assert onhost.parse_answer("noise\n" + onhost.MARK + '{"a": 1}\n') == {"a": 1}
    with pytest.raises(ValueError, match="no answer"):
        onhost.parse_answer("Traceback ...")
