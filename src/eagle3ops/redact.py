"""The one redaction rule: which command-line flags and environment variables carry keys or tokens, and how their
values are hidden (``***``) in everything eagle3ops writes or prints, on the host and on the driver.

Secrets are:

- the value of a flag of :data:`SECRET_FLAGS` (vLLM's ``--api-key``, Hugging Face's ``--hf-token``), in each form
  a command line holds it: ``--api-key K`` (two words), ``--api-key=K`` (one word), and either one inside a single
  word holding a shell command line (``bash -c "vllm serve ... --api-key K"``);
- the value of an environment variable named in :data:`SECRET_ENV` (``VLLM_API_KEY``, which vLLM reads when no
  ``--api-key`` is given; ``HF_TOKEN`` and ``HUGGING_FACE_HUB_TOKEN``, which ``huggingface_hub`` reads) or in the
  inventory's ``secret_env`` (the host's own names), in each shape it is kept: a mapping ``{NAME: VALUE}``, a
  ``NAME=VALUE`` word of an environment list, and ``NAME=VALUE`` inside a shell command line.

Every writer goes through :func:`value` (a whole JSON-ready record: the journal, results, audit lines) or the
narrower :func:`argv`, :func:`env` and :func:`text`; a stream of output (a stage's log) through :class:`LineWriter`. The records that restore and ``rollback`` recreate serving from
must keep serving's secrets: they are written readable by their owner only (mode 0600) instead, and are the only
files that hold them (docs/guarantees.md, the secrets of serving).

Standard library only, and imports nothing of eagle3ops: the host-side supervisor, the health gate and the
configuration all use it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any, BinaryIO, overload

__all__ = ["MASK", "SECRET_ENV", "SECRET_FIELDS", "SECRET_FLAGS", "LineWriter", "argv", "env", "is_secret_env",
           "is_secret_flag", "text", "value"]

#: What a secret is replaced with.
MASK = "***"
#: Flags whose value is a secret: vLLM's ``--api-key`` (``vllm serve``), ``--hf-token`` (the token vLLM and
#: ``huggingface-cli`` take for gated models).
SECRET_FLAGS: tuple[str, ...] = ("--api-key", "--hf-token")
#: Environment variables whose value is a secret wherever they appear: vLLM's ``VLLM_API_KEY``, Hugging Face's
#: ``HF_TOKEN`` and its older name ``HUGGING_FACE_HUB_TOKEN``. A host adds its own in the inventory (``secret_env``).
SECRET_ENV: tuple[str, ...] = ("VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")

#: Field names of a JSON record whose value is a secret (a request to the host's gate helper carries the key so).
SECRET_FIELDS: tuple[str, ...] = ("api_key", "hf_token")

# A flag inside one word holding a command line: `--api-key K`, `--api-key=K`, `--api-key 'K'`.
_FLAG_IN_TEXT = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, SECRET_FLAGS))
                           + r")(=|\s+)('[^']*'|\"[^\"]*\"|\S+)")


def _names(extra: Iterable[str]) -> frozenset[str]:
    return frozenset(SECRET_ENV).union(extra)


def is_secret_flag(word: str) -> bool:
    """Whether ``word`` is a flag of :data:`SECRET_FLAGS` (``--api-key``; not ``--api-key=K``, see :func:`argv`)."""
    return word in SECRET_FLAGS


def is_secret_env(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether environment variable ``name`` holds a secret: one of :data:`SECRET_ENV` or of ``extra`` (the
    inventory's ``secret_env``)."""
    return name in _names(extra)


def _env_in_text(names: frozenset[str]) -> re.Pattern[str]:
    # NAME=VALUE as a word of its own (start of the string or after a blank, quote or `;`/`&`/`|`)
    return re.compile(r"(?<![\w$-])(" + "|".join(map(re.escape, sorted(names))) + r")=('[^']*'|\"[^\"]*\"|\S*)")


def text(s: str, extra: Iterable[str] = ()) -> str:
    """``s`` with every secret inside it masked: ``--api-key K`` / ``--api-key=K`` (any flag of
    :data:`SECRET_FLAGS`, its value quoted or not) and ``NAME=VALUE`` of a secret name (:func:`is_secret_env`).
    Meant for one word holding a shell command line, an error message or a log line."""
    s = _FLAG_IN_TEXT.sub(lambda m: m.group(1) + m.group(2) + MASK, s)
    return _env_in_text(_names(extra)).sub(lambda m: m.group(1) + "=" + MASK, s)


