"""The venv runtime (``stage_runtime: venv``) as argv lists: hosts without a container engine, where the
supervisor and the stages run as processes of the pipeline environment.

The pipeline environment is a directory ``<state_dir>/env/<digest>/`` (a Python venv built against the inventory's
``venv_python``, holding eagle3ops, the hash-locked wheels and the applied patch series), named by the sha256 of the
tarball it was unpacked from, with ``ENV_MARKER`` (``eagle3ops-env.json``: its digest) inside. The host's
``deployed.json`` names it as ``image: venv:<digest>`` and ``image_id: sha256:<digest>``, so windows carry it where
container hosts carry the pipeline image. The user's own venvs are never used or changed.

Stages see no mounts: the container paths ``/data`` and ``/model`` of a pipeline config are mapped to the host's
``data_dir`` and ``model_path`` through ``EAGLE3OPS_MOUNTS`` (JSON ``{"/data": ..., "/model": ...}``), which the
stage CLI applies to the config's paths (:func:`eagle3ops.config.pipeline.apply_mounts`; digests stay the written
config's).

The supervisor runs detached (``setsid nohup``, stdin from ``/dev/null``, output appended to the window's
``supervisor.log``) so it survives the SSH session and the driver; its pid is in the window's ``supervisor.pid``.
:data:`STATE_SH` says whether it runs, in the words ``docker inspect`` uses for a container (``running``, ``exited``,
``No such ...``), so the process-serving restore agent and the driver read either the same way.
"""

from __future__ import annotations

from typing import Any

from eagle3ops.commands.types import Change, Read
from eagle3ops.config import HostConfig

#: The file inside a pipeline environment that names its digest (JSON: ``{"digest": "sha256:...", ...}``).
ENV_MARKER = "eagle3ops-env.json"
#: ``deployed.json``'s ``image`` prefix for a pipeline environment (``venv:sha256:<hex>``).
IMAGE_PREFIX = "venv:"
#: The environment variable mapping the stages' container paths to host directories (see the module doc).
MOUNTS_ENV = "EAGLE3OPS_MOUNTS"


def env_root(host: HostConfig) -> str:
    """Where pipeline environments are unpacked on the host: ``<state_dir>/env``."""
    return f"{host.state_dir}/env"


def digest_hex(image: str) -> str:
    """The hex digest of a pipeline environment's ``image`` (``venv:sha256:<hex>``, ``sha256:<hex>`` or ``<hex>``).

    Raises:
        ValueError: not 64 hex digits (names the value).
    """
    hexd = image.removeprefix(IMAGE_PREFIX).removeprefix("sha256:")
    if len(hexd) != 64 or any(c not in "0123456789abcdef" for c in hexd):
        raise ValueError(f"{image!r} does not name a pipeline environment (expected venv:sha256:<64 hex digits>)")
    return hexd


#: The environment of an offline plan (``--dry-run --offline``): its digest is on the host, which is not asked.
UNKNOWN_ENV = "venv:<sha256 from the host's deployed.json>"


def env_dir(host: HostConfig, image: str) -> str:
    """The directory of the pipeline environment ``image`` (:func:`digest_hex`; :data:`UNKNOWN_ENV` in an offline
    plan) on the host."""
    if image == UNKNOWN_ENV:
        return f"{env_root(host)}/{UNKNOWN_ENV.removeprefix(IMAGE_PREFIX)}"
    return f"{env_root(host)}/{digest_hex(image)}"


def env_python(host: HostConfig, image: str) -> str:
    """The pipeline environment's interpreter: ``<env_dir>/bin/python``."""
    return f"{env_dir(host, image)}/bin/python"


#: The pipeline environment's stage program (``bin/eagle3ops-stage STAGE --run-dir DIR``): in an environment built
#: from the pipeline's lock it runs ``python -m eagle3ops stage``; the stand-in environment of the tests
#: (``eagle3ops_dev.standin_env``) provides stand-in stages under the same name.
STAGE_PROGRAM = "eagle3ops-stage"


