"""pytest-timeout is configured for the host suite: a hung wait fails its test (and the run continues) instead of
hanging CI; the default is generous enough for the slowest tests (session fixtures included)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_timeout_is_configured_in_pyproject() -> None:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert any(r.replace(" ", "").startswith("pytest-timeout") for r in data["project"]["optional-dependencies"]["test"])
    ini = data["tool"]["pytest"]["ini_options"]
    # one hang costs at most 10 minutes of CI (images are built before pytest: tests/prebuild.py)
    assert 0 < int(ini["timeout"]) <= 600
    assert ini["timeout_method"] == "signal"


def test_no_test_raises_its_own_limit_above_600_s() -> None:
    """A ``@pytest.mark.timeout(N)`` above 600 s would bring back the 40-minute hang; the in-image suite gets a limit
    on its command line (scripts/test-image.sh) from a hash-pinned pytest-timeout wheel."""
    marks = [(p.name, int(n)) for p in sorted((REPO / "tests").rglob("test_*.py"))
             for n in re.findall(r"mark\.timeout\((\d+)", p.read_text())]
    assert marks, "no timeout mark found at all: the pattern is stale"
    assert [m for m in marks if m[1] > 600] == []
    assert "--timeout" in (REPO / "scripts/test-image.sh").read_text()
    assert "pytest-timeout==" in (REPO / "requirements/image-test.txt").read_text()


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
