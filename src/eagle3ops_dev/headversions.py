"""The same draft head served under two vLLM versions, judged (pure): the serving image a run of
``benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py --speculative-image`` used (its vLLM from its labels), and
``--compare-with``'s entry: acceptance under each version within :data:`ACCEPTANCE_ACROSS_VERSIONS_MAX`, greedy
answers identical to no speculation under the newer one (the gate's ``answer_agreement`` against a baseline on the
same image), and the same prompts, head and settings on both sides. Beside :mod:`eagle3ops_dev.gpuhead`, whose
figures these read; the script does the I/O.
"""

from __future__ import annotations

import json
from typing import Any

from eagle3ops_dev.gpuhead import vllm_suffix

__all__ = ["ACCEPTANCE_ACROSS_VERSIONS_MAX", "answers_identical", "head_across_versions", "image_record"]

#: How far the served acceptance length of a head trained under vLLM 0.16 may move when the same head, prompts and
#: settings are served under another vLLM (0.32) and still count as serving unchanged.
ACCEPTANCE_ACROSS_VERSIONS_MAX = 0.05
#: The serving image's labels read here (:mod:`eagle3ops.images.tags`: ``io.eagle3ops.*``).
PROFILE_LABEL, PINS_LABEL, BASE_LABEL = ("io.eagle3ops.profile", "io.eagle3ops.pins",
                                         "org.opencontainers.image.base.name")


def image_record(tag: str, labels: dict[str, str] | None) -> dict[str, Any]:
    """The speculative serving image as the JSON records it, from its labels (``docker image inspect``): tag,
    profile, pins, vLLM version (the ``vllm`` pin of ``io.eagle3ops.pins``, written by ``eagle3ops image build``)
    and base image.

    Raises:
        SystemExit: the image carries no ``vllm`` pin (not built by ``eagle3ops image build serving``); the
            message names the image and how to build one."""
    labels = labels or {}
    try:
        pins = json.loads(labels.get(PINS_LABEL) or "{}")
    except ValueError:
        pins = {}
    if not isinstance(pins, dict) or not pins.get("vllm"):
        raise SystemExit(f"--speculative-image {tag}: no vLLM version in its label {PINS_LABEL} (not an image of "
                         "`eagle3ops image build serving`): build it with `eagle3ops image build serving --profile "
                         "vllm-0.32.0-serving --base-image eagle3ops/vllm-openai-local:v0.32.0` "
                         "(docs/vllm-profiles.md)")
    return {"tag": tag, "profile": labels.get(PROFILE_LABEL), "pins": pins, "vllm": pins["vllm"],
            "base": labels.get(BASE_LABEL), "vllm_from": f"the image's label {PINS_LABEL}"}


def answers_identical(agreement: Any) -> dict[str, Any]:
    """Whether the gate's ``answer_agreement`` (:func:`eagle3ops.gate.answers.answer_agreement`: per concurrency,
    each side's first pass, prompt by prompt) shows every compared prompt's greedy answer identical at every level.

    Returns:
        ``{"value": {concurrency: "identical/compared" or None}, "not_compared": {concurrency: m}, "holds",
        "why"}``: not holding when the gate recorded no agreement, a level compared no prompt, or an answer
        differs (``why`` names the level, the count and the first differing prompt indices)."""
    if not isinstance(agreement, dict) or not agreement:
        return {"value": None, "not_compared": None, "holds": False,
                "why": f"the gate recorded no answer agreement ({agreement!r})"}
    value: dict[str, str | None] = {}
    skipped: dict[str, Any] = {}
    why: list[str] = []
    for c in sorted(agreement, key=lambda x: int(x) if str(x).isdigit() else 0):
        lv = agreement[c] if isinstance(agreement[c], dict) else {}
        if "not_recorded" in lv or not lv.get("prompts"):
            value[c] = None
            why.append(f"concurrency {c}: {lv.get('not_recorded') or 'no prompt compared'}")
            continue
        n, k = int(lv["prompts"]), int(lv.get("identical") or 0)
        value[c], skipped[c] = f"{k}/{n}", lv.get("not_compared", 0)
        if k != n:
            why.append(f"concurrency {c}: {n - k} of {n} greedy answers differ (first prompts {lv.get('differing')})")
    return {"value": value, "not_compared": skipped, "holds": not why, "why": "; ".join(why) or None}


def _served_vllm(fig: dict[str, Any]) -> str | None:
    """The speculative release's vLLM: its ``/version`` as the gate read it, else the image's label."""
    got = ((fig.get("measured_releases") or {}).get("speculative") or {}).get("vllm_version")
    return got or (fig.get("speculative_image") or {}).get("vllm")


