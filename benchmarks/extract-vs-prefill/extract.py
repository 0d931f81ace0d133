"""P6: hidden-state extraction throughput vs a plain prefill of the same vLLM engine on the same inputs.

One run, one ratio (target >= 0.9):

- **prefill**: vLLM ``LLM.generate`` of every prompt with ``max_tokens=1`` (a prefill and one sampled token),
  same model, dtype, ``enforce_eager``, ``max_model_len``, scheduler limits (``max_num_seqs=32``,
  ``max_num_batched_tokens=max(8192, max_model_len)``: speculators' generator's values) and prefix caching off
  (as the patched generator runs);
- **extract**: speculators' ``VllmHiddenStatesGenerator`` (patched) on the same token ids, capturing 3 aux
  layers + the last, hidden states returned to the caller on the CPU (what stage extract then writes).

Both engines are started first, each warmed up once, then timed in alternating rounds over the same inputs
(so that load from other processes falls on both alike); engine start-up is not counted. Printed: tokens
(all rounds), seconds, tokens/s of each and ``ratio = extract tok/s / prefill tok/s``; with ``--json PATH``
the figures are also written there. Measured (2-core CPU, tiny Llama, vLLM 0.16 CPU):
``benchmarks/extract-vs-prefill/extract-cpu-tiny-llama.json``.

Usage (inside the pipeline image, or a venv with vLLM 0.16 and the patched speculators)::

    VLLM_CPU_KVCACHE_SPACE=2 python benchmarks/extract-vs-prefill/extract.py              # tiny Llama built on the fly
    python benchmarks/extract-vs-prefill/extract.py --model /data/models/x --repeat 4 --tp 8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import write_result  # noqa: E402


def prepared_inputs(model: str, max_seq_len: int, repeat: int) -> list[list[int]]:
    """Token ids of the built-in chat data rendered with the model's chat template (stage prepare's code)."""
    from eagle3ops.config.pipeline import PipelineConfig
    from eagle3ops.stages.prepare import read_samples, run_prepare

    run = Path(tempfile.mkdtemp(prefix="e3bench-"))
    cfg = PipelineConfig.model_validate({
        "target_model": model,
        "prepare": {"datasets": ["builtin:sharegpt", "builtin:messages"] * repeat, "max_seq_len": max_seq_len},
    })
    run_prepare(run, cfg, log=lambda *_: None)
    return [r["input_ids"] for r in read_samples(run)]


class Prefill:
    """Plain prefill: vLLM ``LLM.generate(max_tokens=1)`` with the generator's scheduler limits."""

    def __init__(self, model: str, max_model_len: int, tp: int) -> None:
        from vllm import LLM, SamplingParams

        self.llm = LLM(model=model, tokenizer=model, trust_remote_code=True, dtype="auto", enforce_eager=True,
                       max_model_len=max_model_len, max_num_seqs=32, max_num_batched_tokens=max(8192, max_model_len),
                       enable_prefix_caching=False, tensor_parallel_size=tp, gpu_memory_utilization=0.4,
                       # speculators' generator's block size: the same attention kernel on both sides, and on
                       # CPU one that works on AMX machines too (eagle3ops.cpuattn)
                       block_size=16)
        self.sp = SamplingParams(max_tokens=1, temperature=0.0)

    def run(self, inputs: list[list[int]]) -> float:
        from vllm.inputs import TokensPrompt

        t = time.perf_counter()
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in inputs], self.sp, use_tqdm=False)
        dt = time.perf_counter() - t
        assert len(outs) == len(inputs)
        return dt


class Extract:
    """speculators' VllmHiddenStatesGenerator (patched), called in batches as stage extract calls it."""

    def __init__(self, model: str, max_model_len: int, tp: int, batch: int) -> None:
        from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(model, trust_remote_code=True)
        cfg = getattr(cfg, "text_config", None) or cfg
        n = cfg.num_hidden_layers
        self.layers = [n - 4, n - 3, n - 2, n - 1] if n < 7 else [2, n // 2, n - 3, n - 1]
        self.batch = batch
        self.gen = VllmHiddenStatesGenerator(model_path=model, layer_ids=self.layers, max_model_len=max_model_len,
                                             gpu_memory_utilization=0.4, tensor_parallel_size=tp)

    def run(self, inputs: list[list[int]]) -> float:
        t = time.perf_counter()
        got = 0
        for i in range(0, len(inputs), self.batch):
            res = self.gen.generate(inputs[i : i + self.batch])
            got += sum(len(r["hidden_states"]) == len(self.layers) for r in res)
        dt = time.perf_counter() - t
        assert got == len(inputs), f"{got} of {len(inputs)} results have {len(self.layers)} layers"
        return dt


def main() -> int:
    p = argparse.ArgumentParser(description="Extraction throughput vs plain prefill (ratio; target >= 0.9).")
    p.add_argument("--model", help="Target model directory; default: a tiny Llama built into a temp dir.")
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=4, help="Copies of the built-in chat data (more tokens).")
    p.add_argument("--tp", type=int, default=1, help="Tensor parallel size.")
    p.add_argument("--batch", type=int, default=64, help="Sequences per generator call (stage extract's batch).")
    p.add_argument("--rounds", type=int, default=2, help="Alternating prefill/extract rounds over all inputs.")
    p.add_argument("--json", type=Path, help="Also write the figures here.")
    a = p.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    model = a.model
    if model is None:
        from eagle3ops.fixtures.tinymodel import build_tiny_model

        model = str(build_tiny_model(Path(tempfile.mkdtemp(prefix="e3tiny-")) / "llama", kind="llama"))
    inputs = prepared_inputs(model, a.max_seq_len, a.repeat)
    tokens = sum(map(len, inputs))
    mml = a.max_seq_len + 1
    prefill, extract = Prefill(model, mml, a.tp), Extract(model, mml, a.tp, a.batch)
    prefill.run(inputs[:8])  # warm-up of each engine
    extract.run(inputs[:8])
    # Rounds alternate the two, so that load from other processes on the machine falls on both alike.
    rounds = [(prefill.run(inputs), extract.run(inputs)) for _ in range(a.rounds)]
    prefill_s = sum(p for p, _ in rounds)
    extract_s = sum(e for _, e in rounds)
    tokens *= a.rounds
    fig = {
        "model": model,
        "sequences": len(inputs),
        "tokens": tokens,
        "prefill_s": round(prefill_s, 3),
        "prefill_tokens_per_s": round(tokens / prefill_s, 1),
        "extract_s": round(extract_s, 3),
        "extract_tokens_per_s": round(tokens / extract_s, 1),
        "ratio": round(prefill_s / extract_s, 3),
        "rounds": [round(p / e, 3) for p, e in rounds],
        "target": 0.9,
    }
    print(f"sequences {fig['sequences']}, tokens {tokens}")
    print(f"prefill : {fig['prefill_s']:8.3f} s  {fig['prefill_tokens_per_s']:10.1f} tok/s")
    print(f"extract : {fig['extract_s']:8.3f} s  {fig['extract_tokens_per_s']:10.1f} tok/s")
    print(f"ratio (extract tok/s / prefill tok/s) = {fig['ratio']:.3f}  (target >= 0.9); per round {fig['rounds']}")
    if a.json:
        write_result(a.json, fig, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
