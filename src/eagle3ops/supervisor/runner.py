"""The runner of a window on the host: record → stop → stages → restore → health gate → rollback → result.

Why this module is long (~790 lines): it is one state machine. Every step (record, stop, each stage, restore, the
switch of a release, each rollback) journals its start and end, waits out Docker engine outages with the same
bounded wait, takes its time from the same budget and goes through the same "serving comes back" exit path; the
resume rules (what a restarted supervisor skips) read across all of them. The parts with a job of their own are
already apart: :mod:`.journal`, :mod:`.releases`, :mod:`.process` (the ``process`` serving kind's steps),
:mod:`eagle3ops.health` (the health poller) and the container records in :mod:`eagle3ops.commands.serving`.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

from eagle3ops.commands import host as hc
from eagle3ops.commands import serving as sv
from eagle3ops.config.plan import MIN_GATE_S, NO_SERVING_NOTE, RECORD_GATE_S, Plan, ReleaseChange, StageStep
from eagle3ops.health import GateFailed, api_key_from_inspect, read_api_key_file, wait_healthy
from eagle3ops.supervisor.journal import Journal, _now, _tail
from eagle3ops.supervisor.process import ProcessServing
from eagle3ops.supervisor.releases import Releases, write_private


class Interrupted(Exception):
    """SIGTERM/SIGINT reached the supervisor: stop the current stage and restore serving."""



class EngineUnavailable(RuntimeError):
    """The Docker engine did not answer within the bounded wait: not a verdict on any release. The supervisor
    exits (status 75) without a result so that its restart policy resumes the window when the engine is back."""


#: Seconds the supervisor waits for an unreachable Docker engine (e.g. a daemon restart) before it gives up and
#: exits for its restart policy; such errors are never a verdict on a release.
ENGINE_WAIT_S = 180.0
#: Engine outages one supervisor run waits out before it exits for its restart policy (bounds a flapping engine).
ENGINE_WAITS_MAX = 5


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


class Supervisor(ProcessServing):
    """Executes a :class:`Plan` against the host's Docker engine (docker SDK ``DockerClient``)."""

    def __init__(self, plan: Plan, client: Any, wdir: Path):
        self.plan, self.client, self.wdir = plan, client, wdir
        self.journal = Journal(wdir / "journal.jsonl")
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
        #: Kind ``process``: suffix of the agent's files for the process it started last (``""``, ``".2"``...).
        self._process_suffix = ""

    def warn(self, step: str, message: str) -> None:
        """Journal a warning; every warning of the window goes, whole, into ``result.json`` and the audit entry."""
        self.journal.log(step, "warn", message=message)

    def warnings(self) -> list[str]:
        """Every warning journaled by this window (all attempts), in order, never cut."""
        return [f"{e['step']}: {e.get('message', '')}" for e in self.journal.entries if e.get("event") == "warn"]

    # docker helpers
    def _serving(self) -> Any | None:
        import docker.errors

        try:
            return self.client.containers.get(self.plan.serving_container)
        except docker.errors.NotFound:
            return None

    def _create(self, spec: dict[str, Any], image_id: str | None = None) -> Any:
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
        return self.client.containers.run(detach=True, **kw)

    def _recreate(self, record: dict[str, Any]) -> Any:
        """Create and start the serving container from a record (:func:`eagle3ops.commands.serving.container_record`)
        through the Engine API, every ``Config``/``HostConfig`` field as recorded. The image stays the recorded
        reference while it still resolves to the recorded image id; a re-tagged reference is replaced by the id (a
        release never changes image silently)."""
        import docker.errors

        image = None
        ref, want = record["Config"].get("Image"), record.get("ImageId")
        if want and ref != want:
            try:
                if self.client.images.get(ref).id != want:
                    image = want
            except docker.errors.ImageNotFound:
                image = want
        body, more = sv.create_request(record, image=image)
        cid = self.client.api.create_container_from_config(body, name=self.plan.serving_container)["Id"]
        for net, ep in more.items():
            ipam = ep.get("IPAMConfig") or {}
            self.client.api.connect_container_to_network(
                cid, net, aliases=ep.get("Aliases"), links=ep.get("Links"), driver_opt=ep.get("DriverOpts"),
                ipv4_address=ipam.get("IPv4Address"), ipv6_address=ipam.get("IPv6Address"),
                link_local_ips=ipam.get("LinkLocalIPs"))
        self.client.api.start(cid)
        return self.client.containers.get(cid)

    def _create_release(self, rel: dict[str, Any]) -> Any:
        """Create and start retained release ``rel`` (:meth:`Releases.get`): its whole recorded container, or the
        docker SDK spec of a release recorded before releases kept the whole configuration."""
        if "container" in rel:
            return self._recreate(rel["container"])
        return self._create(rel["spec"], image_id=rel.get("image_id"))

    def _remove_serving(self) -> None:
        c = self._serving()
        if c is not None:
            c.stop(timeout=self.plan.stop_timeout_s)
            c.remove(force=True)

    # steps
    def record(self) -> None:
        """Save the serving container's full inspect output and make sure it is a retained release."""
        if self.journal.done("record"):
            return
        self.journal.log("record", "start")
        if self.plan.serving_kind == "process":
            argv = self._process_argv()
            self.journal.log("record", "ok", pid=self.plan.process_pid, argv=argv, cwd=self._process_file("cwd"),
                             uid=self._process_file("uid"))
            return
        c = self._serving()
        if c is None:
            raise RuntimeError(f"serving container {self.plan.serving_container!r} does not exist on the host")
        inspect = c.attrs
        write_private(self.wdir / "serving-inspect.json", json.dumps(inspect, indent=2))
        recorded = None
        current = self.releases.current()
        label = ((inspect.get("Config") or {}).get("Labels") or {}).get(sv.RELEASE_LABEL)
        # The live container is the current release when it carries its label, or an earlier window adopted it.
        live_is_current = label == str(current) or self.releases.is_adopted(current, inspect.get("Id"))
        if current is not None and not live_is_current:
            # Serving was recreated outside eagle3ops (by hand, or the demo's provisioning): the live container is
            # not the release the state dir calls current, so rollbacks must not treat that one as live.
            self.warn("record", f"serving container {self.plan.serving_container!r} is not release {current} (its "
                                f"{sv.RELEASE_LABEL} label is {label!r}): it was recreated outside eagle3ops; "
                                "recording it as a new release")
        if not live_is_current:
            # Retained so that a restore can recreate it, but live only when it runs and passes its gate now.
            recorded = self.releases.add(sv.container_record(inspect), self.plan.window_id)
            if label != str(recorded):
                self.releases.adopt(recorded, inspect.get("Id") or "")
            c.reload()
            if c.status != "running":
                self.warn("record", f"serving container {self.plan.serving_container!r} is {c.status!r}, not running: "
                                    f"recorded as release {recorded} but not as a live release (no rollback "
                                    f"targets it)")
            else:
                try:
                    self._gate_through_signal(RECORD_GATE_S)
                    self.releases.set_current(recorded)
                except GateFailed as exc:
                    self.warn("record", f"serving container {self.plan.serving_container!r} did not pass the health "
                                        f"gate ({exc}): recorded as release {recorded} but not as a live release")
        self.journal.log("record", "ok", release=self.releases.current(), recorded=recorded,
                         image_id=inspect.get("Image"))

    def stop_serving(self) -> None:
        """Stop serving gracefully (``stop_timeout_s``, then SIGKILL) and wait for the GPUs to be released."""
        if self.journal.done("stop"):
            return
        self.journal.log("stop", "start")
        if self.plan.serving_kind == "process":
            self._process_stop()
            return
        c = self._serving()
        if c is not None and c.status == "running":
            c.stop(timeout=self.plan.stop_timeout_s)
        self.journal.log("stop", "ok")
        if self.plan.gpus and self.plan.stages:  # the GPU check runs in the stages' image
            try:
                self._wait_gpus_free()
            except Interrupted:
                raise
            except Exception as exc:  # noqa: BLE001 - a failing check must not keep serving down; stages may fail
                self.warn("gpu-release", f"could not check GPU memory: {exc}")

    def _wait_gpus_free(self, timeout: float = 300.0, poll_s: float = 2.0) -> None:
        """Poll ``nvidia-smi --query-compute-apps=pid`` in a throwaway container (the pipeline image, all GPUs)
        until no process holds GPU memory, so stages do not start while the stopped server still frees it.

        After ``timeout`` seconds it logs a warning and goes on (a stage then fails on its own if memory is short).
        """
        import docker.types

        self.journal.log("gpu-release", "start")
        image = self.plan.stages[0].spec["image"]
        deadline = time.time() + timeout
        holders = ""
        while time.time() < deadline:
            argv = hc.gpu_compute_pids()
            holders = self.client.containers.run(
                image, entrypoint=argv[:1], command=argv[1:],
                device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])], remove=True,
                pid_mode="host",  # other containers' processes are invisible to nvidia-smi in its own PID namespace
            ).decode().strip()
            if not holders:
                self.journal.log("gpu-release", "ok", seconds=round(timeout - (deadline - time.time()), 1))
                return
            time.sleep(poll_s)
        self.warn("gpu-release", f"GPU memory still held after stop by pids {holders.split()}; continuing")

    def run_stage(self, step: StageStep) -> bool:
        """Run one stage container to completion within its timeout and the window budget.

        Returns:
            True when the stage exited 0.
        """
        import docker.errors

        if self.journal.done(step.name):
            self.stage_outcomes[step.name] = "ok (earlier)"
            return True
        name = step.spec["name"]
        try:
            self.client.containers.get(name).remove(force=True)  # left over from an interrupted attempt
        except docker.errors.NotFound:
            pass
        # The restore's share of the budget is reserved: stages end by deadline - reserve.
        budget_left = self.deadline - self.plan.reserve_s() - time.time()
        limit = min(step.timeout_s, budget_left)
        self.journal.log(step.name, "start", limit_s=round(limit, 1))
        if limit <= 0:
            self.journal.log(step.name, "error", reason=f"maintenance budget exhausted before the stage started "
                                                        f"({self.plan.reserve_s():.0f}s of it are reserved for the "
                                                        f"restore)")
            self.stage_outcomes[step.name] = "not run (budget)"
            return False
        t0 = time.time()
        container = self._create(step.spec)
        log_path = self.wdir / f"{step.name}.log"
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
            self.stage_times[step.name] = round(dt, 1)
            try:  # its output is in <stage>.log; the exit code goes into the journal below
                container.remove(force=True)
            except Exception as exc:  # noqa: BLE001 - cleanup only, reported as a warning
                self.warn(step.name, f"could not remove stage container {name}: {type(exc).__name__}: {exc}; "
                                     f"remove it by hand: docker rm --force {name}")
            if exit_code == 0:
                self.journal.log(step.name, "ok", seconds=round(dt, 1))
                self.stage_outcomes[step.name] = "ok"
            else:
                why = reason or f"exited {exit_code}"
                said = stage_error(_tail(log_path)) if exit_code is not None else ""
                why += f": {said}" if said else ""
                self.journal.log(step.name, "error", seconds=round(dt, 1), reason=why)
                self.stage_outcomes[step.name] = f"failed ({why})"
        return exit_code == 0

    def restore(self) -> str:
        """Bring serving back: start the stopped container, or recreate it from the recorded spec; health-gate it.

        Engine errors (the Docker engine unreachable, e.g. a daemon restart) are waited out for up to
        ``engine_wait_s`` seconds and the restore is retried; they are never a verdict on the release. Only a
        completed health gate that failed (:class:`GateFailed`) marks the release failed; any other error with the
        engine up still leads to a rollback (serving must come back) but leaves the release unjudged.

        Returns:
            ``"restored"`` or ``"rolled back to release N"``.

        Raises:
            RuntimeError: neither the restore nor the rollback passed the health gate.
            EngineUnavailable: the engine stayed unreachable for ``engine_wait_s`` seconds.
        """
        self.journal.log("restore", "start")
        if self.plan.serving_kind == "process":
            return self._process_restore()
        while True:
            try:
                c = self._serving()
                if c is None:
                    inspect = json.loads((self.wdir / "serving-inspect.json").read_text())
                    self._recreate(sv.container_record(inspect))
                elif c.status != "running":
                    c.start()
                self._gate_through_signal()
            except Exception as exc:  # noqa: BLE001 - any failure leads to the engine wait or the rollback path
                if self._wait_out_engine("restore", exc):
                    continue  # the engine is back: the same restore again, not a rollback
                verdict = isinstance(exc, GateFailed)
                self.journal.log("restore", "error", reason=str(exc)[-500:], verdict=verdict)
                return self._rollback_after_failure(str(exc), verdict=verdict)
            self._confirm_restored()
            self.journal.log("restore", "ok")
            return "restored"

    def _confirm_restored(self) -> None:
        """The restored container passed its gate: it is the live release (this clears an earlier failure mark; a
        container first recorded by this window without a gate becomes live now)."""
        n = self.releases.current()
        if n is None:
            rec = self.journal.first("record", "ok")
            n = rec.get("recorded") if rec else None
        if n is not None:
            self.releases.confirm_live(n)

    def _wait_out_engine(self, step: str, exc: BaseException) -> bool:
        """After ``exc``: when the Docker engine does not answer, wait (bounded) for it to come back.

        Returns:
            True when the engine was unreachable and is back (retry the step); False when the engine answered all
            along (``exc`` is a real failure of the step).

        Raises:
            EngineUnavailable: still unreachable after ``engine_wait_s`` seconds, or the engine went away more than
                :data:`ENGINE_WAITS_MAX` times in this run.
        """
        if self._engine_up():
            return False
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
            if self._engine_up():
                self.journal.log(step, "info", message="Docker engine is back; retrying")
                return True
        raise EngineUnavailable(f"the Docker engine did not answer within {self.engine_wait_s:.0f}s ({exc})")

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

    def _gate_through_signal(self, timeout_s: float | None = None) -> None:
        """:meth:`gate`, finished even when the first SIGTERM/SIGINT lands during it: the signal handler raises
        :class:`Interrupted` once and ignores later signals, and a stop request during a restore must not turn a
        healthy start into a rollback. ``timeout_s``: the gate's limit (default :meth:`gate_timeout`)."""
        timeout_s = self.gate_timeout() if timeout_s is None else timeout_s
        try:
            self.gate(timeout_s=timeout_s)
        except Interrupted as exc:
            self.warn("health", f"{exc}; finishing the health gate before exiting")
            self.gate(timeout_s=timeout_s)

    def _rollback_after_failure(self, why: str, failed: int | None = None, tries: int = 3,
                                verdict: bool = True) -> str:
        """Serving failed on release ``failed`` (default: the current one): bring back the most recently live other
        release, trying up to ``tries`` previously live releases in turn, each health-gated.

        ``verdict``: the failure was a completed health gate (:class:`GateFailed`) on ``failed``; only then is the
        release marked failed in the history. Engine errors during a rollback are waited out (bounded) and the same
        release is tried again; they never move on to the next candidate.

        Returns:
            ``"rolled back to release N"``.

        Raises:
            RuntimeError: no previously live release is retained, or none of those tried passed the gate.
            EngineUnavailable: the engine stayed unreachable for ``engine_wait_s`` seconds.
        """
        failed = self.releases.current() if failed is None else failed
        if verdict and failed is not None and failed == self.releases.current():
            self.releases.mark_failed(failed, why)
        candidates = self.releases.fallbacks(failed)[:tries]
        if not candidates:
            self.unhealthy = True
            raise RuntimeError(f"serving failed its health gate ({why}) and no earlier live release is retained")
        errors = []
        for prev in candidates:
            self.journal.log("rollback", "start", to_release=prev, failed_release=failed, reason=why[-300:])
            while True:
                try:
                    self._remove_serving()
                    rel = self.releases.get(prev)
                    self._create_release(rel)
                    self._gate_through_signal()
                except Exception as exc:  # noqa: BLE001 - engine wait, else the next previously live release
                    if self._wait_out_engine("rollback", exc):
                        continue
                    self.journal.log("rollback", "error", to_release=prev, reason=str(exc)[-500:])
                    errors.append(f"release {prev}: {exc}")
                    break
                self.releases.set_current(prev)
                self.journal.log("rollback", "ok", to_release=prev, message=f"ROLLED BACK: release {failed} failed "
                                                                            f"its health gate; serving release {prev}")
                return f"rolled back to release {prev}"
        self.unhealthy = True
        raise RuntimeError(f"serving failed its health gate ({why}); rollback failed too: " + "; ".join(errors))

    def gate(self, timeout_s: float | None = None) -> None:
        """Health gate on the serving container (:func:`eagle3ops.health.wait_healthy`): /health 200,
        /v1/models lists the served model, one completion returns text; with the API key the container itself
        requires (its ``--api-key``/``VLLM_API_KEY``), else the one in ``health.api_key_file``.

        Waits up to ``timeout_s`` seconds (default ``health.timeout_s``) for a slow start, but fails at once when the
        container has exited.

        Raises:
            GateFailed: the gate did not pass in time, or the serving container stopped (a verdict on the release).
            Exception: docker SDK / connection errors while inspecting the container (the engine is unreachable):
                not a verdict; callers wait the engine out.
        """
        h = self.plan.health
        assert h is not None  # plans with serving have a gate
        timeout_s = h.timeout_s if timeout_s is None else timeout_s
        self.journal.log("health", "start", timeout_s=round(timeout_s, 1))
        if self.plan.serving_kind == "process":
            try:
                models = wait_healthy(f"http://127.0.0.1:{h.port}", h.model, timeout_s=timeout_s,
                                      interval_s=h.interval_s, api_key=self._api_key, crashed=self._process_exited)
            except GateFailed as exc:
                self.journal.log("health", "error", reason=str(exc)[-800:])
                raise
            self.journal.log("health", "ok", models=models)
            return
        c0 = self._serving()
        restarts0 = c0.attrs.get("RestartCount", 0) if c0 is not None else 0

        def crashed() -> str | None:
            c = self._serving()
            if c is None:
                return None
            c.reload()
            # A restart policy turns a crash into "restarting"/a higher RestartCount: a crash, not a slow start.
            if c.status in ("exited", "dead", "restarting") or c.attrs.get("RestartCount", 0) > restarts0:
                logs = c.logs(tail=20).decode(errors="replace")
                return (f"serving container crashed (status {c.status}, exit {c.attrs['State'].get('ExitCode')}): "
                        f"{logs[-800:]}")
            return None

        try:
            models = wait_healthy(f"http://127.0.0.1:{h.port}", h.model, timeout_s=timeout_s,
                                  interval_s=h.interval_s, api_key=self._api_key, crashed=crashed)
        except GateFailed as exc:
            self.journal.log("health", "error", reason=str(exc)[-800:])
            raise
        self.journal.log("health", "ok", models=models)

    def _api_key(self) -> str | None:
        """The API key serving requires: from the serving container's own configuration, else from the secret
        file the inventory names (``health.api_key_file``); None when neither has one. Never logged."""
        if self.plan.serving_kind == "process":
            env = [e.decode(errors="replace") for e in self._process_bytes("environ.nul").split(b"\0") if e]
            key = api_key_from_inspect({"Config": {"Cmd": self._process_argv(), "Env": env}})
        else:
            c = self._serving()
            key = api_key_from_inspect(c.attrs) if c is not None else None
        assert self.plan.health is not None
        if key is None and self.plan.health.api_key_file:
            key = read_api_key_file(self.plan.health.api_key_file)
        return key

    def replace_serving(self) -> str:
        """``release``/``rollback`` plans: swap the serving container for the target spec, health-gated.

        A ``rollback`` plan without ``to_release`` targets the release that was live before the current one
        (from the live history, see :class:`Releases`).

        Raises:
            RuntimeError: the target is not retained, there is no earlier live release, or neither the target nor
                any fallback passed the health gate.
            FileNotFoundError: ``to_release`` names a release that is not retained.
        """
        self.record()
        if self.plan.serving_kind == "process":
            return self._process_switch()
        done = self.journal.first("switch", "ok")
        if done:  # a resumed supervisor: the switch already happened
            return f"serving release {done['to_release']}"
        begun = self.journal.first("switch", "start")
        if begun:  # resumed mid-switch: same target, never a second new release
            target = begun["to_release"]
        elif self.plan.kind == "release":
            target = self.releases.add(self._new_release(), self.plan.window_id,
                                       change=(self.plan.change or ReleaseChange()).describe())
        elif self.plan.to_release is not None:
            target = self.plan.to_release
            self.releases.get(target)  # raises when not retained
        else:
            earlier = self.releases.fallbacks(self.releases.current())
            if not earlier:
                raise RuntimeError(f"no release that was live before the current one "
                                   f"({self.releases.current()}) is retained; name one with --to")
            target = earlier[0]
        rel = self.releases.get(target)
        if self.journal.first("switch", "error") is None:
            if not begun:
                self.journal.log("switch", "start", to_release=target)
            while True:
                try:
                    self._remove_serving()
                    self._create_release(rel)
                    self._gate_through_signal()
                except Exception as exc:  # noqa: BLE001
                    if self._wait_out_engine("switch", exc):
                        continue  # engine back: the same switch again
                    self.journal.log("switch", "error", reason=str(exc)[-500:], verdict=isinstance(exc, GateFailed))
                    what = "failed its health gate" if isinstance(exc, GateFailed) else "could not be started"
                    return f"release {target} {what}; " + self._rollback_after_failure(
                        str(exc), target, verdict=isinstance(exc, GateFailed))
                break
            self.releases.set_current(target)
            self.journal.log("switch", "ok", to_release=target)
            return f"serving release {target}"
        # resumed after the switch failed: finish the rollback
        ok = self.journal.first("rollback", "ok")
        if ok:
            return f"release {target} failed its health gate; rolled back to release {ok['to_release']}"
        return f"release {target} failed its health gate; " + self._rollback_after_failure("resumed", target)

    def _new_release(self) -> dict[str, Any]:
        """The record of a new release: the serving container recorded by this window (``serving-inspect.json``)
        plus the plan's intended change, nothing else (:func:`eagle3ops.commands.serving.apply_change`)."""
        inspect = json.loads((self.wdir / "serving-inspect.json").read_text())
        change = self.plan.change or ReleaseChange()
        defaults = None
        if change.image:  # the old image's own defaults give way to the new image's
            defaults = self.client.images.get(inspect["Image"]).attrs.get("Config") or {}
        return sv.apply_change(sv.container_record(inspect), args=change.args, env=change.env, binds=change.binds,
                               image=change.image, image_defaults=defaults)

    # the whole window
    def run(self) -> dict[str, Any]:
        """Execute the plan; always restores serving; writes ``result.json``, the audit line, releases the lock."""
        t0 = self.journal.first_epoch()
        outcome, error, stopped_at, restored_at = "ok", "", None, None
        try:
            if self.plan.serving_kind == "none":
                outcome, error = self._stages_only()
            elif self.plan.kind == "window":
                self.record()  # nothing is stopped before this succeeds
                try:
                    if self.journal.first("restore", "start") is None:
                        self.stop_serving()
                        for step in self.plan.stages:
                            if not self.run_stage(step):
                                outcome, error = "failed", f"stage {step.name}: {self.stage_outcomes[step.name]}"
                                break
                    else:  # resumed once serving was already being restored: never run stages beside it
                        outcome, error = self._stages_from_journal()
                        self.warn("supervisor", "resumed after the restore had begun; stages are not run again")
                except Interrupted as exc:
                    outcome, error = "interrupted", str(exc)
                except Exception as exc:  # noqa: BLE001 - whatever broke, serving is restored below
                    outcome, error = "failed", f"{type(exc).__name__}: {exc}"
                    self.journal.log("supervisor", "error", reason=error[-1000:])
                finally:
                    # Downtime counts from the moment the stop began (serving refuses requests from then on).
                    stopped = self.journal.first("stop", "start")
                    stopped_at = stopped["epoch"] if stopped else None
                    restore_msg = self.restore()
                    restored_at = time.time()
                    if restore_msg != "restored":
                        outcome = "failed" if outcome == "ok" else outcome
                        error = (error + "; " if error else "") + f"serving {restore_msg}"
            else:
                msg = self.replace_serving()
                if "rolled back" in msg:
                    outcome, error = "failed", msg
        except EngineUnavailable as exc:
            self.journal.log("supervisor", "error", reason=f"{exc}; exiting so that the restart policy resumes this "
                                                           f"window when the engine is back (no verdict recorded)")
            raise SystemExit(75) from None
        except Exception as exc:  # noqa: BLE001 - recorded, then reported through the result
            outcome, error = "failed", f"{type(exc).__name__}: {exc}"
            self.journal.log("supervisor", "error", reason=error[-1000:])
        if not self._engine_up():
            # The Docker engine is going down (daemon restart): leave no result, exit non-zero, and let the restart
            # policy (on-failure) start this supervisor again once the engine is back; it resumes from the journal.
            self.journal.log("supervisor", "error", reason="Docker engine unavailable; exiting so that the restart "
                                                           "policy resumes this window when the engine is back")
            raise SystemExit(75)
        no_serving = self.plan.serving_kind == "none"
        running = None if no_serving else self._serving_running()
        serving_ok = no_serving or (bool(running) and not self.unhealthy)
        if not serving_ok:
            error = (error + "; " if error else "") + (
                f"SERVING IS NOT {'HEALTHY' if running else 'RUNNING'} on {self.plan.host}: the lock stays held; "
                f"`eagle3ops recover {shlex.quote(self.plan.host)}` retries the restore")
            outcome = "failed"
        result = {
            "window_id": self.plan.window_id, "kind": self.plan.kind, "outcome": outcome, "error": error,
            "stages": self.stage_outcomes, "stage_seconds": self.stage_times,
            "downtime_s": round((restored_at or time.time()) - stopped_at, 1) if stopped_at else None,
            "wall_s": round(time.time() - t0, 1), "serving_running": running,
            "serving_healthy": None if no_serving else serving_ok, "serving": self.plan.serving_kind,
            **({"serving_note": NO_SERVING_NOTE} if no_serving else {}),
            # Releases are serving containers: a window on a host serving with a process (or none) has none.
            # A window on a process host keeps no release (it restores the process as recorded); its release and
            # rollback plans do (Supervisor._process_switch).
            "release": self.releases.current() if self.plan.serving_kind in ("container", "compose") or (
                self.plan.serving_kind == "process" and self.plan.kind != "window") else None,
            # The release live when the window began, as its record step found it (None before any record).
            "release_before": (self.journal.first("record", "ok") or {}).get("release"),
            "finished": _now(), "warnings": self.warnings(),
        }
        audit = self.state_dir / "audit.jsonl"
        with audit.open("a") as f:
            f.write(json.dumps({"t": _now(), "user": self.plan.user, "host": self.plan.host,
                                "command": self.plan.command, "window": self.plan.window_id,
                                "outcome": outcome, "error": error, "release": result["release"],
                                "warnings": result["warnings"]}) + "\n")
        # The driver appends to the same log as the SSH user (windows that never started): keep it theirs.
        st = self.state_dir.stat()
        try:
            os.chown(audit, st.st_uid, st.st_gid)
        except OSError:
            pass
        if serving_ok:
            self._release_lock()
        self.journal.log("supervisor", "done", outcome=outcome)
        # Last: the driver removes this container as soon as it sees the result.
        tmp = self.wdir / "result.json.tmp"
        tmp.write_text(json.dumps(result, indent=2))
        tmp.replace(self.wdir / "result.json")
        return result

    def _stages_only(self) -> tuple[str, str]:
        """A window on a host without production serving (``serving: none``): journal that the stop, restore and
        health gate are skipped, then run the stages (a resumed supervisor skips finished ones). A ``release`` or
        ``rollback`` plan for such a host is refused (the driver refuses it first).

        Returns:
            (outcome, error) of the stages.
        """
        if self.plan.kind != "window":
            raise RuntimeError(f"host {self.plan.host} has no serving (serving: none): nothing to {self.plan.kind}")
        if self.journal.first("serving", "skip") is None:
            self.journal.log("serving", "skip", message=NO_SERVING_NOTE)
        try:
            for step in self.plan.stages:
                if not self.run_stage(step):
                    return "failed", f"stage {step.name}: {self.stage_outcomes[step.name]}"
        except Interrupted as exc:
            return "interrupted", str(exc)
        return "ok", ""

    def _stages_from_journal(self) -> tuple[str, str]:
        """Stage outcomes of an earlier attempt of this window, from the journal: (outcome, error)."""
        outcome, error = "ok", ""
        for step in self.plan.stages:
            e = self.journal.last(step.name)
            if e is None or e["event"] == "start":
                self.stage_outcomes[step.name] = "not run" if e is None else "interrupted"
            elif e["event"] == "ok":
                self.stage_outcomes[step.name] = "ok"
            else:
                self.stage_outcomes[step.name] = f"failed ({e.get('reason', '')})"
            if self.stage_outcomes[step.name] != "ok" and outcome == "ok":
                outcome, error = "failed", f"stage {step.name}: {self.stage_outcomes[step.name]}"
            if e is not None and "seconds" in e:
                self.stage_times[step.name] = e["seconds"]
        return outcome, error

    def _engine_up(self) -> bool:
        try:
            return bool(self.client.ping())
        except Exception:  # noqa: BLE001 - any failure means "not reachable"
            return False

    def _serving_running(self) -> bool:
        if self.plan.serving_kind == "process":  # host pids are invisible here: the last gate decides
            if self.journal.first("stop", "start") is None:
                return True  # never asked to stop: the agent stops nothing once this supervisor ends
            return self.journal.last("health") is not None and self.journal.last("health")["event"] == "ok"
        c = self._serving()
        if c is None:
            return False
        c.reload()
        return c.status == "running"

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
