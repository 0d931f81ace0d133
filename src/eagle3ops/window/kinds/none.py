"""Serving kind ``none`` on the driver side: a host that only trains; no serving to find, stop, restore or gate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from eagle3ops.config import HostConfig
from eagle3ops.config.plan import NO_SERVING_NOTE, Plan
from eagle3ops.window.common import WindowError
from eagle3ops.window.kinds.base import DriverKind, ServingFindings, stage_previews

if TYPE_CHECKING:
    from eagle3ops.remote import Remote


class NoServingKind(DriverKind):
    """A host that only trains (``serving: none``): no serving to find, stop, restore or gate."""

    name = "none"
    record_form = None
    answers_http = False
    dry_run_note = NO_SERVING_NOTE

    def refuse(self, h: HostConfig, what: str) -> None:
        raise WindowError(f"host {h.name} has no serving: `hosts.{h.name}.serving` is `none` in the inventory (a "
                          f"host that only trains), so there is nothing to {what}. Run {what} on a host that serves, "
                          f"or describe this host's serving (`eagle3ops config docs inventory`).")

    def preflight(self, r: "Remote", pf: ServingFindings, need_serving: bool) -> None:
        pf.add("serving", True, NO_SERVING_NOTE)  # no serving container to find or check

    def plan_fields(self, h: HostConfig, window_id: str, serving_container: str | None,
                    process_pid: int | None) -> dict[str, Any]:
        return {"serving_container": ""}

    def supervisor_commands(self, h: HostConfig, plan: Plan) -> list[list[str]]:
        return stage_previews(h, plan)  # the stages, nothing else (see NO_SERVING_NOTE)

    def looked_for(self, h: HostConfig) -> str:
        return "no serving (serving: none)"

    def live_state(self, r: "Remote") -> tuple[str, bool | None]:
        return "no serving (serving: none)", None

    def start_stopped(self, r: "Remote") -> tuple[str, list[Any]]:
        return "nothing", []

    def drift_note(self, h: HostConfig) -> str | None:
        return "serving: none (a host that only trains): no serving container to compare"

    def served_argv(self, r: "Remote") -> tuple[list[str], Callable[[str], str | None], str] | None:
        return None
