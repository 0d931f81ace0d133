"""One cycle across roles (``eagle3ops cycle``): the heavy work on work hosts, production touched last and least.

Production answers the training prompts on its live serving (``regenerate``); the target's weights go to the work
hosts (``weights W --from PRODUCTION``: verified, resumable, skipped where present); the work hosts, which have
``serving: none``, extract (sharded over them) and train with no window anywhere; the head is served on a work
host with production's argv plus ``--speculative-config`` and its acceptance measured there (a head below the
floor ends the cycle: production is never restarted); only then does the head go to production
(``speculate P --head W:RUN``: fetched, verified by sha256, the speed gate keeps or rolls back) and the report is
written. Production's only restarts are the speed gate's own.

This module is the cycle's pure part: :func:`plan_cycle`: facts (recorded on the hosts: weights manifests,
measured extract rates, production's recorded restarts and regenerate rates, the train host's step time) →
:class:`CyclePlan`, a pure value: every step's hosts, bytes to move, expected seconds, the command it runs, and
production's restarts and expected downtime on each path. ``--dry-run`` prints it (and ``--json``). Carrying it out
(the journal, its lock, the steps, the served acceptance) is :mod:`eagle3ops.speculate.cyclerun`.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from eagle3ops.commands import cycle as cyc
from eagle3ops.commands.quote import render
from eagle3ops.fleet.plan import FleetPlan
from eagle3ops.speculate.restarts import NEWEST, RestartPlan

__all__ = ["CycleEnded", "CycleError", "CycleFacts", "CycleLocked", "CycleOptions", "CyclePlan", "CycleStep",
           "StepFailed", "WorkFacts", "hidden_move", "lost_on", "plan_cycle", "regen_out", "regenerate_estimate", "speculate_parts",
           "step_durations", "train_estimate"]

#: What the plan says of a step it has no figure for.
NO_FIGURE = "no recorded figure"

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
    truncated: str = "error"

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
    ``extract_note`` says why); ``dead``: work hosts named dead (left out of every step, their shard moved);
    ``regenerate_todo``: conversations regenerate will send (its own plan: answered ones in the resume log left out);
    ``regenerate_recorded``: production's regenerate manifests (:func:`regenerate_estimate`); ``train_steps``: the
    pipeline's ``train.steps``; ``train_recorded``: the train host's newest train figures
    (:func:`eagle3ops.fleet.gather.recorded_train`); ``cycles_recorded``: step kind -> seconds each earlier cycle's
    step took on this production host (:func:`step_durations` of its journals); ``gate_recorded``: ``wall_s`` of
    production's recorded ``speculate`` windows (the gate), oldest first; ``head_bytes``: the largest trained head
    on the train host (``du -sb``; None: none there); ``link_mbit``: the link rate the transfers assume;
    ``hidden_bytes_per_token``: disk bytes of one token's hidden states, from the target's ``config.json`` on
    production and ``extract.hidden_dtype`` (:func:`eagle3ops.window.preflight.hidden_state_bytes`; None: unread);
    ``control``: production's speculate job measures a control release
    (:func:`eagle3ops.speculate.ship.needs_control`; ``restarts`` counted with it); ``gate_traffic``:
    production's ``serving.gate_traffic``; ``drain``: production has a ``serving.drain_hook``.
    """

    production: str
    work: tuple[WorkFacts, ...]
    restarts: RestartPlan
    acceptance_floor: float
    extract: FleetPlan | None = None
    extract_note: str | None = None
    dead: tuple[str, ...] = ()
    health_timeout_s: float = 600.0
    regenerate_todo: int | None = None
    regenerate_recorded: tuple[dict[str, Any], ...] = ()
    train_steps: int | None = None
    train_recorded: dict[str, Any] | None = None
    cycles_recorded: Mapping[str, Sequence[float]] = field(default_factory=dict)
    gate_recorded: tuple[float, ...] = ()
    head_bytes: int | None = None
    link_mbit: float = 1000.0
    hidden_bytes_per_token: int | None = None
    control: bool = False
    gate_traffic: str = "idle"
    drain: bool = False


