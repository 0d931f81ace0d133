"""``eagle3ops watch HOST``: the command line of :mod:`eagle3ops.speculate.watch` (registered on the main app)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from eagle3ops import cli_common as common
from eagle3ops.cli_common import DryRunOpt, InventoryOpt
from eagle3ops.speculate.watch import EXIT_CODES

_EXITS = "; ".join(f"{code} {what}" for code, what in sorted(EXIT_CODES.items()))


def watch_command(host: str, inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt,
                  duration: float = typer.Option(600.0, "--duration", min=1, help="Seconds to watch, then exit "
                                                 "(bounded: safe from cron or a systemd timer)."),
                  interval: Optional[float] = typer.Option(None, "--interval", min=1, help="Seconds between "
                                                           "/metrics scrapes (default serving.watch.interval_s)."),
                  endpoint: Optional[str] = typer.Option(None, "--endpoint", help="URL the driver reaches serving "
                                                         "at (default: direct, else an SSH forward)."),
                  json_out: bool = typer.Option(False, "--json", help="With --dry-run: print the watch's plan "
                                                "(release, thresholds, records, what a breach does) as one JSON "
                                                "document; nothing is scraped or written.")) -> None:
    """Watch the live release's /metrics: acceptance per position and throughput per interval, recorded under
    <state_dir>/watch/; a sustained breach of serving.watch is reported, and rolled back when the policy says so."""
    from eagle3ops.window.common import pipeline_image
    import shlex
    import sys

    from eagle3ops.speculate import watch as wt

    h = common.load_host(inventory, host)
    command = shlex.join(["eagle3ops", *sys.argv[1:]])
    try:
        with wt.watch_lock(h.name), common.remote(h, dry_run, json_out) as r:
            dep = common.deployed_record(r, required=False)
            # a placeholder when never deployed: no image to name then unless the inventory names one
            image, image_id = pipeline_image(h, dep) if dep.get("image_id") or h.pipeline_image \
                else (None, None)
            opts = wt.WatchOptions(duration_s=duration, interval_s=interval, endpoint=endpoint,
                                   pipeline_image=image, pipeline_image_id=image_id,
                                   command=command, plan_only=json_out)
            out = wt.watch(r, opts, echo=lambda m: common.console.print(m, markup=False))
            if json_out:
                return common.print_plan(out, h, json_out)
    except wt.WatchLocked as exc:
        common.console.print(f"[yellow]{exc}[/yellow]")
        raise typer.Exit(wt.EXIT_LOCKED) from None
    except wt.WatchError as exc:
        common.fail(str(exc))
    common.console.print(f"{out['intervals']} interval(s) of release {out['release']}; breaches "
                         f"{[b['reason'] for b in out['breaches']] or 'none'}; rollback {out['rollback']}; "
                         f"production {out.get('production')}", markup=False)
    raise typer.Exit(out["exit_code"])


watch_command.__doc__ = f"{watch_command.__doc__} Exit status: {_EXITS}."
