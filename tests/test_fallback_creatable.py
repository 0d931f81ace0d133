"""Fallback releases on the sandbox (real sshd, real dockerd, real vLLM): every release a window may restore or roll
back to is checked creatable on this host before serving stops (its image present under the id this host's image
store uses, its binds' host paths present); a window whose fallback cannot be created is refused naming the release
and what is missing, and serving is not touched."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from eagle3ops.remote import Remote
from eagle3ops.window.common import PreflightFailed, paths
from eagle3ops.window.run import run_window

pytestmark = [pytest.mark.sandbox, pytest.mark.images, pytest.mark.slow]
GONE_ID = "sha256:" + "d" * 64
GONE_PATH = "/var/lib/eagle3ops-sandbox/no-such-model-dir"


def _docker(h, *args, check=True):
    return subprocess.run(["docker", "-H", h.docker_host, *args], capture_output=True, text=True, timeout=120,
                          check=check)


def test_rollback_to_a_release_that_cannot_be_created_is_refused_before_the_stop(deployed):
    h, dep = deployed
    live = json.loads(_docker(h, "container", "inspect", h.serving.container).stdout)[0]
    rdir = Path(paths(h)["releases"])
    owner = Path(h.state_dir).stat()  # the releases dir and files belong to the state dir's owner (the SSH user)
    if not rdir.exists():
        rdir.mkdir()
        os.chown(rdir, owner.st_uid, owner.st_gid)
    n = max([int(p.stem) for p in rdir.glob("[0-9]*.json")] or [0]) + 1
    # A release recorded on this host earlier, whose image was pruned since and whose model dir was moved.
    container = {"Name": h.serving.container, "ImageId": GONE_ID,
                 "Config": {**live["Config"], "Image": "eagle3ops/vllm-openai-local:pruned"},
                 "HostConfig": {**live["HostConfig"], "Binds": [f"{GONE_PATH}:/models/tiny-llama:ro"]}}
    rel = rdir / f"{n:04d}.json"
    rel.write_text(json.dumps({"release": n, "container": container, "created": "2026-01-01T00:00:00Z",
                               "window": "pytest", "change": ""}))
    os.chown(rel, owner.st_uid, owner.st_gid)
    try:
        with Remote(h) as r:
            with pytest.raises(PreflightFailed) as e:
                run_window(r, kind="rollback", image=dep.tag, expected_image_id=dep.image_id,
                           command="pytest rollback", to_release=n)
        msg = str(e.value)
        assert f"release {n}" in msg and "nothing was stopped" in msg, msg
        assert "eagle3ops/vllm-openai-local:pruned" in msg and GONE_ID[:19] in msg, msg
        assert GONE_PATH in msg, msg
        after = json.loads(_docker(h, "container", "inspect", h.serving.container).stdout)[0]
        assert after["Id"] == live["Id"] and after["State"]["StartedAt"] == live["State"]["StartedAt"]
    finally:
        rel.unlink(missing_ok=True)
        if _docker(h, "inspect", "--format", "{{.State.Status}}", h.serving.container,
                   check=False).stdout.strip() != "running":  # today's switch removed it: bring serving back
            from eagle3ops_dev import demo

            with Remote(h) as r:
                r.run(["rm", "-rf", paths(h)["lock"]], check=False)
            demo.start_serving(h)
