"""The stand-in stages (:mod:`eagle3ops_dev.standin_stages`) run in this process on a local run dir: the stand-in
train reads every sample file the extract manifest lists — a one-host run's, or a merged fleet run's put together from
shard outputs as ``train --from-fleet`` leaves them — checked by sha256 as the real stage's inputs are; a file whose
content differs from the manifest is refused by name. No host."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from eagle3ops.stages.merge import bind_inputs, check_merged, merge_manifests
from eagle3ops.fleet.shard import Shard
from eagle3ops_dev import standin_stages

PIPELINE = "target_model: /model\nprepare: {datasets: [builtin:sharegpt], max_seq_len: 256, max_samples: 7}\n"


def _run(tmp: Path, name: str) -> Path:
    d = tmp / name
    d.mkdir()
    (d / "pipeline.yaml").write_text(PIPELINE)
    assert standin_stages.main(["prepare", "--run-dir", str(d)]) == 0
    return d


def _read(d: Path) -> list[int]:
    return [r["i"] for r in json.loads((d / "train/standin.json").read_text())["train"]["read"]]


def test_standin_train_reads_a_one_host_run_and_a_merged_fleet_run(tmp_path, capsys):
    one = _run(tmp_path, "one")
    for stage in ("extract", "vocab", "train"):
        assert standin_stages.main([stage, "--run-dir", str(one)]) == 0
    assert _read(one) == list(range(7))

    # three shards on three "hosts" (run dirs), then the union put into the training host's run dir
    hosts = [_run(tmp_path, f"h{k}") for k in range(3)]
    ranges = [(0, 3), (3, 5), (5, 7)]
    texts = {}
    for k, (d, (s, e)) in enumerate(zip(hosts, ranges)):
        assert standin_stages.main(["extract", "--run-dir", str(d), "--shard", f"{s}:{e}"]) == 0
        texts[k] = (d / f"extract/shards/{s}-{e}.json").read_text()
    merged = merge_manifests([Shard(k, f"h{k}", s, e) for k, (s, e) in enumerate(ranges)], texts)
    train_dir = hosts[0]
    for d in hosts[1:]:
        for f in (d / "extract/hidden").iterdir():
            shutil.copy(f, train_dir / "extract/hidden" / f.name)
    prep = (train_dir / "prepare/manifest.json").read_text()
    check_merged(merged, prep)
    (train_dir / "extract/manifest.json").write_text(json.dumps(bind_inputs(merged, prep)))
    assert standin_stages.main(["vocab", "--run-dir", str(train_dir)]) == 0
    assert standin_stages.main(["train", "--run-dir", str(train_dir)]) == 0
    assert _read(train_dir) == list(range(7))
    assert json.loads((train_dir / "extract/manifest.json").read_text())["files"] == json.loads(
        (one / "extract/manifest.json").read_text())["files"]  # the union is the one-host run, file by file

    # a shard file that differs from the merged manifest: the train refuses it by name
    bad = train_dir / "extract/hidden/data_000004.standin.json"
    bad.write_text(bad.read_text().replace("true", "1   "))
    assert standin_stages.main(["train", "--run-dir", str(train_dir), "--restart"]) == 2
    assert "data_000004.standin.json does not match the sha256" in capsys.readouterr().out
