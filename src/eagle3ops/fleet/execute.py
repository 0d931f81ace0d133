"""Carrying out a fleet plan: the plan's windows in its waves, never more serving hosts down at once than
the plan's waves allow, then the per-shard manifests merged and checked. No I/O of its own: each window is run by
the caller's ``run_one`` (the single-host window machinery, :func:`eagle3ops.fleet.driver.window_runner`), each
manifest read by ``read_text``; so the order and the bounds are tested without hosts.

Order (:func:`run_plan`):

- hosts with ``serving: none`` (windows whose ``serving`` is None) stop nothing: each such host runs its windows one
  after another in a thread of its own, from the start, beside the waves;
- windows that stop serving run wave by wave: every window of a wave at once (one thread each; a host has at most
  one window per wave, :func:`eagle3ops.fleet.plan.schedule`), and the next wave starts only when every window of
  this one has ended. The plan put at most ``max_down_per_model`` windows of one model in a wave, so no more hosts
  serving a model are down at once;
- a window of no samples (more hosts than samples) is not run: nothing to extract, nothing stopped;
- a wave with a failed window ends the serving part: later waves are not started (a host that failed its window
  may still be restoring or unhealthy, and taking more hosts down would leave fewer serving); the hosts without
  serving finish their shards. A rerun resumes: finished shards are no-op windows that stop nothing, a failed
  shard resumes from the samples it wrote.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eagle3ops.stages.merge import MergeError, bind_inputs, check_merged, merge_manifests
from eagle3ops.fleet.plan import FleetPlan, Window
from eagle3ops.fleet.shard import Shard
from eagle3ops.stages.shards import manifest_rel

#: Outcomes of a window that leave its shard finished.
DONE = ("ok", "nothing to do")


@dataclass
class WindowOutcome:
    """One window's end: the supervisor's result (``outcome``, ``downtime_s``...), or the error that stopped it
    before or while it ran (``error``); ``started``/``ended``: monotonic seconds on the driver."""

    window: Window
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    started: float = 0.0
    ended: float = 0.0

    @property
    def ok(self) -> bool:
        """The window ended with its shard finished (``ok``, or ``nothing to do``: finished earlier)."""
        return not self.error and self.result.get("outcome") in DONE

    def as_dict(self) -> dict[str, Any]:
        """The outcome as printed in the run's summary (JSON)."""
        w = self.window
        return {"host": w.host, "rank": w.rank, "part": w.part, "start": w.start, "end": w.end,
                "serving": w.serving, "wave": w.wave, "outcome": self.result.get("outcome") or "error",
                "window_id": self.result.get("window_id"), "downtime_s": self.result.get("downtime_s"),
                "error": (self.error or self.result.get("error") or "")[-500:],
                "seconds": round(self.ended - self.started, 1)}


@dataclass
class FleetRun:
    """What :func:`run_plan` did: one outcome per window that ran, the windows not started (an earlier wave
    failed), in plan order."""

    outcomes: list[WindowOutcome]
    not_started: list[Window]

    @property
    def ok(self) -> bool:
        """Every window of the plan ran and finished its shard."""
        return not self.not_started and all(o.ok for o in self.outcomes)


def _run(run_one: Callable[[Window], dict[str, Any]], w: Window) -> WindowOutcome:
    out = WindowOutcome(w, started=time.monotonic())
    try:
        out.result = run_one(w)
    except Exception as exc:  # noqa: BLE001 - a window's failure is its outcome; the fleet goes on or stops by policy
        out.error = f"{type(exc).__name__}: {exc}"
    out.ended = time.monotonic()
    return out


def run_plan(plan: FleetPlan, run_one: Callable[[Window], dict[str, Any]],
             on_window: Callable[[WindowOutcome], None] | None = None) -> FleetRun:
    """Run every window of ``plan`` in the order of the module doc; ``run_one(window)`` runs one window and returns
    its result (raising is a failed window); ``on_window`` hears each outcome as it ends (from worker threads).

    Returns the outcomes in plan order. Bounded by the windows' own bounds (each window's watch is bounded).
    """
    outcomes: dict[int, WindowOutcome] = {}
    lock = threading.Lock()
    index = {id(w): i for i, w in enumerate(plan.windows)}

    def record(o: WindowOutcome) -> None:
        with lock:
            outcomes[index[id(o.window)]] = o
        if on_window:
            on_window(o)

    free = [w for w in plan.windows if w.serving is None and w.samples]
    per_host: dict[str, list[Window]] = {}
    for w in free:
        per_host.setdefault(w.host, []).append(w)

    def host_worker(ws: list[Window]) -> None:
        for w in ws:
            o = _run(run_one, w)
            record(o)
            if not o.ok:
                return  # the host's later windows would meet the same fault; a rerun resumes

    threads = [threading.Thread(target=host_worker, args=(ws,), name=f"fleet-{h}", daemon=True)
               for h, ws in per_host.items()]
    for t in threads:
        t.start()
    not_started: list[Window] = []
    failed = False
    for wave in plan.waves():
        serving = [w for w in wave if w.serving is not None and w.samples]
        if failed:
            not_started += serving
            continue
        wave_threads = [threading.Thread(target=lambda w=w: record(_run(run_one, w)), name=f"fleet-{w.host}",
                                         daemon=True) for w in serving]
        for t in wave_threads:
            t.start()
        for t in wave_threads:
            t.join()
        failed = any(not outcomes[index[id(w)]].ok for w in serving)
    for t in threads:
        t.join()
    ran = {index[id(w)] for w in not_started}
    not_started += [w for w in free if index[id(w)] not in outcomes and index[id(w)] not in ran]
    return FleetRun([outcomes[i] for i in sorted(outcomes)], sorted(not_started, key=lambda w: index[id(w)]))


def shard_manifest_path(data_dir: str, run: str, w: Window) -> str:
    """Where window ``w``'s shard manifest lies on its host: ``<data_dir>/runs/<run>/extract/shards/<s>-<e>.json``."""
    return f"{data_dir}/runs/{run}/extract/{manifest_rel(w.start, w.end)}"


def merge_run(plan: FleetPlan, read_text: Callable[[str, str], str | None], data_dirs: dict[str, str],
              train_host: str) -> dict[str, Any]:
    """The run's merged extract manifest from each window's shard manifest (read on the window's host by
    ``read_text(host, path)``), checked against ``train_host``'s prepare manifest and naming it as its input.

    Raises:
        MergeError: a shard manifest missing or inconsistent (:func:`eagle3ops.stages.merge.merge_manifests`), or the
            merge not covering the prepared samples of ``train_host`` (:func:`eagle3ops.stages.merge.check_merged`).
    """
    windows = sorted(plan.windows, key=lambda w: w.start)
    parts = [Shard(i, w.host, w.start, w.end) for i, w in enumerate(windows)]
    texts: dict[int, str] = {}
    for i, w in enumerate(windows):
        if w.samples:
            text = read_text(w.host, shard_manifest_path(data_dirs[w.host], plan.run, w))
            if text:
                texts[i] = text
    merged = merge_manifests(parts, texts)
    prep = read_text(train_host, f"{data_dirs[train_host]}/runs/{plan.run}/prepare/manifest.json")
    if not prep:
        raise MergeError(f"{train_host} holds no prepare manifest for run {plan.run}: the merged manifest cannot be "
                         f"checked against its samples; run its shard (or `eagle3ops extract {train_host}`) first")
    check_merged(merged, prep)
    merged = bind_inputs(merged, prep)
    merged["fleet"] = {**merged["fleet"], "plan": plan.as_dict(), "train_host": train_host}
    return merged
