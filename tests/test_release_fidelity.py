"""A release keeps the live container's configuration, and the gate sends serving's API key, on the sandbox's
real Docker engine.

Serving (the STAND-IN OpenAI server in the local vLLM base image, :mod:`standin_serving`: the subject here is the
container's configuration and the gate's key, not vLLM; it requires ``--api-key`` as vLLM does) is started by hand with a long ``docker run`` flag list like a real 8-GPU vLLM deployment's (ipc host,
shm size, finite memlock/stack/nofile ulimits within this machine's limits, a tmpfs mount, a device, cap-add,
security-opt, init, log options, user, workdir, stop signal/timeout, a healthcheck, pids limit, group-add, env,
binds, restart policy) and with ``--api-key``: the health gate must send the key it finds in the container's own
configuration, and a release and a rollback must give back a container equal to the recorded one on every
``Config``/``HostConfig`` field except the intended change (the ``--max-num-seqs`` flag), the release label and the
compile cache's two binds to the plan's folder (created by the engine).

The supervisor runs in this process (the code under test; the sandbox's deployed pipeline image holds an older
eagle3ops), against the sandbox engine's socket; the gate reaches serving on the loopback the sandbox shares.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import pytest

import standin_serving
from secretscan import ORG_NAME, leaks, planted_args, planted_env, private, release_record, scan

from eagle3ops.config.plan import HealthCheck, Plan, ReleaseChange
from eagle3ops import health as gate
from eagle3ops.supervisor.releases import Releases
from eagle3ops.supervisor.runner import Supervisor

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]
PORT = 18007
NAME = "e3-fidelity-serving"
KEY = planted_args()[1]  # given as --api-key K and --api-key=K, beside --hf-token and secret env (secretscan)
RELEASE_LABEL = "io.eagle3ops.release"


def _docker(h, *args, check=True):
    return subprocess.run(["docker", "-H", h.docker_host, *args], capture_output=True, text=True, timeout=300,
                          check=check)


def _inspect(h, name=NAME) -> dict:
    return json.loads(_docker(h, "container", "inspect", name).stdout)[0]


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Paths where two inspect sections differ (recursively into dicts)."""
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r} -> {vb!r}")
    return out


def _run_argv(h) -> list[str]:
    s = h.serving
    return [
        "run", "--detach", "--name", NAME, "--network", "host", "--restart", "always",
        "--ipc", "host", "--shm-size", "1g",
        "--ulimit", "memlock=8388608:8388608", "--ulimit", "stack=67108864:67108864",
        "--ulimit", "nofile=16384:16384",
        "--tmpfs", "/tmp/scratch:rw,size=64m",
        "--device", "/dev/fuse:/dev/infiniband/uverbs0",
        "--cap-add", "IPC_LOCK", "--cap-add", "SYS_NICE", "--security-opt", "no-new-privileges",
        "--init", "--user", "0:0", "--workdir", "/tmp", "--group-add", "44",
        "--stop-signal", "SIGINT", "--stop-timeout", "20",
        "--health-cmd", "python3 -c 0", "--health-interval", "30s",
        "--log-driver", "json-file", "--log-opt", "max-size=10m", "--log-opt", "max-file=3",
        "--pids-limit", "4096", "--oom-score-adj", "100", "--cpu-shares", "512",
        "--env", "NCCL_IB_HCA=mlx5", "--env", "NCCL_SOCKET_IFNAME=lo", "--env", "NCCL_DEBUG=WARN",
        "--env", "VLLM_CPU_KVCACHE_SPACE=1", "--env", "OMP_NUM_THREADS=2",
        *[w for k, v in planted_env().items() for w in ("--env", f"{k}={v}")],
        "--label", "team=inference",
        "--volume", f"{h.model_path}:/models/tiny-llama:ro", "--volume", standin_serving.script_volume(h),
        "--entrypoint", standin_serving.ENTRYPOINT[0],
        s.image, *standin_serving.ENTRYPOINT[1:], *standin_serving.args(PORT, s.served_model_name), *planted_args(),
    ]


@pytest.fixture
def hand_started(sandbox_host):
    h = sandbox_host
    _docker(h, "rm", "--force", NAME, check=False)
    _docker(h, *_run_argv(h))
    try:
        gate.wait_healthy(f"http://127.0.0.1:{PORT}", h.serving.served_model_name, api_key=KEY, timeout_s=900,
                          crashed=lambda: None if _inspect(h)["State"]["Running"] else
                          _docker(h, "logs", "--tail", "30", NAME).stderr)
        yield h
    finally:
        _docker(h, "rm", "--force", NAME, check=False)


