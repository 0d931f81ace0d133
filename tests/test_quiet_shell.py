"""First contact with a host whose shell prints on non-interactive SSH commands (``conda activate`` output or a
banner echoed from ``~/.bashrc``): refused before any command of the caller's runs, naming the byte count, the likely
start-up file and the fix.

A real OpenSSH server of this module's own (127.0.0.1, a free port, its own host key) and a user of its own
(``e3talk``, shell /bin/bash) whose ``~/.bashrc`` prints: the shared sandbox's user is left alone, so the suite's
other tests (run side by side) never see a talking shell. The same user with a quiet ``~/.bashrc`` is accepted.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from eagle3ops.config import load_inventory
from eagle3ops.remote import ConnectFailed, Remote

USER = "e3talk"
TALK = "conda activated: (base)\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def talking_host(tmp_path_factory):
    """(inventory file, home): an sshd on 127.0.0.1 admitting only ``e3talk`` by key; the test writes its
    ``~/.bashrc``."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    root = Path("/var/lib/eagle3ops-test-quiet-shell")  # root-owned all the way up: sshd's StrictModes
    shutil.rmtree(root, ignore_errors=True)
    (root / "ssh").mkdir(parents=True, mode=0o755)
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", USER], check=True)
    subprocess.run(["usermod", "-p", "*", USER], check=True)  # unlocked, no password: key only
    home = Path(pwd.getpwnam(USER).pw_dir)
    client = tmp_path_factory.mktemp("quiet-shell")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "ssh" / "host_key")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(client / "id")], check=True)
    (root / "ssh" / "authorized_keys").write_text((client / "id.pub").read_text())
    port = _free_port()
    cfg = root / "ssh" / "sshd_config"
    cfg.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {root / 'ssh' / 'host_key'}",
        f"PidFile {root / 'ssh' / 'sshd.pid'}", f"AuthorizedKeysFile {root / 'ssh' / 'authorized_keys'}",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PubkeyAuthentication yes",
        "PermitRootLogin no", f"AllowUsers {USER}", "StrictModes yes", "UsePAM no", "PrintMotd no", ""]))
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege-separation directory sshd requires
    subprocess.run([sshd, "-t", "-f", str(cfg)], check=True)
    proc = subprocess.Popen([sshd, "-D", "-f", str(cfg), "-E", str(root / "sshd.log")])
    try:
        for _ in range(200):  # bounded: 10 s
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        else:
            pytest.fail(f"sshd did not listen on 127.0.0.1:{port}: {(root / 'sshd.log').read_text()}")
        pub = (root / "ssh" / "host_key.pub").read_text().split()
        (client / "known_hosts").write_text(f"[127.0.0.1]:{port} {pub[0]} {pub[1]}\n")
        inv = client / "hosts.yaml"
        inv.write_text(f"""hosts:
  talker:
    hostname: 127.0.0.1
    port: {port}
    user: {USER}
    identity_file: {client / 'id'}
    known_hosts: {client / 'known_hosts'}
    data_dir: /tmp/e3talk-data
    state_dir: /tmp/e3talk-state
    model_path: /tmp/e3talk-data/model
    serving: none
""")
        yield inv, home
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


def _host(inv: Path):
    return load_inventory(inv).host("talker")


def test_talking_shell_is_refused_at_first_contact(talking_host):
    inv, home = talking_host
    (home / ".bashrc").write_text(f"echo '{TALK.strip()}'\n")
    r = Remote(_host(inv))
    with pytest.raises(ConnectFailed) as ei:  # not retried, audited as a host not reached
        r.run(["echo", "data"])
    assert type(ei.value).__name__ == "ShellNotQuiet", str(ei.value)
    msg = str(ei.value)
    assert msg.startswith("talker: the shell of e3talk@127.0.0.1 prints 24 bytes"), msg
    assert repr(TALK) in msg and "~/.bashrc" in msg and "[[ $- == *i* ]] || return" in msg, msg
    assert f"ssh -p {r.host.port} e3talk@127.0.0.1 true | wc -c" in msg, msg
    assert r.history == ["echo data"] and r._conn is None  # the caller's command never ran; nothing kept open


def test_quiet_shell_is_accepted_and_stderr_noise_ignored(talking_host):
    inv, home = talking_host
    # A locale warning on stderr corrupts no output: accepted.
    (home / ".bashrc").write_text("echo 'bash: warning: setlocale: LC_ALL: cannot change locale' >&2\n")
    with Remote(_host(inv)) as r:
        assert r.run(["echo", "data"]).stdout == "data\n"
    os.remove(home / ".bashrc")
