"""The behavioural probes' model fixtures: the one seam between the product's probes and the development harness.

The probes (:mod:`.probes`, :mod:`.specprobes`, :mod:`.kimiprobe`) run the installed, patched code on tiny,
locally built models: random targets of several architectures and random EAGLE-3 heads. Their builders are
development harness (:mod:`eagle3ops_dev.tinymodel`, :mod:`eagle3ops_dev.tinydraft`), which the product never
imports (import contract). The probes reach them only through this module, which loads an implementation of
:class:`ProbeFixtures` *by name* with :mod:`importlib`: :data:`DEFAULT_MODULE`, or the module named by the
environment variable :data:`ENV` (a test or another harness may supply its own).

Where the default implementation is importable: the driver venv (``scripts/setup.sh``'s ``eagle3ops-dev.pth``),
the pipeline image (the Dockerfile copies ``src/eagle3ops_dev`` to ``/opt/eagle3ops/dev`` and puts it on the
interpreter's path), and containers that mount this checkout's ``src`` first on ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["DEFAULT_MODULE", "ENV", "FixturesMissing", "ProbeFixtures", "load", "module_name"]

#: The implementation loaded unless :data:`ENV` names another module.
DEFAULT_MODULE = "eagle3ops_dev.fixtures"
#: Environment variable naming the implementation module (``package.module``).
ENV = "EAGLE3OPS_PROBE_FIXTURES"


class FixturesMissing(RuntimeError):
    """The fixtures module cannot be imported or lacks the protocol's functions; the message says how to fix it."""


@runtime_checkable
class ProbeFixtures(Protocol):
    """What the probes need from their fixtures (a module with these two functions satisfies it)."""

    def build_target(self, out_dir: Path, kind: str, seed: int = 0) -> Path:
        """Build a tiny random target of ``kind`` (``llama``, ``llama-remote-code``, ``deepseek-v3``,
        ``kimi-k25``) into the new or empty ``out_dir`` (bf16 safetensors, tokenizer, configs); return it.
        Raises ValueError for an unknown kind, FileExistsError for a non-empty ``out_dir``."""
        ...

    def build_draft(self, out_dir: Path, target_dir: Path, *, draft_vocab: Sequence[int] | None = None,
                    seed: int = 0, aux_layer_ids: Sequence[int] | None = None) -> Path:
        """Build a random Llama-style EAGLE-3 head for the target at ``target_dir`` into ``out_dir`` (float32;
        ``draft_vocab`` target ids as ``d2t`` offsets, ``aux_layer_ids`` as the aux hidden-state layers); return it."""
        ...


def module_name() -> str:
    """The implementation's module name: ``$EAGLE3OPS_PROBE_FIXTURES`` when set and not empty, else
    :data:`DEFAULT_MODULE`."""
    return os.environ.get(ENV, "").strip() or DEFAULT_MODULE


def load(module: str | None = None) -> ProbeFixtures:
    """Import the fixtures module (``module``, else :func:`module_name`) and return it.

    Raises:
        FixturesMissing: it cannot be imported (the message says where the default one must be installed) or it
            lacks ``build_target`` / ``build_draft``.
    """
    name = module or module_name()
    try:
        mod = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise FixturesMissing(
            f"probe fixtures module {name!r} cannot be imported ({exc}); the probes build their tiny models with it. "
            f"The pipeline image carries {DEFAULT_MODULE} under /opt/eagle3ops/dev (Dockerfile); in a checkout run "
            f"`bash scripts/setup.sh` (eagle3ops-dev.pth) or put its src/ on PYTHONPATH; or set {ENV} to a module "
            f"that provides build_target and build_draft") from exc
    missing = [f for f in ("build_target", "build_draft") if not callable(getattr(mod, f, None))]
    if missing:
        raise FixturesMissing(f"probe fixtures module {name!r} lacks {', '.join(missing)} (see "
                              f"eagle3ops.patches.fixtures.ProbeFixtures)")
    return mod  # type: ignore[return-value]
