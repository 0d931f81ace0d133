"""Before a release changes the serving image: the served tokenizer as each image's own transformers reads it.

A vLLM upgrade brings another transformers, and a tokenizer saved by one version may be read otherwise by the next:
transformers 5.19 (vLLM 0.32) reads a saved ``tokenizer_class: LlamaTokenizer`` beside a byte-level BPE
``tokenizer.json`` as a different tokenizer than 4.57.6 (vLLM 0.16) did, and the server then answers garbage at full
speed, which ``release --gate`` (a speed gate) keeps (benchmarks/vllm-upgrade-gate/, docs/spikes/vllm-0.32-cpu.md).
So, before any restart, the tokenizer production serves (``--tokenizer``, else the model, as the release's command
line names it) is loaded in a throwaway container of the live image and of the new one (mounted read-only, no
network: :func:`eagle3ops.executor.read_in_image`) with ``AutoTokenizer.from_pretrained`` (how vLLM
loads a Hugging Face tokenizer) and a few fixed texts are encoded; different ids refuse the release, naming the
class each version loaded and the first text that differs.
"""

from __future__ import annotations

import json
from typing import Any

from eagle3ops.executor import read_in_image

#: texts encoded by both images: plain English, code with indentation, non-ASCII (byte-level BPE's edge)
SAMPLES = ("Hello world, what is the capital of France?", "def add(a, b):\n    return a + b\n",
           "Grüße aus Köln — 東京 🙂")
#: seconds one image may take (it imports transformers)
READ_TIMEOUT_S = 300
TOKENIZER_AT = "/tokenizer"

TOKENIZE_SOURCE = (
    "import json\nimport transformers\nfrom transformers import AutoTokenizer\n"
    f"tok = AutoTokenizer.from_pretrained({TOKENIZER_AT!r})\n"
    # through json.loads in the image: an ASCII-only source, and the emoji's surrogate pair decoded as one character
    f"samples = json.loads({json.dumps(json.dumps(list(SAMPLES)))})\n"
    "print(json.dumps({'transformers': transformers.__version__, 'class': type(tok).__name__,\n"
    "                  'ids': [tok.encode(s, add_special_tokens=False) for s in samples]}))\n"
)


def tokenizer_path(argv: list[str]) -> str | None:
    """The tokenizer a ``vllm serve`` command line loads (pure): ``--tokenizer X`` / ``--tokenizer=X``, else the
    model (``--model X`` / ``--model=X``, else the first word after ``serve``, or the first word when there is no
    ``serve``, that is not a flag). None when none is found.

    >>> tokenizer_path(["vllm", "serve", "/models/m", "--tokenizer=/models/m/tok"])
    '/models/m/tok'
    >>> tokenizer_path(["/models/m", "--port", "8000"])
    '/models/m'
    """
    for flag in ("--tokenizer", "--model"):
        for i, word in enumerate(argv):
            if word.startswith(flag + "="):
                return word.split("=", 1)[1]
            if word == flag and i + 1 < len(argv):
                return argv[i + 1]
    rest = argv[argv.index("serve") + 1:] if "serve" in argv else argv
    return rest[0] if rest and not rest[0].startswith("-") else None


def host_path(path: str, binds: list[str]) -> str | None:
    """``path`` inside the container as a host path through the container's ``HOST:CONTAINER[:OPTS]`` binds (pure;
    the longest container prefix wins). None when no bind holds it (a Hugging Face repo id, a path in the image).

    >>> host_path("/models/m/tok", ["/data/m:/models/m:ro"])
    '/data/m/tok'
    """
    best: tuple[int, str] | None = None
    for bind in binds:
        parts = bind.split(":")
        if len(parts) < 2:
            continue
        src, dst = parts[0], parts[1].rstrip("/") or "/"
        if path == dst or path.startswith(dst + "/"):
            if best is None or len(dst) > best[0]:
                best = (len(dst), src.rstrip("/") + path[len(dst):])
    return best[1] if best else None


