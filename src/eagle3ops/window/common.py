"""What every part of the driver side of a window shares: its errors, host paths, window ids, hints, the audit log."""

from __future__ import annotations

import getpass
import json
import os
import secrets
import shlex
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from eagle3ops import redact
from eagle3ops.commands import host as hc
from eagle3ops.commands import stages as st
from eagle3ops.config import HostConfig
from eagle3ops.remote import Remote


class WindowError(Exception):
    """A window could not start or did not end well; the message says what happened and what to do."""


class LockHeld(WindowError):
    """Another run holds the host's deploy lock."""


class PreflightFailed(WindowError):
    """A preflight check failed; nothing was stopped."""


class SupervisorDead(WindowError):
    """The window's host-side supervisor is not running and left no result; the message gives the recover command."""


def hint(*args: str) -> str:
    """An ``eagle3ops`` command for a message, each argument quoted (``shlex.quote``): a host name or alias pasted
    back into a shell stays one literal word and runs nothing."""
    return "`" + shlex.join(["eagle3ops", *args]) + "`"


def new_window_id(kind: str) -> str:
    """``YYYYmmddTHHMMSSZ-<kind>-<6 hex>``: sortable and unique."""
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{kind}-{secrets.token_hex(3)}"


def host_path(h: HostConfig, path: str, run: str) -> str | None:
    """The host path of ``path`` as a stage container sees it (relative paths: the run directory
    ``<data_dir>/runs/<run>/``; absolute ones under the data or model mount); None if it is not mounted."""
    if not path.startswith("/"):
        return f"{h.data_dir}/runs/{run}/{path}"
    for mount, host_dir in ((st.DATA_MOUNT, h.data_dir), (st.MODEL_MOUNT, h.model_path)):
        if path == mount or path.startswith(mount + "/"):
            return host_dir + path[len(mount):]
    return None


def paths(host: HostConfig, window_id: str | None = None) -> dict[str, str]:
    """Well-known state paths on the host (see :mod:`eagle3ops.supervisor`)."""
    s = host.state_dir
    p = {"state": s, "lock": f"{s}/lock", "lock_details": f"{s}/lock/details.json", "audit": f"{s}/audit.jsonl",
         "windows": f"{s}/windows", "releases": f"{s}/releases", "deployed": f"{s}/deployed.json"}
    if window_id:
        w = f"{s}/windows/{window_id}"
        p.update(window=w, plan=f"{w}/plan.json", journal=f"{w}/journal.jsonl", result=f"{w}/result.json")
    return p


def current_release(r: Remote) -> int | None:
    """The host's current serving release (``<state_dir>/releases/current``), None when none is recorded."""
    out = r.run(hc.cat_if_exists(f"{paths(r.host)['releases']}/current"), check=False).stdout.strip()
    return int(out) if out.isdigit() else None


def latest_window(r: Remote) -> str | None:
    """Id of the newest window on the host (ids sort by time)."""
    out = r.run(hc.ls(paths(r.host)["windows"]), check=False)
    names = sorted(n for n in out.stdout.split() if n)
    return names[-1] if names else None


def audit_entries(r: Remote) -> list[dict[str, Any]]:
    """The host's audit log."""
    out = r.run(hc.cat_if_exists(paths(r.host)["audit"]), check=False)
    return [json.loads(ln) for ln in out.stdout.splitlines() if ln.strip()]


def append_audit(r: Remote, entry: dict[str, Any]) -> None:
    """Append one audit line from the driver (for windows that never reached the supervisor), its secrets masked
    (:func:`eagle3ops.redact.value`)."""
    entry = redact.value({"t": datetime.now(timezone.utc).isoformat(timespec="seconds"), **entry}, r.host.secret_env)
    r.run(hc.mkdir_p(r.host.state_dir))
    r.run(hc.append_file(paths(r.host)["audit"]), stdin=json.dumps(entry) + "\n")


def local_audit_path() -> Path:
    """The driver's own audit log: ``$EAGLE3OPS_LOCAL_AUDIT``, else ``$XDG_STATE_HOME/eagle3ops/audit.jsonl``
    (default ``~/.local/state/eagle3ops/audit.jsonl``)."""
    if os.environ.get("EAGLE3OPS_LOCAL_AUDIT"):
        return Path(os.environ["EAGLE3OPS_LOCAL_AUDIT"])
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local/state")
    return Path(state) / "eagle3ops/audit.jsonl"


def append_local_audit(host: str, command: str, outcome: str, error: str) -> str | None:
    """Record, on this machine, a host-changing command that never reached its host (the host's own audit log,
    :func:`append_audit`, cannot be written then): one JSON line (t, user, host, command, outcome, error) appended to
    :func:`local_audit_path`. Returns a warning text instead of raising when the local file cannot be written."""
    entry = {"t": datetime.now(timezone.utc).isoformat(timespec="seconds"), "user": getpass.getuser(), "host": host,
             "command": command, "outcome": outcome, "error": error[-500:], "by": "driver (host not reached)"}
    path = local_audit_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(redact.value(entry)) + "\n")
    except OSError as exc:
        return f"could not write the local audit log {path}: {exc}"
    return None


def pipeline_image(host, dep: dict) -> tuple[str, str | None]:
    """``(image, id to verify)`` a window on ``host`` runs, from its inventory entry and ``dep`` (the host's
    ``deployed.json``, :func:`deployed_record`): the inventory's ``pipeline_image`` when set, verified against the
    recorded id only when ``deploy`` recorded that same image (another image's id would fail every window with a
    "redeploy" that cannot fix it); else the deployed image and its id. Pure."""
    if host.pipeline_image:
        return host.pipeline_image, dep.get("image_id") if dep.get("image") == host.pipeline_image else None
    return dep["image"], dep.get("image_id")
