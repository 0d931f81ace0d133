"""Like for like: every measured release's identity (image, id, labels, argv, vLLM's ``/version``) is
recorded, a speculative image unlike the live one is refused by the driver naming both unless ``--control``, and
the host's decision is ``undecided`` for unlike measurements (pure, with the driver's stand-in remote of
``test_speculate_ship``). The control path on real vLLM (a control release measured, then the speculative one) is
``test_speculate_ship``'s sandbox keep test."""

from __future__ import annotations

import json

import pytest

from eagle3ops.commands import speculate as sc
from eagle3ops.config import load_inventory
from eagle3ops.config.plan import SpeculateJob
from eagle3ops.gate.like import ReleaseIdentity, control_change, unlike, without_flags
from eagle3ops.speculate import ship
from eagle3ops.supervisor.speculate import decide_measured
from test_speculate_ship import REPO, _FakeRemote, _Res

SPEC_ARGS = sc.speculative_args(num_speculative_tokens=3, cpu=True)
FLAGS = {"--speculative-config", "--override-generation-config"}
ARGV = ["vllm", "serve", "/models/m", "--port", "8000", "--block-size", "16"]


def _id(**kw) -> ReleaseIdentity:
    return ReleaseIdentity(**{"image": "serving:patched", "image_id": "sha256:" + "a" * 64,
                              "labels": {"io.eagle3ops.profile": "p"}, "argv": ARGV, "vllm_version": "0.16.0", **kw})


def test_releases_alike_but_for_the_speculative_flags_are_comparable():
    assert unlike(_id(), _id(argv=ARGV + SPEC_ARGS), change_flags=FLAGS) is None
    # a process: no image on either side; the argv decides
    assert unlike(_id(image=None, image_id=None), _id(image=None, image_id=None, argv=ARGV + SPEC_ARGS),
                  change_flags=FLAGS) is None


def test_another_image_another_vllm_or_another_flag_is_named():
    why = unlike(_id(image="vllm-openai-local:v0.16.0", image_id="sha256:" + "b" * 64), _id(argv=ARGV + SPEC_ARGS),
                 change_flags=FLAGS)
    assert why and "images differ" in why and "vllm-openai-local:v0.16.0 (id sha256:bbbbbbbbbbbb" in why
    assert "serving:patched (id sha256:aaaaaaaaaaaa" in why
    # ids unknown: the references decide
    assert unlike(_id(image_id=None, image="a:1"), _id(image_id=None), change_flags=FLAGS)
    assert "vLLM versions differ: baseline 0.15.1, speculative 0.16.0" in unlike(
        _id(vllm_version="0.15.1"), _id(argv=ARGV + SPEC_ARGS), change_flags=FLAGS)
    why = unlike(_id(), _id(argv=ARGV + ["--max-num-seqs", "8"] + SPEC_ARGS), change_flags=FLAGS)
    assert "command lines differ" in why and "'--max-num-seqs', '8'" in why
    # an unanswered /version is not a difference
    assert unlike(_id(vllm_version=None), _id(argv=ARGV + SPEC_ARGS), change_flags=FLAGS) is None


def test_the_control_release_drops_only_the_speculative_config():
    ctl = control_change(SPEC_ARGS)
    assert "--speculative-config" not in ctl and ctl == ["--override-generation-config", '{"temperature": 0.0}']
    assert without_flags(["a", "--x=1", "--y", "--z", "2", "b"], ["--x", "--y", "--z"]) == ["a", "b"]


def test_recorded_argv_has_no_api_key():
    argv = ["vllm", "serve", "--api-key", "K1", "--api-key=K2", "sh -c 'vllm serve m --api-key K3 --port 1'"]
    out = json.dumps(ReleaseIdentity(argv=argv).figures())
    assert "K1" not in out and "K2" not in out and "K3" not in out and out.count("***") == 3


def test_the_driver_refuses_unlike_images_naming_both_unless_control():
    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    live, spec = ("eagle3ops/vllm-openai-local:v0.16.0", "sha256:" + "b" * 64), ("serving:patched", None)
    with pytest.raises(ship.SpeculateError) as e:
        ship.check_like_for_like(h, live, spec, control=False)
    msg = str(e.value)
    assert "eagle3ops/vllm-openai-local:v0.16.0" in msg and "serving:patched" in msg and "--control" in msg
    assert "not on the host yet" in msg and "eagle3ops release sandbox --image serving:patched" in msg
    fig = ship.check_like_for_like(h, live, spec, control=True)
    assert fig["like_for_like"] is False and fig["control"] is True
    same = ship.check_like_for_like(h, live, (live[0], live[1]), control=False)
    assert same["like_for_like"] is True
    with pytest.raises(ship.SpeculateError, match="drop --control"):
        ship.check_like_for_like(h, live, live, control=True)
    # the same id under another reference is the same image
    assert ship.check_like_for_like(h, live, ("other:tag", live[1]), control=False)["like_for_like"] is True


