"""Serving kind ``process``: vLLM run as a plain process on the host, stopped and restored by the
host-side restore agent, health-gated by the supervisor; releases (changed flags) and rollbacks of it.

The first two sandbox tests serve a STAND-IN (``tests/data/standin_openai_server.py``, a tiny OpenAI-compatible
server, not vLLM; it starts in a second, so they cover releases and rollbacks in every round). The last sandbox test
serves REAL vLLM 0.16.0 as a plain process: the local base image's virtualenv ``/opt/venv`` (8.1 GB, too large to
copy on this machine) is mounted read-only from the build engine's overlay2 layers (no copy) and run by the host's
python3.11 (same Debian 12 as the image). Each runs on the sandbox host as the SSH user, started over SSH with its own
working directory and environment.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from eagle3ops.config import load_inventory
from eagle3ops.health import probe, wait_healthy
from eagle3ops.remote import Remote
from eagle3ops.window.common import audit_entries
from eagle3ops.window.lock import read_lock
from eagle3ops.window.planner import build_plan, supervisor_commands
from eagle3ops.window.run import run_window

REPO = Path(__file__).resolve().parents[1]
SANDBOX_ROOT = Path(f"/var/lib/eagle3ops-sandbox/{os.environ.get('EAGLE3OPS_SANDBOX') or 'sandbox'}")
PORT, MODEL = 18077, "standin-tiny"
#: An extract window on a fresh run whose dataset file is missing: its prepare stage runs for real and fails at once,
#: the cheapest real stage run between the stop and the restore (a train window on a fresh run is refused before
#: the stop: its input `extract` is not ready).
TINY = """target_model: /model
prepare: {datasets: [missing-stand-in.jsonl], max_seq_len: 256, max_samples: 8}
"""


def _proc(pid: int) -> tuple[bytes, bytes, str, str]:
    p = Path(f"/proc/{pid}")
    uid = next(ln.split()[1] for ln in (p / "status").read_text().splitlines() if ln.startswith("Uid:"))
    return (p / "cmdline").read_bytes(), (p / "environ").read_bytes(), os.readlink(p / "cwd"), uid


def _pid_of(marker: str) -> int | None:
    """Oldest process whose command line holds ``marker`` (read from /proc here: the sandbox shares this machine)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes() and b"standin_openai_server" in \
                        (d / "cmdline").read_bytes():
                    found.append((d.stat().st_mtime, int(d.name)))
            except OSError:
                continue
    return min(found)[1] if found else None


def _wrapper_pid(work: Path) -> int | None:
    """The shell wrapper (``sh -c '... standin_openai_server.py ...'``) started in ``work``."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
                if cmd.startswith(b"sh\0-c\0") and str(work).encode() in cmd:
                    return int(d.name)
            except OSError:
                continue
    return None


def _wait_up(timeout: float = 30) -> None:
    """The stand-in server answers the health gate's probe (:func:`eagle3ops.health.wait_healthy`)."""
    wait_healthy(f"http://127.0.0.1:{PORT}", MODEL, timeout_s=timeout, interval_s=0.3)


