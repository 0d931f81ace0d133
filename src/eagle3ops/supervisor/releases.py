"""Retained serving releases under ``<state_dir>/releases``: numbered container specs, the live one, the history."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from eagle3ops.commands.serving import RELEASE_LABEL, release_container_id
from eagle3ops.config.fallbacks import fallbacks_from, is_live_entry, rollback_target
from eagle3ops.supervisor.journal import _now


def write_private(path: Path, text: str | bytes) -> None:
    """Write ``text`` (bytes as they are) to ``path`` readable by its owner only (0600), owned like the directory it
    is in (the SSH user's state dir): a recorded container configuration, a process's command line and environment
    or a unit's drop-in may carry secrets (an API key). Ownership that cannot be changed is left as it is."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
        f.write(text)
    os.chmod(path, 0o600)  # an existing file keeps its old mode through O_CREAT
    st = path.parent.stat()
    try:
        os.chown(path, st.st_uid, st.st_gid)
    except OSError:
        pass


class Releases:
    """Retained serving releases under ``<state_dir>/releases``; pruning never removes one listed here.

    Files: ``NNNN.json`` per release (the whole container configuration), ``current`` (the live release) and
    ``history.jsonl`` (one line per release that became live, oldest first, plus failure marks and gates' verdicts:
    :func:`eagle3ops.config.fallbacks.dispositions`). A release that failed its health gate never becomes live, so
    it never enters the history: rollback targets come from the history, not from the numbering, and a broken
    newer-numbered release is never picked by an automatic rollback; nor is one that a gate rejected or that was
    live only while a gate measured it.
    """

    def __init__(self, state_dir: Path):
        self.dir = state_dir / "releases"
        self.dir.mkdir(parents=True, exist_ok=True)
        # the supervisor runs as root in its container: the directory (and so, through write_private, every release
        # file) belongs to the state dir's owner, the SSH user, whose preflight reads the releases before a stop
        own, st = self.dir.stat(), state_dir.stat()
        if (own.st_uid, own.st_gid) != (st.st_uid, st.st_gid):
            try:
                os.chown(self.dir, st.st_uid, st.st_gid)
                for f in self.dir.iterdir():
                    os.chown(f, st.st_uid, st.st_gid)
            except OSError:
                pass
        self.history_file = self.dir / "history.jsonl"

    def numbers(self) -> list[int]:
        """Release numbers present, ascending."""
        return sorted(int(p.stem) for p in self.dir.glob("[0-9]*.json"))

    def get(self, n: int) -> dict[str, Any]:
        """Release ``n``: ``{"release", "container", "created", "window", "change"}`` (``container``: the whole
        recorded container, :func:`eagle3ops.commands.serving.container_record`), or ``"process"`` instead of
        ``"container"`` on a host serving with a process (:meth:`add_process`); releases recorded by older
        versions have ``{"spec", "image_id"}`` (docker SDK kwargs) instead.

        Raises:
            FileNotFoundError: no such retained release.
        """
        return json.loads((self.dir / f"{n:04d}.json").read_text())

    def current(self) -> int | None:
        """The live release number, or None when none was recorded."""
        p = self.dir / "current"
        return int(p.read_text().strip()) if p.exists() else None

    def add(self, container: dict[str, Any], window: str, change: str = "") -> int:
        """Record a new release (not yet current) and return its number.

        Args:
            container: the container's whole configuration (:func:`eagle3ops.commands.serving.container_record`);
                its ``io.eagle3ops.release`` label is set to the number (the one bookkeeping field eagle3ops adds).
            window: the window that recorded it; ``change``: what it changed against the live container.
        """
        n = (self.numbers() or [0])[-1] + 1
        container = json.loads(json.dumps(container))
        cfg = container.setdefault("Config", {})
        cfg["Labels"] = {**(cfg.get("Labels") or {}), RELEASE_LABEL: str(n)}
        rec = {"release": n, "container": container, "created": _now(), "window": window, "change": change}
        write_private(self.dir / f"{n:04d}.json", json.dumps(rec, indent=2))
        return n

    def add_process(self, process: dict[str, Any], window: str, change: str = "") -> int:
        """Record a new release of a host serving with a process (kind ``process``; not yet current) and return its
        number.

        Args:
            process: the whole recorded process, ``{"argv": [...], "environ": ["K=V", ...], "cwd", "uid"}`` (from
                ``/proc/<pid>/``; see :mod:`eagle3ops.commands.process`), bytes decoded with ``surrogateescape``.
            window: the window that recorded it; ``change``: what it changed against the live process.
        """
        n = (self.numbers() or [0])[-1] + 1
        rec = {"release": n, "process": process, "created": _now(), "window": window, "change": change}
        write_private(self.dir / f"{n:04d}.json", json.dumps(rec, indent=2))
        return n

    def set_current(self, n: int, measured: bool = False) -> None:
        """Mark release ``n`` as live (it passed its health gate, or it was already serving) and log it.

        ``measured``: n serves only so that a gate measures it (a speculate job's or ``release --gate``'s switch);
        until :meth:`mark_gate` records a ``keep`` verdict, no rollback picks it."""
        self._append({"release": n, "t": _now(), **({"measured": True} if measured else {})})
        tmp = self.dir / "current.tmp"
        tmp.write_text(f"{n}\n")
        tmp.replace(self.dir / "current")  # atomic: a crash leaves the old or the new number, never half

    def mark_container(self, n: int, container_id: str) -> None:
        """Record that eagle3ops created (or, at a record step, took as release ``n``) the container
        ``container_id`` for release ``n``: its release file gains ``container_id``. A later record step takes a live
        container for release ``n`` only when it is this one (Docker keeps a container's id across stop, start and
        restart; a container recreated by anyone else gets a new one, whatever labels it copies)."""
        rec = self.get(n)
        if rec.get("container_id") != container_id:
            rec["container_id"] = container_id
            tmp = self.dir / f"{n:04d}.json.tmp"
            write_private(tmp, json.dumps(rec, indent=2))
            tmp.replace(self.dir / f"{n:04d}.json")  # atomic: a crash keeps the release's whole record

    def container_id(self, n: int) -> str | None:
        """The id of the container eagle3ops last created for release ``n`` (:meth:`mark_container`), else the one
        an earlier version adopted as ``n`` (``adopted.json``: ``{"release", "container_id"}``, written before
        releases kept their id); None for a release recorded without either (an earlier version's).

        Raises:
            FileNotFoundError: no such retained release.
        """
        rel = self.get(n)
        p = self.dir / "adopted.json"
        try:
            adopted = json.loads(p.read_text()) if p.exists() else {}
        except ValueError:
            adopted = {}
        return release_container_id(n, rel, adopted if isinstance(adopted, dict) else {})

    def mark_failed(self, n: int, why: str) -> None:
        """Record that live release ``n`` failed a completed health gate: no rollback picks it until it is live again.

        Only a gate verdict (:class:`eagle3ops.health.GateFailed`) may be recorded here; engine errors never are.
        """
        self._append({"release": n, "t": _now(), "failed": why})

    def mark_gate(self, n: int, verdict: str, why: str) -> None:
        """Record a gate's verdict on release ``n``, which it measured while live (:meth:`set_current` with
        ``measured``): ``keep`` makes it kept; ``rollback`` (rejected) and any other verdict keep every later
        rollback from picking it (:func:`eagle3ops.config.fallbacks.dispositions`). Written where the gate decides,
        before the return to the release live before."""
        # the reason's head names the verdict and its figures: kept whole up to 300 characters, then cut at the end
        self._append({"release": n, "t": _now(), "gate": verdict, "why": why if len(why) <= 300 else why[:297] + "..."})

    def is_marked_failed(self, n: int) -> bool:
        """True when release ``n``'s newest history entry (a gate's verdict aside) says it failed a health gate."""
        newest = None
        for e in self._entries():
            if e["release"] == n and "gate" not in e:
                newest = e
        return bool(newest and newest.get("failed"))

    def confirm_live(self, n: int) -> None:
        """Release ``n`` just passed a health gate while serving: make it current, and clear an earlier failure mark
        (a newer live entry) so that rollbacks may pick it again."""
        if self.current() != n or self.is_marked_failed(n):
            self.set_current(n)

    def _append(self, entry: dict[str, Any]) -> None:
        earlier = [] if self.history_file.exists() else self._entries()  # seed from the numbering once
        with self.history_file.open("a") as f:
            for e in earlier:
                f.write(json.dumps(e) + "\n")
            f.write(json.dumps(entry) + "\n")

    def _entries(self) -> list[dict[str, Any]]:
        if self.history_file.exists():
            out = []
            for line in self.history_file.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut by a crash
            return out
        cur = self.current()
        return [] if cur is None else [{"release": n, "t": None, "reconstructed": True}
                                       for n in self.numbers() if n <= cur]

    def history(self) -> list[int]:
        """Releases in the order they became live, oldest first (repeats kept).

        Hosts whose state predates the history file get one reconstructed from the numbering: every retained
        release up to the current one. Lines cut by a crash are skipped.
        """
        return [e["release"] for e in self._entries() if is_live_entry(e)]

    def fallbacks(self, failed: int | None) -> list[int]:
        """Rollback candidates after release ``failed`` did not pass its gate: previously live releases, most
        recently live first, each once, excluding ``failed``, releases no longer retained and releases whose
        newest history entry says they failed a gate (:func:`eagle3ops.config.fallbacks.fallbacks_from`, the rule
        the driver's preflight checks the same candidates with)."""
        return fallbacks_from(self._entries(), set(self.numbers()), failed)

    def rollback_target(self, current: int | None) -> tuple[int | None, str]:
        """A plain ``rollback``'s target and why (:func:`eagle3ops.config.fallbacks.rollback_target`, the rule the
        driver printed before the stop): the release production kept live before ``current``."""
        return rollback_target(self._entries(), set(self.numbers()), current)
