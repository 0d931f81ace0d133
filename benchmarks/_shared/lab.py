"""Where the lab's folders are, for the benchmark scripts: one folder per question under ``benchmarks/``, this one
(``_shared``) for what several of them import.

A script puts this folder on ``sys.path`` from its own location (``Path(__file__).resolve().parents[1] / "_shared"``)
and imports :mod:`lab`; the same works inside a container that mounts ``benchmarks/`` whole (the measuring containers
mount it at ``/bench``).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

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


def scrub(text: str) -> str:
    """``text`` with every path of the measuring machine made portable: this checkout's absolute path → relative
    (``.`` for the checkout itself), the home folder (``/root``, ``/home/USER``, ``/Users/USER``) → ``~``, the
    temporary folders (``/tmp``, ``/var/tmp``, ``$TMPDIR``) → ``$TMPDIR``, ``/work`` → ``$WORK``. A host's path (a
    data dir on the host) and a container's (the side after ``:`` in a bind) are kept: the reader needs them and they
    do not depend on the machine that measured."""
    if len(REPO.parts) > 1:  # in a container that mounts benchmarks/ alone, REPO is "/": nothing to strip
        text = re.sub(re.escape(str(REPO)) + r"(?=[\s\"',;:)]|$)", ".", text.replace(str(REPO) + "/", ""))
    return _MACHINE.sub(lambda m: _SHOWN[next(k for k, g in enumerate(m.groups()[1:]) if g is not None)], text)


#: Where a machine path starts: not inside a word or another path, not the container side of a bind (``HOST:/ctr``);
#: the groups in :data:`_SHOWN`'s order. ``/work`` holds this lab's checkouts and what came back from device machines.
_MACHINE = re.compile(r"(?<![\w.\-/:$~])((/tmp/|/var/tmp/" + (
    "|" + re.escape(os.environ["TMPDIR"].rstrip("/") + "/") if os.environ.get("TMPDIR", "").strip("/") else "")
    + r")|(/root/|/home/[\w.-]+/|/Users/[\w.-]+/)|(/work/))")
_SHOWN = ("$TMPDIR/", "~/", "$WORK/")


def portable(value: Any) -> Any:
    """``value`` (a result: dicts, lists, strings, numbers) with :func:`scrub` applied to every string, keys too, and
    to every path object (written as its string)."""
    if isinstance(value, os.PathLike):
        return scrub(os.fspath(value))
    if isinstance(value, dict):
        return {portable(k): portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v) for v in value]
    return scrub(value) if isinstance(value, str) else value


def write_result(path: str | os.PathLike[str], result: Any, **dumps: Any) -> Path:
    """Write a benchmark's result as JSON (``json.dumps(result, **dumps)`` and a newline) with no path of the
    measuring machine in it (:func:`portable`); returns the path. ``tests/test_lab.py`` scans the committed results
    for such paths."""
    path = Path(path)
    path.write_text(json.dumps(portable(result), **dumps) + "\n")
    return path
