"""Where the pipeline image's checks and probes run (build vs host), the ``probe HOST`` command as data, and the real
thing:

* fast: :func:`eagle3ops.imagecheck.plan` / labels, the ``docker run`` argv of the host probes (GPU and CPU hosts), the
  record read from the old ``<state_dir>/verify/`` dir, the deprecated ``verify`` aliases;
* slow (minutes, real docker engine, no sandbox): the UPSTREAM-LAYOUT stand-in base (CUDA vLLM 0.16.0 + torch 2.9.1
  with ``uv pip install --system``) imports vLLM but cannot start an engine; the pipeline image builds on it with
  the probes deferred and labelled so; the interpreter is discovered;
* sandbox: ``deploy`` of an image whose probes are deferred runs them on the sandbox (a CPU host: the image
  is built on the CPU local base with ``engine_checks="host"``), records the result, reuses it on the next deploy;
  ``eagle3ops probe sandbox`` runs them again and prints the record.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3ops import imagecheck
from eagle3ops.commands import hostprobe as hp
from eagle3ops.config import HostConfig

REPO = Path(__file__).resolve().parents[1]
CPU_BASE = {"engine": True, "imports": True, "platform": "CpuPlatform", "reason": "vLLM platform CpuPlatform"}
CUDA_NO_GPU = {"engine": False, "imports": True, "platform": "UnspecifiedPlatform", "reason": "no CUDA device"}
NO_TORCH = {"engine": False, "imports": False, "platform": None, "reason": "torch is not installed"}


# --- plan and labels ---------------------------------------------------------------------------------------------


def test_plan_defers_only_the_engine_checks_when_the_base_cannot_start_an_engine() -> None:
    assert imagecheck.plan(CPU_BASE) == {"build": ["pins", "apply", "compile", "import", "manifest", "probes"],
                                         "host": []}
    assert imagecheck.plan(CUDA_NO_GPU) == {"build": ["pins", "apply", "compile", "import", "manifest"],
                                            "host": ["probes"]}
    assert imagecheck.plan(NO_TORCH) == {"build": ["pins", "apply", "compile", "manifest"], "host": ["probes"]}
    assert imagecheck.plan(CPU_BASE, engine_checks="host")["host"] == ["probes"]
    assert imagecheck.plan(NO_TORCH, engine_checks="build")["build"][-1] == "probes"
    assert imagecheck.plan(CUDA_NO_GPU, verify="apply-only")["host"] == []  # no probes anywhere
    with pytest.raises(imagecheck.CheckError, match="engine checks must be one of"):
        imagecheck.plan(CPU_BASE, engine_checks="gpu")


def test_verified_label_round_trip() -> None:
    for facts in (CPU_BASE, CUDA_NO_GPU, NO_TORCH):
        p = imagecheck.plan(facts)
        assert imagecheck.parse_verified(imagecheck.verified_label(p)) == p
    assert imagecheck.verified_label(imagecheck.plan(CUDA_NO_GPU)) == \
        "build:pins,apply,compile,import,manifest;host:probes"
    assert imagecheck.parse_verified("probes")["host"] == []  # labels of images built before the split
    with pytest.raises(imagecheck.CheckError, match="unknown checks"):
        imagecheck.parse_verified("build:apply;host:warp-drive")


# --- the probe command as data ------------------------------------------------------------------------------------


def _host(**kw) -> HostConfig:
    base = {"name": "gpu-01", "hostname": "gpu-01", "user": "mlops", "gpus": 8, "data_dir": "/srv/e3/data",
            "state_dir": "/srv/e3/state", "model_path": "/srv/models/target", "stage_env": {"HF_HOME": "/data/hf"},
            "serving": {"container": "vllm", "image": "vllm/vllm-openai:v0.16.0", "port": 8000,
                        "served_model_name": "m"}}
    base.update(kw)
    return HostConfig.model_validate(base)


def test_host_probe_argv_uses_the_stage_container_settings() -> None:
    image_id = "sha256:" + "ab" * 32
    argv = hp.probe_argv(_host(), image="eagle3ops/pipeline:0.16.0-0.3.0-0123456789ab", image_id=image_id)
    assert argv[:4] == ["docker", "run", "--rm", "--name"] and argv[4] == "eagle3ops-probe-abababababab"
    # all GPUs, host IPC, unlimited memlock, host network, the inventory's stage_env: as the stage containers
    for opt in (["--gpus", "all"], ["--ipc", "host"], ["--ulimit", "memlock=-1:-1"], ["--network", "host"],
                ["--env", "HF_HOME=/data/hf"], ["--env", "HF_HUB_OFFLINE=1"]):
        assert any(argv[i:i + 2] == opt for i in range(len(argv))), opt
    # pinned by id; the entrypoint is the image's python3 (the interpreter with vLLM, see check-base.py)
    assert argv[-5:] == ["--entrypoint", "python3", image_id, "-m", "eagle3ops.hostprobe"]
    assert hp.result_path(_host(), image_id) == f"/srv/e3/state/probes/{'ab' * 32}.json"
    assert hp.result_path(_host(), image_id, legacy=True) == f"/srv/e3/state/verify/{'ab' * 32}.json"


def test_host_probe_argv_on_a_cpu_host_has_no_gpu_options() -> None:
    argv = hp.probe_argv(_host(gpus=0, docker_host="unix:///run/d.sock"), image="p:t", image_id="sha256:" + "c" * 64)
    assert argv[:3] == ["docker", "-H", "unix:///run/d.sock"]
    assert "--gpus" not in argv and "--ipc" not in argv and "--ulimit" not in argv


def test_probe_dry_run_prints_the_commands(tmp_path: Path) -> None:
    from eagle3ops import hostprobe
    from eagle3ops.remote import Remote

    printed: list[str] = []
    with Remote(_host(gpus=0), dry_run=True, echo=printed.append) as r:  # (a GPU host: nvidia-smi runs)
        res = hostprobe.probe_host(r, image="p:t", image_id="sha256:" + "d" * 64, echo=lambda *_: None)
    assert res.ok and res.outcomes == []
    assert any(c.startswith("docker run --rm --name eagle3ops-probe-dddddddddddd") for c in printed)


# --- the upstream-layout base (real docker engine; no sandbox) ----------------------------------------------------


@pytest.mark.slow
def test_pipeline_on_the_upstream_layout_base_defers_the_probes() -> None:
    """The UPSTREAM-LAYOUT stand-in (CUDA vllm 0.16.0 + torch 2.9.1, ``uv pip install --system`` into the system
    python3, ``vllm serve``) imports vLLM but cannot start an engine here, like a real build host without a GPU; the
    pipeline image builds on it: apply + every engine-free check at build, the probes deferred to the host, and
    the labels say so. The base takes ~4 min once (10.6 GB; cached by its inputs), the pipeline ~1 min."""
    import docker

    from eagle3ops import images
    from eagle3ops_dev import bases

    ca = images.default_ca_bundle()
    base = bases.build_base("upstream", ca, quiet=True)
    client = docker.from_env()
    b = client.images.get(base)
    assert b.labels["io.eagle3ops.base-layout"] == "upstream"
    assert b.labels["io.eagle3ops.stand-in-for"] == "vllm/vllm-openai:v0.16.0"
    assert b.attrs["Config"]["Entrypoint"] == ["vllm", "serve"] and b.attrs["Config"]["WorkingDir"] == "/vllm-workspace"
    facts = images.base_facts(base)
    assert (facts["executable"], facts["venv"], facts["site"]) == \
        ("/usr/bin/python3", False, "/usr/local/lib/python3.11/dist-packages")
    assert facts["vllm"] == {"vllm": "0.16.0"} and facts["torch_version"] == "2.9.1+cu128"
    assert facts["imports"] and not facts["engine"] and facts["platform"] == "UnspecifiedPlatform"
    # what vLLM itself does when an engine is configured there
    with pytest.raises(docker.errors.ContainerError) as e:
        client.containers.run(base, ["-c", "from vllm.config import DeviceConfig; DeviceConfig()"],
                              entrypoint=["python3"], network_mode="none", remove=True)
    assert b"Failed to infer device type" in e.value.stderr

    built = images.build_image("pipeline", base, None, ca, quiet=True)
    img = client.images.get(built.tag)
    assert img.labels["io.eagle3ops.verified"] == "build:pins,apply,compile,import,manifest;host:probes"
    assert img.labels["io.eagle3ops.verify-mode"] == "probes"
    assert imagecheck.parse_verified(img.labels["io.eagle3ops.verified"])["host"] == ["probes"]
    assert img.attrs["Config"]["Entrypoint"] == ["python3", "-m", "eagle3ops"]
    script = ("import json, sys, sysconfig, shutil, os; r = json.load(open('/opt/eagle3ops/checks.json')); "
              "site = sysconfig.get_paths()['purelib']; "
              "print(json.dumps([sys.executable, shutil.which('python3'), site, r['build'], r['host'], "
              "sorted(r['results']['speculators']), "
              "os.path.exists(site + '/eagle3ops_patches/speculators.json'), "
              "os.path.exists(site + '/eagle3ops_patches/speculators.probes.json')]))")
    out = json.loads(client.containers.run(built.tag, ["-c", script], entrypoint=["python3"], network_mode="none",
                                           remove=True).decode().strip().splitlines()[-1])
    assert out == ["/usr/bin/python3", "/opt/eagle3ops/bin/python3", "/usr/local/lib/python3.11/dist-packages",
                   ["pins", "apply", "compile", "import", "manifest"], ["probes"],
                   ["apply", "compile", "import", "manifest", "pins"], True, False]


# --- the import check: in the probe step's process when the probes run at build --------------------------------


def test_the_import_check_runs_in_the_probe_step_when_the_probes_run_at_build(tmp_path, monkeypatch, capsys):
    """With the probes at build, ``imagecheck build`` leaves the import check to the probe step (one process imports
    the patched stack once) and says so in checks.json; the Dockerfile then passes ``--import-check`` to ``patch
    probe``. With the probes deferred it imports here, as before. ``import_patched`` imports each patched module and
    names the one that does not import and the fix."""
    from eagle3ops.patches.apply import MANIFEST_DIR, MANIFEST_SCHEMA, import_patched
    from eagle3ops.patches.errors import PatchToolError

    asked: list[list[str]] = []
    monkeypatch.setattr(imagecheck, "run_static", lambda pkg, checks: asked.append(list(checks)) or {})
    monkeypatch.setattr(imagecheck, "BASE_FACTS", tmp_path / "base.json")
    monkeypatch.setattr(imagecheck, "CHECKS_RECORD", tmp_path / "checks.json")
    (tmp_path / "base.json").write_text(json.dumps(CPU_BASE))
    argv = ["--profile", "speculators-0.3.0-vllm-0.16.0", "--verify", "probes", "--probes-module",
            "eagle3ops.patches.probes", "--engine-checks", "auto", "--build-checks", "auto", "--host-checks", "auto"]
    assert imagecheck.build_cmd(argv) == 0
    assert asked == [["pins", "apply", "compile", "manifest", "probes"]]
    rec = json.loads((tmp_path / "checks.json").read_text())
    assert "import" in rec["build"] and rec["results"]["speculators"]["import"] == imagecheck.IMPORT_IN_PROBES
    assert imagecheck.main(["wants", "import"]) == 0 and imagecheck.main(["wants", "probes"]) == 0
    (tmp_path / "base.json").write_text(json.dumps(CUDA_NO_GPU))
    assert imagecheck.build_cmd(argv) == 0
    assert asked[-1] == ["pins", "apply", "compile", "import", "manifest"]  # probes deferred: imported here
    assert "if python3 -m eagle3ops.imagecheck wants import; then set -- --import-check; fi" in \
        (REPO / "Dockerfile").read_text()
    capsys.readouterr()

    site = tmp_path / "site"
    (site / "okpkg").mkdir(parents=True)
    (site / "okpkg" / "__init__.py").write_text("")
    (site / "okpkg" / "fine.py").write_text("VALUE = 1\n")
    (site / MANIFEST_DIR).mkdir()
    manifest = {"schema": MANIFEST_SCHEMA, "files_sha256": {"okpkg/__init__.py": "x", "okpkg/fine.py": "x",
                                                            "okpkg/data.json": "x"}}
    (site / MANIFEST_DIR / "okpkg.json").write_text(json.dumps(manifest))
    monkeypatch.syspath_prepend(str(site))
    assert import_patched(site, "okpkg")[0] == 2
    (site / "okpkg" / "broken.py").write_text("import no_such_module_here\n")
    manifest["files_sha256"]["okpkg/broken.py"] = "x"
    (site / MANIFEST_DIR / "okpkg.json").write_text(json.dumps(manifest))
    with pytest.raises(PatchToolError, match=r"okpkg.broken .*ModuleNotFoundError.*\n  fix: fix the patch"):
        import_patched(site, "okpkg")


# --- probe on the sandbox -------------------------------------------------------------------------------------------


@pytest.mark.sandbox
@pytest.mark.slow
def test_deploy_runs_the_deferred_probes_on_the_sandbox(sandbox_host, built_images) -> None:
    """An image whose probes are deferred (built on the CPU local base with ``engine_checks="host"``: the
    sandbox is a CPU host) is deployed: ``deploy`` runs the probes on the sandbox in a container of the pushed image
    with the stage settings, records the result under <state_dir>/probes/, and a second deploy reuses the recorded
    pass; ``eagle3ops probe sandbox --dry-run`` plans the same probe container (its real run is that function).
    What was deployed before is put back (other tests' windows use it)."""
    import subprocess
    import sys

    from eagle3ops import deployer, images
    from eagle3ops.commands import host as hc
    from eagle3ops.remote import Remote
    from eagle3ops.window.common import paths

    h = sandbox_host
    base, _ = built_images
    with Remote(h) as r:
        before = r.run(hc.cat_if_exists(paths(h)["deployed"]), check=False).stdout
        # Another test may have deployed this very image already (its record would be reused): start without one.
        r.run(hc.rm_rf(hp.probes_dir(h)))
        r.run(hc.rm_rf(hp.legacy_dir(h)))
    try:
        dep = deployer.deploy(h, base_image=base, engine_checks="host", echo=lambda *_: None)
        labels = images.docker_client().images.get(dep.tag).labels
        assert labels["io.eagle3ops.verified"] == "build:pins,apply,compile,import,manifest;host:probes"
        v = dep.probes
        assert v is not None and v.ok and not v.reused and v.deferred == ["probes"], v
        assert v.platform == "CpuPlatform" and v.outcomes and all(o["ok"] for o in v.outcomes)
        from eagle3ops.patches.series import read_series_file

        series = read_series_file(REPO / "patches/speculators/0.3.0/series")
        assert [o["patch"] for o in v.outcomes] == series
        with Remote(h) as r:
            rec = json.loads(r.run(hc.cat(hp.result_path(h, dep.image_id))).stdout)
            assert (rec["ok"], rec["image_id"], rec["deferred"]) == (True, dep.image_id, ["probes"])
            from eagle3ops.window.lock import read_lock

            assert read_lock(r) is None  # deploy's lock (its push, probes and record) released at its end
        again = deployer.deploy(h, base_image=base, engine_checks="host", echo=lambda *_: None)
        assert again.image_id == dep.image_id and again.probes is not None and again.probes.reused
        # `eagle3ops probe` is the same probe_host as deploy's run above; its --dry-run reads the deployed image
        # from the host and prints the very container command that run used, running nothing (a real second run
        # here cost 60-75 s of CI for what deploy's run already showed)
        from eagle3ops.commands.quote import render

        cli = subprocess.run([sys.executable, "-m", "eagle3ops", "probe", h.name, "--inventory",
                              str(REPO / "deploy/hosts.yaml"), "--dry-run"], capture_output=True, text=True,
                             cwd=REPO, timeout=300)
        assert cli.returncode == 0, cli.stderr[-3000:]
        assert render(hp.probe_argv(h, image=dep.tag, image_id=dep.image_id, gpu=None)) in cli.stdout.splitlines(), (
            cli.stdout[-3000:])
        with Remote(h) as r:  # nothing ran: the record is still deploy's
            assert json.loads(r.run(hc.cat(hp.result_path(h, dep.image_id))).stdout)["at"] == rec["at"]
    finally:
        with Remote(h) as r:
            if before.strip():
                r.run(hc.write_file(paths(h)["deployed"]), stdin=before)
            else:
                r.run(hc.rm_rf(paths(h)["deployed"]))


def test_a_build_by_hand_decides_the_plan_inside_the_build(tmp_path: Path) -> None:
    """``docker build`` without eagle3ops (``BUILD_CHECKS=auto``): the build plans from the base's facts itself.
    On the torch-less TEST STAND-IN base nothing can start an engine (or import), so the probes are deferred and
    the in-image record says the build decided."""
    import shutil
    import uuid

    import docker

    from eagle3ops import images
    from eagle3ops_dev import bases

    ca = images.default_ca_bundle()
    base = bases.build_standin_base(ca_bundle=ca)
    ctx = tmp_path / "ctx"
    for rel in ("Dockerfile", "pyproject.toml", "src", "patches", "requirements", "images/pipeline"):
        src = REPO / rel
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, ctx / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy2(src, ctx / rel)
    tag = f"eagle3ops/test-by-hand:{uuid.uuid4().hex[:12]}"
    images.buildkit_build(ctx, tag, build_args={"BASE_IMAGE": base}, ca_bundle=ca, quiet=True)
    client = docker.from_env()
    try:
        rec = json.loads(client.containers.run(tag, ["/opt/eagle3ops/checks.json"], entrypoint=["cat"],
                                               network_mode="none", remove=True))
        assert (rec["build"], rec["host"]) == (["pins", "apply", "compile", "manifest"], ["probes"])
        assert rec["how"].startswith("decided in the build") and rec["engine"]["engine"] is False
    finally:
        client.images.remove(tag, force=True)


def test_gpu_choice_for_the_probe_engines() -> None:
    rows = hp.parse_gpu_memory("0, 72000, 81559\n1, 1200, 81559\n2, 30000, 81559\n")
    assert hp.pick_gpu(rows) == 1
    assert hp.pick_gpu(hp.parse_gpu_memory("0, 72000, 81559\n1, 70000, 81559\n")) is None  # serving holds them
    argv = hp.probe_argv(_host(), image="p:t", image_id="sha256:" + "e" * 64, gpu=1)
    assert ["--env", "CUDA_VISIBLE_DEVICES=1"] == argv[argv.index("CUDA_VISIBLE_DEVICES=1") - 1:][:2]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in argv
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        hp.parse_gpu_memory("0, 1\n")


class _RecordsOnly:
    """STAND-IN for :class:`eagle3ops.remote.Remote` that answers only ``cat`` of the files it holds (empty output
    for any other file, as ``cat_if_exists`` gives for a missing one): enough for
    :func:`eagle3ops.hostprobe.recorded`, which reads and decides."""

    def __init__(self, host: HostConfig, files: dict[str, str]) -> None:
        self.host, self.files, self.dry_run, self.cmds = host, files, False, []

    def run(self, cmd, check: bool = True, **_):
        from types import SimpleNamespace

        from eagle3ops.commands.quote import render

        text = render(list(cmd))
        self.cmds.append(text)
        hit = next((v for k, v in self.files.items() if k in text), "")
        return SimpleNamespace(ok=True, stdout=hit, stderr="", exited=0)


def test_a_pass_recorded_by_an_older_version_under_verify_is_read() -> None:
    """Hosts deployed before the rename hold their pass in <state_dir>/verify/: ``recorded`` finds it there (and
    says where), a record in <state_dir>/probes/ wins, and none at all is None."""
    from eagle3ops import hostprobe

    h, image_id = _host(), "sha256:" + "f" * 64
    old, new = hp.result_path(h, image_id, legacy=True), hp.result_path(h, image_id)
    r = _RecordsOnly(h, {old: json.dumps({"ok": True, "at": "then"})})
    assert hostprobe.recorded(r, image_id) == {"ok": True, "at": "then", "record_path": old}
    assert new in r.cmds[0] and old in r.cmds[1]  # the new place is read first
    both = _RecordsOnly(h, {new: json.dumps({"ok": False}), old: json.dumps({"ok": True})})
    assert hostprobe.recorded(both, image_id) == {"ok": False, "record_path": new}
    assert hostprobe.recorded(_RecordsOnly(h, {}), image_id) is None


def test_the_old_verify_commands_are_hidden_aliases_that_say_so(tmp_path: Path) -> None:
    """``eagle3ops verify HOST`` and ``eagle3ops patch verify`` still run ``probe`` with the same options (users'
    scripts), after one deprecation line on stderr; neither is listed in --help."""
    import os
    import subprocess
    import sys

    def cli(*args: str) -> subprocess.CompletedProcess:
        # wide enough that the error's path is not wrapped (rich wraps at 80 columns without a terminal)
        return subprocess.run([sys.executable, "-m", "eagle3ops", *args], capture_output=True, text=True, cwd=REPO,
                              timeout=120, env={**os.environ, "COLUMNS": "400"})

    top = cli("verify", "nohost", "--inventory", str(tmp_path / "absent.yaml"))
    assert "`eagle3ops verify` is deprecated: it is now `eagle3ops probe`" in top.stderr, top.stderr
    assert top.returncode == 2 and "absent.yaml" in top.stderr  # then `probe` ran: the inventory error
    sub = cli("patch", "verify", "--site-dir", str(tmp_path), "--package", "speculators")
    assert "`eagle3ops patch verify` is deprecated: it is now `eagle3ops patch probe`" in sub.stderr, sub.stderr
    assert sub.returncode != 0 and "error:" in sub.stderr  # then `patch probe` ran: nothing installed there
    import re

    for helps in (cli("--help").stdout, cli("patch", "--help").stdout):  # rich's command table: "│ NAME  help"
        assert re.search(r"│ probe\s", helps) and not re.search(r"│ verify\s", helps), helps
