"""Image definitions: ``images/<name>.yaml`` validated with pydantic and resolved against the profile registry.

A definition says how one image is built (Dockerfile, build context, base, build args, env) and which patch
profiles it can be built for. A profile itself is defined once, in ``patches/profiles.yaml``
(:mod:`eagle3ops.config.profiles`): the definition refers to it by name and takes from it the version pins
(``requires``; the content tag is ``<name>:<vllm>-<speculators>-<hash>``) and the patch series (``series``, those of
the packages in ``patch_packages``); it adds only what is its own, e.g. the pipeline's hash-pinned lock file.

The content hashing, labels and builds that use a definition are in :mod:`eagle3ops.images`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field, PrivateAttr, field_validator

from eagle3ops.config.base import ConfigError, StrictModel, read_yaml, validate
from eagle3ops.config.profiles import PROFILES_FILE, ProfilesRegistry, load_registry, normalize_name

#: repository root (this file is src/eagle3ops/config/images.py)
REPO_ROOT = Path(__file__).resolve().parents[3]
IMAGES_DIR = REPO_ROOT / "images"
SECTION = "image"
#: the pins every image profile needs: the content tag is ``<name>:<vllm>-<speculators>-<12 hex>``
TAG_PINS = ("vllm", "speculators")


class ImageError(Exception):
    """A definition, input or build problem; the message names the file/field and the fix."""


class ImageDefinitionError(ImageError, ConfigError):
    """An image definition (or the profile registry it refers to) is missing or invalid."""


class BaseRef(StrictModel):
    """The base image: a reference (``repo:tag``) and, when known, the registry digest (``sha256:<64 hex>``)."""

    image: str = Field(..., description="Base image reference `repo:tag`, e.g. `vllm/vllm-openai:v0.16.0`.")
    digest: str | None = Field(
        None, description="Registry digest `sha256:<64 hex>` of the base when known (hashed into the content tag); "
                          "null: the building engine's digest or image id is used."
    )

    @field_validator("digest")
    @classmethod
    def _digest(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", v):
            raise ValueError(f"digest must look like sha256:<64 hex> (or null), got {v!r}")
        return v


class ImageProfile(StrictModel):
    """What an image adds to a profile of ``patches/profiles.yaml`` (the profile's pins and series come from there)."""

    pins: dict[str, str] = Field(
        default_factory=dict,
        description="Version pins the image adds to the profile's `requires` (e.g. `{speculators: 0.3.0}` for a "
                    "serving profile that requires vLLM only: the stack its draft heads are trained with); a package "
                    "the profile already pins must not get another version here.",
    )

    lock: str | None = Field(
        None, description="Hash-pinned requirements lock of this profile's Python packages (path from the repository "
                          "root, e.g. `requirements/pipeline-speculators-0.3.0.lock`); its bytes enter the content tag."
    )
    base: BaseRef | None = Field(
        None, description="The base this profile builds on when it is not the definition's `base` (e.g. "
                          "`{image: vllm/vllm-openai:v0.32.0}` for a vLLM 0.32 profile of a definition whose base is "
                          "the 0.16 image); omitted: the definition's `base`. `--base-image` overrides either."
    )


@dataclass(frozen=True)
class ProfileSpec:
    """One profile as an image is built for it: version pins (the registry's ``requires`` + the definition's
    ``pins``), the lock (from the definition), the patch series dirs (from the registry, relative to the repository
    root, e.g. ``patches/speculators/0.3.0``), ``standin`` (from the registry: build only on the local stand-in
    base) and ``base`` (the profile's own base from the definition, else the definition's; ``None`` only for a spec
    built by hand, read as the definition's)."""

    pins: dict[str, str]
    lock: str | None = None
    series: list[str] = field(default_factory=list)
    standin: bool = False
    base: BaseRef | None = None


class ImageDef(StrictModel):
    """One ``images/<name>.yaml``. ``build_args`` and ``env`` values are jinja2 templates rendered with ``profile``,
    ``pins`` and ``base`` (see :func:`eagle3ops.images.render`)."""

    name: str = Field(..., description="Image repository, e.g. `eagle3ops/pipeline` (the tag is the content tag).")
    title: str = Field(..., description="`org.opencontainers.image.title` label.")
    description: str = Field("", description="`org.opencontainers.image.description` label.")
    dockerfile: str = Field(
        ..., description="Dockerfile from the repository root; a `.j2` one is a jinja2 template rendered before the "
                         "build (variables: base, pins, profile, env, vllm_patches)."
    )
    context: list[str] = Field(
        ..., description="Files and dirs (from the repository root) forming the build context; all but `patches` "
                         "enter the content tag byte by byte (the patches enter through their series)."
    )
    base: BaseRef = Field(..., description="The base image.")
    patch_packages: list[str] | None = Field(
        None, description="Which series of a profile this image applies, by package (`patches/<package>/<version>`): "
                          "e.g. `[vllm]`; omitted: every series of the profile."
    )
    default_profile: str | None = Field(
        None, description="Profile built when none is named; default: the registry's `default`."
    )
    profiles: dict[str, ImageProfile] = Field(
        ..., description="The profiles of `patches/profiles.yaml` this image can be built for, with what the image "
                         "adds to each (`{}` for nothing)."
    )
    build_args: dict[str, str] = Field(default_factory=dict, description="Build args (jinja2 templates).")
    env: dict[str, str] = Field(default_factory=dict, description="Environment defaults of the image (jinja2 templates).")

    _specs: dict[str, ProfileSpec] = PrivateAttr(default_factory=dict)
    _default: str = PrivateAttr("")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9]+([._/-][a-z0-9]+)*", v):
            raise ValueError(f"name must be a lowercase docker repository name, got {v!r}")
        return v

    def base_for(self, spec: ProfileSpec) -> BaseRef:
        """The base a build of ``spec`` uses when no ``--base-image`` is given: the profile's own, else ``base``."""
        return spec.base or self.base

    def profile(self, name: str | None) -> tuple[str, ProfileSpec]:
        """The named profile (default: ``default_profile``, else the registry's default) as ``(name, spec)``.

        Raises:
            ImageError: the image is not defined for that profile (the message names the known ones), or the
                definition was not resolved by :func:`load_def`.
        """
        name = name or self._default
        if name not in self._specs:
            raise ImageError(
                f"image {self.name}: unknown profile {name!r}; known: {', '.join(sorted(self.profiles))} "
                f"(images/*.yaml key profiles, each one of patches/{PROFILES_FILE})"
            )
        return name, self._specs[name]

    def resolve(self, registry: ProfilesRegistry, path: Path | str, patches_rel: str = "patches") -> None:
        """Take each listed profile's pins and series from ``registry``; ``path`` (this file) names errors;
        ``patches_rel`` is the patches dir relative to the repository root.

        Raises:
            ImageDefinitionError: a listed profile is not in the registry, lacks a pin the tag needs, or
                ``default_profile`` is not listed.
        """
        reg_file = f"{patches_rel}/{PROFILES_FILE}"
        wanted = None if self.patch_packages is None else {normalize_name(p) for p in self.patch_packages}
        specs: dict[str, ProfileSpec] = {}
        for pname, extra in self.profiles.items():
            if pname not in registry.profiles:
                raise ImageDefinitionError(
                    f"{path}: profiles.{pname}: no such profile in {reg_file} (known: "
                    f"{', '.join(sorted(registry.profiles))}); add it there or remove it here"
                )
            entry = registry.profiles[pname]
            pins = entry.pins()
            for pkg, version in extra.pins.items():
                pkg, version = normalize_name(pkg), str(version)
                if pins.get(pkg, version) != version:
                    raise ImageDefinitionError(
                        f"{path}: profiles.{pname}.pins.{pkg}: {version} contradicts {reg_file} "
                        f"profiles.{pname}.requires ({pkg}=={pins[pkg]}); remove it here or change it there"
                    )
                pins[pkg] = version
            for pin in TAG_PINS:
                if pin not in pins:
                    raise ImageDefinitionError(
                        f"{path}: profiles.{pname}: {reg_file} profiles.{pname}.requires does not pin {pin} (the "
                        f"content tag is <name>:<vllm>-<speculators>-<hash>); add {pin}==<version> there, or "
                        f"`pins: {{{pin}: <version>}}` under profiles.{pname} here"
                    )
            series = [f"{patches_rel}/{s}" for s in entry.series
                      if wanted is None or normalize_name(Path(s).parts[0]) in wanted]
            specs[pname] = ProfileSpec(pins=pins, lock=extra.lock, series=series, standin=entry.standin,
                                       base=extra.base or self.base)
        default = self.default_profile or registry.default
        if default not in specs:
            key = "default_profile" if self.default_profile else f"profiles (the registry's default {default!r})"
            raise ImageDefinitionError(
                f"{path}: {key}: profile {default!r} is not listed under `profiles:`; list it there or set "
                f"`default_profile:` to one of {', '.join(sorted(specs)) or '(none)'}"
            )
        self._specs, self._default = specs, default


