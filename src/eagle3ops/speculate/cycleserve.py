"""The head's served acceptance on a work host: the cycle's ``acceptance`` step, with production never touched.

Production's serving as recorded — its live release's record under ``<state_dir>/releases`` (the whole container
configuration, or the process's command line, environment and working directory), else read from the live
container (``docker inspect``) or the live process (``/proc``) — is started on the work host with the change the
speculate job would make for the trained head (:meth:`eagle3ops.window.kinds.DriverKind.speculative_change`, the one
builder of it, so the served acceptance measures the release production would get), the same image id (pushed to
the work host with the existing transfer when missing, then compared with production's), production's host paths
remapped to the work host's (``model_path``, ``data_dir``, ``state_dir``: the target where ``weights`` put it, the
head in the work host's run dir), on a port free there. Its health is waited for (bounded by production's
``serving.health_timeout_s``; a server that exits fails at once with its log's tail), the gate's prompts are replayed
(:func:`eagle3ops.speculate.cyclerun.measure_served`: acceptance from ``/metrics`` deltas), and the server is stopped
and removed whatever happened (a ``finally``): nothing the cycle started stays running on the work host.

Pure: :func:`plan_work_serving` (with :func:`remap`, :func:`choose_port`, :func:`secrets_to_env`). Carried out:
:func:`serve_and_measure`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from eagle3ops.commands import cycle as cyc
from eagle3ops.commands import docker as dk
from eagle3ops.commands import host as hc
from eagle3ops.commands import runtime as rt
from eagle3ops.commands.serving import ROLE_LABEL, ShellFormCommand, apply_change, container_record, set_args
from eagle3ops.speculate.cycle import CycleEnded, StepFailed

__all__ = ["ProductionServing", "WorkServing", "choose_port", "head_dir", "plan_work_serving", "production_serving",
           "remap", "secrets_to_env", "serve_and_measure", "server_name"]

#: The role label of the work host's measuring server (never ``serving``: nothing mistakes it for production).
ROLE = "cycle-acceptance"
#: Seconds a stopped server gets between SIGTERM (``docker rm --force``: SIGKILL) and SIGKILL.
STOP_TIMEOUT_S = 30
#: Server flags whose value is a secret, and the environment variable vLLM 0.16 reads instead (``VLLM_API_KEY``:
#: ``vllm.entrypoints.openai.api_server``'s ``args.api_key or envs.VLLM_API_KEY``; ``HF_TOKEN``: huggingface_hub).
SECRET_FLAGS = {"--api-key": "VLLM_API_KEY", "--hf-token": "HF_TOKEN"}


@dataclass(frozen=True)
class ProductionServing:
    """Production's serving as recorded: ``form`` (its serving kind's :attr:`~eagle3ops.window.kinds.DriverKind.
    record_form`) ``container`` (``record``: :func:`eagle3ops.commands.serving.container_record`) or ``process``
    (``record``: ``{"argv": [...], "environ": ["K=V", ...], "cwd"}``), and where it was read (``source``: ``release
    N`` or the live container/process)."""

    form: str
    record: dict[str, Any]
    source: str


@dataclass(frozen=True)
class WorkServing:
    """The work host's measuring server (pure value): ``form`` as production's record's; ``spec`` (container:
    ``docker run`` kwargs for :func:`eagle3ops.commands.serving.run_argv`, no environment: a private env file's);
    ``argv`` the server's command line (container: entrypoint + command); ``environ`` its ``K=V`` environment;
    ``cwd`` (process); ``remapped``: ``production path -> work host path`` per path changed."""

    form: str
    name: str
    port: int
    head_dir: str
    argv: tuple[str, ...]
    environ: tuple[str, ...]
    cwd: str = "/"
    image: str | None = None
    image_id: str | None = None
    spec: dict[str, Any] | None = None
    remapped: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def figures(self) -> dict[str, Any]:
        """What the journal keeps of it (the command line is masked by the journal's redaction)."""
        return {"port": self.port, "served_form": self.form, "image": self.image, "image_id": self.image_id,
                "head_dir": self.head_dir, "command": list(self.argv), "remapped": list(self.remapped),
                "notes": list(self.notes)}


def head_dir(work: Any, run: str) -> str:
    """The trained head on the work host: ``<data_dir>/runs/<run>/train/final`` (where ``train`` saves it)."""
    return f"{work.data_dir}/runs/{run}/train/final"


def server_name(run: str) -> str:
    """The work host's measuring container's name: ``eagle3ops-cycle-<run>`` (characters Docker refuses: ``-``)."""
    return "eagle3ops-cycle-" + re.sub(r"[^a-zA-Z0-9_.-]", "-", run)


def remap(path: str, pairs: Sequence[tuple[str, str]]) -> str:
    """``path`` with the first (longest) production root of ``pairs`` it is under replaced by the work host's; a
    path under none is returned as it is."""
    for src, dst in sorted(pairs, key=lambda p: -len(p[0])):
        src = src.rstrip("/")
        if path == src or path.startswith(src + "/"):
            return dst.rstrip("/") + path[len(src):]
    return path


def _remap_word(word: str, pairs: Sequence[tuple[str, str]]) -> str:
    """A command-line word: a path, or ``--flag=PATH``."""
    if word.startswith("--") and "=" in word:
        flag, val = word.split("=", 1)
        return f"{flag}={remap(val, pairs)}"
    return remap(word, pairs)


def choose_port(in_use: set[int], start: int, span: int = 200) -> int:
    """The first port from ``start`` (production's serving port: the work host serves nothing, so it is usually
    free) not in ``in_use`` (:func:`eagle3ops.commands.cycle.bound_ports`: listeners and the local ends of
    connections alike, since a listener cannot bind a port a client connection holds either).

    Raises:
        StepFailed: all ``span`` ports from ``start`` are in use.
    """
    for p in range(start, min(start + span, 65536)):
        if p not in in_use:
            return p
    raise StepFailed(f"no free port in {start}..{start + span - 1} on the work host")


def secrets_to_env(cmd: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """``cmd`` without the values of :data:`SECRET_FLAGS` (``--api-key K`` / ``--api-key=K``), and the environment
    that carries them instead: a ``docker run`` line goes over SSH as argv, which never carries a secret."""
    out: list[str] = []
    env: dict[str, str] = {}
    it = iter(range(len(cmd)))
    for i in it:
        w = cmd[i]
        flag = w.split("=", 1)[0]
        if flag in SECRET_FLAGS:
            if "=" in w:
                env[SECRET_FLAGS[flag]] = w.split("=", 1)[1]
            elif i + 1 < len(cmd):
                env[SECRET_FLAGS[flag]] = cmd[i + 1]
                next(it, None)
            continue
        out.append(w)
    return out, env


def plan_work_serving(prod: Any, work: Any, src: ProductionServing, *, run: str, k: int, port: int,
                      image: str | None = None, image_id: str | None = None,
                      image_defaults: dict[str, Any] | None = None) -> WorkServing:
    """The work host's measuring server from production's record (pure).

    The speculative change is production's serving kind's (:meth:`~eagle3ops.window.kinds.DriverKind.
    speculative_change`, the speculate job's own), made for the work host's GPUs (on a CPU host the stand-in's
    greedy settings) and the head at :func:`head_dir` (a container sees it read-only at
    :data:`eagle3ops.commands.speculate.HEAD_MOUNT`, a process at its path). Then: ``--port`` (host network or a
    process) or the published port remapped; every bind (and bind mount) source and every command-line path under
    production's ``model_path``/``data_dir``/``state_dir`` remapped (:func:`remap`); the container created from
    ``image_id`` (``image`` when None), restart policy none, named ``eagle3ops-cycle-<run>``, labelled
    :data:`ROLE`; secrets of the command line moved to the environment (:func:`secrets_to_env`). With
    ``image_defaults`` (the ``Config`` of production's live image) the image change is made as the speculate job's
    supervisor makes it (:func:`eagle3ops.commands.serving.apply_change`: what the old image put into the container
    gives way to ``image``'s own defaults).

    Raises:
        StepFailed: a serving kind other than container or process; a bridge network without a published port
            for production's ``serving.port``; an environment value with a newline (an env file cannot carry it).
    """
    from eagle3ops.window.kinds import driver_kind

    pairs = [(prod.model_path, work.model_path), (prod.data_dir, work.data_dir), (prod.state_dir, work.state_dir)]
    head = head_dir(work, run)
    on_work = prod.model_copy(update={"gpus": work.gpus})  # the change as it runs on the work host's GPUs
    change = driver_kind(on_work).speculative_change(on_work, head, k, image or "", None)
    name = server_name(run)
    if src.form == "process":
        return _process_serving(src, pairs, change, name=name, port=port, head=head)
    if src.form != "container":
        raise StepFailed(f"{prod.name}: a release record of form {src.form}: the served acceptance on a work host "
                         f"replays a container or a process; serve production as one, or ship with speculate only",
                         (prod.name,))
    mode, ports, port_args = _published_port(prod, src.record.get("HostConfig") or {}, port)
    try:
        rec = apply_change(src.record, args=port_args + list(change.args),
                           image=image if image_defaults is not None else None, image_defaults=image_defaults)
    except ShellFormCommand as exc:
        raise StepFailed(str(exc), (prod.name,)) from None
    cfg, hcfg = rec["Config"], rec["HostConfig"]
    binds, moved = _remapped_binds(hcfg, pairs, change.binds)
    mounts, moved_mounts = _remapped_mounts(hcfg, pairs)
    cmd, env, secret_env = _secrets_in_env(prod, cfg)
    spec = _container_spec(cfg, hcfg, image=image_id or image or cfg.get("Image"), name=name, cmd=cmd, binds=binds,
                           mounts=mounts, mode=mode, ports=ports)
    notes = ["the command line's secrets moved to the environment (" + ", ".join(secret_env) + ")"] \
        if secret_env else []
    return WorkServing(src.form, name, port, head, tuple([*(cfg.get("Entrypoint") or []), *cmd]), tuple(env),
                       image=image or cfg.get("Image"), image_id=image_id, spec=spec,
                       remapped=tuple(moved + moved_mounts), notes=tuple(notes))


def _process_serving(src: ProductionServing, pairs: list[tuple[str, str]], change: Any, *, name: str, port: int,
                     head: str) -> WorkServing:
    """The work host's process from production's recorded one: every argv word and the working directory remapped
    (:func:`remap`), the speculative change's arguments and ``--port port`` set (:func:`set_args`); what moved is
    listed in ``remapped``."""
    rec = src.record
    argv = [_remap_word(w, pairs) for w in rec["argv"]]
    cwd = remap(rec.get("cwd") or "/", pairs)
    moved = [f"{a} -> {b}" for a, b in zip(rec["argv"], argv) if a != b]
    if cwd != (rec.get("cwd") or "/"):
        moved.append(f"{rec.get('cwd')} -> {cwd} (working directory)")
    argv = set_args(argv, [*change.args, "--port", str(port)])
    return WorkServing(src.form, name, port, head, tuple(argv), tuple(rec.get("environ") or ()), cwd,
                       remapped=tuple(moved))


def _published_port(prod: Any, hcfg: dict[str, Any], port: int
                    ) -> tuple[str, dict[str, list[tuple[str, int]]], list[str]]:
    """How the work host's container is reached on ``port``: (network mode, docker SDK ``ports``, extra server
    arguments). The host network gets ``--port port``; a bridge network publishes ``port`` for the container port
    that production publishes as ``serving.port``.

    Raises:
        StepFailed: a bridge network with no published port for production's ``serving.port``.
    """
    mode = hcfg.get("NetworkMode") or "default"
    if mode == "host":
        return mode, {}, ["--port", str(port)]
    cport = next((c for c, bs in (hcfg.get("PortBindings") or {}).items()
                  if any(str((b or {}).get("HostPort")) == str(prod.serving.port) for b in bs or [])), None)
    if cport is None:
        raise StepFailed(f"{prod.name}: its serving container (network {mode}) publishes no port "
                         f"{prod.serving.port} (serving.port): the work host's copy cannot be reached; publish "
                         f"serving's port or use the host network", (prod.name,))
    return mode, {cport: [("", port)]}, []


def _remapped_binds(hcfg: dict[str, Any], pairs: list[tuple[str, str]],
                    head_binds: Sequence[str]) -> tuple[list[str], list[str]]:
    """The container's ``Binds`` with each source remapped (:func:`remap`) and the head's binds in place of any at
    the same container path: (binds, what moved)."""
    moved = []
    binds = []
    for b in hcfg.get("Binds") or []:
        parts = b.split(":")
        new = remap(parts[0], pairs)
        if new != parts[0]:
            moved.append(f"{parts[0]} -> {new} (bind of {parts[1] if len(parts) > 1 else parts[0]})")
        binds.append(":".join([new, *parts[1:]]))
    targets = {b.split(":")[1] for b in head_binds}  # the head's bind replaces one at the same path
    return [x for x in binds if len(x.split(":")) < 2 or x.split(":")[1] not in targets] + list(head_binds), moved


def _remapped_mounts(hcfg: dict[str, Any], pairs: list[tuple[str, str]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The container's ``Mounts`` with each bind mount's source remapped (:func:`remap`): (mounts, what moved)."""
    moved = []
    mounts = []
    for m in hcfg.get("Mounts") or []:
        m = dict(m)
        if m.get("Type", "bind") == "bind" and m.get("Source"):
            new = remap(m["Source"], pairs)
            if new != m["Source"]:
                moved.append(f"{m['Source']} -> {new} (mount at {m.get('Target')})")
            m["Source"] = new
        mounts.append(m)
    return mounts, moved


def _secrets_in_env(prod: Any, cfg: dict[str, Any]) -> tuple[list[str], list[str], dict[str, str]]:
    """The container's command without its secrets and its environment carrying them (:func:`secrets_to_env`):
    (command, ``KEY=value`` environment, the secrets moved).

    Raises:
        StepFailed: an environment value holds a newline (an env file cannot carry it).
    """
    cmd, secret_env = secrets_to_env(list(cfg.get("Cmd") or []))
    env = [e for e in cfg.get("Env") or [] if e.split("=", 1)[0] not in secret_env]
    env += [f"{key}={v}" for key, v in secret_env.items()]
    bad = [e.split("=", 1)[0] for e in env if "\n" in e]
    if bad:
        raise StepFailed(f"{prod.name}: the serving environment's {', '.join(bad)} holds a newline, which an env "
                         f"file cannot carry", (prod.name,))
    return cmd, env, secret_env


def _container_spec(cfg: dict[str, Any], hcfg: dict[str, Any], *, image: str | None, name: str, cmd: list[str],
                    binds: list[str], mounts: list[dict[str, Any]], mode: str,
                    ports: dict[str, list[tuple[str, int]]]) -> dict[str, Any]:
    """The docker SDK ``containers.create`` keywords for the work host's container: production's record's settings
    (entrypoint, GPUs, shm, IPC, ulimits, runtime, user, working directory) with the remapped binds and mounts,
    labelled :data:`ROLE`; docker's defaults (private IPC, runc) left unset."""
    runtime = hcfg.get("Runtime")
    return {"image": image, "name": name, "entrypoint": cfg.get("Entrypoint") or None,
            "command": cmd, "volumes": binds, "mounts": mounts,
            "network_mode": "bridge" if mode == "default" else mode, "labels": {ROLE_LABEL: ROLE},
            "device_requests": hcfg.get("DeviceRequests") or [], "shm_size": hcfg.get("ShmSize"),
            "ipc_mode": hcfg.get("IpcMode") if hcfg.get("IpcMode") not in ("", "private", "shareable") else None,
            "ulimits": hcfg.get("Ulimits") or [], "runtime": runtime if runtime not in (None, "", "runc") else None,
            "ports": ports, "user": cfg.get("User") or None, "working_dir": cfg.get("WorkingDir") or None}


def _recreated_since(pr: Any, n: int, rec: dict[str, Any]) -> ProductionServing | None:
    """The live serving container when it is not the one eagle3ops created for current release ``n`` (its record's
    ``container_id``, :meth:`eagle3ops.supervisor.releases.Releases.mark_container`): serving recreated outside
    eagle3ops since, whose settings (a CPU set, a flag) the record lacks; the next window's record step records it
    as a new release, so production is the live container. None when it is release ``n``'s container, when no
    container serves, and for a record without an id (written by an earlier version: the record stands)."""
    from eagle3ops.window.kinds import serving_container

    if not isinstance(rec.get("container"), dict) or not rec.get("container_id"):
        return None
    names, _ = serving_container(pr)
    out = pr.run(dk.inspect_container(pr.host, names[0]), check=False) if names else None
    live = json.loads(out.stdout)[0] if out is not None and out.ok and out.stdout.strip() else None
    if live is None or live.get("Id") == rec["container_id"]:
        return None
    return ProductionServing("container", container_record(live), f"live container {names[0]} (recreated outside "
                                                                  f"eagle3ops since release {n} was recorded)")


def production_serving(pr: Any) -> ProductionServing:
    """Production's serving as recorded (reads only): its current release's record, else the live container's
    ``docker inspect`` or the live process's ``/proc`` (what a window's record step would record).

    Raises:
        StepFailed: nothing serves (no record, no live server), or a serving kind the step cannot replay.
    """
    from eagle3ops.commands import process as pc
    from eagle3ops.window.common import current_release, paths
    from eagle3ops.window.kinds import driver_kind, serving_container

    h = pr.host
    n = current_release(pr)
    if n is not None:
        text = pr.run(hc.cat_if_exists(f"{paths(h)['releases']}/{n:04d}.json"), check=False).stdout or ""
        try:
            rec = json.loads(text)
        except ValueError:
            rec = {}
        for form in ("container", "process"):
            if isinstance(rec.get(form), dict):
                return _recreated_since(pr, n, rec) or ProductionServing(form, rec[form], f"release {n}")
    form = driver_kind(h).record_form
    if form == "container":
        names, what = serving_container(pr)
        out = pr.run(dk.inspect_container(h, names[0]), check=False) if names else None
        if out is None or not out.ok:
            raise StepFailed(f"{h.name}: no release recorded and no live {what} to replay on the work host: is "
                             f"production serving? (`eagle3ops status {h.name}`)", (h.name,))
        return ProductionServing(form, container_record(json.loads(out.stdout)[0]), f"live container {names[0]}")
    if form == "process":
        pids = [p for p in (pr.run(pc.find_process(h.serving.process_match or ""), check=False).stdout or "").split()
                if p.isdigit()]
        if not pids:
            raise StepFailed(f"{h.name}: no release recorded and no process matches serving.process_match "
                             f"{h.serving.process_match!r}: is production serving?", (h.name,))
        pid = int(pids[0])
        argv = [a for a in (pr.run(hc.cat(f"/proc/{pid}/cmdline")).stdout or "").split("\0") if a]
        environ = [e for e in (pr.run(hc.cat(f"/proc/{pid}/environ"), check=False).stdout or "").split("\0") if e]
        cwd = (pr.run(cyc.proc_cwd(pid), check=False).stdout or "/").strip() or "/"
        return ProductionServing(form, {"argv": argv, "environ": environ, "cwd": cwd}, f"live process {pid}")
    raise StepFailed(f"{h.name}: serving.kind {h.serving.kind}: the served acceptance on a work host replays a "
                     f"container or a process (its release record); serve production as one", (h.name,))


def _api_key(src: ProductionServing, pr: Any) -> str | None:
    """The key production's server requires, as the health gate takes it (never logged)."""
    from eagle3ops import health
    from eagle3ops.speculate import reach

    if src.form == "container":
        key = health.api_key_from_inspect(src.record)
    else:
        key = health.api_key_from_args(list(src.record["argv"])) or next(
            (e.split("=", 1)[1] for e in src.record.get("environ") or [] if e.startswith(health.API_KEY_ENV + "=")),
            None)
    return key or (reach.serving_api_key(pr) if pr.host.serving.api_key_file else None)


def same_image(pr: Any, wr: Any, image: str, push: Callable[[str, Any], str], echo: Callable[[str], None]
               ) -> tuple[str | None, str]:
    """The id of ``image`` on the work host, equal to production's: pushed from the build engine when missing
    (:func:`eagle3ops.deployer.push_image`: missing layers only, id verified). Returns ``(id, how)``.

    Raises:
        StepFailed: the work host's id differs from production's after the push (another build under the tag).
    """
    got = pr.run(dk.image_id(pr.host, image), check=False)
    prod_id = got.stdout.strip() if got.ok and got.stdout.strip() else None
    have = wr.run(dk.image_id(wr.host, image), check=False)
    how = "present"
    if not have.ok or (prod_id and have.stdout.strip() != prod_id):
        echo(f"pushing {image} to {wr.host.name}")
        how = push(image, wr.host)
        have = wr.run(dk.image_id(wr.host, image), check=False)
    work_id = have.stdout.strip() if have.ok else None
    if prod_id and work_id != prod_id:
        raise StepFailed(f"{image} is {work_id} on {wr.host.name} but {prod_id} on {pr.host.name} (production): the "
                         f"served acceptance must run production's image; build and push the same image to both",
                         (wr.host.name,))
    return work_id, how


def serve_and_measure(pr: Any, wr: Any, *, run: str, k: int, prompts: Sequence[Any], floor: float,
                      max_tokens: int, push: Callable[[str, Any], str] | None = None,
                      echo: Callable[[str], None] = print, command: str | None = None) -> dict[str, Any]:
    """The acceptance step: production's serving (:func:`production_serving`, read through ``pr``) started on the
    work host of ``wr`` with the head of ``run`` (:func:`plan_work_serving`; ``k`` speculative tokens), its health
    waited for (bounded by production's ``serving.health_timeout_s``), ``prompts`` replayed and judged against
    ``floor`` (:func:`eagle3ops.speculate.cyclerun.measure_served`), then the server stopped and removed (always).

    After the reads (the head's presence, production's record), the work host's own deploy lock
    (:func:`eagle3ops.window.lock.acquire_lock`; ``command``, the driver's command line, recorded in it) is held
    over every change the step makes there (the image push, the server's folder and files, the server) and
    released once the server is removed, whatever happened: the measuring server holds the work host's GPUs and a
    port, and a window started there meanwhile (``extract``/``train`` of another run) would start its stage on
    the same GPUs; the lock makes such a command refuse, naming the cycle, instead.

    Returns the measurement's figures with the server's (:meth:`WorkServing.figures`), ``source`` and ``stopped``.

    Raises:
        CycleEnded: below ``floor`` (its figures carry the server's too): production is never reached.
        StepFailed: no head on the work host, the work host's lock held by another run (its holder and command
            named; nothing changed there), an image that differs from production's, a server that did not become
            healthy (its log's tail), or a server that could not be stopped (named, with what still runs).
    """
    from eagle3ops.window.common import LockHeld, WindowError, new_window_id
    from eagle3ops.window.lock import acquire_lock, release_lock

    work = wr.host
    head = head_dir(work, run)
    if not wr.run(hc.exists(f"{head}/config.json"), check=False).ok:
        raise StepFailed(f"{work.name}: no trained head at {head} (config.json missing): the train step did not "
                         f"finish there; rerun the cycle", (work.name,))
    src = production_serving(pr)
    if src.form == "container" and not rt.for_host(work).engine:
        raise StepFailed(f"{work.name}: `stage_runtime: venv` (no container engine) but production serves a "
                         f"container: the head's acceptance runs production's image; give the work host a "
                         f"Docker engine", (work.name,))
    wid = new_window_id("cycle-acceptance")
    take = lambda: acquire_lock(wr, wid, command or f"eagle3ops cycle --run {run}",  # noqa: E731
                                f"cycle {run}: the head's served acceptance (a server on this host's GPUs)")
    try:
        try:
            take()
        except LockHeld:
            if not _left_by_killed_driver(wr, src, run, echo):
                raise
            take()
    except (LockHeld, WindowError) as exc:
        raise StepFailed(f"{exc} The cycle's acceptance step needs {work.name} to itself (its server takes the "
                         f"host's GPUs): rerun the cycle once that lock is free (finished steps are not repeated)",
                         (work.name,)) from None
    try:
        return _serve_and_measure(pr, wr, src, run=run, k=k, prompts=prompts, floor=floor, max_tokens=max_tokens,
                                  push=push, echo=echo)
    finally:
        release_lock(wr, wid)


def _left_by_killed_driver(wr: Any, src: ProductionServing, run: str, echo: Callable[[str], None]) -> bool:
    """When the work host's deploy lock is this cycle's own acceptance (its window id and message: ``cycle RUN:``)
    left by a killed driver, stop the server that driver started (its session, or its container: only what the
    cycle started, by the id it recorded) and release that lock; returns whether it did. The cycle's lock on
    production admits one driver at a time, so an acceptance lock of this run held meanwhile is a dead driver's.
    The server is not reused: the measurement is made afresh by a server whose command line this driver made.

    Raises:
        StepFailed: the left server could not be stopped (named, with what still runs).
    """
    from eagle3ops.window.lock import read_lock, release_lock

    held = read_lock(wr) or {}
    if not (str(held.get("window_id", "")).startswith("cycle-acceptance")
            and str(held.get("message", "")).startswith(f"cycle {run}:")):
        return False
    left = WorkServing(src.form, server_name(run), 0, "", (), ())
    stopped = _stop(wr, left, f"{wr.host.state_dir}/cycles/{run}/serve")
    release_lock(wr, held.get("window_id"))
    echo(f"{wr.host.name}: the served acceptance of cycle {run} left by a killed driver (lock since "
         f"{held.get('since', '?')}): its server {stopped or 'was gone'}; its lock released, measured afresh")
    return True


def _serve_and_measure(pr: Any, wr: Any, src: ProductionServing, *, run: str, k: int, prompts: Sequence[Any],
                       floor: float, max_tokens: int, push: Callable[[str, Any], str] | None,
                       echo: Callable[[str], None]) -> dict[str, Any]:
    """:func:`serve_and_measure` once the work host's lock is held: its changes there, its server stopped always."""
    from eagle3ops import health
    from eagle3ops.speculate.cyclerun import measure_served

    prod, work = pr.host, wr.host
    image = image_id = defaults = None
    how = None
    if src.form == "container":
        if push is None:
            from eagle3ops.deployer import push_image as push
        image = prod.serving.speculative_image or prod.serving.image
        image_id, how = same_image(pr, wr, image, push, echo)
        live = src.record.get("ImageId") or (src.record.get("Config") or {}).get("Image") or ""
        got = pr.run(dk.inspect_format(prod, live, "{{json .Config}}", kind="image"), check=False)
        try:  # production's live image's defaults (as the supervisor reads them); unreadable: the record's kept
            defaults = json.loads(got.stdout) if got.ok else None
        except ValueError:
            defaults = None
    port = choose_port(cyc.parse_ports(wr.run(cyc.bound_ports(), check=False).stdout or ""),
                       prod.serving.port)
    ws = plan_work_serving(prod, work, src, run=run, k=k, port=port, image=image, image_id=image_id,
                           image_defaults=defaults)
    d = f"{work.state_dir}/cycles/{run}/serve"
    model, url = prod.serving.served_model_name, f"http://{work.hostname}:{port}"
    key = _api_key(src, pr)
    figs = {**ws.figures(), "source": src.source, "url": url, **({"image_push": how} if how else {})}
    echo(f"serving the head on {work.name}:{port} as production's {src.source} (+ --speculative-config)")
    wr.run(hc.rm_rf(d))
    wr.run(hc.mkdir_p(d))
    ended: CycleEnded | None = None
    try:
        if ws.form == "process":
            wr.run(cyc.write_private(f"{d}/cmdline.nul"), stdin=_nul(ws.argv))
            wr.run(cyc.write_private(f"{d}/environ.nul"), stdin=_nul(ws.environ))
            wr.run(cyc.write_private(f"{d}/cwd"), stdin=ws.cwd)
            wr.run(cyc.start_process(d))
        else:
            assert ws.spec is not None
            wr.run(dk.rm(work, ws.name, force=True), check=False)  # a copy a killed driver left
            wr.run(cyc.write_private(f"{d}/env"), stdin="".join(e + "\n" for e in ws.environ))
            wr.run(cyc.serve_container(work, ws.spec, f"{d}/env"))
        try:
            health.wait_healthy(url, model, timeout_s=float(prod.serving.health_timeout_s), api_key=key,
                                interval_s=1.0, crashed=lambda: _crashed(wr, ws, d, key))
        except health.GateFailed as exc:
            raise StepFailed(f"{work.name}: the head served there did not become healthy: {exc}; its log: "
                             f"{_log(wr, ws, d, key)[-1500:]}", (work.name,)) from None
        try:
            verdict = measure_served(url, model, prompts, floor, where=work.name, max_tokens=max_tokens,
                                     api_key=key)
        except CycleEnded as end:
            ended = end
    finally:
        figs["stopped"] = _stop(wr, ws, d)
    if ended is not None:  # below the floor: journaled with the server's figures, stopped first
        ended.figures.update(figs)
        raise ended
    return {**verdict, **figs}


def _nul(words: Sequence[str]) -> bytes:
    return b"".join(w.encode("utf-8", "surrogateescape") + b"\0" for w in words)


def _crashed(wr: Any, ws: WorkServing, d: str, key: str | None) -> str | None:
    """Why the server is gone (its log's tail), or None while it runs."""
    if ws.form == "process":
        gone = not wr.run(cyc.session_alive(d), check=False).ok
    else:
        st = wr.run(dk.container_status(wr.host, ws.name), check=False)
        gone = not st.ok or st.stdout.strip() in ("exited", "dead")
    return f"the server on {wr.host.name} exited: {_log(wr, ws, d, key)[-1500:]}" if gone else None


def _log(wr: Any, ws: WorkServing, d: str, key: str | None) -> str:
    """The server's log's tail, the API key masked (vLLM prints its non-default arguments, the key among them)."""
    from eagle3ops import redact

    out = wr.run(cyc.log_tail(f"{d}/serving.log") if ws.form == "process" else dk.logs(wr.host, ws.name, tail=40),
                 check=False)
    text = redact.text(((out.stdout or "") + (out.stderr or "")).strip(), wr.host.secret_env)
    return text.replace(key, "***") if key else text


def _stop(wr: Any, ws: WorkServing, d: str) -> str:
    """Stop and remove the work host's server; returns what was done.

    Raises:
        StepFailed: something the cycle started still runs (named): the cycle does not go on past it.
    """
    if ws.form == "process":
        out = wr.run(cyc.stop_session(d, STOP_TIMEOUT_S), check=False, timeout=STOP_TIMEOUT_S + 30)
    else:
        out = wr.run(dk.rm(wr.host, ws.name, force=True), check=False, timeout=STOP_TIMEOUT_S + 30)
        gone = not wr.run(dk.container_status(wr.host, ws.name), check=False).ok
        if out.ok or gone:
            return f"container {ws.name} removed"
    if not out.ok:
        raise StepFailed(f"{wr.host.name}: the served acceptance's server could not be stopped: "
                         f"{(out.stdout or '').strip()} {(out.stderr or '').strip()[-400:]}; stop it by hand",
                         (wr.host.name,))
    return (out.stdout or "").strip()
