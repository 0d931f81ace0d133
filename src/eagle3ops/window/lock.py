"""The host's deploy lock (a directory: ``mkdir`` is atomic) and who holds it."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shlex
import socket
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from eagle3ops.commands import host as hc
from eagle3ops.commands import runtime as rt
from eagle3ops.remote import Remote, render
from eagle3ops.window.common import LockHeld, WindowError, hint, new_window_id, paths


def acquire_lock(r: Remote, window_id: str, command: str, message: str = "") -> None:
    """Take the host's deploy lock (atomic ``mkdir``) and write who/when/what into it, with the driver that holds it
(``driver``: this machine's hostname and this process's pid, read by :func:`lock_is_stale`).

    Raises:
        LockHeld: the lock exists; the message says who holds it, since when, and the command to clear it.
        WindowError: the lock could not be created for another reason (e.g. ``Permission denied`` on ``state_dir``);
            the message quotes the host's error and says how to fix it.
    """
    p, h = paths(r.host), r.host
    fix = (f"The SSH user ({h.user or 'the login user'}) must be able to create and write {h.state_dir}: on the host "
           f"run `sudo install -d -o <ssh user> {shlex.quote(h.state_dir)}`, or set `hosts.{h.name}.state_dir` in "
           f"the inventory to a directory that user owns.")
    mk = r.run(hc.mkdir_p(p["state"]), check=False)
    if not mk.ok and not r.dry_run:
        raise WindowError(f"{h.name}: cannot create the state dir: `{render(hc.mkdir_p(p['state']))}` failed: "
                          f"{(mk.stderr or mk.stdout).strip()}. {fix}")
    res = r.run(hc.mkdir_atomic(p["lock"]), check=False)
    if not res.ok and not r.dry_run:
        if r.run(hc.test_dir(p["lock"]), check=False).ok:
            raise LockHeld(describe_lock(r))
        raise WindowError(f"{h.name}: cannot take the deploy lock: `{render(hc.mkdir_atomic(p['lock']))}` failed: "
                          f"{(res.stderr or res.stdout).strip() or f'exit {res.exited}'}. {fix}")
    details = {"window_id": window_id, "holder": f"{getpass.getuser()}@{socket.gethostname()}",
               "since": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": command,
               "message": message, "driver": {"machine": socket.gethostname(), "pid": os.getpid()}}
    r.run(hc.write_file(p["lock_details"]), stdin=json.dumps(details, indent=2))


def read_lock(r: Remote) -> dict[str, Any] | None:
    """The lock's details, or None when the host is not locked."""
    out = r.run(hc.cat_if_exists(paths(r.host)["lock_details"]), check=False)
    if out.ok and out.stdout.strip():
        try:
            return json.loads(out.stdout)
        except ValueError:
            return {"holder": "unknown", "raw": out.stdout}
    held = r.run(hc.test_dir(paths(r.host)["lock"]), check=False)
    return {"holder": "unknown (no details file)"} if held.ok else None


#: A lock whose window has no plan on the host yet is the driver's own (preflight, launch) for this long.
LAUNCH_GRACE_S = 900


def _serving_ok(result: dict[str, Any]) -> bool:
    """A window result says serving ended running and healthy (results before ``serving_healthy`` existed: running;
    a host without serving, ``"serving": "none"``: nothing to be unhealthy)."""
    if result.get("serving") == "none":
        return True
    return bool(result.get("serving_healthy", result.get("serving_running", True)))


def supervisor_alive(r: Remote, window_id: str) -> bool:
    """True while the window's supervisor container runs (or is being restarted by its restart policy); on a venv
    host, while its detached process runs (:data:`eagle3ops.commands.venv.STATE_SH`)."""
    runtime = rt.for_host(r.host)
    out = r.run(runtime.supervisor_alive(r.host, window_id), check=False)
    return runtime.alive_from(out.ok, out.stdout)


