"""Image transfer into a containerd-store engine (Docker 26.1 + containerd 1.7, the store Docker 29 uses by default).

The build engine here is Docker 20.10 (classic store); the host is the sandbox ``pytest-ctrd2`` (port 2235), never
the demo's ``sandbox`` nor the classic transfer tests' ``pytest-push``/``pytest-push2``. On this store an image id is
its manifest's digest; the push sends an OCI layout without the layers the host holds (containerd refuses a
``docker save`` tar with layer tars left out: checked here too) and verifies the manifest digest it generated.
Images are small (a few files imported as the base, then COPY layers of random bytes): the module runs in well
under a minute.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
import uuid

import pytest

from eagle3ops import transfer
from eagle3ops_dev import sandbox
from eagle3ops.transfer import PushOptions
from eagle3ops.transfer.archive import SCAFFOLD_LABEL, ArchivePart, archive_chunks, oci_ref_name
from eagle3ops.transfer.errors import TransferError
from eagle3ops.transfer.sources import StoreLayerSource, open_source

pytestmark = pytest.mark.sandbox
#: This module brings up a sandbox of its own (pytest-ctrd2): its tests run in the host suite's "rest" part
#: (tests/conftest.py), the module whole in one process.
OWN_SANDBOX = "pytest-ctrd2"

NAME, PORT = "pytest-ctrd2", 2235


def _docker(*args: str, host: str | None = None, check: bool = True, **kw) -> subprocess.CompletedProcess:
    argv = ["docker"] + (["-H", host] if host else []) + list(args)
    return subprocess.run(argv, capture_output=True, check=check, timeout=300, **kw)


@pytest.fixture(scope="module")
def ctrd():
    info = sandbox.up(NAME, PORT, engine="containerd")
    yield info
    _wipe(info)
    sandbox.down(NAME)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Two versions of a 4-layer image differing only in the top layer, and a 4-layer image with bigger layers.

    Returns dict: v1, v2, big (tags on the build engine).
    """
    d = tmp_path_factory.mktemp("img")
    tag = uuid.uuid4().hex[:8]
    (d / "root" / "etc").mkdir(parents=True)
    (d / "root" / "etc" / "base").write_text(f"base {tag}\n")
    base = f"e3ops-test/ctrd-base:{tag}"
    tar = subprocess.run(["tar", "-C", str(d / "root"), "-c", "."], capture_output=True, check=True).stdout
    _docker("import", "-", base, input=tar)
    (d / "a.bin").write_bytes(os.urandom(1_500_000))
    (d / "b.bin").write_bytes(os.urandom(1_000_000))
    (d / "big.bin").write_bytes(os.urandom(8_000_000))
    (d / "big2.bin").write_bytes(os.urandom(6_000_000))
    tags = {}
    for version in ("v1", "v2"):
        (d / "c.txt").write_text(f"patch {version}\n")
        (d / "Dockerfile").write_text(f"FROM {base}\nCOPY a.bin /a.bin\nCOPY b.bin /b.bin\nCOPY c.txt /c.txt\n")
        tags[version] = f"e3ops-test/ctrd-app:{tag}-{version}"
        _docker("build", "-q", "-t", tags[version], str(d))
    (d / "Dockerfile").write_text(f"FROM {base}\nCOPY big.bin /big.bin\nCOPY big2.bin /big2.bin\nCOPY c.txt /c.txt\n")
    tags["big"] = f"e3ops-test/ctrd-big:{tag}"
    _docker("build", "-q", "-t", tags["big"], str(d))
    yield tags
    _docker("image", "rm", *tags.values(), base, check=False)


def _host_id(info, ref: str) -> str:
    return _docker("image", "inspect", "--format", "{{.Id}}", ref, host=info.docker_host, check=False,
                   text=True).stdout.strip()


def _listed(info) -> set[str]:
    return set(_docker("image", "ls", "-a", "-q", "--no-trunc", host=info.docker_host, text=True).stdout.split())


def _wipe(info) -> None:
    """Remove from the sandbox engine what this module may have left: its ``e3ops-test/...`` tags (by name) and
    untagged images that no other tag names. Other images (the serving base of tests/test_window_containerd.py)
    stay even when a test tag names the same image."""
    out = _docker("image", "ls", "-a", "--no-trunc", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}",
                  host=info.docker_host, text=True).stdout
    rows = [ln.split() for ln in out.splitlines() if ln.strip()]
    ours = [ref for _, ref in rows if ref.startswith("e3ops-test/")]
    kept = {i for i, ref in rows if not ref.startswith("e3ops-test/") and ref != "<none>:<none>"}
    if ours:
        _docker("image", "rm", *ours, host=info.docker_host, check=False)
    dangling = sorted({i for i, ref in rows if ref == "<none>:<none>" or ref.startswith("e3ops-test/")} - kept)
    if dangling:
        _docker("image", "rm", "-f", *dangling, host=info.docker_host, check=False)
    left = _docker("image", "ls", "-a", "--format", "{{.Repository}}", host=info.docker_host, text=True).stdout
    assert not any(r.startswith("e3ops-test/") or r == "<none>" for r in left.split())


