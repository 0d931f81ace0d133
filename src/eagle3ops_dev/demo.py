"""``make demo``: the whole maintenance cycle against the embedded sandbox host, each step visible and timed.

1. sandbox host up (sshd on 127.0.0.1 + its own dockerd)  2. images: local vLLM 0.16 base (stand-in for
``vllm/vllm-openai:v0.16.0``) and the pipeline image  3. production serving on the sandbox (real vLLM; the target:
:mod:`eagle3ops_dev.tinytrained`, a tiny Llama trained on HumanEval's train split, 24 layers deep)
4. deploy  4b. training data: HumanEval's train-split prompts answered by the live target (no window; the gate's
split held out)  5. extract window, train window  6. a second serving release, then rollback  7. speculate: the
trained head as a speculative release, kept only when measured faster (else rolled back)  8. the run's report (HTML
+ plots) — and a summary of figures.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from eagle3ops.config import HostConfig, load_inventory
from eagle3ops.console import print_event, summary

console = Console()
SANDBOX = "sandbox"
#: The demo's training data: HumanEval's train-split prompts (all of them when None), answered by the sandbox's
#: target with at most DEMO_MAX_TOKENS tokens each (the 24-layer trained target decodes ~10 ms a token on the shared
#: 2-core machine; 125 prompts x 96 tokens at concurrency 4 take about a minute).
DEMO_PROMPTS: int | None = None
DEMO_MAX_TOKENS = 96
#: Head training in the demo (deploy/pipeline.yaml's 20 steps at lr 1e-4 suit the tests' random target). Measured on
#: the demo's data (125 replies, ~7.5k tokens) with the 24-layer trained target: 150 steps at lr 1e-4 and 1024 tokens
#: a batch gave an offline acceptance estimate of 1.55 (gate: 1.46, rolled back at x0.94); 300 steps at lr 3e-3 and
#: 2048 tokens gave 2.88 offline, 1.93 at the gate, kept at x1.21 (about 3 minutes of training on 2 cores).
DEMO_TRAIN = {"steps": 300, "lr": 3e-3, "batch_max_tokens": 2048, "checkpoint_every": 100}
#: The demo's gate: HumanEval gate-split prompts x output tokens per level (the inventory's 4 x 16 suit the tests).
DEMO_GATE_PROMPTS = 8
DEMO_GATE_MAX_TOKENS = 64
#: The sandbox target the demo serves (:mod:`eagle3ops_dev.tinytrained`); the tests serve the random ``llama``.
DEMO_TARGET = "llama-trained"


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
    """The kind of sandbox target at ``model_path``: ``llama-trained`` (its :data:`eagle3ops_dev.tinytrained.RECORD`
    says so), ``llama`` (a model without that record: :mod:`eagle3ops_dev.tinymodel`), or None (no ``config.json``)."""
    from eagle3ops_dev.tinytrained import RECORD  # torch is imported lazily there

    out = Path(model_path)
    if not (out / "config.json").exists():
        return None
    rec = out / RECORD
    return str(json.loads(rec.read_text()).get("kind", "llama")) if rec.exists() else "llama"


def build_tiny_model(image: str, model_path: str, kind: str = DEMO_TARGET) -> bool:
    """Build the sandbox target of ``kind`` into ``model_path`` on this machine with the pipeline image (local engine);
    return True when it replaced a target of another kind (serving must then restart), False when it was built
    fresh or was already there.

    ``kind``: ``llama`` (:mod:`eagle3ops_dev.tinymodel`, random weights, 4 layers: the tests' target) or
    ``llama-trained`` (:mod:`eagle3ops_dev.tinytrained`: trained on HumanEval's train split, written here as the corpus
    beside the model directory, then deepened to 24 layers; ~50 s on 2 cores). The model is built into a sibling
    directory and renamed into place, so a failed build leaves the old one. The sandbox host's directories live on
    this machine, so provisioning writes there directly, as an operator would copy weights onto a real host before
    it ever served.

    Raises:
        DemoError: the build wrote no ``config.json``.
        ValueError: unknown ``kind``.
    """
    import shutil

    import docker

    from eagle3ops_dev import provision

    if kind not in ("llama", "llama-trained"):
        raise ValueError(f"kind={kind!r}: expected llama or llama-trained")
    out = Path(model_path)
    have = target_kind(out)
    if have == kind:
        console.print(f"sandbox target ({kind}) already at {out}")
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.building"
    shutil.rmtree(tmp, ignore_errors=True)
    if kind == "llama":
        argv = provision.tiny_model(f"/out/{tmp.name}", "llama")
    else:
        from eagle3ops.speculate import regenerate as rg

        corpus = out.parent / f"{out.name}.corpus.jsonl"
        rec = rg.write_humaneval_train_corpus(corpus)
        console.print(f"training corpus: HumanEval train split, {rec['rows']} tasks -> {corpus}")
        argv = provision.trained_model(f"/out/{tmp.name}", f"/out/{corpus.name}")
    client = docker.from_env()
    logs = client.containers.run(
        image, entrypoint=argv[:1], command=argv[1:],
        volumes={str(out.parent): {"bind": "/out", "mode": "rw"}}, network_mode="host", remove=True,
        environment={"HF_HUB_OFFLINE": "1"},
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


def regenerate_training_data(h: HostConfig, run: str, pipeline_text: str, *, prompts: int | None = DEMO_PROMPTS,
                             max_tokens: int = DEMO_MAX_TOKENS, out_dir: Path | None = None,
                             train: dict[str, Any] | None = None) -> tuple[str, dict]:
    """Answer the first ``prompts`` (all when None) HumanEval train-split prompts with the sandbox's live target
    (:func:`eagle3ops.speculate.reach.regenerate_for_host`: greedy, ``max_tokens`` each, uploaded to the run's
    ``regenerated/``) and return ``(pipeline text training on them, the generation manifest)``; ``train`` (keys of the
    pipeline's ``train`` section) overrides those settings.

    Raises:
        DemoError: some prompts stayed unanswered after their attempts.
        eagle3ops.speculate.regenerate.RegenerateError: serving not reachable.
    """
    import yaml

    from eagle3ops import executor
    from eagle3ops.speculate import reach
    from eagle3ops.speculate import regenerate as rg

    he = rg.humaneval_train(prompts)
    p = rg.plan(he.items, rg.settings_for(h, max_tokens=max_tokens),
                out_dir or Path("regenerated") / f"{h.name}-{run}")
    with executor.for_host(h) as r:
        man = reach.regenerate_for_host(r, run, p, extra_manifest=he.record, echo=console.print)
    if man["failed"]:
        raise DemoError(f"training data: {man['failed']} prompt(s) unanswered: {man['errors'][:3]}")
    cfg = yaml.safe_load(pipeline_text) or {}
    cfg.setdefault("prepare", {})["datasets"] = [f"{rg.HOST_FOLDER}/{rg.DATASET}"]
    if train:
        cfg.setdefault("train", {}).update(train)
    return yaml.safe_dump(cfg, sort_keys=False), man


def run(inventory: Path = Path("deploy/hosts.yaml"), pipeline: Path = Path("deploy/pipeline.yaml")) -> int:
    """Run the demo; returns the process exit code (0 = the whole cycle ran and serving is healthy at the end)."""
    from eagle3ops import deployer, executor, images
    from eagle3ops_dev import bases, sandbox
    from eagle3ops.window.run import run_window

    t_start = time.monotonic()
    figures: list[tuple[str, str]] = []
    h = load_inventory(inventory).host(SANDBOX)

    t = _step("1. sandbox host: sshd on 127.0.0.1 + its own Docker engine")
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

    t = _step("3. production serving on the sandbox host: real vLLM 0.16 serving a small trained target")
    console.print(deployer.push_image(h.serving.image, h))
    replaced = build_tiny_model(built.tag, h.model_path, DEMO_TARGET)
    ready_s = start_serving(h, restart=replaced)
    figures.append(("serving start (cold)", f"{ready_s:.1f} s"))
    figures.append(("provision serving", f"{time.monotonic() - t:.1f} s"))

    t = _step(f"4. deploy {SANDBOX}: push the pipeline image over SSH (missing layers only), verify, preflight")
    dep = deployer.deploy(h, base_image=base, echo=console.print)
    figures.append(("deploy", f"{time.monotonic() - t:.1f} s (push {dep.push_s:.1f} s)"))

    ok = True
    run = time.strftime("demo-%Y%m%dT%H%M%S")  # a fresh pipeline run each demo (stages refuse foreign outputs)

    t = _step(f"4b. training data: {DEMO_PROMPTS or 'all'} HumanEval train-split prompts answered by the live target")
    pipeline_text, gen = regenerate_training_data(h, run, pipeline.read_text(), train=DEMO_TRAIN)
    figures.append(("regenerate (live serving)", f"{gen['answered']} answers, {gen['completion_tokens_now']} tokens "
                                                 f"in {gen['wall_s']} s ({gen['tokens_per_s_now']} tokens/s, "
                                                 f"concurrency {gen['settings']['concurrency']})"))
    for kind in ("extract", "train"):
        t = _step(f"5. {kind} window on {SANDBOX}")
        with executor.for_host(h) as r:
            res = run_window(r, kind=kind, image=dep.tag, expected_image_id=dep.image_id,
                             command=f"eagle3ops {kind} {SANDBOX} --run {run} (demo)", run=run, on_event=print_event,
                             pipeline_text=pipeline_text)
        summary(res)
        ok &= res["outcome"] == "ok"
        figures.append((f"{kind} window", f"{res['outcome']}, wall {res['wall_s']} s, serving downtime "
                                           f"{res['downtime_s']} s"))
        for name, secs in (res.get("stage_seconds") or {}).items():
            figures.append((f"  stage {name}", f"{secs} s ({res['stages'][name]})"))
        if res["outcome"] != "ok":
            break

    if ok:
        t = _step("6. a second serving release (changed flag), then rollback to the previous one")
        with executor.for_host(h) as r:
            from eagle3ops.config.plan import ReleaseChange

            rel = run_window(r, kind="release", image=dep.tag, expected_image_id=dep.image_id,
                             command=f"eagle3ops release {SANDBOX} --arg --max-num-seqs --arg 8 (demo)",
                             change=ReleaseChange(args=["--max-num-seqs", "8"]), on_event=print_event)
            figures.append(("release", f"{rel['outcome']} → release {rel['release']}, {rel['wall_s']} s"))
            prev = res["release"]  # live before the new release (release numbers need not be consecutive)
            rb = run_window(r, kind="rollback", image=dep.tag, expected_image_id=dep.image_id,
                            command=f"eagle3ops rollback {SANDBOX} (demo)", on_event=print_event)
            figures.append(("rollback", f"{rb['outcome']} → release {rb['release']}, {rb['wall_s']} s"))
            ok &= rel["outcome"] == "ok" and rb["outcome"] == "ok" and rb["release"] == prev

    if ok:
        t = _step("7. speculate: the trained head as a speculative release, kept only when measured faster")
        from eagle3ops.speculate import ship

        spec_img = images.build_image("serving", base_image=base, profile="vllm-0.16.0-serving-cpu-standin",
                                      ca_bundle=ca, extra_tags=[h.serving.speculative_image] if
                                      h.serving.speculative_image else ())
        with executor.for_host(h) as r:
            # --force: whatever the head's offline estimate, the demo shows the gate's measured decision
            sp = ship.speculate(r, ship.SpeculateOptions(
                run=run, pipeline_image=dep.tag, pipeline_image_id=dep.image_id, force=True,
                prompts=DEMO_GATE_PROMPTS, max_tokens=DEMO_GATE_MAX_TOKENS,
                serving_image=h.serving.speculative_image or spec_img.tag,
                command=f"eagle3ops speculate {SANDBOX} --run {run} --force (demo)"), echo=console.print,
                on_event=print_event)
        sd = sp.get("spec_decode") or {}
        figures.append(("speculation gate", f"{sp['verdict']}: {sp['reason']}"))
        for c, lv in (sp.get("levels") or {}).items():
            spec_tps = (lv.get("speculative") or {}).get("output_tokens_per_s")
            figures.append((f"  concurrency {c}", f"baseline {lv['baseline']['output_tokens_per_s']} tok/s, "
                                                  f"speculative {spec_tps} tok/s (x{lv.get('throughput_ratio')})"))
        figures.append(("  acceptance length", f"{sd.get('mean_acceptance_length')} (per position "
                                               f"{sd.get('acceptance_per_position')})"))
        figures.append(("  live release", str(sp.get("live_release"))))

    if ok:
        t = _step("8. the run's report (HTML + plots)")
        from eagle3ops import report

        with executor.for_host(h) as r:
            data = report.collect(r, h, run)
        folder = Path("reports") / f"{SANDBOX}-{run}"
        report.render(data, folder)
        figures.append(("report", f"{folder / 'index.html'} ({len(data['windows'])} windows, "
                                  f"{len(data['train_metrics'])} train steps)"))

    healthy = serving_healthy(h, completion=True)
    figures.append(("serving healthy at the end", str(healthy)))
    figures.append(("demo wall time", f"{time.monotonic() - t_start:.1f} s"))
    table = Table(title="eagle3ops demo: measured figures")
    table.add_column("what")
    table.add_column("figure")
    for k, v in figures:
        table.add_row(k, v)
    console.print(table)
    return 0 if ok and healthy else 1
