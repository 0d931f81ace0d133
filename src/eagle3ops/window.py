"""A maintenance window, driver side: lock → preflight → launch the host-side supervisor → watch → summary.

The driver *plans and watches*; the host *does and remembers* (:mod:`eagle3ops.supervisor`). Nothing here stops
serving: the supervisor does, and it restores serving whatever happens to the driver. A preflight failure stops
nothing and releases the lock.
"""

from __future__ import annotations

import getpass
import json
import secrets
import shlex
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from eagle3ops.commands import docker as dk
from eagle3ops.commands import host as hc
from eagle3ops.commands import serving as sv
from eagle3ops.commands import stages as st
from eagle3ops.config import HostConfig
from eagle3ops.remote import Remote, RemoteError, render
from eagle3ops.supervisor import MIN_GATE_S, RECORD_GATE_S, HealthCheck, Plan, StageStep

#: Bytes per token of extracted hidden states: 4 aux layers (3 intermediate + last) × hidden size × 2 bytes (bf16).
AUX_LAYERS_STORED = 4
BF16_BYTES = 2


class WindowError(Exception):
    """A window could not start or did not end well; the message says what happened and what to do."""


class LockHeld(WindowError):
    """Another run holds the host's deploy lock."""


class PreflightFailed(WindowError):
    """A preflight check failed; nothing was stopped."""


class SupervisorDead(WindowError):
    """The window's host-side supervisor is not running and left no result; the message gives the recover command."""


def hint(*args: str) -> str:
    """An ``eagle3ops`` command for a message, each argument quoted (``shlex.quote``): a host name or alias pasted
    back into a shell stays one literal word and runs nothing."""
    return "`" + shlex.join(["eagle3ops", *args]) + "`"


def new_window_id(kind: str) -> str:
    """``YYYYmmddTHHMMSSZ-<kind>-<6 hex>``: sortable and unique."""
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{kind}-{secrets.token_hex(3)}"


def paths(host: HostConfig, window_id: str | None = None) -> dict[str, str]:
    """Well-known state paths on the host (see :mod:`eagle3ops.supervisor`)."""
    s = host.state_dir
    p = {"state": s, "lock": f"{s}/lock", "lock_details": f"{s}/lock/details.json", "audit": f"{s}/audit.jsonl",
         "windows": f"{s}/windows", "releases": f"{s}/releases", "deployed": f"{s}/deployed.json"}
    if window_id:
        w = f"{s}/windows/{window_id}"
        p.update(window=w, plan=f"{w}/plan.json", journal=f"{w}/journal.jsonl", result=f"{w}/result.json")
    return p


def hidden_state_bytes(tokens: int, hidden_size: int) -> int:
    """Disk bytes of extracted hidden states: tokens × 4 aux layers × hidden_size × 2 (bf16).

    Source: speculators stores, per token, the 3 aux layers' hidden states concatenated plus the last layer's,
    each ``hidden_size`` values, in the target's dtype (bf16 = 2 bytes).
    """
    return tokens * AUX_LAYERS_STORED * hidden_size * BF16_BYTES


#: Bytes per token of ``prepare/samples.jsonl`` (ids and loss mask as JSON text) and of the int64 ``input_ids`` +
#: ``loss_mask`` stored beside each sample's hidden states: generous bounds.
PREPARED_BYTES_PER_TOKEN = 16
#: Bytes per trainable draft-head parameter in one resumable checkpoint: fp32 weights (4) + AdamW's two fp32
#: moments (8). Frozen parameters (embeddings, verifier lm_head) are saved as fp32 weights only (4).
CHECKPOINT_BYTES_PER_PARAM = 12
FROZEN_BYTES_PER_PARAM = 4


def target_dims(model_config: dict[str, Any]) -> dict[str, int]:
    """``hidden_size``, ``intermediate_size``, ``vocab_size`` of a target's ``config.json`` (the text model's for
    multimodal configs with a ``text_config``).

    Raises:
        ValueError: no ``hidden_size`` (the file is not a transformer config).
    """
    t = model_config if "hidden_size" in model_config else (model_config.get("text_config") or {})
    if not t.get("hidden_size"):
        raise ValueError("config.json has no hidden_size (nor text_config.hidden_size)")
    h = int(t["hidden_size"])
    return {"hidden_size": h, "intermediate_size": int(t.get("intermediate_size") or 4 * h),
            "vocab_size": int(t.get("vocab_size") or model_config.get("vocab_size") or 0)}


def draft_param_count(dims: dict[str, int], *, num_layers: int, draft_vocab_size: int) -> tuple[int, int]:
    """Upper bounds of an EAGLE-3 draft head's parameters as ``(trainable, frozen)``: trainable are the fused aux
    projection (3H·H), per decoder layer attention over 2H inputs (≤ 8H²) and the MLP (3·H·I), and the draft
    lm_head (H·draft_vocab); frozen are the target's embeddings and verifier lm_head (2·V·H)."""
    h, i, v = dims["hidden_size"], dims["intermediate_size"], dims["vocab_size"]
    return 3 * h * h + num_layers * (8 * h * h + 3 * h * i) + h * draft_vocab_size, 2 * v * h


