"""``eagle3ops config docs [SECTION]``: the reference of every configuration file, generated from its models.

Each section names its file, its checked-in example (validated by ``tests/test_config_docs.py``) and its root model;
the reference lists every key of the root model and of each model nested in it, with type, default and the key's
``description``. A new section (e.g. the supervisor's plan schema) adds one :class:`Section` to :data:`SECTIONS`.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel

from eagle3ops.config.base import ConfigError
from eagle3ops.config.images import ImageDef, load_def
from eagle3ops.config.inventory import Inventory, load_inventory
from eagle3ops.config.pipeline import PipelineConfig, parse_pipeline_config
from eagle3ops.config.profiles import ProfilesRegistry, load_registry


@dataclass(frozen=True)
class Section:
    """One configuration file kind: its ``config docs`` name, where it lives, its examples (paths from the
    repository root), its root model and ``check``, which loads one file of the kind exactly as eagle3ops does
    (raising :class:`ConfigError` naming file, key and fix)."""

    name: str
    title: str
    where: str
    examples: tuple[str, ...]
    model: type[BaseModel]
    check: Callable[[Path], object]


SECTIONS: dict[str, Section] = {
    s.name: s
    for s in (
        Section("inventory", "Inventory",
                "deploy/hosts.yaml (--inventory FILE; your own hosts: start from deploy/hosts.first-host.example.yaml)",
                ("deploy/hosts.yaml",), Inventory, load_inventory),
        Section("pipeline", "Pipeline config of a run",
                "<data_dir>/runs/<run>/pipeline.yaml, uploaded from deploy/pipeline.yaml (--pipeline FILE)",
                ("deploy/pipeline.yaml", "deploy/pipeline.first-host.example.yaml"), PipelineConfig,
                lambda p: parse_pipeline_config(p.read_text(), p)),
        Section("image", "Image definition", "images/<name>.yaml", ("images/pipeline.yaml", "images/serving.yaml"),
                ImageDef, lambda p: load_def(p.stem, p.parent)),
        Section("profiles", "Patch profile registry", "patches/profiles.yaml", ("patches/profiles.yaml",),
                ProfilesRegistry, lambda p: load_registry(p.parent)),
    )
}


def _type_name(ann: Any) -> str:
    """A short, readable name of a field's type (``list[str]``, ``'a' | 'b'``, ``mapping str → HostConfig``)."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if ann is type(None):
        return "null"
    if origin is Annotated:  # a validated value (config/enginevalues.py): documented by its base type
        return _type_name(args[0])
    if origin is Literal:
        return " | ".join(f"`{a}`" for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is dict:
        return f"mapping {_type_name(args[0])} → {_type_name(args[1])}"
    if origin in (list, tuple):
        return f"list of {_type_name(args[0])}"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann.__name__
    return getattr(ann, "__name__", None) or str(ann).replace("typing.", "")


def _nested(ann: Any) -> list[type[BaseModel]]:
    """The models a field's type refers to (through lists, mappings and unions)."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    return [m for a in typing.get_args(ann) for m in _nested(a)]


def model_reference(root: type[BaseModel]) -> str:
    """Markdown reference of ``root`` and every model nested in it: each key with type, default and meaning."""
    out: list[str] = []
    todo, seen = [root], set()
    while todo:
        model = todo.pop(0)
        if model in seen:
            continue
        seen.add(model)
        out.append(f"### {model.__name__}\n{inspect.cleandoc(model.__doc__ or '')}\n")
        for key, field in model.model_fields.items():
            if field.exclude:
                continue
            if field.is_required():
                default = "required"
            else:
                value = field.get_default(call_default_factory=True)
                default = "default: its own defaults" if isinstance(value, BaseModel) else f"default {value!r}"
            out.append(f"- `{key}` ({_type_name(field.annotation)}, {default}): {field.description or ''}")
            todo.extend(_nested(field.annotation))
        out.append("")
    return "\n".join(out)


def get_section(name: str) -> Section:
    """The section called ``name``.

    Raises:
        ConfigError: unknown section (the message lists the known ones).
    """
    if name not in SECTIONS:
        raise ConfigError(f"no configuration section {name!r}; known: {', '.join(SECTIONS)} "
                          "(`eagle3ops config docs SECTION`)")
    return SECTIONS[name]


def docs(section: str | None = None) -> str:
    """The reference of one section (``inventory``, ``pipeline``, ``image``, ``profiles``), or of all of them.

    Raises:
        ConfigError: unknown section (the message lists the known ones).
    """
    out = []
    for s in [get_section(section)] if section else SECTIONS.values():
        out.append(f"## {s.title} (`{s.name}`)\nFile: {s.where}. Example: {', '.join(s.examples)}.\n\n"
                   + model_reference(s.model))
    return "\n".join(out).rstrip() + "\n"
