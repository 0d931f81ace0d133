"""``--dry-run --json``: every host-changing command that plans a window or a copy prints its plan as one JSON
document on stdout (the commands it would run go to stderr), its secrets masked, and changes nothing.

One table over the CLI, each command run against the stand-in host of ``test_window_driver`` (files, ``df``,
containers answered in memory) behind the recording host's transport (:mod:`recording_host`): the product's
``Remote`` runs the reads and records the changes without sending them, as a dry run does.
"""

from __future__ import annotations

import json
import platform

import pytest
from typer.testing import CliRunner

from recording_host import RecordingHost
from test_lock_first import ABSENT, _push, _two_host_facts, _two_hosts, pushed_image  # noqa: F401 - a fixture
from test_window_driver import REPO, TINY, _host_with_serving

#: (command line, the JSON path that holds the plan, a check of it); ``{pipeline}`` is a tiny pipeline config.
#: ``train`` prints through the same path as ``extract`` (``cli._window``); it needs a finished extract on the host,
#: so it has its own test below.
TABLE = [
    (["extract", "sandbox", "--pipeline", "{pipeline}"], ("plan",), lambda p: p["kind"] == "window"
     and [s["name"] for s in p["stages"]] == ["prepare", "extract"]),
    (["release", "sandbox", "--arg", "--max-num-seqs", "--arg", "8"], ("plan",),
     lambda p: p["kind"] == "release" and p["change"]["args"] == ["--max-num-seqs", "8"]),
    (["rollback", "sandbox"], ("plan",), lambda p: p["kind"] == "rollback"),
    (["release", "sandbox", "--gate", "--env", "VLLM_API_KEY=s3cret-planted"], ("release_plan", "plan"),
     lambda p: p["kind"] == "speculate" and p["speculate"]["rule"] == "not_slower"),
    (["speculate", "sandbox", "--run", "r1", "--accept-low-power", "--image", ABSENT], ("release_plan", "plan"),
     lambda p: p["kind"] == "speculate" and p["speculate"]["change"]["image"] == ABSENT),
]


def _dig(doc, path):
    for key in path:
        doc = doc[key]
    return doc


@pytest.mark.parametrize("args,path,check", TABLE, ids=[" ".join(a[:3]) for a, _, _ in TABLE])
def test_the_dry_run_prints_its_plan_as_json_and_changes_nothing(monkeypatch, tmp_path, args, path, check):
    from eagle3ops import cli, deployer, executor
    from eagle3ops.config import load_inventory
    from test_lock_first import _facts

    host = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    world = _host_with_serving(host)
    world._mkdirs(f"{host.data_dir}/runs/r1/train/final/config.json")  # `test -e` answers from the dirs: a head

    def facts(argv, stdin):  # the speculation gate's helper and images as test_lock_first answers them
        if "eagle3ops.speculate.onhost" in argv or ABSENT in argv:
            return _facts(argv, stdin)
        return world(argv, stdin)

    rec = RecordingHost(facts=facts, stop_at_lock=False)
    monkeypatch.setattr(executor, "for_host", rec.for_host)
    monkeypatch.setattr(deployer, "push_image", _push(rec))
    (tmp_path / "p.yaml").write_text(TINY)
    words = [a.replace("{pipeline}", str(tmp_path / "p.yaml")) for a in args]
    out = CliRunner().invoke(cli.app, [*words, "--dry-run", "--json", "--inventory", str(REPO / "deploy/hosts.yaml")])
    assert out.exit_code == 0, (out.output, out.exception)
    doc = json.loads(out.stdout)  # the whole of stdout is one JSON document
    assert check(_dig(doc, path)), json.dumps(doc)[:3000]
    assert "s3cret-planted" not in out.stdout  # secrets masked
    assert world.writes == []  # nothing changed: the changes were recorded, not sent
    sent = [c for c in rec.calls if c.kind != "read"]
    assert sent and sent[0].kind == "lock", [c.cmd for c in sent]  # the plan's first change is the lock



