"""``eagle3ops speculate``: the head check (pure), the gate's host commands, the inventory keys, the host-side
helper's file readers; and, on the sandbox, both branches of the gate end to end (random heads; the keep branch
with a margin named as negative)."""

from __future__ import annotations

import json
import os
import shlex
import struct
from pathlib import Path

import pytest

from eagle3ops.commands import speculate as sc
from eagle3ops.config import load_inventory
from eagle3ops.config.inventory import NEGATIVE_MARGIN_ENV
from eagle3ops.speculate import headcheck as hk
from eagle3ops.speculate import onhost
from eagle3ops.window.common import current_release

REPO = Path(__file__).resolve().parents[1]
TARGET = {"architectures": ["LlamaForCausalLM"], "hidden_size": 128, "vocab_size": 2048, "num_hidden_layers": 4}
#: The layout of a head the train stage writes (speculators 0.3.0 save_pretrained, as on the sandbox).
HEAD = {"architectures": ["Eagle3DraftModel"], "draft_vocab_size": 1024, "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
        "speculators_model_type": "eagle3", "target_hidden_size": None,
        "speculators_config": {"algorithm": "eagle3", "verifier": {"architectures": ["LlamaForCausalLM"],
                                                                    "name_or_path": "/model"}},
        "transformer_layer_config": {"hidden_size": 128, "vocab_size": 2048, "num_hidden_layers": 1}}
SHAPES = {"d2t": [1024], "t2d": [2048], "lm_head.weight": [1024, 128], "fc.weight": [128, 384]}


def _with(d: dict, path: str, value) -> dict:
    out = json.loads(json.dumps(d))
    cur = out
    *parents, last = path.split(".")
    for p in parents:
        cur = cur[p]
    cur[last] = value
    return out


def test_a_trained_head_fits_its_target():
    facts = hk.check_head(HEAD, SHAPES, TARGET)
    assert (facts.hidden_size, facts.draft_vocab_size, facts.aux_layer_ids) == (128, 1024, [1, 2, 3])
    assert facts.verifier_architectures == ["LlamaForCausalLM"] and facts.warnings == []
    nested = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": TARGET}  # wrapper targets
    hk.check_head(_with(HEAD, "speculators_config.verifier.architectures", nested["architectures"]), SHAPES, nested)


@pytest.mark.parametrize("head,shapes,field,fix", [
    (_with(HEAD, "transformer_layer_config.hidden_size", 256), SHAPES, "hidden_size", "train the head"),
    (_with(HEAD, "target_hidden_size", 7168), SHAPES, "target_hidden_size", "train the head"),
    (_with(HEAD, "transformer_layer_config.vocab_size", 32000), SHAPES, "vocab_size", "train the head"),
    (HEAD, {**SHAPES, "d2t": [512]}, "d2t", "vocabulary mapping"),
    (HEAD, {**SHAPES, "t2d": [32000]}, "t2d", "vocabulary mapping"),
    (HEAD, {k: v for k, v in SHAPES.items() if k not in ("d2t", "t2d")}, "d2t", "d2t tensor"),
    (HEAD, {**SHAPES, "lm_head.weight": [2048, 128]}, "lm_head.weight", "draft_vocab_size"),
    (_with(HEAD, "eagle_aux_hidden_state_layer_ids", [1, 2, 4]), SHAPES, "eagle_aux_hidden_state_layer_ids",
     "train the head"),
    (_with(HEAD, "eagle_aux_hidden_state_layer_ids", [0, 1, 2]), SHAPES, "eagle_aux_hidden_state_layer_ids",
     "train the head"),  # vLLM adds hidden + residual; no residual before layer 0
    (HEAD, {**SHAPES, "fc.weight": [128, 256]}, "fc.weight", "train the head"),
    (_with(HEAD, "speculators_config.verifier.architectures", ["DeepseekV3ForCausalLM"]), SHAPES,
     "speculators_config.verifier.architectures", "train the head"),
])
def test_a_misfit_head_is_refused_naming_the_field_and_the_fix(head, shapes, field, fix):
    with pytest.raises(hk.HeadMismatch) as ei:
        hk.check_head(head, shapes, TARGET)
    msg = str(ei.value)
    assert ei.value.field == field and f"`{field}`" in msg and "fix:" in msg and fix in msg


def test_a_flat_eagle3_llama_head_without_aux_ids_takes_vllms_default():
    flat = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 128, "target_hidden_size": 128,
            "vocab_size": 2048, "draft_vocab_size": 2048}
    facts = hk.check_head(flat, {"lm_head.weight": [2048, 128], "fc.weight": [128, 384]}, TARGET)
    assert facts.aux_layer_ids == [2, 2, 1] and "default" in facts.warnings[0]


