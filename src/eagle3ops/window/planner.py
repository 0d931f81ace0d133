"""The plan of a window (pure): configuration + what preflight found → :class:`eagle3ops.config.plan.Plan`, and
what the supervisor will do with it as printable argv (``--dry-run``)."""

from __future__ import annotations

import getpass
import json
from dataclasses import dataclass, field
from typing import Any

from eagle3ops.commands import docker as dk
from eagle3ops.commands import process as pr
from eagle3ops.commands import serving as sv
from eagle3ops.commands import stages as st
from eagle3ops.config import HostConfig
from eagle3ops.config.plan import NO_SERVING_NOTE, HealthCheck, Plan, ReleaseChange, StageStep


#: Stages whose command takes ``--restart`` (the others redo only what is not done for their inputs).
RESTARTABLE = ("extract", "train")


@dataclass
class StageDecision:
    """What a window will do with each of its stages, decided before serving stops (:func:`decide_stages`).

    ``run`` and ``skip``: ``[(stage, why)]`` in window order; ``refuse``: why the window cannot run at all (an
    input made outside this window is missing or stale), empty when it can.
    """

    run: list[tuple[str, str]] = field(default_factory=list)
    skip: list[tuple[str, str]] = field(default_factory=list)
    refuse: str = ""

    @property
    def nothing_to_do(self) -> bool:
        """Every stage of the window is done for these inputs: the window is a no-op (serving is not stopped)."""
        return not self.run and not self.refuse

    def lines(self) -> list[tuple[str, str]]:
        """``(check name, detail)`` per stage for preflight's list and the dry-run plan."""
        return ([(f"stage {s}", f"run: {why}") for s, why in self.run]
                + [(f"stage {s}", f"skip: {why}") for s, why in self.skip])


def decide_stages(stages: list[str], config: Any, manifests: dict[str, str | None],
                  sizes: dict[str, int], *, restart: bool = False, rerun_hint: str = "") -> StageDecision:
    """Which stages of a window run, which are skipped, and why (pure; from files read before the stop).

    Args:
        stages: the window's stages in order (:data:`eagle3ops.commands.stages.WINDOWS`).
        config: the run's :class:`~eagle3ops.config.pipeline.PipelineConfig` as the window will write it.
        manifests: ``{stage: text of runs/<run>/<stage>/manifest.json or None}`` for every stage of
            :data:`eagle3ops.stages.manifest.STAGES`.
        sizes: ``{"<stage>/<relative path>": bytes}`` of the files now in the run directory.
        restart: ``--restart``: extract and train (:data:`RESTARTABLE`) run with their own ``--restart``; prepare
            and vocab are redone only when not done (they resume nothing).
        rerun_hint: the command that makes a missing input (named in ``refuse``).

    A stage is skipped when :func:`eagle3ops.stages.manifest.done_status` says it is done for exactly these inputs
    and every file its manifest lists is there with its size (the stage's own ``finished`` test, so the stage would
    be a no-op too); once a stage runs, every later stage of the window runs (its input changes). An input made by an
    earlier window (train's ``extract``) that is not done refuses the window.
    """
    from eagle3ops.stages.manifest import STAGE_INPUTS, done_status

    d = StageDecision()
    ancestors: list[str] = []
    todo = [i for s in stages for i in STAGE_INPUTS[s]]
    while todo:
        a = todo.pop()
        if a not in stages and a not in ancestors:
            ancestors.append(a)
            todo.extend(STAGE_INPUTS[a])
    for a in ancestors:
        ok, why = done_status(a, config, manifests)
        if not ok:
            d.refuse = (f"input `{a}` of this window is not ready ({why})"
                        + (f": run {rerun_hint} first" if rerun_hint else ""))
            return d
    for s in stages:
        if restart and s in RESTARTABLE:
            d.run.append((s, "--restart: redone from scratch"))
            continue
        if d.run:
            d.run.append((s, f"runs after {d.run[0][0]} (its input changes)"))
            continue
        ok, why = done_status(s, config, manifests)
        if ok:
            listed = (json.loads(manifests[s] or "{}").get("files") or {})
            bad = [rel for rel, e in listed.items() if sizes.get(f"{s}/{rel}") != e.get("bytes")]
            if bad:
                ok, why = False, f"{s}: {len(bad)} listed file(s) missing or of another size (e.g. {s}/{bad[0]})"
        (d.skip if ok else d.run).append((s, why))
    return d


def health_check(h: HostConfig) -> HealthCheck | None:
    """The health gate settings for the host's serving (None for ``serving: none``: nothing to gate)."""
    if not h.serving.managed:
        return None
    return HealthCheck(port=h.serving.port, model=h.serving.served_model_name or "", timeout_s=h.serving.health_timeout_s,
                       api_key_file=h.serving.api_key_file)


