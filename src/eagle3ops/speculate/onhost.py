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

``python3 -m eagle3ops.speculate.onhost measure``: :func:`eagle3ops.gate.replay.replay_level` at each
concurrency, ``passes`` times, against the serving port over the host's loopback, with ``/metrics`` scraped after
each level's idle wait and after its last request (spec-decode counters as raw values; the driver takes the
deltas). The API key, when serving needs one, comes in the request (stdin), never in argv.

Only the standard library, httpx, prometheus_client and PyYAML are imported at module level (all in the pipeline
image); ``inspect`` also reads the head's config through vLLM's loader, and with ``"estimate"`` in its request (a
head from elsewhere: ``speculate --head``) estimates the head's acceptance on the run's held-out hidden states
(:mod:`eagle3ops.stages.estimate`: torch and speculators), answered as ``estimate``.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

__all__ = ["MARK", "ROW_MARK", "head_sha256", "inspect", "measure", "parse_answer", "regenerate", "safetensors_shapes",
           "safetensors_vector", "vllm_view"]

MARK = "E3OPS-ANSWER "
ROW_MARK = "E3OPS-ROW "


def head_sha256(head: Path) -> str:
    """A head directory's content digest (hex sha256): over its regular files in name order, each as its name, a NUL
    byte and the sha256 of its bytes. The same head gives the same digest on the driver and on the host; a speculate
    attempt's results are kept under it."""
    import hashlib

    digest = hashlib.sha256()
    for p in sorted(p for p in head.iterdir() if p.is_file()):
        h = hashlib.sha256()
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digest.update(p.name.encode() + b"\0" + h.digest())
    return digest.hexdigest()


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


#: safetensors dtype names -> numpy dtype strings, for the integer and bool tensors read here (d2t, t2d).
_ST_DTYPES = {"I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def safetensors_vector(path: Path, name: str) -> list[int] | None:
    """The values of the integer or bool tensor ``name`` of a safetensors file, flattened (None when absent);
    read with numpy from the file's byte range (format: u64 LE header length, JSON header, data), no torch.

    Raises:
        ValueError: a dtype other than integers or bool (``d2t``/``t2d`` never are).
    """
    import numpy as np

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        meta = header.get(name)
        if meta is None:
            return None
        if meta["dtype"] not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name} has dtype {meta['dtype']}, expected an integer or bool tensor")
        start, end = meta["data_offsets"]
        f.seek(8 + n + start)
        return np.frombuffer(f.read(end - start), dtype=_ST_DTYPES[meta["dtype"]]).astype("int64").tolist()


