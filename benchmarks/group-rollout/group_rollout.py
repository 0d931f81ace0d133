"""A serving group's release as its clients see it (NOT a CI test: real vLLM CPU serving on two hosts, real HAProxy,
tens of minutes): ``eagle3ops group rollout`` of a speculative release (canary gated → bake on live traffic → roll)
and then ``eagle3ops group rollback``, with one client streaming chat requests through the balancer the whole time.

Hosts (this machine; README.md beside this file): two sandbox hosts, each a real OpenSSH server on 127.0.0.1 checked
by host key (:func:`eagle3ops_dev.sandbox.up`, ``engine="none"``), ``b49a`` (port 2249) and ``b49b`` (port 2250).
Neither starts a Docker engine of its own: each host's ``docker_host`` is a socket in its sandbox folder forwarded
byte for byte to this machine's engine (``benchmarks/_shared/downtime.py``: :class:`DockerProxy`, shared with
``benchmarks/cycle-downtime``). Both serve the REAL target SmolLM2-135M-Instruct with
real vLLM 0.16 CPU (``deploy/sandbox-smollm2.yaml``'s serving, each its own container name and port), each serving
container on a core of its own (the inventory's ``serving.cpuset_cpus``: :data:`CPUSETS`), so that one host's restart
or gate cannot take the core the other host serves on; every release keeps the set (it recreates the live container)
and vLLM's default OpenMP binding follows it (recorded per phase: ``pinning``). ``--no-pin``: both on every CPU.

The balancer: Debian's HAProxy started by this script (:class:`eagle3ops_dev.haproxylocal.LocalHaproxy`: ``retries
0``, no ``retry-on``, ``option httpchk GET /health``), the group's ``balancer`` reaching its runtime API socket.

The client (:class:`downtime.ConcurrentProbe`): a streaming chat request through HAProxy started every 0.5 s, each on its own thread and
connection (at most 16 at once); a request fails on a connection error, a non-2xx status, a stream
without ``data: [DONE]``, or 30 s without a token. Per phase: failed requests by kind, the longest span without a
successful answer, each failure with the group step it fell in (the rollout's journal on the first host).

The speculative release: the committed SmolLM2 head (``benchmarks/gpu-head-smollm2/heads/``) with ``--head``, the
CPU stand-in serving image (``serving.speculative_image``, as ``make demo``). The canary's speed gate runs beside the
other host's load on the same 2 shared cores, so its verdict is reported, not decided on: the gate's margin is -0.9
through the test-only switch ``EAGLE3OPS_TEST_ALLOW_NEGATIVE_MARGIN=1`` (recorded); the acceptance floor and the
served-acceptance check apply as they are.

Usage (root; about 30-45 minutes on 2 shared cores)::

    nice .venv/bin/python benchmarks/group-rollout/group_rollout.py [--json benchmarks/group-rollout/group-rollout.json]

Writes the JSON after every phase (a partial file says where it stopped: ``stopped_at``, and the error).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks" / "_shared"))
from downtime import (MAX_IN_FLIGHT, PROBE_INTERVAL_S, PROMPTS, TOKEN_TIMEOUT_S, DockerProxy,  # noqa: E402
                      RecordLog, chat_request, ensure_proxy, iso, journal_spans, now, parse_iso, read_records)
from downtime import ConcurrentProbe as Probe  # noqa: E402
from downtime import analyse_failures as analyse  # noqa: E402
from lab import write_result  # noqa: E402

HERE = Path(__file__).resolve().parent
GROUP = "g49"
#: host -> (ssh port, serving port)
HOSTS = {"b49a": (2249, 18049), "b49b": (2250, 18050)}
#: host -> the CPUs its serving container may use (``serving.cpuset_cpus``): one core each on the 2-core machine.
CPUSETS = {"b49a": "0", "b49b": "1"}
#: ``nice`` of the ``eagle3ops group`` driver (:meth:`Bench.group`).
DRIVER_NICE = 10
LOCAL_BASE = "eagle3ops/vllm-openai-local:v0.16.0"
#: Where the sandbox hosts keep their state (``deploy/sandbox-smollm2.yaml``'s ``state_dir``), for a JSON written
#: before it recorded ``state_dirs``.
STATE_BASE = Path("/var/lib/eagle3ops-sandbox")
BUILT_TARGET = Path("/var/lib/eagle3ops-sandbox/sandbox/data/models/smollm2-135m-instruct")
HEAD = REPO / "benchmarks/gpu-head-smollm2/heads/smollm2-135m-instruct-eagle3"
GATE_MARGIN = -0.9
#: The gate's most time to first token over the baseline's (``serving.gate_ttft_ratio_max``; 1.5 by default): high, so
#: that this speed verdict is reported, not decided on, as the throughput's (:data:`GATE_MARGIN`).
GATE_TTFT_RATIO_MAX = 100.0
#: The speculative release's serving image as the demo tags it (the CPU stand-in).
STANDIN_IMAGE = "eagle3ops/serving:sandbox-cpu-standin"
#: Tags only this benchmark uses, on the very images it deployed: the engine is shared with other checkouts, whose
#: builds move the common tags (the pipeline image's content tag carries its checkout's commit as a label, so two
#: commits give two ids under one tag) and the canary's preflight would then find another image than the deployed one.
PRIVATE_SPEC = "eagle3ops/serving:b49-standin"


def private_pipeline(host: str) -> str:
    """The pipeline image tag of ``host`` in this benchmark (:data:`PRIVATE_SPEC`'s reason)."""
    return f"eagle3ops/pipeline:b49-{host}"


def docker_tag(source: str, tag: str) -> str:
    """``docker tag SOURCE TAG`` on this machine's engine; returns the id now under ``tag``."""
    subprocess.run(["docker", "tag", source, tag], check=True, capture_output=True, timeout=60)
    return subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], check=True,
                          capture_output=True, text=True, timeout=60).stdout.strip()
