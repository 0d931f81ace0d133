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

A stand-in pipeline environment (the venv runtime's tarball) carries the file :data:`STANDIN_ENV_MARKER` as its
first entry (JSON: ``what`` it is, ``why`` it is a stand-in, the ``image`` it was exported from, if any): the test
environment of :mod:`eagle3ops_dev.standin_env` always, and an environment exported from a stand-in pipeline image
(:mod:`eagle3ops.transfer.envbuild`); read by :func:`eagle3ops.transfer.envdeliver.env_marker` from the tarball's head.

A host is a sandbox when its ``docker_host`` is a sandbox engine's socket,
``unix:///var/lib/eagle3ops-sandbox/<name>/docker.sock`` (the test ``eagle3ops_dev.sandbox.name_of`` applies to the
inventory's ``sandbox`` entry), or, for a venv host (``stage_runtime: venv``: no engine, so no ``docker_host``), when
its ``state_dir`` lies under ``/var/lib/eagle3ops-sandbox/<name>/`` (where the sandboxes' venv hosts keep their
state). Stand-ins are refused by name on every other host by every command that sends one (:func:`refusal`, the one
rule): ``deploy`` and ``push`` (the image's labels on the build engine, before anything is built or sent),
``deploy --env-tarball`` (the marker), ``release --image`` and ``speculate`` (the labels on the host).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

__all__ = ["ENV_FIX", "PIPELINE_FIX", "REAL_BASE", "SANDBOX_STATE_ROOT", "SERVING_FIX", "STANDIN_ENV_MARKER", "STANDIN_LABELS",
           "STANDIN_REPOSITORIES", "env_standin_reason", "image_fix", "is_sandbox", "refusal", "standin_reason",
           "standin_refusal"]

#: Where sandbox engines keep their state; a sandbox's ``docker_host`` is ``unix://<this>/<name>/docker.sock``.
SANDBOX_STATE_ROOT = "/var/lib/eagle3ops-sandbox"
#: Labels that mark a stand-in image (see the module doc).
STANDIN_LABELS = ("io.eagle3ops.standin", "io.eagle3ops.stand-in-for", "io.eagle3ops.stand-in")
#: Repositories of the stand-in bases (``eagle3ops_dev.bases``: LOCAL_BASE_TAG, UPSTREAM_BASE_TAG, STANDIN_REPO).
STANDIN_REPOSITORIES = ("eagle3ops/vllm-openai-local", "eagle3ops/vllm-openai-upstream-standin",
                        "eagle3ops/standin-vllm-base")
#: The file a stand-in pipeline environment's tarball holds as its first entry (see the module doc).
STANDIN_ENV_MARKER = "eagle3ops-standin.json"
#: The real base the stand-in bases stand in for (``images/pipeline.yaml``'s ``base.image``).
REAL_BASE = "vllm/vllm-openai:v0.16.0"
#: What to do instead of sending a stand-in serving image (or a stand-in base as one).
SERVING_FIX = ("Use a production serving image, e.g. one built by `eagle3ops image build serving` on "
               f"{REAL_BASE.split(':')[0]}")
#: What to do instead of sending a pipeline image built on a stand-in base (``{host}``: the host's name).
PIPELINE_FIX = (f"Build the pipeline image on the real base {REAL_BASE} (images/pipeline.yaml's base): "
                "`eagle3ops deploy {host}` without --base-image")
#: What to do instead of sending a stand-in pipeline environment (``{host}``: the host's name).
ENV_FIX = ("Deploy the real pipeline environment: `eagle3ops deploy {host}` without --env-tarball exports it from the "
           f"pipeline image built on {REAL_BASE}")


def is_sandbox(host: Any) -> bool:
    """True when ``host`` (a :class:`~eagle3ops.config.HostConfig`) is a sandbox: its ``docker_host`` is
    ``unix:///var/lib/eagle3ops-sandbox/<name>/docker.sock``, or it is a venv host (no ``docker_host``) whose
    ``state_dir`` lies under ``/var/lib/eagle3ops-sandbox/<name>/``."""
    if getattr(host, "uses_venv", False):
        state = PurePosixPath(getattr(host, "state_dir", "") or "/")
        return (".." not in state.parts and state.is_relative_to(SANDBOX_STATE_ROOT)
                and len(state.relative_to(SANDBOX_STATE_ROOT).parts) >= 2)
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


def env_standin_reason(marker: Mapping[str, Any] | None) -> str | None:
    """Why a pipeline environment is a stand-in, from its :data:`STANDIN_ENV_MARKER` (parsed JSON; None when the
    tarball holds none): the marker's ``what`` and ``why``; None for an environment without a marker."""
    if marker is None:
        return None
    what, why = marker.get("what") or "a stand-in", marker.get("why") or "no reason given"
    return f"it holds {STANDIN_ENV_MARKER}: {what}; {why}"


def image_fix(labels: Mapping[str, str] | None) -> str:
    """The fix a refusal of an image names: :data:`PIPELINE_FIX` for a pipeline image (its ``io.eagle3ops.image``
    label), :data:`SERVING_FIX` for any other (a serving image, a stand-in base sent as one)."""
    return PIPELINE_FIX if (labels or {}).get("io.eagle3ops.image") == "eagle3ops/pipeline" else SERVING_FIX


def refusal(host: Any, what: str, subject: str, noun: str, why: str | None, fix: str) -> str | None:
    """The one rule: the refusal message for ``what`` (a command, e.g. ``deploy``) sending ``subject`` (an image
    reference, an environment's digest and file) to ``host``, or None when allowed: nothing marks it a stand-in
    (``why`` None) or ``host`` is a sandbox (:func:`is_sandbox`). The message names the host, the command, the
    subject, ``noun`` (``stand-in image``, ``stand-in pipeline environment``), what marks it and ``fix`` (its
    ``{host}`` replaced by the host's name)."""
    if why is None or is_sandbox(host):
        return None
    return (f"{host.name}: {what} refused: {subject} is a {noun} ({why}); stand-ins run only on a sandbox "
            f"host (docker_host unix://{SANDBOX_STATE_ROOT}/<name>/docker.sock, or a venv host whose state_dir is "
            f"under {SANDBOX_STATE_ROOT}/<name>/). {fix.replace('{host}', host.name)}")


def standin_refusal(host: Any, image: str, labels: Mapping[str, str] | None, what: str,
                    fix: str | None = None) -> str | None:
    """The refusal message for ``what`` (e.g. ``release --image``) putting ``image`` (labels ``labels`` where they
    could be read) on ``host``, or None when allowed (:func:`refusal`); ``fix`` defaults to :func:`image_fix`."""
    return refusal(host, what, image, "stand-in image", standin_reason(image, labels),
                   fix if fix is not None else image_fix(labels))
