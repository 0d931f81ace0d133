"""The strict YAML loader (eagle3ops.yamlload) and every file kind that goes through it: a duplicate key anywhere is
an error naming file, line and key; documents without duplicates load exactly as yaml.safe_load loads them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from eagle3ops.yamlload import DuplicateKeyError, safe_load

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("text", "key", "line", "column", "first"),
    [
        ("a: 1\nb: 2\na: 3\n", "a", 3, 1, 1),
        ("top:\n  x: [1, {k: 1, k: 2}]\n", "k", 2, 17, 2),  # inside a flow mapping inside a sequence
        ("- n: 1\n- n: 2\n  m: 1\n  n: 3\n", "n", 4, 3, 2),  # second list item only
        ("yes: 1\ntrue: 2\n", True, 2, 1, 1),  # YAML 1.1: both are the boolean true
        ("1: a\n0x1: b\n", 1, 2, 1, 1),  # both the integer 1
    ],
)
def test_duplicate_key_named_with_file_line_and_key(text: str, key: object, line: int, column: int, first: int) -> None:
    with pytest.raises(DuplicateKeyError) as e:
        safe_load(text, source="some/file.yaml")
    assert (e.value.key, e.value.line, e.value.column, e.value.first_line) == (key, line, column, first)
    assert str(e.value).startswith(f"some/file.yaml:{line}:{column}: duplicate key {key!r} (first given at line {first}")
    assert isinstance(e.value, yaml.YAMLError)  # callers' existing `except yaml.YAMLError` still catch it


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\nb: {c: 2, d: [1, 2]}\n",
        "base: &b {x: 1, y: 2}\nderived:\n  <<: *b\n  y: 3\n",  # a merge key overridden in place is not a duplicate
        "'1': a\n1: b\n",  # a string and an integer are different keys
        "",
        "- 1\n- x: y\n",
    ],
)
def test_documents_without_duplicates_load_like_safe_load(text: str) -> None:
    assert safe_load(text) == yaml.safe_load(text)


def test_syntax_errors_name_the_source() -> None:
    with pytest.raises(yaml.YAMLError) as e:
        safe_load("a: [1\n", source="x/y.yaml")
    assert not isinstance(e.value, DuplicateKeyError) and 'in "x/y.yaml", line' in str(e.value)


def test_image_definition_with_duplicate_key(tmp_path: Path) -> None:
    from eagle3ops.images import ImageError, load_def

    text = (REPO / "images/pipeline.yaml").read_text()
    assert "\ndockerfile:" in text
    (tmp_path / "pipeline.yaml").write_text(text + "dockerfile: Dockerfile.other\n")
    line = len(text.splitlines()) + 1
    with pytest.raises(ImageError, match=rf"pipeline\.yaml:{line}:1: duplicate key 'dockerfile'"):
        load_def("pipeline", tmp_path)


def test_patch_profiles_and_upstream_with_duplicate_key(tmp_path: Path) -> None:
    from eagle3ops.patches.errors import SeriesError
    from eagle3ops.patches.series import load_profiles, load_upstream

    pdir = tmp_path / "patches"
    shutil.copytree(REPO / "patches", pdir)
    prof = pdir / "profiles.yaml"
    text = prof.read_text()
    # the same profile name twice: the second silently replaced the first before
    dup = text.replace("  speculators-0.4.0.1-vllm-0.16.0:", "  speculators-0.3.0-vllm-0.16.0:")
    prof.write_text(dup)
    line = dup.splitlines().index("  speculators-0.3.0-vllm-0.16.0:", dup.splitlines().index("  speculators-0.3.0-vllm-0.16.0:") + 1) + 1
    with pytest.raises(SeriesError) as e:
        load_profiles(pdir)
    assert f"profiles.yaml:{line}:3: duplicate key 'speculators-0.3.0-vllm-0.16.0'" in str(e.value)
    assert e.value.exit_code == 2
    up = pdir / "speculators/0.3.0/upstream.yaml"
    up.write_text(up.read_text() + "sha256: " + "0" * 64 + "\n")
    with pytest.raises(SeriesError, match=r"upstream\.yaml:\d+:1: duplicate key 'sha256'"):
        load_upstream(up)
