"""One conformance suite for every serving kind behind :class:`eagle3ops.supervisor.kinds.ServingKind`: container,
compose, process, the systemd STAND-IN and none, each driven through the same window runner
(:class:`eagle3ops.supervisor.runner.Supervisor`): record → stop → restore, a release switch, ``running``,
``api_key`` and ``keeps_release``; ``none`` refuses every serving step.

The parts, per kind (fast: no sandbox, no vLLM):
- container / compose: the stand-in Docker client of ``test_supervisor_resume`` (containers as dicts) and its
  stand-in health gate (passes while the serving container runs);
- process: the REAL restore agent (POSIX sh, :data:`eagle3ops.commands.process.AGENT_SH`) serving the stand-in
  OpenAI server (``tests/data/standin_openai_server.py``, NOT vLLM), a stand-in ``docker`` that reports the
  supervisor running, and the real health gate;
- systemd: the REAL systemd variant of the agent (:data:`eagle3ops.commands.systemd.AGENT_SH`) with a STAND-IN
  ``systemctl`` on PATH (a small sh script, not systemd: no systemd runs as PID 1 here) that records its argv, prints
  ``systemctl show``-shaped output and starts/stops the same stand-in server; the real health gate. systemd itself
  was not run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eagle3ops.commands import process as pc
from eagle3ops.commands import systemd as sd
from eagle3ops.config import load_inventory
from eagle3ops.config.plan import HealthCheck, Plan, ReleaseChange
from eagle3ops.supervisor.kinds import KINDS
from eagle3ops.supervisor.runner import Supervisor
from secretscan import ORG_NAME, leaks, planted_args, planted_env, private, scan_with_records
from test_supervisor_resume import StandInClient, gate  # noqa: F401 - gate: the stand-in health gate fixture

REPO = Path(__file__).resolve().parents[1]
SERVER = REPO / "tests/data/standin_openai_server.py"
#: Serving's key: planted (``--api-key K --api-key=K``) beside the other secrets of :mod:`secretscan` in every kind's
#: command line and environment.
MODEL = "standin-kinds"
KEY = planted_args()[1]
KINDS_UNDER_TEST = ["container", "compose", "process", "systemd", "none"]

#: STAND-IN of ``systemctl`` (not systemd): one unit, its state in ``$SYSTEMCTL_STANDIN/state``, its argv appended to
#: ``$SYSTEMCTL_STANDIN/calls``; ``start`` runs the unit's ExecStart (``$SYSTEMCTL_STANDIN/exec``) detached.
SYSTEMCTL_STANDIN = r"""#!/bin/sh
s=$SYSTEMCTL_STANDIN
echo "$*" >> "$s/calls"
state=$(cat "$s/state" 2>/dev/null || echo inactive)
case "$1" in
  show)
    echo "ExecStart={ path=$(head -n 1 "$s/exec") ; argv[]=$(tr '\n' ' ' < "$s/exec" | sed 's/ $//') ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }"
    echo "Environment=$(cat "$s/env")"
    echo "ActiveState=$state" ;;
  is-active)
    echo "$state"; [ "$state" = active ] ;;
  stop)
    [ -e "$s/pid" ] && kill "$(cat "$s/pid")" 2>/dev/null
    while [ -e "$s/pid" ] && kill -0 "$(cat "$s/pid")" 2>/dev/null; do sleep 0.1; done
    rm -f "$s/pid"; echo inactive > "$s/state" ;;
  start)
    env $(cat "$s/env") setsid nohup $(tr '\n' ' ' < "$s/exec") >> "$s/out" 2>&1 < /dev/null &
    echo $! > "$s/pid"; echo active > "$s/state" ;;
  kill)
    [ -e "$s/pid" ] && kill -9 "$(cat "$s/pid")" 2>/dev/null; echo failed > "$s/state" ;;
  *) echo "stand-in systemctl: unsupported: $*" >&2; exit 1 ;;
esac
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _up(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.3):
            return True
    except OSError:
        return False


