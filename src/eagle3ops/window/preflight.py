"""Preflight of a window (read-only, before anything stops): host checks and the stages' disk estimate."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from eagle3ops.commands import docker as dk
from eagle3ops.commands import host as hc
from eagle3ops.commands import runtime as rt
from eagle3ops.commands import serving as sv
from eagle3ops.commands import stages as st
from eagle3ops.commands import venv as vc
from eagle3ops.config import HostConfig
from eagle3ops.remote import Remote, RemoteError
from eagle3ops.window.common import hint
from eagle3ops.window.estimate import GpuMemoryPlan, draft_param_count
from eagle3ops.window.gpucheck import check_gpus_fit
from eagle3ops.window.hostfacts import env_load_problems
from eagle3ops.window.kinds import check_session_kill, driver_kind, serving_container

# the disk estimate lives beside preflight; its names stay importable from here for the window's callers
from eagle3ops.window.diskestimate import (AUX_LAYERS_STORED, BF16_BYTES, PREPARED_BYTES_PER_TOKEN,  # noqa: E402,F401
                                           DiskEstimate, estimate_disk, hidden_state_bytes, stage_output_bytes,
                                           target_dims)



@dataclass
class Preflight:
    """Results of the read-only checks made before anything stops."""

    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    #: Name of the serving container the run will manage (see :func:`serving_container`).
    serving_container: str = ""
    #: Kind ``process``: pid of the serving process found (see :func:`check_process`).
    process_pid: int | None = None
    #: What the throwaway stage container printed when it passed (its ``cuda archs`` line: the image's CUDA
    #: architectures, see :func:`check_gpus_fit`); empty when it did not run.
    trial_output: str = ""
    #: How the restore agent (kinds ``process``/``systemd``) and a venv host's supervisor are detached
    #: (:func:`eagle3ops.window.kinds.check_session_kill`).
    agent_detach: str = "setsid"
    #: The NCCL/CUDA environment live serving runs with, which the stages inherit
    #: (:func:`eagle3ops.window.kinds.inherited_env`); empty when none was read.
    serving_env: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, ok: bool, detail: str) -> None:
        """Record one check."""
        self.checks.append((name, ok, detail))

    @property
    def ok(self) -> bool:
        """All checks passed."""
        return all(ok for _, ok, _ in self.checks)

    def failures(self) -> str:
        """One line per failed check."""
        return "\n".join(f"  - {n}: {d}" for n, ok, d in self.checks if not ok)


def read_run_state(r: Remote, run: str) -> tuple[str | None, dict[str, str | None], dict[str, int]]:
    """What a run directory holds now (read-only, over SSH): ``(text of runs/<run>/pipeline.yaml or None,
    {stage: text of its manifest.json or None} for every stage, {"<stage>/<relative path>": bytes} of every file)``.
    The driver decides from it which stages are done before serving stops
    (:func:`eagle3ops.window.planner.decide_stages`)."""
    from eagle3ops.stages.manifest import MANIFEST, STAGES

    rdir = f"{r.host.data_dir}/runs/{run}"

    def text(path: str) -> str | None:
        out = r.run(hc.cat_if_exists(path), check=False)
        return out.stdout if out.ok and out.stdout else None

    manifests = {s: text(f"{rdir}/{s}/{MANIFEST}") for s in STAGES}
    sizes: dict[str, int] = {}
    if any(manifests.values()):
        out = r.run(hc.file_sizes(rdir), check=False)
        sizes = hc.parse_file_sizes(out.stdout, rdir)
    return text(f"{rdir}/pipeline.yaml"), manifests, sizes


#: What a failed throwaway stage container's output says → the stage setting at fault and its inventory key under
#: ``hosts.<name>`` (first match wins; the engine's own words, e.g. runc's "error setting rlimit type 8").
TRIAL_SETTINGS: list[tuple[str, str, str]] = [
    (r"rlimit|ulimit", "ulimits", "stage_ulimits"),
    (r"runtime name|unknown runtime|runtime .*not found", "runtime", "stage_runtime"),
    (r"device driver|nvidia-container|libnvidia|cdi|gpu|cuda devices", "gpus", "gpus (or stage_runtime)"),
    (r"shm", "shm", "stage_shm_size"),
    (r"\bipc\b", "ipc", "stage_ipc"),
    (r"mounts missing|mount", "mounts", "data_dir / model_path"),
]


def _settings(spec: dict[str, Any]) -> dict[str, str]:
    return {"runtime": spec.get("runtime") or "engine default", "ipc": spec.get("ipc_mode") or "engine default",
            "shm": spec.get("shm_size") or "engine default",
            "ulimits": ", ".join(f"{u['Name']}={u['Soft']}:{u['Hard']}" for u in spec.get("ulimits") or [])
            or "engine default", "gpus": "all" if spec.get("device_requests") else "none",
            "mounts": ", ".join(spec.get("volumes") or [])}


def diagnose_trial(h: HostConfig, spec: dict[str, Any], exited: int | None, output: str) -> str:
    """The message of a failed throwaway stage container (pure): the engine's or the container's own words, the
    stage setting they point at (:data:`TRIAL_SETTINGS`) with its value and the inventory key that sets it, else
    every setting with its key."""
    settings = _settings(spec)
    low = output.lower()
    hit = next(((name, key) for pattern, name, key in TRIAL_SETTINGS if re.search(pattern, low)), None)
    if hit:
        what = f"the stages' {hit[0]} ({settings[hit[0]]}): inventory key hosts.{h.name}.{hit[1]}"
    else:
        what = (f"the stage settings ({'; '.join(f'{k} {v}' for k, v in settings.items())}): inventory keys "
                f"hosts.{h.name}.stage_runtime / stage_ipc / stage_shm_size / stage_ulimits / gpus")
    tail = " ".join(output.strip().split())[-400:] or "no output"
    return (f"a throwaway stage container with the stages' own settings failed "
            f"({'timed out' if exited is None else f'exit {exited}'}): {tail}. Fix {what}; serving was not touched")


def trial_stage_container(r: Remote, pf: Preflight, *, image: str, run: str, window_id: str, stage: str) -> None:
    """Preflight's GPU/container check: start a throwaway container from the stage's own spec
    (:func:`eagle3ops.commands.stages.trial_spec`: device request, runtime, ipc, shm, ulimits, env, mounts) and the
    pipeline image, running :func:`eagle3ops.commands.stages.trial_command`, bounded by
    :data:`eagle3ops.commands.stages.TRIAL_TIMEOUT_S` seconds and removed afterwards (``--rm``, then ``rm -f``).
    Adds the ``stage container`` check to ``pf``. In a dry run it is printed, not run."""
    spec = st.trial_spec(r.host, image=image, run=run, window_id=window_id, stage=stage)
    try:
        res = r.run(st.trial_argv(r.host, spec), check=False, timeout=st.TRIAL_TIMEOUT_S)
        ok, exited, output = res.ok, res.exited, (res.stderr + "\n" + res.stdout)
    except RemoteError as exc:  # timed out
        ok, exited, output = False, None, f"no answer within {st.TRIAL_TIMEOUT_S}s: {exc}"
    finally:
        r.run(dk.rm(r.host, spec["name"], force=True), check=False)
    if r.dry_run:
        pf.add("stage container", True, f"would run {spec['name']} with the {stage} stage's settings")
        return
    pf.add("stage container", ok, f"{stage} stage's settings work: {' '.join(output.split())[-120:]}" if ok
           else diagnose_trial(r.host, spec, exited, output))
    pf.trial_output = output if ok else ""


def trial_stage_process(r: Remote, pf: Preflight, *, image: str, run: str) -> bool:
    """A venv host's throwaway stage process (:func:`eagle3ops.commands.venv.trial_argv`: the pipeline
    environment's python with the stages' environment; on GPU hosts its torch's device count and CUDA
    architectures), bounded by :data:`eagle3ops.commands.stages.TRIAL_TIMEOUT_S` seconds. Adds the ``stage
    process`` check; returns whether it ran (not in a dry run, where it is printed)."""
    h = r.host
    try:
        res = r.run(vc.trial_argv(h, image=image, run=run), check=False, timeout=st.TRIAL_TIMEOUT_S)
        ok, exited, output = res.ok, res.exited, (res.stderr + "\n" + res.stdout)
    except RemoteError as exc:  # timed out
        ok, exited, output = False, None, f"no answer within {st.TRIAL_TIMEOUT_S}s: {exc}"
    if r.dry_run:
        pf.add("stage process", True, "would run the pipeline environment's python with the stages' environment")
        return False
    tail = " ".join(output.split())[-300:] or "no output"
    pf.add("stage process", ok, f"the stages' environment works: {tail[-120:]}" if ok else
           f"a throwaway stage process of the pipeline environment failed "
           f"({'timed out' if exited is None else f'exit {exited}'}): {tail}. Fix hosts.{h.name}.stage_env / gpus / "
           f"data_dir / model_path, or redeploy the environment; serving was not touched")
    pf.trial_output = output if ok else ""
    return True


def _check_image(r: Remote, pf: Preflight, image: str, expected_image_id: str | None) -> None:
    """Add the ``pipeline image`` check: ``image`` is on the host's engine, with id ``expected_image_id`` when
    given (``sha256:...``); a miss names ``deploy``."""
    h = r.host
    got = r.run(dk.image_id(h, image), check=False)
    got_id = got.stdout.strip()
    if not got.ok:
        pf.add("pipeline image", False, f"{image} is not on the host: run {hint('deploy', h.name)} first")
    elif expected_image_id and got_id != expected_image_id:
        pf.add("pipeline image", False, f"{image} on host has id {got_id[:19]}, expected "
                                         f"{expected_image_id[:19]}: redeploy with {hint('deploy', h.name)}")
    else:
        pf.add("pipeline image", True, got_id[:19])


def _check_free_space(r: Remote, pf: Preflight, has_data_dir: bool, need_bytes: int,
                      disk: DiskEstimate | None) -> None:
    """Add the ``free space`` check: the free bytes of ``data_dir``'s filesystem (``/``'s while ``data_dir`` does
    not exist yet: it is created at launch) against ``need_bytes`` + the stages' estimate ``disk`` +
    ``min_free_gib``; an estimate that could not be made fails with its reason."""
    h = r.host
    df = r.run(hc.free_bytes(h.data_dir if has_data_dir else "/"), check=False)
    if disk is not None and disk.error:
        pf.add("free space", False, f"no disk estimate: {disk.error}")
    elif df.ok:
        free = hc.parse_df_free_bytes(df.stdout)
        margin = int(h.min_free_gib * 2**30)
        need = need_bytes + (disk.total if disk else 0) + margin
        pf.add("free space", free >= need,
               f"{free / 2**30:.2f} GiB free on {h.data_dir}, need {need / 2**30:.2f} GiB"
               + (f" = {disk.describe()} + min_free_gib {h.min_free_gib:g} GiB" if disk else "")
               + ("" if free >= need else f": free space on {h.data_dir} (or make the run smaller: "
                                          f"prepare.max_samples / max_seq_len, train.keep_checkpoints)"))
    else:
        pf.add("free space", False, df.stderr.strip()[-200:])


def preflight(r: Remote, *, image: str, expected_image_id: str | None, need_bytes: int = 0,
              need_serving: bool = True, disk: DiskEstimate | None = None,
              trial: tuple[str, str, str] | None = None, memory: GpuMemoryPlan | None = None,
              engine: tuple[int, str, str] | None = None, target_later: bool = False) -> Preflight:
    """Read-only host checks: engine, image id, model path, free disk, GPUs, serving container; and, with
    ``trial``, a throwaway container with a stage's own settings (:func:`trial_stage_container`).

    Args:
        image: pipeline image reference that must be present on the host.
        expected_image_id: ``sha256:...`` it must have (None: presence only).
        need_bytes: further bytes the run will write into ``data_dir`` (on top of ``disk`` and ``min_free_gib``).
        disk: the stages' estimated output (:func:`estimate_disk`); an estimate that could not be made fails the
            ``free space`` check with its reason.
        trial: ``(run, window_id, stage)``: start the throwaway container of that stage
            (:func:`trial_stage_container`), once every check before it passed and ``data_dir`` exists; GPU hosts
            without it fall back to ``nvidia-smi -L`` on the host.
        memory: the GPU stages' memory estimates (:func:`estimate_gpu_memory`), checked with the architectures
            against what the GPUs report (:func:`check_gpus_fit`).
        target_later: a missing ``model_path`` passes, said so (``deploy`` of a host without serving: a work host
            is deployed before ``weights HOST --from PRODUCTION`` puts the target there; its windows check again).

    A host whose container engine is missing or does not answer fails at once, with one line saying so
    (:func:`engine_status`): every later check would only repeat it. ``engine``: ``docker version``'s
    ``(exit status, stdout, stderr)`` when the caller asked already (:func:`ask_engine`), else asked here.
    """
    h, pf, engine_runtime = r.host, Preflight(), rt.for_host(r.host).engine
    if not engine_runtime:  # no engine on this host, by configuration: the venv runtime's own checks instead
        check_venv(r, pf, image=image, expected_image_id=expected_image_id)
        if not pf.ok:
            return pf
    else:
        pf.add("docker engine", *engine_status(h, *(engine or ask_engine(r))))
        if not pf.ok:
            return pf
        _check_image(r, pf, image, expected_image_id)
    m = r.run(hc.test_dir(h.model_path), check=False)
    if m.ok:
        pf.add("model path", True, h.model_path)
    elif target_later:
        pf.add("model path", True, f"{h.model_path}: not there yet; `eagle3ops weights {h.name} --from PRODUCTION` "
                                   f"puts the target there (a cycle's weights step does), before any window")
    else:
        pf.add("model path", False, f"{h.model_path} is not a directory on the host: put the target there (from "
                                    f"another inventory host: `eagle3ops weights {h.name} --from HOST`) or fix "
                                    f"hosts.{h.name}.model_path")
    has_data_dir = r.run(hc.test_dir(h.data_dir), check=False).ok
    _check_free_space(r, pf, has_data_dir, need_bytes, disk)
    # The GPUs as the stages see them: a container with their settings. Only once the engine, image, model path
    # and data dir are known good: a bind mount of a missing directory would make the engine create it (as root).
    trial_ran = False
    if trial is not None and not engine_runtime and pf.ok:
        trial_ran = trial_stage_process(r, pf, image=image, run=trial[0])
    elif trial is not None and pf.ok and has_data_dir:
        run, window_id, stage = trial
        trial_stage_container(r, pf, image=image, run=run, window_id=window_id, stage=stage)
        trial_ran = not r.dry_run
    elif trial is not None and pf.ok:
        pf.add("stage container", True, f"not started: {h.data_dir} does not exist yet (created at launch; a bind "
                                        f"mount would make the engine create it as root)")
    if h.gpus and not trial_ran:  # the host's own view of its GPUs, where no stage container told
        g = r.run(hc.gpu_list(), check=False)
        n = len([ln for ln in g.stdout.splitlines() if ln.startswith("GPU ")])
        pf.add("gpus", g.ok and n >= h.gpus, f"{n} visible, inventory says {h.gpus}")
    elif not h.gpus:
        pf.add("gpus", True, "none (CPU host)")
    if h.gpus:
        check_gpus_fit(r, pf, memory=memory, trial_ran=trial_ran)
    _serving_checks(r, pf, need_serving)
    return pf


def _serving_checks(r: Remote, pf: Preflight, need_serving: bool) -> None:
    """The serving kind finds live serving (read-only), and on a venv host whether logind would end the window's
    supervisor with the SSH session (:func:`~eagle3ops.window.kinds.check_session_kill`); then, where serving
    answers HTTP, the host's profile
    against the vLLM version it reports (:func:`eagle3ops.window.servedversion.check_served_version`) and the
    inventory's served model against the models it lists (:func:`eagle3ops.window.servedmodel.check_served_model`)."""
    from eagle3ops.window.servedmodel import check_served_model
    from eagle3ops.window.servedversion import check_served_version

    kind = driver_kind(r.host)
    kind.preflight(r, pf, need_serving)
    if not rt.for_host(r.host).engine and not kind.restore_agent:
        check_session_kill(r, pf, agent=False)  # a venv host's supervisor is a session process (agents: asked)
    if need_serving and kind.answers_http and pf.ok:
        check_served_version(r, pf)
        check_served_model(r, pf)


