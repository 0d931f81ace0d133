"""Presentation for the driver's terminal: window events as they stream, and a window's summary table (rich).

One place for what people read on the console, used by the CLI and by ``make demo``; it prints and decides nothing.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from eagle3ops import redact

__all__ = ["answer_lines", "err", "print_event", "speculate_result", "summary"]

#: Events and errors go to stderr (stdout stays for machine-readable output such as JSON).
err = Console(stderr=True)


def print_event(ev: dict[str, Any]) -> None:
    """One journal event of a window (``{"t", "step", "event", ...}``) as a coloured line: time, step, event,
    the remaining fields as ``key=value``; event ``say`` prints its ``message`` alone; secrets masked
    (:func:`eagle3ops.redact.value`: a journal written by an older version may hold them)."""
    ev = redact.value(ev)
    step, event = ev.get("step"), ev.get("event")
    if event == "say":  # a sentence the driver says before anything stops (``rollback``'s target and why)
        err.print(f"[bold]{escape(str(ev.get('message', '')))}[/bold]", soft_wrap=True)  # one line: scripts read it
        return
    color = {"ok": "green", "error": "red", "warn": "yellow", "start": "cyan", "done": "bold"}.get(event, "white")
    extra = {k: v for k, v in ev.items() if k not in ("t", "epoch", "step", "event")}
    err.print(f"[{color}]{ev.get('t', '')[11:19]} {step:<12} {event:<6}[/{color}] "
              + " ".join(f"{k}={v}" for k, v in extra.items()))


def summary(result: dict[str, Any]) -> None:
    """A window's ``result.json`` as a table: outcome (with its ``outcome_note``), message (a no-op window's reasons),
    error, each stage (seconds), downtime, each Docker engine outage (the step it ended, seconds), wall time, serving
    state, release, every warning (whole); secrets masked."""
    result = redact.value(result)
    t = Table(title=f"window {result.get('window_id')} ({result.get('kind')})")
    t.add_column("what")
    t.add_column("value")
    note = result.get("outcome_note")  # e.g. serving started from outside during the stages: not a plain ok
    t.add_row("outcome", f"{result.get('outcome')} ({note})" if note else str(result.get("outcome")))
    if result.get("message"):  # a window that had nothing to do says why (each stage's reason)
        t.add_row("message", str(result["message"]))
    if result.get("error"):
        t.add_row("error", str(result["error"]))
    for name, outcome in (result.get("stages") or {}).items():
        secs = (result.get("stage_seconds") or {}).get(name)
        t.add_row(f"stage {name}", f"{outcome}" + (f" ({secs:.1f} s)" if secs is not None else ""))
    if result.get("downtime_s") is not None:
        t.add_row("serving downtime", f"{result['downtime_s']:.1f} s")
    for o in result.get("engine_outages") or []:  # the Docker engine went away (a daemon restart) and came back
        secs = o.get("seconds")
        t.add_row("engine outage", f"during {o.get('step')}: " + ("not back" if secs is None else f"{secs:.1f} s"))
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


def speculate_result(console: Console, res: dict[str, Any]) -> None:
    """A speculate job's result (``speculate``'s answer: verdict, per-level figures, interval, drift, acceptance,
    per-set tables, one row per candidate, what each measured release ran) as lines on ``console``."""
    from eagle3ops.gate.like import ReleaseIdentity

    sd = res.get("spec_decode") or {}
    console.print(f"[bold]{res['verdict']}[/bold]: {res['reason']}")
    for c, lv in (res.get("levels") or {}).items():
        console.print(f"  concurrency {c}: baseline {lv['baseline']['output_tokens_per_s']} tok/s, speculative "
                      f"{(lv.get('speculative') or {}).get('output_tokens_per_s')} tok/s "
                      f"(x{lv.get('throughput_ratio')}); passes (tok/s): baseline "
                      f"{[p['output_tokens_per_s'] for p in lv['baseline'].get('passes', [])]}, speculative "
                      f"{[p['output_tokens_per_s'] for p in (lv.get('speculative') or {}).get('passes', [])]}")
    if res.get("interval"):
        iv = res["interval"]
        console.print(f"  {iv['level']:.0%} interval of the ratio x{iv['low']} to x{iv['high']} (point x{iv['point']},"
                      f" {iv['baseline_passes']} + {iv['speculative_passes']} passes x {iv['prompts']} prompts; "
                      f"{iv.get('method', 'bootstrap')})")
    if res.get("drift"):
        dr = res["drift"]
        console.print(f"  baseline drift: {dr['not_made']}" if dr.get("not_made") else
                      f"  baseline drift {dr['change']} (interval {dr['low']} to {dr['high']}, limit ±{dr['limit']})")
    if (res.get("design") or {}).get("block_shift_measured") is False:
        console.print(f"  not measured: {res['design']['risk']}")
    if res.get("power"):
        pwr = res["power"]
        console.print(f"  planned power {pwr['power']:.0%} at x{pwr['true_ratio']} ({pwr['passes']} passes, pass CV "
                      f"{pwr['pass_cv']:.1%}" + (", accepted below the target)" if pwr.get("accepted_low_power")
                                                 else ")"))
    for line in answer_lines(res):
        console.print(f"  {escape(line)}")
    if sd:  # absent when no speculative release was measured as a whole (e.g. no candidate cleared the gate)
        console.print(f"  mean acceptance length {sd.get('mean_acceptance_length')}, per position "
                      f"{sd.get('acceptance_per_position')}")
    console.print(f"  live release {res.get('live_release')}")
    for name, table in (res.get("sets") or {}).items():
        if "error" in table:
            console.print(f"  set {name} ({table['prompts']} prompts): {table['error']}")
            continue
        for c, row in table["levels"].items():
            iv = row.get("interval")
            console.print(f"  set {name} ({table['prompts']} prompts), concurrency {c}: baseline "
                          f"{row['baseline_tokens_per_s']} tok/s, speculative {row['speculative_tokens_per_s']} tok/s "
                          f"(x{row['throughput_ratio']}" + (f", 90 % interval x{iv['low']} to x{iv['high']}" if iv
                                                           else "") + f"), TTFT x{row['ttft_ratio']}")
    cands = res.get("candidates") or {}
    for row in cands.get("rows", []):
        iv = row.get("interval") or {}
        acc = (row.get("spec_decode") or {}).get("mean_acceptance_length")
        console.print(f"  candidate {row['name']}{' (chosen)' if row['name'] == cands.get('winner') else ''}: "
                      f"{row['verdict']}, x{row.get('throughput_ratio')}"
                      + (f", {iv['level']:.1%} interval x{iv['low']} to x{iv['high']}" if iv else "")
                      + (f", acceptance {acc:.3f}" if acc else "") + f" ({row['reason']})")
    for side, rel in (res.get("measured_releases") or {}).items():
        what = "control release" if side == "baseline" and res.get("control") else side
        console.print(f"  {side} measured: {what}, {ReleaseIdentity.from_dict(rel).describe()}")


def answer_lines(res: dict[str, Any]) -> list[str]:
    """One line per level of a gate result's ``answer_agreement`` (:func:`eagle3ops.gate.answers.answer_agreement`):
    how many greedy answers the measured release shares with the baseline, the first differing prompts and the
    baseline's agreement with itself; none for a result without it (one recorded before answers were kept)."""
    out = []
    for c, row in (res.get("answer_agreement") or {}).items():
        if "not_recorded" in row:
            out.append(f"greedy answers not compared at concurrency {c}: {row['not_recorded']}")
            continue
        line = f"greedy answers identical to the baseline's: {row['identical']}/{row['prompts']} at concurrency {c}"
        notes = []
        if row.get("differing"):
            notes.append("first differing: prompt " + ", ".join(map(str, row["differing"])))
        if row.get("not_compared"):
            notes.append(f"{row['not_compared']} failed on a side, not compared")
        own = row.get("baseline_self") or {}
        if "identical" in own:
            notes.append(f"the baseline against itself: {own['identical']}/{own['prompts']}")
        out.append(line + (f" ({'; '.join(notes)})" if notes else ""))
    return out
