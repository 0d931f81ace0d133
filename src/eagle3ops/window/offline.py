"""The offline dry run of an extract/train window (``--dry-run --offline``): no SSH at all. The facts preflight would
read from the host come from the inventory and are labelled as assumed; the plan itself is built by the same
functions as the online dry run (:func:`eagle3ops.window.planner.build_plan`, :func:`supervisor_commands`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eagle3ops import redact
from eagle3ops.commands import serving as sv
from eagle3ops.commands import runtime as rt
from eagle3ops.commands import stages as st
from eagle3ops.config import HostConfig
from eagle3ops.config.pipeline import ChatTemplateFile, PipelineConfig, parse_pipeline_config
from eagle3ops.commands.quote import render
from eagle3ops.config.inventory import KIND_KEYS
from eagle3ops.window.common import WindowError, new_window_id
from eagle3ops.window.served_template import FLAG, SERVED_FILE, chat_template_flag
from eagle3ops.window.planner import StageDecision, build_plan, supervisor_commands


def offline_chat_template(h: HostConfig, cfg: PipelineConfig) -> str:
    """Which chat template stage prepare will render the data with, and where that comes from, as an offline dry run
    can tell it (pure): ``prepare.chat_template`` when it names a file or ``tokenizer``; for ``auto`` (the default)
    serving's ``--chat-template`` as the inventory's ``serving.args`` give it (online, the extract window reads the
    live server's command line instead: :func:`eagle3ops.window.served_template.read_served_template`), the
    tokenizer's own when they have none (vLLM's default) or the host serves nothing."""
    tpl = cfg.prepare.chat_template
    if isinstance(tpl, ChatTemplateFile):
        return (f"{tpl.file} (pipeline prepare.chat_template.file"
                + (f", sha256 {tpl.sha256[:12]}..." if tpl.sha256 else "") + "; a relative path is taken from the "
                "run directory)")
    if tpl != "auto":
        return f"the tokenizer's own (pipeline prepare.chat_template: {tpl})"
    kind = h.serving.kind
    if not h.serving.managed:
        return "the tokenizer's own (prepare.chat_template: auto, and the host serves nothing to match)"
    if not KIND_KEYS[kind].in_container:
        return (f"not known offline: prepare.chat_template: auto takes the live {kind} server's {FLAG} (read on "
                "the host before serving stops), else the tokenizer's own; set prepare.chat_template to fix it")
    online = ("online, the live server's command line is read on the host before serving stops and decides "
              f"({SERVED_FILE} written into the run directory when it has {FLAG})")
    value = chat_template_flag(list(h.serving.args))
    if value is None:
        return (f"the tokenizer's own (prepare.chat_template: auto; assumed from the inventory: "
                f"hosts.{h.name}.serving.args have no {FLAG}; {online})")
    shown = (f"{FLAG} (inline, {len(value)} characters)" if any(c in value for c in "{}\n")
             else f"{FLAG} {value}")
    return (f"serving's {shown} (prepare.chat_template: auto; assumed from the inventory's "
            f"hosts.{h.name}.serving.args; {online})")


def assumed_facts(h: HostConfig, kind: str, cfg: PipelineConfig) -> list[tuple[str, str]]:
    """``(fact, assumed value)`` for each thing online preflight reads from the host, taken from the inventory and
    the pipeline config instead (pure)."""
    tp = cfg.extract.tensor_parallel_size
    nproc = cfg.train.nproc
    facts = [
        ("gpus", f"{h.gpus} (inventory `gpus`; not counted on the host)"),
        ("free space", f"unknown (not read); the window needs min_free_gib {h.min_free_gib:g} GiB plus the stages' "
                       f"output on {h.data_dir}"),
        rt.for_host(h).offline_fact(h),
        ("model path", f"{h.model_path} (inventory `model_path`; not checked)"),
        ("serving container", f"{sv.default_name(h.serving)} (inventory `serving`; assumed live and running)"),
        ("stages", "none done (the run directory was not read): every stage of the window runs"),
        ("extract tensor parallel", f"auto: every GPU the stage sees, {h.gpus} assumed" if tp == "auto"
         else f"{tp} (pipeline extract.tensor_parallel_size)"),
        ("train processes", f"auto: one per GPU, {h.gpus} assumed" if nproc == "auto"
         else f"{nproc} (pipeline train.nproc)"),
    ]
    if "prepare" in st.window_stages(kind, cfg):
        facts.append(("chat template", offline_chat_template(h, cfg)))
    if kind == "train" and cfg.chunks.count != "off":
        facts.append(("stage inputs", "prepare assumed done (not read); a chunked run (chunks.count "
                                      f"{cfg.chunks.count}): stage chunked extracts and trains chunk by chunk, its "
                                      "plan printed when it starts (`stage chunked --dry-run` on the host)"))
    elif kind == "train":
        facts.append(("stage inputs", "extract assumed done for these inputs (not read)"))
    return facts


def offline_dry_run(h: HostConfig, *, kind: str, run: str, pipeline_text: str, command: str, restart: bool = False,
                    echo: Callable[[str], None] | None = print) -> dict[str, Any]:
    """The plan of an extract/train window printed without contacting the host (pure but for ``echo``).

    Args:
        kind: ``extract`` or ``train`` (:data:`eagle3ops.commands.stages.WINDOWS`).
        pipeline_text: the run's pipeline config (YAML), already validated by the caller.
        restart: extract/train get ``--restart``.
        echo: where each printed line goes, its secrets masked (:func:`eagle3ops.redact.text`; None: print
            nothing).

    Returns:
        ``{"window_id", "outcome": "dry-run", "offline": True, "assumed": [[fact, value]], "stages",
        "trial_command", "supervisor_commands", "serving_command"}``: argv lists as the online dry run returns them.

    Raises:
        WindowError: ``kind`` is not a stage window (release/rollback read the live container: no offline plan).
        eagle3ops.config.pipeline.PipelineConfigError: ``pipeline_text`` does not hold (the callers validated it).
    """
    if echo is not None:
        show = echo
        echo = lambda line: show(redact.text(line, h.secret_env))  # noqa: E731 - the same printer, masked
    if kind not in st.WINDOWS:
        raise WindowError(f"--offline plans only the stage windows ({', '.join(st.WINDOWS)}), not {kind}")
    cfg = parse_pipeline_config(pipeline_text, "the pipeline config")  # the strict loader (duplicate keys refused)
    window_id = new_window_id(kind)
    runtime = rt.for_host(h)
    image = runtime.offline_image(h)
    stages = st.window_stages(kind, cfg)
    decision = StageDecision(run=[(s, "--restart: redone from scratch" if restart and s in ("extract", "train", "chunked")
                                   else "assumed not done (offline)") for s in stages])
    facts = assumed_facts(h, kind, cfg)
    plan = build_plan(h, kind="window", window_id=window_id, image=image, command=command, run=run,
                      stages=[s for s, _ in decision.run], serving_container=sv.default_name(h.serving),
                      restart=restart)
    trial = runtime.offline_trial(h, image=image, run=run, window_id=window_id, stage=stages[0])
    on_host = supervisor_commands(h, plan)
    # a serving container as the inventory describes it (process/systemd serving has none to show)
    serving = sv.run_argv(h, sv.container_spec(h, release=0)) if KIND_KEYS[h.serving.kind].in_container else None
    if echo:
        echo(f"# offline dry run of the {kind} window on {h.name}: no SSH; facts assumed from the inventory:")
        for name, value in facts:
            echo(f"#   assumed {name}: {value}")
        for name, why in decision.lines():
            echo(f"#   {name}: {why}")
        if trial is not None:
            echo("# preflight would start a throwaway container with the first stage's settings:")
            echo(render(trial))
        echo(runtime.supervisor_note)
        for argv in on_host:
            echo(render(argv))
        if serving is not None:
            echo("# the live serving container as the inventory describes it (what the stop/start above acts on):")
            echo("#   " + render(serving))
    return {"window_id": window_id, "outcome": "dry-run", "offline": True, "assumed": [list(f) for f in facts],
            "stages": [s.name for s in plan.stages], "trial_command": trial, "supervisor_commands": on_host,
            "serving_command": serving}
