"""What the probe engines' workers import, imported once by the forkserver they are forked from
(:mod:`eagle3ops.patches.forkworkers`); no other module imports this one.

A worker of a vLLM engine (``MultiprocExecutor``, vLLM 0.16) runs ``WorkerProc.worker_main``: it imports torch,
vLLM's CPU worker and model runner, the target's model class and the generator's worker extension
(``speculators.data_generation.custom_worker``, a patched module). Imported here, in the forkserver, every worker
forked from it has them already. Each import that fails is left for the worker to do again -- its error is then the
worker's, reported by the probe that needed the engine -- so a broken patched module never stops the forkserver.
"""

from __future__ import annotations

import importlib

#: Imported in this order; each one's failure ignored here (see the module docstring).
MODULES = (
    "torch",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.worker.cpu_worker",
    "vllm.model_executor.models.llama",
    "vllm.model_executor.models.deepseek_v2",
    "speculators.data_generation.custom_worker",
    "eagle3ops.patches.probekit",
)

for _name in MODULES:
    try:
        importlib.import_module(_name)
    except Exception:  # noqa: BLE001, S112 - see the module docstring
        continue
