"""``capture``/``drift`` round trip on a real container of the local docker engine.

The container image is assembled here without any registry: a minimal root filesystem made of this machine's own
``sh``, ``cat``, ``find``, ``sha256sum``, ``base64``, ``sed``, ``sleep``, ``mkdir`` and their shared libraries
(``ldd``), imported with ``docker import``. It has no Python, so the package is located by the ``find`` fallback.
The real speculators 0.3.0 wheel is copied in with ``docker cp``; a ``sed -i`` inside the running container is the
"live edit". The captured patch, applied to the pristine wheel, must reproduce the edited files byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from eagle3ops.patches.apply import apply_series
from eagle3ops.patches.capture import inspect_container, local_docker_runner
from eagle3ops.patches.series import load_series

from test_patch_helpers import GEN, LOGU, SPEC_030, make_diff, run_cli, site_from_wheel, write_series

SITE = "/usr/lib/python3/dist-packages"
TOOLS = ["sh", "cat", "find", "sha256sum", "base64", "sed", "sleep", "mkdir", "rm"]
TOKENIZER_SED = "s/AutoTokenizer.from_pretrained(model_path)/AutoTokenizer.from_pretrained(model_path, trust_remote_code=True)/"


def _docker(*args: str, input: bytes | None = None, docker_host: str | None = None) -> bytes:
    h = ["-H", docker_host] if docker_host else []
    return subprocess.run(["docker", *h, *args], input=input, capture_output=True, check=True).stdout


def _rootfs_tar(dest: Path) -> Path:
    """A tar of a rootfs holding the host's tools and their libraries (real files, symlinks resolved)."""
    files: dict[str, Path] = {}
    for t in TOOLS:
        exe = shutil.which(t)
        assert exe, f"host tool {t} missing"
        files[f"bin/{t}"] = Path(exe).resolve()
        out = subprocess.run(["ldd", exe], capture_output=True, text=True, check=False).stdout
        for lib in re.findall(r"(/\S+) \(0x", out):
            files[lib.lstrip("/")] = Path(lib).resolve()
    tar = dest / "rootfs.tar"
    with tarfile.open(tar, "w") as tf:
        for d in ("tmp", "usr/lib/python3/dist-packages"):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tf.addfile(ti)
        for arc, src in sorted(files.items()):
            tf.add(src, arcname=arc, recursive=False)
    return tar


def _import_image(tar: Path, docker_host: str | None = None) -> str:
    """``docker import`` the rootfs tar (once per content digest) into the engine at ``docker_host``; its tag."""
    digest = hashlib.sha256(tar.read_bytes()).hexdigest()[:12]
    tag = f"eagle3ops-test/patch-capture:{digest}"
    h = ["-H", docker_host] if docker_host else []
    if subprocess.run(["docker", *h, "image", "inspect", tag], capture_output=True).returncode != 0:
        _docker("import", "--change", 'CMD ["/bin/sleep","600"]', str(tar), tag, docker_host=docker_host)
    return tag


@pytest.fixture(scope="module")
def rootfs_tar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _rootfs_tar(tmp_path_factory.mktemp("rootfs"))


@pytest.fixture(scope="module")
def capture_image(rootfs_tar: Path) -> str:
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.fail("the local docker engine is required for the capture round trip (docker info failed)")
    return _import_image(rootfs_tar)


@pytest.fixture()
def container(capture_image: str) -> Iterator[str]:
    name = f"e3-patch-capture-{uuid.uuid4().hex[:8]}"
    _docker("run", "-d", "--network", "none", "--name", name, capture_image, "/bin/sleep", "600")
    try:
        yield name
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def _install(container: str, site: Path) -> None:
    _docker("exec", container, "rm", "-rf", f"{SITE}/speculators", f"{SITE}/speculators-0.3.0.dist-info")
    _docker("cp", f"{site}/.", f"{container}:{SITE}/")


def _cat(container: str, rel: str) -> bytes:
    return _docker("exec", container, "cat", f"{SITE}/{rel}")


