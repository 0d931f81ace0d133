"""The host suite's two parts (tests/conftest.py, ``pytest --part sandbox|rest``): every test is in exactly one,
the sandbox's tests in ``sandbox``, and ``--part`` runs only its own. (The first side-by-side run used pytest-xdist's
``loadgroup``, which pytest 9 silently ignores: the sandbox's tests ran in both workers at once and 21 failed on each
other's lock and on engines the other worker's module teardown had stopped.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import part_of

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.sandbox
def test_a_sandbox_marked_test_is_in_the_sandbox_part(request):
    assert part_of(request.node) == "sandbox"


def test_a_plain_test_is_in_the_rest_part(request):
    assert part_of(request.node) == "rest"


def test_the_parts_split_the_suite_and_put_the_sandbox_fixtures_users_in_sandbox():
    """Collect the host suite twice (``--part sandbox``, ``--part rest``; pytest's summary gives the whole count,
    ``S/N tests collected (D deselected)``): the parts are disjoint and cover it (disjoint sets of sizes S and R with
    S + R = N), every module that brings up a sandbox of its own is whole in ``rest``, and a test using ``deployed``
    is in ``sandbox``. (A third collection of the whole suite cost ~15 s of CPU in every CI run.)"""
    def ids(*extra: str) -> tuple[set[str], int]:
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                              "tests", "--ignore=tests/image", *extra], cwd=REPO, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        m = re.search(r"^(\d+)/(\d+) tests? collected \((\d+) deselected\)", out.stdout, flags=re.M)
        assert m, out.stdout[-2000:]
        got = {line for line in out.stdout.splitlines() if "::" in line}
        assert len(got) == int(m.group(1)) and int(m.group(1)) + int(m.group(3)) == int(m.group(2))
        return got, int(m.group(2))

    (sandbox, n_s), (rest, n_r) = ids("--part", "sandbox"), ids("--part", "rest")
    assert sandbox and rest and not (sandbox & rest) and n_s == n_r == len(sandbox) + len(rest)
    assert any(i.startswith("tests/test_window_faults.py::") for i in sandbox)
    for own in ("test_transfer.py", "test_transfer_containerd.py", "test_window_containerd.py", "test_sandbox.py"):
        assert not any(i.startswith(f"tests/{own}::") for i in sandbox), own
    assert any(i.startswith("tests/test_transfer_containerd.py::") for i in rest)


def test_make_test_runs_both_parts_and_the_in_image_suite():
    """``scripts/test.sh`` (README's ``make test``) starts one pytest per part, with the same host-suite arguments,
    and the in-image suite: dropping a part from it would leave that part's tests out of CI while the others pass."""
    text = (REPO / "scripts/test.sh").read_text()
    runs = re.findall(r"^\s*\.venv/bin/python -m pytest (.*)$", text, flags=re.M)
    parts = sorted(re.search(r"--part (\w+)", r).group(1) for r in runs if "--part" in r)
    assert parts == ["rest", "sandbox"], runs
    assert all(r.endswith('"$@" tests --ignore=tests/image') or '"$@" tests --ignore=tests/image >' in r
               for r in runs), runs
    assert re.search(r"^\s*bash scripts/test-image.sh \"\$tag\"", text, flags=re.M)
    assert re.search(r'\[ "\$sandbox_rc" = 0 \] && \[ "\$rest_rc" = 0 \] && \[ "\$image_rc" = 0 \]', text)
