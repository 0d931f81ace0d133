"""``eagle3ops release --gate``: a serving change measured against the live release by the same host-side
job as ``speculate`` (:mod:`eagle3ops.supervisor.speculate`, ``rule="not_slower"``), kept only when not slower beyond
the margin.

Driver side, fast: the job :func:`eagle3ops.speculate.gated.gated_release` hands the host (the window stubbed at
the module boundary, ``eagle3ops.window.run.run_window``). Host side: the real window runner
(:class:`eagle3ops.supervisor.runner.Supervisor`) carries out that job on a ``process`` host serving the STAND-IN
OpenAI server (``tests/data/standin_openai_server.py``, NOT vLLM: ``--token-ms`` sets its speed), with the real
restore agent, measurement and decision: a faster flag change is kept, a slower one rolled back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import eagle3ops.window.run as window_run
from eagle3ops.config import load_inventory
from eagle3ops.config.plan import ReleaseChange
from eagle3ops.speculate import gated, ship
from secretscan import leaks, release_record, scan
from test_speculate_job import JOB_MARGIN, KEY, JobWorld

REPO = Path(__file__).resolve().parents[1]


class _Res:
    def __init__(self, stdout: str = "", ok: bool = True):
        self.stdout, self.stderr, self.ok = stdout, "", ok


class _Remote:
    """Answers every command with nothing (no recorded restart); records every command."""

    def __init__(self, dry_run: bool = False):
        self.host = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
        self.dry_run, self.calls = dry_run, []

    def run(self, argv, *, check=True, timeout=None, stdin=None, **_):
        self.calls.append((list(argv), stdin))
        return _Res("")


@pytest.fixture()
def gate(monkeypatch):
    """Run ``gated_release`` with the host's job answering ``attempt``; returns (result, windows run, remote)."""
    def run(attempt: dict | None = None, dry_run: bool = False, design: str | None = None, **kw):
        r, windows, said = _Remote(dry_run), [], []
        if design:  # serving.gate_design (the tests' inventory: ab, the sandbox's restarts cost CI time)
            r.host = r.host.model_copy(update={"serving": r.host.serving.model_copy(update={"gate_design": design})})

        def stub_window(r_, **w):
            windows.append(w)
            if r_.dry_run:
                return {"plan": "printed"}
            return {"outcome": "ok", "window_id": "w-gate", "restarts_s": [12.0], "speculate": attempt}

        monkeypatch.setattr(window_run, "run_window", stub_window)
        change = kw.pop("change", ReleaseChange(args=["--max-num-seqs", "64"], env={"NCCL_ALGO": "Ring"}))
        res = gated.gated_release(r, change, pipeline_image="p:1", pipeline_image_id="sha256:1", echo=said.append,
                                  **kw)
        return res, windows, r, said

    return run


@pytest.mark.parametrize("design,keep,back", [("ab", 1, 2), ("aba", 4, 3)])
def test_the_gated_release_is_one_host_job_with_the_not_slower_rule(gate, design, keep, back):
    res, windows, r, said = gate({"verdict": "keep", "reason": "not slower", "live_release": 4}, design=design)
    assert res["verdict"] == "keep" and res["window_id"] == "w-gate" and res["restarts_s"] == [12.0]
    assert [w["kind"] for w in windows] == ["speculate"]  # one locked job on the host: no second window
    job = windows[0]["speculate"]
    s = r.host.serving
    assert job.rule == "not_slower" and job.acceptance_floor is None and job.head is None and job.run is None
    assert job.change.args == ["--max-num-seqs", "64"] and job.margin == s.gate_margin
    assert job.results_dir == f"{r.host.state_dir}/gates" and job.latest is None
    assert len(job.prompts) == s.gate_prompts and job.levels == list(s.gate_concurrency)
    assert job.passes == s.gate_passes and job.prompt_sets == {"code": list(range(s.gate_prompts))}
    assert job.figures["restarts"]["restarts_keep"] == keep and job.figures["restarts"]["restarts_rollback"] == back
    assert job.design == design and job.figures["restarts"]["design"] == design
    assert ["mkdir", "-p", job.results_dir] in [argv for argv, _ in r.calls]
    assert any(f"serving restarts: {keep} if kept, {back} if rolled back" in line for line in said)
    # the order of the passes, printed before the restarts (aba splits the baseline's passes, rounded up)
    order = next(line for line in said if line.startswith(f"gate design {design}: "))
    again = f"measure it again x {(s.gate_passes + 1) // 2}"
    assert (again in order) == (design == "aba") and ("not measured" in order) == (design == "ab"), order


