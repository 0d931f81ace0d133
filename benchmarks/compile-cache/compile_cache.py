"""Restart time of a recreated serving release with its compile cache kept against one that starts cold.

Every release, rollback and gate switch recreates the serving container from its record; vLLM's compile cache
(``VLLM_CACHE_ROOT``) and torch inductor's (``TORCHINDUCTOR_CACHE_DIR``) were in the removed container's layer, so
every start compiled again. eagle3ops now binds both to ``<data_dir>/compile-cache`` on the host
(:func:`eagle3ops.commands.serving.keep_compile_cache`). This measures what that saves, on the sandbox's real Docker
engine and real vLLM (the CPU build of the local base image), in one run, starts of the same recorded container
one after another (each from ``docker start`` to a passing health gate: ``/health``, ``/v1/models``, one completion;
:func:`eagle3ops.health.wait_healthy`, the supervisor's gate):

1. ``cold``: recreated as before the fix (the record as it is: the cache in the container's layer, empty);
2. ``kept-first``: recreated with the cache binds (:func:`keep_compile_cache`) to an empty host folder: cold too,
   it fills the folder;
3. ``kept``: recreated again with the same binds: what every later release of the same configuration costs;

then ``cold`` and ``kept`` again, alternating (``--repeats``, default 2 of each), the figures their medians.

The serving container is the inventory's serving (image, model, flags, environment) started without
``--enforce-eager`` (the sandbox's production serving runs eager, which compiles nothing; production on GPUs
compiles), under its own name and port beside production serving. When nothing lands in the cache folder (vLLM did
not compile, or kept nothing), the JSON says so with the measured figures and claims no saving.

Writes ``--json`` (default ``benchmarks/compile-cache-<model>.json``): each start's seconds, the ratio kept / cold,
the cache folder's content (files and bytes per folder), vLLM's compile log lines, the target model (the inventory's:
``deploy/sandbox-smollm2.yaml`` serves SmolLM2-135M-Instruct, a real pretrained model; ``deploy/hosts.yaml`` the
tests' tiny random Llama), the CPU. Holds the sandbox for the run (5 starts by default, 3-4 minutes each on the
2-core machine).

Usage::

    python benchmarks/compile-cache/compile_cache.py                                   # SmolLM2, deploy/sandbox-smollm2.yaml
    python benchmarks/compile-cache/compile_cache.py -i deploy/hosts.yaml              # the tiny Llama
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import use, write_result  # noqa: E402

use("release-gate")

from release_gate import _cpu  # noqa: E402  (the CPU line every sandbox benchmark records)

NAME = "e3-bench-compile-cache"
PORT = 18031
#: vLLM's log lines about compiling (what it compiled, loaded or skipped), kept in the JSON as evidence (not the
#: engine's whole configuration, which names every compilation setting).
COMPILE_LINE = re.compile(r"warming up|init engine|dynamo|inductor|torch\.compile|compile cache|cache director", re.I)
#: vLLM's own figure for the engine's start after loading: profile, KV cache, warm-up (where CPU compiles).
INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) seconds")


def _folder(path: Path) -> dict[str, Any]:
    """Files and bytes under ``path``, in total and per folder two levels down (``vllm/torch_aot_compile``...)."""
    out: dict[str, Any] = {"files": 0, "bytes": 0, "folders": {}}
    if not path.is_dir():
        return out
    for f in path.rglob("*"):
        if f.is_file():
            size = f.stat().st_size
            out["files"] += 1
            out["bytes"] += size
            parts = f.relative_to(path).parts
            # inductor's kernels sit in 2-character hash folders: counted under their cache, not one by one
            key = "/".join(parts[:2]) if len(parts) > 2 and len(parts[1]) > 2 else parts[0]
            d = out["folders"].setdefault(key, {"files": 0, "bytes": 0})
            d["files"] += 1
            d["bytes"] += size
    return out


def _record(client: Any, h: Any) -> dict[str, Any]:
    """The benchmark's serving container as the supervisor records one (:func:`sv.container_record` of its
    ``docker inspect``): the inventory's serving spec without ``--enforce-eager``, on :data:`PORT`."""
    from eagle3ops.commands import serving as sv

    spec = sv.container_spec(h, release=1)
    cmd = [a for a in sv.set_args(spec["command"], ["--port", str(PORT)]) if a != "--enforce-eager"]
    _remove(client)
    c = client.containers.create(spec["image"], name=NAME, command=cmd, environment=spec["environment"],
                                 volumes=spec["volumes"], network_mode="host",
                                 labels={"io.eagle3ops.bench": "compile-cache"})
    c.reload()
    rec = sv.container_record(c.attrs)
    c.remove(force=True)
    return rec


def _remove(client: Any) -> None:
    import docker.errors

    try:
        client.containers.get(NAME).remove(force=True)
    except docker.errors.NotFound:
        pass


