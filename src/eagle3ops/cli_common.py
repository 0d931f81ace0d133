"""What the ``eagle3ops`` command modules share: the stderr console, the ``--inventory`` and ``--dry-run`` options,
and loading a host, opening a :class:`eagle3ops.remote.Remote` to it and failing with a message.

Command modules call these through the module (``common.remote(...)``), never by a name imported from it, so a test
that replaces one (``monkeypatch.setattr(cli_common, "remote", ...)``) replaces it for every command.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console

from eagle3ops.config import ConfigError, HostConfig, load_inventory

__all__ = ["DryRunOpt", "InventoryOpt", "console", "fail", "load_host", "remote"]

console = Console(stderr=True)

InventoryOpt = typer.Option(
    Path(os.environ.get("EAGLE3OPS_INVENTORY", "deploy/hosts.yaml")), "--inventory", "-i",
    help="Inventory file (env EAGLE3OPS_INVENTORY).")
DryRunOpt = typer.Option(False, "--dry-run", help="Print every remote command in order; execute none.")


def load_host(inventory: Path, name: str) -> HostConfig:
    """Host ``name`` of the inventory file ``inventory``; a bad inventory or an unknown host prints the error and
    exits with status 2 (``typer.Exit``)."""
    try:
        return load_inventory(inventory).host(name)
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def remote(host: HostConfig, dry_run: bool = False):
    """The SSH executor to ``host`` (:func:`eagle3ops.executor.for_host`: not yet connected; use it as a context
    manager); a dry run echoes every command it would run to stdout."""
    from eagle3ops import executor

    echo = (lambda cmd: print(cmd)) if dry_run else None
    return executor.for_host(host, dry_run=dry_run, echo=echo)


def fail(msg: str, code: int = 1) -> NoReturn:
    """Print ``error: msg`` on stderr and exit with status ``code`` (``typer.Exit``)."""
    console.print(f"[red]error:[/red] {msg}")
    raise typer.Exit(code)
