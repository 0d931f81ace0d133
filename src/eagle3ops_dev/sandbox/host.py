"""The embedded sandbox host: an OpenSSH server on 127.0.0.1 and a Docker engine of its own, on this machine.

The sandbox is reached exactly like a real GPU host — through :class:`eagle3ops.remote.Remote` and the inventory
entry ``sandbox`` in ``deploy/hosts.yaml`` — so the same code path serves ``HOST=sandbox`` and ``HOST=gpu-01``.

Layout (host side, owned by root, under ``/var/lib/eagle3ops-sandbox/<name>/``)::

    docker.sock         the sandbox engine's API socket (group ``e3ops``, mode 660)
    docker.pid          dockerd pid file;  dockerd.log  its log
    docker/             dockerd --data-root;  /run/eagle3ops-sandbox/<name>  its --exec-root
    ssh/sshd_config     sshd's own config (Port, ListenAddress 127.0.0.1, HostKey, PidFile, AuthorizedKeysFile)
    ssh/ssh_host_ed25519_key[.pub]   the sandbox's own host key, generated on first ``up``
    ssh/authorized_keys  the client keys allowed to log in as ``e3ops`` (one per checkout that ran ``up``; added,
                         never replaced)
    ssh/sshd.pid, sshd.log
    data/  state/       the inventory's ``data_dir`` / ``state_dir`` (owned by ``e3ops``)

Client side (in the repository, gitignored): ``.sandbox/<name>/id_ed25519`` (the user key) and
``.sandbox/<name>/known_hosts`` holding ``[127.0.0.1]:<port> ssh-ed25519 ...`` — host-key checking stays on.

Engines (``engine=``): ``classic`` is this machine's Debian ``dockerd`` (Docker 20.10, classic overlay2 image
store); ``containerd`` is Debian 13's ``docker.io`` 26.1 with its ``containerd`` 1.7, unpacked from the packages
(never installed over the system's) into ``/opt/eagle3ops/engines/docker-26.1`` and started with
``{"features": {"containerd-snapshotter": true}}``: the containerd image store that Docker Engine 29 uses by default
on new installs (image ids are manifest digests there). The system's ``runc`` runs its containers (trixie's needs a
newer glibc than bookworm's).

The second dockerd runs with ``--bridge=none --iptables=false``, so containers there must use ``--network host``.
It starts its own containerd under its exec-root (none is shared with the build engine). Measured on this machine
(Docker 20.10, Debian 12): two dockerd daemons with separate data-/exec-roots run side by side (FACTS.md).
"""

from __future__ import annotations

import grp
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from eagle3ops_dev.sandbox.engines import ensure_containerd_engine
from eagle3ops_dev.sandbox.keys import ensure_keys
from eagle3ops_dev.sandbox.proc import SandboxError, run_checked
from eagle3ops_dev.sandbox.purge import purge_root


#: Parent of every sandbox's host-side state.
SANDBOX_BASE = Path("/var/lib/eagle3ops-sandbox")
#: Parent of every sandbox dockerd's exec-root (short path: containerd puts unix sockets under it).
EXEC_BASE = Path("/run/eagle3ops-sandbox")
#: Login user and group on the sandbox (group owns the sandbox docker socket).
USER = "e3ops"
GROUP = "e3ops"
#: apt packages providing the programs the sandbox needs.
APT_PACKAGES = {"sshd": "openssh-server", "dockerd": "docker.io", "docker": "docker.io", "ssh-keygen": "openssh-client",
                "ssh": "openssh-client"}
#: Seconds to wait for dockerd / sshd to answer after start (dockerd starts its own containerd first: on a loaded
#: 2-core machine that alone once took over 60 s).
START_TIMEOUT_S = 180.0


#: ``none``: sshd only, no Docker engine at all (a host like the seeds': a GPU container reached over SSH, vLLM in a
#: venv; the ``stage_runtime: venv`` tests).
ENGINES = ("classic", "containerd", "none")