def test_train_dry_run_json_is_its_window_over_a_finished_extract(monkeypatch, tmp_path):
    """``train --dry-run --json`` where prepare and extract are finished for these inputs (their manifests on the
    host, made with this pipeline's settings): the window's plan (vocab, train) opening with the lock; nothing sent."""
    import hashlib

    from eagle3ops import cli, executor
    from eagle3ops.config import load_inventory
    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages.manifest import STAGE_SECTIONS

    host = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    (tmp_path / "pipeline.yaml").write_text(TINY)
    cfg = load_pipeline_config(tmp_path)
    world = _host_with_serving(host)
    run = f"{host.data_dir}/runs/default"
    inputs: dict[str, str] = {}
    for stage in ("prepare", "extract"):
        text = json.dumps({"stage": stage, "status": "complete", "inputs": inputs,
                           "config_digest": cfg.section_digest(*STAGE_SECTIONS[stage])})
        world._mkdirs(f"{run}/{stage}/manifest.json")
        world.files[f"{run}/{stage}/manifest.json"] = text
        inputs = {stage: hashlib.sha256(text.encode()).hexdigest()}
    rec = RecordingHost(facts=world, stop_at_lock=False)
    monkeypatch.setattr(executor, "for_host", rec.for_host)
    out = CliRunner().invoke(cli.app, ["train", "sandbox", "--pipeline", str(tmp_path / "pipeline.yaml"),
                                       "--dry-run", "--json", "--inventory", str(REPO / "deploy/hosts.yaml")])
    assert out.exit_code == 0, (out.output, out.exception)
    plan = json.loads(out.stdout)["plan"]
    assert plan["kind"] == "window" and [s["name"] for s in plan["stages"]] == ["vocab", "train"], plan
    assert world.writes == []
    sent = [c for c in rec.calls if c.kind != "read"]
    assert sent and sent[0].kind == "lock", [c.cmd for c in sent]

#: Commands over two hosts (the repository's sandbox and ``other``, its copy): (command line, a check of the JSON).
MULTI = [
    (["weights", "other", "--from", "sandbox"],
     lambda d: d["source"] == "sandbox" and d["dest"] == "other"
     and [s["path"] for s in d["steps"]] == ["config.json"]),
    (["extract", "sandbox", "other", "--run", "r1", "--pipeline", "{pipeline}"],
     lambda d: d["run"] == "r1" and {w["host"] for w in d["windows"]} == {"sandbox", "other"}),
    (["train", "sandbox", "--run", "r1", "--from-fleet", "{merged}", "--pipeline", "{pipeline}"],
     lambda d: d["train_host"] == "sandbox" and d["bytes"] == 4),
    (["train", "sandbox", "other", "--run", "r1", "--from-fleet", "{nodes}", "--pipeline", "{pipeline}"],
     lambda d: [n["host"] for n in d["nodes"]] == ["sandbox", "other"] and d["nodes"][1]["node_args"][:2] == [2, 1]),
]


@pytest.mark.parametrize("args,check", MULTI, ids=[" ".join(a[:3]) for a, _ in MULTI])
def test_commands_over_two_hosts_print_their_plan_as_json(monkeypatch, tmp_path, args, check):
    from eagle3ops import cli, executor
    from test_lock_first import FLEET_MERGED, MERGED, _nodes_facts

    def facts(argv, stdin):
        return _nodes_facts(argv, stdin) if "/prepare/" in " ".join(argv) or "/shards/" in " ".join(argv) \
            else _two_host_facts(argv, stdin)

    rec = RecordingHost(facts=facts, stop_at_lock=False)
    monkeypatch.setattr(executor, "for_host", rec.for_host)
    files = {"pipeline": ("p.yaml", "target_model: /model\nprepare: {datasets: [builtin:sharegpt], max_seq_len: 256, "
                                    "max_samples: 8}\n"),
             "merged": ("merged.json", json.dumps(FLEET_MERGED)), "nodes": ("nodes.json", json.dumps(MERGED))}
    words = list(args)
    for key, (name, text) in files.items():
        (tmp_path / name).write_text(text)
        words = [w.replace("{" + key + "}", str(tmp_path / name)) for w in words]
    out = CliRunner().invoke(cli.app, [*words, "--dry-run", "--json", "--inventory", str(_two_hosts(tmp_path))])
    assert out.exit_code == 0, (out.output, out.exception)
    doc = json.loads(out.stdout)
    assert check(doc), json.dumps(doc)[:3000]
    assert not [c for c in rec.calls if c.kind != "read"]  # planned over both hosts: nothing changed or recorded



