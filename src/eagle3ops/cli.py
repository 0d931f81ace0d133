"""The ``eagle3ops`` command line (typer): thin commands that load the inventory and call the orchestration layer.

Every command that changes a host takes ``--dry-run``, which prints the remote commands in order and runs none of
them (read-only checks still run, so the plan shows real answers); with ``--json`` (the window commands and
``weights``) the plan is printed as one JSON document instead (:func:`eagle3ops.cli_common.print_plan`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from eagle3ops import __version__
from eagle3ops import cli_common as common
from eagle3ops.cli_common import DryRunOpt, InventoryOpt, JsonOpt
from eagle3ops.config import HostConfig
from eagle3ops.config_cli import app as config_app
from eagle3ops.console import answer_lines, print_event, speculate_result, summary
from eagle3ops.image_cli import app as image_app
from eagle3ops.lock_cli import app as lock_app
from eagle3ops.patches.cli import app as patch_app
from eagle3ops.stages.cli import app as stage_app
from eagle3ops.watch_cli import watch_command
from eagle3ops import cycle_cli, fleet_cli, group_cli, weights_cli

console = common.console
app = typer.Typer(no_args_is_help=True, help="Train and ship an EAGLE-3 draft head for a model served with vLLM.")
app.add_typer(patch_app, name="patch", help="Patch series: apply, probe, check, new/refresh, rebase, capture, drift.")
app.add_typer(stage_app, name="stage", help="Pipeline stages (run inside the pipeline image).")
app.add_typer(image_app, name="image", help="Versioned images: build, ls.")
app.add_typer(lock_app, name="lock")
app.add_typer(config_app, name="config")
app.add_typer(group_cli.app, name="group")

_command_line = common.command_line  # this invocation, quoted and redacted (the lock and audit show it)


def _window(kind: str, host: HostConfig, dry_run: bool, json_out: bool = False, **kw: Any) -> dict[str, Any]:
    from eagle3ops.window.common import pipeline_image
    from eagle3ops.window.common import WindowError
    from eagle3ops.window.run import run_window

    command = _command_line()
    with common.remote(host, dry_run, json_out) as r:
        dep = common.deployed_record(r, required=not (dry_run or host.pipeline_image))
        try:
            image, image_id = pipeline_image(host, dep)
            result = run_window(r, kind=kind, image=image, expected_image_id=image_id, command=command,
                                on_event=print_event, **kw)
        except WindowError as exc:
            common.fail(str(exc))
    if dry_run:
        common.print_plan(result, host, json_out)
        return result
    summary(result)
    if result.get("outcome") not in ("ok", "nothing to do"):
        raise typer.Exit(1)
    return result


@app.command()
def version() -> None:
    """Print the eagle3ops version."""
    print(__version__)


@app.command()
def deploy(host: str, inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt, json_out: bool = JsonOpt,
           profile: Optional[str] = typer.Option(None, help="Patch profile of the pipeline image (default: "
                                                 "hosts.HOST.profile, else the registry's default)."),
           base_image: Optional[str] = typer.Option(None, help="Override BASE_IMAGE (local bases)."),
           env_tarball: Optional[Path] = typer.Option(None, help="`stage_runtime: venv` hosts: the pipeline "
                                                      "environment tarball to deliver (verified by sha256); "
                                                      "default: the pipeline image's venv, exported.")) -> None:
    """Build the pipeline image if needed, then under the host's lock push it over SSH, verify its id on the host,
    preflight, run the probes the build deferred to the host. Serving untouched. A stand-in (an image built on a
    stand-in base, a stand-in environment) is refused on a host that is not a sandbox, before anything is built or
    sent."""
    from eagle3ops import deployer

    h = common.load_host(inventory, host)
    with common.plan_output(dry_run, json_out):  # --json: stdout keeps the plan alone
        try:
            res = deployer.deploy(h, dry_run=dry_run, profile=profile or h.profile, base_image=base_image, echo=console.print,
                                  env_tarball=env_tarball, command=_command_line())
        except deployer.DeployError as exc:
            common.fail(str(exc))
    common.print_plan(res.plan or {}, h, json_out)


RestartOpt = typer.Option(False, "--restart", help="Redo extract/train from scratch even when done for these "
                          "inputs (a window whose stages are all done is otherwise a no-op: serving is not stopped).")
OfflineOpt = typer.Option(False, "--offline", help="With --dry-run: no SSH at all; the host's facts (GPUs, serving "
                          "container, stages done) are assumed from the inventory and labelled so in the plan.")


def _stage_window(kind: str, h: HostConfig, dry_run: bool, offline: bool, json_out: bool = False, **kw: Any) -> None:
    """An extract/train window, or its offline plan (``--dry-run --offline``: :mod:`eagle3ops.window.offline`)."""
    if not offline:
        _window(kind, h, dry_run, json_out, **kw)
        return
    if not dry_run:
        common.fail("--offline needs --dry-run: a real window must read the host (add --dry-run, or drop --offline)", 2)
    from eagle3ops.window.offline import offline_dry_run

    with common.plan_output(dry_run, json_out):  # --json: the printed plan to stderr, its value to stdout
        plan = offline_dry_run(h, kind=kind, command="eagle3ops " + " ".join(sys.argv[1:]), **kw)
    common.print_plan(plan, h, json_out)


@app.command()
def extract(hosts: list[str] = typer.Argument(..., metavar="HOST...", help="One host, or several: the samples are "
                                              "sharded over them in this order (a fleet run)."),
            inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt,
            run: str = typer.Option("default", help="Pipeline run name (data_dir/runs/NAME)."),
            pipeline: Path = typer.Option(Path("deploy/pipeline.yaml"), help="Pipeline config to run with."),
            restart: bool = RestartOpt, offline: bool = OfflineOpt, json_out: bool = JsonOpt,
            dead: list[str] = typer.Option([], "--dead", help="Several hosts: a lost host (repeatable); its shard "
                                           "moves to another."),
            merged: Optional[Path] = typer.Option(None, help="Several hosts: the merged manifest's file.")) -> None:
    """Maintenance window 1: stop serving, run prepare + extract, restore serving (health-gated). Stages done for
    these inputs are skipped, decided before the stop (--restart redoes). Several hosts: the fleet plan printed, then
    run wave by wave (`fleet:` policy), each window its shard; shard manifests merged. A rerun resumes."""
    if len(hosts) > 1:
        fleet_cli.fleet_extract(hosts, inventory, dry_run, offline, run, pipeline, dead=dead, restart=restart,
                                merged_out=merged, json_out=json_out)
        return
    if dead or merged:
        common.fail("--dead and --merged are for a run over several hosts (name them all)", 2)
    h = common.load_host(inventory, hosts[0])
    _stage_window("extract", h, dry_run, offline, json_out, run=run, pipeline_text=common.read_pipeline(pipeline),
                  restart=restart)


@app.command()
def train(hosts: list[str] = typer.Argument(..., metavar="HOST [HOST...]"), inventory: Path = InventoryOpt,
          dry_run: bool = DryRunOpt,
          run: str = typer.Option("default", help="Pipeline run name (data_dir/runs/NAME)."),
          pipeline: Path = typer.Option(Path("deploy/pipeline.yaml"), help="Pipeline config to run with."),
          restart: bool = RestartOpt, offline: bool = OfflineOpt, json_out: bool = JsonOpt,
          from_fleet: Optional[Path] = typer.Option(None, "--from-fleet", metavar="MERGED", help="A fleet run's "
                                                    "merged manifest: one HOST gets its hidden states first; several "
                                                    "train their own shards together (multi-node).")) -> None:
    """Maintenance window 2: stop serving, run vocab + train, restore serving (health-gated). Stages done for
    these inputs are skipped, decided before the stop; when all are, serving is not stopped (--restart redoes).
    Several HOSTs: one multi-node run over a fleet run's shards (`fleet_cli.train_nodes`)."""
    if len(hosts) > 1:
        return fleet_cli.train_nodes(hosts, inventory, dry_run, run, from_fleet, pipeline, restart, _command_line(),
                                     offline, json_out)
    host = hosts[0]
    h, kw = common.load_host(inventory, host), {"run": run, "pipeline_text": common.read_pipeline(pipeline)}
    window = lambda: _stage_window("train", h, dry_run, offline, json_out, restart=restart, **kw)  # noqa: E731
    fleet_cli.fleet_train(host, inventory, dry_run, run, from_fleet, window, offline, json_out) if from_fleet \
        else window()


