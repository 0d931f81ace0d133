"""A keyed container's release and rollback on the sandbox's real Docker engine: every setting kept but the
change, the release label and the compile cache's two binds.

Serving (the STAND-IN OpenAI server in the local vLLM base image, :mod:`standin_serving`: the subject here is the
container's configuration and the gate's key, not vLLM; it requires ``--api-key`` as vLLM does) is started by hand with a long ``docker run`` flag list like a real 8-GPU vLLM deployment's (ipc host,
shm size, finite memlock/stack/nofile ulimits within this machine's limits, a tmpfs mount, a device, cap-add,
security-opt, init, log options, user, workdir, stop signal/timeout, a healthcheck, pids limit, group-add, env,
binds, restart policy) and with ``--api-key``: the health gate must send the key it finds in the container's own
configuration, and a release and a rollback must give back a container equal to the recorded one on every
``Config``/``HostConfig`` field except the intended change (the ``--max-num-seqs`` flag), the release label and the
compile cache's two binds to the plan's folder (created by the engine).

Everything runs as a user runs it: the ``eagle3ops`` CLI over SSH, the supervisor in the pipeline image deployed on
the sandbox (built from this checkout by the ``deployed`` fixture), against the sandbox engine; the gate reaches
serving on the loopback the sandbox shares. The container also carries every form of secret (:mod:`secretscan`),
which must end up only in the private release records.
"""

from __future__ import annotations

import json
import pwd
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import standin_serving
from secretscan import ORG_NAME, leaks, planted_args, planted_env, private, scan_with_records

from eagle3ops import health as gate
from eagle3ops.supervisor.releases import Releases

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


#: A run of two stages small enough for a CPU (the fault suite's: prepare + extract with the transformers engine).
TINY_HF = """target_model: /model
prepare: {datasets: [builtin:sharegpt], max_seq_len: 128, max_samples: 4}
extract: {batch_size: 4, engine: transformers}
vocab: {draft_vocab_size: 512}
train: {steps: 2, checkpoint_every: 1, batch_max_tokens: 512}
"""


@pytest.fixture
def keyed_inventory(hand_started, deployed, tmp_path):
    """An inventory file holding the hand-started keyed container as host ``sandbox-keyed``: its own state and data
    dirs (empty at start, so that every file in them is this test's), the deployed pipeline image's record, the
    inventory's own secret name (``secret_env``) and a gate sized for seconds that keeps what is not ten times
    slower (``--margin 0.9``: ``release --gate`` keeps a change not slower than x0.1 of the live release; the subject
    is the secrets and the container's settings, not the verdict)."""
    import yaml

    h = hand_started
    root = Path(h.state_dir).parent
    state, data = root / "state-keyed", root / "data-keyed"
    for d in (state, data):
        subprocess.run(["rm", "-rf", str(d)], check=True)
        d.mkdir()
    shutil.copy(Path(h.state_dir) / "deployed.json", state / "deployed.json")
    subprocess.run(["chown", "-R", f"{h.user}:{h.user}", str(state), str(data)], check=True)
    kh = h.model_copy(update={"name": "sandbox-keyed", "state_dir": str(state), "data_dir": str(data),
                              "secret_env": [ORG_NAME], "serving": h.serving.model_copy(update={
                                  "container": NAME, "port": PORT, "health_timeout_s": 120, "stop_timeout_s": 30,
                                  "gate_concurrency": [1], "gate_passes": 3, "gate_prompts": 1,
                                  "gate_max_tokens": 4, "gate_warmup_prompts": 0, "gate_accept_low_power": True,
                                  "gate_ttft_ratio_max": 100.0, "speculative_image": None})})
    host = kh.model_dump(mode="json", exclude_unset=True)
    host.pop("name")
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": {kh.name: host}}, sort_keys=False))
    yield path, kh


def _keyed(h) -> None:
    """The server demands its key (a client without it gets 401) and takes it."""
    with pytest.raises(gate.ProbeFailed, match="401"):
        gate.probe(f"http://127.0.0.1:{PORT}", h.serving.served_model_name)
    gate.probe(f"http://127.0.0.1:{PORT}", h.serving.served_model_name, api_key=KEY)