@dataclass(frozen=True)
class CycleStep:
    """One step: ``key`` (journal key: unique in the plan), ``kind`` (which runner does it), ``hosts`` (where it
    runs), ``argv`` (the existing command it runs; None: the cycle's own step), ``send_bytes`` (bytes it moves
    between hosts; None: not known before an earlier step), ``expected_s`` (None: nothing recorded to estimate it
    from), ``restarts`` (production's serving restarts: ``(if kept, if rolled back)``) and ``downtime_s`` (their
    expected seconds, from production's recorded restarts; None: none recorded), ``note``, ``reads`` (other hosts
    the step reads from: a step that fails is checked against them too, to name a dead one)."""

    key: str
    kind: str
    hosts: tuple[str, ...]
    argv: tuple[str, ...] | None = None
    send_bytes: int | None = None
    expected_s: float | None = None
    restarts: tuple[int, int] = (0, 0)
    downtime_s: tuple[float | None, float | None] = (0.0, 0.0)
    note: str = ""
    reads: tuple[str, ...] = ()
    parts: tuple[tuple[str, float | None, str], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the ``--dry-run --json`` shape)."""
        return {"key": self.key, "kind": self.kind, "hosts": list(self.hosts),
                "command": render(self.argv) if self.argv else None, "send_bytes": self.send_bytes,
                "expected_s": None if self.expected_s is None else round(self.expected_s, 1),
                "production_restarts_keep": self.restarts[0], "production_restarts_rollback": self.restarts[1],
                "production_downtime_keep_s": self.downtime_s[0], "production_downtime_rollback_s": self.downtime_s[1],
                "reads_from": list(self.reads), "note": self.note,
                "parts": [{"part": p, "expected_s": None if t is None else round(t, 1), "note": n}
                          for p, t, n in self.parts]}


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
    gate_traffic: str = "idle"
    drain: bool = False

    def step(self, key: str) -> CycleStep:
        """The step named ``key``. Raises: KeyError."""
        return next(s for s in self.steps if s.key == key)

    @property
    def train_host(self) -> str:
        """The work host that trains and serves the head for its acceptance."""
        return self.step("train").hosts[0]

    def production_figures(self) -> dict[str, Any]:
        """Production's restarts and expected downtime per path (seconds; None: no restart recorded there), and
        how long its clients get no answer (:meth:`clients_held_off`)."""
        rp = self.restarts
        held = self.clients_held_off()
        return {"restarts_keep": rp.keep, "restarts_rollback": rp.rollback, "restarts_below_floor": 0,
                "expected_downtime_keep_s": rp.downtime_s(rp.keep),
                "expected_downtime_rollback_s": rp.downtime_s(rp.rollback), "expected_downtime_below_floor_s": 0.0,
                "per_restart_s": rp.per_restart_s, "recorded_restarts": rp.recorded, "restart_bound_s": rp.bound_s,
                "gate_traffic": self.gate_traffic, "clients_held_off_keep_s": held[0],
                "clients_held_off_rollback_s": held[1], "clients_held_off_below_floor_s": 0.0,
                "clients_held_off_note": held[2]}

    def clients_held_off(self) -> tuple[float | None, float | None, str]:
        """Seconds production's clients (one backend) get no answer in the speculate step, ``(kept, rolled back,
        why)``; None: no figure recorded. ``serving.gate_traffic: live``: only the restarts (the gate measures
        beside them); a ``drain_hook``: the whole gate (the median of production's recorded speculate windows,
        restarts included), whatever the path; neither: the restarts, but the gate sees their requests and
        decides nothing (undecided: rolled back)."""
        rp = self.restarts
        down = (rp.downtime_s(rp.keep), rp.downtime_s(rp.rollback))
        if self.gate_traffic == "live":
            return (*down, "serving.gate_traffic: live: clients stay on production during the gate except for its "
                           "restarts")
        if self.drain:
            gate = next((t for s in self.steps if s.key == "speculate" for p, t, _ in s.parts if p == "the gate"),
                        None)
            return (gate, gate, "serving.drain_hook takes clients off production for the whole gate (its median "
                                "recorded wall time, restarts included)")
        return (*down, "no drain_hook and serving.gate_traffic: idle: clients stay on production, and a gate that "
                       "sees their requests is undecided (rolled back); set serving.gate_traffic: live")

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
            took = NO_FIGURE if s.expected_s is None else f"~{s.expected_s:.0f} s"
            down = f", production restarts {s.restarts[0]} (kept) / {s.restarts[1]} (rolled back)" \
                + ("" if s.downtime_s[0] is None else f", ~{s.downtime_s[0]:.0f} s / ~{s.downtime_s[1]:.0f} s down") \
                if any(s.restarts) else ", production not restarted"
            bare = lambda n: n.replace(f"{NO_FIGURE} (", "(")  # noqa: E731 - said once, before it
            out.append(f"{i:2d}. {s.key} on {', '.join(s.hosts)}: {took}{size}{down}"
                       + (f"; {bare(s.note) if s.expected_s is None else s.note}" if s.note else ""))
            out += [f"      {p}: {NO_FIGURE if t is None else f'~{t:.0f} s'}; {bare(n)}" for p, t, n in s.parts]
            if s.argv:
                out.append(f"      $ {render(s.argv)}")
        out += ["production: " + line for line in self.restarts.lines()]
        held = self.clients_held_off()
        if held[0] is not None and held[1] is not None:
            out.append(f"production: clients get no answer for ~{held[0]:.0f} s (kept) / ~{held[1]:.0f} s (rolled "
                       f"back); {held[2]}")
        else:
            out.append(f"production: clients' time without an answer: {NO_FIGURE}; {held[2]}")
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
    gate: the only step that restarts production) → ``report``. Each step's expected seconds come from what the
    hosts recorded, or its note says "no recorded figure".

    Raises:
        CycleError: no live work host, production named as a work host, or a dead host that is not a work host.
    """
    live = _live_work_hosts(facts)
    ex_step, ex = _extract_step(facts, opts, live)
    steps = [*_data_steps(facts, opts, live), ex_step, *_head_steps(facts, opts, live, ex)]
    return CyclePlan(facts.production, tuple(w.name for w in facts.work), opts.run, tuple(steps), facts.restarts,
                     facts.acceptance_floor, tuple(facts.dead), tuple(ex.notes) if ex is not None else (),
                     facts.gate_traffic, facts.drain)