@app.command()
def release(host: str, inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt, json_out: bool = JsonOpt,
            arg: list[str] = typer.Option([], "--arg", help="Server flag to set for this release (repeatable; "
                                                           "replaces the same flag of the live command)."),
            image: Optional[str] = typer.Option(None, "--image", help="New serving image for this release."),
            env: list[str] = typer.Option([], "--env", help="NAME=VALUE to set in serving's environment for this "
                                          "release (repeatable), e.g. NCCL_ALGO=Ring; values are not logged."),
            gate: bool = typer.Option(False, "--gate", help="Measure the change against the live release (the "
                                      "speculation gate's prompts, passes and interval) and keep it only if not "
                                      "slower beyond serving.gate_margin; else roll back."),
            margin: Optional[float] = typer.Option(None, "--margin", help="With --gate: override "
                                                   "serving.gate_margin.")
            ) -> None:
    """Roll out a new serving release: the live serving (container or process) with only this change (--arg
    flags, --env, --image), every other setting kept; health-gated; rollback on failure. The inventory's serving flags are not applied
    (`eagle3ops config check HOST` shows how they differ from the live container). With --gate: exit 0 when
    kept, 3 when measured slower (or undecided) and rolled back."""
    from eagle3ops.window.common import pipeline_image
    from eagle3ops.config.plan import ReleaseChange

    h = common.load_host(inventory, host)
    change = ReleaseChange(args=list(arg), image=image, env=common.env_pairs(env, "--env"))
    if not gate:
        if margin is not None:
            common.fail("--margin needs --gate", code=2)
        _window("release", h, dry_run, json_out, change=change)
        return
    if margin is not None:  # before the host is reached
        from eagle3ops.config.inventory import check_gate_margin

        try:
            check_gate_margin(margin)
        except ValueError as e:
            common.fail(f"--margin: {e}", code=2)
    from eagle3ops.speculate.gated import gated_release
    from eagle3ops.speculate.ship import SpeculateError
    from eagle3ops.window.common import WindowError

    with common.remote(h, dry_run, json_out) as r:
        dep = common.deployed_record(r, required=not (dry_run or h.pipeline_image))
        try:
            pimage, pimage_id = pipeline_image(h, dep)
            res = gated_release(r, change, pipeline_image=pimage, pipeline_image_id=pimage_id,
                                command=_command_line(), margin=margin,
                                echo=lambda m: console.print(m), on_event=print_event)
        except (SpeculateError, WindowError) as exc:
            common.fail(str(exc))
    if dry_run:
        return common.print_plan(res, h, json_out)
    console.print(f"[bold]{res['verdict']}[/bold]: {res['reason']}")
    for line in answer_lines(res):  # reported beside the verdict, not part of it
        console.print(line, markup=False)
    print(json.dumps({"verdict": res["verdict"], "live_release": res.get("live_release")}))
    if res["verdict"] != "keep":
        raise typer.Exit(3)


