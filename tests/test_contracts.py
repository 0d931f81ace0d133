"""Architecture contracts (ARCHITECTURE.md): which layer may import which, and where command lines are built.

1. Import contracts, declared in pyproject.toml ``[tool.importlinter]``, checked by import-linter (``lint-imports``).
2. No module outside ``src/eagle3ops/commands/`` builds the argv of anything run on a host or through a Docker
   engine: an AST scan for list displays whose first element names a program. The exceptions are local tools that
   never reach a host or an engine of a host, each with its reason.
3. No module over 600 lines without a paragraph of its module docstring that starts "Why this module is long":
   split along the module's seams, or say why it is one module.
4. The development harness (``src/eagle3ops_dev``) stays out of the product: a contract that the product
   never imports it (and a test that the contract fails when a product module does), an AST scan that no product
   module imports it by name either nor names it in a message, and the production wheel, built here and listed,
   holds no sandbox, demo, stand-in base builder or trained sandbox target (the tiny models the probes build are
   product: ``eagle3ops.fixtures``). The in-image suite checks that the pipeline image cannot import the harness.

5. A two-letter (or any) module alias names one module across ``src/`` and ``tests/`` (``pr`` once meant
   ``commands.process`` in some files and ``speculate.prompts`` in others).
6. The words keep their meaning (ARCHITECTURE.md "Conventions"): *check* inspects with no target code running,
   *probe* runs the patched target code on tiny input against a reference, *verify* compares with a recorded
   identity, *trial* starts something throwaway only to see that it runs. Mechanically: the CLI commands and the
   modules named with those words are exactly the listed ones, the old ``verify`` commands are hidden deprecated
   aliases, and no module named for checking imports one that runs probes.

Checks 2 and 3 cover both packages; the harness's argv builders (``provision``, ``headspecs``) are its own
``commands``.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import grimp
import pytest

from eagle3ops.fixtures import tinykimi

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
    "eagle3ops_dev/pagecache.py": ({"docker"}, "the page-cache warm-up container on this machine's engines"),
    "eagle3ops_dev/fleet.py": ({"ip", "tc"}, "the fleet fixture's namespaces and rate-limited links on this "
                               "machine (it is the network)"),
}
#: Where argv may be built (relative to src/): the product's commands/ and the harness's own argv builders.
COMMAND_MODULES = ("eagle3ops/commands/", "eagle3ops_dev/provision.py", "eagle3ops_dev/headspecs.py")


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` of the driver venv over ``root`` (a checkout: its pyproject.toml and src/)."""
    lint = Path(sys.executable).parent / "lint-imports"
    return subprocess.run([str(lint), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(root / "src"), "PATH": "/usr/bin:/bin"})