def test_offline_estimate_is_read_from_the_train_manifest():
    from eagle3ops.speculate import ship

    assert hk.offline_acceptance({"offline_estimate": {"acceptance_length": 1.8, "per_position": {}}}) == 1.8
    assert hk.offline_acceptance({"offline_estimate": None}) is None and hk.offline_acceptance(None) is None
    info = {"train_manifest": {"offline_estimate": {"acceptance_length": 1.8}}}
    assert ship.offline_estimate_for(ship.SpeculateOptions(run="r", pipeline_image="p"), info) == 1.8
    # a head trained elsewhere (--head): the run's manifest describes the run's own head, not this one
    assert ship.offline_estimate_for(ship.SpeculateOptions(run="r", pipeline_image="p", head=Path("/h")), info) is None


def test_speculative_config_and_the_gate_helper_argv():
    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    args = sc.speculative_args(num_speculative_tokens=3, cpu=True)
    assert args[0] == "--speculative-config" and json.loads(args[1]) == {
        "method": "eagle3", "model": sc.HEAD_MOUNT, "num_speculative_tokens": 3, "disable_padded_drafter_batch": True}
    assert args[2:] == ["--override-generation-config", '{"temperature": 0.0}']  # greedy-only CPU stand-in
    assert sc.speculative_args(num_speculative_tokens=4, cpu=False) == [
        "--speculative-config", '{"method": "eagle3", "model": "/eagle3ops/draft", "num_speculative_tokens": 4}']
    # by the serving image's vLLM, not by the host alone: vLLM 0.32 on CPU takes the plain config (sampled requests
    # work there), 0.16 (labelled with a local version, or not known) the stand-in's keys
    assert sc.speculative_args(num_speculative_tokens=3, cpu=True, vllm="0.32.0") == [
        "--speculative-config", '{"method": "eagle3", "model": "/eagle3ops/draft", "num_speculative_tokens": 3}']
    assert sc.speculative_args(num_speculative_tokens=3, cpu=True, vllm="0.16.0+cpu") == args
    assert sc.ngram_args(num_speculative_tokens=3, cpu=True, vllm="0.32.0")[2:] == []
    assert sc.ngram_args(num_speculative_tokens=3, cpu=True, vllm="0.16.0")[2:] == [
        "--override-generation-config", '{"temperature": 0.0}']
    assert [sc.cpu_standin_keys(True, v) for v in ("0.31.9", "0.32.0", "1.0.0", "0.33.1+cpu", "main", None)] == [
        True, False, False, False, True, True]
    argv = sc.gate_helper(h, "img:1", "inspect", head_dir="/d/h ead", run_dir="/d/runs/r")
    assert argv[:3] == ["docker", "-H", h.docker_host] and argv[-3:] == ["-m", "eagle3ops.speculate.onhost", "inspect"]
    assert "/d/h ead:/head:ro" in argv and f"{h.model_path}:/target:ro" in argv and "/d/runs/r:/run:ro" in argv
    assert shlex.split(shlex.join(argv)) == argv  # quoted once, by remote.render
    m = sc.gate_helper(h, "img:1", "measure")
    assert "--volume" not in m and m[m.index("--network") + 1] == "host"
    with pytest.raises(ValueError):
        sc.gate_helper(h, "img:1", "rm -rf /")


def test_inventory_gate_keys():
    s = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox").serving
    assert s.gate_concurrency[0] == 1 and s.gate_max_tokens == 16 and s.speculative_image
    from eagle3ops.config import ServingConfig
    with pytest.raises(Exception, match="gate_concurrency"):
        ServingConfig(image="x", served_model_name="m", gate_concurrency=[4, 4])


def test_onhost_reads_safetensors_headers_and_checks_the_runs_chats(tmp_path):
    head, target, run = tmp_path / "head", tmp_path / "target", tmp_path / "run"
    for d in (head, target, run):
        d.mkdir()
    hdr = json.dumps({"__metadata__": {"format": "pt"}, "d2t": {"dtype": "I64", "shape": [1024], "data_offsets":
                                                                 [0, 8192]}}).encode()
    (head / "model.safetensors").write_bytes(struct.pack("<Q", len(hdr)) + hdr + b"\0" * 8192)
    (head / "config.json").write_text(json.dumps(HEAD))
    (target / "config.json").write_text(json.dumps(TARGET))
    (run / "pipeline.yaml").write_text("prepare:\n  datasets: [chats.jsonl]\n")
    from eagle3ops.speculate.prompts import humaneval
    he = humaneval()
    (run / "chats.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hello"}]}) + "\n")
    req = {"gate": [{"id": p.id, "text": p.text} for p in he[:3]]}
    ans = onhost.inspect(req, head, target, run)
    assert ans["shapes"] == {"d2t": [1024]} and ans["head_config"] == HEAD and ans["target_config"] == TARGET
    assert ans["disjointness"]["overlap"] == [] and ans["disjointness"]["contained_in_training"] == []
    (run / "chats.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "Complete:\n"
                                                               + he[1].text}]}) + "\n")
    assert onhost.inspect(req, head, target, run)["disjointness"]["contained_in_training"] == [he[1].id]
    assert onhost.parse_answer("noise\n" + onhost.MARK + '{"a": 1}\n') == {"a": 1}
    with pytest.raises(ValueError, match="no answer"):
        onhost.parse_answer("Traceback ...")