def stage_output_bytes(stage: str, cfg: Any, dims: dict[str, int], tokens: int) -> int:
    """Estimated bytes a stage writes into ``<data_dir>/runs/<run>/`` (pure).

    Args:
        stage: ``prepare``, ``extract``, ``vocab`` or ``train``.
        cfg: the run's :class:`eagle3ops.config.pipeline.PipelineConfig`.
        dims: :func:`target_dims` of the target model.
        tokens: prepared tokens (exact from the prepare manifest, else an upper bound).

    ``extract``: tokens × 4·H·2 bytes of hidden states (:func:`hidden_state_bytes`) + ids/masks; ``train``:
    ``keep_checkpoints + 1`` resumable checkpoints (the newest is written before the oldest is deleted) of
    :data:`CHECKPOINT_BYTES_PER_PARAM` per trainable and :data:`FROZEN_BYTES_PER_PARAM` per frozen parameter, plus
    the bf16 final head.
    """
    if stage == "prepare":
        return tokens * PREPARED_BYTES_PER_TOKEN
    if stage == "extract":
        return hidden_state_bytes(tokens, dims["hidden_size"]) + tokens * PREPARED_BYTES_PER_TOKEN
    if stage == "vocab":
        return 8 * (cfg.vocab.draft_vocab_size + dims["vocab_size"])
    if stage == "train":
        trainable, frozen = draft_param_count(dims, num_layers=cfg.train.num_layers,
                                              draft_vocab_size=cfg.vocab.draft_vocab_size)
        ckpt = trainable * CHECKPOINT_BYTES_PER_PARAM + frozen * FROZEN_BYTES_PER_PARAM
        return ckpt * (cfg.train.keep_checkpoints + 1) + (trainable + frozen) * BF16_BYTES
    raise ValueError(f"unknown stage {stage!r}")


@dataclass
class DiskEstimate:
    """Bytes each stage of a window is expected to write, how they were estimated, or why they could not be."""

    by_stage: dict[str, int] = field(default_factory=dict)
    basis: str = ""
    error: str = ""

    @property
    def total(self) -> int:
        """Sum over the stages, in bytes."""
        return sum(self.by_stage.values())

    def describe(self) -> str:
        """One line: per-stage MiB and the basis."""
        parts = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in self.by_stage.items())
        return f"stage outputs {parts} ({self.basis})" if parts else self.error


def _host_path(h: HostConfig, path: str, run: str) -> str | None:
    """Host path of a path as a stage container sees it (relative paths: the run directory); None if not mounted."""
    if not path.startswith("/"):
        return f"{h.data_dir}/runs/{run}/{path}"
    for mount, host_dir in ((st.DATA_MOUNT, h.data_dir), (st.MODEL_MOUNT, h.model_path)):
        if path == mount or path.startswith(mount + "/"):
            return host_dir + path[len(mount):]
    return None