def _live_work_hosts(facts: CycleFacts) -> list[WorkFacts]:
    """The work hosts not named dead, after the roles are checked (see :func:`plan_cycle`'s errors)."""
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
    return live


def _data_steps(facts: CycleFacts, opts: CycleOptions, live: list[WorkFacts]) -> list[CycleStep]:
    """``regenerate``, ``dataset`` and ``weights:W`` per live work host."""
    prod, run, inv = facts.production, opts.run, opts.inventory
    regen_s, regen_note = regenerate_estimate(facts.regenerate_todo, facts.regenerate_recorded)
    ds_s, ds_note = recorded_step("dataset", facts.cycles_recorded)
    steps = [
        CycleStep("regenerate", "regenerate", (prod,),
                  tuple(cyc.regenerate(prod, run, inv, opts.datasets, held_out=opts.held_out, limit=opts.limit,
                                      out=regen_out(prod, run), truncated=opts.truncated)),
                  expected_s=regen_s, note=f"on production's live serving (resumable): {regen_note}"),
        CycleStep("dataset", "dataset", tuple(w.name for w in live), expected_s=ds_s,
                  note=f"{REGENERATED} and its manifest to each work host's run dir; {ds_note}"),
    ]
    for w in live:
        present = w.weights_send_bytes == 0
        steps.append(CycleStep(f"weights:{w.name}", "weights", (w.name,),
                               tuple(cyc.weights(w.name, prod, inv, opts.link_mbit)),
                               send_bytes=w.weights_send_bytes, expected_s=0.0 if present else w.weights_estimate_s,
                               note="present (every file's sha256 matches production's): skipped" if present else
                               f"{w.weights_files} file(s) from {prod}, verified by sha256"
                               if w.weights_files is not None else f"from production, verified by sha256; "
                                                                   f"{NO_FIGURE} (the host was not read)"))
    return steps