@pytest.fixture
def process_host(deployed, tmp_path, request):
    """(host with serving kind process, DeployResult, pid, its workdir): the stand-in server running as e3ops;
    ``pid`` the oldest process matching ``process_match``. Parametrized indirectly with ``"wrapper"``: the server runs
    behind a shell wrapper that ignores SIGTERM (``sh -c 'trap "" TERM; python3 ...'``, as a conda-run or shell
    wrapper), which is then the oldest match; with ``"detached"``: a shell that puts the server in the background
    and leaves it (``sh -c '(python3 ... &); while ...'``, as ``nohup ... &`` or a daemonizing launcher does): the
    shell is the oldest match, the server is re-parented away from it."""
    h, dep = deployed
    wrapper = getattr(request, "param", None) == "wrapper"
    detached = getattr(request, "param", None) == "detached"
    work = SANDBOX_ROOT / f"proc-{uuid.uuid4().hex[:8]}"
    pw = pwd.getpwnam(h.user or "e3ops")
    work.mkdir(mode=0o755)
    shutil.copy(REPO / "tests/data/standin_openai_server.py", work / "standin_openai_server.py")
    for p in (work, work / "standin_openai_server.py"):
        os.chown(p, pw.pw_uid, pw.pw_gid)
    raw = yaml.safe_load((REPO / "deploy/hosts.yaml").read_text())["hosts"]["sandbox"]
    raw.update(identity_file=str(h.identity_file), known_hosts=str(h.known_hosts), port=h.port,
               docker_host=h.docker_host, data_dir=h.data_dir, state_dir=h.state_dir, model_path=h.model_path,
               serving={"kind": "process", "process_match": f"standin_openai_server.py --port {PORT}",
                        "port": PORT, "served_model_name": MODEL, "health_timeout_s": 60, "stop_timeout_s": 10})
    inv = tmp_path / "hosts.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"sandbox": raw}}))
    host = load_inventory(inv).host("sandbox")
    server = f"/usr/bin/python3 {work}/standin_openai_server.py --port {PORT} --model {MODEL}"
    if wrapper:
        server = "sh -c " + shlex.quote(f'trap "" TERM; {server}; echo wrapper-end')
    if detached:
        server = "sh -c " + shlex.quote(f'({server} &); while :; do sleep 1; done')
    start = f"cd {work} && E3_STANDIN_MARK={work.name} setsid nohup {server} >{work}/first.log 2>&1 </dev/null &"
    with Remote(h) as r:
        r.run(["sh", "-c", start])
    _wait_up()
    pid = _wrapper_pid(work) if wrapper or detached else _pid_of(f"--port\0{PORT}")
    assert pid
    try:
        yield host, dep, pid, work
    finally:
        # A server behind the wrapper inherits its ignored SIGTERM (`trap "" TERM` is SIG_IGN across exec): KILL it
        for _ in range(2):
            left = [p for p in (_pid_of(f"--port\0{PORT}"), _wrapper_pid(work)) if p]
            for p in left:
                with Remote(h) as r:
                    r.run(["kill", "-KILL" if wrapper else "-TERM", str(p)], check=False)
            time.sleep(1)
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.sandbox
@pytest.mark.images
def test_window_stops_and_restores_a_serving_process_as_recorded(process_host):
    host, dep, pid, work = process_host
    before = _proc(pid)
    with Remote(host, dry_run=True) as r:  # the plan shows the agent, the stop and the restore
        cmds = supervisor_commands(host, build_plan(host, kind="window", window_id="w", image=dep.tag, command="c",
                                                    stages=["prepare"], process_pid=pid))
    flat = [" ".join(c) for c in cmds]
    assert any("eagle3ops-restore-agent" in c for c in flat) and any(c.startswith(f"kill -TERM {pid}") for c in flat)
    t0 = time.time()
    with Remote(host) as r:
        res = run_window(r, kind="extract", image=dep.tag, expected_image_id=dep.image_id,
                         command="pytest process", run=f"proc-{uuid.uuid4().hex[:8]}", pipeline_text=TINY)
        assert read_lock(r) is None, res
        audit = [e for e in audit_entries(r) if e.get("window") == res["window_id"]]
    wall = time.time() - t0
    assert res["stages"]["prepare"].startswith("failed") and "extract" not in res["stages"], res
    assert "missing-stand-in.jsonl" in res["stages"]["prepare"], res
    assert res["serving_healthy"] is True and res["serving_running"] is True, res
    assert res["serving"] == "process" and res["release"] is None, res
    assert res["downtime_s"] and res["downtime_s"] > 0
    assert audit and audit[-1]["outcome"] == "failed"
    new = _pid_of(f"--port\0{PORT}")
    assert new and new != pid
    after = _proc(new)
    assert after[0] == before[0], "same command line"
    assert after[1] == before[1], "same environment"
    assert after[2] == before[2] == str(work), "same working directory"
    assert after[3] == before[3], "same user"
    assert b"E3_STANDIN_MARK=" + work.name.encode() in after[1]
    pdir = Path(host.state_dir) / "windows" / res["window_id"] / "process"
    assert "stand-in OpenAI server" in (pdir / "serving.log").read_text()
    assert "restored: pid" in (pdir / "agent.log").read_text()
    _wait_up(5)
    print(f"process window: wall {wall:.1f} s, downtime {res['downtime_s']} s")


