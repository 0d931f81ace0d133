"""Chat data files → normalized conversations (no torch, no tokenizer).

Accepted rows (one conversation each), in JSONL (one JSON object per line) or Parquet:

- ShareGPT form: ``{"conversations": [{"from": "human"|"gpt"|"system", "value": "..."}, ...]}``
- OpenAI form: ``{"messages": [{"role": "user"|"assistant"|"system"|"tool", "content": "..."}, ...]}``

Both normalize to ``[{"role": ..., "content": ...}]`` with roles ``system``, ``user``, ``assistant``, ``tool``
(the names chat templates use). Role names follow speculators 0.3.0's ``_normalize_conversation``
(``human``→user, ``gpt``→assistant), but an unknown role is an error naming file and row instead of a silently
dropped turn, and OpenAI ``content`` given as a list of ``{"type": "text", "text": ...}`` parts is joined.
"""

from __future__ import annotations

import json
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


def _read_rows(path: Path) -> Iterator[tuple[int, Any]]:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
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
    if isinstance(value, list):  # OpenAI content parts
        parts = []
        for part in value:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            else:
                raise ChatDataError(f"{where}: only text content parts are supported, got {part!r:.80}")
        return "".join(parts)
    raise ChatDataError(f"{where}: content must be a string, got {type(value).__name__}")


def normalize_row(row: Any, where: str) -> list[dict[str, str]]:
    """One row (ShareGPT or OpenAI form) → ``[{"role", "content"}]``.

    Raises:
        ChatDataError: neither ``conversations`` nor ``messages``, a turn without role/content, an unknown role.
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
        content = _content(turn.get("value", turn.get("content")), f"{where}: turn {i}")
        out.append({"role": role, "content": content})
    return out


def load_conversations(paths: list[Path]) -> list[dict[str, Any]]:
    """All conversations of ``paths`` in file order: ``{"source": "file:row", "messages": [...]}``.

    Conversations without an assistant turn are kept out (nothing to train on) — callers count them via the
    returned ``skipped`` entries: rows with ``"messages": None`` and a ``"reason"``.
    """
    out: list[dict[str, Any]] = []
    for path in paths:
        for rowno, row in _read_rows(path):
            where = f"{path}:{rowno}"
            messages = normalize_row(row, where)
            if not any(m["role"] == "assistant" for m in messages):
                out.append({"source": where, "messages": None, "reason": "no assistant turn"})
                continue
            out.append({"source": where, "messages": messages})
    return out