def load_def(name: str, images_dir: Path = IMAGES_DIR, patches_dir: Path | None = None) -> ImageDef:
    """Read and validate ``images/<name>.yaml`` (``name``: ``pipeline`` or ``serving``) and resolve its profiles
    against the registry ``patches/profiles.yaml`` (``patches_dir``; default: ``patches/`` beside ``images_dir``).

    Raises:
        ImageDefinitionError: missing file, bad YAML, a validation error (each bad key named with its fix), or a
            profile the registry does not define.
    """
    path = Path(images_dir) / f"{name}.yaml"
    known = sorted(p.stem for p in Path(images_dir).glob("*.yaml"))
    raw = read_yaml(path, what="image definition", error=ImageDefinitionError,
                    missing_fix=f"known definitions: {', '.join(known) or '(none)'}")
    defn = validate(ImageDef, raw, path, what="image definition", section=SECTION, error=ImageDefinitionError)
    patches_dir = Path(patches_dir) if patches_dir is not None else Path(images_dir).parent / "patches"
    try:
        registry = load_registry(patches_dir)
    except ConfigError as exc:
        raise ImageDefinitionError(f"{path} refers to the profile registry, which is invalid:\n{exc}") from None
    defn.resolve(registry, path, patches_dir.name)
    return defn
