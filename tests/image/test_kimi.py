"""A tiny Kimi-K2.5-class target (``tinymodel`` kind ``kimi-k25``) through every pipeline stage.

Runs inside the pipeline image (vLLM 0.16 CPU, patched speculators, tiktoken). The target is built locally
(:mod:`eagle3ops.fixtures.tinykimi`): ``KimiK25ForConditionalGeneration`` with a remote-code config, a DeepSeek-V3 text
backbone under ``language_model.`` with Kimi's 163,840-token vocabulary, a one-block vision tower, and a slow
tiktoken-backed remote-code tokenizer. The ``slow`` test starts vLLM twice (extract, probe): a few minutes on
2 cores. Figures (prepare tokens/s, vocab time and memory, probe errors, train loss) are printed (``-s``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from eagle3ops.config.pipeline import load_pipeline_config  # noqa: E402
from eagle3ops.stages.draft import target_final_norm  # noqa: E402
from eagle3ops.stages.extract import TransformersEngine, run_extract  # noqa: E402
from eagle3ops.stages.prepare import load_tokenizer, read_samples, run_prepare  # noqa: E402
from eagle3ops.stages.target import BACKBONE_TENSORS, load_backbone_tensors, target_text_config  # noqa: E402
from eagle3ops.stages.train import run_train  # noqa: E402
from eagle3ops.stages.vocab import run_vocab  # noqa: E402
from eagle3ops.fixtures.tinykimi import (  # noqa: E402
    IM_END_ID,
    KIMI_VOCAB_SIZE,
    MEDIA_PAD_ID,
    N_RANKS,
    VISION_CONFIG,
    synthetic_chat_rows,
    vision_weight_shapes,
)
from eagle3ops.fixtures.tinymodel import build_tiny_model  # noqa: E402

ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
QUIET = lambda *_a, **_k: None  # noqa: E731
#: The backbone tensors every stage reads, by their full checkpoint names in a Kimi-K2.5 checkpoint.
KIMI_BACKBONE_NAMES = {
    "embeddings": "language_model.model.embed_tokens.weight",
    "final_norm": "language_model.model.norm.weight",
    "lm_head": "language_model.lm_head.weight",
}


@pytest.fixture(scope="module")
def kimi(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("kimi") / "kimi-k25", kind="kimi-k25")


def make_run(root: Path, model: Path, **sections) -> Path:
    cfg = {"target_model": str(model), "prepare": {"max_seq_len": 512}, "extract": {"engine": "transformers"},
           "vocab": {"draft_vocab_size": 32000}, "train": {"steps": 3, "checkpoint_every": 3,
                                                          "batch_max_tokens": 512}}
    for k, v in sections.items():
        cfg[k] = {**cfg.get(k, {}), **v} if isinstance(v, dict) else v
    root.mkdir(parents=True, exist_ok=True)
    (root / "pipeline.yaml").write_text(json.dumps(cfg))
    return root


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


# ---------------------------------------------------------------------------------------------------- layout


def test_kimi_target_is_laid_out_like_the_real_checkpoint(kimi):
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer, DeepseekV3Config, DeepseekV3ForCausalLM

    conf = json.loads((kimi / "config.json").read_text())
    assert conf["model_type"] == "kimi_k25" and conf["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert conf["auto_map"] == {"AutoConfig": "configuration_kimi_k25.KimiK25Config"}
    assert conf["media_placeholder_token_id"] == MEDIA_PAD_ID == 163605
    assert "hidden_size" not in conf and "num_hidden_layers" not in conf  # sizes only in text_config
    with pytest.raises(ValueError, match="trust_remote_code"):  # transformers 4.57.6 has no kimi_k25
        AutoConfig.from_pretrained(kimi)
    text = target_text_config(str(kimi))
    assert isinstance(text, DeepseekV3Config) and text.vocab_size == KIMI_VOCAB_SIZE == 163_840
    assert (text.hidden_size, text.num_hidden_layers, text.q_lora_rank, text.kv_lora_rank) == (128, 4, 48, 32)
    assert text.qk_nope_head_dim + text.qk_rope_head_dim == 64  # a CPU attention head size (FACTS.md)

    with safe_open(str(kimi / "model.safetensors"), "pt") as f:
        names = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    ref = DeepseekV3ForCausalLM(text)  # the backbone's own parameter names (transformers = vLLM's DeepSeek names)
    want_text = {f"language_model.{k}": tuple(v.shape) for k, v in ref.state_dict().items()}
    want_vision = vision_weight_shapes(VISION_CONFIG, 128)
    assert names == {**want_text, **want_vision}
    for role, name in KIMI_BACKBONE_NAMES.items():
        assert names[name][0] in (KIMI_VOCAB_SIZE, 128), (role, name)
    assert not any(k.startswith("model.") or k == "lm_head.weight" for k in names)  # nothing at the top level

    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoTokenizer.from_pretrained(kimi, trust_remote_code=False)
    tok = load_tokenizer(str(kimi))
    assert type(tok).__name__ == "TikTokenTokenizer" and tok.is_fast is False and len(tok) == KIMI_VOCAB_SIZE
    assert tok.convert_tokens_to_ids(["[BOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                                      "<|im_middle|>", "<|media_pad|>", "[PAD]"]) == \
        [163584, 163586, 163587, 163588, 163594, 163601, 163605, 163839]
    text_in = "The draft head reads 3 hidden states: bako tiru, and 4211 more.\nDone?"
    ids = tok(text_in, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text_in and max(ids) < N_RANKS and len(ids) < len(text_in) // 2
    assert len(set(tok.get_vocab().values())) == KIMI_VOCAB_SIZE


# ---------------------------------------------------------------------------------------------------- prepare


def test_kimi_prepare_masks_the_replies_with_the_slow_tokenizer(tmp_path, kimi):
    run = make_run(tmp_path / "run", kimi, prepare={"max_seq_len": 4096})
    figures = run_prepare(run, load_pipeline_config(run), log=QUIET)
    assert figures["tokenizer"]["class"] == "TikTokenTokenizer" and figures["tokenizer"]["is_fast"] is False
    assert figures["samples"] == 42 and figures["boundary_merges"] == 0
    tok = load_tokenizer(str(kimi))
    from eagle3ops.stages.chatdata import load_conversations, resolve_dataset

    convs = {f"{d}:{c['source'].rpartition(':')[2]}": c["messages"]  # samples.jsonl names rows by the spec
             for d in ("builtin:sharegpt", "builtin:messages") for c in load_conversations([resolve_dataset(d, run)])}
    for row in read_samples(run):
        replies = [m["content"] for m in convs[row["source"]] if m["role"] == "assistant"]
        spans = _runs(row["loss_mask"])
        assert [tok.decode(row["input_ids"][a:b]) for a, b in spans] == [r + "<|im_end|>" for r in replies]
        assert all(row["input_ids"][b - 1] == IM_END_ID for _a, b in spans)  # the end-of-turn token is trained
        # the role markers and the default system prompt are context, never trained
        assert row["input_ids"][:3] == [163594, tok.convert_tokens_to_ids("system"), 163601]


def test_kimi_prepare_throughput_on_the_slow_tokenizer_in_one_and_in_several_processes(tmp_path, kimi,
                                                                                       monkeypatch):
    """Measured: tokens/s of the prepare stage with the slow remote-code tokenizer (printed; run with -s), in one
    process and in worker processes ($EAGLE3OPS_PREPARE_PROCS); the samples are byte-identical."""
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in synthetic_chat_rows(300, seed=1)))
    out = {}
    for procs in ("1", "2"):
        monkeypatch.setenv("EAGLE3OPS_PREPARE_PROCS", procs)
        run = make_run(tmp_path / f"run{procs}", kimi, prepare={"datasets": [str(data)], "max_seq_len": 4096})
        t0 = time.monotonic()
        figures = run_prepare(run, load_pipeline_config(run), log=QUIET)
        wall = time.monotonic() - t0
        print(f"\nprepare (slow TikTokenTokenizer, {figures['workers']} process(es), {os.cpu_count()} CPUs): "
              f"{figures['samples']} conversations, {figures['tokens']} tokens in {wall:.2f} s = "
              f"{figures['tokens'] / wall:.0f} tokens/s (manifest: {figures['tokens_per_s']})")
        assert figures["workers"] == int(procs)
        assert figures["samples"] == 300 and figures["turns"]["trained"] == 600
        assert figures["tokens"] > 60_000 and figures["assistant_tokens"] > 0.7 * figures["tokens"]
        out[procs] = (run / "prepare/samples.jsonl").read_bytes()
    assert out["1"] == out["2"]
    monkeypatch.setenv("EAGLE3OPS_PREPARE_PROCS", "0")
    with pytest.raises(ValueError, match="EAGLE3OPS_PREPARE_PROCS"):
        run_prepare(run, load_pipeline_config(run), log=QUIET)


# ------------------------------------------------------------------------------------------------------ vocab


def test_kimi_vocab_at_full_size(tmp_path, kimi):
    """163,840 -> 32,000 on data with more distinct assistant tokens than the draft vocabulary holds."""
    import numpy as np

    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in synthetic_chat_rows(1200, seed=2, reply_words=(200, 300))))
    run = make_run(tmp_path / "run", kimi, prepare={"datasets": [str(data)], "max_seq_len": 4096})
    run_prepare(run, load_pipeline_config(run), log=QUIET)
    t0 = time.monotonic()
    figures = run_vocab(run, load_pipeline_config(run), log=QUIET)
    wall = time.monotonic() - t0
    d2t, t2d = np.load(run / "vocab/d2t.npy"), np.load(run / "vocab/t2d.npy")
    assert d2t.shape == (32000,) and t2d.shape == (KIMI_VOCAB_SIZE,) and int(t2d.sum()) == 32000
    target_ids = np.arange(32000) + d2t
    assert (np.diff(target_ids) > 0).all() and target_ids[0] >= 0 and target_ids[-1] < KIMI_VOCAB_SIZE
    assert (target_ids == np.nonzero(t2d)[0]).all()
    freq = {int(k): v for k, v in json.loads((run / "vocab/token_freq.json").read_text()).items()}
    assert len(freq) > 32000 and figures["padded_ids"] == 0  # the cut is real: not every token fits
    top = sorted(freq, key=lambda t: (-freq[t], t))[:32000]
    assert set(top) == set(target_ids.tolist())  # exactly the most frequent assistant tokens are kept
    assert all(t < N_RANKS or t == IM_END_ID for t in target_ids)  # real tokens (text or end-of-turn)
    covered = sum(freq[t] for t in top) / sum(freq.values())
    assert figures["coverage"] == pytest.approx(covered, abs=1e-6) and 0.5 < covered < 1
    print(f"\nvocab 163840 -> 32000: {figures['distinct_assistant_tokens']} distinct of "
          f"{figures['assistant_tokens']} assistant tokens, coverage {covered:.4f}, stage {figures['wall_s']} s "
          f"(call {wall:.2f} s), peak RSS {figures['peak_memory_bytes'] / 2**20:.0f} MiB")


# ------------------------------------------------------------------------------------------------------ train


def test_kimi_train_reads_every_target_tensor_under_language_model(tmp_path, kimi):
    """The three backbone tensors are read under `language_model.`: by the stage (final norm) and by speculators'
    draft head (embeddings, lm_head rows of the draft vocabulary; this project's speculators patch)."""
    import numpy as np
    from safetensors import safe_open
    from speculators.models.eagle3 import Eagle3DraftModel

    from eagle3ops.stages.draft import build_draft_config

    with safe_open(str(kimi / "model.safetensors"), "pt") as f:
        stored = {role: f.get_tensor(name) for role, name in KIMI_BACKBONE_NAMES.items()}
    got = load_backbone_tensors(str(kimi), list(BACKBONE_TENSORS))
    for role in KIMI_BACKBONE_NAMES:
        assert torch.equal(got[role], stored[role]), role
    w, eps = target_final_norm(str(kimi))
    assert torch.equal(w, stored["final_norm"].float()) and eps == 1e-6

    run = make_run(tmp_path / "run", kimi, prepare={"max_samples": 10}, extract={"aux_layer_ids": [0, 1, 2]},
                   vocab={"draft_vocab_size": 1000})
    cfg = load_pipeline_config(run)
    run_prepare(run, cfg, log=QUIET)
    run_vocab(run, cfg, log=QUIET)
    t2d = torch.from_numpy(np.load(run / "vocab/t2d.npy"))
    d2t = torch.from_numpy(np.load(run / "vocab/d2t.npy"))
    model = Eagle3DraftModel(build_draft_config(cfg, [0, 1, 2], 1000), t2d=t2d, d2t=d2t)
    assert torch.equal(model.embed_tokens.weight, stored["embeddings"].float())
    assert torch.equal(model.verifier_lm_head.weight, stored["lm_head"].float()[t2d])
    assert torch.equal(model.lm_head.weight, stored["lm_head"].float()[t2d])

    run_extract(run, cfg, log=QUIET)  # reference engine (transformers) on the language_model.* backbone
    fig = run_train(run, cfg, log=QUIET)
    assert fig["steps"] == 3 and all(v == v for v in (fig["first_loss"], fig["final_metrics"]["loss"]))
    conf = json.loads((run / "train/final/config.json").read_text())
    assert conf["speculators_config"]["verifier"]["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert conf["transformer_layer_config"]["vocab_size"] == KIMI_VOCAB_SIZE
    assert conf["transformer_layer_config"]["head_dim"] == 32  # hidden / heads, not MLA's rope part
    print(f"\ntrain (reference-engine states): loss {fig['first_loss']:.3f} -> {fig['final_metrics']['loss']:.3f}")


def test_kimi_reference_engine_runs_the_language_model_backbone(kimi):
    """The extract stage's reference engine loads the `language_model.*` tensors into a model of text_config: its
    last captured layer, through the stored final norm and lm_head, gives the same logits as that model."""
    from safetensors import safe_open

    eng = TransformersEngine(str(kimi), [0, 1, 2, 3], device="cpu", dtype=torch.float32)
    ids = list(range(1000, 1040))
    h = eng.generate([ids])[0]["hidden_states"][3]
    with safe_open(str(kimi / "model.safetensors"), "pt") as f:
        norm = f.get_tensor("language_model.model.norm.weight").float()
        head = f.get_tensor("language_model.lm_head.weight").float()
    with torch.inference_mode():
        logits = eng.model(torch.tensor([ids])).logits[0]
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * norm
    assert torch.allclose(normed @ head.T, logits, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------------------------- end to end


def _stage(stage: str, run: Path, *args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    env = {k: v for k, v in ENV.items() if k != "VLLM_MLA_DISABLE"}  # the stage sets it for MLA on CPU
    return subprocess.run([sys.executable, "-m", "eagle3ops", "stage", stage, "--run-dir", str(run), *args],
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_kimi_every_stage_and_the_probe_with_vllm(tmp_path, kimi):
    """prepare -> extract (vLLM 0.16 CPU, vision off, capture through `language_model`) -> vocab (163,840 ->
    32,000) -> train -> probe, through the stage CLI, with Kimi's remote-code tokenizer. Extracted states are compared
    per token with the reference engine (MoE tolerance stated per quantile, FACTS.md); the probe must pass; then
    prepare's settings changed make the later stages' inputs stale, and train refuses through the CLI (this was
    tests/image/test_stages.py's four-stage CLI test on a tiny remote-code Llama, folded in here: that test ran the
    same four stages through the same CLI again, ~60 s of every CI run)."""
    run = make_run(tmp_path / "run", kimi, prepare={"max_samples": 16, "max_seq_len": 256},
                   extract={"engine": "vllm", "aux_layer_ids": [0, 1, 2]})
    for stage in ("prepare", "extract", "vocab", "train"):
        r = _stage(stage, run)
        assert r.returncode == 0, (stage, r.stdout[-3000:], r.stderr[-4000:])
    ext = json.loads((run / "extract/manifest.json").read_text())
    assert ext["engine"] == "vllm" and ext["layer_ids"] == [0, 1, 2, 3] and ext["hidden_size"] == 128
    eng = TransformersEngine(str(kimi), [0, 1, 2, 3], device="cpu")
    rows = read_samples(run)
    errs = []
    for row, ref in zip(rows, eng.generate([r["input_ids"] for r in rows]), strict=True):
        d = torch.load(run / f"extract/hidden/data_{row['i']:06d}.pt", weights_only=True)
        assert d["input_ids"].tolist() == row["input_ids"]
        for got, want in zip(d["hidden_states"], ref["hidden_states"], strict=True):
            w = want.float()
            errs.append((got.float() - w).norm(dim=-1) / w.norm(dim=-1).clamp_min(1e-6))
    e = torch.cat(errs)
    print(f"\nextract vs reference: {e.numel()} token-layers, median {e.median():.4g}, "
          f"p99 {e.quantile(0.99):.4g}, max {e.max():.4g}")
    assert e.median().item() <= 0.01 and (e > 0.05).float().mean().item() <= 0.03
    voc = json.loads((run / "vocab/manifest.json").read_text())
    assert voc["target_vocab_size"] == KIMI_VOCAB_SIZE and voc["draft_vocab_size"] == 32000
    tr = json.loads((run / "train/manifest.json").read_text())
    assert tr["steps"] == 3
    r = _stage("probe", run)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-4000:]
    rep = json.loads((run / "probe/report.json").read_text())
    assert rep["passed"] and rep["tolerance_kind"] == "moe" and rep["token_source"] == "prepare/samples.jsonl"
    print(f"probe: {rep['tokens']} tokens, median {rep['median']:.4g}, p99 {rep['p99']:.4g}, max {rep['max']:.4g}; "
          f"train loss {tr['first_loss']:.3f} -> {tr['final_metrics']['loss']:.3f}; stage wall s: "
          + ", ".join(f"{s} {json.loads((run / s / 'manifest.json').read_text())['wall_s']}"
                      for s in ("prepare", "extract", "vocab", "train")))
    # prepare's settings changed after the fact: the later stages' inputs are now stale and train refuses through
    # the CLI (exit 2, naming the manifest and the rerun), touching nothing
    cfg = json.loads((run / "pipeline.yaml").read_text())
    cfg["prepare"]["max_seq_len"] = 128
    (run / "pipeline.yaml").write_text(json.dumps(cfg))
    before = (run / "train/manifest.json").read_bytes()
    r = _stage("train", run, timeout=300)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    assert "prepare" in r.stderr and "manifest.json" in r.stderr and "rerun" in r.stderr
    assert (run / "train/manifest.json").read_bytes() == before


VLLM_LOAD_ALL = r"""
import json, sys
if __name__ == "__main__":
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model
    target, port = sys.argv[1], sys.argv[2]
    vc = EngineArgs(model=target, trust_remote_code=True, enforce_eager=True, max_model_len=256,
                    dtype="bfloat16").create_engine_config()  # every modality on: the vision tower is built
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo")
        initialize_model_parallel(1, 1)
        m = get_model(vllm_config=vc)  # raises on a checkpoint name no module takes and on an unloaded weight
    p = dict(m.named_parameters())
    from safetensors import safe_open
    with safe_open(target + "/model.safetensors", "pt") as f:
        same = {
            "embed": torch.equal(p["language_model.model.embed_tokens.weight"], f.get_tensor("language_model.model.embed_tokens.weight")),
            "lm_head": torch.equal(p["language_model.lm_head.weight"], f.get_tensor("language_model.lm_head.weight")),
            "norm": torch.equal(p["language_model.model.norm.weight"], f.get_tensor("language_model.model.norm.weight")),
            "wqkv": torch.equal(p["vision_tower.encoder.blocks.0.wqkv.weight"], f.get_tensor("vision_tower.encoder.blocks.0.wqkv.weight")),
            "proj0": torch.equal(p["mm_projector.linear_1.weight"], f.get_tensor("mm_projector.proj.0.weight")),
            "proj2": torch.equal(p["mm_projector.linear_2.weight"], f.get_tensor("mm_projector.proj.2.weight")),
        }
    print("RESULT " + json.dumps({"cls": type(m).__name__, "vision": type(m.vision_tower).__name__,
                                  "params": len(p), "same": same}))
"""


@pytest.mark.slow
def test_kimi_checkpoint_loads_into_vllms_kimi_k25_with_the_vision_tower(tmp_path, kimi):
    """vLLM 0.16 builds KimiK25ForConditionalGeneration from the tiny config with the vision modality ON (the
    MoonViT tower and projector built, not skipped) and loads every checkpoint tensor into it: vLLM's loader
    refuses names no module takes and parameters left unloaded, so the names are vLLM's own."""
    script = tmp_path / "load.py"
    script.write_text(VLLM_LOAD_ALL)
    env = {**ENV, "VLLM_MLA_DISABLE": "1"}
    r = subprocess.run([sys.executable, str(script), str(kimi), "29547"], env=env, capture_output=True, text=True,
                       timeout=900)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, r.stdout[-3000:] + r.stderr[-4000:]
    res = json.loads(line.removeprefix("RESULT "))
    assert res["cls"] == "KimiK25ForConditionalGeneration" and res["vision"] == "MoonViT3dPretrainedModel"
    assert all(res["same"].values()), res["same"]
