"""The window's journal: append-only JSON lines, fsynced, reopened after a restart (``windows/<id>/journal.jsonl``)."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from eagle3ops import redact


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Journal:
    """Append-only JSON-lines journal of a window (``journal.jsonl``); safe to reopen after a restart.

    Every entry is written (and printed: the supervisor's log) with its secrets masked by the one redaction rule
    (:func:`eagle3ops.redact.value`, with ``secret_env``: the inventory's names), and kept so in :attr:`entries`."""

    def __init__(self, path: Path, secret_env: list[str] | tuple[str, ...] = ()):
        self.path = path
        self.secret_env = tuple(secret_env)
        self.entries: list[dict[str, Any]] = []
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    self.entries.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut by a crash

    def log(self, step: str, event: str, **data: Any) -> None:
        """Append ``{"t", "epoch", "step", "event", **data}`` (secrets masked) and fsync."""
        entry = {"t": _now(), "epoch": time.time(), "step": step, "event": event,
                 **redact.value(data, self.secret_env)}
        self.entries.append(entry)
        with self.path.open("a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())
        print(json.dumps(entry), flush=True)

    def last(self, step: str) -> dict[str, Any] | None:
        """The newest entry of ``step``, or None."""
        for e in reversed(self.entries):
            if e["step"] == step:
                return e
        return None

    def first(self, step: str, event: str) -> dict[str, Any] | None:
        """The oldest entry of ``step`` with ``event``, or None."""
        return next((e for e in self.entries if e["step"] == step and e["event"] == event), None)

    def first_after(self, entry: dict[str, Any] | None, step: str, event: str) -> dict[str, Any] | None:
        """The oldest entry of ``step`` with ``event`` written after ``entry`` (None: after nothing, i.e. any)."""
        start = next((i for i, e in enumerate(self.entries) if e is entry), -1) + 1 if entry is not None else 0
        return next((e for e in self.entries[start:] if e["step"] == step and e["event"] == event), None)

    def done(self, step: str) -> bool:
        """True when ``step``'s newest entry is a successful end (``event == "ok"``)."""
        e = self.last(step)
        return bool(e and e["event"] == "ok")

    def first_epoch(self) -> float:
        """Start time of the window (epoch seconds), surviving restarts."""
        return self.entries[0]["epoch"] if self.entries else time.time()


#: Journal steps that restart serving (each ``start`` to its ``ok`` is one restart, its health gate included;
#: ``control``: a speculate job's switch to its control release; ``candidate-<name>``: to one of its candidates;
#: the three-block gate's ``restart-baseline`` (the baseline restarted for its first block), ``control-again`` (the
#: control release for the baseline's second block) and ``keep-switch`` (the kept release served again)).
RESTART_STEPS = ("restore", "control", "switch", "rollback", "restart-baseline", "control-again", "keep-switch")
#: Prefix of a speculate job's candidate switch steps (:data:`RESTART_STEPS` too).
CANDIDATE_STEP = "candidate-"


def is_restart_step(step: str) -> bool:
    """Whether journal step ``step`` restarts serving (:data:`RESTART_STEPS`, or a candidate's switch)."""
    return step in RESTART_STEPS or step.startswith(CANDIDATE_STEP)


def restart_seconds(entries: list[dict[str, Any]]) -> list[float]:
    """Seconds of each serving restart in a journal (pure): every ``start`` of a :data:`RESTART_STEPS` step to the
    next ``ok`` of the same step (a restart that failed its gate is not a restart time)."""
    out: list[float] = []
    begun: dict[str, float] = {}
    for e in entries:
        if not is_restart_step(str(e.get("step", ""))):
            continue
        if e.get("event") == "start":
            begun[e["step"]] = e["epoch"]
        elif e.get("event") in ("ok", "error") and e["step"] in begun:
            t = begun.pop(e["step"])
            if e["event"] == "ok":
                out.append(round(e["epoch"] - t, 1))
    return out


#: Journal step of the Docker engine's outages: ``down`` (``during``: the step it ended or held up) and ``back``.
ENGINE_STEP = "engine"


def engine_outages(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Docker engine's outages in a journal (pure), in order: each ``engine``/``down`` entry to the next
    ``engine``/``back`` as ``{"step": the window step it ended or held up, "down_at": ISO time, "seconds": length
    (None while no ``back`` follows)}``. A supervisor that waited the engine out journals both; one the restarting
    daemon stopped journals ``down`` and its restarted self ``back``, so ``seconds`` spans the daemon's restart."""
    out: list[dict[str, Any]] = []
    down: dict[str, Any] | None = None
    for e in entries:
        if e.get("step") != ENGINE_STEP:
            continue
        if e.get("event") == "down" and down is None:
            down = e
        elif e.get("event") == "back" and down is not None:
            out.append({"step": down.get("during"), "down_at": down.get("t"),
                        "seconds": round(e["epoch"] - down["epoch"], 1)})
            down = None
    if down is not None:
        out.append({"step": down.get("during"), "down_at": down.get("t"), "seconds": None})
    return out


def _tail(path: Path, size: int = 65536) -> str:
    """The last ``size`` bytes of a file as text ('' when it cannot be read)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
