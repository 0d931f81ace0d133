"""The multi-node training plan, pure: which samples each rank trains at each step
(:mod:`eagle3ops.stages.trainplan`). Its batches against speculators' own sampler are checked in the in-image suite
(``tests/image/test_stages_distributed.py``)."""

from __future__ import annotations

import random

import pytest

from eagle3ops.stages import trainplan as tp


def _lengths(n: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randint(8, 300) for _ in range(n)]


@pytest.mark.parametrize("n,replicas", [(1, 1), (5, 3), (41, 1), (41, 3), (200, 4), (7, 8)])
def test_an_epoch_holds_every_sample_once_and_fits_the_batch(n, replicas):
    lengths = _lengths(n, n)
    steps = tp.pack_epoch(lengths, 512, replicas, seed=3, epoch=2)
    seen = [p for step in steps for b in step for p in b]
    assert sorted(seen) == list(range(n))
    for step in steps:
        assert len(step) == replicas
        assert all(sum(min(lengths[p], 512) for p in b) <= 512 for b in step)
    assert steps == tp.pack_epoch(lengths, 512, replicas, seed=3, epoch=2)  # deterministic
    assert steps != tp.pack_epoch(lengths, 512, replicas, seed=3, epoch=3) or n < 20  # epochs differ


def test_layout_units_follow_the_shards_when_they_divide_the_world():
    shards = [(0, 14), (14, 28), (28, 42)]
    lay = tp.layout(shards, 42, 3)
    assert lay.units == tuple(shards) and lay.per_unit == 1 and lay.unit_of(2) == (2, 0)
    lay6 = tp.layout(shards, 42, 6)
    assert lay6.per_unit == 2 and lay6.unit_of(3) == (1, 1) and list(lay6.ranks_of(2)) == [4, 5]
    for world in (1, 2, 4):  # shards that do not divide the world: one unit, every rank every file
        assert tp.layout(shards, 42, world).units == ((0, 42),)
    assert tp.layout([], 42, 3).units == ((0, 42),)
    with pytest.raises(ValueError):
        tp.layout(shards, 42, 0)
    with pytest.raises(ValueError):
        lay.unit_of(3)


def test_shards_of_a_merged_manifest_must_be_contiguous():
    man = {"fleet": {"shards": [{"rank": 1, "start": 10, "end": 20}, {"rank": 0, "start": 0, "end": 10}]}}
    assert tp.shards_of(man) == [(0, 10), (10, 20)]
    assert tp.shards_of({}) == []
    with pytest.raises(tp.TrainPlanError, match=r"samples \[10, 12\) uncovered"):
        tp.shards_of({"fleet": {"shards": [{"start": 0, "end": 10}, {"start": 12, "end": 20}]}})
    with pytest.raises(tp.TrainPlanError, match=r"samples \[10, 8\) uncovered or overlap"):
        tp.shards_of({"fleet": {"shards": [{"start": 0, "end": 10}, {"start": 8, "end": 20}]}})
    with pytest.raises(tp.TrainPlanError, match="fleet.shards"):
        tp.shards_of({"fleet": {"shards": [{"start": 0}]}})


def test_epoch_plan_pads_short_units_and_keeps_ranks_in_their_unit():
    lay = tp.layout([(0, 30), (30, 36), (36, 60)], 60, 3)
    lengths = _lengths(60, 1)
    samples = [(i, lengths[i]) for i in range(60) if i % 10 != 7]  # some held out
    units = tp.unit_samples(lay, samples)
    plan = tp.epoch_plan(lay, units, 512, seed=0, epoch=0)
    assert all(len(row) == 3 for row in plan)
    for rank, (a, b) in enumerate(lay.units):
        got = [i for row in plan if row[rank] for i in row[rank]]
        assert sorted(got) == [i for i, _t in samples if a <= i < b]
    assert any(row[1] is None for row in plan)  # the small unit runs out first: zero-weight steps
    # the same samples per step whatever process holds them: a one-node run of three processes has this plan too
    assert plan == tp.epoch_plan(tp.layout([(0, 30), (30, 36), (36, 60)], 60, 3), units, 512, seed=0, epoch=0)
    with pytest.raises(tp.TrainPlanError, match="no sample"):
        tp.epoch_plan(tp.layout([], 0, 1), [[]], 512, seed=0, epoch=0)


def test_held_out_samples_split_within_their_unit():
    lay = tp.layout([(0, 10), (10, 20)], 20, 4)
    plan = tp.held_out_plan(lay, [1, 2, 3, 15])
    assert plan == [[1, 2, 15, None], [3, None, None, None]]
    assert tp.held_out_plan(tp.layout([], 20, 2), []) == []


def test_the_checkpoint_with_the_best_held_out_acceptance_is_chosen_the_earlier_on_a_tie():
    """An over-fitted end of training is not shipped: the best held-out acceptance length wins, not the last step;
    of two equal ones the earlier (trained less)."""
    curve = [{"step": 50, "acceptance_length": 2.1}, {"step": 100, "acceptance_length": 2.6},
             {"step": 150, "acceptance_length": 2.6}, {"step": 200, "acceptance_length": 2.4}]
    assert tp.choose_checkpoint(curve)["step"] == 100
    assert tp.choose_checkpoint(curve[:1])["step"] == 50
    assert tp.choose_checkpoint([*curve, {"step": 250, "acceptance_length": 2.61}])["step"] == 250
    with pytest.raises(ValueError, match="no held-out estimate"):
        tp.choose_checkpoint([])
