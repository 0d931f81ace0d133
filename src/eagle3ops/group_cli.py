"""``eagle3ops group ...``: release a serving group host by host behind its load balancer (:mod:`eagle3ops.group`),
registered on the main typer app by :mod:`eagle3ops.cli`.

``rollout GROUP --run RUN`` (a speculative release: canary gated, baked on live traffic, then rolled), ``release
GROUP --arg/--image/--env`` and ``rollback GROUP`` (the same rolling path, no gate, no bake), ``status GROUP``,
``promote``/``abort``/``pause GROUP``. Facts (each host's live release and group marker, reads only, through dry-run
executors) → the plan (pure; ``--dry-run`` prints it, ``--json`` as JSON) → under the group lock on the group's
first host, the steps, journaled; a rerun of the same command resumes a rollout left unfinished.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from eagle3ops import cli_common as common
from eagle3ops.cli_common import DryRunOpt, InventoryOpt, JsonOpt

app = typer.Typer(no_args_is_help=True, help="Serving groups behind a load balancer: canary, bake, rolling release.")
console = common.console


def say(text: str) -> None:
    """One line on the terminal as written: no rich markup, no emoji codes (a step key such as ``return:a:drain``
    holds one)."""
    console.print(text, markup=False, emoji=False)


TakeOverOpt = typer.Option(False, "--take-over", help="Take the group lock of a driver known dead on another machine.")
OutWaitOpt = typer.Option(600.0, "--out-wait", min=0, help="Seconds a drain waits for room under the group's "
                          "max_out before it fails.")
DrainTimeoutOpt = typer.Option(600.0, "--drain-timeout", min=1, help="Seconds a host may take to be drained (0 "
                               "balancer sessions and 0 vLLM requests for 5 s); past it, it is set ready again and "
                               "the step fails.")
#: Exit status by outcome (0 done or paused; 3 the release did not stay; 1 a return failed).
EXITS = {"done": 0, "paused": 0, "refused": 3, "returned": 3, "aborted": 3}


def _load(inventory: Path, name: str) -> tuple[Any, Any, list[Any]]:
    """The inventory, group ``name`` of its ``groups:`` and the group's host entries (exit 2 naming the file and
    the fix when wrong)."""
    from eagle3ops.config import ConfigError, load_inventory

    try:
        inv = load_inventory(inventory)
    except ConfigError as exc:
        common.fail(str(exc), 2)
    g = inv.groups.get(name)
    if g is None:
        common.fail(f"{inventory}: no group {name!r} (groups: {', '.join(sorted(inv.groups)) or 'none'}): add it "
                    f"under `groups:` (docs/serving-groups.md)", 2)
    return inv, g, [inv.host(h) for h in g.hosts]


def _journal(r: Any, first: Any, name: str) -> Any:
    from eagle3ops.group.journal import GroupJournal, group_dir

    return GroupJournal(r, group_dir(first.state_dir, name), first.secret_env)


def _unfinished(j: Any) -> tuple[Any, Any] | None:
    """The current rollout's plan and state when it has not ended (the journal switched to it), else None."""
    from eagle3ops.group.journal import replay

    cur = j.current()
    if cur is None:
        return None
    j.use(cur)
    plan = j.plan()
    if plan is None:
        return None
    st = replay(plan, j.entries())
    return None if st.ended else (plan, st)


def _last_done_target(j: Any) -> str | None:
    """The target of the group's newest rollout when it ended ``done`` (what a group rollback undoes)."""
    from eagle3ops.group.journal import replay

    cur = j.current()
    if cur is None:
        return None
    j.use(cur)
    plan = j.plan()
    return plan.target if plan and replay(plan, j.entries()).ended == "done" and plan.kind != "rollback" else None


def _facts(hosts: list[Any], name: str, target: str, rollback_from: str | None,
           json_out: bool = False) -> dict[str, str | None]:
    """Why each host does not serve the target already, None where it does (reads only): its marker, its current
    release and what serves (:func:`eagle3ops.group.steps.target_check`); for a group rollback, a host not on the
    release being rolled back counts as on the target. ``json_out``: the reads' echo goes to stderr (stdout keeps
    the plan's JSON)."""
    from eagle3ops.group.steps import read_marker, target_check
    from eagle3ops.window.common import current_release

    out: dict[str, str | None] = {}
    for h in hosts:
        with common.remote(h, dry_run=True, json_out=json_out) as r:
            marker = read_marker(r, name)
            if rollback_from:
                out[h.name] = ("its group marker names the release being rolled back"
                               if marker.get("target") == rollback_from else None)
            else:
                out[h.name] = target_check(r, marker, current_release(r), target)
    return out


