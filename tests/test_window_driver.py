"""Driver side of a window against a stand-in host: a small in-memory host that
answers the argv lists :mod:`eagle3ops.window` sends (files, ``mkdir``, ``df``, ``docker``) the way a POSIX host and
the Docker CLI do. No SSH, no engine: the real-host versions of these paths are in ``test_window_faults.py``.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3ops.window import common as wcommon
from eagle3ops.window import lock as wlock
from eagle3ops.window import preflight as wpreflight
from eagle3ops.window import run as wrun
from eagle3ops.window import watch as wwatch
from eagle3ops.config import load_inventory
from eagle3ops.commands.types import is_read
from eagle3ops.remote import RemoteCommandError, Result, render

REPO = Path(__file__).resolve().parents[1]
IMAGE, IMAGE_ID = "eagle3ops/pipeline:t", "sha256:" + "a" * 64
TINY = """target_model: /model
prepare: {datasets: [builtin:sharegpt], max_seq_len: 256, max_samples: 8}
"""


class Launched(Exception):
    """The driver started the supervisor (the window would stop serving now)."""


class StandInHost:
    """Files and directories of a host, a free-space figure, and the states of its containers."""

    def __init__(self, host, *, free_bytes=50 * 2**30, hidden_size=64, vocab_size=512):
        self.host, self.free_bytes = host, free_bytes
        self.files: dict[str, str] = {}
        self.dirs: set[str] = {"/"}
        self.readonly: set[str] = set()  # directories the SSH user cannot create entries in
        self.containers: dict[str, str] = {}  # name -> state
        self.inspects: dict[str, dict] = {}  # name -> its `docker container inspect` object
        self.rm_error = ""  # stderr of a failing `docker rm`
        self.on_launch = None
        self.trials: list[list[str]] = []  # argv of each throwaway stage container (docker run --rm)
        self.trial_answer = (0, "mounts ok\n", "")
        self.writes: list[str] = []  # rendered argv of each mutating command
        self.served_vllm: str | None = "0.16.0+cpu"  # serving's GET /version (None: it does not answer)
        self.served_models: list[str] | None = None  # serving's GET /v1/models ids (None: curl -f fails, unjudged)
        model = host.model_path
        self._mkdirs(model)
        self.files[f"{model}/config.json"] = json.dumps(
            {"hidden_size": hidden_size, "intermediate_size": 4 * hidden_size, "vocab_size": vocab_size})

    def _mkdirs(self, path):
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            self.dirs.add("/" + "/".join(parts[:i]))

    def _parent_writable(self, path):
        parent = path.rsplit("/", 1)[0] or "/"
        return parent not in self.readonly and parent in self.dirs

    def __call__(self, argv, stdin):
        a = list(argv)
        if a[0] == "docker":
            a = a[3:] if a[1] == "-H" else a[1:]
            return self._docker(a)
        if a[:3] == ["sh", "-c", 'umask 077 && exec tee "$1"']:  # hc.write_private_file: a tee, mode 0600
            a = ["tee", a[-1]]
        cmd = a[0]
        if cmd == "mkdir" and a[1] == "-p":
            if a[2] in self.dirs:
                return 0, "", ""
            if any(a[2].startswith(ro + "/") for ro in self.readonly):
                return 1, "", f"mkdir: cannot create directory '{a[2]}': Permission denied"
            self._mkdirs(a[2])
            return 0, "", ""
        if cmd == "mkdir":
            if a[1] in self.dirs:
                return 1, "", f"mkdir: cannot create directory '{a[1]}': File exists"
            if not self._parent_writable(a[1]):
                return 1, "", f"mkdir: cannot create directory '{a[1]}': Permission denied"
            self.dirs.add(a[1])
            return 0, "", ""
        if cmd == "tee":
            path = a[-1]
            data = stdin.decode() if isinstance(stdin, bytes) else (stdin or "")
            self.files[path] = (self.files.get(path, "") if a[1] == "-a" else "") + data
            return 0, data, ""
        if cmd == "mv":
            self.files[a[-1]] = self.files.pop(a[-2])
            return 0, "", ""
        if cmd == "find" and "-type" in a and a[a.index("-exec") + 1] == "wc":  # file sizes under a directory
            root = a[1].rstrip("/") + "/"
            hits = {f: v for f, v in self.files.items() if f.startswith(root)}
            return (0 if hits else 1), "".join(f"{len(v.encode())} {f}\n" for f, v in hits.items()), ""
        if cmd in ("cat", "find"):
            path = a[1]
            return (0, self.files[path], "") if path in self.files else (1, "", f"{cmd}: {path}: No such file")
        if cmd == "tail":
            path, start = a[-1], int(a[2].lstrip("+"))
            if path not in self.files:
                return 1, "", "tail: no such file"
            return 0, "".join(self.files[path].splitlines(True)[start - 1:]), ""
        if cmd == "test":
            return (0 if a[2] in self.dirs else 1), "", ""
        if cmd == "rm":
            path = a[-1]
            self.dirs = {d for d in self.dirs if d != path and not d.startswith(path + "/")}
            self.files = {f: v for f, v in self.files.items() if not f.startswith(path + "/")}
            return 0, "", ""
        if cmd == "ls":  # the names in a directory (e.g. preflight's look at the retained releases)
            root = a[-1].rstrip("/") + "/"
            names = sorted({p[len(root):].split("/")[0] for p in [*self.files, *self.dirs] if p.startswith(root)})
            return (0, "".join(f"{n}\n" for n in names), "") if names or a[-1] in self.dirs else \
                (2, "", f"ls: cannot access '{a[-1]}': No such file or directory")
        if cmd == "df":
            return 0, ("Filesystem 1024-blocks Used Available Capacity Mounted on\n"
                       f"/dev/x 99999999 1 {self.free_bytes // 1024} 1% /\n"), ""
        if cmd == "wc":
            path = a[-1]
            return (0, f"{len(self.files[path].splitlines())} {path}\n", "") if path in self.files else \
                (1, "", f"wc: {path}: No such file")
        if cmd == "curl" and a[-1].endswith("/version"):  # hc.http_body: serving's vLLM version
            return (0, json.dumps({"version": self.served_vllm}), "") if self.served_vllm else (22, "", "")
        if cmd == "curl" and a[-1].endswith("/v1/models"):  # hc.http_body: the models serving lists
            return ((0, json.dumps({"data": [{"id": m} for m in self.served_models]}), "")
                    if self.served_models is not None else (22, "", ""))
        if a[:2] == ["sh", "-c"] and a[3] == "eagle3ops-logind":  # process/systemd preflight: a host without logind
            return 0, "user=e3ops\nlogind=absent\n", ""
        if a[:2] == ["sh", "-c"] and a[3] == "eagle3ops-dropin-check":  # systemd: the unit's drop-in is writable
            return 0, "", ""
        raise AssertionError(f"unexpected command {a}")

    def _docker(self, a):
        if a[0] == "version":
            return 0, "27.0.0\n", ""
        if a[:2] == ["image", "inspect"]:
            return 0, IMAGE_ID + "\n", ""
        if a[0] == "ps":
            return 0, self.host.serving.container + "\n", ""
        if a[0] in ("inspect", "container"):
            name = a[-1]
            if name not in self.containers:
                return 1, "", f"Error: No such object: {name}"
            if "--format" not in a:  # the whole inspect
                return 0, json.dumps([self.inspects.get(name, {})]), ""
            fmt = a[a.index("--format") + 1]
            if fmt == "{{.State.Running}} {{.State.Restarting}}":
                return 0, f"{str(self.containers[name] == 'running').lower()} false\n", ""
            if fmt == "{{.Id}}":
                return 0, "cid\n", ""
            if fmt == "{{json .Config.Env}}":
                return 0, json.dumps((self.inspects.get(name, {}).get("Config") or {}).get("Env") or []) + "\n", ""
            return 0, self.containers[name] + "\n", ""
        if a[0] == "run" and a[1] == "--rm":  # preflight's throwaway stage container: runs and is gone
            self.trials.append(a)
            return self.trial_answer
        if a[0] == "run":
            name = a[a.index("--name") + 1]
            self.containers[name] = "running"
            if self.on_launch:
                self.on_launch(name)
            return 0, "cid\n", ""
        if a[0] == "rm":
            if self.rm_error:
                return 1, "", self.rm_error
            self.containers.pop(a[-1], None)
            return 0, "", ""
        raise AssertionError(f"unexpected docker command {a}")


class StandInRemote:
    """The :class:`eagle3ops.remote.Remote` interface over a :class:`StandInHost`."""

    def __init__(self, host, world, dry_run=False):
        self.host, self.world, self.dry_run, self.echo, self.history = host, world, dry_run, None, []
        self.changes: list[str] = []  # as Remote's: the rendered commands that are not a Read

    def run(self, argv, *, check=True, timeout=None, stdin=None, stream=None):
        cmd = render(argv)
        self.history.append(cmd)
        changes = not is_read(argv)  # as Remote: the command's type decides
        if changes:
            self.changes.append(cmd)
        if self.dry_run and changes:  # a dry run prints what changes the host, runs only what reads
            return Result(list(argv), 0)
        if changes:
            self.world.writes.append(cmd)
        code, out, err = self.world(argv, stdin)
        if check and code:
            raise RemoteCommandError(self.host.name, argv, code, out, err)
        return Result(list(argv), code, out, err)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


@pytest.fixture
def host():
    return load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")


def _host_with_serving(host, **kw):
    world = StandInHost(host, **kw)
    world.containers[host.serving.container] = "running"
    world._mkdirs(host.data_dir)
    world.files[f"{host.state_dir}/deployed.json"] = json.dumps({"image": IMAGE, "image_id": IMAGE_ID})
    world._mkdirs(host.state_dir)
    return world


def _cli(monkeypatch, world, *args):
    """Run the real CLI with its Remote replaced by the stand-in host."""
    from eagle3ops import cli, cli_common

    monkeypatch.setattr(cli_common, "remote",
                        lambda h, dry_run=False, json_out=False: StandInRemote(h, world, dry_run))
    return CliRunner().invoke(cli.app, [*args, "--inventory", str(REPO / "deploy/hosts.yaml")])


# ---- the lock and the order of writes ----------------------------------------------------------------------------

def test_refused_run_does_not_touch_a_running_windows_pipeline_config(host, monkeypatch, tmp_path):
    """`extract` while another window holds the lock refuses and leaves that run's pipeline.yaml alone
    (main uploaded it before taking the lock)."""
    world = _host_with_serving(host)
    run_cfg = f"{host.data_dir}/runs/default/pipeline.yaml"
    world.files[run_cfg] = "the running window's input\n"
    world.dirs.add(f"{host.state_dir}/lock")
    world.files[f"{host.state_dir}/lock/details.json"] = json.dumps(
        {"window_id": "20990101T000000Z-extract-abcdef", "holder": "alice@laptop", "since": "2099-01-01T00:00:00",
         "command": "eagle3ops extract sandbox"})
    world.containers["eagle3ops-supervisor-20990101T000000Z-extract-abcdef"] = "running"
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(TINY)
    out = _cli(monkeypatch, world, "extract", "sandbox", "--pipeline", str(pipeline))
    assert out.exit_code != 0 and "alice@laptop" in out.output, out.output
    assert world.files[run_cfg] == "the running window's input\n"
    assert not [w for w in world.writes if "pipeline.yaml" in w], world.writes


def test_pipeline_config_is_written_after_preflight_under_the_lock(host):
    """The order of writes of a window: lock, then (after preflight) the pipeline config, plan, supervisor."""
    world = _host_with_serving(host)

    def launched(name):
        raise Launched(name)

    world.on_launch = launched
    r = StandInRemote(host, world)
    with pytest.raises(wcommon.WindowError, match="started on the host"):
        wrun.run_window(r, kind="extract", image=IMAGE, expected_image_id=IMAGE_ID, command="t", run="r1",
                        pipeline_text=TINY)
    writes = world.writes
    lock = next(i for i, w in enumerate(writes) if w == f"mkdir {host.state_dir}/lock")
    cfg = next(i for i, w in enumerate(writes) if w.endswith("runs/r1/pipeline.yaml"))
    sup = next(i for i, w in enumerate(writes) if "eagle3ops-supervisor-" in w and " run " in w)
    assert lock < cfg < sup


def test_stages_inherit_the_nccl_and_cuda_environment_of_live_serving(host):
    """Plan level (no GPU here): serving was started with NCCL settings its host needs (NCCL_P2P_DISABLE=1: PCIe
    P2P hangs on RTX PRO 6000 hosts); the stages of a window inherit serving's NCCL_*/CUDA_* environment as the
    preflight read it from the live container, the inventory's stage_env winning, and --dry-run shows it. The
    serving container's environment is faked (its ``docker inspect``); the preflight, planner and preview are real."""
    h = host.model_copy(update={"stage_env": {"NCCL_IB_DISABLE": "0"}})
    world = _host_with_serving(h)
    world.inspects[h.serving.container] = {"Config": {"Env": [
        "NCCL_P2P_DISABLE=1", "NCCL_IB_DISABLE=1", "CUDA_DEVICE_MAX_CONNECTIONS=1", "CUDA_VISIBLE_DEVICES=0,1",
        "CUDA_VERSION=12.9.1", "HF_TOKEN=hf_not_inherited", "PATH=/usr/bin"]}}
    r, events = StandInRemote(h, world, dry_run=True), []
    res = wrun.run_window(r, kind="extract", image=IMAGE, expected_image_id=IMAGE_ID, command="t", run="r1",
                          pipeline_text=TINY, on_event=events.append)
    said = [e["detail"] for e in events if e.get("check") == "stage environment"]
    assert said and "NCCL_P2P_DISABLE=1" in said[0] and "serving container" in said[0], events
    stage = next(c for c in res["supervisor_commands"] if "eagle3ops-" in " ".join(c) and "stage" in c)
    env = {stage[i + 1].split("=", 1)[0]: stage[i + 1].split("=", 1)[1] for i, a in enumerate(stage) if a == "--env"}
    assert env["NCCL_P2P_DISABLE"] == "1" and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1", stage
    assert env["NCCL_IB_DISABLE"] == "0", "the inventory's stage_env wins"
    assert not {"CUDA_VISIBLE_DEVICES", "CUDA_VERSION", "HF_TOKEN", "PATH"} & set(env), env


