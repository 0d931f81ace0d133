"""The runner of a window on the host: the table of steps (record → stop → stages → restore → health gate →
rollback → result) and the one policy every step shares: the journal (each step journals its start and end, and a
restarted supervisor skips what is done), the budget (each gate's limit) and Docker engine waits.

What differs between serving managers (how serving is recorded, stopped, restored, switched to a release, where its
API key is, how a crash shows) is the serving kind's (:mod:`eagle3ops.supervisor.kinds`), chosen once from the plan;
the stage containers are :mod:`.stagerun`'s; releases :mod:`.releases`'; the health poller :mod:`eagle3ops.health`.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

from eagle3ops import redact
from eagle3ops.commands import runtime as rt
from eagle3ops.config.plan import MIN_GATE_S, NO_SERVING_NOTE, Plan, StageStep
from eagle3ops.health import GateFailed, read_api_key_file, wait_healthy
from eagle3ops.supervisor.errors import EngineUnavailable, Interrupted, ServingRestarted
from eagle3ops.supervisor.journal import ENGINE_STEP, Journal, _now, engine_outages, restart_seconds
from eagle3ops.supervisor.kinds import for_plan
from eagle3ops.supervisor.speculate import SpeculateRun
from eagle3ops.supervisor.releases import Releases
from eagle3ops.supervisor.stagerun import create_container, run_stage, stage_error, stages_from_journal

__all__ = ["ENGINE_WAIT_S", "ENGINE_WAITS_MAX", "GUARD_POLL_S", "GUARD_RESTARTS_MAX", "EngineUnavailable",
           "Interrupted", "ServingRestarted", "Supervisor", "socket_accepts", "stage_error"]

#: Seconds the supervisor waits for an unreachable Docker engine (e.g. a daemon restart) before it gives up and
#: exits for its restart policy; such errors are never a verdict on a release.
ENGINE_WAIT_S = 180.0
#: Engine outages one supervisor run waits out before it exits for its restart policy (bounds a flapping engine).
ENGINE_WAITS_MAX = 5
#: Host jobs with their own step table beside the window's (plan kind → the job; ``run()`` gives
#: ``(outcome, error, extra)``): ``speculate`` (:mod:`eagle3ops.supervisor.speculate`).
JOBS = {"speculate": SpeculateRun}
#: Times serving may be found started again during one window's stages (and stopped again) before the stages are
#: stopped and serving restored (an outside restarter that keeps fighting the window).
GUARD_RESTARTS_MAX = 3
#: Seconds between two checks, while a stage runs, that serving is still stopped.
GUARD_POLL_S = 5.0


def socket_accepts(path: str, timeout_s: float = 2.0) -> bool:
    """Whether a unix socket at ``path`` accepts a new connection within ``timeout_s`` seconds (False: refused,
    missing, or no answer)."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(path)
        except OSError:
            return False
    return True


def _secs(seconds: float | None) -> str:
    """An outage's length for the result's note: ``12.3s``, or unknown while no ``back`` is journaled."""
    return "for an unknown time (not back when the result was written)" if seconds is None else f"{seconds:.1f}s"


class _Ran:
    """What :meth:`Supervisor.run` has come to so far: ``outcome``/``error`` (the result's), ``stopped_at`` and
    ``restored_at`` (epoch seconds of serving's stop and restore, None without them), ``extra`` (a job's result
    fields, its audit fields under ``audit``)."""

    def __init__(self) -> None:
        self.outcome, self.error = "ok", ""
        self.stopped_at: float | None = None
        self.restored_at: float | None = None
        self.extra: dict[str, Any] = {}


