"""Architecture contracts (ARCHITECTURE.md): which layer may import which, and where command lines are built.

1. Import contracts, declared in pyproject.toml ``[tool.importlinter]``, checked by import-linter (``lint-imports``).
2. No module outside ``src/eagle3ops/commands/`` builds the argv of anything run on a host or through a Docker
   engine: an AST scan for list displays whose first element names a program. The exceptions are local tools that
   never reach a host or an engine of a host, each with its reason.
3. No module over 600 lines without a paragraph of its module docstring that starts "Why this module is long"
   (issue 13): split along the module's seams, or say why it is one module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src/eagle3ops"

#: Programs whose argv must come from commands/ (run on a host, in a container, or through a Docker engine).
PROGRAMS = {
    "docker", "docker-compose", "ssh", "sh", "bash", "mkdir", "cat", "tee", "rm", "mv", "find", "test", "kill",
    "sha256sum", "base64", "python3", "id", "df", "ls", "tail", "nvidia-smi", "zstd", "systemctl", "ps",
    "curl", "chown", "chmod", "git", "patch", "diff", "ip", "tc", "dpkg", "apt-get", "apt-cache", "useradd",
    "groupadd", "usermod", "umount", "ssh-keygen", "sshd", "dockerd", "pip", "uv",
}
#: module (relative to src/eagle3ops) -> programs it may start itself, and why.
LOCAL_TOOLS: dict[str, tuple[set[str], str]] = {
    "sandbox/host.py": ({"usermod", "groupadd", "useradd", "docker", "ip", "ssh", "sh"},
                        "the sandbox's own daemons and user on this machine (it is the host)"),
    "sandbox/engines.py": ({"apt-get", "apt-cache", "dpkg"}, "the sandbox engine's Debian packages, unpacked here"),
    "images/tags.py": ({"git"}, "this checkout's revision for the image label (local git)"),
}


def test_import_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    cp = subprocess.run([str(lint), "--config", str(REPO / "pyproject.toml")], cwd=REPO, capture_output=True,
                        text=True, timeout=300, env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
    assert cp.returncode == 0, cp.stdout[-4000:] + cp.stderr[-2000:]
    assert "BROKEN" not in cp.stdout and "Contracts:" in cp.stdout


def _argv_displays(path: Path) -> list[tuple[int, str]]:
    """(line, program) of each list display in ``path`` whose first element is a program name of PROGRAMS."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant) \
                and node.elts[0].value in PROGRAMS:
            found.append((node.lineno, node.elts[0].value))
    return found


def test_command_lines_are_built_only_in_commands():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("commands/"):
            continue
        allowed = LOCAL_TOOLS.get(rel, (set(), ""))[0]
        offenders += [f"{rel}:{line}: {prog}" for line, prog in _argv_displays(path) if prog not in allowed]
    assert offenders == [], "build these argv in src/eagle3ops/commands/:\n" + "\n".join(offenders)


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
    offenders = [f"{path.relative_to(SRC).as_posix()}: {why}" for path in sorted(SRC.rglob("*.py"))
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


# --- executors are made in one place (issue 23) ------------------------------------------------------------------
#: modules (relative to src/eagle3ops) that may construct the SSH executor ``Remote(...)``, and why.
REMOTE_MAKERS = {"executor.py": "the one factory of executors (for_host)"}
#: modules that may start a local process themselves (``subprocess.run/Popen/...``), and why; every other module
#: runs local commands through ``executor.local()``.
SUBPROCESS_USERS = {
    "executor.py": "the local executor itself",
    "sandbox/host.py": "development harness: the sandbox's own daemons on this machine (moves to eagle3ops_dev)",
    "sandbox/engines.py": "development harness: the sandbox engine's Debian packages (moves to eagle3ops_dev)",
    "stages/train.py": "runs in the pipeline image (torchrun workers); the image has no driver executor",
    # Not moved to executor.local() yet (issue 23, next step): each is a local tool on the build machine with its
    # own error handling (CalledProcessError text, input bytes, env): images/bases.py (debootstrap, docker import),
    # images/buildkit.py (client version probes), images/tags.py (git revision), patches/diffgen.py (diff),
    # patches/gnupatch.py (patch), patches/wheels.py (pip download), transfer/compression.py (zstd on a sample).
    "images/bases.py": "not moved yet", "images/buildkit.py": "not moved yet", "images/tags.py": "not moved yet",
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
