"""Group rollouts: the pure plan, and the executor against a STAND-IN balancer and STAND-IN step callables.

The journal and the group lock are the real ones (``GroupJournal`` through this machine's executor, files in a temp
dir). Stand-ins, named: ``StandinBalancer`` (a JSON file of server states recording every ``set_state``: the load
balancer's runtime view, shared across a forked driver) and ``StandinSteps`` (each step appends ``host:action`` to a
file and fails, breaches or kills its own driver where a test says).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from eagle3ops import executor
from eagle3ops.group import rollout as ro
from eagle3ops.group.balancer import ServerState
from eagle3ops.group.execute import StepFailed, StepFns, run_rollout
from eagle3ops.group.journal import GroupJournal, GroupLocked, replay
from eagle3ops.group.status import view

HOSTS = ("a", "b", "c")


class StandinBalancer:
    """STAND-IN for the load balancer: server states in a JSON file; every ``set_state`` recorded with how many
    hosts were out right after it."""

    def __init__(self, path: Path, hosts=HOSTS):
        self.path = path
        if not path.exists():
            path.write_text(json.dumps({"servers": {h: "ready" for h in hosts}, "log": []}))

    def _load(self) -> dict[str, Any]:
        return json.loads(self.path.read_text())

    def states(self) -> dict[str, ServerState]:
        return {h: ServerState(h, s, 0) for h, s in self._load()["servers"].items()}

    def set_state(self, host: str, state: str) -> None:
        d = self._load()
        d["servers"][host] = state
        d["log"].append([host, state, sum(s in ("drain", "maint", "down") for s in d["servers"].values())])
        self.path.write_text(json.dumps(d))

    def force(self, host: str, state: str) -> None:
        """The balancer's own view changing (e.g. its health check marks a host down)."""
        d = self._load()
        d["servers"][host] = state
        self.path.write_text(json.dumps(d))

    @property
    def log(self) -> list[list[Any]]:
        return self._load()["log"]


class StandinSteps:
    """STAND-IN step callables: each appends ``host:action`` to ``ran.txt``; ``fail`` maps ``host:action`` to an
    error (once); ``kill`` a ``host:action`` at which the driver process SIGKILLs itself; ``acceptance`` host →
    figure; ``bake`` a list of interval figures."""

    def __init__(self, d: Path, bal: StandinBalancer, *, fail=(), kill=None, acceptance=None, bake=(),
                 verdict="keep"):
        self.ran, self.bal, self.fail, self.kill = d / "ran.txt", bal, set(fail), kill
        self.acc = acceptance or {}
        self.bake, self.verdict, self.release = list(bake), verdict, {h: 1 for h in HOSTS}

    def _do(self, host: str, action: str) -> None:
        with open(self.ran, "a") as f:
            f.write(f"{host}:{action}\n")
        if f"{host}:{action}" == self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        if f"{host}:{action}" in self.fail:
            self.fail.discard(f"{host}:{action}")  # once: the return's own step succeeds
            raise RuntimeError(f"stand-in failure of {action} on {host}")

    def fns(self) -> StepFns:
        def drain(h):
            self._do(h, "drain"); self.bal.set_state(h, "drain")  # noqa: E702

        def undrain(h):
            self._do(h, "undrain"); self.bal.set_state(h, "ready")  # noqa: E702

        def switch(h):
            self._do(h, "switch")
            return {"release": 2, "previous": 1}

        def switch_back(h, prev):
            self._do(h, f"switch-back-to-{prev}")

        def gate(h):
            self._do(h, "gate")
            return {"verdict": self.verdict, "reason": "stand-in", "release": 2, "previous": 1,
                    "mean_acceptance_length": 2.5,
                    "thresholds": {"acceptance_floor": 2.0, "floor_source": "stand-in",
                                   "request_tokens_per_s_min": 10.0, "baseline_release": 1, "run": "r1"}}

        def bake_sample(h):
            self._do(h, "bake-sample")
            return self.bake.pop(0) if self.bake else None

        return StepFns(drain=drain, undrain=undrain, switch=switch, switch_back=switch_back,
                       health=lambda h: self._do(h, "health"),
                       acceptance=lambda h: (self._do(h, "acceptance"), self.acc.get(h, 2.5))[1],
                       gate=gate, bake_sample=bake_sample)

    def lines(self) -> list[str]:
        return self.ran.read_text().split() if self.ran.exists() else []


class Clock:
    """A clock the bake and the capacity wait advance (no real sleeping)."""

    def __init__(self):
        self.t = 1_000_000.0

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += max(s, 0.001)


def _plan(kind="speculate", on=(), max_out=1, bake_s=120.0, hosts=HOSTS) -> ro.RolloutPlan:
    return ro.plan_rollout("chat", hosts, max_out, kind, "t" * 16, "stand-in release",
                           {h: h in on for h in hosts}, bake_s=bake_s, bake_interval_s=30, bake_sustained_s=0,
                           out_wait_s=60)


def _journal(d: Path, plan: ro.RolloutPlan, rid="r1") -> GroupJournal:
    j = GroupJournal(executor.local(), str(d / "groups" / "chat"))
    j.acquire("eagle3ops group rollout chat")
    if j.current() != rid:
        j.begin(rid, plan)
    else:
        j.use(rid)
    return j


def _run(d: Path, plan, steps: StandinSteps, bal: StandinBalancer, clock=None) -> dict[str, Any]:
    clock = clock or Clock()
    return run_rollout(plan, _journal(d, plan), steps.fns(), bal, echo=lambda m: None, now=clock.now,
                       sleep=clock.sleep, poll_s=5)


# --- the plan (pure) ---

def test_plan_canary_bake_roll_and_skips_hosts_on_target() -> None:
    p = _plan(on=("a",))
    assert p.canary == "b" and p.skipped == ("a",)
    assert [s.key for s in p.steps] == ["b:drain", "b:gate", "b:undrain", "b:bake", "c:drain", "c:switch", "c:health",
                                        "c:acceptance", "c:undrain"]
    r = _plan(kind="rollback")
    assert r.canary is None and r.bake_s == 0 and [s.action for s in r.steps[:5]] == list(ro.ROLL_ACTIONS)
    assert _plan(on=HOSTS).steps == () and ro.RolloutPlan.from_json(json.loads(json.dumps(p.to_json()))) == p
    with pytest.raises(ro.PlanError, match="expected one of"):
        _plan(kind="restart")
    # the host that is out goes back first, never drained again; a drained host never switched is only undrained
    assert [s.key for s in ro.return_steps(["a", "b"], "b")] == [
        "return:b:switch-back", "return:b:health", "return:b:undrain", "return:a:drain", "return:a:switch-back",
        "return:a:health", "return:a:undrain"]
    assert [s.key for s in ro.return_steps(["a"], "b")][:2] == ["return:b:undrain", "return:a:drain"]


