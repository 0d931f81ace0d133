"""No reference to this project's own tracker in code, docs or CLI help; upstream citations stay.

A reader of the code, the docs or ``eagle3ops --help`` cannot open this project's tracker, so a comment, docstring,
heading, test name or help text says *why* (the behaviour or the reason), never which ticket asked for it. Citations
of upstream trackers stay: they are public and say where a mirrored behaviour comes from (``vllm #33736``,
``speculators issue #279``, ``pip #9644``, ``vLLM PR #36361``, any URL).

What is scanned: every file git tracks (code, tests, scripts, benchmark scripts and READMEs, docs, README.md,
ARCHITECTURE.md, Makefile, Dockerfiles, images/, deploy/, patches/, .ci/, requirements/), and the help of every
command and sub-command of the CLI, hidden ones included, read from the click command tree (the text ``--help``
renders). Not scanned:

- JSON/JSONL files: benchmark results and test data are records of a run, written by their script and never edited
  by hand; the scripts that write their keys and descriptions are scanned, so every result written from now on is
  clean, and a committed result changes only when its script runs again.
- In a ``.patch`` file, the diff's context and removed lines: that text is upstream's. The header (the
  description) and the added lines are this project's and are scanned.
- This file: its examples are the forms it looks for.

The forms (:data:`TRACKER`): an issue number in any spelling (``issue 45``, ``issue #45``, ``issues 12/13``, a test
named ``test_issue_45_...``), a bare ``#45`` or ``(#45)``, the ``Done-when`` section, "the/this issue" as a reference
("the issue's 2.5", "round-5 issue", "per issue") and an issue's numbered items and kinds (``item 9``, ``kind 10``).
What is allowed first (:data:`UPSTREAM`) is removed before the forms are looked for: a URL, an upstream project's
name right before its ``#N`` (or ``issue #N``, ``issues N and M``, ``PR #N``, and a list after it: ``vllm #33497,
#40551``), ``PR #N`` (this project has no pull requests), ``hunk #N`` and ``reference.rej: FILE #N`` (hunk numbers
in patch output) and a CSS colour. The ``done_when`` key of a benchmark's JSON stays: its committed results are read
back by its script (the serving targets that run is measured against); a numbered one (``done_when_2``) does not.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve().relative_to(REPO).as_posix()

#: Upstream projects whose trackers the code cites (name right before ``#N``). A new upstream name goes here.
UPSTREAM_NAMES = (
    "vllm", "speculators", "specforge", "sglang", "pip", "moby", "conda", "docker-py", "docker", "transformers",
    "torch", "pytorch", "typer", "click", "fabric", "paramiko", "pydantic", "rich", "buildkit", "uv", "cpython",
    "python", "huggingface_hub", "accelerate", "flashinfer", "triton", "nccl", "kubernetes",
)
_NAMES = "|".join(re.escape(n) for n in UPSTREAM_NAMES)
#: Text removed before the tracker forms are looked for: upstream citations and look-alikes.
UPSTREAM = re.compile(
    r"https?://\S+"
    rf"|\b(?:{_NAMES}|[\w.-]+/[\w.-]+)(?:\s+(?:issues?|PRs?|pull\s+requests?)\s*#?|\s*#)\d+"
    r"(?:\s*(?:,|/|and|or)\s*(?:PR\s*)?#?\d+)*"
    r"|\bPR\s*#\d+|\bhunk\s+#\d+|reference\.rej: \S+ #\d+|:\s*#[0-9a-fA-F]{3,8}\b",
    re.IGNORECASE,
)
#: This project's tracker, in the forms it was cited.
TRACKER = re.compile(
    r"(?i:(?<![a-z])issues?[\s_#-]*\d+)"              # issue 45, issue #45, issues 12/13, Issue26, test_issue_45
    r"|(?<![\w&#])#\d+\b"                            # #45, (#45)
    r"|\bDone[- ]when\b|(?i:\bdone-when\b|\bdone[-_ ]when[-_ ]*\(?\d)"  # the Done-when section, done_when_2
    r"|(?i:(?<![a-z])(?:the|this|that|per|which|round[- ]?\d+)[\s_]+issue(?:'s)?(?![a-z]))"  # the issue's, per issue
    r"|\b(?:[Ii]tems?|[Kk]inds?)\s+\d+\b"           # an issue's numbered items and kinds: "item 9:", "(kind 10)"
)

#: The landing check's own rule (the before-stop hook): ``[Ii]ssues? #?[0-9]+`` in src/, docs/ and README.md, lines
#: naming github.com, ``vllm #``, ``speculators #``, ``SpecForge #`` or ``PR #`` left out. Its allow rule is narrower
#: than :data:`UPSTREAM` (``speculators issue #279`` is flagged there), so it is checked too.
HOOK = re.compile(r"[Ii]ssues? #?[0-9]+")
HOOK_ALLOWS = re.compile(r"github\.com|vllm #|speculators #|SpecForge #|PR #")


def tracker_refs(text: str) -> list[str]:
    """The tracker references in ``text``: each match of :data:`TRACKER` once :data:`UPSTREAM` spans are removed,
    with up to 30 characters either side (one line)."""
    rest = UPSTREAM.sub(lambda m: " " * len(m.group(0)), text)
    return [" ".join(text[max(m.start() - 30, 0):m.end() + 30].split()) for m in TRACKER.finditer(rest)]


def _own_text(path: str, text: str) -> str:
    """The part of a tracked file this project wrote: a ``.patch`` file's header and added lines only."""
    if not path.endswith(".patch"):
        return text
    head, _, diff = text.partition("\ndiff --git ")
    return head + "\n" + "\n".join(l[1:] for l in diff.splitlines() if l.startswith("+") and not l.startswith("+++"))