class _LiveImageRemote(_FakeRemote):
    """The driver's stand-in remote, whose serving container runs the local base image."""

    def run(self, argv, stdin=None, check=True, timeout=None):
        if "ps" in argv and "--all" in argv:
            return _Res("vllm-serving\n")
        if "inspect" in argv and "{{.Config.Image}} {{.Image}}" in argv:
            return _Res(f"eagle3ops/vllm-openai-local:v0.16.0 sha256:{'b' * 64}\n")
        if "image" in argv and "inspect" in argv:  # the speculative image is on the host
            return _Res(f"sha256:{'a' * 64}\n")
        return super().run(argv, stdin=stdin, check=check, timeout=timeout)


def test_speculate_refuses_before_any_window_and_plans_the_control_with_one_more_restart(monkeypatch):
    from eagle3ops.window import run as window_run

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    windows: list[dict] = []
    monkeypatch.setattr(window_run, "run_window", lambda r_, *, kind, **kw: windows.append(kw) or {"outcome": "dry"})
    r = _LiveImageRemote(h, [7], results=json.dumps({"window_id": "w0", "restarts_s": [20.0, 40.0]}))
    with pytest.raises(ship.SpeculateError, match="vllm-openai-local.*serving:patched.*--control"):
        ship.speculate(r, ship.SpeculateOptions(run="r1", pipeline_image="p:1", serving_image="serving:patched"),
                       echo=lambda *_: None)
    assert windows == [] and not any(a[:1] == ["mkdir"] for a in r.calls)  # nothing written on the host
    r = _LiveImageRemote(h, [7], results=json.dumps({"window_id": "w0", "restarts_s": [20.0, 40.0]}))
    r.dry_run = True
    said: list[str] = []
    res = ship.speculate(r, ship.SpeculateOptions(run="r1", pipeline_image="p:1", serving_image="serving:patched",
                                                  control=True), echo=said.append)
    job = windows[0]["speculate"]
    assert job.control is not None and job.control.image == "serving:patched" and not job.control.binds
    assert "--speculative-config" not in job.control.args and "--override-generation-config" in job.control.args
    assert res["restarts"]["restarts_keep"] == 2 and res["restarts"]["restarts_rollback"] == 3
    assert any("2 if kept, 3 if rolled back" in m for m in said)
    assert any("control release (serving:patched without --speculative-config)" in m for m in said)


