"""Versioned, reproducible images: definitions, content tags, labels, builds and inspection.

Each image has a declarative definition in ``images/<name>.yaml`` at the repository root
(:class:`eagle3ops.config.images.ImageDef`, read by :func:`load_def`): base reference (+ digest when known), the
profiles of ``patches/profiles.yaml`` it is built for (pins and patch series come from there; a lock from the
definition), build args and env defaults (jinja2 templates). That folder of YAML files and Dockerfiles
(``REPO_ROOT / "images"``) is data; this package is the code, one job per module:

- :mod:`~eagle3ops.images.tags`: content inputs, content tag, labels, the jinja2 render of build args (pure but
  for the base's id on the engine when no digest is known);
- :mod:`~eagle3ops.images.buildkit`: the BuildKit-capable client, the streamed build, the CA bundle;
- :mod:`~eagle3ops.images.build`: :func:`build_image` (context, checks plan, labels, BuildKit or the SDK's legacy
  builder) and the serving image's patches;
- :mod:`~eagle3ops.images.facts`: what a base holds (:func:`base_facts`) and the checks plan it implies;
- :mod:`~eagle3ops.images.inspect`: ``image ls``, layer search, human sizes;
- :mod:`~eagle3ops.images.engine`: the build engine's docker SDK client, whether it holds an image.

Dependencies run one way: engine ← tags ← inspect ← facts; buildkit; build (all of them). The stand-in bases (the
debootstrap minbase, the ``local`` and ``upstream`` stand-ins for ``vllm/vllm-openai``, the test stand-in base) are
development harness, built by ``make base`` in a checkout of eagle3ops; only their tag
:data:`LOCAL_BASE_TAG` is here. Command lines come from :mod:`eagle3ops.commands.images`. Callers import from this
package (``from eagle3ops import images``; ``images.build_image(...)``); the names below are its API.
"""

from __future__ import annotations

from eagle3ops.config.images import REPO_ROOT, ImageDef, ImageError, ProfileSpec, load_def
from eagle3ops.images.build import (
    LOCAL_BASE_TAG,
    BuildPlan,
    BuiltImage,
    base_vllm_version,
    build_image,
    check_base_version,
    plan_build,
    write_serving_patches,
)
from eagle3ops.images.buildkit import (
    DEFAULT_CA_BUNDLE,
    BuildFailed,
    buildkit_build,
    buildkit_command,
    default_ca_bundle,
)
from eagle3ops.images.facts import FACTS_CACHE, base_facts, checks_plan
from eagle3ops.images.engine import docker_client
from eagle3ops.images.inspect import ImageInfo, Runner, find_in_layers, human_size, list_images
from eagle3ops.images.tags import (
    LABEL_PREFIX,
    OCI,
    VERIFY_MODES,
    _extra_args,
    _tag,
    base_identity,
    content_hash,
    content_inputs,
    content_tag,
    eagle3ops_version,
    git_revision,
    image_labels,
    patch_digests,
    patch_origins,
    probe_key_salt,
    render,
)

__all__ = [
    # definitions (eagle3ops.config.images)
    "REPO_ROOT", "ImageDef", "ImageError", "ProfileSpec", "load_def",
    # tags
    "LABEL_PREFIX", "OCI", "VERIFY_MODES", "_extra_args", "_tag", "base_identity", "content_hash", "content_inputs",
    "content_tag", "eagle3ops_version", "git_revision", "image_labels", "patch_digests", "patch_origins",
    "probe_key_salt", "render",
    # buildkit and build
    "DEFAULT_CA_BUNDLE", "BuildFailed", "buildkit_build", "buildkit_command", "default_ca_bundle",
    "LOCAL_BASE_TAG", "BuildPlan", "BuiltImage", "base_vllm_version", "build_image", "check_base_version",
    "plan_build", "write_serving_patches",
    # facts
    "FACTS_CACHE", "base_facts", "checks_plan",
    # inspect
    "ImageInfo", "Runner", "docker_client", "find_in_layers", "human_size", "list_images",
]
