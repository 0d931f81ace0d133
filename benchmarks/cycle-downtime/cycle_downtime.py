"""Production's downtime as its clients see it (NOT a CI test: real vLLM CPU serving, real stages, tens of minutes):
today's two-window cycle (extract window + train window + speculate, as ``make demo`` runs them) against
``eagle3ops cycle PRODUCTION --work WORK`` (extract and train on the work host, the head's served acceptance there,
production restarted only by the speed gate), both in one run, with one client streaming chat requests to production
the whole time.

Hosts (this machine; see README.md beside this file): two sandbox hosts, each a real OpenSSH server on 127.0.0.1
checked by host key (:func:`eagle3ops_dev.sandbox.up`, ``engine="none"``): ``b47prod`` (production, port 2247) and
``b47work`` (the work host, port 2248, ``serving: none``). Neither starts a Docker engine of its own (three full
engines do not fit this machine's disk): each host's ``docker_host`` is a socket in its sandbox folder
(``/var/lib/eagle3ops-sandbox/<name>/docker.sock``, group ``e3ops``) that this script forwards byte for byte to this
machine's Docker engine (:class:`DockerProxy`), where the images already are. So both hosts share one engine, one
image store, one CPU (2 cores here) and one disk: a rented work host would have its own.

Production serves the REAL target, SmolLM2-135M-Instruct (the demo's, copied from the ``sandbox`` sandbox when built
there, else built as ``make demo`` builds it), with real vLLM 0.16 CPU (``eagle3ops/vllm-openai-local:v0.16.0``, the
demo's serving container with the settings of ``deploy/sandbox-smollm2.yaml``); the stages are the real ones of the
pipeline image (a manifest that says ``standin`` fails the benchmark). Sizes: the demo's settings, fewer
conversations and train steps (``--conversations``, ``--train-steps``: recorded) so one run fits. Production's
``serving.acceptance_floor`` is lowered to ``--floor`` (default 1.0, recorded): the demo's head measured 1.14 against
the floor 1.3, and a cycle whose head stays below the floor ends before production is restarted (that path has its
own test); the benchmark is about the restarts.

The client (:class:`downtime.SerialProbe`, its records written as they are made to ``cycle-downtime.records.jsonl``
beside the JSON): one streaming chat request at a time to production's port, a new one every 0.5 s (the
next starts when the last ended if that took longer); a request fails on a connection error, a non-2xx status, a
stream without ``data: [DONE]``, or 30 s without a token. Per phase: failed requests by kind, the longest span
without a successful answer, production's seconds not answering (from the first failed request of an outage to the
start of the next successful one), each outage with the step it fell in (the cycle's journal on production; the
baseline's own markers). The cycle's plan (``cycle --dry-run --json``, printed before the cycle ran) gives the
expected downtime; the speculate job's result gives its restarts.

Usage (root; about 45 minutes on 2 cores with the default sizes)::

    .venv/bin/python benchmarks/cycle-downtime/cycle_downtime.py [--json benchmarks/cycle-downtime/cycle-downtime.json]

Writes the JSON after every phase (a partial file says where it stopped: ``stopped_at``).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import pwd
import shutil
import subprocess
import sys
import threading
import time
import traceback
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks" / "_shared"))
from downtime import (PROBE_INTERVAL_S, TOKEN_TIMEOUT_S, DockerProxy, RecordLog, SerialProbe,  # noqa: E402
                      analyse_outages, ensure_proxy, iso, journal_spans, load_figures, now, read_records)
from lab import write_result  # noqa: E402

HERE = Path(__file__).resolve().parent
PROD, WORK = "b47prod", "b47work"
SSH_PORTS = {PROD: 2247, WORK: 2248}
SERVING_PORT = 18047
LOCAL_BASE = "eagle3ops/vllm-openai-local:v0.16.0"
BUILT_TARGET = Path("/var/lib/eagle3ops-sandbox/sandbox/data/models/smollm2-135m-instruct")
#: The STAND-IN balancer's port (:class:`Balancer`): production's drain_hook / undrain_hook call it.
BALANCER_PORT = 18147


class Balancer:
    """A STAND-IN load balancer in front of production (one backend): ``POST /drain`` takes the client off production,
    ``POST /undrain`` puts it back; production's ``serving.drain_hook`` / ``undrain_hook`` call them (run by the
    speculate job's supervisor, host network), so the gate measures an idle server as it requires
    (:func:`eagle3ops.gate.replay.wait_idle`). ``events``: (time, "drain"|"undrain"), each also a marker in ``log``
    (the client's records file) when given."""

    def __init__(self, port: int = BALANCER_PORT, log: RecordLog | None = None):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.events: list[tuple[float, str]] = []
        self.drained = threading.Event()
        bal = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                what = self.path.strip("/")
                if what not in ("drain", "undrain"):
                    self.send_response(404)
                    self.end_headers()
                    return
                (bal.drained.set if what == "drain" else bal.drained.clear)()
                bal.events.append((now(), what))
                if log is not None:
                    log.mark(what)
                print(f"[bench] balancer: {what}", flush=True)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True, name="balancer").start()

    @staticmethod
    def hook(port: int, what: str) -> list[str]:
        """The hook's argv (python3 of the pipeline image, where the supervisor runs it)."""
        return ["python3", "-c", f"import urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:{port}/{what}', "
                                 f"method='POST'), timeout=10)"]

    def intervals(self, end: float) -> list[tuple[float, float]]:
        """The drained spans, (from, to); one still drained ends at ``end``."""
        out, start = [], None
        for t, what in self.events:
            if what == "drain" and start is None:
                start = t
            elif what == "undrain" and start is not None:
                out.append((start, t))
                start = None
        if start is not None:
            out.append((start, end))
        return out


