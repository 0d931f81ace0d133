"""Stand-ins and the sandbox, told apart from production by name (pure; no I/O).

A stand-in image is one this repository builds so that the sandbox (a CPU machine) can go through the production
code path: the local vLLM base (``eagle3ops/vllm-openai-local``: CPU vLLM in a venv), the upstream-layout base
(``eagle3ops/vllm-openai-upstream-standin``), the test base (``eagle3ops/standin-vllm-base``) and every image
built from a ``standin: true`` patch profile (e.g. the CPU stand-in serving image
``eagle3ops/serving:sandbox-cpu-standin``, greedy only). They are recognised by their labels (``io.eagle3ops.standin`` on an image of a stand-in profile,
``io.eagle3ops.stand-in-for`` on a stand-in base and every image built on it: labels are inherited,
``io.eagle3ops.stand-in`` on the test base; written by :mod:`eagle3ops.images.tags` and
:mod:`eagle3ops_dev.bases`) and, where the labels cannot be read (an image the host does not hold yet), by
reference: one of the stand-in repositories above, or ``standin`` / ``stand-in`` in the reference.

A host is a sandbox when its ``docker_host`` is a sandbox engine's socket,
``unix:///var/lib/eagle3ops-sandbox/<name>/docker.sock`` (the test ``eagle3ops_dev.sandbox.name_of`` applies to the
inventory's ``sandbox`` entry). Stand-in images are refused by name on every other host, at ``release --image`` and
``speculate`` as at build (issue 24).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

__all__ = ["SANDBOX_STATE_ROOT", "STANDIN_LABELS", "STANDIN_REPOSITORIES", "is_sandbox", "standin_reason",
           "standin_refusal"]

#: Where sandbox engines keep their state; a sandbox's ``docker_host`` is ``unix://<this>/<name>/docker.sock``.
SANDBOX_STATE_ROOT = "/var/lib/eagle3ops-sandbox"
#: Labels that mark a stand-in image (see the module doc).
STANDIN_LABELS = ("io.eagle3ops.standin", "io.eagle3ops.stand-in-for", "io.eagle3ops.stand-in")
#: Repositories of the stand-in bases (``eagle3ops_dev.bases``: LOCAL_BASE_TAG, UPSTREAM_BASE_TAG, STANDIN_REPO).
STANDIN_REPOSITORIES = ("eagle3ops/vllm-openai-local", "eagle3ops/vllm-openai-upstream-standin",
                        "eagle3ops/standin-vllm-base")


def is_sandbox(host: Any) -> bool:
    """True when ``host`` (a :class:`~eagle3ops.config.HostConfig`) is a sandbox: its ``docker_host`` is
    ``unix:///var/lib/eagle3ops-sandbox/<name>/docker.sock``."""
    dh = getattr(host, "docker_host", None) or ""
    if not dh.startswith("unix://"):
        return False
    path = PurePosixPath(dh.removeprefix("unix://"))
    return path.name == "docker.sock" and str(path.parent.parent) == SANDBOX_STATE_ROOT and bool(path.parent.name)


def _repository(image: str) -> str:
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return ref[: len(ref) - len(last)] + last.split(":", 1)[0]


def standin_reason(image: str, labels: Mapping[str, str] | None = None) -> str | None:
    """Why ``image`` is a stand-in (a label it carries, its repository, or its reference), None when nothing says
    it is one. ``labels``: the image's labels where they could be read."""
    for key in STANDIN_LABELS:
        if labels and key in labels:
            return f"it carries the label {key}={labels[key]!r}"
    repo = _repository(image)
    if repo in STANDIN_REPOSITORIES or any(repo.endswith("/" + r) for r in STANDIN_REPOSITORIES):
        return f"{repo} is a stand-in base built for the sandbox (not vLLM's production image)"
    low = image.lower()
    if "standin" in low or "stand-in" in low:
        return "its reference names it a stand-in"
    return None


def standin_refusal(host: Any, image: str, labels: Mapping[str, str] | None, what: str) -> str | None:
    """The refusal message for ``what`` (e.g. ``release --image``) putting ``image`` on ``host``, or None when
    allowed: a stand-in image is allowed on a sandbox only (:func:`is_sandbox`)."""
    why = standin_reason(image, labels)
    if why is None or is_sandbox(host):
        return None
    return (f"{host.name}: {what} refused: {image} is a stand-in image ({why}); stand-ins run only on a sandbox "
            f"host (docker_host unix://{SANDBOX_STATE_ROOT}/<name>/docker.sock). Use a production serving image, "
            "e.g. one built by `eagle3ops image build serving` on vllm/vllm-openai")
