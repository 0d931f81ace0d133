"""Which retained releases a window may restore or roll back to, and what each needs on the host to be created.
Pure: the supervisor's :class:`eagle3ops.supervisor.releases.Releases` picks rollback targets with
:func:`fallbacks_from`, and the driver's preflight (:func:`eagle3ops.window.preflight.check_fallbacks`) checks the
same candidates before serving stops, so the two cannot disagree.

A release record is ``releases/NNNN.json`` (:meth:`Releases.get`): ``{"container": {...}}`` (the whole recorded
container: ``Config.Image`` the reference, ``ImageId`` the id in the image store of the host that recorded it,
``HostConfig.Binds``/``Mounts``), ``{"spec", "image_id"}`` (a release recorded by an older version: docker SDK
kwargs) or ``{"process": {...}}`` (process serving: no image, no binds).
"""

from __future__ import annotations

import json
from typing import Any

#: Previously live releases a failed gate tries in turn (the supervisor's ``rollback_after_failure`` default).
ROLLBACK_TRIES = 3


def history_entries(history_text: str) -> list[dict[str, Any]]:
    """``history.jsonl``'s entries in order; lines cut by a crash are skipped."""
    out = []
    for line in history_text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


#: A release's disposition in the history (:func:`dispositions`): production ran it and kept it; a gate measured it
#: and kept it not (yet); a gate rejected it; it failed a completed health gate while live.
KEPT, MEASURED, REJECTED, FAILED = "kept", "measured", "rejected", "failed"


def is_live_entry(e: dict[str, Any]) -> bool:
    """Whether history entry ``e`` records a release becoming live (not a failure mark, not a gate's verdict)."""
    return not e.get("failed") and "gate" not in e


def dispositions(entries: list[dict[str, Any]]) -> tuple[list[tuple[int, str]], dict[int, tuple[str, str]]]:
    """Each live spell in the history with what became of it, and each release's newest disposition.

    History entries (``history.jsonl``, :class:`eagle3ops.supervisor.releases.Releases`), oldest first:

    - ``{"release": n}``: n became live and production kept it (a release, a rollback, a recorded live container);
    - ``{"release": n, "measured": true}``: n became live only so that a gate could measure it (``release --gate``'s
      changed release, a speculate job's speculative release or its chosen candidate, confirmed afresh); it stays
      :data:`MEASURED` until its gate's verdict;
    - ``{"release": n, "gate": verdict, "why": ...}``: that gate's verdict on n's newest live spell: ``keep`` makes
      it :data:`KEPT`, ``rollback`` :data:`REJECTED`, any other (``undecided``, ``error``) leaves it measured only;
    - ``{"release": n, "failed": why}``: live n failed a completed health gate (:data:`FAILED` until live again).

    Control releases and candidates are never live (``live=False`` switches): they never enter the history.

    Returns:
        (``[(release, disposition)]``, one per live spell, oldest first; ``{release: (newest disposition, why)}``).
    """
    spells: list[list[Any]] = []
    newest: dict[int, tuple[str, str]] = {}
    for e in entries:
        n = e["release"]
        if e.get("failed"):
            newest[n] = (FAILED, str(e["failed"]))
        elif "gate" in e:
            verdict = str(e["gate"])
            d = KEPT if verdict == "keep" else REJECTED if verdict == "rollback" else MEASURED
            why = "" if d == KEPT else f"{verdict}: {e.get('why') or ''}".rstrip(": ")
            for spell in reversed(spells):  # the verdict is on the spell the gate measured: n's newest
                if spell[0] == n:
                    spell[1] = d
                    break
            newest[n] = (d, why)
        else:
            d = MEASURED if e.get("measured") else KEPT
            spells.append([n, d])
            newest[n] = (d, "" if d == KEPT else "no verdict recorded")
    return [(n, d) for n, d in spells], newest


def describe(entries: list[dict[str, Any]], n: int) -> str:
    """What became of release ``n``, in words, for the rollback line (``--to N`` names a rejected one as such)."""
    d, why = dispositions(entries)[1].get(n, (None, ""))
    return {KEPT: "kept live by production",
            MEASURED: f"live only while a gate measured it ({why})",
            REJECTED: f"rejected by a gate ({why})",
            FAILED: f"failed its health gate while live ({why})"}.get(
        d, "never live: a candidate, a control release, or a release that failed its health gate when started")


