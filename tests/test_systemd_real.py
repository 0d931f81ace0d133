"""Serving of kind ``systemd`` against a REAL systemd: systemd 252 as PID 1 of a container (Debian bookworm's
systemd, sshd with pam_systemd, systemd-logind), reached over SSH by the real executor.

What it shows (each against systemd itself, not a stand-in of ``systemctl``):
- the restore agent's stop ends the unit's whole control group: a unit with ``KillMode=process`` whose main process
  has a child (as vLLM's API server has its EngineCore and workers) leaves no process behind, and the agent's restore
  starts the unit again;
- the unit's secrets (``--api-key K``, ``--api-key=K``, ``--hf-token`` on its command line; ``VLLM_API_KEY``,
  ``HF_TOKEN`` and an inventory-named variable in its environment) end up in no file of the host's state and data
  dirs but the unit's record (``unit.show``, mode 0600), and in no output of the CLI's ``status`` / ``config check``;
- a release driven by the window runner's supervisor steps (run in this process, the host's state dir bind-mounted
  at the same files) through the real agent, whose drop-in cannot be put in place: the round fails, the switch
  rolls back to the unit as recorded, nothing that never ran is made live; the secrets are then in no file of the
  state and data dirs but the release records (0600, root's), and not in the supervisor's output;
- through the CLI, on the same systemd as a venv-runtime host (the STAND-IN pipeline environment of
  ``eagle3ops_dev.standin_env``, with the gate's imports: this checkout's supervisor as a host process, stand-in
  stages): ``deploy --env-tarball``, an ``extract`` window whose driver is killed mid-stage (the supervisor, a user
  service where logind ends the SSH session's processes, finishes it on the host), ``release --gate`` (the speculation gate's job: the
  baseline restarted, the changed release's drop-in, the unit as recorded put back for the baseline's second block,
  the kept drop-in written again; its figures are the STAND-IN server's), ``rollback``, ``report``, ``status`` and
  ``config check``; then the planted secrets are in no file under the state and data dirs and reports/ but the
  release records (0600, root's), and in no output of the CLI;
- preflight advises ``KillMode=control-group`` for such a unit;
- with logind's ``KillUserProcesses=yes`` applying to the SSH user, preflight detaches the agent as a user service
  (the user lingers) and the agent outlives the SSH session; without linger the window is refused before anything
  stops, naming ``loginctl enable-linger``.

The container: ``--cap-add SYS_ADMIN`` (systemd mounts its own file systems; ``--privileged`` fails on this machine),
tmpfs on /run and /run/lock, the host's cgroup file system with ``--cgroupns host`` (systemd keeps to its container's
subtree, ``/docker/<id>/...``), host networking with sshd on a free loopback port. Its image is built on the
debootstrap minbase with Debian's packages (tests/systemd_image.py); the serving unit's main process is the STAND-IN
OpenAI server (``tests/data/standin_openai_server.py``, NOT vLLM: it answers the health gate) run by Debian's python3,
with a ``sleep`` child as a stand-in for vLLM's EngineCore (the subject is how the unit's processes are stopped,
started and released, not serving a model).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from eagle3ops.commands import process as pc
from eagle3ops.commands import systemd as sd
from eagle3ops.config import load_inventory
from eagle3ops.remote import Remote

import systemd_image
from secretscan import ORG_NAME, leaks, planted_args, planted_env, private, scan_with_records

UNIT = "vllm-standin.service"
SERVER = Path(__file__).resolve().parent / "data/standin_openai_server.py"
#: Where the stand-in server is copied in the container.
SERVER_IN = "/opt/standin/standin_openai_server.py"
MODEL = "standin-kinds"


def unit_file(port: int) -> str:
    """The serving unit: the main process (the stand-in server, after bash's exec) and a ``sleep`` child, as vLLM's
    API server and its EngineCore; KillMode=process: `systemctl stop` ends the main process only. It carries
    serving's secrets as a keyed vLLM unit would (secretscan's planted values: `--api-key K`, `--api-key=K` and
    `--hf-token` on its command line; VLLM_API_KEY, HF_TOKEN and the inventory-named ORG_TOKEN in its environment).
    A word with spaces (bash's script) and ``$$`` (systemd's literal ``$``) as units have them."""
    return f"""[Service]
