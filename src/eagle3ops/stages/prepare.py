"""Stage ``prepare``: chat files → token ids with loss masks over the assistant turns.

Output, in ``<run_dir>/prepare/``:

- ``samples.jsonl``: one object per kept conversation, in the order extraction will use:
  ``{"i": index, "source": "file:row", "input_ids": [int], "loss_mask": [0|1]}`` (same length, at most
  ``prepare.max_seq_len``);
- ``manifest.json``: counts, tokens, the tokenizer's class and chat template digest, the input files' sha256.

How the masks are made (works for slow, remote-code tokenizers: no offset mapping is needed)
--------------------------------------------------------------------------------------------
speculators 0.3.0 (``data_generation/preprocessing.py``) renders the conversation, finds assistant spans with a
regex guessed from the template and maps them to tokens through ``return_offsets_mapping`` — which only fast
tokenizers have, and its guessed regex (``<|start|>`` lookahead, ``rfind("<")``) is template-specific. Here the
template itself marks the turns: for every assistant turn *k* of a conversation of messages ``m``:

- ``start_k`` = template(``m[:k]``, add_generation_prompt=True): the text right before the reply;
- ``end_k``   = template(``m[:k+1]``): the text through the end of the reply, end-of-turn token included
  (the draft head must learn to predict it);

and the whole conversation ``full`` = template(``m``). The prefix property is checked on text
(``full`` starts with ``start_k`` and with ``end_k``); then each prefix is tokenized on its own and the
reply's tokens are ``[lcp(tok(start_k), tok(full)), lcp(tok(end_k), tok(full)))`` where ``lcp`` is the
length of the common prefix of two id lists. When a tokenizer merges characters across a boundary the merged
token falls to the later side; such boundaries are counted (``boundary_merges``) in the manifest. A template
that breaks the text prefix property (e.g. one that rewrites earlier turns) makes the conversation
*unmaskable*: an error naming it, or a counted skip with ``prepare.on_unmaskable: skip``.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path
from typing import Any

from eagle3ops.pipeline_config import PipelineConfig
from eagle3ops.stages.chatdata import load_conversations, resolve_dataset
from eagle3ops.stages.manifest import atomic_write_text, file_entry, sha256_file, stage_dir, write_manifest

SAMPLES = "samples.jsonl"


class UnmaskableConversation(Exception):
    """The chat template does not keep the prefix property for this conversation; assistant turns can't be found."""


