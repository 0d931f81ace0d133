"""The container specs of the tiny Kimi target's head run (:mod:`eagle3ops_dev.headspecs`).

The run itself (the tiny Kimi-K2.5-class target served without and with a head trained by eagle3ops's stages,
greedy-identical, spec-decode counters; 160 s) left the test suite for ``benchmarks/kimi-trained-head/kimi_trained_head.py``
(``make bench-kimi-head``); see its docstring for what still covers its parts in CI.
"""

from __future__ import annotations

import json

from eagle3ops_dev import headspecs


def test_headspecs_mount_the_checkout_and_run_as_the_caller():
    """The container specs are plain data: this checkout's src read-only and first on PYTHONPATH, the work dir
    read-write, no network, the caller's uid:gid, and every path quoted once (a space survives the shell)."""
    t = headspecs.train_head_spec("pipe:1", src="/s", work="/w d", user="1000:1000", target="k 25", kind="kimi-k25",
                                  run="run")
    g = headspecs.greedy_pair_spec("serve:1", src="/s", work="/w d", user="1000:1000", kind="kimi-k25",
                                   target="k 25", draft="run/train/final", prompts="p.json", out="o.json")
    for spec, image in ((t, "pipe:1"), (g, "serve:1")):
        assert spec["image"] == image and spec["network_mode"] == "none" and spec["user"] == "1000:1000"
        assert spec["volumes"] == ["/s:/e3/src:ro", "/w d:/e3/work"]
        assert spec["environment"]["PYTHONPATH"] == "/e3/src" and spec["entrypoint"] == ["sh", "-c"]
        json.dumps(spec)
    script = t["command"][0]
    assert script.startswith("set -e; test -f '/e3/work/k 25/config.json' || python3 -m eagle3ops.fixtures.tinymodel ")
    assert [s for s in headspecs.HEAD_STAGES if f"eagle3ops stage {s} --run-dir /e3/work/run" in script] == \
        list(headspecs.HEAD_STAGES)
    assert "--target '/e3/work/k 25'" in g["command"][0] and "--draft /e3/work/run/train/final" in g["command"][0]
    assert "--prompts /e3/work/p.json" in g["command"][0] and "--dtype float32" in g["command"][0]