def head_across_versions(fig: dict[str, Any], other: dict[str, Any], other_name: str,
                         max_difference: float = ACCEPTANCE_ACROSS_VERSIONS_MAX) -> tuple[str, dict[str, Any]]:
    """The same head served under two vLLM versions, compared (pure): ``fig`` this script's JSON of the run on the
    newer serving image (``--speculative-image``, e.g. vLLM 0.32), ``other`` the JSON of the same round and prompt
    set under the default vLLM 0.16 stand-in (file ``other_name``).

    Returns:
        ``("head_under_<MAJOR><MINOR>", entry)``: ``entry`` holds ``acceptance`` (both acceptance lengths, the
        difference, ``holds`` when ``|difference| <= max_difference``), ``answers_identical_to_no_speculation``
        (:func:`answers_identical` of ``fig``'s gate, whose baseline must be the same image without speculation:
        ``--control``), ``same_prompts`` (the gate's prompts file sha256 and count on both), ``same_head`` (the
        gate's head sha256 on both), ``same_settings`` (k, tokens a request, levels measured) and ``holds``: all
        five hold.

    Raises:
        SystemExit: the two files are of other prompt sets, or ``fig`` names no vLLM version (not a
            ``--speculative-image`` run); the message names both files' values.
    """
    if fig.get("set") != other.get("set"):
        raise SystemExit(f"--compare-with {other_name}: prompt set {other.get('set')!r}, this run's is "
                         f"{fig.get('set')!r}: compare runs of the same --set")
    mine, theirs = _served_vllm(fig), _served_vllm(other)
    if not fig.get("speculative_image") or not mine:
        raise SystemExit("--compare-with: this JSON records no --speculative-image (its vLLM version): run the "
                         "benchmark with --speculative-image IMAGE first, then compare its JSON")
    a, b = fig.get("acceptance_length"), other.get("acceptance_length")
    diff = round(a - b, 4) if a is not None and b is not None else None
    rel = fig.get("measured_releases") or {}
    base_img, spec_img = (rel.get("baseline") or {}).get("image"), (rel.get("speculative") or {}).get("image")
    answers = {**answers_identical(fig.get("answer_agreement")),
               "baseline": {"image": base_img, "vllm": (rel.get("baseline") or {}).get("vllm_version")},
               "needs": "every compared greedy answer of the speculative release identical to the baseline's at "
                        "every level, the baseline the same image without --speculative-config (--control)"}
    if base_img is None or base_img != spec_img:
        answers["holds"] = False
        answers["why"] = "; ".join(filter(None, [answers.get("why"), f"the baseline ran {base_img}, the speculative "
                                                                     f"release {spec_img}: not the same image"]))
    gate_mine, gate_theirs = ((x.get("prompts") or {}).get("gate") or {} for x in (fig, other))
    sha_mine, sha_theirs = gate_mine.get("file_sha256"), gate_theirs.get("file_sha256")
    prompts = {"this": {"file_sha256": sha_mine, "count": gate_mine.get("count")},
               "other": {"file_sha256": sha_theirs, "count": gate_theirs.get("count")},
               "holds": bool(sha_mine) and sha_mine == sha_theirs and gate_mine.get("count") == gate_theirs.get(
                   "count")}

    def settings(x: dict[str, Any]) -> dict[str, Any]:
        return {"num_speculative_tokens": x.get("num_speculative_tokens"),
                "max_tokens": ((x.get("prompts") or {}).get("gate") or {}).get("max_tokens"),
                "levels": (x.get("levels") or {}).get("measured")}

    same = {"this": settings(fig), "other": settings(other)}
    heads = {"this": fig.get("head_sha256"), "other": other.get("head_sha256")}
    entry = {
        "compared_with": other_name,
        "vllm": {"this": mine, "other": theirs or "0.16 (the stand-in serving image; /version not recorded)"},
        "acceptance": {"this": a, "other": b, "difference": diff, "needs": f"|difference| <= {max_difference}",
                       "holds": diff is not None and abs(diff) <= max_difference + 1e-9},
        "answers_identical_to_no_speculation": answers,
        "same_prompts": prompts,
        "same_head": {**heads, "holds": bool(heads["this"]) and heads["this"] == heads["other"]},
        "same_settings": {**same, "holds": same["this"] == same["other"]},
    }
    entry["holds"] = all(entry[k]["holds"] for k in ("acceptance", "answers_identical_to_no_speculation",
                                                     "same_prompts", "same_head", "same_settings"))
    entry["needs"] = (f"the head trained under vLLM 0.16 serves under {mine}: greedy output identical to no "
                      f"speculation there, acceptance within {max_difference} of the same head under {theirs or '0.16'}"
                      ", on the same prompts, head and settings")
    return f"head_under_{vllm_suffix(mine)[4:]}", entry
