"""One user of a sandbox at a time: an exclusive ``flock`` that a test run (or the demo) holds while it uses it.

Two runs on one sandbox (the same sshd, engine and ``state_dir``) take each other's deploy lock and stop each
other's serving: stop 36's CI (a fresh clone on this machine) failed with ``LockHeld`` because a developer's own
``.ci/run`` was still in its kill test on the same sandbox. The hold is a lock file beside the sandbox's state
(``/var/lib/eagle3ops-sandbox/<name>.hold``); the kernel drops it when its holder exits, killed or not, so a dead
run never leaves it held. A second run waits for it, bounded, saying who holds it, and then fails naming the holder.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, TextIO

from eagle3ops_dev.sandbox.host import SANDBOX_BASE, _check_name
from eagle3ops_dev.sandbox.proc import SandboxError

#: How long a second run waits for the sandbox by default: longer than one run of the suite's sandbox part
#: (~22 min on 2 cores beside the other streams), shorter than CI's 90 minutes.
WAIT_S = 1800.0
POLL_S = 2.0


def hold_path(name: str) -> Path:
    """The lock file of sandbox ``name``: ``/var/lib/eagle3ops-sandbox/<name>.hold``."""
    _check_name(name)
    return SANDBOX_BASE / f"{name}.hold"


def holder(name: str) -> dict | None:
    """Who holds sandbox ``name`` (``pid``, ``cwd``, ``argv``, ``since``) as its holder wrote it, or None when
    the file is missing or unreadable. Read only: it says nothing about whether the hold is still taken."""
    try:
        return json.loads(hold_path(name).read_text() or "null")
    except (OSError, ValueError):
        return None


def _describe(info: dict | None) -> str:
    if not info:
        return "a process that wrote no details"
    return (f"pid {info.get('pid')} since {info.get('since')} in {info.get('cwd')}: "
            f"{' '.join(map(str, info.get('argv') or []))[:200]}")


def hold(name: str = "sandbox", *, wait_s: float = WAIT_S, poll_s: float = POLL_S,
         log: Callable[[str], None] | None = None) -> TextIO:
    """Take sandbox ``name`` for this process: an exclusive ``flock`` on :func:`hold_path`, waited for at most
    ``wait_s`` seconds (polled every ``poll_s``), then this process's pid, cwd, argv and start time written into it.

    Returns the open lock file: the hold lasts while it stays open (close it, or let the process exit, to let
    the sandbox go). Taking it twice in one process is not supported (a second open file of the same lock waits).

    Raises:
        SandboxError: still held by another process after ``wait_s``; the message names that process (its pid,
            cwd and command line) and what to do.
    """
    path = hold_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")
    deadline, told = time.monotonic() + wait_s, False
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                f.close()
                raise SandboxError(
                    f"sandbox {name!r} is still in use after {wait_s:.0f} s by {_describe(holder(name))} "
                    f"(lock {path}). Let that run finish, or stop it (kill its pid), then run again.") from None
            if not told:
                (log or (lambda m: print(m, file=sys.stderr, flush=True)))(
                    f"waiting up to {wait_s:.0f} s for sandbox {name!r}: in use by {_describe(holder(name))}")
                told = True
            time.sleep(poll_s)
    f.seek(0)
    f.truncate()
    f.write(json.dumps({"pid": os.getpid(), "cwd": os.getcwd(), "argv": sys.argv,
                        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
    f.flush()
    return f
