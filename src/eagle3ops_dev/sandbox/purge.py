"""A purged sandbox's host-side root deleted in the background (:func:`purge_root`), for
:func:`eagle3ops_dev.sandbox.host.down`."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

#: the name prefix a purged sandbox's host-side root is renamed to (beside the others) before it is deleted
PURGING_PREFIX = ".purging-"


def purge_root(root: Path) -> threading.Thread:
    """Delete ``root`` (a stopped sandbox's host-side state) without making the caller wait for it: the directory is
    renamed aside first (``<base>/.purging-<name>-<pid>-<ns>``, one rename: the name is free for the next ``up`` at
    once), then deleted in a non-daemon thread of this process, so the interpreter still waits for it at exit and
    nothing is left half-deleted by a clean exit. Left-overs of a process that died mid-delete (their pid gone) are
    deleted by the same thread.

    Why: deleting a containerd-store sandbox (~30,000 files: its snapshots of one small image) took 26-44 s of
    waiting on the disk with ~2 s of CPU (measured on this machine: ``getrusage`` around ``shutil.rmtree``), all
    of it on the test module's teardown.

    Returns:
        the started thread (tests join it).
    """
    trash = root.with_name(f"{PURGING_PREFIX}{root.name}-{os.getpid()}-{time.monotonic_ns()}")
    os.rename(root, trash)
    stale = []
    for p in root.parent.glob(f"{PURGING_PREFIX}*"):
        parts = p.name[len(PURGING_PREFIX):].rsplit("-", 2)  # [name, pid, ns]
        pid = parts[1] if len(parts) == 3 else ""
        if p != trash and pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            stale.append(p)

    def work() -> None:
        for p in (trash, *stale):
            shutil.rmtree(p, ignore_errors=True)

    t = threading.Thread(target=work, name=f"purge {root.name}", daemon=False)
    t.start()
    return t
