"""How many serving restarts a ``speculate`` job makes and the downtime to expect, from this host's recorded restore
times (pure; the plan and ``--dry-run`` print it).

Every serving restart of a job (a window's restore, a release's switch, a rollback) is recorded by the supervisor
in the window's ``result.json`` as ``restarts_s`` (seconds from the restart's start to its passed health gate, one
per restart). Results written before that field existed give one figure for a window: ``downtime_s`` less its
``stage_seconds`` (the stop and the restore; an overestimate of the restore alone). The expected downtime of one
restart is the median of the newest :data:`NEWEST` figures; with none recorded, the health gate's limit bounds it
(said so).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any

__all__ = ["NEWEST", "RestartPlan", "parse_results", "recorded_restart_seconds", "restart_plan"]

#: How many of the newest recorded restarts the estimate uses.
NEWEST = 20


def parse_results(text: str) -> list[dict[str, Any]]:
    """Split concatenated ``result.json`` documents (:func:`eagle3ops.commands.host.window_results`' output); a
    document that is not JSON (cut by a crash) ends the reading of the rest."""
    dec, out, i = json.JSONDecoder(), [], 0
    text = text.strip()
    while i < len(text):
        try:
            doc, end = dec.raw_decode(text, i)
        except ValueError:
            break
        if isinstance(doc, dict):
            out.append(doc)
        i = end
        while i < len(text) and text[i].isspace():
            i += 1
    return out


def recorded_restart_seconds(results: list[dict[str, Any]], newest: int = NEWEST) -> list[float]:
    """Seconds of each recorded serving restart, newest windows last (by ``window_id``, which sorts by time), at
    most ``newest``. Results without ``restarts_s`` give ``downtime_s - sum(stage_seconds)`` when positive."""
    figures: list[float] = []
    for res in sorted(results, key=lambda r: str(r.get("window_id", ""))):
        if isinstance(res.get("restarts_s"), list):
            figures += [float(x) for x in res["restarts_s"] if isinstance(x, (int, float)) and x >= 0]
        elif isinstance(res.get("downtime_s"), (int, float)):
            rest = float(res["downtime_s"]) - sum(float(v) for v in (res.get("stage_seconds") or {}).values()
                                                  if isinstance(v, (int, float)))
            if rest > 0:
                figures.append(rest)
    return figures[-newest:]


@dataclass(frozen=True)
class RestartPlan:
    """Serving restarts of a speculate job and the downtime to expect (seconds).

    Attributes:
        keep: restarts when the speculative release is kept (the switch to it).
        rollback: restarts when it is rolled back (the switch to it, then back to the baseline release).
        per_restart_s: median of the recorded restarts (None: none recorded on this host).
        worst_s: the longest recorded restart (None: none recorded).
        recorded: how many recorded restarts the figures come from.
        bound_s: each restart's health gate limit (``serving.health_timeout_s``): the bound when none is recorded.
    """

    keep: int
    rollback: int
    per_restart_s: float | None
    worst_s: float | None
    recorded: int
    bound_s: float

    def downtime_s(self, restarts: int) -> float | None:
        """Expected downtime of ``restarts`` restarts (None: nothing recorded)."""
        return None if self.per_restart_s is None else round(restarts * self.per_restart_s, 1)

    def figures(self) -> dict[str, Any]:
        """JSON-ready figures (for the result and the dry run)."""
        return {"restarts_keep": self.keep, "restarts_rollback": self.rollback,
                "expected_downtime_keep_s": self.downtime_s(self.keep),
                "expected_downtime_rollback_s": self.downtime_s(self.rollback),
                "per_restart_s": self.per_restart_s, "worst_restart_s": self.worst_s,
                "recorded_restarts": self.recorded, "restart_bound_s": self.bound_s}

    def lines(self) -> list[str]:
        """What the plan prints: the restarts on each path and the downtime to expect."""
        if self.per_restart_s is None:
            each = (f"no serving restart recorded on this host yet: each is bounded by the health gate's "
                    f"{self.bound_s:.0f} s")
            return [f"serving restarts: {self.keep} if kept, {self.rollback} if rolled back; {each} "
                    f"(at most {self.keep * self.bound_s:.0f} s / {self.rollback * self.bound_s:.0f} s of downtime)"]
        return [f"serving restarts: {self.keep} if kept, {self.rollback} if rolled back; expected downtime "
                f"{self.downtime_s(self.keep):.0f} s if kept, {self.downtime_s(self.rollback):.0f} s if rolled back "
                f"(median restart {self.per_restart_s:.1f} s, longest {self.worst_s:.1f} s, from this host's "
                f"{self.recorded} recorded restart{'s' if self.recorded != 1 else ''})"]


def restart_plan(recorded_s: list[float], *, bound_s: float, keep: int = 1, rollback: int = 2) -> RestartPlan:
    """The :class:`RestartPlan` of a speculate job from this host's recorded restarts (seconds, any order).

    ``keep``/``rollback``: restarts on each path (a speculate job: the switch to the speculative release; and the
    switch back to the baseline release).
    """
    if not recorded_s:
        return RestartPlan(keep, rollback, None, None, 0, bound_s)
    return RestartPlan(keep, rollback, round(statistics.median(recorded_s), 1), round(max(recorded_s), 1),
                       len(recorded_s), bound_s)
