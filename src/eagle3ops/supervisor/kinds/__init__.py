"""Serving kinds on the host side: one class per serving manager behind :class:`.base.ServingKind`, chosen once
per window from the plan's ``serving_kind`` (:func:`for_plan`).

Modules: :mod:`.base` (the interface), :mod:`.container` (``container`` and ``compose``), :mod:`.process` (a plain
process, through the host-side restore agent), :mod:`.systemd` (a systemd unit, through the same agent), :mod:`.none`
(a host that only trains). A new kind is one new module here plus its entry in :data:`KINDS`.
"""

from __future__ import annotations

from eagle3ops.supervisor.kinds.base import KindHost, ServingKind
from eagle3ops.supervisor.kinds.container import ComposeServing, ContainerServing
from eagle3ops.supervisor.kinds.none import NoServing
from eagle3ops.supervisor.kinds.process import ProcessServing
from eagle3ops.supervisor.kinds.systemd import SystemdServing

#: The plan's ``serving_kind`` → its class.
KINDS: dict[str, type[ServingKind]] = {k.name: k for k in (ContainerServing, ComposeServing, ProcessServing,
                                                           SystemdServing, NoServing)}


def for_plan(sup: KindHost) -> ServingKind:
    """The serving kind of ``sup``'s plan, bound to ``sup``.

    Raises:
        ValueError: the plan names a kind this supervisor does not know (a plan written by a newer driver).
    """
    try:
        cls = KINDS[sup.plan.serving_kind]
    except KeyError:
        raise ValueError(f"plan {sup.plan.window_id}: serving kind {sup.plan.serving_kind!r} is not one of "
                         f"{sorted(KINDS)}; run the supervisor image of the driver that wrote the plan") from None
    return cls(sup)


__all__ = ["KINDS", "KindHost", "ServingKind", "for_plan"]
