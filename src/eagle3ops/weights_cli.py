"""``eagle3ops weights HOST --from OTHER [--dry-run]`` (the target's weights from another inventory host) and the
``--head HOST:RUN`` form of ``speculate`` (a head trained on another host, fetched and installed here): the
rented-host lifecycle, registered on the main typer app by :mod:`eagle3ops.cli`."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import typer

from eagle3ops import cli_common as common
from eagle3ops.cli_common import DryRunOpt, InventoryOpt, JsonOpt

#: ``--link-mbit``'s default: the rate the plan's time estimate assumes (Mbit/s).
DEFAULT_LINK_MBIT = 1000.0


def weights(host: str = typer.Argument(..., metavar="HOST", help="The host that gets the weights (its "
                                       "model_path)."),
            source: str = typer.Option(..., "--from", help="The inventory host that holds them (its model_path)."),
            link_mbit: float = typer.Option(DEFAULT_LINK_MBIT, "--link-mbit", help="Link rate the plan's time "
                                            "estimate assumes, Mbit/s."),
            inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt, json_out: bool = JsonOpt) -> None:
    """Copy the target's weights from another inventory host: files missing or differing (by the source's weights
    manifest: names, sizes, sha256) are streamed through this machine over SSH, a partial file resumed, each
    verified by sha256 on HOST before it is renamed into place. The plan (bytes, time) is printed first; --dry-run
    prints only it. HOST's lock is held during the copy; serving on HOST is not stopped or restarted."""
    from eagle3ops.config import ConfigError, load_inventory
    from eagle3ops.transfer.weights import WeightsError, check_room, copy_steps, plan_weights, record_dest_manifest
    from eagle3ops.transfer.weightsplan import WeightsPlanError, render
    from eagle3ops.window.common import LockHeld, WindowError, append_audit, new_window_id
    from eagle3ops.window.lock import acquire_lock, read_lock, release_lock, describe_lock

    if link_mbit <= 0:
        common.fail(f"--link-mbit {link_mbit}: give the link's rate in Mbit/s (a positive number)", 2)
    try:
        inv = load_inventory(inventory)
        dst_h, src_h = inv.host(host), inv.host(source)
    except ConfigError as exc:
        common.fail(str(exc), 2)
    with common.remote(src_h, dry_run, json_out) as sr, common.remote(dst_h, dry_run, json_out) as dr:
        try:
            plan, facts = plan_weights(sr, dr, link_mbit * 1e6 / 8)
            free = check_room(dr, plan)
        except (WeightsError, WeightsPlanError) as exc:
            common.fail(str(exc))
        text = sys.stderr if json_out else sys.stdout  # --json: stdout holds the plan alone
        if facts["rehashed"]:
            print(f"{src_h.name}: {len(facts['rehashed'])} file(s) hashed "
                  + ("again (size or mtime changed since the manifest)" if facts["had_manifest"] else
                     "(no weights manifest was recorded; it is now)"), file=text)
        print(render(plan), file=text)
        if not json_out:
            print(json.dumps({**plan.as_dict(), "dest_free_bytes": free}), flush=True)
        if dry_run:
            if read_lock(dr):
                print(f"note: {describe_lock(dr)}", file=text)
            return common.print_plan({**plan.as_dict(), "dest_free_bytes": free}, dst_h, json_out)
        if facts["source_stale"]:
            _record_source(sr, facts["source_entries"])
        if not plan.send_bytes:
            print(f"{dst_h.name}: the weights are there already (every file's sha256 matches {src_h.name}'s)")
            return
        wid, command = new_window_id("weights"), "eagle3ops " + " ".join(sys.argv[1:])
        try:
            acquire_lock(dr, wid, command, f"weights from {src_h.name}")
        except (LockHeld, WindowError) as exc:
            common.fail(str(exc))
        outcome: dict[str, Any] = {"outcome": "failed"}
        try:
            res = copy_steps(plan, src_h, dst_h, on_file=lambda f: print(json.dumps(f), flush=True))
            record_dest_manifest(dr, plan)
            outcome = {"outcome": "ok", "sent_bytes": res["sent_bytes"], "seconds": res["seconds"]}
        except WeightsError as exc:
            outcome["error"] = str(exc)
            common.fail(str(exc))
        finally:
            append_audit(dr, {"host": dst_h.name, "command": command, "window": wid, "from": src_h.name,
                              **outcome})
            release_lock(dr, wid)
    rate = res["sent_bytes"] / res["seconds"] if res["seconds"] else 0.0
    print(json.dumps({"host": dst_h.name, "from": src_h.name, **outcome, "rate_mbit": round(rate * 8 / 1e6, 1),
                      "estimate_s": round(plan.estimate_s, 1)}))


