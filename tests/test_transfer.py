"""Image transfer with real engines: the build engine → a sandbox host's dockerd over real SSH.

Test images are built locally (no registry): a base ``docker import``-ed from a few files, then COPY layers of
random bytes, so every run has fresh layer digests. Uses sandboxes ``pytest-push`` (2232) and ``pytest-push2``
(2233), never the demo's ``sandbox``. The host engines here use the classic layer store (Docker 20.10); the containerd
image store has its own module, tests/test_transfer_containerd.py (sandbox ``pytest-ctrd2``, Docker 26.1).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

from eagle3ops import transfer
from eagle3ops_dev import sandbox
from eagle3ops.transfer.archive import SCAFFOLD_LABEL
from eagle3ops.transfer.cli import push_command
from eagle3ops.transfer import compression
from eagle3ops.transfer.compression import Encoders, choose_compression
from eagle3ops.transfer.hoststore import inspect_host
from eagle3ops.transfer.local import is_containerd_store
from eagle3ops.transfer.sources import SaveLayerSource, StoreLayerSource
from eagle3ops.transfer.tarsafe import safe_extract
from eagle3ops.remote import Remote
from eagle3ops.transfer import PushOptions

pytestmark = pytest.mark.sandbox
#: This module brings up a sandbox of its own (pytest-push): its tests run in the host suite's "rest" part
#: (tests/conftest.py), the module whole in one process.
OWN_SANDBOX = "pytest-push"


def _docker(*args: str, host: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    argv = ["docker"] + (["-H", host] if host else []) + list(args)
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=300)


@pytest.fixture(scope="module")
def sbx():
    info = sandbox.up("pytest-push", 2232)
    yield info
    sandbox.down("pytest-push")


@pytest.fixture(scope="module")
def sbx2():
    info = sandbox.up("pytest-push2", 2233)
    yield info
    sandbox.down("pytest-push2")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Two versions of a 4-layer image differing only in the top layer, plus a big-layer image.

    Returns dict: v1, v2, big (tags).
    """
    d = tmp_path_factory.mktemp("img")
    tag = uuid.uuid4().hex[:8]
    (d / "root" / "etc").mkdir(parents=True)
    (d / "root" / "etc" / "base").write_text("base\n")
    (d / "root" / "etc" / "link").symlink_to("base")
    base = f"e3ops-test/base:{tag}"
    tar = subprocess.run(["tar", "-C", str(d / "root"), "-c", "."], capture_output=True, check=True).stdout
    subprocess.run(["docker", "import", "-", base], input=tar, capture_output=True, check=True)
    (d / "a.bin").write_bytes(os.urandom(3_000_000))
    (d / "b.bin").write_bytes(os.urandom(2_000_000))
    (d / "big.bin").write_bytes(os.urandom(24_000_000))
    (d / "big2.bin").write_bytes(os.urandom(12_000_000))
    tags = {}
    for version in ("v1", "v2"):
        (d / "c.txt").write_text(f"patch {version}\n")
        (d / "Dockerfile").write_text(f"FROM {base}\nCOPY a.bin /a.bin\nCOPY b.bin /b.bin\nCOPY c.txt /c.txt\n")
        tags[version] = f"e3ops-test/app:{tag}-{version}"
        _docker("build", "-q", "-t", tags[version], str(d))
    (d / "Dockerfile").write_text(f"FROM {base}\nCOPY big.bin /big.bin\nCOPY big2.bin /big2.bin\nCOPY c.txt /c.txt\n")
    tags["big"] = f"e3ops-test/big:{tag}"
    _docker("build", "-q", "-t", tags["big"], str(d))
    yield tags
    _docker("image", "rm", *tags.values(), base, check=False)


def _host_id(info, ref: str) -> str:
    return _docker("image", "inspect", "--format", "{{.Id}}", ref, host=info.docker_host, check=False).stdout.strip()


