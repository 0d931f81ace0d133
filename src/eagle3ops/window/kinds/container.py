"""Serving kinds ``container`` and ``compose`` on the driver side: the serving container, found by its name or by a
Compose service's labels, stopped and started by the supervisor through the engine; releases recreate it from its
record (:mod:`eagle3ops.commands.serving`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable

from eagle3ops.commands import docker as dk
from eagle3ops.commands import serving as sv
from eagle3ops.config import HostConfig
from eagle3ops.config.plan import Plan, ReleaseChange
from eagle3ops.window.common import WindowError
from eagle3ops.window.kinds.base import (DriverKind, ServingFindings, add_inherited_env, gate_preview,
                                         speculate_preview, stage_previews)

if TYPE_CHECKING:
    from eagle3ops.remote import Remote


class ContainerKind(DriverKind):
    """A serving container on the host's engine, found by its name (``serving.container``)."""

    name = "container"
    record_form: str | None = "container"

    def preflight(self, r: "Remote", pf: ServingFindings, need_serving: bool) -> None:
        """Find live serving (read-only) and add its check to ``pf``: the container (by name or Compose labels)."""
        check_serving_container(r, pf, need_serving, self)

    def plan_fields(self, h: HostConfig, window_id: str, serving_container: str | None,
                    process_pid: int | None) -> dict[str, Any]:
        """The :class:`~eagle3ops.config.plan.Plan` fields of this kind: the serving container's name (found at
        preflight, else :func:`eagle3ops.commands.serving.default_name`) and the host folder that keeps its compile
        cache across recreated releases (``<data_dir>/compile-cache``)."""
        return {"serving_container": serving_container or sv.default_name(h.serving),
                "compile_cache": sv.compile_cache_dir(h)}

    def supervisor_commands(self, h: HostConfig, plan: Plan) -> list[list[str]]:
        """What the supervisor (docker SDK) will do, as equivalent argv lists (``--dry-run``)."""
        cmds: list[list[str]] = []
        if plan.kind == "window":
            cmds.append(dk.docker(h, "stop", "--time", str(plan.stop_timeout_s), plan.serving_container))
            cmds += stage_previews(h, plan)
            cmds.append(dk.docker(h, "start", plan.serving_container))
        else:
            if plan.kind in ("release", "speculate"):
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
            cmds.append(sv.record_run_argv(h, record, plan.compile_cache))
        cmds.append(gate_preview(plan))
        if plan.kind == "speculate":
            back = {"Name": plan.serving_container, "Config": {"Image": "<image of the release live before>",
                                                                "Cmd": ["<command of the release live before>"]}}
            return speculate_preview(plan, cmds, [dk.rm(h, plan.serving_container, force=True),
                                                   sv.record_run_argv(h, back, plan.compile_cache), gate_preview(plan)])
        return cmds

    def speculative_change(self, h: HostConfig, head_dir: str, k: int, image: str,
                           draft_tp: int | None = None, vllm: str | None = None) -> ReleaseChange:
        """The speculative release: the live container plus ``--speculative-config`` (``draft_tp``: the draft's
        tensor parallelism; on a CPU host of vLLM 0.16 the stand-in's settings, chosen by ``vllm``, the serving
        ``image``'s labelled vLLM version: :func:`eagle3ops.commands.speculate.speculative_args`), the serving
        ``image`` and the head mounted read-only at :data:`eagle3ops.commands.speculate.HEAD_MOUNT`; everything
        else of the live container unchanged."""
        from eagle3ops.commands import speculate as sc

        return ReleaseChange(args=sc.speculative_args(num_speculative_tokens=k, cpu=h.gpus == 0, draft_tp=draft_tp,
                                                      vllm=vllm),
                             image=image, binds=[f"{head_dir}:{sc.HEAD_MOUNT}:ro"])

    def ngram_change(self, h: HostConfig, k: int, image: str, vllm: str | None = None) -> ReleaseChange:
        """vLLM's n-gram proposer as a speculative release: the live container plus its ``--speculative-config``
        on the serving ``image`` (``vllm``: its vLLM version, as for :meth:`speculative_change`); no head (one of
        the candidates ``speculate --method`` chooses from)."""
        from eagle3ops.commands import speculate as sc

        return ReleaseChange(args=sc.ngram_args(num_speculative_tokens=k, cpu=h.gpus == 0, vllm=vllm), image=image)

    def live_state(self, r: "Remote") -> tuple[str, bool | None]:
        """The live server as the host has it now (read-only): ``(words, running)``; ``running`` is None for a host
        without serving. Containers: the container's own ``State.Status`` (``missing`` when it does not exist)."""
        names, found = find_serving_container(r, self)
        if not names:
            return f"no container for {found}", False
        s = r.run(dk.container_status(r.host, names[0]), check=False)
        state = s.stdout.strip() if s.ok else "missing"
        return f"container {names[0]!r} is {state}", state == "running"

    def start_stopped(self, r: "Remote") -> tuple[str, list[Any]]:
        """``recover`` of serving stopped outside a window: ``(what is started, the commands)``.

        Raises:
            WindowError: serving cannot be started as it is (no container); the message names the fix.
        """
        names, found = find_serving_container(r, self)
        if not names:
            raise WindowError(f"{r.host.name}: no container for {found} to start: recreate the current release with "
                              f"`eagle3ops rollback {r.host.name} --to N` (N: `eagle3ops status {r.host.name}`'s "
                              f"serving release), or start serving by hand")
        return repr(names[0]), [dk.start(r.host, names[0])]

    def served_argv(self, r: "Remote") -> tuple[list[str], Callable[[str], str | None], str] | None:
        """The live server's command line, a reader of a file as the server sees it (its text, or None when it
        cannot be read), and where it runs in words; None when no serving is found. Read-only. Containers: the
        serving container's ``Entrypoint`` + ``Cmd``; files through ``docker exec NAME cat``."""
        names, _ = find_serving_container(r, self)
        if not names:
            return None
        out = r.run(dk.inspect_container(r.host, names[0]), check=False)
        try:
            cfg = (json.loads(out.stdout)[0].get("Config") or {}) if out.ok else None
        except (ValueError, IndexError, AttributeError):
            cfg = None
        if cfg is None:
            return None
        name = names[0]

        def read(path: str) -> str | None:
            res = r.run(dk.exec_cat(r.host, name, path), check=False)
            return res.stdout if res.ok else None

        return [*(cfg.get("Entrypoint") or []), *(cfg.get("Cmd") or [])], read, f"container {name!r}"


