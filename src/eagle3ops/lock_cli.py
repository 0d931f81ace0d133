"""``eagle3ops lock``: show and release a host's deploy lock (:mod:`eagle3ops.window.lock`)."""

from __future__ import annotations

from pathlib import Path

import typer

from eagle3ops import cli_common as common
from eagle3ops.cli_common import DryRunOpt, InventoryOpt, JsonOpt

console = common.console
app = typer.Typer(no_args_is_help=True, help="The host's deploy lock.")


@app.command("status")
def lock_status(host: str, inventory: Path = InventoryOpt) -> None:
    """Show who holds the host's deploy lock (and whether it is stale)."""
    from eagle3ops.window.lock import describe_lock, read_lock

    h = common.load_host(inventory, host)
    with common.remote(h) as r:
        console.print(describe_lock(r) if read_lock(r) else f"{host}: lock is free")


@app.command("release")
def lock_release(host: str, inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt, json_out: bool = JsonOpt,
                 force: bool = typer.Option(False, "--force", help="Release even if its window may still run.")
                 ) -> None:
    """Release the host's deploy lock; refuses while its window's supervisor runs unless --force."""
    from eagle3ops.window.lock import lock_is_stale, read_lock, release_lock

    h = common.load_host(inventory, host)
    with common.remote(h, dry_run, json_out) as r:
        d = read_lock(r)
        if not d:
            console.print(f"{host}: lock is free")
            return common.print_plan({"host": host, "lock": None, "changes": []}, h, json_out)
        if not lock_is_stale(r, d) and not force:
            common.fail(f"{host}: window {d.get('window_id')} is still running; wait or pass --force")
        release_lock(r)
        console.print(f"{host}: lock {'would be ' if dry_run else ''}released (was held by {d.get('holder')} "
                      f"since {d.get('since')})")
        common.print_plan({"host": host, "lock": d, "changes": list(r.changes)}, h, json_out)