def _wipe(info, *refs: str) -> None:
    """Remove the images (by id: every tag of them) from the sandbox host."""
    ids = [transfer.inspect_local(r).id for r in refs]
    _docker("image", "rm", "-f", *ids, host=info.docker_host, check=False)
    for i in ids:
        assert _host_id(info, i) == ""


# --- pure parts (no host) ---------------------------------------------------------------------------------------
def test_chain_ids_match_the_engines_layer_store(images):
    img = transfer.inspect_local(images["v1"])
    root = _docker("info", "--format", "{{.DockerRootDir}}").stdout.strip()
    for cid in img.chain_ids:
        assert (Path(root) / "image/overlay2/layerdb/sha256" / cid[7:]).is_dir(), cid
    assert img.chain_ids[0] == img.diff_ids[0] and len(set(img.chain_ids)) == len(img.diff_ids)


def test_store_source_equals_docker_save(images):
    img = transfer.inspect_local(images["v1"])
    store = StoreLayerSource.open(img)
    save = SaveLayerSource(img)
    try:
        assert store.config_bytes() == save.config_bytes()
        for i in range(len(img.diff_ids)):
            a = b"".join(store.iter_layer(i))
            assert a == b"".join(save.iter_layer(i))
            assert store.layer_size(i) == len(a)
    finally:
        save.close()


def test_corrupt_layer_bytes_are_detected(images):
    img = transfer.inspect_local(images["v1"])

    class Corrupt(StoreLayerSource):
        def _raw_layer(self, i):
            for k, chunk in enumerate(super()._raw_layer(i)):
                yield bytes([chunk[0] ^ 1]) + chunk[1:] if k == 0 else chunk

    src = Corrupt(img, StoreLayerSource.open(img).root)
    with pytest.raises(transfer.LayerDigestMismatch, match="layer 1"):
        b"".join(src.iter_layer(1))


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for ti, data in members:
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    buf.seek(0)
    return buf


@pytest.mark.parametrize("bad", ["../evil", "/abs/evil", "a/../../evil", "sym-out", "hard-out", "dev"])
def test_safe_extract_refuses_path_escapes(tmp_path, bad):
    dest = tmp_path / "x" / "dest"
    dest.mkdir(parents=True)
    ok = tarfile.TarInfo("ok.txt")
    if bad == "sym-out":
        ti = tarfile.TarInfo("link"); ti.type = tarfile.SYMTYPE; ti.linkname = "../../outside"
    elif bad == "hard-out":
        ti = tarfile.TarInfo("hl"); ti.type = tarfile.LNKTYPE; ti.linkname = "../outside"
    elif bad == "dev":
        ti = tarfile.TarInfo("null"); ti.type = tarfile.CHRTYPE; ti.devmajor, ti.devminor = 1, 3
    else:
        ti = tarfile.TarInfo(bad)
    with pytest.raises(transfer.UnsafeArchive):
        safe_extract(_tar((ok, b"fine"), (ti, b"x" if ti.isreg() else b"")), dest)
    assert not (tmp_path / "x" / "evil").exists() and not (tmp_path / "evil").exists()
    assert (dest / "ok.txt").read_bytes() == b"fine"  # members before the bad one were checked and written
    assert sorted(p.name for p in dest.iterdir()) == ["ok.txt"]


def test_safe_extract_accepts_inner_links(tmp_path):
    f = tarfile.TarInfo("d/f")
    s = tarfile.TarInfo("d/s"); s.type = tarfile.SYMTYPE; s.linkname = "f"
    names = safe_extract(_tar((f, b"data"), (s, b"")), tmp_path)
    assert names == ["d/f", "d/s"] and (tmp_path / "d" / "s").read_bytes() == b"data"