def stage_program(host: HostConfig, image: str) -> str:
    """``<env_dir>/bin/eagle3ops-stage`` (:data:`STAGE_PROGRAM`)."""
    return f"{env_dir(host, image)}/bin/{STAGE_PROGRAM}"


def python_version(host: HostConfig) -> Read:
    """``<venv_python> -c ...``: the host Python's version (``3.12.3``), or the shell's error when it is missing."""
    return Read([host.venv_python or "python3", "-c",
                 "import sys; print('.'.join(map(str, sys.version_info[:3])))"])


def read_marker(host: HostConfig, image: str) -> Read:
    """The environment's :data:`ENV_MARKER` text, empty when the environment or its interpreter is missing."""
    d = env_dir(host, image)
    return Read(["sh", "-c", 'test -x "$1/bin/python" && cat "$1/$2" 2>/dev/null || true', "eagle3ops-env", d,
                 ENV_MARKER])


_ENV_HEALTH_SH = r"""
d=$1
echo "mount $(findmnt -no OPTIONS --target "$d" 2>/dev/null | head -n 1)"
find "$d" \( -path '*/site-packages/torch/lib/*.so*' -o -path '*/site-packages/vllm/*.so' \) -type f 2>/dev/null \
  | head -n 300 | while read -r f; do
    ldd "$f" 2>/dev/null | grep 'not found' | sed "s|^[[:space:]]*|missing $f: |"
  done | sort -u | head -n 40
"""


def env_health(host: HostConfig, image: str) -> Read:
    """Can the pipeline environment ``image`` load its compiled wheels on this host (read-only)? Prints ``mount
    <options>`` (``findmnt -no OPTIONS --target <env_dir>``; empty where ``findmnt`` is missing), then one ``missing
    <file>: <lib> => not found`` line per library that ``ldd`` cannot resolve for torch's (``torch/lib/*.so*``) and
    vLLM's (``vllm/**/*.so``) shared objects (at most 40)."""
    return Read(["sh", "-c", _ENV_HEALTH_SH, "eagle3ops-env-health", env_dir(host, image)])


def mounts_value(host: HostConfig) -> str:
    """``{"/data": "<data_dir>", "/model": "<model_path>"}`` (JSON): the value of :data:`MOUNTS_ENV` for the host's
    stages."""
    import json

    from eagle3ops.commands.stages import DATA_MOUNT, MODEL_MOUNT

    return json.dumps({DATA_MOUNT: host.data_dir, MODEL_MOUNT: host.model_path}, sort_keys=True)


