"""Import contracts of the window (driver side) and the supervisor (host side).

The driver imports nothing from the host-side supervisor except the plan schema (``eagle3ops.plan_schema``) and the
one health poller (``eagle3ops.supervisor.gate``, standard library only); the supervisor imports nothing of the
driver (no ``window``, ``cli``, ``remote``: the pipeline image it runs in has no Fabric). Every import is checked,
including those inside functions.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "eagle3ops"
#: Driver-side modules allowed to import a module of the supervisor package, and which one.
DRIVER_MAY_IMPORT = {"eagle3ops.supervisor.gate"}
DRIVER_FORBIDDEN_FOR_SUPERVISOR = ("eagle3ops.window", "eagle3ops.cli", "eagle3ops.remote", "eagle3ops.demo",
                                   "eagle3ops.deployer", "eagle3ops.transfer", "fabric", "paramiko")


def _imports(path: Path) -> set[str]:
    """Every module name ``path`` imports (``from a import b`` gives ``a`` and ``a.b``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _module(path: Path) -> str:
    return "eagle3ops." + ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")


def test_the_driver_imports_only_the_plan_schema_and_the_gate_from_the_supervisor():
    wrong = []
    for path in SRC.rglob("*.py"):
        mod = _module(path)
        if mod.startswith("eagle3ops.supervisor"):
            continue
        for name in _imports(path):
            if name.startswith("eagle3ops.supervisor") and name not in DRIVER_MAY_IMPORT and \
                    name != "eagle3ops.supervisor":
                wrong.append(f"{mod} imports {name}")
            if name == "eagle3ops.supervisor" and not any(i.startswith("eagle3ops.supervisor.gate")
                                                          for i in _imports(path)):
                wrong.append(f"{mod} imports eagle3ops.supervisor")
    assert not wrong, wrong


def test_the_supervisor_imports_nothing_of_the_driver():
    wrong = [f"{_module(p)} imports {n}" for p in (SRC / "supervisor").rglob("*.py") for n in _imports(p)
             if n.startswith(DRIVER_FORBIDDEN_FOR_SUPERVISOR)]
    wrong += [f"plan_schema imports {n}" for n in _imports(SRC / "plan_schema.py")
              if n.startswith(("eagle3ops.window", "eagle3ops.supervisor"))]
    assert not wrong, wrong


def test_the_gate_imports_without_the_docker_sdk():
    code = ("import sys; sys.modules['docker'] = None; import eagle3ops.supervisor.gate as g; "
            "assert 'docker' not in [m for m in sys.modules if sys.modules[m] is not None]; print(g.probe.__name__)")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                        env={"PYTHONPATH": str(SRC.parent), "PATH": "/usr/bin:/bin"})
    assert cp.returncode == 0 and cp.stdout.strip() == "probe", cp.stderr
