"""The fleet planner, pure: sharding, the down-at-once policy, the merge, the budget split/refusal."""

from __future__ import annotations

import hashlib
import json

import pytest

from eagle3ops.config.inventory import FleetConfig, HostConfig
from eagle3ops.stages.merge import MergeError, check_merged, merge_manifests
from eagle3ops.fleet.plan import FleetHost, FleetPlanError, HostRates, model_limits, plan_fleet, rates_from, reassign
from eagle3ops.fleet.shard import Shard, shard_range, shard_ranges


def host(name: str, model: str | None = "kimi", budget: float = 3600.0, health: float = 600.0) -> HostConfig:
    serving = "none" if model is None else {"image": "vllm/vllm-openai:v0.16.0", "served_model_name": model,
                                            "health_timeout_s": health}
    return HostConfig(name=name, hostname=name, data_dir="/data", state_dir="/state", model_path="/m",
                      serving=serving, maintenance_budget_s=budget)


RATES = HostRates(tokens_per_s=100.0, fixed_s=300.0, stage_fixed_s=120.0, window_id="w1")


# --- sharding ------------------------------------------------------------------------------------------------------

def _speculators(n: int, world: int, rank: int) -> tuple[int, int]:
    # speculators 0.6.0 get_indices_to_process, written out independently
    chunk, rem = n // world, n % world
    start = rank * chunk + min(rank, rem)
    return start, start + chunk + (1 if rank < rem else 0)


def _specforge(total: int, dp_size: int, dp_rank: int) -> tuple[int, int]:
    # SpecForge prepare_hidden_states.py, written out independently
    per, rem = total // dp_size, total % dp_size
    if dp_rank < rem:
        per += 1
        start = dp_rank * per
    else:
        start = dp_rank * per + rem
    return start, start + per


@pytest.mark.parametrize("n", [0, 1, 2, 7, 10, 11, 100, 1001])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_shards_match_upstream_and_cover_once(n: int, world: int) -> None:
    hosts = [f"h{i}" for i in range(world)]
    shards = shard_ranges(n, hosts)
    covered = [i for s in shards for i in range(s.start, s.end)]
    assert covered == list(range(n))
    for s in shards:
        assert (s.start, s.end) == _speculators(n, world, s.rank) == _specforge(n, world, s.rank)
        assert s.host == hosts[s.rank]
    sizes = [s.samples for s in shards]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_shard_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="a, b named more than once"):
        shard_ranges(10, ["a", "b", "a", "b"])
    with pytest.raises(ValueError, match=r"rank must be in \[0, 3\)"):
        shard_range(10, 3, 3)


# --- policy and schedule -----------------------------------------------------------------------------------------

def _down_intervals(plan) -> list[tuple[float, float, str, str]]:
    """Each window's (start, end, model, host) when waves run one after another and a wave lasts its longest window."""
    t, out = 0.0, []
    for wave in plan.waves():
        longest = max((w.downtime_s or 0.0) for w in wave)
        out += [(t, t + (w.downtime_s or 0.0), w.serving, w.host) for w in wave if w.serving is not None]
        t += longest
    return out


def test_limit_one_never_has_two_serving_hosts_of_a_model_down_together() -> None:
    inv = [host("a"), host("b"), host("c"), host("d", model="llama"), host("e", model="llama"), host("t", None)]
    policy = FleetConfig(max_down_per_model=1)
    limits, _ = model_limits(inv, policy)
    assert limits == {"kimi": 1, "llama": 1}
    fh = [FleetHost.of(h, RATES) for h in inv]
    plan = plan_fleet("r", fh, samples=600, tokens=600_000, tokens_exact=True, limits=limits, policy=policy)
    assert [w.samples for w in plan.windows if w.host == "a"] == [100]
    downs = _down_intervals(plan)
    for i, (s1, e1, m1, h1) in enumerate(downs):
        for s2, e2, m2, h2 in downs[i + 1:]:
            if m1 == m2:
                assert e1 <= s2 or e2 <= s1, f"{h1} and {h2} (both serving {m1}) are down together"
    waves = plan.waves()
    assert len(waves) == 3  # kimi's three hosts one after another; llama's two beside them
    assert {w.host for w in waves[0]} == {"a", "d", "t"}
    assert [w for w in plan.windows if w.host == "t"][0].serving is None  # no window: nothing to stop
    text = plan.as_dict()
    assert text == plan_fleet("r", fh, samples=600, tokens=600_000, tokens_exact=True, limits=limits,
                              policy=policy).as_dict()  # deterministic


