"""Session fixtures with real parts: the sandbox host (sshd + its own dockerd), the built images, production serving.

Each fixture builds or starts what is missing and reuses what is already there, so a second run is fast. They are
the same functions ``make demo`` uses (:mod:`eagle3ops_dev.demo`).

The host suite runs in two parts (``pytest --part sandbox|rest``): ``--part sandbox`` runs every test that reaches
the inventory's sandbox host (one sshd, one engine, one serving port, one lock), one after another; ``--part rest``
runs all the others (pure tests, the local build engine, and the modules that bring up sandboxes of their own, each
module whole). Which part a test is in: :func:`part_of`. README's ``make test`` runs the two parts and the in-image
suite side by side (``scripts/test.sh``); without ``--part`` every test runs in one process (``make test-serial``).
pytest-xdist's ``loadgroup`` would do the split, but xdist 3.8 writes the group into ``item._nodeid``, which pytest 9
no longer reads: the groups were silently ignored.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
INVENTORY = REPO / "deploy/hosts.yaml"
#: Fixtures that reach the inventory's sandbox host (directly or through the fixtures they use).
SANDBOX_FIXTURES = frozenset({"sandbox_host", "deployed", "speculative_image", "standin_deployed",
                              "standin_inventory"})
PARTS = ("sandbox", "rest")


def part_of(item: pytest.Item) -> str:
    """``sandbox`` for a test that uses a :data:`SANDBOX_FIXTURES` fixture (the closure of its fixtures) or is marked
    ``sandbox`` and brings up no sandbox of its own (its module's ``OWN_SANDBOX``); ``rest`` otherwise."""
    if SANDBOX_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "sandbox"
    if getattr(getattr(item, "module", None), "OWN_SANDBOX", None):
        return "rest"
    return "sandbox" if item.get_closest_marker("sandbox") else "rest"


def pytest_addoption(parser):
    parser.addoption("--part", choices=PARTS, default=None,
                     help="run only this part of the host suite (by hand; make test runs the whole suite)")


@pytest.hookimpl(trylast=True)  # after -m/-k deselection: a run of pure tests never waits for the sandbox
def pytest_collection_modifyitems(config, items):
    part = config.getoption("--part")
    if part is not None:
        keep, dropped = [], []
        for item in items:
            (keep if part_of(item) == part else dropped).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    if not config.option.collectonly and any(part_of(item) == "sandbox" for item in items):
        _hold_sandbox(config)


def _hold_sandbox(config) -> None:
    """Take the inventory's sandbox for this run (:func:`eagle3ops_dev.sandbox.hold.hold`: an exclusive flock,
    waited for at most 30 min, saying who holds it), kept until the process exits: a second run on this machine
    (another checkout's ``make test``, a CI clone) waits instead of taking the first one's deploy lock. Taken here,
    at collection, not in a fixture: pytest-timeout's 600 s would count the wait against the first test."""
    from eagle3ops.config import load_inventory
    from eagle3ops_dev.sandbox import name_of
    from eagle3ops_dev.sandbox.hold import hold

    h = load_inventory(INVENTORY).host("sandbox")
    config.stash[_HOLD] = hold(name_of(h.docker_host or ""))


_HOLD = pytest.StashKey()


@pytest.fixture(scope="session", autouse=True)
def local_audit_log(tmp_path_factory):
    """The driver's local audit log (commands that never reached their host) in a temp dir, not the user's home;
    subprocesses inherit it."""
    import os

    path = tmp_path_factory.mktemp("local-audit") / "audit.jsonl"
    old = os.environ.get("EAGLE3OPS_LOCAL_AUDIT")
    os.environ["EAGLE3OPS_LOCAL_AUDIT"] = str(path)
    yield path
    if old is None:
        os.environ.pop("EAGLE3OPS_LOCAL_AUDIT", None)
    else:
        os.environ["EAGLE3OPS_LOCAL_AUDIT"] = old


@pytest.fixture(scope="session")
def sandbox_host():
    """The inventory's ``sandbox`` host, brought up (idempotent)."""
    from eagle3ops.config import load_inventory
    from eagle3ops_dev import sandbox

    h = load_inventory(INVENTORY).host("sandbox")
    sandbox.up_for(h)
    return h


@pytest.fixture(scope="session")
def built_images():
    """(local base tag, BuiltImage of the pipeline image) — built if missing (the base takes minutes once)."""
    from eagle3ops import images
    from eagle3ops_dev import bases, pagecache

    ca = images.default_ca_bundle()
    base = bases.build_local_base(ca_bundle=ca, quiet=True)
    built = images.build_image("pipeline", base_image=base, ca_bundle=ca, quiet=True)
    # The build engine's copy into the page cache: the tiny target and the tests' heads are built in containers of
    # the pipeline image here (torch imports; cold starts are disk-bound: eagle3ops_dev.pagecache).
    pagecache.warm_quietly(built.tag, label="built_images")
    return base, built


@pytest.fixture(scope="session")
def deployed(sandbox_host, built_images):
    """Sandbox with production serving running (real vLLM, tiny model) and the pipeline image deployed.

    Returns (host, DeployResult).
    """
    from eagle3ops import deployer
    from eagle3ops_dev import demo, pagecache

    base, built = built_images
    deployer.push_image(sandbox_host.serving.image, sandbox_host)
    # The sandbox engine's copy of the base layers into the page cache before vLLM starts from them (cold vLLM
    # starts here are disk-bound: eagle3ops_dev.pagecache); the pipeline image shares these layers.
    pagecache.warm_quietly(sandbox_host.serving.image, sandbox_host.docker_host, label="deployed")
    # The tests' target: the random 4-layer tiny Llama (the demo serves the trained one; switching restarts serving)
    replaced = demo.build_tiny_model(built.tag, sandbox_host.model_path, "llama")
    demo.start_serving(sandbox_host, restart=replaced)
    dep = deployer.deploy(sandbox_host, base_image=base, echo=lambda *_: None)
    assert demo.serving_healthy(sandbox_host, completion=True)
    mark = os.environ.get("E3_TEST_DEPLOYED_MARK")
    if mark:  # scripts/test.sh starts the in-image suite once this heavy, disk-bound set-up is over
        Path(mark).touch()
    return sandbox_host, dep


@pytest.fixture(scope="session")
def speculative_image(built_images, sandbox_host):
    """The CPU stand-in serving image (patched vLLM), tagged as the sandbox inventory's ``speculative_image``."""
    from eagle3ops import images

    base, _ = built_images
    built = images.build_image("serving", base_image=base, profile="vllm-0.16.0-serving-cpu-standin",
                               ca_bundle=images.default_ca_bundle(), quiet=True,
                               extra_tags=[sandbox_host.serving.speculative_image])
    return built


@pytest.fixture(scope="session")
def standin_deployed(deployed):
    """(host, DeployResult): the sandbox with a second production serving container whose server is the STAND-IN
    OpenAI server (``tests/data/standin_openai_server.py``, NOT vLLM: it starts in about a second and answers what
    the health gate asks), in the local vLLM base image with ``--entrypoint python3``, on its own port
    (``EAGLE3OPS_TEST_STANDIN_SERVING_PORT``, default 18010), container name and state dir (its own lock, releases and
    audit), beside the real vLLM serving of :func:`deployed`.

    For the window tests whose subject is the window (stages, faults, the lock, the supervisor, the restore agent):
    each window's stop and restore of serving then costs seconds, not a vLLM start. It exits at start on a bad flag
    value or without the mounted model's ``config.json``, as vLLM does. Windows against real vLLM are the ``deployed``
    tests (the engine restarted under a window, the speculation gate, the deferred probes)."""
    import os
    import shutil
    import subprocess

    import standin_serving
    from eagle3ops import executor
    from eagle3ops.commands import docker as dk
    from eagle3ops_dev import demo

    h, dep = deployed
    port = int(os.environ.get("EAGLE3OPS_TEST_STANDIN_SERVING_PORT", "18010"))
    state = Path(h.state_dir).parent / "state-standin"
    state.mkdir(exist_ok=True)
    # the deployed pipeline image's record, so the CLI's windows on this host find it (``eagle3ops extract``)
    shutil.copy(Path(h.state_dir) / "deployed.json", state / "deployed.json")
    subprocess.run(["chown", "-R", "e3ops:e3ops", str(state)], check=True)
    # the model's mount in the container: the stand-in exits at start without its config.json (a lost model)
    sh = h.model_copy(update={"name": "sandbox-standin", "state_dir": str(state), "serving": h.serving.model_copy(
        update={"container": "standin-serving", "port": port, "health_timeout_s": 60,
                "args": standin_serving.args(port, h.serving.served_model_name,
                                             f"{standin_serving.model_mount(h)}/config.json"),
                "volumes": [*h.serving.volumes, standin_serving.script_volume(h)], "speculative_image": None})})
    standin_serving.start_container(sh, timeout_s=60)
    assert demo.serving_healthy(sh, completion=True), "the stand-in serving container does not complete"
    yield sh, dep
    with executor.for_host(sh) as r:
        r.run(dk.rm(sh, "standin-serving", force=True), check=False)


@pytest.fixture(scope="session")
def standin_inventory(standin_deployed, tmp_path_factory) -> Path:
    """An inventory file holding the :func:`standin_deployed` host as ``sandbox-standin`` (every key as loaded,
    paths absolute), for tests that drive it through the ``eagle3ops`` CLI (``EAGLE3OPS_INVENTORY``)."""
    import yaml

    from eagle3ops.config import load_inventory

    sh, _ = standin_deployed
    host = sh.model_dump(mode="json", exclude_unset=True)
    host.pop("name")
    path = tmp_path_factory.mktemp("standin-inventory") / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": {sh.name: host}}, sort_keys=False))
    loaded = load_inventory(path).host(sh.name)
    assert loaded.serving.args == sh.serving.args and loaded.state_dir == sh.state_dir, "inventory round trip"
    return path
