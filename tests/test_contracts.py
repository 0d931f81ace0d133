"""Architecture contracts (ARCHITECTURE.md): which layer may import which, and where command lines are built.

1. Import contracts, declared in pyproject.toml ``[tool.importlinter]``, checked by import-linter (``lint-imports``).
2. No module outside ``src/eagle3ops/commands/`` builds the argv of anything run on a host or through a Docker
   engine: an AST scan for list displays whose first element names a program. The exceptions are local tools that
   never reach a host or an engine of a host, each with its reason.
3. No module over 600 lines without a paragraph of its module docstring that starts "Why this module is long"
   (issue 13): split along the module's seams, or say why it is one module.
4. The development harness (``src/eagle3ops_dev``) stays out of the product (issue 23): a contract that the product
   never imports it (and a test that the contract fails when a product module does), and the production wheel,
   built here and listed, holds no sandbox, demo, stand-in base builder or tiny model.

Checks 2 and 3 cover both packages; the harness's argv builders (``provision``, ``headspecs``) are its own
``commands``.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src/eagle3ops"
DEV = REPO / "src/eagle3ops_dev"

#: Programs whose argv must come from commands/ (run on a host, in a container, or through a Docker engine).
PROGRAMS = {
    "docker", "docker-compose", "ssh", "sh", "bash", "mkdir", "cat", "tee", "rm", "mv", "find", "test", "kill",
    "sha256sum", "base64", "python3", "id", "df", "ls", "tail", "nvidia-smi", "zstd", "systemctl", "ps",
    "curl", "chown", "chmod", "git", "patch", "diff", "ip", "tc", "dpkg", "apt-get", "apt-cache", "useradd",
    "groupadd", "usermod", "umount", "ssh-keygen", "sshd", "dockerd", "pip", "uv",
}
#: module (relative to src/) -> programs it may start itself, and why.
LOCAL_TOOLS: dict[str, tuple[set[str], str]] = {
    "eagle3ops_dev/sandbox/host.py": ({"usermod", "groupadd", "useradd", "docker", "ip", "ssh", "sh"},
                                      "the sandbox's own daemons and user on this machine (it is the host)"),
    "eagle3ops_dev/sandbox/engines.py": ({"apt-get", "apt-cache", "dpkg"},
                                         "the sandbox engine's Debian packages, unpacked here"),
    "eagle3ops/images/tags.py": ({"git"}, "this checkout's revision for the image label (local git)"),
}
#: Where argv may be built (relative to src/): the product's commands/ and the harness's own argv builders.
COMMAND_MODULES = ("eagle3ops/commands/", "eagle3ops_dev/provision.py", "eagle3ops_dev/headspecs.py")


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` of the driver venv over ``root`` (a checkout: its pyproject.toml and src/)."""
    lint = Path(sys.executable).parent / "lint-imports"
    return subprocess.run([str(lint), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(root / "src"), "PATH": "/usr/bin:/bin"})


def test_import_contracts_hold():
    cp = _lint_imports(REPO)
    assert cp.returncode == 0, cp.stdout[-4000:] + cp.stderr[-2000:]
    assert "BROKEN" not in cp.stdout and "Contracts:" in cp.stdout
    assert "the product never imports the development harness" in " ".join(cp.stdout.split())


HARNESS_CONTRACT = "the product never imports the development harness"