def estimate_disk(r: Remote, *, kind: str, run: str, pipeline_text: str) -> DiskEstimate:
    """Estimate the bytes the stages of window ``kind`` will write, from facts read before anything stops
    (read-only): the target's ``config.json``, the run's prepare manifest (exact token count) or else the dataset
    row counts × ``prepare.max_seq_len`` (an upper bound), and the pipeline config."""
    import yaml
    from importlib import resources

    from eagle3ops.config.pipeline import PipelineConfig

    h, est = r.host, DiskEstimate()
    try:
        cfg = PipelineConfig.model_validate(yaml.safe_load(pipeline_text) or {})
    except Exception as exc:  # noqa: BLE001 - pydantic or YAML error
        est.error = f"pipeline config is invalid: {exc}"
        return est
    model_dir = _host_path(h, cfg.target_model, run) or h.model_path
    out = r.run(hc.cat_if_exists(f"{model_dir}/config.json"), check=False, mutates=False)
    try:
        dims = target_dims(json.loads(out.stdout))
    except (ValueError, TypeError) as exc:
        est.error = (f"cannot read the target's {model_dir}/config.json on the host ({exc or 'missing'}); it gives "
                     f"the hidden size the disk estimate needs (target_model: {cfg.target_model})")
        return est
    rdir = f"{h.data_dir}/runs/{run}"
    if not {"prepare", "extract"} & set(st.WINDOWS[kind]):  # train window: outputs do not scale with tokens
        est.basis = f"draft head of {cfg.train.num_layers} layer(s), hidden size {dims['hidden_size']}"
        est.by_stage = {s: stage_output_bytes(s, cfg, dims, 0) for s in st.WINDOWS[kind]}
        return est
    man = r.run(hc.cat_if_exists(f"{rdir}/prepare/manifest.json"), check=False, mutates=False)
    tokens = None
    try:
        tokens = int(json.loads(man.stdout)["tokens"]) if man.stdout.strip() else None
    except (ValueError, KeyError, TypeError):
        tokens = None
    if tokens is not None:
        est.basis = f"{tokens} prepared tokens from the prepare manifest, hidden size {dims['hidden_size']}"
    else:
        rows, unknown = 0, []
        for spec in cfg.prepare.datasets:
            if spec.startswith("builtin:"):
                f = resources.files("eagle3ops.data").joinpath(f"chat_{spec.removeprefix('builtin:')}.jsonl")
                rows += len(f.read_text().splitlines()) if f.is_file() else 0
                continue
            hp = _host_path(h, spec, run)
            wc = r.run(hc.line_count(hp), check=False, mutates=False) if hp and not spec.endswith(".parquet") else None
            if wc is not None and wc.ok and wc.stdout.split():
                rows += int(wc.stdout.split()[0])
            else:
                why = (wc.stderr.strip() if wc is not None else "") or (
                    "Parquet" if hp else "not under /data or the run directory")
                unknown.append(f"{spec} ({why})")
        if unknown and not cfg.prepare.max_samples:
            est.error = (f"cannot count the rows of {'; '.join(unknown)} before the run; put the file in the run "
                         f"directory or set prepare.max_samples in the pipeline config so the hidden-state size "
                         f"can be bounded")
            return est
        if unknown:  # rows of some files unknown: max_samples bounds the count
            n = cfg.prepare.max_samples or 0
        else:
            n = min(rows, cfg.prepare.max_samples) if cfg.prepare.max_samples else rows
        tokens = n * cfg.prepare.max_seq_len
        est.basis = (f"at most {n} samples × {cfg.prepare.max_seq_len} tokens, hidden size {dims['hidden_size']}, "
                     f"4 layers × 2 bytes per value")
    for stage in st.WINDOWS[kind]:
        est.by_stage[stage] = stage_output_bytes(stage, cfg, dims, tokens)
    return est


# ---- lock -------------------------------------------------------------------------------------------------------

def acquire_lock(r: Remote, window_id: str, command: str, message: str = "") -> None:
    """Take the host's deploy lock (atomic ``mkdir``) and write who/when/what into it.

    Raises:
        LockHeld: the lock exists; the message says who holds it, since when, and the command to clear it.
        WindowError: the lock could not be created for another reason (e.g. ``Permission denied`` on ``state_dir``);
            the message quotes the host's error and says how to fix it.
    """
    p, h = paths(r.host), r.host
    fix = (f"The SSH user ({h.user or 'the login user'}) must be able to create and write {h.state_dir}: on the host "
           f"run `sudo install -d -o <ssh user> {shlex.quote(h.state_dir)}`, or set `hosts.{h.name}.state_dir` in "
           f"the inventory to a directory that user owns.")
    mk = r.run(hc.mkdir_p(p["state"]), check=False)
    if not mk.ok and not r.dry_run:
        raise WindowError(f"{h.name}: cannot create the state dir: `{render(hc.mkdir_p(p['state']))}` failed: "
                          f"{(mk.stderr or mk.stdout).strip()}. {fix}")
    res = r.run(hc.mkdir_atomic(p["lock"]), check=False)
    if not res.ok and not r.dry_run:
        if r.run(hc.test_dir(p["lock"]), check=False, mutates=False).ok:
            raise LockHeld(describe_lock(r))
        raise WindowError(f"{h.name}: cannot take the deploy lock: `{render(hc.mkdir_atomic(p['lock']))}` failed: "
                          f"{(res.stderr or res.stdout).strip() or f'exit {res.exited}'}. {fix}")
    details = {"window_id": window_id, "holder": f"{getpass.getuser()}@{socket.gethostname()}",
               "since": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": command,
               "message": message}
    r.run(hc.write_file(p["lock_details"]), stdin=json.dumps(details, indent=2))


def read_lock(r: Remote) -> dict[str, Any] | None:
    """The lock's details, or None when the host is not locked."""
    out = r.run(hc.cat_if_exists(paths(r.host)["lock_details"]), check=False, mutates=False)
    if out.ok and out.stdout.strip():
        try:
            return json.loads(out.stdout)
        except ValueError:
            return {"holder": "unknown", "raw": out.stdout}
    held = r.run(hc.test_dir(paths(r.host)["lock"]), check=False, mutates=False)
    return {"holder": "unknown (no details file)"} if held.ok else None


#: A lock whose window has no plan on the host yet is the driver's own (preflight, launch) for this long.
LAUNCH_GRACE_S = 900


def _serving_ok(result: dict[str, Any]) -> bool:
    """A window result says serving ended running and healthy (results before ``serving_healthy`` existed: running)."""
    return bool(result.get("serving_healthy", result.get("serving_running", True)))


