"""``eagle3ops cycle PRODUCTION --work W [--work W2...] --run RUN``: one cycle across roles, production touched last
and least (:mod:`eagle3ops.speculate.cycle`, :mod:`eagle3ops.speculate.cyclerun`), registered on the main typer app
by :mod:`eagle3ops.cli`.

Facts (reads only: production's recorded restarts and acceptance floor, each work host's weights copy plan, the
work hosts' measured extract rates) → checks (work hosts have ``serving: none``; the pipeline trains on the
regenerated dataset) → the plan printed (``--dry-run`` stops there; ``--json`` prints it as JSON) → under the
cycle's lock on production, the steps, each journaled; every step an existing command does is that command, run as
a child process (:mod:`eagle3ops.commands.cycle`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from eagle3ops import cli_common as common
from eagle3ops import redact
from eagle3ops.cli_common import DryRunOpt, InventoryOpt
from eagle3ops.weights_cli import DEFAULT_LINK_MBIT


def _regenerate_todo(prod: Any, opts: Any) -> int:
    """How many conversations regenerate will send: its own item selection and plan (the local resume log's answered
    ones left out); exits 2 naming the dataset when it cannot be read."""
    from eagle3ops.speculate import regenerate as rg
    from eagle3ops.speculate.cycle import regen_out
    from eagle3ops.speculate.prompts import GatePromptsError
    from eagle3ops.speculate.regensource import select_items
    from eagle3ops.stages.chatdata import ChatDataError

    try:
        items, _ = select_items(opts.datasets, truncated=opts.truncated, held_out=opts.held_out, limit=opts.limit)
        return len(rg.plan(items, rg.settings_for(prod), regen_out(prod.name, opts.run)).todo)
    except (rg.RegenerateError, ChatDataError, GatePromptsError) as exc:
        common.fail(str(exc), 2)


def _facts(inv: Any, prod: Any, works: list[Any], dead: list[str], cfg: Any, opts: Any) -> Any:
    """The plan's facts, read with dry-run executors (nothing on any host is changed before the lock)."""
    from eagle3ops.commands import cycle as cyc
    from eagle3ops.fleet import driver, gather
    from eagle3ops.fleet.plan import FleetPlanError
    from eagle3ops.remote import RemoteError
    from eagle3ops.speculate.cycle import CycleFacts, WorkFacts, step_durations
    from eagle3ops.speculate.restarts import parse_results
    from eagle3ops.speculate.ship import needs_control, plan_restarts, window_results
    from eagle3ops.transfer.weights import WeightsError, plan_weights
    from eagle3ops.transfer.weightsplan import WeightsPlanError

    run, link_mbit = opts.run, opts.link_mbit
    todo = _regenerate_todo(prod, opts)
    # reads only, echoed to stderr: stdout carries the plan alone (--json's document is all of it)
    reader = lambda h: common.remote(h, dry_run=True, json_out=True)  # noqa: E731
    work_facts = []
    with reader(prod) as pr:
        windows = window_results(pr)
        control = needs_control(pr)
        restarts = plan_restarts(pr, control=control, results=windows)
        regenerated = parse_results(pr.run(cyc.regenerated_manifests(prod.data_dir), check=False).stdout or "")
        cycles = step_durations(pr.run(cyc.cycle_journals(prod.state_dir), check=False).stdout or "")
        per_token = _hidden_bytes_per_token(pr, cfg)
        for w in works:
            if w.name in dead:
                work_facts.append(WorkFacts(w.name))
                continue
            try:
                with reader(w) as wr:
                    plan, _ = plan_weights(pr, wr, link_mbit * 1e6 / 8)
                work_facts.append(WorkFacts(w.name, plan.send_bytes, sum(1 for s in plan.steps if s.send),
                                            plan.estimate_s))
            except RemoteError as exc:
                common.fail(f"work host {w.name} did not answer ({exc}): rerun with --dead {w.name} to leave it out "
                            f"(its shard moves to another work host), or once it is back")
            except (WeightsError, WeightsPlanError) as exc:
                common.fail(f"weights for work host {w.name}: {exc}")
    extract, note = None, None
    try:
        extract = driver.plan_hosts(inv, [w.name for w in works], run, cfg, reader=reader, dead=set(dead))
    except FleetPlanError as exc:
        note = f"no extract estimate: {exc}"
    with reader(next(w for w in works if w.name not in dead)) as tr:
        trained = gather.recorded_train(tr)
        sizes = (tr.run(cyc.head_sizes(tr.host.data_dir), check=False).stdout or "").split("\n")
        heads = [int(line.split()[0]) for line in sizes if line.split()[:1] and line.split()[0].isdigit()]
    gate = tuple(float(w["wall_s"]) for w in sorted(windows, key=lambda w: str(w.get("window_id", "")))
                 if w.get("kind") == "speculate" and isinstance(w.get("wall_s"), (int, float)))
    return CycleFacts(prod.name, tuple(work_facts), restarts, float(prod.serving.acceptance_floor), extract, note,
                      tuple(dead), float(prod.serving.health_timeout_s), todo, tuple(regenerated), cfg.train.steps,
                      trained, cycles, gate, max(heads) if heads else None, link_mbit, per_token, control,
                      prod.serving.gate_traffic, bool(prod.serving.drain_hook))


