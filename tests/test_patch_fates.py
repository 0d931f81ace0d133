"""Fates of a succeeded profile's patches: carried forward or retired by a record whose evidence is read from the
pinned wheels (``eagle3ops.patches.fates``). Pure tests on small wheels built here, then the repository's records
against the real pinned 0.16 and 0.32 wheels (cached by ``fetch_wheel``)."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest
import yaml

from eagle3ops.patches.check import check_series
from eagle3ops.patches.errors import SeriesError
from eagle3ops.patches.fates import Retirement, check_evidence, fates, load_retirement, records
from eagle3ops.patches.series import load_profiles, load_series
from eagle3ops.patches.wheels import fetch_wheel

from test_patch_helpers import run_cli

REPO_PATCHES = Path(__file__).resolve().parents[1] / "patches"
HEADER = ("Description: {d}\nOrigin: vendor\nForwarded: not-needed\nLast-Update: 2026-12-07\n"
          "X-Eagle3ops-Pin: pkga=={v}\nX-Eagle3ops-Probe: test-probe\n---\n")


def _wheel(cache: Path, version: str, files: dict[str, str]) -> dict[str, str]:
    """A small wheel of pkga ``version`` holding ``files``, written into ``cache``; its upstream.yaml entry."""
    buf = io.BytesIO()
    di = f"pkga-{version}.dist-info"
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr(f"{di}/METADATA", f"Metadata-Version: 2.1\nName: pkga\nVersion: {version}\n")
        zf.writestr(f"{di}/RECORD", "".join(f"{n},,\n" for n in files))
    name = f"pkga-{version}-py3-none-any.whl"
    (cache / name).write_bytes(buf.getvalue())
    return {"package": "pkga", "version": version, "wheel": name, "sha256": hashlib.sha256(buf.getvalue()).hexdigest()}


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    """patches/ with pkga/1.0 (patches 0001-a, 0002-b) in profile ``old`` and pkga/2.0 (patch 0001-b carried
    forward, 0001-a retired by a record) in profile ``new`` succeeding it; the wheels in a cache dir."""
    cache = tmp_path / "cache"
    cache.mkdir()
    root = tmp_path / "patches"
    old, new = root / "pkga" / "1.0", root / "pkga" / "2.0"
    old.mkdir(parents=True)
    new.mkdir(parents=True)
    (old / "upstream.yaml").write_text(yaml.safe_dump(_wheel(cache, "1.0", {"pkga/__init__.py": "x = 1\n"})))
    (new / "upstream.yaml").write_text(yaml.safe_dump(_wheel(cache, "2.0", {"pkga/__init__.py": "x = 3\n",
                                                                               "pkga/b.py": "y = 1\n"})))
    for name, v, diff in (("0001-a.patch", "1.0", "--- a/pkga/__init__.py\n+++ b/pkga/__init__.py\n@@ -1 +1 @@\n-x = 1\n+x = 3\n"),
                          ("0002-b.patch", "1.0", "--- /dev/null\n+++ b/pkga/c.py\n@@ -0,0 +1 @@\n+z = 1\n")):
        (old / name).write_text(HEADER.format(d=name, v=v) + diff)
    (old / "series").write_text("0001-a.patch\n0002-b.patch\n")
    (new / "0001-b.patch").write_text(HEADER.format(d="b carried", v="2.0")
                                      + "--- /dev/null\n+++ b/pkga/c.py\n@@ -0,0 +1 @@\n+z = 1\n")
    (new / "series").write_text("0001-b.patch\n")
    rec = new / "retired" / "pkga" / "1.0" / "0001-a.yaml"
    rec.parent.mkdir(parents=True)
    rec.write_text(yaml.safe_dump({"fate": "upstream", "release": "pkga 2.0", "pr": "https://example.org/pr/1",
                                   "evidence": [{"file": "pkga/__init__.py", "contains": "x = 3"},
                                                {"file": "pkga/c.py", "absent": True}]}))
    (root / "profiles.yaml").write_text(yaml.safe_dump({"default": "old", "profiles": {
        "old": {"series": ["pkga/1.0"], "requires": ["pkga==1.0"]},
        "new": {"series": ["pkga/2.0"], "requires": ["pkga==2.0"], "succeeds": ["old"]}}}))
    return root, cache


def test_every_patch_has_one_fate_and_the_evidence_is_read_from_the_wheel(tmp_path: Path) -> None:
    root, cache = _tree(tmp_path)
    got, problems = fates(load_profiles(root), "new")
    assert problems == []
    assert [(f.old, f.kind, f.where) for f in got] == [
        ("pkga/1.0/0001-a.patch", "retired", "pkga/2.0/retired/pkga/1.0/0001-a.yaml"),
        ("pkga/1.0/0002-b.patch", "carried", "pkga/2.0/0001-b.patch")]
    res = check_series(root / "pkga" / "2.0", cache=cache, probes_module="e3_no_such_registry")
    assert res.ok, res.problems
    # the same record does not hold on the old wheel: there the patch was still needed
    old = load_series(root / "pkga" / "1.0")
    assert check_evidence(load_series(root / "pkga" / "2.0"), {"old.whl": fetch_wheel(old.upstream, cache)}) == [
        "retired/pkga/1.0/0001-a.yaml: evidence 1 (pkga/__init__.py contains 'x = 3') does not hold in old.whl; the "
        "patch may still be needed there: carry it forward (`eagle3ops patch rebase`) or correct the record"]


def test_a_patch_without_a_fate_a_stale_record_and_a_double_fate_are_named(tmp_path: Path) -> None:
    root, _ = _tree(tmp_path)
    rec = root / "pkga/2.0/retired/pkga/1.0/0001-a.yaml"
    moved = rec.with_name("0009-gone.yaml")
    rec.rename(moved)
    _, problems = fates(load_profiles(root), "new")
    assert any(p.startswith("pkga/1.0/0001-a.patch (profile old) has no fate in profile new") for p in problems)
    assert any(p.startswith("pkga/2.0/retired/pkga/1.0/0009-gone.yaml: retires no patch") for p in problems)
    moved.rename(rec)
    (root / "pkga/2.0/retired/pkga/1.0/0002-b.yaml").write_text(rec.read_text())
    _, problems = fates(load_profiles(root), "new")
    assert problems == ["pkga/1.0/0002-b.patch: both carried forward (pkga/2.0/0001-b.patch) and retired "
                        "(pkga/2.0/retired/pkga/1.0/0002-b.yaml); delete one"]
    r = run_cli("check", "--patches-dir", root, "--profile", "new", "--cache-dir", tmp_path / "cache",
                "--probes-module", "e3_no_such_registry")
    assert r.returncode == 5 and "FAIL pkga/1.0/0002-b.patch: both carried forward" in r.stdout, r.stdout + r.stderr


def test_a_record_that_does_not_hold_fails_the_check_and_a_bad_record_names_its_key(tmp_path: Path) -> None:
    root, cache = _tree(tmp_path)
    rec = root / "pkga/2.0/retired/pkga/1.0/0001-a.yaml"
    rec.write_text(yaml.safe_dump({"fate": "upstream", "release": "pkga 2.0",
                                   "evidence": [{"file": "pkga/__init__.py", "contains": "x = 4"}]}))
    res = check_series(root / "pkga" / "2.0", cache=cache, probes_module="e3_no_such_registry")
    assert not res.ok and any("evidence 1 (pkga/__init__.py contains 'x = 4') does not hold in pkga-2.0" in p
                              for p in res.problems), res.problems
    rec.write_text(yaml.safe_dump({"fate": "removed", "release": "pkga 2.0",
                                   "evidence": [{"file": "pkga/__init__.py", "contains": "x = 3"}]}))
    with pytest.raises(SeriesError, match=r"0001-a.yaml: invalid patch retirement record(?s:.*)fate `removed` needs"):
        load_retirement(rec)
    rec.write_text(yaml.safe_dump({"fate": "upstream", "release": "pkga 2.0",
                                   "evidence": [{"file": "pkga/__init__.py", "contains": "x", "absent": True}]}))
    with pytest.raises(SeriesError, match="needs exactly one of contains, lacks, absent"):
        load_retirement(rec)


def test_repo_every_016_patch_has_a_fate_in_a_032_profile() -> None:
    """Every series of every profile on vLLM 0.16.0 is succeeded by a profile on vLLM 0.32.0, and each of its
    patches has exactly one fate there (today: all retired, each naming its upstream release)."""
    profs = load_profiles(REPO_PATCHES)
    on = {n: {str(r) for r in p.requires} for n, p in profs.profiles.items()}
    old = {n for n, r in on.items() if "vllm==0.16.0" in r}
    new = [n for n, r in on.items() if "vllm==0.32.0" in r]
    assert old and old == {o for n in new for o in profs.get(n).succeeds}
    old_patches = {f"{d.relative_to(REPO_PATCHES).as_posix()}/{p.name}"
                   for n in old for d in profs.get(n).series_dirs for p in load_series(d).patches}
    fated: set[str] = set()
    for n in new:
        got, problems = fates(profs, n)
        assert problems == [], problems
        fated |= {f.old for f in got if f.kind in ("carried", "retired")}
    assert fated == old_patches and len(old_patches) == 15


def test_repo_records_hold_on_032_and_not_on_the_016_wheels() -> None:
    """Each record's evidence holds in its own series' pinned wheels (also checked by `patch check`) and fails
    in the wheel(s) of the series the retired patch belongs to: the record tells the two releases apart."""
    for new_dir in (REPO_PATCHES / "vllm" / "0.32.0", REPO_PATCHES / "speculators" / "0.9.0"):
        series = load_series(new_dir)
        mine = {u.wheel: fetch_wheel(u) for u in (series.upstream, *series.upstream.also)}
        assert check_evidence(series, mine) == []
        for rec in records(new_dir):
            old_dir = REPO_PATCHES / rec.relative_to(new_dir / "retired").parent
            old = load_series(old_dir)
            assert (old_dir / (rec.stem + ".patch")).is_file()
            r: Retirement = load_retirement(rec)
            assert r.release and r.note
            for u in (old.upstream, *old.upstream.also):
                with zipfile.ZipFile(fetch_wheel(u)) as zf:
                    names = set(zf.namelist())
                    held = [ev.holds(names, lambda m: zf.read(m).decode("utf-8", "replace")) for ev in r.evidence]
                assert not all(held), f"{rec}: every evidence line also holds on {u.wheel}"
