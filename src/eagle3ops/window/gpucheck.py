"""Preflight's GPU fit (read-only, before anything stops): the GPU stages' memory per rank against what the GPUs
report, and the GPUs' compute capability against the CUDA architectures of the pipeline image.

The facts: the target's ``config.json`` and the run's pipeline config (:func:`estimate_gpu_memory`),
``nvidia-smi --query-gpu=memory.total,compute_cap`` on the host, and the ``cuda archs`` line the throwaway stage
container printed (``torch.cuda.get_arch_list()`` in the image, :func:`eagle3ops.commands.stages.trial_command`).
The arithmetic is :mod:`eagle3ops.window.estimate` (pure).
"""

from __future__ import annotations

import json
from typing import Protocol

from eagle3ops.commands import host as hc
from eagle3ops.remote import Remote
from eagle3ops.window.estimate import GpuMemoryPlan, arch_check, memory_fits, stage_memory, target_shape


class GpuFindings(Protocol):
    """What the GPU fit reads and writes of preflight's record (:class:`eagle3ops.window.preflight.Preflight` is
    one): ``trial_output`` (what the throwaway stage container printed, its ``cuda archs`` line included) and one
    check per :meth:`add`."""

    trial_output: str

    def add(self, name: str, ok: bool, detail: str) -> None:
        """Record one check: its name, whether it passed, and what was found in words."""


def estimate_gpu_memory(r: Remote, *, run: str, pipeline_text: str, stages: list[str]) -> GpuMemoryPlan | None:
    """The memory estimates of the GPU stages among ``stages`` (extract, train) on ``r.host``, from the target's
    ``config.json`` read on the host and the pipeline config (read-only). None on a CPU host (``gpus: 0``) or when
    no GPU stage runs; a plan with ``error`` when the config cannot be read (preflight then fails, naming it)."""
    import yaml

    from eagle3ops.config.pipeline import PipelineConfig
    from eagle3ops.window.common import host_path

    h = r.host
    if not h.gpus or not {"extract", "train"} & set(stages):
        return None
    try:
        cfg = PipelineConfig.model_validate(yaml.safe_load(pipeline_text) or {})
    except Exception as exc:  # noqa: BLE001 - pydantic or YAML error
        return GpuMemoryPlan(error=f"pipeline config is invalid: {exc}")
    model_dir = host_path(h, cfg.target_model, run) or h.model_path
    out = r.run(hc.cat_if_exists(f"{model_dir}/config.json"), check=False)
    try:
        shape = target_shape(json.loads(out.stdout))
    except (ValueError, TypeError) as exc:
        return GpuMemoryPlan(error=f"cannot read the target's {model_dir}/config.json on the host ({exc or 'missing'})"
                                   f"; it gives the sizes the GPU memory estimate needs (target_model: "
                                   f"{cfg.target_model})")
    ests = [e for s in stages if (e := stage_memory(s, shape, cfg, gpus=h.gpus)) is not None]
    return GpuMemoryPlan(ests, utilization=cfg.extract.gpu_memory_utilization)


def trial_arch_list(output: str) -> list[str] | None:
    """The architectures in the throwaway stage container's ``cuda archs ...`` line; None when it printed none."""
    for line in output.splitlines():
        if line.startswith("cuda archs"):
            return line.split()[2:]
    return None


def check_gpus_fit(r: Remote, pf: GpuFindings, *, memory: GpuMemoryPlan | None, trial_ran: bool) -> None:
    """Add preflight's ``gpu memory`` and ``gpu architecture`` checks to ``pf`` (read-only; on GPU hosts).

    ``gpu memory``: each GPU stage's estimate (:func:`eagle3ops.window.estimate.memory_fits`) against
    ``memory.utilization × memory.total`` of the GPUs nvidia-smi reports; skipped without estimates (``memory``
    None: no GPU stage runs, or ``deploy``'s preflight). ``gpu architecture``: the GPUs' ``compute_cap`` against the
    ``cuda archs`` the throwaway stage container printed (:func:`eagle3ops.window.estimate.arch_check`); only when
    that container ran (``trial_ran``). A failure names both figures and the setting to change.
    """
    if memory is None and not trial_ran:
        return
    q = r.run(hc.gpu_memory_and_capability(), check=False)
    try:
        gpus = hc.parse_gpu_memory_and_capability(q.stdout) if q.ok else []
    except ValueError as exc:
        gpus, q_err = [], str(exc)
    else:
        q_err = "" if q.ok else " ".join((q.stderr or q.stdout).split())[-200:] or f"exit {q.exited}"
    if not gpus:
        why = q_err or "no GPU listed"
        pf.add("gpu memory", False, f"cannot read the GPUs' memory and compute capability on {r.host.name} "
                                    f"(`nvidia-smi --query-gpu=memory.total,compute_cap`: {why}); put nvidia-smi on "
                                    f"the SSH user's PATH")
        return
    if memory is not None and memory.error:
        pf.add("gpu memory", False, f"no GPU memory estimate: {memory.error}")
    elif memory is not None:
        for est in memory.estimates:
            ok, line = memory_fits(est, [m for m, _ in gpus], memory.utilization)
            pf.add("gpu memory", ok, line)
    if trial_ran:
        archs = trial_arch_list(pf.trial_output)
        if archs is None:
            pf.add("gpu architecture", True, "not checked: the stage container printed no `cuda archs` line")
        else:
            pf.add("gpu architecture", *arch_check([c for _, c in gpus], archs))
