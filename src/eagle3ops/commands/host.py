"""Plain host commands (files, disk, GPUs) as argv lists; POSIX tools only, no shell strings."""

from __future__ import annotations


def mkdir_p(path: str) -> list[str]:
    """Create a directory and its parents."""
    return ["mkdir", "-p", path]


def mkdir_atomic(path: str) -> list[str]:
    """Create one directory, failing if it exists: the atomic test-and-set behind the deploy lock."""
    return ["mkdir", path]


def write_file(path: str) -> list[str]:
    """Write standard input to ``path`` (``tee``; the caller discards stdout)."""
    return ["tee", path]


def append_file(path: str) -> list[str]:
    """Append standard input to ``path``."""
    return ["tee", "-a", path]


def cat(path: str) -> list[str]:
    """Print a file."""
    return ["cat", path]


def cat_if_exists(path: str) -> list[str]:
    """Print a file, or nothing on stdout when it is missing (``find`` then exits 1 with a message on stderr: run
    it with ``check=False`` and test stdout)."""
    return ["find", path, "-maxdepth", "0", "-type", "f", "-exec", "cat", "{}", "+"]


def tail_from(path: str, line: int) -> list[str]:
    """Print ``path`` from 1-based line ``line`` on (journal polling)."""
    return ["tail", "-n", f"+{line}", path]


def line_count(path: str) -> list[str]:
    """``wc -l``: number of lines of a file (first field of stdout)."""
    return ["wc", "-l", "--", path]


def test_dir(path: str) -> list[str]:
    """Exit 0 when ``path`` is a directory."""
    return ["test", "-d", path]


def mv(src: str, dest: str) -> list[str]:
    """Rename ``src`` to ``dest`` (no overwrite prompts)."""
    return ["mv", "-f", "--", src, dest]


def rm_rf(path: str) -> list[str]:
    """Remove a path recursively."""
    return ["rm", "-rf", "--", path]


def free_bytes(path: str) -> list[str]:
    """POSIX ``df -Pk``: free 1024-byte blocks of the filesystem holding ``path`` (4th column of line 2)."""
    return ["df", "-Pk", path]


def gpu_compute_pids() -> list[str]:
    """``nvidia-smi``: the pids of processes holding GPU memory, one per line (empty: every GPU released)."""
    return ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"]


def gpu_list() -> list[str]:
    """``nvidia-smi -L``: one line per visible GPU."""
    return ["nvidia-smi", "-L"]


def gpu_memory_and_capability() -> list[str]:
    """``nvidia-smi``: one ``<memory.total MiB>, <compute_cap>`` line per GPU (e.g. ``97887, 12.0``); parse with
    :func:`parse_gpu_memory_and_capability`."""
    return ["nvidia-smi", "--query-gpu=memory.total,compute_cap", "--format=csv,noheader,nounits"]


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


def cpuinfo() -> list[str]:
    """The host's ``/proc/cpuinfo`` (CPU feature flags: which attention kernel vLLM's CPU build will take)."""
    return ["cat", "/proc/cpuinfo"]


def whoami() -> list[str]:
    """The SSH login user (for lock and audit entries)."""
    return ["id", "-un"]


def ls(path: str) -> list[str]:
    """List a directory, one name per line."""
    return ["ls", "-1", path]


def parse_df_free_bytes(output: str) -> int:
    """Free bytes from ``df -Pk`` output.

    Raises:
        ValueError: output is not in POSIX ``df -P`` format.
    """
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    if len(lines) < 2:
        raise ValueError(f"unexpected df output: {output!r}")
    return int(lines[-1].split()[3]) * 1024


def file_sizes(path: str) -> list[str]:
    """POSIX ``find … -exec wc -c``: the size in bytes of every regular file under ``path``, one ``<bytes> <path>``
    line each (plus a ``total`` line per batch); nothing on stdout and exit 1 when ``path`` does not exist (run it
    with ``check=False``). Parse with :func:`parse_file_sizes`."""
    return ["find", path, "-type", "f", "-exec", "wc", "-c", "{}", "+"]


def parse_file_sizes(output: str, root: str) -> dict[str, int]:
    """``{path relative to root: bytes}`` from :func:`file_sizes` output (``total`` lines dropped)."""
    out: dict[str, int] = {}
    prefix = root.rstrip("/") + "/"
    for line in output.splitlines():
        size, _, path = line.strip().partition(" ")
        if path.startswith(prefix) and size.isdigit():
            out[path[len(prefix):]] = int(size)
    return out
