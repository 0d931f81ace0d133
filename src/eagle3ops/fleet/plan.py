"""The fleet extraction plan (pure): shards → windows → a schedule that keeps serving up, printed before any stop.

``eagle3ops extract a b c`` shards the prepared samples over the hosts (:mod:`eagle3ops.fleet.shard`), then:

- **windows**: a serving host runs its shard in a maintenance window; its downtime is estimated from the host's own
  measured rates (:class:`HostRates`: the newest finished extract window's ``result.json`` — ``downtime_s``,
  ``stage_seconds`` — and that run's extract ``manifest.json`` — ``generate_s``, ``generate_tokens_per_s``):
  ``downtime = fixed_s + tokens / tokens_per_s`` where ``fixed_s = downtime_s - generate_s`` is what does not grow
  with the data (stop, prepare, model load, restore, health gate). A host never measured is planned with no estimate
  and says so (the supervisor's budget still bounds it).
- **budget**: a window must fit the host's ``maintenance_budget_s`` the way the supervisor counts it (the stages end
  by the budget minus the restore's reserve ``min(serving.health_timeout_s, budget / 2)``; the whole downtime within
  the budget). A window over it is split into consecutive sub-ranges (``fleet.split_windows: true``, the default)
  or the plan is refused (``false``); a window that cannot fit even with one sample is refused. Both before any stop.
- **policy**: at most ``fleet.max_down_per_model`` hosts serving one model (``serving.served_model_name``, counted
  over the whole inventory) are down at once; by default one fewer than the hosts serving it, so never all of them —
  except a model with a single serving host, which goes down alone as in a one-host window (the plan says so).
  Windows are placed in waves (all windows of a wave may be down together; a host takes one window per wave).
- ``serving: none`` hosts take their shard with no window (nothing to stop): wave 0, no budget.
- **reassignment**: :func:`reassign` moves the unfinished part of a dead host's shards to the live host with the
  least planned work (hosts without serving first); the shards keep their global sample ranges, so the files they
  write (named by global index) and the merged manifest are the same wherever a shard ran.

Everything here is arithmetic on the inventory, the measured rates and the sample count; nothing is read or run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from eagle3ops.config import HostConfig
from eagle3ops.config.inventory import FleetConfig
from eagle3ops.fleet.shard import Shard, shard_ranges, split_range


class FleetPlanError(ValueError):
    """The fleet run cannot be planned as asked (a window over its budget that may not be split, one that cannot fit,
    an unknown or dead host); the message names the host, the figures and the fix. Raised before anything stops."""


@dataclass(frozen=True)
class HostRates:
    """One host's measured extraction rates (from :func:`rates_from`).

    ``tokens_per_s``: the extract engine's rate (tokens per second of generation); ``fixed_s``: seconds of a window's
    downtime that do not grow with the data; ``stage_fixed_s``: the same within the stages only (model load, prepare);
    ``window_id``: the window they were measured in.
    """

    tokens_per_s: float
    fixed_s: float
    stage_fixed_s: float
    window_id: str

    def downtime_s(self, tokens: float) -> float:
        """Estimated downtime of a window extracting ``tokens`` tokens, in seconds."""
        return self.fixed_s + tokens / self.tokens_per_s

    def stage_s(self, tokens: float) -> float:
        """Estimated time of the window's stages for ``tokens`` tokens, in seconds."""
        return self.stage_fixed_s + tokens / self.tokens_per_s


def rates_from(window_id: str, result: dict[str, Any], extract_manifest: dict[str, Any]) -> HostRates | None:
    """The rates a finished extract window measured, or None when it measured none (it failed, extracted nothing, or
    its result lacks the figures).

    ``result``: the window's ``result.json`` (``outcome``, ``stage_seconds``, ``downtime_s``, ``wall_s``);
    ``extract_manifest``: its run's ``extract/manifest.json`` (``generate_s``, ``generate_tokens_per_s``). A host
    without serving has no ``downtime_s``: its ``wall_s`` stands for it.
    """
    stages = result.get("stage_seconds") or {}
    tps = extract_manifest.get("generate_tokens_per_s")
    gen = extract_manifest.get("generate_s")
    if result.get("outcome") != "ok" or "extract" not in stages or not tps or gen is None:
        return None
    down = result.get("downtime_s")
    if down is None:
        down = result.get("wall_s")
    if down is None:
        return None
    stage_total = float(sum(stages.values()))
    return HostRates(tokens_per_s=float(tps), fixed_s=max(0.0, float(down) - float(gen)),
                     stage_fixed_s=max(0.0, stage_total - float(gen)), window_id=window_id)


