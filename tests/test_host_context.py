"""The narrow host context: serving kinds, stage runs and the speculate job receive what they use of the window
(a Protocol in their own module), never the supervisor; the driver's kinds and GPU fit receive what they write of
preflight's record. Pure: an AST scan of each module's reaches into the object it is given, against its Protocol,
and the Protocol against what the runner (or preflight's record) provides; and a stage's end journaled through a
STAND-IN window that has only the Protocol's members (:class:`StandinStageHost`).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from eagle3ops.supervisor import speculate, stagerun
from eagle3ops.supervisor.kinds import base as kind_base
from eagle3ops.supervisor.runner import Supervisor
from eagle3ops.window import gpucheck
from eagle3ops.window.kinds import base as driver_kind_base
from eagle3ops.window.preflight import Preflight

SRC = Path(__file__).resolve().parents[1] / "src/eagle3ops"


def reaches(path: Path, name: str) -> dict[str, list[int]]:
    """``{member: [lines]}`` of every attribute read or set on the object called ``name`` in ``path``: on a bare
    name (``sup.journal``) or on ``self`` (``self.sup.journal``)."""
    found: dict[str, list[int]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        v = node.value
        if (isinstance(v, ast.Name) and v.id == name) or (
                isinstance(v, ast.Attribute) and v.attr == name and isinstance(v.value, ast.Name)
                and v.value.id == "self"):
            found.setdefault(node.attr, []).append(node.lineno)
    return found


def protocol_members(proto: type) -> set[str]:
    """The attributes (annotated) and methods a Protocol class declares itself."""
    own = vars(proto)
    return set(own.get("__annotations__", {})) | {n for n, v in own.items()
                                                  if inspect.isfunction(v) and not n.startswith("__")}


def runner_members() -> set[str]:
    """What a :class:`Supervisor` has: its class's attributes and what its ``__init__`` sets on ``self``."""
    init = ast.parse(inspect.getsource(Supervisor.__init__).strip().replace("\n    ", "\n"))
    set_there = {t.attr for node in ast.walk(init) if isinstance(node, (ast.Assign, ast.AnnAssign))
                 for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                 for t in ast.walk(target)
                 if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return set(dir(Supervisor)) | set_there


SUPERVISOR_SIDE = [
    (kind_base.KindHost, "sup", sorted((SRC / "supervisor/kinds").glob("*.py"))),
    (stagerun.StageHost, "sup", [SRC / "supervisor/stagerun.py"]),
    (speculate.SpeculateHost, "sup", [SRC / "supervisor/speculate.py"]),
]
DRIVER_SIDE = [
    (driver_kind_base.ServingFindings, "pf", sorted((SRC / "window/kinds").glob("*.py"))),
    (gpucheck.GpuFindings, "pf", [SRC / "window/gpucheck.py"]),
]


@pytest.mark.parametrize(("proto", "name", "paths"), SUPERVISOR_SIDE + DRIVER_SIDE,
                         ids=lambda x: x.__name__ if isinstance(x, type) else None)
def test_each_collaborator_reaches_only_what_its_protocol_declares(proto, name, paths):
    """Every ``sup.X`` / ``self.sup.X`` (``pf.X``) in the module is a member of its Protocol: a new reach into the
    runner is declared where the reader sees it, or passed as an argument instead."""
    members = protocol_members(proto)
    used: dict[str, list[str]] = {}
    for path in paths:
        for attr, lines in reaches(path, name).items():
            used.setdefault(attr, []).extend(f"{path.name}:{n}" for n in lines)
    assert used, f"no reach through {name!r} found in {[p.name for p in paths]} (the scan is blind)"
    undeclared = {a: w for a, w in used.items() if a not in members}
    assert undeclared == {}, f"declare these in {proto.__qualname__} or pass them as arguments: {undeclared}"
    unused = members - set(used)
    assert unused == set(), f"{proto.__qualname__} declares members no one uses (drop them): {sorted(unused)}"


@pytest.mark.parametrize("proto", [p for p, _, _ in SUPERVISOR_SIDE], ids=lambda p: p.__name__)
def test_the_runner_provides_every_protocol(proto):
    missing = protocol_members(proto) - runner_members()
    assert missing == set(), f"Supervisor lacks {sorted(missing)} of {proto.__qualname__}"


@pytest.mark.parametrize("proto", [p for p, _, _ in DRIVER_SIDE], ids=lambda p: p.__name__)
def test_preflight_record_provides_every_protocol(proto):
    have = {f.name for f in dataclasses.fields(Preflight)} | set(dir(Preflight))
    missing = protocol_members(proto) - have
    assert missing == set(), f"Preflight lacks {sorted(missing)} of {proto.__qualname__}"


def test_the_reach_scan_sees_names_and_self_attributes(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("def f(sup):\n    sup.journal.log('x')\n    sup.unhealthy = True\n\n\n"
                 "class K:\n    def g(self):\n        return self.sup.plan, self.other.plan, sup2.plan\n")
    assert reaches(p, "sup") == {"journal": [2], "unhealthy": [3], "plan": [8]}


def test_the_runner_members_include_what_init_sets():
    members = runner_members()
    assert {"journal", "plan", "client", "wdir", "releases", "kind", "deadline", "warn", "engine_up"} <= members
    assert "no_such_member" not in members


class StandinStageHost:
    """STAND-IN window for a stage run: only :class:`~eagle3ops.supervisor.stagerun.StageHost`'s members, a real
    journal in a temp folder; ``engine`` says whether the Docker engine answers."""

    def __init__(self, wdir: Path, engine: bool = True):
        from eagle3ops.supervisor.journal import Journal

        self.plan, self.client, self.wdir, self.deadline = None, None, wdir, 0.0
        self.journal = Journal(wdir / "journal.jsonl")
        self.stage_outcomes, self.stage_times = {}, {}
        self.guard_poll_s, self.engine_waits, self.engine = 1.0, 0, engine
        self.warned: list[tuple[str, str]] = []

    def warn(self, step, message):
        self.warned.append((step, message))

    def guard_stopped(self, step):
        pass

    def engine_up(self):
        return self.engine

    def wait_out_engine(self, step, exc):
        return False


def test_a_stage_runs_end_is_journaled_from_what_the_protocol_gives(tmp_path):
    """A stage's outcome and its container's removal need nothing but the Protocol's members: exit 0 is ``ok``;
    another exit names what the stage's log said; a stop's reason replaces the exit; a container the engine could
    not remove is a warning naming the command, or, with the engine down, a journal note."""
    assert protocol_members(stagerun.StageHost) <= set(dir(StandinStageHost(tmp_path)))
    sup = StandinStageHost(tmp_path)
    log = tmp_path / "extract.log"
    log.write_text("loading\nerror: datasets: x.jsonl not found; put it in the run dir\n")
    stagerun._journal_outcome(sup, "prepare", 0, "", 1.04, log)
    stagerun._journal_outcome(sup, "extract", 2, "", 3.0, log)
    stagerun._journal_outcome(sup, "train", None, "budget exceeded", 9.0, log)
    assert sup.stage_outcomes == {"prepare": "ok", "extract": "failed (exited 2: datasets: x.jsonl not found; put "
                                  "it in the run dir)", "train": "failed (budget exceeded)"}
    assert sup.stage_times == {"prepare": 1.0, "extract": 3.0, "train": 9.0}
    assert [(e["step"], e["event"]) for e in sup.journal.entries] == [("prepare", "ok"), ("extract", "error"),
                                                                      ("train", "error")]

    class Stuck:
        def remove(self, force):
            raise RuntimeError("device busy")

    stagerun._remove_stage_container(sup, "extract", Stuck(), "e3-extract")
    assert sup.warned and "docker rm --force e3-extract" in sup.warned[0][1]
    (tmp_path / "down").mkdir()
    down = StandinStageHost(tmp_path / "down", engine=False)
    stagerun._remove_stage_container(down, "extract", Stuck(), "e3-extract")
    assert not down.warned and "removed once it is back" in down.journal.entries[-1]["message"]


def test_a_process_switchs_target_from_what_kindhost_gives(tmp_path):
    """The process kind's target, through a STAND-IN window with only KindHost's members and real release records:
    a release is the live process with the change (a candidate when not live); a rollback goes to ``to_release``,
    else to the release live before, and refuses one that is not a process release."""
    from types import SimpleNamespace

    from eagle3ops.config.plan import ReleaseChange
    from eagle3ops.supervisor.kinds.process import ProcessServing
    from eagle3ops.supervisor.releases import Releases

    releases = Releases(tmp_path)
    live = {"argv": ["vllm", "serve", "/m", "--max-num-seqs", "4"], "environ": ["A=1"], "cwd": "/"}

    def kind(**plan):
        p = SimpleNamespace(**{"kind": "release", "change": None, "window_id": "w1", "to_release": None, **plan})
        host = SimpleNamespace(plan=p, journal=None, releases=releases, client=None, wdir=tmp_path, unhealthy=False,
                               warn=None, gate_through_signal=None, wait_out_engine=None)
        assert protocol_members(kind_base.KindHost) <= set(vars(host))
        return ProcessServing(host)

    first = releases.add_process(live, "w0")
    releases.set_current(first)
    change = ReleaseChange(args=["--max-num-seqs", "8"], env={"A": "2"})
    target, new = kind(change=change)._target(live, first, None, True)
    assert target == first + 1 and new["argv"][-2:] == ["--max-num-seqs", "8"] and new["environ"] == ["A=2"]
    assert releases.get(target)["process"] == new and releases.get(target)["change"] == change.describe()
    cand, _ = kind(kind="speculate", change=change)._target(live, first, None, False)
    assert releases.get(cand)["change"].startswith("candidate: ")
    releases.set_current(target)
    assert kind(kind="rollback", to_release=first)._target(live, target, None, True) == (first, live)
    assert kind(kind="rollback")._target(live, target, None, True) == (first, live)  # the one live before
    (tmp_path / "releases" / f"{first:04d}.json").write_text('{"release": 1, "container": {}}')
    with pytest.raises(RuntimeError, match="release 1 is not a process release"):
        kind(kind="rollback", to_release=first)._target(live, target, None, True)
