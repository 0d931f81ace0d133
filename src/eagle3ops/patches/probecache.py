"""Content-addressed cache of passed probe results (``eagle3ops patch probe --result-cache DIR``).

A probe's pass is reused only when everything it could have read is byte-identical to the run that passed. The
key of probe ``P`` is the sha256 of a canonical JSON record (:func:`probe_key_inputs`) of:

* the probe's name and the probe registry's module name;
* **the probe code**: sha256 of every source file of the registry's top-level package (all of ``eagle3ops`` for
  ``eagle3ops.patches.probes``) and of the probes' fixtures package (:mod:`eagle3ops.patches.fixtures`: the
  top-level package of the module it loads, ``eagle3ops`` itself for the default :mod:`eagle3ops.fixtures`, the
  tiny-model builders the probes use);
* **the patched code**: for every package with an eagle3ops patch manifest in the site dir (speculators today),
  the sha256 of every file of its installed, patched tree (``__pycache__``/``*.pyc`` excepted) -- the files the
  patches produced, not the patch files: a DEP-3 header edit or a refresh that only moves line offsets leaves them
  identical, and any change to the patched code changes them;
* **the environment**: Python version and executable, platform, CPU model and flags, the name, version and
  sha256 of the ``RECORD`` (per-file hashes) of every installed distribution on ``sys.path`` (vLLM, torch,
  transformers, ...), the environment variables that steer them (``VLLM_*``, ``OMP_*``, ``HF_*``, ...);
* a **salt** given by the caller: the image build passes the base image's registry digest or image id, which
  covers what the Python metadata does not (system libraries), and a hash of every input of the image's layers
  below the patch step (``eagle3ops.images.probe_key_salt``).

Granularity: the key covers the whole patched tree, not the subset of files a probe executes. With the speculators
series every probe goes through ``VllmHiddenStatesGenerator`` and the worker extension -- the two files every patch
edits -- inside vLLM worker processes that are spawned, so a narrower per-probe file set would need tracing across
processes and would select every probe for any code change anyway.

Only passes are stored; a failed or crashed probe is never cached, so it re-runs (and fails) on every build.
An entry is used only if it parses, names the same key and probe, and records ``ok``; anything else is a miss.
Entries are written atomically (temp file + rename), so concurrent builds sharing the directory (a BuildKit cache
mount) never read half an entry.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata as md
import importlib.util
import json
import os
import platform
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3ops.patches.apply import MANIFEST_DIR, PROBE_RECORD_SUFFIX
from eagle3ops.patches.digests import cpu_info as _cpu
from eagle3ops.patches.digests import tree_digest

__all__ = ["ENV_PREFIXES", "ProbeResultCache", "code_digest", "environment_fingerprint", "patched_trees",
           "probe_key", "probe_key_inputs", "tree_digest"]

SCHEMA = 1
#: Environment variables (by prefix or exact name) that can change what a probe observes.
ENV_PREFIXES = ("VLLM_", "CUDA_", "NVIDIA_", "TORCH", "PYTORCH_", "OMP_", "KMP_", "MKL_", "HF_", "TRANSFORMERS_",
                "TOKENIZERS_", "EAGLE3OPS_", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHASHSEED")
#: Variables with those prefixes that only say where things go, not what a probe does.
ENV_IGNORED = frozenset({"EAGLE3OPS_PROBE_CACHE", "EAGLE3OPS_FIXTURES_CACHE"})


def code_digest(module: str) -> str:
    """sha256 over the source files of ``module``'s top-level package (all of ``eagle3ops`` for
    ``eagle3ops.patches.probes``; the module file alone for a top-level module) and of the probes' fixtures
    package (:func:`eagle3ops.patches.fixtures.module_name`'s top-level package, ``eagle3ops`` for the default
    :mod:`eagle3ops.fixtures`: the tiny models the probes build; a ``missing`` marker when it cannot be found).

    Raises:
        ModuleNotFoundError: ``module`` cannot be found on ``sys.path``.
    """
    from eagle3ops.patches.fixtures import module_name

    h = hashlib.sha256(_package_digest(module).encode())
    try:
        h.update(f"fixtures {_package_digest(module_name())}".encode())
    except ModuleNotFoundError:
        h.update(f"fixtures missing {module_name()}".encode())
    return h.hexdigest()


def _package_digest(module: str) -> str:
    """sha256 over the source files of ``module``'s top-level package (see :func:`code_digest`)."""
    top = module.split(".", 1)[0]
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise ModuleNotFoundError(f"probe registry {module}: package {top} not found")
    if spec.submodule_search_locations:
        roots = [Path(p) for p in spec.submodule_search_locations]
        h = hashlib.sha256()
        for r in roots:
            h.update(tree_digest(r.parent, [r.name]).encode())
        return h.hexdigest()
    if spec.origin is None:
        raise ModuleNotFoundError(f"probe registry {module}: {top} has no source file")
    origin = Path(spec.origin)
    return tree_digest(origin.parent, [origin.name])


