"""The rented-host lifecycle, pure parts: the weights manifest (parse/render), the cheap re-verification
by size and mtime, the copy plan (same / copy / replace / resume), its estimate, the head digest, the host scripts'
argv. No host; the sandbox test is ``tests/test_weights_transfer.py``."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from eagle3ops.commands import weights as wc
from eagle3ops.commands.types import Change, Read
from eagle3ops.speculate.onhost import head_sha256
from eagle3ops.transfer.weightsplan import (FileEntry, WeightsPlanError, head_digest, parse_hashes, parse_listing,
                                            parse_manifest, plan_copy, refresh, render, render_manifest, stale)

A, B, C = "a" * 64, "b" * 64, "c" * 64


def _m(**files: tuple[int, int, str]) -> dict[str, FileEntry]:
    return {k.replace("__", "/"): FileEntry(k.replace("__", "/"), *v) for k, v in files.items()}


def test_manifest_round_trip_and_refusals():
    m = _m(**{"model-00001.safetensors": (10, 100, A), "config.json": (3, 50, B), "sub__tok.json": (5, 7, C)})
    text = render_manifest(m)
    assert text.splitlines()[0] == wc.MANIFEST_HEADER
    assert [line.split(" ", 3)[3] for line in text.splitlines()[1:]] == ["config.json", "model-00001.safetensors",
                                                                          "sub/tok.json"]
    assert parse_manifest(text, "h:m") == m
    with pytest.raises(WeightsPlanError, match="h:m: not a weights manifest"):
        parse_manifest("x\n", "h:m")
    with pytest.raises(WeightsPlanError, match="h:m: line 2 is not"):
        parse_manifest(wc.MANIFEST_HEADER + "\nzz 1 2 f\n", "h:m")


def test_reverify_by_size_and_mtime_hashes_only_changed_files():
    rec = _m(a=(10, 100, A), b=(20, 200, B), gone=(1, 1, C))
    listing = {"a": (10, 100), "b": (20, 201), "new": (5, 5)}  # b touched, new appeared, gone removed
    assert stale(rec, listing) == ["b", "new"]
    out = refresh(rec, listing, {"b": C, "new": A})
    assert out["a"].sha256 == A and out["b"] == FileEntry("b", 20, 201, C) and "gone" not in out
    with pytest.raises(WeightsPlanError, match="b: changed since"):
        refresh(rec, listing, {"new": A})


def test_listing_and_hash_parsing():
    files, parts = parse_listing("10 100.53 a\n7 5.0 sub/w.safetensors.part\n3 9 sub/x y\n")
    assert files == {"a": (10, 100), "sub/x y": (3, 9)} and parts == {"sub/w.safetensors": 7}
    with pytest.raises(WeightsPlanError, match="unexpected line"):
        parse_listing("ten 1 a\n")
    assert parse_hashes(f"{A} a\n{B} sub/x y\n") == {"a": A, "sub/x y": B}


def test_plan_same_copy_replace_resume_and_estimate():
    src = _m(same=(100, 1, A), missing=(200, 1, B), differs=(300, 1, C), resized=(50, 1, A), partial=(1000, 1, B),
             overfull=(10, 1, C))
    dst_files = {"same": (100, 9), "differs": (300, 9), "resized": (49, 9), "extra.bin": (1, 1)}
    plan = plan_copy("s", "d", "/m", "/n", src, dst_files, {"same": A, "differs": A},
                     {"partial": 400, "overfull": 20}, rate_bps=100.0)
    act = {s.path: (s.action, s.offset, s.send) for s in plan.steps}
    assert act == {"same": ("same", 0, 0), "missing": ("copy", 0, 200), "differs": ("replace", 0, 300),
                   "resized": ("replace", 0, 50), "partial": ("resume", 400, 600), "overfull": ("copy", 0, 10)}
    assert plan.send_bytes == 1160 and plan.estimate_s == pytest.approx(11.6) and plan.extra == ["extra.bin"]
    text = render(plan)
    assert "to send: 1.2 KB (1160 bytes), about 11.6 s at 0 Mbit/s" in text
    slow = plan_copy("s", "d", "/m", "/n", src, dst_files, {"same": A, "differs": A}, {"partial": 400}, 100.0, 0.5)
    assert slow.estimate_s == pytest.approx(11.6 + 5 * 0.5)  # five files move, "same" does not
    assert "resume   partial (600 B; 400 of 1000 bytes there)" in text
    assert not [line for line in text.splitlines() if line.strip().startswith("same")]  # nothing moves: not listed
    assert "kept on d (not in s's manifest): extra.bin" in text


def test_head_digest_equals_the_hosts_digest_of_the_bytes(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 33)
    sums = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()}
    assert head_digest(sums) == head_sha256(tmp_path)


def test_host_scripts_are_typed_argv_and_work_locally(tmp_path: Path):
    """The POSIX scripts run here as they run on a host: record, receive (resume, refusal), read from an offset."""
    assert isinstance(wc.stat_listing("/m"), Read) and isinstance(wc.receive_file("/m", "a", 1, A, 0), Change)
    assert wc.read_from("/m/a", 5).argv[-3:] == ("+6", "--", "/m/a")
    model, dest = tmp_path / "model", tmp_path / "dest"
    (model / "sub").mkdir(parents=True)
    data = bytes(range(256)) * 40
    (model / "sub" / "w.bin").write_bytes(data)
    (model / "config.json").write_text("{}")
    out = tmp_path / "state" / "weights" / "manifest.txt"
    subprocess.run(list(wc.record(str(model), str(out))), check=True)
    m = parse_manifest(out.read_text(), "local")
    assert m["sub/w.bin"].sha256 == hashlib.sha256(data).hexdigest() and m["sub/w.bin"].size == len(data)
    files, _ = parse_listing(subprocess.run(list(wc.stat_listing(str(model))), capture_output=True, text=True).stdout)
    assert files["sub/w.bin"] == (m["sub/w.bin"].size, m["sub/w.bin"].mtime)
    sha = m["sub/w.bin"].sha256
    # a partial file of 1000 bytes: only the rest is sent
    (dest / "sub").mkdir(parents=True)
    (dest / "sub" / "w.bin.part").write_bytes(data[:1000])
    rest = subprocess.run(list(wc.read_from(str(model / "sub" / "w.bin"), 1000)), capture_output=True).stdout
    assert rest == data[1000:]
    cp = subprocess.run(list(wc.receive_file(str(dest), "sub/w.bin", len(data), sha, 1000)), input=rest,
                        capture_output=True)
    assert cp.returncode == 0 and (dest / "sub" / "w.bin").read_bytes() == data
    assert not (dest / "sub" / "w.bin.part").exists()
    # a corrupted byte: refused (exit 5), the partial copy removed, the old file left as it was
    bad = bytearray(data)
    bad[77] ^= 1
    cp = subprocess.run(list(wc.receive_file(str(dest), "config.json", len(bad), sha, 0)), input=bytes(bad),
                        capture_output=True)
    assert cp.returncode == 5 and b"config.json: sha256" in cp.stderr and not (dest / "config.json.part").exists()
    # a stream cut short: exit 3, the partial file kept for the resume
    cp = subprocess.run(list(wc.receive_file(str(dest), "x.bin", len(data), sha, 0)), input=data[:10],
                        capture_output=True)
    assert cp.returncode == 3 and (dest / "x.bin.part").stat().st_size == 10


class _DfHost:
    """A stand-in executor answering ``df -Pk`` for existing folders only (``/n`` is missing, ``/`` holds ``free``
    KiB)."""

    def __init__(self, free_kib: int):
        self.free_kib, self.asked = free_kib, []

    def run(self, argv, check=True):
        from types import SimpleNamespace

        self.asked.append(argv[-1])
        if argv[-1].startswith("/n"):
            return SimpleNamespace(ok=False, stdout="")
        return SimpleNamespace(ok=True, stdout=f"Filesystem 1024-blocks Used Available Capacity Mounted on\n"
                                               f"/dev/x 100 1 {self.free_kib} 1% /\n")


def test_room_on_the_destination_is_checked_before_anything_is_copied():
    from eagle3ops.transfer.weights import WeightsError, check_room

    plan = plan_copy("s", "d", "/m", "/n/model", _m(a=(10_000, 1, A)), {}, {}, {}, 1e6)
    ok = _DfHost(free_kib=100)
    assert check_room(ok, plan) == 102_400 and ok.asked == ["/n/model", "/n", "/"]
    with pytest.raises(WeightsError, match=r"d: / has 9216 bytes free, the copy sends 10000: free space"):
        check_room(_DfHost(free_kib=9), plan)
