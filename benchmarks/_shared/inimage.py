"""What the benchmarks that measure inside a container of the pipeline image share: the container run with its output
streamed, the first conversations of a data file, and the step count of whole epochs as the train stage packs them."""

from __future__ import annotations

import gzip
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
#: Offline, unbuffered stages in every measuring container.
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def run_container(image: str, argv: list[str], volumes: dict[str, dict[str, str]], *, src: bool = False,
                  tmpfs: dict[str, str] | None = None) -> int:
    """Run ``argv`` (the entrypoint) in a container of ``image`` without network, stream its output to stdout, remove
    it; returns its exit status. ``src``: this checkout's ``src`` mounted at ``/e3/src`` and first on ``PYTHONPATH``
    (the code measured is the checkout's, whatever the image was built from). ``tmpfs``: docker's ``--tmpfs``."""
    import docker

    env = dict(ENV)
    if src:
        volumes = {**volumes, str(REPO / "src"): {"bind": "/e3/src", "mode": "ro"}}
        env |= {"PYTHONPATH": "/e3/src", "PYTHONDONTWRITEBYTECODE": "1"}
    c = docker.from_env().containers.run(image, entrypoint=argv, volumes=volumes, network_mode="none", detach=True,
                                         environment=env, **({"tmpfs": tmpfs} if tmpfs else {}))
    try:
        for chunk in c.logs(stream=True, follow=True):
            sys.stdout.write(chunk.decode(errors="replace"))
        return int(c.wait(timeout=60)["StatusCode"])
    finally:
        c.remove(force=True)


def first_conversations(src: Path, dst: Path, n: int) -> int:
    """The first ``n`` non-empty lines of ``src`` (``.jsonl`` or ``.jsonl.gz``) written to ``dst``; returns how many."""
    opener: Any = gzip.open if src.suffix == ".gz" else open
    k = 0
    with opener(src, "rt", encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as out:
        for line in f:
            if line.strip() and k < n:
                out.write(line)
                k += 1
    return k


def epoch_steps(run: Path, epochs: int, chunks: list[tuple[int, int]] | None = None) -> int:
    """Steps of ``epochs`` whole epochs of run ``run`` as stage train packs them with one process
    (:func:`eagle3ops.stages.trainplan.epoch_plan`, or chunk by chunk for a chunked run), held-out samples left out.
    Inside the pipeline image (needs the run's prepare/ and pipeline.yaml)."""
    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages import trainplan
    from eagle3ops.stages.prepare import read_samples

    c = load_pipeline_config(run)
    samples = read_samples(run)
    tokens = [len(s["input_ids"]) for s in samples]
    held = trainplan.held_out_of(samples, c.train.held_out_fraction, c.seed)
    lay = trainplan.layout([], len(tokens), 1)
    units = trainplan.unit_samples(lay, [(i, t - 1) for i, t in enumerate(tokens) if i not in held])
    if chunks:
        return sum(len(trainplan.chunked_epoch_plan(lay, units, c.train.batch_max_tokens, c.seed, e, chunks))
                   for e in range(epochs))
    return sum(len(trainplan.epoch_plan(lay, units, c.train.batch_max_tokens, c.seed, e)) for e in range(epochs))
