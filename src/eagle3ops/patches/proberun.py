"""``eagle3ops patch probe``: verify the applied files, then run the behavioural probe of every applied patch.

(Named for its job: a *probe* runs the patched code on tiny input and compares its behaviour with a reference; the
module was ``patches/verify.py`` and the command ``patch verify`` before the words got one meaning each, see
ARCHITECTURE.md "Conventions".)

The patches to probe come from the manifest ``apply`` wrote (``<site>/eagle3ops_patches/<package>.json``), so
this needs neither the patch files nor the repository. First the verify step (:func:`verify_files`): each touched
file's sha256 is compared with the one recorded at apply time (a file edited since is reported); then each patch's
probe is looked up in the probe
registry ``eagle3ops.patches.probes.PROBES`` (imported lazily: probes import torch/vLLM inside their body) and
called. A probe passes by returning None; it fails by raising ``ProbeFailed`` (or any other exception, reported with
its type). Nothing is judged from log text.

The registry can be replaced by another module exposing ``PROBES`` (``--probes-module``); the fault tests use this
to inject a failing probe. A registry may also expose ``prepare(names)``: called once with the probes about to run
(after cache hits are removed) so that it can start what they share (``eagle3ops.patches.probes`` starts the
vLLM engines they need, concurrently); an exception there is left for the probes themselves to report. Before
that, a registry's ``warm(names)`` is called with the same names as soon as they are known -- before the caller's
``before_probes`` (the image build's import check) -- so that what the engines share can start while this process
imports the patched stack (``eagle3ops.patches.probes``: the forkserver the engines' workers are forked from). A
registry's ``finish()`` (else ``shutdown()``), if any, is called once the probes have run (it stops those engines).

With a result cache (:mod:`eagle3ops.patches.probecache`, ``--result-cache DIR``) a probe whose content key --
probe code, every byte of the patched package trees, the installed distributions, the platform and a caller salt
-- matches a stored pass is reported as reused instead of run; only passes are stored.
"""

from __future__ import annotations

import importlib
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3ops.patches.apply import file_sha256, read_manifest
from eagle3ops.patches.errors import ProbeError

if TYPE_CHECKING:
    from eagle3ops.patches import probecache

DEFAULT_PROBES_MODULE = "eagle3ops.patches.probes"
#: Phases of the last :func:`probe_installed` call, seconds: ``keys`` (hashing the cache inputs), ``before``
#: (the caller's ``before_probes``: the import check), ``prepare`` (the registry's prepare hook: engine starts),
#: ``probes`` (probe bodies), ``shutdown`` (the registry's shutdown).
LAST_TIMINGS: dict[str, float] = {}


@dataclass
class ProbeOutcome:
    """Outcome of one patch's probe.

    Attributes:
        ok: the probe passed (now, or -- ``reused`` -- in an earlier run with the same content key).
        detail: the ProbeFailed message or the exception (failures); for a reused pass, when it passed.
        reused: the pass came from the result cache (the probe did not run in this process).
        key: the probe's content key (sha256 hex) when a result cache was used, else "".
        seconds: wall time of the probe in this run (0 for a reused pass; the first probe on an engine includes
            the engine's start).
    """

    patch: str
    probe: str
    ok: bool
    detail: str = ""
    reused: bool = False
    key: str = ""
    seconds: float = 0.0


def load_probes(module: str = DEFAULT_PROBES_MODULE) -> Mapping[str, Callable[[], None]]:
    """Import ``module`` and return its ``PROBES`` dict.

    Raises:
        ProbeError: the module cannot be imported or has no ``PROBES`` mapping.
    """
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure means probes cannot run here
        raise ProbeError(f"cannot import probe registry {module}: {type(e).__name__}: {e}", fix="run the probes where the patched package and its dependencies are installed")
    probes = getattr(mod, "PROBES", None)
    if not isinstance(probes, Mapping):
        raise ProbeError(f"{module} has no PROBES mapping", fix="define PROBES: dict[str, Callable[[], None]]")
    return probes


def _probe_failed_type(module: str) -> type[BaseException] | None:
    try:
        return getattr(importlib.import_module(module), "ProbeFailed", None)
    except Exception:  # noqa: BLE001
        return None


