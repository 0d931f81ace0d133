"""The single place where an argv list becomes a shell string (POSIX quoting, once)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

__all__ = ["render"]


def render(argv: Sequence[str]) -> str:
    """Quote an argv list for a POSIX shell: the single place where commands become strings.

    Args:
        argv: program and arguments; each element becomes exactly one shell word (``shlex.join``).

    Raises:
        TypeError: an element is not a ``str`` (a bug in a command builder).
    """
    for a in argv:
        if not isinstance(a, str):
            raise TypeError(f"argv elements must be str, got {type(a).__name__}: {a!r} in {argv!r}")
    return shlex.join(argv)
