"""OpenSSH client commands, as argv lists (pure): the bulk transfer path runs ``ssh`` with a generated config."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from eagle3ops.config import HostConfig


def openssh(host: HostConfig, remote_argv: Sequence[str], config_file: Path | str) -> list[str]:
    """OpenSSH client argv running ``remote_argv`` (quoted once by :func:`eagle3ops.commands.quote.render`) on ``host``.

    Args:
        host: the inventory entry; ``hostname`` may be an ssh_config alias (``ProxyJump`` works).
        remote_argv: the remote command as an argv list.
        config_file: the file from :func:`eagle3ops.transfer.sshconfig.write_ssh_config` (strict host keys on every
            hop, identity, timeouts), passed with ``-F``; the inventory's ``port``/``user`` are given as
            ``-p``/``-l`` (target only).

    Returns:
        ``["ssh", "-F", config_file, ..., "--", hostname, "<rendered command>"]``.

    Raises:
        TypeError: an element of ``remote_argv`` is not a ``str`` (from :func:`eagle3ops.commands.quote.render`).
    """
    from eagle3ops.commands.quote import render

    argv = ["ssh", "-F", str(config_file)]
    if host.port:
        argv += ["-p", str(host.port)]
    if host.user:
        argv += ["-l", host.user]
    return argv + ["--", host.hostname, render(list(remote_argv))]
