"""Multi-node training, measured (NOT a CI test: it needs the real pipeline environment, GBs): one training run over three
sandbox hosts, each in its own network namespace behind a 100 mbit veth link (``tc tbf``), routed to each other
(:func:`eagle3ops_dev.fleet.up` with ``routed=True``), through the product's commands as a user runs them:

1. ``eagle3ops extract n0 n1 n2 --merged M``: the real prepare + extract stages (transformers engine) on the tests'
   tiny Llama target, one shard per host;
2. node 2's route removed: ``eagle3ops train n0 n1 n2 --from-fleet M`` must be refused by the reach probe naming
   n2, before any serving stops (n0 serves the STAND-IN OpenAI server as ``serving: process``; its pid is checked);
3. route back: the multi-node train; when node 0 has written the checkpoint of step ``--kill-at``, node 1's trainer
   process is SIGKILLed: the command must fail naming n1 first, with n0's serving restored;
4. a copy of node 0's checkpoints resumed by ONE process on the union of the three shards (a pipeline-image
   container on this machine): a one-node run resumes the three-node checkpoint;
5. the same ``train`` command again: it resumes from node 0's last checkpoint on all three nodes and finishes;
6. the reference: one node with three processes (a pipeline-image container, gloo on loopback) on the union, from
   scratch: per-step samples compared with the three-node run's ``metrics.jsonl``, final losses compared, and every
   training sample seen exactly once per epoch.

Prints the figures and writes them as JSON (``--json``, default ``benchmarks/fleet-train-nodes/fleet-train-nodes.json``).

The pipeline environment is the REAL one exported from ``--image`` (:func:`eagle3ops.transfer.envbuild.export_env`),
delivered to n0 by the product (``deploy --env-tarball``: sent over the link, sha256 verified, unpacked) with the
links raised to 10 gbit for the delivery only (delivery has its own benchmark); n1 and n2 share n0's unpacked
environment through a symlink and a copy of its ``deployed.json`` (a STAND-IN for two more 4.9 GB deliveries: the
three sandboxes share this machine's disk). Serving on n0 is the STAND-IN OpenAI server. Usage::

    .venv/bin/python benchmarks/fleet-train-nodes/fleet_train_nodes.py --image eagle3ops/pipeline:<tag> [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_shared"))  # lab.py
from lab import write_result  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from eagle3ops import deployer  # noqa: E402
from eagle3ops.remote import Remote  # noqa: E402
from eagle3ops.transfer import envbuild  # noqa: E402

NET = {"prefix": "bench-nodes", "ns_prefix": "e3nd", "subnet": 224}
SSH_PORT, PORT, MODEL, RUN = 2284, 18084, "standin-nodes", "nodes"
PIPELINE = """target_model: /model
seed: 0
prepare: {datasets: [builtin:sharegpt, builtin:messages], max_seq_len: 256, max_samples: 60}
extract: {engine: transformers, aux_layer_ids: [0, 1, 2]}
vocab: {draft_vocab_size: 256}
train: {steps: STEPS, checkpoint_every: 5, batch_max_tokens: 512}
"""
CLI_TIMEOUT_S = 1200


def _cli(*args: str, timeout: float = CLI_TIMEOUT_S) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "eagle3ops", *args], capture_output=True, text=True, timeout=timeout,
                         cwd=REPO)
    return out, round(time.monotonic() - t0, 1)


def _rate(nodes, rate: str) -> None:
    for n in nodes:
        for argv in (["tc", "qdisc", "change", "dev", n.link.here, "root", "tbf", "rate", rate, "burst", "32kbit",
                      "latency", "400ms"],
                     ["ip", "netns", "exec", n.link.ns, "tc", "qdisc", "change", "dev", n.link.there, "root", "tbf",
                      "rate", rate, "burst", "32kbit", "latency", "400ms"]):
            subprocess.run(argv, check=True, timeout=30)


def _trainer_pids(ns: str) -> list[int]:
    """The train stage's worker processes (torchrun ranks) in namespace ``ns``."""
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout.split()
    pids = []
    for p in out:
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{p}/environ").read_bytes()
        except OSError:
            continue
        if b"eagle3ops.stages" in cmd and b"train" in cmd and b"LOCAL_RANK=" in env:
            pids.append(int(p))
    return pids