ExecStart=/bin/bash -c 'sleep 10001 & exec /usr/bin/python3 {SERVER_IN} "$$@"' vllm --port {port} --model {MODEL} \
  {' '.join(planted_args())}
{chr(10).join(f'Environment={k}={v}' for k, v in planted_env().items())}
KillMode=process
"""


#: The agent asks about "the supervisor" with these words: always running (the test plays the supervisor's part
#: through the agent's request files).
RUNNING = ["sh", "-c", "echo running", "eagle3ops-test-supervisor"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sh(*argv: str, check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def systemd_host(tmp_path_factory):
    """The inventory file of a host whose serving is systemd unit ``vllm-standin.service``, on a real systemd."""
    image = systemd_image.build()  # built by tests/prebuild.py: seconds here
    name = f"e3-systemd-{uuid.uuid4().hex[:8]}"
    port, serving_port = _free_port(), _free_port()
    d = tmp_path_factory.mktemp("systemd-host")
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "id"))
    (d / "e3").mkdir()  # the host's /var/lib/e3 (state and data dirs): the supervisor steps read it here
    _sh("docker", "run", "-d", "--name", name, "--network", "host", "--cap-add", "SYS_ADMIN",
        "--tmpfs", "/run", "--tmpfs", "/run/lock", "--volume", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
        "--volume", f"{d / 'e3'}:/var/lib/e3", "--cgroupns", "host", image)
    try:
        state = ""
        for _ in range(60):  # bounded: 30 s for systemd to boot
            state = _sh("docker", "exec", name, "systemctl", "is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded"):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"systemd did not boot in the container (is-system-running: {state!r}): "
                        f"{_sh('docker', 'logs', name, check=False).stdout[-2000:]}")
        setup = f"""set -e
mkdir -p /root/.ssh && chmod 700 /root/.ssh && cat > /root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys
printf 'Port {port}\\nListenAddress 127.0.0.1\\n' > /etc/ssh/sshd_config.d/e3.conf
mkdir -p /etc/systemd/logind.conf.d
printf '[Login]\\nKillUserProcesses=yes\\nKillExcludeUsers=nobody\\n' > /etc/systemd/logind.conf.d/e3.conf
systemctl restart systemd-logind ssh
"""
        _sh("docker", "exec", "-i", name, "bash", "-c", setup, input=(d / "id.pub").read_text())
        _sh("docker", "exec", "-i", name, "sh", "-c", f"mkdir -p /opt/standin && cat > {SERVER_IN}",
            input=SERVER.read_text())
        _sh("docker", "exec", "-i", name, "sh", "-c", f"cat > /etc/systemd/system/{UNIT}",
            input=unit_file(serving_port))
        _sh("docker", "exec", name, "systemctl", "daemon-reload")
        _sh("docker", "exec", name, "systemctl", "start", UNIT)
        pub = _sh("docker", "exec", name, "cat", "/etc/ssh/ssh_host_ed25519_key.pub").stdout.split()
        (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {pub[0]} {pub[1]}\n")
        inv = d / "hosts.yaml"
        inv.write_text(f"""hosts:
  sysd:
    hostname: 127.0.0.1
    port: {port}
    user: root
    identity_file: {d / 'id'}
    known_hosts: {d / 'known_hosts'}
    data_dir: /var/lib/e3/data
    state_dir: /var/lib/e3/state
    secret_env: [{ORG_NAME}]
    model_path: /var/lib/e3/data/model
    serving:
      kind: systemd
      unit: {UNIT}
      port: {serving_port}
      served_model_name: {MODEL}
      stop_timeout_s: 5