def _extract_step(facts: CycleFacts, opts: CycleOptions, live: list[WorkFacts]) -> tuple[CycleStep, FleetPlan | None]:
    """``extract`` over every work host (dead ones named) and the fleet plan it was timed by (None: none holds)."""
    ex, note = facts.extract, facts.extract_note or ""
    gone = sorted({w.host for w in ex.windows} & set(facts.dead)) if ex is not None else []
    if gone:  # made before a host was found dead (a step moved off it): its shards and seconds no longer hold
        ex, note = None, (f"the extract plan was made with {', '.join(gone)} live; its shards move to the live work "
                          f"hosts")
    if ex is not None:
        note = (f"{ex.samples} samples, {'' if ex.tokens_exact else 'at most '}{ex.tokens} tokens over "
                f"{len(ex.shards)} shard(s); no window (serving: none)")
    ex_s = _extract_seconds(ex)
    if ex_s is None:
        note = "; ".join(n for n in (note, f"{NO_FIGURE} (a work host without a measured extract rate)") if n)
    names = [w.name for w in facts.work]
    argv = cyc.extract(names, opts.run, opts.pipeline, opts.inventory, opts.merged_path, dead=facts.dead)
    return CycleStep("extract", "extract", tuple(w.name for w in live), tuple(argv), expected_s=ex_s, note=note), ex


def _head_steps(facts: CycleFacts, opts: CycleOptions, live: list[WorkFacts], ex: FleetPlan | None
                ) -> list[CycleStep]:
    """``train`` (the first live work host; with several, the hidden states of the others moved there first),
    ``acceptance`` there, ``speculate`` (production's only restarts) and ``report``."""
    prod, run, inv = facts.production, opts.run, opts.inventory
    train_host, several = live[0].name, len(facts.work) > 1
    train_s, train_note = train_estimate(facts.train_steps, facts.train_recorded)
    train_parts: tuple[tuple[str, float | None, str], ...] = ()
    if several:
        train_parts = (hidden_move(ex, train_host, facts.hidden_bytes_per_token, facts.link_mbit),
                       ("vocab + train", train_s, train_note))
        train_s = None if any(t is None for _, t, _ in train_parts) else sum(t or 0.0 for _, t, _ in train_parts)
    acc_s, acc_note = recorded_step("acceptance", facts.cycles_recorded)
    rep_s, rep_note = recorded_step("report", facts.cycles_recorded)
    if acc_s is None and facts.restarts.per_restart_s is not None:
        acc_note += (f"; its server's start there is about one of production's restarts (~"
                     f"{facts.restarts.per_restart_s:.0f} s, assumed: the same target and GPUs), the replay of the "
                     f"gate's prompts: {NO_FIGURE}")
    parts = speculate_parts(facts.head_bytes, facts.link_mbit, facts.gate_recorded)
    spec_s = None if any(t is None for _, t, _ in parts) else sum(t for _, t, _ in parts if t is not None)
    rp = facts.restarts
    return [
        CycleStep("train", "train", (train_host,),
                  tuple(cyc.train(train_host, run, opts.pipeline, inv, opts.merged_path if several else None)),
                  expected_s=train_s, reads=tuple(w.name for w in live[1:]), parts=train_parts,
                  note="hidden states of the other work hosts copied there first, then vocab + train"
                  if several else f"vocab + train; no window (serving: none); {train_note}"),
        CycleStep("acceptance", "acceptance", (train_host,), reads=(prod,), expected_s=acc_s,
                  note=f"the head served on {train_host} with production's argv + --speculative-config (same image "
                       f"id); mean acceptance length from /metrics deltas against the floor "
                       f"{facts.acceptance_floor:g}; its start bounded by {facts.health_timeout_s:.0f} s; {acc_note}"),
        CycleStep("speculate", "speculate", (prod, train_host),
                  tuple(cyc.speculate(prod, run, train_host, inv, opts.prompts_file, control=facts.control)),
                  restarts=(rp.keep, rp.rollback), downtime_s=(rp.downtime_s(rp.keep), rp.downtime_s(rp.rollback)),
                  expected_s=spec_s, parts=parts,
                  note="head fetched from the work host and verified by sha256, then the speed gate"),
        CycleStep("report", "report", (prod,), tuple(cyc.report(prod, run, inv)), expected_s=rep_s,
                  note=f"reads only; {rep_note}"),
    ]


