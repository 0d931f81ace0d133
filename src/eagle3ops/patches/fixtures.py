"""The behavioural probes' model fixtures: the seam between the probes and the tiny models they build.

The probes (:mod:`.probes`, :mod:`.specprobes`, :mod:`.kimiprobe`) run the installed, patched code on tiny,
locally built models: random targets of several architectures and random EAGLE-3 heads. Their builders are the
product package :mod:`eagle3ops.fixtures` (:mod:`eagle3ops.fixtures.tinymodel`, :mod:`eagle3ops.fixtures.tinydraft`),
shipped in the eagle3ops wheel and therefore in the pipeline image, where the probes run at build time and on a
target host (``eagle3ops probe HOST``). The probes reach them only through this module, which loads an
implementation of :class:`ProbeFixtures` *by name* with :mod:`importlib`: :data:`DEFAULT_MODULE`, or the module
named by the environment variable :data:`ENV` (a test may supply its own).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["DEFAULT_MODULE", "ENV", "FixturesMissing", "ProbeFixtures", "load", "module_name"]

#: The implementation loaded unless :data:`ENV` names another module.
DEFAULT_MODULE = "eagle3ops.fixtures"
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
            f"{DEFAULT_MODULE} is part of the eagle3ops package (installed in the pipeline image; in a checkout run "
            f"`make setup`); unset {ENV} to use it, or set it to a module that provides build_target and "
            f"build_draft") from exc
    missing = [f for f in ("build_target", "build_draft") if not callable(getattr(mod, f, None))]
    if missing:
        raise FixturesMissing(f"probe fixtures module {name!r} lacks {', '.join(missing)} (see "
                              f"eagle3ops.patches.fixtures.ProbeFixtures)")
    return mod  # type: ignore[return-value]
