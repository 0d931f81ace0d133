"""The speculation gate's power, planned before any restart (fast, no sandbox): the pass CV pooled from the host's
recorded gates, the power at x1.30 printed, a low-power gate refused before anything is written on the host unless
``--accept-low-power`` / ``serving.gate_accept_low_power``, and the CLI's ``--passes`` / ``--accept-low-power``.

The remote below is a STAND-IN for a host reached over SSH (it answers ``find ... result.json`` with the window
results it is given and records every command; nothing else): the power check runs before the first host write, so
only reads reach it on a refusal.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3ops.commands.types import Read
from eagle3ops.config import load_inventory
from eagle3ops.gate import decide as dec
from eagle3ops.speculate import power as pw

REPO = Path(__file__).resolve().parents[1]


def _gate(window_id: str, base: list[float], spec: list[float], c: int = 1) -> dict:
    """A recorded speculate window's result (only what the power reads)."""
    side = lambda rates: {"passes": [{"output_tokens_per_s": x} for x in rates]}
    return {"window_id": window_id, "speculate": {"production_concurrency": c,
                                                 "levels": {str(c): {"baseline": side(base),
                                                                     "speculative": side(spec)}}}}


def test_the_pass_cv_is_pooled_from_the_recorded_gates_and_assumed_without_any():
    assert pw.recorded_pass_cv([]) == (None, 0)
    assert pw.recorded_pass_cv([{"window_id": "w1", "restarts_s": [3.0]}]) == (None, 0)  # not a gate
    results = [_gate("w1", [100, 110, 90], [130, 133, 127]), _gate("w2", [50, 50.5, 49.5], [60, 60, 61])]
    logs = [[math.log(x) for x in side] for side in ([100, 110, 90], [130, 133, 127], [50, 50.5, 49.5], [60, 60, 61])]
    ss = sum(sum((v - sum(s) / len(s)) ** 2 for v in s) for s in logs)
    cv, gates = pw.recorded_pass_cv(results)
    assert gates == 2 and cv == pytest.approx(math.sqrt(math.expm1(ss / 8)))
    # only the newest gates count
    assert pw.recorded_pass_cv(results, newest=1)[0] == pytest.approx(pw.recorded_pass_cv(results[1:])[0])
    plan = pw.power_plan([], passes=3, margin=0.05, accepted=False)
    assert plan.cv == dec.DEFAULT_PASS_CV and plan.recorded_gates == 0 and plan.low and plan.needed == 4
    assert "assumed pass CV of 10%" in plan.lines()[0] and "--passes 4" in plan.lines()[0]
    quiet = pw.power_plan(results[1:], passes=3, margin=0.05, accepted=False)
    assert not quiet.low and quiet.refusal("h") is None and "from its 1 recorded gate" in quiet.lines()[0]
    # several candidates are decided at the Bonferroni level: less power at the same passes
    assert pw.power_plan([], passes=5, margin=0.05, accepted=False, candidates=3).power < \
        pw.power_plan([], passes=5, margin=0.05, accepted=False).power


class _Res:
    def __init__(self, stdout: str = "", ok: bool = True):
        self.stdout, self.stderr, self.ok = stdout, "", ok


class _Remote:
    """STAND-IN remote (see the module doc)."""

    def __init__(self, host, results: list[dict]):
        self.host, self.dry_run, self.results, self.calls = host, False, results, []

    def run(self, argv, *, check=True, timeout=None, stdin=None, **_):
        self.calls.append(argv)
        if argv[0] == "find" and "result.json" in argv:
            return _Res("\n".join(json.dumps(r) for r in self.results))
        if "image" in argv and "inspect" in argv:
            return _Res(json.dumps([{"Config": {"Labels": {"io.eagle3ops.standin": "true"}}}]))
        if "container" in argv and "inspect" in argv:
            return _Res(json.dumps([{"Config": {"Cmd": ["/models/m"], "Env": []}}]))
        return _Res("", ok=False)


def test_a_low_power_gate_is_refused_before_any_restart_and_runs_when_accepted():
    from eagle3ops.speculate import ship

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    h = h.model_copy(update={"serving": h.serving.model_copy(update={"gate_passes": 3, "gate_design": "aba"})})
    r = _Remote(h, [])
    out: list[str] = []
    # the three-block design (serving.gate_design's default): 2 + 3 + 2 passes, 74 % at the assumed 10 % CV
    with pytest.raises(ship.SpeculateError, match=r"gate power: 74% .*3 passes per side \(aba\).* below 80%.*"
                                                  r"--passes 4.*--accept-low-power"):
        ship.speculate(r, ship.SpeculateOptions(run="r1", pipeline_image="p:1"), echo=out.append)
    # the power line is printed (other facts, e.g. the cross-version read, may be printed before it)
    assert any("gate power: 74%" in line for line in out), out
    ab = h.model_copy(update={"serving": h.serving.model_copy(update={"gate_design": "ab"})})
    with pytest.raises(ship.SpeculateError, match=r"gate power: 70% .*3 passes per side \(ab\).* below 80%"):
        ship.speculate(_Remote(ab, []), ship.SpeculateOptions(run="r1", pipeline_image="p:1"), echo=[].append)
    assert r.calls and all(isinstance(c, Read) for c in r.calls), r.calls  # reads only: nothing written
    # the same gate with --passes 4 or accepted: past the power check (the stand-in remote then fails the inspect)
    for opts, host in ((ship.SpeculateOptions(run="r1", pipeline_image="p:1", passes=4), h),
                       (ship.SpeculateOptions(run="r1", pipeline_image="p:1", accept_low_power=True), h),
                       (ship.SpeculateOptions(run="r1", pipeline_image="p:1"),
                        h.model_copy(update={"serving": h.serving.model_copy(update={"gate_accept_low_power": True})})),
                       (ship.SpeculateOptions(run="r1", pipeline_image="p:1"),  # a quiet host: 3 passes suffice
                        h)):
        quiet = [_gate("w1", [100, 100.5, 99.5], [130, 130.4, 129.6])] if opts.passes is None and \
            not opts.accept_low_power and not host.serving.gate_accept_low_power else []
        r, out = _Remote(host, quiet), []
        with pytest.raises(Exception) as e:
            ship.speculate(r, opts, echo=out.append)
        assert "gate power" not in str(e.value), e.value
        writes = [list(c) for c in r.calls if not isinstance(c, Read)]
        assert writes[0] == ["mkdir", "-p", f"{h.state_dir}"], writes  # past the power check: the lock's, first
        assert any(line.startswith("gate power: ") for line in out), out


def test_the_cli_takes_passes_and_accept_low_power():
    from eagle3ops.cli import app

    r = CliRunner().invoke(app, ["speculate", "--help"], env={"COLUMNS": "200"})
    assert "--passes" in r.output and "--accept-low-power" in r.output
    r = CliRunner().invoke(app, ["speculate", "sandbox", "--run", "r1", "--passes", "2",
                                 "--inventory", str(REPO / "deploy/hosts.yaml")])
    assert r.exit_code == 2 and "--passes" in r.output  # at least 3, refused before the host is reached
