"""The pure plan of ``train HOST --from-fleet MERGED`` (:mod:`eagle3ops.fleet.hidden`) and the parsing of the training
host's digests (:func:`eagle3ops.transfer.hidden.parse_digests`): no host."""

from __future__ import annotations

import pytest

from eagle3ops.fleet.hidden import (DEFAULT_LINK_BYTES_PER_S, HiddenPlanError, check_space, files_by_host, plan_move,
                                    render)
from eagle3ops.transfer.hidden import parse_digests


def _merged(n: int = 6, hosts=("a", "b", "c"), size: int = 1000) -> dict:
    per = -(-n // len(hosts))
    shards = [{"rank": k, "host": h, "start": min(k * per, n), "end": min((k + 1) * per, n)}
              for k, h in enumerate(hosts)]
    sample_files = [{"i": i, "file": f"hidden/data_{i:06d}.pt", "tokens": 10} for i in range(n)]
    files = {r["file"]: {"bytes": size + r["i"], "sha256": f"{r['i']:064x}"} for r in sample_files}
    return {"files": files, "sample_files": sample_files, "fleet": {"shards": shards}}


def _present(merged: dict, which) -> dict[str, str]:
    return {rel: e["sha256"] for rel, e in merged["files"].items() if which(rel)}


def test_files_are_assigned_to_the_host_of_their_shard():
    by = files_by_host(_merged())
    assert [f.rel for f in by["a"]] == ["hidden/data_000000.pt", "hidden/data_000001.pt"]
    assert [f.rel for f in by["c"]] == ["hidden/data_000004.pt", "hidden/data_000005.pt"]
    assert by["b"][0].bytes == 1002 and by["b"][0].sha256 == f"{2:064x}"


def test_plan_sends_only_what_the_training_host_lacks_with_bytes_and_seconds_from_the_link():
    m = _merged()
    own = _present(m, lambda rel: rel < "hidden/data_000002")  # a's shard
    present = {**own, "hidden/data_000004.pt": f"{4:064x}"}  # one of c's already there (a resumed copy)
    plan = plan_move(m, "r", "a", present, {"b": (2000.0, "measured")})
    moves = {mv.host: mv for mv in plan.moves}
    assert plan.own_files == 2
    assert [f.rel for f in moves["b"].files] == ["hidden/data_000002.pt", "hidden/data_000003.pt"]
    assert moves["b"].bytes == 1002 + 1003 and moves["b"].seconds == round(2005 / 2000, 1)
    assert [f.rel for f in moves["c"].files] == ["hidden/data_000005.pt"] and moves["c"].present == 1
    assert moves["c"].bytes_per_s == DEFAULT_LINK_BYTES_PER_S and "assumed" in moves["c"].rate_from
    assert plan.bytes == 1002 + 1003 + 1005
    text = render(plan)
    assert "from b: 2 file(s), 2005 bytes" in text and "1 already there" in text


def test_a_rerun_with_everything_there_sends_nothing():
    m = _merged()
    plan = plan_move(m, "r", "b", _present(m, lambda rel: True))
    assert plan.bytes == 0 and all(not mv.files for mv in plan.moves)


def test_a_file_with_another_digest_on_the_training_host_is_sent_again_and_named():
    m = _merged()
    present = {**_present(m, lambda rel: True), "hidden/data_000003.pt": "f" * 64}
    plan = plan_move(m, "r", "a", present)
    assert plan.replace == ["hidden/data_000003.pt"]
    assert [f.rel for mv in plan.moves for f in mv.files] == ["hidden/data_000003.pt"]


def test_the_training_hosts_own_file_missing_or_corrupted_is_refused_by_name():
    m = _merged()
    present = _present(m, lambda rel: rel != "hidden/data_000001.pt")
    with pytest.raises(HiddenPlanError, match=r"a: extract/hidden/data_000001.pt of its own shard is missing.*"
                                               r"rerun the fleet extract"):
        plan_move(m, "r", "a", present)
    present["hidden/data_000001.pt"] = "0" * 64
    with pytest.raises(HiddenPlanError, match="data_000001.pt of its own shard has sha256 0000"):
        plan_move(m, "r", "a", present)


def test_a_file_needed_from_a_dead_host_is_refused():
    m = _merged()
    with pytest.raises(HiddenPlanError, match="c is marked dead but holds 2 file"):
        plan_move(m, "r", "a", _present(m, lambda rel: rel < "hidden/data_000004"), dead={"c"})


@pytest.mark.parametrize("bad, match", [
    ({"fleet": {}}, "no `fleet.shards`"),
    ({"sample_files": [{"i": 9, "file": "hidden/x.pt", "tokens": 1}]}, "sample 9 .* lies in no shard"),
    ({"sample_files": [{"i": 0, "file": "../etc/passwd", "tokens": 1}]}, "not a plain relative path"),
    ({"files": {}}, "has no `files` entry"),
])
def test_a_manifest_that_is_not_a_merged_fleet_manifest_is_refused(bad, match):
    with pytest.raises(HiddenPlanError, match=match):
        files_by_host({**_merged(), **bad})


def test_extra_files_no_sample_names_are_refused():
    m = _merged()
    m["files"]["hidden/stray.pt"] = {"bytes": 1, "sha256": "0" * 64}
    with pytest.raises(HiddenPlanError, match="stray.pt"):
        files_by_host(m)


def test_digests_parse_into_placed_and_arrived_relative_to_extract():
    out = (f"{'a' * 64}  /d/runs/r/extract/hidden/data_000000.pt\n"
           f"{'b' * 64}  /d/runs/r/extract/.incoming/hidden/data_000003.pt\n"
           "find: '/d/runs/r/extract/.incoming': No such file or directory\n")
    placed, arrived = parse_digests(out, "/d/runs/r/extract", ".incoming")
    assert placed == {"hidden/data_000000.pt": "a" * 64}
    assert arrived == {"hidden/data_000003.pt": "b" * 64}


def test_a_copy_larger_than_the_training_hosts_free_disk_is_refused_before_anything_is_written():
    m = _merged()
    plan = plan_move(m, "r", "a", _present(m, lambda rel: rel < "hidden/data_000002"))
    check_space(plan, plan.bytes, "/data")  # exactly fits
    check_space(plan, None, "/data")  # unknown: not refused
    with pytest.raises(HiddenPlanError, match=rf"a: /data has {plan.bytes - 1} bytes free, the copy needs "
                                              rf"{plan.bytes}.*hosts.a.data_dir"):
        check_space(plan, plan.bytes - 1, "/data")