def test_capture_round_trip_byte_for_byte(tmp_path: Path, container: str) -> None:
    pristine = site_from_wheel(SPEC_030, tmp_path / "pristine")
    _install(container, pristine)
    # the live edits: a sed -i in the running container, a new file, a deleted file
    _docker("exec", container, "sed", "-i", TOKENIZER_SED, f"{SITE}/{GEN}")
    _docker("exec", container, "sh", "-c", f"printf 'HOTFIX = True\\n' > {SITE}/speculators/hotfix.py")
    _docker("exec", container, "rm", f"{SITE}/speculators/proposals/greedy.py")
    edited = _cat(container, GEN)
    assert b"trust_remote_code=True)\n\n        config" in edited

    cp = inspect_container(local_docker_runner(container), "speculators")
    assert (cp.site_dir, cp.version) == (SITE, "0.3.0")
    assert cp.modified == [GEN] and cp.added == ["speculators/hotfix.py"] and cp.deleted == ["speculators/proposals/greedy.py"]

    write_series(tmp_path / "patches", SPEC_030, [])
    out = tmp_path / "captured.patch"
    r = run_cli("capture", "local", "--container", container, "--package", "speculators", "-o", out, "--patches-dir", tmp_path / "patches")
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "X-Eagle3ops-Pin: speculators==0.3.0" in text and f"--- a/{GEN}" in text

    # the captured patch, applied strictly to the pristine wheel, reproduces the container's files byte for byte
    sdir = tmp_path / "patches/speculators/0.3.0"
    shutil.copy(out, sdir / "0001-captured.patch")
    (sdir / "series").write_text("0001-captured.patch\n")
    target = site_from_wheel(SPEC_030, tmp_path / "target")
    res = apply_series(load_series(sdir), site_dir=target, check_requires=False)
    assert [p.action.value for p in res.patches] == ["applied"]
    assert (target / GEN).read_bytes() == edited
    assert (target / "speculators/hotfix.py").read_bytes() == _cat(container, "speculators/hotfix.py")
    assert not (target / "speculators/proposals/greedy.py").exists()


def test_capture_of_unmodified_package_says_nothing_to_capture(tmp_path: Path, container: str) -> None:
    _install(container, site_from_wheel(SPEC_030, tmp_path / "pristine"))
    write_series(tmp_path / "patches", SPEC_030, [])
    r = run_cli("capture", "local", "--container", container, "--patches-dir", tmp_path / "patches")
    assert r.returncode == 1
    assert "identical to its wheel: nothing to capture" in r.stderr


def test_drift_attributes_known_partial_and_unknown(tmp_path: Path, container: str) -> None:
    pristine = site_from_wheel(SPEC_030, tmp_path / "pristine")
    d1 = make_diff(pristine, LOGU, lambda t: t.replace("import logging", "import logging  # 0001", 1), tmp_path / "e1")
    d2 = make_diff(pristine, GEN, lambda t: t.replace("AutoTokenizer.from_pretrained(model_path)",
                                                      "AutoTokenizer.from_pretrained(model_path, trust_remote_code=True)", 1), tmp_path / "e2")
    d3 = make_diff(pristine, GEN, lambda t: t.replace("import torch\n", "import torch  # 0003\n", 1), tmp_path / "e3")
    sdir = write_series(tmp_path / "patches", SPEC_030, [("0001-log.patch", d1), ("0002-tok.patch", d2), ("0003-torch.patch", d3)])

    # 1) pristine package: every file the series changes is reported as a missing patch
    _install(container, pristine)
    r = run_cli("drift", "local", "--container", container, "--patches-dir", tmp_path / "patches")
    assert r.returncode == 1, r.stderr
    assert f"missing-patch {LOGU}: still pristine, but the series changes it (0001-log.patch)" in r.stdout
    assert f"missing-patch {GEN}: still pristine, but the series changes it (0002-tok.patch, 0003-torch.patch)" in r.stdout

    # 2) series applied by eagle3ops (manifest present), then live edits on top
    patched = site_from_wheel(SPEC_030, tmp_path / "patched")
    apply_series(load_series(sdir), site_dir=patched, check_requires=False, profile="speculators-0.3.0-vllm-0.16.0")
    _install(container, patched)
    _docker("exec", container, "sed", "-i", "s/import logging  # 0001/import logging  # 0001 + live edit/", f"{SITE}/{LOGU}")
    _docker("exec", container, "sed", "-i", 's/^build_type = .*/build_type = "hotfix"/', f"{SITE}/speculators/version.py")
    r = run_cli("drift", "local", "--container", container, "--patches-dir", tmp_path / "patches")
    assert r.returncode == 1
    out = r.stdout
    assert "manifest lists: 0001-log.patch, 0002-tok.patch, 0003-torch.patch" in out
    assert f"known         {GEN}: matches the wheel + series (0002-tok.patch, 0003-torch.patch)" in out
    assert f"unknown       {LOGU}: edited beyond/instead of series patches 0001-log.patch" in out
    assert "unknown       speculators/version.py: differs from the wheel; no series patch touches it" in out

    # 3) only the first GEN patch applied (0003 missing): partial
    half = site_from_wheel(SPEC_030, tmp_path / "half")
    ser = load_series(sdir)
    ser.patches = ser.patches[:2]
    apply_series(ser, site_dir=half, check_requires=False)
    _install(container, half)
    r = run_cli("drift", "local", "--container", container, "--patches-dir", tmp_path / "patches")
    assert f"partial       {GEN}: matches the state after 0002-tok.patch; missing 0003-torch.patch" in r.stdout
    assert f"known         {LOGU}" in r.stdout

    # 4) exactly the series: clean, exit 0
    _install(container, patched)
    r = run_cli("drift", "local", "--container", container, "--patches-dir", tmp_path / "patches")
    assert r.returncode == 0, r.stdout
    assert "unknown" not in r.stdout and "missing-patch" not in r.stdout
    manifest = json.loads(_cat(container, "eagle3ops_patches/speculators.json"))
    assert manifest["profile"] == "speculators-0.3.0-vllm-0.16.0"


