"""An image or a pipeline environment built for another CPU architecture than the host's is refused before it is
sent or serving is stopped for it: ``push`` (its plan), ``release --image`` (before the lock), ``deploy
--env-tarball`` (before the upload). The foreign image is a real one on the build engine (``FROM scratch`` + one
file, built with ``--platform``: no emulation needed); the host's machine is read for real (the build engine's
``docker info``, this machine's ``uname -m``) except for the release, driven against the in-memory stand-in host of
``test_window_driver``."""

from __future__ import annotations

import io
import platform
import tarfile
from pathlib import Path

import pytest

from eagle3ops.config import HostConfig, load_inventory
from eagle3ops.executor import Local
from test_window_driver import IMAGE, IMAGE_ID, Launched, StandInHost, _cli

REPO = Path(__file__).resolve().parents[1]
#: This machine's architecture in GOARCH words (as an image config names it).
HERE = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
#: An architecture that is not this machine's (the build engine's and the local "host"'s).
FOREIGN = "arm64" if HERE != "arm64" else "amd64"
#: ELF ``e_machine`` of :data:`FOREIGN` (EM_AARCH64, EM_X86_64).
FOREIGN_ELF_MACHINE = 183 if FOREIGN == "arm64" else 62
STANDIN_TAG = f"eagle3ops-test/arch-standin:{FOREIGN}"


@pytest.fixture(scope="module")
def foreign_image(tmp_path_factory) -> str:
    """A STAND-IN image for another architecture on the build engine: ``FROM scratch``, one file, config
    ``architecture`` = :data:`FOREIGN` (``docker build --platform``; nothing in it runs, so no emulation)."""
    from eagle3ops import executor

    ctx = tmp_path_factory.mktemp("arch-standin")
    (ctx / "hello.txt").write_text("a stand-in layer\n")
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY hello.txt /hello.txt\n")
    img, _ = executor.engine(timeout=120).images.build(path=str(ctx), tag=STANDIN_TAG, platform=f"linux/{FOREIGN}",
                                                        rm=True)
    assert img.attrs["Architecture"] == FOREIGN
    return STANDIN_TAG


class _LocalHost(Local):
    """This machine's executor standing for a host (its engine: the build engine; ``uname -m``: this machine)."""

    def __init__(self, host: HostConfig):
        super().__init__()
        self.host = host

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def close(self):
        pass


def test_push_plan_refuses_an_image_of_another_architecture(foreign_image, tmp_path):
    """The push's facts (the host engine's ``docker info``, read for real here from the build engine) name the
    host's machine; the plan refuses an image whose config is for another one, whether the host lacks it or not."""
    from eagle3ops.transfer.errors import TransferError
    from eagle3ops.transfer.local import inspect_local
    from eagle3ops.transfer.plan import PushOptions, gather, plan_push
    from eagle3ops.transfer.sources import open_source

    h = HostConfig(name="engine-host", hostname="127.0.0.1", data_dir=str(tmp_path / "d"),
                   state_dir=str(tmp_path / "s"), model_path="/m", serving="none")
    img = inspect_local(foreign_image)
    src = open_source(img)
    try:
        facts = gather(_LocalHost(h), src, PushOptions())
        with pytest.raises(TransferError) as exc:
            plan_push(h, src, facts, PushOptions())
    finally:
        src.close()
    msg = " ".join(str(exc.value).split())
    assert f"{foreign_image} is built for {FOREIGN} but engine-host runs {HERE}" in msg, msg
    assert "exec format error" in msg and f"docker build --platform linux/{HERE}" in msg, msg


