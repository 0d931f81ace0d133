"""The demo's figures (``make demo``, :mod:`eagle3ops_dev.demo`): rows of ``(what, figure)`` for its table and its
``demo-figures.json``, read from the results its steps return and the stage manifests they leave. Pure apart from
reading those manifests: nothing here runs a step, so a figure can be checked against a result without a sandbox.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def stage_figures(run_dir: Path, window: str) -> list[tuple[str, str]]:
    """Figures from the stage manifests of ``window`` (``extract``: prepare + extract; ``train``: vocab + train) in
    the run directory ``run_dir`` (the sandbox's data directory is on this machine); a manifest not there is
    skipped."""
    out: list[tuple[str, str]] = []

    def man(stage: str) -> dict[str, Any] | None:
        f = run_dir / stage / "manifest.json"
        try:
            return json.loads(f.read_text())
        except (OSError, ValueError):
            return None

    if window == "extract" and (m := man("prepare")):
        keep = ("samples", "tokens", "assistant_tokens", "truncated", "wall_s")
        out.append(("  prepare", ", ".join(f"{k} {m[k]}" for k in keep if k in m) or "ok"))
    if window == "train":
        if m := man("vocab"):
            out.append(("  draft vocabulary", f"{m.get('draft_vocab_size')} of {m.get('target_vocab_size')} ids, "
                                              f"coverage {m.get('coverage')} ({m.get('size_choice')}); curve "
                                              f"{m.get('coverage_curve')}"))
        if m := man("train"):
            keep = ("steps_this_run", "first_loss", "final_metrics", "offline_estimate", "steps_per_s", "wall_s")
            out.append(("  train", ", ".join(f"{k} {m[k]}" for k in keep if k in m) or "ok"))
    return out


def regenerate_figures(gen: dict[str, Any], dataset: str) -> list[tuple[str, str]]:
    """The figures of demo step 4b from :func:`eagle3ops_dev.demo.regenerate_training_data`'s record ``gen`` of
    conversations from ``dataset`` (its name, as the regenerate source names it)."""
    figures: list[tuple[str, str]] = []
    sel = gen.get("selection") or {}
    figures.append(("regenerate (live serving)", f"{gen['answered']} of {gen['conversations']} conversations, "
                                                 f"{gen['completion_tokens_now']} tokens in {gen['wall_s']} s "
                                                 f"({gen['tokens_per_s_now']} tokens/s, concurrency "
                                                 f"{gen['settings']['concurrency']}, up to {sel.get('max_turns')} "
                                                 f"answers each; finish {gen.get('finish_reasons')}; not started "
                                                 f"(time budget) {gen.get('not_started_time_budget')})"))
    figures.append(("  data", f"{dataset}: {sel.get('conversations_read')} conversations read, "
                              f"{sel.get('held_out')} held out by hash, {sel.get('within_prompt_chars')} of the rest "
                              f"within {sel.get('prompt_chars')} prompt characters"))
    return figures


def window_figures(kind: str, res: dict[str, Any], run_dir: Path) -> list[tuple[str, str]]:
    """The figures of a demo ``kind`` window (step 5) from its result ``res``, then its stages' manifests in the
    run's directory ``run_dir`` (:func:`stage_figures`)."""
    figures: list[tuple[str, str]] = []
    figures.append((f"{kind} window", f"{res['outcome']}, wall {res['wall_s']} s, serving downtime "
                                       f"{res['downtime_s']} s"))
    for name, secs in (res.get("stage_seconds") or {}).items():
        figures.append((f"  stage {name}", f"{secs} s ({res['stages'][name]})"))
    figures.extend(stage_figures(run_dir, kind))
    return figures


def gate_figures(sp: dict[str, Any]) -> list[tuple[str, str]]:
    """The figures of the speculation gate's result ``sp`` (:func:`eagle3ops.speculate.ship.speculate`)."""
    figures: list[tuple[str, str]] = []
    sd = sp.get("spec_decode") or {}
    figures.append(("speculation gate", f"{sp['verdict']}: {sp['reason']}"))
    for c, lv in (sp.get("levels") or {}).items():
        spec_tps = (lv.get("speculative") or {}).get("output_tokens_per_s")
        figures.append((f"  concurrency {c}", f"baseline {lv['baseline']['output_tokens_per_s']} tok/s, "
                                              f"speculative {spec_tps} tok/s (x{lv.get('throughput_ratio')})"))
    figures.append(("  acceptance length", f"{sd.get('mean_acceptance_length')} (per position "
                                           f"{sd.get('acceptance_per_position')})"))
    figures.append(("  live release", str(sp.get("live_release"))))
    iv = sp.get("interval") or {}
    if iv:
        figures.append(("  90 % interval", f"x{iv.get('low')} to x{iv.get('high')} (point x{iv.get('point')}, "
                                           f"{iv.get('baseline_passes')} + {iv.get('speculative_passes')} passes x "
                                           f"{iv.get('prompts')} prompts)"))
    gd = sp.get("gate_design") or {}
    if gd:
        figures.append(("  gate design", f"{gd.get('used')}: {gd.get('order')} (block passes "
                                         f"{gd.get('block_passes')})"))
    pw = sp.get("power") or {}
    if pw:  # planned before any restart; the demo's 3 passes are accepted below the target (its inventory)
        figures.append(("  planned gate power", f"{pw.get('power')} at x{pw.get('true_ratio')} with "
                                                f"{pw.get('passes')} passes, pass CV {pw.get('pass_cv')} (target "
                                                f"{pw.get('target')}; low power accepted: "
                                                f"{pw.get('accepted_low_power')})"))
    for name, t in (sp.get("sets") or {}).items():
        for c, row in (t.get("levels") or {}).items():
            siv = row.get("interval")
            figures.append((f"  set {name}, concurrency {c}",
                            f"x{row.get('throughput_ratio')}" + (f" (x{siv['low']} to x{siv['high']})" if siv
                                                                 else "") + f", TTFT x{row.get('ttft_ratio')}"))
    figures.append(("  gate wall time", f"{sp.get('wall_s')} s ({len(sp.get('restarts_s') or [])} serving "
                                        "restarts)"))
    return figures