@app.command()
def rollback(host: str, inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt, json_out: bool = JsonOpt,
             to: Optional[int] = typer.Option(
                 None, "--to", help="Release number: any retained release, one a gate rejected included (named as "
                                    "such). Default: the release production kept live before the current one.")
             ) -> None:
    """Bring back a retained serving release, health-gated. Default: the release production kept live before the
    current one, passing over releases a gate rejected or that were live only while a gate measured them; the
    target and why are printed before anything stops."""
    h = common.load_host(inventory, host)
    _window("rollback", h, dry_run, json_out, to_release=to)


@app.command()
def speculate(host: str, run: str = typer.Option(..., "--run", help="The pipeline run (its head: train/final; "
                                                                       "results: runs/<run>/speculate/)."),
              head: Optional[Path] = typer.Option(None, "--head", help="A local head directory trained elsewhere "
                                                  "(uploaded), or HOST:RUN: that run's head on HOST, fetched."),
              image: Optional[str] = typer.Option(None, "--image", help="Patched serving image (default: "
                                                  "serving.speculative_image)."),
              force: bool = typer.Option(False, "--force", help="Accept a head whose offline acceptance "
                                         "estimate is below serving.acceptance_floor, or a --head that the host "
                                         "cannot estimate (no hidden states of the run)."),
              allow_template_mismatch: bool = typer.Option(
                  False, "--allow-template-mismatch", help="Ship a head whose run's data was rendered with another "
                  "chat template than the live release's (serving's --chat-template, or the tokenizer's own)."),
              with_humaneval: bool = typer.Option(
                  False, "--with-humaneval", help="With --prompts-file: also replay HumanEval's gate split "
                  "(serving.gate_prompts of them) as the prompt set \"code\"; one table per set."),
              control: bool = typer.Option(
                  False, "--control", help="Measure a control release (the speculative image without "
                  "--speculative-config, every other flag equal) as the baseline: needed when the speculative "
                  "image differs from the live one (like for like); one more serving restart."),
              arg: list[str] = typer.Option([], "--arg", help="Server flag to set on the speculative release and its "
                                            "--control baseline alike, as release --arg sets it (repeatable), e.g. "
                                            "--arg=--block-size=32; needs --control."),
              margin: Optional[float] = typer.Option(None, "--margin", help="Override serving.gate_margin (0 or "
                                                     "more; negative only in tests, with "
                                                     "EAGLE3OPS_TEST_ALLOW_NEGATIVE_MARGIN=1)."),
              method: str = typer.Option("eagle3", "--method", help="Speculation methods to measure, comma-separated:"
                                         " eagle3 (the run's head; always included), ngram (vLLM's prompt lookup, "
                                         "beside it). With several methods or --k values (at most 6 candidates), "
                                         "every candidate is measured against one baseline at a corrected level and "
                                         "the best is confirmed afresh."),
              k: str = typer.Option("", "--k", help="Speculative lengths, comma-separated, 1-8 (default: ttt_steps)."),
              draft_tp: str = typer.Option("", "--draft-tp", help="The EAGLE-3 draft's tensor parallelism to "
                                           "measure, comma-separated: 1 or the target's TP, e.g. 1,8 (default: the "
                                           "target's)."),
              passes: Optional[int] = typer.Option(None, "--passes", min=3, help="Passes per release at each gate "
                                                   "concurrency (override serving.gate_passes; at least 3)."),
              accept_low_power: bool = typer.Option(
                  False, "--accept-low-power", help="Measure even when the gate's planned power (its chance to keep "
                  "a release truly x1.30 faster, at this host's recorded pass CV) is below 80 %; without it such a "
                  "gate is refused before any restart."),
              prompts_file: Optional[Path] = typer.Option(
                  None, "--prompts-file", help="Replay these prompts instead of HumanEval's gate split: a JSONL "
                  "file, one {\"prompt\": TEXT, \"id\": ID (optional)} a line, all of them in file order (not "
                  "serving.gate_prompts). TEXT goes to /v1/completions as is: render chat turns with the served "
                  "chat template first. A line may instead be a chat body, {\"messages\": [...]} with e.g. "
                  "\"tools\" or \"response_format\", sent to /v1/chat/completions as given (greedy, the gate's "
                  "max_tokens)."),
              inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt, json_out: bool = JsonOpt) -> None:
    """Ship a draft head as a speculative serving release; keep it only when measured faster (else roll back)."""
    from eagle3ops.window.common import pipeline_image
    from eagle3ops.speculate.ship import SpeculateError, SpeculateOptions, check_invocation
    from eagle3ops.speculate.ship import speculate as run_speculate
    from eagle3ops.window.common import WindowError

    methods = [m.strip() for m in method.split(",") if m.strip()]
    ks, tps = common.int_list(k, "--k", "2,3"), common.int_list(draft_tp, "--draft-tp", "1,8")
    asked = SpeculateOptions(run=run, pipeline_image="", serving_image=image, force=force, control=control,
                             allow_template_mismatch=allow_template_mismatch, with_humaneval=with_humaneval,
                             methods=tuple(methods), ks=tuple(ks), draft_tps=tuple(tps), margin=margin, passes=passes,
                             args=tuple(arg),
                             accept_low_power=accept_low_power, prompts_file=prompts_file, command=_command_line())
    try:  # before the inventory is read or the host reached
        check_invocation(host, asked)
    except SpeculateError as e:
        common.fail(str(e), code=2)
    h = common.load_host(inventory, host)
    with common.remote(h, dry_run, json_out) as r:
        dep = common.deployed_record(r, required=not (dry_run or h.pipeline_image))
        pimage, pimage_id = pipeline_image(h, dep)
        opts = dataclasses.replace(asked, pipeline_image=pimage, pipeline_image_id=pimage_id,
                                   head=weights_cli.head_for(inventory, r, head, defer=True, json_out=json_out))
        try:
            res = run_speculate(r, opts, echo=lambda m: console.print(m), on_event=print_event)
        except (SpeculateError, WindowError) as exc:
            common.fail(str(exc))
    _speculate_report(res, opts, h, dry_run, json_out)