def verify_files(site_dir: Path, package: str) -> list[str]:
    """The verify step: each file ``apply`` touched, compared by sha256 with the manifest's record.

    Returns:
        the files (relative to ``site_dir``) whose bytes differ from the manifest, or that are missing.

    Raises:
        PatchToolError: no manifest for ``package`` in ``site_dir``.
    """
    manifest = read_manifest(site_dir, package)
    return [f for f, sha in manifest.get("files_sha256", {}).items() if file_sha256(site_dir / f) != sha]


def _probe_keys(site_dir: Path, entries: list[dict], probes_module: str, salt: str) -> dict[str, tuple[str, dict]]:
    """Each probe's content key and the inputs it hashes (:mod:`eagle3ops.patches.probecache`)."""
    from eagle3ops.patches import probecache

    trees = probecache.patched_trees(site_dir)
    environment = probecache.environment_fingerprint()
    code = probecache.code_digest(probes_module)
    keys: dict[str, tuple[str, dict]] = {}
    for e in entries:
        inputs = probecache.probe_key_inputs(e["probe"], probes_module, trees=trees, environment=environment,
                                             probes_code=code, salt=salt)
        keys[e["probe"]] = (probecache.probe_key(inputs), inputs)
    return keys


def _call_hook(hook: Callable | None) -> None:
    """A registry's ``prepare``/``finish`` hook, its failure ignored (the probes report what failed to start; a
    failing cleanup does not change decided outcomes)."""
    if hook is None:
        return
    try:
        hook()
    except Exception:  # noqa: BLE001 - see the docstring
        pass


def _run_one(name: str, probe: str, fn: Callable[[], None], key: str, failed_type: type | None) -> ProbeOutcome:
    """One probe run: passed, failed (its ``ProbeFailed`` message) or crashed (the exception and where)."""
    t0 = time.monotonic()
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - any failure of a probe is a failed probe
        if isinstance(e, KeyboardInterrupt):
            raise
        if failed_type is not None and isinstance(e, failed_type):
            detail = f"ProbeFailed: {e}"
        else:
            tb = traceback.extract_tb(e.__traceback__)
            loc = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
            detail = f"probe crashed: {type(e).__name__}: {e}{loc}"
        return ProbeOutcome(name, probe, False, detail, key=key, seconds=time.monotonic() - t0)
    return ProbeOutcome(name, probe, True, key=key, seconds=time.monotonic() - t0)


def _run_probes(entries: list[dict], registry: Mapping[str, Callable[[], None]], hits: dict[str, dict],
                keys: dict[str, tuple[str, dict]], failed_type: type | None
                ) -> tuple[list[ProbeOutcome], dict[str, ProbeOutcome]]:
    """One outcome per patch, in order: a cached pass reused, a probe two patches name run once, an unknown probe
    failed; returns (outcomes, the outcome of each probe that ran)."""
    outcomes: list[ProbeOutcome] = []
    done: dict[str, ProbeOutcome] = {}
    for entry in entries:
        name, probe = entry["name"], entry["probe"]
        key = keys.get(probe, ("", {}))[0]
        if probe in hits:
            outcomes.append(ProbeOutcome(name, probe, True, f"passed {hits[probe].get('passed_at', '?')}",
                                         reused=True, key=key))
        elif probe in done:  # two patches naming one probe: it ran once
            prev = done[probe]
            outcomes.append(ProbeOutcome(name, probe, prev.ok, prev.detail, key=key))
        elif registry.get(probe) is None:
            outcomes.append(ProbeOutcome(name, probe, False, f"unknown probe {probe!r} (registry has: "
                                                             f"{', '.join(sorted(registry)) or 'nothing'})"))
        else:
            done[probe] = _run_one(name, probe, registry[probe], key, failed_type)
            outcomes.append(done[probe])
    return outcomes, done