def fallbacks_from(entries: list[dict[str, Any]], kept: set[int], failed: int | None) -> list[int]:
    """Rollback candidates after release ``failed`` did not pass its gate (and a plain ``rollback``'s target, the
    first): releases production kept live, most recently kept first, each once, excluding ``failed``, releases
    not in ``kept`` (no longer retained) and releases whose newest disposition is not :data:`KEPT` (failed a
    health gate, rejected by a gate, live only while measured: :func:`dispositions`).

    Args:
        entries: the history (:func:`history_entries`), oldest first.
        kept: the retained release numbers.
    """
    spells, newest = dispositions(entries)
    out: list[int] = []
    for n, d in reversed(spells):
        if d == KEPT and n != failed and n in kept and n not in out and newest[n][0] == KEPT:
            out.append(n)
    return out


def rollback_target(entries: list[dict[str, Any]], kept: set[int], current: int | None,
                    to_release: int | None = None) -> tuple[int | None, str]:
    """What ``rollback`` brings back, and why in words: ``to_release`` when named (with what became of it: a
    rejected one is named as such), else the release production kept live before the current one, passing over
    releases a gate rejected or that were live only while measured (so a rollback after a failed gate never
    brings back the change that failed). Pure: the driver prints it before anything stops and the supervisor
    switches to the same target.

    Returns:
        ``(release, why)``, or ``(None, why)`` when no kept release before the current one is retained (``why``
        then names the fix: ``--to N``).
    """
    if to_release is not None:
        return to_release, f"named with --to; {describe(entries, to_release)}"
    cands = fallbacks_from(entries, kept, current)
    target = cands[0] if cands else None
    passed: list[str] = []
    seen: set[int] = set()
    spells, newest = dispositions(entries)
    for n, _ in reversed(spells):
        if n == target:
            break
        if n in seen or n == current:
            continue
        seen.add(n)
        if newest[n][0] != KEPT:
            passed.append(f"{n} ({describe(entries, n)})")
        elif n not in kept:
            passed.append(f"{n} (no longer retained)")
    over = f"; passed over: {', '.join(passed)}" if passed else ""
    if current is not None and newest.get(current, (KEPT,))[0] != KEPT:
        over += f"; release {current}, serving now, is {describe(entries, current)}"
    if target is None:
        return None, (f"no release that was live before release {current} and kept by production is "
                      f"retained{over}; name one with --to N")
    return target, f"the release production kept live before release {current}{over}"


def candidates(kind: str, current: int | None, entries: list[dict[str, Any]], kept: set[int],
               to_release: int | None = None) -> list[tuple[int, str]]:
    """The retained releases a plan of ``kind`` may create, each with why: ``(n, "the rollback target")``...

    - a window (``extract``/``train``: kind ``window``) restarts the live container; if that fails its gate it
      rolls back to up to :data:`ROLLBACK_TRIES` previously live releases (``fallbacks_from(current)``);
    - ``rollback`` creates its target (:func:`rollback_target`: ``to_release``, else the release production kept
      live before the current one), then falls back like a failed release;
    - ``release`` creates the live container plus the change (checked by preflight's own image and flag checks),
      then falls back to the releases live before it (the current one first).
    """
    out: list[tuple[int, str]] = []
    if kind == "rollback":
        target = rollback_target(entries, kept, current, to_release)[0]
        if target is not None:
            out.append((target, "the rollback target"))
        failed = target
    else:
        failed = current if kind == "window" else None
    for n in fallbacks_from(entries, kept, failed)[:ROLLBACK_TRIES]:
        if n not in [m for m, _ in out]:
            out.append((n, "a fallback if the gate fails"))
    return out


def needs(record: dict[str, Any]) -> tuple[str | None, str | None, list[str]]:
    """What creating release ``record`` needs on the host: ``(image id, image reference, bind host paths)``; the id
    is None for a record that names none (process serving, an old record without it)."""
    if "container" in record:
        c = record["container"]
        ref = (c.get("Config") or {}).get("Image")
        hc = c.get("HostConfig") or {}
        paths = [b.split(":", 1)[0] for b in hc.get("Binds") or [] if b.startswith("/")]
        paths += [m.get("Source") for m in hc.get("Mounts") or []
                  if m.get("Type") == "bind" and str(m.get("Source") or "").startswith("/")]
        return c.get("ImageId") or None, ref, paths
    if "spec" in record:
        spec = record["spec"]
        vols = spec.get("volumes") or {}
        paths = [p for p in (vols if isinstance(vols, dict) else [v.split(":", 1)[0] for v in vols])
                 if str(p).startswith("/")]
        return record.get("image_id") or None, spec.get("image"), paths
    return None, None, []