def supervisor_alive(r: Remote, window_id: str) -> bool:
    """True while the window's supervisor container runs (or is being restarted by its restart policy)."""
    out = r.run(dk.docker(r.host, "inspect", "--format", "{{.State.Running}} {{.State.Restarting}}",
                          st.supervisor_name(window_id)), check=False, mutates=False)
    return out.ok and "true" in out.stdout.split()


def lock_is_stale(r: Remote, details: dict[str, Any]) -> bool:
    """True when the lock's holder is dead: its window's supervisor is not running, and it is not a driver still in
    preflight/launch (no plan written yet and the lock younger than :data:`LAUNCH_GRACE_S`)."""
    wid = details.get("window_id")
    if not wid:
        return True
    if supervisor_alive(r, wid):
        return False
    if r.run(hc.cat_if_exists(paths(r.host, wid)["plan"]), check=False, mutates=False).stdout.strip():
        return True
    try:
        age = (datetime.now(timezone.utc) - datetime.fromisoformat(details["since"])).total_seconds()
    except (KeyError, TypeError, ValueError):
        return True
    return age > LAUNCH_GRACE_S


def describe_lock(r: Remote) -> str:
    """Human text about the current lock, with the exact command to clear a stale one."""
    d = read_lock(r)
    if d is None:
        return f"{r.host.name}: the deploy lock is free (it was released meanwhile); run the command again"
    stale = lock_is_stale(r, d)
    text = (f"{r.host.name}: deploy lock held by {d.get('holder')} since {d.get('since', '?')} "
            f"for `{d.get('command', '?')}` (window {d.get('window_id', '?')})")
    res = r.run(hc.cat_if_exists(paths(r.host, d["window_id"])["result"]), check=False, mutates=False).stdout \
        if d.get("window_id") else ""
    if stale and res.strip() and not _serving_ok(json.loads(res)):
        text += (f". That window ended with serving NOT running and kept the lock: {hint('recover', r.host.name)} "
                 f"retries the restore.")
    elif stale:
        text += (f". Its supervisor is not running, so the lock looks stale: check {hint('status', r.host.name)}"
                 f", then clear it with {hint('lock', 'release', r.host.name, '--force')}.")
    else:
        text += f". That window is still running: follow it with {hint('attach', r.host.name)}."
    return text


def release_lock(r: Remote, window_id: str | None = None) -> None:
    """Remove the lock (only if held by ``window_id`` when given)."""
    if window_id is not None:
        d = read_lock(r)
        if d and d.get("window_id") != window_id:
            return
    r.run(hc.rm_rf(paths(r.host)["lock"]))


# ---- preflight --------------------------------------------------------------------------------------------------

@dataclass
class Preflight:
    """Results of the read-only checks made before anything stops."""

    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    #: Name of the serving container the run will manage (see :func:`serving_container`).
    serving_container: str = ""

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


def preflight(r: Remote, *, image: str, expected_image_id: str | None, need_bytes: int = 0,
              need_serving: bool = True, disk: DiskEstimate | None = None) -> Preflight:
    """Read-only host checks: engine, image id, model path, free disk, GPUs, serving container.

    Args:
        image: pipeline image reference that must be present on the host.
        expected_image_id: ``sha256:...`` it must have (None: presence only).
        need_bytes: further bytes the run will write into ``data_dir`` (on top of ``disk`` and ``min_free_gib``).
        disk: the stages' estimated output (:func:`estimate_disk`); an estimate that could not be made fails the
            ``free space`` check with its reason.
    """
    h, pf = r.host, Preflight()
    v = r.run(dk.version(h), check=False, mutates=False)
    pf.add("docker engine", v.ok, v.stdout.strip() or v.stderr.strip()[-200:])
    got = r.run(dk.image_id(h, image), check=False, mutates=False)
    got_id = got.stdout.strip()
    if not got.ok:
        pf.add("pipeline image", False, f"{image} is not on the host: run {hint('deploy', h.name)} first")
    elif expected_image_id and got_id != expected_image_id:
        pf.add("pipeline image", False, f"{image} on host has id {got_id[:19]}, expected {expected_image_id[:19]}: "
                                         f"redeploy with {hint('deploy', h.name)}")
    else:
        pf.add("pipeline image", True, got_id[:19])
    m = r.run(hc.test_dir(h.model_path), check=False, mutates=False)
    pf.add("model path", m.ok, h.model_path if m.ok else f"{h.model_path} is not a directory on the host")
    has_data_dir = r.run(hc.test_dir(h.data_dir), check=False, mutates=False).ok
    # df on the data dir, or on the state dir's filesystem while the data dir does not exist yet (created at launch).
    df = r.run(hc.free_bytes(h.data_dir if has_data_dir else "/"), check=False, mutates=False)
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
    if h.gpus:
        g = r.run(hc.gpu_list(), check=False, mutates=False)
        n = len([ln for ln in g.stdout.splitlines() if ln.startswith("GPU ")])
        pf.add("gpus", g.ok and n >= h.gpus, f"{n} visible, inventory says {h.gpus}")
    else:
        pf.add("gpus", True, "none (CPU host)")
    names, found = serving_container(r)
    pf.serving_container = names[0] if names else sv.default_name(h.serving)
    if len(names) > 1:
        pf.add("serving container", False, f"{found} matches {len(names)} containers ({', '.join(names)}); "
                                           f"eagle3ops manages one serving container: scale the service to 1")
    elif need_serving:
        s = r.run(dk.docker(h, "inspect", "--format", "{{.State.Status}}", pf.serving_container),
                  check=False, mutates=False) if names else None
        pf.add("serving container", bool(s and s.ok and s.stdout.strip() == "running"),
               f"{pf.serving_container}: {s.stdout.strip()}" if s and s.ok else f"no container for {found}")
    return pf


