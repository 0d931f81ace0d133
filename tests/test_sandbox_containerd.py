"""A sandbox whose Docker engine uses the containerd image store (Debian 13's docker.io 26.1 + containerd 1.7).

Docker Engine 29 uses the containerd image store by default on new installs; its image ids are manifest digests,
not config digests as on the classic overlay2 store. This sandbox (``pytest-ctrd`` on 2234) is reached over real
SSH like every other; the transfer subset (thin push, resume, verify) runs against it in tests/test_transfer*.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from eagle3ops_dev import sandbox
from eagle3ops.remote import Remote

pytestmark = pytest.mark.sandbox
#: This module brings up a sandbox of its own (pytest-ctrd): its tests run in the host suite's "rest" part
#: (tests/conftest.py), the module whole in one process.
OWN_SANDBOX = "pytest-ctrd"

NAME, PORT = "pytest-ctrd", 2234


@pytest.fixture(scope="module")
def ctrd():
    info = sandbox.up(NAME, PORT, engine="containerd")
    yield info
    sandbox.down(NAME)


def test_engine_is_docker_26_with_the_containerd_snapshotter(ctrd):
    with Remote(ctrd.host_config()) as r:
        out = r.run(["docker", "-H", ctrd.docker_host, "info", "--format", "{{json .}}"]).stdout
    info = json.loads(out)
    assert info["ServerVersion"].startswith("26.1.")
    assert dict(info["DriverStatus"]).get("driver-type") == "io.containerd.snapshotter.v1"
    assert ctrd.engine == "containerd" and (ctrd.root / "engine").read_text().strip() == "containerd"


def test_image_id_is_the_manifest_digest_there(ctrd):
    """What 'image id' means differs between the stores: the same image loaded into both engines."""
    src = "eagle3ops/debian-minbase:bookworm"
    build_id = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", src], capture_output=True,
                              text=True, check=True).stdout.strip()
    save = subprocess.Popen(["docker", "save", src], stdout=subprocess.PIPE)
    subprocess.run(["docker", "-H", ctrd.docker_host, "load", "-q"], stdin=save.stdout, check=True,
                   capture_output=True, timeout=300)
    save.wait(timeout=60)
    ctrd_id = subprocess.run(["docker", "-H", ctrd.docker_host, "image", "inspect", "--format", "{{.Id}}", src],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert build_id.startswith("sha256:") and ctrd_id.startswith("sha256:") and build_id != ctrd_id


def test_engine_kind_is_kept(ctrd):
    with pytest.raises(sandbox.SandboxError, match="made with the containerd engine"):
        sandbox.up(NAME, PORT, engine="classic")
