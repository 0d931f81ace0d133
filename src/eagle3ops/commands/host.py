"""Plain host commands (files, disk, GPUs) as argv lists; POSIX tools only, no shell strings."""

from __future__ import annotations
from eagle3ops.commands.types import Change, Read


def mkdir_p(path: str) -> Change:
    """Create a directory and its parents."""
    return Change(["mkdir", "-p", path])


def mkdir_atomic(path: str) -> Change:
    """Create one directory, failing if it exists: the atomic test-and-set behind the deploy lock."""
    return Change(["mkdir", path])


def write_file(path: str) -> Change:
    """Write standard input to ``path`` (``tee``; the caller discards stdout)."""
    return Change(["tee", path])


def write_private_file(path: str) -> Change:
    """Write standard input to ``path`` readable by the SSH user only (``tee`` under ``umask 077``: a new file is
    mode 0600; the caller discards stdout): for files that must keep a secret, e.g. a plan whose release change or
    stage environment carries a token."""
    return Change(["sh", "-c", 'umask 077 && exec tee "$1"', "eagle3ops-write", path])


def append_file(path: str) -> Change:
    """Append standard input to ``path``."""
    return Change(["tee", "-a", path])


def http_status(url: str, timeout_s: int = 5) -> Read:
    """``curl -s -o /dev/null -w %{http_code} --max-time T URL``: the HTTP status of one GET, printed (``000`` when
    nothing answered; exit 127 when the host has no ``curl``). Read-only: ``status``/``recover`` ask serving's
    ``/health`` on the host's loopback with it."""
    return Read(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", str(timeout_s), url])


def http_body(url: str, timeout_s: int = 5) -> Read:
    """``curl -s -f --max-time T URL``: the body of one GET, printed (exit 22 on an HTTP error status, 127 when
    the host has no ``curl``). Read-only: a window's preflight reads serving's ``/version`` with it."""
    return Read(["curl", "-s", "-f", "--max-time", str(timeout_s), url])


def quiet_shell_probe() -> Read:
    """``true``: prints nothing on a host whose login shell is quiet for non-interactive SSH commands; whatever it
    prints is what the shell's start-up files print before every command (:meth:`eagle3ops.remote.Remote`'s first
    contact)."""
    return Read(["true"])


def login_shell() -> Read:
    """``printenv SHELL``: the SSH user's login shell (which start-up files it reads for SSH commands)."""
    return Read(["printenv", "SHELL"])


def cat(path: str) -> Read:
    """Print a file."""
    return Read(["cat", path])


def cat_if_exists(path: str) -> Read:
    """Print a file, or nothing on stdout when it is missing (``find`` then exits 1 with a message on stderr: run
    it with ``check=False`` and test stdout)."""
    return Read(["find", path, "-maxdepth", "0", "-type", "f", "-exec", "cat", "{}", "+"])


def tail_from(path: str, line: int) -> Read:
    """Print ``path`` from 1-based line ``line`` on (journal polling)."""
    return Read(["tail", "-n", f"+{line}", path])


def line_count(path: str) -> Read:
    """``wc -l``: number of lines of a file (first field of stdout)."""
    return Read(["wc", "-l", "--", path])


def exists(path: str) -> Read:
    """``test -e PATH``: exits 0 when the path exists (a file, a directory, a socket...)."""
    return Read(["test", "-e", path])


def test_dir(path: str) -> Read:
    """Exit 0 when ``path`` is a directory."""
    return Read(["test", "-d", path])


def mv(src: str, dest: str) -> Change:
    """Rename ``src`` to ``dest`` (no overwrite prompts)."""
    return Change(["mv", "-f", "--", src, dest])


def rm_rf(path: str) -> Change:
    """Remove a path recursively."""
    return Change(["rm", "-rf", "--", path])


def free_bytes(path: str) -> Read:
    """POSIX ``df -Pk``: free 1024-byte blocks of the filesystem holding ``path`` (4th column of line 2)."""
    return Read(["df", "-Pk", path])


def gpu_compute_pids() -> Read:
    """``nvidia-smi``: the pids of processes holding GPU memory, one per line (empty: every GPU released)."""
    return Read(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"])


def gpu_list() -> Read:
    """``nvidia-smi -L``: one line per visible GPU."""
    return Read(["nvidia-smi", "-L"])


def gpu_memory_and_capability() -> Read:
    """``nvidia-smi``: one ``<memory.total MiB>, <compute_cap>`` line per GPU (e.g. ``97887, 12.0``); parse with
    :func:`parse_gpu_memory_and_capability`."""
    return Read(["nvidia-smi", "--query-gpu=memory.total,compute_cap", "--format=csv,noheader,nounits"])


def parse_gpu_memory_and_capability(output: str) -> list[tuple[int, str]]:
    """``[(memory.total in MiB, compute_cap)]``, one per GPU, from :func:`gpu_memory_and_capability` output.

    Raises:
        ValueError: a line is not ``<integer>, <major>.<minor>`` (the message quotes it).
    """
    gpus = []
    for line in output.strip().splitlines():
        mem, _, cap = (p.strip() for p in line.partition(","))
        if not mem.isdigit() or not cap.replace(".", "", 1).isdigit() or "." not in cap:
            raise ValueError(f"unexpected nvidia-smi line {line!r} (want `<memory.total MiB>, <compute_cap>`)")
        gpus.append((int(mem), cap))
    return gpus


def cpuinfo() -> Read:
    """The host's ``/proc/cpuinfo`` (CPU feature flags: which attention kernel vLLM's CPU build will take)."""
    return Read(["cat", "/proc/cpuinfo"])


def machine() -> Read:
    """``uname -m``: the host's CPU architecture as the kernel names it (``x86_64``, ``aarch64``)."""
    return Read(["uname", "-m"])


def whoami() -> Read:
    """The SSH login user (for lock and audit entries)."""
    return Read(["id", "-un"])


def ls(path: str) -> Read:
    """List a directory, one name per line."""
    return Read(["ls", "-1", path])


def parse_df_free_bytes(output: str) -> int:
    """Free bytes from ``df -Pk`` output.

    Raises:
        ValueError: output is not in POSIX ``df -P`` format.
    """
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    if len(lines) < 2:
        raise ValueError(f"unexpected df output: {output!r}")
    return int(lines[-1].split()[3]) * 1024


def file_sizes(path: str) -> Read:
    """POSIX ``find … -exec wc -c``: the size in bytes of every regular file under ``path``, one ``<bytes> <path>``
    line each (plus a ``total`` line per batch); nothing on stdout and exit 1 when ``path`` does not exist (run it
    with ``check=False``). Parse with :func:`parse_file_sizes`."""
    return Read(["find", path, "-type", "f", "-exec", "wc", "-c", "{}", "+"])


def parse_file_sizes(output: str, root: str) -> dict[str, int]:
    """``{path relative to root: bytes}`` from :func:`file_sizes` output (``total`` lines dropped)."""
    out: dict[str, int] = {}
    prefix = root.rstrip("/") + "/"
    for line in output.splitlines():
        size, _, path = line.strip().partition(" ")
        if path.startswith(prefix) and size.isdigit():
            out[path[len(prefix):]] = int(size)
    return out


def window_results(windows_dir: str) -> Read:
    """Print every window's ``result.json`` under ``windows_dir`` (``<state_dir>/windows``), concatenated (one JSON
    document after another; :func:`eagle3ops.speculate.restarts.parse_results` splits them). Nothing when there is
    none (``find`` prints nothing; run with ``check=False``: a missing dir exits 1)."""
    return Read(["find", windows_dir, "-mindepth", "2", "-maxdepth", "2", "-type", "f", "-name", "result.json",
                 "-exec", "cat", "{}", "+"])
