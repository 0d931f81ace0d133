"""``eagle3ops extract HOST HOST...``: the fleet plan from the inventory, each host's measured rates and the run's
prepared sample count, read before anything stops (reads only; ``offline``: no SSH, nothing measured); then, unless
``--dry-run``, the plan carried out (:mod:`eagle3ops.fleet.execute`), each window the single-host window machinery
(:func:`eagle3ops.window.run.run_window`: lock, preflight, supervisor, restore) with its shard.

- **Dead hosts** (``--dead HOST``): the plan is cut over every named host (so the shards are the ones of the first
  run), then :func:`eagle3ops.fleet.plan.reassign` moves a dead host's shards to a live one; a dead host is never
  reached.
- **Prepare first**: shards are cut from the prepared sample count. When no live host has prepared the run, one
  prepare-only window runs first (:func:`prepare_host`: a host with ``serving: none`` when there is one, so nothing
  stops) and the plan is made again from its count. Every shard's window prepares on its own host too (skipped where
  done); the merge compares the prepared samples by content digest.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from eagle3ops.config import HostConfig
from eagle3ops.config.inventory import Inventory
from eagle3ops.config.pipeline import PipelineConfig
from eagle3ops.fleet import gather
from eagle3ops.fleet.plan import FleetHost, FleetPlan, FleetPlanError, Window, model_limits, plan_fleet, reassign


def sample_count(counts: list[tuple[int, int] | None], cfg: PipelineConfig) -> tuple[int, int, bool]:
    """``(samples, tokens, exact)``: the run's prepare manifest on any host (exact), else ``prepare.max_samples`` ×
    ``prepare.max_seq_len`` (an upper bound).

    Raises:
        FleetPlanError: hosts disagree on the prepared samples, or none has prepared the run and ``max_samples`` is
            unset (the count the shards are cut from is unknown).
    """
    known = sorted({c for c in counts if c is not None})
    if len(known) > 1:
        raise FleetPlanError(f"the hosts hold different prepared samples for this run {known} (samples, tokens): "
                             f"rerun with --restart so every shard is cut from the same samples")
    if known:
        return known[0][0], known[0][1], True
    if cfg.prepare.max_samples is None:
        raise FleetPlanError("no host has prepared this run yet and `prepare.max_samples` is unset, so the number "
                             "of samples to shard is unknown: set prepare.max_samples in pipeline.yaml, or run "
                             "prepare first (a one-host `eagle3ops extract HOST --run RUN`)")
    n = cfg.prepare.max_samples
    return n, n * cfg.prepare.max_seq_len, False


def plan_hosts(inv: Inventory, names: list[str], run: str, cfg: PipelineConfig, *,
               reader: Callable[[HostConfig], Any] | None, dead: set[str] | None = None) -> FleetPlan:
    """The fleet plan for ``names`` (rank order). ``reader(host)``: a context manager giving the host's executor
    (reads only); None: offline (no rates, the sample count from the pipeline config). ``dead``: hosts never read
    whose shards move to live ones (:func:`eagle3ops.fleet.plan.reassign`).

    Raises:
        ConfigError: an unknown host name. FleetPlanError: see :func:`sample_count`, :func:`plan_fleet` and
            :func:`reassign` (a dead host not named, every host dead).
    """
    dead = set(dead or ())
    unknown = sorted(dead - set(names))
    if unknown:
        raise FleetPlanError(f"--dead {', '.join(unknown)}: not among this run's hosts ({', '.join(names)}); name "
                             f"a host of the run")
    hosts = [inv.host(n) for n in names]
    rates, counts = {}, []
    for h in hosts:
        if reader is None or h.name in dead:
            rates[h.name] = None
            continue
        with reader(h) as r:
            rates[h.name] = gather.measured_rates(r)
            counts.append(gather.prepared_counts(r, run))
    samples, tokens, exact = sample_count(counts, cfg)
    limits, notes = model_limits(list(inv.hosts.values()), inv.fleet)
    if reader is None:
        notes.append("offline: no host read, so no rates measured and the sample count from pipeline.yaml")
    fleet = [FleetHost.of(h, rates[h.name]) for h in hosts]
    plan = plan_fleet(run, fleet, samples, tokens, tokens_exact=exact, limits=limits, policy=inv.fleet, notes=notes)
    if dead:
        plan = reassign(plan, dead, fleet, policy=inv.fleet)
    return plan


def prepare_host(inv: Inventory, names: list[str], dead: set[str]) -> HostConfig:
    """The host that prepares a run no host has prepared yet: the first live one with ``serving: none`` (nothing
    stops), else the first live one (a short window of its own).

    Raises:
        FleetPlanError: every host is dead.
    """
    live = [inv.host(n) for n in names if n not in dead]
    if not live:
        raise FleetPlanError("every host of the run is marked dead: no host left to prepare it")
    return next((h for h in live if not h.serving.managed), live[0])


def prepare_window(host: HostConfig) -> Window:
    """The prepare pass as a window of the plan's type (no samples of its own; run with ``kind="prepare"`` by the
    function :func:`window_runner` returns)."""
    return Window(host.name, -1, 0, 1, 0, 0, host.serving.served_model_name if host.serving.managed else None, 0.0,
                  None, None, None)


def train_host(plan: FleetPlan, dead: set[str]) -> str:
    """The host the merged manifest is checked against (where training would run): the live host of the lowest
    rank."""
    return next(s.host for s in sorted(plan.shards, key=lambda s: s.rank) if s.host not in dead)


def window_runner(inv: Inventory, *, run: str, pipeline_text: str, command: str, restart: bool = False,
                  on_event: Callable[[str, dict[str, Any]], None] | None = None,
                  connect: Callable[[HostConfig], Any] | None = None) -> Callable[[Window], dict[str, Any]]:
    """``run_one(window)`` for :func:`eagle3ops.fleet.execute.run_plan`: one extract window on the window's host
    with its shard (``run_window(kind="extract", shard=(start, end))``), the image the host's ``deployed.json``
    names (or the inventory's ``pipeline_image``). ``on_event(host, event)`` hears the window's events;
    ``connect(host)``: the executor (default :func:`eagle3ops.executor.for_host`).

    A host whose lock is held by a window whose supervisor still runs (an earlier fleet run's driver was killed
    mid-window; the window goes on on the host) is waited for, polling every :data:`LOCK_POLL_S`, at most the
    host's ``maintenance_budget_s`` + :data:`LOCK_WAIT_MARGIN_S`, then its window runs (a no-op when that window
    finished the shard, else it resumes it).

    The returned function raises what ``run_window`` raises (``LockHeld`` — held by no running supervisor, or past
    the wait —, ``PreflightFailed``, ``WindowError``...) and :class:`FleetPlanError` when the host has no deployed
    pipeline image.
    """
    from eagle3ops import executor
    from eagle3ops.window.common import LockHeld
    from eagle3ops.window.run import run_window

    def run_one(w: Window, kind: str = "extract") -> dict[str, Any]:
        """One window on ``w.host``: ``extract`` with the window's shard, or the ``prepare`` pass."""
        h = inv.host(w.host)
        with (connect or executor.for_host)(h) as r:
            image, image_id = deployed_image(r)
            ev = (lambda e: on_event(h.name, e)) if on_event else None

            def once() -> dict[str, Any]:
                return run_window(r, kind=kind, image=image, expected_image_id=image_id, command=command, run=run,
                                  pipeline_text=pipeline_text, restart=restart and kind == "extract", on_event=ev,
                                  shard=(w.start, w.end) if kind == "extract" else None)

            try:
                return once()
            except LockHeld:
                if not wait_for_running_window(r, h.maintenance_budget_s + LOCK_WAIT_MARGIN_S, ev):
                    raise
            return once()

    return run_one


