"""Regenerate a chat dataset's assistant turns with the target itself, through the host's LIVE serving endpoint.

EAGLE heads learn best on the target's own answers: SpecForge (``scripts/regenerate_train_data.py``) and
speculators (``data_generation``'s response regeneration) both send each conversation's prompts to the served
target and train on what it answers. Here the driver does that against production serving, without a window: no
downtime, and at most ``serving.regenerate_concurrency`` requests in flight (default 4) so production keeps its
latency.

Per conversation (an :class:`Item`): its system and user turns, in order; each user turn is sent through
``POST /v1/chat/completions`` with the conversation so far (earlier user turns and the target's own earlier
answers) and the answer becomes the next assistant turn. Settings: ``model``, ``temperature`` (default 0: greedy,
deterministic), ``max_tokens``, ``seed`` (vLLM's per-request seed), per-request timeout; transient failures
(connection errors, timeouts, HTTP 429 and 5xx) are retried with tenacity (``attempts`` in all, exponential
back-off); any other answer (e.g. 400: prompt longer than the server's ``max_model_len``) fails the item at once.

Resume: every finished item (answered or failed) is appended to ``answers.jsonl`` as it finishes, keyed by the
item's id, the sha256 of its prompt turns and :meth:`GenSettings.key` (the settings that change an answer:
model, temperature, max_tokens, seed). A rerun skips the items already answered with the same key and retries the
failed ones; a changed setting changes the key, so nothing answered before is reused.

Outputs, in ``out_dir``: ``answers.jsonl`` (the resume log), ``dataset.jsonl`` (OpenAI ``messages`` rows, one per
answered item, in the items' order: what stage ``prepare`` reads) and ``dataset.manifest.json`` (the generation
settings, endpoint, vLLM version from ``/version``, the prompt set's sha256, counts, timings and, for HumanEval
prompts, the disjointness record against the gate's split). Stage ``prepare`` copies a dataset's
``<stem>.manifest.json`` into its own manifest (``generation``).

How the host's serving is reached (its API key, a direct URL, an SSH forward or a relay on the host), the upload
of the result and :func:`~eagle3ops.speculate.reach.regenerate_for_host` live in :mod:`eagle3ops.speculate.reach`;
this module is the pure part (settings, items, resume log, plan) and the HTTP client with its retries.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from eagle3ops.serving_http import auth_headers
from eagle3ops.speculate.prompts import Prompt

__all__ = ["ANSWERS", "DATASET", "HOST_FOLDER", "MANIFEST", "ForwardRefused", "GenSettings", "Item",
           "RegenerateError", "RegeneratePlan", "RowSource", "answer_item", "auth_headers", "chat_request",
           "items_from_dataset", "items_from_prompts", "plan", "prompt_set_sha256", "read_answers",
           "regenerate", "settings_for", "split_held_out", "vllm_version"]

ANSWERS = "answers.jsonl"
DATASET = "dataset.jsonl"
MANIFEST = "dataset.manifest.json"
#: Folder of the run directory the dataset is uploaded to; name it in ``prepare.datasets`` as
#: ``regenerated/dataset.jsonl``.
HOST_FOLDER = "regenerated"

#: Why an assistant turn the target answered is not written (keys of the manifest's ``skipped_turns``).
SKIP_REASONS = {
    "cut_in_reasoning": "max_tokens ran out inside the reasoning: no reply (content null) after the thinking",
    "empty_reply": "the answer has no content (null or blank)",
}
#: What ``reasoning`` (the plan's setting) does with the thinking a reasoning parser returns.
REASONING_MODES = ("strip", "keep")
#: Why the default is ``strip``: recorded in the manifest (``reasoning.mode_why``).
REASONING_DEFAULT_WHY = (
    "default: the driver cannot read the served chat template; templates of reasoning models (Qwen3, DeepSeek-R1) "
    "drop the thinking of earlier assistant turns when they render a conversation, so the training text has none"
)


class RegenerateError(RuntimeError):
    """Regeneration cannot start or finish (endpoint unreachable, bad input); the message names what and the fix."""


class ForwardRefused(RegenerateError):
    """The driver does not reach serving and the host's sshd refuses an SSH port-forward to it."""