#: The test-only switch that lets the inventory hold that margin (read by every load of it, in here and in the
#: ``eagle3ops group`` subprocesses).
os.environ["EAGLE3OPS_TEST_ALLOW_NEGATIVE_MARGIN"] = "1"


#: The journal events that end a step.
STEP_ENDS = ("done", "failed", "busy")


def steps_of(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rollout journal's steps in the order they started: name, start and end (the journal's ISO times, whole
    seconds), seconds, how it ended (one of :data:`STEP_ENDS`, ``None`` while unfinished) and, unless done, the
    entry's other fields (``detail``)."""
    out: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}
    for e in entries:
        step, ev = e.get("step"), e.get("event")
        if step is None:
            continue
        if ev == "start":
            open_[step] = {"step": step, "start": e["t"], "end": None, "seconds": None, "outcome": None}
            out.append(open_[step])
        elif ev in STEP_ENDS and step in open_:
            s = open_.pop(step)
            s.update(end=e["t"], outcome=ev, seconds=round(parse_iso(e["t"]) - parse_iso(s["start"]), 1))
            if ev != "done":
                s["detail"] = {k: v for k, v in e.items() if k not in ("t", "step", "event")}
    return out


def out_intervals(entries: list[dict[str, Any]], end: float) -> list[tuple[str, float, float]]:
    """When each host was out of the balancer: ``(host, from, to)`` from its ``HOST:drain`` step's start to its
    ``HOST:undrain`` step's end (epoch seconds; ``end`` while not undrained), read from the rollout journal."""
    out, since = [], {}
    for e in entries:
        host, _, action = str(e.get("step", "")).partition(":")
        if action == "drain" and e.get("event") == "start":
            since[host] = parse_iso(e["t"])
        elif action == "undrain" and e.get("event") in STEP_ENDS and host in since:
            out.append((host, since.pop(host), parse_iso(e["t"])))
    out += [(h, t, end) for h, t in since.items()]
    return out


def spans_by_hosts_in(records: list[dict[str, Any]], start: float, end: float,
                      outs: list[tuple[str, float, float]]) -> dict[str, Any]:
    """The spans without a successful answer over 1 s in ``[start, end]`` (between the ends of successful requests
    that end in it, whenever they began: unlike :func:`downtime.analyse_failures`, which counts the requests begun in
    it, so that its first span lasts as long as one answer takes) split by whether a host was out of the balancer
    during the span (:func:`out_intervals`) or every host was in: a span while every host was in measures the
    serving's answer times on this machine, not the rollout."""
    ends = [start] + sorted(r["t1"] for r in records if r["ok"] and start <= r["t1"] <= end) + [end]
    gaps = [(a, b) for a, b in zip(ends, ends[1:]) if b - a > 1.0]
    with_out = [(a, b) for a, b in gaps if any(f < b and a < t for _, f, t in outs)]
    all_in = [g for g in gaps if g not in with_out]
    return {"spans_over_1s_with_a_host_out": len(with_out),
            "longest_span_with_a_host_out_s": round(max((b - a for a, b in with_out), default=0.0), 2),
            "longest_span_with_a_host_out_from": iso(max(with_out, key=lambda g: g[1] - g[0])[0]) if with_out else None,
            "longest_span_without_answer_s": round(max((b - a for a, b in zip(ends, ends[1:]))), 2),
            "spans_over_1s_with_every_host_in": len(all_in),
            "longest_span_with_every_host_in_s": round(max((b - a for a, b in all_in), default=0.0), 2),
            "hosts_out": [{"host": h, "from": iso(f), "seconds": round(t - f, 1)} for h, f, t in outs]}