def test_oci_ref_name_normalises_like_docker():
    assert oci_ref_name("ubuntu:22.04") == "docker.io/library/ubuntu:22.04"
    assert oci_ref_name("eagle3ops/pipeline:1") == "docker.io/eagle3ops/pipeline:1"
    assert oci_ref_name("reg.example:5000/a/b:1") == "reg.example:5000/a/b:1"
    assert oci_ref_name("localhost/app:1") == "localhost/app:1"


def test_thin_push_then_patch_only_update(ctrd, images):
    _wipe(ctrd)
    host = ctrd.host_config()
    v1 = transfer.inspect_local(images["v1"])
    r1 = transfer.push(v1, host)
    assert r1.status == "ok", r1.reason
    assert (r1.store, r1.mode, r1.layers_sent, r1.id_kind) == ("containerd", "thin", 4, "manifest digest")
    # The image id there is the manifest digest, not the build engine's (config) id, and verification compared it.
    assert r1.host_id != v1.id and _host_id(ctrd, images["v1"]) == r1.host_id and r1.host_id in _listed(ctrd)
    # v2 differs only in the top layer: only that layer goes over SSH.
    v2 = transfer.inspect_local(images["v2"])
    r2 = transfer.push(v2, host)
    assert r2.status == "ok", r2.reason
    assert r2.mode == "thin" and r2.layers_sent == 1 and r2.per_layer.keys() == {3}
    top = StoreLayerSource.open(v2).layer_size(3)
    assert r2.layer_bytes == top
    # the top layer + config + manifest + index.json + oci-layout + tar headers (measured 8.5 KiB of metadata)
    assert r2.bytes_sent < top + 12_288
    assert r2.bytes_sent < r1.bytes_sent / 100
    assert _host_id(ctrd, images["v2"]) == r2.host_id and r2.host_id in _listed(ctrd)  # content complete
    # The loaded image runs: a container made from it holds v2's patch file.
    cid = _docker("create", "--network", "host", images["v2"], "x", host=ctrd.docker_host,
                  text=True).stdout.strip()
    try:
        data = _docker("cp", f"{cid}:/c.txt", "-", host=ctrd.docker_host).stdout
        assert b"patch v2" in data
    finally:
        _docker("rm", cid, host=ctrd.docker_host, check=False)
    # Again: already present (by manifest digest), nothing sent; a new tag of it is only tagged.
    r3 = transfer.push(v2, host)
    assert r3.status == "present" and r3.bytes_sent == 0
    _docker("tag", images["v2"], images["v2"] + "-other")
    try:
        r4 = transfer.push(images["v2"] + "-other", host)
        assert r4.status == "tagged" and r4.bytes_sent == 0 and _host_id(ctrd, images["v2"] + "-other") == r2.host_id
    finally:
        _docker("image", "rm", images["v2"] + "-other", check=False)


def test_host_id_equals_plain_docker_save_load(ctrd, images):
    """The manifest a push generates is the one containerd's importer writes for `docker save`: same image id."""
    _wipe(ctrd)
    save = subprocess.Popen(["docker", "save", images["v1"]], stdout=subprocess.PIPE)
    _docker("load", "-q", host=ctrd.docker_host, stdin=save.stdout)
    save.wait(timeout=60)
    r = transfer.push(images["v1"], ctrd.host_config())
    assert r.status == "present" and r.host_id == _host_id(ctrd, images["v1"]), r.reason


def test_docker_save_tar_without_held_layers_is_refused_there(ctrd, images, tmp_path):
    """Why the containerd store gets an OCI layout: its importer refuses the classic store's thin archive."""
    _wipe(ctrd)
    assert transfer.push(images["v1"], ctrd.host_config()).status == "ok"
    v2 = transfer.inspect_local(images["v2"])
    src = StoreLayerSource.open(v2)
    thin = ArchivePart(src.config_bytes(), 4, (3,), v2.repo_tags)  # docker-save format, layers 0-2 left out
    (tmp_path / "thin.tar").write_bytes(b"".join(c for c, _ in archive_chunks(src, thin)))
    cp = _docker("load", "-i", str(tmp_path / "thin.tar"), host=ctrd.docker_host, check=False, text=True)
    assert cp.returncode != 0 and "failed to resolve layers" in cp.stderr, cp


