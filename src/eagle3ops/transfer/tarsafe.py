"""Path safety for layer bytes: tar members that cannot escape their directory, files opened without symlinks."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path, PurePosixPath

from eagle3ops.transfer.errors import UnsafeArchive


def check_member(member: tarfile.TarInfo) -> None:
    """Refuse a tar member that could write outside the extraction directory.

    Allowed: regular files and directories with relative names without ``..``; symbolic and hard links whose
    target stays inside. Refused: absolute names, ``..`` components, links leaving the tree, devices, FIFOs.

    Raises:
        UnsafeArchive: naming the member and why.
    """
    name = member.name
    parts = PurePosixPath(name).parts
    if name.startswith("/") or ".." in parts or "\x00" in name:
        raise UnsafeArchive(f"tar member {name!r} escapes the extraction directory (absolute path or '..')")
    if member.isreg() or member.isdir():
        return
    if member.issym() or member.islnk():
        target = member.linkname
        base = PurePosixPath(name).parent if member.issym() else PurePosixPath(".")
        resolved = os.path.normpath(str(base / target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            raise UnsafeArchive(f"tar member {name!r} links to {target!r}, outside the extraction directory")
        return
    raise UnsafeArchive(f"tar member {name!r} is a device/FIFO/other special file; refused")


def safe_extract(stream: io.RawIOBase | io.BufferedIOBase, dest: Path) -> list[str]:
    """Extract a tar stream into ``dest``, checking every member with :func:`check_member` before it is written
    (and with Python's ``data`` extraction filter as a second line).

    Returns:
        the member names, in stream order.

    Raises:
        UnsafeArchive: a member failed the checks (nothing of it was written; ``dest`` should be discarded).
    """
    names: list[str] = []
    with tarfile.open(fileobj=stream, mode="r|") as tf:
        for m in tf:
            check_member(m)
            try:
                tf.extract(m, dest, filter="data")
            except tarfile.FilterError as exc:
                raise UnsafeArchive(f"tar member {m.name!r} refused by the data filter: {exc}") from None
            names.append(m.name)
    return names


def open_beneath(root_fd: int, rel: str) -> int:
    """Open regular file ``rel`` below the directory ``root_fd`` without following any symlink (openat per
    component, ``O_NOFOLLOW``); raises :class:`UnsafeArchive` on ``..``/absolute names."""
    parts = [p for p in PurePosixPath(rel).parts if p not in (".", "")]
    if rel.startswith("/") or ".." in parts or not parts:
        raise UnsafeArchive(f"layer entry {rel!r} escapes the layer directory")
    fd = root_fd
    opened: list[int] = []
    try:
        for p in parts[:-1]:
            fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            opened.append(fd)
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    finally:
        for o in opened:
            os.close(o)
