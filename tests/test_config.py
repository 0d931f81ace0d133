"""Inventory validation: the checked-in file loads; bad input names file, key and fix."""

from pathlib import Path

import pytest

from eagle3ops.config import ConfigError, load_inventory
from eagle3ops.config.docs import docs

REPO = Path(__file__).resolve().parents[1]


def test_checked_in_inventory_loads_and_resolves_paths():
    inv = load_inventory(REPO / "deploy/hosts.yaml")
    h = inv.host("sandbox")
    assert h.port == 2222 and h.user == "e3ops"
    assert h.identity_file == REPO / ".sandbox/sandbox/id_ed25519"
    assert h.serving.served_model_name == "tiny-llama"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "hosts.yaml"
    p.write_text(text)
    return p


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


def test_unknown_key_is_named_with_fix(tmp_path):
    p = _write(tmp_path, BASE + "    gpuz: 8\n")
    with pytest.raises(ConfigError) as e:
        load_inventory(p)
    msg = str(e.value)
    assert str(p) in msg and "hosts.h1.gpuz" in msg and "spelling" in msg


def test_wrong_type_and_relative_path(tmp_path):
    p = _write(tmp_path, BASE.replace("data_dir: /data", "data_dir: data") + "    gpus: many\n")
    with pytest.raises(ConfigError) as e:
        load_inventory(p)
    msg = str(e.value)
    assert "hosts.h1.data_dir" in msg and "absolute" in msg
    assert "hosts.h1.gpus" in msg


def test_missing_required_key(tmp_path):
    p = _write(tmp_path, BASE.replace("      served_model_name: m\n", ""))
    with pytest.raises(ConfigError, match=r"hosts\.h1\.serving\b.*served_model_name.*add it"):
        load_inventory(p)


def test_unknown_host_lists_known(tmp_path):
    inv = load_inventory(_write(tmp_path, BASE))
    with pytest.raises(ConfigError, match="Known hosts: h1"):
        inv.host("nope")


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_inventory(tmp_path / "none.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_inventory(_write(tmp_path, "hosts: [unclosed"))


def test_docs_cover_every_key():
    text = docs()
    for key in ("hostname", "docker_host", "stage_env", "maintenance_budget_s", "health_timeout_s", "served_model_name"):
        assert f"`{key}`" in text


def test_compose_serving_needs_project_and_service(tmp_path):
    p = _write(tmp_path, BASE + "      kind: compose\n      compose_project: prod\n")
    with pytest.raises(ConfigError) as e:
        load_inventory(p)
    assert "hosts.h1.serving" in str(e.value) and "compose_service" in str(e.value)
    ok = load_inventory(_write(tmp_path, BASE + "      kind: compose\n      compose_project: prod\n"
                                                "      compose_service: vllm\n")).host("h1")
    assert (ok.serving.kind, ok.serving.compose_project, ok.serving.compose_service) == ("compose", "prod", "vllm")


def test_compose_keys_with_container_kind_and_systemd_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="kind: compose"):
        load_inventory(_write(tmp_path, BASE + "      compose_service: vllm\n"))
    # systemd is a kind now: it needs the unit it manages, named in the error
    with pytest.raises(ConfigError, match=r"hosts\.h1\.serving.*kind `systemd` needs `unit`"):
        load_inventory(_write(tmp_path, BASE + "      kind: systemd\n"))


def test_host_written_twice_is_refused_naming_file_line_and_key(tmp_path):
    """The same host twice in an inventory: YAML would keep the last entry silently; it is an error naming the
    file, the line of the second entry and the key (also through `eagle3ops config check`)."""
    second = BASE.replace("gpu-01", "gpu-02").replace("hosts:\n", "")
    p = _write(tmp_path, BASE + second)
    line = (BASE + second).splitlines().index("  h1:", 3) + 1
    with pytest.raises(ConfigError) as e:
        load_inventory(p)
    msg = str(e.value)
    assert f"{p}:{line}:3: duplicate key 'h1'" in msg and "first given at line 3" in msg and "remove or rename" in msg

    from typer.testing import CliRunner

    from eagle3ops.cli import app

    r = CliRunner().invoke(app, ["config", "check", "--inventory", str(p)])
    assert r.exit_code != 0 and "duplicate key 'h1'" in r.output


def test_duplicate_setting_inside_a_host_is_refused(tmp_path):
    p = _write(tmp_path, BASE + "    data_dir: /data2\n")
    with pytest.raises(ConfigError, match=r"hosts\.yaml:11:5: duplicate key 'data_dir' \(first given at line 5"):
        load_inventory(p)


def test_serving_cpuset_is_checked_naming_the_key_and_fix(tmp_path):
    ok = load_inventory(_write(tmp_path, BASE + "      cpuset_cpus: 1\n")).host("h1")
    assert ok.serving.cpuset_cpus == "1"  # YAML's number is the one CPU it names
    ok = load_inventory(_write(tmp_path, BASE + "      cpuset_cpus: 0-3,6\n      env: {VLLM_CPU_OMP_THREADS_BIND: "
                                                "'0-3'}\n")).host("h1")
    assert ok.serving.cpuset_cpus == "0-3,6"
    for bad, says in (("'0 - 3'", r"hosts\.h1\.serving\.cpuset_cpus.*'0 - 3' is not a CPU id.*e\.g\. `0-3`"),
                      ("3-1", r"hosts\.h1\.serving\.cpuset_cpus.*'3-1' is not a CPU id or an ascending range")):
        with pytest.raises(ConfigError, match=says):
            load_inventory(_write(tmp_path, BASE + f"      cpuset_cpus: {bad}\n"))
    # vLLM's explicit OpenMP binding (per rank, `|`) must name CPUs the container may use
    with pytest.raises(ConfigError, match=r"VLLM_CPU_OMP_THREADS_BIND` '0-1\|2-3' binds vLLM's threads to CPUs 2,3, "
                                          r"outside `cpuset_cpus` '0-1'.*`auto`, binds to the container's CPUs"):
        load_inventory(_write(tmp_path, BASE + "      cpuset_cpus: 0-1\n      env: {VLLM_CPU_OMP_THREADS_BIND: "
                                               "'0-1|2-3'}\n"))
    with pytest.raises(ConfigError, match=r"`cpuset_cpus` pins a serving container.*not kind `systemd`.*CPUAffinity="):
        load_inventory(_write(tmp_path, BASE + "      kind: systemd\n      unit: vllm.service\n      cpuset_cpus: 1\n"))
