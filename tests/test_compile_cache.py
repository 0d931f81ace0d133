"""A serving container recreated by eagle3ops keeps what vLLM compiled at its last start.

vLLM 0.16 keeps its torch.compile artifacts under ``VLLM_CACHE_ROOT`` (default ``~/.cache/vllm``:
``torch_compile_cache/<hash>``, ``torch_aot_compile/<hash>``) and torch's inductor keeps its generated and compiled
kernels under ``TORCHINDUCTOR_CACHE_DIR`` (default ``/tmp/torchinductor_<user>``). In a container both are in the
writable layer, which every release, rollback and gate switch removes with the container: each start compiled
again. Plan level and the supervisor's recreation with a stand-in Docker engine (``test_release_record``'s), no
sandbox: the restart time itself is ``benchmarks/compile-cache/compile_cache.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_release_record import LIVE, _Engine, _sup

from eagle3ops.commands import serving as sv
from eagle3ops.config import load_inventory
from eagle3ops.config.plan import ReleaseChange
from eagle3ops.supervisor.runner import Supervisor
from eagle3ops.window.planner import build_plan, supervisor_commands

REPO = Path(__file__).resolve().parents[1]

#: Production serving as the vLLM image runs it: as root, no cache mount of its own (the Hugging Face cache only).
ROOT_LIVE = json.loads(json.dumps(LIVE))
ROOT_LIVE["Config"]["User"] = ""
ROOT_LIVE["HostConfig"]["Mounts"] = None


def _cache_binds(host_config: dict, cache: str) -> list[str]:
    return sorted(b for b in host_config.get("Binds") or [] if b.startswith(cache + "/"))


def test_release_rollback_and_gate_switches_keep_the_compile_cache(tmp_path, monkeypatch):
    """Every container kind's plan names the cache folder under the host's data_dir, and each container the
    supervisor recreates from it (a release, a rollback, a gate's control and speculative releases) has vLLM's and
    inductor's cache folders bound there: the same two folders for every one, like for like."""
    h = load_inventory(REPO / "deploy" / "hosts.yaml").hosts["sandbox"]
    for kind in ("release", "rollback"):
        plan = build_plan(h, kind=kind, window_id="w", image="i", command="c")
        assert plan.compile_cache == f"{h.data_dir}/compile-cache", (kind, plan.compile_cache)
        preview = " ".join(w for argv in supervisor_commands(h, plan) for w in argv)
        assert f"{plan.compile_cache}/vllm:<VLLM_CACHE_ROOT of the container" in preview, preview
    cache = str(tmp_path / "data" / "compile-cache")
    want = [f"{cache}/torchinductor:/tmp/torchinductor_root", f"{cache}/vllm:/root/.cache/vllm"]

    monkeypatch.setattr(Supervisor, "gate", lambda self, timeout_s=None: self.journal.log("health", "ok"))
    engine = _Engine(ROOT_LIVE)
    plan, wdir = _sup(tmp_path, "release", change=ReleaseChange(args=["--max-num-seqs", "8"]), compile_cache=cache)
    assert Supervisor(plan, engine, wdir).run()["outcome"] == "ok"
    assert _cache_binds(engine.bodies[-1]["HostConfig"], cache) == want, engine.bodies[-1]["HostConfig"]
    others = [b for b in engine.bodies[-1]["HostConfig"]["Binds"] if not b.startswith(cache)]
    assert others == ROOT_LIVE["HostConfig"]["Binds"], "production's own binds are kept as they were"

    plan, wdir = _sup(tmp_path, "rollback", compile_cache=cache)
    assert Supervisor(plan, engine, wdir).run()["outcome"] == "ok"
    assert _cache_binds(engine.bodies[-1]["HostConfig"], cache) == want, "release 1 (production's) recreated too"

    # A gate's control release and its speculative release: both switched through the same recreation.
    plan, wdir = _sup(tmp_path, "release", change=ReleaseChange(), compile_cache=cache)
    sup = Supervisor(plan, engine, wdir)
    sup.record()
    sup.kind.switch("control", ReleaseChange(args=["--max-num-seqs", "16"]), live=False)
    control = engine.bodies[-1]["HostConfig"]
    sup.kind.switch("speculative", ReleaseChange(args=["--speculative-config", '{"method": "eagle3"}']),
                    live=False)
    assert _cache_binds(control, cache) == _cache_binds(engine.bodies[-1]["HostConfig"], cache) == want


@pytest.mark.parametrize("where", ["bind", "mount", "env-on-volume"])
def test_a_cache_production_keeps_itself_is_left_exactly_as_it_is(where):
    """Production that already keeps vLLM's cache on the host (a bind over ``~/.cache``, a volume, or
    ``VLLM_CACHE_ROOT`` pointing into one) is recreated with that configuration exactly; only the cache it does
    not keep is bound."""
    rec = sv.container_record(ROOT_LIVE)
    if where == "bind":
        rec["HostConfig"]["Binds"].append("/srv/cache:/root/.cache")
    elif where == "mount":
        rec["HostConfig"]["Mounts"] = [{"Type": "volume", "Source": "vllm-cache", "Target": "/root/.cache/vllm"}]
    else:
        rec["HostConfig"]["Mounts"] = [{"Type": "volume", "Source": "c", "Target": "/cache"}]
        rec["Config"]["Env"].append("VLLM_CACHE_ROOT=/cache/vllm")
    out, notes = sv.keep_compile_cache(rec, "/data/compile-cache")
    assert out["Config"] == rec["Config"] and out["HostConfig"]["Mounts"] == rec["HostConfig"]["Mounts"]
    assert out["HostConfig"]["Binds"] == rec["HostConfig"]["Binds"] + [
        "/data/compile-cache/torchinductor:/tmp/torchinductor_root"], notes
    again, _ = sv.keep_compile_cache(out, "/data/compile-cache")
    assert again == out, "a container recreated from one that keeps the cache gets nothing more"


def test_a_container_of_another_user_is_not_given_a_folder_it_cannot_write():
    """Docker creates a missing bind source as root: a server running as another user could not write into it
    (vLLM would fail its start). Nothing is bound; the note says why and what to mount instead."""
    rec = sv.container_record(LIVE)  # User 1000:1000
    out, notes = sv.keep_compile_cache(rec, "/data/compile-cache")
    assert out == rec
    assert len(notes) == 1 and "1000:1000" in notes[0] and "VLLM_CACHE_ROOT" in notes[0], notes


@pytest.mark.parametrize("config, want", [
    ({"Env": ["VLLM_CACHE_ROOT=~/vc"]}, {"vllm": "/root/vc", "torchinductor": "/tmp/torchinductor_root"}),
    ({"User": "root", "Env": ["XDG_CACHE_HOME=/x", "TMPDIR=/scratch"]},
     {"vllm": "/x/vllm", "torchinductor": "/scratch/torchinductor_root"}),
    ({"User": "1000", "Env": ["HOME=/home/u", "USER=u", "TORCHINDUCTOR_CACHE_DIR=/ind"]},
     {"vllm": "/home/u/.cache/vllm", "torchinductor": "/ind"}),
    ({"User": "1000"}, {"vllm": None, "torchinductor": None}),
])
def test_the_cache_folders_are_where_vllm_and_torch_put_them_for_the_containers_settings(config, want):
    """The folders as vLLM (``VLLM_CACHE_ROOT``, ``XDG_CACHE_HOME``, ``~``) and torch (``TORCHINDUCTOR_CACHE_DIR``,
    ``TMPDIR``, ``getpass.getuser``) derive them; unknown (None) where a non-root user's home or name is not given."""
    assert sv.compile_cache_paths(config) == want


def test_config_check_does_not_call_the_cache_binds_drift():
    """``config check HOST`` after a release: the two binds eagle3ops added are not settings the inventory lacks;
    any other bind still is."""
    h = load_inventory(REPO / "deploy" / "hosts.yaml").host("sandbox")
    released, _ = sv.keep_compile_cache(sv.container_record({
        "Config": {"Image": h.serving.image, "Cmd": list(h.serving.args), "User": "",
                   "Env": [f"{k}={v}" for k, v in h.serving.env.items()]},
        "HostConfig": {"Binds": list(h.serving.volumes)}}), sv.compile_cache_dir(h))
    assert len(released["HostConfig"]["Binds"]) == len(h.serving.volumes) + 2
    assert sv.inventory_drift(h, released) == []
    released["HostConfig"]["Binds"].append("/srv/other:/other")
    assert sv.inventory_drift(h, released) == ["volume '/srv/other:/other': a bind of the live container, not in "
                                               "the inventory"]


class _LocalHost:
    """A STAND-IN for the SSH executor: runs the read-only POSIX commands of the fallback check here (the state dir
    is a real folder under tmp_path); every ``docker`` command (the image lookup) answers found."""

    def __init__(self, host):
        self.host = host

    def run(self, argv, check=True, **kw):
        import subprocess
        from types import SimpleNamespace

        if list(argv)[0] == "docker":
            return SimpleNamespace(ok=True, stdout="", stderr="")
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
        return SimpleNamespace(ok=p.returncode == 0, stdout=p.stdout, stderr=p.stderr)


def test_a_fallback_whose_cache_folder_was_deleted_is_still_creatable(tmp_path):
    """Preflight's fallback check needs every bind source of a release on the host, but not the compile cache's: the
    engine creates it, so deleting the cache to free space must not block a rollback. A missing model dir still
    does."""
    from eagle3ops.window import preflight as pfm

    h = load_inventory(REPO / "deploy" / "hosts.yaml").host("sandbox").model_copy(
        update={"data_dir": str(tmp_path / "data"), "state_dir": str(tmp_path / "state")})
    model = tmp_path / "model"
    model.mkdir()
    rec, _ = sv.keep_compile_cache(sv.container_record(
        {**ROOT_LIVE, "HostConfig": {**ROOT_LIVE["HostConfig"], "Binds": [f"{model}:/models/m:ro"]}}),
        sv.compile_cache_dir(h))
    assert len(rec["HostConfig"]["Binds"]) == 3 and not (tmp_path / "data").exists()
    rdir = tmp_path / "state" / "releases"
    rdir.mkdir(parents=True)
    for n in (1, 2):
        (rdir / f"{n:04d}.json").write_text(json.dumps({"release": n, "container": rec}))
    (rdir / "current").write_text("2")
    pf = pfm.Preflight()
    pfm.check_fallbacks(_LocalHost(h), pf, kind="rollback")
    assert pf.checks == [("fallback releases", True, "creatable: 1, 2")], pf.checks
    model.rmdir()
    pf = pfm.Preflight()
    pfm.check_fallbacks(_LocalHost(h), pf, kind="rollback")
    assert not pf.checks[0][1] and f"bind source {model} does not exist" in pf.checks[0][2], pf.checks
    assert "compile-cache" not in pf.checks[0][2]
