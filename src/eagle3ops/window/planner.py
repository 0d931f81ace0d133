"""The plan of a window (pure): configuration + what preflight found → :class:`eagle3ops.config.plan.Plan`, and
what the supervisor will do with it as printable argv (``--dry-run``)."""

from __future__ import annotations

import getpass
import json
from dataclasses import dataclass, field
from typing import Any

from eagle3ops.commands import runtime as rt
from eagle3ops.commands import stages as st
from eagle3ops.config import HostConfig
from eagle3ops.config.plan import HealthCheck, Plan, ReleaseChange, SpeculateJob, StageStep
from eagle3ops.window.kinds import driver_kind


#: Stages whose command takes ``--restart`` (the others redo only what is not done for their inputs).
RESTARTABLE = ("extract", "train", "chunked")


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
            m = "train" if s == "chunked" else s  # chunked's output is train's
            listed = (json.loads(manifests[m] or "{}").get("files") or {})
            bad = [rel for rel, e in listed.items() if sizes.get(f"{m}/{rel}") != e.get("bytes")]
            if bad:
                ok, why = False, f"{m}: {len(bad)} listed file(s) missing or of another size (e.g. {m}/{bad[0]})"
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
               restart: bool = False, process_pid: int | None = None,
               speculate: SpeculateJob | None = None, shard: tuple[int, int] | None = None,
               nodes: tuple[int, int, str] | None = None, agent_detach: str = "setsid",
               serving_env: dict[str, str] | None = None) -> Plan:
    """The :class:`~eagle3ops.config.plan.Plan` for a window (pure).

    ``serving_container``: the container name found on the host (default: :func:`sv.default_name`);
    a new release's container gets the same name, so the next window finds it again. ``change``: a ``release``
    plan's intended change of the live container (default: none, the live container recreated as it is).
    ``stages``: the stages that run (:func:`decide_stages` leaves out the done ones); ``restart``: extract and train
    get ``--restart`` (their earlier output is redone, not resumed). ``shard``: the extract stage takes only samples
    ``[start, end)`` (``--shard``, a fleet run's window). ``nodes``: ``(count, rank, "HOST:PORT")``, the train stage
    of one node of a multi-node run (``--nodes/--node-rank/--rendezvous``). ``speculate``: a ``speculate`` plan's job (its
    ``change`` becomes the plan's). ``agent_detach``: how a process/systemd host's restore agent is detached
    (preflight's finding, :func:`eagle3ops.commands.logind.detach_mode`). ``serving_env``: the NCCL/CUDA
    environment of live serving (:func:`eagle3ops.window.kinds.inherited_env`), which every stage gets under the
    inventory's ``stage_env`` (that wins).
    A host with ``serving: none`` gets a plan with ``serving_kind`` ``none``, no serving container and no health
    gate: the supervisor runs only the stages (:data:`eagle3ops.config.plan.NO_SERVING_NOTE`).

    Raises:
        ValueError: a ``release``/``rollback`` plan for a host with ``serving: none`` (callers refuse earlier, with
            :func:`eagle3ops.window.kinds.require_serving`); a release of a process changing ``image`` or
            ``binds`` (a process has neither).
    """
    if not h.serving.managed and kind != "window":
        raise ValueError(f"host {h.name} has no serving (serving: none): a {kind} plan needs production serving")
    serving = driver_kind(h)
    refusal = serving.release_refusal(h, speculate.change if speculate is not None else change)
    if refusal:
        raise ValueError(refusal)
    if kind == "speculate":
        if speculate is None:
            raise ValueError("a speculate plan needs its job (speculate=SpeculateJob)")
        change = speculate.change
    if kind == "release" and change is None:
        change = ReleaseChange()
    steps, runtime = [], rt.for_host(h)
    for s in stages or []:
        extra = ["--restart"] if restart and s in RESTARTABLE else []
        if shard is not None and s == "extract":
            extra += st.shard_args(*shard)
        if nodes is not None and s == "train":
            extra += st.node_args(*nodes)
        spec = runtime.stage_spec(h, image=image, stage=s, run=run, window_id=window_id, extra=extra)
        if serving_env:  # serving's NCCL/CUDA settings, the inventory's stage_env winning
            spec["environment"] = {**{k: v for k, v in serving_env.items() if k not in h.stage_env},
                                   **spec["environment"]}
        steps.append(StageStep(name=s, spec=spec, timeout_s=h.stage_timeout_s))
    return Plan(window_id=window_id, kind=kind, host=h.name, user=user or getpass.getuser(), command=command,
                state_dir=h.state_dir, stop_timeout_s=h.serving.stop_timeout_s,
                stages=steps, budget_s=h.maintenance_budget_s, health=health_check(h), change=change,
                to_release=to_release, gpus=h.gpus, speculate=speculate, serving_kind=h.serving.kind,
                runtime=runtime.name, agent_detach=agent_detach,
                secret_env=list(h.secret_env),
                **serving.plan_fields(h, window_id, serving_container, process_pid))


def supervisor_commands(h: HostConfig, plan: Plan) -> list[list[str]]:
    """What the host-side supervisor will do, as equivalent ``docker`` argv lists (for ``--dry-run``): the serving
    kind's (:meth:`eagle3ops.window.kinds.DriverKind.supervisor_commands`).

    The supervisor uses the docker SDK, not the CLI; these are the CLI commands with the same effect.
    """
    return driver_kind(h).supervisor_commands(h, plan)
