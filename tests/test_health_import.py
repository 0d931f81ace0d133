"""The one health poller (``eagle3ops.health``, standard library only) loads without the docker SDK, so the driver
(demo) and the host-side supervisor share it. Which layer may import which is checked by import-linter
(tests/test_contracts.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "eagle3ops"


def test_the_gate_imports_without_the_docker_sdk():
    code = ("import sys; sys.modules['docker'] = None; import eagle3ops.health as g; "
            "assert 'docker' not in [m for m in sys.modules if sys.modules[m] is not None]; print(g.probe.__name__)")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                        env={"PYTHONPATH": str(SRC.parent), "PATH": "/usr/bin:/bin"})
    assert cp.returncode == 0 and cp.stdout.strip() == "probe", cp.stderr