def tokenizer_refusal(host: str, old: dict[str, Any], new: dict[str, Any], *, old_image: str, new_image: str,
                      path: str) -> str | None:
    """The refusal when the two images' readings (:data:`TOKENIZE_SOURCE`'s answers) encode :data:`SAMPLES`
    differently, else None (pure)."""
    for text, a, b in zip(SAMPLES, old.get("ids") or [], new.get("ids") or []):
        if a != b:
            return (f"{host}: the tokenizer at {path} reads differently under {new_image} (transformers "
                    f"{new.get('transformers')}, {new.get('class')}) than under the live {old_image} (transformers "
                    f"{old.get('transformers')}, {old.get('class')}): {text!r} encodes to {b[:8]}... instead of "
                    f"{a[:8]}...; the new release would serve other token ids. Nothing was restarted: give it a "
                    f"tokenizer both read alike (e.g. a copy saved with tokenizer_class PreTrainedTokenizerFast, "
                    f"--arg=--tokenizer --arg=DIR; docs/vllm-profiles.md)")
    return None


def tokenize_in_image(r: Any, image: str, host_dir: str) -> dict[str, Any]:
    """:data:`TOKENIZE_SOURCE`'s answer in a throwaway container of ``image`` with ``host_dir`` at
    :data:`TOKENIZER_AT` (:func:`eagle3ops.executor.read_in_image`), or ``{"error": ...}`` when it gave none.
    Read-only."""
    got = read_in_image(r, image, TOKENIZE_SOURCE, mounts=((host_dir, TOKENIZER_AT),), timeout=READ_TIMEOUT_S)
    return got.answer if got.answer is not None else {"error": got.silence()}


def live_spec(r: Any, image: str | None) -> dict[str, Any] | None:
    """:func:`eagle3ops.window.kinds.container.live_spec_for_image` (the live serving container's ``docker inspect``
    when a release to ``image`` changes its image; None otherwise). Read-only."""
    from eagle3ops.window.kinds import driver_kind
    from eagle3ops.window.kinds.container import live_spec_for_image

    return live_spec_for_image(r, driver_kind(r.host), image)


def check_tokenizer(r: Any, image: str | None, args: list[str]) -> dict[str, Any] | None:
    """With a new ``image``: production's tokenizer as it serves today (the live container's command line, read by
    the live image) against the release's (that command line with ``args`` set as the release sets them, read by
    ``image``). Read-only; runs before any restart.

    Returns:
        figures for the result: ``{"path", "live_path", "old", "new", "same": True}``, or ``{"not_compared": why}`` (no
        tokenizer found on a bind, an image that could not read it); None: no image, no live serving container, or
        the same image.

    Raises:
        ValueError: the two readings encode a sample differently (:func:`tokenizer_refusal`'s message).
    """
    from eagle3ops.commands import serving as sv

    spec = live_spec(r, image)
    if spec is None:
        return None
    cfg, hcfg = spec.get("Config") or {}, spec.get("HostConfig") or {}
    live = [*(cfg.get("Entrypoint") or []), *(cfg.get("Cmd") or [])]
    binds = list(hcfg.get("Binds") or [])
    # production's tokenizer as it serves today, against the one the release will serve (--tokenizer may change)
    paths = (tokenizer_path(live), tokenizer_path(sv.set_args(live, list(args))))
    srcs = [host_path(p, binds) if p else None for p in paths]
    if None in srcs:
        bad = paths[srcs.index(None)] or "(none named)"
        return {"not_compared": f"the tokenizer {bad} is not on a bind of the serving container"}
    old_image = cfg.get("Image") or spec["Image"]
    old, new = tokenize_in_image(r, old_image, srcs[0]), tokenize_in_image(r, image, srcs[1])
    if old.get("error") or new.get("error"):
        return {"not_compared": old.get("error") or new.get("error"), "path": paths[1]}
    shown = paths[1] if paths[0] == paths[1] else f"{paths[1]} (production: {paths[0]})"
    refusal = tokenizer_refusal(r.host.name, old, new, old_image=old_image, new_image=image, path=shown)
    if refusal:
        raise ValueError(refusal)
    return {"path": paths[1], "live_path": paths[0], "old": {k: old.get(k) for k in ("transformers", "class")},
            "new": {k: new.get(k) for k in ("transformers", "class")}, "same": True}