def _contract_names(root: Path = REPO) -> list[str]:
    """The names of the import contracts declared in ``root``'s pyproject.toml, in order."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    return [c["name"] for c in config["tool"]["importlinter"]["contracts"]]


def _verdicts(stdout: str, names: list[str]) -> dict[str, str]:
    """``{contract name: "KEPT" | "BROKEN"}`` from lint-imports' summary (its lines wrap at 80 columns, so the text
    is compared with whitespace collapsed). Raises AssertionError when a contract has no verdict."""
    out = " ".join(stdout.split())
    verdicts = {}
    for name in names:
        found = [v for v in ("KEPT", "BROKEN") if f"{name} {v}" in out]
        assert len(found) == 1, f"no verdict for contract {name!r} in:\n{stdout[-3000:]}"
        verdicts[name] = found[0]
    return verdicts


def _lint_copy_with_import(tmp_path: Path, module: str, line: str) -> tuple[subprocess.CompletedProcess, str]:
    """lint-imports over a copy of this checkout (pyproject.toml and src/) in which ``module`` (a path under src/;
    created when missing) ends with ``line``; returns the run and its stdout with whitespace collapsed."""
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(REPO / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    path = tmp_path / "src" / module
    path.write_text((path.read_text() if path.exists() else "") + f"\n\n{line}  # noqa: E402,F401\n")
    cp = _lint_imports(tmp_path)
    return cp, " ".join(cp.stdout.split())


def test_import_contracts_hold():
    """Every contract of pyproject.toml is checked and kept; lint-imports stays fast (the whole run, the product
    and the harness graphs built from scratch: ~0.2 s here) so that it costs the suite nothing."""
    t0 = time.monotonic()
    cp = _lint_imports(REPO)
    took = time.monotonic() - t0
    assert cp.returncode == 0, cp.stdout[-4000:] + cp.stderr[-2000:]
    names = _contract_names()
    assert set(_verdicts(cp.stdout, names).values()) == {"KEPT"}
    assert f"Contracts: {len(names)} kept, 0 broken." in cp.stdout
    assert {LAYERS_CONTRACT, INDEPENDENCE_CONTRACT, PROTECTED_CONTRACT, HARNESS_CONTRACT, SSH_CONTRACT} <= set(names)
    assert took < 30, f"lint-imports took {took:.1f} s"


HARNESS_CONTRACT = ("the product never imports the development harness (eagle3ops_dev: sandbox, demo, stand-in "
                    "bases, trained sandbox target)")
LAYERS_CONTRACT = next(n for n in _contract_names() if n.startswith("layers:"))
INDEPENDENCE_CONTRACT = ("independent sides: the host-side supervisor, the in-image stages and the driver's executor "
                         "never import one another")
PROTECTED_CONTRACT = ("the driver never imports the host-side supervisor (only the plan schema, in configuration): "
                      "nothing outside supervisor/ imports it")
SSH_CONTRACT = "the in-image stages and the host-side supervisor use no SSH library"


@pytest.mark.parametrize(("module", "line", "broken", "said"), [
    # a product module imports the harness (one at the top: the sandbox's own imports go down the layers)
    ("eagle3ops/console.py", "from eagle3ops_dev import sandbox", {HARNESS_CONTRACT},
     "eagle3ops.console -> eagle3ops_dev.sandbox"),
    # a lower layer imports a higher one (health sits below the CLI and orchestration)
    ("eagle3ops/health.py", "from eagle3ops import report", {LAYERS_CONTRACT},
     "eagle3ops.health is not allowed to import eagle3ops.report: - eagle3ops.health -> eagle3ops.report"),
    # a new module under eagle3ops/ that no layer names (the contract is exhaustive)
    ("eagle3ops/newthing.py", "X = 1", {LAYERS_CONTRACT},
     "The following modules are not listed as layers: - eagle3ops.newthing"),
    # an in-image stage imports the driver's executor: layers allow it (the executor sits lower), independence
    # does not (and the executor's SSH library comes with it)
    ("eagle3ops/stages/manifest.py", "from eagle3ops import remote", {INDEPENDENCE_CONTRACT, SSH_CONTRACT},
     "eagle3ops.stages is not allowed to import eagle3ops.remote: - eagle3ops.stages.manifest -> eagle3ops.remote"),
    # a driver module imports the supervisor: allowed by the layers (the supervisor sits lower), not by protection
    ("eagle3ops/window/planner.py", "from eagle3ops.supervisor import journal", {PROTECTED_CONTRACT},
     "Illegal imports of protected package eagle3ops.supervisor: - eagle3ops.window.planner -> "
     "eagle3ops.supervisor.journal"),
], ids=["harness", "layers", "layers-exhaustive", "independence", "protected"])
def test_each_kind_of_import_contract_fails_on_an_offending_import(tmp_path, module, line, broken, said):
    """A copy of the tree with one offending import: lint-imports fails, exactly the contracts named break, and the
    report names the import (so the passing run above is a real check, not an empty graph)."""
    cp, out = _lint_copy_with_import(tmp_path, module, line)
    assert cp.returncode != 0, out[-3000:]
    verdicts = _verdicts(cp.stdout, _contract_names(tmp_path))
    assert {n for n, v in verdicts.items() if v == "BROKEN"} == broken, verdicts
    assert said in out, out[-3000:]


# --- no import circles ------------------------------------------------------------------------------------------


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """One circle per group of modules that import one another (a strongly connected component of the module-level
    import graph, Tarjan's algorithm, iterative): the shortest path from the group's first module back to itself,
    as ``[a, b, ..., a]``. Empty when the graph has no circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    group.append(m)
                    if m == node:
                        break
                if len(group) > 1 or node in graph.find_modules_directly_imported_by(node):
                    groups.append(sorted(group))
    return [_shortest_circle(graph, group) for group in groups]


def _shortest_circle(graph: grimp.ImportGraph, group: list[str]) -> list[str]:
    """The shortest import path from ``group[0]`` back to itself inside ``group`` (breadth first)."""
    members, start = set(group), group[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for m in frontier:
            for nxt in sorted(graph.find_modules_directly_imported_by(m) & members):
                if nxt == start:
                    path = [m]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, start]
                if nxt not in previous:
                    previous[nxt] = m
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle through {start} inside {group}")


def _describe(graph: grimp.ImportGraph, circle: list[str]) -> str:
    """``a -> b (l.12) -> ... -> a (l.3)``: each step with the line numbers of its imports."""
    steps = [circle[0]]
    for a, b in zip(circle, circle[1:]):
        lines = sorted({d["line_number"] for d in graph.get_import_details(importer=a, imported=b)})
        steps.append(f"{b} (l.{','.join(map(str, lines))})")
    return " -> ".join(steps)


def _module_name(path: Path) -> str:
    """The dotted module of a source file under ``src/`` (a package's ``__init__.py`` is the package)."""
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def annotation_imports(path: Path, modules: set[str]) -> list[tuple[int, str]]:
    """(line, module) of each module of ``modules`` that a string annotation in ``path`` names by its dotted path
    (``x: "eagle3ops.window.preflight.Preflight"``, or a name inside a string such as ``"list[pkg.mod.Name]"``):
    the longest dotted prefix that is a module. Such a name needs no import to be read by a type checker, so the
    import graph alone would not see this dependency. Names imported by the module are left to the graph."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        annotations = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            annotations += [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
                            if x is not None and x.annotation is not None]
            annotations += [node.returns] if node.returns is not None else []
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        for ann in annotations:
            for const in ast.walk(ann):
                if not (isinstance(const, ast.Constant) and isinstance(const.value, str)):
                    continue
                try:
                    parsed = ast.parse(const.value, mode="eval")
                except SyntaxError:  # a Literal's string value, not a type
                    continue
                inner = {id(a.value) for a in ast.walk(parsed) if isinstance(a, ast.Attribute)}
                for ref in ast.walk(parsed):
                    if isinstance(ref, ast.Attribute) and id(ref) not in inner:  # whole dotted names only
                        parts = ast.unparse(ref).split(".")
                        hit = next((".".join(parts[:n]) for n in range(len(parts), 0, -1)
                                    if ".".join(parts[:n]) in modules), None)
                        if hit:
                            found.append((const.lineno, hit))
    return sorted(set(found))


def _module_graph() -> grimp.ImportGraph:
    """The module-level import graph of the product and the harness (no cache), at type level: imports under
    ``if TYPE_CHECKING:`` count (a type checker follows them; a circle there is a module that knows its caller),
    and so does each module a string annotation names by its dotted path (:func:`annotation_imports`)."""
    graph = grimp.build_graph("eagle3ops", "eagle3ops_dev", cache_dir=None, exclude_type_checking_imports=False)
    for importer, line, imported in _annotation_edges(frozenset(graph.modules)):
        graph.add_import(importer=importer, imported=imported, line_number=line, line_contents="string annotation")
    return graph


@functools.lru_cache(maxsize=1)
def _annotation_edges(modules: frozenset[str]) -> tuple[tuple[str, int, str], ...]:
    """(importer, line, imported) of every string annotation's module in the sources (read once per session)."""
    return tuple((_module_name(path), line, imported) for path in _sources()
                 for line, imported in annotation_imports(path, set(modules)) if imported != _module_name(path))


def test_no_import_circles():
    """No module imports itself through others, in the product or the harness, at type level too: a circle means a
    private helper or a constant sits in the wrong module (move it down to where both sides can import it), or a
    callee names its caller's type (give it a Protocol of what it uses, in its own module)."""
    graph = _module_graph()
    assert len(graph.modules) > 100
    circles = import_cycles(graph)
    assert circles == [], "import circles (move the shared piece to the module both can import):\n" + "\n".join(
        _describe(graph, c) for c in circles)


def test_the_circle_check_counts_type_level_imports(tmp_path):
    """The graph holds an import made only under ``if TYPE_CHECKING:`` (commands/fleet.py names ``HostConfig``
    in annotations only), and a string annotation's dotted module is read as an import."""
    graph = _module_graph()
    details = graph.get_import_details(importer="eagle3ops.commands.fleet", imported="eagle3ops.config")
    assert [d["line_contents"] for d in details] == ["from eagle3ops.config import HostConfig"], details
    p = tmp_path / "m.py"
    p.write_text('from typing import Literal\n\n\ndef f(x: "eagle3ops.window.preflight.Preflight", '
                 'y: Literal["a.b"]) -> "list[eagle3ops.cli.Thing]":\n    pass\n\n\n'
                 'z: "eagle3ops.redact" = None\n')
    modules = set(graph.modules)
    assert annotation_imports(p, modules) == [(4, "eagle3ops.cli"), (4, "eagle3ops.window.preflight"),
                                              (8, "eagle3ops.redact")]


def test_the_circle_check_sees_a_circle():
    """The same check on the real graph with one import added from the bottom to the top reports that circle,
    with its path; and a two-module circle is reported as such."""
    graph = _module_graph()
    graph.add_import(importer="eagle3ops.yamlload", imported="eagle3ops.cli", line_number=1,
                     line_contents="from eagle3ops import cli")
    circles = import_cycles(graph)
    assert len(circles) == 1, circles
    circle = circles[0]
    assert circle[0] == circle[-1] and {"eagle3ops.yamlload", "eagle3ops.cli"} <= set(circle), circle
    for a, b in zip(circle, circle[1:]):
        assert b in graph.find_modules_directly_imported_by(a), (a, b)
    said = _describe(graph, circle)
    assert re.fullmatch(r"eagle3ops\.cli -> .* -> eagle3ops\.yamlload \(l\.\d+\) -> eagle3ops\.cli \(l\.1\)",
                        said), said
    small = _module_graph()
    small.add_import(importer="eagle3ops.health", imported="eagle3ops.cpuattn")
    small.add_import(importer="eagle3ops.cpuattn", imported="eagle3ops.health")
    assert import_cycles(small) == [["eagle3ops.cpuattn", "eagle3ops.health", "eagle3ops.cpuattn"]]


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


#: A module longer than this says at its top why it is one module.
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
HARNESS_NAMES = ("eagle3ops_dev", "sandbox", "demo", "tinytrained", "smollm2", "bases.py", "provision.py",
                 "headspecs.py", "standin_env", "standin_stages", "chatset", "pagecache", "slurmlocal")


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
                 "eagle3ops/images/build.py", "eagle3ops/templates/report.html.j2",
                 # the probes' tiny models, with the tiny Kimi's remote-code files (package data)
                 "eagle3ops/fixtures/__init__.py", "eagle3ops/fixtures/tinymodel.py", "eagle3ops/fixtures/tinydraft.py",
                 *(f"eagle3ops/fixtures/remote_code/{f}" for f in tinykimi.REMOTE_CODE_FILES)):
        assert must in names, f"{must} missing from the wheel"
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"eagle3ops"}, f"the wheel holds top-level packages besides eagle3ops: {tops}"
    harness = [n for n in names if any(h in n for h in HARNESS_NAMES)]
    assert harness == [], f"the production wheel ships development harness files: {harness}"
    entry = [n for n in names if n.endswith("entry_points.txt")]
    assert entry and "eagle3ops_dev" not in zipfile.ZipFile(wheels[0]).read(entry[0]).decode()


