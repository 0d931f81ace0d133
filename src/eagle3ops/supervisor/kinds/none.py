"""Serving kind ``none``: a host that only trains (``serving: none``). There is nothing to record, stop, restore,
switch or gate: the runner journals ``serving skip`` and runs only the stages; every serving step refuses."""

from __future__ import annotations

from eagle3ops.config.plan import NO_SERVING_NOTE
from eagle3ops.supervisor.kinds.base import ServingKind


class NoServing(ServingKind):
    """No production serving: :attr:`manages` is False and every step of :class:`ServingKind` refuses."""

    name = "none"
    manages = False

    def switch(self) -> str:
        """Refused: there is no serving to release or roll back (the driver refuses such a plan first).

        Raises:
            RuntimeError: always, naming the host.
        """
        raise RuntimeError(f"host {self.plan.host} has no serving (serving: none): nothing to {self.plan.kind}")

    def note(self) -> str:
        """What the window leaves out (journal, result)."""
        return NO_SERVING_NOTE
