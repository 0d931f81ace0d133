"""ProxyJump through a real bastion sshd, with host keys checked on every hop (:mod:`eagle3ops.remote`).

The target is the sandbox (sshd on 127.0.0.1:2222, user e3ops). The sandbox's own sshd has ``AllowTcpForwarding
no``, so it cannot be its own bastion; this module starts a second, throwaway OpenSSH server (``sshd -D`` on a free
port, ``AllowTcpForwarding yes``, its own host key, the sandbox client key authorized for e3ops) and stops it at
the end. The host is reached by the ssh_config alias ``target`` whose ``ProxyJump bastion`` Fabric turns into a
gateway Connection — the one that would use Fabric's default AutoAddPolicy if eagle3ops did not replace it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import paramiko
import pytest

from eagle3ops.remote import KEEPALIVE_S, HostUnreachable, Remote

pytestmark = pytest.mark.sandbox


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def bastion(sandbox_host):
    """A second sshd on 127.0.0.1:<free port> that allows TCP forwarding; yields (port, host key line, log)."""
    # sshd reads authorized_keys as the login user: the directory must be traversable by e3ops (pytest's tmp dirs
    # are root-only 0700).
    d = Path(tempfile.mkdtemp(prefix="e3ops-bastion-"))
    d.chmod(0o755)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")], check=True)
    (d / "authorized_keys").write_text(Path(str(sandbox_host.identity_file) + ".pub").read_text())
    port = _free_port()
    (d / "sshd_config").write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {d / 'host_key'}", f"PidFile {d / 'sshd.pid'}",
        f"AuthorizedKeysFile {d / 'authorized_keys'}", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes", "PermitRootLogin no", "AllowUsers e3ops", "StrictModes no", "UsePAM no",
        "AllowTcpForwarding yes", "LogLevel DEBUG1", "",
    ]))
    log = d / "sshd.log"
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", str(d / "sshd_config"), "-E", str(log)])
    try:
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.1)
        kind, key = (d / "host_key.pub").read_text().split()[:2]
        yield port, f"[127.0.0.1]:{port} {kind} {key}", log
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        shutil.rmtree(d, ignore_errors=True)


def _jump_host(sandbox_host, tmp_path: Path, bastion_port: int, known_lines: list[str]):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"""Host target
    HostName 127.0.0.1
    Port {sandbox_host.port}
    User e3ops
    ProxyJump bastion

Host bastion
    HostName 127.0.0.1
    Port {bastion_port}
    User e3ops
""")
    kh = tmp_path / "known_hosts"
    kh.write_text("".join(line + "\n" for line in known_lines))
    host = sandbox_host.model_copy(update={"hostname": "target", "port": None, "user": None, "ssh_config": cfg,
                                           "known_hosts": kh})
    return host, kh


def _sandbox_key_line(sandbox_host) -> str:
    return Path(sandbox_host.known_hosts).read_text().splitlines()[0]


def test_proxyjump_runs_through_bastion_with_strict_keys_on_both_hops(sandbox_host, bastion, tmp_path):
    port, bastion_line, log = bastion
    host, kh = _jump_host(sandbox_host, tmp_path, port, [_sandbox_key_line(sandbox_host), bastion_line])
    before = kh.read_bytes()
    with Remote(host) as r:
        assert r.run(["id", "-un"]).stdout.strip() == "e3ops"
        conn = r.connection
        gw = conn.gateway
        # Fabric built exactly one gateway hop from ProxyJump, and both hops check host keys strictly.
        assert gw is not None and (gw.host, gw.port) == ("127.0.0.1", port) and gw.gateway is None
        for c in (conn, gw):
            assert isinstance(c.client._policy, paramiko.RejectPolicy)
            # keepalive applied on each hop's transport
            assert c.client.get_transport().packetizer._Packetizer__keepalive_interval == KEEPALIVE_S
        # The target transport runs over a direct-tcpip channel of the bastion, not a socket of its own.
        assert isinstance(conn.client.get_transport().sock, paramiko.Channel)
    text = log.read_text(errors="replace")
    # The bastion really forwarded to the sandbox's sshd.
    assert "server_request_direct_tcpip" in text and f"target 127.0.0.1 port {sandbox_host.port}" in text, text[-2000:]
    assert kh.read_bytes() == before  # nothing added to known_hosts


def test_bastion_key_missing_from_known_hosts_is_refused(sandbox_host, bastion, tmp_path):
    port, _, log = bastion
    host, kh = _jump_host(sandbox_host, tmp_path, port, [_sandbox_key_line(sandbox_host)])
    before = kh.read_bytes()
    forwards_before = log.read_text(errors="replace").count("server_request_direct_tcpip")
    with pytest.raises(HostUnreachable) as ei:
        Remote(host).run(["id", "-un"])
    msg = str(ei.value)
    assert "bastion" in msg and f"[127.0.0.1]:{port}" in msg and "not in known_hosts" in msg, msg
    assert "fingerprint" in msg and f"add the key to {kh}" in msg, msg
    assert kh.read_bytes() == before  # never auto-added
    assert log.read_text(errors="replace").count("server_request_direct_tcpip") == forwards_before  # nothing was forwarded


def test_bastion_key_mismatch_is_refused(sandbox_host, bastion, tmp_path):
    port, _, _ = bastion
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    kind, key = (tmp_path / "other.pub").read_text().split()[:2]
    host, kh = _jump_host(sandbox_host, tmp_path, port,
                          [_sandbox_key_line(sandbox_host), f"[127.0.0.1]:{port} {kind} {key}"])
    with pytest.raises(HostUnreachable, match=r"host key of bastion .* does NOT match"):
        Remote(host).run(["true"])


def test_target_key_missing_behind_a_trusted_bastion_is_refused(sandbox_host, bastion, tmp_path):
    port, bastion_line, _ = bastion
    host, kh = _jump_host(sandbox_host, tmp_path, port, [bastion_line])
    before = kh.read_bytes()
    with pytest.raises(HostUnreachable) as ei:
        Remote(host).run(["true"])
    msg = str(ei.value)
    assert "target e3ops@127.0.0.1:" in msg and f"[127.0.0.1]:{sandbox_host.port}" in msg, msg
    assert "not in known_hosts" in msg
    assert kh.read_bytes() == before


def test_jump_that_fabric_would_drop_is_refused(sandbox_host, bastion, tmp_path):
    """``ProxyJump e3ops@127.0.0.1:<bastion port>`` for a target whose HostName is also 127.0.0.1: Fabric skips such
    a hop (its self-proxy guard compares host strings only) and would connect directly; eagle3ops refuses."""
    port, bastion_line, log = bastion
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host target\n    HostName 127.0.0.1\n    Port {sandbox_host.port}\n    User e3ops\n"
                   f"    ProxyJump e3ops@127.0.0.1:{port}\n")
    kh = tmp_path / "known_hosts"
    kh.write_text(_sandbox_key_line(sandbox_host) + "\n" + bastion_line + "\n")
    host = sandbox_host.model_copy(update={"hostname": "target", "port": None, "user": None, "ssh_config": cfg,
                                           "known_hosts": kh})
    forwards_before = log.read_text(errors="replace").count("server_request_direct_tcpip")
    with pytest.raises(HostUnreachable, match=r"Fabric would skip the jump .* `ProxyJump bastion`"):
        Remote(host).run(["true"])
    assert log.read_text(errors="replace").count("server_request_direct_tcpip") == forwards_before
