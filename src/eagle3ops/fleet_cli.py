"""``eagle3ops extract HOST HOST...`` (the fleet plan, then its windows), ``eagle3ops train HOST --from-fleet MERGED``
(the shards' hidden states copied to the training host, verified, then the train window) and ``eagle3ops render
k8s|slurm RUN``: the commands over several hosts, registered on the main typer app by
:mod:`eagle3ops.cli`.

Why this module is long: the multi-node train (:func:`train_nodes`: plan, facts, interfaces, locks with the reach
probe and the trial under them, windows, report) and the train from a fleet (:func:`fleet_train`: inputs, facts,
rates, plan, copies under the lock) are tables of steps, each a function of its own here because each exits
through the CLI (``common.fail``) and reads through its remotes; they move into :mod:`eagle3ops.fleet`
with the rest of the fleet orchestration once they raise instead of exiting."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import typer

from eagle3ops import cli_common as common
from eagle3ops.cli_common import InventoryOpt
from eagle3ops.commands.host import cat_if_exists as hc_cat
from eagle3ops.commands.host import free_bytes as hc_free
from eagle3ops.commands.host import ls as hc_ls
from eagle3ops.commands.host import parse_df_free_bytes as hc_parse_free
from eagle3ops.commands.host import write_file as hc_write
from eagle3ops.commands.fleet import node_trial_argv as fc_trial
from eagle3ops.commands.fleet import reach_argv as fc_reach
from eagle3ops.commands.fleet import reach_listen_argv as fc_listen


def fleet_extract(hosts: list[str], inventory: Path, dry_run: bool, offline: bool, run: str, pipeline: Path, *,
                  dead: list[str] | None = None, restart: bool = False, merged_out: Path | None = None,
                  json_out: bool = False) -> None:
    """``extract`` over several hosts: the fleet plan (reads only), printed; then, unless ``dry_run``, carried out
    (:mod:`eagle3ops.fleet.execute`: waves, per-host windows with their shards), the shard manifests merged and
    checked, the merged manifest written to ``merged_out`` (default ``fleet-<run>-extract-manifest.json``). Exit 1
    when a window failed or the merge does not check (the message names the shard and the rerun). ``json_out``
    (with ``dry_run``): stdout holds the plan's JSON alone, the rest goes to stderr."""
    from eagle3ops.config import ConfigError, load_inventory
    from eagle3ops.config.pipeline import parse_pipeline_config
    from eagle3ops.fleet import driver
    from eagle3ops.fleet.execute import merge_run, run_plan
    from eagle3ops.stages.merge import MergeError
    from eagle3ops.fleet.plan import FleetPlanError, render

    if offline and not dry_run:
        common.fail("--offline needs --dry-run: a real fleet run must read the hosts (add --dry-run, or drop "
                    "--offline)", 2)
    if json_out and not dry_run:
        common.fail("--json prints the plan of a dry run: add --dry-run, or drop --json", 2)
    dead_set = set(dead or ())
    text = common.read_pipeline(pipeline)
    reader = None if offline else (lambda h: common.remote(h, True, json_out) if dry_run else _reader(h))
    command = "eagle3ops " + " ".join(sys.argv[1:])
    try:
        inv = load_inventory(inventory)
        cfg = parse_pipeline_config(text, pipeline)
        if cfg.chunks.count != "off":
            raise FleetPlanError(f"{pipeline}: chunks.count is {cfg.chunks.count}: a chunked run extracts and trains "
                                 f"on one host (window train); over several hosts, set chunks.count off (each "
                                 f"host's shard is its own bounded share)")
        plan = driver.plan_hosts(inv, hosts, run, cfg, reader=reader, dead=dead_set)
        if not dry_run and not plan.tokens_exact:
            prep = driver.prepare_host(inv, hosts, dead_set)
            print(f"no host has prepared run {run}: prepare runs first on {prep.name}"
                  + ("" if not prep.serving.managed else " (a window of its own: its serving stops)"), flush=True)
            run_one = driver.window_runner(inv, run=run, pipeline_text=text, command=command, on_event=_event)
            res = run_one(driver.prepare_window(prep), kind="prepare")
            if res.get("outcome") not in ("ok", "nothing to do"):
                common.fail(f"{prep.name}: the prepare window ended {res.get('outcome')}: {res.get('error')}")
            plan = driver.plan_hosts(inv, hosts, run, cfg, reader=reader, dead=dead_set)
    except (ConfigError, FleetPlanError) as exc:
        common.fail(str(exc), 2)
    print(render(plan), file=sys.stderr if json_out else sys.stdout)
    print(json.dumps(plan.as_dict(), indent=2), flush=True)
    if dry_run:
        return
    run_one = driver.window_runner(inv, run=run, pipeline_text=text, command=command, restart=restart,
                                   on_event=_event)
    result = run_plan(plan, run_one, on_window=lambda o: print(f"[{o.window.host}] window for samples "
                                                                 f"[{o.window.start}, {o.window.end}): "
                                                                 f"{json.dumps(o.as_dict())}", flush=True))
    summary = {"run": run, "ok": result.ok, "windows": [o.as_dict() for o in result.outcomes],
               "not_started": [w.as_dict() for w in result.not_started]}
    if not result.ok:
        print(json.dumps(summary, indent=2))
        common.fail(f"fleet extract of run {run}: {sum(not o.ok for o in result.outcomes)} window(s) failed, "
                    f"{len(result.not_started)} not started; rerun the same command to resume (finished shards "
                    f"are not redone), or add --dead HOST to move a lost host's shard to another")
    try:
        merged = merge_run(plan, lambda host, path: _read(inv.host(host), path),
                           {n: inv.host(n).data_dir for n in hosts}, driver.train_host(plan, dead_set))
    except MergeError as exc:
        common.fail(f"fleet extract of run {run}: the merged manifest does not check: {exc}")
    out = merged_out or Path(f"fleet-{run}-extract-manifest.json")
    out.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    summary["merged"] = {"path": str(out), "samples": merged["samples"], "tokens": merged["tokens"],
                         "train_host": merged["fleet"]["train_host"]}
    print(json.dumps(summary, indent=2))