@dataclass(frozen=True)
class FleetHost:
    """What the planner needs of one host: its name, the model it serves (None: ``serving: none``), its budget and
    restore reserve (seconds) and its measured rates (None: never measured)."""

    name: str
    model: str | None
    budget_s: float
    reserve_s: float
    rates: HostRates | None = None

    @classmethod
    def of(cls, host: HostConfig, rates: HostRates | None) -> "FleetHost":
        """The planner's view of an inventory host (its budget and the reserve the supervisor keeps for the
        restore: ``min(serving.health_timeout_s, budget / 2)``)."""
        budget = host.maintenance_budget_s
        return cls(host.name, host.serving.served_model_name if host.serving.managed else None, budget,
                   min(host.serving.health_timeout_s, budget / 2) if host.serving.managed else 0.0, rates)


@dataclass(frozen=True)
class Window:
    """One unit of work on one host: samples ``[start, end)`` of shard ``rank`` (part ``part`` of ``parts``).

    ``serving``: the model taken down, None for a host without serving (no window: nothing stops); ``wave``: its place
    in the schedule; ``tokens``: estimated tokens; ``downtime_s`` / ``stage_s``: estimates (None: host unmeasured).
    """

    host: str
    rank: int
    part: int
    parts: int
    start: int
    end: int
    serving: str | None
    tokens: float
    downtime_s: float | None
    stage_s: float | None
    budget_s: float | None
    wave: int = 0

    @property
    def samples(self) -> int:
        """Number of samples of the window."""
        return self.end - self.start

    def as_dict(self) -> dict[str, Any]:
        """The window as recorded in the fleet plan (JSON)."""
        return {"host": self.host, "rank": self.rank, "part": self.part, "parts": self.parts, "start": self.start,
                "end": self.end, "samples": self.samples, "serving": self.serving, "tokens": round(self.tokens),
                "downtime_s": _r(self.downtime_s), "stage_s": _r(self.stage_s), "budget_s": self.budget_s,
                "wave": self.wave}


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


@dataclass(frozen=True)
class FleetPlan:
    """A whole fleet run: ``samples`` / ``tokens`` (``tokens_exact``: from the prepare manifest, else an upper bound
    of samples × max_seq_len), the shards, the windows in schedule order, the per-model down-at-once limits and the
    notes printed with it."""

    run: str
    samples: int
    tokens: int
    tokens_exact: bool
    shards: tuple[Shard, ...]
    windows: tuple[Window, ...]
    limits: dict[str, int]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        """The plan as recorded beside the run (``fleet-plan.json``): deterministic for the same inputs."""
        return {"run": self.run, "samples": self.samples, "tokens": self.tokens, "tokens_exact": self.tokens_exact,
                "sharding": "contiguous; speculators 0.6 --world-size/--rank rule (first n % N ranks one more)",
                "shards": [s.as_dict() for s in self.shards], "windows": [w.as_dict() for w in self.windows],
                "max_down_per_model": dict(sorted(self.limits.items())), "notes": list(self.notes)}

    def waves(self) -> list[list[Window]]:
        """The windows grouped by wave, in order."""
        out: list[list[Window]] = []
        for w in self.windows:
            while len(out) <= w.wave:
                out.append([])
            out[w.wave].append(w)
        return out


def model_limits(inventory_hosts: list[HostConfig], policy: FleetConfig) -> tuple[dict[str, int], list[str]]:
    """Per served model: how many of its serving hosts may be down at once, and notes for the plan.

    ``policy.max_down_per_model`` when set; else one fewer than the inventory's hosts serving the model (never all of
    them), but at least 1 (a model with one serving host goes down alone, as in a one-host window: noted).
    """
    counts: dict[str, int] = {}
    for h in inventory_hosts:
        if h.serving.managed:
            counts[str(h.serving.served_model_name)] = counts.get(str(h.serving.served_model_name), 0) + 1
    limits, notes = {}, []
    for model, n in sorted(counts.items()):
        if policy.max_down_per_model is not None:
            limits[model] = policy.max_down_per_model
        else:
            limits[model] = max(1, n - 1)
            if n == 1:
                notes.append(f"model {model} has one serving host in the inventory: its window takes {model} down "
                             f"(as a one-host window does)")
    return limits, notes