@pytest.mark.sandbox
@pytest.mark.images
@pytest.mark.parametrize("process_host", ["wrapper"], indirect=True)
def test_window_stops_the_whole_tree_behind_a_wrapper_and_gates_the_restored_server(process_host):
    """A wrapper in front of serving (conda #10351, vllm #13836): the oldest matching process ignores SIGTERM.
    The window must stop the server under it too (else it keeps the port and the GPUs, the restored one cannot bind,
    and the survivor answers the restore's gate), and serving afterwards is the server the restore started."""
    host, dep, wrapper, work = process_host
    server = _pid_of(f"--port\0{PORT}")
    assert server and server != wrapper
    with Remote(host) as r:
        res = run_window(r, kind="extract", image=dep.tag, expected_image_id=dep.image_id,
                         command="pytest process wrapper", run=f"proc-{uuid.uuid4().hex[:8]}", pipeline_text=TINY)
    pdir = Path(host.state_dir) / "windows" / res["window_id"] / "process"
    log = (pdir / "agent.log").read_text()
    assert not Path(f"/proc/{server}").exists(), f"the wrapper's server {server} survived the stop: {log}"
    assert res["serving_healthy"] is True, res
    restored = int((pdir / "restored").read_text())
    now = _pid_of(f"--port\0{PORT}")
    assert now and now != server, log
    ppid = int(Path(f"/proc/{now}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert now == restored or ppid == restored, f"serving is pid {now}, not the restored process {restored}: {log}"
    _wait_up(5)


def test_a_recorded_process_that_cannot_be_replayed_is_refused_by_its_record():
    """Pure: what preflight reads (the recorded pid's command line, the listeners on serving's port with their
    ancestry) judged; the sandbox test below reads them from a real process tree."""
    from eagle3ops.window.hostfacts import replay_refusal

    # a shell whose script ends by putting the server in the background: its replay exits at once
    why = replay_refusal("gpu1", 4242, ["bash", "-c", "cd /srv && vllm serve m --port 8000 &"], 8000, {})
    assert why and "pid 4242" in why and "ends with `&`" in why and "hosts.gpu1.serving.process_match" in why, why
    assert replay_refusal("gpu1", 4242, ["/bin/sh", "-c", "vllm serve m &  \n"], 8000, {}), "trailing blanks"
    # the server listening on the port is not under the recorded pid (it was left in the background)
    why = replay_refusal("gpu1", 4242, ["/usr/bin/python3", "launch.py"], 8000, {4300: [4300, 1]})
    assert why and "pid 4300 listens on port 8000" in why and "foreground" in why, why
    # replayable: the server itself, a wrapper that waits for it, a shell that runs it in the foreground
    assert replay_refusal("gpu1", 4300, ["vllm", "serve", "m"], 8000, {4300: [4300, 1]}) is None
    assert replay_refusal("gpu1", 4242, ["bash", "-c", "vllm serve m & wait"], 8000, {4300: [4300, 4242, 1]}) is None
    assert replay_refusal("gpu1", 4242, ["sh", "-c", "a && vllm serve m 2>&1"], 8000, {4300: [4300, 4242, 1]}) is None
    assert replay_refusal("gpu1", 4242, ["vllm", "serve", "m"], 8000, {}) is None, "no listener seen: not judged"


@pytest.mark.sandbox
@pytest.mark.images
@pytest.mark.parametrize("process_host", ["detached"], indirect=True)
def test_a_recorded_command_that_leaves_its_server_in_the_background_is_refused_before_the_stop(process_host):
    """The oldest matching process is a shell that started the server in the background and let it go: the agent's
    stop would take the shell's tree (not the server), and the restore would replay the shell, whose new server
    nothing tracks. Refused by preflight (a dry run reads the same facts), before the lock and anything stops."""
    from eagle3ops.window.common import PreflightFailed

    host, dep, shell, work = process_host
    server = _pid_of(f"--port\0{PORT}")
    assert server and server != shell
    t0 = time.time()
    with Remote(host, dry_run=True) as r, pytest.raises(PreflightFailed) as failed:
        run_window(r, kind="extract", image=dep.tag, expected_image_id=dep.image_id, command="pytest detached",
                   run=f"proc-{uuid.uuid4().hex[:8]}", pipeline_text=TINY)
    msg = " ".join(str(failed.value).split())
    assert f"pid {shell}" in msg and f"pid {server} listens on port {PORT}" in msg, msg
    assert "process_match" in msg and "foreground" in msg, msg
    assert Path(f"/proc/{server}").exists() and Path(f"/proc/{shell}").exists(), "nothing was stopped"
    _wait_up(5)
    print(f"refused in {time.time() - t0:.1f} s")


@pytest.mark.sandbox
@pytest.mark.images
def test_release_rollback_and_failed_release_of_a_serving_process(process_host):
    """A release with a changed flag, a rollback, then a release whose process exits at once (an argument the
    stand-in rejects): each leaves the live process's command line as expected, gated, and the release history
    naming the live release. Its own state dir: the sandbox's container releases stay as they are."""
    from eagle3ops.config.plan import ReleaseChange
    from eagle3ops.supervisor.releases import Releases

    host, dep, pid, work = process_host
    state = work / "state"
    state.mkdir(mode=0o755)
    pw = pwd.getpwnam(host.user or "e3ops")
    os.chown(state, pw.pw_uid, pw.pw_gid)
    host = host.model_copy(update={"state_dir": str(state)})
    before = _proc(pid)
    argv0 = before[0].split(b"\0")[:-1]
    printed: list[str] = []
    with Remote(host, dry_run=True, echo=printed.append) as r:  # `release --dry-run`: the plan, nothing done
        res = run_window(r, kind="release", image=dep.tag, expected_image_id=dep.image_id, command="pytest dry",
                         change=ReleaseChange(args=["--label", "v2"]))
    assert res["outcome"] == "dry-run" and res["serving"] == "process", res
    flat = [" ".join(c) for c in res["supervisor_commands"]]
    assert any(c.startswith(f"kill -TERM {pid}") for c in flat), flat
    assert any("--label v2" in c for c in flat) and any("roll back to the recorded process" in c for c in flat), flat
    assert any("eagle3ops-restore-agent" in line for line in printed) and _pid_of(f"--port\0{PORT}") == pid
    assert not (state / "releases").exists() and not (state / "windows").exists(), "a dry run writes nothing"
    times = {}

    def window(kind: str, **kw):
        t0 = time.time()
        with Remote(host) as r:
            res = run_window(r, kind=kind, image=dep.tag, expected_image_id=dep.image_id, command=f"pytest {kind}",
                             **kw)
            assert read_lock(r) is None, res
        times[f"{kind} {len(times)}"] = round(time.time() - t0, 1)
        live = _pid_of(f"--port\0{PORT}")
        assert live, res
        _wait_up(5)
        return res, _proc(live)

    res, live = window("rollback")  # nothing was live before: refused by the supervisor, nothing stopped
    assert res["outcome"] == "failed" and "no release that was live before" in res["error"], res
    assert res["serving_healthy"] is True and live == before and _pid_of(f"--port\0{PORT}") == pid, res

    res, live = window("release", change=ReleaseChange(args=["--label", "v2"]))
    assert res["outcome"] == "ok" and res["serving_healthy"] is True, res
    assert live[0].split(b"\0")[:-1] == argv0 + [b"--label", b"v2"], live[0]
    assert live[1:] == before[1:], "same environment, working directory and user"
    rel = Releases(state)
    first, v2 = rel.history()[-2:]
    assert rel.current() == v2 == res["release"] and first < v2

    res, live = window("rollback")
    assert res["outcome"] == "ok" and res["serving_healthy"] is True and res["release"] == first, res
    assert live[0] == before[0] and live[1:] == before[1:]
    assert Releases(state).current() == first

    # a flag value the server refuses at start (the stand-in ignores unknown flags, as vLLM-shaped argv reach it)
    res, live = window("release", change=ReleaseChange(args=["--token-ms", "not-a-number"]))
    assert res["outcome"] == "failed" and "rolled back to release" in res["error"], res
    assert res["serving_healthy"] is True and res["serving_running"] is True, res
    assert live[0] == before[0], "the recorded process is back"
    rel = Releases(state)
    assert rel.current() == first == res["release"]
    assert max(rel.numbers()) not in rel.history(), "the failed release never became live"
    pdir = state / "windows" / res["window_id"] / "process"
    assert (pdir / "exited").exists() and "invalid float value" in (pdir / "serving.log").read_text()

    res, live = window("rollback", to_release=v2)  # a named release comes back, as it was recorded
    assert res["outcome"] == "ok" and res["release"] == v2, res
    assert live[0].split(b"\0")[:-1] == argv0 + [b"--label", b"v2"] and live[1:] == before[1:]
    assert Releases(state).history()[-1] == v2
    print(f"process release/rollback windows: {times}")


def test_release_changing_the_image_of_a_serving_process_is_refused_clearly():
    from types import SimpleNamespace

    from eagle3ops.config.plan import ReleaseChange
    from eagle3ops.window.common import WindowError

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    h = h.model_copy(update={"serving": type(h.serving)(kind="process", process_match="vllm serve",
                                                        served_model_name="m")})
    with pytest.raises(WindowError, match=r"serves with a process.*not the image or binds \(asked: --image\); drop --image"):
        run_window(SimpleNamespace(host=h), kind="release", image="i", expected_image_id=None, command="pytest",
                   change=ReleaseChange(image="other:tag"))
    with pytest.raises(ValueError, match=r"not the image or binds \(asked: --image\)"):
        build_plan(h, kind="release", window_id="w", image="i", command="c", change=ReleaseChange(image="o"))
    from eagle3ops.window.kinds import require_serving

    for what in ("release", "rollback", "speculate"):
        require_serving(h, what)
    with pytest.raises(WindowError, match=r"serves with a process \(`hosts\.sandbox\.serving\.kind: process`\): "
                                          r"frobnicate is not supported for process serving"):
        require_serving(h, "frobnicate")


# --- Real vLLM as a plain process -------------------------------------------------------------------------------
VLLM_PORT, VLLM_MODEL = 18078, "tiny-llama"


def _mount_image_ro(image: str, mnt: Path) -> None:
    """Mount the build engine's (overlay2) filesystem of ``image`` read-only at ``mnt``, copying nothing: its layer
    directories become the lowerdirs of an overlay mount with no upperdir (root only)."""
    out = subprocess.run(["docker", "image", "inspect", image, "--format", "{{json .GraphDriver}}"],
                         check=True, capture_output=True, text=True).stdout
    gd = json.loads(out)
    assert gd["Name"] == "overlay2", f"the build engine's storage driver is {gd['Name']}, not overlay2"
    layers = ":".join(x for x in (gd["Data"].get("UpperDir"), gd["Data"].get("LowerDir")) if x)
    mnt.mkdir(mode=0o755)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"ro,lowerdir={layers}", str(mnt)], check=True)


