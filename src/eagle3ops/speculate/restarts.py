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

__all__ = ["NEWEST", "ORDERS", "RestartPlan", "design_for", "parse_results", "recorded_restart_seconds", "restart_plan",
           "restarts_for"]

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


#: Each design's order of restarts and measured blocks, as the plan prints it (``a``: the baseline's passes per
#: block, ``n``: the speculative release's; :func:`eagle3ops.gate.decide.block_passes`).
ORDERS = {"ab": "measure the live baseline x {a}, restart into the speculative release, measure it x {n}; keep: "
                "stays; reject: restart back to the baseline",
          "aba": "restart the baseline, measure it x {a}, restart into the speculative release, measure it x {n}, "
                 "restart back to the baseline, measure it again x {a}; reject: stays on the baseline; keep: "
                 "restart into the speculative release again"}


def design_for(requested: str, candidates: int = 0) -> str:
    """The design a job runs (pure): ``requested`` (``serving.gate_design``), except that several candidates are
    measured ``ab`` (each against the one baseline)."""
    return "ab" if candidates > 1 else requested


def restarts_for(design: str, *, control: bool = False, candidates: int = 0) -> tuple[int, int]:
    """``(keep, rollback)``: the serving restarts of each path of a speculate job (pure).

    ``ab``: the switch (keep 1), and the switch back (rollback 2); a control release first adds one to both, and
    each of several candidates one more. ``aba``: the baseline restarted for its first block, the switch, the
    return to the baseline for its second block (rollback 3: serving is on the baseline already), the switch into
    the kept release again (keep 4); with a control release the first and third restarts are switches to the
    control release and a rejection returns to the live release (4 either way)."""
    if design == "aba":
        return 4, 3 + (1 if control else 0)
    extra = (1 if control else 0) + (candidates if candidates > 1 else 0)
    return 1 + extra, 2 + extra


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
        design: the order of the passes (``aba`` or ``ab``: :data:`ORDERS`).
        block_passes: passes of the baseline's block(s) and the speculative release's: ``(before, n, after)``.
    """

    keep: int
    rollback: int
    per_restart_s: float | None
    worst_s: float | None
    recorded: int
    bound_s: float
    design: str = "ab"
    block_passes: tuple[int, int, int] | None = None

    def downtime_s(self, restarts: int) -> float | None:
        """Expected downtime of ``restarts`` restarts (None: nothing recorded)."""
        return None if self.per_restart_s is None else round(restarts * self.per_restart_s, 1)

    def figures(self) -> dict[str, Any]:
        """JSON-ready figures (for the result and the dry run)."""
        return {"restarts_keep": self.keep, "restarts_rollback": self.rollback,
                "expected_downtime_keep_s": self.downtime_s(self.keep),
                "expected_downtime_rollback_s": self.downtime_s(self.rollback),
                "per_restart_s": self.per_restart_s, "worst_restart_s": self.worst_s,
                "recorded_restarts": self.recorded, "restart_bound_s": self.bound_s, "design": self.design,
                "block_passes": list(self.block_passes) if self.block_passes else None}

    def lines(self) -> list[str]:
        """What the plan prints: the design and its order, then the restarts on each path and the downtime to
        expect."""
        return [*self._design_lines(), *self._restart_lines()]

    def _design_lines(self) -> list[str]:
        if self.block_passes is None:
            return []
        a, n, _ = self.block_passes
        order = ORDERS[self.design].format(a=a, n=n)
        if self.design == "aba":
            return [f"gate design aba: {order} (a drift of the host's speed linear in time and a restarted server's "
                    "own speed cancel)"]
        return [f"gate design ab: {order}; a shift of the host's speed between the blocks and a restarted server's "
                "own speed are not measured (the result says so; serving.gate_design: aba measures the baseline "
                "before and after)"]

    def _restart_lines(self) -> list[str]:
        if self.per_restart_s is None:
            each = (f"no serving restart recorded on this host yet: each is bounded by the health gate's "
                    f"{self.bound_s:.0f} s")
            return [f"serving restarts: {self.keep} if kept, {self.rollback} if rolled back; {each} "
                    f"(at most {self.keep * self.bound_s:.0f} s / {self.rollback * self.bound_s:.0f} s of downtime)"]
        return [f"serving restarts: {self.keep} if kept, {self.rollback} if rolled back; expected downtime "
                f"{self.downtime_s(self.keep):.0f} s if kept, {self.downtime_s(self.rollback):.0f} s if rolled back "
                f"(median restart {self.per_restart_s:.1f} s, longest {self.worst_s:.1f} s, from this host's "
                f"{self.recorded} recorded restart{'s' if self.recorded != 1 else ''})"]


def restart_plan(recorded_s: list[float], *, bound_s: float, keep: int = 1, rollback: int = 2, design: str = "ab",
                 block_passes: tuple[int, int, int] | None = None) -> RestartPlan:
    """The :class:`RestartPlan` of a speculate job from this host's recorded restarts (seconds, any order).

    ``keep``/``rollback``: restarts on each path (:func:`restarts_for`); ``design``/``block_passes``: the order
    of the passes the plan prints (None: not printed).
    """
    if not recorded_s:
        return RestartPlan(keep, rollback, None, None, 0, bound_s, design, block_passes)
    return RestartPlan(keep, rollback, round(statistics.median(recorded_s), 1), round(max(recorded_s), 1),
                       len(recorded_s), bound_s, design, block_passes)