def test_arg_flags_go_on_the_speculative_release_and_its_control_alike_and_are_recorded(monkeypatch):
    """``speculate --arg``: the flags a speculative image needs (vLLM 0.32's ``--block-size=32`` on CPU) set on the
    speculative release and its control baseline by release's own rule (``set_args``), recorded in the plan; refused
    without ``--control``, for ``--speculative-config`` and for a flag the candidate sets itself, before the host."""
    from eagle3ops.window import run as window_run

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    windows: list[dict] = []
    monkeypatch.setattr(window_run, "run_window", lambda r_, *, kind, **kw: windows.append(kw) or {"outcome": "dry"})
    r = _LiveImageRemote(h, [7], results=json.dumps({"window_id": "w0", "restarts_s": [20.0, 40.0]}))
    r.dry_run = True
    opts = ship.SpeculateOptions(run="r1", pipeline_image="p:1", serving_image="serving:patched", control=True,
                                 args=("--block-size=32", "--max-num-seqs", "4"))
    res = ship.speculate(r, opts, echo=lambda *_: None)
    job = windows[0]["speculate"]
    assert job.change.args[:3] == ["--block-size=32", "--max-num-seqs", "4"]
    assert job.change.args[3] == "--speculative-config"
    assert job.control.args == ["--block-size=32", "--max-num-seqs", "4", *control_change(job.change.args[3:])]
    assert job.figures["server_args"] == ["--block-size=32", "--max-num-seqs", "4"]
    assert res["speculative_change"]["args"] == job.change.args
    # the host's like-for-like check: control and speculative differ by the speculative flags only
    base = ["vllm", "serve", "/m", "--block-size", "16"]
    from eagle3ops.commands.serving import set_args
    from eagle3ops.gate.like import flag_names

    assert unlike(_id(argv=set_args(base, job.control.args)), _id(argv=set_args(base, job.change.args)),
                  change_flags=flag_names(job.change.args)) is None
    # refusals, before the host is reached (check_invocation runs before the inventory is read)
    with pytest.raises(ship.SpeculateError, match=r"--arg --block-size: .*need --control"):
        ship.check_invocation("sandbox", ship.SpeculateOptions(run="r", pipeline_image="", args=("--block-size=32",)))
    with pytest.raises(ship.SpeculateError, match=r"--arg --api-key: ") as e:  # named, its value not shown
        ship.check_invocation("sandbox", ship.SpeculateOptions(run="r", pipeline_image="", args=("--api-key", "sk-S3")))
    assert "sk-S3" not in str(e.value)
    with pytest.raises(ship.SpeculateError, match=r"--arg --speculative-config: speculate sets it"):
        ship.check_invocation("sandbox", ship.SpeculateOptions(run="r", pipeline_image="", control=True,
                                                               args=("--speculative-config", "{}")))
    with pytest.raises(ship.SpeculateError, match=r"--arg --override-generation-config: the speculative release "
                                                  r"sets it itself"):
        ship.candidates_for(h, ship.SpeculateOptions(run="r", pipeline_image="", control=True, args=(
            "--override-generation-config", "{}")), "/h", 3, "serving:patched")
    # --control on the live image itself is the live release with the --arg flags: not refused then
    live = ("eagle3ops/vllm-openai-local:v0.16.0", "sha256:" + "b" * 64)
    assert ship.check_like_for_like(h, live, live, control=True, server_args=["--block-size=32"])["control"] is True


def _measurement(tps: float, release: ReleaseIdentity, passes: int = 3, prompts: int = 4) -> dict:
    per = [16] * prompts
    secs = [16 / tps] * prompts
    fig = {"concurrency": 1, "requests": prompts, "errors": 0, "output_tokens": 16 * prompts,
           "wall_s": sum(secs), "output_tokens_per_s": tps, "itl_ms_median": 1000 / tps, "itl_ms_p90": 1000 / tps,
           "ttft_ms_median": 10.0, "foreign_requests": 0, "prompt_tokens": per, "prompt_seconds": secs,
           "prompt_ttft_ms": [10.0] * prompts}
    counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": {}, "requests_running": 0}
    after = {"drafts": 100, "draft_tokens": 300, "accepted": 200, "accepted_per_pos": {"0": 90, "1": 70, "2": 40},
             "requests_running": 0}
    return {"levels": {"1": [fig] * passes}, "counters": {"1": [[counters, after]] * passes},
            "release": release.figures()}


def test_the_host_never_decides_across_unlike_measured_releases(tmp_path):
    job = SpeculateJob(run="r", head="/h", head_sha256="0" * 64, results_dir=str(tmp_path), prompts=["a"] * 4,
                       change={"args": SPEC_ARGS, "image": "serving:patched"}, levels=[1], max_tokens=16, passes=3,
                       margin=0.05, acceptance_floor=1.3)
    spec = _measurement(30.0, _id(argv=ARGV + SPEC_ARGS))
    verdict, reason, _ = decide_measured(job, _measurement(10.0, _id()), spec)
    assert verdict == "keep", reason
    verdict, reason, figures = decide_measured(
        job, _measurement(10.0, _id(image="local:v0.16.0", image_id="sha256:" + "b" * 64)), spec)
    assert verdict == "undecided" and "unlike releases measured" in reason and "local:v0.16.0" in reason
    assert figures["would_have_been"]["verdict"] == "keep" and "--control" in reason


# --- prompt sets: one table per set, cut from the same passes ------------------------------------------------------

def _lr(tokens: list[int], secs: list[float], c: int = 1):
    from eagle3ops.gate.replay import LevelResult

    wall = sum(x for x in secs if x is not None)
    return LevelResult(concurrency=c, requests=len(tokens), errors=0, output_tokens=sum(tokens), wall_s=wall,
                       output_tokens_per_s=sum(tokens) / wall, itl_ms_median=None, itl_ms_p90=None,
                       ttft_ms_median=10.0, foreign_requests=0, prompt_tokens=tokens, prompt_seconds=secs,
                       prompt_ttft_ms=[10.0] * len(tokens))


