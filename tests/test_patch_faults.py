"""Fault suite for ``eagle3ops patch apply/probe/check`` with the real speculators wheels (pinned sha256).

Each fault must stop the command with a non-zero exit and a message naming the cause (and leave the installed
tree untouched where the fault is found before applying). The command runs as a real process
(``python -m eagle3ops.patches``), exactly as a Dockerfile ``RUN`` step would run it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from test_patch_helpers import (
    GEN,
    LOGU,
    SPEC_030,
    SPEC_0401,
    make_diff,
    run_cli,
    site_from_wheel,
    tree_digest,
    write_series,
)


def _edit_log(t: str) -> str:
    return t.replace("import logging", "import logging  # eagle3ops fault-suite edit", 1)


def _edit_gen_two_hunks(t: str) -> str:
    t = t.replace("import torch\n", "import torch  # edit one\n", 1)
    return t.replace("        self.tokenizer = AutoTokenizer.from_pretrained(model_path)\n",
                     "        self.tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=True)\n", 1)


@pytest.fixture()
def site030(tmp_path: Path) -> Path:
    return site_from_wheel(SPEC_030, tmp_path / "site")


@pytest.fixture()
def good_series(tmp_path: Path, site030: Path) -> Path:
    """A two-patch series for 0.3.0 made from real diffs against the wheel; returns the patches dir."""
    d1 = make_diff(site030, LOGU, _edit_log, tmp_path / "e1")
    d2 = make_diff(site030, GEN, _edit_gen_two_hunks, tmp_path / "e2")
    write_series(tmp_path / "patches", SPEC_030, [("0001-log.patch", d1), ("0002-gen.patch", d2)])
    return tmp_path / "patches"


def test_pinned_version_differs_from_installed(tmp_path: Path, good_series: Path) -> None:
    """Series pinned to 0.3.0, site holds the real 0.4.0.1 wheel: refused, both versions named, nothing touched."""
    site = site_from_wheel(SPEC_0401, tmp_path / "site0401")
    before = tree_digest(site)
    r = run_cli("apply", "--patches-dir", good_series, "--site-dir", site, "--no-require-check")
    assert r.returncode == 3, r.stderr
    assert "pinned to speculators==0.3.0" in r.stderr
    assert "speculators 0.4.0.1 is installed" in r.stderr
    assert tree_digest(site) == before
    assert not (site / "eagle3ops_patches").exists()


def test_required_version_missing_is_refused(site030: Path, good_series: Path) -> None:
    """X-Eagle3ops-Requires / profile requires vllm==0.16.0, which is not in the site dir: refused, named."""
    before = tree_digest(site030)
    r = run_cli("apply", "--patches-dir", good_series, "--site-dir", site030)
    assert r.returncode == 3
    assert "requires vllm==0.16.0" in r.stderr and "no distribution providing 'vllm'" in r.stderr
    assert tree_digest(site030) == before


def test_locally_edited_file_is_refused_by_name_before_anything_is_applied(site030: Path, good_series: Path) -> None:
    """The installed generator differs from the wheel where patch 0002's second hunk applies: the tree is in no
    state the series knows, so apply exits 5 naming the file (and patch rebase), before any patch is applied."""
    gen = site030 / GEN
    text = gen.read_text()
    line = '        log.info(f"Tensor parallel size: {tensor_parallel_size}")\n'
    assert text.count(line) == 1
    gen.write_text(text.replace(line, '        log.info("TP size: %d", tensor_parallel_size)  # local edit\n'))
    before = tree_digest(site030)
    r = run_cli("apply", "--patches-dir", good_series, "--site-dir", site030, "--no-require-check")
    assert r.returncode == 5, r.stdout + r.stderr
    err = r.stderr
    assert f"{GEN} (sha256 " in err and "is neither the pinned wheel's file (RECORD: sha256" in err
    assert LOGU not in err.split("fix:")[0]  # the pristine file is not blamed
    assert "eagle3ops patch rebase speculators" in err
    assert tree_digest(site030) == before, "a refused series must not leave earlier patches applied"


def test_rejected_hunk_names_patch_file_and_hunk(tmp_path: Path, site030: Path) -> None:
    """Patch 0002's second hunk carries a context line the (pristine) generator does not have: exit 5 naming
    patch, file, hunk #2 and its @@ header; the whole series is refused before anything is written."""
    d1 = make_diff(site030, LOGU, _edit_log, tmp_path / "e1")
    d2 = make_diff(site030, GEN, _edit_gen_two_hunks, tmp_path / "e2")
    line = ' log.info(f"Tensor parallel size: {tensor_parallel_size}")\n'
    assert d2.count(line) == 1
    d2 = d2.replace(line, ' log.info("TP size: %d", tensor_parallel_size)\n')
    write_series(tmp_path / "patches", SPEC_030, [("0001-log.patch", d1), ("0002-gen.patch", d2)])
    before = tree_digest(site030)
    r = run_cli("apply", "--patches-dir", tmp_path / "patches", "--site-dir", site030, "--no-require-check")
    assert r.returncode == 5, r.stdout + r.stderr
    err = r.stderr
    assert "patch 0002-gen.patch does not apply" in err
    assert f"{GEN}: hunk #2 \"@@ -81,7 +81,7 @@ def __init__(\" does not match at line 81" in err
    assert "hunk #1" not in err  # the first hunk still matches; only the real culprit is named
    assert tree_digest(site030) == before, "a rejected series must not leave earlier patches applied"