def test_a_gate_with_no_change_says_it_is_an_a_a_check(gate):
    """``release --gate`` with no --arg/--env/--image measures the live spec against a copy of itself: said before
    the job runs (a change that measured even is not mistaken for it); a real change gets no such note."""
    _, _, _, said = gate({"verdict": "keep", "reason": "not slower", "live_release": 4}, change=ReleaseChange())
    assert said[0].startswith("note: no change given") and "A/A check" in said[0] and "sandbox" in said[0]
    _, _, _, said = gate({"verdict": "keep", "reason": "not slower", "live_release": 4})
    assert not any("no change given" in line for line in said)


def test_an_error_of_the_job_is_raised_naming_where_serving_is(gate):
    with pytest.raises(ship.SpeculateError, match="measuring failed; rolled back to release 3"):
        gate({"verdict": "error", "reason": "measuring failed", "rollback": "rolled back to release 3"})


def test_the_dry_run_prints_the_restarts_and_the_plan_and_changes_nothing(gate):
    res, windows, r, said = gate(dry_run=True)
    assert res["verdict"] == "dry-run" and res["release_plan"] == {"plan": "printed"}
    assert windows[0]["speculate"].rule == "not_slower"
    assert not any(argv[0] == "mkdir" for argv, _ in r.calls)
    assert said[0].startswith("# dry run: would measure the live release and the changed one")


def test_a_negative_margin_is_refused_before_anything_runs(gate):
    with pytest.raises(ship.SpeculateError, match="is negative"):
        gate({}, margin=-0.1)


# --- the host's supervisor carries the gated release out ---------------------------------------------------------

@pytest.fixture
def gate_world(tmp_path):
    JobWorld.server_args = ["--token-ms", "25"]
    w = JobWorld(tmp_path, "process")
    yield w
    for f in reversed(w.cleanup):
        f()


