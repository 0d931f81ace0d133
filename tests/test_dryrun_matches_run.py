"""``--dry-run`` prints what then runs, on the sandbox's real sshd and engine.

For each host-changing command, the dry run's plan (the executor's ``changes``: the host-changing commands it
printed and did not run, and its ``history``: every command, reads included) is compared with what the executor then
ran for real on the sandbox, in this order: the deploy lock taken and released; ``lock release --force``;
``push`` of an image the host already holds, and of one it lacks; ``release`` without a change (a real window: serving is stopped,
recreated as it was and health-gated); ``recover`` with nothing to recover; ``deploy --dry-run`` (the build planned,
not run; the host's deployment record untouched); ``attach`` to the finished window. Window ids are random per run and are
compared as ``<WID>``. Reads are compared too where no read follows a write the dry run skipped (a read after a
skipped write sees the host as it is, not as the plan would leave it).

Runs under the sandbox lock (``flock /tmp/e3-sandbox.lock``): it takes the sandbox's real deploy lock and runs one
window on production serving.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3ops.window.common import current_release

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[1]
INVENTORY = REPO / "deploy/hosts.yaml"
WID = re.compile(r"\d{8}T\d{6}Z-[a-z]+-[0-9a-f]{6}")


def _norm(cmds: list[str]) -> list[str]:
    return [WID.sub("<WID>", c) for c in cmds]


class Recorder:
    """Replaces ``cli_common.remote``: keeps every Remote the CLI makes, so a test can read its history and
    changes."""

    def __init__(self, monkeypatch, inventory: Path = INVENTORY):
        from eagle3ops import cli_common

        self.made: list = []
        self.inventory = inventory
        real = cli_common.remote

        def make(host, dry_run=False, json_out=False):
            r = real(host, dry_run, json_out)
            self.made.append(r)
            return r

        monkeypatch.setattr(cli_common, "remote", make)

    def invoke(self, *args: str):
        """Run the CLI in-process; returns (result, the one Remote it made)."""
        from eagle3ops import cli

        self.made.clear()
        res = CliRunner().invoke(cli.app, [*args, "--inventory", str(self.inventory)])
        assert res.exit_code == 0, f"{args}: exit {res.exit_code}\n{res.output}\n{res.exception!r}"
        assert len(self.made) == 1, self.made
        return res, self.made[0]


def test_dry_run_plan_is_what_runs(standin_deployed, standin_inventory, monkeypatch):
    """Needs production serving and a deployed pipeline image that the build engine holds: the sandbox with the
    STAND-IN serving container (``standin_deployed``: the stand-in OpenAI server, not vLLM; the subject here is the
    plan, and the release window's restart then costs a second, not a vLLM start), driven through the CLI with its
    inventory (``standin_inventory``)."""
    from eagle3ops import transfer
    from eagle3ops.commands import docker as dk
    from eagle3ops.commands import host as hc
    from eagle3ops.commands import stages as st
    from eagle3ops.remote import Remote, render
    from eagle3ops.window.common import new_window_id, paths
    from eagle3ops.window.lock import acquire_lock, read_lock, release_lock

    h, _ = standin_deployed
    with Remote(h) as r0:
        assert read_lock(r0) is None, "the sandbox's deploy lock is held: another window runs (run under flock)"
        live_before = current_release(r0)
        deployed = json.loads(r0.run(hc.cat(paths(h)["deployed"])).stdout)

    # 1. the deploy lock, taken and released (the window driver's own calls)
    wid = new_window_id("dryrun")
    runs = []
    for dry in (True, False):
        with Remote(h, dry_run=dry) as r:
            acquire_lock(r, wid, "test_dryrun_matches_run", "dry-run plan test")
            release_lock(r, wid)
            runs.append(r)
    dry, real = runs
    p = paths(h)
    take = [render(hc.mkdir_p(p["state"])), render(hc.mkdir_atomic(p["lock"])), render(hc.write_file(p["lock_details"]))]
    assert dry.changes == real.changes == [*take, render(hc.rm_rf(p["lock"]))], (dry.changes, real.changes)
    # (reads are not compared here: release_lock reads the details file the dry run did not write)

    # 2. `lock release --force` of a lock held by a window that never started (young: not yet stale)
    rec = Recorder(monkeypatch, standin_inventory)
    with Remote(h) as r:
        acquire_lock(r, wid, "test_dryrun_matches_run (stale)", "left for lock release")
    try:
        out_dry, dry = rec.invoke("lock", "release", h.name, "--force", "--dry-run")
        assert "would be released" in out_dry.output
        with Remote(h) as r:
            assert read_lock(r) is not None, "--dry-run released the lock"
        _, real = rec.invoke("lock", "release", h.name, "--force")
    finally:
        with Remote(h) as r:
            release_lock(r, wid)
    assert dry.changes == real.changes == [render(hc.rm_rf(p["lock"]))], (dry.changes, real.changes)
    assert dry.history == real.history
    assert out_dry.stdout.splitlines()[:len(dry.history)] == dry.history  # printed = planned

    # 3. push of an image the host already holds (the deployed pipeline image)
    dres = transfer.push(deployed["image"], h, options=transfer.PushOptions(dry_run=True))
    rres = transfer.push(deployed["image"], h)
    assert (dres.status, rres.status) == ("dry-run", "present"), (dres, rres)
    assert dres.commands == rres.commands and dres.changes == rres.changes == [], (dres.commands, rres.commands)
    assert dres.plan == dres.commands  # nothing to send: the plan is the commands, no notes

    # 3b. push of an image the host lacks (its layers are there: the archive carries the config): the streamed
    # `docker load` is the dry run's too. The image is removed again afterwards (untag only: its layers are shared).
    small = "eagle3ops/debian-minbase:bookworm"
    on_host = lambda: subprocess.run(["docker", "-H", h.docker_host, "image", "inspect", small],  # noqa: E731
                                     capture_output=True, timeout=60).returncode == 0
    if not on_host():
        try:
            dres = transfer.push(small, h, options=transfer.PushOptions(dry_run=True))
            assert not on_host(), "a dry-run push loaded the image"
            rres = transfer.push(small, h)
        finally:
            subprocess.run(["docker", "-H", h.docker_host, "rmi", small], capture_output=True, timeout=60)
        assert (dres.status, rres.status) == ("dry-run", "ok"), (dres, rres)
        assert dres.changes == rres.changes and any(c.endswith(" load") for c in dres.changes), \
            (dres.changes, rres.changes)
        assert dres.commands == rres.commands[:len(dres.commands)]  # then the real run verifies (reads)

    # 4. a release (a real window: serving stopped, recreated, health-gated). No intended change, so serving ends as
    # it was found: the live container recreated as it is (one window: a flag change would need a second window,
    # a rollback, to restore it).
    _, dry = rec.invoke("release", h.name, "--dry-run")
    _, real = rec.invoke("release", h.name)
    _same_window_start(dry, real, take)
    with Remote(h) as r:
        assert read_lock(r) is None
        assert current_release(r) != live_before  # the recreated container passed its gate: a new release

    # 5. recover when nothing is to recover (the newest window finished with serving running)
    out_dry, dry = rec.invoke("recover", h.name, "--dry-run")
    out_real, real = rec.invoke("recover", h.name)
    assert "already finished with serving running" in out_dry.output + out_real.output
    want = _norm([render(dk.rm(h, st.supervisor_name(real_wid(real)), force=True))])  # finish_window's cleanup, nothing else
    assert _norm(dry.changes) == _norm(real.changes) == want, (dry.changes, real.changes)

    # 6. deploy --dry-run plans the build and builds nothing; the host's deployment record is untouched
    from eagle3ops import cli, images
    from eagle3ops.images import build as build_mod

    def refuse(*a, **k):
        raise AssertionError("deploy --dry-run called a builder")

    monkeypatch.setattr(build_mod, "buildkit_build", refuse)
    monkeypatch.setattr(build_mod, "_sdk_build", refuse)
    bp = images.plan_build("pipeline", base_image=images.LOCAL_BASE_TAG)
    res = CliRunner().invoke(cli.app, ["deploy", h.name, "--dry-run", "--base-image", images.LOCAL_BASE_TAG,
                                       "--inventory", str(standin_inventory)])
    assert res.exit_code == 0, res.output
    out = res.stdout.splitlines()
    assert bp.lines()[0] in out and f"#   --build-arg BASE_IMAGE={images.LOCAL_BASE_TAG}" in out, res.stdout
    assert render(hc.write_file(p["deployed"])) in out, res.stdout
    with Remote(h) as r:
        assert json.loads(r.run(hc.cat(p["deployed"])).stdout) == deployed

    # 7. attach to the newest window, finished: the same cleanup, nothing else
    _, dry = rec.invoke("attach", h.name, "--dry-run")
    _, real = rec.invoke("attach", h.name)
    assert _norm(dry.changes) == _norm(real.changes) == want, (dry.changes, real.changes)


def real_wid(r) -> str:
    """The window id in the executor's history."""
    return next(m.group(0) for c in r.history for m in [WID.search(c)] if m)


def _same_window_start(dry, real, take: list[str]) -> None:
    """A window's dry-run plan equals the real run's commands up to and including the supervisor's start (after it
    the real run watches and finishes the window: reads, then removing the finished supervisor)."""
    # The weights manifest's recording (the serving host's first window starts it detached once the
    # supervisor runs) is planned and run beside the window; it is compared on its own.
    rec = "e3-weights-record"
    d, r = _norm(dry.changes), _norm(real.changes)
    assert [c for c in d if rec in c] == [c for c in r if rec in c]
    d, r = [c for c in d if rec not in c], [c for c in r if rec not in c]
    assert d and "eagle3ops-supervisor-<WID>" in d[-1] and " run --detach " in d[-1], d
    assert r[:len(d)] == d, "\n".join(["dry run:", *d, "real run:", *r])
    assert d[:3] == take  # the lock first
