"""Serving kind ``systemd``, supervisor side: vLLM run by a systemd unit on the host.

The supervisor's container cannot run the host's ``systemctl``; the driver records the unit (``systemctl show``
into ``unit.show``) and starts the systemd variant of the host-side restore agent
(:data:`eagle3ops.commands.systemd.AGENT_SH`), which answers the same stop and restore requests as the ``process``
kind's agent with ``systemctl stop|start UNIT``. This side is therefore the ``process`` kind's request-and-gate
steps with the unit's record: windows only (a release would have to edit the unit; release and rollback refuse).
NOT run against a real systemd: its tests use a named stand-in of ``systemctl`` (``tests/test_serving_kinds.py``).
"""

from __future__ import annotations

from typing import Any

from eagle3ops.commands import systemd as sd
from eagle3ops.health import api_key_from_inspect
from eagle3ops.supervisor.kinds.process import ProcessServing


class SystemdServing(ProcessServing):
    """A systemd unit, stopped and started by the restore agent; recorded from ``unit.show``."""

    name = "systemd"

    def _unit(self) -> dict[str, object]:
        return sd.parse_show(self._file("unit.show"))

    def record(self) -> None:
        """Journal the unit the driver recorded (name, ``ExecStart`` command line, state)."""
        u = self._unit()
        self.sup.journal.log("record", "ok", unit=self.plan.serving_unit, argv=u["argv"], active=u["active"])

    def api_key(self) -> str | None:
        """From the unit's ``ExecStart`` (``--api-key``) and ``Environment`` (``VLLM_API_KEY``)."""
        u = self._unit()
        return api_key_from_inspect({"Config": {"Cmd": u["argv"], "Env": u["environ"]}})

    def switch(self, step: str = "switch", change: Any | None = None, live: bool = True) -> str:
        """Refused: a release of a unit would edit its unit file (not supported; the driver refuses first).

        Raises:
            RuntimeError: always, naming the unit and the fix.
        """
        raise RuntimeError(f"host {self.plan.host} serves with systemd unit {self.plan.serving_unit!r}: {self.plan.kind} "
                           f"is not supported for systemd serving (windows are); edit the unit and restart it, or "
                           f"run serving as a container")

    def keeps_release(self) -> bool:
        return False