def test_each_prompt_set_gets_its_own_table_from_the_same_passes():
    from eagle3ops.gate.decide import set_tables, subset_pass

    # chat prompts (0, 1) speed up x2 under speculation, code prompts (2, 3) x1: the whole is in between
    base = {1: [_lr([16, 16, 16, 16], [1.0, 1.0, 1.0, 1.0]) for _ in range(3)]}
    spec = {1: [_lr([16, 16, 16, 16], [0.5, 0.5, 1.0, 1.0]) for _ in range(3)]}
    cut = subset_pass(base[1][0], [2, 3])
    assert (cut.output_tokens, cut.wall_s, list(cut.prompt_tokens)) == (32, 2.0, [16, 16])
    t = set_tables(base, spec, {"chat": [0, 1], "code": [2, 3]}, production_concurrency=1)
    assert t["chat"]["prompts"] == 2 and t["chat"]["levels"]["1"]["throughput_ratio"] == 2.0
    assert t["code"]["levels"]["1"]["throughput_ratio"] == 1.0
    assert t["chat"]["levels"]["1"]["interval"]["low"] == pytest.approx(2.0)
    bad = {1: [_lr([16, 16], [1.0, None]) for _ in range(3)]}  # a failed request: the set says why
    assert "error" in set_tables(bad, bad, {"x": [0, 1]}, production_concurrency=1)["x"]


def test_a_prompts_file_names_its_set_and_humaneval_joins_as_code(tmp_path):
    from eagle3ops.speculate import prompts as pr

    f = tmp_path / "chat.jsonl"
    f.write_text(json.dumps({"prompt": "hi"}) + "\n" + json.dumps({"prompt": "yo", "set": "support"}) + "\n")
    got = pr.from_jsonl(f)
    assert [p.set for p in got] == ["chat", "support"]
    opts = ship.SpeculateOptions(run="r", pipeline_image="p", prompts_file=f, with_humaneval=True)
    prompts, source = ship.select_gate(opts, 3)
    assert [p.set for p in prompts] == ["chat", "support", "code", "code", "code"]
    assert ship.prompt_sets(prompts) == {"chat": [0], "support": [1], "code": [2, 3, 4]}
    assert source["source"] == "prompts file + HumanEval gate split" and source["humaneval_prompts"] == 3
    clash = tmp_path / "code.jsonl"
    clash.write_text(json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(ship.SpeculateError, match='set "code"'):
        ship.select_gate(ship.SpeculateOptions(run="r", pipeline_image="p", prompts_file=clash,
                                               with_humaneval=True), 3)
    bad = tmp_path / "b.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "set": ""}) + "\n")
    with pytest.raises(pr.GatePromptsError, match=r"b.jsonl:1: `set` must be a non-empty string"):
        pr.from_jsonl(bad)


def test_the_host_reports_the_sets_beside_the_decision(tmp_path):
    job = SpeculateJob(run="r", head="/h", head_sha256="0" * 64, results_dir=str(tmp_path), prompts=["a"] * 4,
                       change={"args": SPEC_ARGS}, levels=[1], max_tokens=16, passes=3, margin=0.05,
                       acceptance_floor=1.3, prompt_sets={"chat": [0, 1], "code": [2, 3]})
    verdict, _, figures = decide_measured(job, _measurement(10.0, _id()), _measurement(30.0, _id(argv=ARGV + SPEC_ARGS)))
    assert verdict == "keep" and set(figures["sets"]) == {"chat", "code"}
    assert figures["sets"]["code"]["levels"]["1"]["throughput_ratio"] == pytest.approx(3.0)


def test_a_rollback_for_acceptance_still_reports_the_interval(tmp_path):
    """The demo's gate prints the interval whatever rule decides (its first run rolled back for
    acceptance, and its result had no interval)."""
    job = SpeculateJob(run="r", head="/h", head_sha256="0" * 64, results_dir=str(tmp_path), prompts=["a"] * 4,
                       change={"args": SPEC_ARGS}, levels=[1], max_tokens=16, passes=3, margin=0.05,
                       acceptance_floor=3.5)  # the counters below give 3.0: below this floor
    verdict, reason, figures = decide_measured(job, _measurement(10.0, _id()),
                                               _measurement(30.0, _id(argv=ARGV + SPEC_ARGS)))
    assert verdict == "rollback" and "below the floor 3.5" in reason
    assert figures["interval"]["point"] == pytest.approx(3.0) and figures["interval"]["low"] > 2.5
