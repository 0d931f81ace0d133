"""The one HTTP client of the serving API (an OpenAI-compatible server: vLLM's ``vllm serve``), beneath the health
gate, the speed gate's measurement, regeneration and ``watch``.

It knows the endpoints a client of eagle3ops uses and the one way the API key travels: vLLM started with
``--api-key`` (or ``VLLM_API_KEY``) answers 401 to ``/v1/*`` requests without ``Authorization: Bearer <key>``
(vLLM 0.16 ``vllm/entrypoints/openai/api_server.py``, its ``AuthenticationMiddleware``); :func:`auth_headers` is
the only place that header is built. The key never appears in an error this module raises.

:class:`ServingClient` asks one request at a time (``/health``, ``/v1/models``, ``/v1/completions``, ``/metrics``,
``/tokenize``, ``/version``); the traffic of the speed gate and of regeneration (many requests at once, streamed)
goes through httpx clients that take their headers from :func:`auth_headers`.

Standard library only (urllib): the supervisor imports it through :mod:`eagle3ops.health`, in the pipeline image and
in a venv host's pipeline environment alike.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

#: The serving API's endpoints (vLLM 0.16's OpenAI-compatible server).
HEALTH = "/health"
MODELS = "/v1/models"
COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
METRICS = "/metrics"
TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"
VERSION = "/version"


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The HTTP headers that carry ``api_key`` (``Authorization: Bearer <key>``, as vLLM's ``--api-key`` asks);
    none when it is None or empty."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class ServingHTTPError(Exception):
    """A request to the serving API failed. ``path``: the endpoint; ``status``: the HTTP status (None when no answer
    came: refused, timed out, unreadable); ``reason``: the status's reason or the transport's error, never the key.
    The message: ``PATH returned STATUS REASON``, ``PATH: REASON`` without a status, or ``message`` when given."""

    def __init__(self, path: str, status: int | None, reason: str, message: str | None = None):
        said = (f"{path}: {reason}" if status is None
                else f"{path} returned {status} {reason}" if reason else f"{path} returned {status}")
        super().__init__(message or said)
        self.path, self.status, self.reason = path, status, reason


class ServingClient:
    """One serving API at ``base_url`` (``http://127.0.0.1:8000``), asked with ``api_key`` (None: no key).

    Args:
        base_url: scheme, host and port, no trailing slash.
        api_key: sent on every request as :func:`auth_headers` builds it.
        timeout_s: seconds each request may take unless the call names its own.
    """

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout_s: float = 10.0):
        self.base_url, self.api_key, self.timeout_s = base_url.rstrip("/"), api_key, timeout_s

    @property
    def headers(self) -> dict[str, str]:
        """The headers of every request (the API key's, :func:`auth_headers`)."""
        return auth_headers(self.api_key)

    def request(self, path: str, body: dict[str, Any] | None = None, *, timeout_s: float | None = None) -> bytes:
        """``GET path`` (or ``POST`` of ``body`` as JSON); the answer's body.

        Raises:
            ServingHTTPError: a status other than 200 (``status`` set), or no answer (``status`` None).
        """
        data = json.dumps(body).encode() if body is not None else None
        headers = {**self.headers, **({"Content-Type": "application/json"} if data is not None else {})}
        req = urllib.request.Request(self.base_url + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s if timeout_s is None else timeout_s) as r:
                if r.status != 200:
                    raise ServingHTTPError(path, r.status, "")
                return r.read()
        except urllib.error.HTTPError as exc:
            raise ServingHTTPError(path, exc.code, str(exc.reason)) from None
        except (urllib.error.URLError, ConnectionError, OSError, ValueError) as exc:
            raise ServingHTTPError(path, None, str(exc)) from None

    def json(self, path: str, body: dict[str, Any] | None = None, *, timeout_s: float | None = None) -> Any:
        """:meth:`request`, its answer read as JSON.

        Raises:
            ServingHTTPError: as :meth:`request`, or an answer that is not JSON (``status`` 200).
        """
        raw = self.request(path, body, timeout_s=timeout_s)
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ServingHTTPError(path, 200, f"not JSON ({exc})", f"{path}: {exc}") from None

    def health(self, *, timeout_s: float | None = None) -> None:
        """``GET /health`` answers 200 (vLLM: the engine is up).

        Raises:
            ServingHTTPError: it did not.
        """
        self.request(HEALTH, timeout_s=timeout_s)

    def models(self, *, timeout_s: float | None = None) -> list[str]:
        """The model ids ``GET /v1/models`` lists (``data[].id``).

        Raises:
            ServingHTTPError: no answer, another status, or an answer without a model list (``status`` 200).
        """
        out = self.json(MODELS, timeout_s=timeout_s)
        try:
            return [m["id"] for m in out["data"]]
        except (KeyError, TypeError) as exc:
            raise ServingHTTPError(MODELS, 200, f"no model list ({exc})",
                                   f"{MODELS} answered without a model list ({exc})") from None

    def completion(self, model: str, prompt: str, max_tokens: int, *, timeout_s: float | None = None) -> Any:
        """``POST /v1/completions`` of ``prompt`` for at most ``max_tokens`` tokens; the answer as JSON.

        Raises:
            ServingHTTPError: as :meth:`json`.
        """
        return self.json(COMPLETIONS, {"model": model, "prompt": prompt, "max_tokens": int(max_tokens)},
                         timeout_s=timeout_s)

    def metrics(self, *, timeout_s: float | None = None) -> str:
        """``GET /metrics``: the Prometheus text (:func:`eagle3ops.gate.metrics.parse` reads it).

        Raises:
            ServingHTTPError: as :meth:`request`.
        """
        return self.request(METRICS, timeout_s=timeout_s).decode("utf-8", "replace")

    def tokenize(self, model: str, *, prompt: str | None = None, messages: list[dict[str, Any]] | None = None,
                 add_generation_prompt: bool = True, timeout_s: float | None = None) -> list[int]:
        """The token ids of ``prompt``, or of ``messages`` rendered by the server's chat template (``POST
        /tokenize``, vLLM's: ``{"tokens": [...]}``).

        Raises:
            ValueError: neither or both of ``prompt`` and ``messages``.
            ServingHTTPError: as :meth:`json`, or an answer without ``tokens`` (``status`` 200).
        """
        if (prompt is None) == (messages is None):
            raise ValueError("tokenize takes a prompt or messages, one of them")
        body: dict[str, Any] = {"model": model}
        body.update({"prompt": prompt} if prompt is not None else {"messages": messages,
                                                                   "add_generation_prompt": add_generation_prompt})
        out = self.json(TOKENIZE, body, timeout_s=timeout_s)
        if not (isinstance(out, dict) and isinstance(out.get("tokens"), list)):
            raise ServingHTTPError(TOKENIZE, 200, "no tokens", f"{TOKENIZE} answered without tokens: {str(out)[:200]}")
        return out["tokens"]

    def version(self, *, timeout_s: float | None = None) -> str | None:
        """vLLM's ``GET /version`` (``{"version": "0.16.0"}``); None when the server does not answer it (another
        server, or no answer)."""
        try:
            out = self.json(VERSION, timeout_s=timeout_s)
        except ServingHTTPError:
            return None
        return out.get("version") if isinstance(out, dict) else None
