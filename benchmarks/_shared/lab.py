"""Where the lab's folders are, for the benchmark scripts: one folder per question under ``benchmarks/``, this one
(``_shared``) for what several of them import.

A script puts this folder on ``sys.path`` from its own location (``Path(__file__).resolve().parents[1] / "_shared"``)
and imports :mod:`lab`; the same works inside a container that mounts ``benchmarks/`` whole (the measuring containers
mount it at ``/bench``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: The lab's root, one folder per question (``benchmarks/``; ``/bench`` in a measuring container).
BENCH = Path(__file__).resolve().parents[1]
#: The checkout.
REPO = BENCH.parent


def folder(question: str) -> Path:
    """A question's folder, ``benchmarks/<question>``; ``FileNotFoundError`` naming it when there is none (a
    misspelt name must not send a result to a new folder)."""
    path = BENCH / question
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such benchmark folder (the folders are listed in benchmarks/README.md)")
    return path


def use(*questions: str) -> None:
    """Put these questions' folders first on ``sys.path``, so that a script imports another benchmark's functions
    (``use("served-acceptance-by-length")`` then ``from served_acceptance_by_length import machine``)."""
    for q in reversed(questions):
        p = str(folder(q))
        if p not in sys.path:
            sys.path.insert(0, p)


def rel(path: str | os.PathLike[str]) -> str:
    """``path`` as a result records it: relative to the checkout when inside it, ``~/...`` when under the home
    folder, ``$TMPDIR/...`` when under the temporary folder; any other path as given (a host's or a container's own
    path, which the reader needs). Results carry no path of the machine that measured them."""
    p = Path(path)
    if not p.is_absolute():
        return p.as_posix()
    for base, shown in ((REPO, None), (Path.home(), "~"), (Path(os.environ.get("TMPDIR", "/tmp")), "$TMPDIR"),
                        (Path("/tmp"), "$TMPDIR")):
        try:
            tail = p.resolve().relative_to(base.resolve()) if base == REPO else p.relative_to(base)
        except ValueError:
            continue
        return tail.as_posix() if shown is None else f"{shown}/{tail.as_posix()}".rstrip("/.")
    return p.as_posix()