# --- on the sandbox: both branches end to end ------------------------------------------------------------------

#: The keep branch on CPU: a 4-layer, 128-wide target costs about what the 1-layer draft plus vLLM's per-step
#: overhead costs, so speculation does not beat the baseline here (measured figures in the result); the keep branch
#: is exercised with this margin, named as negative so that the decision records it
#: (``margin_is_negative_test_setting``). Never a faked figure: throughput and acceptance are measured.
NEGATIVE_TEST_MARGIN = -0.9
#: The keep head is random too, but its draft vocabulary is the one token the target emits most often on the gate
#: prompts (its greedy output, read from serving first), so the target accepts its proposals wherever it loops on
#: that token: a measured mean acceptance length a little above 1 (about 1.2 expected for 4 prompts x 16 tokens).
#: A random head over the whole vocabulary stays at about 1.0. The floor between them, named for the test:
TEST_ACCEPTANCE_FLOOR = 1.1
#: The gate's time-to-first-token rule (``serving.gate_ttft_ratio_max``, 1.5 by default) on 2 shared CPU cores: the
#: speculative release's first token pays the draft's prefill too, and the default decided a CI run by noise (the
#: keep head rolled back at x1.531, stop 34). The keep branch is tested at this ratio, named for the test;
#: the rule itself (rollback above the ratio, keep below) is tested in tests/test_speculate.py.
TEST_TTFT_RATIO_MAX = 4.0


def _build_head(tag: str, target_dir: str, out: Path, *, draft_vocab: list[int] | None, seed: int) -> Path:
    """A random EAGLE-3 head (eagle3ops.fixtures.tinydraft) built in the pipeline image on the local build engine."""
    import subprocess

    out.mkdir(parents=True, exist_ok=True)
    code = ("import os, sys, json; from eagle3ops.fixtures.tinydraft import build_tiny_eagle3_draft as b; "
            "v = json.loads(sys.argv[1]); b('/out/head', '/target', draft_vocab=v, seed=int(sys.argv[2]), "
            "aux_layer_ids=[1, 2, 3]); [os.chmod(os.path.join('/out/head', f), 0o644) for f in "
            "os.listdir('/out/head')]; os.chmod('/out/head', 0o755)")
    subprocess.run(["docker", "run", "--rm", "--network", "host", "--user", f"{os.getuid()}:{os.getgid()}",
                    "--volume", f"{target_dir}:/target:ro", "--volume", f"{out}:/out", "--entrypoint", "python3", tag,
                    "-c", code, json.dumps(draft_vocab), str(seed)], check=True, capture_output=True, timeout=600)
    return out / "head"


def _greedy_token_ids(h, prompts: list[str], max_tokens: int) -> list[int]:
    """The target's greedy output token ids on the gate prompts (vLLM's ``return_tokens_as_token_ids``)."""
    import httpx

    ids: list[int] = []
    for p in prompts:
        r = httpx.post(f"http://127.0.0.1:{h.serving.port}/v1/completions", timeout=120, json={
            "model": h.serving.served_model_name, "prompt": p, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True})
        r.raise_for_status()
        ids += [int(t.split(":", 1)[1]) for t in r.json()["choices"][0]["logprobs"]["tokens"]]
    return ids


