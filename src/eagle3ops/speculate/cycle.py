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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from eagle3ops.commands import cycle as cyc
from eagle3ops.commands.quote import render
from eagle3ops.fleet.plan import FleetPlan
from eagle3ops.speculate.restarts import RestartPlan

__all__ = ["CycleEnded", "CycleError", "CycleFacts", "CycleLocked", "CycleOptions", "CyclePlan", "CycleStep",
           "StepFailed", "WorkFacts", "plan_cycle", "regen_out", "regenerate_estimate", "train_estimate"]

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
    (:func:`eagle3ops.fleet.gather.recorded_train`); ``control``: production's speculate job measures a control
    release (:func:`eagle3ops.speculate.ship.needs_control`; ``restarts`` counted with it).
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
    control: bool = False


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
    regen_s, regen_note = regenerate_estimate(facts.regenerate_todo, facts.regenerate_recorded)
    train_s, train_note = train_estimate(facts.train_steps, facts.train_recorded)
    train_host = live[0].name
    several = len(names) > 1
    steps = [
        CycleStep("regenerate", "regenerate", (prod,),
                  tuple(cyc.regenerate(prod, run, inv, opts.datasets, held_out=opts.held_out, limit=opts.limit,
                                      out=regen_out(prod, run), truncated=opts.truncated)),
                  expected_s=regen_s, note=f"on production's live serving (resumable): {regen_note}"),
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
                  expected_s=train_s,
                  note=("vocab + train; hidden states of other work hosts copied there first (not timed); "
                        if several else "vocab + train; no window (serving: none); ") + train_note),
        CycleStep("acceptance", "acceptance", (train_host,),
                  note=f"the head served on {train_host} with production's argv + --speculative-config (same image "
                       f"id); mean acceptance length from /metrics deltas against the floor "
                       f"{facts.acceptance_floor:g}; its start bounded by {facts.health_timeout_s:.0f} s"),
        CycleStep("speculate", "speculate", (prod, train_host),
                  tuple(cyc.speculate(prod, run, train_host, inv, opts.prompts_file, control=facts.control)),
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


def regenerate_estimate(todo: int | None, manifests: Sequence[Mapping[str, Any]]) -> tuple[float | None, str]:
    """Seconds for regenerate to answer ``todo`` conversations at the rate of production's newest regenerate that
    answered some (``wall_s / answered_now`` of its manifest, at its recorded concurrency), and the note saying so.
    ``(None, why)`` when ``todo`` is unknown or nothing was recorded."""
    if todo is None:
        return None, "conversations to answer not known"
    if todo == 0:
        return 0.0, "every conversation answered already (resume log)"
    rec = [m for m in manifests if isinstance(m.get("answered_now"), int) and m["answered_now"] > 0
           and isinstance(m.get("wall_s"), (int, float)) and m["wall_s"] > 0]
    if not rec:
        return None, f"{todo} conversations; no regenerate recorded on production to time them by"
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
        return None, "no train recorded on the work host to time it by"
    fixed = max(0.0, float(rec["wall_s"]) - float(rec["steps_this_run"]) * float(rec["median_step_s"]))
    return fixed + steps * float(rec["median_step_s"]), (
        f"{steps} steps at {float(rec['median_step_s']):.2f} s + {fixed:.0f} s outside the steps (run "
        f"{rec.get('run')}'s train there; assumed: the same batch size and target)")


def regen_out(prod: str, run: str) -> Path:
    """The local folder regenerate writes (its own default: ``regenerated/<host>-<run>/``)."""
    return Path("regenerated") / f"{prod}-{run}"