def serving_container(r: Remote) -> tuple[list[str], str]:
    """Find the host's serving container (read-only).

    Returns:
        (names found, what was looked for): kind ``container`` looks up its name, kind ``compose`` the
        container(s) carrying the service's Compose labels. An empty list: no such container (callers then use
        :func:`eagle3ops.commands.serving.default_name`).
    """
    s = r.host.serving
    what = (f"Compose service {s.compose_project}/{s.compose_service}" if s.kind == "compose"
            else f"container {s.container!r}")
    out = r.run(sv.find_container_argv(r.host), check=False, mutates=False)
    names = [n for n in out.stdout.split() if n] if out.ok else []
    return names, what


# ---- running a plan ---------------------------------------------------------------------------------------------

def health_check(h: HostConfig) -> HealthCheck:
    """The health gate settings for the host's serving."""
    return HealthCheck(port=h.serving.port, model=h.serving.served_model_name, timeout_s=h.serving.health_timeout_s)


def build_plan(h: HostConfig, *, kind: str, window_id: str, image: str, command: str, run: str = "default",
               stages: list[str] | None = None, new_spec: dict[str, Any] | None = None,
               to_release: int | None = None, user: str = "", serving_container: str | None = None) -> Plan:
    """The :class:`~eagle3ops.supervisor.Plan` for a window (pure).

    ``serving_container``: the container name found on the host (default: :func:`sv.default_name`);
    a new release's container gets the same name, so the next window finds it again.
    """
    name = serving_container or sv.default_name(h.serving)
    if new_spec is not None:
        new_spec = {**new_spec, "name": name}
    steps = [StageStep(name=s, spec=st.stage_spec(h, image=image, stage=s, run=run, window_id=window_id),
                       timeout_s=h.stage_timeout_s) for s in (stages or [])]
    return Plan(window_id=window_id, kind=kind, host=h.name, user=user or getpass.getuser(), command=command,
                state_dir=h.state_dir, serving_container=name, stop_timeout_s=h.serving.stop_timeout_s,
                stages=steps, budget_s=h.maintenance_budget_s, health=health_check(h), new_spec=new_spec,
                to_release=to_release, gpus=h.gpus)


def supervisor_commands(h: HostConfig, plan: Plan) -> list[list[str]]:
    """What the host-side supervisor will do, as equivalent ``docker`` argv lists (for ``--dry-run``).

    The supervisor uses the docker SDK, not the CLI; these are the CLI commands with the same effect.
    """
    cmds: list[list[str]] = []
    if plan.kind == "window":
        cmds.append(dk.docker(h, "stop", "--time", str(plan.stop_timeout_s), plan.serving_container))
        for step in plan.stages:
            cmds.append(sv.run_argv(h, {**step.spec, "restart_policy": {}}))
        cmds.append(dk.docker(h, "start", plan.serving_container))
    else:
        spec = plan.new_spec if plan.kind == "release" else {"image": f"<image of release {plan.to_release or 'live before the current one'}>",
                                                             "name": plan.serving_container, "command": []}
        cmds.append(dk.rm(h, plan.serving_container, force=True))
        cmds.append(sv.run_argv(h, spec))
    port = plan.health.port
    cmds.append(["GET", f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}/v1/models",
                 f"POST http://127.0.0.1:{port}/v1/completions"])
    return cmds


def launch(r: Remote, plan: Plan, image: str) -> None:
    """Write the plan on the host and start the detached supervisor container."""
    p = paths(r.host, plan.window_id)
    r.run(hc.mkdir_p(r.host.data_dir))
    r.run(hc.mkdir_p(p["window"]))
    r.run(hc.write_file(p["plan"]), stdin=plan.model_dump_json(indent=2))
    r.run(st.supervisor_argv(r.host, image=image, window_id=plan.window_id, plan_path=p["plan"]))


