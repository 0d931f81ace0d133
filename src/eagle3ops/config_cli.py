"""``eagle3ops config``: the configuration reference generated from the models (``docs``), validation of a file
as eagle3ops loads it, and a host's inventory serving flags against its live container (``check``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from eagle3ops import cli_common as common
from eagle3ops.cli_common import InventoryOpt
from eagle3ops.config import ConfigError, load_inventory

console = common.console
app = typer.Typer(no_args_is_help=True, help="Configuration reference (every file, every key) and validation.")


@app.command("docs")
def config_docs(section: Optional[str] = typer.Argument(
        None, help="inventory, pipeline, image or profiles (default: all of them).")) -> None:
    """Print every key of a configuration file (type, default, meaning), generated from its models."""
    from eagle3ops.config.docs import docs

    try:
        print(docs(section), end="")
    except ConfigError as exc:
        common.fail(str(exc), 2)


@app.command("check")
def config_check(
        what: Optional[str] = typer.Argument(
            None, help="inventory (default), pipeline, image or profiles: the kind of FILE; or a HOST of the "
                       "inventory: also compare its serving section with its live serving container."),
        file: Optional[Path] = typer.Argument(
            None, help="The file to check (default: the section's checked-in example; inventory: --inventory)."),
        inventory: Path = InventoryOpt) -> None:
    """Validate a configuration file (default: the inventory) as eagle3ops loads it. With HOST, show how the
    inventory's serving flags differ from the live container (they apply only where no live container exists:
    releases start from the live container)."""
    from eagle3ops.config.docs import SECTIONS, get_section

    sections = set(SECTIONS)
    if what is None or what == "inventory" and file is None or what not in sections:
        try:
            inv = load_inventory(inventory)
        except ConfigError as exc:
            common.fail(str(exc), 2)
        console.print(f"{inventory}: ok ({', '.join(inv.hosts)})")
        if what in (None, "inventory"):
            return
        if what not in inv.hosts:
            common.fail(f"{what!r} is neither a section ({', '.join(sorted(sections))}) nor a host of {inventory} "
                  f"({', '.join(inv.hosts)})", 2)
        _serving_drift(inventory, what)
        return
    try:
        s = get_section(what)
        for f in [file] if file is not None else [Path(e) for e in s.examples]:
            s.check(f)
            console.print(f"{f}: ok ({s.title.lower()})")
    except ConfigError as exc:
        common.fail(str(exc), 2)


def _serving_drift(inventory: Path, host: str) -> None:
    """Print how the inventory's serving flags for ``host`` differ from its live serving container."""
    from eagle3ops.window.preflight import serving_drift

    h = common.load_host(inventory, host)
    from eagle3ops.window.kinds import driver_kind

    note = driver_kind(h).drift_note(h)
    if note:
        console.print(f"{host}: {note}")
        return
    with common.remote(h) as r:
        name, diffs = serving_drift(r)
    if name is None:
        console.print(f"{host}: no live serving container; the inventory's serving flags would start one")
    elif not diffs:
        console.print(f"{host}: live serving container {name} matches the inventory's serving flags")
    else:
        console.print(f"{host}: live serving container {name} differs from the inventory's serving flags (releases "
                      f"keep the live settings; these inventory values are not applied):")
        for d in diffs:
            console.print(f"  - {d}", markup=False)