def test_default_policy_keeps_one_serving_host_up_and_lets_a_sole_server_go_alone() -> None:
    inv = [host("a"), host("b"), host("c"), host("s", model="solo")]
    limits, notes = model_limits(inv, FleetConfig())
    assert limits == {"kimi": 2, "solo": 1}
    assert any("solo has one serving host" in n for n in notes)
    fh = [FleetHost.of(h, RATES) for h in inv]
    plan = plan_fleet("r", fh, samples=40, tokens=40_000, tokens_exact=True, limits=limits, policy=FleetConfig())
    for wave in plan.waves():
        assert sum(w.serving == "kimi" for w in wave) <= 2  # never all three kimi hosts
    assert len(plan.waves()) == 2


# --- budget ---------------------------------------------------------------------------------------------------------

def test_window_over_budget_is_split_into_windows_that_fit() -> None:
    # 1000 samples x 1000 tokens at 100 tokens/s = 10,000 s of extraction; budget 3600 s, reserve 600 s.
    h = FleetHost.of(host("a", budget=3600.0, health=600.0), RATES)
    plan = plan_fleet("r", [h], samples=1000, tokens=1_000_000, tokens_exact=True, limits={"kimi": 1},
                      policy=FleetConfig())
    ws = plan.windows
    assert len(ws) == 4 and [w.part for w in ws] == [0, 1, 2, 3] and all(w.parts == 4 for w in ws)
    assert [(w.start, w.end) for w in ws] == [(0, 250), (250, 500), (500, 750), (750, 1000)]
    for w in ws:
        assert w.downtime_s == pytest.approx(300 + w.samples * 1000 / 100)
        assert w.downtime_s <= 3600 and w.stage_s <= 3600 - 600
    assert [w.wave for w in ws] == [0, 1, 2, 3]  # one host: one window per wave
    text = __import__("eagle3ops.fleet.plan", fromlist=["render"]).render(plan)
    assert "part 1/4" in text and "est. downtime 2800 s of budget 3600 s" in text


def test_window_over_budget_is_refused_when_splitting_is_off_or_impossible() -> None:
    h = FleetHost.of(host("a", budget=3600.0), RATES)
    with pytest.raises(FleetPlanError, match=r"a: the window for samples \[0, 1000\).*split_windows is false"):
        plan_fleet("r", [h], samples=1000, tokens=1_000_000, tokens_exact=True, limits={"kimi": 1},
                   policy=FleetConfig(split_windows=False))
    slow = FleetHost.of(host("a", budget=3600.0), HostRates(1.0, 300.0, 120.0, "w9"))
    with pytest.raises(FleetPlanError, match="even a one-sample window.*w9"):
        plan_fleet("r", [slow], samples=10, tokens=40_000, tokens_exact=True, limits={"kimi": 1},
                   policy=FleetConfig())


def test_rates_from_a_window_result_and_its_manifest() -> None:
    result = {"outcome": "ok", "stage_seconds": {"prepare": 20.0, "extract": 180.0}, "downtime_s": 400.0}
    r = rates_from("w1", result, {"generate_s": 100.0, "generate_tokens_per_s": 50.0})
    assert r == HostRates(tokens_per_s=50.0, fixed_s=300.0, stage_fixed_s=100.0, window_id="w1")
    assert r.downtime_s(5000) == 400.0  # reproduces the measured window
    assert rates_from("w2", {**result, "outcome": "failed"}, {"generate_s": 1, "generate_tokens_per_s": 5}) is None