class ComposeKind(ContainerKind):
    """The container of a Compose service, found by its Compose labels."""

    name = "compose"

    def looked_for(self, h: HostConfig) -> str:
        return f"Compose service {h.serving.compose_project}/{h.serving.compose_service}"


def check_serving_container(r: "Remote", pf: ServingFindings, need_serving: bool, kind: DriverKind) -> None:
    """Kinds ``container`` and ``compose``: find the serving container as ``kind`` looks for it
    (:func:`find_serving_container`), refuse more than one, and when ``need_serving`` check that it runs; sets
    ``pf.serving_container``. Read-only."""
    h = r.host
    names, found = find_serving_container(r, kind)
    pf.serving_container = names[0] if names else sv.default_name(h.serving)
    if len(names) > 1:
        pf.add("serving container", False, f"{found} matches {len(names)} containers ({', '.join(names)}); "
                                           f"eagle3ops manages one serving container: scale the service to 1")
    elif need_serving:
        s = r.run(dk.inspect_format(h, pf.serving_container, "{{.State.Status}}"),
                  check=False) if names else None
        pf.add("serving container", bool(s and s.ok and s.stdout.strip() == "running"),
               f"{pf.serving_container}: {s.stdout.strip()}" if s and s.ok else f"no container for {found}")
    if names and len(names) == 1:
        e = r.run(dk.inspect_format(h, pf.serving_container, "{{json .Config.Env}}"), check=False)
        try:
            pairs = json.loads(e.stdout) if e.ok else []
        except ValueError:
            pairs = []
        add_inherited_env(pf, pairs if isinstance(pairs, list) else [], f"serving container {pf.serving_container}",
                          h.name)


def find_serving_container(r: "Remote", kind: DriverKind) -> tuple[list[str], str]:
    """Find the host's serving container (read-only), as ``kind`` looks for it (:meth:`DriverKind.looked_for`).

    Returns:
        (names found, what was looked for): kind ``container`` looks up its name, kind ``compose`` the
        container(s) carrying the service's Compose labels. An empty list: no such container (callers then use
        :func:`eagle3ops.commands.serving.default_name`).
    """
    what = kind.looked_for(r.host)
    out = r.run(sv.find_container_argv(r.host), check=False)
    names = [n for n in out.stdout.split() if n] if out.ok else []
    return names, what


def live_spec_for_image(r: Any, kind: DriverKind, image: str | None) -> dict[str, Any] | None:
    """The live serving container's ``docker inspect`` (found as ``kind``, the host's driver kind, looks for it) when
    a release to ``image`` changes its image; None when there is no ``image``, no live serving container, or it
    already runs ``image`` (same id). Read-only."""
    if not image:
        return None
    names, _ = find_serving_container(r, kind)
    if not names:
        return None
    out = r.run(dk.inspect_container(r.host, names[0]), check=False)
    try:
        spec = json.loads(out.stdout)[0] if out.ok else None
    except (ValueError, IndexError):
        spec = None
    if not spec or not spec.get("Image"):
        return None
    if r.run(dk.image_id(r.host, image), check=False).stdout.strip() == spec["Image"]:
        return None
    return spec
