"""``--dry-run --json``: every host-changing command that plans a window or a copy prints its plan as one JSON
document on stdout (the commands it would run go to stderr), its secrets masked, and changes nothing.

One table over the CLI, each command run against the stand-in host of ``test_window_driver`` (files, ``df``,
containers answered in memory) behind the recording host's transport (:mod:`recording_host`): the product's
``Remote`` runs the reads and records the changes without sending them, as a dry run does.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from recording_host import RecordingHost
from test_lock_first import ABSENT, _push, _two_host_facts, _two_hosts
from test_window_driver import REPO, TINY, _host_with_serving

#: (command line, the JSON path that holds the plan, a check of it); ``{pipeline}`` is a tiny pipeline config.
#: ``train`` prints through the same path as ``extract`` (``cli._window``); its dry run on this stand-in host
#: refuses before a plan (no finished extract), so it is not in the table.
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
