"""ProxyJump through a real bastion sshd, with host keys checked on every hop (:mod:`eagle3ops.remote`).

The target is the sandbox (sshd on 127.0.0.1:2222, user e3ops). The sandbox's own sshd has ``AllowTcpForwarding
no``, so it cannot be its own bastion; this module starts a second, throwaway OpenSSH server (``sshd -D`` on a free
port, ``AllowTcpForwarding yes``, its own host key, the sandbox client key authorized for e3ops) and stops it at
the end. The host is reached by the ssh_config alias ``target`` whose ``ProxyJump bastion`` Fabric turns into a
gateway Connection — the one that would use Fabric's default AutoAddPolicy if eagle3ops did not replace it.

The same bastion carries the OpenSSH bulk path of :mod:`eagle3ops.transfer` (an ``ssh`` subprocess, whose jump hop
is a separate ``ssh -W`` process that reads only the generated ``-F`` config): a push goes through it, and an
unknown bastion key is refused there too, even when the inventory's ssh_config tries to switch checking off.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import paramiko
import pytest

from eagle3ops import transfer
from eagle3ops.commands.docker import docker as docker_cmd
from eagle3ops.transfer.sshconfig import ssh_command
from eagle3ops.transfer.streams import SshStream
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


def _jump_host(sandbox_host, tmp_path: Path, bastion_port: int, known_lines: list[str], bastion_extra: str = ""):
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
{bastion_extra}""")
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


# --- the OpenSSH bulk path (eagle3ops.transfer) ------------------------------------------------------------------
_WEAKEN = "    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n    BatchMode no\n"


def _forwards(log: Path) -> int:
    return log.read_text(errors="replace").count("server_request_direct_tcpip")


