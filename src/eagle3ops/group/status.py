"""What ``eagle3ops group status GROUP`` says about a rollout: each host's place in it and what comes next (pure)."""

from __future__ import annotations

from typing import Any

from eagle3ops.group.journal import RolloutState
from eagle3ops.group.rollout import RolloutPlan, return_steps

__all__ = ["view"]


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