def _start(client: Any, record: dict[str, Any], model: str, timeout_s: float) -> dict[str, Any]:
    """Recreate ``record`` and time it from ``docker start`` to a passing health gate; its compile log lines."""
    from eagle3ops import health
    from eagle3ops.commands import serving as sv

    _remove(client)
    body, _ = sv.create_request(record)
    cid = client.api.create_container_from_config(body, name=NAME)["Id"]

    def crashed() -> str | None:
        st = client.api.inspect_container(cid)["State"]
        return None if st["Running"] else client.api.logs(cid, tail=30).decode(errors="replace")

    load = os.getloadavg()[0]
    t0 = time.monotonic()
    client.api.start(cid)
    try:
        health.wait_healthy(f"http://127.0.0.1:{PORT}", model, timeout_s=timeout_s, crashed=crashed)
        seconds = round(time.monotonic() - t0, 1)
    finally:
        logs = client.api.logs(cid).decode(errors="replace")
        _remove(client)
    lines = [ln.strip()[-300:] for ln in logs.splitlines()
             if COMPILE_LINE.search(ln) and "dynamic_shapes_config" not in ln]
    init = INIT_ENGINE.search(logs)
    return {"seconds": seconds, "init_engine_s": float(init.group(1)) if init else None,
            "load_average_1min_at_start": round(load, 1), "binds": body["HostConfig"].get("Binds") or [],
            "compile_log": lines[:20]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("host", nargs="?", default="sandbox")
    ap.add_argument("-i", "--inventory", type=Path, default=REPO / "deploy" / "sandbox-smollm2.yaml")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--timeout-s", type=float, default=900.0, help="bound of each start's health gate (seconds)")
    ap.add_argument("--repeats", type=int, default=2,
                    help="cold and kept starts each, alternating after the start that fills the cache")
    args = ap.parse_args()

    import docker

    from eagle3ops.commands import serving as sv
    from eagle3ops.config import load_inventory
    from eagle3ops_dev import sandbox
    from eagle3ops_dev.sandbox.hold import hold

    h = load_inventory(args.inventory).host(args.host)
    held = hold(sandbox.name_of(h.docker_host or ""))  # noqa: F841 - kept until the process exits
    model_dir = Path(h.model_path)
    provenance = model_dir / "eagle3ops-target.json"
    cfg = json.loads((model_dir / "config.json").read_text())
    model = {"served_model_name": h.serving.served_model_name, "path": str(model_dir),
             "what": (json.loads(provenance.read_text()) if provenance.exists() else
                      "the tests' tiny random Llama (eagle3ops_dev.tinymodel): a stand-in target"),
             "layers": cfg.get("num_hidden_layers"), "hidden": cfg.get("hidden_size")}
    client = docker.DockerClient(base_url=h.docker_host, timeout=600)
    cache = Path(f"{sv.compile_cache_dir(h)}-bench")
    shutil.rmtree(cache, ignore_errors=True)  # a cold start needs an empty folder
    if _folder(cache)["files"]:
        raise SystemExit(f"{cache} could not be emptied: the first start with the cache kept would not be cold")

    record = _record(client, h)
    kept, notes = sv.keep_compile_cache(record, str(cache))
    if notes:
        raise SystemExit(f"the benchmark's container would not keep its cache: {notes}")
    order = [("cold", record), ("kept-first", kept), ("kept", kept)]
    order += [x for _ in range(args.repeats - 1) for x in (("cold", record), ("kept", kept))]
    runs: list[dict[str, Any]] = []
    try:
        for name, rec in order:
            print(f"{name}: starting {NAME} ...", flush=True)
            run = {"start": name, **_start(client, rec, h.serving.served_model_name or "", args.timeout_s)}
            if name == "kept-first":
                run["cache_after"] = _folder(cache)
            runs.append(run)
            print(f"{name}: {run['seconds']} s to a passing health gate (vLLM's init engine "
                  f"{run['init_engine_s']} s, load {run['load_average_1min_at_start']})", flush=True)
    finally:
        _remove(client)
    shutil.rmtree(cache, ignore_errors=True)  # its content is counted above; the host keeps no benchmark leftovers
    filled = next(r["cache_after"] for r in runs if r["start"] == "kept-first")
    colds = [r["seconds"] for r in runs if r["start"] == "cold"]
    warms = [r["seconds"] for r in runs if r["start"] == "kept"]
    cold, warm = statistics.median(colds), statistics.median(warms)
    ratio = round(warm / cold, 3)
    if filled["files"] == 0:
        verdict = (f"vLLM compiled nothing it keeps here: the cache folder stayed empty after a start; restart "
                   f"{cold} s cold vs {warm} s with the cache kept (x{ratio}): no saving is claimed")
    else:
        verdict = (f"restart {cold} s cold vs {warm} s with the compile cache kept (medians of {len(colds)} and "
                   f"{len(warms)}; x{ratio}, {cold - warm:.1f} s saved per recreated release); the cache holds "
                   f"{filled['files']} files, {filled['bytes'] / 2**20:.1f} MiB, in "
                   + ", ".join(f"{k} ({v['files']} files)" for k, v in sorted(filled["folders"].items())))
    out = {
        "benchmark": "compile-cache restart time of a recreated serving release",
        "measured_on": {"cpu": _cpu(), "cores": os.cpu_count(), "engine": "the sandbox's Docker engine",
                        "image": h.serving.image, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        "model": model,
        "serving_argv": record["Config"].get("Cmd"),
        "runs": runs,
        "cold_s": colds, "kept_first_s": next(r["seconds"] for r in runs if r["start"] == "kept-first"),
        "kept_s": warms, "cold_median_s": cold, "kept_median_s": warm,
        "ratio_kept_over_cold": ratio,
        "compiled_and_cached": filled["files"] > 0,
        "verdict": verdict,
        "note": ("each figure: docker start to a passing health gate (/health, /v1/models, one completion), on a "
                 "machine shared with other work (its 1-minute load average at each start is recorded): the figures "
                 "move with that load; cold and kept starts alternate so that both see it"),
    }
    path = args.json or Path(__file__).resolve().parent / f"compile-cache-{h.serving.served_model_name}.json"
    write_result(path, out, indent=2)
    print(verdict)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
