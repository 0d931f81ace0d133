"""The stage runtime: where a host's stages and its window supervisor run, named once and chosen once.

Two runtimes exist. ``container`` (the default): the stages and the supervisor are containers of the pipeline image
on the host's engine (:mod:`eagle3ops.commands.stages`). ``venv`` (the inventory's ``stage_runtime: venv``, hosts
without a container engine): they are processes of the pipeline environment (:mod:`eagle3ops.commands.venv`). Both
are argv builders behind one protocol, :class:`StageRuntime`; :func:`for_host`, :func:`for_plan` and
:func:`for_spec` are the only places that decide which one a host, a plan or a stage step uses, so the rest of the
product calls the runtime's methods instead of asking which runtime it is.

Pure (argv lists and their readings, no I/O), as every module of :mod:`eagle3ops.commands`. What differs in I/O
rather than in command lines (preflight's engine checks, a supervisor's Docker client) is asked of
:attr:`StageRuntime.engine`: whether this runtime has a container engine at all.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Protocol

from eagle3ops.commands import docker as dk
from eagle3ops.commands import stages as st
from eagle3ops.commands import venv as vc
from eagle3ops.commands.types import Change, Read
from eagle3ops.config import HostConfig
from eagle3ops.config.inventory import VENV_RUNTIME

#: The runtimes' names, as ``plan.json``'s ``runtime`` and a venv stage spec's ``runtime`` carry them.
RuntimeName = Literal["container", "venv"]


def _window_dir(host: HostConfig, window_id: str) -> str:
    """``<state_dir>/windows/<window_id>`` (the window's directory, as :func:`eagle3ops.window.common.paths` names
    it)."""
    return f"{host.state_dir}/windows/{window_id}"


class StageRuntime(Protocol):
    """Where a host's stages and supervisor run: the command lines that differ between a container engine and a
    pipeline environment's processes. Every method is pure.

    Attributes:
        name: ``container`` or ``venv`` (``plan.json``'s ``runtime``).
        engine: True when stages and supervisor run on a container engine (the host has one by configuration).
        supervisor_note: how ``--dry-run`` introduces the supervisor's commands.
    """

    name: RuntimeName
    engine: bool
    supervisor_note: str

    def stage_spec(self, host: HostConfig, *, image: str, stage: str, run: str, window_id: str,
                   extra: list[str] | None = None) -> dict[str, Any]:
        """The spec of one stage step (JSON-serialisable), its arguments followed by ``extra``."""
        ...

    def stage_preview(self, host: HostConfig, spec: dict[str, Any]) -> list[str]:
        """What the supervisor runs for a stage spec, as one argv (``--dry-run``)."""
        ...

    def trial_argv(self, host: HostConfig, *, image: str, run: str, window_id: str, stage: str) -> Change:
        """Preflight's throwaway stage (container or process) with the stages' settings."""
        ...

    def trial_cleanup(self, host: HostConfig, window_id: str) -> Change | None:
        """What removes the throwaway of :meth:`trial_argv` afterwards (None: nothing is left)."""
        ...

    def chunk_plan_argv(self, host: HostConfig, *, image: str, run: str, window_id: str) -> Change:
        """Stage ``chunked``'s plan printed without running it (``--dry-run``)."""
        ...

    def chunk_plan_cleanup(self, host: HostConfig, window_id: str) -> Change | None:
        """What removes the throwaway of :meth:`chunk_plan_argv` afterwards (None: nothing is left)."""
        ...

    def supervisor_argv(self, host: HostConfig, *, image: str, window_id: str, plan_path: str,
                        detach: str = "setsid") -> Change:
        """Start the window's supervisor detached (``detach``: how a supervisor process is detached from the SSH
        session, :func:`eagle3ops.commands.logind.detach_mode`; a container needs none)."""
        ...

    def supervisor_rm(self, host: HostConfig, window_id: str) -> Change | None:
        """Remove a finished supervisor (None: nothing to remove, a process that exited)."""
        ...

    def supervisor_status(self, host: HostConfig, window_id: str) -> Read:
        """Read the supervisor's state (answered as ``docker inspect``'s ``.State.Status`` words)."""
        ...

    def status_from(self, ok: bool, stdout: str, stderr: str) -> str | None:
        """:meth:`supervisor_status`'s answer read: ``running``, ``restarting``, ``exited``..., ``missing``, or None
        when it cannot be told."""
        ...

    def supervisor_alive(self, host: HostConfig, window_id: str) -> Read:
        """Read whether the supervisor runs or is being restarted (:meth:`alive_from`)."""
        ...

    def alive_from(self, ok: bool, stdout: str) -> bool:
        """:meth:`supervisor_alive`'s answer read."""
        ...

    def supervisor_started(self, host: HostConfig, window_id: str) -> Read:
        """Read whether the supervisor was started at all (:meth:`started_from`)."""
        ...

    def started_from(self, ok: bool, stdout: str) -> bool:
        """:meth:`supervisor_started`'s answer read."""
        ...

    def state_words(self, host: HostConfig, window_id: str) -> list[str] | None:
        """The words a restore agent asks about the supervisor with in place of ``docker`` (None: ``docker``)."""
        ...

    def left_supervisors(self, host: HostConfig) -> Read | None:
        """Finished supervisors of earlier windows to remove (None: nothing is ever left)."""
        ...

    def machine(self, host: HostConfig) -> tuple[Read, str]:
        """The host's CPU architecture as the runtime sees it, and how to name that source in a message."""
        ...

    def python(self, host: HostConfig, image: str) -> list[str]:
        """The pipeline's interpreter on the host, with the stages' environment, as the first words of an argv."""
        ...

    def offline_image(self, host: HostConfig) -> str:
        """The image (or environment) an offline plan (``--dry-run --offline``) names, the host not asked."""
        ...

    def offline_fact(self, host: HostConfig) -> tuple[str, str]:
        """An offline plan's assumed fact about the image (or environment): ``(name, value)``."""
        ...

    def offline_trial(self, host: HostConfig, *, image: str, run: str, window_id: str, stage: str) -> Change | None:
        """The throwaway stage an offline plan shows preflight would start (None: none shown)."""
        ...


class ContainerRuntime:
    """Stages and supervisor as containers of the pipeline image on the host's engine
    (:mod:`eagle3ops.commands.stages`, :mod:`eagle3ops.commands.docker`)."""

    name: ClassVar[RuntimeName] = "container"
    engine: ClassVar[bool] = True
    supervisor_note: ClassVar[str] = "# then, on the host, the supervisor (docker SDK) does the equivalent of:"

    def stage_spec(self, host: HostConfig, *, image: str, stage: str, run: str, window_id: str,
                   extra: list[str] | None = None) -> dict[str, Any]:
        """:func:`eagle3ops.commands.stages.stage_spec`, ``extra`` appended to its ``command``."""
        spec = st.stage_spec(host, image=image, stage=stage, run=run, window_id=window_id)
        spec["command"] = [*spec["command"], *(extra or [])]
        return spec

    def stage_preview(self, host: HostConfig, spec: dict[str, Any]) -> list[str]:
        """The stage container's ``docker run`` (:func:`eagle3ops.commands.serving.run_argv`), no restart policy."""
        from eagle3ops.commands.serving import run_argv

        return run_argv(host, {**spec, "restart_policy": {}})

    def trial_argv(self, host: HostConfig, *, image: str, run: str, window_id: str, stage: str) -> Change:
        """:func:`eagle3ops.commands.stages.trial_argv` of :func:`~eagle3ops.commands.stages.trial_spec`."""
        return st.trial_argv(host, st.trial_spec(host, image=image, run=run, window_id=window_id, stage=stage))

    def trial_cleanup(self, host: HostConfig, window_id: str) -> Change | None:
        """``docker rm --force`` of the throwaway container (``--rm`` may not have run: a timeout)."""
        return dk.rm(host, st.trial_name(window_id), force=True)

    def chunk_plan_argv(self, host: HostConfig, *, image: str, run: str, window_id: str) -> Change:
        """:func:`eagle3ops.commands.stages.chunk_plan_argv`."""
        return st.chunk_plan_argv(host, image=image, run=run, window_id=window_id)

    def chunk_plan_cleanup(self, host: HostConfig, window_id: str) -> Change | None:
        """``docker rm --force`` of the chunk plan's throwaway container."""
        return dk.rm(host, st.chunk_plan_name(window_id), force=True)

    def supervisor_argv(self, host: HostConfig, *, image: str, window_id: str, plan_path: str,
                        detach: str = "setsid") -> Change:
        """:func:`eagle3ops.commands.stages.supervisor_argv` (``docker run --detach``: the engine's, not the SSH
        session's, so ``detach`` is not needed)."""
        return st.supervisor_argv(host, image=image, window_id=window_id, plan_path=plan_path)

    def supervisor_rm(self, host: HostConfig, window_id: str) -> Change | None:
        """``docker rm --force`` of the supervisor container."""
        return dk.rm(host, st.supervisor_name(window_id), force=True)

    def supervisor_status(self, host: HostConfig, window_id: str) -> Read:
        """``docker container inspect --format {{.State.Status}}`` of the supervisor container."""
        return dk.container_status(host, st.supervisor_name(window_id))

    def status_from(self, ok: bool, stdout: str, stderr: str) -> str | None:
        """The container's status; ``missing`` when the engine says there is no such container."""
        if ok:
            return stdout.strip() or None
        return "missing" if "no such" in (stderr + stdout).lower() else None

    def supervisor_alive(self, host: HostConfig, window_id: str) -> Read:
        """``{{.State.Running}} {{.State.Restarting}}`` of the supervisor container."""
        return dk.inspect_format(host, st.supervisor_name(window_id), "{{.State.Running}} {{.State.Restarting}}")

    def alive_from(self, ok: bool, stdout: str) -> bool:
        """Running or restarting (its restart policy)."""
        return ok and "true" in stdout.split()

    def supervisor_started(self, host: HostConfig, window_id: str) -> Read:
        """The supervisor container's id."""
        return dk.inspect_format(host, st.supervisor_name(window_id), "{{.Id}}")

    def started_from(self, ok: bool, stdout: str) -> bool:
        """A container that exists has an id."""
        return ok and bool(stdout.strip())

    def state_words(self, host: HostConfig, window_id: str) -> list[str] | None:
        """None: the restore agent asks ``docker`` itself."""
        return None

    def left_supervisors(self, host: HostConfig) -> Read | None:
        """:func:`eagle3ops.commands.stages.left_supervisors`."""
        return st.left_supervisors(host)

    def machine(self, host: HostConfig) -> tuple[Read, str]:
        """The engine's ``docker info`` ``Architecture`` (the images it runs are for it)."""
        return dk.info_format(host, "{{.Architecture}}"), "its engine's `docker info`"

    def python(self, host: HostConfig, image: str) -> list[str]:
        """``docker run --rm --network host --entrypoint python3 IMAGE``."""
        return ["docker", *(["-H", host.docker_host] if host.docker_host else []), "run", "--rm", "--network",
                "host", "--entrypoint", "python3", image]

    def offline_image(self, host: HostConfig) -> str:
        """The inventory's ``pipeline_image``, else :data:`eagle3ops.commands.stages.UNKNOWN_IMAGE`."""
        return host.pipeline_image or st.UNKNOWN_IMAGE

    def offline_fact(self, host: HostConfig) -> tuple[str, str]:
        """``pipeline image``: the inventory's, its id not verified, or the placeholder."""
        return ("pipeline image", f"{host.pipeline_image} (inventory `pipeline_image`; id not verified)"
                if host.pipeline_image else f"{st.UNKNOWN_IMAGE} (inventory has no `pipeline_image`; not read from "
                                            f"the host's deployed.json)")

    def offline_trial(self, host: HostConfig, *, image: str, run: str, window_id: str, stage: str) -> Change | None:
        """Preflight's throwaway stage container (:meth:`trial_argv`)."""
        return self.trial_argv(host, image=image, run=run, window_id=window_id, stage=stage)


class VenvRuntime:
    """Stages and supervisor as processes of the pipeline environment on a host without an engine
    (:mod:`eagle3ops.commands.venv`)."""

    name: ClassVar[RuntimeName] = "venv"
    engine: ClassVar[bool] = False
    supervisor_note: ClassVar[str] = ("# then, on the host, the supervisor (a detached process of the pipeline "
                                      "environment) runs:")

    def stage_spec(self, host: HostConfig, *, image: str, stage: str, run: str, window_id: str,
                   extra: list[str] | None = None) -> dict[str, Any]:
        """:func:`eagle3ops.commands.venv.stage_spec`, ``extra`` appended to its ``argv``."""
        spec = vc.stage_spec(host, image=image, stage=stage, run=run, window_id=window_id)
        spec["argv"] = [*spec["argv"], *(extra or [])]
        return spec

    def stage_preview(self, host: HostConfig, spec: dict[str, Any]) -> list[str]:
        """:func:`eagle3ops.commands.venv.stage_preview`."""
        return vc.stage_preview(spec)

    def trial_argv(self, host: HostConfig, *, image: str, run: str, window_id: str, stage: str) -> Change:
        """:func:`eagle3ops.commands.venv.trial_argv` (a process: nothing named, nothing left)."""
        return vc.trial_argv(host, image=image, run=run)

    def trial_cleanup(self, host: HostConfig, window_id: str) -> Change | None:
        """None: the trial process leaves nothing."""
        return None

    def chunk_plan_argv(self, host: HostConfig, *, image: str, run: str, window_id: str) -> Change:
        """:func:`eagle3ops.commands.venv.chunk_plan_argv`."""
        return vc.chunk_plan_argv(host, image=image, run=run, window_id=window_id)

    def chunk_plan_cleanup(self, host: HostConfig, window_id: str) -> Change | None:
        """None: the plan's process leaves nothing."""
        return None

    def supervisor_argv(self, host: HostConfig, *, image: str, window_id: str, plan_path: str,
                        detach: str = "setsid") -> Change:
        """:func:`eagle3ops.commands.venv.supervisor_argv` (``setsid nohup`` or a user service; the pid file is
        rewritten)."""
        return vc.supervisor_argv(host, image=image, window_dir=_window_dir(host, window_id), plan_path=plan_path,
                                  detach=detach)

    def supervisor_rm(self, host: HostConfig, window_id: str) -> Change | None:
        """None: a supervisor process that exited leaves only its pid file, kept as a record."""
        return None

    def supervisor_status(self, host: HostConfig, window_id: str) -> Read:
        """:func:`eagle3ops.commands.venv.supervisor_state` (:data:`~eagle3ops.commands.venv.STATE_SH`)."""
        return vc.supervisor_state(_window_dir(host, window_id))

    def status_from(self, ok: bool, stdout: str, stderr: str) -> str | None:
        """``running`` / ``exited``; ``missing`` before the pid file exists."""
        said = stdout.strip()
        return said if said in ("running", "exited") else ("missing" if "no such" in said.lower() else None)

    def supervisor_alive(self, host: HostConfig, window_id: str) -> Read:
        """:meth:`supervisor_status`."""
        return self.supervisor_status(host, window_id)

    def alive_from(self, ok: bool, stdout: str) -> bool:
        """``running``."""
        return stdout.strip() == "running"

    def supervisor_started(self, host: HostConfig, window_id: str) -> Read:
        """:meth:`supervisor_status` (the launcher writes the pid file as it starts the process)."""
        return self.supervisor_status(host, window_id)

    def started_from(self, ok: bool, stdout: str) -> bool:
        """The pid file exists."""
        return ok

    def state_words(self, host: HostConfig, window_id: str) -> list[str] | None:
        """:func:`eagle3ops.commands.venv.state_words` of the window directory."""
        return vc.state_words(_window_dir(host, window_id))

    def left_supervisors(self, host: HostConfig) -> Read | None:
        """None: supervisors are processes, nothing is left to remove."""
        return None

    def machine(self, host: HostConfig) -> tuple[Read, str]:
        """``uname -m`` (no engine)."""
        from eagle3ops.commands.host import machine

        return machine(), "`uname -m`"

    def python(self, host: HostConfig, image: str) -> list[str]:
        """``env <the stages' environment> <env_dir>/bin/python`` (offline switches, ``stage_env`` - e.g.
        ``GLOO_SOCKET_IFNAME``)."""
        spec = vc.stage_spec(host, image=image, stage="trial", run="trial", window_id="preflight")
        return ["env", *[f"{k}={v}" for k, v in sorted(spec["environment"].items())], vc.env_python(host, image)]

    def offline_image(self, host: HostConfig) -> str:
        """:data:`eagle3ops.commands.venv.UNKNOWN_ENV` (its digest is in the host's ``deployed.json``)."""
        return vc.UNKNOWN_ENV

    def offline_fact(self, host: HostConfig) -> tuple[str, str]:
        """``pipeline environment``: its digest unknown, under ``<state_dir>/env``."""
        return ("pipeline environment", f"{vc.UNKNOWN_ENV} under {vc.env_root(host)} (stage_runtime venv; not read)")

    def offline_trial(self, host: HostConfig, *, image: str, run: str, window_id: str, stage: str) -> Change | None:
        """None: the trial process needs the environment's digest, which only the host knows."""
        return None


CONTAINER = ContainerRuntime()
VENV = VenvRuntime()
_BY_NAME: dict[str, StageRuntime] = {CONTAINER.name: CONTAINER, VENV.name: VENV}


def named(name: str | None) -> StageRuntime:
    """The runtime called ``name`` (``container``, ``venv``; None or empty: ``container``).

    Raises:
        ValueError: an unknown name (names it and the known ones).
    """
    try:
        return _BY_NAME[name or CONTAINER.name]
    except KeyError:
        raise ValueError(f"unknown stage runtime {name!r}: expected one of {', '.join(_BY_NAME)}") from None


def for_host(host: Any) -> StageRuntime:
    """The runtime of an inventory host: ``venv`` with ``stage_runtime: venv``
    (:data:`eagle3ops.config.inventory.VENV_RUNTIME`), else ``container`` (any other ``stage_runtime`` is the
    engine's OCI runtime for stage containers, e.g. ``nvidia``)."""
    return VENV if getattr(host, "stage_runtime", None) == VENV_RUNTIME else CONTAINER


def for_plan(plan: Any) -> StageRuntime:
    """The runtime a window's plan (``plan.json``'s ``runtime``) was made for."""
    return named(plan.runtime)


def for_spec(spec: dict[str, Any]) -> StageRuntime:
    """The runtime of one stage step's spec: ``venv`` when the spec says ``runtime: venv``, else ``container`` (a
    container spec's ``runtime`` is the engine's OCI runtime, e.g. ``nvidia``)."""
    return VENV if spec.get("runtime") == VENV.name else CONTAINER