def _print_plan(plan: Any, json_out: bool, resumed: str | None, secret_env: Any = ()) -> None:
    """The plan on the terminal, or as one JSON document on stdout (``json_out``); its secrets masked."""
    from eagle3ops import redact

    doc = redact.value({**plan.to_json(), "resumes": resumed}, secret_env)
    if json_out:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return
    say(f"group {plan.group}: {plan.kind} to {doc['label']} (release key {plan.target})"
        + (f", resuming rollout {resumed}" if resumed else ""))
    say(f"  skipped (on the target): {', '.join(plan.skipped) or 'none'}; canary: {plan.canary or 'none'}; "
        f"max_out {plan.max_out}")
    for h, why in plan.not_skipped.items():
        say(f"  {h} not skipped: {why}")
    for s in plan.steps:
        say(f"  {s.key}")


def _steps(name: str, hosts: list[Any], remotes: dict[str, Any], balancer: Any, plan: Any, command: str,
           **kw: Any) -> Any:
    """The real step callables of ``plan`` (:class:`eagle3ops.group.steps.HostSteps`); reads each host's deployed
    pipeline image (exit 1 naming ``deploy`` when one has none)."""
    from eagle3ops.window.common import pipeline_image
    from eagle3ops.group.steps import HostSteps

    images = {}
    for h in hosts:
        dep = common.deployed_record(remotes[h.name])
        images[h.name] = pipeline_image(h, dep)
    return HostSteps(group=name, kind=plan.kind, remotes=remotes, balancer=balancer, target=plan.target,
                     label=plan.label, command=command, images=images, echo=say, max_out=plan.max_out,
                     canary=plan.canary,
                     drain_timeout_s=float(plan.options.get("drain_timeout_s", 600.0)), out_wait_s=plan.out_wait_s,
                     **kw)


def _drive(name: str, inventory: Path, kind: str, target: str, label: str, timing: dict[str, float],
           dry_run: bool, json_out: bool, take_over: bool,
           step_kw: Callable[[list[Any]], dict[str, Any]]) -> None:
    """Facts → plan → (``dry_run``: print) → under the group lock, run or resume the rollout. ``timing``: the plan's
    ``bake_s``/``bake_interval_s``/``bake_sustained_s``/``out_wait_s`` and ``drain_timeout_s`` (seconds)."""
    from eagle3ops.group.rollout import plan_rollout, release_key

    inv, g, hosts = _load(inventory, name)
    with common.remote(hosts[0], dry_run=True, json_out=json_out) as r0:  # reads only
        j = _journal(r0, hosts[0], name)
        open_ = _unfinished(j)
        rollback_from = None
        if kind == "rollback" and open_ is None:
            rollback_from = _last_done_target(j)
            if rollback_from is None:
                common.fail(f"group {name}: no finished rollout to roll back (`eagle3ops group status {name}`)")
            target = release_key("rollback", {"from": rollback_from})
    if open_ is not None and kind == "rollback" == open_[0].kind:  # a group rollback left unfinished: continue it
        target = open_[0].target
    if open_ is not None and open_[0].target != target:
        common.fail(f"group {name}: rollout {j.rollout_id} ({open_[0].kind} to {open_[0].label}) is not finished: "
                    f"rerun its command to continue it, or `eagle3ops group abort {name}` to return its hosts")
    if open_ is not None:  # resumed as planned: the journal's plan, its timings included
        plan, rid = open_[0], j.rollout_id
    else:
        t, why = dict(timing), _facts(hosts, name, target, rollback_from, json_out)
        plan = plan_rollout(name, g.hosts, g.max_out, kind, target, label, {h: w is None for h, w in why.items()},
                            why={h: w for h, w in why.items() if w},
                            bake_s=t.pop("bake_s", 0.0), bake_interval_s=t.pop("bake_interval_s", 60.0),
                            bake_sustained_s=t.pop("bake_sustained_s", 0.0), out_wait_s=t.pop("out_wait_s", 600.0),
                            options=t)
        rid = None
    if dry_run:
        return _print_plan(plan, json_out, rid, hosts[0].secret_env)
    if json_out:
        common.fail("--json prints the plan of a dry run: add --dry-run, or drop --json", 2)
    _print_plan(plan, False, rid, hosts[0].secret_env)
    if not plan.steps:
        say(f"group {name}: every host is on the target already; nothing to do")
        return
    _run(inv, name, hosts, plan, rid, take_over, step_kw)


