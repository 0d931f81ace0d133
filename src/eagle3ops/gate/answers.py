"""Whether two releases answer the gate's prompts alike (pure): the share of greedy answers that are identical.

The replay decodes greedily (temperature 0, a fixed ``max_tokens``; :mod:`eagle3ops.gate.replay`) and keeps each
answer's digest, so a release whose answers changed shows here though its speed looks fine: speculative decoding
with a correct draft head verifies every draft token against the target's own greedy choice, so its answers are the
target's (lossless speculative sampling: Y. Leviathan, M. Kalman & Y. Matias (2023), "Fast inference from
transformers via speculative decoding", ICML 2023; vLLM's rejection sampler at temperature 0 keeps a draft
token only where it equals the target's argmax). What still moves a greedy answer between two releases is
numerics: a different batch shape or kernel (vLLM is not batch-invariant by default) can flip a near-tie and the
answer goes on differently from there; a tokenizer mismatch or a broken release changes nearly every answer. The
figures are reported, never decided on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from eagle3ops.gate.replay import LevelResult

__all__ = ["MOST_DIFFERING", "answer_agreement", "level_agreement"]

#: How many differing prompts a level names (the first ones, in the prompts' order).
MOST_DIFFERING = 5


def level_agreement(baseline: LevelResult, speculative: LevelResult) -> dict[str, object]:
    """Compare one pass of each side, prompt by prompt (both passes sent the same prompts in the same order).

    Returns:
        ``{"prompts": n compared, "identical": k, "share": k / n (4 decimals; None when n is 0), "differing":
        [first <= MOST_DIFFERING prompt indices whose answers differ], "examples": [{"prompt", "baseline",
        "speculative"}: each differing prompt's first characters on both sides], "not_compared": m}``; a prompt
        is compared where both sides answered it (``m``: failed on a side). ``{"not_recorded": why}`` when a pass
        holds no answer digests (figures recorded before answers were kept) or the passes' prompt counts differ.
    """
    b, s = list(baseline.answer_sha256), list(speculative.answer_sha256)
    if not b or not s:
        return {"not_recorded": "no answer digests in the " + ("baseline's" if not b else "speculative release's")
                + " figures (measured before answers were recorded)"}
    if len(b) != len(s):
        return {"not_recorded": f"the sides sent {len(b)} and {len(s)} prompts: not the same prompt set"}
    both = [i for i, (x, y) in enumerate(zip(b, s, strict=True)) if x is not None and y is not None]
    differ = [i for i in both if b[i] != s[i]]
    bh, sh = list(baseline.answer_head), list(speculative.answer_head)

    def head(heads: list[str | None], i: int) -> str | None:
        return heads[i] if i < len(heads) else None

    n, k = len(both), len(both) - len(differ)
    return {"prompts": n, "identical": k, "share": round(k / n, 4) if n else None,
            "differing": differ[:MOST_DIFFERING],
            "examples": [{"prompt": i, "baseline": head(bh, i), "speculative": head(sh, i)}
                         for i in differ[:MOST_DIFFERING]],
            "not_compared": len(b) - n}


def answer_agreement(baseline: Mapping[int, Sequence[LevelResult]],
                     speculative: Mapping[int, Sequence[LevelResult]],
                     after: Mapping[int, Sequence[LevelResult]] | None = None) -> dict[str, dict[str, object]]:
    """Per concurrency measured on both sides: :func:`level_agreement` of each side's first pass.

    One pass per side is enough: greedy decoding answers a prompt the same way in every pass of a release (the
    same weights, kernels and prompts), so further passes repeat the comparison rather than add to it; what can
    still move between passes (above concurrency 1 the batch a prompt shares depends on timing) is what
    ``baseline_self`` shows. The baseline compared with itself (its first pass against the ``aba`` design's block after
    the speculative release, else against its own second pass) is recorded as ``baseline_self`` beside it: how
    many answers the baseline's own numerics move, the level a speculative release's figure is read against.

    Args:
        baseline, speculative: concurrency -> that level's passes in the order they ran
            (:class:`~eagle3ops.gate.replay.LevelResult`, ``answer_sha256`` per prompt).
        after: the ``aba`` design's second baseline block, per concurrency (None: ``ab``).

    Returns:
        ``{"c": {**level_agreement(baseline pass 0, speculative pass 0), "baseline_self": level_agreement(...) or
        None}}`` for each concurrency in both (string keys, as in the result JSON); a level with no pass on a side
        is left out.
    """
    out: dict[str, dict[str, object]] = {}
    for c in sorted(set(baseline) & set(speculative)):
        b, s = baseline[c], speculative[c]
        if not b or not s:
            continue
        again = [*(after or {}).get(c, ()), *b[1:]]
        out[str(c)] = {**level_agreement(b[0], s[0]),
                       "baseline_self": level_agreement(b[0], again[0]) if again else None}
    return out