def fleet_train(host: str, inventory: Path, dry_run: bool, run: str, merged_file: Path,
                train_window: Callable[[], None], offline: bool = False, json_out: bool = False) -> None:
    """``train HOST --from-fleet MERGED``: the hidden-state files of a fleet run that live on other hosts copied to
    ``host``'s run dir, then the train window. In order: the training host's files read and hashed (reads only) →
    the plan printed (:func:`eagle3ops.fleet.hidden.plan_move`: per source host the bytes and the seconds from the
    link; then the window) — ``dry_run`` stops here — → under ``host``'s lock: arrivals of an interrupted copy
    verified and placed, each source host's files streamed (:mod:`eagle3ops.transfer.hidden`), verified by sha256 on
    arrival and placed, the rates recorded (``extract/fleet-copy.json``), the merged manifest checked against
    ``host``'s prepare manifest (:func:`eagle3ops.stages.merge.check_merged`) and written as ``extract/manifest.json``
    → lock released → ``train_window()`` (vocab + train on the union). Exit 1 when the bytes to copy exceed
    ``host``'s free disk (before anything is written), or naming the file and the fix when a shard file is missing
    or arrives corrupted (what arrived whole stays placed); 2 for a manifest that does not hold or ``offline``.
    ``json_out`` (with ``dry_run``): stdout holds the copy plan's JSON alone, the rest goes to stderr."""
    from eagle3ops.fleet import hidden
    from eagle3ops.transfer import hidden as move

    if offline:
        common.fail("--offline does not go with --from-fleet: the copy plan reads what the training host holds (drop "
                    "--offline; --dry-run alone prints the plan and changes nothing)", 2)
    if json_out and not dry_run:
        common.fail("--json prints the plan of a dry run: add --dry-run, or drop --json", 2)
    inv, h, merged, by_host = _fleet_inputs(inventory, host, merged_file)
    facts = _copy_facts(h, run)
    expected_all = {f.rel: f.sha256 for fs in by_host.values() for f in fs}
    plan = _copy_plan(merged, merged_file, run, host, facts, expected_all, _copy_rates(merged, facts["record"], inv))
    text = sys.stderr if json_out else sys.stdout  # --json: stdout holds the plan alone
    print(hidden.render(plan), file=text)
    print(json.dumps(plan.as_dict(), indent=2), flush=True)
    print(f"then the train window on {host}: vocab + train on the {len(expected_all)} samples' files", file=text,
          flush=True)
    try:
        hidden.check_space(plan, facts["free"], h.data_dir)
    except hidden.HiddenPlanError as exc:
        common.fail(str(exc))
    if dry_run:
        return
    _copy_under_lock(inv, host, h, run, merged, merged_file, plan, facts, expected_all)
    print(f"{host}: every file of run {run}'s {len(expected_all)} samples verified in place; merged manifest "
          f"written to {move.extract_dir(h, run)}/manifest.json", flush=True)
    train_window()


def _fleet_inputs(inventory: Path, host: str, merged_file: Path) -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
    """``(inventory, the training host, the merged manifest, its files by source host)``, judged before any host is
    reached; exit 2 when they do not hold."""
    from eagle3ops.config import ConfigError, load_inventory
    from eagle3ops.fleet import hidden

    try:
        inv = load_inventory(inventory)
        h = inv.host(host)
        merged = json.loads(merged_file.read_text())
        for name in {str(s["host"]) for s in (merged.get("fleet") or {}).get("shards") or []}:
            inv.host(name)
        by_host = hidden.files_by_host(merged)  # the manifest judged before any host is reached
    except (ConfigError, OSError, ValueError, KeyError, TypeError) as exc:
        common.fail(f"train --from-fleet {merged_file}: {exc}", 2)
    return inv, h, merged, by_host


