"""Carrying out a group rollout's plan (:mod:`.rollout`) with injected step callables, journaled (:mod:`.journal`).

The caller holds the group lock. :func:`run_rollout` skips the steps journaled done (a rerun after a killed driver
resumes; a step started and not done runs again, so every step callable must be safe to repeat), acts on the control
requests between steps (``abort``: return now; ``pause``: stop before the next host; ``promote``: end the bake), and
on the first failure returns every switched host (:func:`eagle3ops.group.rollout.return_steps`). Before every drain
it waits, bounded by the plan's ``out_wait_s``, until draining keeps the hosts out — drained, in maintenance or down,
as the balancer reports them — within ``max_out`` (:func:`eagle3ops.group.drain.wait_for_capacity`). The bake
reads the canary's interval figures and judges them with
``watch``'s rules (:func:`eagle3ops.speculate.watch.judge`, :class:`~eagle3ops.speculate.watch.Tracker`) against the
thresholds the gate step returned (:func:`eagle3ops.speculate.watch.thresholds`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from eagle3ops.group.balancer import Balancer
from eagle3ops.group.journal import GroupJournal, RolloutState, replay
from eagle3ops.group.rollout import RolloutPlan, Step, return_steps, steps_by_host
from eagle3ops.speculate.watch import Thresholds, Tracker, judge

__all__ = ["ReturnFailed", "StepBusy", "StepFailed", "StepFns", "run_return", "run_rollout"]


class StepFailed(RuntimeError):
    """A rollout step failed (the message names host and step); the rollout returns every switched host."""


class StepBusy(RuntimeError):
    """A step cannot start yet and nothing was changed (e.g. the window an earlier driver started on the host still
    runs); the rollout stops where it is, journaled as it was, and a rerun tries the step again."""


class ReturnFailed(RuntimeError):
    """Returning a switched host failed; the message names the hosts still on the target release and the rerun."""


class _Abort(Exception):
    """An ``abort`` request was read."""


@dataclass(frozen=True)
class StepFns:
    """What each step does to one host (host = inventory name); tests pass stand-ins.

    ``drain``/``undrain``/``health``: do it or raise; ``switch(host)``: to the target release, returns
    ``{"release", "previous"}`` (release numbers; ``previous`` is what a return goes back to);
    ``switch_back(host, previous)``: to ``previous``; ``acceptance(host)``: the served mean acceptance length on the
    drained host (None: no draft round measured); ``gate(host)``: the speculate job on the drained canary, returns
    ``{"verdict", "reason", "release", "previous", "mean_acceptance_length", "thresholds"}`` (``thresholds``: the
    fields of :class:`~eagle3ops.speculate.watch.Thresholds`); ``bake_sample(host)``: the canary's figures since the
    previous call (:func:`eagle3ops.gate.metrics.interval_figures`' shape; None on the first call or no reading).
    """

    drain: Callable[[str], Any]
    undrain: Callable[[str], Any]
    switch: Callable[[str], Mapping[str, Any]]
    switch_back: Callable[[str, Any], Any]
    health: Callable[[str], Any]
    acceptance: Callable[[str], float | None]
    gate: Callable[[str], Mapping[str, Any]] = lambda host: {"verdict": "keep"}
    bake_sample: Callable[[str], Mapping[str, Any] | None] = lambda host: None


@dataclass
class _Run:
    """One driver's run: the plan, journal, steps, balancer and clock."""

    plan: RolloutPlan
    journal: GroupJournal
    fns: StepFns
    balancer: Balancer
    echo: Callable[[str], None]
    now: Callable[[], float]
    sleep: Callable[[float], None]
    poll_s: float

    def state(self) -> RolloutState:
        return replay(self.plan, self.journal.entries())

    def wait_room(self, host: str) -> dict[str, Any]:
        """Wait (bounded by ``out_wait_s``) until ``host`` may be drained with at most ``max_out`` hosts out
        (:func:`eagle3ops.group.drain.wait_for_capacity`).

        Raises:
            StepFailed: the balancer does not know a host of the group, or ``host`` is in maintenance.
            eagle3ops.group.drain.CapacityTimeout: still no room at the bound (nothing changed).
        """
        from eagle3ops.group.drain import wait_for_capacity

        states = self.balancer.states()
        unknown = [h for h in self.plan.hosts if h not in states]
        if unknown:
            raise StepFailed(f"the balancer reports no server for host(s) {unknown}: check the group's balancer "
                             f"settings (`groups.{self.plan.group}.balancer.servers` in the inventory)")
        if states[host].state == "maint":  # an operator's maintenance: undraining it later would end it
            raise StepFailed(f"{host}: in maintenance at the balancer; the rollout does not take a host out of "
                             f"maintenance: set it ready (or remove it from the group), then rerun")
        cap = wait_for_capacity(self.balancer, host, self.plan.max_out, timeout_s=self.plan.out_wait_s,
                                poll_s=self.poll_s, clock=self.now, sleep=self.sleep, echo=self.echo)
        return {"out_before": [h for h, _ in cap.out if h != host]}


def _check_acceptance(run: _Run, host: str, value: float | None, st: RolloutState) -> dict[str, Any]:
    """The rolled host's served acceptance against the reference (see :mod:`.rollout`)."""
    ref, tol = st.reference, run.plan.tolerance
    if ref is None:
        return {"mean_acceptance_length": value, "reference": None}
    if value is None:
        raise StepFailed(f"{host}: no draft round measured on the new release, while the reference speculates "
                         f"(mean acceptance length {ref:.3f}): is --speculative-config in its argv?")
    if abs(value - ref) > tol + 1e-9:
        raise StepFailed(f"{host}: served mean acceptance length {value:.3f} is not within {tol:g} of the "
                         f"reference's {ref:.3f}")
    return {"mean_acceptance_length": value, "reference": ref}


def _bake(run: _Run, step: Step, st: RolloutState, started: float) -> dict[str, Any]:
    """The canary on live traffic until ``bake_s`` after ``started`` (or a promote), judged by ``watch``'s rules.

    Raises:
        StepFailed: a breach lasted ``bake_sustained_s`` (the reason names the figure and its threshold).
        _Abort: an abort request.
    """
    gate = st.done.get(f"{step.host}:gate") or {}
    th = Thresholds(**gate["thresholds"]) if gate.get("thresholds") else Thresholds(None, "none", None, None, None)
    tracker, drafts, accepted, intervals = Tracker(run.plan.bake_sustained_s), 0.0, 0.0, 0
    deadline, t_prev, promoted = started + run.plan.bake_s, run.now(), False
    run.fns.bake_sample(step.host)  # the first reading: the intervals start here
    run.echo(f"{step.host}: baking on live traffic until {run.plan.bake_s:g} s after the start (acceptance floor "
             f"{th.acceptance_floor}, per-request output tokens/s floor {th.request_tokens_per_s_min})")
    while run.now() < deadline:
        cur = run.state()
        if cur.abort:
            raise _Abort("abort requested during the bake")
        if cur.promote:
            promoted = True
            run.echo(f"{step.host}: promoted: the bake ends early")
            break
        run.sleep(min(run.plan.bake_interval_s, max(0.0, deadline - run.now())))
        t = run.now()
        fig = run.fns.bake_sample(step.host)
        if not fig:
            continue
        checks = judge(dict(fig), th)
        sustained = tracker.update(t_prev, t, checks)
        run.journal.record(step.key, "interval", figures=dict(fig), checks=checks)
        intervals += 1
        if fig.get("drafts"):
            drafts += float(fig["drafts"])
            accepted += float(fig.get("accepted") or 0.0)
        t_prev = t
        if sustained:
            why = "; ".join(f"acceptance {fig.get('mean_acceptance_length')} < {th.acceptance_floor}" if c ==
                            "acceptance" else f"per-request output tokens/s {fig.get('request_output_tokens_per_s')}"
                            f" < {th.request_tokens_per_s_min}" for c in sustained)
            raise StepFailed(f"{step.host}: the bake breached watch's rules: {why}")
    mal = round(1 + accepted / drafts, 4) if drafts else gate.get("mean_acceptance_length")
    return {"mean_acceptance_length": mal, "intervals": intervals, "promoted": promoted,
            "from": "live traffic" if drafts else "the gate"}


def _do(run: _Run, step: Step, st: RolloutState) -> dict[str, Any]:
    """One step of the roll; returns its figures for the journal."""
    fns, h = run.fns, step.host
    if step.action == "drain":
        room = run.wait_room(h)
        return {**room, **dict(fns.drain(h) or {})}
    if step.action == "undrain":
        return dict(fns.undrain(h) or {})
    if step.action == "switch":
        return dict(fns.switch(h))
    if step.action == "gate":
        return dict(fns.gate(h))
    if step.action == "health":
        return dict(fns.health(h) or {})
    if step.action == "acceptance":
        return _check_acceptance(run, h, fns.acceptance(h), st)
    raise StepFailed(f"{step.key}: unknown action {step.action!r}")


def run_rollout(plan: RolloutPlan, journal: GroupJournal, fns: StepFns, balancer: Balancer, *,
                echo: Callable[[str], None] = print, now: Callable[[], float] = time.time,
                sleep: Callable[[float], None] = time.sleep, poll_s: float = 5.0) -> dict[str, Any]:
    """Carry out (or resume) ``plan``, journaled in ``journal`` (its rollout in use); the caller holds the lock.

    Returns ``{"outcome", "reason", "switched", "next"}``: ``outcome`` ``done`` (every host on the target),
    ``paused`` (``next``: the host a rerun starts with), ``refused`` (the gate did not keep the canary's release: the
    speculate job returned it; the canary is undrained), ``returned`` (a step failed or the bake breached: every
    switched host returned; ``reason`` says which) or ``aborted`` (an abort request: every switched host returned);
    a rollout journaled ``end`` earlier returns its outcome again with ``"earlier": True``.

    Raises:
        ReturnFailed: a return step failed (the hosts still switched are named; ``group abort`` resumes it).
        StepBusy: a step cannot start yet (nothing changed; a rerun tries it again).
    """
    run = _Run(plan, journal, fns, balancer, echo, now, sleep, poll_s)
    st = run.state()
    if st.ended:
        return {"outcome": st.ended, "reason": st.end_reason, "switched": st.switched, "next": None, "earlier": True}
    journal.record("rollout", "run")
    if st.returning or st.abort:
        return run_return(run, st.return_reason or "abort requested")
    gate = st.done.get(f"{plan.canary}:gate")
    if gate is not None and gate.get("verdict") != "keep":  # a driver killed right after a gate that did not keep
        return _refused(run, Step(f"{plan.canary}:gate", plan.canary or "", "gate"), gate)
    for host, steps in steps_by_host(plan):
        if all(s.key in st.done for s in steps):
            continue
        st = run.state()
        if st.abort:
            return run_return(run, "abort requested")
        if st.pause and not any(s.key in st.done for s in steps) and st.interrupted not in {s.key for s in steps}:
            journal.record("rollout", "paused", next=host)
            echo(f"paused before {host}; rerun the same `group rollout` to continue")
            return {"outcome": "paused", "reason": "pause requested", "switched": st.switched, "next": host}
        for s in steps:
            if s.key in st.done:
                continue
            st = run.state()
            if st.abort:
                return run_return(run, "abort requested")
            started = st.bake_started if (s.action == "bake" and st.interrupted == s.key and st.bake_started) \
                else now()
            echo(f"{s.key}")
            journal.record(s.key, "start", epoch=started)
            try:
                figs = _bake(run, s, st, started) if s.action == "bake" else _do(run, s, st)
            except StepBusy as exc:
                journal.record(s.key, "busy", error=str(exc))
                raise
            except _Abort as exc:
                journal.record(s.key, "failed", error=str(exc))
                return run_return(run, str(exc), aborted=True)
            except Exception as exc:  # noqa: BLE001 - any failure of a step returns the switched hosts
                journal.record(s.key, "failed", error=str(exc))
                echo(f"{s.key} failed: {exc}")
                return run_return(run, f"{s.key}: {exc}")
            journal.record(s.key, "done", **figs)
            if s.action == "gate" and figs.get("verdict") != "keep":
                return _refused(run, s, figs)
    st = run.state()
    journal.record("rollout", "end", outcome="done", reason=None)
    return {"outcome": "done", "reason": None, "switched": st.switched, "next": None}


def _refused(run: _Run, gate: Step, figs: Mapping[str, Any]) -> dict[str, Any]:
    """The gate did not keep the canary's release (the speculate job returned it): undrain the canary and end."""
    key = f"{gate.host}:undrain"
    run.journal.record(key, "start")
    run.fns.undrain(gate.host)
    run.journal.record(key, "done")
    reason = f"the gate on {gate.host}: {figs.get('verdict')} ({figs.get('reason')})"
    run.journal.record("rollout", "end", outcome="refused", reason=reason)
    return {"outcome": "refused", "reason": reason, "switched": [], "next": None}


def run_return(run: _Run, reason: str, *, aborted: bool = False) -> dict[str, Any]:
    """Return every switched host to its previous release, journaled; resumes a return a killed driver left.

    Raises:
        ReturnFailed: a return step failed (the journal keeps where the return stands).
    """
    st = run.state()
    if not st.returning:
        ret = return_steps(st.switched, st.out)
        run.journal.record("rollout", "return", reason=reason, aborted=aborted or st.abort,
                           steps=[s.key for s in ret], switched=list(st.switched), out=st.out)
        st = run.state()
    ret = return_steps(st.return_switched, st.return_out)
    previous = dict(st.previous)
    run.echo(f"returning {', '.join(st.return_switched) or 'no switched host'}: {st.return_reason}")
    for s in ret:
        if s.key in st.done:
            continue
        run.journal.record(s.key, "start")
        try:
            if s.action == "drain":
                figs = {**run.wait_room(s.host), **dict(run.fns.drain(s.host) or {})}
            elif s.action == "switch-back":
                figs = dict(run.fns.switch_back(s.host, previous.get(s.host)) or {})
            elif s.action == "health":
                figs = dict(run.fns.health(s.host) or {})
            else:
                figs = dict(run.fns.undrain(s.host) or {})
        except Exception as exc:  # noqa: BLE001 - named in ReturnFailed with the rerun
            run.journal.record(s.key, "failed", error=str(exc))
            left = run.state().switched
            raise ReturnFailed(f"returning {s.host} failed at {s.action}: {exc}; still on the new release: "
                               f"{', '.join(left) or 'none'}; `eagle3ops group abort {run.plan.group}` resumes the "
                               f"return (steps done are not repeated)") from exc
        run.journal.record(s.key, "done", **figs)
    outcome = "aborted" if st.aborted else "returned"
    run.journal.record("rollout", "end", outcome=outcome, reason=st.return_reason)
    return {"outcome": outcome, "reason": st.return_reason, "switched": run.state().switched, "next": None,
            "returned": list(st.return_switched)}
