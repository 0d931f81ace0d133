"""The driver venv's lock (requirements/driver.lock) covers every dependency eagle3ops declares, hash-pinned."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
ENTRY = re.compile(r"^([A-Za-z0-9_.\-]+)==(\S+) \\$")


def _lock() -> dict[str, tuple[Version, int]]:
    """name -> (version, number of --hash lines) of requirements/driver.lock."""
    out: dict[str, tuple[Version, int]] = {}
    name = None
    for line in (REPO / "requirements/driver.lock").read_text().splitlines():
        m = ENTRY.match(line)
        if m:
            name = re.sub(r"[-_.]+", "-", m[1]).lower()
            out[name] = (Version(m[2]), 0)
        elif name and line.strip().startswith("--hash=sha256:"):
            v, n = out[name]
            out[name] = (v, n + 1)
    return out


def test_every_declared_driver_dependency_is_locked_with_hashes():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    lock = _lock()
    assert len(lock) > len(declared)  # the closure, not only the direct dependencies
    for spec in declared:
        req = Requirement(spec)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in lock, f"{req.name} is declared in pyproject.toml but missing from requirements/driver.lock"
        version, hashes = lock[name]
        assert version in req.specifier, f"{name}=={version} in the lock does not satisfy {spec}"
        assert hashes >= 1, f"{name} has no --hash in the lock"
    assert all(h >= 1 for _, h in lock.values())


def test_every_imported_third_party_module_is_declared():
    """``invoke`` was imported (remote.py) but not declared: scan the driver package's top-level imports."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {re.sub(r"[-_.]+", "-", Requirement(s).name).lower() for s in project["dependencies"]}
    module_to_dist = {"yaml": "pyyaml"}
    in_image_only = {"torch", "transformers", "vllm", "speculators", "safetensors", "tokenizers", "numpy",
                     "datasets", "huggingface_hub", "tiktoken", "pyarrow", "matplotlib", "accelerate"}
    seen: set[str] = set()
    for py in (REPO / "src/eagle3ops").rglob("*.py"):
        # parsed, not matched line by line: a docstring line that starts with "from" is not an import
        for node in ast.walk(ast.parse(py.read_text(), str(py))):
            if isinstance(node, ast.Import):
                seen.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                seen.add(node.module.split(".")[0])
    import sys

    third_party = {m for m in seen if m not in sys.stdlib_module_names and m not in ("eagle3ops", "__future__")}
    missing = sorted(m for m in third_party - in_image_only
                     if module_to_dist.get(m, m).replace("_", "-") not in declared)
    assert not missing, f"imported by src/eagle3ops but not declared in pyproject.toml dependencies: {missing}"