def _copy_facts(h: Any, run: str) -> dict[str, Any]:
    """What the training host holds (reads only): ``placed`` and ``arrived`` (file → sha256: placed, and arrived
    from an interrupted copy), ``record`` (its ``extract/fleet-copy.json``) and ``free`` (bytes free in its data
    dir, None when unknown)."""
    from eagle3ops.transfer import hidden as move

    with _reader(h) as r:
        placed, arrived = move.read_digests(r, run)
        record = _json_or_empty(r, f"{move.extract_dir(h, run)}/{COPY_RECORD}")
        df = r.run(hc_free(h.data_dir), check=False)
        free = hc_parse_free(df.stdout) if df.ok else None
    return {"placed": placed, "arrived": arrived, "record": record, "free": free}


def _copy_rates(merged: dict[str, Any], record: dict[str, Any], inv: Any) -> dict[str, tuple[float, str]]:
    """Per source host the link rate the plan assumes (bytes/s, where from): the last copy's measurement, else
    ``fleet.link_mb_per_s``."""
    rates = {}
    for name in {str(s["host"]) for s in (merged.get("fleet") or {}).get("shards") or []}:
        got = ((record.get("sources") or {}).get(name) or {}).get("bytes_per_s")
        if got:
            rates[name] = (float(got), f"measured by the copy of {record.get('at', '?')}")
        elif inv.fleet.link_mb_per_s:
            rates[name] = (inv.fleet.link_mb_per_s * 1e6, "fleet.link_mb_per_s")
    return rates


def _copy_plan(merged: dict[str, Any], merged_file: Path, run: str, host: str, facts: dict[str, Any],
               expected_all: dict[str, str], rates: dict[str, tuple[float, str]]) -> Any:
    """The copy plan (:func:`eagle3ops.fleet.hidden.plan_move`, pure) over what is placed and what arrived whole;
    exit 1 when it cannot be made from the files, 2 when the manifest does not hold."""
    from eagle3ops.fleet import hidden

    try:
        good_arrived = {k: v for k, v in facts["arrived"].items() if expected_all.get(k) == v}
        return hidden.plan_move(merged, run, host, {**facts["placed"], **good_arrived}, rates)
    except (hidden.HiddenPlanError, KeyError, TypeError, ValueError) as exc:
        common.fail(f"train --from-fleet {merged_file}: {exc}", 1 if isinstance(exc, hidden.HiddenPlanError) else 2)


def _copy_under_lock(inv: Any, host: str, h: Any, run: str, merged: dict[str, Any], merged_file: Path, plan: Any,
                     facts: dict[str, Any], expected_all: dict[str, str]) -> None:
    """Under the training host's lock: the copies (:func:`_copy_all`), then the merged manifest checked against the
    host's prepare manifest and written as ``extract/manifest.json``; the lock released whatever happened. Exit 1
    naming the files that arrived corrupted, a missing prepare manifest or one that does not match."""
    from eagle3ops.stages.merge import MergeError, bind_inputs, check_merged
    from eagle3ops.transfer import hidden as move
    from eagle3ops.window.common import LockHeld, WindowError
    from eagle3ops.window.lock import acquire_lock, release_lock

    wid = f"fleetcopy-{int(time.time())}"
    with common.remote(h) as r:
        try:
            acquire_lock(r, wid, "eagle3ops " + " ".join(sys.argv[1:]), "hidden states copied for training")
        except (LockHeld, WindowError) as exc:
            common.fail(str(exc))
        try:
            bad = _copy_all(r, inv, run, plan, facts["arrived"], expected_all, facts["record"])
            if bad:
                common.fail(f"{host}: {len(bad)} file(s) arrived with another sha256 than {merged_file} lists and "
                            f"were removed: {', '.join(f'extract/{b} (from {src})' for b, src in bad[:5])}; the "
                            f"source file is damaged: delete it on its host and rerun the fleet extract (its shard "
                            f"re-extracts it), then rerun this command (the {len(expected_all) - len(bad)} verified "
                            f"file(s) stay and are not sent again)")
            prep = r.run(hc_cat(f"{h.data_dir}/runs/{run}/prepare/manifest.json"), check=False).stdout
            if not prep.strip():
                common.fail(f"{host} holds no prepare manifest for run {run}: run its prepare first (`eagle3ops "
                            f"extract {host} --run {run}` or the fleet extract with it)")
            try:
                check_merged(merged, prep)
            except MergeError as exc:
                common.fail(f"{host}: {exc}")
            r.run(hc_write(f"{move.extract_dir(h, run)}/manifest.json"),
                  stdin=json.dumps(bind_inputs(merged, prep), indent=2, sort_keys=True) + "\n")
        finally:
            release_lock(r, wid)


