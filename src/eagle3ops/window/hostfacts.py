"""Pure judgements of facts that preflight reads from a host, before anything stops: whether a serving process's
record can be replayed (:func:`replay_refusal`), which of serving's environment the stages inherit
(:func:`inherited_env`), whether a venv host's pipeline environment can load its wheels (:func:`env_load_problems`).
Each takes what the host answered (strings, pids) and says why not, naming the cause and the fix; the reads are in
:mod:`eagle3ops.window.kinds` and :mod:`eagle3ops.window.preflight`."""

from __future__ import annotations

from eagle3ops.config import HostConfig
from eagle3ops.window.common import hint

__all__ = ["DRIVER_LIBS", "INHERITED_ENV_PREFIXES", "NOT_INHERITED", "SHELLS", "env_load_problems", "inherited_env",
           "replay_refusal"]


#: Shells whose ``-c`` script :func:`replay_refusal` reads.
SHELLS = ("sh", "bash", "dash", "zsh", "ksh", "ash")


def replay_refusal(host: str, pid: int, argv: list[str], port: int, listeners: dict[int, list[int]]) -> str | None:
    """Why the serving process ``pid`` cannot be recorded for a replay, else None (pure; :func:`check_process`
    reads the facts). The restore agent replays the recorded command line and tracks the process it starts; the
    stop takes the recorded pid's tree. Both hold only when the server stays under the recorded process, so:

    - a shell (:data:`SHELLS`) run with ``-c`` whose script ends with ``&`` is refused: it puts the last command in
      the background and exits, so its replay exits at once (the health gate then fails) while the server it left
      answers on the port, tracked by nothing;
    - the processes listening on serving's ``port`` must be ``pid`` or under it: a listener whose ancestry misses
      ``pid`` was left in the background (``nohup ... &``, a subshell, a daemonizing launcher), and the stop would
      miss it while the restore starts another. This is the robust check (it judges the process tree itself, not
      how a command line reads); the script check covers the case it cannot see (nothing listens yet). No listener
      seen: not judged by it.

    Args:
        host: the inventory's host name (for the key the message names).
        pid: the oldest process matching ``serving.process_match``.
        argv: its ``/proc/PID/cmdline``, split at NULs.
        port: ``serving.port``.
        listeners: listening pid → its ancestry ``[pid, parent, ..., 1]`` (:func:`eagle3ops.commands.process.
            port_listeners`).
    """
    key = f"hosts.{host}.serving.process_match"
    fix = (f"run serving in the foreground under the process {key} matches (no trailing `&`; in a script, `exec "
           f"vllm serve ...`), started detached from outside it (`setsid nohup ... &`), or set {key} to match the "
           f"server itself")
    if argv and argv[0].rsplit("/", 1)[-1] in SHELLS:
        opts = [a for a in argv[1:] if a.startswith("-") and not a.startswith("--")]
        script = next((a for a in argv[1:] if not a.startswith("-")), "") if any("c" in o for o in opts) else ""
        if script.rstrip().endswith("&") and not script.rstrip().endswith("&&"):
            return (f"pid {pid} is a shell whose script ends with `&` ({' '.join(argv)[:200]!r}): it puts the server "
                    f"in the background and exits, so the restore's replay of it would exit at once and leave a "
                    f"server that nothing tracks; {fix}")
    outside = [c for c in listeners.values() if pid not in c]
    if listeners and len(outside) == len(listeners):
        c = outside[0]
        return (f"pid {pid} ({' '.join(argv)[:160]!r}), the oldest process matching {key}, is not the server: pid "
                f"{c[0]} listens on port {port} and is not under pid {pid} (its parents: "
                f"{' '.join(map(str, c[1:])) or 'none'}): the server was left in the background (`nohup ... &`, a "
                f"shell ending with `&`, a daemonizing launcher). The stop would take pid {pid}'s processes without "
                f"the server, and the restore would replay pid {pid}'s command line, starting a server nothing "
                f"tracks; {fix}")
    return None


