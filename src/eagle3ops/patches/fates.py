"""What became of every patch of a profile on its successor: carried forward, or retired with a checked record.

A profile that replaces others on an upgrade names them in ``profiles.yaml`` (``succeeds``). Every patch of every
series of a succeeded profile must then have exactly one *fate* in the successor:

* **carried forward**: a patch with the same slug (its file name without the ``NNNN-`` number) is listed in one of
  the successor's series (rebased, zero fuzz: ``eagle3ops patch check`` applies it to the new pinned wheel);
* **retired**: a record ``<new series dir>/retired/<old package>/<old version>/<patch name>.yaml`` (the old patch's
  path under ``patches/``, ``.patch`` → ``.yaml``) says why the new upstream no longer needs it (:class:`Retirement`):
  ``fate: upstream`` (upstream now has the change) or ``fate: removed`` (the patched code is gone), the first
  upstream ``release`` known to have it, the ``pr`` where known, and ``evidence``: lines that must hold in every
  pinned wheel of that series (a file contains / lacks a literal string, or is absent). ``patch check`` reads the
  evidence from the wheels themselves, so a record that stops being true (a wrong pin, a misread file) fails the
  check instead of silently dropping a fix.

The retirement record follows the spirit of Debian's ``debian/patches`` practice of dropping a patch "applied
upstream" only with the upstream reference in the changelog; here that reference is machine-readable and checked.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from eagle3ops.config.base import ConfigError, StrictModel, format_validation_error, read_yaml
from eagle3ops.patches.errors import PatchToolError, SeriesError
from eagle3ops.patches.series import Profiles, Series, load_series

#: the sub-directory of a series dir holding its retirement records
RETIRED_DIR = "retired"
_NUMBER_RE = re.compile(r"^\d{4}-")


class Evidence(StrictModel):
    """One line of proof read from a pinned wheel: exactly one of ``contains``, ``lacks``, ``absent``."""

    file: str = Field(..., description="Path inside the wheel (site-relative), e.g. `vllm/config/speculative.py`.")
    contains: str | None = Field(None, description="A literal string the file must contain.")
    lacks: str | None = Field(None, description="A literal string the file must not contain (the file must exist).")
    absent: bool = Field(False, description="`true`: the file must not be in the wheel (the patched code is gone).")

    @model_validator(mode="after")
    def _one_kind(self) -> "Evidence":
        kinds = [k for k, v in (("contains", self.contains), ("lacks", self.lacks), ("absent", self.absent or None))
                 if v is not None]
        if len(kinds) != 1:
            raise ValueError(f"evidence for {self.file!r} needs exactly one of contains, lacks, absent: true "
                             f"(has {', '.join(kinds) or 'none'})")
        return self

    def describe(self) -> str:
        """One line: ``vllm/x.py contains 'Foo'``."""
        if self.contains is not None:
            return f"{self.file} contains {self.contains!r}"
        if self.lacks is not None:
            return f"{self.file} lacks {self.lacks!r}"
        return f"{self.file} is absent"

    def holds(self, names: set[str], read: Callable[[str], str]) -> bool:
        """Whether this line holds for a wheel whose members are ``names`` (``read(member)`` gives its text)."""
        if self.absent:
            return self.file not in names
        if self.file not in names:
            return False
        text = read(self.file)
        return (self.contains in text) if self.contains is not None else (self.lacks not in text)


class Retirement(StrictModel):
    """A retirement record (``retired/<package>/<version>/<patch>.yaml``): why a patch is not carried forward."""

    fate: Literal["upstream", "removed"] = Field(
        ..., description="`upstream`: the new release has the change itself; `removed`: the code the patch changed "
                         "is gone from the new release.")
    release: str = Field(..., min_length=1, description="The first upstream release known to have the change or to "
                                                        "lack the patched code, e.g. `vllm 0.18.0`.")
    pr: str | None = Field(None, description="The upstream pull request (URL) that made the patch unnecessary, "
                                             "where known.")
    note: str = Field("", description="What was read to decide it (one paragraph).")
    evidence: list[Evidence] = Field(..., min_length=1, description="Lines that must hold in every pinned wheel of "
                                                                    "the series holding this record.")

    @model_validator(mode="after")
    def _evidence_fits_fate(self) -> "Retirement":
        if self.fate == "upstream" and not any(e.contains is not None for e in self.evidence):
            raise ValueError("fate `upstream` needs at least one `contains` line: the upstream code that does it")
        if self.fate == "removed" and not any(e.absent for e in self.evidence):
            raise ValueError("fate `removed` needs at least one `absent: true` line: the file that is gone")
        return self


@dataclass(frozen=True)
class Fate:
    """What became of one old patch: ``kind`` is ``carried`` (``where`` = the new patch file), ``retired``
    (``where`` = the record) or ``none`` (a problem)."""

    old: str
    kind: Literal["carried", "retired", "none"]
    where: str


def slug(patch_name: str) -> str:
    """A patch file name without its ``NNNN-`` number and ``.patch`` suffix (``0001-a-b.patch`` → ``a-b``)."""
    return _NUMBER_RE.sub("", patch_name).removesuffix(".patch")


def record_path(series_dir: Path, old_series: Series, patch_name: str) -> Path:
    """Where the record retiring ``old_series``'s ``patch_name`` lives in the new ``series_dir``."""
    return (series_dir / RETIRED_DIR / old_series.dir.parent.name / old_series.dir.name
            / (patch_name.removesuffix(".patch") + ".yaml"))


