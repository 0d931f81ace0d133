"""Session fixtures with real parts: the sandbox host (sshd + its own dockerd), the built images, production serving.

Each fixture builds or starts what is missing and reuses what is already there, so a second run is fast. They are
the same functions ``make demo`` uses (:mod:`eagle3ops_dev.demo`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
INVENTORY = REPO / "deploy/hosts.yaml"


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
    from eagle3ops_dev import bases

    ca = images.default_ca_bundle()
    base = bases.build_local_base(ca_bundle=ca, quiet=True)
    built = images.build_image("pipeline", base_image=base, ca_bundle=ca, quiet=True)
    return base, built


@pytest.fixture(scope="session")
def deployed(sandbox_host, built_images):
    """Sandbox with production serving running (real vLLM, tiny model) and the pipeline image deployed.

    Returns (host, DeployResult).
    """
    from eagle3ops import deployer
    from eagle3ops_dev import demo

    base, built = built_images
    deployer.push_image(sandbox_host.serving.image, sandbox_host)
    # The tests' target: the random 4-layer tiny Llama (the demo serves the trained one; switching restarts serving)
    replaced = demo.build_tiny_model(built.tag, sandbox_host.model_path, "llama")
    demo.start_serving(sandbox_host, restart=replaced)
    dep = deployer.deploy(sandbox_host, base_image=base, echo=lambda *_: None)
    assert demo.serving_healthy(sandbox_host, completion=True)
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