def test_the_harness_contract_fails_when_a_product_module_imports_the_harness(tmp_path):
    """A copy of the tree whose product module ``eagle3ops.health`` imports the sandbox: lint-imports fails and
    names that contract and that import (so the passing run above is a real check, not an empty graph)."""
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(REPO / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    health = tmp_path / "src/eagle3ops/health.py"
    health.write_text(health.read_text() + "\n\nfrom eagle3ops_dev import sandbox  # noqa: E402,F401\n")
    cp = _lint_imports(tmp_path)
    out = " ".join(cp.stdout.split())
    assert cp.returncode != 0, out[-3000:]
    assert f"{HARNESS_CONTRACT}" in out and "BROKEN" in out, out[-3000:]
    assert "eagle3ops.health -> eagle3ops_dev.sandbox" in out, out[-3000:]


def _argv_displays(path: Path) -> list[tuple[int, str]]:
    """(line, program) of each list display in ``path`` whose first element is a program name of PROGRAMS."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant) \
                and node.elts[0].value in PROGRAMS:
            found.append((node.lineno, node.elts[0].value))
    return found


def _sources() -> list[Path]:
    """Every Python file of the product and of the harness (the remote-code files a tiny model ships included)."""
    return sorted([*SRC.rglob("*.py"), *DEV.rglob("*.py")])


def test_command_lines_are_built_only_in_commands():
    offenders = []
    for path in _sources():
        rel = path.relative_to(SRC.parent).as_posix()
        if rel.startswith(COMMAND_MODULES):
            continue
        allowed = LOCAL_TOOLS.get(rel, (set(), ""))[0]
        offenders += [f"{rel}:{line}: {prog}" for line, prog in _argv_displays(path) if prog not in allowed]
    assert offenders == [], "build these argv in src/eagle3ops/commands/:\n" + "\n".join(offenders)
    assert all((SRC.parent / m).exists() for m in [*LOCAL_TOOLS, *COMMAND_MODULES]), "a listed module moved"


def test_the_scan_sees_an_argv_display(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('def f(h):\n    return ["docker", "-H", h, "ps"]\n')
    assert _argv_displays(p) == [(2, "docker")]


#: A module longer than this says at its top why it is one module (issue 13).
LONG_MODULE_LINES = 600
LONG_REASON = "Why this module is long"


def _long_without_reason(path: Path) -> str | None:
    """``"<lines> lines"`` when ``path`` is over LONG_MODULE_LINES lines and no paragraph of its module docstring
    starts with LONG_REASON; else None."""
    text = path.read_text()
    lines = len(text.splitlines())
    if lines <= LONG_MODULE_LINES:
        return None
    doc = ast.get_docstring(ast.parse(text)) or ""
    paragraphs = [p.strip() for p in doc.split("\n\n")]
    return None if any(p.startswith(LONG_REASON) for p in paragraphs) else f"{lines} lines"


def test_every_long_module_says_why_at_its_top():
    offenders = [f"{path.relative_to(SRC.parent).as_posix()}: {why}" for path in _sources()
                 if (why := _long_without_reason(path))]
    assert offenders == [], (f"split these modules along their seams, or start a paragraph of the module docstring "
                             f"with {LONG_REASON!r} (over {LONG_MODULE_LINES} lines):\n" + "\n".join(offenders))


def test_the_long_module_check_sees_a_missing_reason(tmp_path):
    body = "x = 1\n" * LONG_MODULE_LINES
    bare = tmp_path / "bare.py"
    bare.write_text('"""A module.\n\nIt does one thing."""\n' + body)
    assert _long_without_reason(bare) == f"{LONG_MODULE_LINES + 3} lines"
    said = tmp_path / "said.py"
    said.write_text(f'"""A module.\n\n{LONG_REASON}: one state machine."""\n' + body)
    assert _long_without_reason(said) is None
    short = tmp_path / "short.py"
    short.write_text('"""A module."""\nx = 1\n')
    assert _long_without_reason(short) is None


# --- the production wheel ---------------------------------------------------------------------------------------

#: Names that must not be in the production wheel: the harness package and what it holds.
HARNESS_NAMES = ("eagle3ops_dev", "sandbox", "demo", "tinymodel", "tinykimi", "tinytrained", "tinydraft", "smollm2",
                 "bases.py", "provision.py", "headspecs.py", "remote_code")


def test_the_production_wheel_holds_no_harness(tmp_path):
    """Build the wheel as a release would (``pip wheel --no-deps --no-build-isolation``, setuptools from the driver
    venv: requirements/driver.lock pins it) from a copy of the checkout, and list it: the product's modules and data
    are in it, nothing of the development harness is."""
    src = tmp_path / "checkout"
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / f, src / f)
    shutil.copytree(REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path / "dist"
    cp = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                         "-q", "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    wheels = list(out.glob("eagle3ops-*.whl"))
    assert len(wheels) == 1, list(out.iterdir())
    names = zipfile.ZipFile(wheels[0]).namelist()
    for must in ("eagle3ops/cli.py", "eagle3ops/patches/probes.py", "eagle3ops/patches/fixtures.py",
                 "eagle3ops/images/build.py", "eagle3ops/templates/report.html.j2"):
        assert must in names, f"{must} missing from the wheel"
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"eagle3ops"}, f"the wheel holds top-level packages besides eagle3ops: {tops}"
    harness = [n for n in names if any(h in n for h in HARNESS_NAMES)]
    assert harness == [], f"the production wheel ships development harness files: {harness}"
    entry = [n for n in names if n.endswith("entry_points.txt")]
    assert entry and "eagle3ops_dev" not in zipfile.ZipFile(wheels[0]).read(entry[0]).decode()


# --- executors are made in one place (issue 23) ------------------------------------------------------------------
#: modules (relative to src/eagle3ops) that may construct the SSH executor ``Remote(...)``, and why.
REMOTE_MAKERS = {"executor.py": "the one factory of executors (for_host)"}
#: modules of the product (the harness in src/eagle3ops_dev runs its own daemons and is not scanned) that may start a local process themselves (``subprocess.run/Popen/...``), and why; every other module
#: runs local commands through ``executor.local()``.
SUBPROCESS_USERS = {
    "executor.py": "the local executor itself",
    "stages/train.py": "runs in the pipeline image (torchrun workers); the image has no driver executor",
    # Not moved to executor.local() yet (issue 23, next step): each is a local tool on the build machine with its
    # own error handling (CalledProcessError text, input bytes, env): images/buildkit.py (client version probes), images/tags.py (git revision), patches/diffgen.py (diff),
    # patches/gnupatch.py (patch), patches/wheels.py (pip download), transfer/compression.py (zstd on a sample).
    "images/buildkit.py": "not moved yet", "images/tags.py": "not moved yet",
    "patches/diffgen.py": "not moved yet", "patches/gnupatch.py": "not moved yet", "patches/wheels.py": "not moved yet",
    "transfer/compression.py": "not moved yet",
}
_STARTERS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"}


def _executor_uses(path: Path) -> list[tuple[int, str]]:
    """(line, what) of each ``Remote(...)`` construction and each ``subprocess.<starter>(...)`` call in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "Remote" or isinstance(f, ast.Attribute) and f.attr == "Remote":
            found.append((node.lineno, "Remote"))
        elif isinstance(f, ast.Attribute) and f.attr in _STARTERS and isinstance(f.value, ast.Name) \
                and f.value.id == "subprocess":
            found.append((node.lineno, "subprocess"))
    return found


def test_executors_are_made_only_in_executor_py():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for line, what in _executor_uses(path):
            allowed = REMOTE_MAKERS if what == "Remote" else SUBPROCESS_USERS
            if rel not in allowed:
                offenders.append(f"{rel}:{line}: {what}")
    assert offenders == [], ("use eagle3ops.executor.for_host(...) / executor.local() instead:\n"
                             + "\n".join(offenders))


def test_the_executor_scan_sees_a_remote_and_a_subprocess(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("import subprocess\nfrom eagle3ops import remote\n"
                 "def f(h):\n    r = remote.Remote(h)\n    subprocess.run(['true'])\n    return subprocess.PIPE\n")
    assert _executor_uses(p) == [(4, "Remote"), (5, "subprocess")]