def _harness_references(path: Path) -> list[tuple[int, str]]:
    """(line, what) of each place in ``path`` that reaches or names the development harness ``eagle3ops_dev``:
    an ``import``/``from`` of it, and any string constant naming it (a module name handed to ``importlib`` or
    ``__import__``, a message, a command line) -- docstrings excepted, which may say how the harness relates."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name.split(".")[0] == "eagle3ops_dev"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "eagle3ops_dev":
            found.append((node.lineno, f"from {node.module} import"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "eagle3ops_dev" in node.value \
                and id(node) not in docstrings:
            found.append((node.lineno, f"string {node.value[:60]!r}"))
    return found


def test_no_product_module_imports_or_names_the_harness():
    """The product never reaches the harness, not even by name (import-linter sees only static imports), and no
    product message sends a user to it: a user has the eagle3ops command and the make targets, not the harness."""
    offenders = [f"{path.relative_to(SRC.parent).as_posix()}:{line}: {what}" for path in sorted(SRC.rglob("*.py"))
                 for line, what in _harness_references(path)]
    assert offenders == [], ("the product reaches or names the development harness; move what it needs into "
                             "eagle3ops (e.g. eagle3ops.fixtures) and point users at a make target:\n"
                             + "\n".join(offenders))


def test_the_harness_scan_sees_imports_names_and_messages_but_not_docstrings(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('"""Relates to eagle3ops_dev.demo."""\nimport importlib\nimport eagle3ops_dev.sandbox as sb\n'
                 'from eagle3ops_dev import demo\n\n\ndef f():\n    """Uses eagle3ops_dev."""\n'
                 '    importlib.import_module("eagle3ops_dev.fixtures")\n'
                 '    raise RuntimeError(f"run `python -m eagle3ops_dev base` ({1})")\n')
    assert [(line, what.split()[0]) for line, what in _harness_references(p)] == [
        (3, "import"), (4, "from"), (9, "string"), (10, "string")]


# --- executors are made in one place ------------------------------------------------------------------
#: modules (relative to src/eagle3ops) that may construct the SSH executor ``Remote(...)``, and why.
REMOTE_MAKERS = {"executor.py": "the one factory of executors (for_host)"}
#: modules of the product (the harness in src/eagle3ops_dev runs its own daemons and is not scanned) that may start a local process themselves (``subprocess.run/Popen/...``), and why; every other module
#: runs local commands through ``executor.local()``.
SUBPROCESS_USERS = {
    "executor.py": "the local executor itself",
    "stages/train.py": "runs in the pipeline image (torchrun workers); the image has no driver executor",
    "stages/chunked.py": "runs in the pipeline image (each pass's extract and train stage as a process of its own, "
                         "so the target's engine and the trainer never hold the GPU together)",
    "supervisor/speculate.py": "the drain/undrain hooks run by the host-side supervisor in its container; the "
                               "supervisor may not import the driver's executor (import-linter layers)",
    "supervisor/stagerun.py": "a venv host's stage processes (stage_runtime: venv), started by the "
                              "host-side supervisor, which may not import the driver's executor",
    # Not moved to executor.local() yet (next step): each is a local tool on the build machine with its
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


# --- 5. one alias, one module --------------------------------------------------------------------------------------


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package, found on disk without importing anything."""
    top, *rest = dotted.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    if not rest:
        return True
    dirs = [Path(d) for d in (spec.submodule_search_locations or [])]
    for i, part in enumerate(rest):
        last = i == len(rest) - 1
        nxt = [d / part for d in dirs if (d / part).is_dir()]
        if last and (nxt or any((d / f"{part}.py").is_file() or list(d.glob(f"{part}.*.so")) for d in dirs)):
            return True
        dirs = nxt
    return False