def test_a_host_is_on_the_target_only_while_its_releases_container_serves() -> None:
    """``not_on_target`` and ``live_not_release`` (pure): the marker and ``releases/current`` are not enough; the
    live serving container must run and be the one eagle3ops created for that release (the record step's rule),
    or, for a release recorded without an id, carry its label and its settings. The words are the plan's."""
    from eagle3ops.group.steps import live_not_release, not_on_target, on_target

    rec = {"release": 7, "container": {"HostConfig": {"CpusetCpus": "0-3"}}, "container_id": "a" * 64}
    live = {"Id": "a" * 64, "Name": "/vllm", "State": {"Status": "running", "Running": True},
            "Config": {"Labels": {"io.eagle3ops.release": "7"}}, "HostConfig": {"CpusetCpus": "0-3"}}
    marker = {"target": "k1", "label": "args --max-num-seqs 8", "release": 7}
    assert live_not_release(7, rec, live, "container 'vllm'") is None and on_target(marker, 7, "k1", None)
    stopped = {**live, "State": {"Status": "exited", "Running": False}}
    assert live_not_release(7, rec, stopped, "container 'vllm'") == "its serving container 'vllm' is exited"
    assert live_not_release(7, rec, None, "container 'vllm'") == "no serving container (container 'vllm')"
    by_hand = {**live, "Id": "b" * 64}  # recreated outside eagle3ops with the release's label copied
    why = live_not_release(7, rec, by_hand, "container 'vllm'")
    assert why == (f"its serving container is {'b' * 12}, not {'a' * 12}, the one eagle3ops created for release 7 "
                   f"(recreated outside eagle3ops)")
    assert not_on_target(marker, 7, "k1", why) == f"what serves is not its current release 7: {why}"
    # a release recorded by an earlier eagle3ops (no id; adopted.json names another release): label and settings
    old = {k: v for k, v in rec.items() if k != "container_id"}
    assert live_not_release(7, old, by_hand, "c", {"release": 6, "container_id": "a" * 64}) is None
    assert live_not_release(7, old, by_hand, "c", {"release": 7, "container_id": "a" * 64}).startswith(
        f"its serving container is {'b' * 12}")
    assert "not its settings (HostConfig.CpusetCpus)" in live_not_release(
        7, old, {**by_hand, "HostConfig": {"CpusetCpus": "4-7"}}, "c")
    assert "label is '6'" in live_not_release(7, old, {**by_hand, "Config": {"Labels": {
        "io.eagle3ops.release": "6"}}}, "c")
    # the files first: their words do not need what serves
    assert not_on_target({}, 7, "k1", None) == "no group marker: this group never switched it"
    assert not_on_target({**marker, "target": "k0"}, 7, "k1", None) == (
        "its group marker names another release (args --max-num-seqs 8)")
    assert not_on_target(marker, 8, "k1", None) == ("its current release is 8, not the marker's 7: released outside "
                                                    "the group since")
    p = ro.plan_rollout("chat", HOSTS, 1, "release", "k1", "x", {"a": True, "b": False, "c": False},
                        why={"b": "no group marker: this group never switched it"})
    assert p.not_skipped == {"b": "no group marker: this group never switched it", "c": "not on the target"}


# --- the executor ---

def test_full_rollout_keeps_within_max_out_and_reaches_every_host(tmp_path: Path) -> None:
    bal = StandinBalancer(tmp_path / "bal.json")
    steps = StandinSteps(tmp_path, bal, bake=[{"drafts": 10, "accepted": 15, "mean_acceptance_length": 2.5,
                                               "request_output_tokens_per_s": 50.0, "seconds": 30}])
    res = _run(tmp_path, _plan(), steps, bal)
    assert res["outcome"] == "done" and res["switched"] == ["a", "b", "c"]
    assert max(n for _, _, n in bal.log) == 1
    assert steps.lines()[:4] == ["a:drain", "a:gate", "a:undrain", "a:bake-sample"]


def test_failure_on_the_second_host_returns_the_first(tmp_path: Path) -> None:
    bal = StandinBalancer(tmp_path / "bal.json")
    steps = StandinSteps(tmp_path, bal, fail={"b:health"})
    res = _run(tmp_path, _plan(kind="release"), steps, bal)
    assert res["outcome"] == "returned" and "b:health" in res["reason"]
    assert res["returned"] == ["a", "b"] and res["switched"] == []
    ran = steps.lines()
    assert ran[ran.index("b:health") + 1:] == ["b:switch-back-to-1", "b:health", "b:undrain", "a:drain",
                                               "a:switch-back-to-1", "a:health", "a:undrain"]
    assert "c:drain" not in ran and {s.state for s in bal.states().values()} == {"ready"}
    assert max(n for _, _, n in bal.log) == 1


def test_served_acceptance_off_the_canarys_returns(tmp_path: Path) -> None:
    bal = StandinBalancer(tmp_path / "bal.json")
    steps = StandinSteps(tmp_path, bal, acceptance={"b": 2.35},
                         bake=[{"drafts": 10, "accepted": 15, "mean_acceptance_length": 2.5,
                                "request_output_tokens_per_s": 50.0, "seconds": 30}])
    res = _run(tmp_path, _plan(), steps, bal)
    assert res["outcome"] == "returned" and "not within 0.1 of the reference's 2.500" in res["reason"]
    assert res["returned"] == ["a", "b"]
    assert steps.lines()[-7:-3] == ["b:switch-back-to-1", "b:health", "b:undrain", "a:drain"]


def test_bake_breach_aborts_and_returns_the_canary(tmp_path: Path) -> None:
    bal = StandinBalancer(tmp_path / "bal.json")
    good = {"drafts": 10, "accepted": 15, "mean_acceptance_length": 2.5, "request_output_tokens_per_s": 50.0,
            "seconds": 30}
    bad = {**good, "accepted": 5, "mean_acceptance_length": 1.5}
    steps = StandinSteps(tmp_path, bal, bake=[good, bad])
    res = _run(tmp_path, _plan(), steps, bal)
    assert res["outcome"] == "returned" and "acceptance 1.5 < 2.0" in res["reason"]
    ran = steps.lines()
    assert ran[-4:] == ["a:drain", "a:switch-back-to-1", "a:health", "a:undrain"] and "b:drain" not in ran
    assert bal.states()["a"].state == "ready"


def test_gate_refusal_ends_with_the_canary_undrained(tmp_path: Path) -> None:
    bal = StandinBalancer(tmp_path / "bal.json")
    steps = StandinSteps(tmp_path, bal, verdict="rollback")
    res = _run(tmp_path, _plan(), steps, bal)
    assert res["outcome"] == "refused" and steps.lines() == ["a:drain", "a:gate", "a:undrain"]


