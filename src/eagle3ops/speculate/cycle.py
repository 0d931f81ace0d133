"""One cycle across roles (``eagle3ops cycle``): the heavy work on work hosts, production touched last and least.

Production answers the training prompts on its live serving (``regenerate``); the target's weights go to the work
hosts (``weights W --from PRODUCTION``: verified, resumable, skipped where present); the work hosts, which have
``serving: none``, extract (sharded over them) and train with no window anywhere; the head is served on a work
host with production's argv plus ``--speculative-config`` and its acceptance measured there (a head below the
floor ends the cycle: production is never restarted); only then does the head go to production
(``speculate P --head W:RUN``: fetched, verified by sha256, the speed gate keeps or rolls back) and the report is
written. Production's only restarts are the speed gate's own.

This module is the cycle's pure part and its journal:

- :func:`plan_cycle`: facts (recorded on the hosts: weights manifests, measured extract rates, production's recorded
  restarts) → :class:`CyclePlan`, a pure value: every step's hosts, bytes to move, expected seconds, the command it
  runs, and production's restarts and expected downtime on each path. ``--dry-run`` prints it (and ``--json``).
- :class:`CycleJournal`: ``<production state_dir>/cycles/<run>/``: ``journal.jsonl`` (one line per step event) under
  a lock directory (``mkdir`` is atomic) holding who drives the cycle; a driver that died leaves the lock, which a
  rerun from the same machine takes over once the recorded process is gone.
- :func:`run_cycle`: the steps in order, each journaled ``start`` then ``done`` (or ``failed``, naming a work host
  that does not answer, or ``ended``: the head was refused and nothing is left to do); a rerun skips the steps
  journaled ``done``.
- :func:`acceptance_verdict`: the served acceptance from two ``/metrics`` scrapes (vLLM's definition, through
  :mod:`eagle3ops.gate.metrics`) against the floor.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from eagle3ops import redact
from eagle3ops.commands import cycle as cyc
from eagle3ops.commands import host as hc
from eagle3ops.commands.quote import render
from eagle3ops.fleet.plan import FleetPlan
from eagle3ops.speculate.restarts import RestartPlan

__all__ = ["CycleEnded", "CycleError", "CycleFacts", "CycleJournal", "CycleLocked", "CycleOptions", "CyclePlan",
           "CycleStep", "StepFailed", "WorkFacts", "acceptance_verdict", "copy_dataset", "cycle_dir", "measure_served",
           "plan_cycle", "run_cycle"]

#: The dataset regenerate writes, as ``prepare.datasets`` names it (relative to the run directory).
REGENERATED = "regenerated/dataset.jsonl"


class CycleError(RuntimeError):
    """A cycle cannot go on; the message names the step, the host and what to do."""


class CycleLocked(CycleError):
    """Another driver holds the cycle's lock on production (the message names it and ``--take-over``)."""


class StepFailed(CycleError):
    """A step's command failed (``hosts``: the hosts it ran on)."""

    def __init__(self, message: str, hosts: Sequence[str] = ()):
        super().__init__(message)
        self.hosts = tuple(hosts)


class CycleEnded(Exception):
    """The cycle ends here by design, nothing to repair (a head below the acceptance floor): ``reason`` and the
    measured ``figures`` are journaled; production is never reached after it."""

    def __init__(self, reason: str, figures: Mapping[str, Any] | None = None):
        super().__init__(reason)
        self.reason, self.figures = reason, dict(figures or {})


@dataclass(frozen=True)
class WorkFacts:
    """What the plan needs of one work host: ``weights_send_bytes`` / ``weights_files`` / ``weights_estimate_s``
    (the copy plan of ``weights NAME --from PRODUCTION``: bytes and files still to send, seconds at the link rate;
    None: not known, e.g. the host was not read)."""

    name: str
    weights_send_bytes: int | None = None
    weights_files: int | None = None
    weights_estimate_s: float | None = None


@dataclass(frozen=True)
class CycleOptions:
    """The cycle's inputs as given on the command line (paths are the driver's)."""

    run: str
    inventory: Path
    pipeline: Path
    datasets: tuple[Path, ...]
    held_out: float | None = None
    limit: int | None = None
    link_mbit: float = 1000.0
    prompts_file: Path | None = None
    merged: Path | None = None

    @property
    def merged_path(self) -> Path:
        """Where the fleet extract's merged manifest is written (``--merged``)."""
        return self.merged or Path(f"fleet-{self.run}-extract-manifest.json")