#: Seconds a supervisor must stay not running (and without a result) before the driver reports it dead; covers a
#: restart by its restart policy (Docker engine restart) and the moment between result.json and its exit.
DEAD_GRACE_S = 10.0
#: Seconds added to a window's own limits (budget, gates) before the driver stops watching.
WATCH_MARGIN_S = 900.0
#: Watch limit (seconds) when the window's plan cannot be read.
WATCH_FALLBACK_S = 24 * 3600.0


def supervisor_state(r: Remote, window_id: str) -> str | None:
    """State of the window's supervisor container: ``running``, ``restarting``, ``exited``, ``created``, ``dead``...,
    ``missing`` (no such container), or None when it cannot be told (engine or host not answering)."""
    out = r.run(dk.container_status(r.host, st.supervisor_name(window_id)), check=False, mutates=False)
    if out.ok:
        return out.stdout.strip() or None
    return "missing" if "no such" in (out.stderr + out.stdout).lower() else None


def watch_limit_s(plan: dict[str, Any]) -> float:
    """How long (seconds) a driver watches a window before giving up: the window's budget (whole downtime), the
    record gate, the graceful stop, up to four gates past the budget (restore + three rollbacks,
    :data:`eagle3ops.supervisor.MIN_GATE_S` each) and :data:`WATCH_MARGIN_S`."""
    return (float(plan.get("budget_s", 7200.0)) + RECORD_GATE_S + float(plan.get("stop_timeout_s", 120))
            + 4 * MIN_GATE_S + WATCH_MARGIN_S)


def watch(r: Remote, window_id: str, *, on_event: Callable[[dict[str, Any]], None] | None = None,
          poll_s: float = 2.0, timeout_s: float | None = None, dead_grace_s: float | None = None) -> dict[str, Any]:
    """Follow a window's journal until ``result.json`` appears; return the result.

    Survives SSH drops (reconnects on the next poll). Every poll without a result also checks that the supervisor
    container is alive: one that stays not running for ``dead_grace_s`` seconds (default :data:`DEAD_GRACE_S`;
    killed, or removed) is reported at
    once with the command that recovers the window. The whole wait is bounded by ``timeout_s`` (seconds; default
    :func:`watch_limit_s` of the window's plan).

    Raises:
        SupervisorDead: the supervisor is not running and the window has no result (serving may be stopped).
        WindowError: no result within ``timeout_s``; the window may go on on the host.
    """
    p = paths(r.host, window_id)
    seen = 0
    t0 = time.monotonic()
    dead_since: float | None = None
    dead_grace_s = DEAD_GRACE_S if dead_grace_s is None else dead_grace_s
    recover = hint("recover", r.host.name)
    if timeout_s is None:
        try:
            out = r.run(hc.cat_if_exists(p["plan"]), check=False, mutates=False)
            timeout_s = watch_limit_s(json.loads(out.stdout)) if out.stdout.strip() else WATCH_FALLBACK_S
        except (RemoteError, OSError, ValueError):
            timeout_s = WATCH_FALLBACK_S

    def result() -> dict[str, Any] | None:
        res = r.run(hc.cat_if_exists(p["result"]), check=False, mutates=False)
        return json.loads(res.stdout) if res.ok and res.stdout.strip() else None

    while True:
        try:
            out = r.run(hc.tail_from(p["journal"], seen + 1), check=False, mutates=False)
            for line in out.stdout.splitlines():
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                seen += 1
                if on_event:
                    on_event(ev)
            done = result()
            if done is not None:
                return done
            state = supervisor_state(r, window_id)
            if state in ("running", "restarting", None):  # None: cannot tell now (engine restart): keep watching
                dead_since = None
            else:
                now = time.monotonic()
                dead_since = now if dead_since is None else dead_since
                if now - dead_since >= dead_grace_s:
                    done = result()  # it may have written the result just before it exited
                    if done is not None:
                        return done
                    raise SupervisorDead(
                        f"{r.host.name}: the supervisor of window {window_id} is not running (container "
                        f"{st.supervisor_name(window_id)}: {state}) and the window has no result: serving may be "
                        f"stopped. Run {recover} now: it restarts the supervisor, which skips finished stages and "
                        f"restores serving.")
        except (RemoteError, OSError) as exc:  # transient (SSH drop, host busy): keep watching
            if on_event:
                on_event({"step": "driver", "event": "warn", "reason": f"watch: {exc}"})
        if time.monotonic() - t0 > timeout_s:
            raise WindowError(f"window {window_id} did not finish within {timeout_s:.0f}s of watching; it may go on "
                              f"on the host: {hint('attach', r.host.name)}; if its supervisor died, {recover}")
        time.sleep(poll_s)


