"""The inventory's served model against the live server: a window does not stop serving when serving's
``/v1/models`` does not list ``serving.served_model_name``.

Why: the window records and later restores the live release as it is, but its health gate asks for the
inventory's ``served_model_name`` (``/v1/models`` must list it: :mod:`eagle3ops.health`), so a restored release
serving another model waits out the whole ``health_timeout_s`` and ends in a rollback; meanwhile the stages read
``model_path``, not the target production serves, so the hidden states and the head would be for another model. Met
on the sandbox when the demo's SmolLM2 inventory ran while serving served the tests' tiny Llama. The fix is in the
inventory (or in what serves), so the refusal names both and the keys.

``/v1/models`` is the OpenAI API's route that vLLM serves (``{"data": [{"id": NAME, ...}]}``; the ids are
``--served-model-name``'s, else the model path). A server that does not answer it with such a list (one that
requires an API key: ``curl -f`` fails on its 401; a stand-in) is not judged: the check says so and passes.
"""

from __future__ import annotations

from typing import Any

from eagle3ops.serving_http import MODELS
from eagle3ops.window.loopback import read_json

__all__ = ["check_served_model", "model_refusal", "served_models"]


def served_models(r: Any) -> list[str] | None:
    """The ids ``GET /v1/models`` lists on the host's loopback (:func:`eagle3ops.window.loopback.read_json`:
    read-only, one try of 5 s); None when it does not answer with a ``data`` list."""
    out = read_json(r, MODELS)
    data = out.get("data") if isinstance(out, dict) else None
    if not isinstance(data, list):
        return None
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


def model_refusal(h: Any, served: list[str] | None) -> str | None:
    """The refusal when ``served`` (``/v1/models``' ids) does not list host ``h``'s ``serving.served_model_name``,
    else None (pure); nothing to judge without a name or an answer."""
    name = h.serving.served_model_name
    if not name or served is None or name in served:
        return None
    return (f"live serving on {h.name} serves {served} (/v1/models), not hosts.{h.name}.serving.served_model_name "
            f"{name!r}: the window would restore that release and its health gate would wait health_timeout_s "
            f"({h.serving.health_timeout_s:.0f} s) for {name!r}, and the stages would read hosts.{h.name}.model_path "
            f"({h.model_path}), not the target serving answers with. Point the inventory at what serves "
            f"(served_model_name, model_path, serving's args) or serve that target; nothing was stopped")


def check_served_model(r: Any, pf: Any) -> None:
    """Add the ``served model`` check to preflight ``pf``: the live server's ``/v1/models`` against the inventory's
    ``serving.served_model_name`` (:func:`model_refusal`). Read-only."""
    served = served_models(r)
    refusal = model_refusal(r.host, served)
    if refusal:
        pf.add("served model", False, refusal)
    elif served is None:
        pf.add("served model", True, "not judged: serving did not answer /v1/models with a model list")
    else:
        pf.add("served model", True, f"{r.host.serving.served_model_name} (/v1/models)")