def stage_spec(host: HostConfig, *, image: str, stage: str, run: str, window_id: str) -> dict[str, Any]:
    """A stage as a process (the venv runtime's counterpart of :func:`eagle3ops.commands.stages.stage_spec`,
    JSON-serialisable): ``name``, ``runtime: venv``, ``image`` (the environment), ``argv`` (the environment's
    :data:`STAGE_PROGRAM` ``STAGE --run-dir <data_dir>/runs/<run>``), ``environment`` (offline switches, the inventory's
    ``stage_env`` exactly, :data:`MOUNTS_ENV`), ``cwd`` (the run directory). All of the host's GPUs are visible, as
    to a stage container."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           MOUNTS_ENV: mounts_value(host)}
    env.update(host.stage_env)
    rdir = f"{host.data_dir}/runs/{run}"
    return {"name": f"eagle3ops-{window_id}-{stage}", "runtime": "venv", "image": image,
            "argv": [stage_program(host, image), stage, "--run-dir", rdir], "environment": env, "cwd": rdir}


def trial_argv(host: HostConfig, *, image: str, run: str) -> Change:
    """Preflight's throwaway stage process on a venv host (the counterpart of the stage container trial): the
    pipeline environment's python with a stage's environment (:func:`stage_spec`'s) running
    :func:`eagle3ops.commands.stages.trial_command` on the host's ``data_dir`` and ``model_path``; on GPU hosts it
    prints the environment's torch CUDA architectures. Bounded by the caller
    (:data:`eagle3ops.commands.stages.TRIAL_TIMEOUT_S`)."""
    from eagle3ops.commands.stages import trial_command

    spec = stage_spec(host, image=image, stage="trial", run=run, window_id="preflight")
    env = [f"{k}={v}" for k, v in sorted(spec["environment"].items())]
    return Change(["env", *env, env_python(host, image), *trial_command(host.gpus, host.data_dir, host.model_path)])


def chunk_plan_argv(host: HostConfig, *, image: str, run: str, window_id: str) -> Change:
    """Stage ``chunked``'s plan printed without running it (``--dry-run``) by a process of the pipeline environment
    with the stage's environment (the counterpart of :func:`eagle3ops.commands.stages.chunk_plan_argv`)."""
    spec = stage_spec(host, image=image, stage="chunked", run=run, window_id=window_id)
    env = [f"{k}={v}" for k, v in sorted(spec["environment"].items())]
    return Change(["env", *env, *spec["argv"], "--dry-run"])


def stage_preview(spec: dict[str, Any]) -> list[str]:
    """What the supervisor runs for a venv stage, as one argv (``--dry-run``): ``cd`` and ``env`` with the stage's
    environment, then its argv (output to ``<stage>.log`` in the window directory)."""
    env = [f"{k}={v}" for k, v in sorted(spec.get("environment", {}).items())]
    return ["cd", spec.get("cwd", "/"), "&&", "env", *env, *spec["argv"]]


def pid_file(window_dir: str) -> str:
    """The detached supervisor's pid file in the window directory."""
    return f"{window_dir}/supervisor.pid"


_LAUNCH_SH = ('py=$1 plan=$2 pidf=$3 log=$4; setsid nohup "$py" -m eagle3ops.supervisor "$plan" </dev/null '
              '>>"$log" 2>&1 & echo $! > "$pidf.tmp" && mv "$pidf.tmp" "$pidf"')
#: The user service's command: its own pid into the pid file, then ``exec`` the supervisor (the same pid).
_SERVICE_SH = 'echo $$ > "$3.tmp" && mv "$3.tmp" "$3" && exec "$1" -m eagle3ops.supervisor "$2" </dev/null'


def supervisor_argv(host: HostConfig, *, image: str, window_dir: str, plan_path: str,
                    detach: str = "setsid") -> Change:
    """Start the window's supervisor detached on the host, so that it survives the SSH session and the driver: the
    pipeline environment's python running ``-m eagle3ops.supervisor PLAN``, output appended to
    ``<window_dir>/supervisor.log``, its pid written to :func:`pid_file` (the supervisor rewrites it when it starts).

    ``detach``: ``setsid`` (``setsid nohup``), or ``user-service`` where systemd-logind ends the session's processes
    at logout (:func:`eagle3ops.commands.logind.detach_mode`, as for the restore agent): a transient user service
    (``systemd-run --user --collect``, unit ``eagle3ops-supervisor-<window id>``) in the lingering user's manager,
    not in the session's scope.

    Raises:
        ValueError: ``detach`` is neither."""
    log, pidf = f"{window_dir}/supervisor.log", pid_file(window_dir)
    if detach == "user-service":
        unit = "eagle3ops-supervisor-" + window_dir.rstrip("/").rsplit("/", 1)[-1]
        # systemd expands $ in a unit's command line (systemd.service(5), "Command lines"): doubled to reach sh
        words = [w.replace("$", "$$") for w in ["sh", "-c", _SERVICE_SH, "eagle3ops-supervisor",
                                                 env_python(host, image), plan_path, pidf]]
        return Change(["systemd-run", "--user", "--collect", "--quiet", "--unit", unit,
                       "-p", f"StandardOutput=append:{log}", "-p", f"StandardError=append:{log}", *words])
    if detach != "setsid":
        raise ValueError(f"detach must be 'setsid' or 'user-service', not {detach!r}")
    return Change(["sh", "-c", _LAUNCH_SH, "eagle3ops-launch", env_python(host, image), plan_path, pidf, log])


#: Whether the supervisor of a pid file runs (POSIX sh), answered as ``docker inspect --format
#: '{{.State.Status}}'`` answers for a container: ``running``, ``exited`` (the pid is gone, or now another
#: program's), or ``No such supervisor: <file>`` (exit 1) before it was launched. Extra arguments are ignored, so
#: the restore agent's ``"$@" inspect --format ... NAME`` works with these words in place of ``docker``.
STATE_SH = r"""
f=$1
[ -s "$f" ] || { echo "No such supervisor: $f"; exit 1; }
p=$(cat "$f")
if kill -0 "$p" 2>/dev/null && ! grep -q '^State:[[:space:]]*Z' "/proc/$p/status" 2>/dev/null \
   && tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q 'eagle3ops[.]supervisor'; then echo running
else echo exited; fi
"""


def state_words(window_dir: str) -> list[str]:
    """The command words that answer :data:`STATE_SH` for this window's supervisor (extra arguments ignored)."""
    return ["sh", "-c", STATE_SH, "eagle3ops-supervisor-state", pid_file(window_dir)]


def supervisor_state(window_dir: str) -> Read:
    """``running`` / ``exited`` / ``No such supervisor`` (exit 1) of this window's supervisor (:data:`STATE_SH`)."""
    return Read(state_words(window_dir))


#: Receive a pipeline environment tarball on stdin (POSIX sh): kept as ``<hex>.part`` until its sha256 equals the
#: digest it is delivered as (else removed, exit 3), unpacked into ``<hex>.tmp`` (exit 4 on a bad archive), its
#: interpreter run once (exit 5 when ``bin/python`` does not start: the venv was built against another Python path
#: than ``venv_python``; exit 6 when the environment's :data:`BUILD_RECORD` names another Python minor version than
#: that interpreter's), the marker written (the host Python's version, and the environment's as ``env_python``),
#: then renamed to ``<hex>``: a directory ``<hex>`` is always whole and verified.
RECEIVE_SH = r"""
root=$1 hex=$2 marker=$3 build=${4:-}
mkdir -p "$root" && cd "$root" || exit 1
rm -rf "$hex.part" "$hex.tmp"
cat > "$hex.part" || { rm -f "$hex.part"; exit 1; }
got=$(sha256sum "$hex.part" | cut -d' ' -f1)
if [ "$got" != "$hex" ]; then
  rm -f "$hex.part"; echo "digest mismatch: received sha256 $got, expected $hex" >&2; exit 3
fi
mkdir "$hex.tmp" && tar -xzf "$hex.part" -C "$hex.tmp" --no-same-owner 2>&1 >/dev/null \
  || { rm -rf "$hex.tmp" "$hex.part"; echo "not a gzip tar archive" >&2; exit 4; }
rm -f "$hex.part"
if ! out=$("$hex.tmp/bin/python" -c 'import sys; print(sys.version.split()[0])' 2>&1); then
  rm -rf "$hex.tmp"; echo "bin/python does not start: $out" >&2; exit 5
fi
want=
if [ -n "$build" ] && [ -f "$hex.tmp/$build" ]; then
  want=$(sed -n 's/.*"python": *"\([0-9]*\.[0-9]*\).*/\1/p' "$hex.tmp/$build" | head -n 1)
  if [ -n "$want" ] && [ "$want" != "${out%.*}" ]; then
    rm -rf "$hex.tmp"; echo "Python mismatch: the environment is Python $want, its bin/python is Python $out" >&2
    exit 6
  fi
fi
printf '{"digest": "sha256:%s", "python": "%s", "env_python": "%s"}\n' "$hex" "$out" "$want" > "$hex.tmp/$marker"
rm -rf "$hex" && mv "$hex.tmp" "$hex" && echo "$root/$hex"
"""


def receive_env(host: HostConfig, image: str) -> Change:
    """Receive the pipeline environment ``image`` (``venv:sha256:<hex>``) as a gzip tarball on stdin into
    ``<state_dir>/env/<hex>`` (:data:`RECEIVE_SH`: verified by digest before anything is unpacked; prints the
    directory). Exit 3: digest mismatch; 4: not a gzip tar; 5: its ``bin/python`` does not start; 6: its
    :data:`BUILD_RECORD` names another Python minor version than the host's ``venv_python``."""
    return Change(["sh", "-c", RECEIVE_SH, "eagle3ops-receive-env", env_root(host), digest_hex(image), ENV_MARKER,
                   BUILD_RECORD])


# --- the real pipeline environment, exported from a built pipeline image (``eagle3ops.transfer.envbuild``) ---

#: The file inside a pipeline environment built from an image that says what it was built from (JSON: ``image``,
#: ``image_id``, ``python`` (the image's ``X.Y.Z``), ``venv_python``, ``source_prefix``). The stand-in has none.
BUILD_RECORD = "eagle3ops-env-build.json"

#: What the pipeline image's interpreter says about itself (run in a throwaway container, no network): its venv
#: (``sys.prefix``), base prefix, version, ``site-packages`` and the ``sys.path`` directories that live outside both
#: prefixes (e.g. ``/opt/eagle3ops/dev`` named by a ``.pth`` file), as one JSON line.
IMAGE_PROBE_PY = r"""
import json, os, site, sys
pre, base = sys.prefix, sys.base_prefix
sp = [p for p in site.getsitepackages() if p.startswith(pre + "/")]
extra = [p for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p) and not p.startswith(pre + "/")
         and not p.startswith(base + "/")]
print(json.dumps({"prefix": pre, "base_prefix": base, "version": ".".join(map(str, sys.version_info[:3])),
                  "site_packages": sp[0] if sp else "", "extra_paths": extra}))
"""


def image_probe_spec(image: str) -> dict[str, Any]:
    """The throwaway container (docker SDK ``containers.create`` kwargs) that runs :data:`IMAGE_PROBE_PY` with the
    image's ``python3`` (what stage containers run), without network. Bounded and removed by the caller."""
    return {"image": image, "entrypoint": ["python3", "-c", IMAGE_PROBE_PY], "network_disabled": True,
            "labels": {"io.eagle3ops.role": "env-export"}}


def export_spec(image: str) -> dict[str, Any]:
    """A container of ``image`` that is created, never started, to read its venv out (``get_archive``)."""
    return {"image": image, "entrypoint": ["true"], "network_disabled": True,
            "labels": {"io.eagle3ops.role": "env-export"}}


#: ``bin/eagle3ops-stage`` of an environment built from the pipeline image: what a stage container runs
#: (:func:`eagle3ops.commands.stages.stage_spec`: ``python3 -m eagle3ops stage STAGE --run-dir DIR``), with the
#: environment's own interpreter, wherever the environment was unpacked.
REAL_STAGE_SH = ('#!/bin/sh\n# the pipeline stages, as in the stage containers: python -m eagle3ops stage\n'
                 'exec "$(dirname -- "$0")/python" -m eagle3ops stage "$@"\n')

#: The first lines that replace a console script's ``#!<image venv>/bin/python`` (the image's venv path does not
#: exist on the host, and the environment's own path is known only once unpacked): ``sh`` re-executes the script
#: with the ``python`` beside it; Python reads the second and third lines as a string expression.
RELOCATABLE_SHEBANG = "#!/bin/sh\n'''exec' \"$(dirname -- \"$0\")/python\" \"$0\" \"$@\"\n' '''\n"
