"""``eagle3ops push IMAGE HOST...``: options, live progress per host, and the per-host results table."""

from __future__ import annotations

import json
import shlex
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import typer

from eagle3ops.transfer.errors import TransferError
from eagle3ops.transfer.limits import STALL_S
from eagle3ops.transfer.pusher import Progress, PushGroupResult, PushOptions, PushResult, push_many


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def results_table(image: str, results: Iterable[PushResult]):
    """A rich table: one row per host with status, store/mode, the image id on the host and which id it is (config
    digest on the classic store, manifest digest on the containerd store), layers, bytes, time, reason."""
    from rich.table import Table

    t = Table(title=f"push {image}")
    for col in ("host", "status"):  # never cut in a narrow terminal
        t.add_column(col, no_wrap=True, min_width=len("present"))
    for col in ("store/mode", "host image id", "layers sent", "layer bytes", "bytes sent", "time", "transport",
                "reason / compression"):
        t.add_column(col)
    for r in results:
        style = {"ok": "green", "present": "cyan", "tagged": "cyan"}.get(r.status, "red")
        hid = f"{r.host_id[7:19]} ({r.id_kind})" if r.host_id else "-"
        t.add_row(r.host, f"[{style}]{r.status}[/]", f"{r.store}/{r.mode or '-'}", hid, f"{r.layers_sent}/{r.layers_total}",
                  _fmt_bytes(r.layer_bytes), _fmt_bytes(r.bytes_sent), f"{r.wall_s:.1f}s", r.transport or "-",
                  r.reason or r.compression)
    return t


def result_line(r: PushResult) -> str:
    """One plain line per host for output that is not a terminal (CI logs, pipes: a rich table there is cut to 80
    columns): ``HOST: STATUS key=value ...``, the table's columns in the same order."""
    hid = f"{r.host_id[7:19]}({r.id_kind})" if r.host_id else "-"
    return (f"{r.host}: {r.status} store={r.store}/{r.mode or '-'} host_image_id={hid} "
            f"layers_sent={r.layers_sent}/{r.layers_total} layer_bytes={_fmt_bytes(r.layer_bytes).replace(' ', '')} "
            f"bytes_sent={_fmt_bytes(r.bytes_sent).replace(' ', '')} time={r.wall_s:.1f}s "
            f"transport={r.transport or '-'} {' '.join((r.reason or r.compression or '').split())}").rstrip()


def plan_doc(image: str, results: Iterable[PushResult]) -> dict:
    """``push --dry-run --json``'s document: per host its status (``dry-run``, or ``failed`` with the reason), the
    plan decided from its facts (``action`` present | tag | load, store, mode, the id the host must give the image,
    layers and bytes to send) and every change the push would make there, in order (the lock's first)."""
    hosts = []
    for r in results:
        p = r.push_plan
        hosts.append({"host": r.host, "status": r.status, "reason": r.reason, "changes": list(r.changes),
                      "plan": None if p is None else {
                          "action": p.action, "store": p.store, "mode": p.mode, "expect": p.expect,
                          "id_kind": p.id_kind, "missing_tags": list(p.missing_tags), "compression": p.compression,
                          "layers_sent": sum(len(x.include) for x in p.parts), "layer_bytes": p.layer_bytes,
                          "summary": p.summary()}})
    return {"kind": "push", "image": image, "hosts": hosts}


def push_command(
    image: str = typer.Argument(..., help="Image reference on the build engine (tag or id)."),
    hosts: list[str] = typer.Argument(..., help="Inventory host names."),
    inventory: Path = typer.Option(Path("deploy/hosts.yaml"), "--inventory", "-i", help="Inventory file."),
    compression: str = typer.Option("auto", help="auto (by measurement) | none | zstd | gzip."),
    transport: str = typer.Option("auto", help="auto | openssh | paramiko."),
    attempts: int = typer.Option(3, min=1, help="Tries per host."),
    stall_s: float = typer.Option(STALL_S, help="Seconds without progress before a stream is killed."),
    parallel: int = typer.Option(8, min=1, help="Hosts pushed at once."),
    containerd: str = typer.Option("thin", help="On a containerd-store host: thin (OCI layout without the layers "
                                   "the host holds) | full (send all layers) | refuse."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Ask each host what it holds (read-only), then print "
                                 "the commands the push would run there (each load with the layers its archive "
                                 "would carry); send and change nothing."),
    json_out: bool = typer.Option(False, "--json", help="With --dry-run: print the plan of every host as one JSON "
                                  "document on stdout (the commands go to stderr)."),
) -> None:
    """Push IMAGE to each HOST over SSH: only missing layers, verified by image id, in parallel.

    A host that cannot be reached fails alone, once, within the connect bound: one ``error: HOST: cause`` line on
    stderr (exit status 1), the others go on. A stand-in image (its labels say so) fails the same way on each host
    that is not a sandbox, before it is contacted. A host's deploy lock is taken once its facts are read and its plan
    made, and held while the plan's changes are made (a host that holds the image already takes none): a host whose
    lock another run holds (a window) fails alone, naming that run."""
    from rich.console import Console

    from eagle3ops.config import ConfigError, load_inventory

    console = Console(stderr=True)
    try:
        inv = load_inventory(inventory)
        host_cfgs = [inv.host(h) for h in hosts]
    except ConfigError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2)
    _check_options(console, compression=compression, transport=transport, containerd=containerd, dry_run=dry_run,
                   json_out=json_out)
    opts = PushOptions(compression=compression, transport=transport, attempts=attempts, stall_s=stall_s,
                       containerd=containerd, dry_run=dry_run, lock=shlex.join(["eagle3ops", *sys.argv[1:]]))
    results = _push_with_bars(console, image, host_cfgs, opts, parallel)
    _print_results(image, results, dry_run=dry_run, json_out=json_out)
    _report_failures(results, dry_run=dry_run)
    if not results.ok:
        raise typer.Exit(1)