#: Step kinds whose output stays on their work hosts: the hidden states of ``extract`` (each host's shards) and the
#: head of ``train`` (on the train host), until ``speculate`` has fetched the head to production.
HOLDS_OUTPUT = {"extract": "hidden states", "train": "the trained head"}


def lost_on(plan: CyclePlan, finished: Mapping[str, Sequence[str]], dead: Sequence[str]) -> tuple[str, str] | None:
    """The first finished step (plan order) whose output sat on a ``dead`` work host, and what that output was
    (:data:`HOLDS_OUTPUT`); None when no finished output is lost (or ``speculate`` finished: the head is on
    production then). ``finished``: step key -> the hosts its finished run ran on (the journal's).

    A step of a dead host moves to another work host only when this is None (nothing finished is redone); else
    the cycle waits for the rerun: as it is once the host is back, or with ``--dead`` to redo from this step."""
    if "speculate" in finished:
        return None
    gone = set(dead)
    for s in plan.steps:
        if s.kind in HOLDS_OUTPUT and s.key in finished and gone & set(finished[s.key]):
            return s.key, HOLDS_OUTPUT[s.kind]
    return None


def step_durations(text: str) -> dict[str, list[float]]:
    """Seconds each finished step took in cycle journals (``journal.jsonl`` lines, several journals concatenated:
    :func:`eagle3ops.commands.cycle.cycle_journals`): from a step's ``start`` to its next ``done`` or ``ended``,
    keyed by the step's kind (``weights:W`` -> ``weights``), in the journals' order. Lines that are not JSON (a line
    cut by a crash) and times that do not parse are left out."""
    from datetime import datetime

    started: dict[str, datetime] = {}
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        try:
            e = json.loads(line)
            key, event, t = str(e["step"]), e["event"], datetime.fromisoformat(str(e["t"]))
        except (ValueError, KeyError, TypeError):
            continue
        if event == "start":
            started[key] = t
        elif event in ("done", "ended") and key in started:
            out.setdefault(key.split(":", 1)[0], []).append((t - started.pop(key)).total_seconds())
    return out


def hidden_move(ex: FleetPlan | None, train_host: str, per_token: int | None, link_mbit: float
                ) -> tuple[str, float | None, str]:
    """``("hidden states to the train host", seconds, note)``: the tokens the extract plan gives the other work
    hosts × ``per_token`` bytes, at ``link_mbit`` Mbit/s (None: no extract plan or no target config read)."""
    name = "hidden states to the train host"
    if ex is None or per_token is None:
        return name, None, f"{NO_FIGURE} ({'no extract plan' if ex is None else 'the target config was not read'})"
    tokens = int(sum(w.tokens for w in ex.windows if w.host != train_host))
    nbytes = tokens * per_token
    return name, nbytes / (link_mbit * 1e6 / 8), (
        f"{_size(nbytes)}: {'' if ex.tokens_exact else 'at most '}{tokens} tokens extracted on the other work hosts "
        f"(the extract plan's) x {per_token} bytes a token (the target's config.json) at {link_mbit:g} Mbit/s")


def recorded_step(kind: str, recorded: Mapping[str, Sequence[float]]) -> tuple[float | None, str]:
    """Seconds a step of ``kind`` is expected to take: the median of the newest
    :data:`~eagle3ops.speculate.restarts.NEWEST` earlier cycles' figures on production, and the note saying so;
    ``(None, "no recorded figure ...")`` when no earlier cycle ran it."""
    figs = list(recorded.get(kind) or [])[-NEWEST:]
    if not figs:
        return None, f"{NO_FIGURE} (no earlier cycle on production ran it)"
    med = statistics.median(figs)
    return med, (f"median of {len(figs)} earlier cycle run(s) on production: {med:.0f} s (assumed: the same data, "
                 f"prompts and hosts)")