def read_releases(r: Remote) -> tuple[set[int], int | None, list[dict[str, Any]]] | None:
    """The host's release records (read-only): ``(retained release numbers, the current one or None, the history
    entries oldest first)``; None when no release was recorded yet. Hosts whose state predates the history file get
    the numbering up to the current one (as :meth:`eagle3ops.supervisor.releases.Releases.history` does)."""
    from eagle3ops.config import fallbacks as fb

    rdir = f"{r.host.state_dir}/releases"
    listing = r.run(hc.ls(rdir), check=False)
    if not listing.ok:
        return None
    kept = {int(n[:-5]) for n in listing.stdout.split() if n.endswith(".json") and n[:-5].isdigit()}
    cur = r.run(hc.cat_if_exists(f"{rdir}/current"), check=False).stdout.strip()
    current = int(cur) if cur.isdigit() else None
    history = fb.history_entries(r.run(hc.cat_if_exists(f"{rdir}/history.jsonl"), check=False).stdout)
    if not history and current is not None:  # older state: the history is the numbering up to the current one
        history = [{"release": n} for n in sorted(kept) if n <= current]
    return kept, current, history


def rollback_plan(r: Remote, to_release: int | None) -> tuple[int | None, str]:
    """What ``rollback`` will bring back and why (:func:`eagle3ops.config.fallbacks.rollback_target` over the host's
    release records, the rule the supervisor switches by), read before anything stops; ``(None, why)`` when there
    is no target (no release recorded, or none kept before the current one), ``why`` naming the fix."""
    from eagle3ops.config import fallbacks as fb

    state = read_releases(r)
    if state is None:
        return None, (f"no release is recorded under {r.host.state_dir}/releases: a window or release records the "
                      "live serving first")
    kept, current, history = state
    target, why = fb.rollback_target(history, kept, current, to_release)
    if target is not None and target not in kept:
        return None, f"release {target} is not retained (retained: {', '.join(map(str, sorted(kept))) or 'none'})"
    return target, why