def test_a_driver_killed_after_a_refusing_gate_ends_refused_on_rerun(tmp_path: Path) -> None:
    bal = StandinBalancer(tmp_path / "bal.json")
    pid = os.fork()
    if pid == 0:
        try:
            _run(tmp_path, _plan(), StandinSteps(tmp_path, bal, verdict="rollback", kill="a:undrain"), bal)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and bal.states()["a"].state == "drain"
    steps = StandinSteps(tmp_path, bal)
    res = _run(tmp_path, _plan(), steps, bal)
    assert res["outcome"] == "refused" and steps.lines()[-1] == "a:undrain" and "a:bake-sample" not in steps.lines()
    assert bal.states()["a"].state == "ready"


def test_a_host_down_on_its_own_counts_as_out(tmp_path: Path) -> None:
    bal = StandinBalancer(tmp_path / "bal.json")
    bal.force("c", "down")
    steps = StandinSteps(tmp_path, bal)
    clock = Clock()
    res = _run(tmp_path, _plan(kind="release", hosts=HOSTS), steps, bal, clock)
    # with c down and max_out 1, a is never drained: the wait is bounded (60 s), then nothing was switched
    assert res["outcome"] == "returned" and "out now: c (down); with a out: 2 of max_out 1" in res["reason"]
    assert steps.lines() == [] and bal.log == [] and clock.t - 1_000_000.0 >= 60
    # with max_out 2 the down host and one drained one fit; c itself (down) is drained without waiting
    bal2 = StandinBalancer(tmp_path / "bal2.json")
    bal2.force("c", "down")
    steps2 = StandinSteps(tmp_path / "two", bal2)
    (tmp_path / "two").mkdir()
    res2 = _run(tmp_path / "two", _plan(kind="release", max_out=2), steps2, bal2)
    assert res2["outcome"] == "done" and max(n for _, _, n in bal2.log) == 2
    # a host an operator put in maintenance is never drained (undraining it would end the maintenance)
    bal3 = StandinBalancer(tmp_path / "bal3.json")
    bal3.force("b", "maint")
    (tmp_path / "three").mkdir()
    steps3 = StandinSteps(tmp_path / "three", bal3)
    res3 = _run(tmp_path / "three", _plan(kind="release", max_out=2), steps3, bal3)
    assert res3["outcome"] == "returned" and "b: in maintenance at the balancer" in res3["reason"]
    assert bal3.states()["b"].state == "maint" and "a:switch-back-to-1" in steps3.lines()


def test_pause_stops_after_the_current_host_and_abort_returns(tmp_path: Path) -> None:
    bal = StandinBalancer(tmp_path / "bal.json")
    plan = _plan(kind="release")
    steps = StandinSteps(tmp_path, bal)
    fns = steps.fns()
    j = _journal(tmp_path, plan)

    def health(h):  # a `group pause` arrives while a is being rolled
        steps._do(h, "health")
        if h == "a":
            _req(j.dir, "pause")

    res = run_rollout(plan, j, StepFns(**{**fns.__dict__, "health": health}), bal, echo=lambda m: None)
    assert res["outcome"] == "paused" and res["next"] == "b" and steps.lines()[-1] == "a:undrain"
    v = view(plan, replay(plan, j.entries()))
    assert v["state"] == "paused before b" and v["next"] == "b:drain" and v["requests"] == []
    assert v["hosts"] == {"a": "on the target", "b": "to roll", "c": "to roll"}
    _req(j.dir, "abort")
    assert view(plan, replay(plan, j.entries()))["state"] == "abort requested"
    res = run_rollout(plan, j, fns, bal, echo=lambda m: None)
    assert res["outcome"] == "aborted" and res["returned"] == ["a"] and "b:drain" not in steps.lines()
    v = view(plan, replay(plan, j.entries()))
    assert v["state"] == "aborted" and v["next"] is None
    assert v["hosts"] == {"a": "returned to its previous release", "b": "untouched", "c": "untouched"}


def _req(d: str, what: str) -> None:
    k = GroupJournal(executor.local(), d)
    k.use("r1")
    k.request(what)


def test_promote_ends_the_bake_early(tmp_path: Path) -> None:
    bal = StandinBalancer(tmp_path / "bal.json")
    plan = _plan(bake_s=3600)
    j = _journal(tmp_path, plan)
    _req(j.dir, "promote")
    steps = StandinSteps(tmp_path, bal)
    clock = Clock()
    res = run_rollout(plan, j, steps.fns(), bal, echo=lambda m: None, now=clock.now, sleep=clock.sleep)
    assert res["outcome"] == "done" and clock.t - 1_000_000.0 < 60
    assert replay(plan, j.entries()).done["a:bake"]["promoted"] is True


@pytest.mark.parametrize("kill_at", ["b:switch", "b:acceptance", "a:bake-sample"])
def test_killed_driver_rerun_resumes(tmp_path: Path, kill_at: str) -> None:
    bal = StandinBalancer(tmp_path / "bal.json")
    plan = _plan(bake_s=60)
    bake = [{"drafts": 10, "accepted": 15, "mean_acceptance_length": 2.5, "request_output_tokens_per_s": 50.0,
             "seconds": 30}] * 4
    pid = os.fork()
    if pid == 0:  # the driver, killed by itself at kill_at
        try:
            _run(tmp_path, plan, StandinSteps(tmp_path, bal, kill=kill_at, bake=bake), bal)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    first = StandinSteps(tmp_path, bal).lines()
    j = GroupJournal(executor.local(), str(tmp_path / "groups" / "chat"))
    taken = j.acquire("x")  # the dead driver's lock is taken over...
    assert taken and f"pid {pid}" in taken and "that process is gone" in taken
    with pytest.raises(GroupLocked, match=r"is held by .*@.* \(pid \d+\) since .*: `x`; wait for it \(its progress: "
                                          r"`eagle3ops group status`\).*--take-over"):  # ...a live driver's is refused
        GroupJournal(executor.local(), str(tmp_path / "groups" / "chat")).acquire("y")
    j.release()
    (tmp_path / "ran.txt").unlink()
    res = _run(tmp_path, plan, StandinSteps(tmp_path, bal, bake=bake), bal)
    again = StandinSteps(tmp_path, bal).lines()
    assert res["outcome"] == "done" and res["switched"] == ["a", "b", "c"]
    host, action = kill_at.split(":")
    # nothing journaled done runs again; the killed step does
    if action == "bake-sample":
        assert "a:gate" in first and again[0] == "a:bake-sample" and "a:gate" not in again
    else:
        assert again[0] == kill_at and f"{host}:drain" in first and f"{host}:drain" not in again
        assert "a:gate" not in again
    assert max(n for _, _, n in bal.log) == 1


# --- the command line: facts read and the plan printed; status and requests (no balancer, no window) ---