def test_reassign_moves_the_rest_of_a_dead_hosts_shard() -> None:
    inv = [host("a"), host("b"), host("t", None)]
    fh = [FleetHost.of(h, RATES) for h in inv]
    limits, _ = model_limits(inv, FleetConfig())
    plan = plan_fleet("r", fh, samples=30, tokens=3000, tokens_exact=True, limits=limits, policy=FleetConfig())
    moved = reassign(plan, {"a"}, fh, done={0: 4}, policy=FleetConfig())
    assert [s.as_dict() for s in moved.shards] == [
        {"rank": 0, "host": "t", "start": 4, "end": 10}, {"rank": 1, "host": "b", "start": 10, "end": 20},
        {"rank": 2, "host": "t", "start": 20, "end": 30}]
    assert not any(w.host == "a" for w in moved.windows)
    assert "shard 0 [4, 10) moved to t" in moved.notes
    with pytest.raises(FleetPlanError, match="every host"):
        reassign(plan, {"a", "b", "t"}, fh, policy=FleetConfig())


# --- merge ----------------------------------------------------------------------------------------------------------

def _samples(n: int) -> list[list[int]]:
    return [[(7 * i + j) % 50 for j in range(3 + i % 5)] for i in range(n)]


def _manifest(ids: range, token_ids: list[list[int]], prepare_sha: str) -> str:
    sample_files = [{"i": i, "file": f"hidden/data_{i:06d}.pt", "tokens": len(token_ids[i])} for i in ids]
    files = {f"hidden/data_{i:06d}.pt": {"bytes": 10 * len(token_ids[i]),
                                        "sha256": hashlib.sha256(json.dumps(token_ids[i]).encode()).hexdigest()}
             for i in ids}
    tokens = sum(len(token_ids[i]) for i in ids)
    m = {"stage": "extract", "status": "complete", "config_digest": "cd", "inputs": {"prepare": prepare_sha},
         "dtype": "bfloat16", "hidden_size": 8, "num_layers": 4, "aux_layer_ids": [0, 1, 2], "layer_ids": [0, 1, 2, 3],
         "hidden_bytes_per_token": 64, "engine": "vllm", "layer_convention": "x", "samples": len(ids),
         "tokens": tokens, "hidden_bytes": 64 * tokens, "file_bytes": sum(f["bytes"] for f in files.values()),
         "sample_files": sample_files, "files": files}
    return json.dumps(m)


def test_merged_manifest_equals_a_one_host_run() -> None:
    token_ids = _samples(23)
    prep = json.dumps({"stage": "prepare", "samples": 23, "tokens": sum(map(len, token_ids))})
    sha = hashlib.sha256(prep.encode()).hexdigest()
    one = json.loads(_manifest(range(23), token_ids, sha))
    shards = shard_ranges(23, ["a", "b", "c"])
    merged = merge_manifests(shards, {s.rank: _manifest(range(s.start, s.end), token_ids, sha) for s in shards})
    for k in ("sample_files", "files", "samples", "tokens", "hidden_bytes", "file_bytes", "layer_ids", "inputs"):
        assert merged[k] == one[k], k
    assert [r["host"] for r in merged["fleet"]["shards"]] == ["a", "b", "c"]
    check_merged(merged, prep)
    # a shard that extracted another sample range, or another prepare, is refused by name
    bad = {s.rank: _manifest(range(s.start, s.end), token_ids, sha) for s in shards}
    bad[1] = _manifest(range(8, 15), token_ids, sha)
    with pytest.raises(MergeError, match=r"shard 1 \(samples \[8, 16\) on b\).*expected exactly samples 8..15"):
        merge_manifests(shards, bad)
    with pytest.raises(MergeError, match=r"shard 1 \(samples \[8, 16\) on b\): no extract manifest"):
        merge_manifests(shards, {0: bad[0]})
    other = dict(json.loads(prep), samples=24)
    with pytest.raises(MergeError, match="made from prepare manifest"):
        check_merged(merged, json.dumps(other))
    assert isinstance(Shard(0, "a", 0, 1).samples, int)
