"""Serving kinds ``container`` and ``compose``: vLLM in one Docker container on the host, driven through the docker
SDK on the mounted socket.

A release is the live container's whole configuration (:func:`eagle3ops.commands.serving.container_record`) plus the
intended change; the supervisor recreates it through the Engine API. ``compose`` is ``container`` with the container
found by its Compose labels at preflight (the plan names it); a recreated release keeps the labels, so Compose still
lists it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from eagle3ops.commands import host as hc
from eagle3ops.commands import serving as sv
from eagle3ops.config.plan import RECORD_GATE_S, ReleaseChange
from eagle3ops.health import GateFailed, api_key_from_inspect
from eagle3ops.supervisor.errors import Interrupted
from eagle3ops.supervisor.kinds.base import ServingKind
from eagle3ops.supervisor.releases import write_private
from eagle3ops.supervisor.stagerun import create_container


class ContainerServing(ServingKind):
    """Serving by one named Docker container: recorded from ``docker inspect``, stopped with ``docker stop``,
    restored by starting (or recreating) it, switched by recreating a retained release; a failed gate rolls back
    to the most recently live release (up to three tried)."""

    name = "container"

    # docker helpers
    def live_container(self) -> Any | None:
        import docker.errors

        try:
            return self.sup.client.containers.get(self.plan.serving_container)
        except docker.errors.NotFound:
            return None

    def _recreate(self, record: dict[str, Any]) -> Any:
        """Create and start the serving container from a record (:func:`eagle3ops.commands.serving.container_record`)
        through the Engine API, every ``Config``/``HostConfig`` field as recorded. The image stays the recorded
        reference while it still resolves to the recorded image id; a re-tagged reference is replaced by the id (a
        release never changes image silently). The compile cache the container would keep in its own layer is bound
        to the plan's ``compile_cache`` folder (:func:`eagle3ops.commands.serving.keep_compile_cache`): every
        container recreated here (a release, a rollback, a gate's control and speculative releases, a restore)
        starts from what the last start of the same configuration compiled."""
        import docker.errors

        client = self.sup.client
        if self.plan.compile_cache:
            record, notes = sv.keep_compile_cache(record, self.plan.compile_cache)
            for note in notes:
                if not any(e.get("message") == note for e in self.sup.journal.entries if e["step"] == "compile-cache"):
                    self.sup.warn("compile-cache", note)
        image = None
        ref, want = record["Config"].get("Image"), record.get("ImageId")
        if want and ref != want:
            try:
                if client.images.get(ref).id != want:
                    image = want
            except docker.errors.ImageNotFound:
                image = want
        body, more = sv.create_request(record, image=image)
        cid = client.api.create_container_from_config(body, name=self.plan.serving_container)["Id"]
        for net, ep in more.items():
            ipam = ep.get("IPAMConfig") or {}
            client.api.connect_container_to_network(
                cid, net, aliases=ep.get("Aliases"), links=ep.get("Links"), driver_opt=ep.get("DriverOpts"),
                ipv4_address=ipam.get("IPv4Address"), ipv6_address=ipam.get("IPv6Address"),
                link_local_ips=ipam.get("LinkLocalIPs"))
        client.api.start(cid)
        return client.containers.get(cid)

    def _create_release(self, rel: dict[str, Any]) -> Any:
        """Create and start retained release ``rel`` (:meth:`Releases.get`): its whole recorded container, or the
        docker SDK spec of a release recorded before releases kept the whole configuration. The new container's id
        is recorded as the release's (:meth:`Releases.mark_container`) before its gate: a later record step knows
        it for this release, and only it."""
        if "container" in rel:
            c = self._recreate(rel["container"])
        else:
            c = create_container(self.sup.client, rel["spec"], image_id=rel.get("image_id"))
        if rel.get("release") is not None:
            self.sup.releases.mark_container(rel["release"], c.attrs.get("Id") or "")
        return c

    def _not_release(self, n: int | None, inspect: dict[str, Any]) -> str | None:
        """Why the live container (its ``docker inspect``) is not release ``n``, None when it is
        (:func:`eagle3ops.commands.serving.container_not_release`: the container eagle3ops created or recorded for
        ``n``, :meth:`Releases.container_id`; for a release recorded without an id, its label and settings)."""
        if n is None:
            return "no release is current"
        try:
            want = self.sup.releases.container_id(n)
            rel = self.sup.releases.get(n)
        except FileNotFoundError:
            return f"release {n} is not retained"
        return sv.container_not_release(n, rel, inspect, want)

    def _remove(self) -> None:
        c = self.live_container()
        if c is not None:
            c.stop(timeout=self.plan.stop_timeout_s)
            c.remove(force=True)

    # the steps
    def record(self) -> None:
        """Save the serving container's full inspect output and make sure it is a retained release."""
        sup, name = self.sup, self.plan.serving_container
        c = self.live_container()
        if c is None:
            raise RuntimeError(f"serving container {name!r} does not exist on the host")
        inspect = c.attrs
        write_private(sup.wdir / "serving-inspect.json", json.dumps(inspect, indent=2))
        recorded, live_failed = None, None
        current = sup.releases.current()
        why_not = self._not_release(current, inspect)
        if current is not None and why_not is None:
            sup.releases.mark_container(current, inspect.get("Id") or "")  # an older record: its id from now on
        if current is not None and why_not:
            # Serving was recreated outside eagle3ops (by hand, or a provisioning script): the live container is not
            # the release the state dir calls current, so rollbacks must not treat that one as live.
            sup.warn("record", f"serving container {name!r} is not release {current} ({why_not}): it was recreated "
                               f"outside eagle3ops; recording it as a new release")
        if why_not:
            # Retained so that a restore can recreate it, but live only when it runs and passes its gate now.
            recorded = sup.releases.add(sv.container_record(inspect), self.plan.window_id)
            sup.releases.mark_container(recorded, inspect.get("Id") or "")
            c.reload()
            if c.status != "running":
                sup.warn("record", f"serving container {name!r} is {c.status!r}, not running: recorded as release "
                                   f"{recorded} but not as a live release (no rollback targets it)")
            else:
                try:
                    sup.gate_through_signal(RECORD_GATE_S)
                    sup.releases.set_current(recorded)
                except GateFailed as exc:
                    live_failed = str(exc)[-300:]
                    sup.warn("record", f"serving container {name!r} did not pass the health gate ({exc}): recorded "
                                       f"as release {recorded} but not as a live release")
        sup.journal.log("record", "ok", release=sup.releases.current(), recorded=recorded,
                        image_id=inspect.get("Image"), **({"live_failed": live_failed} if live_failed else {}))

    def stop(self) -> None:
        """Stop serving gracefully (``stop_timeout_s``, then SIGKILL) and wait for the GPUs to be released."""
        c = self.live_container()
        if c is not None and c.status == "running":
            c.stop(timeout=self.plan.stop_timeout_s)
        self.sup.journal.log("stop", "ok")
        if self.plan.gpus and self.plan.stages:  # the GPU check runs in the stages' image
            try:
                self.wait_gpus_free()
            except Interrupted:
                raise
            except Exception as exc:  # noqa: BLE001 - a failing check must not keep serving down; stages may fail
                self.sup.warn("gpu-release", f"could not check GPU memory: {exc}")

    def wait_gpus_free(self, timeout: float = 300.0, poll_s: float = 2.0) -> None:
        """Poll ``nvidia-smi --query-compute-apps=pid`` in a throwaway container (the pipeline image, all GPUs)
        until no process holds GPU memory, so stages do not start while the stopped server still frees it.

        After ``timeout`` seconds it logs a warning and goes on (a stage then fails on its own if memory is short).
        """
        import docker.types

        journal = self.sup.journal
        journal.log("gpu-release", "start")
        image = self.plan.stages[0].spec["image"]
        deadline = time.time() + timeout
        holders = ""
        while time.time() < deadline:
            argv = hc.gpu_compute_pids()
            holders = self.sup.client.containers.run(
                image, entrypoint=argv[:1], command=argv[1:],
                device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])], remove=True,
                pid_mode="host",  # other containers' processes are invisible to nvidia-smi in its own PID namespace
            ).decode().strip()
            if not holders:
                journal.log("gpu-release", "ok", seconds=round(timeout - (deadline - time.time()), 1))
                return
            time.sleep(poll_s)
        self.sup.warn("gpu-release", f"GPU memory still held after stop by pids {holders.split()}; continuing")

    def restore(self) -> str:
        """Start the stopped container, or recreate it from the recorded spec; health-gate it.

        Engine errors (the Docker engine unreachable, e.g. a daemon restart) are waited out (bounded) and the
        restore is retried; they are never a verdict on the release. Only a completed health gate that failed
        (:class:`GateFailed`) marks the release failed; any other error with the engine up still leads to a rollback
        (serving must come back) but leaves the release unjudged.

        Raises:
            RuntimeError: neither the restore nor the rollback passed the health gate.
            EngineUnavailable: the engine stayed unreachable.
        """
        sup = self.sup
        while True:
            try:
                c = self.live_container()
                if c is None:
                    inspect = json.loads((sup.wdir / "serving-inspect.json").read_text())
                    self._mark_live(self._recreate(sv.container_record(inspect)))
                elif c.status != "running":
                    c.start()
                sup.gate_through_signal()
            except Exception as exc:  # noqa: BLE001 - any failure leads to the engine wait or the rollback path
                if sup.wait_out_engine("restore", exc):
                    continue  # the engine is back: the same restore again, not a rollback
                verdict = isinstance(exc, GateFailed)
                sup.journal.log("restore", "error", reason=str(exc)[-500:], verdict=verdict)
                return self.rollback_after_failure(str(exc), verdict=verdict)
            self._confirm_restored()
            sup.journal.log("restore", "ok")
            return "restored"

    def _mark_live(self, c: Any) -> None:
        """``c``, recreated from the record step's inspect output, is the release that step found live (or recorded):
        its id becomes that release's (:meth:`Releases.mark_container`)."""
        rec = self.sup.journal.first("record", "ok") or {}
        n = rec.get("recorded") if rec.get("recorded") is not None else rec.get("release")
        if n is not None:
            self.sup.releases.mark_container(n, c.attrs.get("Id") or "")

    def _confirm_restored(self) -> None:
        """The restored container passed its gate: it is the live release (this clears an earlier failure mark; a
        container first recorded by this window without a gate becomes live now)."""
        releases = self.sup.releases
        n = releases.current()
        if n is None:
            rec = self.sup.journal.first("record", "ok")
            n = rec.get("recorded") if rec else None
        if n is not None:
            releases.confirm_live(n)

    def rollback_after_failure(self, why: str, failed: int | None = None, tries: int = 3,
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
            EngineUnavailable: the engine stayed unreachable.
        """
        sup, releases = self.sup, self.sup.releases
        failed = releases.current() if failed is None else failed
        if verdict and failed is not None and failed == releases.current():
            releases.mark_failed(failed, why)
        candidates = releases.fallbacks(failed)[:tries]
        if not candidates:
            sup.unhealthy = True
            raise RuntimeError(f"serving failed its health gate ({why}) and no earlier live release is retained")
        errors = []
        for prev in candidates:
            sup.journal.log("rollback", "start", to_release=prev, failed_release=failed, reason=why[-300:])
            while True:
                try:
                    self._remove()
                    self._create_release(releases.get(prev))
                    sup.gate_through_signal()
                except Exception as exc:  # noqa: BLE001 - engine wait, else the next previously live release
                    if sup.wait_out_engine("rollback", exc):
                        continue
                    sup.journal.log("rollback", "error", to_release=prev, reason=str(exc)[-500:])
                    errors.append(f"release {prev}: {exc}")
                    break
                releases.set_current(prev)
                sup.journal.log("rollback", "ok", to_release=prev, message=f"ROLLED BACK: release {failed} failed "
                                                                           f"its health gate; serving release {prev}")
                return f"rolled back to release {prev}"
        sup.unhealthy = True
        raise RuntimeError(f"serving failed its health gate ({why}); rollback failed too: " + "; ".join(errors))

    def switch(self, step: str = "switch", change: ReleaseChange | None = None, live: bool = True) -> str:
        """Swap the serving container for the target release, health-gated. A ``rollback`` plan without
        ``to_release`` targets the release production kept live before the current one
        (:meth:`Releases.rollback_target`: releases a gate rejected or only measured are passed over); a
        resumed supervisor keeps the target its journal names and never adds a second new release.

        ``step``, ``change``, ``live``: a speculate job's control release (like for like) switches under
        its own journal step with its own change (the recorded container plus ``change``), and with
        ``live=False``: it passes its gate but never becomes the current release or enters the history, so every
        rollback still targets the release live before the job.

        Raises:
            RuntimeError: the target is not retained, there is no earlier live release, or neither the target nor
                any fallback passed the health gate.
            FileNotFoundError: ``to_release`` names a release that is not retained.
        """
        sup, journal, releases = self.sup, self.sup.journal, self.sup.releases
        done = journal.first(step, "ok")
        if done:  # a resumed supervisor: the switch already happened
            return f"serving release {done['to_release']}"
        begun = journal.first(step, "start")
        if begun:  # resumed mid-switch: same target, never a second new release
            target = begun["to_release"]
        elif change is not None or self.plan.kind in ("release", "speculate"):
            # a control release (``change``), a release, or speculate (the plan's change is the speculative one)
            self._refuse_release_of_failed_live()
            want = change or self.plan.change or ReleaseChange()
            target = releases.add(self.new_release(want), self.plan.window_id,
                                  change=(f"{step} (never live): " if not live else "") + want.describe())
        elif self.plan.to_release is not None:
            target = self.plan.to_release
            releases.get(target)  # raises when not retained
        else:
            target, why = releases.rollback_target(releases.current())
            if target is None:
                raise RuntimeError(why)
        rel = releases.get(target)
        if journal.first(step, "error") is None:
            if not begun:
                journal.log(step, "start", to_release=target)
            while True:
                try:
                    self._remove()
                    self._create_release(rel)
                    sup.gate_through_signal()
                except Exception as exc:  # noqa: BLE001
                    if sup.wait_out_engine(step, exc):
                        continue  # engine back: the same switch again
                    journal.log(step, "error", reason=str(exc)[-500:], verdict=isinstance(exc, GateFailed))
                    what = "failed its health gate" if isinstance(exc, GateFailed) else "could not be started"
                    return f"release {target} {what}; " + self.rollback_after_failure(
                        str(exc), target, verdict=isinstance(exc, GateFailed))
                break
            if live:  # a speculate job's switch (release --gate's too) is live only while its gate measures it
                releases.set_current(target, measured=self.plan.kind == "speculate")
            journal.log(step, "ok", to_release=target, **({} if live else {"live": False}))
            return f"serving release {target}"
        # resumed after the switch failed: finish the rollback (this switch's: a rollback after its error)
        ok = journal.first_after(journal.first(step, "error"), "rollback", "ok")
        if ok:
            return f"release {target} failed its health gate; rolled back to release {ok['to_release']}"
        return f"release {target} failed its health gate; " + self.rollback_after_failure("resumed", target)

    def return_to(self, release: int | None, why: str) -> str:
        """Recreate retained release ``release`` (the one live before a speculate job's switch), health-gated;
        engine outages waited out; when it fails, the earlier live releases are tried
        (:meth:`rollback_after_failure`). A resumed supervisor whose journal has this return done returns it (its
        journal entries carry ``returning``: a candidate's rollback after a failed gate earlier in the job is another).

        Raises:
            RuntimeError: no release to return to, or none passed its gate.
        """
        sup, journal, releases = self.sup, self.sup.journal, self.sup.releases
        mine = [e for e in journal.entries if e["step"] == "rollback" and e.get("returning")]
        if mine and mine[-1]["event"] == "ok":
            return f"rolled back to release {mine[-1]['to_release']}"
        if release is None:
            raise RuntimeError("no release was live before the switch: nothing to roll back to")
        failed = releases.current()
        journal.log("rollback", "start", to_release=release, failed_release=failed, reason=why[-300:], returning=True)
        while True:
            try:
                self._remove()
                self._create_release(releases.get(release))
                sup.gate_through_signal()
            except Exception as exc:  # noqa: BLE001 - engine wait, else the earlier live releases
                if sup.wait_out_engine("rollback", exc):
                    continue
                journal.log("rollback", "error", to_release=release, reason=str(exc)[-500:], returning=True)
                return self.rollback_after_failure(f"release {release}: {exc}", release, verdict=False)
            releases.set_current(release)
            journal.log("rollback", "ok", to_release=release, message=f"ROLLED BACK ({why}): serving release "
                                                                      f"{release}", returning=True)
            return f"rolled back to release {release}"

    def reinstate(self, release: int, why: str, step: str = "keep-switch") -> str:
        """Recreate retained release ``release`` (the speculative release an ``aba`` gate kept, measured before the
        baseline's second block), health-gated, and make it current; engine outages waited out; a failed gate
        brings back the release live before (:meth:`rollback_after_failure`). Resumed: the journal's ``step``."""
        sup, journal, releases = self.sup, self.sup.journal, self.sup.releases
        done = journal.first(step, "ok")
        if done:
            return f"serving release {done['to_release']}"
        if journal.first(step, "error") is None:
            if journal.first(step, "start") is None:
                journal.log(step, "start", to_release=release, reason=why[-300:])
            while True:
                try:
                    self._remove()
                    self._create_release(releases.get(release))
                    sup.gate_through_signal()
                except Exception as exc:  # noqa: BLE001 - engine wait, else back to the release live before
                    if sup.wait_out_engine(step, exc):
                        continue
                    journal.log(step, "error", to_release=release, reason=str(exc)[-500:],
                                verdict=isinstance(exc, GateFailed))
                    return f"release {release} failed its health gate; " + self.rollback_after_failure(
                        str(exc), release, verdict=False)
                break
            releases.set_current(release)
            journal.log(step, "ok", to_release=release)
            return f"serving release {release}"
        ok = journal.first_after(journal.first(step, "error"), "rollback", "ok")
        if ok:
            return f"release {release} failed its health gate; rolled back to release {ok['to_release']}"
        return f"release {release} failed its health gate; " + self.rollback_after_failure("resumed", release,
                                                                                            verdict=False)

    def _refuse_release_of_failed_live(self) -> None:
        """A release is a change of the live container: when the record step found that container running but failing
        its own health gate, the release is refused before anything is removed (switching would replace serving
        whose fault nobody has looked at, and leave no known-good release to fall back to). A live container that is
        not running (e.g. ``created``, never started) is not judged: a release may replace it.

        Raises:
            RuntimeError: the live container failed at the record step; the message names it and the fix.
        """
        rec = self.sup.journal.first("record", "ok") or {}
        why = rec.get("live_failed")
        if why:
            h = self.plan.host
            raise RuntimeError(
                f"live serving container {self.plan.serving_container!r} failed its own health gate before the "
                f"switch ({why}); release not switched, serving left as it was: fix live serving first (`eagle3ops "
                f"status {h}`, its logs; `eagle3ops rollback {h} --to N` brings back a retained release), then "
                f"release again")

    def new_release(self, change: ReleaseChange | None = None) -> dict[str, Any]:
        """The record of a new release: the serving container recorded by this window (``serving-inspect.json``)
        plus ``change`` (default: the plan's intended change), nothing else
        (:func:`eagle3ops.commands.serving.apply_change`)."""
        inspect = json.loads((self.sup.wdir / "serving-inspect.json").read_text())
        change = change or self.plan.change or ReleaseChange()
        defaults = None
        if change.image:  # the old image's own defaults give way to the new image's
            defaults = self.sup.client.images.get(inspect["Image"]).attrs.get("Config") or {}
        return sv.apply_change(sv.container_record(inspect), args=change.args, env=change.env, binds=change.binds,
                               image=change.image, image_defaults=defaults)

    # what the gate and the result ask
    def identity(self) -> dict[str, Any]:
        """The live container's image reference and id, its image's ``io.eagle3ops.*`` labels and its whole argv
        (``Entrypoint`` + ``Cmd``); ``{}`` when no serving container exists."""
        from eagle3ops.gate.like import LABEL_PREFIX

        c = self.live_container()
        if c is None:
            return {}
        cfg = c.attrs.get("Config") or {}
        image_id = c.attrs.get("Image")
        try:
            labels = (self.sup.client.images.get(image_id).attrs.get("Config") or {}).get("Labels") or {}
        except Exception:  # noqa: BLE001 - an image the engine cannot show: its labels are unknown
            labels = {}
        return {"image": cfg.get("Image"), "image_id": image_id,
                "labels": {k: v for k, v in labels.items() if k.startswith(LABEL_PREFIX)},
                "argv": list(cfg.get("Entrypoint") or []) + list(cfg.get("Cmd") or [])}

    def api_key(self) -> str | None:
        c = self.live_container()
        return api_key_from_inspect(c.attrs) if c is not None else None

    def crash_check(self) -> Callable[[], str | None]:
        """A crash is status ``exited``/``dead``/``restarting`` or a RestartCount above the one seen now (a
        restart policy turns a crash into a restart: a crash, not a slow start)."""
        c0 = self.live_container()
        restarts0 = c0.attrs.get("RestartCount", 0) if c0 is not None else 0

        def crashed() -> str | None:
            c = self.live_container()
            if c is None:
                return None
            c.reload()
            if c.status in ("exited", "dead", "restarting") or c.attrs.get("RestartCount", 0) > restarts0:
                logs = c.logs(tail=20).decode(errors="replace")
                return (f"serving container crashed (status {c.status}, exit {c.attrs['State'].get('ExitCode')}): "
                        f"{logs[-800:]}")
            return None

        return crashed

    def started_again(self) -> str | None:
        """The serving container runs (or restarts) again while the stages run: kill it (a stop with no grace: the
        stop signal, then SIGKILL at once), wait for the GPUs on a GPU host, and say what was found (its status, when
        it started, its restart policy, how long the kill took).

        No graceful timeout: the window already stopped this serving gracefully; what runs now was started by
        something outside the window and is, in the field, a vLLM still loading its weights, which does not act on
        SIGTERM, so a graceful stop let it run beside the stage for the whole ``stop_timeout_s`` at every restart.
        A ``stop`` with timeout 0 rather than a ``kill``: Docker counts only a stop as a manual one, and a killed
        container's restart policy (``always``, ``unless-stopped``, ``on-failure``) would start it again at once."""
        c = self.live_container()
        if c is None:
            return None
        c.reload()
        if c.status not in ("running", "restarting"):
            return None
        state = c.attrs.get("State") or {}
        policy = ((c.attrs.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name") or "no"
        found = (f"container {self.plan.serving_container!r} is {c.status} since {state.get('StartedAt', '?')}, "
                 f"restart policy {policy}")
        t0 = time.monotonic()
        c.stop(timeout=0)
        found += f"; killed in {time.monotonic() - t0:.1f} s"
        if self.plan.gpus and self.plan.stages:
            try:
                self.wait_gpus_free(timeout=120.0)
            except Interrupted:
                raise
            except Exception as exc:  # noqa: BLE001 - the stage fails on its own if memory is short
                self.sup.warn("gpu-release", f"could not check GPU memory: {exc}")
        return found

    def running(self) -> bool:
        c = self.live_container()
        if c is None:
            return False
        c.reload()
        return c.status == "running"

    def keeps_release(self) -> bool:
        return True


class ComposeServing(ContainerServing):
    """Kind ``compose``: the container of a Compose service. The driver resolved it by its Compose labels at
    preflight (the plan names it); on the host it is a container like any other, and a recreated release keeps the
    labels (they are part of the recorded configuration)."""

    name = "compose"