def speculate_parts(head_bytes: int | None, link_mbit: float, gate_recorded: Sequence[float]
                    ) -> tuple[tuple[str, float | None, str], ...]:
    """The ``speculate`` step's parts: ``("head transfer", seconds, note)`` (the train host's largest recorded head,
    ``head_bytes``, at ``link_mbit`` Mbit/s) and ``("the gate", seconds, note)`` (the median ``wall_s`` of
    production's newest recorded ``speculate`` windows, restarts included); None where nothing is recorded."""
    if head_bytes is None:
        head: tuple[str, float | None, str] = ("head transfer", None, f"{NO_FIGURE} (no trained head on the train "
                                                                      f"host to size it by)")
    else:
        head = ("head transfer", head_bytes / (link_mbit * 1e6 / 8),
                f"{_size(head_bytes)} (the largest head trained on the train host, assumed: the same draft "
                f"architecture) at {link_mbit:g} Mbit/s")
    figs = list(gate_recorded)[-NEWEST:]
    if not figs:
        gate: tuple[str, float | None, str] = ("the gate", None, f"{NO_FIGURE} (no speculate window recorded on "
                                                                 f"production)")
    else:
        med = statistics.median(figs)
        gate = ("the gate", med, f"median of {len(figs)} speculate window(s) recorded on production, restarts "
                                 f"included (assumed: the same gate settings and prompts)")
    return head, gate


def regenerate_estimate(todo: int | None, manifests: Sequence[Mapping[str, Any]]) -> tuple[float | None, str]:
    """Seconds for regenerate to answer ``todo`` conversations at the rate of production's newest regenerate that
    answered some (``wall_s / answered_now`` of its manifest, at its recorded concurrency), and the note saying so.
    ``(None, why)`` when ``todo`` is unknown or nothing was recorded."""
    if todo is None:
        return None, f"{NO_FIGURE} (conversations to answer not known)"
    if todo == 0:
        return 0.0, "every conversation answered already (resume log)"
    rec = [m for m in manifests if isinstance(m.get("answered_now"), int) and m["answered_now"] > 0
           and isinstance(m.get("wall_s"), (int, float)) and m["wall_s"] > 0]
    if not rec:
        return None, f"{todo} conversations; {NO_FIGURE} (no regenerate recorded on production to time them by)"
    m = max(rec, key=lambda x: str(x.get("created", "")))
    per = float(m["wall_s"]) / int(m["answered_now"])
    conc = (m.get("settings") or {}).get("concurrency")
    return todo * per, (f"{todo} conversations at {per:.1f} s each (production's regenerate of {m.get('created')}: "
                        f"{m['answered_now']} in {float(m['wall_s']):.0f} s, concurrency {conc})")


def train_estimate(steps: int | None, rec: Mapping[str, Any] | None) -> tuple[float | None, str]:
    """Seconds to train ``steps`` steps at the train host's recorded median step time, plus that run's time outside
    the steps (loading, vocab, saving: ``wall_s - steps_this_run x median_step_s``), and the note saying so. Assumes
    the same batch size and target as the recorded run (said so)."""
    if steps is None or rec is None:
        return None, f"{NO_FIGURE} (no train recorded on the work host to time it by)"
    fixed = max(0.0, float(rec["wall_s"]) - float(rec["steps_this_run"]) * float(rec["median_step_s"]))
    return fixed + steps * float(rec["median_step_s"]), (
        f"{steps} steps at {float(rec['median_step_s']):.2f} s + {fixed:.0f} s outside the steps (run "
        f"{rec.get('run')}'s train there; assumed: the same batch size and target)")


def regen_out(prod: str, run: str) -> Path:
    """The local folder regenerate writes (its own default: ``regenerated/<host>-<run>/``)."""
    return Path("regenerated") / f"{prod}-{run}"
