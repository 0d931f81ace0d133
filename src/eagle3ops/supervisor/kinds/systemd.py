"""Serving kind ``systemd``, supervisor side: vLLM run by a systemd unit on the host.

The supervisor's container cannot run the host's ``systemctl``; the driver records the unit (``systemctl show``
into ``unit.show``, its ``ExecStart`` word for word into ``unit.argv.json``, eagle3ops' drop-in into ``unit.dropin``)
and starts the systemd variant of the host-side restore agent (:data:`eagle3ops.commands.systemd.AGENT_SH`), which
answers the same stop, restore and switch requests as the ``process`` kind's agent with ``systemctl``. This side is
therefore the ``process`` kind's request-and-gate steps with the unit's record. A release or rollback is a drop-in
(:func:`eagle3ops.commands.systemd.dropin_text`) that this side writes into the process dir (``next.unit.dropin``,
mode 0600) and the agent puts in place before ``systemctl daemon-reload`` and ``systemctl start``; a release record
(``releases/NNNN.json``, 0600) holds the unit's command line, environment and drop-in, which is what a later rollback
writes back. A speculate job (``speculate``, ``release --gate``) switches the same way in the agent's rounds:
each restart (the baseline restarted, the speculative or changed release, a candidate, the return to the release
live before, the kept release served again) puts the round's drop-in in place (``next.unit.dropin``) or the unit as
recorded back (``unit.dropin``; none recorded: eagle3ops' drop-in removed), then ``daemon-reload`` and start; a
control release is refused as for a process (no image: like for like already). Met for real in
``tests/test_systemd_real.py`` (systemd 252 as PID 1 of a container).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3ops.commands import systemd as sd
from eagle3ops.config.plan import ReleaseChange
from eagle3ops.health import api_key_from_inspect
from eagle3ops.supervisor.kinds.process import ProcessServing
from eagle3ops.supervisor.releases import write_private


class SystemdServing(ProcessServing):
    """A systemd unit, stopped and started (and switched between releases by a drop-in) by the restore agent;
    recorded from ``unit.show``, ``unit.argv.json`` and ``unit.dropin``."""

    name = "systemd"

    def _unit(self) -> dict[str, Any]:
        """The recorded unit: :func:`~eagle3ops.commands.systemd.parse_show` of ``unit.show``, its ``argv`` and
        ``path`` taken word for word from ``unit.argv.json`` when the driver could read the bus."""
        u: dict[str, Any] = sd.parse_show(self._file("unit.show"))
        exact = sd.parse_execstart_json(self._file("unit.argv.json"))
        if exact is not None:
            u["path"], u["argv"] = exact
        return u

    def _live(self) -> dict[str, Any]:
        """The recorded unit as a release record: ``{"unit", "path", "argv", "environ", "dropin"}`` (``dropin``:
        eagle3ops' drop-in as it was at record time, ``""`` when there was none)."""
        u = self._unit()
        try:
            dropin = self._bytes("unit.dropin").decode(errors="surrogateescape")
        except OSError:
            dropin = ""
        return {"unit": self.plan.serving_unit, "path": u.get("path", ""), "argv": u["argv"],
                "environ": u["environ"], "dropin": dropin}

    def _argv(self) -> list[str]:
        return list(self._unit()["argv"])

    def _changed(self, recorded: dict[str, Any], change: ReleaseChange) -> dict[str, Any]:
        """The process kind's change (flags set, named variables replaced) plus the drop-in that makes the unit
        run it (:func:`eagle3ops.commands.systemd.dropin_text`)."""
        # the recorded words are systemd's (``$`` unexpanded); the change's flags are literal
        literal = change.model_copy(update={"args": [sd.exec_literal(a) for a in change.args]})
        new = super()._changed(recorded, literal)
        return {**new, "dropin": sd.dropin_text(new["argv"], new["environ"], new.get("path", ""))}

    def _write_record(self, prefix: str, process: dict[str, Any]) -> None:
        """Write the release's drop-in as ``<prefix>unit.dropin`` in the process dir (mode 0600, the dir's owner:
        it holds the unit's secrets); an empty file means "no drop-in" (the agent removes eagle3ops' drop-in).

        Raises:
            RuntimeError: the record is not one of a systemd unit (a release recorded while the host served with
                a process), or of another unit than the one this host serves with.
        """
        assert self.plan.process_dir is not None
        if "dropin" not in process or process.get("unit") != self.plan.serving_unit:
            raise RuntimeError(f"the target release is not a release of systemd unit {self.plan.serving_unit!r} "
                               f"(it records {process.get('unit') or 'a process'}): roll back to a release of this "
                               f"unit (`eagle3ops status {self.plan.host}` lists them), or change the unit yourself")
        write_private(Path(self.plan.process_dir) / f"{prefix}unit.dropin",
                      str(process["dropin"]).encode(errors="surrogateescape"))

    def _round(self, k: int, prefix: str) -> None:
        """:meth:`ProcessServing._round`, then the agent's ``dropin-failed[.k]``: a drop-in it could not put in place
        (or remove) fails the round, so that a unit started without the release's change is never gated and made
        the live release (the switch then rolls back, or reports serving unhealthy).

        Raises:
            RuntimeError: the agent's errors, or the drop-in was not put in place (the message says which file)."""
        super()._round(k, prefix)
        failed = self._file("dropin-failed" + self._suffix)
        if failed:
            raise RuntimeError(f"the restore agent {failed}: the unit runs without record '{prefix or 'recorded'}'s "
                               f"drop-in (see {self.plan.process_dir}/agent.log); the SSH user must be able to write "
                               f"{sd.DROPIN_DIR}/{self.plan.serving_unit}.d/")

    def record(self) -> None:
        """Journal the unit the driver recorded (name, ``ExecStart`` command line, state)."""
        u = self._unit()
        self.sup.journal.log("record", "ok", unit=self.plan.serving_unit, argv=u["argv"], active=u["active"])

    def api_key(self) -> str | None:
        """From the unit's ``ExecStart`` (``--api-key``) and ``Environment`` (``VLLM_API_KEY``)."""
        u = self._unit()
        return api_key_from_inspect({"Config": {"Cmd": u["argv"], "Env": u["environ"]}})