@dataclass(frozen=True)
class SandboxInfo:
    """Where a sandbox lives and how to reach it (the values the inventory entry uses).

    Attributes:
        name: sandbox name (``sandbox`` for the inventory entry of the same name).
        ssh_port: TCP port of its sshd on 127.0.0.1.
        root: host-side state directory.
        docker_host: ``unix://`` URL of its dockerd socket.
        data_dir / state_dir: the inventory's data and state directories on the "host".
        identity_file / known_hosts: client-side files (the user key and the pinned host key).
        user: login user.
        hostname: address sshd listens on (127.0.0.1, or an address inside ``netns``).
        netns: network namespace sshd runs in (benchmarks: a veth link with a rate limit); None = this one.
        engine: ``classic`` (Docker 20.10, overlay2 image store), ``containerd`` (Docker 26.1, containerd store) or
            ``none`` (no engine: ``docker_host`` is empty).
        docker_version: server version the sandbox engine reported on the last verification.
        started: which daemons this call (re)started (empty when everything already ran).
    """

    name: str
    ssh_port: int
    root: Path
    docker_host: str
    data_dir: Path
    state_dir: Path
    identity_file: Path
    known_hosts: Path
    user: str
    docker_version: str = ""
    started: tuple[str, ...] = ()
    hostname: str = "127.0.0.1"
    netns: str | None = None
    engine: str = "classic"

    def host_config(self, **overrides: object):
        """A :class:`eagle3ops.config.HostConfig` for this sandbox (serving/model fields are placeholders unless
        overridden); used by tests and benchmarks that need a host without an inventory file."""
        from eagle3ops.config import HostConfig, ServingConfig

        fields: dict = dict(
            name=self.name, hostname=self.hostname, port=self.ssh_port, user=self.user,
            identity_file=self.identity_file, known_hosts=self.known_hosts, docker_host=self.docker_host,
            data_dir=str(self.data_dir), state_dir=str(self.state_dir), model_path=str(self.data_dir / "model"),
            serving=ServingConfig(image="none", served_model_name="none", gpus="none"),
        )
        fields.update(overrides)
        return HostConfig(**fields)


# --- paths ------------------------------------------------------------------------------------------------------
def repo_root() -> Path:
    """The repository root: the source checkout this module lives in, else the current directory."""
    here = Path(__file__).resolve().parents[3]
    if (here / "pyproject.toml").is_file() and (here / "src" / "eagle3ops").is_dir():
        return here
    return Path.cwd()


def _root(name: str) -> Path:
    return SANDBOX_BASE / name


def client_dir(name: str) -> Path:
    """Client-side directory holding the sandbox's user key and known_hosts: ``<repo>/.sandbox/<name>/``."""
    override = os.environ.get("EAGLE3OPS_SANDBOX_CLIENT_DIR")
    base = Path(override) if override else repo_root() / ".sandbox"
    return base / name


def _check_name(name: str) -> None:
    if not name or not all(c.isalnum() or c in "-_" for c in name) or len(name) > 32:
        raise SandboxError(f"sandbox name {name!r}: use 1-32 letters, digits, '-' or '_'")


def info(name: str = "sandbox", ssh_port: int = 2222, listen: str = "127.0.0.1", netns: str | None = None,
         engine: str = "classic") -> SandboxInfo:
    """The :class:`SandboxInfo` of a sandbox (paths only; nothing is checked or started)."""
    _check_name(name)
    root = _root(name)
    cdir = client_dir(name)
    return SandboxInfo(
        name=name, ssh_port=ssh_port, root=root,
        docker_host="" if engine == "none" else f"unix://{root / 'docker.sock'}",
        data_dir=root / "data", state_dir=root / "state", identity_file=cdir / "id_ed25519",
        known_hosts=cdir / "known_hosts", user=USER, hostname=listen, netns=netns, engine=engine,
    )


# --- prerequisites ----------------------------------------------------------------------------------------------
def check_prerequisites() -> dict[str, str]:
    """Check that we run as root and that ``sshd``, ``dockerd``, ``docker``, ``ssh``, ``ssh-keygen`` exist.

    Returns:
        program name → absolute path.

    Raises:
        SandboxError: not root, or programs missing (the message names the apt packages to install).
    """
    if os.geteuid() != 0:
        raise SandboxError("the sandbox host needs root (it starts sshd and dockerd and creates the user e3ops); "
                           "run `sudo python -m eagle3ops_dev sandbox up`")
    found: dict[str, str] = {}
    missing: list[str] = []
    search = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/local/sbin"
    for prog in APT_PACKAGES:
        path = shutil.which(prog, path=search)
        if path:
            found[prog] = path
        else:
            missing.append(prog)
    if missing:
        pkgs = sorted({APT_PACKAGES[p] for p in missing})
        raise SandboxError(f"missing program(s) {', '.join(missing)}: install them with "
                           f"`apt-get install -y {' '.join(pkgs)}`")
    return found


