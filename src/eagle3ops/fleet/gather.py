"""What the fleet planner reads from each host before anything stops (reads only, over the host's executor).

- :func:`measured_rates`: the newest finished extract window of the host (``<state_dir>/windows/<id>/result.json``,
  ids sorting by time; ``-extract-`` in the id), its ``plan.json`` for the run it extracted (a stage spec's command's
  ``--run-dir /data/runs/<run>``), and that run's ``extract/manifest.json`` (a fleet shard's window, ``--shard S:E``:
  ``extract/shards/S-E.json``) → :func:`eagle3ops.fleet.plan.rates_from`.
- :func:`prepared_counts`: the run's prepare manifest on a host (samples and tokens) when prepare has run there.
- :func:`recorded_train`: the newest train window's run and its ``train/manifest.json`` step figures (the cycle's
  train estimate).
"""

from __future__ import annotations

import json
from typing import Any

from eagle3ops.commands import host as hc
from eagle3ops.commands.stages import DATA_MOUNT
from eagle3ops.fleet.plan import HostRates, rates_from
from eagle3ops.stages.shards import manifest_rel, parse_shard

#: How many of the newest extract windows are looked at for a measurement.
LOOKBACK = 10


def _json(r: Any, path: str) -> dict[str, Any] | None:
    text = r.run(hc.cat_if_exists(path), check=False).stdout
    try:
        data = json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def _run_of(plan: dict[str, Any], data_dir: str = DATA_MOUNT) -> str | None:
    """The run an extract window's plan extracted: the argument after ``--run-dir`` in a stage command (a container's
    ``/data/runs/<run>``, or a venv host's ``<data_dir>/runs/<run>`` in its argv)."""
    prefixes = (f"{DATA_MOUNT}/runs/", f"{data_dir.rstrip('/')}/runs/")
    for stage in plan.get("stages") or []:
        spec = stage.get("spec") if isinstance(stage, dict) else None
        cmd = (spec or {}).get("command") or (spec or {}).get("argv") or []
        for a, b in zip(cmd, cmd[1:]):
            for prefix in prefixes:
                if a == "--run-dir" and isinstance(b, str) and b.startswith(prefix):
                    return b[len(prefix):]
    return None


def _shard_of(plan: dict[str, Any]) -> tuple[int, int] | None:
    """The shard a fleet window's plan extracted: the argument after ``--shard`` in a stage command (argv of a venv
    host, command of a container)."""
    for stage in plan.get("stages") or []:
        spec = stage.get("spec") if isinstance(stage, dict) else None
        cmd = (spec or {}).get("command") or (spec or {}).get("argv") or []
        for a, b in zip(cmd, cmd[1:]):
            if a == "--shard" and isinstance(b, str):
                try:
                    return parse_shard(b)
                except ValueError:
                    return None
    return None


def measured_rates(r: Any) -> HostRates | None:
    """The host's rates from its newest extract window that measured some (None: never measured)."""
    state = r.host.state_dir
    names = sorted((n for n in r.run(hc.ls(f"{state}/windows"), check=False).stdout.split() if "-extract-" in n),
                   reverse=True)
    for wid in names[:LOOKBACK]:
        result = _json(r, f"{state}/windows/{wid}/result.json")
        plan = _json(r, f"{state}/windows/{wid}/plan.json")
        run = _run_of(plan, r.host.data_dir) if plan else None
        if not result or not run:
            continue
        shard = _shard_of(plan) if plan else None
        rel = manifest_rel(*shard) if shard else "manifest.json"
        manifest = _json(r, f"{r.host.data_dir}/runs/{run}/extract/{rel}")
        rates = rates_from(wid, result, manifest or {})
        if rates is not None:
            return rates
    return None


def prepared_counts(r: Any, run: str) -> tuple[int, int] | None:
    """``(samples, tokens)`` of the run's prepare manifest on the host, or None when prepare has not run there."""
    m = _json(r, f"{r.host.data_dir}/runs/{run}/prepare/manifest.json")
    if not m or m.get("stage") != "prepare" or "samples" not in m or "tokens" not in m:
        return None
    return int(m["samples"]), int(m["tokens"])


def recorded_train(r: Any) -> dict[str, Any] | None:
    """The step figures of the host's newest train window whose run's train manifest has them: ``{"window_id",
    "run", "median_step_s", "steps_this_run", "wall_s"}`` (seconds), or None (never trained here)."""
    state = r.host.state_dir
    names = sorted((n for n in r.run(hc.ls(f"{state}/windows"), check=False).stdout.split() if "-train-" in n),
                   reverse=True)
    for wid in names[:LOOKBACK]:
        plan = _json(r, f"{state}/windows/{wid}/plan.json")
        run = _run_of(plan, r.host.data_dir) if plan else None
        m = _json(r, f"{r.host.data_dir}/runs/{run}/train/manifest.json") if run else None
        fig = {k: (m or {}).get(k) for k in ("median_step_s", "steps_this_run", "wall_s")}
        if all(isinstance(v, (int, float)) and v > 0 for v in fig.values()):
            return {"window_id": wid, "run": run, **fig}
    return None