class LocalHostExecutor:
    """STAND-IN for the SSH executor of one inventory host: this machine's executor (``executor.local()``) with the
    host's entry, its state_dir a temp dir (the CLI's reads and the journal's writes are real commands). A dry run
    echoes its commands as ``cli_common.remote``'s does: to stdout, or to stderr with ``json_out`` (so that a
    command's JSON on stdout stays one document)."""

    def __init__(self, host, dry_run=False, json_out=False):
        out = sys.stderr if json_out else sys.stdout
        echo = (lambda cmd: print(cmd, file=out)) if dry_run else None
        self.host, self._local = host, executor.local(dry_run=dry_run, echo=echo)

    def __getattr__(self, name):
        return getattr(self._local, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _cli_files(tmp_path: Path, container: str = "vllm") -> tuple[Path, list[str]]:
    """An inventory of hosts a, b, c (state dirs under ``tmp_path``, serving container ``container`` on this
    machine's engine) in group ``chat``; the CLI's options for it."""
    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n" + "".join(
        f"  {h}: {{hostname: 127.0.0.1, state_dir: {tmp_path}/{h}/state, data_dir: {tmp_path}/{h}/data, "
        f"model_path: /m, serving: {{container: {container}, image: img, served_model_name: m, port: 8000}}}}\n"
        for h in HOSTS) + "groups:\n  chat: {hosts: [a, b, c], max_out: 1, balancer: {kind: haproxy, socket: "
                         f"{tmp_path}/haproxy.sock, backend: vllm}}}}\n")
    return inv, ["--inventory", str(inv)]


def _words(res) -> str:
    return " ".join(res.output.split())  # the console wraps long lines


def _invoke(monkeypatch, *args):
    from typer.testing import CliRunner

    from eagle3ops import cli, cli_common

    monkeypatch.setattr(cli_common, "remote", LocalHostExecutor)
    return CliRunner().invoke(cli.app, list(args))


@pytest.fixture
def serving_container():
    """``(name, start)``: ``start()`` (re)creates and starts a container of that name on this machine's engine and
    returns its id. STAND-IN for a host's serving container: the debootstrap minbase running ``sleep`` (the subject
    is the container's identity and state, not what it serves)."""
    import subprocess
    import uuid

    from eagle3ops_dev import bases

    image, name = bases.build_minbase(), f"e3-group-{uuid.uuid4().hex[:6]}"  # present already after `make prebuild`

    def docker(*args: str) -> str:
        return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60, check=True).stdout

    def start() -> str:
        subprocess.run(["docker", "rm", "--force", name], capture_output=True, timeout=60)
        return docker("run", "--detach", "--name", name, "--network", "none", "--entrypoint", "sleep", image,
                      "600").strip()

    start.docker = docker  # type: ignore[attr-defined]
    try:
        yield name, start
    finally:
        subprocess.run(["docker", "rm", "--force", name], capture_output=True, timeout=60)


@pytest.mark.images
def test_cli_dry_run_plans_from_host_facts_and_status_shows_what_comes_next(tmp_path: Path, monkeypatch,
                                                                            serving_container) -> None:
    from eagle3ops.config.plan import ReleaseChange

    name, start = serving_container
    inv, common = _cli_files(tmp_path, name)
    key = ro.release_key("release", ReleaseChange(args=["--max-num-seqs", "8"]).model_dump())
    # a is on the target already: its marker names it, its current release is the marker's, and what serves is the
    # container eagle3ops created for that release (its release file's id)
    (tmp_path / "a/state/releases").mkdir(parents=True)
    (tmp_path / "a/state/releases/current").write_text("7\n")
    first = start()
    (tmp_path / "a/state/releases/0007.json").write_text(json.dumps({"release": 7, "container": {},
                                                                    "container_id": first}))
    (tmp_path / "a/state/groups/chat").mkdir(parents=True)
    (tmp_path / "a/state/groups/chat/live.json").write_text(json.dumps({"target": key, "release": 7}))
    (tmp_path / "b/state/releases").mkdir(parents=True)
    (tmp_path / "b/state/releases/current").write_text("4\n")
    (tmp_path / "b/state/groups/chat").mkdir(parents=True)  # b's marker names it, but b was released since
    (tmp_path / "b/state/groups/chat/live.json").write_text(json.dumps({"target": key, "release": 3}))
    release = ("group", "release", "chat", "--arg", "--max-num-seqs", "--arg", "8", "--dry-run")
    res = _invoke(monkeypatch, *release, "--json", *common)
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["skipped"] == ["a"] and plan["target"] == key and plan["steps"][0]["key"] == "b:drain"
    assert plan["not_skipped"] == {"b": "its current release is 4, not the marker's 3: released outside the group "
                                        "since", "c": "no group marker: this group never switched it"}
    assert not (tmp_path / "a/state/groups/chat/current.json").exists()  # a dry run writes nothing
    # the files unchanged, a is not on the target once what serves is not its release: serving stopped, then
    # recreated outside eagle3ops (same name, a new container id); the plan says why a is not skipped
    start.docker("kill", name)
    res = _invoke(monkeypatch, *release, *common)
    assert res.exit_code == 0 and "skipped (on the target): none" in _words(res), res.output
    assert (f"a not skipped: what serves is not its current release 7: its serving container {name!r} is exited"
            in _words(res)), res.output
    second = start()
    res = _invoke(monkeypatch, *release, "--json", *common)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["not_skipped"]["a"] == (
        f"what serves is not its current release 7: its serving container is {second[:12]}, not {first[:12]}, the "
        f"one eagle3ops created for release 7 (recreated outside eagle3ops)")
    res = _invoke(monkeypatch, "group", "rollout", "chat", "--run", "r1", "--bake", "120", "--dry-run", "--json",
                  *common)
    assert res.exit_code == 0, res.output
    spec = json.loads(res.stdout)  # a speculative release: a (not on its target) is the canary, gated and baked
    assert spec["canary"] == "a" and spec["bake_s"] == 120 and spec["options"] == {"drain_timeout_s": 600.0}
    assert [s["key"] for s in spec["steps"][:5]] == ["a:drain", "a:gate", "a:undrain", "a:bake", "b:drain"]
    # a half-rolled group (the journal as a killed driver left it): status says where it stands and what is next
    p = ro.RolloutPlan.from_json({k: v for k, v in plan.items() if k != "resumes"})
    j = GroupJournal(executor.local(), str(tmp_path / "a/state/groups/chat"))
    j.begin("r1", p)
    for k in ("b:drain", "b:switch", "b:health", "b:acceptance", "b:undrain", "c:drain"):
        j.record(k, "start")
        j.record(k, "done", **({"release": 4, "previous": 3} if k == "b:switch" else {}))
    res = _invoke(monkeypatch, "group", "status", "chat", "--json", *common)
    assert res.exit_code == 0, res.output
    v = json.loads(res.stdout)
    assert v["state"] == "running or interrupted" and v["next"] == "c:switch"
    assert v["hosts"] == {"a": "skipped (on the target already)", "b": "on the target", "c": "out (drained)"}
    res = _invoke(monkeypatch, "group", "pause", "chat", *common)
    assert res.exit_code == 0 and "pause requested for rollout r1" in _words(res)
    assert json.loads(_invoke(monkeypatch, "group", "status", "chat", "--json", *common).stdout)["requests"] == [
        "pause"]
    # another target while this rollout is unfinished is refused, naming it
    res = _invoke(monkeypatch, "group", "release", "chat", "--arg", "--max-num-seqs", "--arg", "16", "--dry-run",
                  *common)
    assert res.exit_code == 1 and "rollout r1 (release to args --max-num-seqs 8) is not finished" in _words(res)