def _steps(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _container_train(image: str, run: Path, model: str, nproc: int) -> tuple[int, str, float]:
    """``stage train`` in a pipeline-image container on this machine (``nproc`` gloo processes on loopback)."""
    t0 = time.monotonic()
    out = subprocess.run(["docker", "run", "--rm", "--network", "host", "-e", f"EAGLE3OPS_TRAIN_NPROC={nproc}",
                          "-e", "HF_HUB_OFFLINE=1", "-e", "TRANSFORMERS_OFFLINE=1", "-e", "GLOO_SOCKET_IFNAME=lo",
                          "-v", f"{run}:/e3run", "-v", f"{model}:/model:ro", "--entrypoint", "python3", image,
                          "-m", "eagle3ops", "stage", "train", "--run-dir", "/e3run"],
                         capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    return out.returncode, (out.stdout + out.stderr)[-3000:], round(time.monotonic() - t0, 1)


COMPARE = """
import json, sys, torch
from pathlib import Path
from eagle3ops.patches.probekit import ProbeFailed, hidden_state_errors
from eagle3ops.stages.probe import _tolerances
pairs = json.loads(sys.argv[1])
results, refs, ids_equal = [], [], True
for fleet_file, ref_file in pairs:
    a, b = torch.load(fleet_file, weights_only=True), torch.load(ref_file, weights_only=True)
    ids_equal = ids_equal and torch.equal(a["input_ids"], b["input_ids"])
    results.append({"hidden_states": a["hidden_states"]})
    refs.append([h.float() for h in b["hidden_states"]])
st = hidden_state_errors(results, refs)
dense, _moe = _tolerances()
try:
    st.check(dense, "fleet extract against the one-host extract")
    within = True
except ProbeFailed:
    within = False
print(json.dumps({"token_ids_equal": ids_equal, "median": st.median, "q99": st.q99, "max": st.max,
                  "worst_seq_median": st.worst_seq_median, "tokens": st.n_tokens, "within_probe_tolerance": within}))
"""


def _one_host_compare(image: str, hosts: dict, model: Path, merged: Path, tmp: Path) -> dict:
    """The one-host extract of the same prepared samples (stage extract, no shard, in a
    pipeline-image container on this machine) against the fleet's merged manifest: sample ids, token ids (each
    sample's ``input_ids``), file sha256; where a file differs, the stage probe's per-token errors and its dense
    tolerance (:func:`eagle3ops.stages.probe._tolerances`), computed in the container."""
    m = json.loads(merged.read_text())
    src = Path(hosts["n0"].data_dir) / "runs" / RUN
    ref = tmp / "ref"
    ref.mkdir()
    shutil.copy(src / "pipeline.yaml", ref / "pipeline.yaml")
    shutil.copytree(src / "prepare", ref / "prepare")
    t0 = time.monotonic()
    out = subprocess.run(["docker", "run", "--rm", "--network", "none", "-e", "HF_HUB_OFFLINE=1", "-e",
                          "TRANSFORMERS_OFFLINE=1", "-v", f"{ref}:/e3run", "-v", f"{model}:/model:ro",
                          "--entrypoint", "python3", image, "-m", "eagle3ops", "stage", "extract", "--run-dir",
                          "/e3run"], capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    res: dict = {"rc": out.returncode, "wall_s": round(time.monotonic() - t0, 1)}
    if out.returncode != 0:
        res["error"] = (out.stdout + out.stderr)[-2000:]
        return res
    rm = json.loads((ref / "extract/manifest.json").read_text())
    res["sample_ids_equal"] = [s["i"] for s in rm["sample_files"]] == [s["i"] for s in m["sample_files"]]
    res["samples"], res["tokens"] = rm["samples"], rm["tokens"]
    res["tokens_equal"] = rm["tokens"] == m["tokens"] and [s["tokens"] for s in rm["sample_files"]] == [
        s["tokens"] for s in m["sample_files"]]
    owner = {}
    for sh in m["fleet"]["shards"]:
        for i in range(sh["start"], sh["end"]):
            owner[i] = sh["host"]
    same = [rel for rel, e in rm["files"].items() if m["files"].get(rel, {}).get("sha256") == e["sha256"]]
    res["files_sha256_equal"] = f"{len(same)} of {len(rm['files'])}"
    cmp_dir = tmp / "cmp"
    cmp_dir.mkdir()
    pairs = []
    for s in rm["sample_files"]:  # every sample's states compared (equal files give zero error)
        host_file = Path(hosts[owner[s["i"]]].data_dir) / "runs" / RUN / "extract" / s["file"]
        shutil.copy(host_file, cmp_dir / f"fleet_{s['i']:06d}.pt")
        pairs.append([f"/cmp/fleet_{s['i']:06d}.pt", f"/e3run/extract/{s['file']}"])
    out = subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{ref}:/e3run:ro", "-v",
                          f"{cmp_dir}:/cmp:ro", "--entrypoint", "python3", image, "-c", COMPARE, json.dumps(pairs)],
                         capture_output=True, text=True, timeout=600)
    res["states"] = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {
        "error": (out.stdout + out.stderr)[-2000:]}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", required=True, help="a built pipeline image (its venv is exported)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--kill-at", type=int, default=15, help="kill node 1's trainer once this step's checkpoint is on "
                    "node 0")
    ap.add_argument("--json", type=Path, default=REPO / "benchmarks/fleet-train-nodes/fleet-train-nodes.json")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--extract-only", action="store_true",
                    help="step 1 only, then the one-host extract compared with the merged manifest "
                         "(writes --json, default benchmarks/fleet-train-nodes/fleet-extract-vs-one-host.json)")
    a = ap.parse_args()
    if a.extract_only and a.json == REPO / "benchmarks/fleet-train-nodes/fleet-train-nodes.json":
        a.json = REPO / "benchmarks/fleet-train-nodes/fleet-extract-vs-one-host.json"
    from eagle3ops_dev import demo, fleet
    from eagle3ops_dev.standin_env import standin_server_pids

    fig: dict = {"what": "multi-node training over three netns sandbox hosts (gloo, torchrun static "
                         "rendezvous), real pipeline environment and stages, tiny Llama target",
                 "image": a.image, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "stand_ins": ["tiny random Llama target (tests' tinymodel)", "STAND-IN OpenAI server as n0's "
                               "serving: process", "n1/n2 share n0's unpacked environment (symlink + deployed.json "
                               "copy) instead of two more deliveries"]}
    pipeline_text = PIPELINE.replace("STEPS", str(a.steps))
    tmp = Path(f"/var/tmp/e3-nodes-{os.getpid()}")
    tmp.mkdir(parents=True)
    nodes = fleet.up(3, ssh_port=SSH_PORT, routed=True, **NET)
    ok = False
    try:
        fig["links"] = [n.link.qdisc() for n in nodes]
        hosts = {}
        for k, node in enumerate(nodes):
            serving = ({"kind": "process", "process_match": f"standin_openai_server.py --port {PORT}", "port": PORT,
                        "served_model_name": MODEL, "health_timeout_s": 60, "stop_timeout_s": 10} if k == 0 else "none")
            hosts[f"n{k}"] = fleet.venv_host(node, f"n{k}", f"{node.info.data_dir}/nodes", serving=serving,
                                             stage_env={"GLOO_SOCKET_IFNAME": node.link.there}, budget_s=1800,
                                             stage_timeout_s=1500)
        inv = tmp / "inventory.yaml"
        inv.write_text(fleet.inventory_yaml(list(hosts.values()), {"rendezvous_port": 29531,
                                                                   "trial_timeout_s": 30}))
        pipeline = tmp / "pipeline.yaml"
        pipeline.write_text(pipeline_text)
        fleet.start_standin_server(hosts["n0"], nodes[0], REPO / "tests/data/standin_openai_server.py", port=PORT,
                                   model=MODEL)
        model = tmp / "model"  # built once (its tokenizer is trained afresh by each build), copied to every host
        demo.build_tiny_model(a.image, str(model), "llama")
        for k, node in enumerate(nodes):  # the dirs (as each host's user), then the target, as an operator copies it
            h = hosts[f"n{k}"]
            fleet.make_dirs(h)
            shutil.rmtree(h.model_path)
            shutil.copytree(model, h.model_path)
            pw = pwd.getpwnam(node.info.user)
            for q in [Path(h.model_path), *Path(h.model_path).rglob("*")]:
                os.chown(q, pw.pw_uid, pw.pw_gid)
        # the environment: exported (cached), delivered to n0 by the product; n1, n2 share it (stand-in)
        env = envbuild.export_env(a.image, "/usr/bin/python3", echo=print)
        fig["env"] = {"digest": env.image, "bytes": env.size, "export_s": env.build_s, "cached": env.cached}
        _rate(nodes, "10gbit")
        t0 = time.monotonic()
        d = deployer.deploy_env(hosts["n0"], env.path)
        fig["env"]["deliver_n0_s"] = round(time.monotonic() - t0, 1)
        _rate(nodes, "100mbit")
        hexd = env.image.removeprefix("venv:sha256:")
        h0 = hosts["n0"]
        src = Path(f"{h0.state_dir}/env/{hexd}")
        p = src
        while p != p.parent:  # n1, n2's users read n0's environment through the symlink
            os.chmod(p, os.stat(p).st_mode | 0o005)
            p = p.parent
        for k in (1, 2):
            h = hosts[f"n{k}"]
            pw = pwd.getpwnam(nodes[k].info.user)
            Path(f"{h.state_dir}/env").mkdir(exist_ok=True)
            os.symlink(src, f"{h.state_dir}/env/{hexd}")
            shutil.copy(f"{h0.state_dir}/deployed.json", f"{h.state_dir}/deployed.json")
            for q in (Path(f"{h.state_dir}/env"), Path(f"{h.state_dir}/deployed.json")):
                os.chown(q, pw.pw_uid, pw.pw_gid)
        merged = tmp / "merged.json"
        common = ["-i", str(inv), "--pipeline", str(pipeline), "--run", RUN]

        ext, ext_s = _cli("extract", "n0", "n1", "n2", *common, "--merged", str(merged))
        fig["fleet_extract"] = {"rc": ext.returncode, "wall_s": ext_s}
        print(ext.stdout[-3000:], ext.stderr[-2000:])
        if ext.returncode != 0:
            raise SystemExit("fleet extract failed")
        m = json.loads(merged.read_text())
        fig["fleet_extract"].update(samples=m["samples"], tokens=m["tokens"],
                                    shards=[{k: s[k] for k in ("host", "start", "end")} for s in m["fleet"]["shards"]])
        if a.extract_only:
            fig["what"] = ("extraction over three netns sandbox hosts (n0 serving the STAND-IN server, "
                           "n1 and n2 serving: none) against a one-host extract of the same prepared samples; real "
                           "pipeline environment and stages, tiny Llama target")
            fig["one_host"] = _one_host_compare(a.image, hosts, model, merged, tmp)
            print(json.dumps(fig["one_host"], indent=2))
            oh = fig["one_host"]
            ok = bool(oh.get("sample_ids_equal") and oh.get("tokens_equal")
                      and (oh.get("states") or {}).get("token_ids_equal")
                      and (oh.get("states") or {}).get("within_probe_tolerance"))
            return 0 if ok else 1
        train = ["train", "n0", "n1", "n2", *common, "--from-fleet", str(merged)]

        # 2. node 2 cannot reach node 0: refused by name, nothing stopped
        pids0 = standin_server_pids(PORT)
        assert pids0, "the stand-in server on n0 is not running"
        subprocess.run(["ip", "netns", "exec", nodes[2].link.ns, "ip", "route", "del", "default"], check=True)
        refused, refused_s = _cli(*train)
        subprocess.run(["ip", "netns", "exec", nodes[2].link.ns, "ip", "route", "add", "default", "via",
                        nodes[2].link.here_addr], check=True)
        said = " ".join(refused.stderr.split())  # the console wraps its lines
        fig["unreachable"] = {"rc": refused.returncode, "wall_s": refused_s, "message": said[-600:],
                              "serving_untouched": standin_server_pids(PORT) == pids0}
        print(json.dumps(fig["unreachable"], indent=2))
        assert refused.returncode == 1 and "n2 cannot reach the rendezvous" in said, said[-2000:]
        assert fig["unreachable"]["serving_untouched"]

        # 3. the multi-node train; node 1's trainer killed after node 0's checkpoint at --kill-at
        ckpt = Path(f"{h0.data_dir}/runs/{RUN}/train/checkpoints/step_{a.kill_at:08d}/state.json")
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "eagle3ops", *train], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + CLI_TIMEOUT_S
        while not ckpt.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        killed = _trainer_pids(nodes[1].link.ns)
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        kill_t = round(time.monotonic() - t0, 1)
        out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
        fig["killed_run"] = {"rc": proc.returncode, "wall_s": round(time.monotonic() - t0, 1), "kill_at_s": kill_t,
                             "killed_pids_on_n1": killed, "checkpoint_seen": ckpt.is_file(),
                             "message": " ".join(err.split())[-800:],
                             "serving_healthy_after": bool(standin_server_pids(PORT))}
        print(out[-4000:], err[-3000:])
        print(json.dumps(fig["killed_run"], indent=2))
        assert killed and proc.returncode == 1 and "node n1 failed first" in " ".join(err.split()), err[-2000:]

        # 4. one process on the union resumes the three-node checkpoint
        union = tmp / "union"
        shutil.copytree(f"{h0.data_dir}/runs/{RUN}", union, symlinks=False,
                        ignore=shutil.ignore_patterns("train", ".train.restart"))
        for k in (1, 2):
            hk = hosts[f"n{k}"]
            shutil.copytree(f"{hk.data_dir}/runs/{RUN}/extract/hidden", union / "extract/hidden", dirs_exist_ok=True)
        one = tmp / "one-resume"
        shutil.copytree(union, one)
        shutil.copytree(f"{h0.data_dir}/runs/{RUN}/train", one / "train")
        rc, log, secs = _container_train(a.image, one, h0.model_path, 1)
        man1 = json.loads((one / "train/manifest.json").read_text()) if rc == 0 else {}
        fig["one_process_resume"] = {"rc": rc, "wall_s": secs, "resumed_from_step": man1.get("resumed_from_step"),
                                     "steps": man1.get("steps"), "world_size": man1.get("world_size"),
                                     "final_loss": (man1.get("final_metrics") or {}).get("loss")}
        print(json.dumps(fig["one_process_resume"], indent=2))
        if rc != 0:
            print(log)

        # 5. the same command again: resumes on all three nodes and finishes
        again, again_s = _cli(*train)
        print(again.stdout[-4000:], again.stderr[-2000:])
        man = json.loads(Path(f"{h0.data_dir}/runs/{RUN}/train/manifest.json").read_text())
        fig["resumed_run"] = {"rc": again.returncode, "wall_s": again_s, "resumed_from_step": man["resumed_from_step"],
                              "steps": man["steps"], "world_size": man["world_size"],
                              "distributed": man["distributed"], "final_loss": man["final_metrics"]["loss"],
                              "offline_estimate": man["offline_estimate"], "steps_per_s": man["steps_per_s"],
                              "serving_healthy_after": bool(standin_server_pids(PORT))}
        print(json.dumps(fig["resumed_run"], indent=2))

        # 6. the reference: one node, three processes, from scratch on the union
        ref = tmp / "ref"
        shutil.copytree(union, ref)
        rc, log, secs = _container_train(a.image, ref, h0.model_path, 3)
        if rc != 0:
            print(log)
        refman = json.loads((ref / "train/manifest.json").read_text())
        a3 = _steps(Path(f"{h0.data_dir}/runs/{RUN}/train/metrics.jsonl"))
        r3 = _steps(ref / "train/metrics.jsonl")
        ranges = [(s["start"], s["end"]) for s in sorted(m["fleet"]["shards"], key=lambda s: s["start"])]
        in_own = all(ids is None or all(ranges[k][0] <= i < ranges[k][1] for i in ids)
                     for s in a3 for k, ids in enumerate(s["samples"]))
        epochs = {}
        for s in a3:
            epochs.setdefault(s["epoch"], []).extend(i for ids in s["samples"] if ids for i in ids)
        held = {int(i) for i in range(m["samples"])}
        complete = [e for e in epochs if e < max(epochs)]
        once = all(len(epochs[e]) == len(set(epochs[e])) for e in epochs)
        same_set = len({frozenset(epochs[e]) for e in complete}) <= 1
        fig["reference_one_node_three_processes"] = {
            "rc": rc, "wall_s": secs, "final_loss": refman["final_metrics"]["loss"], "steps": refman["steps"],
            "offline_estimate": refman["offline_estimate"]}
        fig["comparison"] = {
            "per_step_samples_equal": [s["samples"] for s in a3] == [s["samples"] for s in r3],
            "metrics_steps_once_in_order": [s["step"] for s in a3] == list(range(1, len(a3) + 1)),
            "steps_compared": len(a3),
            "final_loss_three_nodes": a3[-1]["loss"], "final_loss_one_node": r3[-1]["loss"],
            "final_loss_rel_diff": round(abs(a3[-1]["loss"] - r3[-1]["loss"]) / r3[-1]["loss"], 6),
            "every_rank_in_its_own_shard": in_own,
            "complete_epochs": len(complete), "each_sample_once_per_epoch": once and same_set,
            "samples_per_complete_epoch": len(epochs[complete[0]]) if complete else None,
            "training_samples": len(held) - refman["offline_estimate"]["held_out_samples"],
        }
        print(json.dumps(fig["comparison"], indent=2))
        ok = (fig["comparison"]["per_step_samples_equal"] and fig["comparison"]["final_loss_rel_diff"] <= 0.02
              and again.returncode == 0 and fig["one_process_resume"]["rc"] == 0)
    finally:
        for pid in standin_server_pids(PORT):
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        if not a.keep:
            fleet.down(3, **NET)
            shutil.rmtree(tmp, ignore_errors=True)
        fig["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        fig["ok"] = ok
        write_result(a.json, fig, indent=2)
        print(f"wrote {a.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