def _hidden_bytes_per_token(pr: Any, cfg: Any) -> int | None:
    """Disk bytes of one token's hidden states from the target's ``config.json`` on production (reads only; None:
    unreadable, the plan then says it has no figure)."""
    from eagle3ops.commands import host as hc
    from eagle3ops.window.preflight import hidden_state_bytes, target_dims

    out = pr.run(hc.cat_if_exists(f"{pr.host.model_path}/config.json"), check=False).stdout or ""
    try:
        return hidden_state_bytes(1, target_dims(json.loads(out))["hidden_size"], cfg.extract.hidden_dtype)
    except (ValueError, TypeError, AttributeError):
        return None


def _checks(prod: Any, works: list[Any], pipeline: Path) -> Any:
    """The pipeline config parsed, after the checks that need no host; exits 2 naming the key and the fix."""
    from eagle3ops.config.pipeline import PipelineConfigError, parse_pipeline_config
    from eagle3ops.speculate.cycle import REGENERATED

    if not prod.serving.managed:
        common.fail(f"{prod.name}: `hosts.{prod.name}.serving` is none: production is the host that serves the "
                    f"target (name it first; work hosts go after --work)", 2)
    for w in works:
        if w.serving.managed:
            common.fail(f"work host {w.name}: `hosts.{w.name}.serving` runs a server, so its extract and train "
                        f"windows would stop it; a work host has `serving: none` (set it, or name another host)", 2)
    try:
        cfg = parse_pipeline_config(common.read_pipeline(pipeline), pipeline)
    except PipelineConfigError as exc:
        common.fail(str(exc), 2)
    if REGENERATED not in cfg.prepare.datasets:
        common.fail(f"{pipeline}: `prepare.datasets` does not name {REGENERATED}: the cycle trains on production's "
                    f"own answers; add it to prepare.datasets", 2)
    return cfg


def _argv_runner(journal: Any, production: str, run: str) -> Callable[[Any], dict[str, Any]]:
    """The runner of the steps that are existing commands: each a child process that outlives a killed driver,
    adopted by the rerun (:class:`~eagle3ops.speculate.cyclechild.StepChild`; its log and exit status under
    ``./cycles/PRODUCTION-RUN/``), its output passed through."""
    from eagle3ops.speculate.cyclechild import StepChild

    return StepChild(journal, Path("cycles") / f"{production}-{run}", echo=_passthrough)