# ---- the disk the stages will need -------------------------------------------------------------------------------

def test_preflight_refuses_hidden_states_that_cannot_fit(host, monkeypatch, tmp_path):
    """A 50 MB data dir and ~75 MB of hidden states: preflight fails before anything stops (main said
    "need 0.0 GiB", stopped serving and extract died later)."""
    # 2,300 rows, at most 600 kept, × 2,048 tokens × 4 layers × 8 hidden × 2 bytes ≈ 75 MiB of hidden states
    world = _host_with_serving(host, free_bytes=50 * 10**6, hidden_size=8)
    world.on_launch = lambda name: (_ for _ in ()).throw(Launched(name))
    small = host.model_copy(update={"min_free_gib": 0.0})
    monkeypatch.setattr("eagle3ops.cli_common.load_host", lambda inv, name: small)
    ds = f"{host.data_dir}/runs/big/chats.jsonl"
    world.files[ds] = "{}\n" * 2300
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text("target_model: /model\nprepare: {datasets: [chats.jsonl], max_seq_len: 2048, "
                        "max_samples: 600}\n")
    out = _cli(monkeypatch, world, "extract", "sandbox", "--run", "big", "--pipeline", str(pipeline))
    assert not any("eagle3ops-supervisor-" in w and " run " in w for w in world.writes), "serving would stop"
    assert out.exit_code != 0 and "free space" in out.output, out.output
    assert "extract" in out.output and "MiB" in out.output, out.output