def test_store_detection():
    info = json.loads(_docker("info", "--format", "{{json .}}").stdout)
    assert is_containerd_store(info) is False  # this machine: Docker 20.10, overlay2 (classic)
    # The shape `docker info` has on Docker >= 24 with the containerd image store (driver-type snapshotter).
    cd = {"Driver": "overlayfs", "DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]}
    assert is_containerd_store(cd) is True


# --- real pushes ------------------------------------------------------------------------------------------------
def test_cold_push_then_patch_only_update(sbx, images):
    _wipe(sbx, images["v1"], images["v2"])
    host = sbx.host_config()
    v1 = transfer.inspect_local(images["v1"])
    r1 = transfer.push(v1, host)
    assert r1.status == "ok", r1.reason
    assert r1.layers_sent == 4 and r1.mode == "thin" and r1.store == "classic"
    assert _host_id(sbx, images["v1"]) == v1.id
    # v2 differs only in the top layer: only that layer goes over SSH.
    v2 = transfer.inspect_local(images["v2"])
    r2 = transfer.push(v2, host)
    assert r2.status == "ok", r2.reason
    assert r2.layers_sent == 1 and r2.per_layer.keys() == {3}
    src = StoreLayerSource.open(v2)
    top = src.layer_size(3)
    assert r2.layer_bytes == top
    assert r2.bytes_sent < top + 8192  # the top layer + config + manifest + tar headers
    assert r2.bytes_sent < r1.bytes_sent / 100
    assert _host_id(sbx, images["v2"]) == v2.id
    # The loaded image is usable: a container made from it holds v2's patch file (no shell in it to run).
    cid = _docker("create", "--network", "host", images["v2"], "x", host=sbx.docker_host).stdout.strip()
    try:
        data = subprocess.run(["docker", "-H", sbx.docker_host, "cp", f"{cid}:/c.txt", "-"], capture_output=True,
                              check=True).stdout
        assert b"patch v2" in data
    finally:
        _docker("rm", cid, host=sbx.docker_host, check=False)
    # Pushing again: already present, nothing sent.
    r3 = transfer.push(v2, host)
    assert r3.status == "present" and r3.bytes_sent == 0


def test_push_to_host_with_only_some_layers_and_tag_only(sbx, images):
    """The host holds v1's base+a+b layers (through v1); v2 needs only its top layer; a new tag of a present image
    is only tagged."""
    _wipe(sbx, images["v1"], images["v2"])
    host = sbx.host_config()
    assert transfer.push(images["v1"], host).status == "ok"
    with Remote(host) as remote:
        store = inspect_host(remote)
    v2 = transfer.inspect_local(images["v2"])
    present = [c in store.chain_ids for c in v2.chain_ids]
    assert present == [True, True, True, False]
    r = transfer.push(v2, host, options=PushOptions(source="save"))  # the docker-save source path too
    assert r.status == "ok" and r.layers_sent == 1, r.reason
    _docker("image", "rm", images["v2"], host=sbx.docker_host)
    _docker("tag", images["v1"], images["v1"] + "-other")
    try:
        r = transfer.push(images["v1"] + "-other", host)
        assert r.status == "tagged" and r.bytes_sent == 0
        assert _host_id(sbx, images["v1"] + "-other") == transfer.inspect_local(images["v1"]).id
    finally:
        _docker("image", "rm", images["v1"] + "-other", check=False)


@pytest.mark.parametrize("codec", ["zstd", "gzip"])
def test_compressed_push(sbx, images, codec):
    _wipe(sbx, images["big"])
    r = transfer.push(images["big"], sbx.host_config(), options=PushOptions(compression=codec, transport="openssh"))
    assert r.status == "ok", r.reason
    assert r.compression.startswith(codec)
    assert _host_id(sbx, images["big"]) == transfer.inspect_local(images["big"]).id
    # random data: compression cannot shrink it, but the stream must carry it all
    assert r.bytes_sent > 36_000_000


def test_broken_stream_is_an_error_then_retry_succeeds(sbx, images):
    host = sbx.host_config()
    killed = []

    def kill_first(stream):
        if killed:
            return
        killed.append(stream)

    def on_progress(p):
        if killed and p.wire > 4_000_000 and killed[0].proc.poll() is None:
            killed[0].proc.kill()

    _wipe(sbx, images["big"])
    r = transfer.push(images["big"], host, options=PushOptions(transport="openssh", attempts=1),
                      stream_hook=kill_first, on_progress=on_progress)
    assert r.status == "failed" and "broke" in r.reason and r.attempts == 1
    assert _host_id(sbx, images["big"]) == ""
    killed.clear()
    r = transfer.push(images["big"], host, options=PushOptions(transport="openssh", attempts=3),
                      stream_hook=kill_first, on_progress=on_progress)
    assert r.status == "ok", r.reason
    assert r.attempts == 2
    assert _host_id(sbx, images["big"]) == transfer.inspect_local(images["big"]).id


def test_resume_after_break_skips_registered_chunks(sbx, images):
    """With 1-byte chunks every missing layer is its own load (scaffold images); a break while layer 2 streams
    resumes without resending layer 1 (24 MB), and the scaffolds are removed at the end. (Layer 0, the base, is
    already on the host from the earlier tests or gets sent in the first chunk.)"""
    host = sbx.host_config()
    _wipe(sbx, images["big"])
    streams, killed = [], []

    def on_progress(p):
        # kill the stream carrying layer 2 (12 MB) a third of the way, once
        if not killed and p.layer == 2 and p.layer_bytes > 4_000_000:
            killed.append(streams[-1])
            streams[-1].proc.kill()

    r = transfer.push(images["big"], host, options=PushOptions(transport="openssh", chunk_bytes=1, attempts=3),
                      stream_hook=streams.append, on_progress=on_progress)
    assert r.status == "ok", r.reason
    assert r.attempts == 2 and killed
    sizes = StoreLayerSource.open(transfer.inspect_local(images["big"]))
    # layer 1 once; layer 2 partly, then once; layer 3 once: far less than sending layer 1 twice
    assert r.per_layer.keys() >= {1, 2, 3}
    assert r.layer_bytes == sum(sizes.layer_size(i) for i in r.per_layer)
    assert r.bytes_sent < sizes.layer_size(1) + 2 * sizes.layer_size(2) + 100_000
    left = _docker("image", "ls", "-a", "-q", "--filter", f"label={SCAFFOLD_LABEL}", host=sbx.docker_host)
    assert left.stdout.strip() == ""


def test_stalled_stream_is_detected(sbx, images):
    host = sbx.host_config()
    _wipe(sbx, images["big"])
    streams = []

    def on_progress(p):
        if streams and p.wire > 2_000_000 and not getattr(streams[0], "_stopped", False):
            streams[0]._stopped = True
            os.kill(streams[0].proc.pid, signal.SIGSTOP)  # ssh stops reading: the pipe fills, nothing moves

    r = transfer.push(images["big"], host, options=PushOptions(transport="openssh", attempts=1, stall_s=3),
                      stream_hook=streams.append, on_progress=on_progress)
    assert r.status == "failed" and "no progress for 3s" in r.reason
    assert r.wall_s < 60


def test_every_layer_pushed_but_image_absent_is_an_error(sbx, images):
    host = sbx.host_config()
    _wipe(sbx, images["v1"], images["v2"])
    r = transfer.push(images["v1"], host, options=PushOptions(load_argv=["sh", "-c", "cat >/dev/null"]))
    assert r.status == "failed" and "is not on the host" in r.reason
    assert {1, 2, 3} <= r.per_layer.keys()  # every layer the host lacked went out (the base may be there)


def test_mismatching_image_on_host_is_an_error(sbx, images):
    """The load puts a different image under the tag (here: v2's archive loaded as v1's tag): verification fails."""
    host = sbx.host_config()
    _wipe(sbx, images["v1"], images["v2"])
    v2_save = subprocess.run(["docker", "save", images["v2"]], capture_output=True, check=True).stdout
    # A host-side "load" that ignores our stream and loads v2 re-tagged as v1.
    load = ["sh", "-c", 'cat >/dev/null; docker -H "$1" load -q >/dev/null < "$2" && docker -H "$1" tag "$3" "$4"',
            "x", sbx.docker_host, str(sbx.data_dir / "v2.tar"), images["v2"], images["v1"]]
    (sbx.data_dir / "v2.tar").write_bytes(v2_save)
    os.chmod(sbx.data_dir / "v2.tar", 0o644)
    try:
        r = transfer.push(images["v1"], host, options=PushOptions(load_argv=load))
    finally:
        (sbx.data_dir / "v2.tar").unlink()
    assert r.status == "failed" and "expected" in r.reason and "has id" in r.reason


def test_fan_out_one_bad_host_does_not_stop_others(sbx, sbx2, images, tmp_path):
    _wipe(sbx, images["v1"])
    _wipe(sbx2, images["v1"])
    bad = sbx.host_config(name="nowhere", port=1)  # nothing listens on port 1
    hosts = [sbx.host_config(), bad, sbx2.host_config()]
    res = transfer.push_many(images["v1"], hosts, options=PushOptions(attempts=1))
    assert [r.status for r in res] == ["ok", "failed", "ok"]
    assert "nowhere" in res[1].reason
    assert not res.ok and list(res.failed) == ["nowhere"] and list(res.succeeded) == [hosts[0].name, hosts[2].name]
    img_id = transfer.inspect_local(images["v1"]).id
    assert _host_id(sbx, images["v1"]) == img_id == _host_id(sbx2, images["v1"])


def test_push_cli_table_and_exit_code(sbx, images, tmp_path):
    from typer.testing import CliRunner
    import typer

    inv = tmp_path / "hosts.yaml"
    entry = {
        "hostname": "127.0.0.1", "port": sbx.ssh_port, "user": "e3ops", "identity_file": str(sbx.identity_file),
        "known_hosts": str(sbx.known_hosts), "docker_host": sbx.docker_host, "data_dir": str(sbx.data_dir),
        "state_dir": str(sbx.state_dir), "model_path": "/nonexistent",
        "serving": {"image": "x", "served_model_name": "x", "gpus": "none"},
    }
    inv.write_text(json.dumps({"hosts": {"sbx": entry, "broken": {**entry, "port": 1}}}))
    app = typer.Typer()
    app.command()(push_command)
    _wipe(sbx, images["v2"])
    # the host's deploy lock held by a window: the load would change the host under it, so the push is refused,
    # naming the window's holder, and nothing is sent
    lock = Path(sbx.state_dir) / "lock"
    lock.mkdir()
    (lock / "details.json").write_text(json.dumps({
        "window_id": "20990101T000000Z-extract-abcdef", "holder": "ops@elsewhere", "command": "eagle3ops extract sbx",
        "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}))
    try:
        r = CliRunner().invoke(app, [images["v2"], "sbx", "--inventory", str(inv), "--attempts", "1"])
    finally:
        shutil.rmtree(lock)
    assert r.exit_code == 1 and "ops@elsewhere" in " ".join(r.output.split()), r.output
    assert _host_id(sbx, images["v2"]) == ""
    r = CliRunner().invoke(app, [images["v2"], "sbx", "--inventory", str(inv)])
    assert r.exit_code == 0, r.output
    assert "sbx" in r.output and "ok" in r.output
    assert not lock.exists()  # taken for the load, released after it
    r = CliRunner().invoke(app, [images["v2"], "sbx", "broken", "--inventory", str(inv), "--attempts", "1"])
    assert r.exit_code == 1
    assert "present" in r.output and "failed" in r.output, r.output


def test_corrupt_layer_fails_the_push_and_loads_nothing(sbx, images):
    """Bytes that do not hash to the diff id abort the stream: failed, and the host has no image."""
    _wipe(sbx, images["big"])
    img = transfer.inspect_local(images["big"])

    class Corrupt(StoreLayerSource):
        def _raw_layer(self, i):
            for k, chunk in enumerate(super()._raw_layer(i)):
                yield bytes([chunk[0] ^ 1]) + chunk[1:] if (i == 2 and k == 1) else chunk

    src = Corrupt(img, StoreLayerSource.open(img).root)
    r = transfer.push(img, sbx.host_config(), source=src, options=PushOptions(transport="openssh"))
    assert r.status == "failed" and "layer 2" in r.reason and "expected" in r.reason
    assert r.attempts == 1  # not retried: resending the same bytes cannot help
    assert _host_id(sbx, images["big"]) == ""


def test_fan_out_compresses_each_layer_once(sbx, sbx2, images, monkeypatch):
    _wipe(sbx, images["big"])
    _wipe(sbx2, images["big"])
    img = transfer.inspect_local(images["big"])
    src = StoreLayerSource.open(img)
    enc = Encoders(src)
    spawned = []
    real_spool = compression._Spool

    class CountingSpool(real_spool):
        def __init__(self, *a, **kw):
            spawned.append(a[1])
            super().__init__(*a, **kw)

    monkeypatch.setattr(compression, "_Spool", CountingSpool)
    try:
        from concurrent.futures import ThreadPoolExecutor

        opts = PushOptions(compression="zstd", transport="openssh")
        with ThreadPoolExecutor(2) as ex:
            res = list(ex.map(lambda h: transfer.push(img, h, encoders=enc, options=opts),
                              [sbx.host_config(), sbx2.host_config()]))
    finally:
        enc.close()
    assert [r.status for r in res] == ["ok", "ok"], [r.reason for r in res]
    sent = sorted(set(res[0].per_layer) | set(res[1].per_layer))
    assert sorted(spawned) == sent  # one compression per layer, shared by both hosts
    assert _host_id(sbx, images["big"]) == img.id == _host_id(sbx2, images["big"])


def test_layer_sample_is_spread_over_the_layer(images):
    img = transfer.inspect_local(images["big"])
    store = StoreLayerSource.open(img)
    save = SaveLayerSource(img)
    try:
        full = b"".join(store.iter_layer(1))  # 24 MB of random bytes + tar headers
        n, pieces = 64 * 1024, 8
        piece = n // pieces
        want = b"".join(full[k * (len(full) - piece) // (pieces - 1):][:piece] for k in range(pieces))
        assert store.sample(1, n, pieces) == want == save.sample(1, n, pieces)
    finally:
        save.close()


def test_group_result_by_host():
    res = transfer.PushGroupResult([transfer.PushResult("a", "ok"), transfer.PushResult("b", reason="b: refused"),
                                    transfer.PushResult("c", "present")])
    assert [r.host for r in res] == ["a", "b", "c"]  # a list in the order given
    assert list(res.succeeded) == ["a", "c"] and list(res.failed) == ["b"] and not res.ok
    assert transfer.PushGroupResult([transfer.PushResult("a", "tagged")]).ok


def test_choose_compression_by_measurement():
    sample = b"x" * 1000

    def measure(_s, codec, level, long=False):  # (rate B/s, ratio) as measured on some link/CPU
        return {1: (300e6, 1.8), 3: (80e6, 2.3), 6: (20e6, 2.5)}[level]

    slow = choose_compression(sample, 12e6, True, 10**9, measure=measure)  # 100 Mbit/s link
    assert (slow.codec, slow.level, slow.long) == ("zstd", 3, True) and "12.0 MB/s" in slow.why
    fast = choose_compression(sample, 1e9, True, 10**9, measure=measure)  # link faster than compressors
    assert fast.codec == "none"
    gz = choose_compression(sample, 12e6, False, 10**9, measure=lambda *a: (100e6, 3.0))
    assert gz.codec == "gzip"


def test_wrong_docker_endpoint_is_reported(sbx, images):
    host = sbx.host_config(docker_host="unix:///nonexistent/docker.sock")
    r = transfer.push(images["v1"], host, options=PushOptions(attempts=1))
    assert r.status == "failed" and "does not answer `docker info`" in r.reason and "docker_host" in r.reason
