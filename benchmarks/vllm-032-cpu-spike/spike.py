#!/usr/bin/env python3
"""vLLM 0.32 CPU spike: serve SmolLM2-135M-Instruct from the local 0.32.0 CPU base, without and with an EAGLE-3 head
trained under the 0.16 profile, and record greedy outputs, output tokens/s and spec-decode counters.

Usage (repo root; the image from images/localbase-0.32.0/Dockerfile, the target and head as local directories):

    python3 benchmarks/vllm-032-cpu-spike/spike.py serve --image eagle3ops/vllm-openai-local:v0.32.0 \
        --target DIR --tag baseline [--head DIR] [--extra-json '{...}'] --out benchmarks/vllm-032-cpu-spike/serve.json

Each run appends one entry (keyed by --tag) to the JSON file: the exact docker argv, seconds to ready, every
prompt's greedy completion (text and token count), output tokens/s of one 128-token greedy request repeated
--speed-runs times, and the spec-decode counters from /metrics (mean acceptance length = 1 + accepted / drafts).
The container is removed afterwards; its log tail goes into the entry when the start fails.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import write_result  # noqa: E402

PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give three tips for writing clear documentation.",
]
CONTAINER = "e3-spike-vllm032"


def http(url: str, body: dict | None = None, timeout: float = 600) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def spec_counters(base: str) -> dict[str, float]:
    _, text = http(f"{base}/metrics")
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:spec_decode_") and not line.startswith("#") and "_created" not in line:
            name, value = line.rsplit(" ", 1)
            labels = name[name.find("{"):] if "{" in name else ""
            pos = [x for x in labels.strip("{}").split(",") if x.startswith("position=")]
            key = name.split("{", 1)[0] + (f"[{pos[0].split('=', 1)[1].strip(chr(34))}]" if pos else "")
            out[key] = out.get(key, 0.0) + float(value)
    return out


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def serve(a: argparse.Namespace) -> int:
    port = a.port
    base = f"http://127.0.0.1:{port}"
    argv = ["docker", "run", "-d", "--name", CONTAINER, "--network", "host", "--shm-size", "1g",
            "-e", "VLLM_CPU_KVCACHE_SPACE=1", "-e", "OMP_NUM_THREADS=2",
            "-v", f"{Path(a.target).resolve()}:/models/target:ro"]
    if a.head:
        argv += ["-v", f"{Path(a.head).resolve()}:/models/head:ro"]
    for m in a.mount:
        argv += ["-v", m]
    argv += [a.image, "/models/target", "--served-model-name", "target", "--host", "127.0.0.1", "--port", str(port),
             "--enforce-eager", "--max-model-len", "2048", "--dtype", "bfloat16", "--block-size", str(a.block_size)]
    if a.head:
        cfg = {"method": "eagle3", "model": "/models/head", "num_speculative_tokens": a.k}
        cfg.update(json.loads(a.extra_json or "{}"))
        argv += ["--speculative-config", json.dumps(cfg, sort_keys=True)]
    argv += a.arg
    subprocess.run(["docker", "rm", "-f", CONTAINER], capture_output=True)
    entry: dict = {"argv": argv, "image": a.image, "machine": {"cpu": cpu_model(), "cores": len(
        [1 for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("processor")])}}
    t0 = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True)
    try:
        ready = False
        while time.monotonic() - t0 < a.timeout:
            st = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", CONTAINER], capture_output=True,
                                text=True).stdout.strip()
            if st != "true":
                break
            try:
                if http(f"{base}/health", timeout=5)[0] == 200:
                    ready = True
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(2)
        entry["ready"] = ready
        entry["ready_s"] = round(time.monotonic() - t0, 1)
        if not ready:
            log = subprocess.run(["docker", "logs", CONTAINER], capture_output=True, text=True)
            lines = (log.stdout + log.stderr).splitlines()
            if a.log:
                Path(a.log).write_text("\n".join(lines) + "\n")
            entry["errors"] = [x for x in lines if "Error" in x or "error" in x][:40]
            entry["log_tail"] = lines[-15:]
            return finish(a, entry, 1)
        entry["version"] = json.loads(http(f"{base}/version")[1])
        before = spec_counters(base)
        outs = []
        for p in PROMPTS:
            c0 = spec_counters(base)
            req = {"model": "target", "messages": [{"role": "user", "content": p}], "temperature": 0.0,
                   "max_tokens": a.max_tokens}
            if a.logprobs:
                req.update(logprobs=True, top_logprobs=2)
            code, body = http(f"{base}/v1/chat/completions", req)
            if code != 200:
                outs.append({"prompt": p, "error": body[:2000]})
                continue
            r = json.loads(body)
            outs.append({"prompt": p, "text": r["choices"][0]["message"]["content"],
                         "completion_tokens": r["usage"]["completion_tokens"]})
            if a.logprobs:
                # per generated token: the chosen token and the gap to the runner-up (a near-tie is where bf16
                # kernels that differ in summation order may pick differently)
                outs[-1]["top2"] = [
                    {"token": t["token"], "gap": round(t["top_logprobs"][0]["logprob"] - t["top_logprobs"][1]["logprob"], 5)
                     if len(t.get("top_logprobs") or []) > 1 else None}
                    for t in r["choices"][0]["logprobs"]["content"]]
            c1 = spec_counters(base)
            d = {k: c1[k] - c0.get(k, 0.0) for k in c1}
            if d.get("vllm:spec_decode_num_drafts_total"):
                outs[-1]["spec_decode_delta"] = d
            if r.get("kv_transfer_params"):
                outs[-1]["kv_transfer_params"] = r["kv_transfer_params"]
        entry["greedy"] = outs
        speeds, speed_texts = [], []
        for _ in range(a.speed_runs):
            t1 = time.monotonic()
            code, body = http(f"{base}/v1/completions", {
                "model": "target", "prompt": "Once upon a time", "temperature": 0.0, "max_tokens": 128,
                "ignore_eos": True})
            dt = time.monotonic() - t1
            if code == 200:
                speeds.append(round(json.loads(body)["usage"]["completion_tokens"] / dt, 2))
                speed_texts.append(json.loads(body)["choices"][0]["text"])
            else:
                entry["speed_error"] = body[:2000]
                break
        entry["output_tokens_per_s"] = speeds
        entry["speed_run_texts_identical"] = len(set(speed_texts)) <= 1
        entry["speed_run_text"] = speed_texts[0] if speed_texts else None
        # the 2 cores are shared with other work: the 1-minute load average right after the speed runs
        entry["load_average_1m_after_speed_runs"] = round(__import__("os").getloadavg()[0], 2)
        after = spec_counters(base)
        delta = {k: after[k] - before.get(k, 0.0) for k in after}
        entry["spec_decode_delta"] = delta
        drafts = delta.get("vllm:spec_decode_num_drafts_total", 0.0)
        if drafts:
            entry["mean_acceptance_length"] = round(
                1 + delta.get("vllm:spec_decode_num_accepted_tokens_total", 0.0) / drafts, 4)
        if a.sampled:
            # last: on vLLM 0.16 CPU with speculation a sampled request kills the engine (Triton rejection sampler)
            code, body = http(f"{base}/v1/completions", {
                "model": "target", "prompt": "Once upon a time", "temperature": 0.8, "seed": 0, "max_tokens": 32})
            entry["sampled_request"] = {"status": code, "body": body[:600]}
            time.sleep(3)
            entry["sampled_then_health"] = http(f"{base}/health", timeout=10)[0] if ready else None
        log = subprocess.run(["docker", "logs", "--tail", "400", CONTAINER], capture_output=True, text=True)
        entry["log_warnings"] = [x for x in (log.stdout + log.stderr).splitlines()
                                 if "WARNING" in x or "ERROR" in x][-30:]
        return finish(a, entry, 0)
    finally:
        subprocess.run(["docker", "rm", "-f", CONTAINER], capture_output=True)


def finish(a: argparse.Namespace, entry: dict, rc: int) -> int:
    out = Path(a.out)
    data = json.loads(out.read_text()) if out.exists() else {}
    entry["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    data[a.tag] = entry
    write_result(out, data, indent=1)
    print(json.dumps(entry, indent=1)[:6000])
    return rc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--image", required=True)
    s.add_argument("--target", required=True)
    s.add_argument("--head")
    s.add_argument("--k", type=int, default=3)
    s.add_argument("--extra-json", help="more --speculative-config keys (JSON object)")
    s.add_argument("--mount", action="append", default=[], help="one more docker -v SRC:DST[:ro] (repeatable)")
    s.add_argument("--arg", action="append", default=[], help="one more server argument (repeatable)")
    s.add_argument("--tag", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--port", type=int, default=18650)
    s.add_argument("--block-size", type=int, default=32)
    s.add_argument("--max-tokens", type=int, default=64)
    s.add_argument("--speed-runs", type=int, default=3)
    s.add_argument("--timeout", type=float, default=600)
    s.add_argument("--logprobs", action="store_true", help="record each greedy token's top-2 logprob gap")
    s.add_argument("--sampled", action="store_true", help="end with one temperature-0.8 request")
    s.add_argument("--log", help="write the container's whole log here when it does not start")
    a = p.parse_args()
    return serve(a)


if __name__ == "__main__":
    raise SystemExit(main())