def _record_source(sr: Any, entries: dict[str, Any]) -> None:
    """The source's refreshed weights manifest written back under the source's own lock, taken for that write only;
    a source whose lock is held (a window runs there) keeps its old manifest (a note says so): the copy needs only
    the entries read now, and the next ``weights --from`` hashes the same files again."""
    from eagle3ops.transfer.weights import record_source_manifest
    from eagle3ops.window.common import LockHeld, WindowError, new_window_id
    from eagle3ops.window.lock import acquire_lock, release_lock

    wid = new_window_id("weights-manifest")
    try:
        acquire_lock(sr, wid, "eagle3ops " + " ".join(sys.argv[1:]), "weights manifest recorded")
    except LockHeld as exc:
        print(f"note: {sr.host.name}'s weights manifest is not written back now: {exc}", flush=True)
        return
    except WindowError as exc:
        common.fail(str(exc))
    try:
        record_source_manifest(sr, entries)
    finally:
        release_lock(sr, wid)


HEAD_REF = re.compile(r"^(?P<host>[A-Za-z0-9][A-Za-z0-9_.-]*):(?P<run>[A-Za-z0-9_.-]+)$")


def head_for(inventory: Path, r: Any, head: Path | None, *, link_mbit: float = DEFAULT_LINK_MBIT,
             defer: bool = False, json_out: bool = False) -> Any:
    """``speculate``'s ``--head``: a local directory is returned as it is (uploaded by the speculate job);
    ``HOST:RUN`` naming an inventory host (and no local path) fetches that run's final head from HOST into this
    host's ``<data_dir>/heads/<sha256[:12]>`` (each file verified by its sha256 from the run's train manifest on
    arrival) and returns an :class:`eagle3ops.transfer.weights.InstalledHead`; in a dry run the fetch is printed,
    not made. ``defer``: plan and check the fetch (reads only) but leave it to the caller, under this host's lock
    (the head's ``pending``). ``json_out`` (``--dry-run --json``): the fetch's lines and the source's reads go to
    stderr, stdout keeping the caller's one JSON document; the fetch's plan is the head's ``fetch``
    (:meth:`~eagle3ops.transfer.weightsplan.WeightsPlan.as_dict`) for that document. Exits 1 naming the host, run
    and file when the head is missing or refused."""
    from eagle3ops.config import ConfigError, load_inventory
    from eagle3ops.transfer.weights import InstalledHead, WeightsError, check_room, copy_steps, head_plan
    from eagle3ops.transfer.weightsplan import render

    m = HEAD_REF.match(str(head)) if head is not None and not head.exists() else None
    if m is None:
        return head
    try:
        src_h = load_inventory(inventory).host(m["host"])
    except ConfigError as exc:
        common.fail(f"--head {head}: neither a local directory nor HOST:RUN of an inventory host: {exc}", 2)
    out = sys.stderr if json_out else sys.stdout
    with common.remote(src_h, r.dry_run, json_out and r.dry_run) as sr:
        try:
            plan, digest = head_plan(sr, r, m["run"], link_mbit * 1e6 / 8)
            print(render(plan), file=out, flush=True)
            check_room(r, plan)
            if not r.dry_run and plan.send_bytes and not defer:
                copy_steps(plan, src_h, r.host)
        except WeightsError as exc:
            common.fail(f"--head {head}: {exc}")
    later = defer and not r.dry_run and bool(plan.send_bytes)
    print(f"head {digest[:16]} of run {m['run']} on {src_h.name} "
          + ("would be installed" if r.dry_run else "to be installed under the lock" if later else "installed")
          + f" at {r.host.name}:{plan.dest_dir}", file=out, flush=True)
    return InstalledHead(str(head), plan.dest_dir, digest,
                         pending=(lambda: copy_steps(plan, src_h, r.host)) if later else None, fetch=plan.as_dict())