@dataclass(frozen=True)
class CycleFacts:
    """What was read from the hosts (reads only) for :func:`plan_cycle`.

    ``restarts``: production's speculate job restarts from its recorded windows
    (:func:`eagle3ops.speculate.ship.plan_restarts`); ``acceptance_floor``: production's ``serving.acceptance_floor``
    (mean acceptance length); ``extract``: the fleet plan of the work hosts (None: it could not be made,
    ``extract_note`` says why); ``dead``: work hosts named dead (left out of every step, their shard moved).
    """

    production: str
    work: tuple[WorkFacts, ...]
    restarts: RestartPlan
    acceptance_floor: float
    extract: FleetPlan | None = None
    extract_note: str | None = None
    dead: tuple[str, ...] = ()
    health_timeout_s: float = 600.0


@dataclass(frozen=True)
class CycleStep:
    """One step: ``key`` (journal key: unique in the plan), ``kind`` (which runner does it), ``hosts`` (where it
    runs), ``argv`` (the existing command it runs; None: the cycle's own step), ``send_bytes`` (bytes it moves
    between hosts; None: not known before an earlier step), ``expected_s`` (None: nothing recorded to estimate it
    from), ``restarts`` (production's serving restarts: ``(if kept, if rolled back)``) and ``downtime_s`` (their
    expected seconds, from production's recorded restarts; None: none recorded), ``note``."""

    key: str
    kind: str
    hosts: tuple[str, ...]
    argv: tuple[str, ...] | None = None
    send_bytes: int | None = None
    expected_s: float | None = None
    restarts: tuple[int, int] = (0, 0)
    downtime_s: tuple[float | None, float | None] = (0.0, 0.0)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the ``--dry-run --json`` shape)."""
        return {"key": self.key, "kind": self.kind, "hosts": list(self.hosts),
                "command": render(self.argv) if self.argv else None, "send_bytes": self.send_bytes,
                "expected_s": None if self.expected_s is None else round(self.expected_s, 1),
                "production_restarts_keep": self.restarts[0], "production_restarts_rollback": self.restarts[1],
                "production_downtime_keep_s": self.downtime_s[0], "production_downtime_rollback_s": self.downtime_s[1],
                "note": self.note}


@dataclass(frozen=True)
class CyclePlan:
    """The whole cycle (pure value): the steps in order and production's restarts and expected downtime on each
    path (kept, rolled back, and a head refused on the work host: none)."""

    production: str
    work: tuple[str, ...]
    run: str
    steps: tuple[CycleStep, ...]
    restarts: RestartPlan
    acceptance_floor: float
    dead: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def step(self, key: str) -> CycleStep:
        """The step named ``key``. Raises: KeyError."""
        return next(s for s in self.steps if s.key == key)

    @property
    def train_host(self) -> str:
        """The work host that trains and serves the head for its acceptance."""
        return self.step("train").hosts[0]

    def production_figures(self) -> dict[str, Any]:
        """Production's restarts and expected downtime per path (seconds; None: no restart recorded there)."""
        rp = self.restarts
        return {"restarts_keep": rp.keep, "restarts_rollback": rp.rollback, "restarts_below_floor": 0,
                "expected_downtime_keep_s": rp.downtime_s(rp.keep),
                "expected_downtime_rollback_s": rp.downtime_s(rp.rollback), "expected_downtime_below_floor_s": 0.0,
                "per_restart_s": rp.per_restart_s, "recorded_restarts": rp.recorded, "restart_bound_s": rp.bound_s}

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``--dry-run --json``; also ``plan.json`` beside the journal)."""
        known = [s.expected_s for s in self.steps if s.expected_s is not None]
        return {"production": self.production, "work": list(self.work), "dead": list(self.dead), "run": self.run,
                "acceptance_floor": self.acceptance_floor, "steps": [s.as_dict() for s in self.steps],
                "production_serving": self.production_figures(),
                "expected_s_known": round(sum(known), 1),
                "steps_without_estimate": [s.key for s in self.steps if s.expected_s is None],
                "notes": list(self.notes)}

    def lines(self) -> list[str]:
        """What ``--dry-run`` prints: one line per step, then production's restarts."""
        out = [f"cycle of run {self.run}: production {self.production}, work host(s) {', '.join(self.work)}"
               + (f" (dead, left out: {', '.join(self.dead)})" if self.dead else "")]
        for i, s in enumerate(self.steps, 1):
            size = "" if s.send_bytes is None else f", {_size(s.send_bytes)} to move"
            took = "no estimate" if s.expected_s is None else f"~{s.expected_s:.0f} s"
            down = f", production restarts {s.restarts[0]} (kept) / {s.restarts[1]} (rolled back)" \
                + ("" if s.downtime_s[0] is None else f", ~{s.downtime_s[0]:.0f} s / ~{s.downtime_s[1]:.0f} s down") \
                if any(s.restarts) else ", production not restarted"
            out.append(f"{i:2d}. {s.key} on {', '.join(s.hosts)}: {took}{size}{down}"
                       + (f"; {s.note}" if s.note else ""))
            if s.argv:
                out.append(f"      $ {render(s.argv)}")
        out += ["production: " + line for line in self.restarts.lines()]
        out.append(f"production: a head below the acceptance floor ({self.acceptance_floor:g}) on "
                   f"{self.train_host} ends the cycle with no restart of production")
        out += [f"note: {n}" for n in self.notes]
        return out


