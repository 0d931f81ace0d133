"""Where the probe engines' vLLM workers come from on vLLM's CPU platform: forked from one forkserver that has
imported torch, vLLM and the patched package once, instead of spawned (each spawned worker imports them again).

vLLM 0.16's CPU platform forces the ``spawn`` start method (``VLLM_WORKER_MULTIPROC_METHOD=spawn``, set while the
engine's config is made), so every engine's worker starts a fresh interpreter; on 2 cores three such imports were
12 s of a 24 s patch rebuild. :func:`start_forkserver` starts :mod:`multiprocessing.forkserver` with
:data:`WORKER_PRELOAD` (:mod:`eagle3ops.patches.forkpreload`) and returns at once, so that import runs beside the
probe process's own; :func:`workers_forked` makes vLLM's ``MultiprocExecutor`` start its workers from it
(:class:`ForkedWorkers`). A forkserver child is a fork of a process that has imported modules and run nothing -- no
engine, no OpenMP parallel region, no thread -- which is what makes forking safe where forking the probe process
(threads, OpenMP pools) would not be. Each worker takes the probe process's whole environment as it is when the
worker starts (:func:`run_with_environ`), as a spawned one inherits it; what a module read from the environment when
the forkserver imported it was read there (the probe engines' variables are set before it starts:
``eagle3ops.patches.probekit.warm``). Only the probe engines use this; serving, the pipeline stages and vLLM on
other platforms keep vLLM's own start method.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import multiprocessing
import multiprocessing.forkserver
import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["WORKER_PRELOAD", "ForkedWorkers", "run_with_environ", "start_forkserver", "vllm_distribution_is_cpu",
           "workers_forked"]

#: The module the forkserver imports before it forks any worker (:mod:`eagle3ops.patches.forkpreload`: torch,
#: vLLM's worker and executor, the patched generator's worker extension).
WORKER_PRELOAD = ("eagle3ops.patches.forkpreload",)
_MP_PATCH_LOCK = threading.Lock()
#: [depth, vLLM's own get_mp_context while replaced]
_MP_PATCH: list[Any] = [0, None]


def vllm_distribution_is_cpu() -> bool:
    """Whether the installed vLLM is a CPU build, read from its version (``0.16.0+cpu``) without importing it: the
    first test of vLLM 0.16's own ``vllm.platforms.cpu_platform_plugin`` (``vllm_version_matches_substr("cpu")``).
    Only decides whether ``probekit.warm`` starts the forkserver early; whether a worker is forked from it is decided
    by the platform vLLM resolves."""
    try:
        return "cpu" in importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False


def start_forkserver() -> None:
    """Start (once per process) multiprocessing's forkserver with :data:`WORKER_PRELOAD`; returns at once (the
    forkserver imports while this process goes on)."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(WORKER_PRELOAD))
    multiprocessing.forkserver.ensure_running()


def run_with_environ(environ: dict[str, str], target: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """In a forked worker: take the starting process's environment (as a spawned process would have it), then run
    ``target``. A forkserver child otherwise has the forkserver's environment of when it started, without what vLLM
    set since (its CPU platform sets ``OMP_NUM_THREADS`` and others while the engine's config is made)."""
    os.environ.clear()
    os.environ.update(environ)
    return target(*args, **kwargs)


class ForkedWorkers:
    """A ``multiprocessing`` context of start method ``forkserver`` whose ``Process`` runs its target through
    :func:`run_with_environ` with this process's environment at the time the process is made; everything else
    (``Pipe``, ``Lock``, ...) is the forkserver context's."""

    def __init__(self) -> None:
        self._ctx = multiprocessing.get_context("forkserver")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def Process(self, group: None = None, target: Callable[..., Any] | None = None, name: str | None = None,  # noqa: N802
                args: tuple = (), kwargs: dict | None = None, *, daemon: bool | None = None) -> Any:
        """``multiprocessing.Process``'s signature; ``target`` runs under :func:`run_with_environ`."""
        return self._ctx.Process(group, run_with_environ, name, (dict(os.environ), target, *args), kwargs or {},
                                 daemon=daemon)


@contextlib.contextmanager
def workers_forked():
    """While inside: vLLM's multiproc executor starts its workers from the forkserver (:class:`ForkedWorkers`,
    started here when it was not yet). vLLM 0.16's ``MultiprocExecutor`` asks
    ``vllm.v1.executor.multiproc_executor.get_mp_context()`` for its context (the CPU platform makes that spawn);
    that name is replaced, and restored when the last concurrent construction leaves."""
    from vllm.v1.executor import multiproc_executor as mpe

    start_forkserver()
    with _MP_PATCH_LOCK:
        if _MP_PATCH[0] == 0:
            _MP_PATCH[1] = mpe.get_mp_context
            mpe.get_mp_context = ForkedWorkers
        _MP_PATCH[0] += 1
    try:
        yield
    finally:
        with _MP_PATCH_LOCK:
            _MP_PATCH[0] -= 1
            if _MP_PATCH[0] == 0:
                mpe.get_mp_context = _MP_PATCH[1]
                _MP_PATCH[1] = None