def check_fallbacks(r: Remote, pf: Preflight, *, kind: str, to_release: int | None = None) -> None:
    """Before the stop (and in ``--dry-run``): every retained release a plan of ``kind`` (``window``, ``release``,
    ``rollback``) may create (:func:`eagle3ops.config.fallbacks.candidates`: the rollback target, the previously live
    releases a failed gate falls back to) must be creatable on this host: its image present under the recorded id
    (``docker image inspect ID``: the id this host's image store uses; a reference re-tagged to another image does
    not count, a release never changes image silently) and every bind's host path present (the compile cache's
    excepted). A missing one fails the check naming the release, its purpose, what is missing and the fix. Read-only."""
    from eagle3ops.config import fallbacks as fb

    h = r.host
    rdir = f"{h.state_dir}/releases"
    state = read_releases(r)
    if state is None:
        return  # no release recorded yet: the first window records the live container
    kept, current, history = state
    problems, checked, unread = [], [], []
    for n, why in fb.candidates(kind, current, history, kept, to_release):
        text = r.run(hc.cat_if_exists(f"{rdir}/{n:04d}.json"), check=False).stdout
        if not text.strip():  # listed but unreadable by the SSH user (a file an older supervisor wrote as root)
            unread.append(n)
            continue
        image_id, ref, binds = fb.needs(json.loads(text))
        missing = []
        if image_id and not r.run(dk.image_id(h, image_id), check=False).ok:
            missing.append(f"image {ref} (id {image_id[:19]}) is not in this host's image store: push it "
                           f"(`eagle3ops push {ref} {h.name}`)")
        cache = sv.compile_cache_dir(h) + "/"  # keep_compile_cache's folders: the engine creates a missing one
        missing += [f"bind source {p} does not exist on the host: restore it" for p in binds
                    if not p.startswith(cache) and not r.run(hc.exists(p), check=False).ok]
        checked.append(n)
        if missing:
            problems.append(f"release {n} ({why}) cannot be created on this host: " + "; ".join(missing))
    if problems:
        pf.add("fallback releases", False, " | ".join(problems) + " (or remove that release file from "
                                                                  f"{rdir} if it is no longer wanted)")
    elif checked or unread:
        note = f"creatable: {', '.join(map(str, checked))}" if checked else "none readable here"
        if unread:
            note += (f"; release(s) {', '.join(map(str, unread))} not readable by the SSH user: the supervisor checks "
                     f"them when it rolls back (the next window makes their files the state dir owner's)")
        pf.add("fallback releases", True, note)