@pytest.mark.sandbox
@pytest.mark.slow
def test_speculate_keeps_a_head_at_a_named_negative_margin_on_real_vllm(deployed, speculative_image, tmp_path,
                                                                       monkeypatch):
    """The speculate job on the sandbox's real vLLM (a control release, the speculative release, one rollback), like
    for like (``--control``: the live serving runs the local base, the speculative release the stand-in serving
    image, so the baseline measured is that image without --speculative-config): a head whose draft
    vocabulary is the target's own frequent greedy token is accepted often enough (floor
    :data:`TEST_ACCEPTANCE_FLOOR`, measured from vLLM's own spec-decode counters) and is kept at
    :data:`NEGATIVE_TEST_MARGIN`; serving ends healthy on the speculative release; the audit entry and the stored
    result carry the figures; then ``eagle3ops watch`` over that live speculative release sees a forced drop
    (traffic the head cannot predict) and rolls the host back to the baseline release, health-gated
    (:func:`_watch_rolls_back_on_a_forced_drop`); were it not to, the test puts the baseline back itself.

    The rollback verdict (acceptance below the floor, or too slow) is the same job's other branch: it runs with the
    stand-in server in ``tests/test_speculate_job.py`` and ``tests/test_speculate_kill.py``; on real vLLM it cost
    two more vLLM starts (~2 min) of every CI run."""
    from collections import Counter

    from eagle3ops_dev import demo
    from eagle3ops.remote import Remote
    from eagle3ops.speculate import ship
    from eagle3ops.window.common import audit_entries
    from eagle3ops.window.run import run_window

    h, dep = deployed
    h = h.model_copy(update={"serving": h.serving.model_copy(update={"gate_ttft_ratio_max": TEST_TTFT_RATIO_MAX})})
    s = h.serving
    gate = [p.text for p in ship.gate_prompts(s.gate_prompts)]
    common = Counter(_greedy_token_ids(h, gate, s.gate_max_tokens)).most_common(1)
    keep_head = _build_head(dep.tag, h.model_path, tmp_path / "keep", draft_vocab=[common[0][0]], seed=2)
    # force: the run has no hidden states on the host to estimate this head on (a head from elsewhere is
    # refused otherwise, tests/test_outside_head.py); the keep path on real vLLM is what this test is for.
    run_id = f"spec-{tmp_path.name[-8:]}"
    # traffic this head cannot predict, for the watch step below: prompts whose greedy continuation never holds
    # the head's one draft token (read while the baseline serves; greedy speculation emits the same tokens)
    unpredictable = _prompts_without(h, common[0][0], s.gate_max_tokens)
    with Remote(h) as r:
        base_release = current_release(r)  # stale when serving was recreated outside a window: see below
        try:
            # the test-only switch: without it a negative margin is refused (test_negative_margin_is_refused...)
            monkeypatch.setenv(NEGATIVE_MARGIN_ENV, "1")
            opts = ship.SpeculateOptions(run=run_id, pipeline_image=dep.tag, pipeline_image_id=dep.image_id,
                                         head=keep_head, margin=NEGATIVE_TEST_MARGIN,
                                         acceptance_floor=TEST_ACCEPTANCE_FLOOR, force=True, control=True,
                                         command="test: keep")
            kept = ship.speculate(r, opts, echo=lambda *_: None)
            if kept["verdict"] == "undecided" and "drifted" in kept["reason"]:
                # The drift rule doing its job under CI's load, not this test's subject (the keep path on real
                # vLLM): three suites share two cores, and stop 37's third CI run had this baseline's first pass
                # 2.7 times slower than its last (+168 %, the in-image suite's Kimi test beside it). The job
                # rolled back cleanly; one more attempt (a new attempt folder), whose verdict must be keep.
                kept = ship.speculate(r, opts, echo=lambda *_: None)
            base_release = kept["baseline_release"]  # what its record step found live
            assert kept["verdict"] == "keep", kept["reason"]
            # like for like: the baseline measured is the control release (the speculative image without
            # --speculative-config), then the speculative release: two restarts on the keep path
            assert kept["outcome"] == "ok" and len(kept["restarts_s"]) == 2
            base_id, spec_id = kept["measured_releases"]["baseline"], kept["measured_releases"]["speculative"]
            assert base_id["image_id"] == spec_id["image_id"] and base_id["image"] == s.speculative_image
            assert "--speculative-config" in spec_id["argv"] and "--speculative-config" not in base_id["argv"]
            assert base_id["vllm_version"] == spec_id["vllm_version"] and base_id["vllm_version"].startswith("0.16")
            assert base_id["labels"] and base_id["labels"] == spec_id["labels"]  # the profile's patch labels
            assert kept["control"] is True and kept["control_release"] not in (None, kept["live_release"],
                                                                               base_release)
            assert kept["margin_is_negative_test_setting"] is True and kept["margin"] == NEGATIVE_TEST_MARGIN
            assert kept["live_release"] == kept["speculative_release"] != kept["baseline_release"]
            sd = kept["spec_decode"]
            assert sd["drafts"] > 0 and sd["mean_acceptance_length"] >= TEST_ACCEPTANCE_FLOOR
            assert demo.serving_healthy(h, completion=True)
            for c in map(str, s.gate_concurrency):
                lv = kept["levels"][c]
                assert lv["baseline"]["output_tokens"] == lv["speculative"]["output_tokens"] == \
                    s.gate_prompts * s.gate_max_tokens * kept["gate_passes"]  # every prompt, every pass
            audit = [e for e in audit_entries(r) if e.get("kind") == "speculate" and e.get("run") == run_id]
            assert [e["verdict"] for e in audit[-1:]] == ["keep"]
            assert audit[-1]["figures"]["spec_decode"]["mean_acceptance_length"] == sd["mean_acceptance_length"] \
                and audit[-1]["figures"]["levels"]
            from eagle3ops.commands import host as hc
            # a head from elsewhere: its newest result in its own folder, the run's own result.json untouched
            stored = json.loads(r.run(hc.cat(f"{h.data_dir}/runs/{run_id}/speculate/"
                                             f"{kept['head_sha256'][:16]}/result.json")).stdout)
            run_own = r.run(hc.cat_if_exists(f"{h.data_dir}/runs/{run_id}/speculate/result.json"), check=False)
            # (the sandbox outlives CI runs: a copy there may be an older run's, written
            # before outside heads kept their own folder)
            assert not run_own.stdout.strip() or json.loads(run_own.stdout)["attempt_dir"] != kept["attempt_dir"]
            assert stored["verdict"] == "keep" and stored["levels"] and stored["spec_decode"]
            assert stored["head_sha256"] == kept["head_sha256"]
            print(json.dumps({"verdict": kept["verdict"], "throughput_ratio": kept["throughput_ratio"],
                              "acceptance": sd["mean_acceptance_length"],
                              "levels": {c: (lv["baseline"]["output_tokens_per_s"],
                                             lv["speculative"]["output_tokens_per_s"])
                                         for c, lv in kept["levels"].items()}}))
            _watch_rolls_back_on_a_forced_drop(r, h, dep, kept, unpredictable)
        finally:  # the baseline release goes back live for the other tests
            if current_release(r) != base_release:
                back = run_window(r, kind="rollback", image=dep.tag, expected_image_id=dep.image_id,
                                  command="test: back to the baseline release", to_release=base_release)
                assert back["outcome"] == "ok"
        assert current_release(r) == base_release and demo.serving_healthy(h, completion=True)


