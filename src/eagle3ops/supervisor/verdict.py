"""The speculation gate's verdict from measured figures (pure): :func:`decide_figures` and :func:`decide_measured`
on :func:`eagle3ops.supervisor.speculate.measure_serving` answers, the failed requests they hold
(:func:`failed_requests`) and the candidate to confirm among several (:func:`choose_candidate`). The speculate job
(:class:`eagle3ops.supervisor.speculate.SpeculateRun`) calls them on the host; the tests call them on their own."""

from __future__ import annotations

import math
from typing import Any

from eagle3ops.config.plan import ReleaseChange, SpeculateJob
from eagle3ops.gate.like import ReleaseIdentity, flag_names, unlike

__all__ = ["choose_candidate", "decide_figures", "decide_measured", "failed_requests"]


def decide_figures(job: SpeculateJob, baseline: dict[str, Any], speculative: dict[str, Any],
                   level: float | None = None, after: dict[str, Any] | None = None) -> Any:
    """The pure decision (:func:`eagle3ops.gate.decide.decide`) on two
    :func:`~eagle3ops.supervisor.speculate.measure_serving` answers (three with ``after``, the ``aba`` design's
    baseline measured again after the speculative release), its
    interval at ``level`` (default :data:`eagle3ops.gate.decide.LEVEL`); returns the
    :class:`~eagle3ops.gate.decide.Decision` with added figures: the per-level counter deltas
    (``spec_decode_per_level``), each side's TTFT p90 and failed requests per level (``levels[c][side]
    ["ttft_ms_p90"]``, pooled over the passes like the median beside it; ``["failures"]``), the TTFT p90 ratio at
    the production concurrency (``ttft_ratio_p90``), vLLM's prefix-cache queries, hits and hit rate per side and
    level (``prefix_cache``, :func:`eagle3ops.gate.measure.prefix_cache`), the endpoints the prompts went to
    (``traffic``) and how many greedy answers the two releases share per level (``answer_agreement``,
    :func:`eagle3ops.gate.answers.answer_agreement`; reported, not decided on)."""
    from eagle3ops.gate.answers import answer_agreement
    from eagle3ops.gate.decide import LEVEL, decide
    from eagle3ops.gate.measure import prefix_cache, read_measurement, sum_deltas
    from eagle3ops.gate.replay import percentile

    base, _ = read_measurement(baseline)
    spec, deltas = read_measurement(speculative)
    again = read_measurement(after)[0] if after else None
    decision = decide(base, spec, sum_deltas(list(deltas.values())), production_concurrency=job.levels[0],
                      margin=job.margin, acceptance_floor=job.acceptance_floor,
                      ttft_ratio_max=math.inf if job.ttft_ratio_max is None else job.ttft_ratio_max, rule=job.rule,
                      level=LEVEL if level is None else level, after=again, traffic=job.traffic)
    decision.figures["spec_decode_per_level"] = {str(c): d.figures() for c, d in deltas.items()}

    def p90(passes: list[Any]) -> float | None:
        v = percentile([float(t) for p in passes for t in p.prompt_ttft_ms if t is not None], 0.9)
        return round(v, 3) if v is not None else None

    levels = decision.figures.get("levels") or {}
    for c, row in levels.items():
        for side, res in (("baseline", base), ("speculative", spec)):
            if isinstance(row.get(side), dict) and int(c) in res:
                row[side]["ttft_ms_p90"] = p90(res[int(c)])
                row[side]["failures"] = [{"pass": j, "prompt": int(i), "error": str(why)}
                                         for j, p in enumerate(res[int(c)]) for i, why in p.failures]
    c0 = job.levels[0]
    bp, sp = (p90(res[c0]) if c0 in res else None for res in (
        ({c: [*ps, *again.get(c, [])] for c, ps in base.items()} if again else base), spec))
    decision.figures["ttft_ratio_p90"] = round(sp / bp, 4) if bp and sp is not None else None
    decision.figures["prefix_cache"] = {"baseline": prefix_cache(baseline), "speculative": prefix_cache(speculative),
                                        **({"baseline_after": prefix_cache(after)} if after else {})}
    decision.figures["traffic"] = speculative.get("traffic") or baseline.get("traffic")
    decision.figures["answer_agreement"] = answer_agreement(base, spec, again)
    return decision


