"""Chat data files → normalized conversations (no torch, no tokenizer).

Accepted rows (one conversation each), in JSONL (one JSON object per line) or Parquet:

- ShareGPT form: ``{"conversations": [{"from": "human"|"gpt"|"system", "value": "..."}, ...]}``
- OpenAI form: ``{"messages": [{"role": "user"|"assistant"|"system"|"tool", "content": "...", ...}, ...],
  "tools": [...]}`` (``tools`` optional)

Both normalize to ``[{"role": ..., "content": ..., <template fields>}]`` with roles ``system``, ``user``,
``assistant``, ``tool`` (the names chat templates use). Role names follow speculators 0.3.0's
``_normalize_conversation`` (``human``→user, ``gpt``→assistant), but an unknown role is an error naming file and
row instead of a silently dropped turn.

A message is handed to the chat template the way vLLM 0.16's chat endpoint hands a request's message to it
(``vllm/entrypoints/chat_utils.py``: ``_parse_chat_message_content``, ``_postprocess_messages``), so that the
training text is the text the served target sees and writes:

- ``content``: a string; ``null`` → ``""``; a list of ``{"type": "text", "text": ...}`` parts is joined with
  ``"\n"`` (vLLM's ``string`` content format);
- :data:`TEMPLATE_FIELDS` are kept: ``tool_calls`` (each ``function.arguments`` given as a JSON string is parsed
  to an object, ``null``/``""`` becomes ``{}``, an empty list is dropped), ``tool_call_id``, ``name``, and the
  reasoning text under both of its names, ``reasoning_content`` and ``reasoning``;
- a row's ``tools`` list (or a JSON string holding it) is kept for the template's ``tools`` argument;
- any other message field is not passed to the template (vLLM would not pass it either): it is counted per
  field in the conversation's ``ignored_fields`` (the prepare manifest reports them), never silently lost.

A field whose value is ``null`` counts as absent (Parquet rows carry every column of the file's schema). Parquet
also gives every struct its keys in the order the file's schema has them, which is what ``tojson`` in a template
then writes: keep ``tools`` (and ``function.arguments``) as JSON strings in Parquet files to keep their key order.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

ROLE_MAP = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
}


#: Message fields, besides ``role`` and ``content``, that vLLM 0.16 passes to the chat template; kept here.
TEMPLATE_FIELDS: tuple[str, ...] = ("tool_calls", "tool_call_id", "name", "reasoning_content", "reasoning")
#: Keys that hold a turn's role and content in one of the two forms (mapped to ``role``/``content``).
_ROLE_CONTENT_KEYS = frozenset({"from", "value", "role", "content"})


class ChatDataError(Exception):
    """A chat file or row is unusable; the message names the file, the row and the fix."""


def resolve_dataset(spec: str, run_dir: Path) -> Path:
    """Path of a dataset named in ``prepare.datasets``: ``builtin:NAME`` or a path (relative: to ``run_dir``).

    Raises:
        ChatDataError: unknown builtin name or missing file.
    """
    if spec.startswith("builtin:"):
        name = spec.removeprefix("builtin:")
        path = Path(str(resources.files("eagle3ops.data").joinpath(f"chat_{name}.jsonl")))
        if not path.is_file():
            raise ChatDataError(
                f"prepare.datasets: unknown builtin dataset `{spec}` (have builtin:sharegpt, builtin:messages)"
            )
        return path
    path = Path(spec)
    if not path.is_absolute():
        path = Path(run_dir) / path
    if not path.is_file():
        raise ChatDataError(f"prepare.datasets: file {path} (from `{spec}`) not found")
    return path


def decode_line(raw: bytes, path: Path | str, lineno: int, offset: int) -> str:
    """One line of a text data file (JSONL, ...) as UTF-8, or a :class:`ChatDataError` saying where it is not.

    Args:
        raw: the line's bytes; ``lineno``: its 1-based number; ``offset``: the file offset of its first byte.

    Raises:
        ChatDataError: ``FILE:LINE: not UTF-8: byte 0xNN at byte B of the line (file offset O)`` and the fix; never a
            bare :class:`UnicodeDecodeError` (which names neither file nor line).
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = " ".join(f"0x{b:02x}" for b in raw[exc.start:exc.end])
        raise ChatDataError(
            f"{path}:{lineno}: not UTF-8: byte {bad} at byte {exc.start} of the line (file offset "
            f"{offset + exc.start}; {exc.reason}); fix: convert the file to UTF-8 (e.g. `iconv -f LATIN1 -t UTF-8`), "
            f"or remove that row"
        ) from None


