"""Watching a running window (bounded; checks that the supervisor is alive) and finishing it."""

from __future__ import annotations

import getpass
import json
import time
from collections.abc import Callable
from typing import Any

from eagle3ops.commands import docker as dk
from eagle3ops.commands import host as hc
from eagle3ops.commands import runtime as rt
from eagle3ops.commands import stages as st
from eagle3ops.config.plan import MIN_GATE_S, RECORD_GATE_S, SpeculateJob
from eagle3ops.remote import Remote, RemoteError, render
from eagle3ops.window.common import SupervisorDead, WindowError, append_audit, hint, paths


#: Seconds a supervisor must stay not running (and without a result) before the driver reports it dead; covers a
#: restart by its restart policy (Docker engine restart) and the moment between result.json and its exit.
DEAD_GRACE_S = 10.0
#: Seconds added to a window's own limits (budget, gates) before the driver stops watching.
WATCH_MARGIN_S = 900.0
#: Watch limit (seconds) when the window's plan cannot be read.
WATCH_FALLBACK_S = 24 * 3600.0


def supervisor_state(r: Remote, window_id: str) -> str | None:
    """State of the window's supervisor container: ``running``, ``restarting``, ``exited``, ``created``, ``dead``...,
    ``missing`` (no such container), or None when it cannot be told (engine or host not answering). On a venv host
    the detached supervisor process's: ``running``, ``exited`` or ``missing`` (no pid file yet)."""
    runtime = rt.for_host(r.host)
    out = r.run(runtime.supervisor_status(r.host, window_id), check=False)
    return runtime.status_from(out.ok, out.stdout, out.stderr)


#: Gates a failed candidate's switch may add: the serving kind tries up to this many earlier live releases.
CANDIDATE_FALLBACK_GATES = 3


def watch_limit_s(plan: dict[str, Any]) -> float:
    """How long (seconds) a driver watches a window before giving up: the window's budget (whole downtime), the
    record gate, the graceful stop, up to four gates past the budget (restore + three rollbacks,
    :data:`eagle3ops.config.plan.MIN_GATE_S` each), a speculate job's measurements (both sides and each candidate's,
    and per candidate its graceful stop, its gate and up to :data:`CANDIDATE_FALLBACK_GATES` fallback gates when it
    fails; the same for each restart the ``aba`` order adds) and :data:`WATCH_MARGIN_S`."""
    measuring = 0.0
    if plan.get("speculate"):  # SpeculateJob.measure_bound_s per measured side
        job = SpeculateJob.model_validate(plan["speculate"])
        per_switch = float(plan.get("stop_timeout_s", 120)) + (1 + CANDIDATE_FALLBACK_GATES) * MIN_GATE_S
        measuring = (job.measurements() * job.measure_bound_s()
                     + (len(job.candidates) + job.extra_restarts()) * per_switch)
    return (float(plan.get("budget_s", 7200.0)) + RECORD_GATE_S + float(plan.get("stop_timeout_s", 120))
            + 4 * MIN_GATE_S + WATCH_MARGIN_S + measuring)


def watch(r: Remote, window_id: str, *, on_event: Callable[[dict[str, Any]], None] | None = None,
          poll_s: float = 2.0, timeout_s: float | None = None, dead_grace_s: float | None = None) -> dict[str, Any]:
    """Follow a window's journal until ``result.json`` appears; return the result.

    Survives SSH drops (reconnects on the next poll). Every poll without a result also checks that the supervisor
    container is alive: one that stays not running for ``dead_grace_s`` seconds (default :data:`DEAD_GRACE_S`;
    killed, or removed) is reported at
    once with the command that recovers the window. The whole wait is bounded by ``timeout_s`` (seconds; default
    :func:`watch_limit_s` of the window's plan).

    Raises:
        SupervisorDead: the supervisor is not running and the window has no result (serving may be stopped).
        WindowError: no result within ``timeout_s``; the window may go on on the host.
    """
    p = paths(r.host, window_id)
    seen = 0
    t0 = time.monotonic()
    dead_since: float | None = None
    dead_grace_s = DEAD_GRACE_S if dead_grace_s is None else dead_grace_s
    recover = hint("recover", r.host.name)
    if timeout_s is None:
        try:
            out = r.run(hc.cat_if_exists(p["plan"]), check=False)
            timeout_s = watch_limit_s(json.loads(out.stdout)) if out.stdout.strip() else WATCH_FALLBACK_S
        except (RemoteError, OSError, ValueError):
            timeout_s = WATCH_FALLBACK_S

    def result() -> dict[str, Any] | None:
        res = r.run(hc.cat_if_exists(p["result"]), check=False)
        return json.loads(res.stdout) if res.ok and res.stdout.strip() else None

    while True:
        try:
            out = r.run(hc.tail_from(p["journal"], seen + 1), check=False)
            for line in out.stdout.splitlines():
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                seen += 1
                if on_event:
                    on_event(ev)
            done = result()
            if done is not None:
                return done
            state = supervisor_state(r, window_id)
            if state in ("running", "restarting", None):  # None: cannot tell now (engine restart): keep watching
                dead_since = None
            else:
                now = time.monotonic()
                dead_since = now if dead_since is None else dead_since
                if now - dead_since >= dead_grace_s:
                    done = result()  # it may have written the result just before it exited
                    if done is not None:
                        return done
                    raise SupervisorDead(
                        f"{r.host.name}: the supervisor of window {window_id} is not running (container "
                        f"{st.supervisor_name(window_id)}: {state}) and the window has no result: serving may be "
                        f"stopped. Run {recover} now: it restarts the supervisor, which skips finished stages and "
                        f"restores serving.")
        except (RemoteError, OSError) as exc:  # transient (SSH drop, host busy): keep watching
            if on_event:
                on_event({"step": "driver", "event": "warn", "reason": f"watch: {exc}"})
        if time.monotonic() - t0 > timeout_s:
            raise WindowError(f"window {window_id} did not finish within {timeout_s:.0f}s of watching; it may go on "
                              f"on the host: {hint('attach', r.host.name)}; if its supervisor died, {recover}")
        time.sleep(poll_s)


