"""A *trained* sandbox target whose forward costs several draft forwards: the stand-in that lets speculation win on CPU.

Why: the sandbox's tiny Llama (:mod:`eagle3ops.fixtures.tinymodel`, kind ``llama``: 4 layers x hidden 128) has random
weights, so its next-token distribution is flat and no draft head can predict it (the demo measured acceptance
length 1.000), and one of its forwards costs about what a one-layer draft forward costs, so speculation could not
win even with a perfect head. ``benchmarks/sandbox-target/README.md`` measured both: 77 s of training on real text
makes the tiny target peaked (held-out mean top-1 probability 0.001 -> 0.43), and a deeper target lowers the
acceptance length speculation needs to break even.

What this builds (``python -m eagle3ops_dev.tinytrained OUT --corpus CORPUS.jsonl [--layers 24]``):

1. **The core**: the tiny Llama of :func:`eagle3ops.fixtures.tinymodel.build_tiny_model` (same config, tokenizer and seed),
   trained on a corpus of chat turns (``{"prompt": ..., "completion": ...}`` per line, rendered with the model's chat
   template as one user turn and one assistant turn), AdamW, warmup + cosine, random windows of the concatenated
   token stream (:func:`train_core`). The demo passes HumanEval's *train* split (prompt + canonical solution; the
   split of :func:`eagle3ops.speculate.prompts.split_by_id` at the gate's fraction), so the gate's HumanEval prompts
   stay unseen by the target and by the head.
2. **The shell** (:func:`deepen`): the trained core's layers spread over ``layers`` decoder layers (core layer j at
   position ``round(j * layers / core_layers)``); every other layer is a *stand-in*: a full Llama decoder layer with
   random attention and MLP inputs whose two output projections (``o_proj``, ``down_proj``) are zero, so it adds
   nothing to the residual stream. The result computes exactly what the core computes (same logits, checked by
   :func:`deepen`'s caller in the tests) at the cost of a ``layers``-deep model: vLLM runs every layer's kernels
   whatever the weights are. Measured with vLLM 0.16 CPU on this 2-core machine (``benchmarks/vllm-target-cost/vllm_target_cost.py``,
   ``benchmarks/vllm-target-cost/vllm-target-cost-cpu.json``: greedy, 64 tokens, bf16, one request): a 4 x 128 target steps in 3.0 ms
   and 7.2 ms with an EAGLE-3 head (k = 3), so speculation needs an acceptance length of 2.39 to win there; a
   24 x 128 one in 11.8 ms and 16.6 ms: break-even at 1.41.

The EAGLE-3 head for it stays one layer at hidden 128 (speculators sizes the head from the target's hidden size),
so it trains as fast as the 4-layer target's head. A real target is deep *and* trained; this one is trained where it
is cheap and deep where it costs compute, and says so in ``eagle3ops-target.json`` beside its weights.

torch and transformers are imported lazily.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["TrainedTargetError", "build_trained_llama", "deepen", "load_corpus", "main", "train_core"]

#: Record written beside the weights (what the target is, how it was trained, the shell's layout).
RECORD = "eagle3ops-target.json"


class TrainedTargetError(ValueError):
    """The corpus is missing, empty or malformed; the message names the file and line."""


def load_corpus(path: str | Path) -> list[dict[str, str]]:
    """The corpus: one JSON object per line with string keys ``prompt`` and ``completion``.

    Raises:
        TrainedTargetError: the file is missing, has no rows, or a line is not such an object (file and line named).
    """
    p = Path(path)
    if not p.is_file():
        raise TrainedTargetError(f"{p}: corpus file not found; pass a JSONL file of {{prompt, completion}} rows")
    rows = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TrainedTargetError(f"{p}:{n}: not JSON ({e.msg})") from e
        if not (isinstance(row, dict) and isinstance(row.get("prompt"), str)
                and isinstance(row.get("completion"), str)):
            raise TrainedTargetError(f"{p}:{n}: expected an object with string keys 'prompt' and 'completion'")
        rows.append({"prompt": row["prompt"], "completion": row["completion"]})
    if not rows:
        raise TrainedTargetError(f"{p}: corpus has no rows")
    return rows


def _chat_ids(tok: Any, row: dict[str, str]) -> list[int]:
    msgs = [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["completion"]}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def train_core(model: Any, seqs: list[list[int]], *, steps: int, seq_len: int = 256, batch: int = 8,
               lr: float = 3e-3, seed: int = 0, max_seconds: float = 1800.0, log=print) -> dict[str, Any]:
    """Train ``model`` (a transformers causal LM, float32, in place) on next-token prediction over ``seqs``.

    Each step takes ``batch`` random windows of ``seq_len`` tokens from the concatenated stream of ``seqs``;
    AdamW (betas 0.9/0.95, weight decay 0.01), linear warmup over 5 % of ``steps`` then cosine decay to 0, gradient
    norm clipped at 1. Stops early after ``max_seconds`` of wall time (a bound, recorded).

    Returns:
        ``{"steps", "steps_planned", "seq_len", "batch", "lr", "loss_first", "loss_last20_mean", "seconds",
        "stream_tokens"}``.

    Raises:
        TrainedTargetError: the stream is shorter than one window.
    """
    import torch

    stream = torch.tensor([t for s in seqs for t in s])
    if len(stream) <= seq_len + 1:
        raise TrainedTargetError(f"corpus has {len(stream)} tokens: fewer than one window of {seq_len}")
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    model.train()
    t0 = time.monotonic()
    losses: list[float] = []
    for step in range(steps):
        starts = torch.randint(0, len(stream) - seq_len - 1, (batch,), generator=g)
        x = torch.stack([stream[s:s + seq_len] for s in starts.tolist()])
        loss = model(input_ids=x, labels=x).loss  # transformers shifts the labels itself
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss))
        if step % 50 == 0 or step == steps - 1:
            log(f"  core step {step:4d}/{steps} loss {float(loss):.3f} ({time.monotonic() - t0:.0f} s)")
        if time.monotonic() - t0 > max_seconds:
            log(f"  core training stopped at step {step + 1}: time bound {max_seconds:.0f} s")
            break
    model.eval()
    tail = losses[-20:]
    return {"steps": len(losses), "steps_planned": steps, "seq_len": seq_len, "batch": batch, "lr": lr,
            "loss_first": round(losses[0], 4), "loss_last20_mean": round(sum(tail) / len(tail), 4),
            "seconds": round(time.monotonic() - t0, 1), "stream_tokens": int(len(stream))}


def deepen(core: Any, layers: int, seed: int = 0) -> tuple[Any, list[int]]:
    """A ``layers``-deep Llama that computes what ``core`` (a ``LlamaForCausalLM``) computes.

    Core layer j goes to position ``round(j * layers / core_layers)``; every other position gets a stand-in layer
    (random weights from transformers' initialisation, ``torch.manual_seed(seed)``, with ``o_proj`` and
    ``down_proj`` zero, so its attention and MLP outputs are zero and the residual passes through unchanged).
    Embeddings, final norm and ``lm_head`` are the core's. Same dtype as ``core``.

    Returns:
        ``(model, core_positions)``.

    Raises:
        ValueError: ``layers`` is smaller than the core's depth.
    """
    import torch
    from transformers import LlamaForCausalLM

    n0 = core.config.num_hidden_layers
    if layers < n0:
        raise ValueError(f"layers={layers}: must be at least the core's {n0}")
    cfg = core.config.__class__.from_dict(core.config.to_dict())
    cfg.num_hidden_layers = layers
    torch.manual_seed(seed)
    deep = LlamaForCausalLM(cfg).to(next(core.parameters()).dtype)
    positions = [round(j * layers / n0) for j in range(n0)]
    with torch.no_grad():
        for i, layer in enumerate(deep.model.layers):
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        for j, p in enumerate(positions):
            deep.model.layers[p].load_state_dict(core.model.layers[j].state_dict())
        deep.model.embed_tokens.load_state_dict(core.model.embed_tokens.state_dict())
        deep.model.norm.load_state_dict(core.model.norm.state_dict())
        deep.lm_head.load_state_dict(core.lm_head.state_dict())
    deep.eval()
    return deep, positions


def build_trained_llama(out_dir: str | Path, corpus: str | Path, *, layers: int = 24, steps: int = 400,
                        seed: int = 0, max_seconds: float = 1800.0, log=print) -> Path:
    """Build the trained, deepened sandbox target into ``out_dir`` (see the module doc) and return that path.

    Writes what :func:`eagle3ops.fixtures.tinymodel.build_tiny_model` writes for kind ``llama`` (bf16 weights, fast
    tokenizer with chat template, generation config) with ``layers`` decoder layers, plus :data:`RECORD`: the corpus's
    sha256 and row count, the training figures of :func:`train_core`, the core positions, and
    ``"stand_in": true``.

    Raises:
        TrainedTargetError: bad corpus (see :func:`load_corpus`).
        FileExistsError: ``out_dir`` exists and is not empty.
    """
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from eagle3ops.fixtures.tinymodel import build_tiny_model

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out}: output directory is not empty; pass a new or empty directory")
    rows = load_corpus(corpus)
    with tempfile.TemporaryDirectory(prefix="e3-core-") as tmp:
        core_dir = build_tiny_model(Path(tmp) / "core", "llama", seed=seed)
        tok = AutoTokenizer.from_pretrained(core_dir)
        core = LlamaForCausalLM.from_pretrained(core_dir, torch_dtype=torch.float32)
        seqs = [_chat_ids(tok, r) for r in rows]
        log(f"training the {core.config.num_hidden_layers}-layer core on {len(rows)} rows "
            f"({sum(map(len, seqs))} tokens), {steps} steps")
        torch.manual_seed(seed)
        figures = train_core(core, seqs, steps=steps, seed=seed, max_seconds=max_seconds, log=log)
        deep, positions = deepen(core.to(torch.bfloat16), layers, seed=seed)
        out.mkdir(parents=True, exist_ok=True)
        deep.config.torch_dtype = "bfloat16"
        deep.save_pretrained(out, safe_serialization=True)
        for f in core_dir.iterdir():
            if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
                shutil.copy(f, out / f.name)
    record = {"kind": "llama-trained", "stand_in": True, "core_layers": core.config.num_hidden_layers,
              "layers": layers, "core_positions": positions, "hidden_size": core.config.hidden_size, "seed": seed,
              "corpus": {"rows": len(rows), "sha256": hashlib.sha256(Path(corpus).read_bytes()).hexdigest()},
              "training": figures}
    (out / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    log(f"wrote {out} ({layers} layers, core at {positions}; loss {figures['loss_first']} -> "
        f"{figures['loss_last20_mean']} in {figures['seconds']} s)")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m eagle3ops_dev.tinytrained OUT --corpus FILE [--layers N] [--steps N] [--seed N]``."""
    p = argparse.ArgumentParser(prog="python -m eagle3ops_dev.tinytrained", description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--corpus", required=True, help="JSONL of {prompt, completion} rows")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seconds", type=float, default=1800.0)
    a = p.parse_args(argv)
    try:
        print(build_trained_llama(a.out, a.corpus, layers=a.layers, steps=a.steps, seed=a.seed,
                                  max_seconds=a.max_seconds))
    except (TrainedTargetError, FileExistsError, ValueError) as e:
        print(f"error: {e}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
