"""``image ls HOST`` asks the engine the inventory names: pure, no host or engine needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3ops import image_cli, images, remote
from eagle3ops.commands import docker as dk
from eagle3ops.commands.types import Read
from eagle3ops.config import load_inventory

ENDPOINT = "unix:///run/user/1000/docker.sock"
IMAGE = {"Id": "sha256:" + "a" * 64, "RepoTags": ["pipeline:1"], "Size": 1000,
         "Config": {"Labels": {"io.eagle3ops.profile": "p1", "io.eagle3ops.patches": "{}"}}}


@pytest.fixture
def inventory(tmp_path) -> Path:
    inv = tmp_path / "hosts.yaml"
    inv.write_text(f"""hosts:
  gpu-01:
    hostname: gpu-01.invalid
    docker_host: {ENDPOINT}
    data_dir: /srv/e3/data
    state_dir: /srv/e3/state
    model_path: /srv/e3/models/m
    serving:
      image: vllm/vllm-openai:v0.16.0
      served_model_name: m
""")
    return inv


def _answer(argv: list[str]) -> str:
    """What an engine holding :data:`IMAGE` prints for the two listing commands."""
    return IMAGE["Id"] + "\n" if "ls" in argv else json.dumps([IMAGE])


def test_listing_argv_address_the_hosts_engine(inventory):
    h = load_inventory(inventory).host("gpu-01")
    assert dk.image_ids(h) == ["docker", "-H", ENDPOINT, "image", "ls", "-q", "--no-trunc"]
    assert dk.inspect_images(h, ["sha256:a"]) == ["docker", "-H", ENDPOINT, "image", "inspect", "sha256:a"]
    assert dk.image_ids(None) == ["docker", "image", "ls", "-q", "--no-trunc"]  # the local client's default
    assert dk.image_ids(h.model_copy(update={"docker_host": None})) == dk.image_ids(None)


def test_list_images_with_host_uses_its_endpoint(inventory):
    h = load_inventory(inventory).host("gpu-01")
    calls: list[list[str]] = []
    rows = images.list_images(lambda argv: calls.append(argv) or _answer(argv), host=h)
    assert [c[:3] for c in calls] == [["docker", "-H", ENDPOINT]] * 2, calls
    assert [r.tags for r in rows] == [["pipeline:1"]] and rows[0].profile == "p1"


def test_image_ls_host_asks_the_inventorys_engine(inventory, monkeypatch):
    calls: list[list[str]] = []

    class FakeRemote:
        def __init__(self, host, **_kw):
            self.host = host

        def run(self, argv, **kw):
            assert isinstance(argv, Read) and "mutates" not in kw  # the builder's type says it only reads
            calls.append(list(argv))
            return remote.Result(list(argv), 0, _answer(argv))

        def close(self):
            pass

    monkeypatch.setattr(remote, "Remote", FakeRemote)
    res = CliRunner().invoke(image_cli.app, ["ls", "gpu-01", "--inventory", str(inventory), "--json"])
    assert res.exit_code == 0, res.output
    assert calls and all(c[:3] == ["docker", "-H", ENDPOINT] for c in calls), calls
    assert json.loads(res.output)[0]["tags"] == ["pipeline:1"]


def test_image_ls_unknown_host_is_one_error_line(inventory):
    res = CliRunner().invoke(image_cli.app, ["ls", "nope", "--inventory", str(inventory)])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert "nope" in res.output and "Traceback" not in res.output