def _speculate_report(res: dict, opts, h, dry_run: bool, json_out: bool) -> None:
    """What ``speculate`` prints: the plan (with a head fetched from another host, that fetch too), or the result
    and its one-line JSON summary."""
    if dry_run:  # a head from another host: its fetch (made under this host's lock) is part of the plan
        fetch = getattr(opts.head, "fetch", None)
        return common.print_plan({**res, **({"head_fetch": fetch} if fetch else {})}, h, json_out)
    speculate_result(console, res)
    print(json.dumps({"verdict": res["verdict"], "live_release": res.get("live_release"),
                      "mean_acceptance_length": (res.get("spec_decode") or {}).get("mean_acceptance_length")}))


def _newest_window(r, required: str = "") -> str | None:
    """Id of the host's newest window; fails with ``no window to <required>`` when ``required`` and none exists."""
    from eagle3ops.window.common import latest_window

    wid = latest_window(r)
    if not wid and required:
        common.fail(f"{r.host.name}: no window to {required}")
    return wid


@app.command()
def status(host: str, inventory: Path = InventoryOpt) -> None:
    """Lock, serving release and the newest window's journal and result."""
    from eagle3ops.commands import host as hc
    from eagle3ops.window.common import paths
    from eagle3ops.window.live import disagreement, newest_record, read_live
    from eagle3ops.window.lock import read_lock

    h = common.load_host(inventory, host)
    with common.remote(h) as r:
        lock = read_lock(r)
        console.print(f"lock: {json.dumps(lock) if lock else 'free'}")
        cur = r.run(hc.cat_if_exists(f"{paths(h)['releases']}/current"), check=False)
        console.print(f"serving release: {cur.stdout.strip() or 'none recorded'}" if h.serving.managed else
                      "serving: none (serving: none in the inventory: a host that only trains)")
        live = read_live(r)  # the truth about serving is the live server, not the newest result
        if live.running is not None:
            console.print(live.line(), markup=False, soft_wrap=True)
        wid, record = newest_record(r)
        note = disagreement(record, wid, live)
        if note:
            console.print(note.replace("HOST", host), style="bold red", markup=False, soft_wrap=True)
        if not wid:
            console.print("no window has run on this host")
            return
        p = paths(h, wid)
        for line in r.run(hc.cat_if_exists(p["journal"]), check=False).stdout.splitlines():
            print_event(json.loads(line))
        res = r.run(hc.cat_if_exists(p["result"]), check=False).stdout
        if res.strip():
            summary({**json.loads(res), "window_id": wid})
        else:
            from eagle3ops.window.common import hint

            console.print(f"window {wid} is still running (or its supervisor died: {hint('recover', host)})")


