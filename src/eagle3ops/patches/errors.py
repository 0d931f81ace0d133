"""Typed errors of the patch tooling.

Every error carries a message that names the thing at fault (file, patch, hunk, package) and, where one exists,
the fix. The CLI prints ``str(error)`` and exits with :attr:`PatchToolError.exit_code`, so a Docker build step or a
CI job running ``eagle3ops patch ...`` stops with a readable cause.
"""

from __future__ import annotations


class PatchToolError(Exception):
    """Base class: a failure of the patch tooling with a human-readable cause and fix.

    Attributes:
        exit_code: process exit status the CLI uses for this error (always non-zero).
    """

    exit_code: int = 1

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.message = message
        self.fix = fix
        super().__init__(message + (f"\n  fix: {fix}" if fix else ""))


class SeriesError(PatchToolError):
    """A series dir, ``series`` file, ``upstream.yaml``, patch header or ``profiles.yaml`` is malformed."""

    exit_code = 2


class PinMismatch(PatchToolError):
    """The installed version of a package differs from the version a series (or patch) is pinned to."""

    exit_code = 3


class RequirementMismatch(PatchToolError):
    """A package named in ``X-Eagle3ops-Requires`` (or the profile) is missing or has another version."""

    exit_code = 3


class UnsafePatch(PatchToolError):
    """A patch would touch something outside the package root: ``..``, an absolute path, a symlink, another
    package, or uses a diff feature the strict applier refuses (renames, mode changes, binary hunks)."""

    exit_code = 4


class HunkRejected(PatchToolError):
    """A patch does not apply with zero fuzz; the message names patch, file and hunk (number and header)."""

    exit_code = 5


class TreeMismatch(PatchToolError):
    """A file the series touches is in no state the series knows: neither the pinned wheel's file (its RECORD hash)
    nor the state recorded when the series (or a leading part of it) was applied; the message names each file."""

    exit_code = 5


class ProbeError(PatchToolError):
    """A verification probe is unknown or failed: behaviour of the installed, patched package is wrong."""

    exit_code = 6


class WheelError(PatchToolError):
    """The pinned wheel could not be fetched, or its sha256 differs from ``upstream.yaml``."""

    exit_code = 7


class RemoteError(PatchToolError):
    """A command run in a (remote) container for ``capture``/``drift`` failed or returned unusable output."""

    exit_code = 8