def _distributions() -> list[list[str]]:
    out = set()
    for dist in md.distributions():
        name = (dist.metadata["Name"] or "?") if dist.metadata else "?"
        record = dist.read_text("RECORD")
        if record is None:  # egg-info or a system package: its file list stands in
            record = (dist.read_text("SOURCES.txt") or "") + (dist.read_text("installed-files.txt") or "")
        loc = getattr(dist, "_path", None)
        out.add((name.lower(), dist.version or "?", hashlib.sha256(record.encode()).hexdigest(),
                 str(loc.parent) if loc is not None else "?"))
    return [list(t) for t in sorted(out)]


def environment_fingerprint() -> dict[str, Any]:
    """What the probes run on: interpreter, platform, CPU, installed distributions, steering env vars.

    Returns a JSON-able dict: ``python`` (``sys.version``), ``executable``, ``platform``, ``cpu`` (model, sorted
    flags, count), ``distributions`` (``[name, version, sha256 of RECORD, location]`` sorted), ``env``.
    """
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith(ENV_PREFIXES) and k not in ENV_IGNORED}
    return {
        "python": sys.version,
        "executable": os.path.realpath(sys.executable),
        "platform": platform.platform(),
        "cpu": _cpu(),
        "distributions": _distributions(),
        "env": env,
    }


def patched_trees(site_dir: Path) -> dict[str, str]:
    """``{package: tree digest}`` for every package of ``site_dir`` that has an eagle3ops patch manifest.

    The digest covers the package's whole installed tree (its top-level dirs from the dist's RECORD).
    """
    from eagle3ops.patches.installed import find_dist

    out: dict[str, str] = {}
    for m in sorted((site_dir / MANIFEST_DIR).glob("*.json")):
        if m.name.endswith((PROBE_RECORD_SUFFIX, ".verify.json")):  # the probe run's own record (old name too)
            continue
        pkg = m.stem
        dist = find_dist(pkg, site_dir)
        out[pkg] = tree_digest(dist.site_dir, list(dist.top_levels))
    return out


def probe_key_inputs(probe: str, probes_module: str, *, trees: dict[str, str], environment: dict[str, Any],
                     probes_code: str, salt: str = "") -> dict[str, Any]:
    """The JSON record hashed into a probe's cache key (see the module doc). All arguments are digests or
    JSON-able values computed once per probe run."""
    return {
        "schema": SCHEMA,
        "probe": probe,
        "probes_module": probes_module,
        "probes_code": probes_code,
        "patched_trees": dict(sorted(trees.items())),
        "environment": environment,
        "salt": salt,
    }


def probe_key(inputs: dict[str, Any]) -> str:
    """sha256 (hex) of the canonical JSON of :func:`probe_key_inputs`' record."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass
class ProbeResultCache:
    """Passed probe results under ``directory`` (one ``<key>.json`` per pass)."""

    directory: Path

    def get(self, key: str, probe: str) -> dict[str, Any] | None:
        """The stored pass for ``key``, or None (absent, unreadable, or not a pass of ``probe`` under ``key``)."""
        path = self.directory / f"{key}.json"
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(rec, dict) or rec.get("key") != key or rec.get("probe") != probe or rec.get("ok") is not True:
            return None
        if rec.get("schema") != SCHEMA:
            return None
        return rec

    def put(self, key: str, probe: str, *, patch: str, seconds: float, inputs: dict[str, Any]) -> Path:
        """Store a pass of ``probe`` under ``key`` (atomic write). Returns the entry's path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        rec = {
            "schema": SCHEMA,
            "key": key,
            "probe": probe,
            "patch": patch,
            "ok": True,
            "seconds": round(seconds, 3),
            "passed_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "inputs": {k: v for k, v in inputs.items() if k != "environment"},
            "environment_sha256": probe_key({"environment": inputs["environment"]}),
        }
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(rec, f, indent=1, sort_keys=True)
        path = self.directory / f"{key}.json"
        os.replace(tmp, path)
        return path
