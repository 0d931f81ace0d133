"""What every configuration section shares: the strict base model, the typed error and the one error formatter.

Each section module (inventory, pipeline, image, profiles, and the supervisor's plan schema) declares its models on
:class:`StrictModel`, reads its file with :func:`read_yaml` (duplicate keys refused by :mod:`eagle3ops.yamlload`)
and validates with :func:`validate`, so that every error has the same shape: the file, then one line per problem
naming the key (dotted path) and the fix, ending with the section's reference command
(``eagle3ops config docs SECTION``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from eagle3ops import yamlload


class ConfigError(Exception):
    """A configuration file is missing, unreadable or invalid; the message names the file, the key and the fix."""


class StrictModel(BaseModel):
    """Base of every configuration model: unknown keys are errors (a misspelt key never passes silently) and a
    loaded value is frozen (nothing changes a configuration after validation)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


M = TypeVar("M", bound=BaseModel)


def docs_hint(section: str) -> str:
    """The reference command of a section, as error messages cite it."""
    return f"`eagle3ops config docs {section}`"


def format_validation_error(path: Path | str, exc: ValidationError, *, what: str, section: str,
                            prefix: tuple[str | int, ...] = ()) -> str:
    """One message for a pydantic :class:`ValidationError`: ``<file>: invalid <what>`` and one line per problem,
    each naming the key (dotted path, ``prefix`` first) and the fix.

    Args:
        path: the file the values came from.
        what: what the file is, e.g. ``inventory``, ``pipeline config``.
        section: the ``eagle3ops config docs`` section documenting it (named in the fixes).
        prefix: keys above the validated value (e.g. ``("hosts",)``) so the path matches the file.
    """
    lines = [f"{path}: invalid {what}"]
    for err in exc.errors():
        # pydantic marks an error in a mapping's key (not its value) with a trailing "[key]": the key is named already
        key = ".".join(str(p) for p in (*prefix, *err["loc"]) if p != "[key]") or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            lines.append(f"  - unknown key `{key}`: remove it or fix its spelling (keys: {docs_hint(section)})")
        elif err["type"] == "missing":
            lines.append(f"  - missing required key `{key}`: add it (meaning and type: {docs_hint(section)})")
        elif err["type"] == "value_error":  # our own validators: the message says what is wrong and how to fix it
            lines.append(f"  - key `{key}`: {msg}")
        else:
            lines.append(f"  - key `{key}`: {msg} (expected type and range: {docs_hint(section)})")
    return "\n".join(lines)


def read_yaml(path: Path | str, *, what: str, missing_fix: str, error: type[Exception] = ConfigError) -> Any:
    """Read ``path`` and parse it with :func:`eagle3ops.yamlload.safe_load` (duplicate keys refused).

    Args:
        what: what the file is (``inventory``, ``image definition``, ...), for the messages.
        missing_fix: the fix printed when the file does not exist.
        error: the :class:`ConfigError` subclass to raise.

    Raises:
        error: the file is missing or unreadable, is not YAML, or repeats a key (file, line and key named).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: {what} not found ({missing_fix})") from None
    except OSError as exc:
        raise error(f"{path}: cannot read the {what} ({exc.strerror}); check its permissions") from None
    return parse_yaml(text, path, error=error)


def parse_yaml(text: str, source: Path | str, *, error: type[Exception] = ConfigError) -> Any:
    """Parse YAML ``text`` (from ``source``, named in errors) with :func:`eagle3ops.yamlload.safe_load`.

    Raises:
        error: not YAML, or a repeated key (file, line and key named).
    """
    try:
        return yamlload.safe_load(text, source=source)
    except yamlload.DuplicateKeyError as exc:
        raise error(str(exc)) from None
    except yaml.YAMLError as exc:
        raise error(f"{source}: not valid YAML: {exc} (fix the YAML syntax at the line shown)") from None


def require_mapping(raw: Any, path: Path | str, *, what: str, expected: str,
                    error: type[Exception] = ConfigError) -> dict[str, Any]:
    """``raw`` when it is a mapping (``None``, an empty file, counts as ``{}``); else ``error`` naming the file and
    what the top level should be (``expected``, e.g. ``a `hosts:` mapping``)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise error(f"{path}: expected a mapping of keys at the top level of the {what} ({expected}), "
                    f"got {type(raw).__name__}")
    return raw


def validate(model: type[M], raw: Any, path: Path | str, *, what: str, section: str,
             error: type[Exception] = ConfigError, prefix: tuple[str | int, ...] = ()) -> M:
    """``model.model_validate(raw)``, a :class:`ValidationError` turned into ``error`` with
    :func:`format_validation_error`'s message."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise error(format_validation_error(path, exc, what=what, section=section, prefix=prefix)) from None
