"""Retained serving releases and their live history (pure: files in a temporary state dir)."""

from __future__ import annotations

import json

from eagle3ops.supervisor.releases import Releases


def _spec(tag: str) -> dict:
    return {"Name": "vllm", "ImageId": None, "Config": {"Image": f"vllm:{tag}", "Labels": {}}, "HostConfig": {},
            "Networks": {}}


def test_fallbacks_follow_the_live_history_not_the_numbering(tmp_path):
    rel = Releases(tmp_path)
    good = rel.add(_spec("good"), "w1")
    rel.set_current(good)
    broken = rel.add(_spec("broken"), "w2")   # failed its gate: never made current
    newer = rel.add(_spec("newer"), "w3")
    rel.set_current(newer)
    assert rel.numbers() == [good, broken, newer]
    assert rel.history() == [good, newer]
    # The newest live release fails after a window: the rollback target is the previously *live* one.
    assert rel.fallbacks(newer) == [good]
    assert broken not in rel.fallbacks(None)


def test_fallbacks_are_most_recent_first_and_unique(tmp_path):
    rel = Releases(tmp_path)
    a, b, c = (rel.add(_spec(t), "w") for t in "abc")
    for n in (a, b, a, c):
        rel.set_current(n)
    assert rel.history() == [a, b, a, c]
    assert rel.fallbacks(c) == [a, b]
    assert rel.fallbacks(a) == [c, b]
    (tmp_path / "releases" / f"{b:04d}.json").unlink()  # no longer retained: never a target
    assert rel.fallbacks(c) == [a]


def test_history_is_seeded_from_the_numbering_on_older_state(tmp_path):
    rel = Releases(tmp_path)
    a, b, c = (rel.add(_spec(t), "w") for t in "abc")
    (tmp_path / "releases" / "current").write_text(f"{b}\n")  # state written before history.jsonl existed
    assert rel.history() == [a, b]
    rel.set_current(c)
    lines = [json.loads(x) for x in (tmp_path / "releases" / "history.jsonl").read_text().splitlines()]
    assert [x["release"] for x in lines] == [a, b, c]
    assert rel.fallbacks(c) == [b, a]


def test_release_label_carries_the_number(tmp_path):
    rel = Releases(tmp_path)
    n = rel.add(_spec("x"), "w")
    assert rel.get(n)["container"]["Config"]["Labels"]["io.eagle3ops.release"] == str(n)
    assert rel.fallbacks(None) == []
