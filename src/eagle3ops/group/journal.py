"""A group rollout's journal and the group lock, on the group's first host, and where a rollout stands.

Layout under ``<state_dir>/groups/<group>/`` of the group's first host (through its executor: every write is a host
write, made only under the lock — control requests excepted, which only append a line):

- ``lock/holder.json``: the driver holding the group lock (machine, pid, user, since, command); a driver of this
  machine whose process is gone is taken over by a rerun (the cycle's lock rule:
  :class:`eagle3ops.speculate.cyclerun.CycleJournal`);
- ``current.json``: ``{"id"}`` of the newest rollout;
- ``rollouts/<id>/plan.json`` (:class:`~.rollout.RolloutPlan`) and ``journal.jsonl``: one event a line —
  ``{"t", "step", "event", ...}`` with ``event`` ``start``/``done``/``failed``/``busy`` for a step, ``interval``
  for a bake reading, ``promote``/``abort``/``pause`` for a control request (``step: "control"``), ``run``/``paused``/
  ``return``/``end`` for the rollout (``step: "rollout"``).

:func:`replay` (pure) reads the events into a :class:`RolloutState`: which steps are done, which hosts are switched,
which one is out, the reference acceptance, pending requests, and whether the rollout is returning or has ended.
"""

from __future__ import annotations

import getpass
import json
import socket
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from eagle3ops import redact
from eagle3ops.commands import host as hc
from eagle3ops.group.rollout import RolloutPlan
from eagle3ops.speculate.cyclerun import CycleJournal, pid_alive

__all__ = ["GroupJournal", "GroupLocked", "RolloutState", "group_dir", "new_rollout_id", "replay"]


class GroupLocked(RuntimeError):
    """Another driver holds the group lock; the message names it and what to do."""


def group_dir(state_dir: str, group: str) -> str:
    """``<state_dir>/groups/<group>``: the group's lock and rollouts on its first host."""
    return f"{state_dir}/groups/{group}"


def new_rollout_id(target: str) -> str:
    """``<UTC time>-<target[:8]>``: sorts by start time and names the release."""
    return f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{target[:8]}"


class GroupJournal(CycleJournal):
    """The group's lock and its rollouts in ``directory`` (:func:`group_dir`) through the executor ``r`` (anything
    with ``run(argv, check=, stdin=)``: the first host's SSH executor; tests: this machine's). ``record`` and
    ``entries`` work on the rollout chosen with :meth:`use` (``journal.jsonl`` of ``rollouts/<id>/``)."""

    def __init__(self, r: Any, directory: str, secret_env: Sequence[str] = ()):
        super().__init__(r, directory, secret_env)
        self.rollout_id: str | None = None

    def use(self, rollout_id: str) -> None:
        """Work on rollout ``rollout_id`` from now on."""
        self.rollout_id = rollout_id
        self.journal = f"{self.dir}/rollouts/{rollout_id}/journal.jsonl"

    lock_name = "the group lock"
    locked_error = GroupLocked
    wait_hint = "wait for it (its progress: `eagle3ops group status`)"

    def holder_alive(self) -> bool | None:
        """Whether the lock's driver runs: True/False for a driver of this machine, None for another machine's
        (not knowable from here), False when the lock is free."""
        held = self.read_holder()
        if not held and not self.r.run(hc.test_dir(self.lock_dir), check=False).ok:
            return False
        if held.get("machine") == socket.gethostname() and isinstance(held.get("pid"), int):
            return pid_alive(held["pid"])
        return None

    def current(self) -> str | None:
        """The newest rollout's id (None: the group never rolled)."""
        out = self.r.run(hc.cat_if_exists(f"{self.dir}/current.json"), check=False).stdout or ""
        try:
            return json.loads(out)["id"] if out.strip() else None
        except (ValueError, KeyError, TypeError):
            return None

    def begin(self, rollout_id: str, plan: RolloutPlan) -> None:
        """Write a new rollout's plan (its secrets masked: a label may quote ``--api-key``) and make it the current
        one (under the lock)."""
        d = f"{self.dir}/rollouts/{rollout_id}"
        self.r.run(hc.mkdir_p(d))
        self.r.run(hc.write_file(f"{d}/plan.json"),
                   stdin=json.dumps(redact.value(plan.to_json(), self.secret_env), indent=2) + "\n")
        self.r.run(hc.write_file(f"{self.dir}/current.json"), stdin=json.dumps({"id": rollout_id}) + "\n")
        self.use(rollout_id)

    def plan(self) -> RolloutPlan | None:
        """The plan of the rollout in use (None: not written)."""
        out = self.r.run(hc.cat_if_exists(f"{self.dir}/rollouts/{self.rollout_id}/plan.json"), check=False).stdout
        return RolloutPlan.from_json(json.loads(out)) if (out or "").strip() else None

    def request(self, what: str, **fields: Any) -> None:
        """Append a control request (``promote``, ``abort`` or ``pause``) to the rollout in use; the driver acts on
        it at its next check (no lock needed: one appended line)."""
        self.record("control", what, by=f"{getpass.getuser()}@{socket.gethostname()}", **fields)


