"""The chunked run's plan (pure, no host): chunks within the disk budget, every training sample once per
epoch, passes that cover the steps in order, and the refusals that name the key to change."""

from __future__ import annotations

import random

import pytest

from eagle3ops.config.pipeline import PipelineConfig
from eagle3ops.stages import chunkplan, trainplan


def _config(steps: int, **chunks: object) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "target_model": "/model", "seed": 3, "chunks": {"count": "auto", **chunks},
        "train": {"steps": steps, "batch_max_tokens": 512, "held_out_fraction": 0.1}})


def _tokens(n: int = 120, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(20, 500) for _ in range(n)]


def test_a_run_twice_the_budget_is_cut_into_chunks_that_each_fit_and_train_every_sample_once_an_epoch() -> None:
    tokens, hidden = _tokens(), 64
    sizes = [chunkplan.sample_bytes(t, hidden) for t in tokens]
    budget = sum(sizes) // 2
    probe = chunkplan.plan(tokens, hidden_size=hidden, config=_config(1), budget_bytes=budget)
    held = set(probe.held)
    lay = trainplan.layout([], len(tokens), 1)
    units = trainplan.unit_samples(lay, [(i, t - 1) for i, t in enumerate(tokens) if i not in held])
    per_epoch = [trainplan.chunked_epoch_plan(lay, units, 512, 3, e, probe.chunks) for e in range(2)]
    steps = sum(map(len, per_epoch))  # two epochs exactly (the packing of each epoch differs a little)
    p = chunkplan.plan(tokens, hidden_size=hidden, config=_config(steps), budget_bytes=budget)
    assert len(p.chunks) >= 2 and p.peak_bytes <= budget < p.total_bytes
    assert [a for a, _ in p.chunks][0] == 0 and p.chunks[-1][1] == len(tokens)
    assert all(b0 == a1 for (_, b0), (a1, _) in zip(p.chunks, p.chunks[1:]))  # contiguous
    assert p.epochs == pytest.approx(2.0, abs=0.1) and p.steps_per_epoch == len(per_epoch[0])
    # passes: every chunk once per epoch, in order, step ranges back to back up to the last step
    assert [(x.epoch, x.chunk) for x in p.passes] == [(e, c) for e in range(2) for c in range(len(p.chunks))]
    assert p.passes[0].step_start == 0 and p.passes[-1].step_end == steps
    assert all(x.step_end == y.step_start for x, y in zip(p.passes, p.passes[1:]))
    # the train stage's chunk-major order: each step within its pass's chunk; each training sample once an epoch
    for epoch, rows in enumerate(per_epoch):
        seen = sorted(i for row in rows for b in row if b for i in b)
        assert seen == sorted(set(range(len(tokens))) - held)
        for x in p.passes:
            if x.epoch == epoch:
                base = sum(map(len, per_epoch[:epoch]))
                ids = [i for row in rows[x.step_start - base: x.step_end - base] for b in row if b for i in b]
                assert ids and all(x.start <= i < x.end for i in ids)


def test_a_fixed_count_gives_that_many_chunks_of_about_equal_bytes_and_says_when_it_is_over_the_budget() -> None:
    tokens = _tokens(200, 1)
    p = chunkplan.plan(tokens, hidden_size=32, config=_config(10, count=4), budget_bytes=10**12)
    assert len(p.chunks) == 4 and max(p.chunk_bytes) < 1.5 * min(p.chunk_bytes)
    assert not p.notes
    tight = chunkplan.plan(tokens, hidden_size=32, config=_config(10, count=2), budget_bytes=p.total_bytes // 3)
    assert any("over the budget" in n for n in tight.notes)
    assert "over the budget" in "\n".join(tight.lines())


def test_a_budget_that_cannot_hold_the_held_out_samples_is_refused_naming_the_keys() -> None:
    tokens = _tokens(60, 2)
    with pytest.raises(chunkplan.ChunkPlanError, match="chunks.budget_bytes.*train.held_out_fraction"):
        chunkplan.plan(tokens, hidden_size=64, config=_config(5), budget_bytes=1000)


def test_the_plan_is_printed_and_read_back_as_recorded() -> None:
    p = chunkplan.plan(_tokens(), hidden_size=16, config=_config(30), budget_bytes=2_000_000, basis="test")
    text = "\n".join(p.lines())
    assert f"{len(p.chunks)} chunk(s)" in text and "pass epoch 0 chunk 0" in text and "(test)" in text
    q = chunkplan.from_json(p.to_json())
    assert q == p and chunkplan.digest(q) == chunkplan.digest(p)


def test_a_chunked_run_has_windows_of_its_own_and_is_done_when_its_train_is(tmp_path) -> None:
    """Window extract only prepares and window train runs vocab + chunked; chunked is judged by train's manifest,
    and preflight's disk estimate counts what a chunked window needs at least, far below the whole extract."""
    from eagle3ops.commands import stages as st
    from eagle3ops.stages.manifest import MANIFEST, STAGES, file_entry, stage_dir, write_manifest
    from eagle3ops.window import planner as wplanner
    from eagle3ops.window import preflight as wpreflight

    text = "target_model: /model\nchunks: {count: auto}\ntrain: {steps: 4}\n"
    cfg = PipelineConfig.model_validate(__import__("yaml").safe_load(text))
    assert st.window_stages("extract", cfg) == ["prepare"] and st.window_stages("train", cfg) == ["vocab", "chunked"]
    assert st.window_stages("train", _config(4, count="off")) == ["vocab", "train"]
    run = tmp_path / "run"
    run.mkdir()
    (run / "pipeline.yaml").write_text(text)

    def state() -> tuple[dict, dict]:
        m = {s: (stage_dir(run, s) / MANIFEST).read_text() if (stage_dir(run, s) / MANIFEST).is_file() else None
             for s in STAGES}
        return m, {str(p.relative_to(run)): p.stat().st_size for p in run.rglob("*") if p.is_file()}

    for stage in ("prepare", "vocab"):
        d = stage_dir(run, stage)
        d.mkdir()
        (d / "out.bin").write_bytes(b"x" * 10)
        write_manifest(run, stage, cfg, {"out.bin": file_entry(d / "out.bin")}, tokens=100)
    d = wplanner.decide_stages(st.window_stages("train", cfg), cfg, *state())
    assert [s for s, _ in d.skip] == ["vocab"] and [s for s, _ in d.run] == ["chunked"] and not d.refuse
    for stage in ("extract", "train"):  # the last pass's view of extract/ and the head
        dd = stage_dir(run, stage)
        dd.mkdir()
        (dd / "out.bin").write_bytes(b"y" * 10)
        write_manifest(run, stage, cfg, {"out.bin": file_entry(dd / "out.bin")}, tokens=100)
    d = wplanner.decide_stages(st.window_stages("train", cfg), cfg, *state())
    assert d.nothing_to_do and "train: already done" in dict(d.skip)["chunked"]
    (stage_dir(run, "train") / "out.bin").write_bytes(b"z")  # the head's file changed: not done
    d = wplanner.decide_stages(st.window_stages("train", cfg), cfg, *state())
    assert [s for s, _ in d.run] == ["chunked"] and "train/out.bin" in dict(d.run)["chunked"]
    dims = {"hidden_size": 7168, "intermediate_size": 18432, "vocab_size": 163840}
    tokens = 10_000_000
    least = wpreflight.stage_output_bytes("chunked", cfg, dims, tokens)
    whole = wpreflight.stage_output_bytes("extract", cfg, dims, tokens)
    assert wpreflight.stage_output_bytes("train", cfg, dims, 0) < least < whole / 2
