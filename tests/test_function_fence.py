"""The function fence: an orchestrator reads as a table of steps, so no function of ``src/eagle3ops`` runs past
:data:`MAX_CODE_LINES` code lines unless :data:`LONG_FUNCTIONS` names it, with the reason and its length today as
its ceiling.

What counts: the lines of the body (the signature is left out: a typer command's options are declarations, not steps)
that hold code, so neither blank lines, comment-only lines nor docstrings count; a nested function's lines count
toward the function around it (a closure is read with it) and toward itself. Functions are named
``path/from/src/eagle3ops.py::Qualified.name`` (``<locals>`` for a nested one).

The list only shrinks: the test fails when a listed function grows past its ceiling, when an unlisted one passes
:data:`MAX_CODE_LINES`, and when a listed one is gone or back within the limit (then its row goes). Splitting a job
into named steps is the way down; ``_part1``/``_part2`` halves are not steps and a reviewer sends them back.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src/eagle3ops"

#: The longest a function's body may be, in code lines.
MAX_CODE_LINES = 60

#: ``"module.py::qualname"`` → (ceiling in code lines = its length when listed, why it is long for now). A row
#: goes once its function is split; a ceiling is lowered whenever its function shrinks.
LONG_FUNCTIONS: dict[str, tuple[int, str]] = {
}

_SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines_by_function(text: str) -> dict[str, int]:
    """``{qualname: code lines of its body}`` for every function (methods and nested functions included) in the
    Python source ``text`` (module doc: what counts)."""
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in _SKIPPED:
            code.update(range(tok.start[0], tok.end[0] + 1))
    tree = ast.parse(text)
    code -= _docstring_lines(tree)
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                out[name] = len(code & set(range(child.body[0].lineno, child.end_lineno + 1)))
                visit(child, name + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def fence_breaches(lengths: dict[str, int], allowed: dict[str, tuple[int, str]],
                   limit: int = MAX_CODE_LINES) -> list[str]:
    """What breaks the fence, one line each: an unlisted function over ``limit``, a listed one over its ceiling, a
    listed one gone or within ``limit`` (its row goes), a ceiling above today's length (lower it)."""
    out = [f"{f}: {n} code lines > {limit}; split it into steps (or list it in LONG_FUNCTIONS with a reason)"
           for f, n in sorted(lengths.items()) if n > limit and f not in allowed]
    for f, (ceiling, _why) in sorted(allowed.items()):
        n = lengths.get(f)
        if n is None:
            out.append(f"{f}: listed in LONG_FUNCTIONS but gone; remove its row")
        elif n <= limit:
            out.append(f"{f}: {n} code lines, within {limit} now; remove its row from LONG_FUNCTIONS")
        elif n > ceiling:
            out.append(f"{f}: {n} code lines > its ceiling {ceiling}; split it rather than raise the ceiling")
        elif n < ceiling:
            out.append(f"{f}: {n} code lines, below its ceiling {ceiling}; lower the ceiling to {n}")
    return out


def _product_lengths() -> dict[str, int]:
    return {f"{path.relative_to(SRC).as_posix()}::{name}": n
            for path in sorted(SRC.rglob("*.py"))
            for name, n in code_lines_by_function(path.read_text()).items()}


def test_no_function_grows_past_the_fence_and_the_allow_list_only_shrinks():
    breaches = fence_breaches(_product_lengths(), LONG_FUNCTIONS)
    assert breaches == [], "the function fence (tests/test_function_fence.py):\n" + "\n".join(breaches)


def test_every_listed_function_says_why():
    assert all(why.strip() and ceiling > MAX_CODE_LINES for ceiling, why in LONG_FUNCTIONS.values())


def test_the_fence_counts_code_lines_only():
    text = ('def f(a,\n      b):\n    """Doc.\n\n    More doc."""\n    # a comment\n\n    x = (a +\n         b)\n'
            '    def g():\n        """Inner doc."""\n        return x\n    return g\n\n\nclass C:\n'
            '    def m(self):\n        return 1\n')
    assert code_lines_by_function(text) == {"f": 5, "f.<locals>.g": 1, "C.m": 1}


def test_the_fence_sees_growth_a_newcomer_and_a_stale_row():
    lengths = {"a.py::grown": 80, "a.py::new": 61, "a.py::short": 40, "a.py::shrunk": 65, "a.py::fine": 70}
    allowed = {"a.py::grown": (75, "r"), "a.py::short": (90, "r"), "a.py::gone": (70, "r"),
               "a.py::shrunk": (70, "r"), "a.py::fine": (70, "r")}
    assert fence_breaches(lengths, allowed) == [
        "a.py::new: 61 code lines > 60; split it into steps (or list it in LONG_FUNCTIONS with a reason)",
        "a.py::gone: listed in LONG_FUNCTIONS but gone; remove its row",
        "a.py::grown: 80 code lines > its ceiling 75; split it rather than raise the ceiling",
        "a.py::short: 40 code lines, within 60 now; remove its row from LONG_FUNCTIONS",
        "a.py::shrunk: 65 code lines, below its ceiling 70; lower the ceiling to 65",
    ]
