"""Build an image definition and tag it with its content tag (:func:`build_image`): the build context, the checks
plan and labels, the serving image's patches as validated diffs (:func:`write_serving_patches`), and the choice of
builder: BuildKit (:mod:`eagle3ops.images.buildkit`) for Dockerfiles with mounts, the docker SDK's legacy builder
for those without (the serving image)."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3ops.config.images import (
    REPO_ROOT,
    ImageDef,
    ImageError,
    ProfileSpec,
    load_def,
)
from eagle3ops.images.buildkit import BuildFailed, buildkit_build
from eagle3ops.images.facts import checks_plan
from eagle3ops.images.engine import docker_client
from eagle3ops.images.tags import (
    LABEL_PREFIX,
    _extra_args,
    _short,
    _tag,
    content_inputs,
    image_labels,
    probe_key_salt,
    render,
)

#: The local CPU base's tag (stand-in for ``vllm/vllm-openai:v0.16.0``, built by the development harness:
#: ``make base``): the only base a profile with a stand-in series may build on.
LOCAL_BASE_TAG = "eagle3ops/vllm-openai-local:v0.16.0"


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


#: ``vllm/vllm-openai:v0.16.0`` → ``0.16.0``: the vLLM release a base reference's tag names (upstream's tag scheme)
_VLLM_TAG = re.compile(r"(?:^|/)vllm-openai[^:/]*:v?(\d+\.\d+\.\d+)$")


def base_vllm_version(ref: str, labels: dict[str, str]) -> str | None:
    """The vLLM release base ``ref`` carries, when it says so: the ``io.eagle3ops.stand-in-for`` label of a local
    stand-in base (``vllm/vllm-openai:v0.32.0``), else the tag of a ``vllm/vllm-openai``-named reference
    (``vllm/vllm-openai:v0.16.0`` → ``"0.16.0"``; upstream tags each release ``v<version>``). ``None``: the base does
    not say (a private tag such as ``registry.example/vllm:prod``), which is not judged."""
    for text in (labels.get(f"{LABEL_PREFIX}.stand-in-for", ""), ref):
        m = _VLLM_TAG.search(text)
        if m:
            return m.group(1)
    return None


def check_base_version(name: str, pname: str, spec: ProfileSpec, base_ref: str, base_labels: dict[str, str]) -> None:
    """Refuse a base whose vLLM release (:func:`base_vllm_version`) is not the profile's ``vllm`` pin: a vLLM 0.32
    profile on the 0.16 base would build, then serve 0.16 under a 0.32 label (every window compares the label's
    profile with ``/version``).

    Raises:
        ImageError: naming the base, both versions and the fix (``--base-image`` or ``profiles.<p>.base``).
    """
    want = spec.pins.get("vllm")
    have = base_vllm_version(base_ref, base_labels)
    if want and have and have != want:
        raise ImageError(
            f"images/{name}.yaml profile {pname} pins vLLM {want}, but its base {base_ref} is vLLM {have}: pass "
            f"--base-image with a vLLM {want} base (e.g. vllm/vllm-openai:v{want}), or set profiles.{pname}.base "
            f"in images/{name}.yaml"
        )


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


@dataclass
class BuildPlan:
    """What :func:`build_image` will build, decided before anything is built (``deploy --dry-run`` prints it).

    Attributes:
        name: image definition (``pipeline``/``serving``); profile: the patch profile's name.
        base: the base image reference; base_id: its id on the build engine (hashed into the tag).
        tag: the content tag the image gets; build_args: every ``--build-arg``; labels: every label.
        dockerfile: the definition's Dockerfile (``.j2``: rendered, built by the SDK's legacy builder; else BuildKit).
        exists: whether the build engine already holds ``tag`` (a build then reuses every cached step).
        base_labels: the base's labels on the build engine (empty when it is not there): the built image inherits
            them (a stand-in base's ``io.eagle3ops.stand-in-for`` included), see :attr:`image_labels`.
    """

    name: str
    profile: str
    base: str
    base_id: str
    tag: str
    build_args: dict[str, str]
    labels: dict[str, str]
    dockerfile: str
    exists: bool
    defn: ImageDef = field(repr=False, compare=False)
    spec: ProfileSpec = field(repr=False, compare=False)
    inputs: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    variables: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    base_labels: dict[str, str] = field(repr=False, compare=False, default_factory=dict)

    @property
    def image_labels(self) -> dict[str, str]:
        """The labels the built image will carry: the base's, then the build's own over them (an image's config
        inherits its base's labels; a ``LABEL`` of the same key replaces it)."""
        return {**self.base_labels, **self.labels}

    def lines(self) -> list[str]:
        """The plan as text lines (base, profile, tag, builder, build args)."""
        builder = "docker SDK (legacy builder)" if self.dockerfile.endswith(".j2") else "BuildKit"
        out = [f"# build {self.name}: base {self.base} ({self.base_id[:19] or 'not on the build engine'}), "
               f"profile {self.profile}",
               f"#   tag {self.tag} ({'already on the build engine' if self.exists else 'new'}), "
               f"{self.dockerfile} with {builder}"]
        out += [f"#   --build-arg {k}={v}" for k, v in self.build_args.items()]
        return out


def plan_build(
    name: str = "pipeline",
    base_image: str | None = None,
    profile: str | None = None,
    *,
    root: Path = REPO_ROOT,
    verify: str = "probes",
    probes_module: str | None = None,
    engine_checks: str = "auto",
) -> BuildPlan:
    """Decide a build without building: definition, profile, base, content tag, build args and labels (the same
    values :func:`build_image` then builds with). Reads the definition files and asks the build engine about the
    base (read-only).

    Raises:
        ImageError: bad definition or profile, a stand-in profile on a non-local base, or a missing base.
    """
    defn = load_def(name, root / "images")
    pname, spec = defn.profile(profile)
    base_ref = base_image or defn.base_for(spec).image
    if spec.standin and base_ref != LOCAL_BASE_TAG:
        raise ImageError(
            f"images/{name}.yaml profile {pname} carries a stand-in series for the sandbox's CPU build; it is built "
            f"only on {LOCAL_BASE_TAG}, not on {base_ref} (use a profile without stand-in series for production)"
        )
    client = docker_client()
    inputs = content_inputs(defn, pname, base_image, root=root, client=client,
                            extra_build_args=_extra_args(defn, verify, probes_module, engine_checks))
    tag = _tag(defn, inputs)
    variables = {"profile": pname, "pins": spec.pins, "base": {**inputs["base"], "image": base_ref}}
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
    try:
        client.images.get(tag)
        exists = True
    except Exception:  # noqa: BLE001 - docker.errors.ImageNotFound (docker is imported lazily)
        exists = False
    try:
        base_labels = dict(client.images.get(variables["base"]["image"]).labels or {})
    except Exception:  # noqa: BLE001 - not on the engine (a digest-pinned base pulled at build time): none known
        base_labels = {}
    check_base_version(name, pname, spec, base_ref, base_labels)
    return BuildPlan(name=name, profile=pname, base=variables["base"]["image"],
                     base_id=str(inputs["base"].get("id") or ""), tag=tag, build_args=build_args, labels=labels,
                     dockerfile=defn.dockerfile, exists=exists, defn=defn, spec=spec, inputs=inputs,
                     variables=variables, base_labels=base_labels)


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
    plan: BuildPlan | None = None,
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
            else deferred to the target host: ``eagle3ops probe HOST``, run by ``deploy``), ``build`` or ``host``.
            Labelled ``io.eagle3ops.verified`` (``build:...;host:...``).
        plan: the :class:`BuildPlan` from :func:`plan_build` to build (then ``name``, ``base_image``, ``profile``,
            ``verify``, ``probes_module`` and ``engine_checks`` are ignored); default: planned here.

    Returns:
        BuiltImage(tag, image_id, size, seconds, labels).

    Raises:
        ImageError / BuildFailed: bad definition, missing base, or a failing build step (pin check, patch apply,
        patch probe): the message carries the step's output.
    """
    if plan is None:
        plan = plan_build(name, base_image, profile, root=root, verify=verify, probes_module=probes_module,
                          engine_checks=engine_checks)
    defn, spec, inputs, variables = plan.defn, plan.spec, plan.inputs, plan.variables
    tag, build_args, labels = plan.tag, plan.build_args, plan.labels
    client = docker_client()
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
