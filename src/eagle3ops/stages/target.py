"""The target (verifier) model as the stages read it: its text config, its text backbone's tensors and modules.

Two checkpoint layouts are handled, decided by where ``model.embed_tokens.weight`` is found:

- text models (Llama, Qwen, DeepSeek-V3): the backbone at the top, ``model.*`` and ``lm_head.weight``;
- multimodal wrappers whose text backbone sits under ``language_model.`` (Kimi-K2.5's
  ``KimiK25ForConditionalGeneration``: ``language_model.model.embed_tokens.weight``,
  ``language_model.model.norm.weight``, ``language_model.lm_head.weight``; vLLM 0.16 loads those names). Their
  config nests the backbone's sizes in ``text_config`` and may ship as remote code (transformers 4.57.6 has no
  ``kimi_k25`` config), so configs are always read with ``trust_remote_code=True``.

The same prefixes are searched by this project's speculators patch (``verifier_text_prefix`` in
``speculators/utils/loading.py``, series 0.3.0), which reads the embeddings and lm_head for the draft head.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Where a checkpoint may keep its text backbone, searched in this order.
TEXT_BACKBONE_PREFIXES: tuple[str, ...] = ("", "language_model.")
#: The backbone tensors the stages read, by role (names relative to the backbone prefix).
BACKBONE_TENSORS: dict[str, str] = {
    "embeddings": "model.embed_tokens.weight",
    "final_norm": "model.norm.weight",
    "lm_head": "lm_head.weight",
}


def target_config(target_model: str) -> Any:
    """The target's config: ``AutoConfig.from_pretrained(trust_remote_code=True)`` (remote-code configs too)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(target_model, trust_remote_code=True)


def target_text_config(target_model: str) -> Any:
    """The config of the target's text backbone: ``text_config`` when the config nests one (multimodal wrappers
    such as Kimi-K2.5, whose wrapper config carries no layer count or width of its own), else the config itself."""
    cfg = target_config(target_model)
    text = getattr(cfg, "text_config", None)
    return text if text is not None else cfg


def checkpoint_tensor_names(target_model: str) -> dict[str, str]:
    """Tensor name -> safetensors file (relative to the model directory) of a local checkpoint.

    Raises:
        FileNotFoundError: neither ``model.safetensors.index.json`` nor ``model.safetensors`` exists.
    """
    root = Path(target_model)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        return dict(json.loads(index.read_text())["weight_map"])
    single = root / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"{target_model}: no model.safetensors.index.json or model.safetensors")
    from safetensors import safe_open

    with safe_open(str(single), framework="pt", device="cpu") as f:
        return dict.fromkeys(f.keys(), "model.safetensors")


def text_backbone_prefix(target_model: str) -> str:
    """The prefix (one of :data:`TEXT_BACKBONE_PREFIXES`) under which the checkpoint holds
    ``model.embed_tokens.weight``.

    Raises:
        KeyError: no prefix does (the message lists the names looked for).
    """
    names = checkpoint_tensor_names(target_model)
    for prefix in TEXT_BACKBONE_PREFIXES:
        if prefix + BACKBONE_TENSORS["embeddings"] in names:
            return prefix
    looked = ", ".join(p + BACKBONE_TENSORS["embeddings"] for p in TEXT_BACKBONE_PREFIXES)
    raise KeyError(f"{target_model}: no embedding tensor in the checkpoint (looked for {looked})")


def load_backbone_tensors(target_model: str, roles: list[str]) -> dict[str, Any]:
    """Tensors of the text backbone by role (keys of :data:`BACKBONE_TENSORS`), read under the checkpoint's
    backbone prefix; returns role -> tensor (as stored).

    Raises:
        KeyError: a tensor is missing (the message names the full checkpoint name looked for).
    """
    from safetensors import safe_open

    names = checkpoint_tensor_names(target_model)
    prefix = text_backbone_prefix(target_model)
    out: dict[str, Any] = {}
    for role in roles:
        name = prefix + BACKBONE_TENSORS[role]
        if name not in names:
            raise KeyError(f"{target_model}: no `{name}` tensor ({role} of the text backbone) in the checkpoint")
        with safe_open(str(Path(target_model) / names[name]), framework="pt", device="cpu") as f:
            out[role] = f.get_tensor(name)
    return out


def load_text_model(target_model: str, dtype: Any = None) -> Any:
    """The target's text backbone as a transformers causal LM (eval mode, on CPU).

    Text models: ``AutoModelForCausalLM.from_pretrained`` (``trust_remote_code``, eager attention; ``dtype`` None
    = the checkpoint's). Wrappers (backbone under ``language_model.``): ``AutoModelForCausalLM.from_config`` of
    ``text_config``, then every ``language_model.*`` tensor loaded with the prefix stripped (strict: a missing
    or extra backbone tensor raises); the vision tower and projector are not loaded.

    Raises:
        RuntimeError: the wrapper's backbone tensors do not fit the text config's model.
    """
    import torch
    from transformers import AutoModelForCausalLM

    prefix = text_backbone_prefix(target_model)
    if not prefix:
        return AutoModelForCausalLM.from_pretrained(
            target_model, trust_remote_code=True, dtype=dtype or "auto", attn_implementation="eager"
        ).eval()
    from safetensors.torch import load_file

    text = target_text_config(target_model)
    text._attn_implementation = "eager"
    want = dtype or getattr(text, "dtype", None) or getattr(target_config(target_model), "dtype", None)
    if isinstance(want, str):
        want = getattr(torch, want)
    model = AutoModelForCausalLM.from_config(text, dtype=want or torch.float32)
    sd: dict[str, Any] = {}
    for name, file in checkpoint_tensor_names(target_model).items():
        if name.startswith(prefix):
            if file not in sd:
                sd[file] = load_file(str(Path(target_model) / file))
    state = {k[len(prefix):]: v for part in sd.values() for k, v in part.items() if k.startswith(prefix)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # transformers keeps DeepSeek's e_score_correction_bias as a buffer, also in the state dict.
    if missing or unexpected:
        raise RuntimeError(f"{target_model}: the `{prefix}*` tensors do not fit {type(model).__name__} of "
                           f"text_config (missing {missing[:5]}, unexpected {unexpected[:5]})")
    return model.to(want or torch.float32).eval()