def test_speculate_with_a_head_from_another_host_dry_run_json_is_one_document_with_the_fetch(monkeypatch, tmp_path):
    """``speculate B --head A:RUN --dry-run --json`` (an image B lacks, as in the table above): stdout is one JSON document, the release plan and the head's
    fetch from A (planned from A's train manifest, made under B's lock in a real run); the fetch's lines and every
    command go to stderr; nothing sent to either host."""
    from eagle3ops import cli, deployer, executor
    from eagle3ops.config import load_inventory
    from test_lock_first import _facts

    world = _host_with_serving(load_inventory(REPO / "deploy/hosts.yaml").host("sandbox"))  # B's engine and files

    def facts(argv, stdin):
        if "eagle3ops.speculate.onhost" in argv or ABSENT in argv:  # the gate's helper; the image to push
            return _facts(argv, stdin)
        if argv[0] == "find" and "-printf" in argv or argv[0] in ("df", "sh") or "/runs/r1/train/" in argv[1]:
            return _two_host_facts(argv, stdin) or (0, "", "")  # A's train manifest; B's heads (none) and room
        if argv[0] == "docker" and "info" in argv:  # B's engine: this machine's architecture
            return 0, platform.machine() + "\n", ""
        return world(argv, stdin)

    rec = RecordingHost(facts=facts, stop_at_lock=False)
    monkeypatch.setattr(executor, "for_host", rec.for_host)
    monkeypatch.setattr(deployer, "push_image", _push(rec))
    out = CliRunner().invoke(cli.app, ["speculate", "other", "--run", "r1", "--accept-low-power", "--head",
                                       "sandbox:r1", "--image", ABSENT, "--dry-run", "--json", "--inventory",
                                       str(_two_hosts(tmp_path))])
    assert out.exit_code == 0, (out.output, out.exception)
    doc = json.loads(out.stdout)  # the whole of stdout is one JSON document
    assert doc["release_plan"]["plan"]["kind"] == "speculate", json.dumps(doc)[:2000]
    fetch = doc["head_fetch"]
    assert (fetch["source"], fetch["dest"]) == ("sandbox", "other") and [s["path"] for s in fetch["steps"]] == [
        "config.json"], fetch
    assert "would be installed" in out.stderr
    assert world.writes == [] and all(c.dry_run for c in rec.calls if c.kind != "read")

def test_lock_release_dry_run_json_names_the_lock_and_its_removal(monkeypatch):
    from eagle3ops import cli, executor

    details = {"window_id": "20990101T000000Z-extract-abcdef", "holder": "alice@laptop", "since": "2099-01-01"}

    def facts(argv, stdin):
        if argv[0] == "find" and argv[1].endswith("/lock/details.json"):
            return 0, json.dumps(details), ""
        if "{{.State.Running}} {{.State.Restarting}}" in argv:  # its supervisor is gone: a stale lock
            return 1, "", "Error: No such object"
        return None

    rec = RecordingHost(facts=facts, stop_at_lock=False)
    monkeypatch.setattr(executor, "for_host", rec.for_host)
    out = CliRunner().invoke(cli.app, ["lock", "release", "sandbox", "--dry-run", "--json", "--inventory",
                                       str(REPO / "deploy/hosts.yaml")])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["lock"]["holder"] == "alice@laptop" and len(doc["changes"]) == 1
    assert doc["changes"][0].startswith("rm -rf -- ") and doc["changes"][0].endswith("/state/lock")


