"""BuildKit builds: which docker client can run one, the streamed build itself, and the CA bundle it mounts.

The Dockerfiles use BuildKit mounts (the proxy's CA bundle as a ``--secret``, pip's cache as a cache mount, lock
files as bind mounts) so that the CA bundle never lands in a layer and a rebuild downloads nothing. The docker SDK
(docker-py) only drives the legacy builder, which has neither secrets nor mounts
(https://github.com/docker/docker-py/issues/2230), so BuildKit builds run the docker CLI as a subprocess
(``docker buildx build`` where buildx is installed, else a pre-23 client with ``DOCKER_BUILDKIT=1``, e.g. Debian's
``/usr/bin/docker`` 20.10) with its plain progress streamed through rich; the argv come from
:mod:`eagle3ops.commands.images`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from eagle3ops import executor
from eagle3ops.commands import images as ic
from eagle3ops.config.images import ImageError

DEFAULT_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


class BuildFailed(ImageError):
    """``docker build`` exited non-zero. ``log_tail`` holds the last lines of its output, ``log_path`` the full log."""

    def __init__(self, message: str, log_tail: str = "", log_path: Path | None = None, returncode: int = 1):
        super().__init__(message)
        self.log_tail = log_tail
        self.log_path = log_path
        self.returncode = returncode


def _client_version(cli: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run(ic.client_version(cli), capture_output=True, text=True,
                             timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.match(r"(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def buildkit_command() -> tuple[list[str], dict[str, str]]:
    """The argv prefix and extra env of a BuildKit-capable ``docker build`` on this machine.

    Order: ``$EAGLE3OPS_DOCKER_CLI`` (a docker binary), then ``docker buildx build`` if buildx is installed, then
    the first docker client older than 23.0 (which still has BuildKit built in: ``DOCKER_BUILDKIT=1 docker
    build``) among ``docker`` on PATH and ``/usr/bin/docker`` (Debian's docker.io).

    Raises:
        ImageError: no BuildKit-capable client found (install docker-buildx, or Debian's docker.io client).
    """
    env = {"DOCKER_BUILDKIT": "1"}
    candidates = [os.environ.get("EAGLE3OPS_DOCKER_CLI"), shutil.which("docker"), "/usr/bin/docker"]
    clis = [c for c in dict.fromkeys(candidates) if c and Path(c).exists()]
    for cli in clis:
        if subprocess.run(ic.buildx_probe(cli), capture_output=True).returncode == 0:
            return [cli, "buildx", "build", "--load"], env
    for cli in clis:
        v = _client_version(cli)
        if v is not None and v < (23, 0):
            return [cli, "build"], env
    raise ImageError(
        "no BuildKit-capable docker client: install the buildx plugin (docker-buildx) or use a docker client < 23 "
        f"(Debian's docker.io); tried {', '.join(clis) or 'docker'}. Set EAGLE3OPS_DOCKER_CLI to pick one."
    )


_SPACES = re.compile(r"\s{2,}")
_OUTPUT = re.compile(r"^#\d+ \d+\.\d+ ")  # a step's own output line (plain progress: "#N <seconds> text")


def _stream_build(argv: list[str], env: dict[str, str], log_path: Path, quiet: bool = False) -> int:
    """Run a ``docker build`` with ``--progress=plain``, echoing step starts/ends through rich and the full output
    to ``log_path``. Returns the exit status."""
    from rich.console import Console
    from rich.text import Text

    console = Console(stderr=True, highlight=False)
    step = re.compile(r"^#\d+ (\[.*|DONE.*|CACHED|ERROR.*|naming to .*|writing image .*)$")
    with log_path.open("w") as log, console.status("docker build …") as status:
        proc = executor.local().popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **env}, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            line = line.rstrip()
            status.update(Text(f"docker build: {line[:110]}"))
            if not quiet and (step.match(line) or _OUTPUT.match(line)) and "━" not in line:
                console.print("  " + _SPACES.sub(" ", line), markup=False, soft_wrap=True)
        return proc.wait()


def buildkit_build(
    context: Path,
    tag: str,
    *,
    dockerfile: str = "Dockerfile",
    build_args: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    ca_bundle: Path | None = None,
    log_path: Path | None = None,
    quiet: bool = False,
    extra_tags: Sequence[str] = (),
    no_cache: bool = False,
) -> tuple[str, float]:
    """Build ``context`` with BuildKit (host network, CA bundle as secret ``ca``). Returns (image id, seconds).

    Raises:
        BuildFailed: non-zero exit; the message carries the failing step's output tail.
        ImageError: the CA bundle path does not exist, or no BuildKit client.
    """
    prefix, env = buildkit_command()
    with tempfile.TemporaryDirectory(prefix="e3img-") as tmp:
        iid = Path(tmp) / "iid"
        if ca_bundle is not None:
            ca_bundle = Path(ca_bundle)
            if not ca_bundle.is_file():
                raise ImageError(f"CA bundle {ca_bundle} not found (pass --ca-bundle PATH or --no-ca-bundle)")
        argv = ic.buildkit_build(prefix, context=context, dockerfile=dockerfile, tag=tag, iidfile=iid,
                                 extra_tags=extra_tags, no_cache=no_cache, build_args=build_args, labels=labels,
                                 ca_bundle=ca_bundle)
        log_path = log_path or Path(tempfile.gettempdir()) / f"eagle3ops-build-{re.sub(r'[^A-Za-z0-9.-]+', '_', tag)}.log"
        t0 = time.monotonic()
        rc = _stream_build(argv, env, log_path, quiet=quiet)
        seconds = time.monotonic() - t0
        if rc != 0:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
            raise BuildFailed(f"docker build of {tag} failed (exit {rc}); full log: {log_path}\n{tail}", tail,
                              log_path, rc)
        return iid.read_text().strip(), seconds


def default_ca_bundle() -> Path | None:
    """``$EAGLE3OPS_CA_BUNDLE`` if set (empty = none), else the system bundle when it exists."""
    env = os.environ.get("EAGLE3OPS_CA_BUNDLE")
    if env is not None:
        return Path(env) if env else None
    return DEFAULT_CA_BUNDLE if DEFAULT_CA_BUNDLE.is_file() else None