def _check_options(console: Any, *, compression: str, transport: str, containerd: str, dry_run: bool,
                   json_out: bool) -> None:
    """The push's option words and ``--json`` (only with ``--dry-run``), checked before any host is reached.

    Raises:
        typer.Exit: (status 2) a word not among its option's choices (the message names the option and them), or
            ``--json`` without ``--dry-run``.
    """
    for name, val, allowed in (("--compression", compression, ("auto", "none", "zstd", "gzip")),
                               ("--transport", transport, ("auto", "openssh", "paramiko")),
                               ("--containerd", containerd, ("thin", "full", "refuse"))):
        if val not in allowed:
            console.print(f"[red]error:[/] {name} {val!r}: use one of {', '.join(allowed)}")
            raise typer.Exit(2)
    if json_out and not dry_run:
        console.print("[red]error:[/] --json prints the plan of a dry run: add --dry-run, or drop --json")
        raise typer.Exit(2)


def _push_with_bars(console: Any, image: str, host_cfgs: list[Any], opts: PushOptions, parallel: int
                    ) -> PushGroupResult:
    """:func:`push_many` over ``host_cfgs`` with one progress bar per host on ``console``; the bars are drawn only
    on a terminal and never in a dry run (a log or a pipe gets the table and the error lines, not a bar's last
    frame). Returns the hosts' results.

    Raises:
        typer.Exit: (status 2) the image cannot be pushed at all (:class:`TransferError`, said on ``console``).
    """
    from rich.progress import BarColumn, DownloadColumn, Progress as RichProgress, TextColumn, TransferSpeedColumn

    with RichProgress(TextColumn("{task.fields[host]:>12}"), TextColumn("{task.description}"), BarColumn(),
                      DownloadColumn(), TransferSpeedColumn(), console=console, transient=False,
                      disable=opts.dry_run or not console.is_terminal) as bar:
        tasks = {h.name: bar.add_task("inventory", host=h.name, total=None) for h in host_cfgs}
        lock = threading.Lock()

        def on_progress(p: Progress) -> None:
            with lock:
                desc = {"send": f"layer {p.layer}" if p.layer is not None else "metadata",
                        "load": "docker load", "verify": "verify"}.get(p.phase, p.phase)
                if p.phase == "send" and p.layer is not None:
                    desc += f" {_fmt_bytes(p.layer_bytes)}/{_fmt_bytes(p.layer_total)}"
                bar.update(tasks[p.host], description=desc, completed=p.done, total=p.total or None)

        try:
            results = push_many(image, host_cfgs, options=opts, parallel=parallel, on_progress=on_progress)
        except TransferError as exc:
            console.print(f"[red]error:[/] {exc}")
            raise typer.Exit(2)
        for r in results:
            bar.update(tasks[r.host], description=r.status)
    return results


def _print_results(image: str, results: PushGroupResult, *, dry_run: bool, json_out: bool) -> None:
    """What the push did, or would do: a dry run's plan per host (its facts' summary, then its commands; with
    ``json_out`` on stderr, and stdout holds :func:`plan_doc` alone), else the results' table on a terminal or one
    line per host."""
    from rich.console import Console

    if dry_run:
        text = sys.stderr if json_out else sys.stdout  # --json: stdout holds the plan alone
        for r in results:
            print(f"# {r.host}: {r.status}{': ' + r.reason if r.reason else ''}", file=text)
            if r.push_plan is not None:  # the plan decided from the host's facts, then its commands as run dry
                print(r.push_plan.summary(), file=text)
            for line in r.plan:
                print(line, file=text)
        if json_out:
            print(json.dumps(plan_doc(image, results), indent=2, sort_keys=True), flush=True)
    elif (out := Console()).is_terminal:
        out.print(results_table(image, results))
    else:
        print(f"push {image}")
        for r in results:
            print(result_line(r))


def _report_failures(results: PushGroupResult, *, dry_run: bool) -> None:
    """One ``error: HOST: cause`` line on stderr per failed host; a host whose engine never answered (its own audit
    log was out of reach) is recorded in this machine's audit log instead (not in a dry run)."""
    for r in results.failed.values():
        reason = r.reason if r.reason.startswith(f"{r.host}:") else f"{r.host}: {r.reason}"
        print(f"error: {' '.join(reason.split())}", file=sys.stderr)
        if not r.store and not dry_run:  # its engine never answered: the host's own audit log was not reachable
            from eagle3ops.window.common import append_local_audit

            warn = append_local_audit(r.host, shlex.join(["eagle3ops", *sys.argv[1:]]), "host not reached", reason)
            if warn:
                print(f"warning: {warn}", file=sys.stderr)
