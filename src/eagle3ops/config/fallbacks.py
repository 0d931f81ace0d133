"""Which retained releases a window may restore or roll back to, and what each needs on the host to be created
(issue 26 kind 10). Pure: the supervisor's :class:`eagle3ops.supervisor.releases.Releases` picks rollback targets with
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


def fallbacks_from(entries: list[dict[str, Any]], kept: set[int], failed: int | None) -> list[int]:
    """Rollback candidates after release ``failed`` did not pass its gate: previously live releases, most recently
    live first, each once, excluding ``failed``, releases not in ``kept`` (no longer retained) and releases whose
    newest history entry says they failed a gate.

    Args:
        entries: the history (:func:`history_entries`), oldest first; ``{"release": n, "failed": why?}``.
        kept: the retained release numbers.
    """
    newest: dict[int, dict[str, Any]] = {}
    for e in entries:
        newest[e["release"]] = e
    out: list[int] = []
    for n in reversed([e["release"] for e in entries if not e.get("failed")]):
        if n != failed and n in kept and n not in out and not newest[n].get("failed"):
            out.append(n)
    return out


def candidates(kind: str, current: int | None, entries: list[dict[str, Any]], kept: set[int],
               to_release: int | None = None) -> list[tuple[int, str]]:
    """The retained releases a plan of ``kind`` may create, each with why: ``(n, "the rollback target")``...

    - a window (``extract``/``train``: kind ``window``) restarts the live container; if that fails its gate it
      rolls back to up to :data:`ROLLBACK_TRIES` previously live releases (``fallbacks_from(current)``);
    - ``rollback`` creates its target (``to_release``, else the release live before the current one), then falls
      back like a failed release;
    - ``release`` creates the live container plus the change (checked by preflight's own image and flag checks),
      then falls back to the releases live before it (the current one first).
    """
    out: list[tuple[int, str]] = []
    if kind == "rollback":
        target = to_release if to_release is not None else (fallbacks_from(entries, kept, current) or [None])[0]
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