def inventory(info: dict[str, Any], floor: float, balancer_port: int = BALANCER_PORT,
              gate_traffic: str = "live") -> str:
    """The benchmark's inventory: production = ``deploy/sandbox-smollm2.yaml``'s sandbox entry (the demo's serving
    settings) on ``b47prod`` with its own container name, serving port, ``acceptance_floor`` and
    ``gate_traffic`` (``live``: the gate measures beside the client, no drain; ``idle``: the STAND-IN balancer's
    drain and undrain hooks take the client off production for the whole gate); the work host the same entry on
    ``b47work`` with ``serving: none``."""
    text = (REPO / "deploy/sandbox-smollm2.yaml").read_text()
    hosts = {}
    for name in (PROD, WORK):
        t = (text.replace("${EAGLE3OPS_SANDBOX:-sandbox}", name)
             .replace("${EAGLE3OPS_SANDBOX_SSH_PORT:-2222}", str(SSH_PORTS[name]))
             .replace("${EAGLE3OPS_SANDBOX_SERVING_PORT:-18000}", str(SERVING_PORT)))
        e = yaml.safe_load(t)["hosts"]["sandbox"]
        e["identity_file"], e["known_hosts"] = str(info[name].identity_file), str(info[name].known_hosts)
        e["docker_host"] = f"unix://{info[name].root / 'docker.sock'}"
        if name == PROD:
            e["serving"]["container"] = "b47-vllm-serving"
            e["serving"]["acceptance_floor"] = floor
            e["serving"]["gate_traffic"] = gate_traffic
            if gate_traffic == "idle":
                e["serving"]["drain_hook"] = Balancer.hook(balancer_port, "drain")
                e["serving"]["undrain_hook"] = Balancer.hook(balancer_port, "undrain")
        else:
            e["serving"] = "none"
        hosts[name] = e
    return yaml.safe_dump({"hosts": hosts}, sort_keys=False)