def test_stage_output_estimates():
    """Hidden states are tokens × 4·H·2 bytes; train keeps keep_checkpoints + 1 checkpoints (and, choosing the
    checkpoint by held-out acceptance, two fp32 copies of the best weights)."""
    from eagle3ops.config.pipeline import PipelineConfig

    cfg = PipelineConfig.model_validate({"target_model": "/model", "train": {"keep_checkpoints": 2}})
    dims = {"hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256}
    assert wpreflight.stage_output_bytes("extract", cfg, dims, 1000) == 1000 * 4 * 4096 * 2 + 1000 * 16
    trainable, frozen = wpreflight.draft_param_count(dims, num_layers=1, draft_vocab_size=32000)
    assert frozen == 2 * 128256 * 4096
    want = (trainable * 12 + frozen * 4) * 3 + (trainable + frozen) * 2
    assert wpreflight.stage_output_bytes("train", cfg, dims, 0) == want + 2 * (trainable + frozen) * 4
    last = cfg.model_copy(update={"train": cfg.train.model_copy(update={"select_checkpoint": "last"})})
    assert wpreflight.stage_output_bytes("train", last, dims, 0) == want
    assert wpreflight.target_dims({"text_config": {"hidden_size": 7168, "vocab_size": 10}})["hidden_size"] == 7168


def test_estimate_uses_the_prepare_manifest_when_present(host):
    """Once prepare ran, its exact token count is the basis."""
    world = _host_with_serving(host, hidden_size=16)
    world.files[f"{host.data_dir}/runs/r/prepare/manifest.json"] = json.dumps({"tokens": 12345})
    est = wpreflight.estimate_disk(StandInRemote(host, world), kind="extract", run="r", pipeline_text=TINY)
    assert est.by_stage["extract"] == 12345 * 4 * 16 * 2 + 12345 * 16 and "12345 prepared tokens" in est.basis


def test_estimate_bounds_the_samples_by_the_dataset_rows_or_max_samples(host):
    """Without a prepare manifest: a dataset file in the run directory is counted on the host (``wc -l``) and
    capped by ``prepare.max_samples``; a file that cannot be counted (Parquet) is bounded by ``max_samples`` alone,
    and without it the estimate fails naming the file and the fix."""
    world = _host_with_serving(host, hidden_size=16)
    world.files[f"{host.data_dir}/runs/r/chats.jsonl"] = "{}\n" * 5

    def est(datasets, max_samples=None):
        text = ("target_model: /model\nprepare: {datasets: [" + ", ".join(datasets) + "], max_seq_len: 256"
                + (f", max_samples: {max_samples}" if max_samples else "") + "}\n")
        return wpreflight.estimate_disk(StandInRemote(host, world), kind="extract", run="r", pipeline_text=text)

    assert est(["chats.jsonl"]).basis.startswith("at most 5 samples × 256 tokens")
    assert est(["chats.jsonl"], max_samples=3).basis.startswith("at most 3 samples × 256 tokens")
    assert est(["chats.jsonl", "big.parquet"], max_samples=7).basis.startswith("at most 7 samples")
    failed = est(["chats.jsonl", "big.parquet"])
    assert failed.by_stage == {} and "cannot count the rows of big.parquet (Parquet)" in failed.error, failed.error
    assert "set prepare.max_samples" in failed.error


def test_preflight_names_a_missing_or_changed_pipeline_image_and_the_deploy_that_fixes_it(host):
    """The image's check: present with the recorded id passes; another id, or no such image, fails naming
    ``deploy``."""
    world = _host_with_serving(host)
    r = StandInRemote(host, world)
    found = {}
    for expected in (IMAGE_ID, "sha256:" + "f" * 64):
        pf = wpreflight.Preflight()
        wpreflight._check_image(r, pf, IMAGE, expected)
        found[expected] = pf.checks
    assert found[IMAGE_ID] == [("pipeline image", True, IMAGE_ID[:19])]
    (name, ok, said), = found["sha256:" + "f" * 64]
    assert not ok and f"expected {'sha256:' + 'f' * 12}" in said and "redeploy with" in said and "deploy" in said
    missing = StandinNoImage(host)
    pf = wpreflight.Preflight()
    wpreflight._check_image(StandInRemote(host, missing), pf, IMAGE, None)
    assert not pf.ok and f"{IMAGE} is not on the host: run" in pf.checks[0][2]


class StandinNoImage(StandInHost):
    """STAND-IN host whose engine holds no pipeline image."""

    def __call__(self, argv, stdin):
        a = list(argv)
        if "image" in a and "inspect" in a:
            return 1, "", "Error: No such image"
        return super().__call__(argv, stdin)


# ---- a state dir the SSH user cannot write -----------------------------------------------------------------------

def test_unwritable_state_dir_names_the_real_cause(host):
    """``mkdir`` of the lock fails with Permission denied: say so and how to fix it (main: "held by None ...
    looks stale ... lock release --force")."""
    world = _host_with_serving(host)
    world.readonly.add(host.state_dir)
    with pytest.raises(wcommon.WindowError) as e:
        wlock.acquire_lock(StandInRemote(host, world), "w1", "t")
    msg = str(e.value)
    assert not isinstance(e.value, wcommon.LockHeld), msg
    assert "Permission denied" in msg and f"{host.state_dir}/lock" in msg and "state_dir" in msg, msg
    assert "None" not in msg and "--force" not in msg, msg


# ---- a supervisor that died --------------------------------------------------------------------------------------

def test_watch_reports_a_dead_supervisor_with_the_recover_command(host, monkeypatch):
    """The supervisor container was killed (exited, no result): the watch ends within its grace period and
    says how to recover, the host name quoted (main waited forever)."""
    evil = host.model_copy(update={"name": "gpu-01;touch /tmp/x"})
    world = _host_with_serving(evil)
    wid = "20990101T000000Z-extract-abcdef"
    world.files[wcommon.paths(evil, wid)["journal"]] = json.dumps({"step": "prepare", "event": "start"}) + "\n"
    world.containers[f"eagle3ops-supervisor-{wid}"] = "exited"
    box = {}
    monkeypatch.setattr(wwatch, "DEAD_GRACE_S", 0.2, raising=False)

    def go():
        try:
            wwatch.watch(StandInRemote(evil, world), wid, poll_s=0.01)
        except Exception as exc:  # noqa: BLE001 - inspected below
            box["exc"] = exc

    th = threading.Thread(target=go, daemon=True)
    t0 = time.monotonic()
    th.start()
    th.join(timeout=10)
    assert not th.is_alive(), "watch() kept waiting for a dead supervisor"
    assert time.monotonic() - t0 < 5
    exc = box["exc"]
    assert isinstance(exc, wcommon.SupervisorDead), exc
    assert "eagle3ops recover 'gpu-01;touch /tmp/x'" in str(exc), str(exc)
    assert shlex.split("eagle3ops recover 'gpu-01;touch /tmp/x'")[-1] == evil.name


def test_watch_waits_through_a_supervisor_restart(host):
    """A container "restarting" (its restart policy after an engine restart) or an engine that cannot answer is not
    death; the result that appears later is returned."""
    world = _host_with_serving(host)
    wid = "20990101T000000Z-extract-abcdef"
    name = f"eagle3ops-supervisor-{wid}"
    world.containers[name] = "restarting"
    polls = []
    orig = world.__call__

    def world_call(argv, stdin):
        polls.append(argv)
        if len(polls) == 30:
            world.files[wcommon.paths(host, wid)["result"]] = json.dumps({"outcome": "ok"})
        return orig(argv, stdin)

    r = StandInRemote(host, world)
    r.world = world_call
    assert wwatch.watch(r, wid, poll_s=0.01, dead_grace_s=0.05, timeout_s=10) == {"outcome": "ok"}


def test_watch_is_bounded_by_default(host):
    """The default watch limit follows the window's own budget (not forever)."""
    assert wwatch.watch_limit_s({"budget_s": 3600, "stop_timeout_s": 30}) < 3600 + 3000


# ---- a supervisor container that cannot be removed (driver side) -------------------------------------------------

def test_cleanup_warning_is_recorded_whole_in_result_and_audit(host):
    """The supervisor container cannot be removed after a good window: the warning, whole (main cut it to
    200 characters, mid-id, and printed it only on the console), is in result.json and in an audit entry."""
    world = _host_with_serving(host)
    wid = "20990101T000000Z-extract-abcdef"
    world.containers[f"eagle3ops-supervisor-{wid}"] = "exited"
    cid = "f" * 64
    world.rm_error = (f"Error response from daemon: cannot remove container {cid}: could not kill: tried to kill "
                      f"container, but did not receive an exit event" + " (details)" * 30)
    r = StandInRemote(host, world)
    warn = wwatch.cleanup_supervisor(r, wid)
    assert warn and cid in warn and world.rm_error in warn, warn
    p = wcommon.paths(host, wid)
    world.files[p["result"]] = json.dumps({"outcome": "ok", "warnings": ["supervisor: earlier"]})
    res = wwatch.finish_window(r, wid, json.loads(world.files[p["result"]]), command="t")
    [w] = [w for w in res["warnings"] if "cleanup" in w]
    assert cid in w and world.rm_error in w
    on_host = json.loads(world.files[p["result"]])
    assert on_host["warnings"] == ["supervisor: earlier", w]
    audit = [json.loads(x) for x in world.files[p["audit"]].splitlines()]
    assert audit[-1]["window"] == wid and audit[-1]["warnings"] == [w] and audit[-1]["outcome"] == "ok"


def test_config_check_host_shows_how_the_inventory_differs_from_live_serving(host, monkeypatch):
    """The inventory's serving flags apply only where no live container exists; `config check HOST` says
    how they differ from the live one (an env value that may be a secret is named, never shown)."""
    world = _host_with_serving(host)
    s = host.serving
    world.inspects[s.container] = {
        "Config": {"Image": s.image, "Cmd": [*s.args, "--max-num-seqs", "8", "--api-key", "k-9"],
                   "Env": ["VLLM_CPU_KVCACHE_SPACE=4", "NCCL_DEBUG=WARN"]},
        "HostConfig": {"Binds": [*s.volumes, "/cache:/root/.cache"], "IpcMode": "host"}}
    out = _cli(monkeypatch, world, "config", "check", "sandbox")
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "differs from the inventory's serving flags" in text
    assert "--max-num-seqs" in text and "k-9" not in text and "***" in text
    assert "env VLLM_CPU_KVCACHE_SPACE: the inventory's value differs from the live one" in text
    assert "'/cache:/root/.cache': a bind of the live container, not in the inventory" in text
    world.inspects[s.container] = {"Config": {"Image": s.image, "Cmd": list(s.args),
                                              "Env": [f"{k}={v}" for k, v in s.env.items()]},
                                   "HostConfig": {"Binds": list(s.volumes)}}
    out = _cli(monkeypatch, world, "config", "check", "sandbox")
    assert "matches the inventory's serving flags" in " ".join(out.output.split()), out.output
    assert not world.writes, "config check changes nothing on the host"


def test_release_plan_carries_only_the_intended_change(host, monkeypatch):
    """`release --arg` puts the change in the plan, not the inventory's idea of serving."""
    world = _host_with_serving(host)
    plans = []

    def launched(name):
        plans.append(next(json.loads(v) for k, v in world.files.items() if k.endswith("/plan.json")))
        raise Launched(name)

    world.on_launch = launched
    _cli(monkeypatch, world, "release", "sandbox", "--arg", "--max-num-seqs", "--arg", "8")
    assert plans and plans[0]["kind"] == "release", plans
    assert plans[0]["change"] == {"args": ["--max-num-seqs", "8"], "env": {}, "binds": [], "image": None}
    assert "new_spec" not in plans[0] and plans[0]["serving_container"] == host.serving.container


class _LeftSupervisors(StandInHost):
    """The stand-in host with supervisor containers of earlier windows: ``docker ps -a`` filtered by the supervisor
    label and a state answers ``NAME<TAB>WINDOW`` lines as the Docker CLI's ``--format`` does; ``test -e`` sees
    files too (a window's ``result.json``)."""

    def __init__(self, host, **kw):
        super().__init__(host, **kw)
        self.ps_calls: list[list[str]] = []

    def __call__(self, argv, stdin):
        a = list(argv)
        if a[:2] == ["test", "-e"]:
            return (0 if a[2] in self.files or a[2] in self.dirs else 1), "", ""
        return super().__call__(argv, stdin)

    def _docker(self, a):
        if a[:2] == ["ps", "-a"]:
            self.ps_calls.append(a)
            filters = [a[i + 1] for i, x in enumerate(a) if x == "--filter"]
            states = {f.split("=", 1)[1] for f in filters if f.startswith("status=")}
            assert "label=io.eagle3ops.role=supervisor" in filters, filters
            rows = [f"{n}\t{n.removeprefix('eagle3ops-supervisor-')}\n" for n, s in self.containers.items()
                    if n.startswith("eagle3ops-supervisor-") and s in states]
            return 0, "".join(rows), ""
        return super()._docker(a)


def test_a_new_window_removes_exited_supervisors_of_finished_windows(host, monkeypatch):
    """A driver killed mid-window never removes its supervisor container (the host finishes the window; the
    container stays ``Exited``). The next window, under the lock and before its own supervisor starts, removes the
    exited supervisors of earlier windows that have a result, and keeps those of windows without one (``recover``
    restarts them and reads their logs)."""
    world = _LeftSupervisors(host)
    world.containers[host.serving.container] = "running"
    world._mkdirs(host.data_dir)
    world._mkdirs(host.state_dir)
    world.files[f"{host.state_dir}/deployed.json"] = json.dumps({"image": IMAGE, "image_id": IMAGE_ID})
    done, lost, live = "20261201T000000Z-extract-aaaaaa", "20261202T000000Z-extract-bbbbbb", "20261203T000000Z-x"
    for wid, state in ((done, "exited"), (lost, "exited"), (live, "running")):
        world.containers[f"eagle3ops-supervisor-{wid}"] = state
    world.files[wcommon.paths(host, done)["result"]] = json.dumps({"outcome": "ok", "serving_healthy": True})
    seen: dict = {}

    def launched(name):
        seen["containers"] = dict(world.containers)
        seen["writes"] = list(world.writes)
        raise Launched(name)

    world.on_launch = launched
    _cli(monkeypatch, world, "release", "sandbox", "--arg", "--max-num-seqs", "--arg", "8")
    assert seen, "the window did not launch"
    assert f"eagle3ops-supervisor-{done}" not in seen["containers"], "the finished window's supervisor stayed"
    assert seen["containers"][f"eagle3ops-supervisor-{lost}"] == "exited", "a window without a result lost its own"
    assert seen["containers"][f"eagle3ops-supervisor-{live}"] == "running"
    rm = next(i for i, w in enumerate(seen["writes"]) if w.endswith(f"rm eagle3ops-supervisor-{done}"))
    lock = next(i for i, w in enumerate(seen["writes"]) if "/lock" in w)
    assert lock < rm, seen["writes"]  # under the lock


def test_the_inventorys_pipeline_image_is_verified_only_against_its_own_deploy_record():
    """An inventory ``pipeline_image`` other than the one ``deploy`` recorded is run unverified (the recorded id is
    another image's: checking it failed every window with a "redeploy" that could not fix it); the same tag is
    verified against its recorded id; without the key the deployed image and its id are used."""
    from types import SimpleNamespace

    dep = {"image": "eagle3ops/pipeline:0.16.0-0.3.0-abc", "image_id": "sha256:" + "1" * 64}
    assert wcommon.pipeline_image(SimpleNamespace(pipeline_image="site/pipeline:7"), dep) == ("site/pipeline:7", None)
    assert wcommon.pipeline_image(SimpleNamespace(pipeline_image=dep["image"]), dep) == (dep["image"], dep["image_id"])
    assert wcommon.pipeline_image(SimpleNamespace(pipeline_image=None), dep) == (dep["image"], dep["image_id"])
