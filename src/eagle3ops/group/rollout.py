"""A group rollout's plan (pure: facts in, plan out; no I/O).

Three kinds share one rolling path:

- ``speculate``: the canary (the first host, in group order, not on the target release) is drained and the existing
  gate (the ``speculate`` job) runs on it while the others serve; kept, the canary is undrained and **bakes** on live
  traffic (judged by ``watch``'s rules against the gate's figures: :mod:`eagle3ops.speculate.watch`); then every
  other host not on the target rolls: drain → switch → health → served acceptance → undrain.
- ``release`` and ``rollback``: no gate and no bake; every host not on the target rolls the same way.

A rolled host's served acceptance (mean acceptance length, measured over the gate's prompts on the drained host)
must be within :data:`ACCEPTANCE_TOLERANCE` of the reference: the canary's gate figure (the same prompts; its bake's
live-traffic figure only when the gate has none); for ``release``/``rollback`` the first rolled host's.
The first failure returns every switched host to its previous release (:func:`return_steps`: the host that is out
first, then the others newest first). Hosts already on the target release are skipped. How many hosts may be out at
once (``max_out``) is enforced when the plan is carried out (:mod:`.execute`): the balancer's view changes by itself.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

__all__ = ["ACCEPTANCE_TOLERANCE", "KINDS", "PlanError", "RolloutPlan", "Step", "plan_rollout", "release_key",
           "return_steps", "steps_by_host"]

#: A rolled host's served mean acceptance length may differ from the reference's by at most this much.
ACCEPTANCE_TOLERANCE = 0.1
KINDS = ("speculate", "release", "rollback")
#: The steps of one rolled host, in order.
ROLL_ACTIONS = ("drain", "switch", "health", "acceptance", "undrain")
#: The canary's steps (kind ``speculate``): the gate switches, measures and keeps or returns on its own.
CANARY_ACTIONS = ("drain", "gate", "undrain", "bake")
#: A returned host's steps (``drain`` is skipped for the host already out).
RETURN_ACTIONS = ("drain", "switch-back", "health", "undrain")


class PlanError(ValueError):
    """The rollout cannot be planned (unknown kind, a host without facts); the message says what to fix."""


@dataclass(frozen=True)
class Step:
    """One step of a rollout: ``key`` (``"<host>:<action>"``, ``"return:<host>:<action>"`` for a return; what the
    journal records), ``host`` and ``action`` (one of :data:`ROLL_ACTIONS`, :data:`CANARY_ACTIONS` or
    :data:`RETURN_ACTIONS`)."""

    key: str
    host: str
    action: str


@dataclass(frozen=True)
class RolloutPlan:
    """The plan of one rollout of ``group`` to the release ``target`` (a key: :func:`release_key`; ``label`` says it
    in words). ``canary``: the host gated and baked first (``speculate`` only); ``skipped``: hosts already on the
    target; ``steps`` in order; ``bake_s``/``bake_interval_s``/``bake_sustained_s`` (seconds) the bake; ``max_out``
    and ``out_wait_s`` (seconds) the capacity rule; ``not_skipped``: why each rolled host is not on the target, as
    the facts said (empty in a plan written before it was kept)."""

    group: str
    kind: str
    target: str
    label: str
    hosts: tuple[str, ...]
    max_out: int
    canary: str | None
    skipped: tuple[str, ...]
    steps: tuple[Step, ...]
    bake_s: float = 0.0
    bake_interval_s: float = 60.0
    bake_sustained_s: float = 600.0
    out_wait_s: float = 600.0
    tolerance: float = ACCEPTANCE_TOLERANCE
    options: Mapping[str, Any] = field(default_factory=dict)
    not_skipped: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The plan as JSON-ready data (what ``plan.json`` and ``--dry-run --json`` hold)."""
        d = asdict(self)
        d["steps"] = [asdict(s) for s in self.steps]
        d["hosts"], d["skipped"], d["options"] = list(self.hosts), list(self.skipped), dict(self.options)
        d["not_skipped"] = dict(self.not_skipped)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RolloutPlan":
        """The plan back from :meth:`to_json`'s data."""
        return cls(**{**d, "hosts": tuple(d["hosts"]), "skipped": tuple(d["skipped"]),
                      "steps": tuple(Step(**s) for s in d["steps"]), "options": dict(d.get("options") or {}),
                      "not_skipped": dict(d.get("not_skipped") or {})})

    @property
    def rolled(self) -> tuple[str, ...]:
        """The hosts the plan switches, in order (the canary first)."""
        return tuple(dict.fromkeys(s.host for s in self.steps))


