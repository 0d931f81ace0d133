"""``eagle3ops extract HOST HOST...``: the fleet plan from the inventory, each host's measured rates and the run's
prepared sample count, read before anything stops (reads only; ``offline``: no SSH, nothing measured).

Running the planned windows needs the shard-aware extract stage (each window extracting only its sample range),
which is not built yet (issue 29): :func:`refuse_execution` says so; ``--dry-run`` prints the plan.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eagle3ops.config import HostConfig
from eagle3ops.config.inventory import Inventory
from eagle3ops.config.pipeline import PipelineConfig
from eagle3ops.fleet import gather
from eagle3ops.fleet.plan import FleetHost, FleetPlan, FleetPlanError, model_limits, plan_fleet


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
               reader: Callable[[HostConfig], Any] | None) -> FleetPlan:
    """The fleet plan for ``names`` (rank order). ``reader(host)``: a context manager giving the host's executor
    (reads only); None: offline (no rates, the sample count from the pipeline config).

    Raises:
        ConfigError: an unknown host name. FleetPlanError: see :func:`sample_count` and :func:`plan_fleet`.
    """
    hosts = [inv.host(n) for n in names]
    rates, counts = {}, []
    for h in hosts:
        if reader is None:
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
    return plan_fleet(run, fleet, samples, tokens, tokens_exact=exact, limits=limits, policy=inv.fleet, notes=notes)


def refuse_execution() -> str:
    """Why a fleet extract runs only as ``--dry-run`` today, and what to do instead."""
    return ("running an extract over several hosts needs the shard-aware extract stage (each window extracting only "
            "its sample range; issue 29), which is not built yet. `--dry-run` prints the fleet plan; run one host "
            "at a time with `eagle3ops extract HOST` meanwhile")
