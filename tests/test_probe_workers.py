"""How ``eagle3ops patch probe`` starts what its probe engines share, without vLLM (the engines themselves:
``tests/image/test_probes.py``).

- the probe engines' workers come from a forkserver (``forkworkers.ForkedWorkers``): each is a child of the forkserver,
  not of the probe process, and runs with the probe process's environment as it is when the worker starts --
  including a variable set, and one removed, after the forkserver started -- as a spawned worker would;
- ``probe_installed`` hands the probes about to run (not those reused, not unknown ones) to the registry's ``warm``
  hook before the caller's ``before_probes`` (the image build's import check) and before ``prepare``; a failing
  ``before_probes`` stops the run before any probe.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from eagle3ops.patches import forkworkers
from eagle3ops.patches.apply import MANIFEST_SCHEMA, manifest_path
from eagle3ops.patches.proberun import probe_installed


def _report(conn, names: tuple[str, ...]) -> None:
    """Worker target: its parent's pid and the named variables as it sees them."""
    conn.send((os.getppid(), {n: os.environ.get(n) for n in names}))
    conn.close()


def test_forked_worker_has_the_environment_at_its_start_and_the_forkserver_as_parent(monkeypatch):
    monkeypatch.setattr(forkworkers, "WORKER_PRELOAD", ("eagle3ops.patches.forkworkers",))  # no torch on this host
    monkeypatch.setenv("E3_TEST_GONE_SINCE", "in the forkserver only")
    forkworkers.start_forkserver()
    monkeypatch.setenv("E3_TEST_SET_SINCE", "set after the forkserver started")
    monkeypatch.delenv("E3_TEST_GONE_SINCE")
    ctx = forkworkers.ForkedWorkers()
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_report, kwargs={"conn": writer, "names": ("E3_TEST_SET_SINCE", "E3_TEST_GONE_SINCE")},
                       name="e3-test-worker", daemon=True)
    proc.start()
    writer.close()
    assert reader.poll(60), "the forked worker did not report"
    parent, seen = reader.recv()
    proc.join(30)
    assert proc.exitcode == 0
    assert parent != os.getpid()  # forked by the forkserver, not by this process
    assert seen == {"E3_TEST_SET_SINCE": "set after the forkserver started", "E3_TEST_GONE_SINCE": None}


def _site_with_manifest(site: Path, probes: list[str]) -> Path:
    path = manifest_path(site, "e3testpkg")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema": MANIFEST_SCHEMA, "files_sha256": {},
                                "patches": [{"name": f"000{i}-x.patch", "probe": p} for i, p in enumerate(probes, 1)]}))
    return site


REGISTRY = '''
CALLS = []
class ProbeFailed(Exception):
    pass
def warm(names):
    CALLS.append(("warm", list(names)))
def prepare(names):
    CALLS.append(("prepare", list(names)))
def finish():
    CALLS.append(("finish",))
PROBES = {"a": lambda: CALLS.append(("probe", "a")), "b": lambda: CALLS.append(("probe", "b"))}
'''


@pytest.fixture()
def registry(tmp_path, monkeypatch):
    (tmp_path / "e3_test_warm_registry.py").write_text(REGISTRY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "e3_test_warm_registry", raising=False)
    import e3_test_warm_registry

    return e3_test_warm_registry


def test_warm_gets_the_probes_to_run_before_the_import_check_and_prepare(tmp_path, registry):
    site = _site_with_manifest(tmp_path / "site", ["a", "b", "a", "unknown"])
    changed, outcomes = probe_installed(site, "e3testpkg", probes_module="e3_test_warm_registry",
                                        before_probes=lambda: registry.CALLS.append(("import check",)))
    assert changed == [] and [o.ok for o in outcomes] == [True, True, True, False]
    assert registry.CALLS == [("warm", ["a", "b"]), ("import check",), ("prepare", ["a", "b"]), ("probe", "a"),
                              ("probe", "b"), ("finish",)]


def test_a_failing_import_check_stops_the_run_before_any_probe(tmp_path, registry):
    site = _site_with_manifest(tmp_path / "site", ["a"])

    def broken() -> None:
        raise ImportError("patched module does not import")

    with pytest.raises(ImportError, match="does not import"):
        probe_installed(site, "e3testpkg", probes_module="e3_test_warm_registry", before_probes=broken)
    assert registry.CALLS == [("warm", ["a"])]
