"""The plan of a window (pure): configuration + what preflight found → :class:`eagle3ops.config.plan.Plan`, and
what the supervisor will do with it as printable argv (``--dry-run``)."""

from __future__ import annotations

import getpass

from eagle3ops.commands import docker as dk
from eagle3ops.commands import process as pr
from eagle3ops.commands import serving as sv
from eagle3ops.commands import stages as st
from eagle3ops.config import HostConfig
from eagle3ops.config.plan import NO_SERVING_NOTE, HealthCheck, Plan, ReleaseChange, StageStep


def health_check(h: HostConfig) -> HealthCheck | None:
    """The health gate settings for the host's serving (None for ``serving: none``: nothing to gate)."""
    if not h.serving.managed:
        return None
    return HealthCheck(port=h.serving.port, model=h.serving.served_model_name or "", timeout_s=h.serving.health_timeout_s,
                       api_key_file=h.serving.api_key_file)


def build_plan(h: HostConfig, *, kind: str, window_id: str, image: str, command: str, run: str = "default",
               stages: list[str] | None = None, change: ReleaseChange | None = None,
               to_release: int | None = None, user: str = "", serving_container: str | None = None,
               process_pid: int | None = None) -> Plan:
    """The :class:`~eagle3ops.config.plan.Plan` for a window (pure).

    ``serving_container``: the container name found on the host (default: :func:`sv.default_name`);
    a new release's container gets the same name, so the next window finds it again. ``change``: a ``release``
    plan's intended change of the live container (default: none, the live container recreated as it is).
    A host with ``serving: none`` gets a plan with ``serving_kind`` ``none``, no serving container and no health
    gate: the supervisor runs only the stages (:data:`eagle3ops.config.plan.NO_SERVING_NOTE`).

    Raises:
        ValueError: a ``release``/``rollback`` plan for a host with ``serving: none`` (callers refuse earlier, with
            :func:`eagle3ops.window.common.require_serving`).
    """
    if not h.serving.managed and kind != "window":
        raise ValueError(f"host {h.name} has no serving (serving: none): a {kind} plan needs production serving")
    if h.serving.kind == "process" and kind != "window":
        raise ValueError(f"host {h.name} serves with a process (kind process): {kind} is not supported for it yet")
    process = h.serving.kind == "process"
    name = "" if not h.serving.managed or process else (serving_container or sv.default_name(h.serving))
    if kind == "release" and change is None:
        change = ReleaseChange()
    steps = [StageStep(name=s, spec=st.stage_spec(h, image=image, stage=s, run=run, window_id=window_id),
                       timeout_s=h.stage_timeout_s) for s in (stages or [])]
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
        return [pr.record_process(plan.process_pid or 0, pdir),
                pr.start_agent(h, pdir=pdir, pid=plan.process_pid or 0, stop_timeout_s=plan.stop_timeout_s,
                               supervisor=st.supervisor_name(plan.window_id), limit_s=agent_limit_s(plan)),
                pr.stop_preview(plan.process_pid or 0, plan.stop_timeout_s),
                *[sv.run_argv(h, {**step.spec, "restart_policy": {}}) for step in plan.stages],
                pr.restore_preview(pdir, [], ""),
                ["GET", f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}/v1/models",
                 f"POST http://127.0.0.1:{port}/v1/completions"]]
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