def _run(inv: Any, name: str, hosts: list[Any], plan: Any, rid: str | None, take_over: bool,
         step_kw: Callable[[list[Any]], dict[str, Any]], requests: tuple[str, ...] = ()) -> None:
    """Under the group lock: begin (or resume) the rollout, journal ``requests`` (control requests this command
    makes itself, e.g. ``abort`` with no driver running), and carry it out; exit by its outcome."""
    from eagle3ops.group.execute import ReturnFailed, StepBusy, run_rollout
    from eagle3ops.group.haproxy import open_balancer
    from eagle3ops.group.journal import GroupLocked, new_rollout_id

    with contextlib.ExitStack() as stack:
        remotes = {h.name: stack.enter_context(common.remote(h)) for h in hosts}
        j = _journal(remotes[hosts[0].name], hosts[0], name)
        balancer = stack.enter_context(open_balancer(inv, name))
        steps = _steps(name, hosts, remotes, balancer, plan, common.command_line(), **step_kw(hosts))
        stack.callback(steps.close)
        try:
            taken = j.acquire(common.command_line(), take_over=take_over)
        except GroupLocked as exc:
            common.fail(str(exc))
        if taken:
            say(taken)
        try:
            if rid is None:
                j.begin(new_rollout_id(plan.target), plan)
            else:
                j.use(rid)
            for what in requests:
                j.request(what)
            res = run_rollout(plan, j, steps.fns(), steps.balancer, echo=say)
        except (ReturnFailed, StepBusy) as exc:
            common.fail(str(exc))
        finally:
            j.release()
    say(f"group {name}: {res['outcome']}" + (f": {res['reason']}" if res.get("reason") else "")
        + (f"; next: {res['next']}" if res.get("next") else ""))
    print(json.dumps({"outcome": res["outcome"], "switched": res.get("switched"), "next": res.get("next")}))
    raise typer.Exit(EXITS.get(res["outcome"], 1))


@app.command("rollout")
def rollout(group: str, run: str = typer.Option(..., "--run", help="The pipeline run whose head ships (as "
                                                 "`speculate --run`)."),
            head: Optional[Path] = typer.Option(None, "--head", help="A local head directory trained elsewhere."),
            image: Optional[str] = typer.Option(None, "--image", help="Patched serving image (default: "
                                                "serving.speculative_image)."),
            control: bool = typer.Option(False, "--control", help="The gate measures a control release (as "
                                         "`speculate --control`)."),
            prompts_file: Optional[Path] = typer.Option(None, "--prompts-file", help="The gate's prompts (as "
                                                        "`speculate --prompts-file`); also the rolled hosts' "
                                                        "acceptance check."),
            accept_low_power: bool = typer.Option(False, "--accept-low-power", help="The gate measures even when "
                                                  "its planned power is below 80 % (as `speculate "
                                                  "--accept-low-power`)."),
            force: bool = typer.Option(False, "--force", help="Measure a head whose offline acceptance estimate is "
                                       "below the floor, or a head from elsewhere the canary could not estimate "
                                       "(as `speculate --force`); the gate and the served acceptance still judge it."),
            bake: float = typer.Option(600.0, "--bake", min=0, help="Seconds the kept canary serves live traffic "
                                       "before the roll (`group promote` ends it early)."),
            bake_interval: float = typer.Option(60.0, "--bake-interval", min=1, help="Seconds between two of the "
                                                "bake's /metrics readings."),
            bake_sustained: float = typer.Option(0.0, "--bake-sustained", min=0, help="Seconds a breach of watch's "
                                                 "rules must last before the bake aborts (0: the first breaching "
                                                 "reading with traffic)."),
            out_wait: float = OutWaitOpt, drain_timeout: float = DrainTimeoutOpt,
            inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt,
            json_out: bool = JsonOpt, take_over: bool = TakeOverOpt) -> None:
    """A speculative release across the group: the gate on one drained host (the canary) while the others serve;
    kept, a bake on live traffic judged by `watch`'s rules (a breach returns the canary); then host by host: drain,
    switch, health, served acceptance within 0.1 of the canary's, undrain. The first failure returns every switched
    host. Exit 0 done or paused, 3 not kept or returned, 1 error."""
    from eagle3ops.group.rollout import release_key
    from eagle3ops.speculate.prechecks import SpeculateOptions

    target = release_key("speculate", {"run": run, "head": str(head) if head else None, "image": image,
                                       "control": control, "prompts": str(prompts_file) if prompts_file else None})

    def kw(hosts: list[Any]) -> dict[str, Any]:
        from eagle3ops.window.common import pipeline_image
        opts = {}
        for h in hosts:
            with common.remote(h, dry_run=True) as r:
                dep = common.deployed_record(r)
            pimage, pimage_id = pipeline_image(h, dep)
            opts[h.name] = SpeculateOptions(run=run, pipeline_image=pimage, pipeline_image_id=pimage_id,
                                            head=head, serving_image=image,
                                            control=control, force=force, prompts_file=prompts_file,
                                            accept_low_power=accept_low_power, command=common.command_line())
        return {"speculate_options": opts, "prompts": _prompts(hosts[0], prompts_file)}

    timing = {"bake_s": bake, "bake_interval_s": bake_interval, "bake_sustained_s": bake_sustained,
              "out_wait_s": out_wait, "drain_timeout_s": drain_timeout}
    _drive(group, inventory, "speculate", target, f"run {run}" + (f" head {head}" if head else ""), timing, dry_run,
           json_out, take_over, kw)


