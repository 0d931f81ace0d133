"""``--dry-run`` of the window commands through the real CLI (``.venv/bin/eagle3ops`` in a subprocess) against the
sandbox's real sshd and Docker engine: the printed plan has the lock, the pipeline config and plan uploads and the
supervisor start in order, and nothing on the host changes.

The inventory is a copy of ``deploy/hosts.yaml`` whose ``data_dir``/``state_dir`` point at fresh directories under
``/var/lib/eagle3ops-sandbox/sandbox/`` owned by ``e3ops`` (so a wrong write would succeed and be seen, not fail on
permissions), with a fake ``deployed.json`` (the windows need a deployed pipeline image record). Nothing here touches
the sandbox's real state dir or any container.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CLI = REPO / ".venv/bin/eagle3ops"
SANDBOX_ROOT = Path("/var/lib/eagle3ops-sandbox/sandbox")
FAKE_IMAGE = "eagle3ops/pipeline:dry-run-test"
FAKE_ID = "sha256:" + "0" * 64

pytestmark = pytest.mark.sandbox


@pytest.fixture()
def dry_env(sandbox_host, tmp_path):
    """(inventory path, state dir, data dir, docker endpoint) for a throwaway copy of the sandbox host."""
    root = SANDBOX_ROOT / f"dryrun-{uuid.uuid4().hex[:8]}"
    state, data = root / "state", root / "data"
    pw = pwd.getpwnam("e3ops")
    for d in (root, state, data):
        d.mkdir(mode=0o755)
        os.chown(d, pw.pw_uid, pw.pw_gid)
    (state / "deployed.json").write_text(json.dumps({"image": FAKE_IMAGE, "image_id": FAKE_ID}))
    raw = yaml.safe_load((REPO / "deploy/hosts.yaml").read_text())
    entry = raw["hosts"]["sandbox"]
    entry.update(data_dir=str(data), state_dir=str(state), identity_file=str(sandbox_host.identity_file),
                 known_hosts=str(sandbox_host.known_hosts))
    inv = tmp_path / "hosts.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"sandbox": entry}}))
    try:
        yield inv, state, data, sandbox_host.docker_host
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _seed_releases(state: Path, history: list[dict], current: int) -> None:
    """Release records as the supervisor writes them (process records: nothing to check in the image store), owned
    by the SSH user."""
    rdir = state / "releases"
    rdir.mkdir()
    for n in sorted({e["release"] for e in history}):
        (rdir / f"{n:04d}.json").write_text(json.dumps({"release": n, "process": {"argv": ["vllm", "serve"]}}))
    (rdir / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in history))
    (rdir / "current").write_text(f"{current}\n")
    pw = pwd.getpwnam("e3ops")
    for p in (rdir, *rdir.iterdir()):
        os.chown(p, pw.pw_uid, pw.pw_gid)


def _tree(d: Path) -> list[tuple]:
    """Every path under ``d`` (and ``d`` itself) with mode, size and mtime: any write shows up."""
    out = []
    for p in sorted([d, *d.rglob("*")]):
        st = p.lstat()
        out.append((str(p.relative_to(d)), st.st_mode, st.st_size, st.st_mtime_ns))
    return out


def _containers(docker_host: str) -> dict[str, str]:
    cp = subprocess.run(["docker", "-H", docker_host, "ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Names}}"],
                        capture_output=True, text=True, check=True, timeout=60)
    return dict(line.split(" ", 1) for line in cp.stdout.splitlines() if line.strip())


def _mounts(docker_host: str, cid: str) -> str:
    cp = subprocess.run(["docker", "-H", docker_host, "inspect", "--format", "{{json .Mounts}} {{json .Config.Labels}}",
                         cid], capture_output=True, text=True, timeout=60)
    return cp.stdout


@pytest.mark.parametrize("args", [
    ["extract", "sandbox"],
    ["train", "sandbox"],
    ["release", "sandbox", "--arg", "--max-num-seqs=4"],
    ["rollback", "sandbox"],
], ids=["extract", "train", "release", "rollback"])
def test_dry_run_prints_the_plan_and_changes_nothing(dry_env, args):
    inv, state, data, docker_host = dry_env
    if args[0] == "rollback":  # release 3 was live only while a gate measured it, and rejected: never the target
        _seed_releases(state, [{"release": 1}, {"release": 2}, {"release": 3, "measured": True},
                               {"release": 3, "gate": "rollback", "why": "x0.81"}, {"release": 2}], current=2)
    before_state, before_data = _tree(state), _tree(data)
    before_ctr = _containers(docker_host)
    cp = subprocess.run([str(CLI), *args, "--inventory", str(inv), "--dry-run"], cwd=REPO, capture_output=True,
                        text=True, timeout=240)
    # The fake image is not on the host (and, for extract/train, no serving container runs in this temp state):
    # the dry run prints the whole plan, then says a real run would stop at preflight, and exits 1.
    assert cp.returncode == 1, f"exit {cp.returncode}\nstdout:\n{cp.stdout}\nstderr:\n{cp.stderr}"
    assert "preflight would fail" in cp.stderr and "is not on the host" in cp.stderr, cp.stderr
    lines = cp.stdout.splitlines()
    assert "# then, on the host, the supervisor (docker SDK) does the equivalent of:" in lines
    if args[0] == "rollback":  # the target and why, named before any check (and so before any stop)
        err = cp.stderr.splitlines()
        said = ("rolling back to release 1 (the release production kept live before release 2; passed over: 3 "
                "(rejected by a gate (rollback: x0.81)))")
        assert said in err and err.index(said) < min(i for i, ln in enumerate(err) if "preflight" in ln), cp.stderr

    def index(pattern: str) -> int:
        hits = [i for i, ln in enumerate(lines) if re.fullmatch(pattern, ln)]
        assert len(hits) == 1, f"{pattern!r} printed {len(hits)} times in:\n{cp.stdout}"
        return hits[0]

    s = re.escape(str(state))
    lock = index(rf"mkdir {s}/lock")
    details = index(rf"tee {s}/lock/details\.json")
    # plan.json may hold serving's secrets (a release's --arg/--env): written 0600 (umask 077, then tee)
    private = re.escape("""sh -c 'umask 077 && exec tee "$1"' eagle3ops-write """)
    plan = index(rf"{private}{s}/windows/(\d{{8}}T\d{{6}}Z-{args[0]}-[0-9a-f]{{6}})/plan\.json")
    wid = re.fullmatch(rf"{private}{s}/windows/(.+)/plan\.json", lines[plan]).group(1)
    sup = index(rf"docker -H {re.escape(docker_host)} run --detach --name eagle3ops-supervisor-{wid} .*"
                rf" --volume {s}:{s} .* --entrypoint python3 {re.escape(FAKE_IMAGE)} -m eagle3ops\.supervisor "
                rf"{s}/windows/{wid}/plan\.json")
    assert lock < details < plan < sup
    if args[0] in ("extract", "train"):  # the pipeline config is written under the lock, after preflight
        assert details < index(rf"tee {re.escape(str(data))}/runs/default/pipeline\.yaml") < sup

    # Nothing changed on the host: no lock, no windows dir, no uploaded config, no audit line, no container.
    assert _tree(state) == before_state
    assert _tree(data) == before_data
    assert not (state / "lock").exists() and not (state / "windows").exists()
    after_ctr = _containers(docker_host)
    assert f"eagle3ops-supervisor-{wid}" not in after_ctr.values()
    # Other sessions may create containers on the shared engine meanwhile; none of the new ones may be ours.
    for cid in set(after_ctr) - set(before_ctr):
        assert str(state) not in _mounts(docker_host, cid) and wid not in _mounts(docker_host, cid)


class DryRunWrote(AssertionError):
    """A dry run changed the host (the known bug the xfail below documents; any other failure is a real one)."""


def test_dry_run_does_not_create_a_missing_data_dir(dry_env):
    inv, state, data, _ = dry_env
    data.rmdir()
    cp = subprocess.run([str(CLI), "release", "sandbox", "--inventory", str(inv), "--dry-run"], cwd=REPO,
                        capture_output=True, text=True, timeout=240)
    assert cp.returncode == 1 and "preflight would fail" in cp.stderr, cp.stderr
    assert "mkdir -p " + str(data) in cp.stdout.splitlines()
    if data.exists():
        raise DryRunWrote(f"--dry-run created {data} on the host")


def test_dry_run_reports_a_held_lock(dry_env):
    inv, state, data, _ = dry_env
    lock = state / "lock"
    lock.mkdir()
    (lock / "details.json").write_text(json.dumps({"window_id": "20000101T000000Z-train-abcdef", "holder": "bob@ops",
                                                   "since": "2000-01-01T00:00:00", "command": "eagle3ops train x"}))
    try:
        cp = subprocess.run([str(CLI), "extract", "sandbox", "--inventory", str(inv), "--dry-run"], cwd=REPO,
                            capture_output=True, text=True, timeout=240)
    finally:
        shutil.rmtree(lock)
    assert cp.returncode == 1
    assert "bob@ops" in cp.stderr and "lock release sandbox --force" in cp.stderr, cp.stderr
