"""The chat template serving uses, read on the host (SpecForge #296).

vLLM renders chat requests with ``--chat-template`` when the server was started with one (a file path, or the
template itself in one line), else with the tokenizer's own template. A draft head is trained on data rendered with
a template: if it is not the one serving uses, the head learns another distribution than it meets. The extract
window therefore resolves ``prepare.chat_template: auto`` before it stops serving (:func:`resolve_config`): it reads
the live server's command line through its serving kind (:meth:`eagle3ops.window.kinds.DriverKind.served_argv`:
the container's ``Entrypoint`` + ``Cmd``, the process's ``/proc/PID/cmdline``, the unit's main process), takes the
flag's value (:func:`chat_template_flag`, pure) and reads the file as the server sees it (``docker exec NAME cat``,
the process's ``cwd`` for a relative path). ``speculate`` compares the run's prepare manifest with the live
release's template the same way (:func:`eagle3ops.speculate.ship.check_template`).

vLLM 0.16's own rule, mirrored (``vllm/entrypoints/chat_utils.py``, ``load_chat_template``): the value is opened as
a file; when that fails and it holds none of ``{``, ``}``, newline it is an error ("looks like a file path"),
otherwise it is the template itself, ``unicode_escape``-decoded.
"""

from __future__ import annotations

import codecs
import hashlib
from dataclasses import dataclass
from typing import Any

import yaml

#: The file the extract window writes into the run directory: the text of serving's ``--chat-template``.
SERVED_FILE = "served-chat-template.jinja"
FLAG = "--chat-template"
_JINJA_CHARS = "{}\n"


class ServedTemplateError(Exception):
    """Serving's ``--chat-template`` could not be read on the host; the message names the server and the fix."""


@dataclass(frozen=True)
class ServedTemplate:
    """Serving's ``--chat-template``: the flag's ``value``, the template ``text`` the server uses, and ``origin``
    (which server, which flag) in words."""

    value: str
    text: str
    origin: str

    @property
    def sha256(self) -> str:
        """sha256 (hex) of the template text (as the prepare manifest records it)."""
        return hashlib.sha256(self.text.encode()).hexdigest()


def chat_template_flag(argv: list[str]) -> str | None:
    """The value of ``--chat-template`` in a server's command line (``--chat-template V`` or
    ``--chat-template=V``; the last one wins, as argparse takes it), or None when it has none. Pure."""
    value = None
    for i, a in enumerate(argv):
        if a == FLAG and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(FLAG + "="):
            value = a[len(FLAG) + 1:]
    return value


def _looks_inline(value: str) -> bool:
    return any(c in value for c in _JINJA_CHARS)


def read_served_template(r: Any) -> ServedTemplate | None:
    """Serving's ``--chat-template`` on the host of ``r`` (read-only), or None when the live server has none (it
    renders with the tokenizer's own) or the host has no serving found.

    Raises:
        ServedTemplateError: the flag names a file the server's view cannot read and it is no inline template.
    """
    from eagle3ops.window.kinds import driver_kind

    found = driver_kind(r.host).served_argv(r)
    if found is None:
        return None
    argv, read_file, where = found
    value = chat_template_flag(argv)
    if value is None:
        return None
    text = read_file(value)
    if text is None:
        if not _looks_inline(value):
            raise ServedTemplateError(
                f"{r.host.name}: {where} runs with {FLAG} {value!r}, and that file cannot be read as the server sees "
                f"it: copy it into the run directory and set `prepare.chat_template: {{file: NAME}}` in "
                "pipeline.yaml, or `prepare.chat_template: tokenizer` to use the tokenizer's own")
        text = codecs.decode(value, "unicode_escape")  # vLLM's own treatment of an inline template
        return ServedTemplate(value=value, text=text, origin=f"{where}: {FLAG} (inline, {len(text)} characters)")
    return ServedTemplate(value=value, text=text, origin=f"{where}: {FLAG} {value}")


def resolve_config(text: str, served: ServedTemplate | None) -> str:
    """The pipeline config ``text`` with ``prepare.chat_template: auto`` (the default) resolved to what serving
    uses: ``{file: served-chat-template.jinja, sha256, origin}`` when ``served`` (the window writes that file into
    the run directory), else ``tokenizer``. A config that sets ``prepare.chat_template`` otherwise is returned as
    written (byte for byte). Pure; the caller validated ``text``."""
    data = yaml.safe_load(text) or {}
    prepare = data.get("prepare") or {}
    if prepare.get("chat_template", "auto") != "auto":
        return text
    prepare["chat_template"] = ({"file": SERVED_FILE, "sha256": served.sha256, "origin": served.origin}
                                if served else "tokenizer")
    data["prepare"] = prepare
    return yaml.safe_dump(data, sort_keys=False)