def cleanup_supervisor(r: Remote, window_id: str) -> str | None:
    """Remove the finished supervisor container; returns a warning text (whole, never cut) instead of raising."""
    res = r.run(dk.rm(r.host, st.supervisor_name(window_id), force=True), check=False)
    name = st.supervisor_name(window_id)
    gone = "no such container" in (res.stderr + res.stdout).lower()  # removed earlier (attach, recover)
    return None if res.ok or gone else (f"cleanup: could not remove supervisor container {name}: "
                                f"{(res.stderr or res.stdout).strip()}; remove it with "
                                f"`{render(dk.rm(r.host, name, force=True))}`")


def finish_window(r: Remote, window_id: str, result: dict[str, Any], *, command: str = "") -> dict[str, Any]:
    """After a window's result: remove its supervisor container and record every driver-side warning, whole, in
    the window's ``result.json`` (rewritten atomically) and in an audit entry of the window. Returns the result
    with ``window_id`` and the warnings added. Recording errors become warnings of the returned result."""
    result = {**result, "window_id": window_id}
    warn = cleanup_supervisor(r, window_id)
    if not warn:
        return result
    result["warnings"] = [*(result.get("warnings") or []), warn]
    p = paths(r.host, window_id)
    try:
        r.run(hc.write_file(p["result"] + ".tmp"), stdin=json.dumps(result, indent=2))
        r.run(hc.mv(p["result"] + ".tmp", p["result"]))
        append_audit(r, {"user": getpass.getuser(), "host": r.host.name, "command": command or result.get("kind", ""),
                         "window": window_id, "outcome": result.get("outcome"), "error": result.get("error", ""),
                         "release": result.get("release"), "warnings": [warn], "by": "driver"})
    except (RemoteError, OSError) as exc:
        result["warnings"].append(f"could not record the warning above on the host: {exc}")
    return result


def relaunch(r: Remote, window_id: str, fallback_image: str | None = None) -> bool:
    """Restart the supervisor of an interrupted window, which resumes from its journal (done stages are skipped,
    serving is restored and health-gated). Returns False, doing nothing, when the window already has a result
    with serving running; a result that says serving is *not* running is moved aside and the restore retried.

    The supervisor image is the one the window's stages ran in (``fallback_image`` for release/rollback plans).

    Raises:
        WindowError: the supervisor still runs (use ``attach``), the window does not hold the host's lock (it never
            started, or another run holds it), or a plan without stages and no ``fallback_image``.
        RemoteError: the plan cannot be read or the supervisor cannot be started.
    """
    h, p = r.host, paths(r.host, window_id)
    res = r.run(hc.cat_if_exists(p["result"]), check=False, mutates=False).stdout
    if res.strip() and _serving_ok(json.loads(res)):
        return False
    if supervisor_alive(r, window_id):
        raise WindowError(f"window {window_id}: its supervisor is still running; follow it with "
                          f"{hint('attach', h.name)}")
    lock = read_lock(r)
    if not lock or lock.get("window_id") != window_id:
        holder = f"the lock is held by window {lock.get('window_id')}" if lock else "the lock is free"
        raise WindowError(f"window {window_id} does not hold the lock of {h.name} ({holder}): it never started "
                          f"or it finished; nothing to recover")
    plan = json.loads(r.run(hc.cat(p["plan"]), mutates=False).stdout)
    image = plan["stages"][0]["spec"]["image"] if plan["stages"] else fallback_image
    if not image:
        raise WindowError(f"window {window_id} has no stages and no deployed image to run its supervisor with")
    if res.strip():
        r.run(hc.mv(p["result"], f"{p['result']}.{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"))
    r.run(dk.rm(h, st.supervisor_name(window_id), force=True), check=False)
    r.run(st.supervisor_argv(h, image=image, window_id=window_id, plan_path=p["plan"]))
    return True


def latest_window(r: Remote) -> str | None:
    """Id of the newest window on the host (ids sort by time)."""
    out = r.run(hc.ls(paths(r.host)["windows"]), check=False, mutates=False)
    names = sorted(n for n in out.stdout.split() if n)
    return names[-1] if names else None


def audit_entries(r: Remote) -> list[dict[str, Any]]:
    """The host's audit log."""
    out = r.run(hc.cat_if_exists(paths(r.host)["audit"]), check=False, mutates=False)
    return [json.loads(ln) for ln in out.stdout.splitlines() if ln.strip()]


def append_audit(r: Remote, entry: dict[str, Any]) -> None:
    """Append one audit line from the driver (for windows that never reached the supervisor)."""
    entry = {"t": datetime.now(timezone.utc).isoformat(timespec="seconds"), **entry}
    r.run(hc.mkdir_p(r.host.state_dir))
    r.run(hc.append_file(paths(r.host)["audit"]), stdin=json.dumps(entry) + "\n")


