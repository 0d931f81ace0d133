"""Presentation for the driver's terminal: window events as they stream, and a window's summary table (rich).

One place for what people read on the console, used by the CLI and by ``make demo``; it prints and decides nothing.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["err", "print_event", "summary"]

#: Events and errors go to stderr (stdout stays for machine-readable output such as JSON).
err = Console(stderr=True)


def print_event(ev: dict[str, Any]) -> None:
    """One journal event of a window (``{"t", "step", "event", ...}``) as a coloured line: time, step, event,
    the remaining fields as ``key=value``."""
    step, event = ev.get("step"), ev.get("event")
    color = {"ok": "green", "error": "red", "warn": "yellow", "start": "cyan", "done": "bold"}.get(event, "white")
    extra = {k: v for k, v in ev.items() if k not in ("t", "epoch", "step", "event")}
    err.print(f"[{color}]{ev.get('t', '')[11:19]} {step:<12} {event:<6}[/{color}] "
              + " ".join(f"{k}={v}" for k, v in extra.items()))


def summary(result: dict[str, Any]) -> None:
    """A window's ``result.json`` as a table: outcome, message (a no-op window's reasons), error, each stage
    (seconds), downtime, wall time, serving state, release, every warning (whole)."""
    t = Table(title=f"window {result.get('window_id')} ({result.get('kind')})")
    t.add_column("what")
    t.add_column("value")
    t.add_row("outcome", str(result.get("outcome")))
    if result.get("message"):  # a window that had nothing to do says why (each stage's reason)
        t.add_row("message", str(result["message"]))
    if result.get("error"):
        t.add_row("error", str(result["error"]))
    for name, outcome in (result.get("stages") or {}).items():
        secs = (result.get("stage_seconds") or {}).get(name)
        t.add_row(f"stage {name}", f"{outcome}" + (f" ({secs:.1f} s)" if secs is not None else ""))
    if result.get("downtime_s") is not None:
        t.add_row("serving downtime", f"{result['downtime_s']:.1f} s")
    t.add_row("wall time", f"{result.get('wall_s')} s")
    if result.get("serving") == "none":
        t.add_row("serving", str(result.get("serving_note") or "none (serving: none): not stopped, restored or gated"))
    else:
        t.add_row("serving running", str(result.get("serving_running")))
    if "release" in result:
        t.add_row("serving release", str(result.get("release")))
    for w in result.get("warnings") or []:
        t.add_row("warning", w)
    Console().print(t)
