"""Stage containers (or, on a venv host, stage processes: :func:`run_stage_process`) of a window on the host: create, run within the stage's limit and the window's budget, stream
the output to ``<stage>.log`` with its secrets masked (:class:`eagle3ops.redact.LineWriter`: a stage may print its
arguments or environment), journal the outcome with the stage's own reason (:func:`stage_error`).

Used by :class:`eagle3ops.supervisor.runner.Supervisor` (the step table); the serving kinds use
:func:`create_container` for releases recorded as docker SDK specs.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Protocol

from eagle3ops import redact
from eagle3ops.commands import runtime as rt
from eagle3ops.config.plan import Plan, StageStep
from eagle3ops.supervisor.errors import Interrupted, ServingRestarted
from eagle3ops.supervisor.journal import Journal, _tail


class StageHost(Protocol):
    """What a stage run uses of the window that runs it (the runner, :class:`eagle3ops.supervisor.runner.Supervisor`,
    is one).

    Attributes: ``plan``, ``journal``, ``client`` (docker SDK ``DockerClient``; None on a venv host), ``wdir`` (the
    window's folder: ``<stage>.log``), ``deadline`` (end of the maintenance budget, epoch seconds),
    ``stage_outcomes`` / ``stage_times`` (``{stage: outcome in words}`` / ``{stage: seconds}``, filled here for the
    result), ``guard_poll_s`` (seconds between two checks that serving is still stopped), ``engine_waits`` (engine
    outages waited out so far in this run). Methods: the window's shared policy.
    """

    plan: Plan
    journal: Journal
    client: Any
    wdir: Path
    deadline: float
    stage_outcomes: dict[str, str]
    stage_times: dict[str, float]
    guard_poll_s: float
    engine_waits: int

    def warn(self, step: str, message: str) -> None:
        """Journal a warning for the window's result."""

    def guard_stopped(self, step: str) -> None:
        """Check that serving is still stopped while ``step`` runs; raises ``ServingRestarted``."""

    def engine_up(self) -> bool:
        """Whether the Docker engine answers (always True on a venv host)."""

    def wait_out_engine(self, step: str, exc: BaseException) -> bool:
        """After ``exc``: True when the Docker engine was away and is back (retry), False when it answered."""


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


#: Engine outages after which a stage the engine ended is still run again in the same window.
ENGINE_RERUNS_MAX = 2


def run_stage(sup: StageHost, step: StageStep) -> bool:
    """Run one stage container to completion within its timeout and the window budget, checking while it runs
    that serving is still stopped (:meth:`StageHost.guard_stopped`). A Docker engine restart is waited out
    (bounded): a stage container that outlived it is waited for further, one that did not is run again in the same
    window (at most :data:`ENGINE_RERUNS_MAX` engine outages), serving not stopped a second time. A container of
    this stage left by an earlier attempt (an engine restart keeps it as exited) is removed before the stage starts.

    Returns:
        True when the stage exited 0.

    Raises:
        Interrupted: SIGTERM/SIGINT. ServingRestarted: serving kept being started (the stage container is
        stopped and removed first). EngineUnavailable: the engine did not come back in time.
    """
    if sup.journal.done(step.name):
        sup.stage_outcomes[step.name] = "ok (earlier)"
        return True
    if not rt.for_spec(step.spec).engine:  # a process of the pipeline environment
        return run_stage_process(sup, step)
    import docker.errors

    name = step.spec["name"]
    try:
        sup.client.containers.get(name).remove(force=True)  # left over from an interrupted attempt
    except docker.errors.NotFound:
        pass
    # The restore's share of the budget is reserved: stages end by deadline - reserve.
    limit = _start_within_budget(sup, step)
    if limit is None:
        return False
    t0 = time.time()
    container = create_container(sup.client, step.spec)
    log_path = sup.wdir / f"{step.name}.log"
    exit_code: int | None = None
    reason, ended = "", ""
    try:
        with log_path.open("ab") as raw:
            log = redact.LineWriter(raw, sup.plan.secret_env)
            th = _follow_logs(container, log)  # the stream ends when the container exits
            try:
                exit_code = _wait_guarded(sup, step.name, container, t0 + limit)
            except EngineEndedStage as exc:
                ended, reason = str(exc), "ended by a Docker engine restart"
            if exit_code is None and not ended:
                reason = _over_reason(step, limit)
                container.stop(timeout=10)
            th.join(timeout=10)
            log.close()
    except (Interrupted, ServingRestarted) as exc:
        reason = "supervisor interrupted" if isinstance(exc, Interrupted) else "stopped: serving kept being started"
        if isinstance(exc, Interrupted) and not sup.engine_up():  # the restarting daemon stops the supervisor
            reason = "ended by a Docker engine restart"
        try:
            container.stop(timeout=10)
        except Exception:  # noqa: BLE001 - the engine may be going down (daemon restart)
            pass
        raise
    finally:
        dt = time.time() - t0
        _remove_stage_container(sup, step.name, container, name)
        _journal_outcome(sup, step.name, exit_code, reason, dt, log_path)
    if ended and sup.engine_waits <= ENGINE_RERUNS_MAX:
        sup.warn(step.name, f"{ended}; running the stage again in this window (its outputs resume), serving not "
                            f"stopped a second time")
        return run_stage(sup, step)
    return exit_code == 0


def _follow_logs(container: Any, log: redact.LineWriter) -> threading.Thread:
    """Start a daemon thread copying the stage container's output into ``log`` until the container stops; returns
    the thread. The client's read timeout (600 s) ends a follow stream when a stage prints nothing for that long:
    the thread follows again from the last second seen while the container still runs (a line printed in that
    second may then appear twice; none is lost). It never raises: the log must never kill the supervisor."""

    def pump() -> None:
        since: int | None = None
        while True:
            try:
                for chunk in container.logs(stream=True, follow=True, since=since):
                    log.write(chunk)
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
    return th


def _remove_stage_container(sup: StageHost, step: str, container: Any, name: str) -> None:
    """Remove the stage's container ``name`` (its output is in ``<stage>.log``); a failed removal is a warning naming the
    command that removes it, or, while the engine is down, a journal note (the stage's next attempt, or the
    window's end, removes it once the engine is back)."""
    try:
        container.remove(force=True)
    except Exception as exc:  # noqa: BLE001 - cleanup only, reported as a warning
        if sup.engine_up():
            sup.warn(step, f"could not remove stage container {name}: {type(exc).__name__}: {exc}; "
                           f"remove it by hand: docker rm --force {name}")
        else:  # the stage's next attempt, or the window's end (Supervisor._remove_left_stages), removes it
            sup.journal.log(step, "info", message=f"stage container {name} left while the Docker engine "
                                                  f"is down; removed once it is back")


def _journal_outcome(sup: StageHost, step: str, exit_code: int | None, reason: str, seconds: float,
                     log_path: Path) -> None:
    """Journal the stage's end and record its outcome and time for the result: ``ok`` on exit 0, else an error
    with ``reason`` (or the exit code) and what the stage's log says (:func:`stage_error`)."""
    sup.stage_times[step] = round(seconds, 1)
    if exit_code == 0:
        sup.journal.log(step, "ok", seconds=round(seconds, 1))
        sup.stage_outcomes[step] = "ok"
        return
    why = reason or f"exited {exit_code}"
    said = stage_error(_tail(log_path)) if exit_code is not None else ""
    why += f": {said}" if said else ""
    sup.journal.log(step, "error", seconds=round(seconds, 1), reason=why)
    sup.stage_outcomes[step] = f"failed ({why})"


def _wait_guarded(sup: StageHost, step: str, container: Any, deadline: float) -> int | None:
    """Wait for the stage container to exit, by ``deadline`` (epoch seconds), checking every ``sup.guard_poll_s``
    seconds that serving is still stopped (:meth:`StageHost.guard_stopped`). Returns the exit code, or None when
    the deadline passed or the engine stopped answering (the caller stops the stage; a restarted supervisor resumes
    the window from its journal).

    Raises:
        Interrupted: SIGTERM/SIGINT. ServingRestarted: serving kept being started (from the guard).
    """
    while True:
        sup.guard_stopped(step)
        left = deadline - time.time()
        if left <= 0:
            return None
        try:
            code = int(container.wait(timeout=max(1.0, min(sup.guard_poll_s, left))).get("StatusCode", -1))
        except Interrupted:
            raise
        except Exception as exc:  # noqa: BLE001 - requests ReadTimeout / ConnectionError: a poll, or the engine
            if sup.engine_up():
                continue
            sup.wait_out_engine(step, exc)  # bounded; raises EngineUnavailable (the restart policy resumes)
            try:  # the engine is back: a stage container that outlived it (live-restore) is waited for further
                container.reload()
                if container.status in ("running", "restarting"):
                    continue
            except Exception:  # noqa: BLE001 - removed with the engine's restart
                pass
            raise EngineEndedStage(f"a Docker engine restart ended the stage container {container.name}") from exc
        try:  # serving started again during the last poll: said (and stopped again); the stage itself is done
            sup.guard_stopped(step)
        except ServingRestarted as exc:
            sup.warn("serving-guard", str(exc))
        return code


class EngineEndedStage(Exception):
    """The stage container did not outlive a Docker engine restart: the stage is run again in the same window
    (its outputs resume), serving not stopped a second time (:func:`run_stage`)."""


def stages_from_journal(sup: StageHost) -> tuple[str, str]:
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


#: Seconds a stage process gets between SIGTERM and SIGKILL (to its whole process group).
STAGE_STOP_GRACE_S = 10.0


def _stop_group(proc: Any, grace_s: float = STAGE_STOP_GRACE_S) -> None:
    """SIGTERM to the stage's process group (it leads its own session), SIGKILL after ``grace_s`` seconds."""
    import os
    import signal
    import subprocess

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_stage_process(sup: StageHost, step: StageStep) -> bool:
    """The venv runtime's stage (``stage_runtime: venv``): ``step.spec`` (from
    :func:`eagle3ops.commands.venv.stage_spec`: ``argv``, ``environment``, ``cwd``) run as a process in a session of
    its own, stdout and stderr appended to ``<stage>.log``, within the stage's limit and the window budget, checking
    every ``sup.guard_poll_s`` seconds that serving is still stopped; journaled as a stage container is (same
    reasons, :func:`stage_error`). Its output reaches the log through a pipe the supervisor reads, so that its
    secrets are masked as a stage container's are (:class:`eagle3ops.redact.LineWriter`). The environment is the supervisor's plus the spec's (the inventory's
    ``stage_env``). A stage still running at its deadline, on an interrupt or when serving keeps being started is
    stopped: SIGTERM to its process group, SIGKILL after :data:`STAGE_STOP_GRACE_S` seconds.

    Returns:
        True when the stage exited 0.

    Raises:
        Interrupted: SIGTERM/SIGINT. ServingRestarted: serving kept being started.
    """
    import os
    import subprocess

    limit = _start_within_budget(sup, step)
    if limit is None:
        return False
    t0 = time.time()
    log_path = sup.wdir / f"{step.name}.log"
    cwd = step.spec.get("cwd") or "/"
    os.makedirs(cwd, exist_ok=True)
    exit_code: int | None = None
    reason = ""
    with log_path.open("ab") as raw:
        log = redact.LineWriter(raw, sup.plan.secret_env)
        pump = None
        try:
            proc = subprocess.Popen(step.spec["argv"], cwd=cwd, env={**os.environ, **step.spec.get("environment", {})},
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            pump = _pump(proc.stdout, log)
        except OSError as exc:  # the environment's python is missing or not executable
            reason = f"could not start {step.spec['argv'][0]}: {exc}"
            proc = None
        try:
            while proc is not None:
                sup.guard_stopped(step.name)
                left = t0 + limit - time.time()
                if left <= 0:
                    reason = _over_reason(step, limit)
                    _stop_group(proc)
                    break
                try:
                    exit_code = proc.wait(timeout=max(0.2, min(sup.guard_poll_s, left)))
                    break
                except subprocess.TimeoutExpired:
                    continue
        except BaseException:  # Interrupted, ServingRestarted: the stage is stopped, the window restores serving
            if proc is not None:
                _stop_group(proc)
            _drain(pump, log)
            dt = time.time() - t0
            sup.stage_times[step.name] = round(dt, 1)
            sup.journal.log(step.name, "error", seconds=round(dt, 1), reason="supervisor interrupted")
            sup.stage_outcomes[step.name] = "failed (supervisor interrupted)"
            raise
        _drain(pump, log)
    dt = time.time() - t0
    sup.stage_times[step.name] = round(dt, 1)
    if exit_code == 0:
        sup.journal.log(step.name, "ok", seconds=round(dt, 1))
        sup.stage_outcomes[step.name] = "ok"
        return True
    why = reason or f"exited {exit_code}"
    said = stage_error(_tail(log_path)) if exit_code is not None else ""
    why += f": {said}" if said else ""
    sup.journal.log(step.name, "error", seconds=round(dt, 1), reason=why)
    sup.stage_outcomes[step.name] = f"failed ({why})"
    return False


def _pump(stream: Any, log: redact.LineWriter) -> Any:
    """Copy a stage process's output pipe into ``log`` on a thread of its own, until the pipe closes (the stage and
    every process that inherited its output have exited). Returns the thread."""
    import os

    def copy() -> None:
        fd = stream.fileno()
        try:
            while chunk := os.read(fd, 1 << 16):
                log.write(chunk)
        except (OSError, ValueError):  # the pipe closed under the read, or the log after the drain's wait
            pass
        finally:
            stream.close()

    th = threading.Thread(target=copy, daemon=True)
    th.start()
    return th


def _drain(pump: Any, log: redact.LineWriter, wait_s: float = 10.0) -> None:
    """Let the output pump finish for at most ``wait_s`` seconds (a child the stage left running may keep the pipe
    open: its later output still reaches the log through the pump), then pass on the last, unended line."""
    if pump is not None:
        pump.join(timeout=wait_s)
    log.close()


def _start_within_budget(sup: StageHost, step: StageStep) -> float | None:
    """Journal the stage's start with its limit in seconds: the stage's own ``timeout_s`` or what is left of the
    maintenance budget once the restore's share (``plan.reserve_s()``) is reserved, whichever is less. None (the
    stage journaled as an error and recorded ``not run (budget)``) when nothing is left."""
    limit = min(step.timeout_s, sup.deadline - sup.plan.reserve_s() - time.time())
    sup.journal.log(step.name, "start", limit_s=round(limit, 1))
    if limit <= 0:
        sup.journal.log(step.name, "error", reason=f"maintenance budget exhausted before the stage started "
                                                    f"({sup.plan.reserve_s():.0f}s of it are reserved for the "
                                                    f"restore)")
        sup.stage_outcomes[step.name] = "not run (budget)"
        return None
    return limit


def _over_reason(step: Any, limit: float) -> str:
    """Why a stage still running at its limit (seconds, from :func:`_start_within_budget`) was stopped: the
    maintenance budget when that was the tighter bound, else the stage's own timeout."""
    return "budget exceeded" if limit < step.timeout_s else f"timed out after {limit:.0f}s"