@pytest.mark.parametrize("command", ["attach", "recover"])
def test_following_a_finished_window_dry_run_json_lists_what_would_finish_it(monkeypatch, command):
    from eagle3ops import cli, executor
    from eagle3ops.config import load_inventory

    host = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    world = _host_with_serving(host)
    wid = "20990101T000000Z-extract-abcdef"
    world._mkdirs(f"{host.state_dir}/windows/{wid}")
    world.files[f"{host.state_dir}/windows/{wid}/result.json"] = json.dumps(
        {"window_id": wid, "outcome": "ok", "serving_running": True, "serving_healthy": True})
    def facts(argv, stdin):  # recover reads the live server's /health: up
        return (0, "200", "") if argv[0] == "curl" else world(argv, stdin)

    rec = RecordingHost(facts=facts, stop_at_lock=False)
    monkeypatch.setattr(executor, "for_host", rec.for_host)
    out = CliRunner().invoke(cli.app, [command, "sandbox", "--dry-run", "--json", "--inventory",
                                       str(REPO / "deploy/hosts.yaml")])
    assert out.exit_code == 0, (out.output, out.exception)
    doc = json.loads(out.stdout)
    assert doc["window_id"] == wid and doc["finished"] is True, doc
    assert doc["changes"] == [c.cmd for c in rec.calls if c.kind != "read"] and world.writes == []
    assert [c.split()[-3:] for c in doc["changes"]] == [["rm", "--force", f"eagle3ops-supervisor-{wid}"]]


def test_json_without_dry_run_is_refused_before_any_host_is_reached(monkeypatch):
    from eagle3ops import cli, executor

    monkeypatch.setattr(executor, "for_host", lambda *a, **k: pytest.fail("a host was reached"))
    out = CliRunner().invoke(cli.app, ["rollback", "sandbox", "--json", "--inventory", str(REPO / "deploy/hosts.yaml")])
    assert out.exit_code == 2 and "--json prints the plan of a dry run" in " ".join(out.output.split())


def _invoke(monkeypatch, rec: RecordingHost, args: list[str]):
    """``args --dry-run --json`` through the CLI against the recording host; its stdout parsed as one document."""
    from eagle3ops import cli, executor

    monkeypatch.setattr(executor, "for_host", rec.for_host)
    out = CliRunner().invoke(cli.app, [*args, "--dry-run", "--json"])
    assert out.exit_code == 0, (out.output, out.exception, [c.cmd for c in rec.calls])
    return json.loads(out.stdout)


def _lock_first(changes: list[str], state_dir: str) -> None:
    """A plan's changes open with the host's lock (its state dir, then the atomic ``mkdir``) and end releasing it."""
    assert changes[:2] == [f"mkdir -p {state_dir}", f"mkdir {state_dir}/lock"], changes
    assert changes[-1] == f"rm -rf -- {state_dir}/lock", changes


def test_deploy_dry_run_json_is_the_build_push_checks_and_record_under_the_lock(monkeypatch, pushed_image):
    """``deploy --dry-run --json``: the build plan (a STAND-IN plan naming the small image on the build engine, so
    that the push is planned from the host's inventory for real), the push's plan, the preflight checks, the record
    and every change in order, the lock's first and its release last; nothing sent."""
    from types import SimpleNamespace

    from eagle3ops import images
    from eagle3ops.config import load_inventory
    from test_lock_first import push_facts

    plan = SimpleNamespace(name="pipeline", base="eagle3ops/base:t", base_labels={}, tag=pushed_image, labels={},
                           profile="p", build_args={"BASE_IMAGE": "eagle3ops/base:t"}, exists=True,
                           lines=lambda: [f"# build pipeline: {pushed_image}"])
    monkeypatch.setattr(images, "plan_build", lambda *a, **k: plan)
    rec = RecordingHost(facts=push_facts, stop_at_lock=False)
    doc = _invoke(monkeypatch, rec, ["deploy", "sandbox", "--inventory", str(REPO / "deploy/hosts.yaml")])
    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    assert doc["kind"] == "deploy" and doc["build"]["tag"] == pushed_image and doc["push"]["action"] == "load", doc
    assert doc["record"]["path"] == f"{h.state_dir}/deployed.json" and doc["preflight"], doc
    _lock_first(doc["changes"], h.state_dir)
    load = next(i for i, c in enumerate(doc["changes"]) if c.endswith(" load"))
    assert load < doc["changes"].index(f"tee {h.state_dir}/deployed.json"), doc["changes"]
    assert doc["changes"] == [c.cmd for c in rec.calls if c.kind != "read"]  # the plan's changes: those recorded