def _size(n: int) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= f:
            return f"{n / f:.1f} {unit}"
    return f"{n} B"


def _extract_seconds(plan: FleetPlan | None) -> float | None:
    """The fleet extract's expected seconds: waves run one after another, the windows of a wave at once (None: a
    window of an unmeasured host)."""
    if plan is None or any(w.stage_s is None for w in plan.windows):
        return None
    return sum(max(w.stage_s for w in wave) for wave in plan.waves() if wave)


def plan_cycle(facts: CycleFacts, opts: CycleOptions) -> CyclePlan:
    """The cycle's plan from the hosts' facts (pure).

    Steps, in order: ``regenerate`` (production, live) → ``dataset`` (the regenerated dataset to each live work
    host) → ``weights:W`` per live work host → ``extract`` (all work hosts, sharded; dead ones named) → ``train``
    (the first live work host; with several, after the hidden states are copied there) → ``acceptance`` (the head
    served on the train host; production untouched) → ``speculate`` (head to production, verified, then the speed
    gate: the only step that restarts production) → ``report``.

    Raises:
        CycleError: no live work host, production named as a work host, or a dead host that is not a work host.
    """
    names = [w.name for w in facts.work]
    if facts.production in names:
        raise CycleError(f"{facts.production} is production and also named with --work: a work host must be another "
                         f"inventory host (with `serving: none`), so production never stops for the stages")
    unknown = sorted(set(facts.dead) - set(names))
    if unknown:
        raise CycleError(f"--dead {', '.join(unknown)}: not among the work hosts ({', '.join(names)})")
    live = [w for w in facts.work if w.name not in facts.dead]
    if not live:
        raise CycleError("every work host is named dead: name a live one with --work")
    prod, run, inv = facts.production, opts.run, opts.inventory
    train_host = live[0].name
    several = len(names) > 1
    steps = [
        CycleStep("regenerate", "regenerate", (prod,),
                  tuple(cyc.regenerate(prod, run, inv, opts.datasets, held_out=opts.held_out, limit=opts.limit,
                                      out=_regen_out(prod, run))),
                  note="answers on production's live serving (resumable)"),
        CycleStep("dataset", "dataset", tuple(w.name for w in live),
                  note=f"{REGENERATED} and its manifest to each work host's run dir"),
    ]
    for w in live:
        present = w.weights_send_bytes == 0
        steps.append(CycleStep(f"weights:{w.name}", "weights", (w.name,),
                               tuple(cyc.weights(w.name, prod, inv, opts.link_mbit)),
                               send_bytes=w.weights_send_bytes, expected_s=0.0 if present else w.weights_estimate_s,
                               note="present (every file's sha256 matches production's): skipped" if present else
                               f"{w.weights_files} file(s) from {prod}, verified by sha256"
                               if w.weights_files is not None else "from production, verified by sha256"))
    ex = facts.extract
    ex_note = (f"{ex.samples} samples, {'' if ex.tokens_exact else 'at most '}{ex.tokens} tokens over "
               f"{len(ex.shards)} shard(s); no window (serving: none)" if ex else (facts.extract_note or ""))
    steps += [
        CycleStep("extract", "extract", tuple(names),
                  tuple(cyc.extract(names, run, opts.pipeline, inv, opts.merged_path, dead=facts.dead)),
                  expected_s=_extract_seconds(ex), note=ex_note),
        CycleStep("train", "train", (train_host,),
                  tuple(cyc.train(train_host, run, opts.pipeline, inv, opts.merged_path if several else None)),
                  note="vocab + train; hidden states of other work hosts copied there first" if several else
                  "vocab + train; no window (serving: none)"),
        CycleStep("acceptance", "acceptance", (train_host,),
                  note=f"the head served on {train_host} with production's argv + --speculative-config (same image "
                       f"id); mean acceptance length from /metrics deltas against the floor "
                       f"{facts.acceptance_floor:g}; its start bounded by {facts.health_timeout_s:.0f} s"),
        CycleStep("speculate", "speculate", (prod, train_host),
                  tuple(cyc.speculate(prod, run, train_host, inv, opts.prompts_file)),
                  restarts=(facts.restarts.keep, facts.restarts.rollback),
                  downtime_s=(facts.restarts.downtime_s(facts.restarts.keep),
                              facts.restarts.downtime_s(facts.restarts.rollback)),
                  note="head fetched from the work host and verified by sha256, then the speed gate (its passes "
                       "are not estimated)"),
        CycleStep("report", "report", (prod,), tuple(cyc.report(prod, run, inv)), note="reads only"),
    ]
    notes = []
    if ex is not None:
        notes += list(ex.notes)
    return CyclePlan(prod, tuple(names), run, tuple(steps), facts.restarts, facts.acceptance_floor,
                     tuple(facts.dead), tuple(notes))