def train_nodes(hosts: list[str], inventory: Path, dry_run: bool, run: str, merged_file: Path | None,
                pipeline: Path, restart: bool, command: str, offline: bool = False, json_out: bool = False) -> None:
    """``train A B C --run RUN --from-fleet MERGED``: one training run over several nodes, each training the shard its
    own host extracted (:mod:`eagle3ops.fleet.nodes`, :mod:`eagle3ops.stages.trainplan`). In order:

    1. the plan (:func:`eagle3ops.fleet.nodes.plan_nodes`: hosts in shard order, node 0's rendezvous), printed;
       each node's deployed pipeline, prepare manifest and shard manifest read; node 0's train judged as a window
       would judge it (done for these inputs: nothing to do anywhere, nothing stops) — ``dry_run`` stops here;
    2. the reach probe (every node connects to node 0's rendezvous port while node 0 listens there, bounded by
       :data:`REACH_TIMEOUT_S`), then the cross-node trial (:mod:`eagle3ops.fleet.trial`: one gloo all-reduce) on
       every node at once, bounded by ``fleet.trial_timeout_s``: a node that cannot reach the rendezvous is named,
       exit 1, nothing stopped;
    3. the merged manifest checked against each node's prepare manifest and written as its ``extract/manifest.json``
       (its own shard's files verified in place by the stage);
    4. one train window per node (vocab + train with ``--nodes/--node-rank/--rendezvous``), all at once, each with
       its own preflight, stop and restore of that host's serving.

    Every node's lock is taken after step 1, before the reach probe starts a container there, and is held into
    that node's train window (its window id); a failure before the windows gives every lock taken back.

    A failed run names the node that failed first (its process killed or its own error) and the nodes that stopped
    because a peer left (:func:`eagle3ops.fleet.nodes.blame`, from each failed node's ``train.log``); every node's
    serving is restored by its own window; rerunning the same command resumes from node 0's last checkpoint on every
    node. Exit 2 for a manifest or host list that does not fit (or no ``merged_file``, or ``offline``), 1 for a failed
    trial or window. ``json_out`` (with ``dry_run``): the plan as one JSON document on stdout, the rest on stderr."""
    _refuse_options(merged_file, offline, dry_run, json_out)
    text = sys.stderr if json_out else sys.stdout  # --json: stdout holds the plan alone
    pipeline_text = common.read_pipeline(pipeline)
    inv, hs, merged, plan = _plan_nodes(hosts, inventory, run, merged_file)
    for line in plan.lines():
        print(line, file=text, flush=True)
    facts = _read_nodes(plan, hs, run, merged, pipeline_text, restart)
    if facts is None:
        print(f"{plan.nodes[0]} (node 0) has trained run {run} for these inputs: nothing to do on any node "
              f"(--restart redoes it)", file=text, flush=True)
        return
    images, ifaces = facts
    _name_interfaces(plan, hs, ifaces, run, text)
    if dry_run:
        if json_out:
            print(json.dumps({"run": run, "rendezvous": plan.rendezvous, "images": images,
                              "nodes": [{"host": n, "node_args": list(plan.node_args(n)), "shard": list(sh)}
                                        for n, sh in zip(plan.nodes, plan.shards)]}, indent=2), flush=True)
        return
    wids = _lock_nodes(plan, hs, command, lambda: _nodes_under_locks(plan, hs, images, inv, run, merged))
    results, errors = _node_windows(plan, hs, images, wids, run=run, command=command, pipeline_text=pipeline_text,
                                    restart=restart)
    _report_nodes(plan, hs, run, results, errors)


def _refuse_options(merged_file: Path | None, offline: bool, dry_run: bool, json_out: bool) -> None:
    """Exit 2 for options a multi-node train does not take (no ``--from-fleet``, ``--offline``, ``--json`` without
    ``--dry-run``)."""
    if merged_file is None:
        common.fail("several hosts train together only on a fleet run's shards: pass --from-fleet MERGED (the "
                    "merged manifest of `eagle3ops extract HOST HOST... --merged MERGED`)", 2)
    if offline:
        common.fail("--offline does not go with a multi-node train: its plan reads every node (drop --offline; "
                    "--dry-run alone prints the plan and changes nothing)", 2)
    if json_out and not dry_run:
        common.fail("--json prints the plan of a dry run: add --dry-run, or drop --json", 2)


def _plan_nodes(hosts: list[str], inventory: Path, run: str, merged_file: Path) -> tuple[Any, dict[str, Any],
                                                                                          dict[str, Any], Any]:
    """Step 1's plan (pure, from the inventory and the merged manifest): ``(inventory, {name: host}, merged,
    plan)``, node 0's rendezvous from ``fleet.rendezvous_host`` or its hostname. Exit 2 when they do not fit."""
    from eagle3ops.config import ConfigError, load_inventory
    from eagle3ops.fleet import nodes as fn

    try:
        inv = load_inventory(inventory)
        hs = {n: inv.host(n) for n in hosts}
        merged = json.loads(merged_file.read_text())
        probe = fn.plan_nodes(run, merged, hosts, rendezvous_host="-", port=inv.fleet.rendezvous_port)
        plan = fn.plan_nodes(run, merged, hosts, rendezvous_host=inv.fleet.rendezvous_host
                             or hs[probe.nodes[0]].hostname, port=inv.fleet.rendezvous_port)
    except (ConfigError, OSError, ValueError, KeyError, TypeError) as exc:
        common.fail(f"train {' '.join(hosts)} --from-fleet {merged_file}: {exc}", 2)
    return inv, hs, merged, plan