def test_push_dry_run_json_plans_each_host_from_its_facts(monkeypatch, tmp_path, pushed_image):
    """``push IMAGE A B --dry-run --json``: per host, the plan decided from its image inventory (a load of the whole
    image: it holds none) and the changes it would make there, under that host's lock."""
    from test_lock_first import _two_hosts, push_facts

    rec = RecordingHost(facts=push_facts, stop_at_lock=False)
    doc = _invoke(monkeypatch, rec, ["push", pushed_image, "sandbox", "other", "--inventory", str(_two_hosts(tmp_path))])
    assert doc["kind"] == "push" and [x["host"] for x in doc["hosts"]] == ["sandbox", "other"], doc
    for x in doc["hosts"]:
        assert x["status"] == "dry-run" and x["plan"]["action"] == "load" and x["plan"]["layers_sent"] == 1, x
        _lock_first(x["changes"], "/var/lib/eagle3ops-sandbox/sandbox/state")
        assert any(c.endswith(" load") for c in x["changes"]), x["changes"]


def test_probe_dry_run_json_is_the_probe_container_under_the_lock(monkeypatch):
    """``probe --dry-run --json``: the deployed image (read), the probe container's commands, under the lock."""
    from eagle3ops.config import load_inventory
    from test_lock_first import IMAGE, IMAGE_ID, _facts

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    rec = RecordingHost(facts=_facts, stop_at_lock=False)
    doc = _invoke(monkeypatch, rec, ["probe", "sandbox", "--inventory", str(REPO / "deploy/hosts.yaml")])
    assert doc["kind"] == "probe" and (doc["image"], doc["image_id"]) == (IMAGE, IMAGE_ID), doc
    _lock_first(doc["changes"], h.state_dir)
    assert any(" run --rm --name eagle3ops-probe-" in c for c in doc["changes"]), doc["changes"]


def test_regenerate_dry_run_json_is_the_plan_and_its_upload(monkeypatch, tmp_path):
    """``regenerate --dry-run --json``: the conversations to answer, the settings and the upload's commands under
    the host's lock (an extract window of the run reads the folder under it); the serving is not asked."""
    from eagle3ops.config import load_inventory
    from test_lock_first import _facts

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    rec = RecordingHost(facts=_facts, stop_at_lock=False)
    doc = _invoke(monkeypatch, rec, ["regenerate", "sandbox", "--run", "r1", "--limit", "2", "--out",
                                     str(tmp_path / "out"), "--inventory", str(REPO / "deploy/hosts.yaml")])
    assert doc["kind"] == "regenerate" and doc["plan"]["conversations"] == 2 and len(doc["plan"]["to_send"]) == 2
    assert doc["plan"]["settings"]["model"] == h.serving.served_model_name, doc
    d = f"{h.data_dir}/runs/r1/regenerated"
    _lock_first(doc["changes"], h.state_dir)
    assert doc["changes"][3:-1] == [f"mkdir -p {d}", f"tee {d}/dataset.jsonl", f"tee {d}/dataset.manifest.json"], doc


