"""The pure parts: where a window's record and the live server disagree (the sandbox test is
tests/test_live_truth.py)."""

from __future__ import annotations

from eagle3ops.commands import docker as dk
from eagle3ops.commands import host as hc
from eagle3ops.commands.types import Change, Read
from eagle3ops.config import load_inventory
from eagle3ops.window.live import LiveServing, disagreement
from pathlib import Path

OK = {"serving_running": True, "serving_healthy": True}
DOWN = {"serving_running": False, "serving_healthy": False}


def test_stopped_outside_a_window_disagrees_with_an_ok_record():
    live = LiveServing("container 'vllm' is exited", False, "/health: no answer", False)
    note = disagreement(OK, "W1", live)
    assert note and "W1" in note and "DISAGREES" in note and "container 'vllm' is exited" in note
    assert "eagle3ops recover HOST" in note


def test_running_but_not_answering_disagrees():
    note = disagreement(OK, "W1", LiveServing("container 'vllm' is running", True, "/health 503", False))
    assert note and "/health 503" in note and "does not answer" in note


def test_started_outside_eagle3ops_disagrees_with_a_failed_record():
    note = disagreement(DOWN, "W2", LiveServing("container 'vllm' is running", True, "/health 200", True))
    assert note and "started outside eagle3ops" in note


def test_agreement_and_nothing_to_compare_say_nothing():
    assert disagreement(OK, "W", LiveServing("container 'v' is running", True, "/health 200", True)) is None
    assert disagreement(DOWN, "W", LiveServing("container 'v' is exited", False, "/health: no answer", False)) is None
    assert disagreement(None, None, LiveServing("container 'v' is exited", False, "", False)) is None
    assert disagreement(OK, "W", LiveServing("no serving (serving: none)", None, "", None)) is None


def test_the_commands_are_typed():
    h = load_inventory(Path(__file__).resolve().parents[1] / "deploy/hosts.yaml").host("sandbox")
    assert isinstance(dk.start(h, "vllm"), Change) and list(dk.start(h, "vllm"))[-2:] == ["start", "vllm"]
    probe = hc.http_status("http://127.0.0.1:8000/health")
    assert isinstance(probe, Read) and list(probe)[0] == "curl" and list(probe)[-1].endswith("/health")