def vllm_view(head: Path) -> dict[str, Any]:
    """How vLLM's own config loader reads the head at ``head`` (in the pipeline image, which has vLLM 0.16).

    ``config``: the draft's ``hf_config`` as vLLM builds it (``vllm.transformers_utils.config.get_config``: for a
    speculators-format head its ``SpeculatorsConfig`` and the eagle3 algo updater, else transformers' config class),
    as a dict; ``read_keys``: the config keys vLLM's EAGLE-3 draft code reads (attribute reads on a config in the
    source of ``vllm.model_executor.models.llama_eagle3`` and ``.llama``, found by pattern in vLLM's installed
    source, not a list kept here) plus the keys of ``LlamaConfig`` and the speculators format's structure;
    ``vllm_version``. ``{"error": ...}`` when vLLM is not importable or its loader fails.
    """
    import inspect as pyinspect
    import re

    try:
        import vllm
        from vllm.model_executor.models import llama, llama_eagle3
        from vllm.transformers_utils.config import get_config
    except Exception as exc:  # noqa: BLE001 - no vLLM in this image: the driver says the check did not run
        return {"error": f"vLLM not importable here: {type(exc).__name__}: {exc}"}
    try:
        cfg = get_config(str(head), trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - the loader's own refusal is the answer
        return {"error": f"vLLM {vllm.__version__} cannot load the head's config: {type(exc).__name__}: {exc}"}
    src = pyinspect.getsource(llama_eagle3) + pyinspect.getsource(llama)
    keys = set(re.findall(r"config\.(\w+)", src)) | set(re.findall(r"getattr\(\s*(?:self\.)?config,\s*[\"'](\w+)", src))
    keys |= set(re.findall(r"[\"'](\w+)[\"']\s+in\s+eagle_config", src))
    try:
        from transformers import LlamaConfig

        keys |= set(LlamaConfig().to_dict())
    except Exception:  # noqa: BLE001
        pass
    try:  # the speculators-format adapter: the keys its eagle3 updater takes from config.json
        from vllm.transformers_utils.configs.speculators import algos

        keys |= set(re.findall(r"\.get\(\s*[\"'](\w+)", pyinspect.getsource(algos)))
        keys |= set(re.findall(r"config_dict\[\s*[\"'](\w+)", pyinspect.getsource(algos)))
    except Exception:  # noqa: BLE001
        pass
    keys |= {"speculators_model_type", "speculators_config", "speculators_version", "transformer_layer_config"}
    return {"config": json.loads(json.dumps(cfg.to_dict(), default=str)), "read_keys": sorted(keys),
            "vllm_version": vllm.__version__}


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


def _estimate(spec: dict[str, Any], head: Path, target: Path, run: Path) -> dict[str, Any]:
    """The offline estimate of a head from elsewhere on the run's hidden states
    (:func:`eagle3ops.stages.estimate.estimate_head`; torch and speculators imported only here), or
    ``{"unavailable": reason}``, never an exception: the driver refuses the head unless forced, naming it."""
    name = str(spec.get("run") or run.name)
    if not run.is_dir():
        return {"unavailable": f"run {name} has no directory on this host, so no hidden states"}
    try:
        from eagle3ops.stages.estimate import DEFAULT_MAX_TOKENS, estimate_head

        return estimate_head(head, run, target, max_tokens=int(spec.get("max_tokens") or DEFAULT_MAX_TOKENS),
                             name=name)
    except Exception as exc:  # noqa: BLE001 - the answer carries the reason; the driver decides
        return {"unavailable": f"the estimate failed on the host: {type(exc).__name__}: {str(exc)[-400:]}"}


def _tokenizer_template_sha256(target: Path) -> str | None:
    """sha256 of the target tokenizer's own chat template, as stage prepare records it (the template vLLM renders
    with when serving has no ``--chat-template``); None when it cannot be loaded (transformers imported here)."""
    import hashlib

    try:
        from transformers import AutoTokenizer

        t = AutoTokenizer.from_pretrained(str(target), trust_remote_code=True).chat_template
    except Exception:  # noqa: BLE001 - the driver says the check could not run
        return None
    if t is None:
        return None
    return hashlib.sha256((t if isinstance(t, str) else json.dumps(t)).encode()).hexdigest()


def inspect(req: dict[str, Any], head: Path = Path("/head"), target: Path = Path("/target"),
            run: Path = Path("/run")) -> dict[str, Any]:
    """Answer of ``inspect`` (see the module doc); ``req["gate"]``: ``[{"id", "text"}]``; ``req["estimate"]``
    (optional): ``{"run": NAME, "max_tokens": N}``, answered as ``estimate`` (:func:`_estimate`). Also the run's
    prepare manifest's ``tokenizer`` record (``prepare_template``: the template its data was rendered with) and the
    target tokenizer's own template's sha256 (``tokenizer_template_sha256``)."""
    from eagle3ops.speculate.prompts import GatePromptsError, Prompt, disjointness, prompt_sha256

    shapes: dict[str, list[int]] = {}
    for f in sorted(head.glob("*.safetensors")):
        shapes.update(safetensors_shapes(f))
    out: dict[str, Any] = {"head_config": json.loads((head / "config.json").read_text()), "shapes": shapes,
                           "target_config": json.loads((target / "config.json").read_text()),
                           "head_files": sorted(p.name for p in head.iterdir() if p.is_file()),
                           "head_sha256": head_sha256(head)}
    files = sorted(head.glob("*.safetensors"))
    out["vocab"] = {k: next((v for v in (safetensors_vector(f, k) for f in files) if v is not None), None)
                    for k in ("d2t", "t2d")}
    out["vllm_view"] = vllm_view(head)
    if req.get("estimate") is not None:
        out["estimate"] = _estimate(req["estimate"], head, target, run)
    prepared = run / "prepare" / "manifest.json"
    out["prepare_template"] = (json.loads(prepared.read_text()).get("tokenizer") if prepared.is_file() else None)
    out["tokenizer_template_sha256"] = _tokenizer_template_sha256(target)
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
    """Answer of ``measure``: :func:`eagle3ops.gate.measure.measure` (the same code the host's supervisor runs
    in a ``speculate`` job)."""
    from eagle3ops.gate.measure import measure as _measure

    return _measure(req)


def regenerate(req: dict[str, Any]) -> dict[str, Any]:
    """Answer of ``regenerate``: ``{"rows": n, "vllm_version": ...}`` after printing each item's row (see the
    module doc) as it finishes. Request: ``{"base_url", "api_key" (or null), "settings": GenSettings fields,
    "items": [{"id", "turns": [[role, content], ...]}]}``."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    import httpx

    from eagle3ops.serving_http import auth_headers
    from eagle3ops.speculate.regenerate import GenSettings, Item, answer_item, vllm_version

    s = GenSettings(**req["settings"])
    items = [Item(i["id"], tuple((r, c) for r, c in i["turns"])) for i in req["items"]]
    headers = auth_headers(req.get("api_key"))
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