def run_window(r: Remote, *, kind: str, image: str, expected_image_id: str | None, command: str,
               run: str = "default", new_spec: dict[str, Any] | None = None, to_release: int | None = None,
               need_bytes: int = 0, on_event: Callable[[dict[str, Any]], None] | None = None,
               message: str = "", pipeline_text: str | None = None) -> dict[str, Any]:
    """One maintenance window end to end (driver side).

    ``kind`` is ``extract`` / ``train`` (stages from :data:`eagle3ops.commands.stages.WINDOWS`), ``release`` or
    ``rollback``. Returns the supervisor's ``result.json`` (``outcome``, ``downtime_s``, ``stage_seconds``...).

    ``pipeline_text``: the run's pipeline config (YAML). It is written to ``<data_dir>/runs/<run>/pipeline.yaml``
    only under the lock, after preflight passed (every write to a host happens then), and it drives the disk
    estimate of the stages (:func:`estimate_disk`) that preflight checks against free space.

    Raises:
        LockHeld: another run holds the lock (nothing done).
        WindowError: the lock could not be taken (the message names the host's error and the fix), or the driver
            failed after the window started.
        PreflightFailed: a check failed (nothing stopped; lock released; audit entry written).
        SupervisorDead: the supervisor died without a result (the message gives the recover command).
    """
    window_id = new_window_id(kind)
    if r.dry_run and read_lock(r):
        raise LockHeld(describe_lock(r))
    acquire_lock(r, window_id, command, message)
    try:
        disk = estimate_disk(r, kind=kind, run=run, pipeline_text=pipeline_text) \
            if pipeline_text is not None and kind in st.WINDOWS else None
        pf = preflight(r, image=image, expected_image_id=expected_image_id, need_bytes=need_bytes,
                       need_serving=kind in st.WINDOWS, disk=disk)
        if on_event:
            for name, ok, detail in pf.checks:
                on_event({"step": "preflight", "event": "ok" if ok else "error", "check": name, "detail": detail})
        if not pf.ok and not r.dry_run:
            raise PreflightFailed(f"{r.host.name}: preflight failed, nothing was stopped:\n{pf.failures()}")
        plan_kind = "window" if kind in st.WINDOWS else kind
        plan = build_plan(r.host, kind=plan_kind, window_id=window_id, image=image, command=command, run=run,
                          stages=st.WINDOWS.get(kind), new_spec=new_spec, to_release=to_release,
                          serving_container=pf.serving_container)
        if pipeline_text is not None:  # under the lock, after preflight: a refused run changes nothing on the host
            upload_pipeline_config(r, run, pipeline_text)
        launch(r, plan, image)
    except BaseException as exc:
        started = None if r.dry_run else _started(r, window_id)
        if started:
            raise WindowError(f"{r.host.name}: the driver failed after window {window_id} started on the host "
                              f"({exc}); it goes on there: {hint('attach', r.host.name)}") from exc
        if started is False:
            release_lock(r, window_id)
            append_audit(r, {"user": getpass.getuser(), "host": r.host.name, "command": command,
                             "window": window_id, "outcome": "not started", "error": str(exc)[-500:]})
        raise
    if r.dry_run:
        on_host = supervisor_commands(r.host, plan)
        if r.echo:
            r.echo("# then, on the host, the supervisor (docker SDK) does the equivalent of:")
            for argv in on_host:
                r.echo("#   " + render(argv))
        if not pf.ok:
            raise PreflightFailed(f"{r.host.name}: preflight would fail, so a real run would stop before anything "
                                  f"is stopped:\n{pf.failures()}")
        return {"window_id": window_id, "outcome": "dry-run", "commands": list(r.history),
                "supervisor_commands": on_host}
    result = watch(r, window_id, on_event=on_event)
    return finish_window(r, window_id, result, command=command)


def _started(r: Remote, window_id: str) -> bool | None:
    """Whether the window's supervisor container exists (the window runs on the host and owns the lock); None when
    the host cannot be asked (the lock then stays; stale detection reports it later)."""
    try:
        return r.run(dk.docker(r.host, "inspect", "--format", "{{.Id}}", st.supervisor_name(window_id)),
                     check=False, mutates=False).ok
    except Exception:  # noqa: BLE001 - host unreachable
        return None


def upload_pipeline_config(r: Remote, run: str, text: str) -> str:
    """Write a pipeline config (YAML text) as ``<data_dir>/runs/<run>/pipeline.yaml`` on the host; returns the path.

    A write to the host: call it only while holding the lock (``run_window(pipeline_text=...)`` does, after
    preflight); a run refused by the lock must not change a running window's input.
    """
    rdir = f"{r.host.data_dir}/runs/{run}"
    r.run(hc.mkdir_p(rdir))
    r.run(hc.write_file(f"{rdir}/pipeline.yaml"), stdin=text)
    return f"{rdir}/pipeline.yaml"


def serving_release_spec(h: HostConfig, extra_args: list[str]) -> dict[str, Any]:
    """Spec of a new serving release from the inventory plus ``extra_args`` (release number set on the host)."""
    return sv.container_spec(h, release=0, extra_args=extra_args)