def load_retirement(path: Path) -> Retirement:
    """Read and validate one retirement record.

    Raises:
        SeriesError: missing, not YAML, unknown key, or evidence that does not fit its fate (file, key and fix named).
    """
    try:
        raw = read_yaml(path, what="patch retirement record", error=ConfigError,
                        missing_fix="write the record, or carry the patch forward instead")
        return Retirement.model_validate(raw)
    except ValidationError as e:
        raise SeriesError(format_validation_error(path, e, what="patch retirement record", section="profiles"),
                          fix="keys: fate (upstream|removed), release, pr, note, evidence (patches/README.md)") from None
    except ConfigError as e:
        raise SeriesError(str(e)) from None


def records(series_dir: Path) -> list[Path]:
    """Every retirement record under ``series_dir/retired`` (sorted)."""
    return sorted((series_dir / RETIRED_DIR).rglob("*.yaml"))


def check_evidence(series: Series, wheels: dict[str, Path]) -> list[str]:
    """Check every retirement record of ``series`` against each of its pinned wheels (``{wheel file name: path}``:
    ``upstream.yaml``'s wheel and its ``also``). Reads the named members straight from the zip (no unpacking).

    Returns: problems, each naming the record, the evidence line and the wheel; empty when every line holds."""
    out: list[str] = []
    for path in records(series.dir):
        rel = path.relative_to(series.dir)
        try:
            rec = load_retirement(path)
        except PatchToolError as e:
            out.append(str(e))
            continue
        for wheel_name, wheel in wheels.items():
            with zipfile.ZipFile(wheel) as zf:
                names = set(zf.namelist())
                for i, ev in enumerate(rec.evidence, start=1):
                    if not ev.holds(names, lambda m: zf.read(m).decode("utf-8", "replace")):
                        out.append(f"{rel}: evidence {i} ({ev.describe()}) does not hold in {wheel_name}; the patch "
                                   f"may still be needed there: carry it forward (`eagle3ops patch rebase`) or "
                                   f"correct the record")
    return out


def fates(profiles: Profiles, name: str) -> tuple[list[Fate], list[str]]:
    """The fate of every patch of every profile that profile ``name`` succeeds (``profiles.yaml`` ``succeeds``).

    Returns:
        ``(fates, problems)``: one :class:`Fate` per old patch (in profile and series order); problems name each old
        patch with no fate or two, each record that retires no patch of a succeeded profile, and each series that
        does not parse. Series files are parsed here; wheels are not read (see :func:`check_evidence`).
    """
    prof = profiles.get(name)
    problems: list[str] = []
    new_series: list[Series] = []
    for d in prof.series_dirs:
        try:
            new_series.append(load_series(d))
        except PatchToolError as e:
            problems.append(str(e))
    carried = {slug(p.name): s.dir / p.name for s in new_series for p in s.patches}
    used: set[Path] = set()
    out: list[Fate] = []
    seen: set[Path] = set()
    root = profiles.patches_dir
    for old_name in prof.succeeds:
        for d in profiles.get(old_name).series_dirs:
            if d in seen:
                continue
            seen.add(d)
            try:
                old = load_series(d)
            except PatchToolError as e:
                problems.append(str(e))
                continue
            for p in old.patches:
                old_rel = (old.dir / p.name).relative_to(root).as_posix()
                recs = [r for r in (record_path(s.dir, old, p.name) for s in new_series) if r.is_file()]
                used.update(recs)
                new = carried.get(slug(p.name))
                if new is not None and recs:
                    problems.append(f"{old_rel}: both carried forward ({new.relative_to(root)}) and retired "
                                    f"({recs[0].relative_to(root)}); delete one")
                elif new is not None:
                    out.append(Fate(old_rel, "carried", new.relative_to(root).as_posix()))
                elif recs:
                    out.append(Fate(old_rel, "retired", recs[0].relative_to(root).as_posix()))
                else:
                    out.append(Fate(old_rel, "none", ""))
                    problems.append(
                        f"{old_rel} (profile {old_name}) has no fate in profile {name}: carry it forward into one of "
                        f"its series (`eagle3ops patch rebase`) or retire it with a record "
                        f"{RETIRED_DIR}/{old.dir.parent.name}/{old.dir.name}/{p.name.removesuffix('.patch')}.yaml in "
                        f"one of its series dirs (patches/README.md)")
    for s in new_series:
        for r in records(s.dir):
            if r not in used:
                problems.append(f"{r.relative_to(root)}: retires no patch of the profiles {name} succeeds "
                                f"({', '.join(prof.succeeds) or 'none'}); delete it or fix its path")
    return out, problems

