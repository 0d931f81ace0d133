"""Named sandboxes: the inventory's ``${VAR:-default}`` expansion (several sandboxes side by side on one machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3ops_dev import sandbox
from eagle3ops.config import ConfigError, load_inventory

REPO = Path(__file__).resolve().parents[1]


def test_sandbox_entry_follows_the_environment(monkeypatch):
    default = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    assert default.port == 2222 and default.serving.port == 18000
    assert sandbox.name_of(default.docker_host) == "sandbox"
    monkeypatch.setenv("EAGLE3OPS_SANDBOX", "newcomer-1")
    monkeypatch.setenv("EAGLE3OPS_SANDBOX_SSH_PORT", "2250")
    monkeypatch.setenv("EAGLE3OPS_SANDBOX_SERVING_PORT", "18050")
    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    assert sandbox.name_of(h.docker_host) == "newcomer-1"
    assert h.port == 2250 and h.serving.port == 18050 and "18050" in h.serving.args
    for p in (h.data_dir, h.state_dir, h.model_path, h.serving.volumes[0], str(h.identity_file), str(h.known_hosts)):
        assert "newcomer-1" in p and "/sandbox/" not in p.replace("eagle3ops-sandbox", ""), p


def test_unset_variable_without_default_names_key_and_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("E3_NOT_SET", raising=False)
    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n  h1:\n    hostname: ${E3_NOT_SET}\n    data_dir: /d\n    state_dir: /s\n"
                   "    model_path: /m\n    serving: {image: x, served_model_name: m}\n")
    with pytest.raises(ConfigError, match=r"hosts\.h1\.hostname: environment variable E3_NOT_SET is not set"):
        load_inventory(inv)


def test_a_value_cannot_change_the_document_structure(tmp_path, monkeypatch):
    monkeypatch.setenv("E3_INJECT", "x\n    port: 1")
    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n  h1:\n    hostname: ${E3_INJECT}\n    data_dir: /d\n    state_dir: /s\n"
                   "    model_path: /m\n    serving: {image: x, served_model_name: m}\n")
    h = load_inventory(inv).host("h1")
    assert h.hostname == "x\n    port: 1" and h.port != 1


def test_name_of_refuses_a_non_sandbox_engine():
    with pytest.raises(sandbox.SandboxError, match="not a sandbox engine"):
        sandbox.name_of("unix:///var/run/docker.sock")
