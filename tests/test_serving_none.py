"""``serving: none``: hosts that only train. The inventory accepts it (shorthand and mapping) and refuses
serving keys beside it; a window's plan (pure) has no serving container and no gate, its dry-run and preflight say
the stop, restore and health gate are skipped; the supervisor (stand-in Docker client) runs only the stages and
leaves every container alone; release, rollback and speculate refuse the host naming it and the inventory key.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3ops.config import ConfigError, load_inventory
from eagle3ops.config.docs import docs
from eagle3ops.config.plan import NO_SERVING_NOTE, StageStep
from eagle3ops.remote import render
from eagle3ops.supervisor.runner import Supervisor
from eagle3ops.window import run as wrun
from eagle3ops.window.common import WindowError
from eagle3ops.window.lock import _serving_ok
from eagle3ops.window.planner import build_plan, supervisor_commands
from test_supervisor_resume import StandInClient, _steps
from test_window_driver import IMAGE, IMAGE_ID, TINY, StandInRemote, _host_with_serving

REPO = Path(__file__).resolve().parents[1]

BASE = """
hosts:
  trainer:
    hostname: rented-01
    data_dir: /data
    state_dir: /var/lib/e3
    model_path: /models/m
"""


def _load(tmp_path: Path, serving: str):
    p = tmp_path / "hosts.yaml"
    p.write_text(BASE + serving)
    return load_inventory(p).host("trainer")


def test_serving_none_shorthand_and_mapping_load(tmp_path):
    for text in ("    serving: none\n", "    serving: {kind: none}\n", "    serving:\n      kind: none\n"):
        h = _load(tmp_path, text)
        assert h.serving.kind == "none" and not h.serving.managed
    assert _load(tmp_path, "    serving: {image: i, served_model_name: m}\n").serving.managed


def test_serving_none_with_serving_keys_or_a_bad_word_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"hosts\.trainer\.serving.*kind: none.*\['image', 'port'\].*remove"):
        _load(tmp_path, "    serving: {kind: none, image: vllm/vllm-openai:v0.16.0, port: 8000}\n")
    with pytest.raises(ConfigError, match=r"hosts\.trainer\.serving.*mapping of serving settings.*`none`.*'off'"):
        _load(tmp_path, "    serving: 'off'\n")
    with pytest.raises(ConfigError, match=r"hosts\.trainer\.serving.*`image` and `served_model_name`.*serving: none"):
        _load(tmp_path, "    serving: {kind: container}\n")


def test_config_docs_show_serving_none():
    text = docs("inventory")
    assert "`none`" in text and "serving: none" in text and "only trains" in text
    assert "serving: none" in (REPO / "deploy/hosts.yaml").read_text()  # the commented example beside gpu-01


@pytest.fixture
def trainer():
    """The sandbox host of the checked-in inventory with ``serving: none`` (same SSH, engine and paths)."""
    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    return h.model_copy(update={"serving": type(h.serving)(kind="none")})


def test_window_plan_of_a_host_without_serving(trainer):
    plan = build_plan(trainer, kind="window", window_id="w1", image=IMAGE, command="c", stages=["prepare", "extract"])
    assert (plan.serving_kind, plan.serving_container, plan.health) == ("none", "", None)
    assert plan.reserve_s() == 0.0  # nothing to restore: the stages may use the whole budget
    cmds = [render(c) for c in supervisor_commands(trainer, plan)]
    assert len(cmds) == 2 and all(" run --detach " in c for c in cmds), cmds
    assert not any(w in c for c in cmds for w in (" stop ", " start ", "/health", "vllm-serving"))
    with pytest.raises(ValueError, match="has no serving"):
        build_plan(trainer, kind="release", window_id="w2", image=IMAGE, command="c")


def test_dry_run_and_preflight_say_what_is_skipped(trainer):
    world = _host_with_serving(trainer)
    r = StandInRemote(trainer, world, dry_run=True)
    echoed, events = [], []
    r.echo = echoed.append
    res = wrun.run_window(r, kind="extract", image=IMAGE, expected_image_id=IMAGE_ID, command="c",
                          pipeline_text=TINY, on_event=events.append)
    assert res["serving"] == "none"
    assert f"# {trainer.name}: {NO_SERVING_NOTE}" in echoed
    assert any(e.get("check") == "serving" and e["detail"] == NO_SERVING_NOTE for e in events)
    assert not any("vllm-serving" in c for c in res["commands"])  # the serving container is not even inspected


@pytest.mark.parametrize("kind", ["release", "rollback"])
def test_release_and_rollback_refuse_a_host_without_serving(trainer, kind):
    world = _host_with_serving(trainer)
    with pytest.raises(WindowError, match=rf"host sandbox has no serving: `hosts\.sandbox\.serving` is `none`.*{kind}"):
        wrun.run_window(StandInRemote(trainer, world), kind=kind, image=IMAGE, expected_image_id=IMAGE_ID,
                        command="c")
    assert world.writes == []  # refused before the lock: nothing written


def test_speculate_refuses_a_host_without_serving(trainer):
    from eagle3ops.speculate.ship import SpeculateOptions, speculate

    world = _host_with_serving(trainer)
    with pytest.raises(WindowError, match="host sandbox has no serving.*speculate"):
        speculate(StandInRemote(trainer, world), SpeculateOptions(run="r", pipeline_image=IMAGE,
                                                                  pipeline_image_id=IMAGE_ID))
    assert world.writes == []


def test_supervisor_runs_only_the_stages_and_leaves_containers_alone(tmp_path, trainer):
    client = StandInClient()  # has a running container "vllm": a trainer's own, not production serving
    plan = build_plan(trainer.model_copy(update={"state_dir": str(tmp_path / "state")}), kind="window",
                      window_id="w1", image=IMAGE, command="c", stages=["prepare", "extract"])
    plan = plan.model_copy(update={"stages": [StageStep(name=s.name, spec={"image": "pipeline:1",
                                                                           "name": f"stage-{s.name}"}, timeout_s=10)
                                              for s in plan.stages]})
    wdir = tmp_path / "w1"
    wdir.mkdir()
    (tmp_path / "state" / "lock").mkdir(parents=True)
    (tmp_path / "state" / "lock" / "details.json").write_text(json.dumps({"window_id": "w1"}))
    res = Supervisor(plan, client, wdir).run()
    assert res["outcome"] == "ok" and res["serving"] == "none" and res["serving_note"] == NO_SERVING_NOTE
    assert res["downtime_s"] is None and res["serving_running"] is None
    assert client.stage_runs == ["stage-prepare", "stage-extract"]
    assert client.serving.status == "running" and client.created == ["pipeline:1", "pipeline:1"]
    steps = _steps(wdir)
    assert ("serving", "skip") in steps and not {s for s, _ in steps} & {"record", "stop", "restore", "health"}
    assert not (tmp_path / "state" / "lock").exists()  # released: a trainer's window ends with nothing to restore
    assert _serving_ok(res)


@pytest.mark.sandbox
@pytest.mark.images
def test_window_on_the_sandbox_as_a_host_without_serving_leaves_serving_alone(deployed, tmp_path):
    """An inventory entry for the sandbox with ``serving: none`` runs a real window (an extract window on a fresh
    run whose dataset file is missing: its prepare stage runs for real and fails at once, the cheapest real stage
    run); the sandbox's serving container is never stopped or restarted (same ``StartedAt``), the lock is released, the audit
    says so."""
    import uuid

    import yaml

    from eagle3ops.commands import docker as dk
    from eagle3ops.remote import Remote
    from eagle3ops.window.common import audit_entries
    from eagle3ops.window.lock import read_lock

    h, dep = deployed
    raw = yaml.safe_load((REPO / "deploy/hosts.yaml").read_text())["hosts"]["sandbox"]
    raw.update(identity_file=str(h.identity_file), known_hosts=str(h.known_hosts), port=h.port,
               docker_host=h.docker_host, data_dir=h.data_dir, state_dir=h.state_dir, model_path=h.model_path,
               serving="none")
    inv = tmp_path / "hosts.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"trainer": raw}}))
    trainer = load_inventory(inv).host("trainer")
    assert trainer.serving.kind == "none"
    started = dk.docker(h, "inspect", "--format", "{{.State.StartedAt}} {{.State.Status}}", h.serving.container)
    with Remote(h) as r:
        before = r.run(started).stdout.strip()
    # prepare fails at once on its missing dataset (a train window on a fresh run is refused: extract not ready)
    pipeline = TINY.replace("builtin:sharegpt", "missing-stand-in.jsonl")
    assert pipeline != TINY
    with Remote(trainer) as r:
        res = wrun.run_window(r, kind="extract", image=dep.tag, expected_image_id=dep.image_id,
                              command="pytest serving-none", run=f"none-{uuid.uuid4().hex[:8]}",
                              pipeline_text=pipeline)
        assert read_lock(r) is None
        audit = [e for e in audit_entries(r) if e.get("window") == res["window_id"]]
    assert res["serving"] == "none" and res["downtime_s"] is None, res
    assert res["stages"]["prepare"].startswith("failed") and "extract" not in res["stages"], res
    assert "missing-stand-in.jsonl" in res["stages"]["prepare"], res
    assert audit and audit[-1]["outcome"] == "failed"
    with Remote(h) as r:
        assert r.run(started).stdout.strip() == before and before.endswith(" running"), "serving was touched"


def test_process_serving_needs_a_match_and_no_image(tmp_path):
    h = _load(tmp_path, "    serving: {kind: process, process_match: 'ml-env/bin/vllm serve', served_model_name: m}\n")
    assert (h.serving.kind, h.serving.process_match, h.serving.image) == ("process", "ml-env/bin/vllm serve", None)
    with pytest.raises(ConfigError, match=r"hosts\.trainer\.serving.*kind `process` needs `process_match`"):
        _load(tmp_path, "    serving: {kind: process, served_model_name: m}\n")
    with pytest.raises(ConfigError, match=r"`process_match` is set but `kind` is not `process`"):
        _load(tmp_path, "    serving: {image: i, served_model_name: m, process_match: vllm}\n")
    assert "`process_match`" in docs("inventory") and "kind: process" in (REPO / "deploy/hosts.yaml").read_text()


def test_speculate_on_systemd_serving_refuses_a_control_release_before_touching_the_host():
    """A systemd unit is speculated on as a process is (its releases are drop-ins: tests/test_systemd_real.py); it
    serves no image, so ``--control`` (the speculative image without speculation) is refused, naming the kind,
    before anything is written."""
    from eagle3ops.speculate.ship import SpeculateError, SpeculateOptions, speculate

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    h = h.model_copy(update={"serving": type(h.serving)(kind="systemd", unit="vllm.service",
                                                        served_model_name="m")})
    world = _host_with_serving(h)
    with pytest.raises(SpeculateError, match="--control: this host serves with a systemd \\(no image\\)"):
        speculate(StandInRemote(h, world), SpeculateOptions(run="r", pipeline_image=IMAGE, pipeline_image_id=IMAGE_ID,
                                                            control=True))
    assert world.writes == []