""")
        yield inv, name
    finally:
        _sh("docker", "rm", "-f", name, check=False)


def _host(inv: Path):
    return load_inventory(inv).host("sysd")


def _wait_file(r: Remote, path: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = r.run(["cat", path], check=False)
        if out.ok:
            return out.stdout
        time.sleep(0.5)
    log = r.run(["sh", "-c", f"cat {path.rsplit('/', 1)[0]}/agent.log"], check=False).stdout
    raise AssertionError(f"{path} did not appear within {timeout}s; agent.log:\n{log}")


def _unit_procs(name: str) -> list[str]:
    out = _sh("docker", "exec", name, "ps", "-eo", "args", check=False).stdout
    return [ln for ln in out.splitlines() if ln.startswith("sleep 10001") or SERVER_IN in ln]


def test_agent_stop_ends_the_units_control_group_and_restore_starts_it(systemd_host, tmp_path):
    inv, name = systemd_host
    h = _host(inv)
    assert len(_unit_procs(name)) == 2  # main process and its child
    pdir = f"/var/lib/e3/state/windows/t-{uuid.uuid4().hex[:6]}/process"
    with Remote(h) as r:
        r.run(["mkdir", "-p", pdir])  # this session stays open while the agent works: detached as by default
        r.run(sd.record_unit(UNIT, pdir))  # what the driver records before the agent starts (a window's launch)
        r.run(sd.start_agent(h, pdir=pdir, unit=UNIT, stop_timeout_s=5, supervisor="eagle3ops-supervisor-t1",
                             limit_s=60, state_words=RUNNING))
        _wait_file(r, f"{pdir}/agent.pid")
        r.run(["touch", f"{pdir}/stop-requested"])
        _wait_file(r, f"{pdir}/stopped")
        left = _unit_procs(name)
        log = r.run(["cat", f"{pdir}/agent.log"]).stdout
        assert left == [], f"left after the agent's stop: {left}; agent.log:\n{log}"
        assert "processes left in vllm-standin.service's control group" in log and "KillMode process" in log, log
        r.run(["touch", f"{pdir}/restore-requested"])
        _wait_file(r, f"{pdir}/restored")
        time.sleep(1)
        assert len(_unit_procs(name)) == 2 and r.run(sd.is_active(UNIT)).stdout.strip() == "active"
        r.run(["touch", f"{pdir}/done"])
    _no_secret_on_the_host_or_in_the_drivers_output(inv, name, tmp_path)


def _no_secret_on_the_host_or_in_the_drivers_output(inv: Path, name: str, tmp_path: Path,
                                                    names: set[str] = frozenset({"unit.show", "unit.argv.json"}),
                                                    ) -> None:
    """The unit's planted secrets (secretscan) are in no file under the host's state and data dirs but the records
    (by default the unit's record: ``unit.show`` and ``unit.argv.json``; ``names``: the files allowed, all of them
    found), each mode 0600 and the SSH user's, and in no output of the driver's CLI over SSH about this host
    (``status``, ``config check``)."""
    copy = tmp_path / "host"
    copy.mkdir()
    tar = subprocess.run(["docker", "exec", name, "tar", "-C", "/var/lib/e3", "-cf", "-", "."], capture_output=True,
                         check=True, timeout=60).stdout
    subprocess.run(["tar", "-C", str(copy), "--same-owner", "-xpf", "-"], input=tar, check=True, timeout=60)
    found, records = scan_with_records([copy / "state", copy / "data"])
    assert found == {}, found
    assert {p.name for p in records} == set(names), records
    assert [private(p, {0}) for p in records] == [None] * len(records), [(p, private(p, {0})) for p in records]
    show = [p for p in records if p.name == "unit.show"]
    assert show and all(leaks(p.read_bytes()) for p in show), "the unit's record lost the secrets a restore needs"
    said = {}
    for args in (["status", "sysd"], ["config", "check", "sysd"]):
        cp = subprocess.run([sys.executable, "-m", "eagle3ops", *args, "--inventory", str(inv)], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path)
        said[" ".join(args)] = (cp.returncode, cp.stdout + cp.stderr)
    assert "vllm-standin.service" in said["config check sysd"][1], said  # it read the unit
    shown = {cmd: leaks(out) for cmd, (_, out) in said.items() if leaks(out)}
    assert shown == {}, f"the CLI shows the unit's secrets: {shown}\n{said}"


def _main_argv(name: str) -> list[str]:
    """The unit's main process's command line (``/proc/MAINPID/cmdline``) as systemd runs it now."""
    pid = _sh("docker", "exec", name, "systemctl", "show", "-p", "MainPID", "--value", UNIT).stdout.strip()
    raw = _sh("docker", "exec", name, "cat", f"/proc/{pid}/cmdline", check=False).stdout
    return [a for a in raw.split("\0") if a]


def _switch(inv: Path, kind: str, window: str, outcome: str = "ok", **plan_kw) -> dict:
    """One ``release``/``rollback`` plan on the real systemd as a window runs it: the driver's launch over SSH (the
    unit recorded, the systemd agent started, its session open throughout), then the supervisor's steps in this
    process on the same files (``Supervisor.run``: record, switch, the real health gate, result)."""
    from eagle3ops.supervisor.runner import Supervisor
    from test_serving_kinds import _Engine, _plan

    h = _host(inv)
    e3 = inv.parent / "e3"
    pdir = f"/var/lib/e3/state/windows/{window}/process"  # on the host; the same files are under e3/ here
    with Remote(h) as r:
        r.run(["mkdir", "-p", pdir])
        r.run(sd.record_unit(UNIT, pdir))
        r.run(sd.start_agent(h, pdir=pdir, unit=UNIT, stop_timeout_s=5, supervisor=f"eagle3ops-supervisor-{window}",
                             limit_s=120, state_words=RUNNING))
        _wait_file(r, f"{pdir}/agent.pid")
        plan = _plan(e3, "systemd", kind, port=h.serving.port, secret_env=[ORG_NAME], serving_unit=UNIT,
                     process_dir=str(e3 / "state/windows" / window / "process"), **plan_kw)
        res = Supervisor(plan.model_copy(update={"window_id": window, "budget_s": 600}), _Engine(),
                         e3 / "state/windows" / window).run()
        log = r.run(["cat", f"{pdir}/agent.log"]).stdout
    assert res["outcome"] == outcome, (res, log)
    print(log)  # its timings, for the record
    return {**res, "agent_log": log}


def test_a_release_whose_dropin_cannot_be_put_in_place_is_rolled_back(systemd_host, tmp_path, capfd):
    """A release on the real systemd, driven by the supervisor's steps, whose drop-in the agent cannot put in place
    (its directory is a file here): the unit it started runs without the change, so the round fails and the switch
    rolls back to the unit as recorded; the release that never ran is not made live. (A release written, gated and
    kept, and a rollback that removes it: ``test_a_window_and_a_gated_release_through_the_cli``, through the CLI.)
    The secrets are only in the release records, and not in the supervisor's output."""
    from eagle3ops.config.plan import ReleaseChange
    from eagle3ops.supervisor.releases import Releases

    inv, name = systemd_host
    before = _main_argv(name)
    assert SERVER_IN in before and "--label" not in before, before
    dropin_dir = sd.dropin_path(UNIT).rsplit("/", 1)[0]
    _sh("docker", "exec", name, "sh", "-c", f"rm -rf {dropin_dir} && touch {dropin_dir}")
    try:
        res = _switch(inv, "release", "rel-1", outcome="failed", change=ReleaseChange(args=["--label", "two"]))
    finally:
        _sh("docker", "exec", name, "rm", "-f", dropin_dir)
    assert "cannot write drop-in" in res["agent_log"] and _main_argv(name) == before, res["agent_log"]
    assert _sh("docker", "exec", name, "systemctl", "is-active", UNIT).stdout.strip() == "active"
    assert len(_unit_procs(name)) == 2
    journal = (inv.parent / "e3/state/windows/rel-1/journal.jsonl").read_text()
    assert "rolled back to release 1" in res["error"] and "cannot write" in journal, (res, journal)
    assert Releases(inv.parent / "e3/state").current() == 1, "the release that never ran was made live"
    rels = sorted(p.name for p in (inv.parent / "e3/state/releases").glob("*.json"))
    assert rels == ["0001.json", "0002.json"], rels  # the unit as recorded, the release that failed
    out = capfd.readouterr()
    assert leaks(out.out + out.err) == [], "the supervisor's output shows a secret"
    _no_secret_on_the_host_or_in_the_drivers_output(
        inv, name, tmp_path, names={"unit.show", "unit.argv.json", "next.unit.dropin", "0001.json", "0002.json"})


