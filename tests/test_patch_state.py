"""The patch workflow's state with the real speculators wheels (pinned sha256) and real GNU patch/diff:

* ``patch apply`` is idempotent: the applied state is judged for the series as a whole (file hashes against the
  wheel's RECORD and the manifest's recorded post-apply state), not per patch by a reverse dry run;
* a hunk lands exactly at the line its header names (offset 0) or the series is refused naming patch, file, hunk;
  a touched file in no state the series knows is refused by name before anything is applied;
* ``patch refresh`` carries every change of the work tree (new empty files, deletions) or refuses it by name
  (mode changes, symlinks, changes outside the package, new empty dirs), writing nothing then.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eagle3ops.patches.series import load_series

from test_patch_helpers import GEN, LOGU, SPEC_030, make_diff, run_cli, site_from_wheel, tree_digest, write_series

REPO = Path(__file__).resolve().parents[1]
MANIFEST = "eagle3ops_patches/speculators.json"


def _apply(pdir: Path, site: Path, *extra: str):
    return run_cli("apply", "--patches-dir", pdir, "--site-dir", site, "--no-require-check", *extra)


def _without_manifest(d: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in d.items() if k != MANIFEST}


# --- apply twice --------------------------------------------------------------------------------------------------


def test_real_030_series_applied_twice_is_a_no_op(tmp_path: Path) -> None:
    """The checked-in speculators 0.3.0 series, applied twice to the same tree: the second run reports every patch
    already applied (exit 0) and changes no file. (Per-patch reverse dry runs failed here: 0002 edits lines 0001
    changed, so neither 0001's reverse nor its forward applied any more: exit 5.)"""
    site = site_from_wheel(SPEC_030, tmp_path / "site")
    names = [p.name for p in load_series(REPO / "patches/speculators/0.3.0").patches]
    r1 = _apply(REPO / "patches", site)
    assert r1.returncode == 0, r1.stdout + r1.stderr
    assert r1.stdout.count("applied          ") == len(names) >= 5
    after_first = tree_digest(site)
    r2 = _apply(REPO / "patches", site)
    assert r2.returncode == 0, r2.stdout + r2.stderr
    for n in names:
        assert f"already-applied  {n}" in r2.stdout
    assert _without_manifest(tree_digest(site)) == _without_manifest(after_first)
    m = json.loads((site / MANIFEST).read_text())
    assert [p["action"] for p in m["patches"]] == ["already-applied"] * len(names)
    assert all(len(p["diff_sha256"]) == 64 for p in m["patches"])
    # a dry run on the applied tree says the same and writes nothing
    r3 = _apply(REPO / "patches", site, "--dry-run")
    assert r3.returncode == 0 and r3.stdout.count("already-applied") == len(names) and "would-apply" not in r3.stdout


@pytest.mark.parametrize("case", ["creates-then-edits", "same-line-twice"])
def test_series_whose_later_patch_edits_an_earlier_change_applies_twice(tmp_path: Path, case: str) -> None:
    """0001 creates a file that 0002 edits, or 0002 edits the very line 0001 changed: apply twice is a no-op."""
    site = site_from_wheel(SPEC_030, tmp_path / "site")
    pristine = site_from_wheel(SPEC_030, tmp_path / "pristine")
    if case == "creates-then-edits":
        new = "speculators/e3_added.py"
        d1 = f"--- /dev/null\n+++ b/{new}\n@@ -0,0 +1,3 @@\n+A = 1\n+B = 2\n+C = 3\n"
        d2 = f"--- a/{new}\n+++ b/{new}\n@@ -1,3 +1,3 @@\n A = 1\n-B = 2\n+B = 20\n C = 3\n"
        check_file, want = new, "A = 1\nB = 20\nC = 3\n"
    else:
        d1 = make_diff(pristine, LOGU, lambda t: t.replace("import sys\n", "import sys  # one\n", 1), tmp_path / "e1")
        (pristine / LOGU).write_text((pristine / LOGU).read_text().replace("import sys\n", "import sys  # one\n", 1))
        d2 = make_diff(pristine, LOGU, lambda t: t.replace("import sys  # one\n", "import sys  # two\n", 1), tmp_path / "e2")
        check_file, want = LOGU, None
    write_series(tmp_path / "patches", SPEC_030, [("0001-first.patch", d1), ("0002-second.patch", d2)])
    r1 = _apply(tmp_path / "patches", site)
    assert r1.returncode == 0, r1.stdout + r1.stderr
    first = tree_digest(site)
    r2 = _apply(tmp_path / "patches", site)
    assert r2.returncode == 0, r2.stdout + r2.stderr
    assert "already-applied  0001-first.patch" in r2.stdout and "already-applied  0002-second.patch" in r2.stdout
    assert _without_manifest(tree_digest(site)) == _without_manifest(first)
    text = (site / check_file).read_text()
    if want is not None:
        assert text == want
    else:
        assert text.count("import sys  # two\n") == 1 and "# one" not in text


def test_live_edit_after_apply_is_refused_by_name(tmp_path: Path) -> None:
    """After a clean apply a file is edited by hand: the next apply refuses naming that file (neither the wheel's
    nor the recorded applied state); the other, untouched files are not blamed."""
    site = site_from_wheel(SPEC_030, tmp_path / "site")
    assert _apply(REPO / "patches", site).returncode == 0
    (site / GEN).write_text((site / GEN).read_text() + "# live sed edit\n")
    before = tree_digest(site)
    r = _apply(REPO / "patches", site)
    assert r.returncode == 5, r.stdout + r.stderr
    msg = r.stderr.split("fix:")[0]
    assert f"{GEN} (sha256 " in msg and "nor the applied state" in msg and "the state recorded after applying 0001" in msg
    assert msg.count("is neither the pinned wheel's file") == 1
    assert tree_digest(site) == before


def test_mixed_states_are_refused(tmp_path: Path) -> None:
    """One file of an applied series reinstalled from the wheel, the others patched: no order explains it."""
    site = site_from_wheel(SPEC_030, tmp_path / "site")
    pristine = site_from_wheel(SPEC_030, tmp_path / "pristine")
    d1 = make_diff(pristine, LOGU, lambda t: t.replace("import sys\n", "import sys  # one\n", 1), tmp_path / "e1")
    d2 = make_diff(pristine, GEN, lambda t: t.replace("import torch\n", "import torch  # two\n", 1), tmp_path / "e2")
    write_series(tmp_path / "patches", SPEC_030, [("0001-log.patch", d1), ("0002-gen.patch", d2)])
    assert _apply(tmp_path / "patches", site).returncode == 0
    (site / LOGU).write_bytes((pristine / LOGU).read_bytes())
    r = _apply(tmp_path / "patches", site)
    assert r.returncode == 5
    assert "partly applied" in r.stderr and f"still pristine: {LOGU}" in r.stderr and GEN in r.stderr


# --- exact landing ------------------------------------------------------------------------------------------------


def _block_edit(t: str) -> str:
    return t.replace('        self.logger.info("  %s", message)\n', '        self.logger.info("  %s", message.strip())\n', 1)


def test_copy_of_the_context_above_the_real_block_is_refused(tmp_path: Path) -> None:
    """The installed file holds an exact copy of a hunk's context block just above the real one: GNU patch (zero
    fuzz) patched the copy and left the real block alone, with exit 0. Now the file is refused by name (it is not
    the wheel's file), nothing is touched."""
    pristine = site_from_wheel(SPEC_030, tmp_path / "pristine")
    d = make_diff(pristine, LOGU, _block_edit, tmp_path / "e")
    write_series(tmp_path / "patches", SPEC_030, [("0001-info.patch", d)])
    site = site_from_wheel(SPEC_030, tmp_path / "site")
    lines = (site / LOGU).read_text().splitlines(keepends=True)
    hunk_start = int(d.split("@@ -", 1)[1].split(",", 1)[0])  # 1-based first line of the hunk's old lines
    block = lines[hunk_start - 1 : hunk_start - 1 + 7]
    assert '        self.logger.info("  %s", message)\n' in block
    (site / LOGU).write_text("".join(lines[: hunk_start - 1] + block + lines[hunk_start - 1 :]))
    before = tree_digest(site)
    r = _apply(tmp_path / "patches", site)
    assert r.returncode == 5, r.stdout + r.stderr
    assert f"{LOGU} (sha256 " in r.stderr and "is neither the pinned wheel's file" in r.stderr
    assert "eagle3ops patch rebase" in r.stderr
    assert tree_digest(site) == before


def test_hunk_at_an_offset_is_refused_naming_patch_file_and_hunk(tmp_path: Path) -> None:
    """0002 was made against the pristine file, but 0001 inserts two lines above its hunk: on the tree 0001
    produces, the hunk's lines are 2 lines further down. GNU patch applied it at offset +2 with exit 0; now apply
    and check refuse it naming patch, file and hunk, and nothing is applied (not even 0001)."""
    pristine = site_from_wheel(SPEC_030, tmp_path / "pristine")
    d1 = make_diff(pristine, LOGU, lambda t: t.replace("import logging\n", "import logging\nimport os\nimport re\n", 1), tmp_path / "e1")
    d2 = make_diff(pristine, LOGU, _block_edit, tmp_path / "e2")
    write_series(tmp_path / "patches", SPEC_030, [("0001-imports.patch", d1), ("0002-info.patch", d2)])
    site = site_from_wheel(SPEC_030, tmp_path / "site")
    before = tree_digest(site)
    r = _apply(tmp_path / "patches", site)
    assert r.returncode == 5, r.stdout + r.stderr
    header = "@@ " + d2.split("@@ ", 1)[1].split("\n", 1)[0]
    assert "patch 0002-info.patch does not apply at the lines it names (zero fuzz, zero offset)" in r.stderr
    assert f'{LOGU}: hunk #1 "{header}" does not match at line' in r.stderr and "offset +2 instead" in r.stderr
    assert tree_digest(site) == before
    c = run_cli("check", "--patches-dir", tmp_path / "patches", "--profile", "speculators-0.3.0-vllm-0.16.0",
                "--probes-module", "eagle3ops.patches.probes")
    assert c.returncode == 5
    assert "ok   0001-imports.patch: applies" in c.stdout
    assert "FAIL 0002-info.patch: patch 0002-info.patch does not apply" in c.stdout and "offset +2 instead" in c.stdout


# --- refresh carries every change or refuses it -------------------------------------------------------------------


@pytest.fixture()
def scratch(tmp_path: Path) -> Path:
    write_series(tmp_path / "patches", SPEC_030, [])
    d = tmp_path / "scratch"
    r = run_cli("new", "speculators==0.3.0", "new-module", "--patches-dir", tmp_path / "patches", "--dir", d)
    assert r.returncode == 0, r.stderr
    return d


def _refresh(d: Path):
    return run_cli("refresh", d, "--description", "Add a module", "--probe", "tokenizer-remote-code")


def test_refresh_refuses_a_mode_change_by_name_and_carries_a_new_empty_file(tmp_path: Path, scratch: Path) -> None:
    """An empty new __init__.py and a chmod +x in work/. refresh exited 0 and the patch held
    neither. Now the chmod is refused by name (exit 4, nothing written); once undone, the empty file is carried
    (a 'new file mode 100644' stanza) and applying the series to a pristine wheel creates it - twice is a no-op."""
    work = scratch / "work"
    (work / "speculators/e3_pkg").mkdir()
    (work / "speculators/e3_pkg/__init__.py").write_text("")
    (work / "speculators/e3_pkg/impl.py").write_text("X = 1\n")
    (work / "speculators/train/__init__.py").unlink()  # an empty file of the wheel, deleted
    mode = (work / LOGU).stat().st_mode
    os.chmod(work / LOGU, mode | 0o111)
    sdir = tmp_path / "patches/speculators/0.3.0"
    r = _refresh(scratch)
    assert r.returncode == 4, r.stdout + r.stderr
    assert f"{LOGU}: mode" in r.stderr and "(chmod)" in r.stderr
    assert not (sdir / "0001-new-module.patch").exists() and (sdir / "series").read_text().strip() == "# test series"
    os.chmod(work / LOGU, mode)
    r = _refresh(scratch)
    assert r.returncode == 0, r.stdout + r.stderr
    text = (sdir / "0001-new-module.patch").read_text()
    assert "diff --git a/speculators/e3_pkg/__init__.py b/speculators/e3_pkg/__init__.py\nnew file mode 100644\n" in text
    assert "diff --git a/speculators/train/__init__.py b/speculators/train/__init__.py\ndeleted file mode 100644\n" in text
    assert "+++ b/speculators/e3_pkg/impl.py" in text
    site = site_from_wheel(SPEC_030, tmp_path / "site")
    r1 = run_cli("apply", "--patches-dir", tmp_path / "patches", "--site-dir", site, "--no-require-check")
    assert r1.returncode == 0, r1.stdout + r1.stderr
    assert (site / "speculators/e3_pkg/__init__.py").read_bytes() == b""
    assert (site / "speculators/e3_pkg/impl.py").read_text() == "X = 1\n"
    assert not (site / "speculators/train/__init__.py").exists()
    r2 = run_cli("apply", "--patches-dir", tmp_path / "patches", "--site-dir", site, "--no-require-check")
    assert r2.returncode == 0 and "already-applied  0001-new-module.patch" in r2.stdout


def test_refresh_names_every_change_it_cannot_carry(tmp_path: Path, scratch: Path) -> None:
    work = scratch / "work"
    os.symlink("logging_utils.py", work / "speculators/data_generation/e3_link.py")
    (work / "speculators/e3_empty_dir").mkdir()
    (work / "speculators/e3_tool.py").write_text("print(1)\n")
    os.chmod(work / "speculators/e3_tool.py", 0o755)
    dist_info = next(work.glob("speculators-*.dist-info"))
    (dist_info / "METADATA").write_text((dist_info / "METADATA").read_text() + "X-Edited: yes\n")
    (work / GEN).write_text((work / GEN).read_text() + "# a real edit\n")
    r = _refresh(scratch)
    assert r.returncode == 4, r.stdout + r.stderr
    err = r.stderr
    assert "4 change(s)" in err
    assert "speculators/data_generation/e3_link.py: symlink (-> logging_utils.py)" in err
    assert "speculators/e3_empty_dir/: new empty directory" in err
    assert "speculators/e3_tool.py: new file with mode 0755 (executable)" in err
    assert f"{dist_info.name}/METADATA: outside the package root" in err
    assert not (tmp_path / "patches/speculators/0.3.0/0001-new-module.patch").exists()


def test_capture_diff_carries_empty_files(tmp_path: Path) -> None:
    """capture's diff of a container package (no container needed for this part): an empty file added in the
    container and an empty wheel file deleted there become git stanzas; the result applies to the pristine wheel."""
    from eagle3ops.patches.capture import ContainerPackage, diff_against_wheel

    pristine = site_from_wheel(SPEC_030, tmp_path / "pristine")
    empty_del = "speculators/train/__init__.py"
    assert (pristine / empty_del).read_bytes() == b""
    new_log = (pristine / LOGU).read_bytes() + b"# captured\n"
    cp = ContainerPackage(package="speculators", version="0.3.0", site_dir="/x", dist_info="/x/d", top_levels=("speculators",),
                          record={}, remote_sha256={}, modified=[LOGU], deleted=[empty_del],
                          added=["speculators/e3_new/__init__.py"],
                          contents={LOGU: new_log, "speculators/e3_new/__init__.py": b""})
    diff = diff_against_wheel(cp, {LOGU: (pristine / LOGU).read_bytes(), empty_del: b""})
    assert "new file mode 100644" in diff and "deleted file mode 100644" in diff
    write_series(tmp_path / "patches", SPEC_030, [("0001-captured.patch", diff)])
    site = site_from_wheel(SPEC_030, tmp_path / "site")
    r = _apply(tmp_path / "patches", site)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (site / LOGU).read_bytes() == new_log and (site / "speculators/e3_new/__init__.py").read_bytes() == b""
    assert not (site / empty_del).exists()


def test_apply_stopped_half_way_is_completed_by_the_next_apply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real run dies after its first patch (the trial had passed): the manifest written after each patch
    records that state, so the next apply reports 0001 already applied and applies 0002."""
    from eagle3ops.patches import apply as apply_mod
    from eagle3ops.patches.errors import PatchToolError

    pristine = site_from_wheel(SPEC_030, tmp_path / "pristine")
    d1 = make_diff(pristine, LOGU, lambda t: t.replace("import sys\n", "import sys  # one\n", 1), tmp_path / "e1")
    (pristine / LOGU).write_text((pristine / LOGU).read_text().replace("import sys\n", "import sys  # one\n", 1))
    d2 = make_diff(pristine, LOGU, lambda t: t.replace("import logging\n", "import logging  # two\n", 1), tmp_path / "e2")
    sdir = write_series(tmp_path / "patches", SPEC_030, [("0001-a.patch", d1), ("0002-b.patch", d2)])
    site = site_from_wheel(SPEC_030, tmp_path / "site")
    real = apply_mod.apply_patch

    def dying(patch, tree, *a, **kw):
        if patch.name == "0002-b.patch" and Path(tree) == site.resolve():
            raise PatchToolError("killed (test)")
        return real(patch, tree, *a, **kw)

    monkeypatch.setattr(apply_mod, "apply_patch", dying)
    with pytest.raises(PatchToolError, match="killed"):
        apply_mod.apply_series(load_series(sdir), site_dir=site, check_requires=False)
    assert "# one" in (site / LOGU).read_text() and "# two" not in (site / LOGU).read_text()
    monkeypatch.setattr(apply_mod, "apply_patch", real)
    res = apply_mod.apply_series(load_series(sdir), site_dir=site, check_requires=False)
    assert [r.action.value for r in res.patches] == ["already-applied", "applied"]
    assert (site / LOGU).read_text().count("# one") == 1 and "# two" in (site / LOGU).read_text()
