"""Stage containers of a window on the host: create, run within the stage's limit and the window's budget, stream
the output to ``<stage>.log``, journal the outcome with the stage's own reason (:func:`stage_error`).

Used by :class:`eagle3ops.supervisor.runner.Supervisor` (the step table); the serving kinds use
:func:`create_container` for releases recorded as docker SDK specs.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from eagle3ops.config.plan import StageStep
from eagle3ops.supervisor.errors import Interrupted
from eagle3ops.supervisor.journal import _tail

if TYPE_CHECKING:
    from eagle3ops.supervisor.runner import Supervisor


def stage_error(log: str, limit: int = 600) -> str:
    """What a failed stage said about why (pure): the last ``error:`` line of its log (the stage CLI's message for a
    config or input error, exit 2, naming the file and fix), else the last line of a Python traceback
    (``SomeError: ...``), cut to ``limit`` characters; '' when the log says neither. It goes into the stage's
    journal reason, so the window's summary carries it, not only "exited 2"."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("error:"):
            return ln[len("error:"):].strip()[:limit]
    if any(ln.startswith("Traceback (most recent call last)") for ln in lines):
        for ln in reversed(lines):
            exc_type = ln.split(":", 1)[0].replace(".", "")
            if ":" in ln and not ln.startswith(("File ", "^", "~")) and exc_type.isidentifier():
                return ln[:limit]
    return ""


def create_container(client: Any, spec: dict[str, Any], image_id: str | None = None) -> Any:
    """Create and start a container from a docker SDK ``containers.run`` spec (stage containers, and releases
    recorded before releases kept the whole container configuration); ``image_id`` (``sha256:...``) pins the
    image when known, so a re-tagged image cannot change a release."""
    import docker.types

    kw = dict(spec)
    if image_id:
        kw["image"] = image_id
    kw["device_requests"] = [
        docker.types.DeviceRequest(driver=r.get("Driver", ""), count=r.get("Count", -1),
                                   device_ids=r.get("DeviceIDs") or None, options=r.get("Options") or None,
                                   capabilities=r.get("Capabilities", [["gpu"]]))
        for r in kw.get("device_requests") or []
    ]
    if kw.get("mounts"):
        kw["mounts"] = [docker.types.Mount(target=m["Target"], source=m.get("Source"), type=m.get("Type", "bind"),
                                           read_only=bool(m.get("ReadOnly"))) for m in kw["mounts"]]
    if kw.get("ulimits"):
        kw["ulimits"] = [docker.types.Ulimit(name=u["Name"], soft=u["Soft"], hard=u["Hard"]) for u in kw["ulimits"]]
    if not (kw.get("restart_policy") or {}).get("Name"):
        kw.pop("restart_policy", None)
    return client.containers.run(detach=True, **kw)


def run_stage(sup: "Supervisor", step: StageStep) -> bool:
    """Run one stage container to completion within its timeout and the window budget.

    Returns:
        True when the stage exited 0.
    """
    import docker.errors

    if sup.journal.done(step.name):
        sup.stage_outcomes[step.name] = "ok (earlier)"
        return True
    name = step.spec["name"]
    try:
        sup.client.containers.get(name).remove(force=True)  # left over from an interrupted attempt
    except docker.errors.NotFound:
        pass
    # The restore's share of the budget is reserved: stages end by deadline - reserve.
    budget_left = sup.deadline - sup.plan.reserve_s() - time.time()
    limit = min(step.timeout_s, budget_left)
    sup.journal.log(step.name, "start", limit_s=round(limit, 1))
    if limit <= 0:
        sup.journal.log(step.name, "error", reason=f"maintenance budget exhausted before the stage started "
                                                    f"({sup.plan.reserve_s():.0f}s of it are reserved for the "
                                                    f"restore)")
        sup.stage_outcomes[step.name] = "not run (budget)"
        return False
    t0 = time.time()
    container = create_container(sup.client, step.spec)
    log_path = sup.wdir / f"{step.name}.log"
    exit_code: int | None = None
    reason = ""
    try:
        with log_path.open("ab") as log:
            # Stream logs while waiting; the stream ends when the container exits.
            import threading

            def pump() -> None:
                # The client's read timeout (600 s) ends a follow stream when a stage prints nothing for that
                # long: follow again from the last second seen while the container still runs (a line printed
                # in that second may then appear twice; none is lost).
                since: int | None = None
                while True:
                    try:
                        for chunk in container.logs(stream=True, follow=True, since=since):
                            log.write(chunk)
                            log.flush()
                            since = int(time.time())
                    except Exception:  # noqa: BLE001 - the log pump must never kill the supervisor
                        pass
                    try:
                        container.reload()
                        if container.status != "running":
                            return
                    except Exception:  # noqa: BLE001 - gone (removed) or the engine is down
                        return
                    since = since or int(time.time())
                    time.sleep(1)

            th = threading.Thread(target=pump, daemon=True)
            th.start()
            try:
                res = container.wait(timeout=limit)
                exit_code = int(res.get("StatusCode", -1))
            except Interrupted:
                raise
            except Exception:  # requests ReadTimeout / ConnectionError
                reason = "budget exceeded" if budget_left <= step.timeout_s else f"timed out after {limit:.0f}s"
                container.stop(timeout=10)
            th.join(timeout=10)
    except Interrupted:
        reason = "supervisor interrupted"
        try:
            container.stop(timeout=10)
        except Exception:  # noqa: BLE001 - the engine may be going down (daemon restart)
            pass
        raise
    finally:
        dt = time.time() - t0
        sup.stage_times[step.name] = round(dt, 1)
        try:  # its output is in <stage>.log; the exit code goes into the journal below
            container.remove(force=True)
        except Exception as exc:  # noqa: BLE001 - cleanup only, reported as a warning
            sup.warn(step.name, f"could not remove stage container {name}: {type(exc).__name__}: {exc}; "
                                 f"remove it by hand: docker rm --force {name}")
        if exit_code == 0:
            sup.journal.log(step.name, "ok", seconds=round(dt, 1))
            sup.stage_outcomes[step.name] = "ok"
        else:
            why = reason or f"exited {exit_code}"
            said = stage_error(_tail(log_path)) if exit_code is not None else ""
            why += f": {said}" if said else ""
            sup.journal.log(step.name, "error", seconds=round(dt, 1), reason=why)
            sup.stage_outcomes[step.name] = f"failed ({why})"
    return exit_code == 0


def stages_from_journal(sup: "Supervisor") -> tuple[str, str]:
    """Stage outcomes of an earlier attempt of this window, from the journal: (outcome, error)."""
    outcome, error = "ok", ""
    for step in sup.plan.stages:
        e = sup.journal.last(step.name)
        if e is None or e["event"] == "start":
            sup.stage_outcomes[step.name] = "not run" if e is None else "interrupted"
        elif e["event"] == "ok":
            sup.stage_outcomes[step.name] = "ok"
        else:
            sup.stage_outcomes[step.name] = f"failed ({e.get('reason', '')})"
        if sup.stage_outcomes[step.name] != "ok" and outcome == "ok":
            outcome, error = "failed", f"stage {step.name}: {sup.stage_outcomes[step.name]}"
        if e is not None and "seconds" in e:
            sup.stage_times[step.name] = e["seconds"]
    return outcome, error