def probe_installed(
    site_dir: Path,
    package: str,
    *,
    probes: Mapping[str, Callable[[], None]] | None = None,
    probes_module: str = DEFAULT_PROBES_MODULE,
    only: list[str] | None = None,
    result_cache: Path | None = None,
    fresh: bool = False,
    salt: str = "",
    before_probes: Callable[[], object] | None = None,
) -> tuple[list[str], list[ProbeOutcome]]:
    """Verify the files against the manifest (:func:`verify_files`), then run each applied patch's probe (or reuse
    a cached pass).

    Args:
        site_dir: site dir of the installed package (holds ``eagle3ops_patches/``).
        package: distribution name.
        probes: the registry to use (default: ``PROBES`` of ``probes_module``).
        only: restrict to these patch names.
        result_cache: directory of the content-addressed probe-result cache, or None (every probe runs).
        fresh: with ``result_cache``: run every probe anyway (passes are still stored).
        salt: extra key material (the image build passes the base image's digest or id).
        before_probes: called once the probes to run are known and the registry's ``warm`` hook has had them, before
            any probe or engine starts (the image build's import check); what it raises propagates.

    Returns:
        (files changed since apply, one :class:`ProbeOutcome` per patch). Unknown probe names are failed outcomes.
        Nothing is reused while a patched file differs from the manifest (the files-changed list is non-empty).

    Raises:
        PatchToolError: no manifest; ProbeError: registry not importable; ValueError: ``probes`` given together
        with ``result_cache`` (the key hashes the code of ``probes_module``, which would not be what runs).
    """
    if probes is not None and result_cache is not None:
        raise ValueError("result_cache needs the registry from probes_module (its code is part of every key)")
    manifest = read_manifest(site_dir, package)
    changed = verify_files(site_dir, package)
    registry = probes if probes is not None else load_probes(probes_module)
    failed_type = _probe_failed_type(probes_module)
    t_start = time.monotonic()
    entries = [e for e in manifest["patches"] if not only or e["name"] in only]
    cache = None
    keys: dict[str, tuple[str, dict]] = {}
    if result_cache is not None:
        from eagle3ops.patches import probecache

        cache = probecache.ProbeResultCache(Path(result_cache))
        keys = _probe_keys(site_dir, entries, probes_module, salt)
    LAST_TIMINGS.clear()
    LAST_TIMINGS["keys"] = time.monotonic() - t_start
    hits: dict[str, dict] = {}
    if cache is not None and not fresh and not changed:
        hits = {probe: rec for probe, (key, _) in keys.items() if (rec := cache.get(key, probe)) is not None}
    to_run = [e["probe"] for e in entries if e["probe"] not in hits and e["probe"] in registry]
    warm = _registry_hook(probes_module, "warm") if probes is None else None
    if warm is not None and to_run:
        _call_hook(lambda: warm(list(dict.fromkeys(to_run))))
    t0 = time.monotonic()
    if before_probes is not None:
        before_probes()
    LAST_TIMINGS["before"] = time.monotonic() - t0
    prepare = _registry_hook(probes_module, "prepare") if probes is None else None
    t0 = time.monotonic()
    if prepare is not None and to_run:
        _call_hook(lambda: prepare(list(dict.fromkeys(to_run))))
    LAST_TIMINGS["prepare"] = time.monotonic() - t0
    t_probes = time.monotonic()
    outcomes, done = _run_probes(entries, registry, hits, keys, failed_type)
    LAST_TIMINGS["probes"] = time.monotonic() - t_probes
    t0 = time.monotonic()
    if probes is None and to_run:
        _call_hook(_registry_hook(probes_module, "finish") or _registry_hook(probes_module, "shutdown"))
    LAST_TIMINGS["shutdown"] = time.monotonic() - t0
    if cache is not None and keys and not changed:  # a pass is stored only when the patched files were as applied
        _store_passes(cache, keys, site_dir, outcomes, done)
    return changed, outcomes


def _store_passes(cache: probecache.ProbeResultCache, keys: dict[str, tuple[str, dict]], site_dir: Path, outcomes: list[ProbeOutcome],
                  done: dict[str, ProbeOutcome]) -> None:
    """Store each probe that ran and passed in the result ``cache`` under its
    key from ``keys`` (probe -> (key, key inputs)); ``done`` maps each probe that ran to its own outcome, so a
    reused pass or the copy a second patch naming one probe got is not stored twice.

    Nothing is stored when the patched trees changed while probing: the keys were computed before, so a pass would
    be filed under files it did not run against.
    """
    from eagle3ops.patches import probecache

    trees_before = next(iter(keys.values()))[1]["patched_trees"]
    if probecache.patched_trees(site_dir) == trees_before:
        for o in outcomes:
            if o.ok and not o.reused and o.probe in done and done[o.probe] is o:
                cache.put(o.key, o.probe, patch=o.patch, seconds=o.seconds, inputs=keys[o.probe][1])


def _registry_hook(module: str, name: str) -> Callable | None:
    try:
        hook = getattr(importlib.import_module(module), name, None)
    except Exception:  # noqa: BLE001
        return None
    return hook if callable(hook) else None