def _read_rows(path: Path) -> Iterator[tuple[int, Any]]:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        with open(path, "rb") as f:
            offset = 0
            for lineno, raw in enumerate(f, 1):
                line = decode_line(raw, path, lineno, offset)
                offset += len(raw)
                if not line.strip():
                    continue
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ChatDataError(
                        f"{path}:{lineno}: not valid JSON ({exc.msg}); JSONL needs one object per line"
                    ) from exc
    elif suffix == ".parquet":
        import pyarrow.parquet as pq  # lazy: only needed for Parquet

        table = pq.read_table(path)
        for i, row in enumerate(table.to_pylist()):
            yield i, row
    else:
        raise ChatDataError(f"{path}: unsupported file type `{suffix}`; use .jsonl or .parquet")


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, list):  # OpenAI content parts, joined as vLLM's `string` content format does
        parts = []
        for part in value:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            else:
                raise ChatDataError(f"{where}: only text content parts are supported, got {part!r:.80}")
        return "\n".join(parts)
    raise ChatDataError(f"{where}: content must be a string, got {type(value).__name__}")


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]] | None:
    """OpenAI ``tool_calls`` as vLLM 0.16 hands them to the template (arguments as objects); ``None`` if empty."""
    if not isinstance(value, list):
        raise ChatDataError(
            f"{where}: `tool_calls` must be a list of {{\"type\": \"function\", \"function\": {{\"name\", "
            f"\"arguments\"}}}} objects (OpenAI form), got {type(value).__name__}"
        )
    if not value:
        return None  # vLLM drops an empty list: the template takes its plain assistant path
    calls = []
    for j, call in enumerate(value):
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise ChatDataError(
                f"{where}: tool_calls[{j}] needs a `function` object with `name` and `arguments` (OpenAI form), "
                f"got {call!r:.80}"
            )
        function = {k: v for k, v in call["function"].items() if v is not None}
        arguments = function.get("arguments")
        if not arguments:
            function["arguments"] = {}
        elif isinstance(arguments, str):
            try:
                function["arguments"] = json.loads(arguments)
            except json.JSONDecodeError as exc:
                raise ChatDataError(
                    f"{where}: tool_calls[{j}].function.arguments is not valid JSON ({exc.msg}); the OpenAI form "
                    "writes the arguments as a JSON object (or a string holding one)"
                ) from exc
        calls.append({**{k: v for k, v in call.items() if v is not None}, "function": function})
    return calls