@app.command()
def attach(host: str, inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt, json_out: bool = JsonOpt) -> None:
    """Follow the newest window's journal until it finishes, then print its summary (and remove its finished
    supervisor container: the only change attach makes on the host, which ``--dry-run`` prints)."""
    from eagle3ops.window.common import WindowError
    from eagle3ops.window.watch import finish_window, watch

    with common.remote(common.load_host(inventory, host), dry_run, json_out) as r:
        wid = _newest_window(r, "attach to")
        try:
            if dry_run:
                return _dry_finish(r, wid, json_out)
            result = finish_window(r, wid, watch(r, wid, on_event=print_event), command="attach")
        except WindowError as exc:
            common.fail(str(exc))
    summary(result)


def _dry_finish(r, wid: str, json_out: bool = False) -> None:
    """Dry run of following window ``wid`` to its end: its result if it has one (read), then the commands that
    finish it (:func:`eagle3ops.window.watch.finish_window`, printed by the dry-run executor, not run); with
    ``json_out``, then the window and those changes as one JSON document."""
    from eagle3ops.commands import host as hc
    from eagle3ops.window.common import paths
    from eagle3ops.window.watch import finish_window

    done = r.run(hc.cat_if_exists(paths(r.host, wid)["result"]), check=False).stdout.strip()
    if not done:
        print(f"# window {wid} has no result yet: a real run follows its journal until result.json appears, then:",
              file=sys.stderr if json_out else sys.stdout)
    finish_window(r, wid, json.loads(done) if done else {}, command="dry-run")
    common.print_plan({"window_id": wid, "finished": bool(done), "changes": list(r.changes)}, r.host, json_out)


