"""The speculation gate's host side: runs inside the pipeline image on the host (``docker run --rm -i --network
host``), reads a JSON request on stdin and prints one JSON answer line prefixed with :data:`MARK` on stdout.

``python3 -m eagle3ops.speculate.onhost inspect``: the head's ``config.json`` and tensor shapes (safetensors
headers only: 8-byte little-endian length + JSON, no tensor is read), the target's ``config.json``, the run's train
manifest, and the disjointness record of the request's gate prompts against the run's training chats (every
string of every row of each dataset the run's ``pipeline.yaml`` names; exact match after whitespace normalisation
by sha256, and containment). Mounts: ``/head`` (the head), ``/target`` (the served model), ``/run`` (the run dir;
optional).

``python3 -m eagle3ops.speculate.onhost regenerate``: :func:`eagle3ops.speculate.regenerate.answer_item` for each
item of the request against the serving port over the host's loopback, ``concurrency`` at a time; each finished
item's row is printed at once on its own line prefixed with :data:`ROW_MARK` (the driver appends it to its resume
log as it arrives). The API key comes in the request (stdin), never in argv.

``python3 -m eagle3ops.speculate.onhost measure``: :func:`eagle3ops.speculate.replay.replay_level` at each
concurrency against the serving port over the host's loopback, with ``/metrics`` scraped before and after each
level (spec-decode counters as raw values; the driver takes the deltas).

Only the standard library, httpx, prometheus_client and PyYAML are imported (all in the pipeline image).
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

__all__ = ["MARK", "ROW_MARK", "inspect", "measure", "parse_answer", "regenerate", "safetensors_shapes"]

MARK = "E3OPS-ANSWER "
ROW_MARK = "E3OPS-ROW "


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from a safetensors file's header (format: u64 LE header length, then JSON).

    Raises:
        ValueError: not a safetensors file (header length beyond the file or not JSON).
    """
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > path.stat().st_size:
            raise ValueError(f"{path}: not a safetensors file (header length {n})")
        header = json.loads(f.read(n))
    return {k: list(v["shape"]) for k, v in header.items() if k != "__metadata__"}


def _training_texts(run: Path) -> tuple[list[str], list[str]]:
    """(every string in the run's training chats, dataset specs read); specs that cannot be read are skipped."""
    import yaml

    from eagle3ops.stages.chatdata import iter_rows, resolve_dataset

    cfg = yaml.safe_load((run / "pipeline.yaml").read_text()) or {}
    texts: list[str] = []
    read: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, str):
            texts.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    truncated = (cfg.get("prepare") or {}).get("truncated") or "error"
    for spec in (cfg.get("prepare") or {}).get("datasets") or []:
        path = resolve_dataset(str(spec), run)
        for row in iter_rows(path, truncated):  # JSONL, a JSON array or Parquet, as stage prepare reads them
            walk(row)
        read.append(str(spec))
    return texts, read


def inspect(req: dict[str, Any], head: Path = Path("/head"), target: Path = Path("/target"),
            run: Path = Path("/run")) -> dict[str, Any]:
    """Answer of ``inspect`` (see the module doc); ``req["gate"]``: ``[{"id", "text"}]``."""
    from eagle3ops.speculate.prompts import GatePromptsError, Prompt, disjointness, prompt_sha256

    shapes: dict[str, list[int]] = {}
    for f in sorted(head.glob("*.safetensors")):
        shapes.update(safetensors_shapes(f))
    out: dict[str, Any] = {"head_config": json.loads((head / "config.json").read_text()), "shapes": shapes,
                           "target_config": json.loads((target / "config.json").read_text()),
                           "head_files": sorted(p.name for p in head.iterdir() if p.is_file())}
    manifest = run / "train" / "manifest.json"
    out["train_manifest"] = json.loads(manifest.read_text()) if manifest.is_file() else None
    out["pipeline_yaml"] = (run / "pipeline.yaml").read_text() if (run / "pipeline.yaml").is_file() else None
    gate = [Prompt(p["id"], p["text"]) for p in req.get("gate") or []]
    if gate and (run / "pipeline.yaml").is_file():
        texts, read = _training_texts(run)
        try:
            rec = disjointness(gate, texts)
        except GatePromptsError as e:
            out["disjointness"] = {"error": str(e), "datasets": read}
            return out
        norm = [" ".join(t.split()) for t in texts]
        contained = sorted(p.id for p in gate if any(" ".join(p.text.split()) in t for t in norm
                                                     if len(t) >= len(" ".join(p.text.split()))))
        out["disjointness"] = {**rec, "datasets": read, "contained_in_training": contained,
                               "training_texts_sha256": prompt_sha256("".join(sorted(
                                   prompt_sha256(t) for t in texts)))}
    else:
        out["disjointness"] = {"gate_prompts": len(gate), "datasets": [], "note": "no run pipeline.yaml: a head "
                               "trained elsewhere; its training prompts are unknown here"}
    return out