def serving_drift(r: Remote) -> tuple[str | None, list[str]]:
    """How the inventory's serving flags differ from the host's live serving container (read-only).

    Returns:
        (the live container's name or None when none exists, one line per difference
        (:func:`eagle3ops.commands.serving.inventory_drift`)). Without a live container the inventory's flags are
        what provisioning would use, so there is nothing to compare.
    """
    names, _ = serving_container(r)
    if not names:
        return None, []
    out = r.run(dk.inspect_container(r.host, names[0]), check=False)
    if not out.ok:
        return names[0], [f"cannot inspect {names[0]}: {(out.stderr or out.stdout).strip()[-300:]}"]
    return names[0], sv.inventory_drift(r.host, json.loads(out.stdout)[0])


#: What ``docker version`` says when the ``docker`` command is missing on the host (POSIX sh, bash, zsh, busybox).
_NO_CLI = ("command not found", "not found", "no such file or directory")
#: What it says when the CLI is there but no engine answers on the socket (Docker 20.10 .. 28 wordings).
_NO_DAEMON = ("cannot connect to the docker daemon", "failed to connect to the docker api", "is the docker daemon "
              "running", "error during connect")
#: What a host without a container engine can use instead: said in the refusal (only hosts not configured for the
#: venv runtime are asked for an engine at all).
NO_ENGINE_ALTERNATIVE = ("a host without a container engine (e.g. a rented GPU container reached over SSH) can run "
                         "windows as processes: set `stage_runtime: venv` with `venv_python: <the host's python3, "
                         "e.g. /usr/bin/python3.12>` and serving kind `process`, `systemd` or `none`, then `eagle3ops "
                         "deploy HOST` (it exports the pipeline image's venv as the host's pipeline environment; "
                         "`--env-tarball PATH` delivers a built one)")


