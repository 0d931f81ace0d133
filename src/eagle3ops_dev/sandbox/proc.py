"""What :mod:`.host` and :mod:`.engines` share: the sandbox's error and its checked local process runner.

Kept apart so that the host module may import the engines module (and not the other way round).
"""

from __future__ import annotations

import subprocess

__all__ = ["SandboxError", "run_checked"]


class SandboxError(Exception):
    """The sandbox cannot be set up or is unhealthy; the message says what and how to fix it."""


def run_checked(argv: list[str], *, timeout: float = 60, check: bool = True,
                env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` on this machine (output captured as text) and return the finished process.

    Raises:
        SandboxError: it did not finish within ``timeout`` seconds, or (``check``) it exited non-zero (the message
            holds the command and the last 800 characters of its stderr, else stdout).
    """
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise SandboxError(f"`{' '.join(argv)}` did not finish within {timeout:.0f}s") from None
    if check and cp.returncode != 0:
        raise SandboxError(f"`{' '.join(argv)}` exited {cp.returncode}: {(cp.stderr or cp.stdout).strip()[-800:]}")
    return cp