def load_tokenizer(target_model: str) -> Any:
    """The target's tokenizer, ``trust_remote_code=True`` (remote-code and slow tokenizers included).

    Raises:
        ValueError: the tokenizer has no chat template (the message says where to add one).
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_model, trust_remote_code=True)
    if getattr(tok, "chat_template", None) is None:
        raise ValueError(
            f"{target_model}: the tokenizer has no chat template; add `chat_template` to tokenizer_config.json "
            "(or a chat_template.jinja) of the target model"
        )
    return tok


def _render(tok: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str")
    return text


def _encode(tok: Any, text: str) -> list[int]:
    # The template already writes BOS/special tokens as text: no second BOS (same as speculators 0.3.0).
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def encode_conversation(tok: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[int], int]:
    """Token ids of the rendered conversation, its loss mask (1 on assistant replies) and boundary merges.

    Returns:
        ``(input_ids, loss_mask, boundary_merges)``; ``len(input_ids) == len(loss_mask)`` (not truncated).

    Raises:
        UnmaskableConversation: the template breaks the text prefix property, or a reply maps to no token.
    """
    full = _render(tok, messages, False)
    ids = _encode(tok, full)
    mask = [0] * len(ids)
    merges = 0
    for k, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        if k == 0:
            raise UnmaskableConversation("the conversation starts with an assistant turn (no prompt before it)")
        start = _render(tok, messages[:k], True)
        end = _render(tok, messages[: k + 1], False)
        if not full.startswith(start):
            raise UnmaskableConversation(
                f"turn {k}: the template's rendering of turns 0..{k - 1} with the generation prompt is not a "
                "prefix of the whole conversation's rendering"
            )
        if not full.startswith(end):
            raise UnmaskableConversation(
                f"turn {k}: the template's rendering of turns 0..{k} is not a prefix of the whole conversation's"
            )
        start_ids, end_ids = _encode(tok, start), _encode(tok, end)
        a, b = _lcp(start_ids, ids), _lcp(end_ids, ids)
        merges += (a != len(start_ids)) + (b != len(end_ids))
        if b <= a:
            if not msg["content"]:
                continue  # an empty reply has nothing to learn
            raise UnmaskableConversation(f"turn {k}: the reply maps to no token of the conversation")
        for j in range(a, b):
            mask[j] = 1
    return ids, mask, merges


def run_prepare(run_dir: Path, config: PipelineConfig, log: Any = print) -> dict[str, Any]:
    """Run stage ``prepare`` for ``run_dir``; returns the manifest's figures.

    Raises:
        ChatDataError: a dataset file or row is unusable.
        UnmaskableConversation: with ``on_unmaskable: error``, naming the conversation (file:row).
        ValueError: no conversation was kept.
    """
    t0 = time.monotonic()
    out_dir = stage_dir(run_dir, "prepare")
    out_dir.mkdir(parents=True, exist_ok=True)
    pc = config.prepare
    paths = [resolve_dataset(spec, run_dir) for spec in pc.datasets]
    convs = load_conversations(paths)
    no_assistant = [c for c in convs if c["messages"] is None]
    convs = [c for c in convs if c["messages"] is not None]
    if pc.shuffle:
        random.Random(config.seed).shuffle(convs)
    if pc.max_samples is not None:
        convs = convs[: pc.max_samples]
    log(f"prepare: {len(convs)} conversations from {len(paths)} file(s); {len(no_assistant)} without assistant turn")

    tok = load_tokenizer(config.target_model)
    rows: list[str] = []
    unmaskable: list[str] = []
    truncated = empty = merges = tokens = trained = 0
    for conv in convs:
        try:
            ids, mask, m = encode_conversation(tok, conv["messages"])
        except UnmaskableConversation as exc:
            if pc.on_unmaskable == "error":
                raise UnmaskableConversation(
                    f"{conv['source']}: {exc}. The target's chat template does not keep the prefix property, so "
                    "assistant turns cannot be located without offsets. Set `prepare.on_unmaskable: skip` in "
                    "pipeline.yaml to leave such conversations out (they are counted in the manifest), or split "
                    "them into single-reply conversations."
                ) from exc
            unmaskable.append(conv["source"])
            continue
        merges += m
        if len(ids) > pc.max_seq_len:
            ids, mask = ids[: pc.max_seq_len], mask[: pc.max_seq_len]
            truncated += 1
        if sum(mask) == 0:
            empty += 1
            continue
        rows.append(
            json.dumps({"i": len(rows), "source": conv["source"], "input_ids": ids, "loss_mask": mask},
                       separators=(",", ":"))
        )
        tokens += len(ids)
        trained += sum(mask)
    if not rows:
        raise ValueError(f"prepare: no conversation left to train on from {', '.join(map(str, paths))}")
    samples = out_dir / SAMPLES
    atomic_write_text(samples, "\n".join(rows) + "\n")
    template = tok.chat_template if isinstance(tok.chat_template, str) else json.dumps(tok.chat_template)
    figures = {
        "samples": len(rows),
        "tokens": tokens,
        "assistant_tokens": trained,
        "max_seq_len": pc.max_seq_len,
        "skipped": {
            "no_assistant_turn": len(no_assistant),
            "unmaskable": len(unmaskable),
            "no_assistant_token_after_truncation": empty,
        },
        "unmaskable_sources": unmaskable[:50],
        "truncated": truncated,
        "boundary_merges": merges,
        "tokenizer": {
            "class": type(tok).__name__,
            "is_fast": bool(getattr(tok, "is_fast", False)),
            "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest(),
        },
        "datasets": {str(p): sha256_file(p) for p in paths},
        "wall_s": round(time.monotonic() - t0, 3),
    }
    write_manifest(run_dir, "prepare", config, {SAMPLES: file_entry(samples)}, **figures)
    log(f"prepare: wrote {len(rows)} samples, {tokens} tokens ({trained} assistant) in {figures['wall_s']} s")
    return figures


def read_samples(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``<run_dir>/prepare/samples.jsonl`` (call after the manifest checks)."""
    with open(stage_dir(run_dir, "prepare") / SAMPLES, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