def _prompts_without(h, token: int, max_tokens: int, want: int = 4) -> list[str]:
    """Up to ``want`` prompts of random numbers (seeded) whose greedy continuation (``max_tokens``) never holds
    ``token``: on them a head that only ever proposes ``token`` is never accepted (acceptance length 1.0)."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(0)
    cands = [" ".join(str(rng.randrange(10**6)) for _ in range(24)) for _ in range(24)]
    out: list[str] = []
    # 8 requests at once (vLLM batches them; one at a time each waited its 16 tokens alone), taken in order. Batched
    # bf16 greedy may differ from the watch's one-at-a-time traffic on a near-tie; a token that then matched the
    # head's one draft token would lift the acceptance a little above 1.0, still far under the 1.1 floor.
    with ThreadPoolExecutor(8) as pool:
        for k in range(0, len(cands), 8):
            batch = cands[k:k + 8]
            for p, ids in zip(batch, pool.map(lambda q: _greedy_token_ids(h, [q], max_tokens), batch)):
                if token not in ids and len(out) < want:
                    out.append(p)
            if len(out) == want:
                break
    assert out, f"no random-number prompt avoids token {token}: the forced drop cannot be driven"
    return out


def _watch_rolls_back_on_a_forced_drop(r, h, dep, kept: dict, prompts: list[str]) -> None:
    """``eagle3ops watch`` over the live speculative release just kept: while traffic the head cannot
    predict runs (``prompts``: acceptance 1.0), the watch with ``rollback: true``, a floor of
    :data:`TEST_ACCEPTANCE_FLOOR` and a breach sustained for one 15 s interval, rolls the host back to the gate's
    baseline release through the locked, health-gated rollback window; the per-interval record, the audit entry's
    figures and the production figure (calibration) are on the host."""
    import threading

    import httpx

    from eagle3ops.commands import host as hc
    from eagle3ops.speculate import watch as w
    from eagle3ops.window.common import audit_entries
    from eagle3ops_dev import demo

    s = h.serving
    hw = h.model_copy(update={"serving": s.model_copy(update={"watch": s.watch.model_copy(update={
        "acceptance_floor": TEST_ACCEPTANCE_FLOOR, "sustained_minutes": 0.25, "rollback": True})})})
    stop = threading.Event()

    def traffic() -> None:
        i = 0
        while not stop.is_set():
            try:
                httpx.post(f"http://127.0.0.1:{s.port}/v1/completions", timeout=60, json={
                    "model": s.served_model_name, "prompt": prompts[i % len(prompts)], "temperature": 0,
                    "max_tokens": s.gate_max_tokens})
            except httpx.HTTPError:
                stop.wait(1)
            i += 1

    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    said: list[str] = []
    try:
        r.host = hw
        out = w.watch(r, w.WatchOptions(duration_s=180, interval_s=15, pipeline_image=dep.tag,
                                        pipeline_image_id=dep.image_id, command="test: watch"), echo=said.append)
    finally:
        stop.set()
        t.join(timeout=90)
        r.host = h
    assert out["exit_code"] == w.EXIT_ROLLED_BACK, (out, said)
    assert out["thresholds"]["acceptance_floor"] == TEST_ACCEPTANCE_FLOOR
    assert out["breaches"] and out["breaches"][0]["conditions"] == ["acceptance"]
    assert out["breaches"][0]["interval"]["mean_acceptance_length"] < TEST_ACCEPTANCE_FLOOR
    assert out["rollback"]["outcome"] == "ok" and out["rollback"]["release"] == kept["baseline_release"]
    assert current_release(r) == kept["baseline_release"] and demo.serving_healthy(h, completion=True)
    entry = [e for e in audit_entries(r) if e.get("kind") == "watch"][-1]
    assert entry["rollback"]["outcome"] == "ok" and entry["release"] == kept["speculative_release"]
    assert entry["figures"]["mean_acceptance_length"] < TEST_ACCEPTANCE_FLOOR and entry["figures"]["drafts"] > 0
    lines = r.run(hc.cat(f"{h.state_dir}/watch/{kept['speculative_release']}.jsonl")).stdout.splitlines()
    assert lines and all("acceptance_per_position" in json.loads(x) for x in lines)
    prod = out["production"]
    assert prod and prod["release"] == kept["speculative_release"] and prod["mean_acceptance_length"] < 1.1
    print(json.dumps({"watch": {"intervals": out["intervals"], "breach": out["breaches"][0]["reason"],
                                "rollback": out["rollback"], "production": prod}}))


# --- the driver with fakes: it plans one speculate job, prints its restarts, and the host does the rest -----------

class _Res:
    def __init__(self, stdout: str = "", ok: bool = True):
        self.stdout, self.stderr, self.ok = stdout, "", ok


class _FakeRemote:
    """Answers the gate's host commands: the inspect helper (a fitting head), ``releases/current``, image present,
    the windows' recorded results (restart times)."""

    def __init__(self, host, current: list[int], results: str = ""):
        self.host, self.dry_run, self.echo, self.current, self.written = host, False, None, current, {}
        self.results, self.calls = results, []

    def run(self, argv, *, check=True, timeout=None, stdin=None, **_):
        self.calls.append(list(argv))
        if argv[-1] == "inspect":
            return _Res(onhost.MARK + json.dumps({"head_config": HEAD, "shapes": SHAPES, "target_config": TARGET,
                                                  "train_manifest": {"offline_estimate": {"acceptance_length": 2.0}},
                                                  "pipeline_yaml": "train:\n  ttt_steps: 4\n",
                                                  "head_sha256": "ab" * 32,
                                                  "disjointness": {"overlap": [], "contained_in_training": []}}))
        if argv[0] == "find" and argv[1].endswith("/windows"):
            return _Res(self.results)
        if argv[0] == "find" and argv[1].endswith("/releases/current"):
            return _Res(f"{self.current[-1]}\n")
        if argv[0] == "tee":
            self.written[argv[-1]] = stdin
        if argv[0] == "test" and argv[-1].endswith("/lock"):  # the deploy lock is free
            return _Res(ok=False)
        return _Res()