def _load_gzip_oci(info, image: transfer.LocalImage, tag: str, tmp_path) -> None:
    """Load ``image`` as a registry pull leaves it: gzip-compressed layer blobs (digests differ from diff ids)."""
    src = StoreLayerSource.open(image)
    cfg = src.config_bytes()
    blobs = [gzip.compress(b"".join(src.iter_layer(i)), mtime=0) for i in range(len(image.diff_ids))]
    sha = lambda b: "sha256:" + hashlib.sha256(b).hexdigest()  # noqa: E731
    man = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                      "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": sha(cfg),
                                 "size": len(cfg)},
                      "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "digest": sha(b),
                                  "size": len(b)} for b in blobs]}).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json", "digest": sha(man), "size": len(man),
        "annotations": {"io.containerd.image.name": oci_ref_name(tag)}}]}).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), (f"blobs/sha256/{sha(cfg)[7:]}", cfg),
                           *((f"blobs/sha256/{sha(b)[7:]}", b) for b in blobs),
                           (f"blobs/sha256/{sha(man)[7:]}", man), ("index.json", index)]:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    (tmp_path / "gz.tar").write_bytes(buf.getvalue())
    _docker("load", "-i", str(tmp_path / "gz.tar"), host=info.docker_host)


def test_layers_held_under_other_blob_digests_are_filled(ctrd, images, tmp_path):
    """The host got v1 from a 'registry' (gzip blobs): v2's thin load runs but is incomplete content, so the push
    sends the left-out blobs too, and the image is listed (docker image ls, docker save work) afterwards."""
    _wipe(ctrd)
    v1, v2 = transfer.inspect_local(images["v1"]), transfer.inspect_local(images["v2"])
    _load_gzip_oci(ctrd, v1, images["v1"] + "-gz", tmp_path)
    r = transfer.push(v2, ctrd.host_config())
    assert r.status == "ok", r.reason
    assert r.mode == "thin+fill" and sorted(r.per_layer) == [0, 1, 2, 3] and r.layers_sent == 4
    assert r.host_id in _listed(ctrd) and _host_id(ctrd, images["v2"]) == r.host_id


def test_resume_after_break_skips_registered_chunks(ctrd, images):
    """1-byte chunks: every missing layer is its own load (an OCI scaffold image); a break while layer 2 streams
    resumes without resending layer 1, and the scaffolds are removed at the end."""
    _wipe(ctrd)
    host = ctrd.host_config()
    streams, killed = [], []

    def on_progress(p):
        if not killed and p.layer == 2 and p.layer_bytes > 2_000_000:
            killed.append(streams[-1])
            streams[-1].proc.kill()

    r = transfer.push(images["big"], host, options=PushOptions(transport="openssh", chunk_bytes=1, attempts=3),
                      stream_hook=streams.append, on_progress=on_progress)
    assert r.status == "ok", r.reason
    assert r.attempts == 2 and killed and r.store == "containerd"
    sizes = StoreLayerSource.open(transfer.inspect_local(images["big"]))
    assert r.per_layer.keys() == {0, 1, 2, 3}
    # layer 1 (8 MB) once; layer 2 partly, then once; layer 3 once
    assert r.bytes_sent < sizes.layer_size(0) + sizes.layer_size(1) + 2 * sizes.layer_size(2) + 100_000
    assert _host_id(ctrd, images["big"]) == r.host_id and r.host_id in _listed(ctrd)
    left = _docker("image", "ls", "-a", "-q", "--filter", f"label={SCAFFOLD_LABEL}", host=ctrd.docker_host, text=True)
    assert left.stdout.strip() == ""


def test_every_layer_pushed_but_image_absent_is_an_error(ctrd, images):
    _wipe(ctrd)
    r = transfer.push(images["v1"], ctrd.host_config(), options=PushOptions(load_argv=["sh", "-c", "cat >/dev/null"]))
    assert r.status == "failed" and "is not on the host" in r.reason


def test_mismatching_image_on_host_is_refused(ctrd, images, tmp_path):
    """A load that puts another image under the tag (v2's archive loaded as v1's tag): verify names both ids."""
    _wipe(ctrd)
    (ctrd.data_dir / "v2.tar").write_bytes(_docker("save", images["v2"]).stdout)
    os.chmod(ctrd.data_dir / "v2.tar", 0o644)
    load = ["sh", "-c", 'cat >/dev/null; docker -H "$1" load -q >/dev/null < "$2" && docker -H "$1" tag "$3" "$4"',
            "x", ctrd.docker_host, str(ctrd.data_dir / "v2.tar"), images["v2"], images["v1"]]
    try:
        r = transfer.push(images["v1"], ctrd.host_config(), options=PushOptions(load_argv=load))
    finally:
        (ctrd.data_dir / "v2.tar").unlink()
    assert r.status == "failed" and "has id" in r.reason and "manifest digest" in r.reason, r.reason


def test_containerd_store_build_engine_is_refused_by_name(ctrd, images):
    """As the *build* engine the containerd store is not supported yet: said at once, with the fix."""
    img = transfer.inspect_local(images["v1"])
    with pytest.raises(TransferError, match="build engine .* containerd image store.*classic store"):
        open_source(img, docker_host=ctrd.docker_host)
