"""What ``eagle3ops group status GROUP`` says about a rollout: each host's place in it and what comes next; and what
a control request (``group promote|pause|abort``) would do to it (both pure)."""

from __future__ import annotations

from typing import Any

from eagle3ops.group.journal import RolloutState
from eagle3ops.group.rollout import RolloutPlan, return_steps

__all__ = ["request_plan", "view"]


def view(plan: RolloutPlan, st: RolloutState) -> dict[str, Any]:
    """The rollout of ``plan`` where ``st`` says it stands.

    Returns ``{"group", "kind", "label", "target", "state", "hosts": {host: words}, "next", "requests", "failed"}``:
    ``state`` is the ended outcome, or ``returning``, ``abort requested``, ``paused before HOST``, ``running or
    interrupted``; ``next`` the step a
    rerun starts with (None when ended); a host's words: ``skipped (on the target already)``, ``on the target``,
    ``out (drained)``, ``returned``, ``to roll`` or ``untouched``.
    """
    hosts: dict[str, str] = {}
    rolled = set(plan.rolled)
    returned = {k.split(":")[1] for k in st.done if k.startswith("return:") and k.endswith(":switch-back")}
    for h in plan.hosts:
        if h in plan.skipped:
            hosts[h] = "skipped (on the target already)"
        elif h == st.out:
            hosts[h] = "out (drained)" + (", on the target" if h in st.switched else "")
        elif h in st.switched:
            hosts[h] = "on the target" + (" (canary)" if h == plan.canary else "")
        elif h in returned:
            hosts[h] = "returned to its previous release"
        else:
            rolling = not (st.returning or st.ended)
            hosts[h] = "to roll" if h in rolled and rolling else "untouched"
    nxt = None
    if not st.ended:
        if st.returning:
            pending = [s.key for s in return_steps(st.return_switched, st.return_out) if s.key not in st.done]
            nxt = pending[0] if pending else None
        elif st.abort:
            nxt = "return"
        else:
            nxt = next((s.key for s in plan.steps if s.key not in st.done), None)
    state = st.ended or ("returning" if st.returning else "abort requested" if st.abort else
                         f"paused before {st.paused_before}" if st.paused_before else "running or interrupted")
    return {"group": plan.group, "kind": plan.kind, "label": plan.label, "target": plan.target, "state": state,
            "reason": st.end_reason or st.return_reason, "hosts": hosts, "next": nxt,
            "requests": [w for w in ("promote", "abort", "pause") if getattr(st, w)
                         and not (w == "pause" and st.paused_before)],  # a pause acted on is no longer pending
            "failed": dict(st.failed), "reference_acceptance": st.reference}


#: What the rollout's running driver does with each control request (:mod:`eagle3ops.group.execute`).
REQUEST_EFFECT = {"promote": "ends the canary's bake at its next reading and rolls the rest",
                  "pause": "stops the rollout after the host it is on (a rerun of its command continues)",
                  "abort": "returns every switched host to its previous release"}


def request_plan(plan: RolloutPlan, st: RolloutState, what: str, driver: bool | None, *, take_over: bool = False,
                 ) -> dict[str, Any]:
    """What ``group WHAT`` would do to the unfinished rollout of ``plan`` where ``st`` says it stands: append the
    request to its journal, then who acts on it. ``driver``: whether the rollout's driver runs (True/False; None:
    it is another machine's, not knowable here, counted as running). An ``abort`` with no driver running (or with
    ``take_over``) is carried out by this command, under the group lock: ``return_steps`` lists the steps it runs
    (the steps of a return already started that are not done yet, else those returning every switched host, the
    host out first). Pure.

    Returns ``{"request", "effect", "acted_on_by", "driver", "return_steps", "switched", "out"}``; ``acted_on_by``
    is ``the running driver``, ``this command (under the group lock)`` or ``the rollout's command, rerun`` (a
    promote or pause with no driver: it waits in the journal).

    Raises:
        ValueError: ``what`` is not a control request.
    """
    if what not in REQUEST_EFFECT:
        raise ValueError(f"control request {what!r}: one of {sorted(REQUEST_EFFECT)}")
    runs = driver is not False
    here = what == "abort" and (not runs or take_over)
    steps: list[str] = []
    if here:
        ret = (return_steps(st.return_switched, st.return_out) if st.returning
               else return_steps(st.switched, st.out))
        steps = [s.key for s in ret if s.key not in st.done]
    return {"request": what, "effect": REQUEST_EFFECT[what],
            "acted_on_by": ("this command (under the group lock)" if here else "the running driver" if runs
                            else "the rollout's command, rerun"),
            "driver": {True: "running", False: "none", None: "unknown (another machine's)"}[driver],
            "return_steps": steps, "switched": list(st.switched), "out": st.out}