def _read_nodes(plan: Any, hs: dict[str, Any], run: str, merged: dict[str, Any], pipeline_text: str,
                restart: bool) -> tuple[dict[str, tuple[str, str | None]], dict[str, list[str]]] | None:
    """Step 1's facts, read only: each node's deployed image, network interfaces, shard manifest and prepare
    manifest (checked against ``merged``); node 0's train judged as a window would judge it. Returns ``(images,
    interfaces)`` by node, or None when node 0 has trained these inputs (nothing to do anywhere). Exit 1 for a
    node without its shard or with another prepare output."""
    from eagle3ops import executor
    from eagle3ops.fleet.driver import deployed_image
    from eagle3ops.stages.merge import MergeError, check_merged
    from eagle3ops.stages.shards import manifest_rel
    from eagle3ops.window.run import _decide

    images: dict[str, tuple[str, str | None]] = {}
    ifaces: dict[str, list[str]] = {}
    for n, name in enumerate(plan.nodes):
        h = hs[name]
        with executor.for_host(h) as r:
            images[name] = deployed_image(r)
            net = r.run(hc_ls("/sys/class/net"), check=False)
            if net.ok:
                ifaces[name] = net.stdout.split()
            a, b = plan.shards[n]
            shard = r.run(hc_cat(f"{h.data_dir}/runs/{run}/extract/{manifest_rel(a, b)}"), check=False).stdout
            if not shard.strip():
                common.fail(f"{name} holds no finished shard [{a}, {b}) of run {run} (extract/{manifest_rel(a, b)}): "
                            f"rerun the fleet extract (`eagle3ops extract {' '.join(plan.nodes)} --run {run}`)")
            prep = r.run(hc_cat(f"{h.data_dir}/runs/{run}/prepare/manifest.json"), check=False).stdout
            try:
                check_merged(merged, prep)
            except MergeError as exc:
                common.fail(f"{name}: {exc}")
            if n == 0:
                _text, decision = _decide(r, "train", run, pipeline_text, restart)
                if decision is not None and decision.nothing_to_do:
                    return None
    return images, ifaces


def _name_interfaces(plan: Any, hs: dict[str, Any], ifaces: dict[str, list[str]], run: str, text: Any) -> None:
    """Each node's NCCL/gloo interface, named where a host has several, printed; exit 2 before any serving stops
    when one cannot be chosen (:func:`eagle3ops.fleet.nodes.socket_interfaces`)."""
    from eagle3ops.fleet import nodes as fn

    try:
        for line in fn.socket_interfaces(plan, {n: dict(hs[n].stage_env) for n in plan.nodes}, ifaces):
            print(line, file=text, flush=True)
    except fn.NodePlanError as exc:
        common.fail(f"multi-node train of run {run} refused before any serving stopped: {exc}", 2)


def _lock_nodes(plan: Any, hs: dict[str, Any], command: str, under_locks: Callable[[], None]) -> dict[str, str]:
    """Every node's lock, taken before the first container starts there (the reach probe), then ``under_locks``
    (steps 2 and 3); returns the window id each lock is held under, into that node's train window. A failure
    before the windows gives every lock taken back; a lock held elsewhere exits 1."""
    from eagle3ops.window.common import LockHeld, WindowError, new_window_id
    from eagle3ops.window.lock import acquire_lock, release_lock

    wids = {n: new_window_id("train") for n in plan.nodes}
    taken: list[str] = []
    try:
        for name in plan.nodes:
            with common.remote(hs[name]) as r:
                try:
                    acquire_lock(r, wids[name], command, "multi-node train: reach probe, trial, merged manifest")
                except (LockHeld, WindowError) as exc:
                    common.fail(str(exc))
            taken.append(name)
        under_locks()
    except BaseException:
        for name in taken:  # nothing of a window started: each lock taken here is given back
            with common.remote(hs[name]) as r:
                release_lock(r, wids[name])
        raise
    return wids


def _node_windows(plan: Any, hs: dict[str, Any], images: dict[str, tuple[str, str | None]], wids: dict[str, str], *,
                  run: str, command: str, pipeline_text: str, restart: bool) -> tuple[dict[str, dict], dict[str, str]]:
    """Step 4: one train window per node, all at once, each under the lock taken for it (its window id); returns
    ``(results, errors)`` by node, an error carrying the tail of that node's ``train.log``."""
    import threading

    from eagle3ops import executor
    from eagle3ops.window.run import run_window

    results: dict[str, dict] = {}
    errors: dict[str, str] = {}

    def window(name: str) -> None:
        h = hs[name]
        try:
            with executor.for_host(h) as r:
                res = run_window(r, kind="train", image=images[name][0], expected_image_id=images[name][1],
                                 command=command, run=run, pipeline_text=pipeline_text, restart=restart,
                                 on_event=lambda e: _event(name, e), nodes=plan.node_args(name), held=wids[name])
            results[name] = res
            if res.get("outcome") not in ("ok", "nothing to do"):
                errors[name] = str(res.get("error") or res.get("outcome"))
                log = r_log(h, res.get("window_id"))
                errors[name] += "\n" + log
        except Exception as exc:  # noqa: BLE001 - named per node below
            errors[name] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=window, args=(n,)) for n in plan.nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def _report_nodes(plan: Any, hs: dict[str, Any], run: str, results: dict[str, dict], errors: dict[str, str]) -> None:
    """The windows' summary as JSON; a failed run names the node that failed first and those that followed
    (:func:`eagle3ops.fleet.nodes.blame`) and exits 1."""
    from eagle3ops.fleet import nodes as fn

    summary = {"run": run, "nodes": list(plan.nodes), "rendezvous": plan.rendezvous,
               "windows": {n: {k: results.get(n, {}).get(k) for k in ("outcome", "window_id", "downtime_s",
                                                                      "serving_healthy")} for n in plan.nodes}}
    if not errors:
        print(json.dumps(summary, indent=2), flush=True)
        print(f"multi-node train of run {run} done: the draft head is on {plan.nodes[0]} "
              f"({hs[plan.nodes[0]].data_dir}/runs/{run}/train/final)", flush=True)
        return
    failed, followed = fn.blame(list(plan.nodes), errors)
    summary["failed"], summary["followed"] = failed, followed
    print(json.dumps(summary, indent=2), flush=True)
    for n in failed:
        print(f"{n}: {errors[n].splitlines()[0][:300]}", flush=True)
    common.fail(f"multi-node train of run {run}: node {', '.join(failed)} failed first"
                + (f"; {', '.join(followed)} stopped because a peer left" if followed else "")
                + f"; every node's serving was restored by its window. Rerun the same command: training resumes from "
                  f"{plan.nodes[0]}'s last checkpoint on every node")