def test_cli_control_requests_dry_run_json_say_what_they_would_do_and_write_nothing(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    """``group promote|pause|abort --dry-run --json``: one JSON document each (the rollout, its journal, the request's
    effect, who acts on it, the one append it would make); nothing written. With no driver holding the group lock,
    abort's plan lists the return this command would run: the drained host undrained first, then each switched
    host returned."""
    from eagle3ops.group.status import request_plan

    inv, common = _cli_files(tmp_path)
    p = ro.plan_rollout("chat", HOSTS, 1, "release", "k1", "args --max-num-seqs 8", {h: False for h in HOSTS})
    d = tmp_path / "a/state/groups/chat"
    j = GroupJournal(executor.local(), str(d))
    j.begin("r1", p)
    for k in ("a:drain", "a:switch", "a:health", "a:acceptance", "a:undrain", "b:drain", "b:switch", "c:drain"):
        j.record(k, "start")
        j.record(k, "done", **({"release": 4, "previous": 3} if k.endswith(":switch") else {}))
    before = (d / "rollouts/r1/journal.jsonl").read_text()
    docs = {}
    for what in ("promote", "pause", "abort"):
        res = _invoke(monkeypatch, "group", what, "chat", "--dry-run", "--json", *common)
        assert res.exit_code == 0, res.output
        docs[what] = json.loads(res.stdout)  # the whole of stdout is one document
        doc = docs[what]
        assert (doc["kind"], doc["group"], doc["rollout"], doc["request"]) == (f"group-{what}", "chat", "r1", what)
        assert doc["journal"] == f"{d}/rollouts/r1/journal.jsonl" and doc["driver"] == "none", doc
        append = f"tee -a {d}/rollouts/r1/journal.jsonl"
        # no driver: promote and pause wait in the journal; abort is this command's, under the group lock
        assert doc["changes"] == ([append] if what != "abort" else [
            f"mkdir -p {d}", f"mkdir {d}/lock", f"tee {d}/lock/holder.json", append, f"rm -rf -- {d}/lock"]), doc
    assert (d / "rollouts/r1/journal.jsonl").read_text() == before  # nothing appended
    assert docs["promote"]["acted_on_by"] == docs["pause"]["acted_on_by"] == "the rollout's command, rerun"
    assert docs["abort"]["acted_on_by"] == "this command (under the group lock)"
    assert docs["abort"]["switched"] == ["a", "b"] and docs["abort"]["out"] == "c"
    assert docs["abort"]["return_steps"] == [
        "return:c:undrain", *(f"return:{h}:{a}" for h in ("b", "a") for a in ro.RETURN_ACTIONS)]
    assert docs["pause"]["return_steps"] == [] and docs["abort"]["lock"] == f"{d}/lock"
    # a return already started resumes where it stands; a running driver acts on the request itself
    st = replay(p, j.entries() + [{"step": "rollout", "event": "return", "switched": ["a", "b"], "out": "c"},
                                  {"step": "return:c:undrain", "event": "done"}])
    assert request_plan(p, st, "abort", False)["return_steps"][0] == "return:b:drain"
    assert request_plan(p, st, "abort", True)["return_steps"] == []
    assert request_plan(p, st, "abort", None)["acted_on_by"] == "the running driver"
    assert request_plan(p, st, "abort", True, take_over=True)["return_steps"][0] == "return:b:drain"
    with pytest.raises(ValueError, match="control request 'resume'"):
        request_plan(p, st, "resume", True)
    res = _invoke(monkeypatch, "group", "pause", "chat", "--json", *common)  # --json is for a dry run's plan
    assert res.exit_code == 2 and "--json prints the plan of a dry run" in _words(res)
    assert (d / "rollouts/r1/journal.jsonl").read_text() == before  # refused before the journal was reached


def test_host_markers_keep_the_release_to_return_to_across_a_killed_driver(tmp_path: Path, monkeypatch) -> None:
    """The real step callables' marker logic (``HostSteps.switch``/``switch_back``) on this machine's files; the
    windows are a STAND-IN (``window``: bumps ``releases/current`` like a release window, or sets it like a
    rollback window), the driver's death during the window a ``BaseException``, and what serves a STAND-IN
    (``serving_not_release``: the window's container, or one recreated outside eagle3ops; the real read is the
    CLI dry run's test)."""
    from eagle3ops.config import load_inventory
    from eagle3ops.group import steps as gs
    from eagle3ops.group.steps import HostSteps, on_target, read_marker

    inv, _ = _cli_files(tmp_path)
    h = load_inventory(inv).host("a")
    cur = tmp_path / "a/state/releases/current"
    cur.parent.mkdir(parents=True)
    cur.write_text("3\n")

    class Killed(BaseException):
        pass

    def window(host, kind, kill=False, **kw):
        n = int(kw["to_release"]) if kind == "rollback" else int(cur.read_text()) + 1
        cur.write_text(f"{n}\n")
        if kill:
            raise Killed()
        return {"outcome": "ok", "release": n, "release_before": n - 1 if kind == "release" else None}

    r = LocalHostExecutor(h)
    steps = HostSteps(group="chat", kind="release", remotes={"a": r}, balancer=StandinBalancer(tmp_path / "b.json"),
                      target="k1", label="stand-in", command="x", images={"a": ("img", None)}, echo=lambda m: None)
    steps._window = lambda host, kind, **kw: window(host, kind, kill=True, **kw)  # type: ignore[method-assign]
    with pytest.raises(Killed):
        steps.switch("a")
    assert read_marker(r, "chat")["pending"] == {"target": "k1", "before": 3}
    steps._window = lambda host, kind, **kw: window(host, kind, **kw)  # type: ignore[method-assign]
    out = steps.switch("a")  # the rerun: the window again (release 5, found 4 live), the release to return to still 3
    assert out == {"release": 5, "previous": 3}
    m = read_marker(r, "chat")
    recreated = "its serving container is 0123456789ab, not ba9876543210, the one eagle3ops created for release 5"
    live = {"why": None}
    monkeypatch.setattr(gs, "serving_not_release", lambda r, n: live["why"])
    assert on_target(m, 5, "k1") and "pending" not in m and steps.switch("a")["repeated"] is True
    live["why"] = recreated  # serving recreated by hand since: the switch's rerun runs the window again, whose
    # record step records the live container as release 6 before it releases 7
    steps._window = lambda host, kind, **kw: (cur.write_text("7\n"), {  # type: ignore[method-assign]
        "outcome": "ok", "release": 7, "release_before": 6})[1]
    assert not on_target(m, 5, "k1", recreated) and steps.switch("a") == {"release": 7, "previous": 6}
    assert read_marker(r, "chat")["previous"] == {"release": 6}
    steps._window = lambda host, kind, **kw: window(host, kind, **kw)  # type: ignore[method-assign]
    live["why"] = None
    steps.switch_back("a", 3)
    assert cur.read_text().strip() == "3" and read_marker(r, "chat") == {}


def test_the_release_to_return_to_is_the_one_the_window_found_live(tmp_path: Path, monkeypatch) -> None:
    """A host whose marker is left from an earlier rollout (release 1, its rollback) and whose serving was
    provisioned again since: the switch's window records the live container as a new release (15) before it
    releases 16. The marker's ``previous``, the step's return target and a later group rollback's target are that
    release 15, as the window's record step found it, never the stale marker's release 1 nor the driver's read of
    ``releases/current`` before the window (1). The same for the canary's gate (its ``baseline_release``). Windows
    and the speculate job are STAND-INs (results as the supervisor writes them)."""
    from eagle3ops.config import load_inventory
    from eagle3ops.group.steps import HostSteps, read_marker
    from eagle3ops.speculate import ship, watch

    inv, _ = _cli_files(tmp_path)
    h = load_inventory(inv).host("a")
    cur = tmp_path / "a/state/releases/current"
    cur.parent.mkdir(parents=True)
    cur.write_text("1\n")
    stale = {"target": "old-rollback", "label": "the releases before the last rollout", "release": 1,
             "previous": {"target": "old-rollout", "release": 6, "previous": {}}}
    (tmp_path / "a/state/groups/chat").mkdir(parents=True)
    (tmp_path / "a/state/groups/chat/live.json").write_text(json.dumps(stale))
    asked = []

    def window(host, kind, **kw):
        asked.append((kind, kw.get("to_release")))
        if kind == "rollback":
            cur.write_text(f"{kw['to_release']}\n")
            return {"outcome": "ok", "release": kw["to_release"], "release_before": 16}
        cur.write_text("16\n")  # the record step recorded the live container as 15, then the release: 16
        return {"outcome": "ok", "release": 16, "release_before": 15}

    r = LocalHostExecutor(h)
    mk = lambda kind, target: HostSteps(  # noqa: E731
        group="chat", kind=kind, remotes={"a": r}, balancer=StandinBalancer(tmp_path / "b.json"), target=target,
        label=kind, command="x", images={"a": ("img", None)}, echo=lambda m: None)
    steps = mk("release", "k1")
    steps._window = window  # type: ignore[method-assign]
    assert steps.switch("a") == {"release": 16, "previous": 15}
    assert read_marker(r, "chat")["previous"] == {"release": 15}
    back = mk("rollback", "rb1")
    back._window = window  # type: ignore[method-assign]
    back.switch("a")
    assert asked[-1] == ("rollback", 15) and cur.read_text().strip() == "15"

    # the canary's gate: the speculate job's baseline is the release its record step found live
    cur.write_text("1\n")
    (tmp_path / "a/state/groups/chat/live.json").write_text(json.dumps(stale))
    monkeypatch.setattr(ship, "speculate", lambda r, opts, echo=None: {
        "verdict": "keep", "reason": "kept", "live_release": 13, "baseline_release": 11, "run": "r1",
        "spec_decode": {"mean_acceptance_length": 1.3}})
    monkeypatch.setattr(watch, "gate_result_for", lambda r, n: None)
    canary = mk("speculate", "k2")
    canary.speculate_options = {"a": None}
    out = canary.gate("a")
    assert out["previous"] == 11 and read_marker(r, "chat")["previous"] == {"release": 11}


def test_cli_group_rollback_plans_the_hosts_on_the_last_finished_release(tmp_path: Path, monkeypatch) -> None:
    inv, common = _cli_files(tmp_path)
    res = _invoke(monkeypatch, "group", "rollback", "chat", "--dry-run", *common)
    assert res.exit_code == 1 and "no finished rollout to roll back" in _words(res)
    plan = _plan(kind="release")
    j = GroupJournal(executor.local(), str(tmp_path / "a/state/groups/chat"))
    j.begin("r1", plan)
    j.record("rollout", "end", outcome="done")
    for h, target in (("a", plan.target), ("b", plan.target), ("c", "another")):
        (tmp_path / f"{h}/state/groups/chat").mkdir(parents=True, exist_ok=True)
        (tmp_path / f"{h}/state/groups/chat/live.json").write_text(json.dumps({"target": target, "release": 4}))
    res = _invoke(monkeypatch, "group", "rollback", "chat", "--dry-run", "--json", *common)
    assert res.exit_code == 0, res.output
    rb = json.loads(res.stdout)
    assert rb["kind"] == "rollback" and rb["skipped"] == ["c"] and [s["host"] for s in rb["steps"]][::5] == ["a", "b"]
    assert rb["target"] == ro.release_key("rollback", {"from": plan.target})


def test_a_busy_gate_stops_the_rollout_as_it_is_and_a_rerun_goes_on(tmp_path: Path) -> None:
    from eagle3ops.group.execute import StepBusy

    bal = StandinBalancer(tmp_path / "bal.json")
    plan = _plan(bake_s=0)
    steps = StandinSteps(tmp_path, bal)
    fns = steps.fns()

    def busy(h):
        raise StepBusy(f"{h}: its deploy lock is held by a running window")

    with pytest.raises(StepBusy):
        run_rollout(plan, _journal(tmp_path, plan), StepFns(**{**fns.__dict__, "gate": busy}), bal, echo=lambda m: None)
    j = GroupJournal(executor.local(), str(tmp_path / "groups" / "chat"))
    j.use("r1")
    st = replay(plan, j.entries())
    assert st.out == "a" and st.interrupted == "a:gate" and not st.returning and st.switched == []
    j.release()
    res = _run(tmp_path, plan, steps, bal)
    assert res["outcome"] == "done" and steps.lines()[:2] == ["a:drain", "a:gate"]
    assert steps.lines().count("a:drain") == 1  # the canary stayed drained: not drained again


def test_cli_run_under_the_group_lock_exits_by_outcome_and_a_rerun_resumes(tmp_path: Path, monkeypatch) -> None:
    """The CLI's run path (lock, journal, exit status) with the STAND-IN balancer and step callables in place of the
    real ones (``group_cli._steps`` replaced; the HAProxy balancer it is given is never asked)."""
    from eagle3ops import group_cli

    inv, common = _cli_files(tmp_path)
    bal = StandinBalancer(tmp_path / "bal.json")
    made = {}

    class Made:
        def __init__(self, steps):
            self.steps, self.balancer = steps, bal

        def fns(self):
            return self.steps.fns()

        def close(self):
            pass

    def steps_for(name, hosts, remotes, balancer, plan, command, **kw):
        made["steps"] = StandinSteps(tmp_path, bal, kill=made.get("kill"))
        return Made(made["steps"])

    monkeypatch.setattr(group_cli, "_steps", steps_for)
    args = ["group", "release", "chat", "--arg", "--max-num-seqs", "--arg", "8", *common]
    made["kill"] = "b:health"
    pid = os.fork()
    if pid == 0:  # the driver, killed at b's health step
        try:
            _invoke(monkeypatch, *args)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and (tmp_path / "a/state/groups/chat/lock").is_dir()
    v = json.loads(_invoke(monkeypatch, "group", "status", "chat", "--json", *common).stdout)
    assert v["next"] == "b:health" and v["lock"]["pid"] == pid and v["hosts"]["b"] == "out (drained), on the target"
    made["kill"] = None
    res = _invoke(monkeypatch, *args)  # the rerun takes the dead driver's lock over and goes on from b:health
    assert res.exit_code == 0, res.output
    roll = ["drain", "switch", "health", "acceptance", "undrain"]
    # the killed driver's steps, then the rerun's: b's health again, nothing journaled done repeated
    assert "that process is gone" in _words(res) and made["steps"].lines() == [
        *(f"a:{x}" for x in roll), "b:drain", "b:switch", "b:health", *(f"b:{x}" for x in roll[2:]),
        *(f"c:{x}" for x in roll)]
    assert not (tmp_path / "a/state/groups/chat/lock").exists()
    assert json.loads(_invoke(monkeypatch, "group", "status", "chat", "--json", *common).stdout)["state"] == "done"
    res = _invoke(monkeypatch, "group", "abort", "chat", *common)
    assert res.exit_code == 1 and "no unfinished rollout to abort" in _words(res)


def test_cli_abort_with_no_driver_returns_the_switched_hosts_under_the_group_lock(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """``group abort`` of a rollout whose driver is gone: this command takes the group lock, journals the abort and
    returns the switched hosts (the drained one undrained first), exit 3 (aborted), the lock given back; the
    STAND-IN balancer and step callables stand in for the real ones (``group_cli._steps`` replaced)."""
    from eagle3ops import group_cli

    inv, common = _cli_files(tmp_path)
    bal = StandinBalancer(tmp_path / "bal.json")
    steps = StandinSteps(tmp_path, bal)

    class Made:
        balancer = bal

        def fns(self):
            return steps.fns()

        def close(self):
            pass

    monkeypatch.setattr(group_cli, "_steps", lambda *a, **kw: Made())
    p = ro.plan_rollout("chat", HOSTS, 1, "release", "k1", "args --max-num-seqs 8", {h: False for h in HOSTS})
    d = tmp_path / "a/state/groups/chat"
    j = GroupJournal(executor.local(), str(d))
    j.begin("r1", p)
    for k in ("a:drain", "a:switch", "a:health", "a:acceptance", "a:undrain", "b:drain"):
        j.record(k, "start")
        j.record(k, "done", **({"release": 4, "previous": 3} if k.endswith(":switch") else {}))
    bal.set_state("b", "drain")
    res = _invoke(monkeypatch, "group", "abort", "chat", *common)
    assert res.exit_code == 3, res.output
    assert "no driver holds the group lock" in _words(res) and "group chat: aborted" in _words(res)
    assert steps.lines() == ["b:undrain", "a:drain", "a:switch-back-to-3", "a:health", "a:undrain"]
    entries = j.entries()
    assert [e["event"] for e in entries if e["step"] == "control"] == ["abort"]
    assert entries[-1]["event"] == "end" and entries[-1]["outcome"] == "aborted"
    assert not (d / "lock").exists() and bal.states()["b"].state == "ready"


def test_cli_rollout_passes_force_to_every_hosts_gate_options(tmp_path: Path, monkeypatch) -> None:
    """``group rollout --force`` reaches each host's ``SpeculateOptions`` (a head from elsewhere that a host cannot
    estimate offline is measured, as ``speculate --force``); without it, none has it. The step callables are
    replaced by a STAND-IN that records what it is given and stops the run."""
    from eagle3ops import cli_common, group_cli

    _, common = _cli_files(tmp_path)
    seen: dict = {}

    def steps_for(name, hosts, remotes, balancer, plan, command, **kw):
        seen["options"] = kw["speculate_options"]
        raise RuntimeError("stand-in steps: stop here")

    monkeypatch.setattr(cli_common, "deployed_record", lambda r: {"image": "pipe:1", "image_id": None})
    monkeypatch.setattr(group_cli, "_steps", steps_for)
    for flag, want in ((["--force"], True), ([], False)):
        seen.clear()
        _invoke(monkeypatch, "group", "rollout", "chat", "--run", "r1", *flag, *common)
        assert sorted(seen["options"]) == ["a", "b", "c"]
        assert {o.force for o in seen["options"].values()} == {want}


class RecordingBalancer:
    """STAND-IN wrapper around the real balancer: passes every call through and records, after each ``set_state``,
    how many hosts the real HAProxy reports out."""

    def __init__(self, real):
        self.real, self.log = real, []

    def states(self):
        return self.real.states()

    def set_state(self, host: str, state: str) -> None:
        self.real.set_state(host, state)
        self.log.append([host, state, sum(s.state != "ready" for s in self.real.states().values())])


def test_real_haproxy_drain_health_acceptance_and_bake_readings_against_standin_servers(tmp_path: Path) -> None:
    """``HostSteps``' drain (the REAL HAProxy's sessions through its runtime API, and the server's own /metrics
    queue), health, served acceptance and bake readings over real HTTP, in front of two STAND-IN OpenAI servers
    (``tests/data/standin_openai_server.py``, NOT vLLM: speculation SIMULATED with ``--spec-acceptance``), one per
    host; the windows are a STAND-IN (``_window``: a release number written like a release window). b serves 1.9
    where the first host serves 2.2: the roll returns both, never more than max_out 1 out."""
    import subprocess
    import sys
    import time

    import httpx

    from eagle3ops.config import load_inventory
    from eagle3ops.group.haproxy import HaproxyBalancer, SocketRuntime
    from eagle3ops.group.steps import HostSteps
    from eagle3ops.speculate.ship import gate_prompts
    from eagle3ops_dev.haproxylocal import LocalHaproxy, free_port

    repo = Path(__file__).resolve().parents[1]
    ports = {h: free_port() for h in ("a", "b")}
    procs = [subprocess.Popen(
        [sys.executable, str(repo / "tests/data/standin_openai_server.py"), "--port", str(ports[h]), "--model",
         "tiny", "--token-ms", "0.2", "--speculative-config", json.dumps({"method": "eagle3",
                                                                           "num_speculative_tokens": 3}),
         "--spec-acceptance", str(acc)], stdout=subprocess.DEVNULL) for h, acc in (("a", 2.2), ("b", 1.9))]
    steps = None
    try:
        inv = tmp_path / "hosts.yaml"
        inv.write_text("hosts:\n" + "".join(
            f"  {h}: {{hostname: 127.0.0.1, state_dir: {tmp_path}/{h}/state, data_dir: {tmp_path}/{h}/data, "
            f"model_path: /m, serving: {{kind: process, process_match: 'standin_openai_server.py --port {p}', "
            f"served_model_name: tiny, port: {p}, health_timeout_s: 30, gate_max_tokens: 16}}}}\n"
            for h, p in ports.items()))
        hosts = {h: load_inventory(inv).host(h) for h in ports}
        for h, p in ports.items():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"http://127.0.0.1:{p}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            Path(tmp_path, h, "state/releases").mkdir(parents=True)
            Path(tmp_path, h, "state/releases/current").write_text("1\n")
        with LocalHaproxy(tmp_path / "haproxy", {"s1": ports["a"], "s2": ports["b"]}, check_inter_ms=200) as lb:
            bal = RecordingBalancer(HaproxyBalancer(SocketRuntime(str(lb.admin_socket)), "vllm",
                                                    {"a": "s1", "b": "s2"}))
            deadline = time.monotonic() + 10
            while {s.state for s in bal.states().values()} != {"ready"} and time.monotonic() < deadline:
                time.sleep(0.05)
            steps = HostSteps(group="chat", kind="release", remotes={h: LocalHostExecutor(hosts[h]) for h in hosts},
                              balancer=bal, target="k1", label="stand-in", command="x",
                              images={h: ("img", None) for h in hosts},
                              prompts=[p.request for p in gate_prompts(4)], echo=lambda m: None,
                              quiet_s=0.5)  # the drain's quiet span shortened: 3 drains here

            def window(host, kind, **kw):
                cur = Path(tmp_path, host, "state/releases/current")
                n = int(kw["to_release"]) if kind == "rollback" else int(cur.read_text()) + 1
                cur.write_text(f"{n}\n")
                return {"outcome": "ok", "release": n}

            steps._window = window  # type: ignore[method-assign]
            assert steps.bake_sample("a") is None  # the first reading
            httpx.post(f"http://127.0.0.1:{lb.port}/v1/completions", timeout=30,  # live traffic through HAProxy
                       json={"model": "tiny", "prompt": "x", "max_tokens": 16, "stream": True})
            httpx.post(f"http://127.0.0.1:{lb.port}/v1/completions", timeout=30,  # round robin: one reaches a
                       json={"model": "tiny", "prompt": "x", "max_tokens": 16, "stream": True})
            fig = steps.bake_sample("a")
            assert fig and fig["mean_acceptance_length"] == pytest.approx(2.2, abs=0.3)
            plan = _plan(kind="release", hosts=("a", "b"))
            res = _run(tmp_path, plan, type("S", (), {"fns": lambda self: steps.fns()})(), bal)
            assert res["outcome"] == "returned" and "b: served mean acceptance length 1.9" in res["reason"]
            assert "within 0.1 of the reference's 2.2" in res["reason"] and res["returned"] == ["a", "b"]
            assert [Path(tmp_path, h, "state/releases/current").read_text().strip() for h in "ab"] == ["1", "1"]
            assert {s.state for s in bal.states().values()} == {"ready"}
            assert [(h, st) for h, st, _ in bal.log] == [("a", "drain"), ("a", "ready"), ("b", "drain"),
                                                         ("b", "ready"), ("a", "drain"), ("a", "ready")]
            assert max(n for _, _, n in bal.log) == 1
    finally:
        if steps is not None:
            steps.close()
        for p in procs:
            p.terminate()
            p.wait(timeout=10)


def test_a_rolled_host_gets_the_release_the_canarys_gate_kept(tmp_path: Path) -> None:
    """``HostSteps.switch`` of a speculative rollout on a process host: the head given with ``--head`` uploaded to the
    rolled host (real ``tar`` through this machine's executor), the speculative length the canary's kept gate result
    names (read from its audit and attempt folder, as a new driver would); the window a STAND-IN capturing the
    change; no head and no trained run on the host is refused, naming --head."""
    from eagle3ops.config import load_inventory
    from eagle3ops.speculate.prechecks import SpeculateOptions
    from eagle3ops.group.steps import HostSteps

    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n" + "".join(
        f"  {h}: {{hostname: 127.0.0.1, state_dir: {tmp_path}/{h}/state, data_dir: {tmp_path}/{h}/data, "
        f"model_path: /m, serving: {{kind: process, process_match: 'vllm serve', served_model_name: m, "
        f"port: 8000}}}}\n" for h in ("a", "b")))
    hosts = {h: load_inventory(inv).host(h) for h in ("a", "b")}
    attempt = tmp_path / "a/data/runs/r1/speculate/0123/w1"
    attempt.mkdir(parents=True)
    (attempt / "result.json").write_text(json.dumps({"verdict": "keep", "num_speculative_tokens": 5,
                                                     "serving_image": "", "live_release": 2}))
    (tmp_path / "a/state/groups/chat").mkdir(parents=True)
    (tmp_path / "a/state/groups/chat/live.json").write_text(json.dumps({"target": "k1", "release": 2}))
    (tmp_path / "a/state/audit.jsonl").write_text(json.dumps({"kind": "speculate", "run": "r1", "attempt_dir": str(
        attempt), "figures": {"speculative_release": 2}}) + "\n")
    (tmp_path / "b/state/releases").mkdir(parents=True)
    (tmp_path / "b/state/releases/current").write_text("7\n")
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text('{"architectures": ["Eagle3Speculator"]}')
    seen = []

    def steps_with(head_dir):
        opts = {h: SpeculateOptions(run="r1", pipeline_image="img", head=head_dir) for h in hosts}
        st = HostSteps(group="chat", kind="speculate", remotes={h: LocalHostExecutor(hosts[h]) for h in hosts},
                       balancer=StandinBalancer(tmp_path / "b.json", hosts=("a", "b")), target="k1", label="x",
                       command="x", images={h: ("img", None) for h in hosts}, speculate_options=opts, canary="a",
                       echo=lambda m: None)
        st._window = lambda host, kind, **kw: seen.append((host, kind, kw["change"])) or {  # type: ignore
            "outcome": "ok", "release": 8}
        return st

    with pytest.raises(StepFailed, match="run r1 has no trained head here.*--head DIR"):
        steps_with(None).switch("b")
    assert seen == []
    out = steps_with(head).switch("b")
    assert out == {"release": 8, "previous": 7}
    host, kind, change = seen[0]
    spec = json.loads(change.args[change.args.index("--speculative-config") + 1])
    assert (host, kind, spec["num_speculative_tokens"]) == ("b", "release", 5)
    assert Path(spec["model"]).parent == tmp_path / "b/data/heads" and (Path(spec["model"]) / "config.json").is_file()