def window_steps(state_dirs: dict[str, str], start: float, end: float) -> list[dict[str, Any]]:
    """The steps of every host window (``<state_dir>/windows/*/journal.jsonl``: the canary's speculate job, each
    switch's release or rollback window) that overlap ``[start, end]``: host, window (its folder's name), step, from,
    to (ISO), seconds; a step runs from its ``start`` entry to the next ``ok``/``failed``/``done`` of the same step
    (the journals' ``epoch`` field). Nested steps (a restart's ``health`` inside ``control``) are listed each."""
    out: list[dict[str, Any]] = []
    for host, sd in state_dirs.items():
        for j in sorted(Path(sd, "windows").glob("*/journal.jsonl")):
            open_: dict[str, float] = {}
            for line in j.read_text().splitlines():
                e = json.loads(line) if line.strip() else {}
                step, ev, t = e.get("step"), e.get("event"), e.get("epoch")
                if step is None or t is None:
                    continue
                if ev == "start":
                    open_[step] = float(t)
                elif ev in ("ok", "failed", "done") and step in open_:
                    t0 = open_.pop(step)
                    if t >= start and t0 <= end:
                        out.append({"host": host, "window": j.parent.name, "step": step, "from": iso(t0),
                                    "to": iso(float(t)), "seconds": round(float(t) - t0, 1)})
    return sorted(out, key=lambda w: w["from"])