#: Environment of live serving that the stages inherit: NCCL's and CUDA's settings (and PyTorch's for NCCL), which
#: hosts need for collectives to work at all (e.g. ``NCCL_P2P_DISABLE=1`` where PCIe P2P hangs, as on RTX PRO 6000
#: hosts) and which serving was started with. ``CUDA_VISIBLE_DEVICES`` is not inherited: the stages get the host's
#: GPUs (``hosts.<name>.gpus``) whatever subset serving used; nor are the names a CUDA base image sets to describe
#: itself (``CUDA_VERSION``, ``CUDA_HOME``, ...): the pipeline image has its own.
INHERITED_ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_NCCL_")
NOT_INHERITED = ("CUDA_VISIBLE_DEVICES", "CUDA_VERSION", "CUDA_HOME", "CUDA_PATH", "CUDA_PKG_VERSION")


def inherited_env(pairs: list[str]) -> dict[str, str]:
    """The stages' share of serving's environment (pure): from ``NAME=VALUE`` strings (``docker inspect``'s
    ``Config.Env``, ``/proc/PID/environ`` split at NULs), the names starting with :data:`INHERITED_ENV_PREFIXES`
    but :data:`NOT_INHERITED`. Nothing else (tokens, keys, paths) is taken."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = str(pair).partition("=")
        if sep and name.startswith(INHERITED_ENV_PREFIXES) and name not in NOT_INHERITED:
            out[name] = value
    return out


#: Libraries of the NVIDIA driver, not of the environment's wheels: a CPU host has none, a GPU host's driver
#: provides them (the GPU checks judge the driver); ``ldd`` not finding them is not the environment's fault.
DRIVER_LIBS = ("libcuda.so", "libnvidia-ml.so", "libnvidia-")


def env_load_problems(h: HostConfig, d: str, out: str) -> list[str]:
    """Why the pipeline environment ``d`` cannot load its compiled wheels, from :func:`eagle3ops.commands.venv.
    env_health`'s output (pure): a ``noexec`` mount (the kernel refuses to map its ``.so`` files executable, so
    ``import torch`` fails in every stage: "failed to map segment from shared object"), or system libraries that
    ``ldd`` does not find for torch's/vLLM's shared objects (the wheels expect them from the host, e.g.
    ``libgomp.so.1``, ``libnuma.so.1``); :data:`DRIVER_LIBS` are not counted. Each line names the cause and the
    fix; empty when neither is seen (nothing to judge where ``findmnt``/``ldd`` are missing)."""
    problems: list[str] = []
    opts = next((ln[6:].strip() for ln in out.splitlines() if ln.startswith("mount ")), "")
    if "noexec" in opts.split(","):
        problems.append(f"the pipeline environment {d} is on a mount with noexec ({opts}): its compiled libraries "
                        f"(torch, vllm) cannot be loaded there, so every stage would fail at import; set "
                        f"hosts.{h.name}.state_dir to a filesystem mounted without noexec (or remount it) and "
                        f"redeploy with {hint('deploy', h.name)}")
    missing: dict[str, str] = {}
    for ln in out.splitlines():
        if not ln.startswith("missing ") or ": " not in ln:
            continue
        path, rest = ln[8:].split(": ", 1)
        lib = rest.split("=>")[0].strip()
        if lib and not lib.startswith(DRIVER_LIBS):
            missing.setdefault(lib, path.split("site-packages/", 1)[-1])
    if missing:
        libs = ", ".join(f"{lib} (needed by {by})" for lib, by in list(missing.items())[:6])
        problems.append(f"the pipeline environment {d} lacks system libraries the wheels load: {libs}: install them "
                        f"on {h.name} (the distribution's packages that provide them, e.g. libgomp1, libnuma1), then "
                        f"run the window again; nothing was stopped")
    return problems