def check_venv(r: Remote, pf: Preflight, *, image: str, expected_image_id: str | None) -> None:
    """Preflight of a ``stage_runtime: venv`` host (read-only), in place of the engine and image checks: the
    inventory's ``venv_python`` runs (``venv runtime``), and the pipeline environment ``image``
    (``venv:sha256:<hex>`` from ``deployed.json``) is unpacked under ``<state_dir>/env/<hex>`` with its marker naming
    the same digest (``pipeline environment``). Each failure names the key or the command that fixes it."""
    h = r.host
    v = r.run(vc.python_version(h), check=False)
    said = " ".join((v.stderr or v.stdout).split())[-160:]
    pf.add("venv runtime", v.ok and bool(v.stdout.strip()),
           f"{h.venv_python}: Python {v.stdout.strip()} (no container engine needed)" if v.ok else
           f"{h.venv_python} does not run on {h.name} ({said or f'exit {v.exited}'}): install that Python there or "
           f"set hosts.{h.name}.venv_python to the host's python3")
    if not pf.ok:
        return
    try:
        d = vc.env_dir(h, image)
    except ValueError as exc:
        pf.add("pipeline environment", False, f"{exc}: run {hint('deploy', h.name)} first")
        return
    text = r.run(vc.read_marker(h, image), check=False).stdout
    try:
        got = json.loads(text).get("digest") if text.strip() else None
    except ValueError:
        got = None
    want = expected_image_id or f"sha256:{vc.digest_hex(image)}"
    if got is None:
        pf.add("pipeline environment", False, f"no pipeline environment at {d} (or its bin/python or "
                                              f"{vc.ENV_MARKER} is missing): run {hint('deploy', h.name)}")
    elif got != want:
        pf.add("pipeline environment", False, f"{d} says it is {got[:19]}, expected {want[:19]}: redeploy with "
                                              f"{hint('deploy', h.name)}")
    elif (envpy := json.loads(text).get("env_python")) and envpy != ".".join(v.stdout.strip().split(".")[:2]):
        pf.add("pipeline environment", False, f"{d} is a Python {envpy} environment but {h.venv_python} is Python "
                                              f"{v.stdout.strip()}: point hosts.{h.name}.venv_python at a Python "
                                              f"{envpy} and redeploy with {hint('deploy', h.name)}")
    else:
        pf.add("pipeline environment", True, f"{d} ({got[:19]})")
        for why in env_load_problems(h, d, r.run(vc.env_health(h, image), check=False).stdout):
            pf.add("pipeline environment libraries", False, why)


