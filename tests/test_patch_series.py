"""Parsing of series files, upstream.yaml, DEP-3 headers and profiles.yaml: every error names file and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3ops.patches.diffcheck import parse_diff
from eagle3ops.patches.errors import SeriesError, UnsafePatch
from eagle3ops.patches.series import Pin, load_patch, load_profiles, load_series, parse_header, read_series_file

from test_patch_helpers import SPEC_030, header, write_series

DIFF = "--- a/speculators/version.py\n+++ b/speculators/version.py\n@@ -1 +1 @@\n-a\n+b\n"


def test_header_fields_parsed() -> None:
    h = parse_header(header("0.3.0", probe="tokenizer-remote-code", requires="vllm==0.16.0, transformers==4.57.6"),
                     where="x.patch", expected_pin=Pin("speculators", "0.3.0"))
    assert h.summary == "test patch"
    assert h.description.splitlines()[1] == "Made by the patch-tooling tests."
    assert h.origin_kind == "vendor" and h.origin_ref == "https://example.invalid/eagle3ops"
    assert h.pin == Pin("speculators", "0.3.0")
    assert [str(r) for r in h.requires] == ["vllm==0.16.0", "transformers==4.57.6"]
    assert h.probe == "tokenizer-remote-code"
    assert h.forwarded == "not-needed" and h.bug is None


@pytest.mark.parametrize(
    ("drop", "needle"),
    [
        ("Description:", "'Description' is missing"),
        ("Origin:", "'Origin' is missing"),
        ("Forwarded:", "neither 'Bug' nor 'Forwarded'"),
        ("Last-Update:", "'Last-Update' is missing"),
        ("X-Eagle3ops-Pin:", "'X-Eagle3ops-Pin' is missing"),
        ("X-Eagle3ops-Probe:", "'X-Eagle3ops-Probe' is missing"),
    ],
)
def test_missing_header_field_is_named(drop: str, needle: str) -> None:
    text = "".join(ln + "\n" for ln in header("0.3.0").splitlines() if not ln.startswith(drop) and not (drop == "Description:" and ln.startswith(" ")))
    with pytest.raises(SeriesError) as e:
        parse_header(text, where="p/0001-x.patch")
    assert needle in str(e.value) and "p/0001-x.patch" in str(e.value) and "fix:" in str(e.value)


def test_pin_in_header_must_match_series_dir() -> None:
    with pytest.raises(SeriesError, match=r"X-Eagle3ops-Pin is speculators==0.4.0.1 but the patch lives in the series for speculators==0.3.0"):
        parse_header(header("0.4.0.1"), where="p.patch", expected_pin=Pin("speculators", "0.3.0"))


def test_range_pins_are_refused() -> None:
    with pytest.raises(SeriesError, match="not an exact pin"):
        Pin.parse("vllm>=0.16", where="X-Eagle3ops-Requires")


def test_pin_local_version_rule() -> None:
    assert Pin("vllm", "0.16.0").matches("0.16.0+cpu")
    assert not Pin("vllm", "0.16.0+cu128").matches("0.16.0+cpu")
    assert not Pin("vllm", "0.16.0").matches("0.16.1")


def test_bad_header_line_and_dates() -> None:
    with pytest.raises(SeriesError, match=r"p.patch:2: not a DEP-3 header field"):
        parse_header("Description: x\nthis is not a field\n", where="p.patch")
    with pytest.raises(SeriesError, match="Last-Update '29/11/2026' is not YYYY-MM-DD"):
        parse_header(_with(header("0.3.0"), "Last-Update", "29/11/2026"), where="p.patch")


def _with(text: str, key: str, value: str) -> str:
    return "".join((f"{key}: {value}" if ln.startswith(key + ":") else ln) + "\n" for ln in text.splitlines())


def test_series_file_rules(tmp_path: Path) -> None:
    s = tmp_path / "series"
    s.write_text("# comment\n0001-a.patch\n\n0002-b.patch -p1  # trailing comment\n")
    assert read_series_file(s) == ["0001-a.patch", "0002-b.patch"]
    s.write_text("0001-a.patch -p0\n")
    with pytest.raises(SeriesError, match=r"series:1: option '-p0' not supported"):
        read_series_file(s)
    s.write_text("0001-a.patch\n0001-a.patch\n")
    with pytest.raises(SeriesError, match="listed twice"):
        read_series_file(s)


def test_load_series_and_errors(tmp_path: Path) -> None:
    sdir = write_series(tmp_path / "patches", SPEC_030, [("0001-a.patch", DIFF)])
    ser = load_series(sdir)
    assert ser.package == "speculators" and ser.version == "0.3.0" and [p.name for p in ser.patches] == ["0001-a.patch"]
    assert len(ser.patches[0].sha256) == 64
    (sdir / "0002-stray.patch").write_text("x")
    assert load_series(sdir).unlisted == ["0002-stray.patch"]
    (sdir / "series").write_text("0001-a.patch\n0003-missing.patch\n")
    with pytest.raises(SeriesError, match="lists '0003-missing.patch' but .* does not exist"):
        load_series(sdir)
    (sdir / "upstream.yaml").write_text("package: speculators\nversion: 0.3.0\nwheel: w.whl\nsha256: 1234\n")
    with pytest.raises(SeriesError, match="upstream.yaml: sha256"):
        load_series(sdir)
    (sdir / "upstream.yaml").write_text(f"package: speculators\nversion: 0.4.0.1\nwheel: w.whl\nsha256: '{'a' * 64}'\n")
    with pytest.raises(SeriesError, match="says speculators==0.4.0.1 but the dir is speculators/0.3.0"):
        load_series(sdir)


def test_patch_without_diff(tmp_path: Path) -> None:
    p = tmp_path / "0001-x.patch"
    p.write_text(header("0.3.0"))
    with pytest.raises(SeriesError, match="no unified diff found"):
        load_patch(p)


def test_profiles(tmp_path: Path) -> None:
    write_series(tmp_path / "patches", SPEC_030, [("0001-a.patch", DIFF)])
    profs = load_profiles(tmp_path / "patches")
    assert profs.default == "speculators-0.3.0-vllm-0.16.0"
    assert profs.get(None).series_dirs == [tmp_path / "patches/speculators/0.3.0"]
    assert [str(p) for p in profs.get("speculators-0.4.0.1-vllm-0.16.0").requires] == ["speculators==0.4.0.1", "vllm==0.16.0"]
    with pytest.raises(SeriesError, match="(?s)no profile 'nope'.*use one of"):
        profs.get("nope")
    (tmp_path / "patches/profiles.yaml").write_text("default: a\nprofiles:\n  a:\n    series: ['../etc']\n")
    with pytest.raises(SeriesError, match="must be relative"):
        load_profiles(tmp_path / "patches")
    (tmp_path / "patches/profiles.yaml").write_text("default: b\nprofiles:\n  a:\n    series: []\n    colour: red\n")
    with pytest.raises(SeriesError, match="colour"):
        load_profiles(tmp_path / "patches")


def test_repo_profiles_file_is_valid() -> None:
    """The checked-in patches/profiles.yaml names the required profiles (speculators for the pipeline image, vLLM
    for serving), default first."""
    profs = load_profiles(Path(__file__).resolve().parents[1] / "patches")
    assert profs.default == "speculators-0.3.0-vllm-0.16.0"
    assert set(profs.profiles) == {"speculators-0.3.0-vllm-0.16.0", "speculators-0.4.0.1-vllm-0.16.0",
                                   "vllm-0.16.0-serving", "vllm-0.16.0-serving-cpu-standin",
                                   "speculators-0.9.0-vllm-0.32.0", "vllm-0.32.0-serving"}
    # the vLLM 0.32 profiles pin their stack exactly and succeed the 0.16 ones (tests/test_patch_fates.py)
    new = profs.profiles["speculators-0.9.0-vllm-0.32.0"]
    assert [str(p) for p in new.requires] == ["speculators==0.9.0", "vllm==0.32.0"]
    assert new.succeeds == ["speculators-0.3.0-vllm-0.16.0", "speculators-0.4.0.1-vllm-0.16.0"]


def test_diff_validation_rules() -> None:
    files = parse_diff(DIFF + "--- /dev/null\n+++ b/speculators/new.py\n@@ -0,0 +1 @@\n+x\n", where="p")
    assert [(f.path, f.added) for f in files] == [("speculators/version.py", False), ("speculators/new.py", True)]
    assert files[0].hunks[0].header == "@@ -1,1 +1,1 @@"
    with pytest.raises(UnsafePatch, match="no a/ or b/ prefix"):
        parse_diff("--- version.py\n+++ version.py\n@@ -1 +1 @@\n-a\n+b\n", where="p")
    with pytest.raises(UnsafePatch, match="appears twice"):
        parse_diff(DIFF + DIFF, where="p")
    with pytest.raises(UnsafePatch, match="new file mode"):
        parse_diff("diff --git a/speculators/l b/speculators/l\nnew file mode 120000\n--- /dev/null\n+++ b/speculators/l\n@@ -0,0 +1 @@\n+/etc/passwd\n", where="p")
