"""The tiny Kimi-K2.5-class target served with a draft head trained by eagle3ops's own stages, as a
benchmark: greedy identity of speculative serving, the spec-decode counters and the acceptance length, on CPU.

Moved out of the test suite (``tests/test_kimi_serving.py``, 160 s of every CI run: a timing verdict belongs to a
benchmark): its parts stay
covered there by cheaper tests (every stage and the probe with vLLM on the tiny Kimi target: the in-image
``tests/image/test_kimi.py``; EAGLE-3 serving greedy-identical on the Kimi target: the serving image's build probes
(:mod:`eagle3ops.patches.specprobes`)); what only this run shows is a head that eagle3ops trained, served by vLLM's
Kimi-K2.5 model class, with its figures.

Across two images on the local engine (docker SDK; container specs from :mod:`eagle3ops_dev.headspecs`; this
checkout's ``src`` is mounted over the images' copy):

1. the pipeline image builds the tiny ``kimi-k25`` target (random weights); the serving image generates the target's
   own greedy replies to stand-in user messages (:func:`eagle3ops.fixtures.tinykimi.synthetic_chat_rows`): the training
   conversations (a random target's replies share few tokens with any real text);
2. the pipeline image runs prepare -> extract (transformers engine) -> vocab -> train on them;
3. the serving image (``vllm-0.16.0-serving-cpu-standin``: the vLLM series plus the sandbox's CPU STAND-IN series)
   serves the target greedily without and with the trained head on prompts taken from the prepared conversations,
   in float32.

Checked (exit 1 naming the check): greedy output identical token for token; drafts > 0 and the draft / accepted /
per-position counters consistent. Measured and written (``--json``): the counters, the acceptance length, the train
loss, wall times. Acceptance is near 1 by construction: the tiny target's next-token distribution is nearly flat
(top-2 logit gaps down to 1e-4), so distillation carries almost no signal about its argmax (earlier runs: 2 of 366
draft tokens accepted, acceptance length 1.016, the same as a random head).

Usage::

    .venv/bin/python benchmarks/kimi-trained-head/kimi_trained_head.py --json benchmarks/kimi-trained-head/kimi-trained-head-cpu.json   # make bench-kimi-head
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import write_result  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PROFILE = "vllm-0.16.0-serving-cpu-standin"
NUM_PROMPTS = 4
MAX_TOKENS = 32
NUM_CHATS = 24  # training conversations: stand-in user messages, the target's own greedy replies
REPLY_TOKENS = 48
TRAIN_STEPS = 20
PROMPT_CAP = 160  # tokens of each prompt (the conversation up to its first reply, cut here)


class Failed(Exception):
    """A check of the run failed; the message names it."""


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise Failed(what)


def images_for_run() -> tuple[str, str]:
    """(pipeline image, serving image) tags on the local engine, built if missing (cached by content tag)."""
    from eagle3ops import images

    ca = images.default_ca_bundle()
    pipe = images.build_image("pipeline", base_image=images.LOCAL_BASE_TAG, ca_bundle=ca, quiet=True).tag
    serving = images.build_image("serving", images.LOCAL_BASE_TAG, PROFILE, ca_bundle=ca, quiet=True).tag
    return pipe, serving


def _run(spec: dict, timeout_s: int) -> tuple[int, str]:
    """Run a container to completion (bounded wait), return (exit status, log tail); the container is removed."""
    from eagle3ops import images

    c = images.docker_client().containers.run(**spec, detach=True)
    try:
        rc = c.wait(timeout=timeout_s)["StatusCode"]
        return rc, c.logs().decode(errors="replace")[-6000:]
    finally:
        c.remove(force=True)


def _prompts(run: Path) -> list[list[int]]:
    """The first NUM_PROMPTS prepared conversations up to their first trained (assistant) token, cut to PROMPT_CAP."""
    out = []
    for line in (run / "prepare/samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        first = row["loss_mask"].index(1)
        out.append(row["input_ids"][:min(first, PROMPT_CAP)])
        if len(out) == NUM_PROMPTS:
            break
    return out


def run(work: Path, pipe: str, serving: str) -> dict:
    """The three steps in ``work`` (a fresh directory); returns the figures.

    Raises:
        Failed: a container exited non-zero (its log tail in the message) or a check failed.
    """
    from eagle3ops_dev import headspecs
    from eagle3ops.fixtures.tinykimi import synthetic_chat_rows

    t_all = time.monotonic()
    (work / "run").mkdir(parents=True)
    os.chmod(work, 0o777)
    common = dict(src=str(REPO / "src"), work=str(work), user=f"{os.getuid()}:{os.getgid()}")
    wall = {}

    t0 = time.monotonic()
    rc, log = _run(headspecs.train_head_spec(pipe, **common, target="kimi-k25", kind="kimi-k25", run="run",
                                             stages=()), 600)
    _check(rc == 0, f"building the tiny Kimi target: {log}")
    questions = [r["messages"][0]["content"] for r in synthetic_chat_rows(NUM_CHATS, seed=3, turns=1)]
    (work / "questions.json").write_text(json.dumps(questions))
    rc, log = _run(headspecs.greedy_pair_spec(serving, **common, kind="kimi-k25", target="kimi-k25",
                                              replies_for="questions.json", out="replies.json",
                                              max_tokens=REPLY_TOKENS), 900)
    _check(rc == 0, f"the target's replies: {log}")
    replies = json.loads((work / "replies.json").read_text())["replies"]
    _check(len(replies) == NUM_CHATS and all(replies), "one non-empty reply per question")
    (work / "chat.jsonl").write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n"
        for q, a in zip(questions, replies, strict=True)))
    wall["replies"] = time.monotonic() - t0

    (work / "run/pipeline.yaml").write_text(json.dumps({
        "target_model": f"{headspecs.WORK_MOUNT}/kimi-k25",
        "prepare": {"max_seq_len": 512, "datasets": [f"{headspecs.WORK_MOUNT}/chat.jsonl"],
                    "on_unmaskable": "skip"},
        "extract": {"engine": "transformers", "aux_layer_ids": [0, 1, 2]},  # vLLM's ids: (1, 2, 3)
        "vocab": {"draft_vocab_size": 1024},
        "train": {"steps": TRAIN_STEPS, "checkpoint_every": TRAIN_STEPS, "batch_max_tokens": 1024, "lr": 3e-3},
    }))
    t0 = time.monotonic()
    rc, log = _run(headspecs.train_head_spec(pipe, **common, target="kimi-k25", kind="kimi-k25", run="run"), 1200)
    wall["pipeline"] = time.monotonic() - t0
    _check(rc == 0, f"the stages: {log}")
    conf = json.loads((work / "run/train/final/config.json").read_text())
    _check(conf["speculators_config"]["verifier"]["architectures"] == ["KimiK25ForConditionalGeneration"],
           "the head's verifier is the Kimi-K2.5 class")
    _check(conf["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3], "aux layer ids in vLLM's convention (1, 2, 3)")
    tr = json.loads((work / "run/train/manifest.json").read_text())

    (work / "prompts.json").write_text(json.dumps(_prompts(work / "run")))
    t0 = time.monotonic()
    rc, log = _run(headspecs.greedy_pair_spec(serving, **common, kind="kimi-k25", target="kimi-k25",
                                              draft="run/train/final", prompts="prompts.json", out="trained.json",
                                              max_tokens=MAX_TOKENS), 900)
    wall["serving"] = time.monotonic() - t0
    _check(rc == 0, f"serving without and with the head: {log}")
    res = json.loads((work / "trained.json").read_text())
    _check([len(o) for o in res["base"]] == [MAX_TOKENS] * NUM_PROMPTS, "every prompt's full greedy output")
    _check(res["divergences"] == {} and res["spec"] == res["base"],
           f"speculative greedy output differs (prompt: first position) {res['divergences']}")
    c = res["counters"]
    _check(c["drafts"] > 0 and c["drafts"] <= c["draft_tokens"] <= 3 * c["drafts"], f"draft counters {c}")
    _check(0 <= c["accepted"] <= c["draft_tokens"] and sum(c["per_pos"]) == c["accepted"] and len(c["per_pos"]) == 3,
           f"accepted counters {c}")
    return {"greedy_identical": True, "prompts": NUM_PROMPTS, "max_tokens": MAX_TOKENS, "counters": c,
            "acceptance_length": res["acceptance_length"], "train_steps": TRAIN_STEPS,
            "train_first_loss": tr["first_loss"], "train_final_loss": tr["final_metrics"]["loss"],
            "engine_seconds": res["seconds"], "wall_s": {k: round(v, 1) for k, v in wall.items()},
            "total_s": round(time.monotonic() - t_all, 1)}


def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the machine type where that is not readable."""
    try:
        return next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=REPO / "benchmarks/kimi-trained-head/kimi-trained-head-cpu.json")
    args = ap.parse_args()
    pipe, serving = images_for_run()
    with tempfile.TemporaryDirectory(prefix="kimi-head-") as tmp:
        try:
            figures = run(Path(tmp) / "work", pipe, serving)
        except Failed as exc:
            print(f"FAILED: {exc}", file=sys.stderr)
            return 1
    out = {"what": "benchmarks/kimi-trained-head/kimi_trained_head.py: the tiny Kimi-K2.5-class target (random weights, a STAND-IN "
                   "for Kimi-K2.5) served by vLLM 0.16 CPU without and with a head trained by eagle3ops's stages",
           "machine": {"cpu": _cpu_model(), "cores": os.cpu_count()},
           "images": {"pipeline": pipe, "serving": serving}, **figures}
    write_result(args.json, out, indent=1)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