def test_preflight_advises_killmode_and_detaches_the_agent_where_logind_kills(systemd_host):
    from eagle3ops.window.kinds import SystemdKind
    from eagle3ops.window.preflight import Preflight

    inv, name = systemd_host
    h = _host(inv)
    with Remote(h) as r:
        r.run(["loginctl", "disable-linger", "root"])
        pf = Preflight()
        SystemdKind().preflight(r, pf, True)
        checks = {n: (ok, d) for n, ok, d in pf.checks}
        assert checks["serving unit"][0], checks
        assert checks["serving unit KillMode"][0] and "KillMode=control-group" in checks["serving unit KillMode"][1]
        ok, detail = checks["restore agent"]
        assert not ok and "loginctl enable-linger root" in detail and "KillUserProcesses=yes" in detail, detail
        r.run(["loginctl", "enable-linger", "root"])
        pf = Preflight()
        SystemdKind().preflight(r, pf, True)
        assert pf.ok and pf.agent_detach == "user-service", pf.checks
        assert r.run(sd.dropin_writable(UNIT), check=False).ok  # root may write the unit's drop-in; nobody may not
        assert _sh("docker", "exec", "-u", "nobody", name, *sd.dropin_writable(UNIT), check=False).returncode == 1
        pdir = f"/var/lib/e3/state/windows/t-{uuid.uuid4().hex[:6]}/process"
        r.run(["mkdir", "-p", pdir])
        r.run(pc.start_agent(h, pdir=pdir, pid=UNIT, stop_timeout_s=5, supervisor="eagle3ops-supervisor-t2",
                             limit_s=60, stop_wait_s=60, script=sd.AGENT_SH, state_words=RUNNING,
                             detach=pf.agent_detach))
        pid = _wait_file(r, f"{pdir}/agent.pid").strip()
    # The SSH session is closed: logind stops its scope. The agent, a user service, runs on.
    time.sleep(6)
    with Remote(h) as r:
        assert r.run(["kill", "-0", pid], check=False).ok, r.run(["cat", f"{pdir}/agent.log"]).stdout
        r.run(["kill", pid])
        # The same agent detached as before (setsid nohup) dies with the session: what the user service prevents.
        pdir2 = pdir + "-setsid"
        r.run(["mkdir", "-p", pdir2])
        r.run(pc.start_agent(h, pdir=pdir2, pid=UNIT, stop_timeout_s=5, supervisor="eagle3ops-supervisor-t3",
                             limit_s=60, stop_wait_s=60, script=sd.AGENT_SH, state_words=RUNNING, detach="setsid"))
        pid2 = _wait_file(r, f"{pdir2}/agent.pid").strip()
    with Remote(h) as r:  # asked every 0.5 s for up to 12 s, not a fixed 6 s: logind ends the scope at once
        deadline = time.monotonic() + 12
        while r.run(["kill", "-0", pid2], check=False).ok and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not r.run(["kill", "-0", pid2], check=False).ok, "KillUserProcesses did not end the setsid agent"


