"""Serving managed by Docker Compose (kind ``compose``) on the sandbox: real Compose (v1, Debian's docker-compose),
real sshd, real dockerd; the service's server is the STAND-IN OpenAI server (:mod:`standin_serving`, NOT vLLM: the
subject is Compose's service container, found, stopped, restored and recreated by eagle3ops).

A second serving service (port 18001) is brought up by ``docker-compose`` on the sandbox's engine; eagle3ops finds it
by its Compose labels, runs an extract window around it (stop → stages → restore, health-gated) and a release that
recreates it; after each, Compose still lists the service's container and it serves.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

import standin_serving

from eagle3ops_dev import demo
from eagle3ops.remote import Remote
from eagle3ops.config.plan import ReleaseChange
from eagle3ops.window.run import run_window

pytestmark = [pytest.mark.sandbox, pytest.mark.images, pytest.mark.slow]
PROJECT, SERVICE, PORT = "e3compose", "vllm", 18001
#: The stages around which the window stops and restores the service: extraction with the transformers engine (the
#: subject is Compose's service container, not the extraction; vLLM's engine start cost ~30 s of CPU in every CI run).
TINY = """target_model: /model
prepare: {datasets: [builtin:sharegpt], max_seq_len: 256, max_samples: 8}
extract: {batch_size: 8, engine: transformers}
"""


def _compose_file(h, path: Path) -> Path:
    s = h.serving
    svc = {"image": s.image, "entrypoint": standin_serving.ENTRYPOINT,
           "command": standin_serving.args(PORT, s.served_model_name), "environment": dict(s.env),
           "volumes": [*s.volumes, standin_serving.script_volume(h)], "network_mode": "host",
           "restart": "unless-stopped"}
    path.write_text(json.dumps({"version": "2.4", "services": {SERVICE: svc}}, indent=2))  # JSON is YAML
    return path


def _compose(h, compose_file: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DOCKER_HOST": h.docker_host}
    return subprocess.run(["docker-compose", "-p", PROJECT, "-f", str(compose_file), *args], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def compose_host(deployed, tmp_path):
    h, dep = deployed
    state = Path(h.state_dir + "-compose")
    state.mkdir(exist_ok=True)
    subprocess.run(["chown", "-R", "e3ops:e3ops", str(state)], check=True)
    ch = h.model_copy(update={"name": "sandbox-compose", "state_dir": str(state), "serving": h.serving.model_copy(
        update={"kind": "compose", "compose_project": PROJECT, "compose_service": SERVICE, "port": PORT,
                "args": standin_serving.args(PORT, h.serving.served_model_name)})})
    cf = _compose_file(h, tmp_path / "compose.yaml")
    up = _compose(ch, cf, "up", "-d")
    assert up.returncode == 0, up.stderr
    try:
        deadline = time.time() + 600
        while not demo.serving_healthy(ch, completion=True):
            assert time.time() < deadline, _compose(ch, cf, "logs", "--tail", "30").stdout
            time.sleep(3)
        yield ch, dep, cf
    finally:
        _compose(ch, cf, "down", "--timeout", "5")


def _service_containers(ch, cf) -> list[str]:
    out = _compose(ch, cf, "ps", "-q", SERVICE)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_window_and_release_on_a_compose_service(compose_host):
    ch, dep, cf = compose_host
    [cid] = _service_containers(ch, cf)
    run = f"compose-{uuid.uuid4().hex[:8]}"
    with Remote(ch) as r:
        res = run_window(r, kind="extract", image=dep.tag, expected_image_id=dep.image_id,
                         command="pytest compose extract", run=run, pipeline_text=TINY)
    assert res["outcome"] == "ok" and res["stages"] == {"prepare": "ok", "extract": "ok"}, res
    # The same Compose container was stopped and started again, and it serves.
    assert _service_containers(ch, cf) == [cid]
    assert demo.serving_healthy(ch, timeout=10, completion=True)

    with Remote(ch) as r:
        rel = run_window(r, kind="release", image=dep.tag, expected_image_id=dep.image_id,
                         command="pytest compose release", change=ReleaseChange(args=["--max-num-seqs", "4"]))
    assert rel["outcome"] == "ok", rel
    # Recreated by eagle3ops: a new container, still Compose's service container, running the new flag.
    [new] = _service_containers(ch, cf)
    assert new != cid
    env = {**os.environ, "DOCKER_HOST": ch.docker_host}
    cmd = json.loads(subprocess.run(["docker", "inspect", "--format", "{{json .Config.Cmd}}", new], env=env,
                                    capture_output=True, text=True, check=True).stdout)
    assert cmd[-2:] == ["--max-num-seqs", "4"]
    # The deployed supervisor kept the compile cache on the host: both cache folders bound under data_dir.
    binds = json.loads(subprocess.run(["docker", "inspect", "--format", "{{json .HostConfig.Binds}}", new], env=env,
                                      capture_output=True, text=True, check=True).stdout)
    assert {f"{ch.data_dir}/compile-cache/vllm:/root/.cache/vllm",
            f"{ch.data_dir}/compile-cache/torchinductor:/tmp/torchinductor_root"} <= set(binds), binds
    assert demo.serving_healthy(ch, timeout=10, completion=True)