def test_already_applied_is_reported_not_applied_twice(site030: Path, good_series: Path) -> None:
    r1 = run_cli("apply", "--patches-dir", good_series, "--site-dir", site030, "--no-require-check")
    assert r1.returncode == 0, r1.stderr
    assert r1.stdout.count("applied          ") == 2
    after_first = tree_digest(site030)
    r2 = run_cli("apply", "--patches-dir", good_series, "--site-dir", site030, "--no-require-check")
    assert r2.returncode == 0, r2.stderr
    assert "already-applied  0001-log.patch" in r2.stdout and "already-applied  0002-gen.patch" in r2.stdout
    after_second = tree_digest(site030)
    after_second.pop("eagle3ops_patches/speculators.json")
    after_first.pop("eagle3ops_patches/speculators.json")
    assert after_second == after_first
    assert (site030 / LOGU).read_text().count("eagle3ops fault-suite edit") == 1
    m = json.loads((site030 / "eagle3ops_patches/speculators.json").read_text())
    assert [p["action"] for p in m["patches"]] == ["already-applied", "already-applied"]


def _traversal_series(tmp_path: Path, diff: str) -> Path:
    write_series(tmp_path / "patches", SPEC_030, [("0001-evil.patch", diff)])
    return tmp_path / "patches"