def ask_engine(r: Remote) -> tuple[int, str, str]:
    """``docker version --format {{.Server.Version}}`` on the host (read-only): ``(exit status, stdout, stderr)``,
    what :func:`engine_status` judges."""
    v = r.run(dk.version(r.host), check=False)
    return v.exited, v.stdout, v.stderr


def engine_status(h: HostConfig, exited: int, stdout: str, stderr: str) -> tuple[bool, str]:
    """Preflight's ``docker engine`` check from ``docker version --format {{.Server.Version}}`` (pure):
    ``(ok, one line)``. eagle3ops runs its supervisor and stages in containers, so a host needs an engine; the
    line says which part is missing and what the host can use instead:

    - no ``docker`` command (exit 127, the shell's "not found"): install Docker Engine, or set ``docker_host``;
    - the CLI is there, the engine's socket does not answer ("Cannot connect to the Docker daemon", Docker 28's
      "failed to connect to the docker API"): start the engine or point ``docker_host`` at one that runs;
    - the socket refuses the SSH user ("permission denied"): the ``docker`` group, or a rootless engine's socket;

    each with :data:`NO_ENGINE_ALTERNATIVE` (the venv runtime). Hosts with ``stage_runtime: venv`` are not asked
    (:func:`check_venv` instead). Other failures keep the engine's own words."""
    out = " ".join((stderr or "").split()) or " ".join((stdout or "").split())
    if exited == 0:
        return True, (stdout or "").strip()
    low = out.lower()
    endpoint = h.docker_host or "unix:///var/run/docker.sock"
    key = f"hosts.{h.name}.docker_host"
    if exited == 127 or (("docker" in low) and any(m in low for m in _NO_CLI) and "daemon" not in low
                         and "docker api" not in low):
        return False, (f"no container engine on {h.name}: the `docker` command is not installed there "
                       f"({out[-120:] or f'exit {exited}'}); eagle3ops runs its supervisor and stages in containers: "
                       f"install Docker Engine (with the NVIDIA Container Toolkit on GPU hosts) or set {key} to an "
                       f"engine's socket; {NO_ENGINE_ALTERNATIVE}. Serving was not touched")
    if "permission denied" in low:
        return False, (f"the SSH user may not use the container engine on {h.name} ({out[-160:]}): add the user to "
                       f"the `docker` group or set {key} to an engine it may use (rootless Docker: "
                       f"unix:///run/user/<uid>/docker.sock). Serving was not touched")
    if any(m in low for m in _NO_DAEMON):
        return False, (f"no container engine answers on {h.name}: the `docker` command is there but {endpoint} "
                       f"does not answer ({out[-160:]}); start the engine (e.g. `systemctl start docker`) or set "
                       f"{key} to a running engine's socket; {NO_ENGINE_ALTERNATIVE}. Serving was not touched")
    return False, out[-200:] or f"`docker version` exited {exited}"
