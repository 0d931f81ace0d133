"""The stand-in pipeline environment of the venv runtime's tests: a SMALL venv tarball, NOT the real
pipeline environment. It holds this checkout's ``eagle3ops`` (so the supervisor on the host is the product's own),
the few pure-Python/compiled packages the supervisor and the config need, copied from the driver venv (pydantic,
pydantic-core, annotated-types, typing-extensions, typing-inspection, PyYAML; same CPython minor version required),
and stand-in stages (:mod:`eagle3ops_dev.standin_stages`) behind ``bin/eagle3ops-stage``. No torch, vLLM or
speculators: its stages touch no model.

Built once per machine and content (a key over the interpreter, the sources and the copied packages), cached under
``.cache/standin-env/`` like images; the tarball is deterministic (sorted entries, mtime 0, uid/gid 0, gzip mtime 0),
so its sha256 names it (``venv:sha256:<hex>``). Its first entry is the stand-in marker
(:data:`eagle3ops.config.standin.STANDIN_ENV_MARKER`, :data:`MARKER`): ``deploy --env-tarball`` refuses it on a host
that is not a sandbox.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

#: The name said wherever this environment appears (logs, test ids): it is a stand-in.
NAME = "eagle3ops stand-in pipeline environment"
#: Top-level modules and packages copied from the driver venv (what ``eagle3ops.supervisor`` and the config import).
DEPS = ("pydantic", "pydantic_core", "annotated_types", "typing_extensions", "typing_inspection", "yaml")
#: Copied too with ``gate=True``: what the supervisor's speculation gate imports (its measurement's HTTP client and
#: metrics parser, its decision's statistics; numpy with the wheel's bundled libraries folder, about 70 MB, so only
#: the tests that run a gate on a venv host ask for it).
GATE_DEPS = ("httpx", "httpcore", "h11", "anyio", "idna", "certifi", "prometheus_client", "numpy")
#: Seconds ``python -m venv`` may take.
VENV_TIMEOUT_S = 120

#: The stand-in marker's content (:data:`eagle3ops.config.standin.STANDIN_ENV_MARKER`, the tarball's first entry).
MARKER = {"what": NAME, "why": "its stages (eagle3ops_dev.standin_stages) write manifests without touching a model; "
                               "no torch, vLLM or speculators"}

STAGE_SH = '#!/bin/sh\n# stand-in stages (eagle3ops_dev.standin_stages), not the real pipeline\nexec "$(dirname "$0")/python" -m eagle3ops_standin_stages "$@"\n'


def _sources(gate: bool = False) -> list[tuple[str, Path]]:
    """(path inside site-packages, local path) of everything copied, files only, sorted; ``gate``: with
    :data:`GATE_DEPS`."""
    import importlib

    import eagle3ops

    out: list[tuple[str, Path]] = []

    def add_tree(prefix: str, root: Path) -> None:
        for f in sorted(root.rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc":
                out.append((f"{prefix}/{f.relative_to(root).as_posix()}", f))

    add_tree("eagle3ops", Path(eagle3ops.__file__).parent)
    for name in DEPS + (GATE_DEPS if gate else ()):
        mod = importlib.import_module(name)
        p = Path(mod.__file__ or "")
        if p.name == "__init__.py":
            add_tree(name, p.parent)
            if (p.parent.parent / f"{name}.libs").is_dir():  # a manylinux wheel's bundled shared libraries
                add_tree(f"{name}.libs", p.parent.parent / f"{name}.libs")
        else:
            out.append((p.name, p))
    out.append(("eagle3ops_standin_stages.py", Path(__file__).with_name("standin_stages.py")))
    return sorted(out)


def cache_dir() -> Path:
    """Where built tarballs are kept: ``<repo>/.cache/standin-env``."""
    from eagle3ops_dev.sandbox.host import repo_root

    return repo_root() / ".cache" / "standin-env"


def build(python: str = "/usr/bin/python3", cache: Path | None = None, gate: bool = False) -> tuple[Path, str]:
    """The stand-in environment's tarball, built against ``python`` (the host's ``venv_python``), from the cache when
    its key matches; ``gate``: with what the supervisor's speculation gate imports (:data:`GATE_DEPS`). Returns
    ``(tarball path, "venv:sha256:<hex>")``.

    Raises:
        RuntimeError: ``python`` is not the driver's CPython minor version (the copied compiled package would not
            load), or ``python -m venv`` failed (its output).
    """
    ver = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                         text=True, timeout=30)
    minor = ver.stdout.strip()
    if ver.returncode or minor != "%d.%d" % sys.version_info[:2]:
        raise RuntimeError(f"{NAME}: {python} is Python {minor or '?'} ({ver.stderr.strip()[-200:]}); the copied "
                           f"packages need {sys.version_info[0]}.{sys.version_info[1]}")
    from eagle3ops.config.standin import STANDIN_ENV_MARKER

    srcs = _sources(gate)
    marker = json.dumps(MARKER, indent=2, sort_keys=True) + "\n"
    key = hashlib.sha256(f"{python} {minor}\n{STAGE_SH}\n{STANDIN_ENV_MARKER}\n{marker}".encode())
    for rel, f in srcs:
        key.update(rel.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    tgz = cache / f"{key.hexdigest()[:24]}.tar.gz"
    if not tgz.is_file():
        with tempfile.TemporaryDirectory(prefix="standin-env-") as tmp:
            env = Path(tmp) / "env"
            cp = subprocess.run([python, "-m", "venv", "--without-pip", str(env)], capture_output=True, text=True,
                                timeout=VENV_TIMEOUT_S)
            if cp.returncode:
                raise RuntimeError(f"{NAME}: `{python} -m venv` failed: {(cp.stderr or cp.stdout).strip()[-400:]}")
            site = env / "lib" / f"python{minor}" / "site-packages"
            for rel, f in srcs:
                (site / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, site / rel)
            (env / "bin" / "eagle3ops-stage").write_text(STAGE_SH)
            (env / "bin" / "eagle3ops-stage").chmod(0o755)
            (env / STANDIN_ENV_MARKER).write_text(marker)
            part = tgz.with_suffix(".part")
            # numpy's 70 MB at gzip's level 9 took 30 s on 2 cores; level 1, a few (the tarball ~25 % larger)
            part.write_bytes(_tar_bytes(env, first=STANDIN_ENV_MARKER, level=1 if gate else 9))
            part.replace(tgz)
    digest = hashlib.sha256(tgz.read_bytes()).hexdigest()
    return tgz, f"venv:sha256:{digest}"


def _tar_bytes(root: Path, first: str | None = None, level: int = 9) -> bytes:
    """A deterministic gzip tar of ``root``'s contents (sorted, mtime 0, owner 0:0, symlinks kept); the file
    ``first`` (relative to ``root``) leads, so a reader of the head finds it; ``level``: gzip's compression level."""
    raw = io.BytesIO()
    lead = [root / first] if first else []
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in lead + sorted(q for q in root.rglob("*") if q not in lead):
            if "__pycache__" in p.parts:
                continue
            info = tar.gettarinfo(str(p), arcname=p.relative_to(root).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if info.isfile():
                with p.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=level) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def standin_server_pids(port: int) -> list[int]:
    """The pids of the stand-in OpenAI server processes (``tests/data/standin_openai_server.py``) listening on
    ``port``, read from ``/proc`` (the sandbox host shares this machine): how the venv tests and
    ``benchmarks/venv-real-window/venv_real_window.py`` see whether a window stopped and restored the serving process."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if b"standin_openai_server" in cmd and f"--port\0{port}".encode() in cmd:
                out.append(int(d.name))
    return out
