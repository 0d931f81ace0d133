"""The health gate: the one poller that judges a server, used by the host-side supervisor and the driver side.

A gate asks what a client of the server needs: ``/health`` answers 200, ``/v1/models`` lists the served model, and
(optionally) one completion returns text. It talks to serving the way its clients do: when the server requires an
API key (vLLM ``--api-key`` or ``VLLM_API_KEY``), the gate sends it as ``Authorization: Bearer``. The key is taken
on the host, from the serving container's own configuration (:func:`api_key_from_inspect`) or a secret file named
in the inventory (``serving.api_key_file``, :func:`read_api_key_file`); it is never put in argv, logs, labels,
journal entries or error messages.

Its requests go through the one serving API client, :class:`eagle3ops.serving_http.ServingClient`.

Standard library only (urllib): the driver side (``demo``, tests, benchmarks) imports it without the docker SDK.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3ops.serving_http import MODELS, ServingClient, ServingHTTPError

#: vLLM reads an API key from this environment variable when ``--api-key`` is not given.
API_KEY_ENV = "VLLM_API_KEY"
API_KEY_FLAG = "--api-key"


class GateFailed(RuntimeError):
    """A health gate ran to its end on a container and failed (no answer in time, wrong answers, or the container
    crashed): the only kind of error that is a verdict on a release."""


class ProbeFailed(Exception):
    """One probe of a server did not pass; the message says which request and why (never a credential)."""


def api_key_from_args(args: list[str]) -> str | None:
    """The first API key in a vLLM command line (``--api-key KEY`` or ``--api-key=KEY``; later keys of a
    multi-key server are equally valid), or None."""
    for i, a in enumerate(args):
        if a == API_KEY_FLAG and i + 1 < len(args) and not args[i + 1].startswith("--"):
            return args[i + 1]
        if a.startswith(API_KEY_FLAG + "="):
            return a.split("=", 1)[1]
    return None


#: Programs that run a command string given with ``-c`` (POSIX sh and its relatives).
SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "busybox"})


@dataclass(frozen=True)
class ShellForm:
    """A container whose server runs through ``SHELL -c STRING`` (:func:`shell_form`).

    Attributes:
        shell: the shell's words up to and including its options (``["bash", "-c"]``, ``["/bin/sh", "-lc"]``).
        script: the command string the shell runs.
        rest: the words after the string: ``$0`` first, then the positional parameters ``$1``...
        forwards_args: the string passes its positional parameters on (``"$@"``) and a ``$0`` word is there, so
            flags appended to the container's command reach the server.
    """

    shell: list[str]
    script: str
    rest: list[str]
    forwards_args: bool

    def words(self) -> list[str]:
        """The server's command line as the shell would run it, where it can be read without running anything:
        the string split as sh does for plain words (:func:`shlex.split`), followed by the forwarded parameters;
        ``[]`` when the string does not split (unbalanced quotes)."""
        try:
            words = shlex.split(self.script)
        except ValueError:
            return []
        return words + (self.rest[1:] if self.forwards_args else [])


def shell_form(config: dict[str, Any]) -> ShellForm | None:
    """Whether a container's ``Config`` (``docker inspect``) runs its server through a shell's ``-c`` string.

    The container runs ``Entrypoint + Cmd`` (Docker's exec form). It is in shell form when that starts (after an
    optional ``env``/``/usr/bin/env`` and its ``NAME=VALUE`` words) with a shell of :data:`SHELLS` whose options
    (``-c``, ``-lc``, ``-e -c``...) include ``c``: the shell then runs the first word after its options as a script
    and gives the words after it to the script as ``$0``, ``$1``... (POSIX ``sh -c``), so flags appended to the
    command (``release --arg``, ``--speculative-config``) never reach the server unless the script forwards
    ``"$@"``. A Dockerfile's shell-form ``CMD``/``ENTRYPOINT`` is ``["/bin/sh", "-c", "..."]``: the same case.

    Returns:
        :class:`ShellForm`, or None for an exec-form command.
    """
    words = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
    i = 0
    if words and words[0].rsplit("/", 1)[-1] == "env":
        i = 1
        while i < len(words) and ("=" in words[i] or words[i].startswith("-")):
            i += 1
    if i >= len(words) or words[i].rsplit("/", 1)[-1] not in SHELLS:
        return None
    start, i = i, i + 1
    if words[start].rsplit("/", 1)[-1] == "busybox":  # busybox sh -c ...
        if i >= len(words) or words[i] not in ("sh", "ash"):
            return None
        i += 1
    has_c = False
    while i < len(words) and words[i].startswith("-") and words[i] not in ("-", "--"):
        has_c = has_c or (not words[i].startswith("--") and "c" in words[i][1:])
        i += 1
    if i < len(words) and words[i] == "--":
        i += 1
    if not has_c or i >= len(words):
        return None
    script, rest = words[i], words[i + 1:]
    forwards = any(p in script for p in ('"$@"', "$@", "${@}")) and len(rest) >= 1
    return ShellForm(words[start:i], script, rest, forwards)


def server_words(config: dict[str, Any]) -> list[str]:
    """The words of a container's server command line: ``Entrypoint + Cmd``, or for a shell-form container
    (:func:`shell_form`) the words of its ``-c`` string (:meth:`ShellForm.words`)."""
    sf = shell_form(config)
    return sf.words() if sf is not None else [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]


def api_key_from_inspect(inspect: dict[str, Any]) -> str | None:
    """The API key a serving container requires, from its own ``docker inspect`` configuration: ``--api-key`` in
    its entrypoint + command (wins, as in vLLM; inside the ``-c`` string of a shell-form container too,
    :func:`server_words`), else ``VLLM_API_KEY`` in its environment; None when it needs none."""
    cfg = inspect.get("Config") or {}
    key = api_key_from_args(server_words(cfg))
    if key:
        return key
    for e in cfg.get("Env") or []:
        name, _, value = e.partition("=")
        if name == API_KEY_ENV and value:
            return value
    return None


def read_api_key_file(path: str | Path) -> str:
    """The API key in a secret file (its first line, stripped).

    Raises:
        ProbeFailed: the file cannot be read or is empty (the message names the file, never its content).
    """
    try:
        key = Path(path).read_text().strip().splitlines()
    except OSError as exc:
        raise ProbeFailed(f"cannot read the API key file {path} named by serving.api_key_file: "
                          f"{exc.strerror or exc}") from None
    if not key or not key[0].strip():
        raise ProbeFailed(f"the API key file {path} named by serving.api_key_file is empty")
    return key[0].strip()


def probe(base_url: str, model: str, *, api_key: str | None = None, completion: bool = True,
          request_timeout_s: float = 10.0, completion_timeout_s: float = 60.0) -> list[str]:
    """One probe of an OpenAI-compatible server: ``/health`` 200, ``/v1/models`` lists ``model``, and with
    ``completion`` one 4-token completion returns choices.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000``.
        api_key: sent as ``Authorization: Bearer`` when given.
        request_timeout_s: per request (seconds); ``completion_timeout_s`` for the completion.

    Returns:
        The model ids ``/v1/models`` listed.

    Raises:
        ProbeFailed: a request failed or answered wrongly; the message names the request (a 401 says the key is
            missing or wrong, and where the gate takes it from).
    """
    client = ServingClient(base_url, api_key, timeout_s=request_timeout_s)
    try:
        client.health()
        models = client.models()
        if model not in models:
            raise ProbeFailed(f"{MODELS} lists {models}, not {model!r}")
        if completion:
            out = client.completion(model, "Hello", 4, timeout_s=completion_timeout_s)
            if not (isinstance(out, dict) and out.get("choices")):
                raise ProbeFailed(f"completion returned no choices: {str(out)[:300]}")
    except ServingHTTPError as exc:
        if exc.status == 401:
            raise ProbeFailed(
                f"{exc.path} answered 401 Unauthorized: the server requires an API key and "
                f"{'the one the gate sent was refused' if api_key else 'the gate found none'} (the gate takes "
                f"it from the serving container's --api-key / {API_KEY_ENV}, else the file named by "
                f"serving.api_key_file in the inventory)") from None
        raise ProbeFailed(str(exc)) from None
    return models


def wait_healthy(base_url: str, model: str, *, timeout_s: float, interval_s: float = 2.0,
                 api_key: Callable[[], str | None] | str | None = None,
                 crashed: Callable[[], str | None] | None = None, completion: bool = True) -> list[str]:
    """Poll :func:`probe` until it passes, for at most ``timeout_s`` seconds (a slow start is waited out).

    Args:
        api_key: the key, or a function giving it (asked before each probe: a recreated container's key).
        crashed: asked before each probe; a text (the server's container crashed, with its logs) fails the gate
            at once. Its own exceptions (e.g. the Docker engine not answering) propagate: they are no verdict.
        interval_s: seconds between probes.

    Returns:
        The model ids listed by the passing probe.

    Raises:
        GateFailed: no passing probe within ``timeout_s``, or ``crashed`` reported a crash.
    """
    deadline = time.time() + timeout_s
    last = "no probe ran"
    while time.time() < deadline:
        if crashed is not None:
            why = crashed()
            if why:
                raise GateFailed(why)
        try:
            key = api_key() if callable(api_key) else api_key
            return probe(base_url, model, api_key=key, completion=completion)
        except ProbeFailed as exc:
            last = str(exc)
        time.sleep(min(interval_s, max(0.0, deadline - time.time())))
    raise GateFailed(f"health gate did not pass within {timeout_s:.0f}s: {last}")
