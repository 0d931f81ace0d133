"""The train stage's distributed path on CPU: torchrun with 2 gloo processes (FSDP2), and checkpoints that resume
across world sizes (2 -> 1 and 1 -> 2). Real speculators draft head on the tiny Llama's extracted hidden states.

Development: ``PYTHONPATH=<patched speculators overlay>:src /opt/e3/venv-ml/bin/python -m pytest
tests/image/test_stages_distributed.py`` (about 2 minutes on 2 cores).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from eagle3ops.config.pipeline import load_pipeline_config  # noqa: E402
from eagle3ops.stages.extract import run_extract  # noqa: E402
from eagle3ops.stages.prepare import run_prepare  # noqa: E402
from eagle3ops.stages.train import NPROC_ENV, resolve_nproc, run_train  # noqa: E402
from eagle3ops.stages.trainplan import held_out_of  # noqa: E402
from eagle3ops.stages.vocab import run_vocab  # noqa: E402
from eagle3ops.fixtures.tinymodel import build_tiny_model  # noqa: E402

QUIET = lambda *_a, **_k: None  # noqa: E731


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """prepare (42 samples), extract (reference engine) and vocab done on the tiny Llama; train not yet."""
    root = tmp_path_factory.mktemp("dist")
    model = build_tiny_model(root / "llama", kind="llama")
    run = root / "base"
    run.mkdir()
    cfg = {"target_model": str(model), "prepare": {"max_seq_len": 256},
           "extract": {"engine": "transformers", "aux_layer_ids": [0, 1, 2]}, "vocab": {"draft_vocab_size": 256},
           "train": {"steps": 4, "checkpoint_every": 2, "batch_max_tokens": 512}}
    (run / "pipeline.yaml").write_text(json.dumps(cfg))
    for fn in (run_prepare, run_extract, run_vocab):
        fn(run, load_pipeline_config(run), log=QUIET)
    return run


def _losses(run: Path) -> list[float]:
    return [json.loads(x)["loss"] for x in (run / "train/metrics.jsonl").read_text().splitlines()]


def _ckpt(run: Path, step: int) -> Path:
    return run / f"train/checkpoints/step_{step:08d}"


def _tamper(ckpt: Path) -> torch.Tensor:
    """Shift fc.weight by 0.01 and give it a zero first moment and a huge second moment: a resume that loads
    both the weights and the optimizer state then leaves fc.weight where it is (updates ~1e-9); one that loads
    neither, or only one, moves it by ~1e-4 (a fresh Adam step) or lands 0.01 away. Returns the new fc.weight."""
    from safetensors.torch import load_file, save_file

    sd = load_file(ckpt / "model.safetensors")
    sd["fc.weight"] = sd["fc.weight"] + 0.01
    save_file(sd, ckpt / "model.safetensors", metadata={"format": "pt"})
    osd = torch.load(ckpt / "optimizer.pt", weights_only=True)
    st = osd["state"]["fc.weight"]
    st["exp_avg"], st["exp_avg_sq"] = torch.zeros_like(st["exp_avg"]), torch.full_like(st["exp_avg_sq"], 1e8)
    torch.save(osd, ckpt / "optimizer.pt")
    return sd["fc.weight"]


def _assert_resumed_from(run: Path, tampered: torch.Tensor) -> None:
    from safetensors.torch import load_file

    w4 = load_file(_ckpt(run, 4) / "model.safetensors")["fc.weight"]  # fp32 checkpoint after 2 more steps
    assert (w4 - tampered).abs().max().item() < 2e-5  # AdamW decay moves it ~1e-6 per step, nothing else


def test_nproc_from_env_config_and_devices(base, monkeypatch):
    cfg = load_pipeline_config(base)
    monkeypatch.delenv(NPROC_ENV, raising=False)
    assert resolve_nproc(cfg) == (torch.cuda.device_count() if torch.cuda.is_available() else 1)  # auto
    assert resolve_nproc(cfg.model_copy(update={"train": cfg.train.model_copy(update={"nproc": 3})})) == 3
    monkeypatch.setenv(NPROC_ENV, "2")
    assert resolve_nproc(cfg) == 2
    monkeypatch.setenv(NPROC_ENV, "two")
    with pytest.raises(ValueError, match=NPROC_ENV):
        resolve_nproc(cfg)


def test_two_gloo_processes_checkpoint_resumes_in_one(tmp_path, base, monkeypatch):
    run = Path(shutil.copytree(base, tmp_path / "run"))
    monkeypatch.setenv(NPROC_ENV, "2")
    assert run_train(run, load_pipeline_config(run), log=QUIET, stop_after=2) == {"stopped_at": 2}
    state = json.loads((_ckpt(run, 2) / "state.json").read_text())
    assert state["world_size"] == 2 and not (run / "train/manifest.json").exists()
    osd = torch.load(_ckpt(run, 2) / "optimizer.pt", weights_only=True)
    assert "fc.weight" in osd["state"] and osd["state"]["fc.weight"]["exp_avg"].shape == (128, 384)  # full, unsharded
    tampered = _tamper(_ckpt(run, 2))
    monkeypatch.setenv(NPROC_ENV, "1")
    fig = run_train(run, load_pipeline_config(run), log=QUIET)
    assert fig["world_size"] == 1 and fig["resumed_from_step"] == 2 and fig["steps_this_run"] == 2
    assert fig["steps"] == 4 and len(_losses(run)) == 4 and all(math.isfinite(x) for x in _losses(run))
    assert (run / "train/final/model.safetensors").is_file()
    _assert_resumed_from(run, tampered)


def test_one_process_checkpoint_resumes_in_two_gloo_processes(tmp_path, base, monkeypatch):
    run = Path(shutil.copytree(base, tmp_path / "run"))
    monkeypatch.setenv(NPROC_ENV, "1")
    assert run_train(run, load_pipeline_config(run), log=QUIET, stop_after=2) == {"stopped_at": 2}
    tampered = _tamper(_ckpt(run, 2))
    monkeypatch.setenv(NPROC_ENV, "2")
    fig = run_train(run, load_pipeline_config(run), log=QUIET)
    assert fig["world_size"] == 2 and fig["distributed"] == "FSDP2 fully_shard, gloo"
    assert fig["resumed_from_step"] == 2 and fig["steps_this_run"] == 2 and fig["steps"] == 4
    losses = _losses(run)
    assert len(losses) == 4 and all(math.isfinite(x) and x > 0 for x in losses)
    assert len(fig["peak_memory_bytes_per_rank"]) == 2 and min(fig["peak_memory_bytes_per_rank"]) > 0
    # 2 ranks pack 2 batches per step: about twice the tokens of a 1-process step
    steps = [json.loads(x) for x in (run / "train/metrics.jsonl").read_text().splitlines()]
    assert sum(s["tokens"] for s in steps[2:]) > 1.4 * sum(s["tokens"] for s in steps[:2])
    _assert_resumed_from(run, tampered)


# --- several nodes: three node processes on this machine's loopback, each with its own run dir holding only
# its own shard's hidden states, as three fleet hosts hold them after a fleet extract.

def _as_fleet(run: Path, n_shards: int, keep: int | None) -> list[tuple[int, int]]:
    """Rewrite ``run``'s extract manifest as a fleet run's merged one (``fleet.shards``: ``n_shards`` contiguous
    ranges) and, unless ``keep`` is None, delete the hidden-state files of every shard but ``keep`` (a node's own)."""
    man_path = run / "extract/manifest.json"
    man = json.loads(man_path.read_text())
    n = len(man["sample_files"])
    cuts = [round(k * n / n_shards) for k in range(n_shards + 1)]
    ranges = list(zip(cuts[:-1], cuts[1:]))
    man["fleet"] = {"shards": [{"rank": k, "host": f"node{k}", "start": a, "end": b} for k, (a, b) in enumerate(ranges)]}
    man_path.write_text(json.dumps(man))
    if keep is not None:
        a, b = ranges[keep]
        for s in man["sample_files"]:
            if not a <= s["i"] < b:
                (run / "extract" / s["file"]).unlink()
    return ranges


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nodes(runs: list[Path], *extra: str, kill_node: int | None = None, kill_after_s: float = 0) -> list[int]:
    """``stage train --nodes N --node-rank k --rendezvous 127.0.0.1:PORT`` for every run dir at once (one process
    each, gloo on loopback); ``kill_node``: SIGKILL that node's process group after ``kill_after_s``. Returns the
    exit statuses (bounded: 300 s). Each node's output goes to ``<run>.node.log``; when a status is not 0 the
    last lines of every node's log are printed (a CI log shows which node failed and how)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    port = _free_port()
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", NPROC_ENV: "1"}
    logs = [r.with_name(r.name + ".node.log") for r in runs]
    procs = []
    for k, r in enumerate(runs):
        with open(logs[k], "w") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", "eagle3ops.stages", "train", "--run-dir", str(r),
                                           "--nodes", str(len(runs)), "--node-rank", str(k), "--rendezvous",
                                           f"127.0.0.1:{port}", *extra],
                                          env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT))
    if kill_node is not None:
        time.sleep(kill_after_s)
        os.killpg(procs[kill_node].pid, signal.SIGKILL)
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=300))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            rcs.append(p.wait())
    if any(rcs) and kill_node is None:
        for k, log in enumerate(logs):
            lines = [x for x in log.read_text(errors="replace").splitlines() if "speculators.utils" not in x]
            print(f"--- node {k} (exit {rcs[k]}), last lines of {log}:", *lines[-25:], sep="\n")
    return rcs


def _steps(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "train/metrics.jsonl").read_text().splitlines()]


def test_three_nodes_train_their_own_shards_as_one_node_of_three_processes(tmp_path, base, monkeypatch):
    """Multi-node training on one machine: three nodes (each only its shard's files) see the same samples at
    every step as one node with three processes, every training sample once per epoch, the same losses; then a
    three-node run stopped at a checkpoint resumes in one process on the union (a lost node does not lose the run)."""
    steps = 8
    for name in ("one", "n0", "n1", "n2"):
        r = Path(shutil.copytree(base, tmp_path / name))
        cfg = json.loads((r / "pipeline.yaml").read_text())
        cfg["train"]["steps"] = steps
        (r / "pipeline.yaml").write_text(json.dumps(cfg))
    one = tmp_path / "one"
    ranges = _as_fleet(one, 3, None)
    nodes = [tmp_path / f"n{k}" for k in range(3)]
    for k, r in enumerate(nodes):
        _as_fleet(r, 3, k)
    monkeypatch.setenv(NPROC_ENV, "3")
    ref = run_train(one, load_pipeline_config(one), log=QUIET)
    assert ref["world_size"] == 3
    assert _nodes(nodes) == [0, 0, 0]
    got = json.loads((nodes[0] / "train/manifest.json").read_text())
    assert got["world_size"] == 3 and got["steps"] == steps
    assert not (nodes[1] / "train/manifest.json").exists()  # node 0 writes the outputs
    a, b = _steps(one), _steps(nodes[0])
    assert [s["samples"] for s in a] == [s["samples"] for s in b]
    for s in b:  # rank k trains only shard k's samples
        for k, ids in enumerate(s["samples"]):
            assert ids is None or all(ranges[k][0] <= i < ranges[k][1] for i in ids)
    assert abs(b[-1]["loss"] - a[-1]["loss"]) <= 0.02 * a[-1]["loss"]
    cfg = load_pipeline_config(one)
    samples = json.loads((one / "extract/manifest.json").read_text())["sample_files"]
    train_ids = set(range(len(samples))) - held_out_of(samples, cfg.train.held_out_fraction, cfg.seed)
    first = [i for s in b if s["epoch"] == 0 for ids in s["samples"] if ids for i in ids]
    assert max(s["epoch"] for s in b) >= 1  # a whole first epoch ran
    assert sorted(first) == sorted(train_ids)  # every training sample exactly once in it
    assert got["offline_estimate"]["held_out_samples"] == ref["offline_estimate"]["held_out_samples"]
    assert abs(got["offline_estimate"]["acceptance_length"] - ref["offline_estimate"]["acceptance_length"]) < 0.02

    # stopped three-node run -> resumed by one process holding every file (the union, as train --from-fleet gathers)
    for r in nodes:
        shutil.rmtree(r / "train")
    assert _nodes(nodes, "--stop-after", "4") == [0, 0, 0]
    assert json.loads((_ckpt(nodes[0], 4) / "state.json").read_text())["world_size"] == 3
    union = Path(shutil.copytree(one, tmp_path / "union"))
    shutil.rmtree(union / "train")
    shutil.copytree(nodes[0] / "train", union / "train")
    monkeypatch.setenv(NPROC_ENV, "1")
    fig = run_train(union, load_pipeline_config(union), log=QUIET)
    assert fig["resumed_from_step"] == 4 and fig["steps"] == steps and fig["world_size"] == 1
    assert all(math.isfinite(s["loss"]) for s in _steps(union))


@pytest.mark.parametrize("n,replicas", [(41, 1), (41, 3), (300, 4)])
def test_the_plan_packs_as_speculators_sampler_and_keeps_what_it_drops(n, replicas):
    """trainplan.pack_epoch reproduces MultipackDistributedBatchSamplerV2's batches for every replica; the samples
    V2 drops at the epoch's end (fewer than the replicas) form one more step instead."""
    import random

    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    from eagle3ops.stages.trainplan import pack_epoch

    rnd = random.Random(n)
    lengths = [rnd.randint(8, 700) for _ in range(n)]  # some past batch_max_tokens: V2 clips them as here
    for epoch in (0, 1):
        ours = pack_epoch(lengths, 512, replicas, seed=5, epoch=epoch)
        for r in range(replicas):
            v2 = MultipackDistributedBatchSamplerV2(batch_max_length=512, lengths=lengths, num_replicas=replicas,
                                                    rank=r, seed=5)
            v2.set_epoch(epoch)
            theirs = [[int(i) for i in b] for b in v2]
            assert [step[r] for step in ours[: len(theirs)]] == theirs
        dropped = n - sum(len(b) for step in ours[: len(theirs)] for b in step)
        assert dropped < replicas and len(ours) == len(theirs) + (1 if dropped else 0)
