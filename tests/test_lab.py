"""The lab's shape (``benchmarks/``): one folder per question with its README, one index that links each folder, no
file over 1 MB but those named here, and no path of the machine that measured in any committed result.

Pure: reads the checkout's files (those git tracks), runs nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
MB = 10**6

#: The files over 1 MB the lab keeps, and why: the round-3 head's two shards (19.7 MB in all), which
#: tests/test_speculate_gpu_head_bench.py checks against its provenance and serves nothing else could.
LARGE = {"benchmarks/gpu-head-smollm2/heads/smollm2-135m-instruct-eagle3/model-00001-of-00002.safetensors",
         "benchmarks/gpu-head-smollm2/heads/smollm2-135m-instruct-eagle3/model-00002-of-00002.safetensors"}
#: Folders of the lab that are no question: what several scripts import.
SHARED = {"_shared"}
#: The committed head's files, kept byte-exact (their sha256 is its provenance); its config names the folder the
#: device trained from, as the trainer wrote it.
BYTE_EXACT = {"benchmarks/gpu-head-smollm2/heads/smollm2-135m-instruct-eagle3/" + n
              for n in ("config.json", "model.safetensors.index.json")}

#: A path of the measuring machine: its temporary folders, home folders and /work (this lab's checkouts and device
#: outputs), where a path starts (not inside a word, a URL or another path, and not the container side of a bind
#: ``HOST:/ctr``, which is the container's own path).
MACHINE_PATH = re.compile(r"(?<![\w.\-/:$~])(/tmp/|/var/tmp/|/root/|/home/[\w.-]+/|/Users/[\w.-]+/|/work/)[^\s\"',;]*")


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "benchmarks"], cwd=REPO, capture_output=True, text=True, check=True)
    return [p for p in out.stdout.split("\0") if p and (REPO / p).exists()]


def machine_paths(text: str) -> list[str]:
    """The machine paths in ``text`` (see :data:`MACHINE_PATH`)."""
    return [m.group(0) for m in MACHINE_PATH.finditer(text)]


def test_the_scan_sees_a_machine_path_and_leaves_portable_ones() -> None:
    assert machine_paths('"PYTHONPATH=/tmp/site:src", "x": "/work/main/.whl/a.gz" (/root/.cache/hf)') == [
        "/tmp/site:src", "/work/main/.whl/a.gz", "/root/.cache/hf)"]
    assert machine_paths("directory: /var/tmp/heads/x\nand /home/bob/y") == ["/var/tmp/heads/x", "/home/bob/y"]
    # a bind's container side, a host's data dir, a URL, placeholders and relative paths are not the machine's
    assert machine_paths('"/var/lib/eagle3ops-sandbox/s/data/vllm:/root/.cache/vllm" https://h/tmp/a '
                         '$TMPDIR/e3s ~/x $WORK/.device/5 benchmarks/gate-aa/x.json') == []


def test_no_committed_result_carries_a_path_of_the_machine_that_measured() -> None:
    bad, seen = [], 0
    for rel in _tracked():
        if not rel.endswith((".json", ".jsonl")) or rel in BYTE_EXACT:
            continue
        seen += 1
        text = (REPO / rel).read_text()
        bad += [f"{rel}: {p}" for p in machine_paths(text)]
    assert seen > 50  # the scan reached the results
    assert bad == [], ("results carry machine paths; write results with benchmarks/_shared/lab.py's write_result "
                       "(repo-relative, ~, $TMPDIR, $WORK):\n" + "\n".join(bad[:20]))


def test_no_file_over_1_mb_but_those_named() -> None:
    sizes = {rel: (REPO / rel).stat().st_size for rel in _tracked()}
    big = {rel for rel, n in sizes.items() if n > MB}
    assert big - LARGE == set(), f"over 1 MB and not named in tests/test_lab.py's LARGE: {sorted(big - LARGE)}"
    assert LARGE <= big, f"named in LARGE but gone or small now (drop them from the list): {sorted(LARGE - big)}"


def _index_links() -> set[str]:
    text = (BENCH / "README.md").read_text()
    return {m.group(1).rstrip("/").split("/")[0] for m in re.finditer(r"\]\((?!https?:)([^)#\s]+)", text)}


def test_one_folder_per_question_each_with_its_readme_and_in_the_index() -> None:
    top = [p for p in BENCH.iterdir() if not p.name.startswith(".")]
    assert sorted(p.name for p in top if p.is_file()) == ["README.md"], "benchmarks/ holds its index and folders only"
    folders = {p.name for p in top if p.is_dir() and any(p.iterdir())} - SHARED
    assert len(folders) > 20
    missing = sorted(f for f in folders if not (BENCH / f / "README.md").is_file())
    assert missing == [], f"a question's folder without its README.md: {missing}"
    links = _index_links()
    assert folders - links == set(), f"not in benchmarks/README.md's index: {sorted(folders - links)}"


def test_every_relative_link_in_the_lab_leads_to_a_file() -> None:
    broken = []
    for readme in sorted(BENCH.rglob("README.md")):
        for m in re.finditer(r"\]\((?!https?:|mailto:)([^)#\s]+)", readme.read_text()):
            if not (readme.parent / m.group(1)).exists():
                broken.append(f"{readme.relative_to(REPO)}: {m.group(1)}")
    assert broken == [], "\n".join(broken)


def test_every_committed_result_parses() -> None:
    """Results are written by their scripts and only their path strings were ever rewritten: each still loads."""
    bad = []
    for rel in _tracked():
        text = (REPO / rel).read_text() if rel.endswith((".json", ".jsonl")) else None
        try:
            if rel.endswith(".json"):
                json.loads(text)
            elif rel.endswith(".jsonl"):
                [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as e:
            bad.append(f"{rel}: {e}")
    assert bad == []


def test_no_test_loads_code_from_the_lab() -> None:
    """Tests import what they test from the product or the harness (``eagle3ops_dev``), never a benchmark script by
    path: the lab's scripts do I/O at import and move between folders; their results are data a test may read."""
    loads = re.compile(r"spec_from_file_location\([^)]*benchmarks|sys\.path\.(?:insert|append)\([^)]*benchmarks")
    bad = [f"{p.relative_to(REPO)}: {m.group(0)!r}" for p in sorted((REPO / "tests").rglob("*.py"))
           if p.name != "test_lab.py" for m in loads.finditer(p.read_text())]  # [^)] spans a call's lines too
    assert bad == [], bad
    assert loads.search('spec_from_file_location("g",\n    REPO / "benchmarks" / "x.py")')  # the scan sees one