@pytest.mark.sandbox
def test_capture_round_trip_over_ssh_on_sandbox_host(tmp_path: Path, rootfs_tar: Path, sandbox_host) -> None:
    """The capture round trip on the sandbox host: a ``sed -i`` run through SSH (``Remote``) inside a container of
    the sandbox's own docker engine becomes, via ``capture sandbox`` (SSH, host keys checked), a patch that applied
    to the pristine wheel reproduces the edited file byte for byte."""
    from eagle3ops.remote import Remote

    from conftest import INVENTORY

    dh = sandbox_host.docker_host
    tag = _import_image(rootfs_tar, docker_host=dh)
    name = f"e3-patch-capture-{uuid.uuid4().hex[:8]}"
    _docker("run", "-d", "--network", "none", "--name", name, tag, "/bin/sleep", "600", docker_host=dh)
    try:
        _docker("cp", f"{site_from_wheel(SPEC_030, tmp_path / 'pristine')}/.", f"{name}:{SITE}/", docker_host=dh)
        with Remote(sandbox_host) as remote:
            remote.run(["docker", "-H", dh, "exec", name, "sed", "-i", TOKENIZER_SED, f"{SITE}/{GEN}"])
            edited_b64 = remote.run(["docker", "-H", dh, "exec", name, "base64", f"{SITE}/{GEN}"]).stdout
        import base64

        edited = base64.b64decode("".join(edited_b64.split()))
        assert b"from_pretrained(model_path, trust_remote_code=True)" in edited

        write_series(tmp_path / "patches", SPEC_030, [])
        out = tmp_path / "captured.patch"
        r = run_cli("capture", "sandbox", "--container", name, "--inventory", INVENTORY, "-o", out,
                    "--patches-dir", tmp_path / "patches")
        assert r.returncode == 0, r.stderr
        assert f"modified ['{GEN}'], added [], deleted []" in r.stderr
        sdir = tmp_path / "patches/speculators/0.3.0"
        shutil.copy(out, sdir / "0001-captured.patch")
        (sdir / "series").write_text("0001-captured.patch\n")
        target = site_from_wheel(SPEC_030, tmp_path / "target")
        apply_series(load_series(sdir), site_dir=target, check_requires=False)
        assert (target / GEN).read_bytes() == edited

        d = run_cli("drift", "sandbox", "--container", name, "--inventory", INVENTORY, "--patches-dir", tmp_path / "patches")
        # the captured patch is now the series: drift over SSH attributes the live edit to it
        assert d.returncode == 0, d.stdout + d.stderr
        assert f"known         {GEN}: matches the wheel + series (0001-captured.patch)" in d.stdout
    finally:
        subprocess.run(["docker", "-H", dh, "rm", "-f", name], capture_output=True)
