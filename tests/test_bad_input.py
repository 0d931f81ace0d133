"""Bad input gets a clear error naming the file (line, byte) or the key the user must change.

- patch files with CRLF, lone CR or mixed line endings are refused by file and line, saying which ending;
- chat data files with bytes that are not UTF-8 are refused by file, line and byte offset, without a traceback;
- inventory values the container engine cannot represent (a ':' in a bind path, a control character in a path or
  an environment value, a container name Docker refuses) are refused when the inventory is loaded (so by
  ``eagle3ops config check``), naming the key the user must change: ``model_path`` when the model path is the
  problem, never the ``stage_*`` keys.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3ops.cli import app
from eagle3ops.config import ConfigError, load_inventory
from eagle3ops.patches.errors import SeriesError
from eagle3ops.patches.series import load_patch
from eagle3ops.stages.chatdata import ChatDataError, load_conversations

from test_patch_helpers import header

DIFF = "--- a/speculators/version.py\n+++ b/speculators/version.py\n@@ -1 +1 @@\n-a\n+b\n"


# ---- patch files with unusual line endings --------------------------------------------------------------------------

def _patch(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "0001-x.patch"
    p.write_bytes(text.encode("utf-8"))
    return p


def test_crlf_patch_is_refused_by_file_and_line(tmp_path: Path) -> None:
    text = (header("0.3.0") + "---\n" + DIFF).replace("\n", "\r\n")
    p = _patch(tmp_path, text)
    with pytest.raises(SeriesError) as e:
        load_patch(p)
    msg = str(e.value)
    assert str(p) in msg and "CRLF" in msg and ":1:" in msg, msg
    assert "dos2unix" in e.value.fix or "LF" in e.value.fix


def test_lone_cr_in_patch_is_refused_by_line(tmp_path: Path) -> None:
    diff = DIFF.replace("+b\n", "+b\rc\n")
    text = header("0.3.0") + "---\n" + diff
    p = _patch(tmp_path, text)
    line = text[: text.index("\r")].count("\n") + 1
    with pytest.raises(SeriesError) as e:
        load_patch(p)
    assert f"{p}:{line}:" in str(e.value) and "lone CR" in str(e.value), str(e.value)


def test_mixed_line_endings_in_patch_are_named(tmp_path: Path) -> None:
    text = header("0.3.0") + "---\n" + DIFF.replace("-a\n", "-a\r\n")
    p = _patch(tmp_path, text)
    line = text[: text.index("\r")].count("\n") + 1
    with pytest.raises(SeriesError) as e:
        load_patch(p)
    msg = str(e.value)
    assert "mixed" in msg and f"{p}:{line}:" in msg and "CRLF" in msg, msg


# ---- chat data with bytes that are not UTF-8 -------------------------------------------------------------------------

def test_undecodable_bytes_in_chat_file_name_file_line_and_byte(tmp_path: Path) -> None:
    good = b'{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}\n'
    bad = b'{"conversations": [{"from": "human", "value": "caf\xe9"}, {"from": "gpt", "value": "ok"}]}\n'
    p = tmp_path / "chat.jsonl"
    p.write_bytes(good + good + bad)
    with pytest.raises(ChatDataError) as e:
        load_conversations([p])
    msg = str(e.value)
    col = bad.index(b"\xe9")
    assert f"{p}:3:" in msg and f"byte {col}" in msg and f"file offset {2 * len(good) + col}" in msg, msg
    assert "0xe9" in msg and "UTF-8" in msg, msg


def test_undecodable_chat_file_gives_no_traceback_from_the_stage_cli(tmp_path: Path) -> None:
    """The stage CLI turns it into one error line (exit 2), not a Python traceback."""
    import subprocess
    import sys

    run = tmp_path / "run"
    run.mkdir()
    (run / "data.jsonl").write_bytes(b'{"conversations": [{"from": "human", "value": "\xff"}]}\n')
    (run / "pipeline.yaml").write_text("target_model: /model\nprepare:\n  datasets: [data.jsonl]\n")
    out = subprocess.run([sys.executable, "-m", "eagle3ops", "stage", "prepare", "--run-dir", str(run)],
                         capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stderr, out.stderr
    assert "data.jsonl:1:" in out.stderr and "not UTF-8" in out.stderr, out.stderr


# ---- inventory values the container engine cannot represent ------------------------------------------------------------

BASE = """
hosts:
  h1:
    hostname: gpu-01
    data_dir: /data
    state_dir: /var/lib/e3
    model_path: /models/m
    serving:
      image: vllm/vllm-openai:v0.16.0
      served_model_name: m
"""


def _inv(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "hosts.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("old,new,key", [
    ("model_path: /models/m", "model_path: /models/m:v2", "hosts.h1.model_path"),
    ("model_path: /models/m", 'model_path: "/models/m\\nx"', "hosts.h1.model_path"),
    ("data_dir: /data", "data_dir: /data:x", "hosts.h1.data_dir"),
    ("state_dir: /var/lib/e3", "state_dir: /var/lib/e3:1", "hosts.h1.state_dir"),
    ("served_model_name: m", "served_model_name: m\n      container: 'my serving'", "hosts.h1.serving.container"),
    ("served_model_name: m", "served_model_name: m\n      container: x", "hosts.h1.serving.container"),
    ("served_model_name: m", "served_model_name: m\n      volumes: ['/a:b:/c']", "hosts.h1.serving.volumes.0"),
    ("served_model_name: m", 'served_model_name: m\n      env: {A: "x\\ny"}', "hosts.h1.serving.env.A"),
    ("served_model_name: m", 'served_model_name: m\n      env: {"A=B": "x"}', "hosts.h1.serving.env.A=B"),
    ("served_model_name: m", 'served_model_name: m\n      api_key_file: "/k:ey"', "hosts.h1.serving.api_key_file"),
    ("model_path: /models/m", 'model_path: /models/m\n    stage_env: {NCCL: "a\\u0000b"}', "hosts.h1.stage_env.NCCL"),
])
def test_inventory_values_the_engine_cannot_represent_name_the_key(tmp_path: Path, old: str, new: str,
                                                                     key: str) -> None:
    p = _inv(tmp_path, BASE.replace(old, new))
    with pytest.raises(ConfigError) as e:
        load_inventory(p)
    msg = str(e.value)
    assert f"`{key}`" in msg, msg
    assert "stage_" not in msg or key.startswith("hosts.h1.stage_"), msg


def test_config_check_names_model_path_for_a_colon_in_it(tmp_path: Path) -> None:
    p = _inv(tmp_path, BASE.replace("model_path: /models/m", "model_path: /models/llama:8b"))
    res = CliRunner().invoke(app, ["config", "check", "--inventory", str(p)])
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert "hosts.h1.model_path" in out and "':'" in out and "stage_" not in out, res.output


def test_plain_values_still_load(tmp_path: Path) -> None:
    text = BASE.replace("served_model_name: m", "served_model_name: m\n      container: vllm_serving.1\n"
                        "      volumes: ['/models:/models:ro']\n      env: {HF_HOME: /data/hf, A: 'x,y:z'}")
    inv = load_inventory(_inv(tmp_path, text))
    assert inv.host("h1").serving.container == "vllm_serving.1"