#: The venv-runtime host's dirs in the container: under the sandbox root (the stand-in pipeline environment is
#: delivered to sandbox hosts only), not bind-mounted (read back with `docker exec tar`).
SANDBOX_DIR = "/var/lib/eagle3ops-sandbox/systemd-real"
#: The stand-in stages' pipeline (eagle3ops_dev.standin_stages: manifests, no model touched).
TINY = """target_model: /model
prepare: {datasets: [builtin:sharegpt], max_seq_len: 256, max_samples: 8}
"""


def _venv_inventory(inv: Path, out: Path) -> Path:
    """The fixture's host as a venv-runtime host ``sysv`` (no container engine: the supervisor is a process of the
    STAND-IN pipeline environment, the stages are its stand-in stages), its state and data under
    :data:`SANDBOX_DIR`, with a gate cut to 4 prompts x 16 tokens at concurrency 1 (the gate's resolution is
    tests/test_gate_simulation.py's; here the subject is the unit's restarts and where the secrets go)."""
    import yaml

    doc = yaml.safe_load(inv.read_text())
    h = dict(doc["hosts"]["sysd"])
    h.update(data_dir=f"{SANDBOX_DIR}/data", state_dir=f"{SANDBOX_DIR}/state", model_path=f"{SANDBOX_DIR}/model",
             stage_runtime="venv", venv_python="/usr/bin/python3", maintenance_budget_s=600, stage_timeout_s=120,
             stage_env={"EAGLE3OPS_STANDIN_SLEEP_S": "3"})  # each stand-in stage 3 s: a driver killed mid-stage
    h["serving"] = {**h["serving"], "health_timeout_s": 60, "gate_prompts": 4, "gate_max_tokens": 16,
                    "gate_concurrency": [1], "gate_passes": 3, "gate_warmup_prompts": 1,
                    # a restarted stand-in's first token moves with the machine's load, not with the change
                    "gate_ttft_ratio_max": 4.0}
    out.write_text(yaml.safe_dump({"hosts": {"sysv": h}}))
    return out