def test_recover_of_serving_stopped_outside_a_window_dry_run_json_is_its_start_under_the_lock(monkeypatch):
    """``recover --dry-run --json`` where serving was stopped outside a window: the container's start between the
    lock and its release; nothing sent."""
    from eagle3ops.config import load_inventory
    from test_lock_first import _facts, _stopped_serving

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    rec = RecordingHost(facts=_stopped_serving(_facts), stop_at_lock=False)
    doc = _invoke(monkeypatch, rec, ["recover", "sandbox", "--inventory", str(REPO / "deploy/hosts.yaml")])
    assert doc["serving_started"] is True, doc
    _lock_first(doc["changes"], h.state_dir)
    assert [c.split()[-2:] for c in doc["changes"] if " start " in c] == [["start", h.serving.container]], doc
    assert all(c.dry_run for c in rec.calls if c.kind != "read")


def test_watch_dry_run_json_is_its_plan_and_scrapes_nothing(monkeypatch):
    """``watch --dry-run --json``: the release watched, its thresholds, where it records, what a breach does; nothing
    scraped or written (the endpoint is never asked)."""
    from eagle3ops.config import load_inventory

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")

    def facts(argv, stdin):
        if argv[0] == "find" and argv[1].endswith("/releases/current"):  # the live release: 7
            return 0, "7\n", ""
        return None

    rec = RecordingHost(facts=facts, stop_at_lock=False)
    doc = _invoke(monkeypatch, rec, ["watch", "sandbox", "--endpoint", "http://127.0.0.1:9/unreachable",
                                     "--inventory", str(REPO / "deploy/hosts.yaml")])
    assert doc["kind"] == "watch" and doc["release"] == 7 and doc["records"]["record"].endswith("/watch/7.jsonl")
    assert doc["on_breach"].startswith("reported") and doc["sustained_minutes"] == h.serving.watch.sustained_minutes
    assert not [c for c in rec.calls if c.kind != "read"]


def test_the_offline_dry_run_prints_its_plan_as_json_without_ssh(monkeypatch, tmp_path):
    """``extract --dry-run --offline --json``: the window's plan from the inventory alone (no host reached)."""
    from eagle3ops import cli, executor

    monkeypatch.setattr(executor, "for_host", lambda *a, **k: pytest.fail("a host was reached"))
    (tmp_path / "p.yaml").write_text(TINY)
    out = CliRunner().invoke(cli.app, ["extract", "sandbox", "--pipeline", str(tmp_path / "p.yaml"), "--dry-run",
                                       "--offline", "--json", "--inventory", str(REPO / "deploy/hosts.yaml")])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["offline"] is True and doc["stages"] == ["prepare", "extract"] and doc["supervisor_commands"], doc


def test_deploy_of_a_venv_host_dry_run_json_is_the_environments_upload_under_the_lock(monkeypatch, tmp_path):
    """``deploy POD --env-tarball FILE --dry-run --json`` (a ``stage_runtime: venv`` host): the environment's digest,
    whether the host holds it (its marker: no), and the upload and record under the lock."""
    from eagle3ops.config import load_inventory
    from test_lock_first import _env_tarball, _facts, _venv_inventory

    inv = _venv_inventory(tmp_path)
    h = load_inventory(inv).host("pod")

    def facts(argv, stdin):
        return (0, "x86_64\n", "") if argv[:1] == ["uname"] else _facts(argv, stdin)

    rec = RecordingHost(facts=facts, stop_at_lock=False)
    doc = _invoke(monkeypatch, rec, ["deploy", "pod", "--env-tarball", str(_env_tarball(tmp_path)),
                                     "--inventory", str(inv)])
    assert doc["kind"] == "deploy" and doc["runtime"] == "venv" and doc["env"]["present"] is False, doc
    assert doc["env"]["image"].startswith("venv:sha256:"), doc
    _lock_first(doc["changes"], h.state_dir)
    assert "eagle3ops-receive-env" in doc["changes"][3] and doc["changes"][4] == f"tee {h.state_dir}/deployed.json"
