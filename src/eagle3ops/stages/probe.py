"""``eagle3ops stage probe --run-dir DIR``: hidden-state correctness probe of the run's target, before extraction.

Runs the extract stage's engine (speculators' patched ``VllmHiddenStatesGenerator``, built by
:func:`eagle3ops.stages.extract.make_vllm_generator` with the run's layers, max_model_len and tensor parallel
size) on a small batch and compares every captured token with the extract stage's reference engine
(:class:`eagle3ops.stages.extract.TransformersEngine`: transformers forward, hooks on the same decoder layers,
in the dtype vLLM returned). The batch is built to hit the faults of upstream speculators #279's class
(states attributed to the wrong sequence or position):

- more sequences in one ``generate()`` call than speculators' scheduler admits at once (``MAX_NUM_SEQS`` = 32);
- a small per-step token budget (``max_num_batched_tokens``, default 256), with sequences longer than it, so
  prompts are prefilled in chunks spread over scheduler steps;
- two ``generate()`` calls in a row on the same engine (the second repeats a sequence of the first).

Sequences: pieces of the prepared samples' token ids (``prepare/samples.jsonl``, real chat text) when the
prepare stage has run, else seeded random ids from the middle of the target vocabulary.

Error per token: relative L2 error ``|h - ref| / |ref|`` over the hidden size, as in
:func:`eagle3ops.patches.probekit.hidden_state_errors`. Tolerance (stated per token quantile, FACTS.md: MoE
routing flips near-tied experts under bf16): the dense tolerance (median <= 0.02, p99 <= 0.06, at most 1 % of
tokens above 0.05, every sequence's median <= 0.05) for dense targets,
:data:`eagle3ops.patches.probekit.MOE_TOLERANCE` for MoE targets. Measured on the tiny Llama (bf16 vLLM vs bf16
transformers): median 0.0064, p99 0.0085, max 0.0102. A misattributed token has an error near 1.

Output: ``<run_dir>/probe/report.json`` (statistics, tolerance, pass/fail). Not a stage input: the pipeline
stages ignore it. The reference forward needs the target on one device (``cuda`` when visible, else CPU).
"""

from __future__ import annotations

import gc
import json
import random
import time
from pathlib import Path
from typing import Any

from eagle3ops.config.pipeline import PipelineConfig
from eagle3ops.stages.manifest import atomic_write_text, stage_dir

#: speculators 0.3.0's ``MAX_NUM_SEQS`` (vllm_hidden_states_generator.py): sequences the scheduler runs at once.
SCHEDULER_MAX_SEQS = 32
PROBE_DIR = "probe"
REPORT = "report.json"


def _tolerances() -> tuple[Any, Any]:
    from eagle3ops.patches.probekit import MOE_TOLERANCE, Tolerance

    # bf16 vLLM against a bf16 reference. Tiny Llama measured (48 sequences, 31.8k tokens, vLLM 0.16 CPU):
    # median 0.0064, p99 0.0085, max 0.0102, 0.003 % of tokens above 0.01, worst sequence median 0.0078 --
    # the same as against fp32 (patches.probekit.DENSE_TOLERANCE), whose limits are kept, with room for deeper
    # targets; a misattributed token is near 1, so at most 1 % of tokens may exceed 0.05.
    dense = Tolerance(median=0.02, q99=0.06, frac_above=((0.05, 0.01),), seq_median=0.05)
    return dense, MOE_TOLERANCE


def is_moe(text_config: Any) -> bool:
    """Whether the target routes tokens over experts (DeepSeek/Kimi ``n_routed_experts``, Mixtral/Qwen MoE)."""
    return any(int(getattr(text_config, k, 0) or 0) > 0 for k in ("n_routed_experts", "num_local_experts",
                                                                  "num_experts"))