def _module_aliases(paths: list[Path], root: Path) -> dict[str, dict[str, list[str]]]:
    """``{alias: {module: ["file:line", ...]}}`` for every ``import a.b as x`` and every ``from a import b as x``
    where ``a.b`` is a module (aliases of functions or classes are left out), in ``paths``."""
    out: dict[str, dict[str, list[str]]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                pairs = [(a.name, a.asname) for a in node.names if a.asname]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                pairs = [(f"{node.module}.{a.name}", a.asname) for a in node.names
                         if a.asname and _is_module(f"{node.module}.{a.name}")]
            else:
                continue
            for module, alias in pairs:
                out.setdefault(alias, {}).setdefault(module, []).append(
                    f"{path.relative_to(root).as_posix()}:{node.lineno}")
    return out


def _alias_collisions(aliases: dict[str, dict[str, list[str]]]) -> list[str]:
    return [f"{alias}: " + "; ".join(f"{m} ({', '.join(where[:3])})" for m, where in sorted(mods.items()))
            for alias, mods in sorted(aliases.items()) if len(mods) > 1]


def test_each_module_alias_names_one_module():
    paths = sorted([*_sources(), *(REPO / "tests").rglob("*.py"), *(REPO / "benchmarks").rglob("*.py")])
    aliases = _module_aliases(paths, REPO)
    assert aliases["pc"] == {"eagle3ops.commands.process": aliases["pc"]["eagle3ops.commands.process"]}  # seen
    bad = _alias_collisions(aliases)
    assert bad == [], "one alias names two modules; give one of them another alias:\n" + "\n".join(bad)


def test_the_alias_scan_sees_a_collision(tmp_path):
    (tmp_path / "a.py").write_text("from eagle3ops.commands import process as pr\nfrom eagle3ops import cli as c\n")
    (tmp_path / "b.py").write_text("from eagle3ops.speculate import prompts as pr\n"
                                   "from eagle3ops.cli import main as c\n")  # a function: not a module alias
    bad = _alias_collisions(_module_aliases([tmp_path / "a.py", tmp_path / "b.py"], tmp_path))
    assert bad == ["pr: eagle3ops.commands.process (a.py:1); eagle3ops.speculate.prompts (b.py:1)"]


# --- 6. check / probe / verify / trial keep their meaning ------------------------------------------------------------

WORDS = ("verify", "probe", "check", "trial")
#: the visible CLI commands named with one of WORDS → (module, function) of their callback
WORD_COMMANDS = {
    ("probe",): ("eagle3ops.hostprobe", "probe_command"),  # the image's deferred probes on a host
    ("patch", "probe"): ("eagle3ops.patches.cli", "probe_cmd"),  # verify step (hashes), then the patches' probes
    ("stage", "probe"): ("eagle3ops.stages.cli", "probe"),  # vLLM's hidden states against a transformers forward
    ("patch", "check"): ("eagle3ops.patches.cli", "check_cmd"),  # series against pristine wheels: apply, compile
    ("config", "check"): ("eagle3ops.config_cli", "config_check"),  # configuration files read and validated
}
#: hidden old names (users' scripts) → the command they now run
DEPRECATED = {("verify",): ("probe",), ("patch", "verify"): ("patch", "probe")}
#: modules named with one of WORDS, by word
WORD_MODULES = {
    "verify": set(),
    "probe": {"eagle3ops.hostprobe", "eagle3ops.commands.hostprobe", "eagle3ops.patches.probes",
              "eagle3ops.patches.probekit", "eagle3ops.patches.specprobes", "eagle3ops.patches.kimiprobe",
              "eagle3ops.patches.probecache", "eagle3ops.patches.proberun", "eagle3ops.stages.probe"},
    "check": {"eagle3ops.imagecheck", "eagle3ops.patches.check", "eagle3ops.patches.diffcheck",
              "eagle3ops.speculate.headcheck", "eagle3ops.speculate.prechecks", "eagle3ops.window.gpucheck"},
    "trial": {"eagle3ops.fleet.trial"},
}
#: modules that run probes (start the patched target code); a check module imports none of them
PROBE_RUNNERS = {"eagle3ops.hostprobe", "eagle3ops.patches.proberun", "eagle3ops.patches.probekit",
                 "eagle3ops.patches.probes", "eagle3ops.patches.specprobes", "eagle3ops.patches.kimiprobe",
                 "eagle3ops.stages.probe"}


def _cli_commands() -> list[tuple[tuple[str, ...], bool, object]]:
    """``(path, hidden, callback)`` of every command of ``eagle3ops`` (the callback unwrapped)."""
    import typer

    from eagle3ops.cli import app

    def walk(c, path):
        if hasattr(c, "list_commands"):
            for n in c.list_commands(None):
                yield from walk(c.get_command(None, n), (*path, n))
        else:
            yield path, c.hidden, c.callback

    return list(walk(typer.main.get_command(app), ()))


def _word_misuse(commands, modules: list[str], imports: dict[str, set[str]]) -> list[str]:
    """What breaks the vocabulary: ``commands`` as :func:`_cli_commands` gives them, ``modules`` the dotted names of
    the product's modules, ``imports`` what each imports directly."""
    def unwrap(f):
        while hasattr(f, "__wrapped__"):
            f = f.__wrapped__
        return f

    bad = []
    by_path = {path: (hidden, unwrap(cb)) for path, hidden, cb in commands}
    for path, (hidden, cb) in sorted(by_path.items()):
        if not any(w in p for p in path for w in WORDS):
            continue
        name = " ".join(path)
        if path in DEPRECATED:
            new = by_path.get(DEPRECATED[path])
            if not hidden or new is None or cb is not new[1]:
                bad.append(f"`{name}` must be a hidden alias of `{' '.join(DEPRECATED[path])}`")
        elif hidden or (cb.__module__, cb.__name__) != WORD_COMMANDS.get(path):
            bad.append(f"`{name}` runs {cb.__module__}.{cb.__name__}: not in WORD_COMMANDS (say what it does, with "
                       f"the word that means it)")
    bad += [f"command `{' '.join(p)}` is missing" for p in WORD_COMMANDS if p not in by_path]
    for word, expected in WORD_MODULES.items():
        named = {m for m in modules if word in m.rsplit(".", 1)[-1]}
        bad += [f"module {m} is named '{word}' but is not listed as one" for m in sorted(named - expected)]
        bad += [f"module {m} is listed as '{word}' but does not exist" for m in sorted(expected - named)]
    for m in sorted(WORD_MODULES["check"]):
        bad += [f"{m} (a check) imports {x}, which runs probes" for x in sorted(imports.get(m, set()) & PROBE_RUNNERS)]
    return bad


def test_verify_probe_check_and_trial_each_name_one_thing():
    graph = _module_graph()
    modules = sorted(m for m in graph.modules if m.startswith("eagle3ops."))
    imports = {m: graph.find_modules_directly_imported_by(m) for m in modules}
    assert _word_misuse(_cli_commands(), modules, imports) == []


def test_the_word_check_sees_misuse():
    commands = _cli_commands()

    def probe_hosts():  # a visible command named verify that runs the host probes
        return None

    probe_hosts.__module__ = "eagle3ops.hostprobe"
    bad = _word_misuse([*commands, (("image", "verify"), False, probe_hosts)],
                       ["eagle3ops.patches.verify", "eagle3ops.imagecheck",
                        *WORD_MODULES["probe"] - {"eagle3ops.hostprobe"}],
                       {"eagle3ops.imagecheck": {"eagle3ops.patches.proberun"}})
    assert "`image verify` runs eagle3ops.hostprobe.probe_hosts: not in WORD_COMMANDS (say what it does, with the " \
           "word that means it)" in bad
    assert "module eagle3ops.patches.verify is named 'verify' but is not listed as one" in bad
    assert "module eagle3ops.hostprobe is listed as 'probe' but does not exist" in bad
    assert "eagle3ops.imagecheck (a check) imports eagle3ops.patches.proberun, which runs probes" in bad
    visible_verify = [(p, False if p == ("verify",) else h, cb) for p, h, cb in commands]
    assert "`verify` must be a hidden alias of `probe`" in _word_misuse(visible_verify, [], {})


# --- 7. serving kinds are objects ----------------------------------------------------------------------------------

#: Modules that are serving-kind objects (they may name their own kind).
KIND_MODULES = ("eagle3ops/supervisor/kinds/", "eagle3ops/window/kinds/")


def _kind_comparisons(path: Path) -> list[tuple[int, str]]:
    """(line, kind) of each comparison in ``path`` of a name or attribute ending in ``kind`` with a serving kind's
    name (a constant of SERVING_KINDS, alone or in a tuple, list or set display)."""
    from eagle3ops.config.inventory import SERVING_KINDS

    def names_kind(e: ast.expr) -> bool:
        n = e.id if isinstance(e, ast.Name) else e.attr if isinstance(e, ast.Attribute) else ""
        return n.endswith("kind")

    def kinds(e: ast.expr) -> list[str]:
        elts = e.elts if isinstance(e, (ast.Tuple, ast.List, ast.Set)) else [e]
        return [x.value for x in elts if isinstance(x, ast.Constant) and x.value in SERVING_KINDS]

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(names_kind(s) for s in sides):
                found += [(node.lineno, k) for s in sides for k in kinds(s)]
    return found


def test_no_serving_kind_is_compared_outside_the_kind_objects():
    offenders = [f"{p.relative_to(SRC.parent).as_posix()}:{line}: {kind}"
                 for p in sorted(SRC.rglob("*.py")) if not p.relative_to(SRC.parent).as_posix().startswith(KIND_MODULES)
                 for line, kind in _kind_comparisons(p)]
    assert offenders == [], ("move these into the kind objects (config.inventory.KIND_KEYS, supervisor.kinds, "
                             "window.kinds):\n" + "\n".join(offenders))


def test_the_kind_scan_sees_a_comparison(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('def f(s, plan):\n    if s.kind == "compose":\n        return plan.serving_kind in ("process", "x")\n'
                 '    return s.window_kind == "window"\n')
    assert _kind_comparisons(p) == [(2, "compose"), (3, "process")]


#: The layers where serving kinds live, each a package with one module per kind, and its registry (kind → class).
KIND_LAYERS = {"eagle3ops/supervisor/kinds/": ("eagle3ops.supervisor.kinds", "KINDS"),
               "eagle3ops/window/kinds/": ("eagle3ops.window.kinds", "DRIVER_KINDS")}
#: A kind whose module is another kind's: ``compose`` is the container kind, its container found by Compose labels.
KIND_FILES = {"compose": "container"}


def _kind_layout(root: Path) -> list[str]:
    """What breaks "one same-named module per serving kind in each kind layer" under ``root`` (a ``src`` folder): a
    kind of :data:`eagle3ops.config.inventory.SERVING_KINDS` missing from a layer's registry, a kind's class not in
    its own module (``<layer>/<kind>.py``, :data:`KIND_FILES`), or a module there for no kind."""
    import importlib

    from eagle3ops.config.inventory import SERVING_KINDS

    problems, want = [], {KIND_FILES.get(k, k) for k in SERVING_KINDS}
    for layer, (package, registry) in KIND_LAYERS.items():
        kinds = getattr(importlib.import_module(package), registry)
        for kind in SERVING_KINDS:
            file = f"{layer}{KIND_FILES.get(kind, kind)}.py"
            if kind not in kinds:
                problems.append(f"{package}.{registry} has no kind {kind!r}")
            elif not (root / file).is_file():
                problems.append(f"kind {kind!r} has no {file}")
            elif kinds[kind].__module__ != file.removesuffix(".py").replace("/", "."):
                problems.append(f"kind {kind!r} of {layer} is defined in {kinds[kind].__module__}, not {file}")
        extra = {p.stem for p in (root / layer).glob("*.py")} - want - {"__init__", "base"}
        problems += [f"{layer}{m}.py is no serving kind's module" for m in sorted(extra)]
    return problems


def test_every_serving_kind_has_its_module_in_each_kind_layer():
    assert _kind_layout(SRC.parent) == []


def test_the_kind_layout_check_sees_a_missing_module(tmp_path):
    import shutil

    for layer in KIND_LAYERS:
        shutil.copytree(SRC.parent / layer, tmp_path / layer)
    (tmp_path / "eagle3ops/window/kinds/systemd.py").unlink()
    (tmp_path / "eagle3ops/window/kinds/spare.py").write_text("")
    assert _kind_layout(tmp_path) == ["kind 'systemd' has no eagle3ops/window/kinds/systemd.py",
                                      "eagle3ops/window/kinds/spare.py is no serving kind's module"]

# --- 8. the stage runtime is chosen in one module ------------------------------------------------------------------

#: The module that names the stage runtimes and chooses one (for a host, a plan, a stage spec).
RUNTIME_MODULE = "eagle3ops/commands/runtime.py"
#: Modules below commands/ that read the setting itself, with the reason (they cannot import the runtime module).
RUNTIME_READERS = {
    "eagle3ops/config/inventory.py": "defines `stage_runtime` and validates the settings that go with it",
    "eagle3ops/config/standin.py": "the sandbox rule: a venv host is a sandbox by its state_dir, having no socket",
}


def _runtime_branches(path: Path) -> list[tuple[int, str]]:
    """(line, what) of each runtime branch in ``path``: a use of ``uses_venv`` (attribute, or ``getattr`` by name), or
    a comparison with the runtime name ``"venv"`` or :data:`eagle3ops.config.inventory.VENV_RUNTIME`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "uses_venv":
            found.append((node.lineno, "uses_venv"))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "getattr" and any(
                isinstance(a, ast.Constant) and a.value == "uses_venv" for a in node.args):
            found.append((node.lineno, "uses_venv"))
        elif isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                elts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                for e in elts:
                    if (isinstance(e, ast.Constant) and e.value == "venv") or \
                            getattr(e, "id", getattr(e, "attr", "")) == "VENV_RUNTIME":
                        found.append((node.lineno, "runtime name compared"))
    return found


def test_the_stage_runtime_is_chosen_in_one_module():
    offenders = [f"{rel}:{line}: {what}" for p in sorted(SRC.rglob("*.py"))
                 if (rel := p.relative_to(SRC.parent).as_posix()) not in (RUNTIME_MODULE, *RUNTIME_READERS)
                 for line, what in _runtime_branches(p)]
    assert offenders == [], (f"ask the host's runtime ({RUNTIME_MODULE}: for_host / for_plan / for_spec, its methods) "
                             f"instead of branching on it:\n" + "\n".join(offenders))
    assert _runtime_branches(SRC.parent / RUNTIME_MODULE), "the runtime module no longer chooses: update this test"
    assert all((SRC.parent / m).exists() for m in RUNTIME_READERS), "a listed module moved"


def test_the_runtime_scan_sees_a_branch(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('def f(h, spec):\n    if h.uses_venv:\n        return 1\n    if spec.get("runtime") == "venv":\n'
                 '        return 2\n    return getattr(h, "uses_venv", False) or h.stage_runtime in (VENV_RUNTIME,)\n')
    assert _runtime_branches(p) == [(2, "uses_venv"), (4, "runtime name compared"), (6, "uses_venv"),
                                    (6, "runtime name compared")]


# --- 9. one serving HTTP client ------------------------------------------------------------------------------------

#: The one module that builds the serving API's key header (``auth_headers``).
SERVING_CLIENT = "eagle3ops/serving_http.py"


def _bearer_headers(path: str | Path) -> list[int]:
    """Lines of ``path`` whose code (not a docstring or other bare string) spells an ``Authorization``/``Bearer``
    header."""
    tree = ast.parse(Path(path).read_text())
    bare = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    return sorted({n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                   and id(n) not in bare and ("Bearer" in n.value or n.value == "Authorization")})


def test_the_api_key_header_is_built_in_one_module():
    offenders = [f"{rel}:{line}" for p in _sources() if (rel := p.relative_to(SRC.parent).as_posix()) != SERVING_CLIENT
                 for line in _bearer_headers(p)]
    assert offenders == [], f"take the serving API's headers from {SERVING_CLIENT} (auth_headers):\n" + "\n".join(
        offenders)
    assert _bearer_headers(SRC.parent / SERVING_CLIENT), "the client no longer builds the header: update this test"


def test_the_header_scan_sees_a_header_but_not_a_docstring(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('def f(k):\n    """Sends ``Authorization: Bearer``."""\n    return {"Authorization": f"Bearer {k}"}\n')
    assert _bearer_headers(p) == [3]