def measure(req: dict[str, Any]) -> dict[str, Any]:
    """Answer of ``measure``: ``{"levels": {c: LevelResult figures}, "counters": {c: [before, after]}}`` where
    counters are :class:`~eagle3ops.speculate.metrics.SpecCounters` as dicts.

    Raises:
        ReplayError: the server was busy before a level, or every request failed.
    """
    from dataclasses import asdict

    import httpx

    from eagle3ops.speculate.metrics import parse
    from eagle3ops.speculate.replay import replay_level

    base, model = req["base_url"], req["model"]
    out: dict[str, Any] = {"levels": {}, "counters": {}}

    def scrape() -> dict[str, Any]:
        d = asdict(parse(httpx.get(f"{base}/metrics", timeout=30).text))
        d["accepted_per_pos"] = {str(k): v for k, v in d["accepted_per_pos"].items()}
        return d

    for c in req["levels"]:
        before = scrape()
        res = replay_level(base, model, req["prompts"], int(c), max_tokens=int(req["max_tokens"]),
                           request_timeout_s=float(req.get("request_timeout_s", 300)),
                           idle_timeout_s=float(req.get("idle_timeout_s", 120)))
        out["levels"][str(c)] = res.figures()
        out["counters"][str(c)] = [before, scrape()]
    return out


def regenerate(req: dict[str, Any]) -> dict[str, Any]:
    """Answer of ``regenerate``: ``{"rows": n, "vllm_version": ...}`` after printing each item's row (see the
    module doc) as it finishes. Request: ``{"base_url", "api_key" (or null), "settings": GenSettings fields,
    "items": [{"id", "turns": [[role, content], ...]}]}``."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    import httpx

    from eagle3ops.speculate.regenerate import GenSettings, Item, answer_item, vllm_version

    s = GenSettings(**req["settings"])
    items = [Item(i["id"], tuple((r, c) for r, c in i["turns"])) for i in req["items"]]
    headers = {"Authorization": f"Bearer {req['api_key']}"} if req.get("api_key") else {}
    n = 0
    limits = httpx.Limits(max_connections=s.concurrency)
    with httpx.Client(headers=headers, limits=limits) as client, ThreadPoolExecutor(s.concurrency) as pool:
        for fut in as_completed([pool.submit(answer_item, client, req["base_url"], s, i) for i in items]):
            print(ROW_MARK + json.dumps(fut.result(), ensure_ascii=False), flush=True)
            n += 1
    return {"rows": n, "vllm_version": vllm_version(req["base_url"], req.get("api_key"))}


def parse_answer(stdout: str) -> dict[str, Any]:
    """The JSON answer from a run's stdout (the last line starting with :data:`MARK`).

    Raises:
        ValueError: no answer line (the command failed before answering).
    """
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise ValueError("no answer from the host-side gate command; its output ends: " + stdout[-500:])


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``inspect``, ``measure`` or ``regenerate``; request JSON on stdin, answer on stdout."""
    args = sys.argv[1:] if argv is None else argv
    actions = {"inspect": inspect, "measure": measure, "regenerate": regenerate}
    if len(args) != 1 or args[0] not in actions:
        print("usage: python3 -m eagle3ops.speculate.onhost inspect|measure|regenerate  (request JSON on stdin)",
              file=sys.stderr)
        return 2
    req = json.loads(sys.stdin.read() or "{}")
    ans = actions[args[0]](req)
    print(MARK + json.dumps(ans), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