def scanned_files() -> list[str]:
    """Tracked text files the scan reads (see the module docstring for what is left out and why)."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0")
            if p and p != THIS and not p.endswith((".json", ".jsonl", ".png", ".safetensors"))]


def cli_help_texts() -> dict[str, str]:
    """``eagle3ops ...`` command path → every help string ``--help`` renders for it (the command's help, short help
    and epilog; each option's and argument's help), hidden commands included, read from the click command tree."""
    from typer.main import get_command

    from eagle3ops.cli import app

    texts: dict[str, str] = {}

    def walk(cmd, path: str) -> None:
        parts = [cmd.help, cmd.short_help, cmd.epilog] + [getattr(p, "help", None) for p in cmd.params]
        texts[path] = "\n".join(t for t in parts if t)
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(get_command(app), "eagle3ops")
    return texts


def test_no_tracker_reference_in_code_docs_or_cli_help():
    files = scanned_files()
    assert len(files) > 300 and "src/eagle3ops/cli.py" in files and "README.md" in files  # the scan reads the repo
    found = []
    for path in files:
        try:
            text = (REPO / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        own = _own_text(path, text)
        for lineno, line in enumerate(own.splitlines(), 1):
            found += [f"{path}:{lineno}: {ref}" for ref in tracker_refs(line)]
            if path.startswith(("src/", "docs/", "README.md")) and HOOK.search(line) and not HOOK_ALLOWS.search(line):
                found.append(f"{path}:{lineno}: (the landing check's rule) {line.strip()[:80]}")
    helps = cli_help_texts()
    assert len(helps) > 30 and "eagle3ops release" in helps  # every command and sub-command was read
    for path, text in helps.items():
        found += [f"`{path} --help`: {ref}" for ref in tracker_refs(text)]
    assert not found, (f"{len(found)} references to this project's tracker (say why, not which issue; an upstream "
                       f"project's name before its #N is allowed, see UPSTREAM_NAMES):\n" + "\n".join(found))


@pytest.mark.parametrize("text", [
    "serving restarts twice (issue 45)", "see issue #45", "issues 12/13 split it", "Issue 26 kind 2: templates",
    "def test_issue_45_holds():", "rolled back (#45)", "as #45 asked", "Done-when (2)'s second half",
    "the \"Done when\" checks", "the issue's 2.5 is not reached", "CI may grow for this issue",
    "a round-5 issue", "one figure per issue", "the #279 class", "# ---- item 9: the decision", "(kind 10, pure)",
    "def test_serves_smollm2_as_the_issue_says():", 'report["done_when_2"]', "done when (2) holds",
])
def test_the_scan_sees_each_form_of_a_tracker_reference(text):
    assert tracker_refs(text), text


@pytest.mark.parametrize("text", [
    "vllm #33736", "vLLM PR #36361", "speculators issue #279", "(pip issues #9644, #12345: ...)",
    "vllm #33497, #40551", "SpecForge #544/PR #564", "(conda #10351, vllm #13836)", "sglang #27829",
    "https://github.com/vllm-project/speculators/issues/279", "vllm-project/vllm#33736",
    "vllm-project/vllm issues 27969 and 51660", "hunk #2 does not match",
    "color: #222;", "\"#1f77b4\"", "a chunked run is done when its train is", "Bug field (upstream issue URL)",
    "round 3 of the benchmark", "fig['done_when']",
])
def test_the_scan_lets_upstream_citations_and_look_alikes_stand(text):
    assert not tracker_refs(text), text
