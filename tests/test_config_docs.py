"""The configuration package: one example file per section validates, `config docs` documents every key of every
section from the models, and all sections share one strict base and one error shape (file, key, fix)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3ops.config import ConfigError, StrictModel
from eagle3ops.config.docs import SECTIONS, _nested, docs

REPO = Path(__file__).resolve().parents[1]


def _models(root: type) -> list[type]:
    todo, seen = [root], []
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.append(m)
            todo.extend(n for f in m.model_fields.values() for n in _nested(f.annotation))
    return seen


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_example_file_validates(section: str) -> None:
    s = SECTIONS[section]
    assert s.examples
    for rel in s.examples:
        s.check(REPO / rel)


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_docs_document_every_key_of_every_model(section: str) -> None:
    text = docs(section)
    for model in _models(SECTIONS[section].model):
        assert issubclass(model, StrictModel), f"{model.__name__} must derive from config.base.StrictModel"
        assert model.__doc__, model
        assert f"### {model.__name__}" in text
        for key, field in model.model_fields.items():
            if field.exclude:
                continue
            assert field.description, f"{model.__name__}.{key} has no description"
            assert f"- `{key}` (" in text


def test_config_docs_command_per_section() -> None:
    from eagle3ops.cli import app

    r = CliRunner().invoke(app, ["config", "docs", "profiles"])
    assert r.exit_code == 0 and "### ProfileEntry" in r.output and "### HostConfig" not in r.output
    r = CliRunner().invoke(app, ["config", "docs"])
    assert r.exit_code == 0 and all(f"(`{name}`)" in r.output for name in SECTIONS)
    r = CliRunner().invoke(app, ["config", "docs", "nope"])
    assert r.exit_code == 2 and "known: inventory, pipeline, image, profiles" in " ".join(r.output.split())


@pytest.mark.parametrize(("section", "rel", "edit", "needle"), [
    ("inventory", "deploy/hosts.yaml", ("    gpus: 0\n", "    gpus: 0\n    gpuz: 1\n"), "unknown key `hosts.sandbox.gpuz`"),
    ("pipeline", "deploy/pipeline.yaml", ("  steps: 20\n", "  stepz: 20\n"), "unknown key `train.stepz`"),
    ("image", "images/serving.yaml", ("build_args: {}\n", "build_argz: {}\n"), "unknown key `build_argz`"),
    ("profiles", "patches/profiles.yaml", ("    series:\n", "    serie:\n"), "unknown key `profiles."),
])
def test_one_error_shape_in_every_section(tmp_path: Path, section: str, rel: str, edit: tuple[str, str],
                                          needle: str) -> None:
    """A misspelt key: every section's error names the file, the key (dotted) and the fix with the docs command."""
    for d in ("deploy", "images", "patches"):
        (tmp_path / d).mkdir()
    for f in ("images/serving.yaml", "patches/profiles.yaml"):
        (tmp_path / f).write_text((REPO / f).read_text())
    text = (REPO / rel).read_text()
    assert edit[0] in text
    (tmp_path / rel).write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(ConfigError) as e:
        SECTIONS[section].check(tmp_path / rel)
    msg = str(e.value)
    assert str(tmp_path / rel) in msg and needle in msg and "remove it or fix its spelling" in msg
    assert f"eagle3ops config docs {section}" in msg


def test_config_check_per_section(monkeypatch: pytest.MonkeyPatch) -> None:
    from eagle3ops.cli import app

    monkeypatch.chdir(REPO)  # the examples are named from the repository root, like --inventory's default
    for section in SECTIONS:
        r = CliRunner().invoke(app, ["config", "check", section])
        assert r.exit_code == 0, r.output
        assert all(f"{rel}: ok" in r.output for rel in SECTIONS[section].examples)
    r = CliRunner().invoke(app, ["config", "check", "pipeline", str(REPO / "deploy/hosts.yaml")])
    assert r.exit_code == 2 and "unknown key `hosts`" in r.output and "missing required key `target_model`" in r.output
