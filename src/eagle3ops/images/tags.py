"""Content inputs, content tag and labels of an image definition; the jinja2 render of its build args and env.

**Content tag** ``<name>:<vllm>-<speculators>-<12 hex>``: the hex is the start of a sha256 over the build inputs
(:func:`content_inputs`): the base image's digest (or, where no digest is known, its id on the building engine),
the pins, the lock bytes, the patch bytes of the profile's series (each ``series`` file and every patch it names,
in order), the Dockerfile and every other file of the build context that goes into the image (``src/``,
``pyproject.toml``, ``images/pipeline/``), the rendered build args and env, and the eagle3ops version. Nothing
time-dependent (no ``created`` date, no git commit) enters the hash, so the same inputs always give the same tag
and one changed byte of a patch gives a new one. The git commit goes into the
``org.opencontainers.image.revision`` label only.

Pure over the repository's files, except :func:`base_identity`, which asks the docker engine for the base's id when
the definition pins no digest and no ``base_id`` is given, and :func:`git_revision` (local git, for a label).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

from eagle3ops.config.images import (
    REPO_ROOT,
    BaseRef,
    ImageDef,
    ImageError,
    ProfileSpec,
    load_def,
)
from eagle3ops.patches.errors import SeriesError
from eagle3ops.patches.series import read_series_file

LABEL_PREFIX = "io.eagle3ops"
#: Pipeline ``VERIFY`` build arg: probes (reuse passes with byte-identical inputs), probes-fresh, apply-only.
VERIFY_MODES = ("probes", "probes-fresh", "apply-only")
OCI = "org.opencontainers.image"


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


def base_identity(defn: ImageDef, base_image: str | None = None, client: Any = None,
                  own: BaseRef | None = None) -> dict[str, str]:
    """What identifies the base: ``{"image": ref, "digest"| "id": ...}``.

    ``own`` is the base the profile builds on when ``base_image`` is not given (:meth:`ImageDef.base_for`; default:
    the definition's ``base``). Its digest is used when the base is that reference; otherwise the local engine's
    ``RepoDigests`` (when the image came from a registry) or its image id (a locally built base).

    Raises:
        ImageError: the base is neither digest-pinned nor present on the engine (build or load it first).
    """
    own = own or defn.base
    ref = base_image or own.image
    if ref == own.image and own.digest:
        return {"image": ref, "digest": own.digest}
    from eagle3ops.images.engine import docker_client  # the engine only here

    client = client or docker_client()
    import docker.errors

    try:
        img = client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise ImageError(
            f"base image {ref} is not on the docker engine and has no digest in images/{_short(defn)}.yaml; "
            f"load it, pass --base-image, or build the local stand-in with `make base` in a checkout of eagle3ops"
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
    base = base_id or base_identity(defn, base_image, client, defn.base_for(spec))
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

    Pipeline images: ``io.eagle3ops.verified`` says which checks and probes ran at build time and which are deferred
    to the host (``build:pins,apply,compile,import,manifest;host:probes``, from ``checks``: :func:`checks_plan`;
    :func:`eagle3ops.imagecheck.parse_verified` reads it), ``io.eagle3ops.verify-mode`` the ``VERIFY`` mode. The
    label keeps its old name although "verify" now means only comparing with a recorded identity (ARCHITECTURE.md
    "Conventions"): deployed hosts and built images carry and read it, and its values name each check and probe."""
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
