"""Local containers of the trained-head serving run (benchmarks/kimi-trained-head/kimi_trained_head.py), as docker SDK specs
(``containers.run`` kwargs). Development harness: the tiny targets it builds come from :mod:`eagle3ops.fixtures.tinymodel`.

The check trains a head with eagle3ops's own stages in a pipeline image, then serves the target with and without
that head in a serving image and compares greedy outputs (:mod:`eagle3ops.patches.specprobes`). Both containers run
on the local build engine, on no network, as the calling user (so the bind-mounted work directory stays removable),
with this checkout's ``src`` mounted read-only at :data:`SRC_MOUNT` and first on ``PYTHONPATH``: the serving image
has no eagle3ops installed, and the pipeline image's installed copy is overridden by the code under test (this
package, ``eagle3ops_dev``, is found there too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eagle3ops.commands.quote import render

#: Where the checkout's ``src`` appears inside the check's containers (read-only, first on PYTHONPATH).
SRC_MOUNT = "/e3/src"
#: Where the host work directory appears (read-write): target, run directory, head, prompts, results.
WORK_MOUNT = "/e3/work"
#: The pipeline stages that produce a trained head, in order.
HEAD_STAGES = ("prepare", "extract", "vocab", "train")


def _spec(image: str, *, src: str, work: str, user: str, script: str, name: str | None = None) -> dict[str, Any]:
    return {
        "image": image,
        "name": name,
        "entrypoint": ["sh", "-c"],
        "command": [script],
        "environment": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": SRC_MOUNT, "HOME": "/tmp",
                        "VLLM_CPU_KVCACHE_SPACE": "1"},
        "volumes": [f"{src}:{SRC_MOUNT}:ro", f"{work}:{WORK_MOUNT}"],
        "network_mode": "none",
        "user": user,
        "working_dir": WORK_MOUNT,
        "labels": {"io.eagle3ops.role": "trained-head-test"},
    }


def train_head_spec(image: str, *, src: str, work: str, user: str, target: str, kind: str, run: str,
                    stages: Sequence[str] = HEAD_STAGES, name: str | None = None) -> dict[str, Any]:
    """Pipeline-image container that builds the tiny ``kind`` target at ``<work>/<target>`` (when it has no
    ``config.json`` yet) and runs ``stages`` on the run directory ``<work>/<run>`` (its ``pipeline.yaml`` written by
    the caller, naming the target by its path inside the container, ``/e3/work/<target>``).

    Args:
        image: the pipeline image (torch, vLLM, patched speculators).
        src: host path of this checkout's ``src`` directory; work: host work directory (bind-mounted read-write).
        user: ``uid:gid`` the container runs as.
        target, run: paths relative to ``work``.

    Returns:
        ``containers.run`` kwargs; the container exits non-zero at the first failing step (``set -e``).
    """
    tgt = f"{WORK_MOUNT}/{target}"
    steps = [f"test -f {render([tgt + '/config.json'])} || "
             + render(["python3", "-m", "eagle3ops.fixtures.tinymodel", tgt, "--kind", kind])]
    steps += [render(["python3", "-m", "eagle3ops", "stage", s, "--run-dir", f"{WORK_MOUNT}/{run}"]) for s in stages]
    return _spec(image, src=src, work=work, user=user, script="set -e; " + "; ".join(steps), name=name)


def greedy_pair_spec(image: str, *, src: str, work: str, user: str, kind: str, target: str, out: str,
                     draft: str | None = None, prompts: str | None = None, dtype: str = "float32",
                     max_tokens: int = 48, replies_for: str | None = None, name: str | None = None) -> dict[str, Any]:
    """Serving-image container that serves ``<work>/<target>`` greedily without and with the EAGLE-3 head
    ``<work>/<draft>`` (None: a random tinydraft head) and writes the pair as JSON to ``<work>/<out>``
    (``python -m eagle3ops.patches.specprobes``; prompts from ``<work>/<prompts>``, a JSON list of id lists).
    With ``replies_for`` (``<work>/<replies_for>``: a JSON list of user messages) it writes the target's own greedy
    replies instead (one engine, no head).

    Returns:
        ``containers.run`` kwargs (paths relative to ``work``; ``src``, ``user`` as in :func:`train_head_spec`).
    """
    argv = ["python3", "-m", "eagle3ops.patches.specprobes", "--kind", kind, "--dtype", dtype,
            "--target", f"{WORK_MOUNT}/{target}", "--workdir", f"{WORK_MOUNT}/tmp-{out}.d",
            "--out", f"{WORK_MOUNT}/{out}", "--max-tokens", str(max_tokens)]
    if draft is not None:
        argv += ["--draft", f"{WORK_MOUNT}/{draft}"]
    if prompts is not None:
        argv += ["--prompts", f"{WORK_MOUNT}/{prompts}"]
    if replies_for is not None:
        argv += ["--replies-for", f"{WORK_MOUNT}/{replies_for}"]
    return _spec(image, src=src, work=work, user=user, script=render(argv), name=name)
