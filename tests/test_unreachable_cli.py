"""A host that cannot be reached, driven through the real command line in a subprocess:
every command fails once, within the inventory's connect bound, with ONE line on stderr naming the host and the
cause, no traceback, exit status 1; a host-changing command leaves an entry in the local audit log. Three ways to be dead: a port that accepts TCP and never speaks SSH (a thread
that accepts and sleeps), a closed port, a name that does not resolve (``.invalid``, RFC 6761).

Also: hints that print a command quote its arguments (a host alias pasted back into a shell runs nothing).

No sandbox needed; nothing here contacts a real host.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path

import paramiko
import pytest

from test_unreachable import silent_listener

REPO = Path(__file__).resolve().parents[1]
CONNECT_S = 2
#: Process start (imports) on a loaded 2-core machine plus the connect bound: the most one command may take.
BOUND_S = CONNECT_S + 12
#: A small image on the build engine for `push` (it is never read: the host is never reached).
PUSH_IMAGE = "eagle3ops/debian-minbase:bookworm"


@pytest.fixture(scope="module")
def silent_port():
    """Port of a listener on 127.0.0.1 that accepts connections and never sends a byte."""
    with silent_listener(64) as (port, _):
        yield port


@pytest.fixture(scope="module")
def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _inventory(dir_: Path, hostname: str, port: int) -> Path:
    (dir_ / "known_hosts").write_text("")
    inv = dir_ / "hosts.yaml"
    inv.write_text(f"""hosts:
  deadhost:
    hostname: {hostname}
    port: {port}
    user: nobody
    known_hosts: known_hosts
    connect_timeout_s: {CONNECT_S}
    data_dir: /srv/e3/data
    state_dir: /srv/e3/state
    model_path: /srv/e3/models/m
    serving:
      image: vllm/vllm-openai:v0.16.0
      served_model_name: m
""")
    return inv


CAUSES = {
    "silent": "SSH handshake with nobody@127.0.0.1:{port} did not complete within 2s",
    "closed": "cannot connect to nobody@127.0.0.1:{port}: connection refused",
    "unresolvable": "cannot resolve nobody@deadhost-{tag}.invalid:{port}",
}

COMMANDS = {
    "status": ["status", "deadhost"],
    "deploy": ["deploy", "deadhost"],
    "push": ["push", PUSH_IMAGE, "deadhost"],
    "extract": ["extract", "deadhost", "--pipeline", str(REPO / "deploy/pipeline.yaml")],
    "release": ["release", "deadhost", "--arg", "--max-num-seqs=4"],
    "recover": ["recover", "deadhost"],
    "lock-release": ["lock", "release", "deadhost", "--force"],
    "attach": ["attach", "deadhost"],
    "image-ls": ["image", "ls", "deadhost"],
}

READ_ONLY = {"status", "image-ls"}

CASES = [(c, "silent") for c in COMMANDS] + [(c, k) for c in ("status", "deploy", "push", "extract")
                                             for k in ("closed", "unresolvable")]


@pytest.mark.parametrize(("command", "kind"), CASES, ids=[f"{c}-{k}" for c, k in CASES])
def test_dead_host_fails_once_in_one_line(command, kind, silent_port, closed_port, tmp_path):
    tag = uuid.uuid4().hex[:6]
    hostname, port = {"silent": ("127.0.0.1", silent_port), "closed": ("127.0.0.1", closed_port),
                      "unresolvable": (f"deadhost-{tag}.invalid", 22)}[kind]
    inv = _inventory(tmp_path, hostname, port)
    argv = [*COMMANDS[command], "--inventory", str(inv)]
    audit = tmp_path / "local-audit.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "COLUMNS": "200", "EAGLE3OPS_LOCAL_AUDIT": str(audit)}
    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "eagle3ops", *argv], cwd=tmp_path, env=env, capture_output=True,
                        text=True, timeout=120, stdin=subprocess.DEVNULL)
    took = time.monotonic() - t0
    assert cp.returncode == 1, f"exit {cp.returncode}\nstdout:\n{cp.stdout}\nstderr:\n{cp.stderr}"
    assert "Traceback" not in cp.stderr + cp.stdout, cp.stderr
    lines = cp.stderr.splitlines()
    assert len(lines) == 1, f"{len(lines)} lines on stderr:\n{cp.stderr}"
    assert lines[0].startswith("error: deadhost: "), lines[0]
    assert CAUSES[kind].format(port=port, tag=tag) in lines[0], lines[0]
    assert took < BOUND_S, f"{command} took {took:.1f}s (bound {BOUND_S}s)"
    if kind == "silent":  # the bound is the connect bound: it waited for the banner, once
        assert took >= CONNECT_S - 0.5, took
    # a host-changing command that never reached its host is in the local audit log (the host's cannot be written)
    if command in READ_ONLY:
        assert not audit.exists(), audit.read_text()
    else:
        entries = [json.loads(ln) for ln in audit.read_text().splitlines()]
        assert len(entries) == 1 and entries[0]["host"] == "deadhost", entries
        assert entries[0]["outcome"] == "host not reached" and CAUSES[kind].format(port=port, tag=tag) in \
            entries[0]["error"], entries
        assert entries[0]["command"].startswith(f"eagle3ops {COMMANDS[command][0]} "), entries


# --- hints quote their arguments ------------------------------------------------------------------------------------

EVIL = "x;touch {p}"


def _paste(cmd: str, tmp_path: Path) -> Path:
    """Run a hint's command in bash with every program of it replaced by a no-op; return the canary path."""
    canary = tmp_path / "pwned"
    assert not canary.exists()
    stubs = "eagle3ops(){ :; }; ssh-keyscan(){ :; }; ssh-keygen(){ :; }; "
    subprocess.run(["bash", "-c", stubs + cmd], cwd=tmp_path, timeout=30, check=False)
    return canary