def _prompts(h: Any, prompts_file: Optional[Path]) -> list[Any]:
    """The acceptance step's requests: the gate's (its chat set when given, else HumanEval's gate split)."""
    from eagle3ops.speculate import prompts as pr
    from eagle3ops.speculate.ship import gate_prompts

    rows = pr.from_jsonl(prompts_file) if prompts_file is not None else gate_prompts(h.serving.gate_prompts)
    return [p.request for p in rows]


@app.command("release")
def release(group: str,
            arg: list[str] = typer.Option([], "--arg", help="Server flag to set (repeatable; as `release --arg`)."),
            image: Optional[str] = typer.Option(None, "--image", help="New serving image."),
            env: list[str] = typer.Option([], "--env", help="NAME=VALUE in serving's environment (repeatable); "
                                          "values are not logged."),
            out_wait: float = OutWaitOpt, drain_timeout: float = DrainTimeoutOpt,
            inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt,
            json_out: bool = JsonOpt, take_over: bool = TakeOverOpt) -> None:
    """A new serving release across the group, host by host (drain, switch, health, served acceptance, undrain);
    the first failure returns every switched host. Exit 0 done or paused, 3 returned, 1 error."""
    from eagle3ops.config.plan import ReleaseChange
    from eagle3ops.group.rollout import release_key

    change = ReleaseChange(args=list(arg), image=image, env=common.env_pairs(env, "--env"))
    _drive(group, inventory, "release", release_key("release", change.model_dump()), change.describe(),
           {"out_wait_s": out_wait, "drain_timeout_s": drain_timeout}, dry_run, json_out, take_over,
           lambda hosts: {"change": change, "prompts": _prompts(hosts[0], None)})


@app.command("rollback")
def rollback(group: str, out_wait: float = OutWaitOpt, drain_timeout: float = DrainTimeoutOpt,
             inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt, json_out: bool = JsonOpt,
             take_over: bool = TakeOverOpt) -> None:
    """Return the group from its last finished rollout, host by host: each host to the release it had before it.
    Exit 0 done or paused, 3 returned, 1 error."""
    _drive(group, inventory, "rollback", "", "the releases before the last rollout",
           {"out_wait_s": out_wait, "drain_timeout_s": drain_timeout}, dry_run, json_out, take_over,
           lambda hosts: {"prompts": _prompts(hosts[0], None)})


@app.command("status")
def status(group: str, inventory: Path = InventoryOpt, json_out: bool = typer.Option(
        False, "--json", help="Print the status as one JSON document.")) -> None:
    """The group's newest rollout: each host's place in it, what comes next, pending requests, the lock's holder."""
    from eagle3ops.group.journal import replay
    from eagle3ops.group.status import view

    _, _, hosts = _load(inventory, group)
    # reads only; with --json the commands' echo goes to stderr, so stdout is the one JSON document
    with common.remote(hosts[0], dry_run=True, json_out=json_out) as r0:
        j = _journal(r0, hosts[0], group)
        cur = j.current()
        if cur is None:
            say(f"group {group}: no rollout yet")
            return
        j.use(cur)
        plan = j.plan()
        if plan is None:
            common.fail(f"group {group}: rollout {cur} has no plan.json under {j.dir}/rollouts/{cur}/ (removed by "
                        f"hand?); its journal alone cannot say what comes next")
        v = {"rollout": cur, **view(plan, replay(plan, j.entries())), "lock": j.read_holder() or None}
    if json_out:
        print(json.dumps(v, indent=2, sort_keys=True))
        return
    say(f"group {group}: rollout {cur}, {v['kind']} to {v['label']}: {v['state']}"
        + (f" ({v['reason']})" if v.get("reason") else ""))
    for h, words in v["hosts"].items():
        say(f"  {h}: {words}")
    say(f"  next: {v['next'] or 'nothing'}; requests: {', '.join(v['requests']) or 'none'}; lock: "
        f"{(v['lock'] or {}).get('command', 'free')}")


