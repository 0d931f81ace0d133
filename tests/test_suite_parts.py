"""The host suite's two parts (tests/conftest.py, ``pytest --part sandbox|rest``): every test is in exactly one,
the sandbox's tests in ``sandbox``, and ``--part`` runs only its own. (The first side-by-side run used pytest-xdist's
``loadgroup``, which pytest 9 silently ignores: the sandbox's tests ran in both workers at once and 21 failed on each
other's lock and on engines the other worker's module teardown had stopped.)"""

from __future__ import annotations

import os
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


#: A plugin for the collection below: the ids ``--part`` deselects, into the file ``$E3_DESELECTED``.
DESELECTED_PLUGIN = """import os

def pytest_deselected(items):
    with open(os.environ["E3_DESELECTED"], "a") as f:
        f.writelines(item.nodeid + "\\n" for item in items)
"""


def test_the_parts_split_the_suite_and_put_the_sandbox_fixtures_users_in_sandbox(tmp_path):
    """Collect the host suite once with ``--part sandbox`` (pytest's summary gives the whole count,
    ``S/N tests collected (D deselected)``), recording what it deselects: the sandbox part is what it keeps, the rest
    part what it drops (``--part rest`` keeps exactly that: :func:`test_part_keeps_only_its_own_tests`); the parts are
    disjoint and cover it (S + D = N), every module that brings up a sandbox of its own is whole in ``rest``, and a
    test using ``deployed`` is in ``sandbox``. (A collection per part cost ~9 s more of CPU in every CI run, a
    third one of the whole suite ~15 s before that.)"""
    (tmp_path / "e3_deselected.py").write_text(DESELECTED_PLUGIN)
    dropped = tmp_path / "deselected.txt"
    env = {**os.environ, "E3_DESELECTED": str(dropped),
           "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-p", "e3_deselected", "tests", "--ignore=tests/image", "--part", "sandbox"], cwd=REPO,
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    m = re.search(r"^(\d+)/(\d+) tests? collected \((\d+) deselected\)", out.stdout, flags=re.M)
    assert m, out.stdout[-2000:]
    sandbox = {line for line in out.stdout.splitlines() if "::" in line}
    rest = set(dropped.read_text().splitlines())
    n_s, n, n_r = (int(g) for g in m.groups())
    assert len(sandbox) == n_s and len(rest) == n_r and n_s + n_r == n
    assert sandbox and rest and not (sandbox & rest)
    assert any(i.startswith("tests/test_window_faults.py::") for i in sandbox)
    for own in ("test_transfer.py", "test_transfer_containerd.py", "test_window_containerd.py", "test_sandbox.py"):
        assert not any(i.startswith(f"tests/{own}::") for i in sandbox), own
    assert any(i.startswith("tests/test_transfer_containerd.py::") for i in rest)


def test_part_keeps_only_its_own_tests():
    """``--part P`` keeps the tests :func:`conftest.part_of` puts in P and reports the others deselected, for each
    part (pure: stand-in items and config; the real suite's split is collected above)."""
    import types

    import conftest

    class Item:
        def __init__(self, name, fixtures=(), own=None, marked=False):
            self.name, self.fixturenames, self.marked = name, list(fixtures), marked
            self.module = types.SimpleNamespace(OWN_SANDBOX=own)

        def get_closest_marker(self, name):
            return object() if self.marked and name == "sandbox" else None

    def items():
        return [Item("plain"), Item("deployed", ["deployed"]), Item("marked", marked=True),
                Item("own", own="pytest-x", marked=True), Item("own-deployed", ["sandbox_host"], own="pytest-x")]

    for part, want in (("sandbox", ["deployed", "marked", "own-deployed"]), ("rest", ["plain", "own"])):
        dropped = []
        config = types.SimpleNamespace(getoption=lambda name, part=part: part,
                                       hook=types.SimpleNamespace(pytest_deselected=lambda items: dropped.extend(items)),
                                       option=types.SimpleNamespace(collectonly=True))
        got = items()
        conftest.pytest_collection_modifyitems(config, got)
        assert [i.name for i in got] == want and sorted(i.name for i in dropped + got) == sorted(
            i.name for i in items())


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