def _pid_on(port: int) -> int | None:
    """Oldest process whose command line holds ``--port <port>`` and ``vllm``: the API server, not its engine."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
                if f"--port\0{port}\0".encode() in cmd and b"vllm" in cmd:
                    found.append((d.stat().st_mtime, int(d.name)))
            except OSError:
                continue
    return min(found)[1] if found else None


@pytest.fixture
def vllm_process_host(deployed, built_images, tmp_path):
    """(host with serving kind process, DeployResult, pid, workdir): REAL vLLM (the local base image's virtualenv,
    mounted read-only from the build engine's layers) serving a copy of the sandbox's tiny Llama as e3ops."""
    h, dep = deployed
    base, _ = built_images
    work = SANDBOX_ROOT / f"vproc-{uuid.uuid4().hex[:8]}"
    pw = pwd.getpwnam(h.user or "e3ops")
    work.mkdir(mode=0o755)
    mnt = work / "image"
    try:
        _mount_image_ro(base, mnt)
        # The sandbox's model files are root's (mode 600, read by the container's root): a copy e3ops can read.
        model = shutil.copytree(h.model_path, work / "tiny-llama")
        for p in [work, model, *model.iterdir()]:
            os.chown(p, pw.pw_uid, pw.pw_gid)
        raw = yaml.safe_load((REPO / "deploy/hosts.yaml").read_text())["hosts"]["sandbox"]
        sv = raw["serving"]
        raw.update(identity_file=str(h.identity_file), known_hosts=str(h.known_hosts), port=h.port,
                   docker_host=h.docker_host, data_dir=h.data_dir, state_dir=h.state_dir, model_path=h.model_path,
                   serving={"kind": "process",
                            "process_match": f"vllm.entrypoints.openai.api_server .*--port {VLLM_PORT}",
                            "port": VLLM_PORT, "served_model_name": VLLM_MODEL, "health_timeout_s": 300,
                            "stop_timeout_s": 30})
        inv = tmp_path / "hosts.yaml"
        inv.write_text(yaml.safe_dump({"hosts": {"sandbox": raw}}))
        host = load_inventory(inv).host("sandbox")
        # The image's ENV (PATH, VIRTUAL_ENV) and the container serving's flags and env (deploy/hosts.yaml).
        args = [a for a in sv["args"][1:] if "EAGLE3OPS_SANDBOX_SERVING_PORT" not in a and a != "--port"]
        env = {"PATH": f"{mnt}/opt/venv/bin:/usr/bin:/bin", "VIRTUAL_ENV": f"{mnt}/opt/venv", "LANG": "C.UTF-8",
               **sv["env"], "OMP_NUM_THREADS": "2"}
        start = (f"cd {work} && {' '.join(f'{k}={v}' for k, v in env.items())} setsid nohup {mnt}/opt/venv/bin/python "
                 f"-m vllm.entrypoints.openai.api_server --model {model} {' '.join(args)} --port {VLLM_PORT} "
                 f">{work}/first.log 2>&1 </dev/null &")
        t0 = time.time()
        with Remote(h) as r:
            r.run(["sh", "-c", start])
        _wait_vllm(300)
        print(f"real vLLM process: up and one completion in {time.time() - t0:.1f} s")
        pid = _pid_on(VLLM_PORT)
        assert pid
        yield host, dep, pid, work
    finally:
        for _ in range(3):
            left = _pid_on(VLLM_PORT)
            if not left:
                break
            with Remote(h) as r:
                r.run(["kill", str(left)], check=False)
            for _ in range(30):
                if not Path(f"/proc/{left}").exists():
                    break
                time.sleep(1)
        if os.path.ismount(mnt):
            subprocess.run(["umount", str(mnt)], check=True)
        shutil.rmtree(work, ignore_errors=True)


def _wait_vllm(timeout: float) -> None:
    """The real vLLM process answers the health gate's probe (:func:`eagle3ops.health.wait_healthy`)."""
    wait_healthy(f"http://127.0.0.1:{VLLM_PORT}", VLLM_MODEL, timeout_s=timeout, interval_s=1.0)


@pytest.mark.sandbox
@pytest.mark.images
def test_window_restores_a_real_vllm_process(vllm_process_host):
    """REAL: vLLM 0.16.0 (the local base image's /opt/venv, mounted read-only from the build engine's layers, run by
    the host's python3.11), the tiny Llama, the restore agent, the supervisor and its health gate (a completion).
    NOT real: the host is the sandbox (vLLM on CPU, no GPUs), the model a 2 MB random Llama.

    One window whose stage fails at once (stop, stage, restore): the process back has the same command line,
    environment, working directory and user, and passes the gate. A release the server rejects, rolled back to the
    recorded process, runs with the stand-in (:func:`test_release_rollback_and_failed_release_of_a_serving_process`);
    here on real vLLM it cost a third vLLM start of every CI run."""
    host, dep, pid, work = vllm_process_host
    state = work / "state"
    state.mkdir(mode=0o755)
    pw = pwd.getpwnam(host.user or "e3ops")
    os.chown(state, pw.pw_uid, pw.pw_gid)
    host = host.model_copy(update={"state_dir": str(state)})
    before = _proc(pid)
    assert b"vllm.entrypoints.openai.api_server" in before[0] and b"VLLM_CPU_KVCACHE_SPACE=1" in before[1]
    times = {}

    def window(kind: str, **kw):
        t0 = time.time()
        with Remote(host) as r:
            res = run_window(r, kind=kind, image=dep.tag, expected_image_id=dep.image_id, command=f"pytest {kind}",
                             **kw)
            assert read_lock(r) is None, res
        times[kind] = round(time.time() - t0, 1)
        live = _pid_on(VLLM_PORT)
        assert live and live != pid, res
        probe(f"http://127.0.0.1:{VLLM_PORT}", VLLM_MODEL)  # serves completions after the gate
        return res, _proc(live)

    res, live = window("extract", run=f"vproc-{uuid.uuid4().hex[:8]}", pipeline_text=TINY)
    assert res["stages"]["prepare"].startswith("failed") and "missing-stand-in.jsonl" in res["stages"]["prepare"]
    assert res["serving"] == "process" and res["serving_healthy"] is True and res["serving_running"] is True, res
    assert live == before, "same command line, environment, working directory and user"
    pdir = state / "windows" / res["window_id"] / "process"
    assert "restored: pid" in (pdir / "agent.log").read_text()

    print(f"real vLLM process windows: {times}")
