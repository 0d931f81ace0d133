"""``eagle3ops patch verify``: run the behavioural probe of every applied patch.

The patches to verify come from the manifest ``apply`` wrote (``<site>/eagle3ops_patches/<package>.json``), so
verify needs neither the patch files nor the repository. First each touched file's sha256 is compared with the one
recorded at apply time (a file edited since is reported), then each patch's probe is looked up in the probe
registry ``eagle3ops.patches.probes.PROBES`` (imported lazily: probes import torch/vLLM inside their body) and
called. A probe passes by returning None; it fails by raising ``ProbeFailed`` (or any other exception, reported with
its type). Nothing is judged from log text.

The registry can be replaced by another module exposing ``PROBES`` (``--probes-module``); the fault tests use this
to inject a failing probe.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from eagle3ops.patches.apply import file_sha256, read_manifest
from eagle3ops.patches.errors import ProbeError

DEFAULT_PROBES_MODULE = "eagle3ops.patches.probes"


@dataclass
class ProbeOutcome:
    """Outcome of one patch's probe: ``ok``; ``detail`` is the ProbeFailed message or the exception."""

    patch: str
    probe: str
    ok: bool
    detail: str = ""


def load_probes(module: str = DEFAULT_PROBES_MODULE) -> Mapping[str, Callable[[], None]]:
    """Import ``module`` and return its ``PROBES`` dict.

    Raises:
        ProbeError: the module cannot be imported or has no ``PROBES`` mapping.
    """
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure means probes cannot run here
        raise ProbeError(f"cannot import probe registry {module}: {type(e).__name__}: {e}", fix="run verify where the patched package and its dependencies are installed")
    probes = getattr(mod, "PROBES", None)
    if not isinstance(probes, Mapping):
        raise ProbeError(f"{module} has no PROBES mapping", fix="define PROBES: dict[str, Callable[[], None]]")
    return probes


def _probe_failed_type(module: str) -> type[BaseException] | None:
    try:
        return getattr(importlib.import_module(module), "ProbeFailed", None)
    except Exception:  # noqa: BLE001
        return None


def verify_installed(
    site_dir: Path,
    package: str,
    *,
    probes: Mapping[str, Callable[[], None]] | None = None,
    probes_module: str = DEFAULT_PROBES_MODULE,
    only: list[str] | None = None,
) -> tuple[list[str], list[ProbeOutcome]]:
    """Check files against the manifest, then run each applied patch's probe.

    Args:
        site_dir: site dir of the installed package (holds ``eagle3ops_patches/``).
        package: distribution name.
        probes: the registry to use (default: ``PROBES`` of ``probes_module``).
        only: restrict to these patch names.

    Returns:
        (files changed since apply, one :class:`ProbeOutcome` per patch). Unknown probe names are failed outcomes.

    Raises:
        PatchToolError: no manifest; ProbeError: registry not importable.
    """
    manifest = read_manifest(site_dir, package)
    changed = [f for f, sha in manifest.get("files_sha256", {}).items() if file_sha256(site_dir / f) != sha]
    registry = probes if probes is not None else load_probes(probes_module)
    failed_type = _probe_failed_type(probes_module)
    outcomes: list[ProbeOutcome] = []
    for entry in manifest["patches"]:
        name, probe = entry["name"], entry["probe"]
        if only and name not in only:
            continue
        fn = registry.get(probe)
        if fn is None:
            outcomes.append(ProbeOutcome(name, probe, False, f"unknown probe {probe!r} (registry has: {', '.join(sorted(registry)) or 'nothing'})"))
            continue
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - any failure of a probe is a failed verification
            if isinstance(e, KeyboardInterrupt):
                raise
            if failed_type is not None and isinstance(e, failed_type):
                detail = f"ProbeFailed: {e}"
            else:
                tb = traceback.extract_tb(e.__traceback__)
                loc = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
                detail = f"probe crashed: {type(e).__name__}: {e}{loc}"
            outcomes.append(ProbeOutcome(name, probe, False, detail))
            continue
        outcomes.append(ProbeOutcome(name, probe, True))
    return changed, outcomes
