"""The serving container as data.

Two kinds: the inventory's idea of serving (:func:`container_spec`, docker SDK ``containers.run`` kwargs, rendered
as ``docker run`` argv by :func:`run_argv`), used only where no live container exists (provisioning); and a release
(:func:`container_record`): the live container's whole configuration from ``docker inspect``, plus the intended
change (:func:`apply_change`), recreated through the Engine API (:func:`create_request`) by the host-side
supervisor. :func:`inventory_drift` says how the two differ (``config check HOST``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from eagle3ops import redact
from eagle3ops.commands.docker import docker
from eagle3ops.commands.types import Change, Read
from eagle3ops.config import HostConfig, ServingConfig
from eagle3ops.config.enginevalues import cpu_ids
from eagle3ops.health import shell_form

ROLE_LABEL = "io.eagle3ops.role"
RELEASE_LABEL = "io.eagle3ops.release"
#: Labels by which Docker Compose (v1 and v2) finds a service's containers.
COMPOSE_PROJECT_LABEL = "com.docker.compose.project"
COMPOSE_SERVICE_LABEL = "com.docker.compose.service"
COMPOSE_ONEOFF_LABEL = "com.docker.compose.oneoff"


def compose_labels(s: ServingConfig) -> dict[str, str]:
    """The Compose labels a serving container of kind ``compose`` carries ({} for kind ``container``).

    Compose (``docker compose ps``, ``docker-compose ps``) lists a service's containers by project + service
    labels with ``oneoff=False``; a release that eagle3ops recreates keeps them, so Compose still sees its service.
    """
    if s.compose_project is None:  # the inventory allows Compose names only with kind compose
        return {}
    return {COMPOSE_PROJECT_LABEL: s.compose_project or "", COMPOSE_SERVICE_LABEL: s.compose_service or "",
            COMPOSE_ONEOFF_LABEL: "False", "com.docker.compose.container-number": "1"}


def default_name(s: ServingConfig) -> str:
    """Serving container name when none exists yet: ``container``, or ``<project>-<service>-1`` for kind
    ``compose`` (the name Compose v2 gives a service's first container)."""
    return f"{s.compose_project}-{s.compose_service}-1" if s.compose_project is not None else s.container


def find_container_argv(host: HostConfig) -> Read:
    """``docker ps -a`` argv printing the name(s) of the serving container(s) (one name per line).

    Kind ``container``: filtered by name (exact match); kind ``compose``: by the Compose project/service labels.
    """
    s = host.serving
    if s.compose_project is not None:  # kind compose (the inventory allows Compose names with it only)
        filters = ["--filter", f"label={COMPOSE_PROJECT_LABEL}={s.compose_project}",
                   "--filter", f"label={COMPOSE_SERVICE_LABEL}={s.compose_service}",
                   "--filter", f"label={COMPOSE_ONEOFF_LABEL}=False"]
    else:
        filters = ["--filter", f"name=^/?{re.escape(s.container)}$"]  # Docker matches names as a regexp
    return Read(docker(host, "ps", "--all", *filters, "--format", "{{.Names}}"))


def _gpu_request(gpus: str | int) -> list[dict[str, Any]]:
    if gpus == "none" or gpus == 0:
        return []
    count = -1 if gpus == "all" else int(gpus)
    return [{"Driver": "", "Count": count, "Capabilities": [["gpu"]]}]


def container_spec(host: HostConfig, *, release: int) -> dict[str, Any]:
    """The inventory's serving container spec, for release number ``release`` (recorded in its labels); used only
    where no serving container exists yet (provisioning: ``demo``, the sandbox). Releases start from the live
    container instead (:func:`container_record`, :func:`apply_change`).

    Returns:
        JSON-serialisable kwargs for ``docker.client.containers.run`` (``device_requests`` as raw dicts).
    """
    s = host.serving
    gpus = "none" if host.gpus == 0 else s.gpus
    spec: dict[str, Any] = {
        "image": s.image,
        "name": default_name(s),
        "command": list(s.args),
        "environment": dict(sorted(s.env.items())),
        "volumes": list(s.volumes),
        "network_mode": "host",
        "restart_policy": {"Name": "unless-stopped"},
        "labels": {**compose_labels(s), ROLE_LABEL: "serving", RELEASE_LABEL: str(release)},
        "device_requests": _gpu_request(gpus),
    }
    if s.shm_size:
        spec["shm_size"] = s.shm_size
    if s.cpuset_cpus:
        spec["cpuset_cpus"] = s.cpuset_cpus
    return spec


def run_argv(host: HostConfig, spec: dict[str, Any], *, remove: bool = False, env_file: str | None = None
             ) -> Change:
    """``docker run -d`` argv equivalent to ``spec`` (see :func:`container_spec`; stage containers:
    :func:`eagle3ops.commands.stages.stage_spec`). ``remove``: ``docker run --rm`` instead (attached, removed on
    exit: preflight's throwaway stage container). ``env_file``: ``--env-file`` (a file on the host: its values never
    reach argv); ``spec``'s ``user`` and ``working_dir``: ``--user``, ``--workdir``."""
    argv = ["run", "--rm" if remove else "--detach", "--name", spec["name"],
            "--network", spec.get("network_mode", "host")]
    rp = spec.get("restart_policy") or {}
    if rp.get("Name"):
        argv += ["--restart", rp["Name"]]
    if env_file:
        argv += ["--env-file", env_file]
    if spec.get("user"):
        argv += ["--user", spec["user"]]
    if spec.get("working_dir"):
        argv += ["--workdir", spec["working_dir"]]
    for k, v in (spec.get("environment") or {}).items():
        argv += ["--env", f"{k}={v}"]
    for vol in spec.get("volumes") or []:
        argv += ["--volume", vol]
    for k, v in (spec.get("labels") or {}).items():
        argv += ["--label", f"{k}={v}"]
    for req in spec.get("device_requests") or []:
        if req.get("DeviceIDs"):
            argv += ["--gpus", "device=" + ",".join(req["DeviceIDs"])]
        else:
            argv += ["--gpus", "all" if req.get("Count", -1) == -1 else str(req["Count"])]
    if spec.get("runtime"):
        argv += ["--runtime", spec["runtime"]]
    for cport, binds in (spec.get("ports") or {}).items():
        for ip, hport in binds:
            argv += ["--publish", f"{ip + ':' if ip else ''}{hport or ''}:{cport}"]
    for m in spec.get("mounts") or []:
        argv += ["--mount", f"type={m.get('Type', 'bind')},source={m.get('Source', '')},target={m['Target']}"
                 + (",readonly" if m.get("ReadOnly") else "")]
    if spec.get("shm_size"):
        argv += ["--shm-size", str(spec["shm_size"])]
    if spec.get("cpuset_cpus"):
        argv += ["--cpuset-cpus", spec["cpuset_cpus"]]
    if spec.get("ipc_mode"):
        argv += ["--ipc", spec["ipc_mode"]]
    for u in spec.get("ulimits") or []:  # stage containers on GPU hosts: memlock for NCCL
        argv += ["--ulimit", f"{u['Name']}={u['Soft']}:{u['Hard']}"]
    if spec.get("entrypoint"):
        ep = spec["entrypoint"]
        ep = ep if isinstance(ep, list) else [ep]
        argv += ["--entrypoint", ep[0]]
        cmd_prefix = ep[1:]
    else:
        cmd_prefix = []
    return Change(docker(host, *argv, spec["image"], *cmd_prefix, *spec.get("command", [])))


# ---- releases: the live container plus the intended change --------------------------------------------------------

#: Settings of a container's endpoint on a network that are configuration (kept); the rest is runtime state.
ENDPOINT_KEYS = ("Aliases", "IPAMConfig", "Links", "DriverOpts")


def container_record(inspect: dict[str, Any]) -> dict[str, Any]:
    """A container's configuration, whole, from its ``docker inspect`` (Engine API ``ContainerInspect``): every
    ``Config`` and ``HostConfig`` field as the engine reports it, the configuration part of each network endpoint
    (:data:`ENDPOINT_KEYS`; the alias Docker derives from the container id is dropped, the new container gets its
    own), its name and image id. Recreating from it (:func:`create_request`) gives a container equal to this one on
    every ``Config``/``HostConfig`` field: User, WorkingDir, StopSignal, StopTimeout, Healthcheck, Ulimits, Devices,
    CapAdd, SecurityOpt, LogConfig, Init, Tmpfs, PidMode, IpcMode, ShmSize, GroupAdd, resource limits, restart
    policy, env, mounts...: nothing is picked field by field, so nothing is lost."""
    short_id = (inspect.get("Id") or "")[:12]
    nets = {}
    for net, ep in ((inspect.get("NetworkSettings") or {}).get("Networks") or {}).items():
        keep = {k: ep[k] for k in ENDPOINT_KEYS if ep.get(k)}
        if keep.get("Aliases"):
            keep["Aliases"] = [a for a in keep["Aliases"] if not short_id or a != short_id] or None
            if keep["Aliases"] is None:
                keep.pop("Aliases")
        nets[net] = keep
    return {"Name": (inspect.get("Name") or "").lstrip("/"), "ImageId": inspect.get("Image"),
            "Config": json.loads(json.dumps(inspect.get("Config") or {})),
            "HostConfig": json.loads(json.dumps(inspect.get("HostConfig") or {})), "Networks": nets}


#: ``Config`` fields an older release record is compared on (:func:`settings_differ`); the rest are left to the
#: engine or the image (the hostname, the image's own exposed ports and volumes).
_COMPARED_CONFIG = ("Image", "Cmd", "Entrypoint", "Env", "User", "WorkingDir", "Labels")


def _unset(v: Any) -> bool:
    return v is None or v == "" or v == 0 or v == [] or v == {} or v is False


def settings_differ(record: dict[str, Any], inspect: dict[str, Any]) -> list[str]:
    """The settings on which the live container (its ``docker inspect``) is not the one recreated from ``record``
    (:func:`container_record` of a release): the names of the differing fields, ``[]`` when it is.

    Only for release records that carry no container id (written by eagle3ops before it kept one): the
    container eagle3ops created from ``record`` differs from it only where the engine or the image fill in what
    the record leaves unset, and where the recreation adds to it. So: every ``HostConfig`` field must be equal
    (unset values alike: ``None``, ``""``, ``0``, ``[]``), but ``Binds``, of which the record's must all be live
    (the compile cache's binds are added, :func:`keep_compile_cache`); the ``Config`` fields of
    :data:`_COMPARED_CONFIG` that the record sets must be equal, but ``Env`` and ``Labels``, of which the record's
    entries must all be live (the image adds its own) and the release label is left out.
    """
    out = []
    rh, lh = record.get("HostConfig") or {}, inspect.get("HostConfig") or {}
    for k in sorted(set(rh) | set(lh)):
        a, b = rh.get(k), lh.get(k)
        if k == "Binds":
            if not set(a or []) <= set(b or []):
                out.append("HostConfig.Binds")
        elif a != b and not (_unset(a) and _unset(b)):
            out.append(f"HostConfig.{k}")
    rc, lc = record.get("Config") or {}, inspect.get("Config") or {}
    for k in _COMPARED_CONFIG:
        a, b = rc.get(k), lc.get(k)
        if _unset(a):
            continue  # left to the image
        if k == "Env":
            same = set(a) <= set(b or [])
        elif k == "Labels":
            same = all((b or {}).get(lk) == lv for lk, lv in a.items() if lk != RELEASE_LABEL)
        else:
            same = a == b
        if not same:
            out.append(f"Config.{k}")
    return out



def release_container_id(n: int, record: Mapping[str, Any], adopted: Mapping[str, Any] | None) -> str | None:
    """The id of the container eagle3ops last created for release ``n`` (pure): ``record["container_id"]`` (its
    release file), else the one an earlier version adopted as ``n`` (``adopted``: ``adopted.json``, ``{"release",
    "container_id"}``, written before releases kept their id); None for a release recorded without either."""
    adopted = adopted or {}
    return record.get("container_id") or (adopted.get("container_id") if adopted.get("release") == n else None)


def container_not_release(n: int, record: Mapping[str, Any], inspect: Mapping[str, Any],
                          want: str | None) -> str | None:
    """Why the container ``inspect`` (its ``docker inspect``) is not release ``n`` (``record``: its release file),
    None when it is (pure). The one rule of the record step
    (:class:`eagle3ops.supervisor.kinds.container.ContainerServing`) and the group's target check
    (:func:`eagle3ops.group.steps.live_not_release`).

    It is when it is the container eagle3ops created or recorded for ``n`` (``want``:
    :func:`release_container_id`): Docker keeps a container's id across stop, start and restart, a recreated
    container gets a new one whatever labels it copies. A release recorded without an id (``want`` None: an earlier
    eagle3ops) is when the container carries its release label and its settings are the recorded ones
    (:func:`settings_differ`); the label alone is never enough: a container recreated outside eagle3ops (by hand, a
    provisioning script) may copy it."""
    cid = inspect.get("Id") or ""
    if want:
        return None if want == cid else (f"its serving container is {cid[:12]}, not {want[:12]}, the one eagle3ops "
                                         f"created for release {n}")
    label = ((inspect.get("Config") or {}).get("Labels") or {}).get(RELEASE_LABEL)
    if label != str(n):
        return f"its serving container's {RELEASE_LABEL} label is {label!r}, not {str(n)!r}"
    container = record.get("container")
    differ = settings_differ(container, dict(inspect)) if isinstance(container, dict) else []
    if differ:
        return (f"its serving container carries release {n}'s label but not its settings ({', '.join(differ)}); "
                f"release {n} was recorded without a container id (by an earlier eagle3ops)")
    return None

def set_args(cmd: list[str], args: list[str]) -> list[str]:
    """``cmd`` with the server flags in ``args`` set: each ``--flag [VALUE...]`` (or ``--flag=VALUE``) of ``args``
    replaces every occurrence of that flag (with the values that follow it) in ``cmd``, then all of ``args`` is
    appended in its order. Tokens of ``args`` before its first flag are appended as they are.

    >>> set_args(["serve", "/m", "--max-num-seqs", "16", "--port", "8000"], ["--max-num-seqs", "8"])
    ['serve', '/m', '--port', '8000', '--max-num-seqs', '8']
    """
    flags = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    out: list[str] = []
    skipping = False
    for tok in cmd:
        if tok.startswith("-"):
            skipping = tok.split("=", 1)[0] in flags
            if skipping:
                continue
        elif skipping:  # a value of a replaced flag
            continue
        out.append(tok)
    return out + list(args)


class ShellFormCommand(ValueError):
    """Server flags cannot be set on a serving container whose server runs through a shell's ``-c`` string; the
    message names the container, the flags and the fix (:func:`shell_form_problem`)."""


def shell_form_problem(record: dict[str, Any], args: list[str]) -> str | None:
    """Why the flags ``args`` cannot be given to the container of ``record`` (:func:`container_record`, or a whole
    ``docker inspect``), or None when they can.

    A container started as ``bash -c "vllm serve ..."`` (or ``sh -c``, or an Entrypoint of a shell with ``-c``:
    :func:`eagle3ops.health.shell_form`) hands words appended to its command to the shell as ``$0``, ``$1``...:
    ``release --arg`` and speculate's ``--speculative-config`` would be recorded as a release and never reach vLLM.
    A script that forwards its parameters (``exec vllm serve ... "$@"`` with a ``$0`` word after it) takes them.
    Nothing is rewritten: whether a shell string is one plain command cannot be proved without running it.
    """
    sf = shell_form(record.get("Config") or {})
    if not args or sf is None or sf.forwards_args:
        return None
    name = (record.get("Name") or "").lstrip("/") or "the serving container"
    labels = (record.get("Config") or {}).get("Labels") or {}
    flags = " ".join(a for a in args if a.startswith("--")) or " ".join(args)
    script = sf.script if len(sf.script) <= 160 else sf.script[:157] + "..."
    if labels.get(COMPOSE_SERVICE_LABEL):
        where = (f"in the Compose file of project {labels.get(COMPOSE_PROJECT_LABEL)}, service "
                 f"{labels[COMPOSE_SERVICE_LABEL]}: write `command:` (and `entrypoint:`) as a YAML list in exec form, "
                 f"e.g. `command: [\"vllm\", \"serve\", \"/model\", \"--port\", \"8000\"]`, then `docker compose up -d`")
    else:
        where = ("recreate the container in exec form: `docker run ... IMAGE vllm serve /model --port 8000` (or "
                 "`--entrypoint vllm IMAGE serve ...`), not `--entrypoint bash IMAGE -c \"vllm serve ...\"`")
    return (f"serving container {name} runs its server through a shell ({' '.join(sf.shell)} {script!r}): the flags "
            f"{flags} would be appended after the shell string, where the shell takes them as $0, $1... and vLLM "
            f"never sees them, so the release would not change serving. Fix: {where}; or make the string forward "
            f"its arguments (`exec vllm serve ... \"$@\"` followed by a `$0` word such as `--`), then run this "
            f"again")


def apply_change(record: dict[str, Any], *, args: list[str] | None = None, env: dict[str, str] | None = None,
                 binds: list[str] | None = None, image: str | None = None,
                 image_defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """A new release: ``record`` (:func:`container_record` of the live container) with only the intended change.

    Args:
        args: server flags to set (:func:`set_args` on ``Config.Cmd``).
        env: environment variables to set (``Config.Env``; others kept, order kept).
        binds: ``HOST:CONTAINER[:OPTS]`` binds; each replaces the bind (or ``--mount``) of the same container path,
            or is added.
        image: a new image reference. ``image_defaults`` (the old image's ``Config``) lets values the old image
            put into the container (its Env entries, Labels, Entrypoint, Cmd, WorkingDir, User) give way to the new
            image's defaults; what was set on the container itself stays.

    Returns:
        A new record (``ImageId`` None when the image changes: the engine resolves ``image`` at creation).

    Raises:
        ShellFormCommand: ``args`` for a container whose server runs through a shell's ``-c`` string
            (:func:`shell_form_problem`): refused before anything is stopped.
    """
    problem = shell_form_problem(record, list(args or []))
    if problem:
        raise ShellFormCommand(problem)
    rec = json.loads(json.dumps(record))
    cfg, hcfg = rec["Config"], rec["HostConfig"]
    if image:
        old = image_defaults or {}
        old_env = set(old.get("Env") or [])
        cfg["Env"] = [e for e in cfg.get("Env") or [] if e not in old_env] or None
        old_labels = old.get("Labels") or {}
        cfg["Labels"] = {k: v for k, v in (cfg.get("Labels") or {}).items() if old_labels.get(k) != v}
        for key in ("Entrypoint", "WorkingDir", "User"):
            if key in old and cfg.get(key) == old.get(key):
                cfg[key] = None if key == "Entrypoint" else ""
        if cfg.get("Cmd") == old.get("Cmd") and not args:
            cfg["Cmd"] = None
        cfg["Image"] = image
        rec["ImageId"] = None
    if args:
        cfg["Cmd"] = set_args(list(cfg.get("Cmd") or []), args)
    if env:
        cur = [e for e in cfg.get("Env") or [] if e.split("=", 1)[0] not in env]
        cfg["Env"] = cur + [f"{k}={v}" for k, v in env.items()]
    for b in binds or []:
        target = b.split(":")[1] if ":" in b else b
        hcfg["Binds"] = [x for x in hcfg.get("Binds") or [] if (x.split(":")[1] if ":" in x else x) != target]
        hcfg["Binds"].append(b)
        if hcfg.get("Mounts"):
            hcfg["Mounts"] = [m for m in hcfg["Mounts"] if m.get("Target") != target] or None
    return rec


#: What a start of vLLM 0.16 compiles and keeps for the next start of the same configuration, as ``(folder name under
#: the host's cache folder, the variable that moves it)``: vLLM's own torch.compile artifacts under ``VLLM_CACHE_ROOT``
#: (``torch_compile_cache/<hash>``, ``torch_aot_compile/<hash>``; vllm/envs.py, vllm/compilation/backends.py and
#: decorators.py) and torch inductor's generated and compiled kernels and FX graph cache under
#: ``TORCHINDUCTOR_CACHE_DIR`` (torch/_inductor/runtime/cache_dir_utils.py; vLLM's CPU platform compiles with the
#: plain inductor backend, which keeps only this one). vLLM names each entry by a hash of the whole engine
#: configuration (speculative config included), the traced code and the compiler; inductor by the graph and its
#: inputs: one folder shared by every release cannot hand one configuration another's artifacts.
COMPILE_CACHES = (("vllm", "VLLM_CACHE_ROOT"), ("torchinductor", "TORCHINDUCTOR_CACHE_DIR"))


def compile_cache_dir(host: HostConfig) -> str:
    """The host folder that keeps serving's compile cache across recreated containers: ``<data_dir>/compile-cache``
    (one folder per host: vLLM and inductor key every entry by its configuration, :data:`COMPILE_CACHES`)."""
    return f"{host.data_dir.rstrip('/')}/compile-cache"


def _under(path: str, target: str) -> bool:
    return path == target or path.startswith(target.rstrip("/") + "/")


def compile_cache_paths(config: dict[str, Any]) -> dict[str, str | None]:
    """Where the server of a container with ``Config`` ``config`` keeps each cache of :data:`COMPILE_CACHES`,
    inside the container: the variable's value when the container sets it, else the default as vLLM and torch
    derive it for the container's user (``$XDG_CACHE_HOME/vllm`` or ``$HOME/.cache/vllm``; ``$TMPDIR`` or ``/tmp``,
    then ``torchinductor_<user>``, the user from ``LOGNAME``/``USER``/``LNAME``/``USERNAME`` as ``getpass.getuser``
    reads them). None where the default depends on a user other than root whose home or name the configuration
    does not give."""
    env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
    user = str(config.get("User") or "").split(":", 1)[0]
    root = user in ("", "root", "0")
    home = env.get("HOME") or ("/root" if root else None)
    cache_home = env.get("XDG_CACHE_HOME") or (f"{home}/.cache" if home else None)
    name = next((env[k] for k in ("LOGNAME", "USER", "LNAME", "USERNAME") if env.get(k)),
                "root" if root else (user if user and not user.isdigit() else None))
    defaults = {"vllm": f"{cache_home}/vllm" if cache_home else None,
                "torchinductor": f"{env.get('TMPDIR') or '/tmp'}/torchinductor_{name}" if name else None}
    paths = {key: env.get(var) or defaults[key] for key, var in COMPILE_CACHES}
    # vLLM expands a leading ~ of VLLM_CACHE_ROOT (os.path.expanduser)
    return {k: (f"{home}{p[1:]}" if home else None) if p and p.startswith("~/") else p for k, p in paths.items()}


def keep_compile_cache(record: dict[str, Any], host_dir: str) -> tuple[dict[str, Any], list[str]]:
    """``record`` (:func:`container_record`) with each compile cache (:func:`compile_cache_paths`) that lives in the
    container's writable layer bound to ``<host_dir>/<name>`` on the host, so that the next container recreated
    from it (a release, a rollback, a gate's switch) starts from what the last one compiled.

    A cache already on a bind or mount of the container (production keeping its own) is left exactly as it is; so
    is a container whose server runs as a user other than root: Docker creates a missing bind source owned by root,
    which that server could not write (vLLM fails its start on a cache folder it cannot create). The environment is
    never changed (vLLM hashes its environment into the cache key).

    Returns:
        ``(new record, notes)``: a note when a cache is not kept, saying why and what to mount instead (one at most).
    """
    rec = json.loads(json.dumps(record))
    cfg, hcfg = rec.get("Config") or {}, rec.setdefault("HostConfig", {})
    targets = [(b.split(":")[1] if ":" in b else b) for b in hcfg.get("Binds") or []]
    targets += [m.get("Target") or "" for m in hcfg.get("Mounts") or []]
    user = str(cfg.get("User") or "")
    lost: list[str] = []
    for (key, var), path in zip(COMPILE_CACHES, compile_cache_paths(cfg).values()):
        if path and any(t and _under(path, t) for t in targets):
            continue  # kept on the host by the container's own configuration
        if user.split(":", 1)[0] not in ("", "root", "0") or not path:
            lost.append(f"{var} ({path or 'its default folder'})")
            continue
        hcfg["Binds"] = [*(hcfg.get("Binds") or []), f"{host_dir.rstrip('/')}/{key}:{path}"]
    notes = [f"the compile cache is not kept across releases: {', '.join(lost)} is in the container's layer, lost "
             f"with every container a release, rollback or gate switch recreates, and the server runs as user "
             f"{user!r}, which could not write a folder Docker creates for it (owned by root); fix: mount a folder "
             f"that user can write and point both there (e.g. `--volume /srv/vllm-cache:/cache --env "
             f"VLLM_CACHE_ROOT=/cache/vllm --env TORCHINDUCTOR_CACHE_DIR=/cache/torchinductor`)"] if lost else []
    return rec, notes


def create_request(record: dict[str, Any], *, image: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Engine API ``POST /containers/create`` body recreating ``record``, and the networks to connect after
    creation (older engines take one network at create time).

    Args:
        image: the image to create from (default ``Config.Image``); the supervisor passes the recorded image id when
            the reference no longer resolves to it.

    Returns:
        (body with ``HostConfig`` and ``NetworkingConfig``, {network: endpoint config} to connect afterwards).
    """
    body = json.loads(json.dumps(record["Config"]))
    if image:
        body["Image"] = image
    body["HostConfig"] = json.loads(json.dumps(record["HostConfig"]))
    nets = dict(record.get("Networks") or {})
    mode = body["HostConfig"].get("NetworkMode") or "default"
    primary = mode if mode in nets else ("bridge" if mode == "default" and "bridge" in nets else None)
    if mode in ("host", "none") or mode.startswith("container:"):
        primary, nets = None, {}
    if primary is None and nets and mode not in ("host", "none") and not mode.startswith("container:"):
        primary = next(iter(nets))
    if primary is not None:
        body["NetworkingConfig"] = {"EndpointsConfig": {primary: nets.pop(primary)}}
    return body, nets


def record_run_argv(host: HostConfig, record: dict[str, Any], compile_cache: str | None = None) -> Change:
    """A readable ``docker run`` line for a recreated container (``--dry-run``): name, image and command; the
    engine gets every other setting of the record from the supervisor, unchanged. ``compile_cache``: the plan's
    folder, shown as the binds :func:`keep_compile_cache` adds (the container's own cache folders are read on the
    host)."""
    cfg = record.get("Config") or {}
    ep = list(cfg.get("Entrypoint") or [])
    cache = [w for key, var in COMPILE_CACHES for w in
             ("--volume", f"{compile_cache}/{key}:<{var} of the container, unless it keeps its own>")]
    return Change(docker(host, "run", "--detach", "--name", record.get("Name") or "?",
                  "<every other Config/HostConfig setting of the recorded container, unchanged>",
                  *(cache if compile_cache else []),
                  *(["--entrypoint", ep[0]] if ep else []), cfg.get("Image") or "?", *ep[1:], *(cfg.get("Cmd") or [])))


def inventory_drift(host: HostConfig, inspect: dict[str, Any]) -> list[str]:
    """How the inventory's serving flags differ from the live serving container (``config check HOST``).

    The inventory's ``image``, ``args``, ``env``, ``volumes``, ``shm_size``, ``cpuset_cpus`` and ``gpus`` apply only
    where no live container exists (provisioning); releases start from the live container. The compile cache's binds
    (:func:`keep_compile_cache`, under :func:`compile_cache_dir`) are eagle3ops' own and not reported. Returns one line per difference
    (values of environment variables are not shown: they may be secrets).
    """
    s, cfg, hcfg = host.serving, inspect.get("Config") or {}, inspect.get("HostConfig") or {}
    out: list[str] = []
    if cfg.get("Image") != s.image:
        out.append(f"image: inventory {s.image!r}, live {cfg.get('Image')!r}")
    cmd = list(cfg.get("Cmd") or [])
    if cmd != list(s.args):
        out.append(f"args: inventory {redact.argv(s.args, host.secret_env)}, "
                   f"live {redact.argv(cmd, host.secret_env)}")
    live_env = dict(e.split("=", 1) for e in cfg.get("Env") or [] if "=" in e)
    for k, v in sorted(s.env.items()):
        if k not in live_env:
            out.append(f"env {k}: set in the inventory, not in the live container")
        elif live_env[k] != v:
            out.append(f"env {k}: the inventory's value differs from the live one")
    # the compile cache's binds are eagle3ops' own (keep_compile_cache), not a setting the inventory should carry
    cache = compile_cache_dir(host) + "/"
    binds = {b for b in hcfg.get("Binds") or [] if not b.startswith(cache)}
    for v in s.volumes:
        if v not in binds:
            out.append(f"volume {v!r}: in the inventory, not a bind of the live container")
    for v in sorted(binds - set(s.volumes)):
        out.append(f"volume {v!r}: a bind of the live container, not in the inventory")
    if s.shm_size and str(hcfg.get("ShmSize")) != str(_bytes(s.shm_size)) and hcfg.get("IpcMode") != "host":
        out.append(f"shm_size: inventory {s.shm_size}, live {hcfg.get('ShmSize')} bytes")
    live_cpus = hcfg.get("CpusetCpus") or ""
    if (s.cpuset_cpus or "") != live_cpus and (not s.cpuset_cpus or not live_cpus
                                               or cpu_ids(s.cpuset_cpus) != cpu_ids(live_cpus)):
        out.append(f"cpuset_cpus: inventory {s.cpuset_cpus or 'every CPU'}, live {live_cpus or 'every CPU'} (a "
                   f"release keeps the live set: `docker update --cpuset-cpus`, then a release restarts vLLM on it)")
    want_gpu = not (host.gpus == 0 or s.gpus in ("none", 0))
    if want_gpu != bool(hcfg.get("DeviceRequests")):
        out.append(f"gpus: inventory {s.gpus!r}, live {'GPU request' if hcfg.get('DeviceRequests') else 'no GPUs'}")
    return out


def _bytes(size: str) -> int:
    """``16g``/``512m``/``1024`` (Docker's size syntax) in bytes."""
    units = {"b": 1, "k": 2**10, "m": 2**20, "g": 2**30}
    s = size.strip().lower()
    return int(float(s[:-1]) * units[s[-1]]) if s and s[-1] in units else int(s)