@pytest.mark.parametrize("verdict", ["keep", "rollback", "error"])
def test_the_driver_plans_one_speculate_job_and_returns_the_hosts_result(monkeypatch, verdict):
    """No measurement and no second window on the driver: one ``speculate`` window carrying the job (the
    speculative change of the host's serving kind, prompts in order, passes, margin), its result read back from the
    window's result; the restarts and the downtime to expect printed first; a failed job is an error naming it."""
    from eagle3ops.speculate import ship
    from eagle3ops.window import run as window_run

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    r = _FakeRemote(h, [7], results=json.dumps({"window_id": "w0", "restarts_s": [20.0, 40.0]}))
    windows: list[dict] = []

    def fake_window(r_, *, kind, **kw):
        windows.append({"kind": kind, **kw})
        job = kw["speculate"]
        return {"window_id": "w-spec", "outcome": "ok" if verdict != "error" else "failed", "restarts_s": [30.0],
                "speculate": {"verdict": verdict, "reason": "why", "attempt_dir": f"{job.results_dir}/w-spec",
                              "live_release": 8 if verdict == "keep" else 7, "rollback": None}}

    monkeypatch.setattr(window_run, "run_window", fake_window)
    said: list[str] = []
    opts = ship.SpeculateOptions(run="r1", pipeline_image="pipe:1", serving_image="serving:patched")
    if verdict == "error":
        with pytest.raises(ship.SpeculateError, match="why"):
            ship.speculate(r, opts, echo=said.append)
        return
    res = ship.speculate(r, opts, echo=said.append)
    assert [w["kind"] for w in windows] == ["speculate"]
    job = windows[0]["speculate"]
    rel = job.change  # the live container plus this change only
    assert rel.image == "serving:patched"
    assert rel.binds == [f"{h.data_dir}/runs/r1/train/final:{sc.HEAD_MOUNT}:ro"]
    assert json.loads(rel.args[rel.args.index("--speculative-config") + 1])["num_speculative_tokens"] == 4
    assert job.passes >= 3 and job.levels == list(h.serving.gate_concurrency) and job.head_sha256 == "ab" * 32
    assert job.warmup_prompts == min(h.serving.gate_warmup_prompts, len(job.prompts)) > 0
    assert job.results_dir == f"{h.data_dir}/runs/r1/speculate/{'ab' * 8}"
    assert ["mkdir", "-p", job.results_dir] in r.calls  # made as the SSH user, before the job
    assert res["verdict"] == verdict and res["window_id"] == "w-spec"
    assert any("1 if kept, 2 if rolled back" in m and "30 s if kept, 60 s if rolled back" in m for m in said)
    assert job.figures["restarts"]["expected_downtime_rollback_s"] == 60.0


