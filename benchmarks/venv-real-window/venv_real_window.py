"""The venv runtime, measured (NOT a CI test: the environment is GBs): a REAL extract window then a train window on a
sandbox host reached as a venv host (``stage_runtime: venv``, no container engine used on the host side), with the
REAL pipeline environment exported from the built pipeline image (:func:`eagle3ops.transfer.envbuild.export_env`),
real stages (``python -m eagle3ops stage``: vLLM's CPU build extracting from the tests' tiny Llama target, then
vocab and train), and process serving played by the STAND-IN OpenAI server (``tests/data/standin_openai_server.py``,
as ``tests/test_venv_window.py`` does), not vLLM.

Prints the figures and writes them as JSON (``--json``, default ``benchmarks/venv-real-window/venv-real-window.json``): tarball size,
export seconds (or the cached export's), send+verify seconds, the unpacked size on the host, a second deploy (no
send), each window's outcome, stages and downtime, and the rerun of the extract window (a no-op: serving not
stopped).

Usage (your own sandbox; never ``sandbox`` or ``newcomer``)::

    EAGLE3OPS_SANDBOX=h28b EAGLE3OPS_SANDBOX_SSH_PORT=2272 EAGLE3OPS_SANDBOX_SERVING_PORT=18072 \\
        .venv/bin/python benchmarks/venv-real-window/venv_real_window.py --image eagle3ops/pipeline:<tag> [--keep]

Needs about 3x the venv's size free on ``/`` (the cached tarball, its copy in transit on the host, the unpacked
environment). ``--keep`` leaves the host's directories (else removed at the end; the cached tarball stays in the
export cache: ``$EAGLE3OPS_ENV_CACHE``).
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import sys
import time
import uuid
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import write_result  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from eagle3ops import deployer  # noqa: E402
from eagle3ops.commands import host as hc  # noqa: E402
from eagle3ops.config import HostConfig, load_inventory  # noqa: E402
from eagle3ops.health import wait_healthy  # noqa: E402
from eagle3ops.remote import Remote  # noqa: E402
from eagle3ops.transfer import envbuild  # noqa: E402
from eagle3ops.window.run import run_window  # noqa: E402

MODEL = "standin-venv-real"
#: The tests' tiny target through every stage, cut small (prepare 16 samples, 4 train steps).
PIPELINE = """target_model: /model
seed: 0
prepare: {datasets: [builtin:sharegpt], max_seq_len: 256, max_samples: 16}
extract: {batch_size: 8}
vocab: {draft_vocab_size: 256}
train: {steps: 4, checkpoint_every: 2, batch_max_tokens: 512}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", help="a built pipeline image on the local engine (exported, then deploy "
                    "--env-tarball)")
    ap.add_argument("--product-deploy", metavar="BASE_IMAGE", help="instead: `eagle3ops deploy` of the venv host "
                    "without --env-tarball (builds this checkout's pipeline image on BASE_IMAGE when missing, "
                    "exports it, checks venv_python's version, sends it)")
    ap.add_argument("--json", type=Path, default=REPO / "benchmarks/venv-real-window/venv-real-window.json")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    if bool(a.image) == bool(a.product_deploy):
        sys.exit("give --image or --product-deploy BASE_IMAGE")
    if a.product_deploy:
        from eagle3ops import images

        a.image = images.content_tag("pipeline", None, a.product_deploy)
    name = os.environ.get("EAGLE3OPS_SANDBOX", "")
    if name in ("", "sandbox", "newcomer"):
        sys.exit("set EAGLE3OPS_SANDBOX (and _SSH_PORT, _SERVING_PORT) to a sandbox of your own")
    from eagle3ops_dev import demo, sandbox
    from eagle3ops_dev.standin_env import standin_server_pids

    sh = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    inf = sandbox.up_for(sh)
    port = int(os.environ.get("EAGLE3OPS_SANDBOX_SERVING_PORT") or 18000) + 93
    base = f"{inf.data_dir}/venvreal-{uuid.uuid4().hex[:6]}"
    work = Path(f"/var/lib/eagle3ops-sandbox/{name}/venvreal-{uuid.uuid4().hex[:6]}")
    h = HostConfig(name="venvpod", hostname=inf.hostname, port=inf.ssh_port, user=inf.user,
                   identity_file=inf.identity_file, known_hosts=inf.known_hosts, data_dir=f"{base}/data",
                   state_dir=f"{base}/state", model_path=f"{base}/model", stage_runtime="venv",
                   venv_python="/usr/bin/python3", stage_env=dict(sh.stage_env), maintenance_budget_s=3600,
                   stage_timeout_s=1800, min_free_gib=2,
                   serving={"kind": "process", "process_match": f"standin_openai_server.py --port {port}",
                            "port": port, "served_model_name": MODEL, "health_timeout_s": 60, "stop_timeout_s": 10})
    fig: dict = {"what": "real pipeline environment, real stages, venv runtime, sandbox over SSH",
                 "sandbox": name, "image": a.image, "pipeline": PIPELINE, "venv_python": h.venv_python,
                 "serving": "STAND-IN OpenAI server as a process (not vLLM)", "started": time.strftime(
                     "%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    pw = pwd.getpwnam(inf.user)
    work.mkdir(mode=0o755)
    shutil.copy(REPO / "tests/data/standin_openai_server.py", work / "standin_openai_server.py")
    for p in (work, work / "standin_openai_server.py"):
        os.chown(p, pw.pw_uid, pw.pw_gid)
    try:
        with Remote(h) as r:
            for d in (h.data_dir, h.state_dir):
                r.run(hc.mkdir_p(d))
        if a.product_deploy:  # the product path: build (when missing), export, version check, send
            t0 = time.monotonic()
            first = deployer.deploy(h, base_image=a.product_deploy, echo=print)
            wall = round(time.monotonic() - t0, 1)
            t0 = time.monotonic()
            again = deployer.deploy(h, base_image=a.product_deploy, echo=print)
            fig["product_deploy"] = {"wall_s": wall, "export_s": first.build_s, "send_verify_unpack_s": first.push_s,
                                     "summary": first.push_summary, "again_wall_s": round(time.monotonic() - t0, 1),
                                     "again_summary": again.push_summary}
        demo.build_tiny_model(a.image, h.model_path, "llama")  # the tests' target, built with the pipeline image
        # built as root in a container (model.safetensors 0600): the weights an operator copied onto the host are the
        # SSH user's to read, and the stages run as that user here (not as root in a container)
        for p in [Path(h.model_path), *Path(h.model_path).rglob("*")]:
            os.chown(p, pw.pw_uid, pw.pw_gid)
        server = f"/usr/bin/python3 {work}/standin_openai_server.py --port {port} --model {MODEL}"
        with Remote(h) as r:
            r.run(["sh", "-c", f"cd {work} && setsid nohup {server} >{work}/first.log 2>&1 </dev/null &"])
        wait_healthy(f"http://127.0.0.1:{port}", MODEL, timeout_s=30, interval_s=0.3)

        t0 = time.monotonic()
        env = envbuild.export_env(a.image, h.venv_python or "", echo=print)
        fig["export"] = {"tarball_bytes": env.size, "digest": env.image, "python": env.python,
                         "build_s": env.build_s, "cached": env.cached,
                         "this_call_s": round(time.monotonic() - t0, 1)}
        print(f"tarball {env.size / 1e9:.2f} GB, export {env.build_s:.0f} s"
              + (" (cached)" if env.cached else ""))
        with Remote(h) as r:
            hostpy = r.run(["/usr/bin/python3", "-c", "import platform; print(platform.python_version())"]).stdout
        envbuild.check_python(env.python, hostpy.strip(), venv_python=h.venv_python or "", host=h.name,
                              source=a.image)
        if not a.product_deploy:
            first = deployer.deploy(h, env_tarball=env.path, echo=print)
            again = deployer.deploy(h, env_tarball=env.path, echo=print)
        with Remote(h) as r:
            du = r.run(["du", "-sb", f"{h.state_dir}/env/{env.image.removeprefix('venv:sha256:')}"]).stdout
        fig["deploy"] = {"send_verify_unpack_s": first.push_s, "summary": first.push_summary,
                         "unpacked_bytes": int(du.split()[0]), "again_s": again.push_s,
                         "again_summary": again.push_summary}

        fig["windows"] = []
        for kind, cmd in (("extract", "extract"), ("extract", "extract again (rerun)"), ("train", "train")):
            before = standin_server_pids(port)
            t0 = time.monotonic()
            with Remote(h) as r:
                res = run_window(r, kind=kind, image=env.image, expected_image_id=env.image.removeprefix("venv:"),
                                 command=f"venv_real_window {cmd}", run="r1", pipeline_text=PIPELINE,
                                 on_event=lambda e: print("  ", json.dumps(e)[:200], flush=True))
                docker_used = [c for c in r.history if c.startswith("docker")]
            w = {"window": cmd, "outcome": res.get("outcome"), "stages": res.get("stages"),
                 "downtime_s": res.get("downtime_s"), "wall_s": round(time.monotonic() - t0, 1),
                 "serving_healthy": res.get("serving_healthy"), "serving_stopped": standin_server_pids(port) != before,
                 "docker_commands_on_host": len(docker_used), "error": res.get("error")}
            fig["windows"].append(w)
            print(json.dumps(w))
            if res.get("outcome") not in ("ok", "nothing to do"):
                with Remote(h) as r:
                    wid = res.get("window_id", "")
                    for st in ("prepare", "extract", "vocab", "train"):
                        log = r.run(["sh", "-c", f"tail -n 40 {h.state_dir}/windows/{wid}/{st}.log 2>/dev/null"],
                                    check=False).stdout
                        if log.strip():
                            print(f"--- {st}.log ---\n{log}")
                            w[f"{st}_log_tail"] = log[-3000:]
                break
        with Remote(h) as r:
            ls = r.run(["sh", "-c", f"ls {h.data_dir}/runs/r1/train 2>/dev/null | head -20"], check=False).stdout
        fig["train_outputs"] = ls.split()
        wait_healthy(f"http://127.0.0.1:{port}", MODEL, timeout_s=30, interval_s=0.5)
    finally:
        for p in standin_server_pids(port):
            try:
                os.kill(p, 15)
            except OSError:
                pass
        shutil.rmtree(work, ignore_errors=True)
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
        fig["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        a.json.parent.mkdir(parents=True, exist_ok=True)
        write_result(a.json, fig, indent=2)
        print(f"wrote {a.json}")
    return 0 if all(w["outcome"] in ("ok", "nothing to do") for w in fig.get("windows", [])) else 1


if __name__ == "__main__":
    sys.exit(main())
