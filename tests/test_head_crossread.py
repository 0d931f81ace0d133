"""A head served by another vLLM than the one it was trained with (``eagle3ops.speculate.crossread``): checked as the
serving image's own vLLM reads it, on the readings of the committed 0.16-trained SmolLM2 head by the real 0.16.0 and
0.32.0 images (tests/data/vllm-parser/head-view-*.json, written by scripts/vllm_parser_dumps.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3ops.config import load_inventory
from eagle3ops.speculate.crossread import HEAD_VIEW_SOURCE, check_as_serving_reads
from eagle3ops.speculate.headcheck import HeadMismatch, check_vllm_reading

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "vllm-parser"
HEAD = REPO / "benchmarks/gpu-head-smollm2/heads/smollm2-135m-instruct-eagle3"


def _views() -> tuple[dict, dict]:
    return tuple(json.loads((DATA / f"head-view-{v}.json").read_text()) for v in ("0.16.0", "0.32.0"))  # type: ignore[return-value]


def test_the_016_trained_head_reads_as_trained_under_032_and_a_032_key_is_refused_by_016_by_name() -> None:
    v16, v32 = _views()
    head = json.loads((HEAD / "config.json").read_text())
    for view in (v16, v32):  # both versions' own loaders: aux layers and norm placement as trained
        got = check_vllm_reading(head, view, target_layers=30)
        assert got["eagle_aux_hidden_state_layer_ids"] == [3, 16, 28] and got["norm_before_residual"] is False
    # norm_before_fc (a switch vLLM 0.32 reads and 0.16 does not): served under 0.32, refused by name under 0.16
    with_norm = {**head, "norm_before_fc": True}
    assert check_vllm_reading(with_norm, v32, target_layers=30)["vllm_version"] == "0.32.0"
    with pytest.raises(HeadMismatch, match="vLLM 0.16.0 does not read `norm_before_fc`") as e:
        check_vllm_reading(with_norm, v16, target_layers=30)
    assert e.value.field == "norm_before_fc"


class _Res:
    def __init__(self, stdout: str = "", exited: int = 0):
        self.stdout, self.stderr, self.exited, self.ok = stdout, "", exited, exited == 0


class ImagesStandIn:
    """STAND-IN for a host's Docker engine as the cross-version reader uses it: ``image inspect`` answers the
    image's profile label, ``run`` answers the committed reading of the image's vLLM; records the runs' argv."""

    def __init__(self, label: str | None, view: dict):
        self.host = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
        self.label, self.view, self.runs = label, view, []

    def run(self, argv, *, check=True, timeout=None, stdin=None, **_):
        a = list(argv)
        if "inspect" in a:
            return _Res(json.dumps([{"Config": {"Labels": {"io.eagle3ops.profile": self.label} if self.label
                                                else {}}}]))
        assert "run" in a and timeout and stdin == ""
        self.runs.append(a)
        return _Res(json.dumps(self.view) + "\n")


def test_the_serving_images_vllm_reads_the_head_before_any_restart_unless_its_label_says_same_version() -> None:
    v16, v32 = _views()
    head = json.loads((HEAD / "config.json").read_text())
    info = {"head_config": head, "vllm_view": v16}  # the pipeline image (vLLM 0.16) read it
    # labelled for a 0.16 profile: the same vLLM, nothing run
    same = ImagesStandIn("vllm-0.16.0-serving", v32)
    assert check_as_serving_reads(same, "serving:16", "/data/head", info, 30) == [] and same.runs == []
    # labelled for the 0.32 profile: read there (head mounted read-only, no network), serves as trained
    other = ImagesStandIn("vllm-0.32.0-serving", v32)
    notes = check_as_serving_reads(other, "serving:32", "/data/head", info, 30)
    assert notes == ["the head as the serving image's vLLM 0.32.0 reads it (trained with vLLM 0.16.0): every key "
                     "as trained, so it serves under that version"]
    argv = other.runs[0]
    assert argv[argv.index("-v") + 1] == "/data/head:/head:ro" and argv[argv.index("--network") + 1] == "none"
    assert argv[-1] == HEAD_VIEW_SOURCE and "def vllm_view(head: Path)" in HEAD_VIEW_SOURCE
    # a head trained under 0.32 with a key 0.16 does not read, served by an unlabelled 0.16 image: refused by name
    info32 = {"head_config": {**head, "norm_before_fc": True}, "vllm_view": v32}
    with pytest.raises(HeadMismatch, match="norm_before_fc"):
        check_as_serving_reads(ImagesStandIn(None, v16), "vllm/vllm-openai:v0.16.0", "/data/head", info32, 30)
    # an image whose vLLM cannot read it (none inside): a note, not a refusal
    none = ImagesStandIn(None, {"error": "vLLM not importable here: ModuleNotFoundError"})
    assert check_as_serving_reads(none, "standin", "/h", info, 30) == [
        "the head was not read by the serving image's own vLLM (vLLM not importable here: ModuleNotFoundError)"]