def _windows_of(shard: Shard, host: FleetHost, tokens_per_sample: float, split: bool) -> list[Window]:
    """The windows of one shard on one host, split to fit the budget when allowed.

    Raises:
        FleetPlanError: the window is over budget and may not be split, or cannot fit even with one sample.
    """
    def window(start: int, end: int, part: int, parts: int) -> Window:
        tokens = (end - start) * tokens_per_sample
        r = host.rates
        return Window(host.name, shard.rank, part, parts, start, end, host.model, tokens,
                      None if r is None else r.downtime_s(tokens), None if r is None else r.stage_s(tokens),
                      host.budget_s if host.model is not None else None)

    whole = window(shard.start, shard.end, 0, 1)
    if host.model is None or host.rates is None or shard.samples == 0 or _fits(whole, host):
        return [whole]
    one = window(shard.start, shard.start + 1, 0, 1)
    if not _fits(one, host):
        raise FleetPlanError(
            f"{host.name}: even a one-sample window would keep serving down ~{one.downtime_s:.0f} s (stages "
            f"~{one.stage_s:.0f} s), over maintenance_budget_s {host.budget_s:.0f} s with "
            f"{host.reserve_s:.0f} s kept for the restore (rates measured in window {host.rates.window_id}). Raise "
            f"hosts.{host.name}.maintenance_budget_s, or run this shard on a host with `serving: none`")
    if not split:
        raise FleetPlanError(
            f"{host.name}: the window for samples [{shard.start}, {shard.end}) would keep serving down "
            f"~{whole.downtime_s:.0f} s, over maintenance_budget_s {host.budget_s:.0f} s (rates measured in window "
            f"{host.rates.window_id}), and fleet.split_windows is false. Set `fleet: {{split_windows: true}}` in the "
            f"inventory to split it, raise the budget, or add hosts")
    for parts in range(2, shard.samples + 1):
        ws = [window(a, b, k, parts) for k, (a, b) in enumerate(split_range(shard.start, shard.end, parts))]
        if all(_fits(w, host) for w in ws):
            return ws
    raise AssertionError("unreachable: one-sample windows fit")  # pragma: no cover


def _fits(w: Window, host: FleetHost) -> bool:
    assert w.downtime_s is not None and w.stage_s is not None
    return w.downtime_s <= host.budget_s and w.stage_s <= host.budget_s - host.reserve_s


def schedule(windows: list[Window], limits: dict[str, int]) -> list[Window]:
    """The windows with their waves: each window in the earliest wave after its host's previous window where fewer
    than ``limits[model]`` windows of its model are already placed. Windows without serving go in wave 0 beside the
    others (a host still takes one per wave). Deterministic: windows are placed in the given order.
    """
    placed: list[Window] = []
    per_wave: dict[tuple[int, str], int] = {}
    host_next: dict[str, int] = {}
    for w in windows:
        wave = host_next.get(w.host, 0)
        if w.serving is not None:
            limit = limits.get(w.serving, 1)
            while per_wave.get((wave, w.serving), 0) >= limit:
                wave += 1
            per_wave[(wave, w.serving)] = per_wave.get((wave, w.serving), 0) + 1
        host_next[w.host] = wave + 1
        placed.append(replace(w, wave=wave))
    return sorted(placed, key=lambda w: (w.wave, w.rank, w.part))


def plan_fleet(run: str, hosts: list[FleetHost], samples: int, tokens: int, *, tokens_exact: bool,
               limits: dict[str, int], policy: FleetConfig, notes: list[str] | None = None,
               shards: list[Shard] | None = None) -> FleetPlan:
    """Plan a fleet extraction of ``samples`` samples (``tokens`` tokens in all) over ``hosts`` (rank order).

    ``shards``: an assignment to keep (a resumed or reassigned run); default: :func:`shard_ranges` over the hosts.

    Raises:
        FleetPlanError: a window over its budget that may not be split or cannot fit (see :func:`_windows_of`), a
            shard assigned to a host not in ``hosts``, or a host named twice.
    """
    by_name = {h.name: h for h in hosts}
    if shards is None:
        try:
            shards = shard_ranges(samples, [h.name for h in hosts])
        except ValueError as exc:
            raise FleetPlanError(str(exc)) from None
    per_sample = tokens / samples if samples else 0.0
    windows: list[Window] = []
    for s in shards:
        if s.host not in by_name:
            raise FleetPlanError(f"shard {s.rank} [{s.start}, {s.end}) is assigned to {s.host!r}, which is not in "
                                 f"this run's hosts ({', '.join(by_name)})")
        windows += _windows_of(s, by_name[s.host], per_sample, policy.split_windows)
    out_notes = list(notes or [])
    for h in hosts:
        if h.model is not None and h.rates is None:
            out_notes.append(f"{h.name}: no finished extract window measured yet: its downtime is not estimated "
                             f"(the supervisor still ends stages within maintenance_budget_s {h.budget_s:.0f} s)")
    return FleetPlan(run, samples, tokens, tokens_exact, tuple(shards), tuple(schedule(windows, limits)),
                     dict(limits), tuple(out_notes))


