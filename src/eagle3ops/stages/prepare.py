"""Stage ``prepare``: chat files → token ids with loss masks over the assistant turns.

Output, in ``<run_dir>/prepare/``:

- ``samples.jsonl``: one object per kept conversation, in the order extraction will use:
  ``{"i": index, "source": "DATASET:row", "input_ids": [int], "loss_mask": [0|1], "content": [key]}`` (ids and
  mask of the same length, at most ``prepare.max_seq_len``; ``DATASET`` as ``prepare.datasets`` names it —
  ``builtin:sharegpt``, a path as written — not the path this host resolved it to, so the same inputs give the same
  bytes on every host of a fleet; ``content``: the content key of each user turn,
  :func:`eagle3ops.stages.contentsplit.content_key`, by which train holds samples out);
- ``manifest.json``: counts (conversations, assistant turns trained and not trained, by reason; message fields
  the chat template does not render), what was read (``read``: rows, turns per role as written in the files and
  the role each maps to, conversations that open with an assistant turn, files cut off mid-record whose complete
  records were kept under ``prepare.truncated: keep-complete``), ``content_groups`` (the kept samples grouped by
  shared user turns: groups, groups with duplicates, duplicate conversations, examples;
  :meth:`eagle3ops.stages.contentsplit.ContentGroups.record`), tokens, the tokenizer's class and chat template digest, the input files'
  sha256, and under ``generation`` (dataset path → its manifest) the generation manifest of each dataset that has
  one beside it (``<stem>.manifest.json``: written by ``eagle3ops regenerate``, which answered the prompts with the
  target; its settings, endpoint, vLLM version, prompt set sha256 and disjointness record).

Messages reach the chat template with every field it can render (``tool_calls``, ``tool_call_id``, ``name``,
``reasoning_content``/``reasoning``; a row's ``tools`` as the template's ``tools`` argument), as vLLM 0.16 passes
them (see :mod:`eagle3ops.stages.chatdata`). A field the target's template leaves out of the text (rendering
without it gives the same text) is counted per field in ``fields.not_rendered`` and logged as a warning naming the
field; turn fields that are not passed to the template at all are counted in ``fields.not_passed``.

How the masks are made (works for slow, remote-code tokenizers: no offset mapping is needed)
--------------------------------------------------------------------------------------------
speculators 0.3.0 (``data_generation/preprocessing.py``) renders the conversation, finds assistant spans with a
regex guessed from the template and maps them to tokens through ``return_offsets_mapping`` — which only fast
tokenizers have, and its guessed regex (``<|start|>`` lookahead, ``rfind("<")``) is template-specific. Here the
template itself marks the turns: for every assistant turn *k* of a conversation of messages ``m``:

- ``start_k`` = template(``m[:k]``, add_generation_prompt=True): the text right before the reply;
- ``end_k``   = template(``m[:k+1]``): the text through the end of the reply, end-of-turn token included
  (the draft head must learn to predict it); with tool use the reply is whatever the template writes for the
  assistant message: its content, its tool calls (e.g. ``<tool_call>{...}</tool_call>``), its reasoning;

and the whole conversation ``full`` = template(``m``). The prefix property is checked on text
(``full`` starts with ``start_k`` and with ``end_k``); then each prefix is tokenized on its own and the
reply's tokens are ``[lcp(tok(start_k), tok(full)), lcp(tok(end_k), tok(full)))`` where ``lcp`` is the
length of the common prefix of two id lists. When a tokenizer merges characters across a boundary the merged
token falls to the later side; such boundaries are counted (``boundary_merges``) in the manifest. Tool results
(``tool`` messages), user and system turns are context: never trained.

Decisions are made per assistant turn: a turn that cannot be trained gets loss mask 0, the conversation's other
replies are kept, and each case is counted in the manifest's ``turns.not_trained`` under its reason:

- ``no_prompt_before``: the conversation starts with assistant turns (nothing to condition on). They are left
  out of the text (many templates refuse a conversation that starts with the assistant); the rest is kept.
- ``empty_reply``: the template renders the turn as an empty reply (no content, and no tool call or reasoning
  that the template writes): training it would teach the draft head to end the turn at once.
- ``prefix_broken``, ``no_token``, ``template_error`` (*unmaskable* turns): the template breaks the text prefix
  property for this turn (e.g. it rewrites earlier turns, as templates that strip past reasoning do), the reply
  maps to no token, or the template raises on the prefix. With ``prepare.on_unmaskable: error`` (the default)
  the stage stops naming the conversation, the turn and the fix; with ``skip`` the turn is not trained.
- ``truncated``: the reply starts at or after ``prepare.max_seq_len``.

A conversation the template cannot render at all (it raises) is unmaskable as a whole: an error, or with
``skip`` counted in ``skipped.unrenderable``. A conversation left with no trained turn is counted in
``skipped.no_trained_turn`` (or ``skipped.no_assistant_token_after_truncation`` when truncation removed its last
trained token).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3ops.config.pipeline import PipelineConfig
from eagle3ops.stages.chatdata import ReadStats, load_conversations, resolve_dataset
from eagle3ops.stages.contentsplit import content_groups, content_key
from eagle3ops.stages.manifest import atomic_write_text, file_entry, sha256_file, stage_dir, write_manifest

SAMPLES = "samples.jsonl"

#: Why an assistant turn is not trained (keys of the manifest's ``turns.not_trained``).
NOT_TRAINED_REASONS: dict[str, str] = {
    "no_prompt_before": "the conversation starts with it: no prompt comes before it (left out of the text)",
    "empty_reply": "the chat template renders it as an empty reply (no content, no rendered tool call or reasoning)",
    "prefix_broken": "the chat template breaks the prefix property for it",
    "no_token": "the reply maps to no token of the conversation",
    "template_error": "the chat template raises on the conversation up to it",
    "truncated": "it starts at or after prepare.max_seq_len",
}
#: Reasons that mean the template (not the data) keeps the turn from being located: subject to ``on_unmaskable``.
UNMASKABLE_REASONS = frozenset({"prefix_broken", "no_token", "template_error"})
#: Message fields checked for being rendered, by the name reported (``reasoning`` is ``reasoning_content``).
_FIELD_GROUPS: dict[str, tuple[str, ...]] = {
    "tool_calls": ("tool_calls",),
    "tool_call_id": ("tool_call_id",),
    "name": ("name",),
    "reasoning_content": ("reasoning_content", "reasoning"),
}


class UnmaskableConversation(Exception):
    """The chat template keeps an assistant turn (or the whole conversation) from being located in the text."""


@dataclass
class EncodedConversation:
    """One conversation as token ids with its loss mask, and what was decided per assistant turn.

    Turn numbers are indices into the messages given to :func:`encode_conversation`.
    """

    input_ids: list[int]
    loss_mask: list[int]
    boundary_merges: int = 0
    #: ``(turn, first token, end token)`` of each trained reply (loss mask 1 on ``[first, end)``).
    trained: list[tuple[int, int, int]] = field(default_factory=list)
    #: ``(turn, reason, detail)`` of each assistant turn not trained; reason is a key of NOT_TRAINED_REASONS.
    not_trained: list[tuple[int, str, str]] = field(default_factory=list)
    #: field name → messages (``tools``: conversations) whose field the template leaves out of the text.
    not_rendered: dict[str, int] = field(default_factory=dict)


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


def _render(tok: Any, messages: list[dict[str, Any]], generation_prompt: bool,
            tools: list[dict[str, Any]] | None = None) -> str:
    kwargs = {"tools": tools} if tools else {}
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs)
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str")
    return text


def _try_render(tok: Any, messages: list[dict[str, Any]], generation_prompt: bool,
                tools: list[dict[str, Any]] | None) -> str | Exception:
    """The rendering, or the exception the template raised (``raise_exception``, an undefined attribute, ...)."""
    try:
        return _render(tok, messages, generation_prompt, tools)
    except Exception as exc:  # noqa: BLE001 - whatever a template raises, the text cannot be had
        return exc


def _encode(tok: Any, text: str) -> list[int]:
    # The template already writes BOS/special tokens as text: no second BOS (same as speculators 0.3.0).
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _not_rendered(tok: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                  full: str) -> dict[str, int]:
    """Fields whose removal leaves the rendering unchanged: field name → messages carrying it (``tools``: 1)."""
    out: dict[str, int] = {}
    for name, keys in _FIELD_GROUPS.items():
        carrying = sum(1 for m in messages if any(k in m for k in keys))
        if not carrying:
            continue
        stripped = [{k: v for k, v in m.items() if k not in keys} for m in messages]
        if _try_render(tok, stripped, False, tools) == full:
            out[name] = carrying
    if tools and _try_render(tok, messages, False, None) == full:
        out["tools"] = 1
    return out


class _NotTrained(Exception):
    """An assistant turn is not trained; ``reason`` is a key of :data:`NOT_TRAINED_REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or NOT_TRAINED_REASONS[reason])
        self.reason = reason


def _reply_span(tok: Any, body: list[dict[str, Any]], k: int, full: str, ids: list[int],
                tools: list[dict[str, Any]] | None, turn: int) -> tuple[int, int, int]:
    """``(first, end, boundary merges)``: the tokens of the reply of assistant message ``body[k]`` in ``ids``.

    Raises:
        _NotTrained: the turn cannot be located (template error, prefix property broken, no token) or is empty.
    """
    start = _try_render(tok, body[:k], True, tools)
    end = _try_render(tok, body[: k + 1], False, tools)
    for text in (start, end):
        if isinstance(text, Exception):
            raise _NotTrained("template_error", f"the chat template raises on the conversation up to turn {turn} "
                                                f"({type(text).__name__}: {text})")
    if not full.startswith(start):
        raise _NotTrained("prefix_broken", f"the template's rendering of the turns before turn {turn} with the "
                                           "generation prompt is not a prefix of the whole conversation's rendering")
    if not full.startswith(end):
        raise _NotTrained("prefix_broken", f"the template's rendering of the turns through turn {turn} is not a "
                                           "prefix of the whole conversation's rendering")
    if not str(body[k].get("content") or "").strip():
        # No content: trainable only if the template writes something else of it (a tool call, reasoning).
        if _try_render(tok, [*body[:k], {"role": "assistant", "content": ""}], False, tools) == end:
            raise _NotTrained("empty_reply")
    start_ids, end_ids = _encode(tok, start), _encode(tok, end)
    a, b = _lcp(start_ids, ids), _lcp(end_ids, ids)
    if b <= a:
        raise _NotTrained("no_token")
    return a, b, int(a != len(start_ids)) + int(b != len(end_ids))


def encode_conversation(tok: Any, messages: list[dict[str, Any]],
                        tools: list[dict[str, Any]] | None = None) -> EncodedConversation:
    """Token ids of the rendered conversation and its loss mask (1 on the assistant replies that can be trained).

    Decides per assistant turn (see the module doc): trained turns are in ``trained``, the others in
    ``not_trained`` with their reason; unmaskable turns are reported there too, never raised. Not truncated.
    Leading assistant turns (no prompt before them) are left out of the text.

    Raises:
        UnmaskableConversation: the template raises on the whole conversation.
    """
    lead = 0
    while lead < len(messages) and messages[lead]["role"] == "assistant":
        lead += 1
    out = EncodedConversation([], [])
    out.not_trained = [(k, "no_prompt_before", NOT_TRAINED_REASONS["no_prompt_before"]) for k in range(lead)]
    body = messages[lead:]
    if not body:
        return out
    full = _try_render(tok, body, False, tools)
    if isinstance(full, Exception):
        raise UnmaskableConversation(
            f"the chat template fails on the whole conversation ({type(full).__name__}: {full})"
        )
    out.input_ids = _encode(tok, full)
    out.loss_mask = [0] * len(out.input_ids)
    for k, msg in enumerate(body):
        if msg["role"] != "assistant":
            continue
        try:
            a, b, merges = _reply_span(tok, body, k, full, out.input_ids, tools, k + lead)
        except _NotTrained as exc:
            out.not_trained.append((k + lead, exc.reason, str(exc)))
            continue
        out.boundary_merges += merges
        out.loss_mask[a:b] = [1] * (b - a)
        out.trained.append((k + lead, a, b))
    out.not_rendered = _not_rendered(tok, body, tools, full)
    return out


def _warn_fields(log: Any, fields: dict[str, Counter[str]], examples: dict[str, str], target: str) -> None:
    for name, n in sorted(fields["not_rendered"].items()):
        what = "conversation(s) lose their tool definitions" if name == "tools" else f"message(s) lose `{name}`"
        log(f"prepare: warning: the chat template of {target} does not render `{name}`: {n} {what} in the "
            f"training text (first: {examples['not_rendered:' + name]}); an assistant turn left empty by this is "
            "not trained. Use a target whose template renders it, or rewrite such rows into `content`.")
    for name, n in sorted(fields["not_passed"].items()):
        log(f"prepare: warning: message field `{name}` is not passed to the chat template ({n} message(s), first: "
            f"{examples['not_passed:' + name]}); vLLM passes only role, content and "
            "tool_calls/tool_call_id/name/reasoning_content. Move what it holds into `content` if it must be trained.")


WORKERS_ENV = "EAGLE3OPS_PREPARE_PROCS"
#: Below this many conversations one process does the work (a worker pool costs more than it saves).
PARALLEL_MIN_CONVERSATIONS = 256
_WORKER_TOK: Any = None


def prepare_workers(n_conversations: int) -> int:
    """Processes that tokenize: ``$EAGLE3OPS_PREPARE_PROCS`` when set, else ``min(8, CPUs)`` for at least
    :data:`PARALLEL_MIN_CONVERSATIONS` conversations and 1 below.

    The chat template and the tokenizer run in Python per conversation (several renderings and tokenizations
    per assistant turn); with a slow tokenizer such as Kimi-K2.5's tiktoken-backed one this is the stage's cost
    (measured on the tiny Kimi target, 1,000 conversations, 273,900 tokens: ~100k tokens per CPU-second in one
    process; wall 18-54k tokens/s on a shared 2-core machine). Worker processes give identical samples.

    Raises:
        ValueError: ``$EAGLE3OPS_PREPARE_PROCS`` is not a positive integer.
    """
    import os

    raw = os.environ.get(WORKERS_ENV)
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"${WORKERS_ENV}={raw!r}: must be a positive integer (processes for stage prepare)")
        return int(raw)
    if n_conversations < PARALLEL_MIN_CONVERSATIONS:
        return 1
    return max(1, min(8, len(os.sched_getaffinity(0))))


def _encode_one(args: tuple[list[dict[str, Any]], list[dict[str, Any]] | None]) -> Any:
    try:
        return encode_conversation(_WORKER_TOK, *args)
    except UnmaskableConversation as exc:
        return exc


def _encode_all(tok: Any, convs: list[dict[str, Any]], workers: int):
    """:func:`encode_conversation` of each conversation, in order (an ``UnmaskableConversation`` is yielded, not
    raised). ``workers`` > 1: forked worker processes that inherit the loaded tokenizer (no reload), fed in chunks;
    results come back in input order, so the output is identical to one process's."""
    global _WORKER_TOK
    _WORKER_TOK = tok
    args = [(c["messages"], c.get("tools")) for c in convs]
    if workers <= 1:
        yield from map(_encode_one, args)
        return
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield from pool.imap(_encode_one, args, chunksize=max(1, min(64, len(args) // (workers * 8) or 1)))


def generation_manifests(paths: list[Path]) -> dict[str, Any]:
    """Dataset path → the generation manifest beside it (``<stem>.manifest.json``, written by ``eagle3ops
    regenerate``), for the datasets that have one; a manifest that is not JSON is recorded as ``{"error": ...}``."""
    out: dict[str, Any] = {}
    for p in paths:
        m = p.with_name(f"{p.stem}.manifest.json")
        if m.is_file():
            try:
                out[str(p)] = json.loads(m.read_text(encoding="utf-8"))
            except ValueError as exc:
                out[str(p)] = {"error": f"{m}: not JSON ({exc})"}
    return out


def use_chat_template(tok: Any, run_dir: Path, config: PipelineConfig) -> tuple[str, str]:
    """Set the tokenizer's chat template to the one ``prepare.chat_template`` names and return
    (its text, its source in words): a file (relative to ``run_dir``; its ``sha256`` checked when given), else the
    tokenizer's own (``auto`` that no window resolved, or ``tokenizer``).

    Raises:
        ValueError: the file is missing or has another sha256; the message names ``prepare.chat_template``, the
            file and the fix.
    """
    import hashlib

    spec = config.prepare.chat_template
    if isinstance(spec, str):
        own = tok.chat_template if isinstance(tok.chat_template, str) else json.dumps(tok.chat_template)
        return own, ("tokenizer's own" if spec == "tokenizer" else
                     "tokenizer's own (prepare.chat_template: auto; serving's --chat-template, when it has one, is "
                     "resolved by the extract window)")
    path = Path(spec.file) if Path(spec.file).is_absolute() else Path(run_dir) / spec.file
    if not path.is_file():
        raise ValueError(f"prepare.chat_template: {path} is missing: rerun the extract window (it writes the "
                         "template serving uses there), or set `prepare.chat_template: tokenizer` in pipeline.yaml")
    text = path.read_text(encoding="utf-8")
    digest = hashlib.sha256(text.encode()).hexdigest()
    if spec.sha256 and digest != spec.sha256:
        raise ValueError(f"prepare.chat_template: {path} has sha256 {digest}, the config says {spec.sha256}: the "
                         "file changed since it was recorded; rerun the extract window, or fix `sha256`")
    tok.chat_template = text
    return text, f"file {spec.file}" + (f" ({spec.origin})" if spec.origin else "")


@dataclass
class _Read:
    """The conversations to encode (``convs``, after the shuffle and ``max_samples``), the dataset files
    (``paths``), the rows read (``stats``) and those without an assistant turn (``no_assistant``); ``labels``:
    resolved path → the dataset as pipeline.yaml names it."""

    paths: list[Path]
    labels: dict[str, Any]
    stats: ReadStats
    convs: list[dict[str, Any]]
    no_assistant: list[dict[str, Any]]

    def portable(self, source: str) -> str:
        """``source`` (``PATH:row``) with the dataset as pipeline.yaml names it, not where this host keeps the file:
        shards prepared on several hosts (a fleet run's extraction) must write the same bytes to compare equal."""
        path, _, row = source.rpartition(":")
        return f"{self.labels.get(path, path)}:{row}"


def _read(run_dir: Path, config: PipelineConfig, log: Any) -> _Read:
    """Step 1 of :func:`run_prepare`: the datasets' conversations read (a file cut off mid-record warned about),
    shuffled with ``config.seed`` when ``prepare.shuffle``, cut to ``prepare.max_samples``."""
    pc = config.prepare
    paths = [resolve_dataset(spec, run_dir) for spec in pc.datasets]
    read = ReadStats()
    convs = load_conversations(paths, pc.truncated, read)
    for path, cut in read.truncated.items():
        log(f"prepare: warning: {path} is cut off at byte {cut['cut_at_byte']:,}; kept its "
            f"{cut['complete_records']:,} complete records (prepare.truncated: keep-complete)")
    no_assistant = [c for c in convs if c["messages"] is None]
    convs = [c for c in convs if c["messages"] is not None]
    with_assistant = len(convs)
    if pc.shuffle:
        random.Random(config.seed).shuffle(convs)
    if pc.max_samples is not None:
        convs = convs[: pc.max_samples]
    log(f"prepare: {len(convs)} conversations from {len(paths)} file(s) ({read.records} rows: {with_assistant} with "
        f"an assistant turn, {len(no_assistant)} without; {read.opening_with_assistant} open with the assistant"
        + (f"; max_samples {pc.max_samples}" if len(convs) < with_assistant else "") + ")")
    return _Read(paths, {str(p): spec for p, spec in zip(paths, pc.datasets)}, read, convs, no_assistant)


@dataclass
class _Tally:
    """What the encoded conversations came to: the sample rows and every count of the manifest."""

    rows: list[str] = field(default_factory=list)
    unrenderable: list[str] = field(default_factory=list)
    untrained_sources: list[str] = field(default_factory=list)
    not_trained: Counter[str] = field(default_factory=lambda: Counter({r: 0 for r in NOT_TRAINED_REASONS}))
    fields: dict[str, Counter[str]] = field(default_factory=lambda: {
        "kept": Counter(), "not_rendered": Counter(), "not_passed": Counter()})
    examples: dict[str, str] = field(default_factory=dict)
    kept_content: list[list[str]] = field(default_factory=list)
    kept_sources: list[str] = field(default_factory=list)
    truncated: int = 0
    no_trained: int = 0
    empty: int = 0
    merges: int = 0
    tokens: int = 0
    trained: int = 0
    assistant_turns: int = 0
    trained_turns: int = 0

    def fields_of(self, conv: dict[str, Any]) -> None:
        """The message fields ``conv`` holds beside role and content, and those not passed to the template."""
        messages = conv["messages"]
        self.assistant_turns += sum(m["role"] == "assistant" for m in messages)
        self.fields["kept"].update(k for m in messages for k in m if k not in ("role", "content", "reasoning"))
        if conv.get("tools"):
            self.fields["kept"]["tools"] += 1
        for name, n in conv.get("ignored_fields", {}).items():
            self.fields["not_passed"][name] += n
            self.examples.setdefault(f"not_passed:{name}", conv["source"])

    def unrendered(self, conv: dict[str, Any], exc: UnmaskableConversation, on_unmaskable: str) -> None:
        """A conversation the chat template raises on: an error, or (``skip``) all its turns not trained.

        Raises:
            UnmaskableConversation: ``prepare.on_unmaskable: error``, naming the row.
        """
        source = conv["source"]
        if on_unmaskable == "error":
            raise UnmaskableConversation(
                f"{source}: {exc}. Fix or remove that row, or set `prepare.on_unmaskable: skip` in "
                "pipeline.yaml to leave such conversations out (they are counted in the manifest)."
            ) from exc
        self.unrenderable.append(source)
        n_turns = sum(m["role"] == "assistant" for m in conv["messages"])
        self.not_trained["template_error"] += n_turns
        if len(self.untrained_sources) < 50:
            self.untrained_sources.append(f"{source}: all {n_turns} assistant turn(s): template_error")

    def add(self, conv: dict[str, Any], enc: EncodedConversation, pc: Any, portable: str) -> None:
        """An encoded conversation: its turns counted, cut to ``prepare.max_seq_len``, kept as a row unless no
        token is left to train.

        Raises:
            UnmaskableConversation: ``prepare.on_unmaskable: error`` and a turn the template keeps from being
                located, naming the row and the turn.
        """
        source, messages = conv["source"], conv["messages"]
        for name, n in enc.not_rendered.items():
            self.fields["not_rendered"][name] += n
            self.examples.setdefault(f"not_rendered:{name}", source)
        unmaskable = [t for t in enc.not_trained if t[1] in UNMASKABLE_REASONS]
        if unmaskable and pc.on_unmaskable == "error":
            turn, _reason, detail = unmaskable[0]
            raise UnmaskableConversation(
                f"{source}: assistant turn {turn}: {detail}. The target's chat template does not let this turn be "
                "located without offsets. Set `prepare.on_unmaskable: skip` in pipeline.yaml to leave such turns "
                "untrained (loss mask 0; the conversation's other replies are kept and each case is counted in the "
                "manifest), or split the conversation into single-reply conversations."
            )
        ids, mask = enc.input_ids, enc.loss_mask
        turn_reasons = list(enc.not_trained)
        kept_turns = [t for t, a, _b in enc.trained if a < pc.max_seq_len]
        turn_reasons += [(t, "truncated", "") for t, a, _b in enc.trained if a >= pc.max_seq_len]
        for turn, reason, _detail in sorted(turn_reasons):
            self.not_trained[reason] += 1
            if len(self.untrained_sources) < 50:
                self.untrained_sources.append(f"{source} turn {turn}: {reason}")
        self.merges += enc.boundary_merges
        if len(ids) > pc.max_seq_len:
            ids, mask = ids[: pc.max_seq_len], mask[: pc.max_seq_len]
            self.truncated += 1
        self.trained_turns += len(kept_turns)
        if sum(mask) == 0:
            if enc.trained:
                self.empty += 1
            else:
                self.no_trained += 1
            return
        # the user turns' content keys: train holds samples out by content (no held-out sample repeats a
        # trained user turn, whatever its id or position)
        content = [content_key(m["content"]) for m in messages
                   if m["role"] == "user" and isinstance(m.get("content"), str)]
        self.rows.append(json.dumps({"i": len(self.rows), "source": portable, "input_ids": ids, "loss_mask": mask,
                                     "content": content}, separators=(",", ":")))
        self.kept_content.append(content)
        self.kept_sources.append(portable)
        self.tokens += len(ids)
        self.trained += sum(mask)


def _figures(read: _Read, t: _Tally, pc: Any, tok: Any, template: str, template_source: str, workers: int,
             t0: float) -> dict[str, Any]:
    """The manifest's figures (module doc)."""
    figures = {
        "samples": len(t.rows),
        "tokens": t.tokens,
        "assistant_tokens": t.trained,
        "max_seq_len": pc.max_seq_len,
        "skipped": {"no_assistant_turn": len(read.no_assistant), "unrenderable": len(t.unrenderable),
                    "no_trained_turn": t.no_trained, "no_assistant_token_after_truncation": t.empty},
        "unrenderable_sources": t.unrenderable[:50],
        "turns": {"assistant": t.assistant_turns, "trained": t.trained_turns, "not_trained": dict(t.not_trained)},
        "not_trained_turn_sources": t.untrained_sources,
        "fields": {k: dict(sorted(v.items())) for k, v in t.fields.items()},
        "truncated": t.truncated,
        "boundary_merges": t.merges,
        "tokenizer": {"class": type(tok).__name__, "is_fast": bool(getattr(tok, "is_fast", False)),
                      "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest(),
                      "chat_template_source": template_source},
        "read": read.stats.as_manifest(),
        "content_groups": content_groups(t.kept_content, t.kept_sources, keyed=True).record(),
        "datasets": {str(p): sha256_file(p) for p in read.paths},
        "generation": generation_manifests(read.paths),
        "workers": workers,
        "wall_s": round(time.monotonic() - t0, 3),
    }
    figures["tokens_per_s"] = round(t.tokens / figures["wall_s"], 1) if figures["wall_s"] > 0 else None
    return figures


def run_prepare(run_dir: Path, config: PipelineConfig, log: Any = print) -> dict[str, Any]:
    """Run stage ``prepare`` for ``run_dir``; returns the manifest's figures. The steps: the conversations read →
    the tokenizer and the chat template serving uses → each conversation encoded (worker processes) and tallied →
    ``samples.jsonl`` and the manifest written.

    Raises:
        ChatDataError: a dataset file or row is unusable.
        UnmaskableConversation: with ``on_unmaskable: error``, naming the conversation (file:row) and the turn.
        ValueError: no conversation was kept.
    """
    t0 = time.monotonic()
    out_dir = stage_dir(run_dir, "prepare")
    out_dir.mkdir(parents=True, exist_ok=True)
    pc = config.prepare
    read = _read(run_dir, config, log)
    tok = load_tokenizer(config.target_model)
    template, template_source = use_chat_template(tok, run_dir, config)
    log(f"prepare: chat template: {template_source}")
    workers = prepare_workers(len(read.convs))
    tally = _Tally()
    for conv, enc in zip(read.convs, _encode_all(tok, read.convs, workers)):
        tally.fields_of(conv)
        if isinstance(enc, UnmaskableConversation):
            tally.unrendered(conv, enc, pc.on_unmaskable)
        else:
            tally.add(conv, enc, pc, read.portable(conv["source"]))
    if not tally.rows:
        raise ValueError(f"prepare: no conversation left to train on from {', '.join(map(str, read.paths))}")
    _warn_fields(log, tally.fields, tally.examples, config.target_model)
    samples = out_dir / SAMPLES
    atomic_write_text(samples, "\n".join(tally.rows) + "\n")
    figures = _figures(read, tally, pc, tok, template, template_source, workers, t0)
    write_manifest(run_dir, "prepare", config, {SAMPLES: file_entry(samples)}, **figures)
    n_untrained = sum(tally.not_trained.values())
    log(f"prepare: wrote {len(tally.rows)} samples, {tally.tokens} tokens ({tally.trained} assistant) in "
        f"{figures['wall_s']} s ({figures['tokens_per_s']} tokens/s, {workers} process{'es' if workers > 1 else ''}); "
        f"{tally.trained_turns} of {tally.assistant_turns} assistant turns trained"
        + (f", not trained: {', '.join(f'{k} {v}' for k, v in tally.not_trained.items() if v)}"
           if n_untrained else ""))
    return figures


def read_samples(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``<run_dir>/prepare/samples.jsonl`` (call after the manifest checks)."""
    with open(stage_dir(run_dir, "prepare") / SAMPLES, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