@app.command()
def recover(host: str, inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt, json_out: bool = JsonOpt) -> None:
    """Finish an interrupted window: restart its supervisor, which skips done stages and restores serving. Serving
    that is not running while no window holds the lock (stopped outside a window) is started again and waited for
    (``/health``); where the newest window's record disagrees with the live server, it says so."""
    from eagle3ops.window.common import WindowError
    from eagle3ops.window.live import recover_stopped
    from eagle3ops.window.run import relaunch
    from eagle3ops.window.watch import finish_window, watch

    h = common.load_host(inventory, host)
    with common.remote(h, dry_run, json_out) as r:
        try:
            if recover_stopped(r, echo=lambda line: console.print(line, markup=False, soft_wrap=True),
                               command=_command_line()):
                return common.print_plan({"serving_started": True, "changes": list(r.changes)}, h, json_out)
        except WindowError as exc:
            common.fail(str(exc))
        wid = _newest_window(r, "recover")
        deployed = common.deployed_record(r, required=False)["image"]
        try:
            if not relaunch(r, wid, fallback_image=None if deployed.startswith("<") else deployed):
                console.print(f"window {wid} already finished with serving running" if h.serving.managed else
                              f"window {wid} already finished (the host has no serving)")
            if dry_run:
                return _dry_finish(r, wid, json_out)
            result = finish_window(r, wid, watch(r, wid, on_event=print_event), command="recover")
        except WindowError as exc:
            common.fail(str(exc))
    summary(result)


