"""The keep branch, measured: a head trained by eagle3ops on a target it can learn is kept because it is faster.

On the sandbox, end to end, with the inventory's own gate settings (``serving.gate_margin`` 0.05, positive;
``serving.acceptance_floor`` 1.3): the sandbox target becomes the trained, 24-layer stand-in the demo serves
(:mod:`eagle3ops_dev.tinytrained`: a tiny Llama trained on HumanEval's train split, deepened so that one target forward
costs several draft forwards), the live target answers HumanEval's train-split prompts, the extract and train
windows train a head on those answers (the demo's settings), and ``speculate`` measures it on the gate split (8
prompts x 64 tokens at concurrency 1 and 4) against the baseline release. Measured here when this test was written:
acceptance length 1.93, output tokens/s x1.21 at concurrency 1 (the production level) — kept. The rollback branch of
a random head is ``tests/test_speculate_ship.py``'s. Afterwards the tests' random target and the baseline release
are live again. About 10 minutes on 2 cores.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_head_trained_on_the_trained_target_is_kept_because_it_measured_faster(
        deployed, built_images, speculative_image, tmp_path):
    from eagle3ops_dev import demo
    from eagle3ops.commands import host as hc
    from eagle3ops.remote import Remote
    from eagle3ops.speculate import ship
    from eagle3ops.window.common import audit_entries
    from eagle3ops.window.run import run_window

    h, dep = deployed
    _, built = built_images
    s = h.serving
    run_id = time.strftime("trained-%Y%m%dT%H%M%S")  # a fresh pipeline run (stages refuse foreign outputs)
    baseline = None  # the plain release speculate records as its baseline
    try:
        assert demo.build_tiny_model(built.tag, h.model_path, "llama-trained") is True  # replaced the random one
        demo.start_serving(h, restart=True)
        pipeline_text, gen = demo.regenerate_training_data(h, run_id, (REPO / "deploy/pipeline.yaml").read_text(),
                                                           out_dir=tmp_path / "regenerated", train=demo.DEMO_TRAIN)
        assert gen["failed"] == 0 and gen["answered"] == len(gen["train_ids"]) > 100
        with Remote(h) as r:
            for kind in ("extract", "train"):
                res = run_window(r, kind=kind, image=dep.tag, expected_image_id=dep.image_id,
                                 command=f"test: {kind} on the trained target", run=run_id,
                                 pipeline_text=pipeline_text)
                assert res["outcome"] == "ok", res
            kept = ship.speculate(r, ship.SpeculateOptions(
                run=run_id, pipeline_image=dep.tag, pipeline_image_id=dep.image_id,
                prompts=demo.DEMO_GATE_PROMPTS, max_tokens=demo.DEMO_GATE_MAX_TOKENS,
                command="test: the trained head at the inventory's margin"), echo=lambda *_: None)
            baseline = kept["baseline_release"]
            sd, prod = kept["spec_decode"], str(s.gate_concurrency[0])
            print(json.dumps({"verdict": kept["verdict"], "reason": kept["reason"],
                              "acceptance": sd.get("mean_acceptance_length"),
                              "per_position": sd.get("acceptance_per_position"),
                              "offline_estimate": kept.get("offline_estimate"),
                              "levels": {c: (lv["baseline"]["output_tokens_per_s"],
                                             lv["speculative"]["output_tokens_per_s"], lv.get("throughput_ratio"))
                                         for c, lv in kept["levels"].items()}}))
            assert kept["verdict"] == "keep", kept["reason"]
            assert kept["margin"] == s.gate_margin > 0 and not kept.get("margin_is_negative_test_setting")
            assert kept["offline_estimate"] is not None and kept["offline_estimate"] >= s.acceptance_floor
            assert sd["mean_acceptance_length"] >= s.acceptance_floor
            assert kept["levels"][prod]["throughput_ratio"] >= 1 + s.gate_margin
            assert kept["live_release"] == kept["speculative_release"] != kept["baseline_release"]
            assert demo.serving_healthy(h, completion=True)
            audit = [e for e in audit_entries(r) if e.get("kind") == "speculate" and e.get("run") == run_id]
            assert audit[-1]["verdict"] == "keep"
            assert audit[-1]["figures"]["spec_decode"]["mean_acceptance_length"] == sd["mean_acceptance_length"]
            stored = json.loads(r.run(hc.cat(f"{h.data_dir}/runs/{run_id}/speculate/result.json")).stdout)
            assert stored["verdict"] == "keep" and stored["levels"][prod]["throughput_ratio"] >= 1 + s.gate_margin
    finally:  # the tests' random target and the baseline release go back live for the other tests
        demo.build_tiny_model(built.tag, h.model_path, "llama")
        with Remote(h) as r:
            if baseline is not None and ship._current_release(r) != baseline:
                back = run_window(r, kind="rollback", image=dep.tag, expected_image_id=dep.image_id,
                                  command="test: back to the baseline release", to_release=baseline)
                assert back["outcome"] == "ok", back
                assert ship._current_release(r) == baseline
            else:
                demo.start_serving(h, restart=True)
        assert demo.serving_healthy(h, completion=True) and demo.target_kind(h.model_path) == "llama"