# --- helpers ----------------------------------------------------------------------------------------------------
def _pid_alive(pidfile: Path) -> int | None:
    """The pid in ``pidfile`` if that process exists (and is not a zombie), else None."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            return None
    except OSError:
        return None
    return pid


def _stop_pid(pidfile: Path, timeout: float = 20.0) -> bool:
    """SIGTERM the process named by ``pidfile``, SIGKILL after ``timeout`` s. Returns True if one was running."""
    pid = _pid_alive(pidfile)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _pid_alive(pidfile) is None:
            break
        time.sleep(0.2)
    else:
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    try:
        pidfile.unlink()
    except FileNotFoundError:
        pass
    return True


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def _ensure_user() -> tuple[int, int]:
    """Create group and user ``e3ops`` (shell /bin/bash, home /home/e3ops) if missing; returns (uid, gid).

    Sandboxes share the user: ``SANDBOX_BASE/.user.lock`` (flock) keeps two ``up`` calls at once (two checkouts,
    two test workers) from racing ``useradd``/``usermod`` on ``/etc/passwd``."""
    import fcntl

    SANDBOX_BASE.mkdir(parents=True, exist_ok=True)
    with open(SANDBOX_BASE / ".user.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_user_locked()


def _ensure_user_locked() -> tuple[int, int]:
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        run_checked(["groupadd", "--system", GROUP])
    try:
        pwd.getpwnam(USER)
    except KeyError:
        run_checked(["useradd", "--create-home", "--shell", "/bin/bash", "--gid", GROUP, USER])
    pw = pwd.getpwnam(USER)
    if pw.pw_shell != "/bin/bash":
        run_checked(["usermod", "--shell", "/bin/bash", USER])
    # A fresh useradd leaves the password field "!" (locked); sshd (UsePAM no) refuses locked accounts even for
    # public-key logins. "*" = no password can ever match, but the account is not locked.
    run_checked(["usermod", "-p", "*", USER])
    return pw.pw_uid, grp.getgrnam(GROUP).gr_gid


def _sshd_config(inf: SandboxInfo) -> str:
    ssh = inf.root / "ssh"
    return "\n".join([
        "# eagle3ops sandbox sshd (generated by eagle3ops_dev.sandbox; edits are overwritten by `sandbox up`)",
        f"Port {inf.ssh_port}",
        f"ListenAddress {inf.hostname}",
        f"HostKey {ssh / 'ssh_host_ed25519_key'}",
        f"PidFile {ssh / 'sshd.pid'}",
        f"AuthorizedKeysFile {ssh / 'authorized_keys'}",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "PermitRootLogin no",
        f"AllowUsers {USER}",
        # StrictModes stays on: the authorized_keys file and every directory above it are root-owned, not
        # group/world-writable, which is what StrictModes demands.
        "StrictModes yes",
        "UsePAM no",
        "X11Forwarding no",
        "AllowTcpForwarding no",
        "PrintMotd no",
        "AcceptEnv LANG LC_*",
        "Subsystem sftp internal-sftp",
        "",
    ])


def _docker_ok(sock: Path) -> str | None:
    """Server version of the engine at ``sock`` if it answers, else None."""
    if not sock.exists():
        return None
    try:
        cp = subprocess.run(["docker", "-H", f"unix://{sock}", "version", "--format", "{{.Server.Version}}"],
                            capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return None  # a daemon still starting (loading its containers) accepts connections but does not answer
    return cp.stdout.strip() if cp.returncode == 0 and cp.stdout.strip() else None


def _clear_stale_containerd(exec_root: Path) -> None:
    """Before a dockerd starts under ``exec_root``: a ``containerd.pid`` left by a dockerd that died makes the new
    one wait for that containerd's socket ("libcontainerd: containerd is still running") until it gives up (seen:
    the pid a zombie, or reused by another process). Stop our own orphaned containerd (its command line names
    ``exec_root``), and remove the pid file in every case."""
    cpid = exec_root / "containerd" / "containerd.pid"
    if not cpid.exists():
        return
    pid = _pid_alive(cpid)
    if pid is not None:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmdline = ""
        if "containerd" in cmdline and str(exec_root) in cmdline:
            _stop_pid(cpid)
    cpid.unlink(missing_ok=True)


def _start_dockerd(inf: SandboxInfo, dockerd: str, engine: str = "classic") -> None:
    root = inf.root
    sock = root / "docker.sock"
    exec_root = EXEC_BASE / inf.name
    exec_root.mkdir(parents=True, exist_ok=True)
    _clear_stale_containerd(exec_root)
    (root / "docker").mkdir(parents=True, exist_ok=True)
    if sock.exists():
        sock.unlink()  # stale socket of a dead daemon
    argv = [
        dockerd,
        "--data-root", str(root / "docker"),
        "--exec-root", str(exec_root),
        "--pidfile", str(root / "docker.pid"),
        "-H", f"unix://{sock}",
        "--bridge=none", "--iptables=false", "--ip-masq=false",
        "--group", GROUP,
        "--containerd-namespace", f"e3ops-{inf.name}",
        "--containerd-plugins-namespace", f"e3ops-{inf.name}-plugins",
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "DOCKER_CONTEXT")}
    if engine == "containerd":
        top = ensure_containerd_engine()
        (root / "daemon.json").write_text('{"features": {"containerd-snapshotter": true}}\n')
        argv[0] = str(top / "usr/sbin/dockerd")
        argv[1:1] = ["--config-file", str(root / "daemon.json")]
        # dockerd starts the containerd it finds on PATH: trixie's 1.7, not the system's 1.6.
        env["PATH"] = f"{top / 'usr/bin'}:{top / 'usr/sbin'}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
    log = open(root / "dockerd.log", "ab")
    subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True, env=env)
    log.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if _docker_ok(sock):
            return
        time.sleep(0.5)
    tail = (root / "dockerd.log").read_text(errors="replace").splitlines()[-15:]
    raise SandboxError(f"sandbox dockerd did not answer on {sock} within {START_TIMEOUT_S:.0f}s; "
                       f"log {root / 'dockerd.log'}:\n" + "\n".join(tail))


def _start_sshd(inf: SandboxInfo, sshd: str) -> None:
    if _port_open(inf.ssh_port, inf.hostname):
        raise SandboxError(f"port {inf.hostname}:{inf.ssh_port} is already taken by another program; pick another "
                           f"with `python -m eagle3ops_dev sandbox up --ssh-port N` (and the inventory's `port:`)")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege-separation directory sshd requires
    ssh = inf.root / "ssh"
    prefix = ["ip", "netns", "exec", inf.netns] if inf.netns else []
    run_checked([sshd, "-t", "-f", str(ssh / "sshd_config")])
    # sshd daemonizes and writes its PidFile
    run_checked(prefix + [sshd, "-f", str(ssh / "sshd_config"), "-E", str(inf.root / "sshd.log")])
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if _port_open(inf.ssh_port, inf.hostname) and _pid_alive(ssh / "sshd.pid"):
            return
        time.sleep(0.2)
    raise SandboxError(f"sandbox sshd did not listen on {inf.hostname}:{inf.ssh_port} within {START_TIMEOUT_S:.0f}s; "
                       f"log {inf.root / 'sshd.log'}")


def _ssh_argv(inf: SandboxInfo, remote_argv: list[str]) -> list[str]:
    from eagle3ops.commands.quote import render

    return ["ssh", "-F", "/dev/null", "-p", str(inf.ssh_port), "-i", str(inf.identity_file),
            "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={inf.known_hosts}", "-o", "ConnectTimeout=10",
            f"{inf.user}@{inf.hostname}", render(remote_argv)]


# --- public API -------------------------------------------------------------------------------------------------
def name_of(docker_host: str) -> str:
    """The sandbox name behind an inventory entry: its ``docker_host`` is ``unix:///var/lib/eagle3ops-sandbox/<name>/
    docker.sock`` (deploy/hosts.yaml's ``sandbox`` entry takes ``<name>`` from ``$EAGLE3OPS_SANDBOX``).

    Raises:
        SandboxError: ``docker_host`` is not a sandbox engine's socket.
    """
    path = Path(docker_host.removeprefix("unix://"))
    if path.name != "docker.sock" or path.parent.parent != SANDBOX_BASE:
        raise SandboxError(f"docker_host {docker_host!r} is not a sandbox engine "
                           f"(expected unix://{SANDBOX_BASE}/<name>/docker.sock)")
    _check_name(path.parent.name)
    return path.parent.name


def up_for(host: object) -> SandboxInfo:
    """:func:`up` for an inventory entry (a :class:`eagle3ops.config.HostConfig` of a sandbox): its name from
    ``docker_host`` (:func:`name_of`), its sshd port from ``port``."""
    return up(name_of(host.docker_host or ""), ssh_port=host.port or 2222)  # type: ignore[attr-defined]


def up(name: str = "sandbox", ssh_port: int = 2222, listen: str = "127.0.0.1", netns: str | None = None,
       engine: str = "classic") -> SandboxInfo:
    """Bring the sandbox host up (idempotent): create what is missing, start what is dead, verify what runs.

    Creates user/group ``e3ops``, the host key (first time only), the client user key and known_hosts, the
    directories, then (re)starts dockerd (none for ``engine="none"``) and sshd as needed. Finally logs in over real
    SSH with strict host-key checking and runs ``docker -H <sock> version`` as ``e3ops`` (with no engine: a login).

    Args:
        name: sandbox name (state under ``/var/lib/eagle3ops-sandbox/<name>/``).
        ssh_port: TCP port for its sshd.
        listen: address sshd listens on; only 127.0.0.1 or an address of a network namespace the caller created
            (``netns``, e.g. the benchmark's rate-limited veth link).
        netns: run sshd inside this network namespace (dockerd stays in this one; its socket is a file).
        engine: ``classic``, ``containerd`` or ``none`` (:data:`ENGINES`; see the module docs). A sandbox keeps
            the engine it was made with (recorded in ``<root>/engine``).

    Returns:
        :class:`SandboxInfo` with ``started`` naming the daemons this call started.

    Raises:
        SandboxError: not root, missing programs (names the apt packages), port taken, a daemon fails to start, or
            the final SSH + docker check fails.
    """
    if engine not in ENGINES:
        raise SandboxError(f"engine {engine!r}: use one of {', '.join(ENGINES)}")
    progs = check_prerequisites()
    inf = info(name, ssh_port, listen, netns, engine)
    uid, gid = _ensure_user()
    root = inf.root
    made_with = (root / "engine").read_text().strip() if (root / "engine").exists() else None
    if made_with is None and (root / "docker").exists():
        made_with = "classic"  # sandboxes from before engines were recorded
    if made_with not in (None, engine):
        raise SandboxError(f"sandbox {name} was made with the {made_with} engine, not {engine}; remove it first with "
                           f"`python -m eagle3ops_dev sandbox down --name {shlex.quote(name)} --purge`")
    for d in (SANDBOX_BASE, root, root / "ssh"):
        d.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chown(d, 0, 0)
        os.chmod(d, 0o755)
    (root / "engine").write_text(engine + "\n")
    for d in (inf.data_dir, inf.state_dir):
        d.mkdir(mode=0o755, exist_ok=True)
        os.chown(d, uid, gid)
    ssh = root / "ssh"
    ensure_keys(inf.identity_file, inf.known_hosts, ssh, progs["ssh-keygen"], name, listen, ssh_port)
    config_text = _sshd_config(inf)
    cfg = ssh / "sshd_config"
    config_changed = not cfg.exists() or cfg.read_text() != config_text
    cfg.write_text(config_text)

    started: list[str] = []
    sock = root / "docker.sock"
    if engine != "none":
        if _pid_alive(root / "docker.pid") is None or _docker_ok(sock) is None:
            _stop_pid(root / "docker.pid")
            _start_dockerd(inf, progs["dockerd"], engine)
            started.append("dockerd")
        # dockerd --group sets the socket's group; make sure (an older daemon may have been started without it).
        os.chown(sock, 0, gid)
        os.chmod(sock, 0o660)
    sshd_pid = _pid_alive(ssh / "sshd.pid")
    if sshd_pid is not None and (config_changed or not _port_open(ssh_port, listen)):
        _stop_pid(ssh / "sshd.pid")
        sshd_pid = None
    if sshd_pid is None:
        _start_sshd(inf, progs["sshd"])
        started.append("sshd")
    version = _verify_login(inf, name, engine)
    return SandboxInfo(**{**asdict(inf), "docker_version": version, "started": tuple(started)})




def _verify_login(inf: SandboxInfo, name: str, engine: str) -> str:
    """Log in over real SSH, as ``e3ops``, with strict host-key checking, and ask the engine its version (step of
    :func:`up`); with no engine the login alone. Returns the engine's server version ("" with no engine).

    Raises:
        SandboxError: the login or the ``docker version`` failed (exit status and the stderr tail, the logs named).
    """
    check = (["sh", "-c", "echo none"] if engine == "none"
             else ["docker", "-H", inf.docker_host, "version", "--format", "{{.Server.Version}}"])
    cp = subprocess.run(_ssh_argv(inf, check), capture_output=True, text=True, timeout=60)
    if cp.returncode != 0 or not cp.stdout.strip():
        raise SandboxError(f"sandbox {name}: SSH login as {USER} + `{shlex.join(check)}` failed "
                           f"(exit {cp.returncode}): "
                           f"{cp.stderr.strip()[-800:]}; see {inf.root / 'sshd.log'} and {inf.root / 'dockerd.log'}")
    return "" if engine == "none" else cp.stdout.strip()


def down(name: str = "sandbox", purge: bool = False) -> list[str]:
    """Stop the sandbox's sshd and dockerd (its containers stop with dockerd).

    Args:
        name: sandbox name.
        purge: also delete its host-side state (images, data, keys) and its client directory; the host-side root
            is renamed aside at once and deleted in the background (:func:`~eagle3ops_dev.sandbox.purge.purge_root`).

    Returns:
        the daemons that were running and got stopped.
    """
    _check_name(name)
    root = _root(name)
    stopped = []
    if _stop_pid(root / "ssh" / "sshd.pid"):
        stopped.append("sshd")
    sock = root / "docker.sock"
    if _pid_alive(root / "docker.pid") is not None:
        # Stop containers first so dockerd exits promptly (bounded by the stop timeout).
        cp = subprocess.run(["docker", "-H", f"unix://{sock}", "ps", "-q"], capture_output=True, text=True,
                            timeout=30)
        ids = cp.stdout.split()
        if ids:
            subprocess.run(["docker", "-H", f"unix://{sock}", "stop", "-t", "10", *ids], capture_output=True,
                           timeout=120)
        _stop_pid(root / "docker.pid", timeout=60)
        stopped.append("dockerd")
    if purge:
        exec_root = EXEC_BASE / name
        for p in (exec_root, root):
            if p.exists():
                # overlay mounts of a dead daemon may linger; unmount before deleting
                subprocess.run(["sh", "-c", 'grep -o " $0[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l',
                                str(p)], capture_output=True, timeout=60)
                if p == root:
                    purge_root(p)
                else:
                    shutil.rmtree(p, ignore_errors=True)
        shutil.rmtree(client_dir(name), ignore_errors=True)
    return stopped


def status(name: str = "sandbox", ssh_port: int = 2222) -> dict[str, object]:
    """State of a sandbox without changing it: which daemons run, whether the engine answers.

    Returns:
        a dict with ``dockerd`` (pid or None), ``docker_version`` (or None), ``sshd`` (pid or None),
        ``ssh_listening`` (bool), and the paths of :class:`SandboxInfo`.
    """
    inf = info(name, ssh_port)
    return {
        "name": name,
        "dockerd": _pid_alive(inf.root / "docker.pid"),
        "docker_version": _docker_ok(inf.root / "docker.sock"),
        "sshd": _pid_alive(inf.root / "ssh" / "sshd.pid"),
        "ssh_listening": _port_open(ssh_port),
        "docker_host": inf.docker_host,
        "identity_file": str(inf.identity_file),
        "known_hosts": str(inf.known_hosts),
        "data_dir": str(inf.data_dir),
        "state_dir": str(inf.state_dir),
    }