@pytest.mark.images
def test_release_and_rollback_keep_every_setting_and_gate_with_the_api_key(keyed_inventory, tmp_path):
    """Through the CLI over SSH, as a user runs it: a gated release (``release --gate``, measured with the key and
    kept) and a rollback of the keyed container (every ``Config``/``HostConfig`` field kept but the change and the
    release label; the rolled-back server demands and takes its key), a stage window (prepare + extract) and the
    run's report. The secrets planted (``--api-key K``, ``--api-key=K``,
    ``--hf-token``, ``VLLM_API_KEY``, ``HF_TOKEN``, the inventory-named ``ORG_TOKEN``) are in no file under the
    host's state and data dirs nor the report's folder but the release records (mode 0600, the SSH user's), in no
    label and in no output of the CLI (stdout and stderr)."""
    inv, h = keyed_inventory
    _keyed(h)  # what main's gate once lacked, failing every release
    before = _inspect(h)
    run = f"keyed-{uuid.uuid4().hex[:8]}"
    (tmp_path / "pipeline.yaml").write_text(TINY_HF)
    said: list[str] = []
    took: dict[str, float] = {}

    def cli(*args: str, ok: tuple[int, ...] = (0,)) -> int:
        t0 = time.monotonic()
        cp = subprocess.run([sys.executable, "-m", "eagle3ops", *args, "--inventory", str(inv)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=900)
        took[" ".join(args[:2])] = round(time.monotonic() - t0, 1)
        said.append(cp.stdout + cp.stderr)
        assert cp.returncode in ok, f"{args}: exit {cp.returncode}\n{cp.stdout[-3000:]}\n{cp.stderr[-3000:]}"
        return cp.returncode

    cli("release", h.name, "--gate", "--margin", "0.9", "--arg=--max-num-seqs=8")  # exit 0: kept
    # The compile cache (user 0:0, no mount of its own) is bound to the host's <data_dir>/compile-cache, which the
    # engine creates.
    cache = Path(h.data_dir) / "compile-cache"
    cache_binds = [f"{cache}/vllm:/root/.cache/vllm", f"{cache}/torchinductor:/tmp/torchinductor_root"]
    released = _inspect(h)
    assert released["Id"] != before["Id"], "the release recreated the container"
    assert released["HostConfig"]["Binds"] == before["HostConfig"]["Binds"] + cache_binds
    assert (cache / "vllm").is_dir() and (cache / "torchinductor").is_dir()
    released["HostConfig"]["Binds"] = before["HostConfig"]["Binds"]
    diff = _diff(before["Config"], released["Config"], "Config.") + _diff(before["HostConfig"],
                                                                         released["HostConfig"], "HostConfig.")
    assert sorted(d.split(":")[0] for d in diff) == ["Config.Cmd", f"Config.Labels.{RELEASE_LABEL}"], diff
    assert released["Config"]["Cmd"] == [*before["Config"]["Cmd"], "--max-num-seqs=8"]

    cli("rollback", h.name)
    back = _inspect(h)
    assert back["HostConfig"]["Binds"] == before["HostConfig"]["Binds"] + cache_binds, "release 1 keeps it too"
    back["HostConfig"]["Binds"] = before["HostConfig"]["Binds"]
    diff = _diff(before["Config"], back["Config"], "Config.") + _diff(before["HostConfig"], back["HostConfig"],
                                                                       "HostConfig.")
    assert diff == [f"Config.Labels.{RELEASE_LABEL}: None -> '1'"], diff
    live = Releases(Path(h.state_dir)).history()
    assert live[0] == live[-1] == 1 and 2 in live, live
    _keyed(h)  # recreated from its records: the key it needs is back, with its environment
    assert planted_args()[-2:] == back["Config"]["Cmd"][-2:] and KEY in back["Config"]["Cmd"]
    assert all(f"{k}={v}" in back["Config"]["Env"] for k, v in planted_env().items())

    cli("extract", h.name, "--run", run, "--pipeline", str(tmp_path / "pipeline.yaml"))
    _keyed(h)  # restored by the window as it was
    cli("report", h.name, "--run", run, "--out", str(tmp_path / "reports"))
    print(f"keyed CLI runs (s): {took}")
    assert any((tmp_path / "reports").rglob("*.html")), "report wrote no page"
    assert list(Path(h.data_dir).glob(f"runs/{run}/*/*.json")), "the stage window wrote no manifest"

    found, records = scan_with_records([Path(h.state_dir), Path(h.data_dir), tmp_path / "reports"])
    assert found == {}, found
    assert [p for p in records if p.parent.name == "releases"], records
    owner = pwd.getpwnam(h.user).pw_uid  # the SSH user: the supervisor's container writes them as that user's
    assert [private(p, {owner}) for p in records] == [None] * len(records)
    assert leaks(json.dumps(_inspect(h)["Config"]["Labels"])) == []
    shown = {i: leaks(out) for i, out in enumerate(said) if leaks(out)}
    assert shown == {}, f"the CLI's output shows secrets: {shown}"