def _backticked(msg: str, starts: str) -> str:
    parts = msg.split("`")[1::2]
    hits = [p for p in parts if p.startswith(starts)]
    assert hits, f"no `{starts}...` in {msg!r}"
    return hits[0]


@pytest.mark.parametrize("args", [("recover",), ("lock", "release", "{h}", "--force"), ("attach",),
                                  ("status",), ("deploy",)], ids=lambda a: "-".join(x for x in a if x != "{h}"))
def test_hint_pasted_back_runs_nothing(args, tmp_path):
    from eagle3ops.window.common import hint

    host = EVIL.format(p=tmp_path / "pwned")
    argv = [host if a == "{h}" else a for a in args] if "{h}" in args else [*args, host]
    cmd = _backticked(hint(*argv), "eagle3ops ")
    assert not _paste(cmd, tmp_path).exists(), cmd


def test_command_line_recorded_for_the_lock_is_quoted(tmp_path, monkeypatch):
    from eagle3ops import cli

    monkeypatch.setattr(sys, "argv", ["eagle3ops", "extract", EVIL.format(p=tmp_path / "pwned")])
    assert not _paste(cli._command_line(), tmp_path).exists()


def test_host_key_hint_quotes_the_host(tmp_path):
    from eagle3ops.config import HostConfig
    from eagle3ops.remote import Remote

    evil = EVIL.format(p=tmp_path / "pwned")
    h = HostConfig(name="h", hostname=evil, port=22, data_dir="/d", state_dir="/s", model_path="/m",
                   serving={"image": "vllm/vllm-openai:v0.16.0", "served_model_name": "m"})
    hop = types.SimpleNamespace(user="u", host=evil, port=22, gateway=None)
    err = Remote(h)._unreachable(paramiko.SSHException(f"Server '[{evil}]:22' not found in known_hosts"), hop,
                                 [hop], [])
    assert not _paste(_backticked(str(err), "ssh-keyscan "), tmp_path).exists(), str(err)