def cleanup_supervisor(r: Remote, window_id: str) -> str | None:
    """Remove the finished supervisor container; returns a warning text (whole, never cut) instead of raising. A
    venv host's supervisor is a process that has exited: nothing to remove (its pid file stays as a record)."""
    remove = rt.for_host(r.host).supervisor_rm(r.host, window_id)
    if remove is None:
        return None
    res = r.run(remove, check=False)
    name = st.supervisor_name(window_id)
    gone = "no such container" in (res.stderr + res.stdout).lower()  # removed earlier (attach, recover)
    return None if res.ok or gone else (f"cleanup: could not remove supervisor container {name}: "
                                f"{(res.stderr or res.stdout).strip()}; remove it with `{render(remove)}`")


def remove_left_supervisors(r: Remote, window_id: str) -> list[str]:
    """Remove the supervisor containers that earlier windows left on the host's engine (a driver killed before it
    removed its own: the host finished the window, the container stays ``Exited``), called by a new window under the
    lock, before its own supervisor starts. Only a container that ended (``exited``, ``dead``) of a window that has a
    ``result.json`` in this host's state dir goes: a window without a result may still need ``recover``, which
    restarts its supervisor and reads its logs; a window of another state dir on the same engine is not ours to
    judge. Never raises: what could not be removed becomes a warning (returned, whole), with the command that removes
    it. A venv host's supervisors are processes: nothing to remove.

    Returns:
        the warnings (empty when every such container was removed or none was there).
    """
    listing = rt.for_host(r.host).left_supervisors(r.host)
    if listing is None:
        return []
    try:
        out = r.run(listing, check=False)
    except (RemoteError, OSError) as exc:
        return [f"cleanup: could not list the supervisor containers of earlier windows: {exc}"]
    warnings = []
    for line in (out.stdout or "").splitlines() if out.ok else []:
        name, _, wid = line.strip().partition("\t")
        if not wid or wid == window_id or name != st.supervisor_name(wid):
            continue
        try:
            if not r.run(hc.exists(paths(r.host, wid)["result"]), check=False).ok:
                continue  # no result: recover may need this container (its restart, its logs)
            res = r.run(dk.rm(r.host, name), check=False)
        except (RemoteError, OSError) as exc:
            warnings.append(f"cleanup: could not remove supervisor container {name} of finished window {wid}: {exc}")
            continue
        if not res.ok and "no such container" not in (res.stderr + res.stdout).lower():
            warnings.append(f"cleanup: could not remove supervisor container {name} of finished window {wid}: "
                            f"{(res.stderr or res.stdout).strip()}; remove it with "
                            f"`{render(dk.rm(r.host, name, force=True))}`")
    return warnings


def finish_window(r: Remote, window_id: str, result: dict[str, Any], *, command: str = "") -> dict[str, Any]:
    """After a window's result: remove its supervisor container and record every driver-side warning, whole, in
    the window's ``result.json`` (rewritten atomically) and in an audit entry of the window. Returns the result
    with ``window_id`` and the warnings added. Recording errors become warnings of the returned result."""
    result = {**result, "window_id": window_id}
    warn = cleanup_supervisor(r, window_id)
    if not warn:
        return result
    result["warnings"] = [*(result.get("warnings") or []), warn]
    p = paths(r.host, window_id)
    try:
        r.run(hc.write_file(p["result"] + ".tmp"), stdin=json.dumps(result, indent=2))
        r.run(hc.mv(p["result"] + ".tmp", p["result"]))
        append_audit(r, {"user": getpass.getuser(), "host": r.host.name, "command": command or result.get("kind", ""),
                         "window": window_id, "outcome": result.get("outcome"), "error": result.get("error", ""),
                         "release": result.get("release"), "warnings": [warn], "by": "driver"})
    except (RemoteError, OSError) as exc:
        result["warnings"].append(f"could not record the warning above on the host: {exc}")
    return result