@dataclass
class RolloutState:
    """Where a rollout stands after its journal (:func:`replay`).

    ``done``: step key → its ``done`` figures; ``interrupted``: a step started and neither done nor failed (its driver
    died); ``switched``: hosts on the target release, in switch order (returned ones removed); ``out``: the host
    drained and not undrained; ``reference``: the mean acceptance length rolled hosts are held to (None: not yet
    known or not speculating); ``returning``: the return was started (``return_reason`` why); ``ended``: the
    ``end`` event's outcome; ``promote``/``abort``/``pause``: requests pending; ``bake_started``: epoch seconds of the
    bake's start; ``previous``: host → the release it had before its switch; ``failed``: step key → its error;
    ``return_switched``/``return_out``/``aborted``: what the return started with (the hosts switched, the one out)
    and whether an abort started it; ``paused_before``: the host a paused rollout stopped before.
    """

    done: dict[str, dict[str, Any]] = field(default_factory=dict)
    interrupted: str | None = None
    switched: list[str] = field(default_factory=list)
    out: str | None = None
    reference: float | None = None
    returning: bool = False
    return_reason: str | None = None
    ended: str | None = None
    end_reason: str | None = None
    promote: bool = False
    abort: bool = False
    pause: bool = False
    bake_started: float | None = None
    previous: dict[str, Any] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    return_switched: list[str] = field(default_factory=list)
    return_out: str | None = None
    aborted: bool = False
    paused_before: str | None = None


def _figures(e: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in e.items() if k not in ("t", "step", "event")}


def replay(plan: RolloutPlan, entries: Sequence[Mapping[str, Any]]) -> RolloutState:
    """Where the rollout of ``plan`` stands after ``entries`` (its journal's events, in order); pure."""
    st = RolloutState()
    for e in entries:
        step, ev = e.get("step"), e.get("event")
        if step == "control":
            if ev == "promote":
                st.promote = True
            elif ev == "abort":
                st.abort = True
            elif ev == "pause":
                st.pause = True
            continue
        if step == "rollout":
            if ev == "run":
                st.pause, st.paused_before = False, None  # a rerun continues a paused rollout
            elif ev == "paused":
                st.paused_before = e.get("next")
            elif ev == "return":
                st.returning, st.return_reason, st.aborted = True, e.get("reason"), bool(e.get("aborted"))
                st.return_switched, st.return_out = list(e.get("switched") or []), e.get("out")
            elif ev == "end":
                st.ended, st.end_reason = e.get("outcome"), e.get("reason")
            continue
        if not isinstance(step, str):
            continue
        host, _, action = step.removeprefix("return:").rpartition(":")
        if ev == "start":
            st.done.pop(step, None)
            st.interrupted = step
            if action == "bake" and "epoch" in e:
                st.bake_started = float(e["epoch"])
        elif ev == "busy":  # nothing was done: the step is still to run
            st.interrupted = step
        elif ev == "failed":
            st.interrupted = None
            st.failed[step] = str(e.get("error"))
        elif ev == "done":
            st.interrupted = None
            st.done[step] = _figures(e)
            _apply_done(plan, st, step, host, action, e)
    return st


def _apply_done(plan: RolloutPlan, st: RolloutState, step: str, host: str, action: str,
                e: Mapping[str, Any]) -> None:
    """One ``done`` event's effect on where the rollout stands."""
    returning = step.startswith("return:")
    if action == "drain":
        st.out = host
    elif action == "undrain" and st.out == host:
        st.out = None
    elif action in ("switch", "gate") and not returning:
        if action == "switch" or e.get("verdict") == "keep":
            st.switched.append(host) if host not in st.switched else None
            st.previous[host] = e.get("previous")
        if action == "gate" and isinstance(e.get("mean_acceptance_length"), (int, float)):
            st.reference = float(e["mean_acceptance_length"])
    elif action == "switch-back" and host in st.switched:
        st.switched.remove(host)
    elif action == "bake" and st.reference is None and isinstance(e.get("mean_acceptance_length"), (int, float)):
        # the gate's figure is kept when there is one: it was measured over the prompts the acceptance step replays
        st.reference = float(e["mean_acceptance_length"])
    elif action == "acceptance" and st.reference is None and plan.kind != "speculate":
        mal = e.get("mean_acceptance_length")
        st.reference = float(mal) if isinstance(mal, (int, float)) else None