def argv(words: Iterable[str], extra: Iterable[str] = ()) -> list[str]:
    """A command line with every secret masked: the word after a flag of :data:`SECRET_FLAGS` (unless it is
    another ``--flag``, as :func:`eagle3ops.health.api_key_from_args` reads it), the value of
    ``--flag=VALUE``, a ``NAME=VALUE`` word of a secret name (``env VLLM_API_KEY=K vllm serve``) and the same inside
    a word holding a shell command line (:func:`text`). A flag with no value after it is kept as it is."""
    out: list[str] = []
    words = list(words)
    for i, w in enumerate(words):
        if i and is_secret_flag(words[i - 1]) and not w.startswith("--"):
            out.append(MASK)
        else:
            out.append(text(w, extra))
    return out


@overload
def env(e: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]: ...
@overload
def env(e: Iterable[str], extra: Iterable[str] = ()) -> list[str]: ...
def env(e: Any, extra: Iterable[str] = ()) -> Any:
    """An environment with the values of secret names (:func:`is_secret_env`) masked, in the shape given: a
    mapping ``{NAME: VALUE}`` or a list of ``NAME=VALUE`` words."""
    names = _names(extra)
    if isinstance(e, Mapping):
        return {k: MASK if k in names else v for k, v in e.items()}
    return [f"{w.split('=', 1)[0]}={MASK}" if "=" in w and w.split("=", 1)[0] in names else w for w in e]


def value(obj: Any, extra: Iterable[str] = ()) -> Any:
    """A JSON-ready record (dicts, lists, strings, numbers) with every secret masked, its shape kept; the input
    is not changed. A list of strings is read as a command line or an environment list (:func:`argv`), a string
    as text (:func:`text`), a mapping's value under a secret name (:func:`is_secret_env`) or a field of
    :data:`SECRET_FIELDS` is masked."""
    names = _names(extra)
    if isinstance(obj, str):
        return text(obj, names)
    if isinstance(obj, Mapping):
        return {k: MASK if v is not None and (k in names or k in SECRET_FIELDS) else value(v, names)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if all(isinstance(w, str) for w in obj):
            return argv(obj, names)
        return [value(v, names) for v in obj]
    return obj


class LineWriter:
    """A binary stream's bytes written to ``out`` with every secret masked (:func:`text`), line by line: a stage's
    output on its way to ``<stage>.log``, which arrives in chunks that may cut a line, and a secret, anywhere.

    Each :meth:`write` passes on everything up to its last line end (``\\n``, or ``\\r``: a progress bar redraws its
    line without a newline) and keeps the rest until the line is complete; a rest longer than ``hold`` bytes (a
    line that never ends) is passed on as it is, masked. :meth:`close` passes on the last, unended line. Bytes that
    are not UTF-8 are kept as they are (``surrogateescape``). Thread-safe: a log pump writes while the caller may
    close.

    Args:
        out: the binary file written to (flushed after each write).
        extra: the inventory's ``secret_env`` names (:func:`is_secret_env`).
        hold: the most bytes of an unended line kept back.
    """

    def __init__(self, out: BinaryIO, extra: Iterable[str] = (), hold: int = 1 << 16) -> None:
        self._out, self._names, self._hold = out, _names(extra), hold
        self._rest = b""
        self._lock = threading.Lock()

    def _mask(self, b: bytes) -> bytes:
        return text(b.decode("utf-8", "surrogateescape"), self._names).encode("utf-8", "surrogateescape")

    def write(self, data: bytes) -> None:
        """Take ``data``: pass on its complete lines (masked), keep the unended rest."""
        with self._lock:
            buf = self._rest + data
            end = max(buf.rfind(b"\n"), buf.rfind(b"\r")) + 1
            if len(buf) - end > self._hold:
                end = len(buf)
            self._rest = buf[end:]
            if end:
                self._out.write(self._mask(buf[:end]))
                self._out.flush()

    def close(self) -> None:
        """Pass on the last, unended line (masked). ``out`` itself is left open."""
        with self._lock:
            if self._rest:
                self._out.write(self._mask(self._rest))
                self._out.flush()
                self._rest = b""