def _nodes_under_locks(plan: Any, hs: dict[str, Any], images: dict[str, tuple[str, str | None]], inv: Any,
                       run: str, merged: dict[str, Any]) -> None:
    """Steps 2 and 3 of :func:`train_nodes`, while the caller holds every node's lock: the reach probe, the
    cross-node trial, the merged manifest written on every node. Exits 1 (``common.fail``) naming the node that
    cannot listen, reach or pass the trial, before any serving stopped."""
    _reach_probe(plan, hs, images, inv, run)
    _cross_node_trial(plan, hs, images, inv, run)
    _write_merged_manifests(plan, hs, run, merged)


def _run_at_once(jobs: list[tuple[Any, Callable[[], list[str]], float]]) -> list[tuple[int, str]]:
    """Each job (host, its argv builder, timeout in seconds) run on its host at the same time, one thread each:
    (exit status, stdout and stderr) per job in order, (-1, the error) where it could not run (the node's verdict,
    named by the caller)."""
    import threading

    from eagle3ops import executor

    got: list[tuple[int, str]] = [(-1, "no result")] * len(jobs)

    def one(i: int) -> None:
        h, argv, timeout = jobs[i]
        try:
            with executor.for_host(h) as r:
                res = r.run(argv(), check=False, timeout=timeout)
            got[i] = (res.exited, (res.stdout or "") + (res.stderr or ""))
        except Exception as exc:  # noqa: BLE001 - the node's verdict: named by the caller
            got[i] = (-1, f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def _reach_probe(plan: Any, hs: dict[str, Any], images: dict[str, tuple[str, str | None]], inv: Any,
                 run: str) -> None:
    """Check, before any serving stops, that node 0 can listen on the rendezvous port and every node can connect
    to it (all at once, bounded by ``fleet.trial_timeout_s`` capped at :data:`REACH_TIMEOUT_S`); prints each node's
    line. Exits 1 (``common.fail``) naming node 0's port or the nodes that cannot reach it, and the config key."""
    from eagle3ops.fleet import trial as ft

    reach_s = min(REACH_TIMEOUT_S, inv.fleet.trial_timeout_s)
    _count0, _rank0, rdzv0 = plan.node_args(plan.nodes[0])
    addr0, _, port0 = rdzv0.rpartition(":")
    h0 = hs[plan.nodes[0]]
    got = _run_at_once(
        [(h0, lambda: fc_listen(h0, images[h0.name][0], port=int(port0), seconds=reach_s + REACH_LISTEN_EXTRA_S,
                                expect=len(plan.nodes)), reach_s + REACH_LISTEN_EXTRA_S + 2 * TRIAL_MARGIN_S)]
        + [(hs[n], lambda n=n: fc_reach(hs[n], images[n][0], addr=addr0, port=int(port0), timeout_s=reach_s),
            reach_s + 2 * TRIAL_MARGIN_S) for n in plan.nodes])
    rv = ft.parse_reach(list(plan.nodes), dict(zip(plan.nodes, got[1:])), {n: images[n][0] for n in plan.nodes},
                        listener=got[0])
    lrc, lout = got[0]
    if rv.not_started:  # a pipeline that cannot run the probe: neither the port nor the route is to blame
        common.fail(f"multi-node train of run {run} refused before any serving stopped: {rv.message()}")
    if lrc != 0:
        common.fail(f"multi-node train of run {run} refused before any serving stopped: {plan.nodes[0]} could not "
                    f"listen on the rendezvous port {port0}: {lout.strip()[-300:]} (free the port or set "
                    f"fleet.rendezvous_port)")
    for line in rv.detail:
        print(f"  {line}", flush=True)
    if not rv.ok:
        common.fail(f"multi-node train of run {run} refused before any serving stopped: {', '.join(rv.unreachable)} "
                    f"cannot reach the rendezvous {rdzv0} on {plan.nodes[0]}; check that node's route to "
                    f"{addr0} (fleet.rendezvous_host) and that TCP port {port0} (fleet.rendezvous_port) is open")


def _trial_argv(h: Any, image: str, args: tuple[int, int, str], timeout_s: float) -> list[str]:
    """The cross-node trial's command line for one node (its venv or its image); ``args``: (nodes, rank, addr:port)."""
    count, rank, (addr, _, port) = args[0], args[1], args[2].rpartition(":")
    return fc_trial(h, image, master_addr=addr, port=int(port), nnodes=count, node_rank=rank, timeout_s=timeout_s)


def _cross_node_trial(plan: Any, hs: dict[str, Any], images: dict[str, tuple[str, str | None]], inv: Any,
                      run: str) -> None:
    """The cross-node gloo trial on every node at once, before any serving stops, each bounded by
    ``fleet.trial_timeout_s`` plus :data:`TRIAL_MARGIN_S` twice; prints the verdict. Exits 1 (``common.fail``)
    with the verdict's message when a node fails it."""
    from eagle3ops.fleet import trial as ft

    t = inv.fleet.trial_timeout_s
    got = _run_at_once([(hs[n], lambda n=n: _trial_argv(hs[n], images[n][0], plan.node_args(n), t),
                         t + 2 * TRIAL_MARGIN_S) for n in plan.nodes])
    verdict = ft.parse_trial(list(plan.nodes), dict(zip(plan.nodes, got)), {n: images[n][0] for n in plan.nodes})
    print(verdict.message(), flush=True)
    for line in verdict.detail:
        print(f"  {line}", flush=True)
    if not verdict.ok:
        common.fail(f"multi-node train of run {run} refused before any serving stopped: {verdict.message()}")


def _write_merged_manifests(plan: Any, hs: dict[str, Any], run: str, merged: dict[str, Any]) -> None:
    """The merged extract manifest (``merged`` bound to each node's own prepare manifest) written to every node's
    ``runs/<run>/extract/manifest.json``, only where it differs; the caller holds every node's lock."""
    from eagle3ops.stages.merge import bind_inputs

    for name in plan.nodes:
        h = hs[name]
        with common.remote(h) as r:
            prep = r.run(hc_cat(f"{h.data_dir}/runs/{run}/prepare/manifest.json"), check=False).stdout
            want = json.dumps(bind_inputs(merged, prep), indent=2, sort_keys=True) + "\n"
            path = f"{h.data_dir}/runs/{run}/extract/manifest.json"
            if r.run(hc_cat(path), check=False).stdout != want:
                r.run(hc_write(path), stdin=want)


#: Seconds the driver waits for a trial beyond its own timeout and grace (SSH, start).
TRIAL_MARGIN_S = 30
#: Longest a node's reach probe tries to connect to the rendezvous port (capped by ``fleet.trial_timeout_s``).
REACH_TIMEOUT_S = 15.0
#: Seconds the listening end stays up beyond the reach timeout (the other nodes' SSH sessions start meanwhile).
REACH_LISTEN_EXTRA_S = 10.0


def r_log(h, window_id: str | None, lines: int = 200) -> str:
    """The last ``lines`` lines of the train stage's log of window ``window_id`` on ``h`` ('' when unreadable)."""
    from eagle3ops.window.common import paths

    if not window_id:
        return ""
    text = _read(h, f"{paths(h, window_id)['window']}/train.log") or ""
    return "\n".join(text.splitlines()[-lines:])


#: The training host's record of its hidden-state copies (per source host: bytes, seconds, rate), in ``extract/``.
COPY_RECORD = "fleet-copy.json"


def _copy_all(r, inv, run, plan, arrived, expected_all, rec) -> list[tuple[str, str]]:
    """The copies of ``plan`` to ``r.host`` (lock held): earlier arrivals settled first, then each source host's
    files; the rates recorded. Returns the ``(file, source host)`` pairs that arrived corrupted (removed)."""
    from eagle3ops.transfer import hidden as move

    move.settle(r, run, expected_all, arrived)
    bad, sources = [], dict(rec.get("sources") or {})
    for m in plan.moves:
        if not m.files:
            continue
        try:
            c = move.copy_files(inv.host(m.host), r, run, [f.rel for f in m.files], expected_all)
        except move.HiddenCopyError as exc:
            common.fail(str(exc))
        print(f"from {m.host}: {len(c.good)} file(s) verified and placed, {c.sent} bytes in {c.seconds} s (stream "
              f"{c.stream_s} s" + (f", {c.bytes_per_s / 1e6:.1f} MB/s)" if c.bytes_per_s else ")"), flush=True)
        bad += [(b, m.host) for b in c.bad]
        if c.bytes_per_s:
            sources[m.host] = {"bytes": c.sent, "seconds": c.seconds, "stream_s": c.stream_s,
                               "bytes_per_s": round(c.bytes_per_s)}
    if sources != (rec.get("sources") or {}):
        r.run(hc_write(f"{move.extract_dir(r.host, run)}/{COPY_RECORD}"),
              stdin=json.dumps({"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sources": sources},
                               indent=2) + "\n")
    return bad


def _json_or_empty(r, path: str) -> dict:
    """A JSON object file on ``r.host`` ({} when absent or unreadable)."""
    text = r.run(hc_cat(path), check=False).stdout
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _reader(h):
    """A read-only executor for planning a real run (no echo)."""
    from eagle3ops import executor

    return executor.for_host(h)


def _read(h, path: str) -> str | None:
    """A file's text on host ``h`` (None when absent)."""
    from eagle3ops import executor
    from eagle3ops.commands import host as hc

    with executor.for_host(h) as r:
        out = r.run(hc.cat_if_exists(path), check=False)
    return out.stdout if out.ok and out.stdout.strip() else None


def _event(host: str, ev: dict) -> None:
    """One window event, one line, prefixed with its host (windows of several hosts interleave)."""
    detail = ev.get("detail") or ev.get("message") or ev.get("error") or ""
    print(f"[{host}] {ev.get('step', '')} {ev.get('event', '')} {ev.get('check', '')} {str(detail)[:200]}".rstrip(),
          flush=True)


def render(target: str = typer.Argument(..., metavar="k8s|slurm"),
           run: str = typer.Argument(..., metavar="RUN", help="The pipeline run (data_dir/runs/RUN)."),
           hosts: list[str] = typer.Option(..., "--host", "-H", help="The hosts (nodes) of the run, in shard "
                                           "order; the first one's deployed.json names the image."),
           inventory: Path = InventoryOpt,
           record: Optional[Path] = typer.Option(None, help="A deployed.json to take the image digest from "
                                                 "instead of reading the first host's."),
           samples: int = typer.Option(..., help="Samples of the run (prepare's count): the shards are cut from "
                                       "it."),
           nproc: int = typer.Option(1, help="Training processes per node (torchrun --nproc-per-node)."),
           train_nodes: int = typer.Option(0, min=0, help="slurm: nodes of the training job (torchrun --nnodes); 0 = "
                                           "one per host."),
           claim: Optional[str] = typer.Option(None, help="k8s: the PersistentVolumeClaim holding data_dir "
                                               "(default: the inventory's fleet.k8s_claim).")) -> None:
    """Print the run's stages as Kubernetes Jobs (extract: an Indexed Job, one completion per shard; train after
    merge and vocab) or a Slurm submit script (an extract array, merge + vocab, train, ordered by afterok), the
    pipeline image named by digest; CPUs, /dev/shm and the claim from the inventory. Prepare the run first: its
    sample count is --samples."""
    from eagle3ops.config import ConfigError, load_inventory
    from eagle3ops.fleet.render import (RenderError, RenderInput, image_by_digest, render_k8s, render_slurm,
                                        shm_bytes, shm_quantity)
    from eagle3ops.fleet.shard import shard_ranges

    if target not in ("k8s", "slurm"):
        common.fail(f"render target {target!r}: use `k8s` or `slurm`", 2)
    try:
        inv = load_inventory(inventory)
        first = inv.host(hosts[0])
        for n in hosts[1:]:
            inv.host(n)
        if record is not None:
            deploy_record = json.loads(record.read_text())
        else:
            with common.remote(first) as r:
                deploy_record = common.deployed_record(r)
        image, source = image_by_digest(deploy_record)
        nodes = [inv.host(n) for n in hosts]
        unsized = [h.name for h in nodes if h.cpus is None]
        if unsized:  # a task must not be left one core: each task has its node, vLLM's and torchrun's workers on it
            raise RenderError(f"hosts {', '.join(unsized)}: no `cpus` in {inventory}: set each host's cpus (the "
                              f"cores a task on it may use, e.g. cpus: 64)")
        unshm = [h.name for h in nodes if h.stage_shm_size is None]
        if target == "k8s" and unshm:
            raise RenderError(f"hosts {', '.join(unshm)}: no `stage_shm_size` in {inventory}: a pod's /dev/shm is "
                              f"64 MiB otherwise, too small for NCCL and vLLM's workers; set it, e.g. 16g")
        # the smallest host's /dev/shm and CPUs fit a task on any of them
        shm = min((h.stage_shm_size for h in nodes if h.stage_shm_size), default=None, key=shm_bytes)
        inp = RenderInput(run, image, source, tuple(shard_ranges(samples, hosts)), first.data_dir,
                          first.model_path, first.gpus, nproc, inv.fleet.rendezvous_port, inv.fleet.slurm_container,
                          inv.fleet.k8s_namespace, cpus=min(int(h.cpus or 0) for h in nodes),
                          shm=shm_quantity(shm) if shm else None, claim=claim or inv.fleet.k8s_claim,
                          model_claim=inv.fleet.k8s_model_claim, train_nodes=train_nodes,
                          stage_timeout_s=min(h.stage_timeout_s for h in nodes))
        print(render_k8s(inp) if target == "k8s" else render_slurm(inp), end="")
    except (ConfigError, RenderError, ValueError, OSError) as exc:
        common.fail(str(exc), 2)
