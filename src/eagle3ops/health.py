"""The health gate: the one poller that judges a server, used by the host-side supervisor and the driver side.

A gate asks what a client of the server needs: ``/health`` answers 200, ``/v1/models`` lists the served model, and
(optionally) one completion returns text. It talks to serving the way its clients do: when the server requires an
API key (vLLM ``--api-key`` or ``VLLM_API_KEY``), the gate sends it as ``Authorization: Bearer``. The key is taken
on the host, from the serving container's own configuration (:func:`api_key_from_inspect`) or a secret file named
in the inventory (``serving.api_key_file``, :func:`read_api_key_file`); it is never put in argv, logs, labels,
journal entries or error messages.

Standard library only (urllib): the driver side (``demo``, tests, benchmarks) imports it without the docker SDK.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def api_key_from_inspect(inspect: dict[str, Any]) -> str | None:
    """The API key a serving container requires, from its own ``docker inspect`` configuration: ``--api-key`` in
    its entrypoint + command (wins, as in vLLM), else ``VLLM_API_KEY`` in its environment; None when it needs none."""
    cfg = inspect.get("Config") or {}
    key = api_key_from_args([*(cfg.get("Entrypoint") or []), *(cfg.get("Cmd") or [])])
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
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def get(path: str, timeout: float, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        h = {**headers, **({"Content-Type": "application/json"} if data else {})}
        req = urllib.request.Request(base_url + path, data=data, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                if r.status != 200:
                    raise ProbeFailed(f"{path} returned {r.status}")
                return json.load(r) if path != "/health" else None
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                raise ProbeFailed(
                    f"{path} answered 401 Unauthorized: the server requires an API key and "
                    f"{'the one the gate sent was refused' if api_key else 'the gate found none'} (the gate takes "
                    f"it from the serving container's --api-key / {API_KEY_ENV}, else the file named by "
                    f"serving.api_key_file in the inventory)") from None
            raise ProbeFailed(f"{path} returned {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, ConnectionError, OSError, ValueError) as exc:
            raise ProbeFailed(f"{path}: {exc}") from None

    get("/health", request_timeout_s)
    try:
        models = [m["id"] for m in get("/v1/models", request_timeout_s)["data"]]
    except (KeyError, TypeError) as exc:
        raise ProbeFailed(f"/v1/models answered without a model list ({exc})") from None
    if model not in models:
        raise ProbeFailed(f"/v1/models lists {models}, not {model!r}")
    if completion:
        out = get("/v1/completions", completion_timeout_s, {"model": model, "prompt": "Hello", "max_tokens": 4})
        if not (isinstance(out, dict) and out.get("choices")):
            raise ProbeFailed(f"completion returned no choices: {str(out)[:300]}")
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