#: A producer of resume-log rows: ``(items to answer, on_row)`` → the vLLM version it saw (or None); it calls
#: ``on_row(row)`` once per item as the item finishes (rows as :func:`answer_item` returns them).
RowSource = Callable[[list["Item"], Callable[[dict[str, Any]], None]], "str | None"]


@dataclass(frozen=True)
class GenSettings:
    """How the target is asked. ``max_tokens``: per answer; ``request_timeout_s``: seconds per HTTP request;
    ``attempts``: tries per request (transient errors only); ``concurrency``: requests in flight at most."""

    model: str
    max_tokens: int
    temperature: float = 0.0
    seed: int = 0
    concurrency: int = 4
    request_timeout_s: float = 300.0
    attempts: int = 3

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.concurrency < 1 or self.attempts < 1 or self.request_timeout_s <= 0:
            raise RegenerateError(f"generation settings {self}: max_tokens, concurrency, attempts and "
                                  "request_timeout_s must be positive")
        if self.temperature < 0:
            raise RegenerateError(f"temperature {self.temperature}: must be >= 0 (0 = greedy)")

    def answer_settings(self) -> dict[str, Any]:
        """The settings that change an answer (the resume key is made of these)."""
        return {"model": self.model, "temperature": self.temperature, "max_tokens": self.max_tokens,
                "seed": self.seed}

    def key(self) -> str:
        """sha256 (hex, 16 chars) of :meth:`answer_settings` as canonical JSON."""
        return hashlib.sha256(json.dumps(self.answer_settings(), sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Item:
    """One conversation to answer: a stable ``id`` and its turns in order: ``system``/``user`` messages and
    ``("assistant", "")`` where the target answers (it also answers after a last ``user`` turn)."""

    id: str
    turns: tuple[tuple[str, str], ...]  # (role, content)

    def prompt_sha256(self) -> str:
        """sha256 (hex) of the prompt turns as canonical JSON."""
        return hashlib.sha256(json.dumps(self.turns).encode()).hexdigest()


def items_from_prompts(prompts: Sequence[Prompt]) -> list[Item]:
    """One single-turn item per prompt (e.g. HumanEval's): the prompt text as the user turn."""
    return [Item(p.id, (("user", p.text),)) for p in prompts]


def items_from_dataset(paths: Sequence[Path | str], *, truncated: str = "error", max_turns: int | None = None
                       ) -> tuple[list[Item], dict[str, int]]:
    """Items from chat files (the forms stage ``prepare`` reads: :mod:`eagle3ops.stages.chatdata`; a path or a
    ``builtin:NAME`` such as ``builtin:sharegpt-v3``); the id is ``<file name>:<row>``.

    Multi-turn: each assistant turn of the conversation becomes a place the target answers, in turn, given the
    conversation so far with its own earlier answers (as speculators and SpecForge regenerate multi-turn data);
    the written assistant texts are never sent. Leading assistant turns (no user turn before them) and an
    assistant turn right after another are not asked (counted: ``leading_assistant_turns``,
    ``consecutive_assistant_turns``); with ``max_turns`` the conversation ends after that many answers (the rest
    counted in ``turns_beyond_max_turns``).

    Conversations with tool use (``tool`` turns or ``tool_calls``) cannot be regenerated without running the
    tools: they are left out and counted (``tool_use``), as are rows without a user turn (``no_user_turn``).

    Returns:
        (items, counts of rows and turns left out by reason).

    Raises:
        eagle3ops.stages.chatdata.ChatDataError: a file or row is unusable (names file and row), or a file is cut
            off mid-record and ``truncated`` is not ``keep-complete``.
    """
    from eagle3ops.stages.chatdata import load_conversations, resolve_dataset

    files = [resolve_dataset(str(p), Path.cwd()) if str(p).startswith("builtin:") else Path(p) for p in paths]
    names = {str(f): f.name for f in files}
    items: list[Item] = []
    left_out = {"tool_use": 0, "no_user_turn": 0, "leading_assistant_turns": 0, "consecutive_assistant_turns": 0,
                "turns_beyond_max_turns": 0}
    for conv in load_conversations(files, truncated):  # type: ignore[arg-type]
        msgs = conv["messages"] or []
        if any(m["role"] == "tool" or m.get("tool_calls") for m in msgs) or conv.get("tools"):
            left_out["tool_use"] += 1
            continue
        turns: list[tuple[str, str]] = []
        answers = 0
        has_user = False
        for m in msgs:
            if m["role"] in ("system", "user"):
                turns.append((m["role"], m["content"]))
                has_user = has_user or m["role"] == "user"
            elif m["role"] == "assistant":
                if not has_user:
                    left_out["leading_assistant_turns"] += 1
                elif turns[-1][0] == "assistant":
                    left_out["consecutive_assistant_turns"] += 1
                elif max_turns is not None and answers >= max_turns:
                    left_out["turns_beyond_max_turns"] += 1
                else:
                    turns.append(("assistant", ""))  # the target answers here
                    answers += 1
        if max_turns is not None and answers >= max_turns:
            last = max(i for i, (r, _) in enumerate(turns) if r == "assistant")
            turns = turns[: last + 1]
        if not has_user:
            left_out["no_user_turn"] += 1
            continue
        path, _, row = conv["source"].rpartition(":")
        items.append(Item(f"{names.get(path) or Path(path).name}:{row}", tuple(turns)))
    return items, left_out


def split_held_out(items: Sequence[Item], fraction: float, salt: str = "eagle3ops-heldout"
                   ) -> tuple[list[Item], list[Item], dict[str, Any]]:
    """``(train, held_out, record)``, held out by content: conversations sharing any normalized user turn (at any
    position, under any id) are one group, which falls on one side by a salted hash of its canonical key
    (:mod:`eagle3ops.stages.contentsplit`; stable whatever the order), so no held-out prompt equals a trained user
    turn. Both sides keep the items' order. The record: ``held_out_fraction``, ``salt``, ``held_out_ids``,
    ``content`` (groups and duplicates counted) and ``disjointness`` (:func:`eagle3ops.speculate.prompts.disjointness`).

    Raises:
        eagle3ops.speculate.prompts.GatePromptsError: ``fraction`` not in (0, 1) or a side left empty.
    """
    from eagle3ops.speculate import prompts as pr
    from eagle3ops.stages import contentsplit as cs

    if not 0.0 < fraction < 1.0:
        raise pr.GatePromptsError(f"held-out fraction {fraction}: must be between 0 and 1")
    groups = cs.content_groups([[c for r, c in i.turns if r == "user"] for i in items], [i.id for i in items])
    held_at = cs.held_out_groups(groups, fraction, salt)
    train = [i for n, i in enumerate(items) if n not in held_at]
    held = [i for n, i in enumerate(items) if n in held_at]
    if not train or not held:
        raise pr.GatePromptsError(f"held-out split of {len(items)} conversations ({len(groups.members())} groups by "
                                  f"content) at {fraction} left a side empty")
    users = [(i.id, [c for r, c in i.turns if r == "user"]) for i in held]
    held_p = [pr.Prompt(f"{id_}#{k}", c) for id_, turns in users for k, c in enumerate(turns)]  # each turn: ID#k
    record = pr.disjointness(held_p, [c for i in train for r, c in i.turns if r == "user"])
    return train, held, {"held_out_fraction": fraction, "salt": salt, "split": "by content group",
                         "held_out_ids": [i.id for i in held], "content": groups.record(), "disjointness": record}


def prompt_set_sha256(items: Sequence[Item]) -> str:
    """sha256 (hex) of the items' ids and prompt hashes, sorted: names the prompt set whatever its order."""
    return hashlib.sha256("".join(sorted(f"{i.id}\0{i.prompt_sha256()}\n" for i in items)).encode()).hexdigest()


def _row_key(item_id: str, prompt_sha: str, key: str) -> tuple[str, str, str]:
    return item_id, prompt_sha, key


def read_answers(path: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Finished rows of a resume log: (id, prompt sha256, settings key) → the last answered (or ``skipped``: no
    answer with content) row. Failed rows and a torn last line (the driver died mid-write) are ignored."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    if not path.is_file():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and (row.get("messages") or row.get("skipped")) and not row.get("error"):
            out[_row_key(row["id"], row["prompt_sha256"], row["key"])] = row
    return out


@dataclass(frozen=True)
class RegeneratePlan:
    """What a run will do (pure value; ``--dry-run`` prints it): every item, the ones already answered with the
    same settings (skipped) and the ones to send."""

    settings: GenSettings
    items: list[Item]
    done: list[str]
    todo: list[Item]
    out_dir: Path
    prompt_set_sha256: str
    #: What the dataset keeps of a reasoning parser's thinking: ``strip`` (the default, see
    #: :data:`REASONING_DEFAULT_WHY`) or ``keep`` (as ``reasoning_content``).
    reasoning: str = "strip"
    reasoning_why: str = REASONING_DEFAULT_WHY
    #: No conversation is started after this many seconds (see :func:`regenerate`); None: no bound.
    time_budget_s: float | None = None

    def describe(self) -> str:
        """Human-readable lines."""
        s = self.settings
        return (f"regenerate {len(self.items)} conversations (prompt set sha256 {self.prompt_set_sha256[:12]}): "
                f"{len(self.done)} already answered with the same settings (skipped), {len(self.todo)} to send\n"
                f"  model {s.model}, temperature {s.temperature}, max_tokens {s.max_tokens}, seed {s.seed}, "
                f"concurrency {s.concurrency}, timeout {s.request_timeout_s:g} s, attempts {s.attempts}\n"
                f"  output: {self.out_dir / DATASET} (resume log {self.out_dir / ANSWERS})")

    def as_dict(self) -> dict[str, Any]:
        """The plan as a JSON-ready value (``regenerate --dry-run --json``): the counts, the ids still to send,
        the generation settings, the local output folder, the prompt set's sha256 and what is kept of reasoning."""
        return {"conversations": len(self.items), "already_answered": len(self.done),
                "to_send": [i.id for i in self.todo], "settings": asdict(self.settings),
                "out_dir": str(self.out_dir), "prompt_set_sha256": self.prompt_set_sha256,
                "reasoning": self.reasoning, "time_budget_s": self.time_budget_s}


def plan(items: Sequence[Item], settings: GenSettings, out_dir: Path, reasoning: str | None = None,
         time_budget_s: float | None = None) -> RegeneratePlan:
    """The plan for ``items`` given the resume log in ``out_dir`` (read only). ``reasoning``: ``strip`` or
    ``keep`` (None: ``strip``, the default recorded with :data:`REASONING_DEFAULT_WHY`); it changes only what the
    dataset keeps, not what is asked, so it is not part of the resume key.

    Raises:
        RegenerateError: no items, two items share an id (the resume key would mix them up), or an unknown
            ``reasoning`` mode.
    """
    if reasoning is not None and reasoning not in REASONING_MODES:
        raise RegenerateError(f"reasoning `{reasoning}`: must be one of {', '.join(REASONING_MODES)}")
    if not items:
        raise RegenerateError("nothing to regenerate: no conversation with a user turn")
    ids = [i.id for i in items]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise RegenerateError(f"item ids repeat ({', '.join(dup[:5])}): each conversation needs its own id")
    answered = read_answers(Path(out_dir) / ANSWERS)
    key = settings.key()
    done = [i.id for i in items if _row_key(i.id, i.prompt_sha256(), key) in answered]
    todo = [i for i in items if _row_key(i.id, i.prompt_sha256(), key) not in answered]
    why = "set by --reasoning" if reasoning else REASONING_DEFAULT_WHY
    return RegeneratePlan(settings, list(items), done, todo, Path(out_dir), prompt_set_sha256(items),
                          reasoning or "strip", why, time_budget_s)


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):  # connect/read errors and timeouts
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code == 429 or exc.response.status_code >= 500
    return False


def chat_request(settings: GenSettings, messages: list[dict[str, str]]) -> dict[str, Any]:
    """The ``/v1/chat/completions`` body for one turn (pure)."""
    return {"model": settings.model, "messages": messages, "max_tokens": settings.max_tokens,
            "temperature": settings.temperature, "seed": settings.seed, "stream": False}


def _post(client: httpx.Client, base_url: str, body: dict[str, Any], settings: GenSettings,
          attempts_used: list[int]) -> dict[str, Any]:
    for attempt in Retrying(stop=stop_after_attempt(settings.attempts), reraise=True,
                            wait=wait_exponential(multiplier=0.5, max=10), retry=retry_if_exception(_transient)):
        with attempt:
            attempts_used[0] += 1
            r = client.post(f"{base_url}/v1/chat/completions", json=body, timeout=settings.request_timeout_s)
            r.raise_for_status()
            return r.json()
    raise AssertionError("unreachable")  # pragma: no cover - Retrying reraises


def _reply(choice: dict[str, Any]) -> tuple[str, str | None]:
    """(content, reasoning) of an answer; vLLM 0.16 with a reasoning parser returns the thinking in ``reasoning``
    (``reasoning_content`` in earlier releases) and ``content: null`` when nothing follows it."""
    msg = choice["message"]
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, str):
        raise TypeError(f"reasoning is {type(reasoning).__name__}, expected a string")
    return msg.get("content") or "", reasoning or None


def answer_item(client: httpx.Client, base_url: str, settings: GenSettings, item: Item) -> dict[str, Any]:
    """Answer one item turn by turn; returns its resume-log row (``messages`` on success, ``error`` on failure,
    never raised). The row carries ``completion_tokens``, ``finish_reasons``, ``attempts`` and ``seconds``.

    An assistant message keeps the server's reasoning under ``reasoning_content`` (the name stage prepare passes
    to the chat template); :func:`regenerate` strips or keeps it when it writes the dataset. An answer with no
    content is never written: the conversation ends before the user turn it answered (``stopped``: turn and
    reason, a key of :data:`SKIP_REASONS`), and when no answer is left the row says ``skipped`` (the reason)
    instead of ``messages``.
    """
    t0 = time.monotonic()
    messages: list[dict[str, Any]] = []
    tokens = 0
    finish: list[str | None] = []
    attempts = [0]
    row: dict[str, Any] = {"id": item.id, "prompt_sha256": item.prompt_sha256(), "key": settings.key()}
    try:
        for n, (role, content) in enumerate(item.turns):
            if role != "assistant":
                messages.append({"role": role, "content": content})
            # the target answers at each assistant place, and after a last user turn (a single prompt)
            if role == "system" or (role == "user" and n + 1 < len(item.turns)) or messages[-1]["role"] != "user":
                continue
            out = _post(client, base_url, chat_request(settings, messages), settings, attempts)
            choice = out["choices"][0]
            text, reasoning = _reply(choice)
            tokens += int((out.get("usage") or {}).get("completion_tokens") or 0)
            finish.append(choice.get("finish_reason"))
            if not text.strip():
                reason = "cut_in_reasoning" if reasoning and finish[-1] == "length" else "empty_reply"
                row["stopped"] = {"turn": len(messages), "reason": reason, "reasoning": bool(reasoning)}
                messages = messages[: max(i for i, m in enumerate(messages) if m["role"] == "user")]
                while messages and messages[-1]["role"] != "assistant":
                    messages.pop()
                break
            answer = {"role": "assistant", "content": text}
            if reasoning:
                answer["reasoning_content"] = reasoning
            messages.append(answer)
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        detail = exc.response.text[:300] if isinstance(exc, httpx.HTTPStatusError) else ""
        row["error"] = f"{type(exc).__name__}: {exc}" + (f" ({detail})" if detail else "")
    else:
        if messages:
            row["messages"] = messages
        else:
            row["skipped"] = row["stopped"]["reason"]
    row.update(completion_tokens=tokens, finish_reasons=finish, attempts=attempts[0],
               seconds=round(time.monotonic() - t0, 3))
    return row


def dataset_messages(messages: list[dict[str, Any]], reasoning: str) -> list[dict[str, Any]]:
    """The messages written to the dataset: ``reasoning_content`` dropped (``strip``) or kept (``keep``)."""
    if reasoning == "keep":
        return messages
    return [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]


def vllm_version(base_url: str, api_key: str | None = None, transport: httpx.BaseTransport | None = None
                 ) -> str | None:
    """The server's ``GET /version`` answer (vLLM: ``{"version": ...}``), or None when it does not answer."""
    try:
        with httpx.Client(headers=auth_headers(api_key), timeout=10, transport=transport) as c:
            r = c.get(f"{base_url}/version")
            r.raise_for_status()
            return str(r.json().get("version"))
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def regenerate(p: RegeneratePlan, base_url: str | None, *, api_key: str | None = None, endpoint: str | None = None,
               extra_manifest: dict[str, Any] | None = None, progress: bool = True,
               transport: httpx.BaseTransport | None = None, rows_from: RowSource | None = None,
               time_budget_s: float | None = None) -> dict[str, Any]:
    """Carry out plan ``p`` against the OpenAI-compatible server at ``base_url`` (see the module doc).

    Args:
        api_key: sent as ``Authorization: Bearer``; never written anywhere.
        endpoint: how the server was reached, for the manifest (default ``base_url``).
        extra_manifest: more manifest fields (e.g. the HumanEval disjointness record).
        progress: a rich progress bar on stderr.
        transport: an httpx transport (tests use ``httpx.MockTransport``).
        rows_from: answer the items elsewhere (:func:`eagle3ops.speculate.reach.host_relay`: on the host) instead
            of from here through ``base_url`` (then None).
        time_budget_s: no conversation is started after this many seconds (those started finish); the ones not
            started are counted in ``not_started_time_budget`` and a rerun answers them. Applies to the requests
            sent from here (not to ``rows_from``).

    Returns:
        The manifest written to ``<out_dir>/dataset.manifest.json`` (``failed`` > 0: some items were not answered
        after their attempts; they are left out of the dataset and a rerun retries them).
    """
    p.out_dir.mkdir(parents=True, exist_ok=True)
    budget = p.time_budget_s if time_budget_s is None else time_budget_s
    t0 = time.monotonic()
    tally = _answer_todo(p, base_url, api_key=api_key, transport=transport, rows_from=rows_from, budget=budget,
                         progress=progress, t0=t0)
    manifest = _write_dataset(p, tally, time.monotonic() - t0, base_url, api_key=api_key, endpoint=endpoint,
                              transport=transport, budget=budget, extra_manifest=extra_manifest)
    (p.out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


@dataclass
class _Tally:
    """What this run did: conversations ``answered`` and ``failed`` (with their ``errors``, ``id: error``),
    completion ``tokens`` received, ``not_started`` (past the time budget), and the ``version`` of vLLM the host's
    relay reported (None: asked of ``base_url`` later)."""

    answered: int = 0
    failed: int = 0
    tokens: int = 0
    not_started: int = 0
    errors: list[str] = field(default_factory=list)
    version: str | None = None

    def add(self, row: dict[str, Any]) -> None:
        """One answered (or failed, or skipped) conversation's row counted."""
        if row.get("error"):
            self.failed += 1
            self.errors.append(f"{row['id']}: {row['error']}")
        elif row.get("skipped"):
            self.tokens += row["completion_tokens"]
        else:
            self.answered += 1
            self.tokens += row["completion_tokens"]


def _answer_todo(p: RegeneratePlan, base_url: str | None, *, api_key: str | None,
                 transport: httpx.BaseTransport | None, rows_from: RowSource | None, budget: float | None,
                 progress: bool, t0: float) -> _Tally:
    """Answer ``p.todo``: from here through ``base_url`` (``settings.concurrency`` at once; none started past
    ``budget`` seconds after ``t0``, a monotonic time), or through ``rows_from``; each row appended to the resume log
    (``<out_dir>/answers.jsonl``) as it comes, with a progress bar on stderr when ``progress``."""
    s = p.settings
    tally, lock = _Tally(), threading.Lock()
    limits = httpx.Limits(max_connections=s.concurrency, max_keepalive_connections=s.concurrency)
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(httpx.Client(headers=auth_headers(api_key), limits=limits, transport=transport))
        log = stack.enter_context(open(p.out_dir / ANSWERS, "a", encoding="utf-8"))
        bar = task = None
        if progress and p.todo:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            bar = stack.enter_context(Progress(TextColumn("regenerate"), BarColumn(), MofNCompleteColumn(),
                                               TextColumn("{task.fields[tokens]} tokens"), TimeRemainingColumn(),
                                               console=Console(stderr=True), transient=False))
            task = bar.add_task("regenerate", total=len(p.todo), tokens=0)

        def on_row(row: dict[str, Any]) -> None:
            with lock:
                log.write(json.dumps(row, ensure_ascii=False) + "\n")
                log.flush()
                tally.add(row)
                if bar is not None:
                    bar.update(task, advance=1, tokens=tally.tokens)

        if rows_from is not None:
            tally.version = rows_from(p.todo, on_row) if p.todo else None
            return tally
        deadline = None if budget is None else t0 + budget

        def work(item: Item) -> dict[str, Any] | None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            return answer_item(client, base_url, s, item)

        pool = stack.enter_context(ThreadPoolExecutor(max_workers=s.concurrency))
        for fut in as_completed([pool.submit(work, item) for item in p.todo]):
            row = fut.result()
            if row is None:
                tally.not_started += 1
            else:
                on_row(row)
    return tally


def _write_dataset(p: RegeneratePlan, tally: _Tally, wall: float, base_url: str | None, *, api_key: str | None,
                   endpoint: str | None, transport: httpx.BaseTransport | None, budget: float | None,
                   extra_manifest: dict[str, Any] | None) -> dict[str, Any]:
    """Write ``<out_dir>/dataset.jsonl`` from every conversation of the plan answered so far (this run's and
    earlier ones', from the resume log) and return its manifest: the settings, the server, what was answered,
    skipped and cut, the reasoning kept, this run's figures (``wall`` seconds) and the dataset's sha256."""
    s, out_dir = p.settings, p.out_dir
    rows = read_answers(out_dir / ANSWERS)
    key = s.key()
    finished = [rows[k] for i in p.items if (k := _row_key(i.id, i.prompt_sha256(), key)) in rows]
    dataset = [{"id": r["id"], "messages": dataset_messages(r["messages"], p.reasoning)} for r in finished
               if r.get("messages")]
    total_tokens = sum(r["completion_tokens"] for r in finished)
    skipped_turns = Counter(r["stopped"]["reason"] for r in finished if r.get("stopped"))
    finish_reasons = Counter(str(f) for r in finished for f in r.get("finish_reasons", []))
    kept_reasoning = sum(1 for r in finished for m in r.get("messages", []) if m.get("reasoning_content"))
    with_reasoning = kept_reasoning + sum(1 for r in finished if (r.get("stopped") or {}).get("reasoning"))
    (out_dir / DATASET).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in dataset),
                                   encoding="utf-8")
    tokens = tally.tokens
    return {
        "kind": "regenerated-answers",
        "settings": {**asdict(s), "key": key},
        "endpoint": endpoint or base_url,
        "vllm_version": tally.version or (vllm_version(base_url, api_key, transport) if base_url else None),
        "prompt_set_sha256": p.prompt_set_sha256,
        "conversations": len(p.items),
        "answered": len(dataset),
        "skipped_conversations": sum(1 for r in finished if r.get("skipped")),
        "skipped_turns": dict(sorted(skipped_turns.items())),
        "skipped_turn_reasons": SKIP_REASONS,
        "finish_reasons": dict(sorted(finish_reasons.items())),
        "reasoning": {"mode": p.reasoning, "mode_why": p.reasoning_why, "replies_with_reasoning": with_reasoning,
                      "written_with_reasoning": kept_reasoning if p.reasoning == "keep" else 0,
                      "cut_in_reasoning": skipped_turns.get("cut_in_reasoning", 0)},
        "skipped_already_answered": len(p.done),
        "not_started_time_budget": tally.not_started,
        "time_budget_s": budget,
        "answered_now": tally.answered,
        "failed": tally.failed,
        "errors": tally.errors[:20],
        "completion_tokens": total_tokens,
        "completion_tokens_now": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s_now": round(tokens / wall, 2) if wall > 0 and tokens else None,
        "dataset_sha256": hashlib.sha256((out_dir / DATASET).read_bytes()).hexdigest(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **(extra_manifest or {}),
    }


def settings_for(h: Any, *, max_tokens: int | None = None, temperature: float = 0.0, seed: int = 0,
                 concurrency: int | None = None, request_timeout_s: float | None = None) -> GenSettings:
    """Generation settings for host ``h``: the served model name, and the inventory's ``serving.regenerate_*``
    keys unless overridden."""
    s = h.serving
    return GenSettings(model=s.served_model_name, max_tokens=max_tokens or s.regenerate_max_tokens,
                       temperature=temperature, seed=seed, concurrency=concurrency or s.regenerate_concurrency,
                       request_timeout_s=request_timeout_s or s.regenerate_timeout_s)