def _plan(h, tmp_path, kind, **kw):
    wid = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{kind}-{uuid.uuid4().hex[:6]}"
    wdir = tmp_path / "state" / "windows" / wid
    wdir.mkdir(parents=True)
    plan = Plan(window_id=wid, kind=kind, host=h.name, user="pytest", command=f"pytest {kind}",
                state_dir=str(tmp_path / "state"), serving_container=NAME, stop_timeout_s=30, budget_s=1800,
                health=HealthCheck(port=PORT, model=h.serving.served_model_name, timeout_s=900),
                secret_env=[ORG_NAME], **kw)
    return plan, wdir


def test_release_and_rollback_keep_every_setting_and_gate_with_the_api_key(hand_started, tmp_path, capfd):
    import docker

    h = hand_started
    # The server requires its key: a client without it gets 401 (what main's gate did, failing every release).
    with pytest.raises(gate.ProbeFailed, match="401"):
        gate.probe(f"http://127.0.0.1:{PORT}", h.serving.served_model_name)
    before = _inspect(h)
    client = docker.DockerClient(base_url=h.docker_host, timeout=600)

    # The compile cache (user 0:0, no mount of its own) is bound to the plan's folder, which the engine creates.
    cache = tmp_path / "compile-cache"
    cache_binds = [f"{cache}/vllm:/root/.cache/vllm", f"{cache}/torchinductor:/tmp/torchinductor_root"]
    plan, wdir = _plan(h, tmp_path, "release", change=ReleaseChange(args=["--max-num-seqs", "8"]),
                       compile_cache=str(cache))
    res = Supervisor(plan, client, wdir).run()
    assert res["outcome"] == "ok" and res["serving_healthy"] and res["release"] == 2, res
    released = _inspect(h)
    assert released["Id"] != before["Id"], "the release recreated the container"
    assert released["HostConfig"]["Binds"] == before["HostConfig"]["Binds"] + cache_binds
    assert (cache / "vllm").is_dir() and (cache / "torchinductor").is_dir()
    released["HostConfig"]["Binds"] = before["HostConfig"]["Binds"]
    diff = _diff(before["Config"], released["Config"], "Config.") + _diff(before["HostConfig"],
                                                                         released["HostConfig"], "HostConfig.")
    assert sorted(d.split(":")[0] for d in diff) == ["Config.Cmd", f"Config.Labels.{RELEASE_LABEL}"], diff
    assert released["Config"]["Cmd"][-2:] == ["--max-num-seqs", "8"]
    assert released["Config"]["Cmd"][:-2] == before["Config"]["Cmd"]

    plan, wdir2 = _plan(h, tmp_path, "rollback", compile_cache=str(cache))
    res = Supervisor(plan, client, wdir2).run()
    assert res["outcome"] == "ok" and res["serving_healthy"] and res["release"] == 1, res
    back = _inspect(h)
    assert back["HostConfig"]["Binds"] == before["HostConfig"]["Binds"] + cache_binds, "release 1 keeps it too"
    back["HostConfig"]["Binds"] = before["HostConfig"]["Binds"]
    diff = _diff(before["Config"], back["Config"], "Config.") + _diff(before["HostConfig"], back["HostConfig"],
                                                                       "HostConfig.")
    assert diff == [f"Config.Labels.{RELEASE_LABEL}: None -> '1'"], diff
    assert Releases(tmp_path / "state").history() == [1, 2, 1]

    # The secrets went nowhere they must not: no file of the state dir but the 0600 release records (the rolled-back
    # container above kept its key and environment from them), no label, not the supervisor's log.
    assert planted_args()[-2:] == back["Config"]["Cmd"][-2:] and KEY in back["Config"]["Cmd"]
    assert all(f"{k}={v}" in back["Config"]["Env"] for k, v in planted_env().items())
    found = scan([tmp_path / "state"], allowed=release_record)
    assert found == {}, found
    records = [p for p in (tmp_path / "state").rglob("*") if p.is_file() and release_record(p)]
    assert len(records) >= 4 and [private(p) for p in records] == [None] * len(records), records
    assert leaks(json.dumps(back["Config"]["Labels"])) == [] and leaks("".join(capfd.readouterr())) == []