@app.command()
def regenerate(host: str, run: str = typer.Option(..., "--run", help="The pipeline run (the dataset goes to "
                                                                         "runs/<run>/regenerated/dataset.jsonl)."),
               dataset: list[Path] = typer.Option([], "--dataset", help="A local chat file (JSONL/JSON array/"
                                                  "Parquet, the forms prepare reads) or builtin:sharegpt-v3; each "
                                                  "assistant turn is answered in turn; repeatable. Default: "
                                                  "HumanEval's train split (the gate's split held out)."),
               truncated: str = typer.Option("error", "--truncated", help="error | keep-complete: a dataset cut "
                                             "off mid-record (the packaged ShareGPT V3 is)."),
               max_turns: Optional[int] = typer.Option(None, "--max-turns", min=1,
                                                       help="Answer at most N assistant turns per conversation."),
               held_out: Optional[float] = typer.Option(None, "--held-out", help="Hold this fraction of the "
                                                        "--dataset conversations out, by content: conversations "
                                                        "sharing any user turn (NFKC, casefold, whitespace collapsed)"
                                                        " stay on one side; groups and duplicates recorded)."),
               time_budget: Optional[float] = typer.Option(None, "--time-budget", min=0, help="Start no "
                                                           "conversation after this many seconds (a rerun goes on)."),
               reasoning: Optional[str] = typer.Option(None, "--reasoning", help="strip | keep the reasoning a "
                                                       "reasoning parser returns (default strip, recorded)."),
               limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Only the first N conversations."),
               max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=1,
                                                        help="Override serving.regenerate_max_tokens."),
               temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 = greedy."),
               seed: int = typer.Option(0, "--seed", help="vLLM per-request seed."),
               concurrency: Optional[int] = typer.Option(None, "--concurrency", min=1,
                                                         help="Override serving.regenerate_concurrency."),
               endpoint: Optional[str] = typer.Option(None, "--endpoint", help="Serving URL as the driver reaches "
                                                      "it (default: http://HOSTNAME:PORT if it answers, else an "
                                                      "SSH port-forward)."),
               ssh_forward: bool = typer.Option(False, "--ssh-forward", help="Always go through an SSH "
                                                "port-forward to the host's 127.0.0.1:PORT."),
               out: Optional[Path] = typer.Option(None, "--out", help="Local folder: resume log, dataset, manifest "
                                                  "(default regenerated/<host>-<run>/)."),
               inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt, json_out: bool = JsonOpt) -> None:
    """Answer the training prompts with the target through LIVE serving (no window, no downtime; resumable).

    Writes dataset.jsonl (the target's answers) and dataset.manifest.json locally and uploads both to
    <data_dir>/runs/<run>/regenerated/; name `regenerated/dataset.jsonl` in prepare.datasets to train on it.
    """
    from eagle3ops.speculate import reach
    from eagle3ops.speculate import regenerate as rg
    from eagle3ops.speculate.prompts import GatePromptsError
    from eagle3ops.speculate.regensource import select_items
    from eagle3ops.stages.chatdata import ChatDataError

    h = common.load_host(inventory, host)
    try:
        items, extra = select_items(dataset, truncated=truncated, max_turns=max_turns, held_out=held_out,
                                       limit=limit)
        settings = rg.settings_for(h, max_tokens=max_tokens, temperature=temperature, seed=seed,
                                   concurrency=concurrency)
        p = rg.plan(items, settings, out or Path("regenerated") / f"{host}-{run}", reasoning=reasoning,
                    time_budget_s=time_budget)
    except (rg.RegenerateError, ChatDataError, GatePromptsError) as exc:
        common.fail(str(exc), 2)
    with common.remote(h, dry_run, json_out) as r:
        try:
            res = reach.regenerate_for_host(r, run, p, direct=endpoint, ssh_forward=ssh_forward,
                                            extra_manifest=extra, echo=lambda m: console.print(m, markup=False))
        except rg.RegenerateError as exc:
            common.fail(str(exc))
    common.print_plan(res.get("doc") or {}, h, json_out)
    if not dry_run and res["failed"]:
        common.fail(f"{res['failed']} conversation(s) failed after their attempts (first: {res['errors'][0]}); "
              "rerun the same command to retry them (answered ones are kept)")