class _ArchHost(StandInHost):
    """The stand-in host of ``test_window_driver`` whose engine says its machine (``docker info``) and the
    architecture of each image it holds."""

    machine = "x86_64" if HERE == "amd64" else "aarch64"
    archs = {"serving:native": HERE, "serving:foreign": FOREIGN}

    def _docker(self, a):
        if a[0] == "info":
            return 0, self.machine + "\n", ""
        if a[:3] == ["image", "inspect", "--format"] and a[3] == "{{.Architecture}}":
            return (0, self.archs[a[-1]] + "\n", "") if a[-1] in self.archs else (1, "", "No such image")
        return super()._docker(a)


def _arch_world(host):
    world = _ArchHost(host)
    world.containers[host.serving.container] = "running"
    world._mkdirs(host.data_dir)
    world.files[f"{host.state_dir}/deployed.json"] = '{"image": "%s", "image_id": "%s"}' % (IMAGE, IMAGE_ID)
    world._mkdirs(host.state_dir)
    return world


def test_release_image_of_another_architecture_is_refused_before_the_lock(monkeypatch):
    """``release --image`` of an image the host holds for another machine: refused naming both architectures and
    the fix, nothing written (no lock, no plan, serving not stopped); the host's own architecture goes on."""
    host = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    launched: list[str] = []

    def on_launch(name):
        launched.append(name)
        raise Launched(name)

    world = _arch_world(host)
    world.on_launch = on_launch
    out = _cli(monkeypatch, world, "release", "sandbox", "--image", "serving:foreign")
    text = " ".join(out.output.split())
    assert out.exit_code != 0 and not launched, text
    assert f"release --image: serving:foreign is built for {FOREIGN} but sandbox runs {HERE}" in text, text
    assert f"docker build --platform linux/{HERE}" in text and "nothing was sent or stopped" in text, text
    assert not world.writes, world.writes  # not even the lock
    world = _arch_world(host)
    world.on_launch = on_launch
    _cli(monkeypatch, world, "release", "sandbox", "--image", "serving:native")
    assert launched, "an image of the host's own architecture was refused"


def _standin_env(path: Path) -> Path:
    """A STAND-IN pipeline environment tarball: one compiled extension whose ELF header says :data:`FOREIGN` (64
    bytes: ``e_ident`` little-endian 64-bit, ``e_type`` ET_DYN, ``e_machine``), beside a Python file."""
    elf = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + (3).to_bytes(2, "little") + FOREIGN_ELF_MACHINE.to_bytes(2, "little")
    files = {"lib/python3.11/site-packages/standin/__init__.py": b"",
             "lib/python3.11/site-packages/standin/_native.cpython-311-linux-gnu.so": elf.ljust(64, b"\0")}
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_deploy_env_tarball_of_another_architecture_is_refused_before_sending(monkeypatch, tmp_path):
    """``deploy --env-tarball`` to a venv host: the tarball's compiled files are for another machine than the host's
    ``uname -m`` (run for real, here): refused naming the file, both architectures and the fix; nothing sent."""
    from eagle3ops import deployer

    h = HostConfig(name="pod", hostname="127.0.0.1", data_dir=str(tmp_path / "d"), state_dir=str(tmp_path / "s"),
                   model_path="/m", stage_runtime="venv", venv_python="/usr/bin/python3", serving="none")
    class _OnlyMachine(_LocalHost):  # `uname -m` runs here for real; anything else would ask or send
        def run(self, argv, **kw):
            if list(argv) != ["uname", "-m"]:
                pytest.fail(f"{list(argv)} ran before the architecture was refused")
            return super().run(argv, **kw)

    monkeypatch.setattr(deployer.executor, "for_host", lambda host, **kw: _OnlyMachine(host))
    tarball = _standin_env(tmp_path / "env.tar.gz")
    with pytest.raises(deployer.DeployError) as exc:
        deployer.deploy_env(h, tarball, echo=lambda _: None)
    msg = " ".join(str(exc.value).split())
    assert f"is built for {FOREIGN} but pod runs {HERE} (`uname -m` says {platform.machine()})" in msg, msg
    assert "_native.cpython-311-linux-gnu.so" in msg and "image env-tarball" in msg, msg