def probe_sequences(run_dir: Path, vocab_size: int, n: int, lo: int, hi: int, seed: int) -> tuple[list[list[int]], str]:
    """``n`` token sequences with lengths in ``[lo, hi]`` (the first one ``hi`` long), and where the ids came from.

    Ids: consecutive pieces of the prepared samples' ids (cycled) when ``prepare/samples.jsonl`` exists, else
    seeded random ids in ``[vocab_size // 16, vocab_size // 2)`` (away from the special tokens at either end).
    """
    rng = random.Random(seed)
    lengths = [hi] + [rng.randint(lo, hi) for _ in range(n - 1)]
    samples = stage_dir(run_dir, "prepare") / "samples.jsonl"
    stream: list[int] = []
    if samples.is_file():
        with open(samples, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    stream.extend(json.loads(line)["input_ids"])
                if len(stream) >= sum(lengths):
                    break
    if stream:
        out, pos = [], 0
        for length in lengths:
            out.append([stream[(pos + k) % len(stream)] for k in range(length)])
            pos += length
        return out, "prepare/samples.jsonl"
    a, b = max(1, vocab_size // 16), max(2, vocab_size // 2)
    return [[rng.randrange(a, b) for _ in range(length)] for length in lengths], "random ids"


def _plan(run_dir: Path, config: PipelineConfig, log: Any, num_seqs: int, max_num_batched_tokens: int,
          seed: int) -> dict[str, Any]:
    """What the probe sends (:func:`run_probe`'s doc): ``layer_ids`` (the aux layers and the last), ``hidden``,
    ``text`` (the target's text config), ``budget`` (the step's token budget), ``calls`` (the two calls' token id
    lists), ``source`` (where the token ids come from); the plan logged.

    Raises:
        ValueError: ``num_seqs`` <= 40 or ``max_num_batched_tokens`` < 32.
    """
    from eagle3ops.stages.extract import resolve_layer_ids
    from eagle3ops.stages.vocab import target_text_config

    if num_seqs <= SCHEDULER_MAX_SEQS + 8:
        raise ValueError(f"--num-seqs {num_seqs}: must be above {SCHEDULER_MAX_SEQS + 8} so the first call holds "
                         f"more than the scheduler's {SCHEDULER_MAX_SEQS} sequences")
    if max_num_batched_tokens < SCHEDULER_MAX_SEQS:
        raise ValueError(f"--max-num-batched-tokens {max_num_batched_tokens}: vLLM needs at least "
                         f"{SCHEDULER_MAX_SEQS} (max_num_seqs)")
    text = target_text_config(config.target_model)
    aux, n_layers, hidden = resolve_layer_ids(config)
    layer_ids = [*aux, n_layers - 1]
    mml = config.effective_max_model_len()
    budget = max(SCHEDULER_MAX_SEQS, min(max_num_batched_tokens, (mml - 1) // 2))
    hi = min(2 * budget, mml - 1)
    seqs, source = probe_sequences(run_dir, int(text.vocab_size), num_seqs, max(8, budget // 2), hi, seed)
    calls = [seqs[: num_seqs - 8], seqs[num_seqs - 8 :] + [seqs[0]]]
    log(f"probe: {config.target_model}: layers {layer_ids}, {num_seqs} sequences of {min(map(len, seqs))}.."
        f"{hi} tokens ({source}) in calls of {len(calls[0])} and {len(calls[1])}; step budget {budget} tokens")
    return {"layer_ids": layer_ids, "hidden": hidden, "text": text, "budget": budget, "calls": calls,
            "source": source}


def _capture(config: PipelineConfig, plan: dict[str, Any], log: Any) -> tuple[list[dict[str, Any]], float]:
    """(results, seconds): vLLM's capture of the plan's two calls through the extract stage's generator, each
    result checked to carry its own sequence; the engine shut down after (the reference model needs the devices).

    Raises:
        ProbeFailed: a call returned another count of results, or a result carries another sequence's ids.
    """
    from eagle3ops.patches.probekit import ProbeFailed
    from eagle3ops.stages.extract import make_vllm_generator

    gen = make_vllm_generator(config, plan["layer_ids"], max_num_batched_tokens=plan["budget"])
    t_gen = time.monotonic()
    results = []
    for k, batch in enumerate(plan["calls"]):
        res = gen.generate(batch)
        if len(res) != len(batch):
            raise ProbeFailed(f"generate() call {k + 1} returned {len(res)} results for {len(batch)} sequences")
        for i, (r, ids) in enumerate(zip(res, batch, strict=True)):
            if r["input_ids"].tolist() != ids:
                raise ProbeFailed(f"generate() call {k + 1}: result {i} carries another sequence's token ids")
        results.extend(res)
    gen_s = time.monotonic() - t_gen
    try:
        gen.executor.shutdown()  # free the devices before the reference model loads
    except Exception as exc:  # noqa: BLE001 - a failed shutdown must not hide the probe's result
        log(f"probe: vLLM executor shutdown: {type(exc).__name__}: {exc}")
    del gen
    gc.collect()
    return results, gen_s


def _report(config: PipelineConfig, plan: dict[str, Any], results: list[dict[str, Any]], refs: list[Any],
            ref_device: str, num_seqs: int, times: dict[str, float]) -> tuple[dict[str, Any], Any]:
    """(report, problem): vLLM's hidden states against the reference's (per token relative L2, overall and per
    layer) and the tolerance of the target's kind (dense or MoE); ``problem`` is the ProbeFailed of the limits
    crossed, None when within."""
    from eagle3ops.patches.probekit import ProbeFailed, hidden_state_errors

    layer_ids, budget, flat = plan["layer_ids"], plan["budget"], [s for batch in plan["calls"] for s in batch]
    stats = hidden_state_errors(results, refs)
    moe = is_moe(plan["text"])
    dense_tol, moe_tol = _tolerances()
    tol = moe_tol if moe else dense_tol
    per_layer = [hidden_state_errors([{"hidden_states": [r["hidden_states"][j]]} for r in results],
                                     [[ref[j]] for ref in refs]).median for j in range(len(layer_ids))]
    report: dict[str, Any] = {
        "target_model": config.target_model,
        "layer_ids": layer_ids,
        "hidden_size": plan["hidden"],
        "dtype": str(results[0]["hidden_states"][0].dtype).removeprefix("torch."),
        "reference": f"transformers eager forward on {ref_device}, same layers and dtype",
        "sequences": num_seqs,
        "calls": [len(c) for c in plan["calls"]],
        "tokens": stats.n_tokens,
        "token_source": plan["source"],
        "max_num_batched_tokens": budget,
        "chunked_sequences": sum(len(s) > budget for s in flat),
        "error": "per token relative L2 |h - ref| / |ref|",
        "median": stats.median,
        "p99": stats.q99,
        "max": stats.max,
        "frac_above_0.01": stats.frac_above_001,
        "frac_above_0.05": stats.frac_above_005,
        "worst_sequence_median": stats.worst_seq_median,
        "per_layer_median": dict(zip(map(str, layer_ids), per_layer, strict=True)),
        "tolerance_kind": "moe" if moe else "dense",
        "tolerance": {"median": tol.median, "p99": tol.q99, "max": tol.max, "seq_median": tol.seq_median,
                      "frac_above": [list(x) for x in tol.frac_above]},
        "vllm_generate_s": round(times["gen_s"], 3),
        "reference_s": round(times["ref_s"], 3),
    }
    problem = None
    try:
        stats.check(tol, f"{config.target_model} ({'MoE' if moe else 'dense'} tolerance)")
    except ProbeFailed as exc:
        problem = exc
    report["passed"] = problem is None
    return report, problem


def run_probe(
    run_dir: Path,
    config: PipelineConfig,
    log: Any = print,
    num_seqs: int = 48,
    max_num_batched_tokens: int = 256,
    seed: int = 0,
) -> dict[str, Any]:
    """Run the probe; writes ``<run_dir>/probe/report.json`` and returns the report.

    ``num_seqs`` sequences go to the engine in two calls: ``num_seqs - 8`` (must exceed 32, the scheduler's
    sequence limit), then 8 (7 new ones and a repeat of the first). Sequence lengths lie in
    ``[budget // 2, min(2 * budget, max_model_len - 1)]`` with ``budget = max_num_batched_tokens``, lowered to
    ``(max_model_len - 1) // 2`` when needed so that some prompts are always chunked. The steps: the plan, vLLM's
    capture, the reference forward (transformers, eager, the same layers and dtype), the comparison, the report.

    Raises:
        eagle3ops.patches.probekit.ProbeFailed: the engine returned wrong ids, counts or shapes, or the errors
            exceed the tolerance (the message lists each limit crossed; the report is written first).
        ValueError: ``num_seqs`` <= 40 or ``max_num_batched_tokens`` < 32.
    """
    from eagle3ops.stages.extract import TransformersEngine

    t0 = time.monotonic()
    plan = _plan(run_dir, config, log, num_seqs, max_num_batched_tokens, seed)
    results, gen_s = _capture(config, plan, log)
    t_ref = time.monotonic()
    ref_engine = TransformersEngine(config.target_model, plan["layer_ids"],
                                    dtype=results[0]["hidden_states"][0].dtype)
    refs = [[h.float() for h in r["hidden_states"]]
            for r in ref_engine.generate([s for batch in plan["calls"] for s in batch])]
    ref_s = time.monotonic() - t_ref
    report, problem = _report(config, plan, results, refs, str(ref_engine.device), num_seqs,
                              {"gen_s": gen_s, "ref_s": ref_s})
    report["wall_s"] = round(time.monotonic() - t0, 3)
    out = stage_dir(run_dir, PROBE_DIR)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / REPORT, json.dumps(report, indent=2) + "\n")
    limits = ", ".join(f"{k} <= {v}" for k, v in report["tolerance"].items() if v not in (None, []))
    log(f"probe: {report['tokens']} tokens: median {report['median']:.4g}, p99 {report['p99']:.4g}, max "
        f"{report['max']:.4g}, {report['frac_above_0.01']:.2%} above 0.01 ({report['tolerance_kind']} tolerance: "
        f"{limits}); {'PASS' if problem is None else 'FAIL'}; report {out / REPORT}")
    if problem is not None:
        raise problem
    return report
