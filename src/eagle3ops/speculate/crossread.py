"""A head checked as the *serving* image's vLLM reads it, when that vLLM is not the pipeline image's (a head
trained under one profile served under the other, e.g. trained with vLLM 0.16's pipeline and served by 0.32).

The pipeline image reads the head through its own vLLM's config loader (:func:`eagle3ops.speculate.onhost.
vllm_view`); a serving image of another vLLM version may read the same ``config.json`` differently (keys one
version reads and the other ignores, defaults that moved). So, before any restart, the same reader runs in the
serving image itself: the source of :func:`~eagle3ops.speculate.onhost.vllm_view` (it imports only vLLM,
transformers and the standard library; the serving image has no eagle3ops) is sent with ``python3 -c`` to a
throwaway container of the serving image, the head mounted read-only at ``/head``, no network
(:func:`eagle3ops.executor.read_in_image`), and its answer goes through the same key-by-key check
(:func:`eagle3ops.speculate.headcheck.check_vllm_reading`): a key read differently is refused by name, else the
head serves as trained. Skipped when the serving image's label says it is built for a profile of the pipeline's
vLLM version (no second vLLM import for the usual case).
"""

from __future__ import annotations

import inspect
import json
import textwrap
from typing import Any

from eagle3ops.commands import docker as dk
from eagle3ops.executor import read_in_image
from eagle3ops.speculate import onhost
from eagle3ops.speculate.headcheck import check_vllm_reading

#: the in-image reader: onhost.vllm_view's own source, called on the mounted head
HEAD_VIEW_SOURCE = ("import json\nfrom pathlib import Path\nfrom typing import Any\n\n"
                    + textwrap.dedent(inspect.getsource(onhost.vllm_view))
                    + "\nprint(json.dumps(vllm_view(Path('/head'))))\n")
#: seconds the reader may take (it imports vLLM)
READ_TIMEOUT_S = 300
PROFILE_LABEL = "io.eagle3ops.profile"
PINS_LABEL = "io.eagle3ops.pins"


def _base(v: str | None) -> str | None:
    return v.split("+", 1)[0] if v else None


def labelled_vllm(r: Any, image: str) -> str | None:
    """The vLLM version the serving ``image`` is labelled for (:func:`image_vllm`); None when unlabelled or unknown
    here. Read-only."""
    return image_vllm(r, image)[0]


def image_vllm(r: Any, image: str, ref: str | None = None) -> tuple[str | None, str]:
    """``(vLLM version, where it was read)`` of the serving ``image`` (a reference or an id; ``ref``: its reference
    when ``image`` is an id), from its labels (read-only: ``docker image inspect``): its ``io.eagle3ops.profile``
    label's ``vllm`` pin in patches/profiles.yaml, else the ``vllm`` of its ``io.eagle3ops.pins`` label (JSON,
    written by :func:`eagle3ops.images.tags.image_labels`), else what a base says of itself
    (:func:`eagle3ops.images.build.base_vllm_version`: a local stand-in base's ``io.eagle3ops.stand-in-for``, an
    upstream ``vllm/vllm-openai:vX.Y.Z`` tag); ``(None, why)`` when none says."""
    out = r.run(dk.inspect_images(r.host, [image]), check=False)
    try:
        labels = (json.loads(out.stdout)[0].get("Config") or {}).get("Labels") or {} if out.ok else {}
    except (ValueError, IndexError, AttributeError):
        return None, f"{image}: no image inspect answer"
    name = labels.get(PROFILE_LABEL)
    if name:
        try:
            from eagle3ops.config.profiles import load_registry
            from eagle3ops.patches.series import find_patches_dir

            pin = load_registry(find_patches_dir(None)).profiles[name].pins().get("vllm")
            if pin:
                return pin, f"label {PROFILE_LABEL} ({name})"
        except Exception:  # noqa: BLE001 - no registry here or no such profile: the pins label is read instead
            pass
    try:
        pin = json.loads(labels.get(PINS_LABEL) or "{}").get("vllm")
    except (ValueError, AttributeError):
        pin = None
    if isinstance(pin, str) and pin:
        return pin, f"label {PINS_LABEL}"
    from eagle3ops.images.build import base_vllm_version

    said = base_vllm_version(ref or image, labels)
    if said:
        return said, "the stand-in-for label or the vllm/vllm-openai tag"
    return None, f"{ref or image}: no label or tag naming its vLLM"


def view_in_image(r: Any, image: str, head_dir: str) -> dict[str, Any]:
    """The head at ``head_dir`` (on the host) as ``image``'s own vLLM reads it: ``vllm_view``'s answer, or
    ``{"error": ...}`` when the image could not read it (no vLLM, a loader refusal, no JSON)."""
    got = read_in_image(r, image, HEAD_VIEW_SOURCE, mounts=((head_dir, "/head"),), timeout=READ_TIMEOUT_S)
    return got.answer if got.answer is not None else {"error": got.silence()}


def check_as_serving_reads(r: Any, image: str | None, head_dir: str, info: dict[str, Any],
                           target_layers: int) -> list[str]:
    """Check the head as the serving ``image``'s vLLM reads it, when that is another vLLM than the pipeline image's
    (``info["vllm_view"]``: the pipeline's reading). Read-only; runs before any restart.

    Returns:
        notes: the head serves under that version as trained, or why it was not read there; empty when there is
        nothing to compare (no image, the same vLLM by label or by reading).

    Raises:
        HeadMismatch: that vLLM reads a key of the head otherwise than it was trained (named).
    """
    pipeline_v = _base((info.get("vllm_view") or {}).get("vllm_version"))
    if not image or (pipeline_v and _base(labelled_vllm(r, image)) == pipeline_v):
        return []
    view = view_in_image(r, image, head_dir)
    if view.get("error"):
        return [f"the head was not read by the serving image's own vLLM ({view['error']})"]
    served_v = _base(view.get("vllm_version"))
    if served_v == pipeline_v:
        return []
    check_vllm_reading(info["head_config"], view, target_layers=target_layers)
    return [f"the head as the serving image's vLLM {view.get('vllm_version')} reads it (trained with vLLM "
            f"{pipeline_v}): every key as trained, so it serves under that version"]
