"""The supervisor's wait for GPU memory to be released after serving stops.

No GPU here: the Docker client is a stand-in (it stands in for the docker SDK's ``DockerClient`` running
``nvidia-smi --query-compute-apps=pid`` in the pipeline image on a GPU host) that answers with a scripted sequence
of PID lists. What is tested is the supervisor's polling, its time limit and its journal, not nvidia-smi.
"""

from __future__ import annotations

import json

from eagle3ops.config.plan import HealthCheck, Plan, StageStep
from eagle3ops.supervisor.runner import Supervisor


class StandInContainers:
    """Stand-in for ``DockerClient.containers``: ``run`` returns the next scripted nvidia-smi output."""

    def __init__(self, outputs: list[bytes]):
        self.outputs, self.calls = list(outputs), []

    def run(self, image, **kw):
        self.calls.append((image, kw))
        return self.outputs.pop(0) if len(self.outputs) > 1 else self.outputs[0]


class StandInClient:
    def __init__(self, outputs: list[bytes]):
        self.containers = StandInContainers(outputs)


def _supervisor(tmp_path, outputs):
    plan = Plan(window_id="w1", kind="window", host="h", user="u", command="c", state_dir=str(tmp_path / "state"),
                serving_container="vllm", health=HealthCheck(port=1, model="m", timeout_s=1), gpus=8,
                stages=[StageStep(name="prepare", spec={"image": "pipeline:1", "name": "s"}, timeout_s=10)])
    wdir = tmp_path / "w1"
    wdir.mkdir()
    client = StandInClient(outputs)
    return Supervisor(plan, client, wdir), client, wdir


def _journal(wdir):
    return [json.loads(x) for x in (wdir / "journal.jsonl").read_text().splitlines()]


def test_waits_until_no_process_holds_gpu_memory(tmp_path):
    sup, client, wdir = _supervisor(tmp_path, [b"4242\n4243\n", b"4242\n", b"\n"])
    sup._wait_gpus_free(timeout=30, poll_s=0.01)
    calls = client.containers.calls
    assert len(calls) == 3
    image, kw = calls[0]
    assert image == "pipeline:1" and kw["entrypoint"] == ["nvidia-smi"] and kw["remove"] is True
    assert kw["device_requests"][0]["Count"] == -1 and kw["device_requests"][0]["Capabilities"] == [["gpu"]]
    assert [(e["step"], e["event"]) for e in _journal(wdir)] == [("gpu-release", "start"), ("gpu-release", "ok")]


def test_gives_up_with_a_warning_naming_the_holders(tmp_path):
    sup, client, wdir = _supervisor(tmp_path, [b"4242\n"])
    sup._wait_gpus_free(timeout=0.2, poll_s=0.05)
    last = _journal(wdir)[-1]
    assert (last["step"], last["event"]) == ("gpu-release", "warn") and "4242" in last["message"]
    assert len(client.containers.calls) >= 2
