"""The docs a newcomer reads: the generated reference is what the code generates now, every relative link of README.md,
ARCHITECTURE.md and docs/ leads to a file, and the README stays short with the two commands first and the first-host
path inline. Pure (one subprocess that imports the CLI), ~3 s."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Pages other changes write beside this one; linked from the docs index already. A name leaves this list once its
#: file is committed (the test then checks the link like any other).
WRITTEN_BESIDE = {"docs/cycle.md",
                  "docs/spikes/vllm-0.32-cpu.md"}

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _pages() -> list[Path]:
    return [REPO / "README.md", REPO / "ARCHITECTURE.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_committed_reference_is_what_the_code_generates():
    cp = subprocess.run([sys.executable, str(REPO / "scripts/gen_reference.py"), "--check"], capture_output=True,
                        text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr


def test_every_relative_link_leads_to_a_file():
    broken = []
    for page in _pages():
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path = (page.parent / target).resolve()
            rel = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)
            if not path.exists() and rel not in WRITTEN_BESIDE:
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert broken == [], "links to nothing:\n" + "\n".join(broken)


def test_readme_is_short_with_the_two_commands_first_and_the_first_host_path_inline():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 160, "README.md grew: move detail into docs/ and link it"
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert blocks and blocks[0].splitlines()[:2] == [
        "make demo   # the whole maintenance cycle on the embedded sandbox host (sets everything up itself)",
        "make test   # the test suite (sets everything up itself; .ci/run calls exactly this)"]
    # the demo's files named, and the first host's steps inline with the files a user copies
    for needle in ("deploy/sandbox-smollm2.yaml", "deploy/pipeline.yaml", "deploy/hosts.first-host.example.yaml",
                   "deploy/pipeline.first-host.example.yaml", "make deploy", "make extract", "make train",
                   "make speculate", "make rollback", "docs/howto/first-host.md"):
        assert needle in text, needle
    for target in ("deploy", "regenerate", "extract", "train", "speculate", "rollback"):
        assert f"make {target} " in text or f"make {target}\n" in text, target


def test_first_host_examples_load_as_eagle3ops_loads_them():
    """The two files the README has a newcomer copy: the inventory entry of one GPU host and its run's pipeline."""
    from eagle3ops.config.inventory import load_inventory
    from eagle3ops.config.pipeline import parse_pipeline_config

    inv = load_inventory(REPO / "deploy/hosts.first-host.example.yaml")
    h = inv.hosts["gpu-01"]
    assert h.gpus == 8 and h.serving.kind == "container" and h.serving.served_model_name == "my-model"
    pipe = REPO / "deploy/pipeline.first-host.example.yaml"
    cfg = parse_pipeline_config(pipe.read_text(), pipe)
    assert cfg.prepare.datasets == ["regenerated/dataset.jsonl"] and cfg.train.steps == 20000


def test_every_make_target_the_readme_names_is_in_the_makefile():
    """A newcomer types what the README shows: each ``make NAME`` in it (the demo's clean-up included) is a target."""
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", (REPO / "Makefile").read_text(), re.M))
    text = (REPO / "README.md").read_text()
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", text, re.S))  # code blocks: lines starting with make
    named = set(re.findall(r"^make ([a-z][a-z0-9-]*)", blocks, re.M) + re.findall(r"`make ([a-z][a-z0-9-]*)", text))
    assert {"demo", "test", "clean-demo", "clean-images"} <= named, "the README names the demo's clean-up targets"
    assert sorted(named - targets) == [], "README names make targets the Makefile lacks"