def _wait(pred, timeout=15.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


class _Engine:
    """The Docker engine the supervisor pings (process/systemd kinds use no container)."""

    def ping(self):
        return True


def _plan(tmp_path: Path, serving_kind: str, kind: str = "window", port: int = 1, **kw) -> Plan:
    health = None if serving_kind == "none" else HealthCheck(port=port, model=MODEL, timeout_s=20, interval_s=0.2)
    return Plan(window_id="w1", kind=kind, host="h", user="u", command="c", state_dir=str(tmp_path / "state"),
                serving_container="vllm" if serving_kind in ("container", "compose") else "", health=health,
                stop_timeout_s=5, serving_kind=serving_kind, budget_s=120, **kw)


class World:
    """One kind's serving on a stand-in host: ``supervisor(plan_kind)`` builds the runner, ``serving()`` says
    whether serving answers now."""

    def __init__(self, tmp_path: Path, kind: str):
        self.tmp, self.kind, self.cleanup = tmp_path, kind, []
        (tmp_path / "state").mkdir()
        self.wdir = tmp_path / "w1"
        self.wdir.mkdir()
        self.port = _free_port()
        getattr(self, f"_setup_{kind if kind != 'compose' else 'container'}")()

    # container / compose: the stand-in Docker client
    def _setup_container(self):
        self.client = StandInClient("vllm:1")
        self.client.serving.attrs["Config"]["Env"] = [f"{k}={v}" for k, v in planted_env().items()]
        self.client.serving.attrs["Config"]["Cmd"] = ["/m", "--port", "8000", *planted_args()]
        if self.kind == "compose":
            self.client.serving.attrs["Config"]["Labels"].update({"com.docker.compose.project": "p",
                                                                  "com.docker.compose.service": "vllm"})
        self.serving = lambda: self.client.serving is not None and self.client.serving.status == "running"
        self.extra = {}

    def _setup_none(self):
        self.client = StandInClient("vllm:1")  # a trainer's own container: must be left alone
        self.serving = lambda: False
        self.extra = {}

    # process / systemd: the real agent and the stand-in OpenAI server
    def _agent_env(self, bindir: Path) -> dict[str, str]:
        sup_state = self.tmp / "supervisor-state"
        sup_state.write_text("running")
        (bindir / "docker").write_text(f"#!/bin/sh\ncat {sup_state}\n")  # stand-in docker: the supervisor runs
        (bindir / "docker").chmod(0o755)
        self.cleanup.append(lambda: sup_state.write_text("exited"))
        return {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}

    def _host(self):
        """The sandbox inventory's host with this world's serving port (the agent checks that port after the stop;
        never the sandbox's own serving port)."""
        h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
        return h.model_copy(update={"docker_host": None, "serving": h.serving.model_copy(update={"port": self.port})})

    def _setup_process(self):
        bindir = self.tmp / "bin"
        bindir.mkdir()
        env = self._agent_env(bindir)
        self.pdir = self.wdir / "process"
        proc = subprocess.Popen([sys.executable, str(SERVER), "--port", str(self.port), "--model", MODEL,
                                 *planted_args()],
                                cwd=self.tmp, env={"PATH": os.environ["PATH"], **planted_env()},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        threading.Thread(target=proc.wait, daemon=True).start()  # reaped at once: no zombie for the agent's alive()
        assert _wait(lambda: _up(self.port))
        subprocess.run(pc.record_process(proc.pid, str(self.pdir)), check=True, capture_output=True)
        subprocess.run(pc.start_agent(self._host(), pdir=str(self.pdir), pid=proc.pid, stop_timeout_s=5,
                                      supervisor="sup", limit_s=60), env=env, check=True, timeout=10)
        self.client = _Engine()
        self.serving = lambda: _up(self.port)
        self.extra = {"process_dir": str(self.pdir), "process_pid": proc.pid}
        self.cleanup.append(self._kill_servers)

    def _setup_systemd(self):
        bindir = self.tmp / "bin"
        bindir.mkdir()
        env = self._agent_env(bindir)
        standin = self.tmp / "systemctl-standin"
        standin.mkdir()
        (bindir / "systemctl").write_text(SYSTEMCTL_STANDIN)
        (bindir / "systemctl").chmod(0o755)
        (standin / "exec").write_text("\n".join([sys.executable, str(SERVER), "--port", str(self.port),
                                                 "--model", MODEL, *planted_args()]) + "\n")
        (standin / "env").write_text(" ".join(f"{k}={v}" for k, v in planted_env().items())
                                     + f" PATH={os.environ['PATH']}")
        env["SYSTEMCTL_STANDIN"] = str(standin)
        self.standin, self.pdir = standin, self.wdir / "process"
        subprocess.run(["sh", "-c", f'PATH="{bindir}:$PATH" systemctl start vllm.service'], env=env, check=True)
        assert _wait(lambda: _up(self.port))
        subprocess.run(sd.record_unit("vllm.service", str(self.pdir)), env=env, check=True, capture_output=True)
        subprocess.run(sd.start_agent(self._host(), pdir=str(self.pdir), unit="vllm.service", stop_timeout_s=5,
                                      supervisor="sup", limit_s=60), env=env, check=True, timeout=10)
        self.client = _Engine()
        self.serving = lambda: _up(self.port)
        self.extra = {"process_dir": str(self.pdir), "serving_unit": "vllm.service"}
        self.cleanup.append(self._kill_servers)

    def _kill_servers(self):
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and f"--port\0{self.port}\0".encode() in (d / "cmdline").read_bytes():
                    os.kill(int(d.name), 9)
            except OSError:
                pass

    def supervisor(self, plan_kind: str = "window", wdir: Path | None = None, **kw) -> Supervisor:
        """The runner of a ``plan_kind`` plan in window folder ``wdir`` (default ``w1``), with the inventory's
        secret names (``secret_env``) as the planner passes them."""
        wdir = wdir or self.wdir
        wdir.mkdir(exist_ok=True)
        plan = _plan(self.tmp, self.kind, plan_kind, port=self.port, secret_env=[ORG_NAME], **self.extra, **kw)
        if wdir != self.wdir:
            plan = plan.model_copy(update={"window_id": wdir.name})
        return Supervisor(plan, self.client, wdir)

    def steps(self) -> list[tuple[str, str]]:
        return [(e["step"], e["event"]) for e in map(json.loads, (self.wdir / "journal.jsonl").read_text().splitlines())]


@pytest.fixture(params=KINDS_UNDER_TEST)
def world(request, tmp_path, gate):  # noqa: F811 - the stand-in gate, used by the container kinds only
    if request.param in ("process", "systemd"):
        request.getfixturevalue("monkeypatch").undo()  # the real health gate for the kinds that serve for real
    w = World(tmp_path, request.param)
    yield w
    for f in reversed(w.cleanup):
        f()


def test_every_plan_kind_has_a_serving_kind_under_test():
    assert sorted(KINDS) == sorted(KINDS_UNDER_TEST)


def test_record_stop_restore(world):
    sup = world.supervisor()
    assert sup.kind.name == world.kind
    if not sup.kind.manages:
        for step in (sup.record, sup.stop_serving, sup.restore):
            with pytest.raises(RuntimeError, match="cannot"):
                step()
        assert sup.kind.running() is None and world.client.serving.status == "running"
        return
    assert world.serving()
    sup.record()
    sup.stop_serving()
    assert _wait(lambda: not world.serving(), 10), "stopped"
    assert sup.restore() == "restored"
    assert world.serving() and sup.kind.running() is True
    steps = world.steps()
    for s in ("record", "stop", "restore", "health"):
        assert (s, "ok") in steps, steps
    if world.kind == "systemd":  # the agent drove the (stand-in) systemctl
        calls = (world.standin / "calls").read_text().splitlines()
        assert "stop vllm.service" in calls and calls.count("start vllm.service") == 2, calls
        assert any(c.startswith("show -p ExecStart -p Environment") for c in calls)
        rec = next(e for e in map(json.loads, (world.wdir / "journal.jsonl").read_text().splitlines())
                   if e["step"] == "record" and e["event"] == "ok")
        assert rec["unit"] == "vllm.service" and rec["argv"][1] == str(SERVER) and rec["active"] == "active"


def test_api_key_comes_from_the_serving_configuration(world):
    sup = world.supervisor()
    assert sup.kind.api_key() == (None if world.kind == "none" else KEY)


def test_whole_window_result(world):
    """A window with no stages end to end: the result's serving fields are the kind's."""
    res = world.supervisor().run()
    assert res["serving"] == world.kind and res["outcome"] == "ok", res
    if world.kind == "none":
        assert res["serving_healthy"] is None and res["serving_running"] is None and res["release"] is None
        assert ("serving", "skip") in world.steps()
        return
    assert res["serving_healthy"] is True and res["serving_running"] is True, res
    assert (res["release"] is not None) == (world.kind in ("container", "compose")), res
    assert world.serving()


def test_switch_release(world):
    """A release: containers and processes switch to a new retained release, health-gated; none refuses (there is
    no serving). systemd's releases are drop-ins that only a real systemd reads (and the agent would write one into
    this machine's /etc): met in ``tests/test_systemd_real.py``; here a speculate job's change of the recorded unit
    becomes the drop-in the agent would put in place."""
    if world.kind == "systemd":
        change = ReleaseChange(args=["--label", "two"])
        kind = world.supervisor("speculate", change=change).kind
        new = kind._changed(kind._live(), change)
        assert new["argv"][-2:] == ["--label", "two"] and '"--label" "two"' in new["dropin"], new["dropin"]
        assert f'Environment="{ORG_NAME}={planted_env()[ORG_NAME]}"' in new["dropin"]  # the unit's whole env
        return
    sup = world.supervisor("release", change=ReleaseChange(args=["--label", "two"] if world.kind == "process" else []))
    if world.kind == "none":
        with pytest.raises(RuntimeError, match="not supported|nothing to release|cannot"):
            sup.replace_serving()
        return
    msg = sup.replace_serving()
    assert msg.startswith("serving release "), msg
    n = int(msg.rsplit(" ", 1)[1])
    assert sup.releases.current() == n and sup.kind.keeps_release()
    assert world.serving()
    if world.kind == "process":
        rel = sup.releases.get(n)["process"]
        assert rel["argv"][-2:] == ["--label", "two"] and any(e == f"{ORG_NAME}={planted_env()[ORG_NAME]}"
                                                              for e in rel["environ"])


@pytest.mark.parametrize("kind", ["container", "process", "systemd"])
def test_no_secret_is_written_by_a_window_a_release_or_a_rollback(kind, tmp_path, gate, monkeypatch, capfd):  # noqa: F811
    """Secrets planted in serving's command line (``--api-key K``, ``--api-key=K``, ``--hf-token``) and
    environment (``VLLM_API_KEY``, ``HF_TOKEN``, a name only the inventory lists) of each kind: a window, then (where
    the kind keeps releases) a release and a rollback to the release before it. No file the supervisor writes holds
    a secret and neither does its log (stdout), except the release records (mode 0600, this user's) that
    ``rollback`` recreates serving from; the container rolled back keeps its key."""
    if kind != "container":
        monkeypatch.undo()  # the real health gate for the kinds that serve for real
    w = World(tmp_path, kind)
    try:
        assert w.supervisor().run()["outcome"] == "ok"
        if kind != "systemd":  # systemd releases: on a real systemd (test_systemd_real)
            change = ReleaseChange(args=["--label", "two"] if kind == "process" else [])
            assert w.supervisor("release", wdir=tmp_path / "w2", change=change).run()["outcome"] == "ok"
            assert w.supervisor("rollback", wdir=tmp_path / "w3").run()["outcome"] == "ok"
            assert w.serving()
        if kind == "container":  # recreated from its record: the key it needs is back
            cfg = w.client.serving.attrs["Config"]
            assert KEY in cfg["Cmd"] and f"VLLM_API_KEY={planted_env()['VLLM_API_KEY']}" in cfg["Env"], cfg
    finally:
        for f in reversed(w.cleanup):
            f()
    # what eagle3ops writes (the stand-in systemctl's files beside them are the unit's configuration); serving.log:
    # serving's own output
    found, records = scan_with_records([tmp_path / d for d in ("state", "w1", "w2", "w3")],
                                       also=lambda p: p.name == "serving.log")
    assert found == {}, found
    assert records and [private(p) for p in records] == [None] * len(records)
    assert [private(p) for p in tmp_path.glob("w1/process/serving.log")] in ([], [None])  # serving's own output
    out = capfd.readouterr()
    assert leaks(out.out + out.err) == [], "the supervisor's log (stdout/stderr) shows a secret"


# --- the systemd kind's inventory entry, docs, driver side and parser (pure) ---------------------------------------
def _inv(tmp_path: Path, serving: str):
    p = tmp_path / "hosts.yaml"
    p.write_text("hosts:\n  h:\n    hostname: h\n    data_dir: /d\n    state_dir: /s\n    model_path: /m\n" + serving)
    return load_inventory(p).host("h")


def test_systemd_inventory_entry_is_validated_with_clear_errors(tmp_path):
    from eagle3ops.config import ConfigError

    h = _inv(tmp_path, "    serving: {kind: systemd, unit: vllm.service, port: 8001, served_model_name: m}\n")
    assert (h.serving.kind, h.serving.unit) == ("systemd", "vllm.service")
    with pytest.raises(ConfigError, match=r"hosts\.h\.serving.*kind `systemd` needs `unit`"):
        _inv(tmp_path, "    serving: {kind: systemd, served_model_name: m}\n")
    with pytest.raises(ConfigError, match=r"`unit` is set but `kind` is not `systemd`"):
        _inv(tmp_path, "    serving: {unit: vllm.service, image: i, served_model_name: m}\n")
    with pytest.raises(ConfigError, match=r"not a systemd unit name"):
        _inv(tmp_path, "    serving: {kind: systemd, unit: 'vllm; rm -rf /', served_model_name: m}\n")


def test_config_docs_document_systemd_with_an_example():
    from eagle3ops.config.docs import docs

    text = docs("inventory")
    assert "`systemd`" in text and "serving: {kind: systemd, unit: vllm.service" in text
    assert "stand-in" in text  # says it was not run on a real unit
    assert "kind: systemd, unit: vllm.service" in (REPO / "deploy/hosts.yaml").read_text()


def test_systemd_driver_side_refuses_releases_and_previews_systemctl(tmp_path):
    from eagle3ops.remote import render
    from eagle3ops.window.common import WindowError
    from eagle3ops.window.kinds import SystemdKind, require_serving
    from eagle3ops.window.planner import build_plan, supervisor_commands

    h = _inv(tmp_path, "    serving: {kind: systemd, unit: vllm.service, served_model_name: m}\n")
    for what in ("release", "rollback", "speculate"):
        require_serving(h, what)
    with pytest.raises(WindowError, match=r"systemd unit 'vllm.service'.*frobnicate is not supported"):
        require_serving(h, "frobnicate")
    from eagle3ops.window.run import refuse_release

    class _Answers:  # STAND-IN of a Remote: answers the drop-in check as told, records what was asked
        def __init__(self, ok: bool):
            self.host, self.ok, self.asked = h, ok, []

        def run(self, argv, check=True, **_):
            self.asked.append(list(argv))
            return type("Res", (), {"ok": self.ok, "stdout": "", "stderr": ""})()

    cannot = _Answers(False)
    for what in ("release", "rollback", "speculate"):
        with pytest.raises(WindowError, match=r"cannot write /etc/systemd/system/vllm\.service\.d/ .*SSH in as root"):
            refuse_release(cannot, what, ReleaseChange(args=["--max-num-seqs", "8"]))
    assert cannot.asked[0] == sd.dropin_writable("vllm.service") and cannot.asked[0][-1].endswith("vllm.service.d")
    refuse_release(_Answers(True), "speculate", ReleaseChange(args=["--max-num-seqs", "8"]))
    spec = SystemdKind().speculative_change(h, "/d/runs/r/train/final", 3, "img:1")
    assert spec.image is None and not spec.binds and spec.args[0] == "--speculative-config" \
        and '"/d/runs/r/train/final"' in spec.args[1], spec  # the head at its host path, in the drop-in's argv
    assert "--image" in SystemdKind().release_refusal(h, ReleaseChange(image="x"))
    assert SystemdKind().release_refusal(h, ReleaseChange(args=["--max-num-seqs", "8"])) is None
    plan = build_plan(h, kind="window", window_id="w9", image="i", command="c", stages=["prepare"])
    assert (plan.serving_kind, plan.serving_unit, plan.serving_container) == ("systemd", "vllm.service", "")
    assert plan.process_dir == "/s/windows/w9/process"
    cmds = [render(c) for c in supervisor_commands(h, plan)]
    assert cmds[0].startswith("sh -c") and "systemctl show -p ExecStart -p Environment -p ActiveState vllm.service" \
        in cmds[0] and "/org/freedesktop/systemd1/unit/vllm_2eservice" in cmds[0] \
        and "/etc/systemd/system/vllm.service.d/50-eagle3ops-release.conf" in cmds[0]
    assert "eagle3ops-restore-agent" in cmds[1] and "vllm.service" in cmds[1]
    assert cmds[2] == "systemctl stop vllm.service" and cmds[-2] == "systemctl start vllm.service"
    assert " run --detach " in cmds[3] and cmds[-1].startswith("GET http://127.0.0.1:8000/health")
    rel = build_plan(h, kind="release", window_id="w8", image="i", command="c",
                     change=ReleaseChange(args=["--max-num-seqs", "8"]))
    cmds = [render(c) for c in supervisor_commands(h, rel)]
    assert cmds[2:5] == ["systemctl stop vllm.service", next(c for c in cmds if c.startswith("'# write'")),
                         "systemctl daemon-reload"], cmds
    assert "--max-num-seqs 8" in cmds[3] and cmds[5] == "systemctl start vllm.service" and "roll back" in cmds[7]
    from eagle3ops.speculate.gated import gate_job

    job = gate_job(h, ReleaseChange(args=["--max-num-seqs", "8"]), margin=0.05, passes=3, restarts={})
    gate = build_plan(h, kind="speculate", window_id="w7", image="i", command="c", change=job.change, speculate=job)
    cmds = [render(c) for c in supervisor_commands(h, gate)]
    writes = [i for i, c in enumerate(cmds) if c.startswith("'# write'")]
    assert cmds[0].startswith("'# measure' baseline") and len(writes) == 1 and "--max-num-seqs 8" in cmds[writes[0]] \
        and cmds[writes[0] - 1] == "systemctl stop vllm.service", cmds  # measured, stopped, the drop-in written
    back = cmds.index("'# restore' /etc/systemd/system/vllm.service.d/50-eagle3ops-release.conf 'as recorded "
                      "(/s/windows/w7/process/unit.dropin; none: removed)'")
    assert cmds[back - 1] == "systemctl stop vllm.service" and cmds[back + 1] == "systemctl daemon-reload", cmds
    from eagle3ops.window.kinds import agent_stop_wait_s

    wait = int(agent_stop_wait_s(gate))  # the agent waits out the baseline measured before the first stop request
    assert wait > 600 and any("eagle3ops-restore-agent" in c and f" {wait} " in c for c in cmds), (wait, cmds)


def test_dropin_text_quotes_words_as_systemd_reads_them():
    """The release's drop-in (pure): ExecStart and Environment reset, then the release's words, each double-quoted
    with systemd's escapes (``$`` left in systemd's form: recorded words are unexpanded); a separate argv[0] with the
    ``@`` prefix; bad input refused by name."""
    text = sd.dropin_text(["/opt/v/bin/vllm", "serve", "/m", "--api-key", 'k"1\\', "--chat-template", "a b $HOME 5%"],
                          ["VLLM_API_KEY=sk x", "P=$x%h"])
    assert text.splitlines()[1:] == [
        "[Service]", "ExecStart=",
        'ExecStart="/opt/v/bin/vllm" "serve" "/m" "--api-key" "k\\"1\\\\" "--chat-template" "a b $HOME 5%%"',
        "Environment=", 'Environment="VLLM_API_KEY=sk x"', 'Environment="P=$x%%h"']
    assert 'ExecStart="@/usr/bin/python3.11" "python3" "-m"' in sd.dropin_text(["python3", "-m", "x"], [],
                                                                              path="/usr/bin/python3.11")
    with pytest.raises(ValueError, match="command line"):
        sd.dropin_text([], [])
    with pytest.raises(ValueError, match=r"NAME=VALUE"):
        sd.dropin_text(["/x"], ["NOEQUALS"])
    assert sd.exec_literal("a$b$$") == "a$$b$$$$"  # a word a release adds: passed as it is
    assert sd.unit_object_path("vllm-standin.service") == "/org/freedesktop/systemd1/unit/vllm_2dstandin_2eservice"
    exact = ('{"type":"a(sasbttttuii)","data":[["/bin/bash",["/bin/bash","-c","sleep 1 & exec sleep 2","v"],false,'
             '1,2,0,0,67,0,0]]}')
    assert sd.parse_execstart_json(exact) == ("/bin/bash", ["/bin/bash", "-c", "sleep 1 & exec sleep 2", "v"])
    assert sd.parse_execstart_json("") is None and sd.parse_execstart_json('{"data": []}') is None


def test_parse_show_reads_execstart_and_environment():
    text = ("ExecStart={ path=/opt/venv/bin/vllm ; argv[]=/opt/venv/bin/vllm serve /m --api-key k1 --port 8000 ; "
            "ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }\n"
            'Environment=HF_HOME=/cache "NOTE=two words"\nActiveState=active\n')
    u = sd.parse_show(text)
    assert u["argv"] == ["/opt/venv/bin/vllm", "serve", "/m", "--api-key", "k1", "--port", "8000"]
    assert u["environ"] == ["HF_HOME=/cache", "NOTE=two words"] and u["active"] == "active"
    assert u["path"] == "/opt/venv/bin/vllm"
    assert sd.parse_show("ExecStart=\nEnvironment=\n") == {"argv": [], "environ": [], "active": "", "path": ""}