#: Seconds between looks at a host's lock while a running window holds it.
LOCK_POLL_S = 2.0
#: Seconds beyond the host's maintenance budget a fleet window waits for a running window to end.
LOCK_WAIT_MARGIN_S = 300.0


def wait_for_running_window(r: Any, limit_s: float, on_event: Callable[[dict[str, Any]], None] | None) -> bool:
    """When the host's lock is held by a window whose supervisor runs, wait (bounded by ``limit_s`` seconds) until
    the lock is free. Returns True when it became free, False when the lock is held by no running supervisor (a
    stale or unhealthy lock: not waited for) or the wait ran out."""
    from eagle3ops.window.lock import read_lock, supervisor_alive

    lock = read_lock(r)
    wid = (lock or {}).get("window_id")
    if not lock:
        return True
    if not wid or not supervisor_alive(r, wid):
        return False
    if on_event:
        on_event({"step": "lock", "event": "wait", "detail": f"waiting for window {wid} to end: it still runs on "
                                                               f"the host (`{lock.get('command', '?')}`)"})
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(LOCK_POLL_S)
        if read_lock(r) is None:
            return True
    return False


def deployed_image(r: Any) -> tuple[str, str | None]:
    """``(image, image id)`` a window on ``r.host`` runs: the inventory's ``pipeline_image``, else the host's
    ``deployed.json``.

    Raises:
        FleetPlanError: neither (the message names ``eagle3ops deploy HOST``).
    """
    import json

    from eagle3ops.commands import host as hc
    from eagle3ops.window.common import hint, paths

    out = r.run(hc.cat_if_exists(paths(r.host)["deployed"]), check=False).stdout
    dep = json.loads(out) if out.strip() else {}
    if not (r.host.pipeline_image or dep.get("image")):
        raise FleetPlanError(f"{r.host.name}: no pipeline image deployed yet; run {hint('deploy', r.host.name)} "
                             f"first")
    from eagle3ops.window.common import pipeline_image

    return pipeline_image(r.host, dep)
