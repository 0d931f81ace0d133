"""On the sandbox (real sshd, dockerd, vLLM serving): re-running a finished window does not
stop serving and leaves the finished run byte-identical; a stage setting the engine cannot honour fails preflight in
a throwaway container before any stop.

No window here stops serving, and no image is built: the tests use the pipeline image already deployed on the
sandbox (its ``deployed.json``). The finished run is a stand-in (real manifests over small stand-in outputs, made
with the stages' own ``write_manifest``), uploaded over SSH: the decision reads only manifests and file sizes.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path, PurePosixPath

import pytest

from eagle3ops_dev import demo
from eagle3ops.commands import docker as dk
from eagle3ops.commands import host as hc
from eagle3ops.remote import Remote
from eagle3ops.window.common import PreflightFailed, audit_entries, paths
from eagle3ops.window.lock import read_lock
from eagle3ops.window.preflight import Preflight, trial_stage_container
from eagle3ops.window.run import run_window
from test_window_decide import TINY, finished_run

pytestmark = [pytest.mark.sandbox, pytest.mark.images]


@pytest.fixture(scope="module")
def live(deployed):
    """(host, deployed.json) of the sandbox with serving healthy; the pipeline image as deployed there (by the
    session's ``deployed`` fixture: on a fresh machine nothing else guarantees it)."""
    h, _ = deployed
    with Remote(h) as r:
        out = r.run(hc.cat_if_exists(paths(h)["deployed"]), check=False).stdout
    assert out.strip(), "no pipeline image deployed on the sandbox: run `eagle3ops deploy sandbox` (or the " \
                        "`deployed` fixture's tests) first"
    assert demo.serving_healthy(h, timeout=60), "sandbox serving must be up before these tests"
    return h, json.loads(out)


def _started_at(r: Remote) -> str:
    return r.run(dk.docker(r.host, "inspect", "--format", "{{.State.StartedAt}}", r.host.serving.container)).stdout.strip()


def _upload(r: Remote, local: Path, name: str) -> str:
    rdir = f"{r.host.data_dir}/runs/{name}"
    for p in sorted(local.rglob("*")):
        if p.is_file():
            r.run(hc.mkdir_p(str(PurePosixPath(rdir) / p.parent.relative_to(local))))
            r.run(hc.write_file(f"{rdir}/{p.relative_to(local)}"), stdin=p.read_bytes())
    return rdir


def _snapshot(rdir: str) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(rdir)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in Path(rdir).rglob("*") if p.is_file()}


def test_rerunning_a_finished_extract_does_not_stop_serving(live, tmp_path):
    h, dep = live
    name = f"finished-standin-{uuid.uuid4().hex[:8]}"
    with Remote(h) as r:
        rdir = _upload(r, finished_run(tmp_path), name)
        try:
            before, files = _started_at(r), _snapshot(rdir)
            t0 = time.monotonic()
            res = run_window(r, kind="extract", image=dep["image"], expected_image_id=dep["image_id"],
                             command=f"pytest rerun {name}", run=name, pipeline_text=TINY)
            took = time.monotonic() - t0
            assert res["outcome"] == "nothing to do", res
            assert res["message"].startswith("nothing to do: prepare: already done for these inputs")
            assert "extract: already done" in res["message"] and "pass --restart" in res["message"]
            assert _started_at(r) == before, "serving was not stopped (StartedAt unchanged)"
            assert _snapshot(rdir) == files, "manifests and pipeline.yaml byte-identical, not even rewritten"
            assert read_lock(r) is None
            assert audit_entries(r)[-1]["outcome"] == "nothing to do"
            print(f"no-op window: {took:.1f} s")
        finally:
            r.run(hc.rm_rf(rdir))
    assert demo.serving_healthy(h, timeout=30)


def test_the_stage_container_trial_passes_with_the_stages_settings(live):
    h, dep = live
    with Remote(h) as r:
        pf = Preflight()
        t0 = time.monotonic()
        trial_stage_container(r, pf, image=dep["image"], run="trial", window_id="pytest-trial-ok", stage="prepare")
        print(f"trial: {time.monotonic() - t0:.1f} s")
        assert pf.ok and "mounts ok" in pf.checks[0][2], pf.checks
        left = r.run(dk.docker(h, "ps", "-a", "--filter", "name=eagle3ops-pytest-trial-ok", "--format", "{{.Names}}")).stdout
        assert not left.strip(), "the throwaway container is removed"


@pytest.mark.parametrize("setting,key,words", [
    ({"stage_runtime": "runtime-that-does-not-exist"}, "hosts.sandbox.stage_runtime", "runtime-that-does-not-exist"),
    # memlock=-1 is refused on this machine: the default of GPU hosts, given explicitly here
    ({"stage_ulimits": {"memlock": -1}}, "hosts.sandbox.stage_ulimits", "memlock=-1:-1"),
])
def test_a_stage_setting_the_engine_refuses_fails_preflight_before_any_stop(live, setting, key, words):
    h, dep = live
    bad = h.model_copy(update=setting)
    name = f"trial-fail-{uuid.uuid4().hex[:8]}"
    with Remote(bad) as r:
        before = _started_at(r)
        with pytest.raises(PreflightFailed) as e:
            run_window(r, kind="extract", image=dep["image"], expected_image_id=dep["image_id"],
                       command=f"pytest trial {name}", run=name, pipeline_text=TINY)
        msg = str(e.value)
        assert "stage container" in msg and key in msg and f"hosts.{h.name}" in msg, msg
        assert words in msg, msg
        assert _started_at(r) == before, "serving untouched"
        assert read_lock(r) is None and audit_entries(r)[-1]["outcome"] == "not started"
        left = r.run(dk.docker(h, "ps", "-a", "--filter", "name=-preflight", "--format", "{{.Names}}")).stdout
        assert not [n for n in left.split() if name in n or "extract" in n and n.endswith("-preflight")]
        assert not r.run(hc.test_dir(f"{h.data_dir}/runs/{name}"), check=False).ok, \
            "nothing of the run written"
