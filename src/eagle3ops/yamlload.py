"""The one YAML loader of eagle3ops: ``yaml.safe_load`` that refuses duplicate mapping keys.

YAML 1.1 (PyYAML) lets a later key silently replace an earlier one in the same mapping: an inventory with the
same host written twice, or a pipeline config with ``prepare:`` twice, would load and the last value would win.
Every configuration file eagle3ops reads (``deploy/hosts.yaml``, ``<run>/pipeline.yaml``, ``images/*.yaml``,
``patches/profiles.yaml``, ``patches/<pkg>/<ver>/upstream.yaml`` and ``hashes.yaml``) goes through
:func:`safe_load`, which raises :class:`DuplicateKeyError` naming the file, the line and column of the second
occurrence, the key and the line of the first one.

Keys are compared after construction, as YAML does: ``yes`` and ``true`` are the same key (both boolean true),
``1`` and ``"1"`` are not. Keys brought in by a merge (``<<: *anchor``) may be overridden by keys written in the
mapping itself (that is what merges are for); two keys written in the same mapping may not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode

_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(ConstructorError):
    """A mapping holds the same key twice.

    A subclass of :class:`yaml.YAMLError` (through :class:`yaml.constructor.ConstructorError`), so callers that
    already turn YAML errors into their own typed errors keep working; ``str(error)`` is one sentence naming the
    file, line, column and key, and the fix.

    Attributes:
        source: the file name (or ``<string>``) given to :func:`safe_load`.
        key: the duplicated key as constructed (e.g. ``'h1'``, ``True``).
        line / column: 1-based position of the second occurrence.
        first_line: 1-based line of the first occurrence.
    """

    def __init__(self, source: str, key: Any, line: int, column: int, first_line: int) -> None:
        self.source = source
        self.key = key
        self.line = line
        self.column = column
        self.first_line = first_line
        super().__init__()

    def __str__(self) -> str:
        return (
            f"{self.source}:{self.line}:{self.column}: duplicate key {self.key!r} (first given at line "
            f"{self.first_line} of the same mapping); YAML would silently keep only the last value - remove or "
            "rename one of them"
        )


class StrictSafeLoader(yaml.SafeLoader):
    """:class:`yaml.SafeLoader` whose mapping constructor raises :class:`DuplicateKeyError` on a repeated key."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:  # type: ignore[override]
        if isinstance(node, MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _value_node in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # unhashable key: SafeConstructor reports it with its own message below
                    continue
                if first is not None:
                    mark = key_node.start_mark
                    raise DuplicateKeyError(str(mark.name), key, mark.line + 1, mark.column + 1, first)
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def safe_load(text: str | bytes, *, source: str | Path | None = None) -> Any:
    """Parse one YAML document like :func:`yaml.safe_load`, refusing duplicate mapping keys at any depth.

    Args:
        text: the document (``str`` or UTF-8/16 ``bytes``).
        source: the file name used in error messages (PyYAML's marks and :class:`DuplicateKeyError`); default
            ``<string>``.

    Returns:
        The constructed Python object (``None`` for an empty document), exactly what ``yaml.safe_load`` returns
        for a document without duplicate keys.

    Raises:
        DuplicateKeyError: a mapping repeats a key (file, line, column, key and the first line named).
        yaml.YAMLError: any other YAML syntax or construction error, as ``yaml.safe_load`` raises it (its marks
            name ``source``).
    """
    loader = StrictSafeLoader(text)
    loader.name = str(source) if source is not None else "<string>"
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_file(path: Path | str) -> Any:
    """Read ``path`` as UTF-8 and parse it with :func:`safe_load` (its name in every error message).

    Raises:
        OSError: the file cannot be read (``FileNotFoundError`` when missing).
        DuplicateKeyError / yaml.YAMLError: as :func:`safe_load`.
    """
    p = Path(path)
    return safe_load(p.read_text(encoding="utf-8"), source=p)
