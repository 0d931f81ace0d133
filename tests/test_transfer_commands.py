"""The transfer's command lines are pure data built in ``eagle3ops.commands`` (no host, no engine needed).

Checks the argv of every command a push runs, that hostile inventory values stay single words through the one
quoting step, and that no module of ``eagle3ops.transfer`` writes a command line of its own.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from eagle3ops.commands import docker as dk
from eagle3ops.commands import ssh as sshc
from eagle3ops.commands import transfer as tc
from eagle3ops.config import load_inventory
from eagle3ops.remote import render

REPO = Path(__file__).resolve().parents[1]
EVIL = "x; touch /tmp/eagle3ops-pwned $(id) `id` 'q' \"dq\" \\ *"


@pytest.fixture
def host():
    return load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")


def test_host_side_commands_use_the_inventory_endpoint(host):
    d = ["docker", "-H", host.docker_host]
    assert tc.inventory(host)[:2] == ["sh", "-c"] and tc.inventory(host)[-3:] == d
    assert tc.load(host) == d + ["load"]
    assert tc.load(host, "gzip") == d + ["load"]  # docker load reads gzip itself
    assert tc.load(host, "zstd") == ["sh", "-c", 'zstd -d -q -c | "$@"', "eagle3ops-load", *d, "load"]
    assert tc.load(host, "zstd", ["sh", "-c", "cat >/dev/null"])[-3:] == ["sh", "-c", "cat >/dev/null"]
    assert tc.image_id_and_layers(host, "img:1") == d + ["image", "inspect", "--format",
                                                         "{{.Id}} {{json .RootFS.Layers}}", "img:1"]
    assert dk.tag(host, "sha256:ab", "img:1") == d + ["tag", "sha256:ab", "img:1"]
    assert dk.rmi(host, "sha256:a", "sha256:b") == d + ["image", "rm", "sha256:a", "sha256:b"]
    plain = host.model_copy(update={"docker_host": None})
    assert tc.load(plain) == ["docker", "load"] and tc.inventory(plain)[-1] == "docker"


def test_inventory_script_reads_the_engine_from_its_arguments(tmp_path, host):
    """The script is a constant: the docker command comes in as "$@", so a hostile endpoint is one word."""
    fake = tmp_path / "docker"
    fake.write_text('#!/bin/sh\nprintf "%s|" "$@" >> "$LOG"; echo >> "$LOG"\n'
                    'case "$3" in info) echo "{}";; esac\n')
    fake.chmod(0o755)
    h = host.model_copy(update={"docker_host": EVIL})
    argv = list(tc.inventory(h))  # a Read is frozen: edit a copy
    argv[argv.index("docker")] = str(fake)
    log = tmp_path / "log"
    cp = subprocess.run(["sh", "-c", render(argv)], capture_output=True, text=True, env={"LOG": str(log),
                        "PATH": "/usr/bin:/bin"})
    assert cp.stdout.startswith("{}\n" + tc.INVENTORY_SEPARATOR), cp
    assert log.read_text().splitlines()[0] == f"-H|{EVIL}|info|--format|{{{{json .}}}}|"
    assert not Path("/tmp/eagle3ops-pwned").exists()


def test_build_engine_commands():
    assert tc.local_info() == ["docker", "info", "--format", "{{json .}}"]
    assert tc.local_inspect("unix:///x.sock", "img:1") == ["docker", "-H", "unix:///x.sock", "image", "inspect", "img:1"]
    assert tc.local_save(None, "sha256:ab") == ["docker", "save", "sha256:ab"]
    assert tc.zstd_compress(3, long=True) == ["zstd", "-q", "-c", "-3", "-T0", "--long=27"]
    assert tc.zstd_compress(1, threads=False) == ["zstd", "-q", "-c", "-1"]


def test_openssh_argv_quotes_the_remote_command_once(host):
    h = host.model_copy(update={"port": 2222, "user": "e3ops", "hostname": "gpu-01"})
    argv = sshc.openssh(h, ["echo", EVIL], "/tmp/cfg")
    assert argv[:8] == ["ssh", "-F", "/tmp/cfg", "-p", "2222", "-l", "e3ops", "--"]
    assert argv[8:] == ["gpu-01", render(["echo", EVIL])]
    bare = host.model_copy(update={"port": None, "user": None, "hostname": "a"})
    assert sshc.openssh(bare, ["true"], "c") == ["ssh", "-F", "c", "--", "a", "true"]


def _argv_literals(path: Path) -> list[str]:
    """List displays (argv are lists) in ``path`` whose first element names a program (``docker``, ``ssh``,
    ``sh``, ``zstd``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant) \
                and node.elts[0].value in ("docker", "ssh", "sh", "zstd"):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_transfer_module_builds_a_command_line():
    pkg = REPO / "src/eagle3ops/transfer"
    assert [f for p in sorted(pkg.glob("*.py")) for f in _argv_literals(p)] == []