def _request(group: str, what: str, inventory: Path, dry_run: bool, json_out: bool = False,
             take_over: bool = False) -> bool | None:
    """Append a control request to the group's unfinished rollout (for a running driver: no lock needed, one
    appended line); returns whether its driver runs (:meth:`eagle3ops.group.journal.GroupJournal.holder_alive`). A
    dry run says what the request would do (:func:`eagle3ops.group.status.request_plan`), ``json_out``: as one JSON
    document with the commands it would run on the group's first host (an abort with no driver: the group lock
    first, the request, then, after the return steps the plan lists, the lock's release)."""
    from eagle3ops.group.status import request_plan

    if json_out and not dry_run:  # refused before any host is reached
        common.fail("--json prints the plan of a dry run: add --dry-run, or drop --json", 2)
    _, _, hosts = _load(inventory, group)
    with common.remote(hosts[0], dry_run, json_out) as r0:
        j = _journal(r0, hosts[0], group)
        open_ = _unfinished(j)
        if open_ is None:
            common.fail(f"group {group}: no unfinished rollout to {what} (`eagle3ops group status {group}`)")
        alive = j.holder_alive()
        here = dry_run and what == "abort" and (alive is False or take_over)  # :func:`abort` carries it out
        if here:  # as the real abort does: the request journaled under the group lock, the return, the release
            j.acquire(common.command_line(), take_over=True)
        j.request(what)
        if here:
            j.release()
    say(f"group {group}: {what} {'would be ' if dry_run else ''}requested for rollout {j.rollout_id}"
        + ("; its driver acts on it at its next step" if alive is not False else ""))
    if dry_run:
        doc = request_plan(*open_, what, alive, take_over=take_over)
        if doc["return_steps"]:
            say(f"  then this command, under the group lock, returns: {', '.join(doc['return_steps'])}")
        common.print_plan({"kind": f"group-{what}", "group": group, "rollout": j.rollout_id, "journal": j.journal,
                           "lock": j.lock_dir, **doc, "changes": list(r0.changes)}, hosts[0], json_out)
    return alive


@app.command("promote")
def promote(group: str, inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt, json_out: bool = JsonOpt
            ) -> None:
    """End the canary's bake now and roll the rest (the driver reads it at its next bake reading)."""
    if _request(group, "promote", inventory, dry_run, json_out) is False:
        say("no driver holds the group lock: rerun the rollout's command to continue")


@app.command("pause")
def pause(group: str, inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt, json_out: bool = JsonOpt) -> None:
    """Stop the rollout after the host it is on (a rerun of its command continues)."""
    _request(group, "pause", inventory, dry_run, json_out)


@app.command("abort")
def abort(group: str, inventory: Path = InventoryOpt, dry_run: bool = DryRunOpt, json_out: bool = JsonOpt,
          take_over: bool = TakeOverOpt) -> None:
    """Return every switched host to its previous release; with no driver running, this command returns them."""
    if dry_run or json_out:
        _request(group, "abort", inventory, dry_run, json_out, take_over)
        return
    inv, _, hosts = _load(inventory, group)
    with common.remote(hosts[0], dry_run=True) as r0:  # reads only: the rollout and whether its driver runs
        j = _journal(r0, hosts[0], group)
        open_ = _unfinished(j)
        if open_ is None:
            common.fail(f"group {group}: no unfinished rollout to abort (`eagle3ops group status {group}`)")
        alive, rid = j.holder_alive(), j.rollout_id
    if alive is not False and not take_over:  # a running driver returns the hosts itself
        _request(group, "abort", inventory, False)
        return
    # no driver: this command returns the hosts, and journals the request only once it holds the group lock
    say(f"group {group}: no driver holds the group lock; this command returns the switched hosts of rollout {rid}")
    _run(inv, group, hosts, open_[0], rid, take_over, lambda hosts: {}, requests=("abort",))