class Supervisor:
    """Executes a :class:`Plan` against the host's Docker engine (docker SDK ``DockerClient``; None for a plan of
    the venv runtime, whose stages are processes: :func:`eagle3ops.supervisor.stagerun.run_stage_process`); serving
    through the plan's serving kind (:attr:`kind`)."""

    def __init__(self, plan: Plan, client: Any, wdir: Path):
        self.plan, self.client, self.wdir = plan, client, wdir
        self.journal = Journal(wdir / "journal.jsonl", plan.secret_env)
        self.state_dir = Path(plan.state_dir)
        self.releases = Releases(self.state_dir)
        #: End of the budget (epoch seconds): the whole downtime, restore and gates included, ends by then.
        self.deadline = self.journal.first_epoch() + plan.budget_s
        self.stage_times: dict[str, float] = {}
        self.stage_outcomes: dict[str, str] = {}
        #: Set when neither the restore nor any rollback passed the health gate.
        self.unhealthy = False
        #: Seconds to wait for an unreachable Docker engine (:data:`ENGINE_WAIT_S`).
        self.engine_wait_s = ENGINE_WAIT_S
        #: Set by the SIGTERM/SIGINT handler. A stop request while the engine is down is a daemon restart stopping
        #: its containers: waiting then would only hold up the new daemon, which loads containers only once this
        #: one exits (seen: 100 s), so the supervisor exits at once and its restart policy resumes the window.
        self.stop_requested = False
        self.engine_poll_s = 2.0
        self.engine_waits = 0
        #: The engine's unix socket as this process reaches it (``__main__`` sets it from ``DOCKER_HOST``, as
        #: ``docker.from_env`` reads it); None: the ping alone says whether the engine is up (:meth:`engine_up`).
        self.engine_socket: str | None = None
        #: Seconds between two checks during a stage that serving is still stopped (:meth:`guard_stopped`).
        self.guard_poll_s = GUARD_POLL_S
        #: The serving kind of the plan (:class:`eagle3ops.supervisor.kinds.ServingKind`), chosen once.
        self.kind = for_plan(self)

    def warn(self, step: str, message: str) -> None:
        """Journal a warning; every warning of the window goes, whole, into ``result.json`` and the audit entry."""
        self.journal.log(step, "warn", message=message)

    def warnings(self) -> list[str]:
        """Every warning journaled by this window (all attempts), in order, never cut."""
        return [f"{e['step']}: {e.get('message', '')}" for e in self.journal.entries if e.get("event") == "warn"]

    # the steps: journal and resume rules here, the serving manager's part in the kind
    def record(self) -> None:
        """Record live serving (the kind's :meth:`~eagle3ops.supervisor.kinds.ServingKind.record`), once."""
        if self.journal.done("record"):
            return
        self.journal.log("record", "start")
        self.kind.record()

    def stop_serving(self) -> None:
        """Stop serving (the kind's ``stop``), once."""
        if self.journal.done("stop"):
            return
        self.journal.log("stop", "start")
        self.kind.stop()

    def run_stage(self, step: StageStep) -> bool:
        """Run one stage container (:func:`eagle3ops.supervisor.stagerun.run_stage`); True when it exited 0."""
        return run_stage(self, step)

    def restore(self) -> str:
        """Bring serving back, health-gated (the kind's ``restore``): ``"restored"`` or ``"rolled back to release
        N"``.

        Raises:
            RuntimeError: neither the restore nor a rollback passed the health gate.
            EngineUnavailable: the engine stayed unreachable for ``engine_wait_s`` seconds.
        """
        self.journal.log("restore", "start")
        return self.kind.restore()

    def replace_serving(self) -> str:
        """``release``/``rollback`` plans: record live serving, then the kind's ``switch`` to the target release,
        health-gated, rolled back on a failed gate.

        Raises:
            RuntimeError: no target, a kind that has no releases, or neither the target nor a fallback passed.
            FileNotFoundError: ``to_release`` names a release that is not retained.
        """
        self.record()
        return self.kind.switch()

    # what tests and older callers reach through the runner
    def _serving(self) -> Any | None:
        return self.kind.live_container()

    def _new_release(self) -> dict[str, Any]:
        return self.kind.new_release()  # type: ignore[attr-defined]

    def _wait_gpus_free(self, timeout: float = 300.0, poll_s: float = 2.0) -> None:
        self.kind.wait_gpus_free(timeout=timeout, poll_s=poll_s)  # type: ignore[attr-defined]

    _wait_out_engine = property(lambda self: self.wait_out_engine)

    def _create(self, spec: dict[str, Any], image_id: str | None = None) -> Any:
        return create_container(self.client, spec, image_id=image_id)

    # the policy: engine waits, budget, gates
    def wait_out_engine(self, step: str, exc: BaseException) -> bool:
        """After ``exc``: when the Docker engine does not answer, wait (bounded) for it to come back.

        Returns:
            True when the engine was unreachable and is back (retry the step); False when the engine answered all
            along (``exc`` is a real failure of the step).

        Raises:
            EngineUnavailable: still unreachable after ``engine_wait_s`` seconds, or the engine went away more than
                :data:`ENGINE_WAITS_MAX` times in this run.
        """
        if self.engine_up():
            return False
        self.engine_down(step, exc)
        if self.stop_requested:
            raise EngineUnavailable(f"stop requested while the Docker engine is down (a daemon restart): exiting "
                                    f"at once ({exc})")
        self.engine_waits += 1
        if self.engine_waits > ENGINE_WAITS_MAX:
            raise EngineUnavailable(f"the Docker engine went away {self.engine_waits} times in this run ({exc})")
        self.warn(step, f"Docker engine unreachable ({type(exc).__name__}: {exc}); waiting up to "
                        f"{self.engine_wait_s:.0f}s for it; this is not a verdict on any release")
        deadline = time.time() + self.engine_wait_s
        while time.time() < deadline:
            time.sleep(self.engine_poll_s)
            if self.engine_up():
                self.engine_back()
                self.journal.log(step, "info", message="Docker engine is back; retrying")
                return True
        raise EngineUnavailable(f"the Docker engine did not answer within {self.engine_wait_s:.0f}s ({exc})")

    def engine_down(self, step: str, exc: BaseException) -> None:
        """Journal that the Docker engine stopped answering during window step ``step`` (``engine``/``down``), once
        per outage: the result's ``engine_outages`` (:func:`eagle3ops.supervisor.journal.engine_outages`) and its
        note are read from these entries, across the supervisor's restarts."""
        last = self.journal.last(ENGINE_STEP)
        if last is None or last["event"] != "down":
            self.journal.log(ENGINE_STEP, "down", during=step, reason=f"{type(exc).__name__}: {exc}"[-300:])

    def engine_back(self) -> None:
        """Journal that the engine answers again (``engine``/``back``, with the outage's seconds) when an outage is
        open: called when a wait sees it back, and at the start of a supervisor its restart policy started again
        after the daemon restart stopped it."""
        last = self.journal.last(ENGINE_STEP)
        if last is not None and last["event"] == "down":
            secs = round(time.time() - last["epoch"], 1)
            self.journal.log(ENGINE_STEP, "back", during=last.get("during"), seconds=secs, message=(
                f"the Docker engine answers again after {secs:.1f}s (down during {last.get('during')}); "
                f"the window goes on where it was"))

    def guard_stopped(self, step: str) -> None:
        """While stage ``step`` runs: serving must still be stopped (the kind's ``started_again``). Serving found
        running again is killed (no graceful timeout: this window stopped it already) and a warning says so; the
        result counts these outside restarts (``outside_restarts``, ``outcome_note``: :meth:`outside_restarts`).
        Found more than :data:`GUARD_RESTARTS_MAX` times in this window, the stages are stopped.

        Raises:
            ServingRestarted: serving kept being started; the stage runner removes the stage container and the
                window restores serving.
        """
        try:
            found = self.kind.started_again()
        except Interrupted:
            raise
        except Exception as exc:  # noqa: BLE001 - an engine outage is the stage wait's to handle; else said, go on
            if self.engine_up():
                self.warn("serving-guard", f"could not check that serving is still stopped: "
                                           f"{type(exc).__name__}: {exc}")
            return
        if not found:
            return
        n = self.outside_restarts() + 1
        if n > GUARD_RESTARTS_MAX:
            raise ServingRestarted(
                f"serving kept being started during the stages ({n} times; last: {found}) by something outside this "
                f"window (a restart policy, a cron or systemd job, an operator): stages stopped, serving restored; "
                f"disable that restarter during windows (e.g. `--restart unless-stopped` on the serving container)")
        self.journal.log("serving-guard", "warn", found=found, message=(
            f"serving was started again during stage {step} ({found}) by something outside this window; killed it "
            f"(no graceful stop: this window had stopped it) ({n} of at most {GUARD_RESTARTS_MAX})"))

    def outside_restarts(self) -> int:
        """Times serving was found started again from outside during this window's stages (all attempts) and
        killed again by :meth:`guard_stopped`."""
        return len([e for e in self.journal.entries if e["step"] == "serving-guard" and e.get("event") == "warn"
                    and "found" in e])

    def gate_timeout(self) -> float:
        """Seconds the next health gate may wait: ``health.timeout_s``, cut to what is left of the budget; once the
        budget is spent, :data:`MIN_GATE_S` (serving first; the overrun is recorded as a warning)."""
        left = self.deadline - time.time()
        if left >= MIN_GATE_S:
            return min(self.plan.health.timeout_s, left)
        if left < self.plan.health.timeout_s:
            self.warn("budget", f"maintenance budget ({self.plan.budget_s:.0f}s) "
                                f"{'spent' if left <= 0 else f'nearly spent ({left:.0f}s left)'} before serving passed "
                                f"its health gate; this gate still waits up to {MIN_GATE_S:.0f}s to bring serving back")
        return min(self.plan.health.timeout_s, MIN_GATE_S)

    def gate_through_signal(self, timeout_s: float | None = None) -> None:
        """:meth:`gate`, finished even when the first SIGTERM/SIGINT lands during it: the signal handler raises
        :class:`Interrupted` once and ignores later signals, and a stop request during a restore must not turn a
        healthy start into a rollback. ``timeout_s``: the gate's limit (default :meth:`gate_timeout`)."""
        timeout_s = self.gate_timeout() if timeout_s is None else timeout_s
        try:
            self.gate(timeout_s=timeout_s)
        except Interrupted as exc:
            self.warn("health", f"{exc}; finishing the health gate before exiting")
            self.gate(timeout_s=timeout_s)

    def gate(self, timeout_s: float | None = None) -> None:
        """Health gate on serving (:func:`eagle3ops.health.wait_healthy`): /health 200, /v1/models lists the served
        model, one completion returns text; with the API key serving itself requires (the kind's ``api_key``), else
        the one in ``health.api_key_file``.

        Waits up to ``timeout_s`` seconds (default ``health.timeout_s``) for a slow start, but fails at once when the
        kind's crash check says serving has crashed.

        Raises:
            GateFailed: the gate did not pass in time, or serving stopped (a verdict on the release).
            Exception: docker SDK / connection errors while inspecting the container (the engine is unreachable):
                not a verdict; callers wait the engine out.
        """
        h = self.plan.health
        assert h is not None  # plans with serving have a gate
        timeout_s = h.timeout_s if timeout_s is None else timeout_s
        self.journal.log("health", "start", timeout_s=round(timeout_s, 1))
        crashed = self.kind.crash_check()
        try:
            models = wait_healthy(f"http://127.0.0.1:{h.port}", h.model, timeout_s=timeout_s,
                                  interval_s=h.interval_s, api_key=self.api_key, crashed=crashed)
        except GateFailed as exc:
            self.journal.log("health", "error", reason=str(exc)[-800:])
            raise
        self.journal.log("health", "ok", models=models)

    def api_key(self) -> str | None:
        """The API key serving requires: from serving's own configuration (the kind's ``api_key``), else from the
        secret file the inventory names (``health.api_key_file``); None when neither has one. Never logged."""
        key = self.kind.api_key()
        assert self.plan.health is not None
        if key is None and self.plan.health.api_key_file:
            key = read_api_key_file(self.plan.health.api_key_file)
        return key

    # the whole window
    def run(self) -> dict[str, Any]:
        """Execute the plan; always restores serving; writes ``result.json``, the audit line, releases the lock.

        The steps: the engine's return noted (a restart policy started this supervisor again) → the plan carried out
        (:meth:`_carry_out`) → an engine going down ends here with no result (exit 75: the restart policy resumes
        the window) → a window's left stage containers removed → the result (:meth:`_result`) and the audit line →
        the lock released when serving is healthy → ``result.json`` last."""
        t0 = self.journal.first_epoch()
        ran = _Ran()
        if self.engine_up():  # started again by the restart policy after a daemon restart stopped it
            self.engine_back()
        try:
            self._carry_out(ran)
        except EngineUnavailable as exc:
            self.journal.log("supervisor", "error", reason=f"{exc}; exiting so that the restart policy resumes this "
                                                           f"window when the engine is back (no verdict recorded)")
            raise SystemExit(75) from None
        except Exception as exc:  # noqa: BLE001 - recorded, then reported through the result
            ran.outcome, ran.error = "failed", f"{type(exc).__name__}: {exc}"
            self.journal.log("supervisor", "error", reason=ran.error[-1000:])
        if not self.engine_up():
            # The Docker engine is going down (daemon restart): leave no result, exit non-zero, and let the restart
            # policy (on-failure) start this supervisor again once the engine is back; it resumes from the journal.
            self.journal.log("supervisor", "error", reason="Docker engine unavailable; exiting so that the restart "
                                                           "policy resumes this window when the engine is back")
            raise SystemExit(75)
        if self.plan.kind == "window":
            self._remove_left_stages()
        result, serving_ok = self._result(ran, t0)
        self._audit(ran, result)
        if serving_ok:
            self._release_lock()
        self.journal.log("supervisor", "done", outcome=ran.outcome)
        # Last: the driver removes this container as soon as it sees the result.
        tmp = self.wdir / "result.json.tmp"
        tmp.write_text(json.dumps(result, indent=2))
        tmp.replace(self.wdir / "result.json")
        return result

    def _carry_out(self, ran: _Ran) -> None:
        """The plan by its kind: stages only (no serving to manage), a window (:meth:`_window`), a job with its own
        step table (:data:`JOBS`), or a release/rollback (the kind's switch)."""
        if not self.kind.manages:
            ran.outcome, ran.error = self._stages_only()
        elif self.plan.kind == "window":
            self._window(ran)
        elif self.plan.kind in JOBS:  # its own step table
            ran.outcome, ran.error, ran.extra = JOBS[self.plan.kind](self).run()
        else:
            msg = self.replace_serving()
            if "rolled back" in msg:
                ran.outcome, ran.error = "failed", msg

    def _window(self, ran: _Ran) -> None:
        """A window: serving recorded, stopped and the stages run (or, resumed once the restore had begun, the
        stages' outcome from the journal), then serving restored whatever happened, unless the engine is going
        down (its restart policy resumes the window)."""
        self.record()  # nothing is stopped before this succeeds
        leaving = False  # for the engine: no restore can begin while it is down
        try:
            if self.journal.first("restore", "start") is None:
                ran.outcome, ran.error = self._stop_and_run_stages()
            else:  # resumed once serving was already being restored: never run stages beside it
                ran.outcome, ran.error = stages_from_journal(self)
                self.warn("supervisor", "resumed after the restore had begun; stages are not run again")
        except Interrupted as exc:
            ran.outcome, ran.error = "interrupted", str(exc)
        except EngineUnavailable as exc:
            leaving = not self.engine_up()
            if leaving:  # its restart policy starts it again once the engine is back: the window resumes
                raise
            ran.outcome, ran.error = "failed", f"{type(exc).__name__}: {exc}"
            self.journal.log("supervisor", "error", reason=ran.error[-1000:])
        except Exception as exc:  # noqa: BLE001 - whatever broke, serving is restored below
            ran.outcome, ran.error = "failed", f"{type(exc).__name__}: {exc}"
            self.journal.log("supervisor", "error", reason=ran.error[-1000:])
        finally:
            if not leaving:
                # Downtime counts from the moment the stop began (serving refuses requests from then on).
                stopped = self.journal.first("stop", "start")
                ran.stopped_at = stopped["epoch"] if stopped else None
                restore_msg = self.restore()
                ran.restored_at = time.time()
                if restore_msg != "restored":
                    ran.outcome = "failed" if ran.outcome == "ok" else ran.outcome
                    ran.error = (ran.error + "; " if ran.error else "") + f"serving {restore_msg}"

    def _result(self, ran: _Ran, t0: float) -> tuple[dict[str, Any], bool]:
        """The window's result (secrets masked) and whether serving is healthy; serving that is not running or not
        healthy fails the window and keeps the lock (``recover`` retries the restore)."""
        no_serving = not self.kind.manages
        running = self.kind.running()
        serving_ok = no_serving or (bool(running) and not self.unhealthy)
        if not serving_ok:
            ran.error = (ran.error + "; " if ran.error else "") + (
                f"SERVING IS NOT {'HEALTHY' if running else 'RUNNING'} on {self.plan.host}: the lock stays held; "
                f"`eagle3ops recover {shlex.quote(self.plan.host)}` retries the restore")
            ran.outcome = "failed"
        outside = self.outside_restarts()
        outages = engine_outages(self.journal.entries)
        notes = [f"serving was started from outside {outside} time{'s' if outside > 1 else ''} during the stages (a "
                 f"restart policy, a cron or systemd job, an operator) and killed again each time; disable that "
                 f"restarter during windows"] if outside else []
        notes += [f"the Docker engine was down {_secs(o['seconds'])} during {o['step']} (a daemon restart or crash; "
                  f"not a verdict on any release) and the window waited it out" for o in outages]
        result = {
            "window_id": self.plan.window_id, "kind": self.plan.kind, "outcome": ran.outcome, "error": ran.error,
            # serving started from outside during the stages (and killed again): the stages shared the host with it
            # for a poll each time, so the outcome is not a plain ok; `outcome` itself keeps its values (the fleet
            # and the CLI's exit status read it), the note says what else happened
            # the engine's outages during the window (the step each ended or held up, how long): a stage one ended
            # ran again in the window, so `stages` alone does not say the window lost time to the engine
            "outside_restarts": outside, "engine_outages": outages,
            **({"outcome_note": "; ".join(notes)} if notes else {}),
            "stages": self.stage_outcomes, "stage_seconds": self.stage_times,
            "downtime_s": (round((ran.restored_at or time.time()) - ran.stopped_at, 1) if ran.stopped_at
                           else None),
            "wall_s": round(time.time() - t0, 1), "serving_running": running,
            "serving_healthy": None if no_serving else serving_ok, "serving": self.plan.serving_kind,
            **({"serving_note": NO_SERVING_NOTE} if no_serving else {}),
            # Whether this plan keeps releases is the kind's (ServingKind.keeps_release): containers always, a process
            # in its release and rollback plans only, a host without serving never.
            "release": self.releases.current() if self.kind.keeps_release() else None,
            # The release live when the window began, as its record step found it (None before any record).
            "release_before": (self.journal.first("record", "ok") or {}).get("release"),
            "finished": _now(), "warnings": self.warnings(),
            # Seconds of each serving restart (restore, switch, rollback: start to passed gate); the plans of later
            # jobs on this host read them (eagle3ops.speculate.restarts).
            "restarts_s": restart_seconds(self.journal.entries),
            **{k: v for k, v in ran.extra.items() if k != "audit"},
        }
        return redact.value(result, self.plan.secret_env), serving_ok

    def _audit(self, ran: _Ran, result: dict[str, Any]) -> None:
        """The window's line in ``audit.jsonl`` (secrets masked), the file kept the SSH user's."""
        audit = self.state_dir / "audit.jsonl"
        with audit.open("a") as f:
            f.write(json.dumps(redact.value({"t": _now(), "user": self.plan.user, "host": self.plan.host,
                                "command": self.plan.command, "window": self.plan.window_id,
                                "outcome": ran.outcome, "error": ran.error, "release": result["release"],
                                "outside_restarts": result["outside_restarts"],
                                "engine_outages": result["engine_outages"],
                                "warnings": result["warnings"],
                                # serving's stop → restore interval (epoch seconds; None without a stop): a fleet
                                # run's down-at-once bound is checked from these lines
                                "stopped_at": ran.stopped_at, "restored_at": ran.restored_at,
                                "downtime_s": result["downtime_s"], **ran.extra.get("audit", {})},
                                            self.plan.secret_env)) + "\n")
        # The driver appends to the same log as the SSH user (windows that never started): keep it theirs.
        st = self.state_dir.stat()
        try:
            os.chown(audit, st.st_uid, st.st_gid)
        except OSError:
            pass

    def _stop_and_run_stages(self) -> tuple[str, str]:
        """A window's stop and stages through Docker engine outages: when a step fails because the engine stopped
        answering, the outage is waited out (:meth:`wait_out_engine`, bounded) and the steps go on from the journal
        in this window: finished stages are skipped, the one the outage ended is run again (its container, left by
        the engine's restart, removed first: :func:`eagle3ops.supervisor.stagerun.run_stage`), serving is not
        stopped a second time, and the budget still bounds every stage.

        Returns:
            (outcome, error) of the stages.

        Raises:
            EngineUnavailable: the engine did not come back within ``engine_wait_s``, went away too often, or the
                restarting daemon is stopping this supervisor (SIGTERM while it is down): the caller exits without
                beginning the restore (nothing can be restored while the engine is down) and the restart policy
                starts this supervisor again once the engine is back, which resumes the window here.
            Interrupted: SIGTERM/SIGINT while the engine answers (an operator's stop): serving is restored.
        """
        while True:
            step_name = "stop"
            try:
                self.stop_serving()
                for step in self.plan.stages:
                    step_name = step.name
                    if not self.run_stage(step):
                        return "failed", f"stage {step.name}: {self.stage_outcomes[step.name]}"
                return "ok", ""
            except Exception as exc:  # Interrupted included: a daemon restart stops this supervisor with SIGTERM
                if self.engine_up() or not self.wait_out_engine(step_name, exc):
                    raise

    def _remove_left_stages(self) -> None:
        """Remove this window's stage containers that are still on the engine (an engine restart ended a stage
        whose container it then kept as exited; a resumed supervisor that ran no stage again found it): nothing
        of a window stays behind once it has a result. A container that cannot be removed is a warning naming the
        command that removes it."""
        if self.client is None or not self.engine_up():
            return
        import docker.errors

        for step in self.plan.stages:
            name = step.spec.get("name")
            if not name or not rt.for_spec(step.spec).engine:  # a process: no container to remove
                continue
            try:
                self.client.containers.get(name).remove(force=True)
            except docker.errors.NotFound:
                continue
            except Exception as exc:  # noqa: BLE001 - cleanup only, reported as a warning (once per container)
                if not any(f"could not remove stage container {name}:" in w for w in self.warnings()):
                    self.warn(step.name, f"could not remove stage container {name}: {type(exc).__name__}: {exc}; "
                                         f"remove it by hand: docker rm --force {name}")
                continue
            self.journal.log(step.name, "info", message=f"removed stage container {name}, left by an earlier attempt")

    def _stages_only(self) -> tuple[str, str]:
        """A window on a host without production serving (``serving: none``): journal that the stop, restore and
        health gate are skipped, then run the stages (a resumed supervisor skips finished ones). A ``release`` or
        ``rollback`` plan for such a host is refused (the driver refuses it first).

        Returns:
            (outcome, error) of the stages.
        """
        if self.plan.kind != "window":
            self.kind.switch()  # refuses
        if self.journal.first("serving", "skip") is None:
            self.journal.log("serving", "skip", message=NO_SERVING_NOTE)
        try:
            for step in self.plan.stages:
                if not run_stage(self, step):
                    return "failed", f"stage {step.name}: {self.stage_outcomes[step.name]}"
        except Interrupted as exc:
            return "interrupted", str(exc)
        return "ok", ""

    def engine_up(self) -> bool:
        """Whether the Docker engine answers: its ping passes and, when :attr:`engine_socket` is known, its socket
        accepts a new connection. A restarting daemon closes its listener first and keeps serving the connections
        already open until it exits (Docker 20.10's API server closes only its listeners on shutdown; seen here:
        pings over the client's pooled connection passed while every new request was refused), so a ping alone
        would call a daemon that is going down "up" and turn its restart into a failed restore."""
        if self.client is None:  # the venv runtime: no engine to wait for
            return True
        try:
            if not self.client.ping():
                return False
        except Exception:  # noqa: BLE001 - any failure means "not reachable"
            return False
        return self.engine_socket is None or socket_accepts(self.engine_socket)

    def _release_lock(self) -> None:
        lock = self.state_dir / "lock"
        details = lock / "details.json"
        try:
            holder = json.loads(details.read_text()).get("window_id")
        except (OSError, ValueError):
            holder = None
        if holder == self.plan.window_id:
            import shutil

            shutil.rmtree(lock, ignore_errors=True)