def test_path_traversal_dotdot(tmp_path: Path, site030: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    diff = "--- a/speculators/../../victim.txt\n+++ b/speculators/../../victim.txt\n@@ -1 +1 @@\n-keep\n+owned\n"
    r = run_cli("apply", "--patches-dir", _traversal_series(tmp_path, diff), "--site-dir", site030, "--no-require-check")
    assert r.returncode == 4
    assert "0001-evil.patch" in r.stderr and "path traversal" in r.stderr
    assert victim.read_text() == "keep\n"


def test_path_traversal_absolute(tmp_path: Path, site030: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    diff = f"--- {victim}\n+++ {victim}\n@@ -1 +1 @@\n-keep\n+owned\n"
    r = run_cli("apply", "--patches-dir", _traversal_series(tmp_path, diff), "--site-dir", site030, "--no-require-check")
    assert r.returncode == 4
    assert "absolute path" in r.stderr
    assert victim.read_text() == "keep\n"


def test_path_outside_package_root(tmp_path: Path, site030: Path) -> None:
    """A -p1 path into another package (or the .dist-info) is outside the package root."""
    diff = "--- a/speculators-0.3.0.dist-info/top_level.txt\n+++ b/speculators-0.3.0.dist-info/top_level.txt\n@@ -1 +1 @@\n-speculators\n+vllm\n"
    before = tree_digest(site030)
    r = run_cli("apply", "--patches-dir", _traversal_series(tmp_path, diff), "--site-dir", site030, "--no-require-check")
    assert r.returncode == 4
    assert "outside the package root" in r.stderr
    assert tree_digest(site030) == before


def test_path_through_symlink(tmp_path: Path, site030: Path) -> None:
    """speculators/data_generation is a symlink to a dir outside the site: a patch writing there is refused."""
    outside = tmp_path / "outside_dg"
    (site030 / "speculators/data_generation").rename(outside)
    os.symlink(outside, site030 / "speculators/data_generation")
    before = (outside / "logging_utils.py").read_bytes()
    diff = make_diff(site030, LOGU, _edit_log, tmp_path / "e")
    r = run_cli("apply", "--patches-dir", _traversal_series(tmp_path, diff), "--site-dir", site030, "--no-require-check")
    assert r.returncode == 4, r.stdout + r.stderr
    assert "symlink" in r.stderr and "speculators/data_generation" in r.stderr
    assert (outside / "logging_utils.py").read_bytes() == before


def test_rename_and_mode_changes_are_refused(tmp_path: Path, site030: Path) -> None:
    diff = ("diff --git a/speculators/version.py b/speculators/evil.py\nsimilarity index 100%\n"
            "rename from speculators/version.py\nrename to speculators/evil.py\n"
            "--- a/speculators/version.py\n+++ b/speculators/evil.py\n@@ -1 +1 @@\n-x\n+y\n")
    r = run_cli("apply", "--patches-dir", _traversal_series(tmp_path, diff), "--site-dir", site030, "--no-require-check")
    assert r.returncode == 4
    assert "unsupported diff feature" in r.stderr or "differ" in r.stderr


def test_probe_fails_after_clean_apply(tmp_path: Path, site030: Path, good_series: Path) -> None:
    """Patches apply, but the behavioural probe (from an injected, clearly named failing registry) fails:
    probe exits 6 naming each patch, its probe and the ProbeFailed message. The passing registry is the control."""
    r = run_cli("apply", "--patches-dir", good_series, "--site-dir", site030, "--no-require-check")
    assert r.returncode == 0, r.stderr
    reg = tmp_path / "registries"
    reg.mkdir()
    (reg / "e3_test_probes_failing.py").write_text(
        "class ProbeFailed(Exception):\n    pass\n"
        "def _wrong():\n    raise ProbeFailed('tokenizer was loaded without trust_remote_code')\n"
        "PROBES = {'test-probe': _wrong}\n"
    )
    (reg / "e3_test_probes_passing.py").write_text("class ProbeFailed(Exception):\n    pass\nPROBES = {'test-probe': lambda: None}\n")
    (reg / "e3_test_probes_empty.py").write_text("PROBES = {}\n")
    env = {"PYTHONPATH": str(reg) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    bad = run_cli("probe", "--patches-dir", good_series, "--site-dir", site030, "--probes-module", "e3_test_probes_failing", env=env)
    assert bad.returncode == 6
    assert "FAIL 0001-log.patch: probe test-probe: ProbeFailed: tokenizer was loaded without trust_remote_code" in bad.stdout
    assert "FAIL 0002-gen.patch" in bad.stdout
    good = run_cli("probe", "--patches-dir", good_series, "--site-dir", site030, "--probes-module", "e3_test_probes_passing", env=env)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "ok   0002-gen.patch: probe test-probe passed" in good.stdout
    assert "ok   verify: 2 patched file(s) match the apply manifest (sha256)" in good.stdout
    unknown = run_cli("probe", "--patches-dir", good_series, "--site-dir", site030, "--probes-module", "e3_test_probes_empty", env=env)
    assert unknown.returncode == 6
    assert "unknown probe 'test-probe'" in unknown.stdout


def test_probe_run_detects_file_edited_after_apply(tmp_path: Path, site030: Path, good_series: Path) -> None:
    assert run_cli("apply", "--patches-dir", good_series, "--site-dir", site030, "--no-require-check").returncode == 0
    reg = tmp_path / "reg"
    reg.mkdir()
    (reg / "e3_test_probes_passing.py").write_text("PROBES = {'test-probe': lambda: None}\n")
    (site030 / GEN).write_text((site030 / GEN).read_text() + "# live sed edit\n")
    r = run_cli("probe", "--patches-dir", good_series, "--site-dir", site030, "--probes-module", "e3_test_probes_passing",
                env={"PYTHONPATH": str(reg)})
    assert r.returncode == 6
    assert f"FAIL verify {GEN}: changed since eagle3ops patch apply" in r.stdout  # the verify step names it


def test_probe_run_without_manifest_fails(site030: Path, good_series: Path) -> None:
    r = run_cli("probe", "--patches-dir", good_series, "--site-dir", site030)
    assert r.returncode != 0
    assert "no patch manifest" in r.stderr


def test_check_refuses_wheel_with_other_sha256(tmp_path: Path, good_series: Path) -> None:
    """upstream.yaml pins a sha256 the index's wheel does not have: check fails naming the wheel."""
    up = good_series / "speculators/0.3.0/upstream.yaml"
    up.write_text(up.read_text().replace(SPEC_030.sha256, "ab" * 32))
    r = run_cli("check", "--patches-dir", good_series, "--profile", "speculators-0.3.0-vllm-0.16.0", "--cache-dir", tmp_path / "cache")
    assert r.returncode == 5
    assert "FAILED" in r.stdout and SPEC_030.wheel in r.stdout and "ab" * 32 in r.stdout
