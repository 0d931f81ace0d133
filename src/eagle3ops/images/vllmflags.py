"""A vLLM upgrade's flag changes, from both versions' own argument parsers: what production's command line meets.

Each serving image's ``vllm serve`` parser is dumped by running :mod:`eagle3ops.images.vllm_parser_dump` in the
image once (``docker run --rm -i --network none``, the command line on standard input), cached on the driver by
image id (``~/.cache/eagle3ops/vllm-parsers/<id>.json``: an image id names its bytes, so the dump never goes stale).
:func:`diff_parsers` (pure) compares two dumps option by option: a flag the new parser lacks is **removed**, or
**renamed** when another flag of the new parser writes the same destination; a flag in both whose default,
type, choices or nargs differ is **re-defaulted** / **changed**. :func:`flag_report` adds which of those
production's argv uses and whether the new image's parser accepts that argv (the parse ran in the new image).
Nothing here is a hand-written list of flags: both sides come from the parsers themselves.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3ops.commands import docker as dk
from eagle3ops.executor import read_in_image

#: the in-image script's text (run with ``python3 -c``)
DUMP_SOURCE = (Path(__file__).with_name("vllm_parser_dump.py")).read_text(encoding="utf-8")
#: seconds a dump may take (importing vLLM on a loaded 2-core machine took up to ~60 s)
DUMP_TIMEOUT_S = 300
SCHEMA = 1


class FlagDumpError(Exception):
    """An image's parser could not be dumped; the message names the image, the host and the output's tail."""


@dataclass(frozen=True)
class FlagChange:
    """One option that differs between the old and the new parser.

    ``kind``: ``removed`` (the new parser lacks the flag and no flag writes its destination), ``renamed`` (the flag
    is gone, ``new`` names the new parser's flags writing the same destination), ``re-defaulted`` (``old`` and
    ``new`` are the defaults), ``changed`` (type, choices or nargs differ: ``old``/``new`` say which)."""

    kind: str
    flag: str
    old: Any = None
    new: Any = None

    def line(self) -> str:
        """One line: ``--x: renamed to --y`` / ``--x: default 16 -> None``."""
        if self.kind == "removed":
            return f"{self.flag}: removed"
        if self.kind == "renamed":
            return f"{self.flag}: renamed to {' / '.join(self.new)}"
        if self.kind == "re-defaulted":
            return f"{self.flag}: default {self.old!r} -> {self.new!r}"
        return f"{self.flag}: {self.old} -> {self.new}"


@dataclass
class FlagReport:
    """What a vLLM upgrade means for production's command line (:func:`flag_report`)."""

    old_vllm: str | None
    new_vllm: str | None
    #: every difference of the two parsers (long flags only; aliases of one option reported once)
    changes: list[FlagChange] = field(default_factory=list)
    #: the differences whose flag production's argv uses
    used: list[FlagChange] = field(default_factory=list)
    #: the new image's parser accepted production's argv (None: not parsed)
    parse_ok: bool | None = None
    parse_error: str | None = None

    def lines(self) -> list[str]:
        """The report for the terminal: the parse verdict, then the changes production uses, then a count."""
        head = f"vLLM flags {self.old_vllm} -> {self.new_vllm} (both parsers dumped from the images):"
        out = [head]
        if self.parse_ok is not None:
            out.append("  the new parser " + ("accepts production's command line" if self.parse_ok
                                              else f"REFUSES production's command line: {self.parse_error}"))
        out += [f"  used by production: {c.line()}" for c in self.used]
        kinds = {k: sum(1 for c in self.changes if c.kind == k) for k in ("removed", "renamed", "re-defaulted",
                                                                            "changed")}
        out.append("  all differences: " + ", ".join(f"{n} {k}" for k, n in kinds.items()))
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the gate's figures and ``--json``)."""
        return asdict(self)


def _norm(value: Any) -> Any:
    """A dumped default as compared: object reprs without addresses (the dump strips them already)."""
    return re.sub(r" at 0x[0-9a-f]+", "", value) if isinstance(value, str) else value


def _long(flags: list[str]) -> list[str]:
    return [f for f in flags if f.startswith("--")]


def diff_parsers(old: dict[str, Any], new: dict[str, Any]) -> list[FlagChange]:
    """Every option of ``old`` (a dump) that ``new`` removes, renames, re-defaults or changes (pure).

    Options are matched by their long flag strings; one missing from ``new`` is ``renamed`` when an option of
    ``new`` has the same ``dest`` (argparse's attribute: what the engine reads), else ``removed``. Each option is
    reported once, under its first long flag. Sorted by flag.

    Raises:
        ValueError: a dump of another schema (re-dump it).
    """
    for d in (old, new):
        if d.get("schema") != SCHEMA:
            raise ValueError(f"vLLM parser dump of schema {d.get('schema')!r}, expected {SCHEMA}: dump it again")
    by_flag = {f: o for o in new["options"] for f in _long(o["flags"])}
    by_dest: dict[str, list[str]] = {}
    for o in new["options"]:
        by_dest.setdefault(o["dest"], []).extend(_long(o["flags"]))
    out: list[FlagChange] = []
    for o in old["options"]:
        flags = _long(o["flags"])
        if not flags:
            continue
        kept = [f for f in flags if f in by_flag]
        if not kept:
            names = by_dest.get(o["dest"])
            out.append(FlagChange("renamed", flags[0], flags, names) if names else FlagChange("removed", flags[0]))
            continue
        n = by_flag[kept[0]]
        if _norm(o["default"]) != _norm(n["default"]):
            out.append(FlagChange("re-defaulted", flags[0], o["default"], n["default"]))
        for key in ("type", "choices", "nargs"):
            if o.get(key) != n.get(key) and not (key == "choices" and o.get(key) and n.get(key)
                                                  and set(o[key]) <= set(n[key])):
                out.append(FlagChange("changed", flags[0], f"{key} {o.get(key)!r}", f"{key} {n.get(key)!r}"))
        for f in flags:  # an alias the new parser dropped while keeping the option
            if f not in by_flag:
                out.append(FlagChange("renamed", f, [f], _long(n["flags"])))
    return sorted(out, key=lambda c: (c.flag, c.kind))


