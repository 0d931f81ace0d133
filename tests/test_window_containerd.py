"""A serving release window and a rollback on a host whose Docker engine uses the containerd image store.

The sandbox ``pytest-ctrd2`` (SSH 2235, serving port 18035; Docker 26.1 + containerd 1.7) is the inventory's
``sandbox`` entry with ``EAGLE3OPS_SANDBOX*`` pointing at it, so the window runs through exactly the code a real
host gets. Production serving needs the local vLLM base (9.0 GB) on it: pushed once (measured 153 s, 4.6 GB on
the wire with zstd, 18.1 GB of sandbox disk: the containerd store keeps the layer blobs beside the unpacked
snapshots); the sandbox keeps it between runs. On this store an image id is a manifest digest, so the window's
expected pipeline image id is the push's ``host_id``, not the build engine's config digest. Measured on 2 shared
cores: fixture 117 s with the base already there (pipeline push, tiny model, serving start), release window 73 s,
rollback 89 s (load ~8); cold (pipeline image build, base push, load 16-21): fixture 752 s, windows 161 s + 105 s.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.sandbox, pytest.mark.images, pytest.mark.slow]
#: xdist group (tests/conftest.py): this module's own sandbox (pytest-ctrd2) is brought up by one worker, its tests run there in turn.
XDIST_GROUP = "pytest-ctrd2"

REPO = Path(__file__).resolve().parents[1]
NAME, PORT, SERVING_PORT = "pytest-ctrd2", 2235, 18035


@pytest.fixture(scope="module")
def ctrd_serving(built_images):
    """(host, pipeline tag, pipeline id on the host) with production serving healthy on the containerd sandbox."""
    from eagle3ops import transfer
    from eagle3ops_dev import demo, sandbox
    from eagle3ops.config import load_inventory

    base, built = built_images
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EAGLE3OPS_SANDBOX", NAME)
        mp.setenv("EAGLE3OPS_SANDBOX_SSH_PORT", str(PORT))
        mp.setenv("EAGLE3OPS_SANDBOX_SERVING_PORT", str(SERVING_PORT))
        h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    sandbox.up(NAME, PORT, engine="containerd")
    for ref in (h.serving.image, built.tag):
        r = transfer.push(ref, h)
        assert r.ok and r.store == "containerd", r.reason
    demo.build_tiny_model(built.tag, h.model_path, "llama")
    demo.start_serving(h)
    yield h, built.tag, r.host_id
    # The containerd store keeps the layer blobs beside the unpacked snapshots: the 9 GB base takes ~18 GB here.
    # Purge, so that a CI machine's disk is not kept full by a sandbox nobody uses between runs.
    sandbox.down(NAME, purge=True)


# The limit covers the module fixture: cold (the 9 GB base and the pipeline image pushed into a purged sandbox, as
# after every run: `sandbox.down(purge=True)` gives its 18 GB back) it took 752 s on the loaded machine, 117 s warm.
@pytest.mark.timeout(1500)
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
