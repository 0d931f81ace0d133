"""pytest-timeout is configured for the host suite: a hung wait fails its test (and the run continues) instead of
hanging CI; the default is generous enough for the slowest tests (session fixtures included)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_timeout_is_configured_in_pyproject() -> None:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert any(r.replace(" ", "").startswith("pytest-timeout") for r in data["project"]["optional-dependencies"]["test"])
    ini = data["tool"]["pytest"]["ini_options"]
    # above the longest wait a test body allows itself (the window-fault tests join for 900 s) plus cold fixtures
    assert 900 < int(ini["timeout"]) <= 3600
    assert ini["timeout_method"] == "signal"


def test_a_hanging_test_fails_and_the_run_goes_on(tmp_path: Path) -> None:
    """With the repository's pytest configuration (limit lowered to 3 s here), a test blocked in a wait is failed
    with pytest-timeout's message and the next test still runs and passes."""
    (tmp_path / "test_hang.py").write_text(
        "import threading\n"
        "def test_hangs_on_a_wait():\n    threading.Event().wait()\n"
        "def test_after_it():\n    assert True\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path),
         "-p", "no:cacheprovider", "-o", "timeout=3", "-q", str(tmp_path / "test_hang.py")],
        capture_output=True, text=True, timeout=120, check=False,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "Timeout (0:00:03)!" in out or "Failed: Timeout" in out, out
    assert "1 failed, 1 passed" in out, out
