"""The ``process`` serving kind, supervisor side.

vLLM run as a plain process on the host cannot be stopped or started from the supervisor's container (no access to
the host's PID namespace), so the host-side restore agent (:mod:`eagle3ops.commands.process`, a POSIX sh script
started over SSH by the driver) does both; this side asks through request files in the window's ``process/`` folder,
waits (bounded) for the agent's answer and health-gates the result. Process releases (the recorded argv, env, cwd
and uid plus the intended change) are switched here the same way.
"""

from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

from eagle3ops.commands import serving as sv
from eagle3ops.config.plan import ReleaseChange
from eagle3ops.health import GateFailed
from eagle3ops.health import api_key_from_inspect
from eagle3ops.supervisor.journal import _now, _tail
from eagle3ops.supervisor.kinds.base import ServingKind
from eagle3ops.supervisor.releases import write_private


class ProcessServing(ServingKind):
    """Serving by a plain process on the host, driven through the host-side restore agent's files: recorded from
    /proc by the driver, stopped and restored (or switched to another process release) by the agent on request,
    health-gated here."""

    name = "process"

    def __init__(self, sup: Any):
        super().__init__(sup)
        #: Suffix of the agent's files for the process it started last (``""``, ``".2"``...).
        self._suffix = ""

    def _bytes(self, name: str) -> bytes:
        assert self.plan.process_dir is not None
        return (Path(self.plan.process_dir) / name).read_bytes()

    def _file(self, name: str) -> str:
        try:
            return self._bytes(name).decode(errors="replace").strip()
        except OSError:
            return ""

    def _argv(self) -> list[str]:
        """The recorded command line of the serving process (``cmdline.nul``)."""
        return [a.decode(errors="replace") for a in self._bytes("cmdline.nul").split(b"\0") if a]

    def _await_file(self, name: str, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s`` seconds) for the agent to write ``name`` into the process dir."""
        assert self.plan.process_dir is not None
        path = Path(self.plan.process_dir) / name
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if path.exists():
                return True
            time.sleep(0.5)
        return path.exists()

    def stop(self) -> None:
        """Ask the restore agent to stop the serving process and wait for it (SIGTERM grace + GPU release wait +
        60 s, bounded)."""
        assert self.plan.process_dir is not None
        req = Path(self.plan.process_dir) / "stop-requested"
        if not req.exists():
            req.write_text(_now())
        if not self._await_file("stopped", self.plan.stop_timeout_s + 300 + 60):
            raise RuntimeError(f"the restore agent did not report the serving process (pid {self.plan.process_pid}) "
                               f"stopped; see {self.plan.process_dir}/agent.log")
        held = self._file("port-held")
        if held:  # a survivor of serving (not in its process tree, not this user's) still serves: no stage may run
            raise RuntimeError(f"serving did not stop: {held}; stages not started (see {self.plan.process_dir}/"
                               f"agent.log; stop what holds the port, or fix `serving.port` in the inventory)")
        self.sup.journal.log("stop", "ok", pid=self.plan.process_pid, seconds=self._file("stopped"))

    def restore(self) -> str:
        """Ask the agent to restore the recorded process (detached, recorded argv/env/cwd), then health-gate it.
        There are no retained releases of a process to roll back to: a failed gate leaves the window failed with
        the lock held (``recover``)."""
        assert self.plan.process_dir is not None
        req = Path(self.plan.process_dir) / "restore-requested"
        if not req.exists():  # it names the record to start (AGENT_SH): '' = the process as recorded
            req.write_text("")
        if not self._await_file("restored", 120):
            self.sup.unhealthy = True
            self.sup.journal.log("restore", "error", reason="the restore agent did not report a restore within 120 s; "
                                                        f"see {self.plan.process_dir}/agent.log")
            raise RuntimeError(f"serving process not restored: no answer from the restore agent "
                               f"({self.plan.process_dir}/agent.log)")
        try:
            held = self._file("port-held")
            if held:  # the gate would be answered by that server, not by the process this restore started
                raise GateFailed(f"{held}; the restored process cannot serve there (its exit is reported in "
                                 f"{self.plan.process_dir}/agent.log)")
            self.sup.gate_through_signal()
        except GateFailed as exc:
            self.sup.unhealthy = True
            self.sup.journal.log("restore", "error", reason=str(exc)[-500:], verdict=True)
            raise RuntimeError(f"restored serving process failed its health gate ({exc}); its output: "
                               f"{self.plan.process_dir}/serving.log") from None
        # The gate counted only the process this restore started (the agent reports its exit: crash_check); now
        # the agent may stop watching it.
        (Path(self.plan.process_dir) / "done").write_text(_now())
        self.sup.journal.log("restore", "ok", pid=self._file("restored"),
                         log=f"{self.plan.process_dir}/serving.log")
        return "restored"

    def _live(self) -> dict[str, Any]:
        """The serving process recorded by this window as a release record: ``{"argv", "environ", "cwd", "uid"}``
        (``/proc`` bytes decoded with ``surrogateescape``, so that they are written back byte for byte)."""
        def words(name: str) -> list[str]:
            return [a.decode(errors="surrogateescape") for a in self._bytes(name).split(b"\0") if a]

        return {"argv": words("cmdline.nul"), "environ": words("environ.nul"), "cwd": self._file("cwd"),
                "uid": self._file("uid")}

    def identity(self) -> dict[str, Any]:
        """No image; the argv of the process serving now: after this window's switch the release it switched to,
        before it the process this window recorded (the state dir's current release may be an older window's
        record of another process until the switch adopts the live one)."""
        from eagle3ops.supervisor.journal import is_restart_step

        proc = None  # the newest switch, candidate or rollback this window made: what serves now
        done = next((e for e in reversed(self.sup.journal.entries) if e.get("event") == "ok"
                     and is_restart_step(str(e.get("step", ""))) and e.get("to_release") is not None), None)
        if done is not None:
            try:
                proc = self.sup.releases.get(int(done["to_release"])).get("process")
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                proc = None
        try:
            argv = (proc or self._live())["argv"]
        except OSError:
            return {}
        return {"image": None, "image_id": None, "labels": {}, "argv": list(argv)}

    def _changed(self, recorded: dict[str, Any], change: ReleaseChange) -> dict[str, Any]:
        """The release record of ``recorded`` with ``change`` applied: its flags set (:func:`eagle3ops.commands.
        serving.set_args`) and its environment's named variables replaced."""
        env = [e for e in recorded["environ"] if e.split("=", 1)[0] not in change.env]
        return {**recorded, "argv": sv.set_args(recorded["argv"], change.args),
                "environ": env + [f"{k}={v}" for k, v in change.env.items()]}

    def _write_record(self, prefix: str, process: dict[str, Any]) -> None:
        """Write ``process`` (a release record's ``process``) as ``<prefix>cmdline.nul``, ``<prefix>environ.nul`` and
        ``<prefix>cwd`` in the process dir, readable by the SSH user only (the environment may hold secrets)."""
        assert self.plan.process_dir is not None
        pdir = Path(self.plan.process_dir)

        def nul(words: list[str]) -> str:
            return "".join(w + "\0" for w in words)

        for name, text in (("cmdline.nul", nul(process["argv"])), ("environ.nul", nul(process["environ"])),
                           ("cwd", process.get("cwd") or "/")):
            write_private(pdir / f"{prefix}{name}", text.encode(errors="surrogateescape"))

    def _round(self, k: int, prefix: str) -> None:
        """Round ``k`` (2, 3, ...) of a switch: the agent stops the process it started last, then starts the record
        ``prefix``; waits (bounded) for both. Round 1 is :meth:`stop` then the first start."""
        assert self.plan.process_dir is not None
        pdir = Path(self.plan.process_dir)
        if k > 1:
            (pdir / f"stop-requested.{k}").write_text(_now())
            if not self._await_file(f"stopped.{k}", self.plan.stop_timeout_s + 300 + 60):
                raise RuntimeError(f"the restore agent did not report the started process stopped; see "
                                   f"{pdir}/agent.log")
        s = "" if k == 1 else f".{k}"
        (pdir / f"restore-requested{s}").write_text(prefix)
        if not self._await_file(f"restored{s}", 120):
            raise RuntimeError(f"the restore agent did not report a start within 120 s; see {pdir}/agent.log")
        self._suffix = s

    def _exited(self) -> str | None:
        """For the health gate: the process the agent started last has exited (the agent reports it)."""
        assert self.plan.process_dir is not None
        pdir = Path(self.plan.process_dir)
        s = self._suffix
        if (pdir / f"exited{s}").exists():
            return (f"the serving process (pid {self._file('exited' + s)}) exited; its output: "
                    f"{_tail(pdir / 'serving.log', 800)}")
        return None

    def _target(self, recorded: dict[str, Any], live_n: int, change: Any | None, live: bool
                ) -> tuple[int, dict[str, Any]]:
        """The release a process switch goes to and its process record: for a release (or a speculate job's
        candidate, ``change`` or the plan's), the recorded live process with the change, added as a new release
        (``candidate: ...`` when not ``live``); for a rollback, ``to_release`` or the one live before ``live_n``.

        Raises:
            RuntimeError: no rollback target (the message says why), or the target is not a process release.
        """
        if change is not None or self.plan.kind in ("release", "speculate"):  # speculate: the plan's change
            change = change or self.plan.change or ReleaseChange()
            new = self._changed(recorded, change)
            return self.sup.releases.add_process(new, self.plan.window_id, change=(
                "candidate: " if not live else "") + change.describe()), new
        target = self.plan.to_release
        if target is None:
            target, why = self.sup.releases.rollback_target(live_n)
            if target is None:
                raise RuntimeError(why)
        new = self.sup.releases.get(target).get("process")
        if not new:
            raise RuntimeError(f"release {target} is not a process release (this host serves with a process)")
        return target, new

    def switch(self, step: str = "switch", change: Any | None = None, live: bool = True) -> str:
        """``release``/``rollback`` of a host serving with a process (kind ``process``): the live process (recorded
        by the driver) is a retained release; the agent stops it and starts the target (a release: the live process
        with the plan's change; a rollback: release ``to_release`` or the one live before the current one), the
        target is health-gated, and on a failed gate the agent stops it and starts the recorded live process again
        (gated too). The agent's own fallback (:mod:`eagle3ops.commands.process`) starts the recorded process when
        this supervisor dies.

        ``step``, ``change``, ``live``: a speculate job's candidate: the recorded process plus ``change``,
        under its own journal step, never made the current release when ``live`` is False; each further switch of
        the job is the agent's next round (the process it started last stopped, the next record started). A control
        release (step ``control``) is refused: a process serves no image, its releases differ by flags only.

        Returns:
            ``"serving release N"`` or ``"release N failed its health gate; rolled back to release M"``.

        Raises:
            RuntimeError: no target (nothing live before), a control release, a resumed supervisor, or neither the
                target nor the recorded process passed the gate (``unhealthy`` set).
        """
        if step == "control":
            raise self._refuse("switch to a control release (a process serves no image: its releases differ by "
                               "flags only, like for like already)")
        assert self.plan.process_dir is not None
        pdir = Path(self.plan.process_dir)
        journal = self.sup.journal
        if journal.first(step, "start") is not None:
            self.sup.unhealthy = True
            raise RuntimeError("resumed after a process switch had begun: the restore agent restores the recorded "
                               "process once this supervisor ends; check serving and run `eagle3ops recover`")
        recorded = self._live()
        live_n = self.sup.releases.current()
        if live_n is None or self.sup.releases.get(live_n).get("process") != recorded:
            live_n = self.sup.releases.add_process(recorded, self.plan.window_id,
                                                   change="the live process, as recorded")
            self.sup.releases.set_current(live_n)  # it serves now (preflight found it); the switch gates what follows
        target, new = self._target(recorded, live_n, change, live)
        self._write_record("next.", new)  # read by the agent at this round's start only: the next one may rewrite it
        first = getattr(self, "_rounds", 0) == 0
        if first:
            (pdir / "switch").write_text(self.plan.kind)
        journal.log(step, "start", to_release=target, from_release=live_n, argv=new["argv"])
        if first:  # round 1 begins with the agent's stop; a failed stop is no round to roll back from
            self.stop()
        self._rounds = getattr(self, "_rounds", 0) + 1
        try:
            try:
                self._round(self._rounds, "next.")
                self.sup.gate_through_signal()
            except (GateFailed, RuntimeError) as exc:
                journal.log(step, "error", to_release=target, reason=str(exc)[-500:],
                            verdict=isinstance(exc, GateFailed))
                journal.log("rollback", "start", to_release=live_n, failed_release=target)
                try:
                    self._recorded_again(live_n)
                except (GateFailed, RuntimeError) as exc2:
                    raise RuntimeError(f"release {target} failed ({exc}); the rollback to release {live_n} failed "
                                       f"too ({exc2}); see {pdir}/serving.log") from None
                self.sup.releases.set_current(live_n)
                journal.log("rollback", "ok", to_release=live_n, message=f"ROLLED BACK: release {target} failed "
                                                                         f"its health gate; serving release {live_n}")
                return f"release {target} failed its health gate; rolled back to release {live_n}"
            if live:  # a speculate job's switch (release --gate's too) is live only while its gate measures it
                self.sup.releases.set_current(target, measured=self.plan.kind == "speculate")
            journal.log(step, "ok", to_release=target, pid=self._file("restored" + self._suffix),
                        **({} if live else {"live": False}))
            return f"serving release {target}"
        finally:
            if self.plan.kind != "speculate":  # a speculate job may switch back: it calls finish() at its end
                self.finish()

    def _recorded_again(self, release: int | None) -> None:
        """A rollback's round: the agent's next round stops the started process and starts the recorded one again
        (it is ``release``), health-gated.

        Raises:
            GateFailed, RuntimeError: the agent did not answer or the recorded process failed its gate; serving is
                then marked unhealthy and the rollback's error journaled.
        """
        self._rounds = getattr(self, "_rounds", 1) + 1
        try:
            self._round(self._rounds, "")
            self.sup.gate_through_signal()
        except (GateFailed, RuntimeError) as exc:
            self.sup.unhealthy = True
            self.sup.journal.log("rollback", "error", to_release=release, reason=str(exc)[-500:])
            raise

    def finish(self) -> None:
        """Tell the restore agent the switch is over (``done``): it exits, leaving the started process serving."""
        if self.plan.process_dir is not None and (Path(self.plan.process_dir) / "switch").exists():
            (Path(self.plan.process_dir) / "done").write_text(_now())

    def return_to(self, release: int | None, why: str) -> str:
        """A speculate job's rollback after its switch passed: the agent stops the started process and starts the
        recorded live process again (its next round), health-gated; it is ``release`` (the switch made the live
        process that release).

        Raises:
            RuntimeError: the agent did not answer, or the recorded process failed its gate (``unhealthy`` set).
        """
        journal = self.sup.journal
        journal.log("rollback", "start", to_release=release, failed_release=self.sup.releases.current(),
                    reason=why[-300:])
        try:
            self._recorded_again(release)
        except (GateFailed, RuntimeError) as exc:
            raise RuntimeError(f"the rollback to release {release} failed ({exc}); see "
                               f"{self.plan.process_dir}/serving.log") from None
        if release is not None:
            self.sup.releases.set_current(release)
        journal.log("rollback", "ok", to_release=release, message=f"ROLLED BACK ({why}): serving release {release}")
        return f"rolled back to release {release}"

    def reinstate(self, release: int, why: str, step: str = "keep-switch") -> str:
        """An ``aba`` gate kept the speculative release: the agent's next round stops the recorded process (serving
        the baseline's second block) and starts the speculative one again (the ``next.`` record its switch wrote,
        unchanged since), health-gated; on a failed gate one more round brings the recorded process back.

        Raises:
            RuntimeError: the agent did not answer, or the recorded process failed its gate too (``unhealthy``)."""
        journal = self.sup.journal
        live_n = self.sup.releases.current()
        journal.log(step, "start", to_release=release, reason=why[-300:])
        self._rounds = getattr(self, "_rounds", 1) + 1
        try:
            self._round(self._rounds, "next.")
            self.sup.gate_through_signal()
        except (GateFailed, RuntimeError) as exc:
            journal.log(step, "error", to_release=release, reason=str(exc)[-500:])
            return f"release {release} failed its health gate; " + self.return_to(live_n, f"release {release} "
                                                                                           f"failed: {exc}")
        self.sup.releases.set_current(release)
        journal.log(step, "ok", to_release=release)
        return f"serving release {release}"

    def record(self) -> None:
        """Journal the process the driver recorded from /proc (pid, command line, cwd, uid); the record itself is
        in the process dir."""
        self.sup.journal.log("record", "ok", pid=self.plan.process_pid, argv=self._argv(), cwd=self._file("cwd"),
                             uid=self._file("uid"))

    def api_key(self) -> str | None:
        """From the recorded command line (``--api-key``) and environment (``VLLM_API_KEY``)."""
        env = [e.decode(errors="replace") for e in self._bytes("environ.nul").split(b"\0") if e]
        return api_key_from_inspect({"Config": {"Cmd": self._argv(), "Env": env}})

    def crash_check(self) -> Callable[[], str | None]:
        return self._exited

    def running(self) -> bool:
        """Host pids are invisible from the supervisor's container: the last gate decides."""
        journal = self.sup.journal
        if journal.first("stop", "start") is None:
            return True  # never asked to stop: the agent stops nothing once this supervisor ends
        return journal.last("health") is not None and journal.last("health")["event"] == "ok"

    def keeps_release(self) -> bool:
        """A window restores the process as recorded (no release); release and rollback plans keep releases."""
        return self.plan.kind != "window"