def test_a_window_and_a_gated_release_through_the_cli(systemd_host, tmp_path):
    """Through the CLI, on the real systemd with a venv-runtime host (the STAND-IN pipeline environment,
    eagle3ops_dev.standin_env: this checkout's supervisor and stand-in stages): ``deploy --env-tarball``, an
    ``extract`` window (the unit stopped, the stand-in stages run, the unit started as systemd has it, gated),
    ``release --gate`` (the speculation gate's job with the not-slower rule: the baseline restarted, the changed
    release's drop-in written, measured, the unit as recorded put back for the baseline's second block, the kept
    release's drop-in written again), ``rollback`` (eagle3ops' drop-in removed), ``report``, ``status`` and
    ``config check``. The gate's figures are the STAND-IN server's (tests/data/standin_openai_server.py, not vLLM);
    ``--margin 0.9`` keeps the change whatever they are. Then the unit's planted secrets are in no file under the
    state and data dirs and reports/ but the release records (0600, root's), and in no output of the CLI."""
    import json

    from eagle3ops_dev import standin_env

    inv0, name = systemd_host
    inv = _venv_inventory(inv0, tmp_path / "hosts.yaml")
    (tmp_path / "pipeline.yaml").write_text(TINY)
    tgz, _ = standin_env.build("/usr/bin/python3", gate=True)  # the gate decides with numpy
    _sh("docker", "exec", name, "loginctl", "enable-linger", "root")  # logind ends session processes: see above
    _sh("docker", "exec", "-i", name, "sh", "-c", f"mkdir -p {SANDBOX_DIR}/model {SANDBOX_DIR}/data && "
        f"cat > {SANDBOX_DIR}/model/config.json",
        input=json.dumps({"hidden_size": 64, "intermediate_size": 256, "vocab_size": 512}))
    before = _main_argv(name)
    drop = sd.dropin_path(UNIT)
    said, took = [], {}

    def cli(*args: str) -> str:
        t0 = time.monotonic()
        cp = subprocess.run([sys.executable, "-m", "eagle3ops", *args, "--inventory", str(inv)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=600)
        took[" ".join(args[:2])] = round(time.monotonic() - t0, 1)
        said.append(cp.stdout + cp.stderr)
        assert cp.returncode == 0, f"{args}: exit {cp.returncode}\n{cp.stdout[-3000:]}\n{cp.stderr[-3000:]}"
        return cp.stdout

    cli("deploy", "sysv", "--env-tarball", str(tgz))
    pid0 = _sh("docker", "exec", name, "systemctl", "show", "-p", "MainPID", "--value", UNIT).stdout.strip()
    # The driver killed mid-stage: its SSH session closes and logind (KillUserProcesses=yes for root here) ends the
    # session's processes; the supervisor, a user service of the lingering user, finishes the window alone.
    driver = subprocess.Popen([sys.executable, "-m", "eagle3ops", "extract", "sysv", "--run", "r1", "--pipeline",
                               str(tmp_path / "pipeline.yaml"), "--inventory", str(inv)], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wdir, deadline = "", time.monotonic() + 90
    try:
        while time.monotonic() < deadline and driver.poll() is None:  # bounded: 90 s for the window to reach prepare
            started = _sh("docker", "exec", name, "sh", "-c", f"grep -l '\"step\": \"prepare\", \"event\": "
                          f"\"start\"' {SANDBOX_DIR}/state/windows/*-extract-*/journal.jsonl", check=False).stdout
            if started.strip():
                wdir = started.strip().rsplit("/", 1)[0]
                break
            time.sleep(0.3)
    finally:
        driver.kill()
        said.append(driver.communicate(timeout=30)[0])
    assert wdir, f"the window never reached its prepare stage: {said[-1][-3000:]}"
    cgroup = _sh("docker", "exec", name, "sh", "-c", f"cat /proc/$(cat {wdir}/supervisor.pid)/cgroup",
                 check=False).stdout
    assert "/user@0.service/" in cgroup and "eagle3ops-supervisor-" in cgroup, cgroup  # not the session's scope
    result, deadline = "", time.monotonic() + 90
    while not result and time.monotonic() < deadline:  # bounded: the rest of the window, on the host alone
        time.sleep(1)
        result = _sh("docker", "exec", name, "cat", f"{wdir}/result.json", check=False).stdout
    res = json.loads(result or "{}")
    assert res.get("outcome") == "ok" and res.get("stages") == {"prepare": "ok", "extract": "ok"}, (
        res, _sh("docker", "exec", name, "sh", "-c", f"tail -c 3000 {wdir}/supervisor.log", check=False).stdout)
    pid1 = _sh("docker", "exec", name, "systemctl", "show", "-p", "MainPID", "--value", UNIT).stdout.strip()
    assert pid1 != pid0 and _main_argv(name) == before, (pid0, pid1)  # stopped, started as systemd has it
    assert _sh("docker", "exec", name, "test", "-e", drop, check=False).returncode == 1, "a window wrote a drop-in"

    out = cli("release", "sysv", "--gate", "--margin", "0.9", "--arg=--label=three")
    assert json.loads(out.strip().splitlines()[-1])["verdict"] == "keep", out[-2000:]
    assert _main_argv(name) == [*before, "--label=three"]
    assert _sh("docker", "exec", name, "stat", "-c", "%a %u", drop).stdout.split() == ["600", "0"]
    wdir = _sh("docker", "exec", name, "sh", "-c", f"ls -d {SANDBOX_DIR}/state/windows/*-release-gate-*").stdout.split()
    assert len(wdir) == 1, wdir
    journal = [json.loads(x) for x in
               _sh("docker", "exec", name, "cat", f"{wdir[0]}/journal.jsonl").stdout.splitlines()]
    restarts = [e["step"] for e in journal if e.get("event") == "ok" and e["step"] in
                ("restart-baseline", "switch", "rollback", "keep-switch")]
    assert restarts == ["restart-baseline", "switch", "rollback", "keep-switch"], journal
    log = _sh("docker", "exec", name, "cat", f"{wdir[0]}/process/agent.log").stdout
    # the baseline's second block runs the unit as recorded: eagle3ops' drop-in removed, then the kept one written
    assert log.count(f"drop-in {sd.DROPIN_DIR}/{UNIT}.d/{sd.DROPIN_NAME} written") == 3, log
    assert log.count(f"drop-in {sd.DROPIN_DIR}/{UNIT}.d/{sd.DROPIN_NAME} removed") == 1, log

    cli("rollback", "sysv")
    assert _sh("docker", "exec", name, "test", "-e", drop, check=False).returncode == 1, "the rollback left a drop-in"
    assert _main_argv(name) == before and len(_unit_procs(name)) == 2  # the keyed unit as it was, its key included
    cli("report", "sysv", "--run", "r1", "--out", str(tmp_path / "reports"))
    assert any((tmp_path / "reports").rglob("*.html")), "report wrote no page"
    status = cli("status", "sysv")
    assert "rollback" in status and "serving running │ True" in status, status
    cli("config", "check", "sysv")
    assert UNIT in said[-1], said[-1]  # it read the unit
    print(f"CLI on the real systemd (s): {took}")

    copy = tmp_path / "host"
    copy.mkdir()
    tar = subprocess.run(["docker", "exec", name, "tar", "-C", SANDBOX_DIR, "-cf", "-", "state", "data"],
                         capture_output=True, check=True, timeout=60).stdout
    subprocess.run(["tar", "-C", str(copy), "--same-owner", "-xpf", "-"], input=tar, check=True, timeout=60)
    found, records = scan_with_records([copy / "state", copy / "data", tmp_path / "reports"])
    assert found == {}, found
    assert {p.parent.name for p in records} == {"releases", "process"}, records
    assert [private(p, {0}) for p in records] == [None] * len(records), [(p, private(p, {0})) for p in records]
    shown = {i: leaks(o) for i, o in enumerate(said) if leaks(o)}
    assert shown == {}, f"the CLI's output shows the unit's secrets: {shown}"