def spans_by_step(records: list[dict[str, Any]], start: float, end: float, group_steps: list[dict[str, Any]],
                  windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every span over 1 s without a successful answer in ``[start, end]`` (as :func:`spans_by_hosts_in`: between
    the ends of successful requests) with the group step it began in (the client's ``steps``: name, from, seconds)
    and the host window steps running when it began (:func:`window_steps`, as ``HOST:STEP``); per group step and per
    outermost window step (the earliest-started one running; ``none``: no window step ran): how many, the longest
    and their sum, seconds."""
    ends = [start] + sorted(r["t1"] for r in records if r["ok"] and start <= r["t1"] <= end) + [end]
    spans = []
    for a, b in zip(ends, ends[1:]):
        if b - a <= 1.0:
            continue
        g = [s["name"] for s in group_steps if parse_iso(s["from"]) <= a <= parse_iso(s["from"]) + s["seconds"]]
        w = [f"{x['host']}:{x['step']}" for x in windows if parse_iso(x["from"]) <= a <= parse_iso(x["to"])]
        spans.append({"from": iso(a), "seconds": round(b - a, 2), "group_step": g[-1] if g else None,
                      "window_steps": w})

    def summary(key: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for sp in spans:
            k = key(sp) or "none"
            d = out.setdefault(k, {"spans": 0, "longest_s": 0.0, "total_s": 0.0})
            d["spans"] += 1
            d["longest_s"] = max(d["longest_s"], sp["seconds"])
            d["total_s"] = round(d["total_s"] + sp["seconds"], 2)
        return out

    return {"spans": spans, "by_group_step": summary(lambda sp: sp["group_step"]),
            "by_window_step": summary(lambda sp: sp["window_steps"][0] if sp["window_steps"] else None)}


def reanalyse(path: Path) -> int:
    """Recompute the client's figures of a run's JSON from its records file (``client_records`` beside it) and write
    it again: each phase's spans split by hosts in (:func:`spans_by_hosts_in`), each span over 1 s with the group
    step and the host window steps it began in (:func:`spans_by_step`; the windows' steps as ``windows``: a host's
    state journals, read at this time, so run it on the machine that ran the benchmark) and the client's view before the
    rollout began (both hosts serving, nothing out). For a JSON written before these figures existed."""
    fig = json.loads(path.read_text())
    records = [r for r in read_records(path.parent / fig["client_records"]) if "event" not in r]
    for phase in ("rollout", "rollback"):
        if phase not in fig:
            continue
        st = fig[phase].get("status") or {}
        if "output" in st and "\n{" in st["output"]:  # printed before `status --json` kept stdout to its JSON alone
            fig[phase]["status"] = {**json.loads(st["output"][st["output"].index("\n{") + 1:]),
                                    "parsed_from": "its output after the host reads' echo"}
        c = fig[phase]["client"]
        a, b = parse_iso(c["from"]), parse_iso(c["to"])
        c["by_hosts_in"] = spans_by_hosts_in(records, a, b, out_intervals(fig[phase]["journal"], b))
        dirs = fig.get("state_dirs") or {n: str(STATE_BASE / n / "state") for n in HOSTS}
        fig[phase]["windows"] = window_steps(dirs, a, b)
        c["by_step"] = spans_by_step(records, a, b, c.get("steps") or [], fig[phase]["windows"])
    if records and "rollout" in fig:
        fig["before_rollout"] = {"client": analyse(records, min(r["t0"] for r in records),
                                                   parse_iso(fig["rollout"]["client"]["from"]), [])}
    for phase, v in (fig.get("verdict") or {}).items():
        v.update({k: fig[phase]["client"]["by_hosts_in"][k] for k in
                  ("spans_over_1s_with_a_host_out", "longest_span_with_a_host_out_s",
                   "spans_over_1s_with_every_host_in", "longest_span_with_every_host_in_s")})
    fig["reanalysed"] = iso(now())
    write_result(path, fig, indent=2, default=str)
    print(f"[bench] rewrote {path} from {fig['client_records']}", flush=True)
    return 0


def inventory(info: dict[str, Any], socket_path: Path, acceptance_floor: float, pin: bool = True) -> str:
    """Both hosts = ``deploy/sandbox-smollm2.yaml``'s sandbox entry (the demo's serving settings), each with its own
    container name, serving port and (``pin``) CPU set (:data:`CPUSETS`), the gate's margin :data:`GATE_MARGIN`
    (module doc) at concurrency 1 only (the second level would double the gate's time on these cores),
    ``acceptance_floor`` as the gate's floor and the bake's; the group of both behind the local HAProxy."""
    text = (REPO / "deploy/sandbox-smollm2.yaml").read_text()
    hosts = {}
    for name, (ssh, port) in HOSTS.items():
        t = (text.replace("${EAGLE3OPS_SANDBOX:-sandbox}", name)
             .replace("${EAGLE3OPS_SANDBOX_SSH_PORT:-2222}", str(ssh))
             .replace("${EAGLE3OPS_SANDBOX_SERVING_PORT:-18000}", str(port)))
        e = yaml.safe_load(t)["hosts"]["sandbox"]
        e["identity_file"], e["known_hosts"] = str(info[name].identity_file), str(info[name].known_hosts)
        e["docker_host"] = f"unix://{info[name].root / 'docker.sock'}"
        e["serving"]["container"] = f"{name}-vllm"
        if pin:
            e["serving"]["cpuset_cpus"] = CPUSETS[name]
        e["pipeline_image"] = private_pipeline(name)
        e["serving"]["speculative_image"] = PRIVATE_SPEC
        e["serving"]["gate_margin"] = GATE_MARGIN
        # the gate's time-to-first-token limit is a speed verdict too (reported, not decided on: module doc); on a
        # core of its own the speculative release's first token came x1.55 of the baseline's (16:48 run)
        e["serving"]["gate_ttft_ratio_max"] = GATE_TTFT_RATIO_MAX
        e["serving"]["gate_concurrency"] = [1]
        # the bake's acceptance floor: the host's acceptance floor, not `break-even` (the gate's speed ratio on
        # shared cores, which this benchmark reports and does not decide on)
        e["serving"]["acceptance_floor"] = acceptance_floor
        e["serving"]["watch"] = {"acceptance_floor": acceptance_floor}
        hosts[name] = e
    groups = {GROUP: {"hosts": list(HOSTS), "max_out": 1,
                      "balancer": {"kind": "haproxy", "socket": str(socket_path), "backend": "vllm",
                                   "servers": {n: n for n in HOSTS}, "timeout_s": 10}}}
    return yaml.safe_dump({"hosts": hosts, "groups": groups}, sort_keys=False)


class Bench:
    """One run: setup, the client, the rollout, the rollback, the figures (written after each phase)."""

    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.fig: dict[str, Any] = {
            "what": "a serving group's speculative rollout (canary -> bake -> roll) and its rollback, as a client "
                    "streaming chat requests through HAProxy sees them",
            "started": iso(now()), "cpu": None, "cores": os.cpu_count(),
            "settings": {"probe_interval_s": PROBE_INTERVAL_S, "token_timeout_s": TOKEN_TIMEOUT_S,
                         "probe_max_tokens": a.max_tokens, "probe_max_in_flight": MAX_IN_FLIGHT,
                         "acceptance_floor": a.acceptance_floor, "bake_s": a.bake, "bake_interval_s": a.bake_interval,
                         "gate_margin": GATE_MARGIN, "gate_ttft_ratio_max": GATE_TTFT_RATIO_MAX,
                         "gate_concurrency": [1], "max_out": 1,
                         "serving_cpuset_cpus": None if a.no_pin else CPUSETS, "driver_nice": DRIVER_NICE,
                         "haproxy": "retries 0, no retry-on, option httpchk GET /health, check inter "
                                    f"{a.check_inter_ms} ms fall 2 rise 1, balance roundrobin"},
            "hosts": "two sandbox hosts (real sshd on 127.0.0.1, host keys checked), one Docker engine (this "
                     "machine's) behind each host's own socket; both serve real vLLM 0.16 CPU SmolLM2-135M-Instruct",
            "stand_ins": ["the speculative release's serving image is the CPU stand-in "
                          "(eagle3ops/serving:sandbox-cpu-standin, as make demo)",
                          "the local CPU vLLM base stands in for vllm/vllm-openai:v0.16.0 (as make demo)",
                          "the gate's margin is -0.9 through the test-only switch and its time-to-first-token limit "
                          f"x{GATE_TTFT_RATIO_MAX:g}: its speed verdict is reported, not decided on (both hosts share "
                          "one machine)"],
        }
        self.stopped_at = "setup"
        self.probe: Probe | None = None
        self.haproxy: Any = None

    def write(self) -> None:
        self.fig["stopped_at"] = self.stopped_at
        self.fig["finished"] = iso(now())
        if self.probe is not None:
            ld = [x for _, x in self.probe.load]
            self.fig["load_average_1min"] = {"samples": len(ld), "mean": round(sum(ld) / len(ld), 2) if ld else None,
                                             "max": max(ld) if ld else None,
                                             "note": "this machine's 2 cores are shared with other sessions' work"}
        self.a.json.parent.mkdir(parents=True, exist_ok=True)
        write_result(self.a.json, self.fig, indent=2, default=str)
        print(f"[bench] wrote {self.a.json} (stopped_at {self.stopped_at})", flush=True)

    def setup(self) -> None:
        from eagle3ops import deployer
        from eagle3ops.config import load_inventory
        from eagle3ops_dev import demo, sandbox
        from eagle3ops_dev.haproxylocal import LocalHaproxy

        self.fig["cpu"] = demo.cpu_model()
        info = {n: sandbox.up(n, ssh, engine="none") for n, (ssh, _) in HOSTS.items()}
        self.fig["docker_proxy"] = ensure_proxy([sandbox.SANDBOX_BASE / n / "docker.sock" for n in HOSTS], __file__,
                                                sandbox.SANDBOX_BASE / next(iter(HOSTS)) / "docker-proxy.log")
        self.work_dir = Path(f"/tmp/b49-{time.strftime('%Y%m%dT%H%M%S')}")
        self.work_dir.mkdir()
        self.haproxy = LocalHaproxy(self.work_dir / "haproxy", {n: port for n, (_, port) in HOSTS.items()},
                                    check_inter_ms=self.a.check_inter_ms)
        self.inv = self.work_dir / "hosts.yaml"
        self.inv.write_text(inventory(info, self.haproxy.admin_socket, self.a.acceptance_floor,
                                      pin=not self.a.no_pin))
        inv = load_inventory(self.inv)
        self.hosts = [inv.host(n) for n in HOSTS]
        self.fig["state_dirs"] = {h.name: h.state_dir for h in self.hosts}
        pw = pwd.getpwnam(info[next(iter(HOSTS))].user)
        for h in self.hosts:
            for d in (h.data_dir, h.state_dir, str(Path(h.model_path).parent)):
                Path(d).mkdir(parents=True, exist_ok=True)
                os.chown(d, pw.pw_uid, pw.pw_gid)
            model = Path(h.model_path)
            if not (model / "config.json").exists():
                if not ((BUILT_TARGET / "config.json").exists()
                        and demo.target_kind(BUILT_TARGET) == demo.DEMO_TARGET):
                    raise RuntimeError(f"{BUILT_TARGET}: the demo's SmolLM2 target is not built there (make demo "
                                       "builds it)")
                shutil.copytree(BUILT_TARGET, model)
                for p in [model, *model.rglob("*")]:
                    os.chown(p, pw.pw_uid, pw.pw_gid)
        self.fig["target"] = json.loads((Path(self.hosts[0].model_path) / "eagle3ops-target.json").read_text())
        self.fig["target_path"] = f"copied from {BUILT_TARGET}"
        # Serving is provisioned afresh below, labelled release 1 (as the demo does); a state dir kept from an earlier
        # run may call release 1 current, and the canary's first restart then recreated that run's record, not the
        # live container (the 16:45 run: b49a on every CPU after its gate). With no current release, the first
        # window records the live container as a new release.
        for h in self.hosts:
            Path(h.state_dir, "releases", "current").unlink(missing_ok=True)
        # both at once (each on its own core when pinned), from the inventory: a container left by an earlier run
        # (another CPU set) is replaced
        with ThreadPoolExecutor(len(self.hosts)) as pool:
            took = pool.map(lambda h: demo.start_serving(h, restart=True), self.hosts)
            started = dict(zip((h.name for h in self.hosts), took))
        self.fig["serving_start_s"] = {n: round(t, 1) for n, t in started.items()}
        self.fig.setdefault("pinning", {})["setup"] = self.pinning()
        self.fig["warm_up"] = self.warm_up()
        self.fig["speculative_image"] = {"tag": PRIVATE_SPEC, "of": STANDIN_IMAGE,
                                         "id": docker_tag(STANDIN_IMAGE, PRIVATE_SPEC)}
        for h in self.hosts:
            t = now()
            dep = deployer.deploy(h, base_image=LOCAL_BASE, echo=print)
            self.fig.setdefault("deploy_s", {})[h.name] = round(now() - t, 1)
            # the id deploy recorded, under this benchmark's own tag (PRIVATE_SPEC's reason)
            deployed = json.loads((Path(h.state_dir) / "deployed.json").read_text())
            self.fig.setdefault("pipeline_image", {})[h.name] = {
                "tag": private_pipeline(h.name), "of": dep.tag,
                "id": docker_tag(deployed["image_id"], private_pipeline(h.name))}
        self.haproxy.start(timeout_s=30)
        self.fig["haproxy"] = {"version": subprocess.run([self.haproxy_exe(), "-v"], capture_output=True,
                                                         text=True).stdout.splitlines()[0],
                               "config": (self.haproxy.workdir / "haproxy.cfg").read_text()}
        self.url = f"http://127.0.0.1:{self.haproxy.port}"

    def warm_up(self) -> dict[str, Any]:
        """Each of the client's prompts once to each host's own port, before the client starts: a fresh vLLM answers
        its first requests slower (the earlier runs' only span over 1 s with every host in came in their first
        seconds), which is the server's start, not the rollout. Returns each host's answer seconds."""
        import httpx

        out: dict[str, Any] = {}
        for h in self.hosts:
            with httpx.Client(timeout=TOKEN_TIMEOUT_S) as client:
                recs = [chat_request(client, f"http://127.0.0.1:{h.serving.port}", h.serving.served_model_name or "",
                                     p, self.a.max_tokens) for p in PROMPTS]
            out[h.name] = {"ok": sum(r["ok"] for r in recs), "answer_s": [round(r["t1"] - r["t0"], 3) for r in recs]}
        return out

    def pinning(self) -> dict[str, Any]:
        """Each host's serving container as the engine runs it now: its ``HostConfig.CpusetCpus`` (empty: every
        CPU), its image, and vLLM's own line naming the CPUs it bound its OpenMP threads to (``auto thread-binding
        list``, from the container's log: the release that created it)."""
        from eagle3ops import executor
        from eagle3ops.commands import docker as dk

        out: dict[str, Any] = {}
        for h in self.hosts:
            try:
                with executor.for_host(h) as r:
                    fmt = "{{.HostConfig.CpusetCpus}}|{{.Config.Image}}|{{.State.StartedAt}}"
                    cpus, image, started = (r.run(dk.inspect_format(h, h.serving.container, fmt),
                                                  check=False).stdout.strip().split("|") + ["", "", ""])[:3]
                    # the whole log: the lines come at start-up, and uvicorn logs a line per request after them
                    log = r.run(dk.logs(h, h.serving.container), check=False)
                # vLLM's worker: the auto binding's choice, then the OpenMP threads as bound (``OMP tid``)
                bind = [ln.strip()[-240:] for ln in (log.stdout + log.stderr).splitlines()
                        if "thread-binding list" in ln or "OMP tid" in ln]
                out[h.name] = {"cpuset_cpus": cpus or "every CPU", "image": image, "started": started,
                               "vllm_binding": bind[-4:]}
            except Exception as exc:  # noqa: BLE001 - a figure, not the run's outcome
                out[h.name] = {"error": f"{type(exc).__name__}: {exc}"}
        return out

    @staticmethod
    def haproxy_exe() -> str:
        from eagle3ops_dev.haproxylocal import haproxy_binary

        return haproxy_binary() or "haproxy"

    def group(self, phase: str, args: list[str]) -> None:
        """``eagle3ops group ARGS`` as a subprocess (its log kept), the client's view of it, the journal's steps."""
        # the driver at a lower priority than the serving and the client: it only orders the steps (the hosts'
        # supervisors do them), and its start-up and polling would otherwise share the core of the host that serves
        cmd = ["nice", "-n", str(DRIVER_NICE), sys.executable, "-m", "eagle3ops", "group", *args, "--inventory",
               str(self.inv)]
        env = dict(os.environ)
        t_start = now()
        log = self.work_dir / f"{phase}.log"
        last: dict[str, Any] = {}
        with log.open("w") as lf:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                    cwd=REPO, env=env)
            assert proc.stdout is not None
            for line in proc.stdout:
                lf.write(line)
                lf.flush()
                print(f"[{phase}] {line}", end="", flush=True)
                if line.startswith("{"):
                    try:
                        last = json.loads(line)
                    except ValueError:
                        pass
            rc = proc.wait()
        end = now()
        entries = self.journal()
        # a step ends at its done/failed/busy entry (a bake's readings are entries of their own in between)
        spans = journal_spans(entries, end, closing=lambda e: e.get("event") in STEP_ENDS)
        self.fig[phase] = {"command": " ".join(["eagle3ops", "group", *args]), "rc": rc, "result": last,
                           "log_tail": log.read_text()[-3000:], "steps": steps_of(entries),
                           "status": self.status(), "journal": entries,
                           "client": analyse(self.probe.records if self.probe else [], t_start, end, spans),
                           "client_starts_skipped_total": self.probe.skipped if self.probe else None}
        self.fig.setdefault("pinning", {})[phase] = self.pinning()
        if rc != 0:
            raise RuntimeError(f"eagle3ops group {args[0]} exited {rc} (log {log})")

    def status(self) -> Any:
        """``eagle3ops group status GROUP --json`` as it printed it (its output's text when that is not JSON)."""
        p = subprocess.run([sys.executable, "-m", "eagle3ops", "group", "status", GROUP, "--json", "--inventory",
                            str(self.inv)], capture_output=True, text=True, cwd=REPO, timeout=120)
        try:
            return json.loads(p.stdout)
        except ValueError:
            return {"rc": p.returncode, "output": (p.stdout + p.stderr)[-2000:]}

    def journal(self) -> list[dict[str, Any]]:
        d = Path(self.hosts[0].state_dir) / "groups" / GROUP
        cur = d / "current.json"
        if not cur.exists():
            return []
        rid = json.loads(cur.read_text())["id"]
        j = d / "rollouts" / rid / "journal.jsonl"
        return [json.loads(x) for x in j.read_text().splitlines() if x.strip()] if j.exists() else []

    def canary_gate(self, run: str) -> dict[str, Any]:
        """The canary's gate result (reported, not decided on: module doc)."""
        found = []
        for h in self.hosts:
            found += sorted(Path(h.data_dir, "runs", run, "speculate").rglob("result.json"),
                            key=os.path.getmtime)
        if not found:
            return {}
        sp = json.loads(found[-1].read_text())
        keys = ("verdict", "reason", "restarts_s", "wall_s", "live_release", "speedup", "gate")
        out = {k: sp.get(k) for k in keys if k in sp}
        out["file"] = str(found[-1])
        out["mean_acceptance_length"] = (sp.get("spec_decode") or {}).get("mean_acceptance_length")
        out["note"] = ("measured beside the other host's live traffic on the same 2 shared cores (and other sessions' "
                       "work): reported, not decided on (gate margin -0.9)")
        return out

    def main(self) -> int:
        try:
            self.setup()
            self.write()
            # the client's records as they are made, beside the JSON: a killed run keeps them
            records = self.a.json.with_suffix(".client.jsonl")
            records.unlink(missing_ok=True)
            self.fig["client_records"] = records.name
            self.probe = Probe(self.url, self.hosts[0].serving.served_model_name or "", self.a.max_tokens,
                               RecordLog(records))
            self.probe.start()
            time.sleep(10)
            run = f"g49-{time.strftime('%m%dT%H%M%S')}"
            self.stopped_at = "rollout"
            try:
                self.group("rollout", ["rollout", GROUP, "--run", run, "--head", str(HEAD), "--force",
                                       "--control", "--accept-low-power", "--bake", str(self.a.bake), "--bake-interval",
                                       str(self.a.bake_interval), "--drain-timeout", "900", "--out-wait", "900"])
            finally:
                self.fig["canary_gate"] = self.canary_gate(run)
            self.write()
            self.stopped_at = "rollback"
            self.group("rollback", ["rollback", GROUP, "--drain-timeout", "900", "--out-wait", "900"])
            time.sleep(5)
            self.stopped_at = None
            self.fig["verdict"] = {
                phase: {"failed_requests": self.fig[phase]["client"]["failed_requests"],
                        "longest_span_without_answer_s": self.fig[phase]["client"]["longest_span_without_answer_s"],
                        "no_span_over_1s": self.fig[phase]["client"]["longest_span_without_answer_s"] <= 1.0,
                        "outcome": (self.fig[phase]["result"] or {}).get("outcome")}
                for phase in ("rollout", "rollback")}
            return 0
        except BaseException as exc:  # noqa: BLE001 - the partial figures are written with where it stopped
            self.fig["error"] = f"{type(exc).__name__}: {exc}"
            self.fig["traceback"] = traceback.format_exc()[-4000:]
            traceback.print_exc()
            return 1
        finally:
            if self.probe is not None:
                self.probe.stop.set()
                self.probe.join(timeout=60)
            self.write()
            if self.probe is not None:  # the figures split by hosts in, from the records file (as --reanalyse)
                try:
                    reanalyse(self.a.json)
                except Exception:  # noqa: BLE001 - the figures written above stay; --reanalyse can redo this
                    traceback.print_exc()
            if not self.a.keep:
                self.cleanup()

    def cleanup(self) -> None:
        """HAProxy stopped, both hosts' serving containers removed (the 2 cores are shared with other work) and this
        benchmark's own image tags removed (the images keep their other tags; the next run tags them again)."""
        if self.haproxy is not None:
            self.haproxy.stop()
        subprocess.run(["docker", "image", "rm", PRIVATE_SPEC, *(private_pipeline(n) for n in HOSTS)],
                       capture_output=True, timeout=120, check=False)
        from eagle3ops import executor
        from eagle3ops.commands import docker as dk

        for h in getattr(self, "hosts", []):
            try:
                with executor.for_host(h) as r:
                    r.run(dk.rm(h, h.serving.container, force=True), check=False)
            except Exception as exc:  # noqa: BLE001 - cleanup must not hide the run's own error
                print(f"[bench] {h.name}: serving not removed: {exc}", flush=True)


