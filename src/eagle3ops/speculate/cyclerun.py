"""Carrying out a cycle's plan (:mod:`eagle3ops.speculate.cycle`): its journal and lock on production, the steps in
order, and the cycle's own steps (the regenerated dataset to the work hosts, the head's served acceptance).

- :class:`CycleJournal`: ``<production state_dir>/cycles/<run>/``: ``journal.jsonl`` (one line per step event) under
  a lock directory (``mkdir`` is atomic) holding who drives the cycle; a driver that died leaves the lock, which a
  rerun from the same machine takes over once the recorded process is gone.
- :func:`run_cycle`: the steps in order, each journaled ``start`` then ``done`` (or ``failed``, naming a work host
  that does not answer, or ``ended``: the head was refused and nothing is left to do); a rerun skips the steps
  journaled ``done``.
- :func:`measure_served` / :func:`acceptance_verdict`: the served acceptance from two ``/metrics`` scrapes (vLLM's
  definition, through :mod:`eagle3ops.gate.metrics`) around the speed gate's own client, against the floor.
- :func:`copy_dataset`: production's regenerated dataset to the work hosts, its sha256 checked.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from eagle3ops import redact
from eagle3ops.commands import host as hc
from eagle3ops.speculate.cycle import CycleEnded, CycleError, CycleLocked, CyclePlan, CycleStep, StepFailed, lost_on

__all__ = ["CycleJournal", "acceptance_beside", "acceptance_verdict", "copy_dataset", "cycle_dir", "describe_holder",
           "finished_hosts", "journaled_dead", "measure_served", "run_cycle"]


def acceptance_verdict(before: str, after: str, floor: float) -> dict[str, Any]:
    """The served acceptance of a head from two ``/metrics`` bodies (Prometheus text of vLLM 0.16, before and after
    the gate's prompts were replayed) against ``floor`` (mean acceptance length, vLLM's ``1 + Δaccepted /
    Δdrafts``: :class:`eagle3ops.gate.metrics.SpecDelta`).

    Returns the delta's figures plus ``floor`` and ``passed`` (bool).

    Raises:
        CycleError: no draft round between the scrapes (the server did not speculate: nothing measured), or a
            counter went down (the server restarted between them).
    """
    from eagle3ops.gate.metrics import SpecDelta, parse

    try:
        delta = SpecDelta.between(parse(before), parse(after))
    except ValueError as exc:
        raise CycleError(f"served acceptance: {exc}; run the cycle again to measure afresh") from None
    mal = delta.mean_acceptance_length
    if mal is None:
        raise CycleError("served acceptance: no draft round between the two /metrics scrapes (is "
                         "--speculative-config in the server's argv?); nothing was measured")
    return {**delta.figures(), "floor": floor, "passed": mal >= floor}


def measure_served(base_url: str, model: str, prompts: Sequence[str | Mapping[str, Any]], floor: float, *,
                   where: str, max_tokens: int = 128, api_key: str | None = None, concurrency: int = 1
                   ) -> dict[str, Any]:
    """The served acceptance of a head on a work host: the prompts replayed once at ``concurrency``
    (:func:`eagle3ops.gate.replay.replay_level`, the speed gate's own client), ``/metrics`` scraped right before
    the first request (after the idle wait) and after the last, judged by :func:`acceptance_verdict`.

    Returns the verdict's figures (plus ``where``, the requests and failed ones) when at or above ``floor``.

    Raises:
        CycleEnded: below ``floor``: the cycle ends, production is never reached.
        CycleError: nothing measured (see :func:`acceptance_verdict`).
        eagle3ops.gate.replay.ReplayError: the server busy with other traffic, or every request failed.
    """
    import httpx

    from eagle3ops.gate.replay import replay_level
    from eagle3ops.serving_http import auth_headers

    headers = auth_headers(api_key)
    scrape = lambda: httpx.get(f"{base_url}/metrics", headers=headers, timeout=10).text  # noqa: E731
    before: list[str] = []
    level = replay_level(base_url, model, prompts, concurrency, max_tokens=max_tokens, api_key=api_key,
                         on_idle=lambda: before.append(scrape()))
    verdict = {**acceptance_verdict(before[0], scrape(), floor), "where": where, "requests": level.requests,
               "failed_requests": level.errors}
    if not verdict["passed"]:
        raise CycleEnded(f"served mean acceptance length {verdict['mean_acceptance_length']:.2f} on {where} is below "
                         f"the floor {floor:g}: the head is not shipped and production is not restarted", verdict)
    return verdict


def acceptance_beside(figures: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The head's mean acceptance length on the work host (the ``acceptance`` step's) beside production's (the
    speed gate's measurement of the kept release: the ``speculate`` step's ``mean_acceptance_length``), from a
    cycle's step figures (this run's or the journal's).

    Returns ``{"work_host", "production", "verdict", "line"}``: ``line`` (None until the acceptance was measured)
    says both, production's only after a keep (a head rolled back or not shipped has no production figure)."""
    acc, spec = figures.get("acceptance") or {}, figures.get("speculate") or {}
    work, verdict = acc.get("mean_acceptance_length"), spec.get("verdict")
    prod = spec.get("mean_acceptance_length") if verdict == "keep" else None
    line = None
    if isinstance(work, (int, float)):
        line = f"mean acceptance length: {work:.2f} on work host {acc.get('where', '?')}"
        if isinstance(prod, (int, float)):
            line += f", {prod:.2f} on production (kept; {prod - work:+.2f})"
        elif verdict:
            line += f"; production: speed gate verdict {verdict}, nothing kept to compare"
    return {"work_host": work, "production": prod, "verdict": verdict, "line": line}


def copy_dataset(src_r: Any, dst_rs: Sequence[Any], run: str) -> dict[str, Any]:
    """The regenerated dataset and its manifest from production's run dir (where ``regenerate`` uploaded them: the
    copy does not depend on the driver that regenerated) to each work host's, through this machine; the dataset's
    sha256 checked against the manifest's ``dataset_sha256`` before it is sent and on each work host after.

    Returns ``{"dataset_sha256", "bytes", "hosts"}``.

    Raises:
        StepFailed: production holds no regenerated dataset for ``run``, or one that differs from its manifest
            (rerun regenerate), or a work host's copy differs after the write (rerun the cycle).
    """
    import hashlib
    import tempfile

    from eagle3ops.commands import weights as wc
    from eagle3ops.speculate import reach
    from eagle3ops.speculate.regenerate import DATASET, MANIFEST
    from eagle3ops.transfer.weightsplan import parse_hashes

    src = reach.host_paths(src_r, run)
    data = src_r.run(hc.cat_if_exists(src["dataset"]), check=False).stdout or ""
    man_text = src_r.run(hc.cat_if_exists(src["manifest"]), check=False).stdout or ""
    try:
        want = json.loads(man_text)["dataset_sha256"]
    except (ValueError, KeyError, TypeError):
        raise StepFailed(f"{src_r.host.name}: no regenerated dataset manifest at {src['manifest']} (or one without "
                         f"dataset_sha256): the regenerate step did not finish; rerun the cycle", (src_r.host.name,))
    body = data.encode("utf-8")
    if hashlib.sha256(body).hexdigest() != want:
        raise StepFailed(f"{src_r.host.name}:{src['dataset']} differs from its manifest's dataset_sha256: rerun "
                         f"`eagle3ops regenerate {src_r.host.name} --run {run}` (answered conversations are kept)",
                         (src_r.host.name,))
    with tempfile.TemporaryDirectory(prefix="eagle3ops-cycle-") as d:
        Path(d, DATASET).write_bytes(body)
        Path(d, MANIFEST).write_text(man_text, encoding="utf-8")
        for r in dst_rs:
            dst = reach.write_dataset(r, run, Path(d))
            got = parse_hashes(r.run(wc.hash_files(dst["dir"], [DATASET]), check=False).stdout or "").get(DATASET)
            if got != want:
                raise StepFailed(f"{r.host.name}:{dst['dataset']}: sha256 {got} after the copy, not {want}; rerun the "
                                 f"cycle", (r.host.name,))
    return {"dataset_sha256": want, "bytes": len(body), "hosts": [r.host.name for r in dst_rs]}


def cycle_dir(state_dir: str, run: str) -> str:
    """``<state_dir>/cycles/<run>``: the cycle's journal, plan and lock on production."""
    return f"{state_dir}/cycles/{run}"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe_holder(held: Mapping[str, Any]) -> str:
    """The driver holding a journal's lock, as every message names it: ``user@machine (pid N) since T: `command```
    from ``held`` (``lock/holder.json`` as :meth:`CycleJournal.acquire` writes it; a missing field reads ``?``)."""
    return (f"{held.get('user', '?')}@{held.get('machine', '?')} (pid {held.get('pid', '?')}) since "
            f"{held.get('since', '?')}: `{held.get('command', '?')}`")


class CycleJournal:
    """The cycle's journal and lock in ``directory`` on production, through the executor ``r`` (anything with
    ``run(argv, check=, stdin=)``: the host's SSH executor; tests: this machine's).

    ``journal.jsonl``: ``{"t", "step", "event": "start"|"done"|"failed"|"ended", ...}`` per line, appended;
    ``lock/holder.json``: ``{"machine", "pid", "user", "since", "command"}``.
    """

    def __init__(self, r: Any, directory: str, secret_env: Sequence[str] = ()):
        self.r, self.dir, self.secret_env = r, directory, tuple(secret_env)
        self.journal, self.lock_dir = f"{directory}/journal.jsonl", f"{directory}/lock"
        self.holder = f"{directory}/lock/holder.json"

    def acquire(self, command: str, *, take_over: bool = False) -> str | None:
        """Take the cycle's lock (atomic ``mkdir``). A lock left by a driver of this machine whose process is gone,
        or any lock with ``take_over``, is taken over; returns a line saying so (None: the lock was free).

        Raises:
            CycleLocked: held by a live driver here, or by another machine (the message names holder and command,
                and ``--take-over`` once that driver is known dead).
        """
        self.r.run(hc.mkdir_p(self.dir))
        if self.r.run(hc.mkdir_atomic(self.lock_dir), check=False).ok:
            taken = None
        else:
            held = self.read_holder()
            mine = held.get("machine") == socket.gethostname() and isinstance(held.get("pid"), int)
            if not take_over and not (mine and not pid_alive(held["pid"])):
                raise self.held_error(held)
            taken = (f"took over {self.lock_name} from {describe_holder(held)}; "
                     + ("--take-over" if take_over else "that process is gone"))
        holder = {"machine": socket.gethostname(), "pid": os.getpid(), "user": getpass.getuser(), "since": _now(),
                  "command": redact.text(command, self.secret_env)}
        self.r.run(hc.write_file(self.holder), stdin=json.dumps(holder))
        return taken

    #: The lock as messages name it.
    lock_name = "the cycle's lock"
    #: What :meth:`acquire` raises when the lock is held (a subclass's lock raises its own).
    locked_error: type[Exception] = CycleLocked
    #: How to wait for the holder, as the refusal says it.
    wait_hint = "wait for it"

    def held_error(self, held: Mapping[str, Any]) -> Exception:
        """What :meth:`acquire` raises when a live driver (or another machine's) holds the lock ``held``: a
        :attr:`locked_error` naming the lock, its holder (:func:`describe_holder`), how to wait and ``--take-over``."""
        return self.locked_error(f"{self.lock_name} {self.lock_dir} is held by {describe_holder(held)}; "
                                 f"{self.wait_hint}, or when that driver is dead, rerun with --take-over")

    def read_holder(self) -> dict[str, Any]:
        """The lock's holder (``{}``: none recorded)."""
        out = self.r.run(hc.cat_if_exists(self.holder), check=False).stdout or ""
        try:
            return json.loads(out) if out.strip() else {}
        except ValueError:
            return {"raw": out}

    def release(self) -> None:
        """Give the lock back."""
        self.r.run(hc.rm_rf(self.lock_dir))

    def record(self, step: str, event: str, **fields: Any) -> None:
        """Append one event (its secrets masked: :func:`eagle3ops.redact.value`)."""
        entry = redact.value({"t": _now(), "step": step, "event": event, **fields}, self.secret_env)
        self.r.run(hc.append_file(self.journal), stdin=json.dumps(entry) + "\n")

    def entries(self) -> list[dict[str, Any]]:
        """Every event, in order (a last line cut by a crash is left out)."""
        out = self.r.run(hc.cat_if_exists(self.journal), check=False).stdout or ""
        rows = []
        for line in out.splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        return rows

    def finished(self) -> dict[str, dict[str, Any]]:
        """Step key -> its last ``done`` or ``ended`` event (a later ``start`` of that step voids it)."""
        out: dict[str, dict[str, Any]] = {}
        for e in self.entries():
            if e.get("event") in ("done", "ended"):
                out[e["step"]] = e
            elif e.get("event") == "start":
                out.pop(e.get("step"), None)
        return out


Runner = Callable[[CycleStep], Mapping[str, Any] | None]
#: Makes the plan again with these work hosts dead (the cycle's facts unchanged): how a step moves off a dead host.
Replan = Callable[[tuple[str, ...]], CyclePlan]


def finished_hosts(entries: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Step key -> the hosts of the run that finished it (its last ``start`` before its ``done``), from a journal's
    events; steps not finished are left out."""
    started: dict[str, list[str]] = {}
    out: dict[str, list[str]] = {}
    for e in entries:
        key = e.get("step")
        if e.get("event") == "start":
            started[key] = list(e.get("hosts") or [])
            out.pop(key, None)
        elif e.get("event") == "done":
            out[key] = started.get(key, [])
    return out


def journaled_dead(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The work hosts an earlier run of the cycle found dead and moved its work off (``dead`` events, in order)."""
    return list(dict.fromkeys(h for e in entries if e.get("event") == "dead" for h in e.get("hosts") or []))


class _StepError(Exception):
    def __init__(self, step: CycleStep, exc: Exception):
        super().__init__(str(exc))
        self.step, self.exc = step, exc


def run_cycle(plan: CyclePlan, journal: CycleJournal, runners: Mapping[str, Runner], *,
              alive: Callable[[str], bool] = lambda host: True, echo: Callable[[str], None] = print,
              replan: Replan | None = None) -> dict[str, Any]:
    """Carry out ``plan`` step by step, each journaled; the caller holds the journal's lock.

    A step journaled ``done`` by an earlier run is skipped (said so), unless its output sat on a host the plan
    names dead (:func:`eagle3ops.speculate.cycle.lost_on`: that step and every later one run again). A step
    journaled ``start`` without ``done`` (its driver was killed) runs again: every step's command resumes on its
    own (answered prompts, verified files, finished shards and stages are kept; a command the killed driver left
    running is adopted: :mod:`eagle3ops.speculate.cyclechild`). ``runners[step.kind](step)`` does a step and returns
    figures for the journal.

    A step that fails on a work host that does not answer (``alive(host)`` false) **moves**: with ``replan`` given,
    another live work host left and no finished output on the dead one, the plan is made again without it
    (``replan(dead)``), the host journaled ``dead`` (a rerun leaves it out too) and the cycle goes on; the loop ends
    since each move adds a dead host. Otherwise it **waits for the rerun** (raised, naming the host and both reruns).

    Returns ``{"outcome": "done"|"ended", "steps": {key: "done"|"skipped"|"ended"}, "figures": {key: the figures
    its runner returned, this run's or the journal's}, "moved": [{"step", "dead", "to"}...]}``; ``ended`` (a head
    below the acceptance floor) carries ``reason`` and ``production_restarts: 0`` — no later step runs.

    Raises:
        CycleError: a step failed and did not move; journaled ``failed`` with the hosts of the step that do not
            answer named as ``dead_hosts``; the message names them and the rerun.
    """
    moved: list[dict[str, Any]] = []
    while True:
        try:
            return {**_run_plan(plan, journal, runners, echo), "moved": moved}
        except _StepError as err:
            s, exc = err.step, err.exc
            dead = [h for h in dict.fromkeys((*s.hosts, *s.reads)) if not alive(h)]
            new = [h for h in dead if h != plan.production and h not in plan.dead]
            why = _why_not_moved(plan, journal, new, dead, replan)
            if why is None:
                assert replan is not None
                moved_plan = replan((*plan.dead, *new))
                live = [w for w in moved_plan.work if w not in moved_plan.dead]
                journal.record(s.key, "failed", error=str(exc), dead_hosts=dead, moved_to=live)
                journal.record("cycle", "dead", hosts=new, during=s.key)
                echo(f"{s.key}: work host(s) {', '.join(new)} did not answer: left out, the step moves to "
                     f"{', '.join(live)} (finished steps are not repeated)")
                moved.append({"step": s.key, "dead": new, "to": live})
                plan = moved_plan
                continue
            journal.record(s.key, "failed", error=str(exc), dead_hosts=dead)
            if dead:
                raise CycleError(f"step {s.key}: host(s) {', '.join(dead)} did not answer"
                                 + (" (production)" if plan.production in dead else " (work host)")
                                 + f": {why}; finished steps are not repeated. The step's error: {exc}") from exc
            raise CycleError(f"step {s.key} on {', '.join(s.hosts)} failed: {exc}; rerun the same command to "
                             f"resume (finished steps are not repeated)") from exc


def _why_not_moved(plan: CyclePlan, journal: CycleJournal, new: Sequence[str], dead: Sequence[str],
                   replan: Replan | None) -> str | None:
    """Why a step whose ``dead`` hosts (``new``: the work hosts among them not yet named dead) do not answer
    cannot move to another work host and waits for the rerun (the rerun to give); None: it moves."""
    if plan.production in dead:
        return "rerun once it answers again"
    if not new:
        return "rerun once it is back"
    flags = " ".join(f"--dead {h}" for h in new)
    left = [w for w in plan.work if w not in plan.dead and w not in new]
    if not left:
        return f"no other work host to move to: rerun once it is back, or name another one with --work"
    lost = lost_on(plan, finished_hosts(journal.entries()), new)
    if lost is not None:
        return (f"the finished step {lost[0]} left {lost[1]} there, so the step waits for the rerun: rerun as it is "
                f"once it is back (nothing is redone), or rerun with {flags} to redo {lost[0]} and what follows on "
                f"{', '.join(left)}")
    if replan is None:
        return (f"rerun with {flags} to move its work to the other work hosts, or rerun as it is once it is "
                f"back")
    return None


def _run_plan(plan: CyclePlan, journal: CycleJournal, runners: Mapping[str, Runner],
              echo: Callable[[str], None]) -> dict[str, Any]:
    """The steps of ``plan`` in order (see :func:`run_cycle`); a step's error raised as :class:`_StepError`."""
    done = journal.finished()
    lost = lost_on(plan, finished_hosts(journal.entries()), plan.dead)
    redo = {s.key for s in plan.steps[[s.key for s in plan.steps].index(lost[0]):]} if lost else set()
    steps: dict[str, str] = {}
    figs: dict[str, dict[str, Any]] = {}
    for s in plan.steps:
        prior = done.get(s.key)
        if prior and prior.get("event") == "ended" and s.key not in redo:
            echo(f"{s.key}: the cycle ended here in an earlier run ({prior.get('reason')}); nothing more to do")
            return {"outcome": "ended", "step": s.key, "reason": prior.get("reason"), "steps": steps,
                    "figures": {**figs, s.key: _figures(prior)}, "production_restarts": 0}
        if prior and s.key in redo:
            echo(f"{s.key}: done in an earlier run, but {lost[1]} of {lost[0]} sat on a host now named dead "
                 f"({', '.join(plan.dead)}): run again")
        elif prior:
            echo(f"{s.key}: done in an earlier run ({prior.get('t')}), skipped")
            steps[s.key], figs[s.key] = "skipped", _figures(prior)
            continue
        echo(f"{s.key} on {', '.join(s.hosts)}")
        journal.record(s.key, "start", hosts=list(s.hosts))
        try:
            figures = dict(runners[s.kind](s) or {})
        except CycleEnded as end:
            journal.record(s.key, "ended", reason=end.reason, **end.figures)
            steps[s.key] = "ended"
            return {"outcome": "ended", "step": s.key, "reason": end.reason, "steps": steps,
                    "figures": {**figs, s.key: end.figures}, "production_restarts": 0}
        except Exception as exc:
            raise _StepError(s, exc) from exc
        journal.record(s.key, "done", **figures)
        steps[s.key], figs[s.key] = "done", figures
    return {"outcome": "done", "steps": steps, "figures": figs}


def _figures(event: Mapping[str, Any]) -> dict[str, Any]:
    """A journal event's figures (without its time, step and event)."""
    return {k: v for k, v in event.items() if k not in ("t", "step", "event")}