def test_openssh_config_puts_strict_options_before_the_inventory_ssh_config(tmp_path):
    """``ssh -G`` (no connection) resolves the generated config as ssh and its jump process will: the strict options
    win on both hops although the inventory's ssh_config says otherwise for each; aliases, ports and users come from
    that ssh_config; the inventory's identity is offered after ssh_config's own."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host target\n    HostName 127.0.0.1\n    Port 2222\n    User e3ops\n    ProxyJump bastion\n"
                   f"    StrictHostKeyChecking accept-new\n    UpdateHostKeys yes\n"
                   f"Host bastion\n    HostName 127.0.0.2\n    Port 2999\n    User jump\n{_WEAKEN}"
                   f"    IdentityFile {tmp_path}/bastion_key\n")
    host = SimpleNamespace(name="h", hostname="target", port=None, user=None, ssh_config=cfg, connect_timeout_s=None,
                           known_hosts=tmp_path / "known_hosts", identity_file=tmp_path / "id")
    with ssh_command(host, ["echo", "a b; c"]) as argv:
        conf = Path(argv[2])
        assert argv[:2] == ["ssh", "-F"] and argv[-2:] == ["target", "echo 'a b; c'"] and "-o" not in argv
        assert conf.stat().st_mode & 0o777 == 0o600 and conf.parent.stat().st_mode & 0o777 == 0o700
        resolved = {}
        for name in ("target", "bastion"):
            out = subprocess.run(["ssh", "-G", "-F", str(conf), name], capture_output=True, text=True, check=True)
            lines = [line.split(" ", 1) for line in out.stdout.splitlines()]
            resolved[name] = {k: [v for k2, v in lines if k2 == k] for k, _ in lines}
    assert not conf.parent.exists()  # removed after the block
    for name, (hostname, port, user) in {"target": ("127.0.0.1", "2222", "e3ops"),
                                         "bastion": ("127.0.0.2", "2999", "jump")}.items():
        r = resolved[name]
        assert (r["hostname"], r["port"], r["user"]) == ([hostname], [port], [user])
        assert r["stricthostkeychecking"] == ["true"] and r["batchmode"] == ["yes"], name
        assert r["updatehostkeys"] == ["false"] and r["checkhostip"] == ["no"], name
        assert r["globalknownhostsfile"][0].split()[0] == str(tmp_path / "known_hosts"), name
        assert r["identityfile"][-1] == str(tmp_path / "id") and r["identitiesonly"] == ["yes"], name
        assert r["serveraliveinterval"] == [str(KEEPALIVE_S)], name
    assert resolved["bastion"]["identityfile"][0] == f"{tmp_path}/bastion_key"
    assert resolved["bastion"]["userknownhostsfile"] == ["/dev/null"]  # read as well, never instead
    assert resolved["target"]["proxyjump"] == ["bastion"]


def test_openssh_bulk_path_runs_and_pushes_through_bastion(sandbox_host, bastion, tmp_path):
    port, bastion_line, log = bastion
    host, kh = _jump_host(sandbox_host, tmp_path, port, [_sandbox_key_line(sandbox_host), bastion_line])
    before = kh.read_bytes()
    # the bare stream: a command through the jump, one forward on the bastion
    n0 = _forwards(log)
    s = SshStream(host, ["id", "-un"])
    rc, out, err = s.finish(timeout=60)
    assert (rc, out.strip()) == (0, "e3ops"), err
    assert _forwards(log) == n0 + 1
    assert not s.config_file.parent.exists()
    # a push of a small fresh image, forced onto the OpenSSH transport (its inventory goes over paramiko)
    tag = f"e3ops-test/bastion:{uuid.uuid4().hex[:8]}"
    root = tmp_path / "root"
    root.mkdir()
    (root / "data.bin").write_bytes(os.urandom(300_000))
    tar = subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True, check=True).stdout
    subprocess.run(["docker", "import", "-", tag], input=tar, capture_output=True, check=True)
    streams: list = []
    try:
        n1 = _forwards(log)
        r = transfer.push(tag, host, options=transfer.PushOptions(transport="openssh", compression="none",
                                                                  attempts=1), stream_hook=streams.append)
        assert r.status == "ok" and r.transport == "openssh" and r.layers_sent == 1, r.reason
        assert [type(x) for x in streams] == [SshStream]
        assert not streams[0].config_file.parent.exists()
        assert _forwards(log) >= n1 + 2  # paramiko's connection and the ssh stream, both through the bastion
        with Remote(host) as remote:
            got = remote.run(docker_cmd(host, "image", "inspect", "--format", "{{.Id}}", tag)).stdout.strip()
            assert got == transfer.inspect_local(tag).id
    finally:
        with Remote(host) as remote:
            remote.run(docker_cmd(host, "image", "rm", tag), check=False)
        subprocess.run(["docker", "image", "rm", tag], capture_output=True)
    assert kh.read_bytes() == before


@pytest.mark.parametrize("weaken", [False, True], ids=["plain", "ssh_config-says-no"])
def test_openssh_bulk_path_refuses_unknown_bastion_key(sandbox_host, bastion, tmp_path, weaken):
    """The bastion's key is not in any known_hosts file: the jump process refuses it (also when the inventory's
    ssh_config sets ``StrictHostKeyChecking no`` / ``UserKnownHostsFile /dev/null`` for the bastion), nothing is
    forwarded and no known_hosts file changes."""
    port, _, log = bastion
    host, kh = _jump_host(sandbox_host, tmp_path, port, [_sandbox_key_line(sandbox_host)],
                          bastion_extra=_WEAKEN if weaken else "")
    user_kh = Path("~/.ssh/known_hosts").expanduser()
    snap = (kh.read_bytes(), user_kh.read_bytes() if user_kh.exists() else None)
    n0 = _forwards(log)
    s = SshStream(host, ["true"])
    rc, _, err = s.finish(timeout=60)
    assert rc == 255 and "Host key verification failed" in err, (rc, err)
    assert f"[127.0.0.1]:{port}" in err, err  # it is the bastion's key that was refused
    assert _forwards(log) == n0
    assert snap == (kh.read_bytes(), user_kh.read_bytes() if user_kh.exists() else None)
    assert not s.config_file.parent.exists()
