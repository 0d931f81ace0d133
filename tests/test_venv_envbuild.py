"""The real pipeline environment exported from a pipeline image (``eagle3ops.transfer.envbuild``), pure:
a made-up engine (no Docker) serves a tiny venv as the image's, so the layout, the marker/build record, the digest,
the cache per image id and the Python version refusals are checked in well under a second. The real export (GBs)
is run by ``benchmarks/venv-real-window/venv_real_window.py``."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from eagle3ops.commands import venv as vc
from eagle3ops.transfer import envbuild

PROBE = {"prefix": "/opt/venv", "base_prefix": "/usr", "version": "3.11.2",
         "site_packages": "/opt/venv/lib/python3.11/site-packages", "extra_paths": ["/opt/eagle3ops/dev"]}


def _tar(top: str, files: dict[str, bytes | str]) -> bytes:
    """A ``get_archive``-like stream of directory ``top``: ``str`` values are symlinks, ``bytes`` files."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        d = tarfile.TarInfo(top)
        d.type, d.mode = tarfile.DIRTYPE, 0o755
        t.addfile(d)
        for name, v in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.mtime, info.uid, info.uname = 1700000000, 1000, "builder"
            if isinstance(v, str):
                info.type, info.linkname = tarfile.SYMTYPE, v
                t.addfile(info)
            else:
                info.size, info.mode = len(v), 0o755 if name.startswith("bin/") else 0o644
                t.addfile(info, io.BytesIO(v))
    return buf.getvalue()


VENV = _tar("venv", {
    "pyvenv.cfg": b"home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.2\n"
                  b"executable = /usr/bin/python3.11\ncommand = /usr/bin/python3 -m venv /opt/venv\n",
    "bin/python": "python3", "bin/python3": "/usr/bin/python3", "bin/python3.11": "python3",
    "bin/torchrun": b"#!/opt/venv/bin/python3\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n",
    "bin/activate": b"VIRTUAL_ENV=/opt/venv\n",
    "lib64": "lib",
    "lib/python3.11/site-packages/eagle3ops/__init__.py": b"",
    "lib/python3.11/site-packages/eagle3ops-dev.pth": b"/opt/eagle3ops/dev\n",
    "lib/python3.11/site-packages/mod_link": "/opt/venv/lib/python3.11/site-packages/eagle3ops",
})
DEV = _tar("dev", {"eagle3ops_dev/__init__.py": b"# dev\n"})


class FakeContainer:
    def __init__(self, engine, kw):
        self.engine, self.kw = engine, kw

    def start(self):
        self.engine.started.append(self.kw["entrypoint"])

    def wait(self, timeout):
        return {"StatusCode": 0}

    def logs(self, **_):
        return (json.dumps(self.engine.probe) + "\n").encode()

    def get_archive(self, path, chunk_size):
        data = {"/opt/venv": VENV, "/opt/eagle3ops/dev": DEV}[path]
        self.engine.archives.append(path)
        return iter([data[i:i + 1000] for i in range(0, len(data), 1000)]), {}

    def remove(self, force=False):
        self.engine.removed += 1


class FakeEngine:
    """The docker SDK surface :func:`envbuild.export_env` uses."""

    def __init__(self, probe=PROBE, image_id="sha256:" + "ab" * 32, layers=("sha256:l1", "sha256:l2")):
        self.probe, self.started, self.archives, self.removed, self.created = probe, [], [], 0, []
        attrs = {"Id": image_id, "RootFS": {"Layers": list(layers)}, "Config": {"Env": ["PATH=/opt/venv/bin"]}}
        self.images = type("I", (), {"get": lambda _s, name: type("Img", (), {"id": image_id, "attrs": attrs})()})()
        self.containers = type("C", (), {"create": lambda _s, **kw: self._create(kw)})()

    def _create(self, kw):
        self.created.append(kw)
        return FakeContainer(self, kw)