def _passthrough(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _gate_requests(prod: Any, prompts_file: Optional[Path]) -> list[Any]:
    """The speed gate's prompts, as speculate replays them: the chat set of ``--prompts-file`` (when given), then
    HumanEval's gate split (``serving.gate_prompts`` of them); exits 2 naming the file when it cannot be read."""
    from eagle3ops.speculate import prompts as pr
    from eagle3ops.speculate.ship import gate_prompts

    try:
        chat = pr.from_jsonl(prompts_file) if prompts_file is not None else []
        return [p.request for p in [*chat, *gate_prompts(prod.serving.gate_prompts)]]
    except pr.GatePromptsError as exc:
        common.fail(f"--prompts-file: {exc}", 2)


def _alive(inv: Any) -> Callable[[str], bool]:
    """Whether an inventory host answers over SSH (a short read)."""
    from eagle3ops.commands import host as hc
    from eagle3ops.remote import RemoteError

    def alive(name: str) -> bool:
        try:
            with common.remote(inv.host(name)) as r:
                return r.run(hc.quiet_shell_probe(), check=False, timeout=30).ok
        except (RemoteError, OSError):
            return False

    return alive


def cycle(production: str = typer.Argument(..., metavar="PRODUCTION", help="The host serving the target."),
          work: list[str] = typer.Option(..., "--work", help="A work host (`serving: none`) that copies the weights, "
                                         "extracts and trains (repeatable: the extract is sharded over them)."),
          run: str = typer.Option(..., "--run", help="Pipeline run name (data_dir/runs/NAME on every host)."),
          dataset: list[Path] = typer.Option([], "--dataset", help="Conversations whose user turns production "
                                             "answers (repeatable; default HumanEval's train split)."),
          held_out: Optional[float] = typer.Option(None, "--held-out", help="As regenerate's --held-out."),
          limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Only the first N conversations."),
          truncated: str = typer.Option("error", "--truncated", help="As regenerate's --truncated."),
          pipeline: Path = typer.Option(Path("deploy/pipeline.yaml"), help="Pipeline config (its prepare.datasets "
                                        "names regenerated/dataset.jsonl)."),
          link_mbit: float = typer.Option(DEFAULT_LINK_MBIT, "--link-mbit", help="Link rate the weights estimate "
                                          "assumes, Mbit/s."),
          prompts_file: Optional[Path] = typer.Option(None, "--prompts-file", help="The gate's chat set (speculate "
                                                      "--prompts-file; HumanEval's gate split beside it)."),
          merged: Optional[Path] = typer.Option(None, "--merged", help="Several work hosts: the merged manifest."),
          dead: list[str] = typer.Option([], "--dead", help="A work host that is gone (repeatable): left out, its "
                                         "shard moved to another."),
          take_over: bool = typer.Option(False, "--take-over", help="Take the cycle's lock from a driver on another "
                                         "machine known to be dead."),
          as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
          inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt) -> None:
    """One training cycle with production touched last and least: regenerate on production's live serving, weights
    to the work hosts, extract and train there (no window anywhere), the head's acceptance served on a work host
    (below the floor: the cycle ends, production never restarted), then the head to production and the speed gate
    (production's only restarts). Journaled under a lock on production: a rerun skips finished steps."""
    from eagle3ops.speculate.cycle import CycleOptions

    if link_mbit <= 0:
        common.fail(f"--link-mbit {link_mbit}: give the link's rate in Mbit/s (a positive number)", 2)
    opts = CycleOptions(run, inventory, pipeline, tuple(dataset), held_out, limit, link_mbit, prompts_file, merged,
                        truncated)
    inv, prod, cfg, plan, gate_requests, replan = _cycle_plan(production, work, list(dead), opts)
    print(json.dumps(plan.as_dict(), indent=2) if as_json else "\n".join(plan.lines()), flush=True)
    if dry_run:
        return
    res = _run_under_lock(inv, prod, run, plan, take_over,
                          lambda journal: _runners(inv, prod, run, cfg, plan, gate_requests, journal), replan)
    _print_outcome(prod, run, plan, res)


def _cycle_plan(production: str, work: list[str], dead: list[str], opts: Any
                ) -> tuple[Any, Any, Any, Any, list[Any], Callable[[tuple[str, ...]], Any]]:
    """Facts, checks and the plan, before any host write: the inventory's hosts, the pipeline config checked against
    them, the gate's chat set read (a bad file named now, not after hours of training) and the cycle planned.

    Returns (inventory, production host, pipeline config, plan, gate requests, the plan again with other work hosts
    dead: how a step moves off a dead host); work hosts the cycle's journal names dead are left out; bad input exits
    2 naming the flag or file (:class:`ConfigError`, :class:`CycleError` turned into ``common.fail``)."""
    from eagle3ops.config import ConfigError, load_inventory
    from eagle3ops.speculate.cycle import CycleError, plan_cycle

    try:
        inv = load_inventory(opts.inventory)
        prod, works = inv.host(production), [inv.host(w) for w in dict.fromkeys(work)]
    except ConfigError as exc:
        common.fail(str(exc), 2)
    cfg = _checks(prod, works, opts.pipeline)
    if not set(dead) < {w.name for w in works}:
        common.fail(f"--dead {', '.join(dead)}: name work hosts (given with --work), not all of them", 2)
    gate_requests = _gate_requests(prod, opts.prompts_file)
    dead = _with_journaled_dead(prod, opts.run, [w.name for w in works], dead)
    try:
        facts = _facts(inv, prod, works, dead, cfg, opts)
        plan = plan_cycle(facts, opts)
    except CycleError as exc:
        common.fail(str(exc), 2)
    return inv, prod, cfg, plan, gate_requests, lambda gone: plan_cycle(dataclasses.replace(facts, dead=gone), opts)


def _with_journaled_dead(prod: Any, run: str, works: list[str], dead: list[str]) -> list[str]:
    """``dead`` plus the work hosts an earlier run of this cycle found dead and moved its work off (its journal on
    production, read only), said so: a rerun does not send work back to a host its shards were moved from."""
    from eagle3ops.speculate.cyclerun import CycleJournal, cycle_dir, journaled_dead

    with common.remote(prod, dry_run=True, json_out=True) as pr:  # reads only, echoed to stderr as the facts
        found = [h for h in journaled_dead(CycleJournal(pr, cycle_dir(prod.state_dir, run)).entries())
                 if h in works and h not in dead]
    if found:
        print(f"[cycle] left out: {', '.join(found)} (an earlier run of this cycle found them dead and moved their "
              f"work off)", flush=True)
    return [*dead, *found]


def _runners(inv: Any, prod: Any, run: str, cfg: Any, plan: Any, gate_requests: list[Any],
             journal: Any) -> dict[str, Callable[[Any], dict[str, Any]]]:
    """What runs each step kind: the pipeline's commands as child processes; the dataset copy, the work host's
    acceptance and the report (with production's acceptance beside the work host's, from ``journal``) in-process.
    A command left running by a killed driver is adopted, not started twice (:func:`_argv_runner`)."""

    def dataset_step(step: Any) -> dict[str, Any]:
        from contextlib import ExitStack

        from eagle3ops.speculate.cyclerun import copy_dataset

        with ExitStack() as stack:
            pr = stack.enter_context(common.remote(prod))
            return copy_dataset(pr, [stack.enter_context(common.remote(inv.host(n))) for n in step.hosts], run)

    def acceptance_step(step: Any) -> dict[str, Any]:
        from eagle3ops.speculate.cycleserve import serve_and_measure

        with common.remote(prod) as pr, common.remote(inv.host(step.hosts[0])) as wr:
            return serve_and_measure(pr, wr, run=run, k=cfg.train.ttt_steps, prompts=gate_requests,
                                     floor=plan.acceptance_floor, max_tokens=prod.serving.gate_max_tokens,
                                     echo=lambda m: print(f"[cycle] {m}", flush=True),
                                     command=common.command_line())

    def report_step(step: Any) -> dict[str, Any]:
        """The run's report, then production's acceptance beside the work host's (from the journal's figures)."""
        from eagle3ops.speculate.cyclerun import acceptance_beside

        out = argv(step)
        beside = acceptance_beside(journal.finished())
        if beside["line"]:
            print(f"[cycle] {beside['line']}", flush=True)
        return {**out, "acceptance_work_host": beside["work_host"], "acceptance_production": beside["production"]}

    argv = _argv_runner(journal, prod.name, run)
    return {"regenerate": argv, "weights": argv, "extract": argv, "train": argv, "speculate": argv,
            "report": report_step, "dataset": dataset_step, "acceptance": acceptance_step}


def _run_under_lock(inv: Any, prod: Any, run: str, plan: Any, take_over: bool,
                    runners: Callable[[Any], dict[str, Callable[[Any], dict[str, Any]]]],
                    replan: Callable[[tuple[str, ...]], Any] | None = None) -> dict[str, Any]:
    """Execute: take the cycle's lock (its journal on production), run the plan's unfinished steps, release the lock
    (also when a step fails). ``runners`` builds the step runners from the journal. Returns :func:`run_cycle`'s
    result; a :class:`CycleError` (lock held elsewhere, a step failed) exits 1 with its message."""
    from eagle3ops.speculate.cycle import CycleError
    from eagle3ops.speculate.cyclerun import CycleJournal, cycle_dir, run_cycle

    with common.remote(prod) as pr:
        journal = CycleJournal(pr, cycle_dir(prod.state_dir, run), prod.secret_env)
        try:
            taken = journal.acquire(common.command_line(), take_over=take_over)
        except CycleError as exc:
            common.fail(str(exc))
        if taken:
            print(taken, flush=True)
        try:
            res = run_cycle(plan, journal, runners(journal), alive=_alive(inv), replan=replan,
                            echo=lambda m: print(f"[cycle] {m}", flush=True))
        except CycleError as exc:
            journal.release()
            common.fail(str(exc))
        journal.release()
    return res


def _print_outcome(prod: Any, run: str, plan: Any, res: dict[str, Any]) -> None:
    """The cycle's closing JSON line (secrets redacted): the steps, production's serving figures and both
    acceptance figures with the verdict; the acceptance line too unless the report step already printed it."""
    from eagle3ops.speculate.cyclerun import acceptance_beside

    beside = acceptance_beside(res["figures"])
    if beside["line"] and res["steps"].get("report") != "done":  # the report step said it already
        print(f"[cycle] {beside['line']}", flush=True)
    print(json.dumps(redact.value({"run": run, **res, "production_serving": plan.production_figures(),
                                   "work_host_acceptance": beside["work_host"],
                                   "production_acceptance": beside["production"], "verdict": beside["verdict"]},
                                  prod.secret_env)))