def _regen_out(prod: str, run: str) -> Path:
    """The local folder regenerate writes (its own default: ``regenerated/<host>-<run>/``)."""
    return Path("regenerated") / f"{prod}-{run}"


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

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
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
            dst = reach.upload(r, run, Path(d))
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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
            if not take_over and not (mine and not _pid_alive(held["pid"])):
                raise CycleLocked(f"the cycle of {self.dir} is driven by {held.get('user', '?')}@"
                                  f"{held.get('machine', '?')} (pid {held.get('pid', '?')}) since "
                                  f"{held.get('since', '?')}: `{held.get('command', '?')}`; wait for it, or when "
                                  f"that driver is dead, rerun with --take-over")
            taken = (f"took over the cycle's lock from {held.get('user', '?')}@{held.get('machine', '?')} pid "
                     f"{held.get('pid', '?')} (since {held.get('since', '?')}): "
                     + ("--take-over" if take_over else "that process is gone"))
        holder = {"machine": socket.gethostname(), "pid": os.getpid(), "user": getpass.getuser(), "since": _now(),
                  "command": redact.text(command, self.secret_env)}
        self.r.run(hc.write_file(self.holder), stdin=json.dumps(holder))
        return taken

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


def run_cycle(plan: CyclePlan, journal: CycleJournal, runners: Mapping[str, Runner], *,
              alive: Callable[[str], bool] = lambda host: True, echo: Callable[[str], None] = print
              ) -> dict[str, Any]:
    """Carry out ``plan`` step by step, each journaled; the caller holds the journal's lock.

    A step journaled ``done`` by an earlier run is skipped (said so); a step journaled ``start`` without ``done``
    (its driver was killed) runs again: every step's command resumes on its own (answered prompts, verified files,
    finished shards and stages are kept). ``runners[step.kind](step)`` does a step and returns figures for the
    journal.

    Returns ``{"outcome": "done"|"ended", "steps": {key: "done"|"skipped"|"ended"}, ...}``; ``ended`` (a head below
    the acceptance floor) carries ``reason`` and ``production_restarts: 0`` — no later step runs.

    Raises:
        CycleError: a step failed; journaled ``failed`` with the hosts of the step that do not answer
            (``alive(host)`` false) named as ``dead_hosts``; the message names them and the rerun.
    """
    done = journal.finished()
    steps: dict[str, str] = {}
    for s in plan.steps:
        prior = done.get(s.key)
        if prior and prior.get("event") == "ended":
            echo(f"{s.key}: the cycle ended here in an earlier run ({prior.get('reason')}); nothing more to do")
            return {"outcome": "ended", "step": s.key, "reason": prior.get("reason"), "steps": steps,
                    "production_restarts": 0}
        if prior:
            echo(f"{s.key}: done in an earlier run ({prior.get('t')}), skipped")
            steps[s.key] = "skipped"
            continue
        echo(f"{s.key} on {', '.join(s.hosts)}")
        journal.record(s.key, "start", hosts=list(s.hosts))
        try:
            figures = dict(runners[s.kind](s) or {})
        except CycleEnded as end:
            journal.record(s.key, "ended", reason=end.reason, **end.figures)
            steps[s.key] = "ended"
            return {"outcome": "ended", "step": s.key, "reason": end.reason, "figures": end.figures,
                    "steps": steps, "production_restarts": 0}
        except Exception as exc:
            dead = [h for h in s.hosts if not alive(h)]
            journal.record(s.key, "failed", error=str(exc), dead_hosts=dead)
            if dead:
                work_dead = [h for h in dead if h != plan.production]
                fix = (f"rerun with --dead {' --dead '.join(work_dead)} to move its work to the other work hosts, "
                       f"or rerun as it is once it is back" if work_dead else "rerun once it answers again")
                raise CycleError(f"step {s.key}: host(s) {', '.join(dead)} did not answer"
                                 + (" (production)" if plan.production in dead else " (work host)")
                                 + f": {fix}; finished steps are not repeated. The step's error: {exc}") from exc
            raise CycleError(f"step {s.key} on {', '.join(s.hosts)} failed: {exc}; rerun the same command to "
                             f"resume (finished steps are not repeated)") from exc
        journal.record(s.key, "done", **figures)
        steps[s.key] = "done"
    return {"outcome": "done", "steps": steps}