def _template_fields(turn: dict[str, Any], where: str) -> dict[str, Any]:
    """The :data:`TEMPLATE_FIELDS` of one turn, normalized as vLLM 0.16 does."""
    out: dict[str, Any] = {}
    if turn.get("tool_calls") is not None:
        calls = _tool_calls(turn["tool_calls"], where)
        if calls is not None:
            out["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        value = turn.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise ChatDataError(f"{where}: `{key}` must be a string, got {type(value).__name__}")
            out[key] = value
    reasoning = {k: turn[k] for k in ("reasoning_content", "reasoning") if turn.get(k) is not None}
    if reasoning:
        texts = {_content(v, f"{where}: `{k}`") for k, v in reasoning.items()}
        if len(texts) > 1:
            raise ChatDataError(
                f"{where}: `reasoning_content` and `reasoning` differ; they are two names of one field "
                "(vLLM passes both to the template with the same text): keep one of them"
            )
        out["reasoning_content"] = out["reasoning"] = texts.pop()
    return out


def normalize_row(row: Any, where: str, ignored: Counter[str] | None = None) -> list[dict[str, Any]]:
    """One row (ShareGPT or OpenAI form) → messages ``[{"role", "content", <template fields>}]``.

    Every field the chat template can render is kept (:data:`TEMPLATE_FIELDS`, see the module doc). Other
    non-null turn fields are left out and, when ``ignored`` is given, counted there per field name.

    Raises:
        ChatDataError: neither ``conversations`` nor ``messages``, a turn without role/content, an unknown role,
            a malformed ``tool_calls`` (arguments that are not JSON) or a non-string ``name``/``tool_call_id``.
    """
    if not isinstance(row, dict):
        raise ChatDataError(f"{where}: a row must be an object with `conversations` or `messages`")
    turns = row.get("conversations")
    if turns is None:
        turns = row.get("messages")
    if not isinstance(turns, list):
        raise ChatDataError(
            f"{where}: no `conversations` (ShareGPT form) or `messages` (OpenAI form) list; keys are {sorted(row)}"
        )
    out = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise ChatDataError(f"{where}: turn {i} is not an object")
        raw_role = turn.get("from", turn.get("role"))
        if raw_role is None:
            raise ChatDataError(f"{where}: turn {i} has neither `from` nor `role`")
        role = ROLE_MAP.get(str(raw_role).lower())
        if role is None:
            raise ChatDataError(
                f"{where}: turn {i} has unknown role `{raw_role}` (known: {', '.join(sorted(ROLE_MAP))})"
            )
        value = turn.get("value") if turn.get("value") is not None else turn.get("content")
        content = _content(value, f"{where}: turn {i}")
        out.append({"role": role, "content": content, **_template_fields(turn, f"{where}: turn {i}")})
        if ignored is not None:
            ignored.update(
                k for k, v in turn.items() if v is not None and k not in _ROLE_CONTENT_KEYS and k not in TEMPLATE_FIELDS
            )
    return out


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def row_tools(row: Any, where: str) -> list[dict[str, Any]] | None:
    """The row's ``tools`` (OpenAI form: tool definitions for the template's ``tools`` argument), or ``None``.

    ``tools`` may be a list or a JSON string holding one (as many datasets store it). Keys whose value is null
    are dropped at every depth: a Parquet file gives each definition every key any definition of the file has.

    Raises:
        ChatDataError: ``tools`` is not a list of objects (or a JSON string holding one).
    """
    tools = row.get("tools") if isinstance(row, dict) else None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise ChatDataError(f"{where}: `tools` is a string but not valid JSON ({exc.msg})") from exc
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ChatDataError(
            f"{where}: `tools` must be a list of tool definitions (objects, OpenAI form), got {tools!r:.80}"
        )
    return _drop_nulls(tools)


def load_conversations(paths: list[Path]) -> list[dict[str, Any]]:
    """All conversations of ``paths`` in file order.

    Each entry is ``{"source": "file:row", "messages": [...], "tools": [...] | None, "ignored_fields": {name: n}}``
    (``ignored_fields``: turn fields not passed to the template, per name). Conversations without an assistant turn
    are kept out (nothing to train on): their entries have ``"messages": None`` and a ``"reason"``, so callers can
    count them.
    """
    out: list[dict[str, Any]] = []
    for path in paths:
        for rowno, row in _read_rows(path):
            where = f"{path}:{rowno}"
            ignored: Counter[str] = Counter()
            messages = normalize_row(row, where, ignored)
            if not any(m["role"] == "assistant" for m in messages):
                out.append({"source": where, "messages": None, "reason": "no assistant turn"})
                continue
            out.append({"source": where, "messages": messages, "tools": row_tools(row, where),
                        "ignored_fields": dict(ignored)})
    return out
