"""The truth about serving is the live server: what ``status`` and ``recover`` read on the host.

The newest window's ``result.json`` is a record of what was true when that window ended; serving may have been
stopped, crashed or restarted since (an operator, a restart policy). :func:`read_live` reads the live server through
the serving kind (:meth:`eagle3ops.window.kinds.DriverKind.live_state`: the container's ``State.Status``, the
process, the unit) and its ``/health`` on the host's loopback (``curl``); :func:`disagreement` (pure) says when the
record and the live server disagree; :func:`recover_stopped` starts serving that was stopped outside a window (no
window holds the lock) and waits for ``/health``.
"""

from __future__ import annotations

import getpass
import json
import time
from dataclasses import dataclass
from typing import Any, Callable

from eagle3ops.commands import host as hc
from eagle3ops.remote import Remote
from eagle3ops.serving_http import HEALTH
from eagle3ops.window import loopback
from eagle3ops.window.common import WindowError, append_audit, latest_window, paths
from eagle3ops.window.kinds import driver_kind
from eagle3ops.window.lock import holding_lock, read_lock

#: Seconds between two reads of the live server while ``recover`` waits for it to answer ``/health``.
POLL_S = 2.0


@dataclass
class LiveServing:
    """The live server as read on the host now."""

    #: What the serving kind found, in words (``container 'vllm-serving' is exited``).
    said: str
    #: The kind's own view: running (container ``running``, a matching process, unit ``active``); None: no serving.
    running: bool | None
    #: ``/health 200``, ``/health 503``, ``/health: no answer``, or why it was not asked.
    health: str
    #: ``/health`` answered 200; None when it was not asked (no serving, no ``curl`` on the host).
    healthy: bool | None

    def line(self) -> str:
        """One line for the terminal: ``live serving: <said>, <health>``."""
        return f"live serving: {self.said}" + (f", {self.health}" if self.health else "")


def probe_health(r: Remote) -> tuple[str, bool | None]:
    """``GET /health`` of serving on the host's loopback (``serving.port``), one try of 5 s: (words, answered 200).
    ``None`` when the host has no ``curl`` (exit 127)."""
    code = loopback.read_status(r, HEALTH)
    if code is None:
        return "/health not checked (no curl on the host)", None
    if not code or code == "000":
        return "/health: no answer", False
    return f"/health {code}", code == "200"


def read_live(r: Remote) -> LiveServing:
    """Read the live server (read-only): the serving kind's view and ``/health``."""
    said, running = driver_kind(r.host).live_state(r)
    if running is None:
        return LiveServing(said, None, "", None)
    health, healthy = probe_health(r)
    return LiveServing(said, running, health, healthy)


def serving_ok(record: dict[str, Any]) -> bool:
    """A window's result says serving ran and was healthy when it ended."""
    return bool(record.get("serving_running")) and record.get("serving_healthy") is not False


def disagreement(record: dict[str, Any] | None, window_id: str | None, live: LiveServing) -> str | None:
    """Where window ``window_id``'s ``result.json`` (``record``) and the live server disagree, in one line naming
    both and what to run; None when they agree or there is nothing to compare (no result, no serving). Pure."""
    if not record or live.running is None:
        return None
    said = "runs healthy" if serving_ok(record) else "is NOT running or NOT healthy"
    head = f"the record of window {window_id} says serving {said}; the live server DISAGREES: {live.line()}"
    if serving_ok(record) and not live.running:
        return f"{head} (stopped outside a window): `eagle3ops recover HOST` starts it again and waits for /health"
    if serving_ok(record) and live.healthy is False:
        return f"{head}: serving runs but does not answer /health; see its logs"
    if not serving_ok(record) and live.running and live.healthy:
        return f"{head} (started outside eagle3ops); the window's lock is still held: `eagle3ops recover HOST`"
    return None


def newest_record(r: Remote) -> tuple[str | None, dict[str, Any] | None]:
    """The newest window's id and its ``result.json`` (None while it has none)."""
    wid = latest_window(r)
    if not wid:
        return None, None
    text = r.run(hc.cat_if_exists(paths(r.host, wid)["result"]), check=False).stdout
    return wid, (json.loads(text) if text.strip() else None)


def recover_stopped(r: Remote, echo: Callable[[str], None], command: str = "eagle3ops recover") -> bool:
    """``recover``'s first step: serving that is not running while no window holds the lock (stopped outside a
    window: no supervisor will restore it) is started again (the serving kind's
    :meth:`~eagle3ops.window.kinds.DriverKind.start_stopped`) and waited for until ``/health`` answers 200
    (``serving.health_timeout_s``); the audit log gets one line. Says first where the newest window's record
    disagrees with the live server. The start, the wait and the audit line run under the host's deploy lock
    (:func:`~eagle3ops.window.lock.holding_lock`, a window id of kind ``recover`` naming ``command``): a window that
    took the lock after the read above is not raced, and no host change precedes a lock.

    Returns:
        True when it handled the recover (serving was started, or the dry run printed it); False when serving runs
        or a window holds the lock (the window's supervisor is then the one to restore it).

    Raises:
        WindowError: serving cannot be started as it is (the message names the fix), or it did not answer
            ``/health`` in time (or stopped again).
    """
    h = r.host
    live = read_live(r)
    wid, record = newest_record(r)
    note = disagreement(record, wid, live)
    if note:
        echo(f"{h.name}: {note.replace('HOST', h.name)}")
    if live.running is not False or read_lock(r) is not None:
        return False
    what, cmds = driver_kind(h).start_stopped(r)
    echo(f"{h.name}: serving is not running ({live.said}) and no window holds the lock: starting {what}")
    with holding_lock(r, "recover", command, f"start serving stopped outside a window ({what})"):
        return _start_and_wait(r, live, what, cmds, echo)


def _start_and_wait(r: Remote, live: LiveServing, what: str, cmds: list[Any], echo: Callable[[str], None]) -> bool:
    """:func:`recover_stopped`'s part under the lock: run ``cmds`` (the kind's start), then wait for ``/health`` and
    write the audit line. Raises WindowError as :func:`recover_stopped` says."""
    h = r.host
    for cmd in cmds:
        r.run(cmd)
    if r.dry_run:
        echo(f"# then waits up to {h.serving.health_timeout_s:.0f}s for /health 200")
        return True
    deadline, now = time.time() + h.serving.health_timeout_s, live
    while time.time() < deadline:
        time.sleep(POLL_S)
        now = read_live(r)
        if now.running is False:
            break
        if now.healthy or (now.running and now.healthy is None):
            append_audit(r, {"user": getpass.getuser(), "host": h.name, "command": "recover", "outcome": "ok",
                             "error": "", "message": f"serving was not running outside a window ({live.said}); "
                                                     f"started {what}"})
            echo(f"{h.name}: serving is running and healthy ({now.line()})")
            return True
    append_audit(r, {"user": getpass.getuser(), "host": h.name, "command": "recover", "outcome": "failed",
                     "error": f"started {what}; {now.line()}"})
    raise WindowError(f"{h.name}: started {what}, but it did not answer /health within "
                      f"{h.serving.health_timeout_s:.0f}s ({now.line()}): read its logs; "
                      f"`eagle3ops rollback {h.name}` brings back the release live before it")
