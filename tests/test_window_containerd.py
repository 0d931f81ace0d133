"""A serving release window and a rollback on a host whose Docker engine uses the containerd image store.

The sandbox ``pytest-ctrd2`` (SSH 2235, serving port 18035; Docker 26.1 + containerd 1.7) is the inventory's
``sandbox`` entry with ``EAGLE3OPS_SANDBOX*`` pointing at it, so the window runs through exactly the code a real
host gets. The image pushed there is the TEST STAND-IN pipeline image (:mod:`standin_images`: the pipeline
definition on the torch-less stand-in base, ~0.5 GB; its supervisor runs the release and rollback windows, which run
no stage) and production serving is the STAND-IN OpenAI server (:mod:`standin_serving`, not vLLM) in that image. On
this store an image id is a manifest digest, so the window's expected pipeline image id is the push's ``host_id``,
not the build engine's config digest. With the real 9.5 GB pipeline image pushed (cold: ~150 s, ~18 GB of sandbox
disk) the fixture took 220-226 s; before the stand-in serving (vLLM, the base pushed too) 220-752 s. The sandbox is
purged after the module.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.sandbox, pytest.mark.images, pytest.mark.slow]
#: This module brings up a sandbox of its own (pytest-ctrd2): its tests run in the host suite's "rest" part
#: (tests/conftest.py), the module whole in one process.
OWN_SANDBOX = "pytest-ctrd2"

REPO = Path(__file__).resolve().parents[1]
NAME, PORT, SERVING_PORT = "pytest-ctrd2", 2235, 18035


@pytest.fixture(scope="module")
def ctrd_serving(built_images, tmp_path_factory):
    """(host, pipeline tag, pipeline id on the host) with production serving healthy on the containerd sandbox."""
    import standin_serving
    from eagle3ops import transfer
    from eagle3ops_dev import demo, sandbox
    from eagle3ops.config import load_inventory

    import standin_images
    from eagle3ops import images

    base, built = built_images
    small = standin_images.standin_pipeline_image(tmp_path_factory.mktemp("standin-pipeline") / "repo",
                                                  images.default_ca_bundle())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EAGLE3OPS_SANDBOX", NAME)
        mp.setenv("EAGLE3OPS_SANDBOX_SSH_PORT", str(PORT))
        mp.setenv("EAGLE3OPS_SANDBOX_SERVING_PORT", str(SERVING_PORT))
        h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    sandbox.up(NAME, PORT, engine="containerd")
    r = transfer.push(small.tag, h)
    assert r.ok and r.store == "containerd", r.reason
    # the model directory preflight checks (built by the real pipeline image on the local engine: no push)
    demo.build_tiny_model(built.tag, h.model_path, "llama")
    # Serving: the STAND-IN OpenAI server (standin_serving, NOT vLLM) in the stand-in pipeline image (its python3):
    # the subject is the window on this image store.
    h = h.model_copy(update={"serving": h.serving.model_copy(update={
        "image": small.tag, "args": standin_serving.args(SERVING_PORT, h.serving.served_model_name),
        "volumes": [*h.serving.volumes, standin_serving.script_volume(h)], "health_timeout_s": 120})})
    standin_serving.start_container(h)
    yield h, small.tag, r.host_id
    # Purge, so that a CI machine's disk is not kept full by a sandbox nobody uses between runs.
    sandbox.down(NAME, purge=True)


def test_release_window_then_rollback(ctrd_serving):
    from eagle3ops_dev import demo
    from eagle3ops.remote import Remote
    from eagle3ops.config.plan import ReleaseChange
    from eagle3ops.window.run import run_window

    h, tag, host_id = ctrd_serving
    with Remote(h) as r:
        rel = run_window(r, kind="release", image=tag, expected_image_id=host_id,
                         command="eagle3ops release (test, containerd store)",
                         change=ReleaseChange(args=["--max-num-seqs", "8"]))
        assert rel["outcome"] == "ok", rel
        assert demo.serving_healthy(h, completion=True)
        rb = run_window(r, kind="rollback", image=tag, expected_image_id=host_id,
                        command="eagle3ops rollback (test, containerd store)")
        assert rb["outcome"] == "ok", rb
        assert rb["release"] != rel["release"]
    assert demo.serving_healthy(h, completion=True)
