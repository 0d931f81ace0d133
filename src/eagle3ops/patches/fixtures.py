"""The behavioural probes' model fixtures: the seam between the probes and the tiny models they build.

The probes (:mod:`.probes`, :mod:`.specprobes`, :mod:`.kimiprobe`) run the installed, patched code on tiny,
locally built models: random targets of several architectures and random EAGLE-3 heads. Their builders are the
product package :mod:`eagle3ops.fixtures` (:mod:`eagle3ops.fixtures.tinymodel`, :mod:`eagle3ops.fixtures.tinydraft`),
shipped in the eagle3ops wheel and therefore in the pipeline image, where the probes run at build time and on a
target host (``eagle3ops probe HOST``). The probes reach them only through this module, which loads an
implementation of :class:`ProbeFixtures` *by name* with :mod:`importlib`: :data:`DEFAULT_MODULE`, or the module
named by the environment variable :data:`ENV` (a test may supply its own).

Built once per content hash: :func:`target` hands the probes a ready tiny target. With a cache directory
(:data:`CACHE_ENV`, the image build's BuildKit cache mount) it is built once per key (:func:`target_key_inputs`:
the kind and seed, every file of the fixtures package, the interpreter, platform and CPU, and every installed
distribution the builders could import) and reused from there, so a patch edit -- which changes none of these --
re-runs the probes on the same models without building them again. Without one it is built into the caller's
scratch directory as before.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata as md
import importlib.util
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["CACHE_ENV", "DEFAULT_MODULE", "ENV", "FixturesMissing", "ProbeFixtures", "cache_dir", "load",
           "module_name", "target", "target_key", "target_key_inputs"]

#: The implementation loaded unless :data:`ENV` names another module.
DEFAULT_MODULE = "eagle3ops.fixtures"
#: Environment variable naming the implementation module (``package.module``).
ENV = "EAGLE3OPS_PROBE_FIXTURES"
#: Environment variable naming the directory where tiny targets are kept by content hash (unset: no cache).
CACHE_ENV = "EAGLE3OPS_FIXTURES_CACHE"
#: Version of the cache entry layout and key record; a new one misses every older entry.
CACHE_SCHEMA = 1
#: The record inside each cache entry: the key, its inputs and the sha256 of every file the builder wrote.
ENTRY_RECORD = ".eagle3ops-fixture.json"


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


# ------------------------------------------------------------------------------------- built once per content hash


def cache_dir() -> Path | None:
    """The fixture cache directory: ``$EAGLE3OPS_FIXTURES_CACHE`` when set and not empty, else None (no cache)."""
    value = os.environ.get(CACHE_ENV, "").strip()
    return Path(value) if value else None


def _module_files_digest(module: str) -> tuple[str, str]:
    """(top-level package, sha256 over the files of ``module``'s own package dir or module file).

    Only the fixtures module's own package is hashed, not the whole top-level package: the default fixtures
    import nothing of eagle3ops outside :mod:`eagle3ops.fixtures` (``tests/test_dev_harness.py`` checks it), so an
    eagle3ops change elsewhere keeps their key."""
    from eagle3ops.patches.digests import tree_digest

    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise FixturesMissing(f"probe fixtures module {module!r} cannot be found; unset {ENV} or install it")
    origin = Path(spec.origin)
    if spec.submodule_search_locations:
        root = origin.parent
        digest = tree_digest(root.parent, [root.name])
    else:
        digest = tree_digest(origin.parent, [origin.name])
    return module.split(".", 1)[0], digest


@functools.lru_cache(maxsize=None)
def _builder_distributions(exclude_top: str) -> tuple[tuple[str, str, str], ...]:
    """``(name, version, sha256 of RECORD)`` of every installed distribution but the fixtures' own (its code is
    hashed file by file): torch, transformers, tokenizers, safetensors, tiktoken, ... whatever the builders
    import. A patch series edits installed files without touching any ``RECORD``, so patching keeps the key.
    Read once per process (scanning every distribution's metadata takes ~0.5 s)."""
    owners = {d.lower() for d in md.packages_distributions().get(exclude_top, [])}
    out = set()
    for dist in md.distributions():
        name = ((dist.metadata["Name"] if dist.metadata else None) or "?").lower()
        if name in owners:
            continue
        record = dist.read_text("RECORD")
        if record is None:  # egg-info or a system package: its file list stands in
            record = (dist.read_text("SOURCES.txt") or "") + (dist.read_text("installed-files.txt") or "")
        out.add((name, dist.version or "?", hashlib.sha256(record.encode()).hexdigest()))
    return tuple(sorted(out))


def target_key_inputs(kind: str, seed: int = 0, module: str | None = None) -> dict[str, Any]:
    """The JSON record hashed into a tiny target's cache key: schema, kind, seed, the fixtures module and the
    digest of its package's files, the interpreter (``sys.version``), platform, CPU model and flags, and the
    distributions the builders could import (:func:`_builder_distributions`). The patched packages' files are
    not in it: the builders never import them, so a patch edit keeps every key.

    Raises:
        FixturesMissing: the fixtures module cannot be found.
    """
    from eagle3ops.patches.digests import cpu_info

    name = module or module_name()
    top, digest = _module_files_digest(name)
    return {
        "schema": CACHE_SCHEMA,
        "kind": kind,
        "seed": seed,
        "module": name,
        "module_files": digest,
        "python": sys.version,
        "platform": platform.platform(),
        "cpu": cpu_info(),
        "distributions": [list(t) for t in _builder_distributions(top)],
    }


def target_key(inputs: dict[str, Any]) -> str:
    """sha256 (hex) of the canonical JSON of :func:`target_key_inputs`' record."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _file_hashes(root: Path) -> dict[str, str]:
    from eagle3ops.patches.wheels import sha256_file

    return {p.relative_to(root).as_posix(): sha256_file(p) for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ENTRY_RECORD and "__pycache__" not in p.parts}


def _entry_ok(entry: Path, key: str) -> bool:
    """The entry is complete and unchanged: its record names ``key`` and every file has the recorded sha256 (and
    no file was added)."""
    try:
        rec = json.loads((entry / ENTRY_RECORD).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(rec, dict) and rec.get("key") == key and rec.get("files") == _file_hashes(entry)


#: How the last :func:`target` call per kind got its model: ``built``, ``reused`` or ``scratch`` (no cache).
LAST_SOURCE: dict[str, str] = {}


def target(kind: str, scratch: Path, *, seed: int = 0, cache: Path | None = None) -> Path:
    """A ready tiny target of ``kind``: from the fixture cache when it holds one under the same key, else built.

    Args:
        kind: a :meth:`ProbeFixtures.build_target` kind.
        scratch: where to build when there is no cache (``scratch/<kind>``, reused when it already holds a
            ``config.json``).
        seed: the builder's seed.
        cache: the cache directory (default :func:`cache_dir`); None and no ``$EAGLE3OPS_FIXTURES_CACHE``: no cache.

    Returns:
        the model directory: ``<cache>/targets/<key>`` (read it, never write into it: its files are checked
        against the entry's record on every use, and an entry that differs is built again) or ``scratch/<kind>``.

    Raises:
        FixturesMissing: the fixtures module cannot be loaded; whatever its builder raises (ValueError for an
        unknown kind).
    """
    cache = cache if cache is not None else cache_dir()
    if cache is None:
        out = scratch / kind
        if not (out / "config.json").exists():
            shutil.rmtree(out, ignore_errors=True)
            load().build_target(out, kind, seed=seed)
        LAST_SOURCE[kind] = "scratch"
        return out
    inputs = target_key_inputs(kind, seed)
    key = target_key(inputs)
    entry = cache / "targets" / key
    if _entry_ok(entry, key):
        LAST_SOURCE[kind] = "reused"
        return entry
    (cache / "targets").mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache / "targets", prefix=f".tmp-{kind}-"))
    try:
        built = tmp / "model"
        load().build_target(built, kind, seed=seed)
        (built / ENTRY_RECORD).write_text(json.dumps(
            {"key": key, "inputs": inputs, "files": _file_hashes(built)}, indent=1, sort_keys=True))
        if entry.exists():  # a damaged entry (checked above), or one a concurrent build just finished
            if _entry_ok(entry, key):
                LAST_SOURCE[kind] = "reused"
                return entry
            shutil.rmtree(entry, ignore_errors=True)
        try:
            os.rename(built, entry)  # atomic: readers see a complete entry or none
        except OSError:
            if not _entry_ok(entry, key):  # lost a race to a complete entry is fine; anything else is not
                raise
            logging.getLogger(__name__).debug("fixture %s: a concurrent build stored the same entry", kind)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    LAST_SOURCE[kind] = "built"
    return entry
