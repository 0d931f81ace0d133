"""The load balancer a serving group sits behind, as a rollout sees it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ServerState:
    """One group host as the balancer reports it.

    ``state``: ``"ready"`` (takes traffic), ``"drain"`` (no new sessions), ``"maint"`` (out) or ``"down"`` (the
    balancer's own health check fails); ``sessions``: connections the balancer has open to it now (count).
    """

    host: str
    state: str
    sessions: int


class Balancer(Protocol):
    """Reads and sets the balancer's view of each host of one group (host = inventory host name)."""

    def states(self) -> dict[str, ServerState]:
        """Every host of the group, by host name."""
        ...

    def set_state(self, host: str, state: str) -> None:
        """Set ``host`` to ``"ready"``, ``"drain"`` or ``"maint"``; raises ``RuntimeError`` naming the host on failure."""
        ...