def failed_requests(ans: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The failed requests of a :func:`~eagle3ops.supervisor.speculate.measure_serving` answer (pure), warm-up
    included, and how many requests it sent: ``([{"concurrency", "pass" (index, or "warm-up"), "prompt" (index in
    the gate's order), "error"}], n)``."""
    out: list[dict[str, Any]] = []
    sent = 0
    for c, fails in ((ans.get("warmup") or {}).get("failures") or {}).items():
        out += [{"concurrency": int(c), "pass": "warm-up", "prompt": int(i), "error": str(why)} for i, why in fails]
    if ans.get("warmup"):
        sent += int(ans["warmup"].get("prompts") or 0) * len(ans.get("levels") or {})
    for c, passes in (ans.get("levels") or {}).items():
        for j, fig in enumerate(passes):
            sent += int(fig.get("requests") or 0)
            out += [{"concurrency": int(c), "pass": j, "prompt": int(i), "error": str(why)}
                    for i, why in fig.get("failures") or []]
    return out, sent


def _failures_line(failed: list[dict[str, Any]]) -> str:
    from eagle3ops.gate.replay import summary

    by_level: dict[int, list[tuple[int, str]]] = {}
    for f in failed:
        by_level.setdefault(f["concurrency"], []).append((f["prompt"], f["error"]))
    return "; ".join(f"at concurrency {c}: {summary(fs)}" for c, fs in sorted(by_level.items()))


def decide_measured(job: SpeculateJob, baseline: dict[str, Any], speculative: dict[str, Any],
                    change: ReleaseChange | None = None, level: float | None = None,
                    after: dict[str, Any] | None = None) -> tuple[str, str, dict[str, Any]]:
    """``(verdict, reason, figures)`` from two measurements (pure): :func:`decide_figures` with one table per
    prompt set (``figures["sets"]``, :func:`eagle3ops.gate.decide.set_tables`, when the job names sets), except that releases
    which are not like for like (:func:`eagle3ops.gate.like.unlike` on the measurements' ``release`` identities,
    the speculative change's flags set aside) are ``undecided``, the verdict they would have had kept in
    ``figures["would_have_been"]``. The driver refuses unlike images before the job
    (:func:`eagle3ops.speculate.ship.check_like_for_like`); this is the host's own check of what it measured. A
    gated release (``rule: not_slower``) is not checked: its change (another image, a vLLM upgrade, NCCL settings)
    is what is measured; both identities stay in the result. ``change``: the measured release's change (a
    candidate's; default the job's); ``level``: the interval's (a candidate's corrected level); ``after``: the
    ``aba`` design's baseline measured again after the speculative release (:func:`decide_figures`; its failed
    requests are listed with the baseline's).

    A request that failed on the speculative release (:func:`failed_requests`: a non-2xx answer, a stream error, a
    stream cut short, a grammar failure) makes it ``rollback`` whatever else was measured, the reason naming the
    failures and ``figures["failed_requests"]`` listing both sides'; the verdict it would have had is kept in
    ``figures["would_have_been"]``. A time to first token above ``ttft_ratio_max`` is named in the reason whichever
    rule decided (an earlier rule, e.g. the acceptance floor, may have decided before the TTFT rule), with the p90
    ratio beside the median's, and recorded as ``figures["ttft_breach"]``.

    Raises:
        ValueError: from :func:`eagle3ops.gate.decide.decide` (a level or passes missing).
    """
    why = None if job.rule == "not_slower" else unlike(
        ReleaseIdentity.from_dict(baseline.get("release")), ReleaseIdentity.from_dict(speculative.get("release")),
        change_flags=flag_names((change or job.change).args))
    decision = decide_figures(job, baseline, speculative, level, after)
    verdict, reason, figures = decision.verdict, decision.reason, dict(decision.figures)
    if job.prompt_sets:
        from eagle3ops.gate.decide import set_tables
        from eagle3ops.gate.measure import read_measurement

        figures["sets"] = set_tables(read_measurement(baseline)[0], read_measurement(speculative)[0],
                                     job.prompt_sets, production_concurrency=job.levels[0],
                                     after=read_measurement(after)[0] if after else None)
    if why:
        figures["would_have_been"] = {"verdict": verdict, "reason": reason}
        verdict, reason = "undecided", (f"unlike releases measured ({why}): the ratio mixes the image's own speed "
                                        "with speculation's; speculate again with --control")
    failed, sent = failed_requests(speculative)
    if failed:  # a release that fails requests is not shipped, however fast the others went
        base_failed = failed_requests(baseline)[0] + (failed_requests(after)[0] if after else [])
        figures["failed_requests"] = {"speculative": failed, "baseline": base_failed}
        figures.setdefault("would_have_been", {"verdict": verdict, "reason": reason})
        verdict = "rollback"
        reason = (f"{len(failed)} of {sent} requests failed on the speculative release ({_failures_line(failed)}); "
                  + ("the baseline served every one" if not base_failed else
                     f"the baseline failed {len(base_failed)} ({_failures_line(base_failed)})"))
    ratio, most = figures.get("ttft_ratio"), job.ttft_ratio_max
    if ratio is not None and most is not None and ratio > most:
        p90 = figures.get("ttft_ratio_p90")
        tail = f" (p90 x{p90:.3f})" if p90 is not None else ""
        figures["ttft_breach"] = {"ttft_ratio": ratio, "ttft_ratio_p90": p90, "ttft_ratio_max": most,
                                  "concurrency": job.levels[0]}
        if "time to first token" in reason:
            reason += tail.replace("(p90", "(time to first token p90")
        else:
            reason += (f"; also: median time to first token x{ratio:.3f} of the baseline's{tail} at concurrency "
                       f"{job.levels[0]}, above x{most:g} (serving.gate_ttft_ratio_max)")
    return verdict, reason, figures


def choose_candidate(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The candidate to confirm (pure): among ``rows`` (one per candidate: ``verdict``, ``interval`` at the
    corrected level, ``throughput_ratio``) those whose verdict is ``keep``, the one with the highest lower bound (then
    the highest point ratio, then the first); None when none is ``keep``."""
    kept = [r for r in rows if r.get("verdict") == "keep" and r.get("interval")]
    if not kept:
        return None
    return max(kept, key=lambda r: (r["interval"]["low"], r.get("throughput_ratio") or 0.0, -rows.index(r)))