def _entries(path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as t:
        return {m.name: m for m in t.getmembers()}


def _read(path: Path, name: str) -> str:
    with tarfile.open(path) as t:
        return t.extractfile(name).read().decode()


def test_export_lays_the_venv_out_for_the_host_named_by_its_digest_and_cached_per_image(tmp_path):
    eng = FakeEngine()
    env = envbuild.export_env("eagle3ops/pipeline:t", "/usr/bin/python3.11", cache=tmp_path, client=eng)
    assert env.image == "venv:sha256:" + hashlib.sha256(env.path.read_bytes()).hexdigest()
    assert env.size == env.path.stat().st_size and env.python == "3.11.2" and not env.cached
    assert all(c["network_disabled"] for c in eng.created) and eng.removed == 2  # probe + export, both removed
    m = _entries(env.path)
    assert m["bin/python"].issym() and m["bin/python"].linkname == "/usr/bin/python3.11"
    assert m["bin/python3"].linkname == m["bin/python3.11"].linkname == "python"
    assert m["lib64"].linkname == "lib" and m["lib/python3.11/site-packages/mod_link"].linkname == "eagle3ops"
    assert all(i.uid == 0 and i.uname == "" for i in m.values())
    assert m["bin/eagle3ops-stage"].mode == 0o755
    assert _read(env.path, "bin/eagle3ops-stage") == vc.REAL_STAGE_SH and "-m eagle3ops stage" in vc.REAL_STAGE_SH
    cfg = _read(env.path, "pyvenv.cfg")
    assert "home = /usr/bin\n" in cfg and "executable = /usr/bin/python3.11" in cfg and "command" not in cfg
    assert _read(env.path, "bin/torchrun").startswith(vc.RELOCATABLE_SHEBANG)
    assert "from torch.distributed.run import main" in _read(env.path, "bin/torchrun")
    assert _read(env.path, "lib/python3.11/site-packages/eagle3ops-dev.pth") == "../../../extra/dev\n"
    assert "extra/dev/eagle3ops_dev/__init__.py" in m
    rec = json.loads(_read(env.path, vc.BUILD_RECORD))
    assert rec == {"image": "eagle3ops/pipeline:t", "image_id": "sha256:" + "ab" * 32, "python": "3.11.2",
                   "venv_python": "/usr/bin/python3.11", "source_prefix": "/opt/venv"}
    assert not list(tmp_path.glob("*.part"))
    # the same layers (a rebuild from cache: another image id) for the same venv_python: from the cache, nothing
    # created; other layers, or another venv_python: exported
    eng2 = FakeEngine(image_id="sha256:" + "ef" * 32)
    again = envbuild.export_env("eagle3ops/pipeline:other-tag", "/usr/bin/python3.11", cache=tmp_path, client=eng2)
    assert again.cached and again.image == env.image and again.path == env.path and eng2.created == []
    other = envbuild.export_env("eagle3ops/pipeline:t", "/opt/py/bin/python3", cache=tmp_path, client=FakeEngine())
    assert other.image != env.image and not other.cached
    changed = envbuild.export_env("eagle3ops/pipeline:t", "/usr/bin/python3.11", cache=tmp_path,
                                  client=FakeEngine(layers=("sha256:l1", "sha256:l3")))
    assert not changed.cached and changed.path != env.path
    # a truncated tarball is not a cache hit
    env.path.write_bytes(env.path.read_bytes()[:100])
    content = envbuild.image_content(eng2.images.get("x").attrs)
    assert envbuild.cached(content, "/usr/bin/python3.11", tmp_path) is None


def test_the_relocatable_shebang_runs_the_python_beside_the_script(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/python").symlink_to(sys.executable)
    script = tmp_path / "bin/tool"
    script.write_text(vc.RELOCATABLE_SHEBANG + "import sys\nprint(sys.argv[1:], sys.executable)\n")
    script.chmod(0o755)
    out = subprocess.run([str(script), "a b", "c"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("['a b', 'c'] ") and str(tmp_path / "bin/python") in out.stdout


def test_an_image_whose_python_is_not_a_venv_is_refused():
    probe = {**PROBE, "prefix": "/usr", "site_packages": ""}
    with pytest.raises(envbuild.EnvBuildError, match="is not a venv"):
        envbuild.export_env("img:x", "/usr/bin/python3", cache=Path("/nonexistent"), client=FakeEngine(probe))


def test_another_python_minor_version_on_the_host_is_refused_naming_both():
    envbuild.check_python("3.11.2", "3.11.9", venv_python="/usr/bin/python3", host="pod", source="img")
    with pytest.raises(envbuild.EnvBuildError) as exc:
        envbuild.check_python("3.11.2", "3.12.3", venv_python="/usr/bin/python3.12", host="pod", source="img:t")
    msg = str(exc.value)
    assert "Python 3.11.2" in msg and "Python 3.12.3" in msg and "hosts.pod.venv_python" in msg
    assert "/usr/bin/python3.12" in msg


def _receive(tmp_path: Path, tgz: bytes, python: str) -> subprocess.CompletedProcess:
    hexd = hashlib.sha256(tgz).hexdigest()
    return subprocess.run(["sh", "-c", vc.RECEIVE_SH, "x", str(tmp_path / "env"), hexd, vc.ENV_MARKER,
                           vc.BUILD_RECORD], input=tgz, capture_output=True, timeout=60)


def test_the_host_refuses_an_environment_of_another_python_minor_version(tmp_path):
    """RECEIVE_SH (run here with this machine's sh): the build record's Python against ``bin/python``'s."""
    here = "%d.%d.%d" % sys.version_info[:3]
    for want, ok in ((here, True), ("2.7.18", False)):
        path = tmp_path / f"{want}.tar.gz"
        link = tarfile.TarInfo("bin/python")
        link.type, link.linkname = tarfile.SYMTYPE, sys.executable
        entries = [(link, None), *envbuild.fixed_entries({"python": want})]
        digest, _ = envbuild.write_tarball(iter(entries), path)
        got = _receive(tmp_path, path.read_bytes(), want)
        if ok:
            assert got.returncode == 0, got.stderr
            marker = json.loads((Path(got.stdout.decode().strip()) / vc.ENV_MARKER).read_text())
            assert marker["env_python"] == ".".join(here.split(".")[:2]) and marker["python"] == here
        else:
            assert got.returncode == 6 and b"Python mismatch: the environment is Python 2.7" in got.stderr
            assert not (tmp_path / "env" / digest.removeprefix("venv:sha256:")).exists()


def test_deploy_of_a_venv_host_refuses_a_python_mismatch_before_sending(monkeypatch, tmp_path):
    from eagle3ops import deployer, images
    from eagle3ops.config import HostConfig
    from eagle3ops.transfer import envdeliver

    h = HostConfig(name="pod", hostname="127.0.0.1", data_dir="/d", state_dir="/s", model_path="/m",
                   stage_runtime="venv", venv_python="/usr/bin/python3.12", serving="none")

    class R:
        def __init__(self, *a, **k):
            self.host = h

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def run(self, cmd, check=True, stdin=None):
            return type("Res", (), {"ok": True, "stdout": "3.12.3\n", "stderr": "", "exited": 0})()

    built = images.BuiltImage(tag="eagle3ops/pipeline:t", image_id="sha256:" + "cd" * 32, size=1)
    env = envbuild.EnvTarball(path=tmp_path / "x.tar.gz", image="venv:sha256:" + "0" * 64, size=1, python="3.11.2",
                              source=built.tag, source_id=built.image_id, venv_python=h.venv_python, build_s=1.0)
    monkeypatch.setattr(deployer.executor, "for_host", R)
    plan = SimpleNamespace(name="pipeline", base="vllm/vllm-openai:v0.16.0", base_labels={}, tag=built.tag, labels={})
    monkeypatch.setattr(images, "plan_build", lambda *a, **k: plan)
    monkeypatch.setattr(images, "build_image", lambda *a, **k: built)
    monkeypatch.setattr(envbuild, "export_env", lambda *a, **k: env)
    monkeypatch.setattr(envdeliver, "send_env", lambda *a, **k: pytest.fail("sent despite the mismatch"))
    with pytest.raises(deployer.DeployError) as exc:
        deployer.deploy(h, echo=lambda _: None)
    assert "Python 3.11.2" in str(exc.value) and "Python 3.12.3" in str(exc.value)
    assert "hosts.pod.venv_python" in str(exc.value)


def test_preflight_refuses_an_environment_of_another_python_than_venv_python():
    from eagle3ops.window import preflight as wpreflight
    from test_venv_runtime import ENV_HEX, ENV_ID, ENV_IMAGE, VenvHost, venv_host
    from test_window_driver import StandInRemote

    h = venv_host()  # venv_python /usr/bin/python3.12 answering 3.12.3
    for env_python, ok in (("3.12", True), ("3.11", False)):
        world = VenvHost(h, marker=json.dumps({"digest": ENV_ID, "python": "3.12.3", "env_python": env_python}))
        pf = wpreflight.preflight(StandInRemote(h, world), image=ENV_IMAGE, expected_image_id=ENV_ID,
                                  trial=("r1", "w1", "prepare"))
        checks = {n: (k, d) for n, k, d in pf.checks}
        assert checks["pipeline environment"][0] is ok, checks
    detail = checks["pipeline environment"][1]
    assert f"/env/{ENV_HEX} is a Python 3.11 environment but /usr/bin/python3.12 is Python 3.12.3" in detail
    assert "hosts." in detail and ".venv_python" in detail


def test_an_environment_exported_from_a_stand_in_image_carries_the_marker_first(tmp_path):
    from eagle3ops.config.standin import STANDIN_ENV_MARKER
    from eagle3ops.transfer.envdeliver import env_marker

    eng = FakeEngine()
    eng.images.get("x").attrs["Config"]["Labels"] = {"io.eagle3ops.stand-in-for": "vllm/vllm-openai:v0.16.0"}
    env = envbuild.export_env("eagle3ops/pipeline:t", "/usr/bin/python3.11", cache=tmp_path, client=eng)
    with tarfile.open(env.path) as t:
        assert t.getnames()[0] == STANDIN_ENV_MARKER  # read from the tarball's head, not after GBs of venv
    mark = env_marker(env.path)
    assert mark["image"] == "eagle3ops/pipeline:t" and "io.eagle3ops.stand-in-for" in mark["why"], mark
    real = envbuild.export_env("eagle3ops/pipeline:t", "/usr/bin/python3.11", cache=tmp_path / "real",
                               client=FakeEngine())
    assert env_marker(real.path) is None and STANDIN_ENV_MARKER not in _entries(real.path)