def build_plan(h: HostConfig, *, kind: str, window_id: str, image: str, command: str, run: str = "default",
               stages: list[str] | None = None, change: ReleaseChange | None = None,
               to_release: int | None = None, user: str = "", serving_container: str | None = None,
               restart: bool = False, process_pid: int | None = None) -> Plan:
    """The :class:`~eagle3ops.config.plan.Plan` for a window (pure).

    ``serving_container``: the container name found on the host (default: :func:`sv.default_name`);
    a new release's container gets the same name, so the next window finds it again. ``change``: a ``release``
    plan's intended change of the live container (default: none, the live container recreated as it is).
    ``stages``: the stages that run (:func:`decide_stages` leaves out the done ones); ``restart``: extract and train
    get ``--restart`` (their earlier output is redone, not resumed).
    A host with ``serving: none`` gets a plan with ``serving_kind`` ``none``, no serving container and no health
    gate: the supervisor runs only the stages (:data:`eagle3ops.config.plan.NO_SERVING_NOTE`).

    Raises:
        ValueError: a ``release``/``rollback`` plan for a host with ``serving: none`` (callers refuse earlier, with
            :func:`eagle3ops.window.common.require_serving`); a release of a process changing ``image`` or
            ``binds`` (a process has neither).
    """
    if not h.serving.managed and kind != "window":
        raise ValueError(f"host {h.name} has no serving (serving: none): a {kind} plan needs production serving")
    if h.serving.kind == "process" and change is not None and (change.image or change.binds):
        raise ValueError(f"host {h.name} serves with a process (`hosts.{h.name}.serving.kind: process`): a release "
                         f"of it changes only server flags (--arg) and environment, not "
                         f"{'--image' if change.image else 'binds'}; drop it, or run serving as a container")
    process = h.serving.kind == "process"
    name = "" if not h.serving.managed or process else (serving_container or sv.default_name(h.serving))
    if kind == "release" and change is None:
        change = ReleaseChange()
    steps = []
    for s in stages or []:
        spec = st.stage_spec(h, image=image, stage=s, run=run, window_id=window_id)
        if restart and s in RESTARTABLE:
            spec["command"] = [*spec["command"], "--restart"]
        steps.append(StageStep(name=s, spec=spec, timeout_s=h.stage_timeout_s))
    return Plan(window_id=window_id, kind=kind, host=h.name, user=user or getpass.getuser(), command=command,
                state_dir=h.state_dir, serving_container=name, stop_timeout_s=h.serving.stop_timeout_s,
                stages=steps, budget_s=h.maintenance_budget_s, health=health_check(h), change=change,
                to_release=to_release, gpus=h.gpus, serving_kind=h.serving.kind,
                process_dir=pr.process_dir(f"{h.state_dir}/windows/{window_id}") if process else None,
                process_pid=process_pid if process else None)


def supervisor_commands(h: HostConfig, plan: Plan) -> list[list[str]]:
    """What the host-side supervisor will do, as equivalent ``docker`` argv lists (for ``--dry-run``).

    The supervisor uses the docker SDK, not the CLI; these are the CLI commands with the same effect.
    """
    cmds: list[list[str]] = []
    if plan.serving_kind == "none":  # a host that only trains: the stages, nothing else (see NO_SERVING_NOTE)
        return [sv.run_argv(h, {**step.spec, "restart_policy": {}}) for step in plan.stages]
    assert plan.health is not None  # every plan with serving has a gate
    if plan.serving_kind == "process":  # the host-side restore agent stops and restores; the supervisor gates
        pdir = plan.process_dir or "?"
        port = plan.health.port
        gate = ["GET", f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}/v1/models",
                f"POST http://127.0.0.1:{port}/v1/completions"]
        head = [pr.record_process(plan.process_pid or 0, pdir),
                pr.start_agent(h, pdir=pdir, pid=plan.process_pid or 0, stop_timeout_s=plan.stop_timeout_s,
                               supervisor=st.supervisor_name(plan.window_id), limit_s=agent_limit_s(plan)),
                pr.stop_preview(plan.process_pid or 0, plan.stop_timeout_s)]
        if plan.kind == "window":
            return [*head, *[sv.run_argv(h, {**step.spec, "restart_policy": {}}) for step in plan.stages],
                    pr.restore_preview(pdir, [], ""), gate]
        if plan.kind == "release":
            args = (plan.change or ReleaseChange()).args
            target = ["<recorded command line, with:", *args, ">"] if args else ["<recorded command line>"]
        else:
            target = [f"<command line of release {plan.to_release or 'live before the current one'}>"]
        return [*head, pr.restore_preview(pdir, target, "<its recorded cwd>"), gate,
                ["# if the gate fails: roll back to the recorded process"],
                pr.stop_preview(0, plan.stop_timeout_s), pr.restore_preview(pdir, [], ""), gate]
    if plan.kind == "window":
        cmds.append(dk.docker(h, "stop", "--time", str(plan.stop_timeout_s), plan.serving_container))
        for step in plan.stages:
            cmds.append(sv.run_argv(h, {**step.spec, "restart_policy": {}}))
        cmds.append(dk.docker(h, "start", plan.serving_container))
    else:
        if plan.kind == "release":
            change = plan.change or ReleaseChange()
            record = {"Name": plan.serving_container, "Config": {
                "Image": change.image or "<image of the live container>",
                "Cmd": ["<command of the live container, with:", *change.args, ">"] if change.args else
                       ["<command of the live container>"]}}
        else:
            which = plan.to_release or "live before the current one"
            record = {"Name": plan.serving_container, "Config": {"Image": f"<image of release {which}>",
                                                                  "Cmd": [f"<command of release {which}>"]}}
        cmds.append(dk.rm(h, plan.serving_container, force=True))
        cmds.append(sv.record_run_argv(h, record))
    port = plan.health.port
    cmds.append(["GET", f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}/v1/models",
                 f"POST http://127.0.0.1:{port}/v1/completions"])
    return cmds


def agent_limit_s(plan: Plan) -> float:
    """How long (seconds) a process-kind window's restore agent waits for the supervisor's restore request before it
    restores on its own: the window's budget plus the graceful stop and 600 s."""
    return plan.budget_s + plan.stop_timeout_s + 600.0