class Bench:
    """One run: setup, the client, the baseline, the cycle, the figures (written after each phase)."""

    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.fig: dict[str, Any] = {
            "what": "production's downtime as clients see it: today's two-window cycle vs `eagle3ops cycle`",
            "started": iso(now()), "cpu": None, "cores": os.cpu_count(),
            "settings": {"conversations": a.conversations, "train_steps": a.train_steps,
                         "acceptance_floor": a.floor, "gate_traffic": a.gate_traffic,
                         "probe_interval_s": PROBE_INTERVAL_S,
                         "token_timeout_s": TOKEN_TIMEOUT_S, "probe_max_tokens": 4},
            "hosts": "two sandbox hosts (real sshd on 127.0.0.1, host keys checked), one Docker engine (this "
                     "machine's) behind each host's own socket; production serves real vLLM 0.16 CPU",
            "stand_ins": ["production's stand-in serving image for the speculative release "
                          "(eagle3ops/serving:sandbox-cpu-standin, as make demo)",
                          "the local CPU vLLM base stands in for vllm/vllm-openai:v0.16.0 (as make demo)"],
        }
        self.stopped_at = "setup"
        records = a.json.with_name(a.json.stem + ".records.jsonl")
        if a.reanalyse:
            self.fig = json.loads(a.json.read_text())
        elif a.resume_after_baseline:
            self.resume(a.resume_after_baseline)
        else:  # the client's records as they are made (a killed run keeps them), beside the JSON; a new run anew
            records.unlink(missing_ok=True)
        self.log = RecordLog(records)
        self.fig["records"] = {"file": records.name, "what": "one JSON line per probe (t0, t1, ok, kind, tokens; "
                               "drained: the health check while drained) and markers (event: phase, span, drain, "
                               "undrain)"}

    def resume(self, folder: Path) -> None:
        """``--resume-after-baseline FOLDER``: this run's JSON already holds a finished baseline (its partial file
        stopped later: in the cycle phase); its figures are kept and only the cycle is run, with the baseline's
        pipeline and gate chat set from ``FOLDER`` (that invocation's work folder). The records file is appended to.
        ``RuntimeError`` when the JSON has no finished baseline or the folder lacks those files."""
        prior = json.loads(self.a.json.read_text()) if self.a.json.exists() else {}
        need = [folder / "pipeline.yaml", folder / "gate-chat.jsonl"]
        if "client" not in prior.get("baseline", {}) or not all(p.exists() for p in need):
            raise RuntimeError(f"--resume-after-baseline {folder}: {self.a.json} has no finished baseline, or "
                               f"{' / '.join(p.name for p in need)} are not in that folder; run without it")
        if prior.get("settings") != self.fig["settings"]:
            raise RuntimeError(f"--resume-after-baseline: the settings differ from the baseline's "
                               f"({prior.get('settings')}); pass the same --conversations/--train-steps/--floor")
        resumed = {"at": iso(now()), "stopped_at_before": prior.get("stopped_at"), "error_before": prior.get("error"),
                   "note": "the baseline phase finished in the first invocation of this run (same hosts, settings "
                           "and production state); the invocation stopped before the cycle phase ran a step and "
                           "this one ran the cycle phase only"}
        self.fig = {k: v for k, v in prior.items() if k not in ("error", "traceback", "cycle", "verdict")}
        self.fig["resumed"] = resumed
        self.fig["load_average_1min_first_invocation"] = prior.get("load_average_1min")
        self.pipeline_text = (folder / "pipeline.yaml").read_text()
        self.chat_file = folder / "gate-chat.jsonl"

    def write(self) -> None:
        self.fig["stopped_at"] = self.stopped_at
        self.fig["finished"] = iso(now())
        if getattr(self, "probe", None) is not None:
            self.fig["load_average_1min"] = load_figures(self.probe.load)
        self.a.json.parent.mkdir(parents=True, exist_ok=True)
        write_result(self.a.json, self.fig, indent=2, default=str)
        print(f"[bench] wrote {self.a.json} (stopped_at {self.stopped_at})", flush=True)

    # ---- setup -----------------------------------------------------------------------------------------------
    def setup(self) -> None:
        from eagle3ops import deployer
        from eagle3ops.config import load_inventory
        from eagle3ops_dev import demo, sandbox

        self.fig["cpu"] = demo.cpu_model()
        info = {n: sandbox.up(n, SSH_PORTS[n], engine="none") for n in (PROD, WORK)}
        self.fig["docker_proxy"] = ensure_proxy(sockets(), __file__, sandbox.SANDBOX_BASE / PROD / "docker-proxy.log")
        self.work_dir = Path(f"/tmp/b47-{time.strftime('%Y%m%dT%H%M%S')}")
        self.work_dir.mkdir()
        self.fig.setdefault("work_folders", []).append(str(self.work_dir))
        self.inv = self.work_dir / "hosts.yaml"
        self.inv.write_text(inventory(info, self.a.floor, gate_traffic=self.a.gate_traffic))
        inv = load_inventory(self.inv)
        self.prod, self.work = inv.host(PROD), inv.host(WORK)
        pw = pwd.getpwnam(info[PROD].user)
        for h in (self.prod, self.work):
            # the work host's model directory exists but is empty: deploy's preflight asks for the directory, and the
            # cycle's weights step fills it
            for d in (h.data_dir, h.state_dir, str(Path(h.model_path).parent), *([h.model_path] if h is self.work
                                                                                   else [])):
                Path(d).mkdir(parents=True, exist_ok=True)
                os.chown(d, pw.pw_uid, pw.pw_gid)
        t = now()
        model = Path(self.prod.model_path)
        if not (model / "config.json").exists():
            if (BUILT_TARGET / "config.json").exists() and demo.target_kind(BUILT_TARGET) == demo.DEMO_TARGET:
                shutil.copytree(BUILT_TARGET, model)  # the demo's target as built there, copied as an operator would
                how = f"copied from {BUILT_TARGET}"
            else:
                from eagle3ops import images

                demo.build_tiny_model(images.content_tag("pipeline", None, LOCAL_BASE), str(model), demo.DEMO_TARGET)
                how = "built as make demo builds it"
            for p in [model, *model.rglob("*")]:
                os.chown(p, pw.pw_uid, pw.pw_gid)
        else:
            how = "already there"
        self.fig["target"] = {"path": str(model), "how": how,
                              "record": json.loads((model / "eagle3ops-target.json").read_text())}
        t = now()
        self.fig["serving_start_s"] = round(demo.start_serving(self.prod), 1)
        self.deployed = {}
        for h in (self.prod, self.work):
            t = now()
            dep = deployer.deploy(h, base_image=LOCAL_BASE, echo=print)
            self.deployed[h.name] = dep
            self.fig.setdefault("deploy_s", {})[h.name] = round(now() - t, 1)
        self.fig["pipeline_image"] = self.deployed[PROD].tag
        self.url = f"http://127.0.0.1:{self.prod.serving.port}"

    # ---- baseline: today's two-window cycle ---------------------------------------------------------------
    def baseline(self) -> None:
        from eagle3ops import executor
        from eagle3ops.console import print_event
        from eagle3ops.speculate import ship
        from eagle3ops.window.run import run_window
        from eagle3ops_dev import demo

        run = f"base-{time.strftime('%m%dT%H%M%S')}"
        dep = self.deployed[PROD]
        spans: list[dict[str, Any]] = []
        t_start = now()
        self.log.mark("phase", name="baseline", run=run)

        def span(name: str, t0: float) -> None:
            spans.append({"name": name, "from": t0, "to": now()})
            self.log.mark("span", name=name, phase="baseline", **{"from": t0, "to": spans[-1]["to"]})

        t = now()
        self.pipeline_text, gen = demo.regenerate_training_data(
            self.prod, run, (REPO / "deploy/pipeline.yaml").read_text(), conversations=self.a.conversations,
            train={**demo.DEMO_TRAIN, "steps": self.a.train_steps}, vocab=demo.DEMO_VOCAB)
        span("regenerate", t)
        windows = {}
        for kind in ("extract", "train"):
            t = now()
            with executor.for_host(self.prod) as r:
                res = run_window(r, kind=kind, image=dep.tag, expected_image_id=dep.image_id,
                                 command=f"eagle3ops {kind} {PROD} --run {run} (cycle_downtime baseline)", run=run,
                                 on_event=print_event, pipeline_text=self.pipeline_text)
            span(f"{kind} window", t)
            windows[kind] = {k: res.get(k) for k in ("outcome", "wall_s", "downtime_s", "stage_seconds", "stages")}
            if res["outcome"] != "ok":
                raise RuntimeError(f"baseline {kind} window: {res.get('outcome')} {res.get('error')}")
        self.chat_file = self.work_dir / "gate-chat.jsonl"
        demo.held_out_chat_set(self.prod, self.chat_file)
        t = now()
        sp: dict[str, Any] = {}
        try:
            with executor.for_host(self.prod) as r:  # as make demo: --force --control
                sp = ship.speculate(r, ship.SpeculateOptions(
                    run=run, pipeline_image=dep.tag, pipeline_image_id=dep.image_id, force=True, control=True,
                    serving_image=self.prod.serving.speculative_image, prompts_file=self.chat_file,
                    with_humaneval=True, command=f"eagle3ops speculate {PROD} --run {run} --force --control "
                                                 "(cycle_downtime baseline)"), echo=print, on_event=print_event)
        except Exception as exc:  # noqa: BLE001 - recorded: the gate's own failure is a figure here
            sp = {"error": f"{type(exc).__name__}: {exc}"}
        span("speculate", t)
        self.fig["baseline"] = {
            "run": run, "what": "regenerate on live serving, extract window, train window (serving stopped for "
                                "each), speculate --force --control (as make demo)",
            "regenerate": {k: gen.get(k) for k in ("answered", "conversations", "wall_s", "completion_tokens_now")},
            "windows": windows, "speculate": self.speculate_summary(sp),
            "client": analyse_outages(self.probe.records, t_start, now(), spans, self.balancer.intervals(now()))}

    @staticmethod
    def speculate_summary(sp: dict[str, Any]) -> dict[str, Any]:
        keys = ("verdict", "reason", "restarts_s", "wall_s", "live_release", "error", "window_id")
        out = {k: sp.get(k) for k in keys if k in sp}
        out["mean_acceptance_length"] = (sp.get("spec_decode") or {}).get("mean_acceptance_length")
        return out

    # ---- the cycle ---------------------------------------------------------------------------------------------
    def cycle(self) -> None:
        from eagle3ops_dev import demo

        run = f"cyc-{time.strftime('%m%dT%H%M%S')}"
        items, record = demo.sharegpt_items(self.a.conversations)
        ds = self.work_dir / "conversations.jsonl"
        with ds.open("w") as f:
            for it in items:  # the demo's selection: up to 2 answers each (the file's answers are replaced)
                f.write(json.dumps({"messages": [{"role": r, "content": c} for r, c in it.turns]}) + "\n")
        cfg = yaml.safe_load(self.pipeline_text)
        pipe = self.work_dir / "pipeline.yaml"
        pipe.write_text(yaml.safe_dump(cfg, sort_keys=False))
        base = [sys.executable, "-m", "eagle3ops", "cycle", PROD, "--work", WORK, "--run", run, "--dataset", str(ds),
                "--truncated", "keep-complete", "--pipeline", str(pipe), "--prompts-file", str(self.chat_file),
                "--inventory", str(self.inv)]
        t = now()
        dry = subprocess.run([*base, "--dry-run", "--json"], capture_output=True, text=True, timeout=600, cwd=REPO)
        if dry.returncode != 0:
            raise RuntimeError(f"cycle --dry-run exited {dry.returncode}: {dry.stderr[-2000:]}")
        # the plan is the JSON document that starts on a line of its own: the dry run also echoes the commands it
        # reads the hosts with to stdout, and those hold braces (find -exec ... '{}' +)
        lines = dry.stdout.splitlines()
        first = next((i for i, x in enumerate(lines) if x.strip() == "{"), None)
        if first is None:
            raise RuntimeError(f"cycle --dry-run --json printed no JSON document: {dry.stdout[-2000:]}")
        plan = json.loads("\n".join(lines[first:]))
        self.fig["dry_run_stdout_lines_before_json"] = first
        self.fig["cycle"] = {"run": run, "command": " ".join(base[2:]), "plan": plan, "dry_run_s": round(now() - t, 1)}
        self.write()
        t_start = now()
        self.log.mark("phase", name="cycle", run=run)
        log = self.work_dir / "cycle.log"
        last: dict[str, Any] = {}
        with log.open("w") as lf:
            proc = subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                    cwd=REPO)
            assert proc.stdout is not None
            for line in proc.stdout:
                lf.write(line)
                lf.flush()
                print(line, end="", flush=True)
                if line.startswith("{"):
                    try:
                        last = json.loads(line)
                    except ValueError:
                        pass
            rc = proc.wait()
        end = now()
        journal = Path(self.prod.state_dir) / "cycles" / run / "journal.jsonl"
        entries = [json.loads(x) for x in journal.read_text().splitlines() if x.strip()] if journal.exists() else []
        spans = journal_spans(entries, end)
        spec = self.cycle_speculate_result(self.prod.data_dir, self.prod.state_dir, run)
        self.fig["cycle"].update({"rc": rc, "log": str(log), "outcome": {k: last.get(k) for k in (
            "outcome", "steps", "verdict", "work_host_acceptance", "production_acceptance", "production_restarts")},
            "figures": last.get("figures"), "journal": entries, "speculate": self.speculate_summary(spec),
            "client": analyse_outages(self.probe.records, t_start, end, spans, self.balancer.intervals(end))})
        self.check_stages(run)

    @staticmethod
    def cycle_speculate_result(data_dir: str, state_dir: str, run: str) -> dict[str, Any]:
        """The cycle's gate result on production (its newest attempt folder) with the speculate window's
        ``restarts_s`` and ``wall_s`` (the supervisor's figures: in the window's ``result.json``, not the gate's)."""
        found = sorted(glob.glob(f"{data_dir}/runs/{run}/speculate/*/*/result.json"), key=os.path.getmtime)
        found = found or sorted(glob.glob(f"{data_dir}/runs/{run}/speculate/result.json"))
        res = json.loads(Path(found[-1]).read_text()) if found else {}
        window = Path(state_dir) / "windows" / str(res.get("window_id")) / "result.json"
        if window.exists():
            w = json.loads(window.read_text())
            res.update({k: w.get(k) for k in ("restarts_s", "wall_s") if k not in res})
        return res

    def reanalyse(self) -> int:
        """``--reanalyse``: the cycle phase's client figures, gate summary and verdict computed again from what the
        run recorded (the records file with its drain markers, the journal in the JSON, production's window
        results), with this script's analysis as it is now; nothing else runs."""
        from eagle3ops_dev import sandbox

        records = self.a.json.with_name(self.a.json.stem + ".records.jsonl")
        marks = read_records(records)
        cyc = self.fig["cycle"]
        start = max(r["t"] for r in marks if r.get("event") == "phase" and r.get("name") == "cycle")
        end = datetime.fromisoformat(cyc["client"]["to"]).timestamp()
        bal = Balancer.__new__(Balancer)  # its drained spans from the markers it wrote
        bal.events = [(r["t"], r["event"]) for r in marks if r.get("event") in ("drain", "undrain")]
        spans = journal_spans(cyc["journal"], end)
        root = sandbox.SANDBOX_BASE / PROD
        spec = self.cycle_speculate_result(str(root / "data"), str(root / "state"), cyc["run"])
        cyc["speculate"] = self.speculate_summary(spec)
        cyc["client"] = analyse_outages([r for r in marks if "event" not in r], start, end, spans,
                                        bal.intervals(end))
        self.fig["reanalysed"] = iso(now())
        self.stopped_at = "conclude"
        self.conclude()
        self.stopped_at = None
        self.write()
        return 0

    def check_stages(self, run: str) -> None:
        """Real stages only: every stage manifest of both runs read; one that says stand-in fails the benchmark."""
        seen = {}
        for h, r in ((self.prod, self.fig["baseline"]["run"]), (self.work, run)):
            for st in ("prepare", "extract", "vocab", "train"):
                p = Path(h.data_dir) / "runs" / r / st / "manifest.json"
                if p.exists():
                    text = p.read_text()
                    seen[f"{h.name}:{r}:{st}"] = "standin" not in text.lower().replace("stand-in", "standin")
        self.fig["real_stages"] = seen
        if not seen or not all(seen.values()):
            raise RuntimeError(f"a stage manifest is missing or says stand-in: {seen}")

    # ---- the verdict ---------------------------------------------------------------------------------------------
    def conclude(self) -> None:
        """The benchmark's questions answered from the figures: did production stop answering only during the speculate
        job's own restarts, how that compares with the plan the cycle printed, and with the baseline."""
        b, c = self.fig["baseline"]["client"], self.fig["cycle"]["client"]
        plan = self.fig["cycle"]["plan"]["production_serving"]
        sp = self.fig["cycle"]["speculate"]
        kept = sp.get("verdict") == "keep"
        expected = plan["expected_downtime_keep_s" if kept else "expected_downtime_rollback_s"]
        in_spec = [o for o in c["outages"] if o["during"] == "speculate"]
        outside = [o for o in c["outages"] if o["during"] != "speculate"]
        measured = round(sum(o["seconds"] for o in in_spec), 2)
        in_spec_chat = sum(o.get("failed_chat_requests", 0) for o in in_spec)
        restarts = sp.get("restarts_s") or []

        step = next((st for st in self.fig["cycle"]["plan"]["steps"] if st["key"] == "speculate"), {})
        gate_s = next((p["expected_s"] for p in step.get("parts", []) if p["part"] == "the gate"), None)
        held_off = round(c["drained_s"] + sum(o["seconds"] for o in in_spec if not o["drained"]), 1)
        plan_held = plan.get("clients_held_off_keep_s" if kept else "clients_held_off_rollback_s")

        def client_down(x: dict[str, Any]) -> float:  # seconds no client got production: drained, or not answering
            return round(x["drained_s"] + sum(o["seconds"] for o in x["outages"] if not o["drained"]), 1)

        self.fig["verdict"] = {
            "speculate_path": "keep" if kept else f"not kept ({sp.get('verdict') or sp.get('error')})",
            "plan_expected_downtime_s": expected,
            "plan_restarts": plan["restarts_keep" if kept else "restarts_rollback"],
            "plan_per_restart_s": plan.get("per_restart_s"),
            "speculate_restarts_reported": len(restarts), "speculate_restart_seconds": restarts,
            "speculate_restart_seconds_sum": round(sum(restarts), 1),
            # the job's own restart figures (each from its start to its passed health gate, a completion included:
            # what the plan's median is taken from) against the plan: the client's drained /health check sees a
            # server back before its first completion answers
            "restart_seconds_sum_over_expected": round(sum(restarts) / expected, 3) if expected else None,
            "cycle_outages_during_speculate": len(in_spec),
            "cycle_seconds_not_answering_during_speculate": measured,
            "cycle_outages_outside_speculate": outside,
            "cycle_failed_chat_requests": c["failed_requests"],
            "cycle_failed_chat_requests_in_speculate_outages": in_spec_chat,
            "cycle_failed_chat_requests_outside_speculate_outages": c["failed_requests"] - in_spec_chat,
            "only_during_speculate_restarts": not outside and c["failed_requests"] == in_spec_chat
            and len(in_spec) <= len(restarts),
            "measured_over_expected": round(measured / expected, 3) if expected else None,
            "within_20_percent_of_plan": (abs(measured / expected - 1) <= 0.2) if expected else None,
            "baseline_seconds_not_answering": b["seconds_not_answering"],
            "cycle_seconds_not_answering": c["seconds_not_answering"],
            "cycle_over_baseline_not_answering": (round(c["seconds_not_answering"] / b["seconds_not_answering"], 3)
                                                  if b["seconds_not_answering"] else None),
            "baseline_drained_s": b["drained_s"], "cycle_drained_s": c["drained_s"],
            "plan_expected_gate_s": gate_s,
            "cycle_clients_held_off_during_speculate_s": held_off,
            "held_off_over_plan_gate": round(held_off / gate_s, 3) if gate_s else None,
            "gate_traffic": plan.get("gate_traffic"),
            "plan_clients_held_off_s": plan_held,
            "held_off_over_plan_clients_held_off": round(held_off / plan_held, 3) if plan_held else None,
            "baseline_seconds_without_production_for_clients": client_down(b),
            "cycle_seconds_without_production_for_clients": client_down(c),
            "baseline_longest_span_without_answer_s": b["longest_span_without_answer_s"],
            "cycle_longest_span_without_answer_s": c["longest_span_without_answer_s"],
            "note": "not answering = probes failed (chat requests, or the balancer's /health while drained): "
                    "production's restarts, compared with the plan's expected downtime (its restarts x the median "
                    "restart recorded on production). drained = the speculate job's drain_hook to its undrain_hook, "
                    "clients held off production (one backend: they got no answer then either), compared with the "
                    "plan's expected gate time (the median speculate window recorded on production, restarts "
                    "included). With gate_traffic live there is no drain: clients are held off only while "
                    "production does not answer, and the plan's clients_held_off figure is its restarts",
        }

    def main(self) -> int:
        try:
            self.setup()
            self.write()
            self.balancer = Balancer(log=self.log)
            self.probe = SerialProbe(self.url, self.prod.serving.served_model_name or "", self.log,
                                     self.balancer.drained)
            self.probe.start()
            if not self.a.resume_after_baseline:
                self.stopped_at = "baseline"
                self.baseline()
                self.write()
            self.stopped_at = "cycle"
            self.cycle()
            self.write()
            self.stopped_at = "conclude"
            self.conclude()
            self.stopped_at = None
            return 0
        except BaseException as exc:  # noqa: BLE001 - the partial figures are written with where it stopped
            self.fig["error"] = f"{type(exc).__name__}: {exc}"
            self.fig["traceback"] = traceback.format_exc()[-4000:]
            traceback.print_exc()
            return 1
        finally:
            if getattr(self, "probe", None) is not None:
                self.probe.stop.set()
                self.probe.join(timeout=60)
            self.write()
            self.log.close()


