"""Shared helpers for the patch-tooling tests (imported by tests/test_patch_*.py; holds no tests itself).

Everything runs against the real speculators wheels from the package index, pinned by sha256 (fetched once into
the eagle3ops wheel cache, ``~/.cache/eagle3ops/wheels`` or ``$EAGLE3OPS_CACHE_DIR``), real GNU patch/diff and,
for capture, the real local docker engine.
"""

from __future__ import annotations

import datetime as _dt
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from eagle3ops.patches.diffgen import diff_file
from eagle3ops.patches.series import Upstream
from eagle3ops.patches.wheels import fetch_wheel, unpack_wheel

SPEC_030 = Upstream(
    package="speculators",
    version="0.3.0",
    wheel="speculators-0.3.0-py3-none-any.whl",
    sha256="10e67b28fd7a09b3f2a0c522ac0ec5d9f459c4021f7bf7e6b32413e551995f73",
)
SPEC_0401 = Upstream(
    package="speculators",
    version="0.4.0.1",
    wheel="speculators-0.4.0.1-py3-none-any.whl",
    sha256="e880958ecbec6b8d59854f846937d20576c73ecfaa5844382afcf0d4a6630f0b",
)
GEN = "speculators/data_generation/vllm_hidden_states_generator.py"
LOGU = "speculators/data_generation/logging_utils.py"
PROFILE_030 = "speculators-0.3.0-vllm-0.16.0"
PROFILE_0401 = "speculators-0.4.0.1-vllm-0.16.0"


def wheel(up: Upstream) -> Path:
    """The real pinned wheel (downloaded once, sha256 verified by fetch_wheel)."""
    return fetch_wheel(up)


def site_from_wheel(up: Upstream, dest: Path) -> Path:
    """Unpack the real wheel into ``dest`` (a site-packages-like dir with the .dist-info) and return it."""
    return unpack_wheel(wheel(up), dest)


def make_diff(site: Path, rel: str, edit: Callable[[str], str], tmp: Path) -> str:
    """A real ``diff -u`` (a/ b/ labels) of ``site/rel`` against ``edit(content)``; asserts the edit changed it."""
    old = site / rel
    text = old.read_text(encoding="utf-8")
    new_text = edit(text)
    assert new_text != text, f"edit did not change {rel}"
    new = tmp / "edited" / rel
    new.parent.mkdir(parents=True, exist_ok=True)
    new.write_text(new_text, encoding="utf-8")
    return diff_file(old, new, rel)


def header(version: str, probe: str = "test-probe", requires: str | None = "vllm==0.16.0", summary: str = "test patch") -> str:
    """A valid DEP-3 + eagle3ops header pinned to speculators==<version>."""
    lines = [
        f"Description: {summary}",
        " Made by the patch-tooling tests.",
        "Origin: vendor, https://example.invalid/eagle3ops",
        "Forwarded: not-needed",
        f"Last-Update: {_dt.date.today().isoformat()}",
        f"X-Eagle3ops-Pin: speculators=={version}",
    ]
    if requires:
        lines.append(f"X-Eagle3ops-Requires: {requires}")
    lines.append(f"X-Eagle3ops-Probe: {probe}")
    return "\n".join(lines) + "\n"


def write_series(patches_dir: Path, up: Upstream, patches: list[tuple[str, str]], *, probe: str = "test-probe", requires: str | None = "vllm==0.16.0") -> Path:
    """Write ``patches_dir/speculators/<ver>/`` (upstream.yaml, series, patch files with headers) and a
    profiles.yaml with both profiles; return the series dir. ``patches`` = [(file name, diff text)]."""
    sdir = patches_dir / "speculators" / up.version
    sdir.mkdir(parents=True, exist_ok=True)
    (sdir / "upstream.yaml").write_text(
        yaml.safe_dump({"package": up.package, "version": up.version, "wheel": up.wheel, "sha256": up.sha256}, sort_keys=False)
    )
    for name, diff in patches:
        (sdir / name).write_text(header(up.version, probe=probe, requires=requires, summary=name) + "---\n" + diff)
    (sdir / "series").write_text("# test series\n" + "".join(f"{n}\n" for n, _ in patches))
    prof = patches_dir / "profiles.yaml"
    prof.write_text(
        yaml.safe_dump(
            {
                "default": PROFILE_030,
                "profiles": {
                    PROFILE_030: {"series": ["speculators/0.3.0"], "requires": ["speculators==0.3.0", "vllm==0.16.0"]},
                    PROFILE_0401: {"series": ["speculators/0.4.0.1"], "requires": ["speculators==0.4.0.1", "vllm==0.16.0"]},
                },
            },
            sort_keys=False,
        )
    )
    return sdir


def run_cli(*args: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m eagle3ops.patches ARGS`` as a real process; returns the completed process (text)."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "eagle3ops.patches", *map(str, args)], capture_output=True, text=True, env=e, cwd=cwd, check=False, timeout=300
    )


def tree_digest(root: Path) -> dict[str, bytes]:
    """path -> bytes of every regular file under ``root`` (to assert a tree was not touched)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}