@pytest.mark.parametrize("token_ms,verdict", [("10", "keep"), ("80", "rollback")], ids=["faster", "slower"])
def test_the_supervisor_keeps_a_faster_flag_change_and_rolls_back_a_slower_one(gate_world, tmp_path, token_ms,
                                                                               verdict, capfd):
    """The job :func:`gated.gate_job` builds, cut to 4 prompts x 16 tokens at concurrency 1 (the gate's resolution
    is tests/test_gate_simulation.py's), on a stand-in server at 25 ms a token: ``--token-ms 10`` (x2.5) is kept,
    ``--token-ms 80`` (x0.31) rolled back to the release live before (at 45 ms, x0.56, a loaded CI machine measured
    x0.634 [x0.547-x0.792], undecided); result, audit line and lock as for speculate."""
    h = gate_world._host()
    job = gated.gate_job(h, ReleaseChange(args=["--token-ms", token_ms]), margin=JOB_MARGIN, passes=3,
                         restarts={}).model_copy(update={
                             "results_dir": str(tmp_path / "state/gates"), "prompts": [f"def f{i}():" for i in range(4)],
                             "prompt_sets": {"code": [0, 1, 2, 3]}, "levels": [1], "max_tokens": 16,
                             "warmup_prompts": 2, "idle_timeout_s": 20, "request_timeout_s": 20,
                             # the TTFT rule has its own tests (tests/test_speculate.py): on two shared cores a
                             # stand-in's first token moved x1.6 by load alone (a busy machine, 2026-12-04)
                             "ttft_ratio_max": 4.0})
    sup = gate_world.supervisor("speculate", speculate=job, change=job.change)
    lock = Path(sup.plan.state_dir) / "lock"
    lock.mkdir()
    (lock / "details.json").write_text(json.dumps({"window_id": sup.plan.window_id}))
    res = sup.run()
    attempt = res["speculate"]
    assert attempt["verdict"] == verdict, attempt["reason"]
    assert attempt["rule"] == "not_slower" and attempt["acceptance_floor"] is None
    assert res["outcome"] == "ok" and res["serving_healthy"] is True and not lock.exists()
    folder = Path(job.results_dir) / sup.plan.window_id
    stored = json.loads((folder / "result.json").read_text())
    assert stored["change"]["args"] == ["--token-ms", token_ms] and stored["head"] is None
    low, high = stored["interval"]["low"], stored["interval"]["high"]
    assert (low >= 1 - JOB_MARGIN) if verdict == "keep" else (high < 1 - JOB_MARGIN), stored["interval"]
    argv = gate_world.live_argv()
    assert argv[argv.index("--token-ms") + 1] == (token_ms if verdict == "keep" else "25")
    assert stored["live_release"] == (stored["speculative_release"] if verdict == "keep"
                                      else stored["baseline_release"])
    # a plain rollback afterwards never brings back the rejected change (it was live only while measured)
    from eagle3ops.supervisor.releases import Releases

    rels = Releases(Path(sup.plan.state_dir))
    target, why = rels.rollback_target(rels.current())
    if verdict == "keep":
        assert target == stored["baseline_release"], why
    else:
        assert target is None and f"passed over: {stored['speculative_release']} (rejected by a gate" in why, why
    rel = stored["measured_releases"]
    assert "--token-ms" in rel["baseline"]["argv"] and KEY not in json.dumps(stored)
    audit = [json.loads(x) for x in (Path(sup.plan.state_dir) / "audit.jsonl").read_text().splitlines()]
    assert audit[-1]["kind"] == "release-gate" and audit[-1]["verdict"] == verdict
    assert audit[-1]["figures"]["rule"] == "not_slower" and audit[-1]["figures"]["change"]["args"][0] == "--token-ms"
    # serving's planted secrets (secretscan): in no file of the gate but the release records, nor in its log
    found = scan([tmp_path], allowed=lambda p: release_record(p) or p.name == "serving.log"
                 or p.parent.name == "bin" or p.name == "supervisor-state")
    assert found == {}, found
    assert leaks("".join(capfd.readouterr())) == []


# --- `release --env`: NCCL settings and other environment changes, values never logged --------------------------

def test_release_env_is_checked_before_the_host_and_its_values_stay_out_of_the_command_line(monkeypatch):
    """``--env NAME=VALUE`` ("NCCL settings") becomes the change's environment; a word without ``=`` is a
    usage error (exit 2) naming ``--env`` and the fix before any host is reached; the command line that goes to the
    lock and the audit log shows the names, never the values (nor an ``--api-key`` given as a flag)."""
    import sys

    from typer.testing import CliRunner

    from eagle3ops import cli
    from eagle3ops.cli_common import env_pairs

    assert env_pairs(["NCCL_ALGO=Ring", "X=a=b"], "--env") == {"NCCL_ALGO": "Ring", "X": "a=b"}
    res = CliRunner().invoke(cli.app, ["release", "sandbox", "--gate", "--env", "NCCL_ALGO", "--inventory",
                                       str(REPO / "deploy/hosts.yaml")])
    assert res.exit_code == 2 and "--env NCCL_ALGO" in res.output and "NAME=VALUE" in res.output
    monkeypatch.setattr(sys, "argv", ["eagle3ops", "release", "h", "--env", "HF_TOKEN=hf_s3cret", "--env=A=b",
                                      "--arg", "--api-key", "--arg", "k3y", "--gate"])
    line = cli._command_line()
    assert "hf_s3cret" not in line and "k3y" not in line and "A=b" not in line
    assert "HF_TOKEN=***" in line and "--env=A=***" in line and "--gate" in line
