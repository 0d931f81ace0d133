"""Serving kinds on the driver side: what a window's driver does differently per serving manager, one class each,
chosen once from the host's ``serving.kind`` (:func:`driver_kind`).

Each class says which commands it refuses (:meth:`DriverKind.refuse`), what a release may change, how preflight
finds live serving, which plan fields it fills, what runs on the host before the supervisor (the ``process`` and
``systemd`` kinds' restore agent), what ``--dry-run`` shows the supervisor doing, and what ``config check`` says.
Each also reads the live server's command line and files as it sees them (:meth:`DriverKind.served_argv`: serving's
``--chat-template``, :mod:`eagle3ops.window.served_template`). The host side of each kind is
:mod:`eagle3ops.supervisor.kinds` (the driver never imports it: the plan's
``serving_kind`` is the only thing the two share). Nothing else on the driver side looks at the kind's name.

Modules, named as the host side's (:mod:`eagle3ops.supervisor.kinds`): :mod:`.base` (the interface and what kinds
share), :mod:`.container` (``container`` and ``compose``), :mod:`.process`, :mod:`.systemd`, :mod:`.none`. A new
kind is one new module here and one there, plus its entry in :data:`DRIVER_KINDS`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eagle3ops.config import HostConfig
from eagle3ops.window.kinds.base import (DriverKind, agent_limit_s, agent_stop_wait_s, check_session_kill, proc_argv,
                                         supervisor_words)
from eagle3ops.window.kinds.container import (ComposeKind, ContainerKind, check_serving_container,
                                              find_serving_container)
from eagle3ops.window.kinds.none import NoServingKind
from eagle3ops.window.kinds.process import ProcessKind, check_process
from eagle3ops.window.kinds.systemd import SystemdKind

if TYPE_CHECKING:
    from eagle3ops.remote import Remote


#: ``serving.kind`` → its driver-side class.
DRIVER_KINDS: dict[str, type[DriverKind]] = {k.name: k for k in (ContainerKind, ComposeKind, ProcessKind,
                                                                 SystemdKind, NoServingKind)}


def driver_kind(h: HostConfig) -> DriverKind:
    """The driver-side serving kind of host ``h`` (from ``serving.kind``, which the inventory validated)."""
    return DRIVER_KINDS[h.serving.kind]()


def require_serving(h: HostConfig, what: str) -> None:
    """Refuse ``what`` (``release``, ``rollback``, ``speculate``) where the host's serving kind cannot do it
    (:meth:`DriverKind.refuse`): ``serving: none`` refuses all three; a plain process and a systemd unit do all three
    (their releases differ from the live one by flags and environment only).

    Raises:
        WindowError: the message names the host, the inventory key and the fix.
    """
    driver_kind(h).refuse(h, what)


def require_switchable(r: "Remote", what: str) -> None:
    """:func:`require_serving`, then what the host says (read-only): refuse ``what`` where the host cannot switch
    serving to another release (:meth:`DriverKind.host_refusal`, e.g. a systemd unit's drop-in the SSH user cannot
    write).

    Raises:
        WindowError: the message names the host and the fix.
    """
    from eagle3ops.window.common import WindowError

    require_serving(r.host, what)
    refusal = driver_kind(r.host).host_refusal(r)
    if refusal:
        raise WindowError(refusal)


def serving_container(r: "Remote") -> tuple[list[str], str]:
    """Find the host's serving container (read-only), as its serving kind looks for it
    (:func:`eagle3ops.window.kinds.container.find_serving_container`).

    Returns:
        (names found, what was looked for). An empty list: no such container (callers then use
        :func:`eagle3ops.commands.serving.default_name`).
    """
    return find_serving_container(r, driver_kind(r.host))


__all__ = ["DRIVER_KINDS", "ComposeKind", "ContainerKind", "DriverKind", "NoServingKind", "ProcessKind",
           "SystemdKind", "agent_limit_s", "agent_stop_wait_s", "check_process", "check_serving_container",
           "check_session_kill", "driver_kind", "proc_argv", "require_serving", "require_switchable",
           "serving_container",
           "supervisor_words"]