def test_the_dry_run_prints_restarts_and_expected_downtime(monkeypatch):
    """``--dry-run``: the restarts on both paths and the expected downtime from the host's recorded restarts, then
    the speculate window's plan; nothing measured."""
    from eagle3ops.speculate import ship
    from eagle3ops.window import run as window_run

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    r = _FakeRemote(h, [7], results=json.dumps({"window_id": "w0", "downtime_s": 95.0,
                                                "stage_seconds": {"extract": 50.0}}))
    r.dry_run = True
    kinds: list[str] = []
    monkeypatch.setattr(window_run, "run_window", lambda r_, *, kind, **kw: kinds.append(kind) or {"outcome": "dry"})
    said: list[str] = []
    res = ship.speculate(r, ship.SpeculateOptions(run="r1", pipeline_image="p:1"), echo=said.append)
    assert kinds == ["speculate"] and res["verdict"] == "dry-run"
    assert res["restarts"]["restarts_keep"] == 1 and res["restarts"]["restarts_rollback"] == 2
    assert any(m.startswith("# serving restarts: 1 if kept, 2 if rolled back; expected downtime 45 s if kept, "
                            "90 s if rolled back") for m in said), said


class _LabelledImagesRemote(_FakeRemote):
    """The driver's stand-in remote whose engine answers ``docker image inspect IMAGE`` with ``labels[IMAGE]`` (as
    :func:`eagle3ops.images.tags.image_labels` writes them)."""

    def __init__(self, host, labels: dict[str, dict[str, str]]):
        super().__init__(host, [7], results=json.dumps({"window_id": "w0", "restarts_s": [20.0, 40.0]}))
        self.labels, self.dry_run = labels, True

    def run(self, argv, *, check=True, timeout=None, stdin=None, **kw):
        a = list(argv)
        if a[:1] == ["docker"] and "image" in a and "inspect" in a and "--format" not in a:
            return _Res(json.dumps([{"Config": {"Labels": self.labels.get(a[-1], {})}}]))
        return super().run(argv, check=check, timeout=timeout, stdin=stdin, **kw)


@pytest.mark.parametrize("image,labels,vllm,standin", [
    ("serving:x", {"io.eagle3ops.profile": "vllm-0.32.0-serving"}, "0.32.0", False),
    ("serving:x", {"io.eagle3ops.pins": '{"speculators": "0.9.0", "vllm": "0.32.0"}'}, "0.32.0", False),
    ("serving:x", {"io.eagle3ops.stand-in-for": "vllm/vllm-openai:v0.32.0"}, "0.32.0", False),
    ("vllm/vllm-openai:v0.32.0", {}, "0.32.0", False),
    ("serving:x", {"io.eagle3ops.profile": "vllm-0.16.0-serving-cpu-standin"}, "0.16.0", True),
    ("serving:x", {}, None, True)])