def sockets() -> list[Path]:
    """Both hosts' Docker sockets (forwarded by :class:`downtime.DockerProxy`)."""
    from eagle3ops_dev import sandbox

    return [sandbox.SANDBOX_BASE / n / "docker.sock" for n in (PROD, WORK)]


def main() -> int:
    if sys.argv[1:] == ["--proxy"]:  # the detached proxy (downtime.ensure_proxy): until killed
        asyncio.run(DockerProxy(sockets()).serve())
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=HERE / "cycle-downtime.json")
    ap.add_argument("--conversations", type=int, default=24, help="ShareGPT V3 conversations regenerated per phase "
                    "(the demo: 100)")
    ap.add_argument("--train-steps", type=int, default=40, help="train steps per phase (the demo: 300)")
    ap.add_argument("--resume-after-baseline", type=Path, metavar="FOLDER", help="the JSON holds a finished "
                    "baseline: run only the cycle phase, with the baseline's pipeline and gate chat set from FOLDER "
                    "(the first invocation's work folder, /tmp/b47-...)")
    ap.add_argument("--reanalyse", action="store_true", help="compute the cycle phase's figures and the verdict "
                    "again from the JSON and its records file (nothing runs)")
    ap.add_argument("--gate-traffic", choices=("live", "idle"), default="live", help="production's "
                    "serving.gate_traffic: live (the gate measures beside the client; no drain) or idle (the STAND-IN "
                    "balancer drains the client for the whole gate, as the first runs did)")
    ap.add_argument("--floor", type=float, default=1.0, help="production's serving.acceptance_floor for this run "
                    "(module doc)")
    a = ap.parse_args()
    return Bench(a).reanalyse() if a.reanalyse else Bench(a).main()


if __name__ == "__main__":
    sys.exit(main())
