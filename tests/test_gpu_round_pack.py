"""A packed GPU round's last step here (``benchmarks/gpu-head-smollm2/gpu_head_smollm2.py finish-round``, run as
``make gpu-round-finish`` runs it): a head file that came back from the device with other bytes than the device wrote
is refused before anything is copied, naming the file; the same folder with the right bytes is taken, every file
checked again after the copy and the figures JSON written. The round's pack and the device folders are small
stand-ins written here (a manifest with the keys ``finish-round`` reads, a one-tensor "head"), not a trained head:
the GPU steps themselves are exercised by the script's ``E3S_SMOKE=1`` mode (benchmarks/gpu-head-smollm2/README.md).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks/gpu-head-smollm2/gpu_head_smollm2.py"


def _stand_in_round(tmp: Path) -> tuple[Path, Path, Path]:
    """(pack folder, device folder of the KL head's call, device folder of the LK head's call)."""
    pack = tmp / "pack"
    (pack / "script").mkdir(parents=True)
    (pack / "script/pack.json").write_text(json.dumps({
        "round": "r9", "tags": ["r9kl", "r9lk"], "made_at": "2026-12-07T00:00:00Z", "commit": "0" * 40,
        "src_uncommitted_changes": None, "inputs": {}, "recipe": {}, "tree_bytes": 1, "call_sizes": [],
        "calls": [{}] * 6}))
    dirs = []
    for tag in ("r9kl", "r9lk"):
        call = tmp / f"files_at_{tag}"
        head = call / tag / "head"
        head.mkdir(parents=True)
        (head / "model.safetensors").write_bytes(b"stand-in weights of " + tag.encode())
        files = {f.name: {"bytes": f.stat().st_size, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
                 for f in head.iterdir()}
        (head / "provenance.json").write_text(json.dumps({"files": files, "bytes_total": 1}))
        (call / tag / f"gpu-head-smollm2-h200-{tag}.json").write_text(json.dumps({
            "generation": {"device": "NVIDIA H100 80GB HBM3"}, "train": {"epochs": 1.0},
            "offline_acceptance": {"acceptance_length": 2.0, "per_position": {"0": 0.5}},
            "head": {"provenance": {"files": {k: v["sha256"] for k, v in files.items()}}, "split": {}}}))
        (call / "step-5.json").write_text(json.dumps({"step": 5, "wall_s": 12.5}))
        dirs.append(call)
    return pack, dirs[0], dirs[1]


def _finish(pack: Path, out: Path, *dirs: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "finish-round", *map(str, dirs), "--pack", str(pack),
                           "--dest-dir", str(out / "figures"), "--heads-dir", str(out / "heads")],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


def test_finish_round_refuses_a_head_file_whose_sha256_differs_then_takes_the_right_one(tmp_path):
    pack, kl, lk = _stand_in_round(tmp_path)
    weights = kl / "r9kl/head/model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[:-1] + b"X")  # same size, one byte changed on the way back

    bad = _finish(pack, tmp_path, kl, lk)
    assert bad.returncode != 0
    assert f"{weights}: sha256 {hashlib.sha256(weights.read_bytes()).hexdigest()}" in bad.stderr
    assert "nothing was copied" in bad.stderr
    assert not (tmp_path / "heads").exists()

    weights.write_bytes(good)
    ok = _finish(pack, tmp_path, kl, lk)
    assert ok.returncode == 0, ok.stderr[-2000:]
    for tag in ("r9kl", "r9lk"):
        fig = json.loads((tmp_path / f"figures/gpu-head-smollm2-h100-{tag}.json").read_text())
        assert fig["pack"]["round"] == "r9" and fig["device_seconds"]["steps_wall_s"] == {"5": 12.5}
        prov = json.loads((tmp_path / f"heads/smollm2-{tag}/provenance.json").read_text())
        assert prov["checked_here"].startswith("every file's bytes and sha256 matched")
        assert (tmp_path / f"heads/smollm2-{tag}/model.safetensors").read_bytes() == (
            (kl if tag == "r9kl" else lk) / tag / "head/model.safetensors").read_bytes()