def _driver_gone(details: dict[str, Any]) -> bool:
    """The lock's driver (``details["driver"]``, :func:`acquire_lock`) ran on this machine and its process is gone
    (a pid another user's process holds counts as alive). A lock from another machine, or one written before
    drivers were named, cannot be told: False."""
    d = details.get("driver")
    if not isinstance(d, dict) or d.get("machine") != socket.gethostname() or not isinstance(d.get("pid"), int):
        return False
    try:
        os.kill(d["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _no_plan(r: Remote, wid: str) -> bool:
    """No plan of window ``wid`` on the host yet: its driver is in preflight or launch."""
    return not r.run(hc.cat_if_exists(paths(r.host, wid)["plan"]), check=False).stdout.strip()


def lock_is_stale(r: Remote, details: dict[str, Any]) -> bool:
    """True when the lock's holder is dead: its window's supervisor is not running, and it is not a driver still in
    preflight/launch (no plan written yet and the lock younger than :data:`LAUNCH_GRACE_S`, unless the lock's driver
    ran on this machine and is gone: a driver killed before its supervisor started holds nothing)."""
    wid = details.get("window_id")
    if not wid:
        return True
    if supervisor_alive(r, wid):
        return False
    if not _no_plan(r, wid) or _driver_gone(details):
        return True
    try:
        age = (datetime.now(timezone.utc) - datetime.fromisoformat(details["since"])).total_seconds()
    except (KeyError, TypeError, ValueError):
        return True
    return age > LAUNCH_GRACE_S


def describe_lock(r: Remote) -> str:
    """Human text about the current lock, with the exact command to clear a stale one."""
    d = read_lock(r)
    if d is None:
        return f"{r.host.name}: the deploy lock is free (it was released meanwhile); run the command again"
    stale = lock_is_stale(r, d)
    text = (f"{r.host.name}: deploy lock held by {d.get('holder')} since {d.get('since', '?')} "
            f"for `{d.get('command', '?')}` (window {d.get('window_id', '?')})")
    res = r.run(hc.cat_if_exists(paths(r.host, d["window_id"])["result"]), check=False).stdout \
        if d.get("window_id") else ""
    if stale and res.strip() and not _serving_ok(json.loads(res)):
        text += (f". That window ended with serving NOT running and kept the lock: {hint('recover', r.host.name)} "
                 f"retries the restore.")
    elif stale:
        text += (f". Its supervisor is not running, so the lock looks stale: check {hint('status', r.host.name)}"
                 f", then clear it with {hint('lock', 'release', r.host.name, '--force')}.")
    elif _no_plan(r, d["window_id"]):  # a driver in preflight or launch: `attach` would follow the previous window
        drv = d.get("driver") if isinstance(d.get("driver"), dict) else {}
        who = f" (pid {drv.get('pid')} on {drv.get('machine')})" if drv else ""
        text += (f". Its driver{who} is still in preflight or launch (no plan on the host yet): wait for it; if that "
                 f"driver was killed, the lock counts as stale {LAUNCH_GRACE_S // 60} minutes after it was taken (at "
                 f"once from the machine it ran on), then clear it with "
                 f"{hint('lock', 'release', r.host.name, '--force')}.")
    else:
        text += f". That window is still running: follow it with {hint('attach', r.host.name)}."
    return text


def release_lock(r: Remote, window_id: str | None = None) -> None:
    """Remove the lock (only if held by ``window_id`` when given)."""
    if window_id is not None:
        d = read_lock(r)
        if d and d.get("window_id") != window_id:
            return
    r.run(hc.rm_rf(paths(r.host)["lock"]))


@contextlib.contextmanager
def holding_lock(r: Remote, kind: str, command: str, message: str = "") -> Iterator[str]:
    """Hold the host's deploy lock over a short job the driver carries out itself (no supervisor: a push, a
    deploy, a probe): taken on entry under a new window id of ``kind`` (yielded), released on leaving, whether the
    block ended or raised (a release that fails after the block failed leaves the lock, which ``status`` reports
    stale: the block's error is the one raised). A dry run records the lock's commands without running them, after
    reporting a lock held by someone else, as :func:`eagle3ops.window.run.under_lock` does: a dry run's changes are
    the real run's.

    Raises:
        LockHeld: another run holds the lock (nothing done; the message names its holder and command).
        WindowError: the lock could not be taken (e.g. ``state_dir`` not writable; the message says how to fix it).
    """
    if r.dry_run and read_lock(r):
        raise LockHeld(describe_lock(r))
    window_id = new_window_id(kind)
    acquire_lock(r, window_id, command, message)
    try:
        yield window_id
    except BaseException:
        with contextlib.suppress(Exception):  # the block's own error is the one to report; a lock left is stale
            release_lock(r, window_id)
        raise
    release_lock(r, window_id)