def reassign(plan: FleetPlan, dead: set[str], hosts: list[FleetHost], done: dict[int, int] | None = None,
             *, policy: FleetConfig) -> FleetPlan:
    """The plan with every shard of a host in ``dead`` moved to a live host, resumed where it stopped.

    ``done``: per shard rank, how many of its first samples are finished (the shard's ``progress.jsonl`` prefix that
    a resumed extract skips); the moved shard keeps the rest of its range. The new host is the live one with the
    least planned samples, hosts without serving first (they need no window), then rank order.

    Raises:
        FleetPlanError: every host is dead, or a dead host is not in the plan.
    """
    unknown = dead - {s.host for s in plan.shards}
    if unknown:
        raise FleetPlanError(f"host(s) {', '.join(sorted(unknown))} marked dead but not in the plan of run {plan.run}")
    live = [h for h in hosts if h.name not in dead]
    if not live:
        raise FleetPlanError(f"every host of run {plan.run} is marked dead: no host left to take its shards")
    done = done or {}
    load = {h.name: sum(s.samples for s in plan.shards if s.host == h.name) for h in live}
    shards: list[Shard] = []
    for s in plan.shards:
        if s.host not in dead:
            shards.append(s)
            continue
        start = min(s.end, s.start + done.get(s.rank, 0))
        if start == s.end:
            shards.append(s)  # finished before its host died: its files stand
            continue
        target = min(live, key=lambda h: (h.model is not None, load[h.name], [x.name for x in live].index(h.name)))
        load[target.name] += s.end - start
        shards.append(Shard(s.rank, target.name, start, s.end))
    finished = [s for s in shards if s.host in dead]
    todo = [s for s in shards if s.host not in dead]
    replanned = plan_fleet(plan.run, live, plan.samples, plan.tokens, tokens_exact=plan.tokens_exact,
                           limits=plan.limits, policy=policy, notes=list(plan.notes), shards=todo)
    moved = [f"shard {s.rank} [{s.start}, {s.end}) moved to {s.host}" for s in todo
             if any(o.rank == s.rank and o.host in dead for o in plan.shards)]
    return replace(replanned, shards=tuple(sorted([*finished, *todo], key=lambda s: s.rank)),
                   notes=(*replanned.notes, *moved))


def render(plan: FleetPlan) -> str:
    """The plan as printed before the first stop: totals, the shards, every window with its estimated downtime and
    budget, wave by wave, and the notes."""
    lines = [f"fleet plan for run {plan.run}: {plan.samples} samples, "
             f"{'' if plan.tokens_exact else '≤ '}{plan.tokens} tokens "
             f"({'prepare manifest' if plan.tokens_exact else 'upper bound: samples × prepare.max_seq_len'}), "
             f"{len(plan.shards)} contiguous shards"]
    for s in plan.shards:
        lines.append(f"  shard {s.rank}: samples [{s.start}, {s.end}) ({s.samples}) on {s.host}")
    if plan.limits:
        lines.append("  down at once, per model: " + ", ".join(f"{m} ≤ {n}" for m, n in sorted(plan.limits.items())))
    for i, wave in enumerate(plan.waves()):
        lines.append(f"  wave {i}:")
        for w in wave:
            what = (f"window on {w.host} (serving {w.serving} stops)" if w.serving is not None
                    else f"{w.host} (serving: none, no window)")
            part = f" part {w.part + 1}/{w.parts}" if w.parts > 1 else ""
            est = ("downtime not estimated (host not measured)" if w.serving is not None and w.downtime_s is None
                   else f"est. downtime {w.downtime_s:.0f} s of budget {w.budget_s:.0f} s" if w.serving is not None
                   else (f"est. {w.stage_s:.0f} s" if w.stage_s is not None else "not estimated"))
            lines.append(f"    {what}: shard {w.rank}{part}, samples [{w.start}, {w.end}) ({w.samples}, "
                         f"~{w.tokens:.0f} tokens), {est}")
    lines += [f"  note: {n}" for n in plan.notes]
    return "\n".join(lines)