def test_the_speculative_config_is_chosen_by_the_serving_images_labelled_vllm(monkeypatch, image, labels, vllm,
                                                                               standin):
    """On the same CPU host, a serving image labelled for vLLM 0.32 (profile, pins or stand-in-for label; an
    upstream image by its tag) gets the plain
    ``{"method": "eagle3", ...}``, a 0.16 one (or an unlabelled one) the stand-in's CPU keys; the version and where it
    was read are in the plan's figures."""
    from eagle3ops.speculate import ship
    from eagle3ops.window import run as window_run

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    assert h.gpus == 0
    windows: list[dict] = []
    monkeypatch.setattr(window_run, "run_window", lambda r_, *, kind, **kw: windows.append(kw) or {"outcome": "dry"})
    r = _LabelledImagesRemote(h, {image: labels})
    ship.speculate(r, ship.SpeculateOptions(run="r1", pipeline_image="p:1", serving_image=image),
                   echo=lambda *_: None)
    job = windows[0]["speculate"]
    cfg = json.loads(job.change.args[job.change.args.index("--speculative-config") + 1])
    assert ("disable_padded_drafter_batch" in cfg) is standin
    assert ("--override-generation-config" in job.change.args) is standin
    assert job.figures["serving_vllm"]["vllm"] == vllm
    assert (" no label or tag naming its vLLM" in job.figures["serving_vllm"]["from"]) is (vllm is None)


def test_a_head_below_the_offline_floor_is_refused_before_anything_changes(monkeypatch):
    from eagle3ops.speculate import ship
    from eagle3ops.window import run as window_run

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    r = _FakeRemote(h, [7])
    orig = r.run

    def low(argv, **kw):
        res = orig(argv, **kw)
        if argv[-1] == "inspect":
            ans = onhost.parse_answer(res.stdout)
            ans["train_manifest"]["offline_estimate"]["acceptance_length"] = 1.1
            res = _Res(onhost.MARK + json.dumps(ans))
        return res

    r.run = low
    monkeypatch.setattr(window_run, "run_window", lambda *a, **k: pytest.fail("a window ran"))
    with pytest.raises(ship.SpeculateError, match="offline acceptance estimate 1.100 is below the floor.*--force"):
        ship.speculate(r, ship.SpeculateOptions(run="r1", pipeline_image="p"), echo=lambda *_: None)


def _head_dir(path: Path, config: dict, shapes: dict) -> Path:
    """A head directory as speculators saves one: ``config.json`` and a safetensors file whose header lists
    ``shapes`` (the tensors' bytes are zeros; the check reads only the header)."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    header, off = {}, 0
    for name, shape in shapes.items():
        n = 4
        for d in shape:
            n *= d
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    blob = json.dumps(header).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * off)
    return path


@pytest.mark.parametrize("fits", [True, False])
def test_the_dry_run_of_a_head_from_elsewhere_runs_the_head_check(monkeypatch, tmp_path, fits):
    """``speculate --head DIR --dry-run``: the head is not uploaded, but its check is local and read-only (its
    ``config.json`` and safetensors headers here, the target's ``config.json`` read on the host), so the dry run
    runs it and prints the verdict; a misfit head fails the dry run naming the field, as the real run would."""
    from eagle3ops.speculate import ship
    from eagle3ops.window import run as window_run

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")

    class _TargetRemote(_FakeRemote):
        def run(self, argv, *, check=True, timeout=None, stdin=None, **_):
            if list(argv) == ["cat", f"{h.model_path}/config.json"]:
                self.calls.append(list(argv))
                return _Res(json.dumps(TARGET))
            return super().run(argv, check=check, timeout=timeout, stdin=stdin)

    r = _TargetRemote(h, [7])
    r.dry_run = True
    kinds: list[str] = []
    monkeypatch.setattr(window_run, "run_window", lambda r_, *, kind, **kw: kinds.append(kind) or {"outcome": "dry"})
    head = _head_dir(tmp_path / "head", HEAD if fits else _with(HEAD, "transformer_layer_config.hidden_size", 256),
                     SHAPES)
    said: list[str] = []
    opts = ship.SpeculateOptions(run="r1", pipeline_image="p:1", head=head)
    if fits:
        res = ship.speculate(r, opts, echo=said.append)
        assert res["verdict"] == "dry-run" and kinds == ["speculate"]
        line = next((m for m in said if "head check" in m), "")
        assert "head check passed" in line and "hidden size 128" in line and "aux layers [1, 2, 3]" in line, said
        assert ["cat", f"{h.model_path}/config.json"] in r.calls
    else:
        with pytest.raises(ship.SpeculateError) as exc:
            ship.speculate(r, opts, echo=said.append)
        assert "dry run" in str(exc.value) and "`hidden_size`: 256" in str(exc.value) and "fix:" in str(exc.value)
        assert not kinds, "the window was planned for a head that does not fit"