def argv_flags(argv: list[str]) -> set[str]:
    """The long flags an argv sets, as the parser names them: ``--x=1`` and ``--x.key`` count as ``--x``;
    ``--max_model_len`` as ``--max-model-len`` (vLLM's FlexibleArgumentParser accepts underscores)."""
    out = set()
    for w in argv:
        if w.startswith("--") and len(w) > 2:
            name = w.split("=", 1)[0].split(".", 1)[0]
            out.add("--" + name[2:].replace("_", "-"))
    return out


def flag_report(old: dict[str, Any], new: dict[str, Any], argv: list[str]) -> FlagReport:
    """:func:`diff_parsers` of the two dumps, with the changes production's ``argv`` uses and the new dump's
    ``parse`` of it (pure)."""
    changes = diff_parsers(old, new)
    used_flags = argv_flags(argv)
    used = [c for c in changes if c.flag in used_flags]
    parse = new.get("parse") or {}
    return FlagReport(old.get("vllm"), new.get("vllm"), changes, used,
                      parse_ok=parse.get("ok") if parse else None, parse_error=parse.get("error") if parse else None)


def cache_file(image_id: str, cache: Path | None = None) -> Path:
    """Where the parser dump of image ``image_id`` (``sha256:...``) is cached on the driver."""
    from eagle3ops.patches.wheels import cache_dir

    base = (Path(cache) if cache is not None else cache_dir().parent / "vllm-parsers")
    return base / (image_id.removeprefix("sha256:") + ".json")


def dump_parser(r: Any, image: str, *, argv: list[str] | None = None, cache: Path | None = None) -> dict[str, Any]:
    """The ``vllm serve`` parser of ``image`` on the host of ``r`` (a dump, see the module doc).

    Without ``argv`` a dump cached for the image's id is returned without running anything. With ``argv`` the
    image runs once more to parse it (its ``parse`` entry); the options are cached all the same. Read-only on the
    host: a throwaway container (``--rm``, no network), bounded by :data:`DUMP_TIMEOUT_S`.

    Raises:
        FlagDumpError: the image is not on the host, or the script failed or printed no JSON (tail quoted).
    """
    got = r.run(dk.image_id(r.host, image), check=False)
    if not got.ok or not got.stdout.strip():
        raise FlagDumpError(f"{r.host.name}: image {image} is not on the host, so its vLLM flags cannot be read; "
                            f"push it first (`eagle3ops deploy`)")
    image_id = got.stdout.strip()
    path = cache_file(image_id, cache)
    if argv is None and path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    got = read_in_image(r, image, DUMP_SOURCE, timeout=DUMP_TIMEOUT_S, stdin=json.dumps({"argv": argv}))
    dump = got.answer
    if not got.ok or dump is None or dump.get("schema") != SCHEMA:
        raise FlagDumpError(f"{r.host.name}: could not dump the vLLM argument parser of {image} (exit "
                            f"{got.exited}): {got.tail}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**dump, "parse": None, "image_id": image_id}, indent=1) + "\n", encoding="utf-8")
    return {**dump, "image_id": image_id}


def upgrade_report(r: Any, image: str, args: list[str], *, cache: Path | None = None) -> FlagReport | None:
    """Production's command line (the live serving container's, with ``args`` set as the release sets them)
    against the vLLM parsers of the live image and of ``image``: the flag changes it meets and whether ``image``'s
    parser accepts it (read-only; see :func:`dump_parser`). None when there is no live serving container or it
    already runs ``image`` (same id): nothing to compare.

    Raises:
        FlagDumpError: either image's parser could not be dumped.
    """
    from eagle3ops import redact
    from eagle3ops.commands import serving as sv
    from eagle3ops.window.kinds import driver_kind
    from eagle3ops.window.kinds.container import live_spec_for_image

    spec = live_spec_for_image(r, driver_kind(r.host), image)
    if spec is None:
        return None
    cfg = spec.get("Config") or {}
    argv = sv.set_args([*(cfg.get("Entrypoint") or []), *(cfg.get("Cmd") or [])], list(args))
    old = dump_parser(r, spec["Image"], cache=cache)
    new = dump_parser(r, image, argv=argv, cache=cache)
    rep = flag_report(old, new, argv)
    if rep.parse_error:  # argparse may quote a value back: every secret of the argv is masked, by value too
        extra = getattr(r.host, "secret_env", ())
        text = redact.text(rep.parse_error, extra)
        for word, shown in zip(argv, redact.argv(argv, extra)):
            if word != shown and len(word) > 3:
                text = text.replace(word, redact.MASK)
        rep.parse_error = text
    return rep
