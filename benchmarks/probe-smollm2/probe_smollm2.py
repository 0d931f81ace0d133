"""The stage probe (vLLM CPU hidden states vs transformers) on the real target: SmolLM2-135M-Instruct.

What it runs: ``eagle3ops stage probe`` (src/eagle3ops/stages/probe.py) on the model the demo provisions
(:mod:`eagle3ops_dev.smollm2`: bf16, dequantized from the pinned Q4_1 GGUF), with the probe's real-text input:
``prepare/samples.jsonl`` holds the first ShareGPT V3 conversations (the packaged file, complete records only)
rendered with SmolLM2's chat template, so the probe's 49 sequences are pieces of real chat text. The probe's
engine is the extract stage's (speculators' patched generator), its reference transformers with hooks on the same
layers in the dtype vLLM returned; a 256-token step budget chunks the longer prompts and the first call holds more
sequences than speculators' scheduler admits at once.

Tolerance (stated in stages/probe.py, dense targets; bf16 vLLM vs bf16 transformers, relative L2 error per
token): median <= 0.02, p99 <= 0.06, at most 1 % of tokens above 0.05, every sequence's median <= 0.05. The probe's
exit status and ``report.json`` say whether it held; this script copies the report and adds the CPU and wall time.

Why a benchmark and not an in-image test: it needs the 93 MB wheel and a dequantization (~20 s on an idle core,
minutes on a busy one) plus a vLLM engine and a transformers reference over ~16k tokens of a 30-layer model: about
the 3 minutes one change may add to CI on its own. The in-image tests keep the tiny models.

Usage (inside the pipeline image; ``make bench-probe-smollm2`` mounts the demo's provisioned model at /model)::

    VLLM_CPU_KVCACHE_SPACE=2 python3 benchmarks/probe-smollm2/probe_smollm2.py --model /model --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import write_result  # noqa: E402


def write_chat_samples(model: str, run: Path, conversations: int) -> int:
    """``run/prepare/samples.jsonl``: the first ``conversations`` ShareGPT V3 conversations (complete records of
    the packaged file, read by stage prepare's reader) rendered with the model's chat template; returns tokens."""
    from transformers import AutoTokenizer

    from eagle3ops.stages.chatdata import load_conversations, resolve_dataset

    tok = AutoTokenizer.from_pretrained(model)
    out = run / "prepare" / "samples.jsonl"
    out.parent.mkdir(parents=True)
    tokens = 0
    with open(out, "w", encoding="utf-8") as f:
        convs = [c for c in load_conversations([resolve_dataset("builtin:sharegpt-v3", run)], "keep-complete")
                 if c["messages"]]
        for conv in convs[:conversations]:
            msgs = [{"role": m["role"], "content": m["content"]} for m in conv["messages"]]
            ids = tok.apply_chat_template(msgs, tokenize=True)
            tokens += len(ids)
            f.write(json.dumps({"input_ids": ids}) + "\n")
    return tokens


def cpu_model() -> str:
    """The CPU's name from /proc/cpuinfo and the count of its logical CPUs."""
    names = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
             if ln.startswith("model name")]
    return f"{names[0]} x {len(names)}" if names else "unknown"


def main() -> int:
    """Run the probe; print its output; write the report (plus CPU and wall time) to ``--json``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="/model")
    ap.add_argument("--conversations", type=int, default=60)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    t0 = time.monotonic()
    run = Path(tempfile.mkdtemp(prefix="e3probe-"))
    tokens = write_chat_samples(a.model, run, a.conversations)
    (run / "pipeline.yaml").write_text(json.dumps({"target_model": a.model, "prepare": {"max_seq_len": 2048}}))
    r = subprocess.run([sys.executable, "-m", "eagle3ops", "stage", "probe", "--run-dir", str(run)],
                       capture_output=True, text=True)
    print(r.stdout[-4000:], r.stderr[-4000:], sep="\n")
    report_file = run / "probe" / "report.json"
    report = json.loads(report_file.read_text()) if report_file.is_file() else {}
    target = {}
    rec = Path(a.model) / "eagle3ops-target.json"
    if rec.is_file():
        t = json.loads(rec.read_text())
        target = {k: t.get(k) for k in ("kind", "model", "package", "gguf", "dtype")}
    out = {"what": "eagle3ops stage probe on SmolLM2-135M-Instruct (vLLM 0.16 CPU vs transformers)",
           "cpu": cpu_model(), "target": target, "chat_tokens_written": tokens, "exit_status": r.returncode,
           "wall_s": round(time.monotonic() - t0, 1), "report": report}
    if a.json:
        write_result(a.json, out, indent=2)
        print(f"wrote {a.json}")
    return r.returncode


if __name__ == "__main__":
    raise SystemExit(main())