def release_key(kind: str, what: Mapping[str, Any]) -> str:
    """A release's identity across the group's hosts (release numbers are each host's own): ``kind`` and the
    canonical JSON of what makes it (e.g. the run and head digest, or the change), hashed; 16 hex digits."""
    body = json.dumps({"kind": kind, **what}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]


def plan_rollout(group: str, hosts: Sequence[str], max_out: int, kind: str, target: str, label: str,
                 on_target: Mapping[str, bool], *, bake_s: float = 0.0, bake_interval_s: float = 60.0,
                 bake_sustained_s: float = 600.0, out_wait_s: float = 600.0,
                 options: Mapping[str, Any] | None = None, why: Mapping[str, str] | None = None) -> RolloutPlan:
    """Plan a rollout of ``group`` (``hosts`` in order) to ``target``; ``on_target[host]``: the host serves the target
    release already (skipped); ``why[host]``: why a host is not (kept as the plan's ``not_skipped``).
    ``max_out``: hosts that may be out at once (at least 1). Times in seconds.

    Returns a plan with no steps when every host is on the target.

    Raises:
        PlanError: ``kind`` not one of :data:`KINDS`, ``max_out`` below 1, or a host without a fact.
    """
    if kind not in KINDS:
        raise PlanError(f"rollout kind {kind!r}: expected one of {', '.join(KINDS)}")
    if max_out < 1:
        raise PlanError(f"max_out {max_out}: at least one host must be allowed out to roll")
    missing = [h for h in hosts if h not in on_target]
    if missing:
        raise PlanError(f"no release facts for host(s) {missing}: read each host's live release first")
    todo = [h for h in hosts if not on_target[h]]
    skipped = tuple(h for h in hosts if on_target[h])
    canary = todo[0] if kind == "speculate" and todo else None
    steps: list[Step] = []
    for h in todo:
        actions = CANARY_ACTIONS if h == canary else ROLL_ACTIONS
        steps += [Step(f"{h}:{a}", h, a) for a in actions]
    return RolloutPlan(group=group, kind=kind, target=target, label=label, hosts=tuple(hosts), max_out=max_out,
                       canary=canary, skipped=skipped, steps=tuple(steps),
                       bake_s=bake_s if kind == "speculate" else 0.0, bake_interval_s=bake_interval_s,
                       bake_sustained_s=bake_sustained_s, out_wait_s=out_wait_s, options=dict(options or {}),
                       not_skipped={h: (why or {}).get(h, "not on the target") for h in todo})


def steps_by_host(plan: RolloutPlan) -> list[tuple[str, list[Step]]]:
    """The plan's steps grouped by host, in order (a pause takes effect between two groups)."""
    out: list[tuple[str, list[Step]]] = []
    for s in plan.steps:
        if not out or out[-1][0] != s.host:
            out.append((s.host, []))
        out[-1][1].append(s)
    return out


def return_steps(switched: Sequence[str], out_host: str | None = None) -> list[Step]:
    """The steps that return every switched host to its previous release: ``out_host`` (the host drained when the
    rollout stopped) first and without a drain (not switched: only undrained), then the other ``switched`` hosts
    newest first (each drained, switched back, health-checked, undrained)."""
    if out_host is not None and out_host not in switched:  # drained, never switched: it only takes traffic again
        head = [Step(f"return:{out_host}:undrain", out_host, "undrain")]
    else:
        head = []
    order = ([out_host] if out_host in switched else []) + [h for h in reversed(switched) if h != out_host]
    return head + [Step(f"return:{h}:{a}", h, a) for h in order for a in RETURN_ACTIONS
                   if not (a == "drain" and h == out_host)]