def main() -> int:
    if sys.argv[1:] == ["--proxy"]:
        from eagle3ops_dev import sandbox

        asyncio.run(DockerProxy([sandbox.SANDBOX_BASE / n / "docker.sock" for n in HOSTS]).serve())
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=HERE / "group-rollout.json")
    ap.add_argument("--bake", type=float, default=60.0, help="the canary's bake, seconds (the default 600 of "
                    "`group rollout` is sized for production)")
    ap.add_argument("--bake-interval", type=float, default=15.0, help="seconds between the bake's readings")
    ap.add_argument("--check-inter-ms", type=int, default=2000, help="HAProxy's health check interval (ms); also its "
                    "check's timeout (no `timeout check`): sized for a loaded machine")
    ap.add_argument("--max-tokens", type=int, default=16, help="the client's answer length, tokens (the bake judges "
                    "the canary's acceptance on this traffic)")
    ap.add_argument("--acceptance-floor", type=float, default=1.15, help="the gate's and the bake's acceptance floor "
                    "(mean acceptance length; the demo's 1.3 refused this head at 1.255 on the canary, which is a "
                    "verdict on the head, not what this benchmark measures)")
    ap.add_argument("--no-pin", action="store_true", help="no `serving.cpuset_cpus`: both serving containers on "
                    "every CPU (as the runs before the pinning)")
    ap.add_argument("--keep", action="store_true", help="leave HAProxy running at the end")
    ap.add_argument("--reanalyse", action="store_true", help="only recompute the client's figures of --json from "
                    "its records file (no run)")
    a = ap.parse_args()
    return reanalyse(a.json) if a.reanalyse else Bench(a).main()


if __name__ == "__main__":
    sys.exit(main())