@app.command()
def report(host: str, run: str = typer.Option(..., "--run", help="The pipeline run to report on."),
           inventory: Path = InventoryOpt,
           out: Optional[Path] = typer.Option(None, "--out", help="Output folder (default reports/<host>-<run>/).")
           ) -> None:
    """Write the run's HTML report: window timeline, training curves, acceptance and throughput plots."""
    from eagle3ops import report as rep

    h = common.load_host(inventory, host)
    with common.remote(h) as r:
        data = rep.collect(r, h, run, remote_for=lambda n: common.remote(common.load_host(inventory, n)))
    if not data["windows"] and not data["train_metrics"] and not data.get("speculate"):
        common.fail(f"{host}: nothing recorded for run {run!r} (no window, no training metrics, no speculation gate); "
              "check --run")
    folder = out or Path("reports") / f"{host}-{run}"
    rep.render(data, folder)
    console.print(f"report: {folder / 'index.html'}")


@app.command()
def audit(host: str, inventory: Path = InventoryOpt) -> None:
    """The host's audit log: who, when, what, outcome."""
    from eagle3ops.window.common import audit_entries

    h = common.load_host(inventory, host)
    with common.remote(h) as r:
        entries = audit_entries(r)
    t = Table(title=f"audit log of {host}")
    for col in ("t", "user", "command", "outcome", "error", "warnings"):
        t.add_column(col)
    for e in entries:  # errors and warnings whole: the table wraps them
        t.add_row(*(str(e.get(c, ""))[:80] for c in ("t", "user", "command", "outcome")),
                  str(e.get("error", "")), "\n".join(e.get("warnings") or []))
    Console().print(t)


def _register_push() -> None:
    from eagle3ops.transfer.cli import push_command

    app.command("push", help="Push an image to hosts over SSH, sending only missing layers.")(push_command)


_register_push()


def _register_probe() -> None:
    from eagle3ops import hostprobe
    from eagle3ops.patches.cli import deprecated_alias

    app.command("probe", help="Run the deployed image's deferred probes on HOST (GPUs there); record and print.")(
        hostprobe.probe_command)
    # the old name, kept for users' scripts: hidden, prints a deprecation line, then runs `probe`
    app.command("verify", hidden=True)(deprecated_alias(hostprobe.probe_command, "eagle3ops verify",
                                                        "eagle3ops probe"))


_register_probe()


app.command("watch")(watch_command)
app.command("render")(fleet_cli.render)
app.command("weights")(weights_cli.weights)
app.command("cycle")(cycle_cli.cycle)


def main() -> None:
    """Console-script entry point.

    A host that cannot be reached, or a remote command that failed where the command did not handle it, ends the
    program with ``error: <host>: <cause>`` on stderr and exit status 1 (no traceback). A host-changing command whose
    host could not be reached is recorded in the local audit log (:func:`eagle3ops.window.common.local_audit_path`):
    the host's own log cannot be written.
    """
    try:
        app()
    except Exception as exc:
        # eagle3ops.remote is imported only by commands that reach a host (the pipeline image has no Fabric)
        remote = sys.modules.get("eagle3ops.remote")
        if remote is not None and isinstance(exc, remote.RemoteError):
            print(f"error: {exc}", file=sys.stderr)
            if isinstance(exc, remote.HostUnreachable) and common.changes_a_host(sys.argv[1:]):
                from eagle3ops.window.common import append_local_audit

                warn = append_local_audit(str(exc).partition(": ")[0], _command_line(), "host not reached", str(exc))
                if warn:
                    print(f"warning: {warn}", file=sys.stderr)
            sys.exit(1)
        raise


if __name__ == "__main__":
    main()
