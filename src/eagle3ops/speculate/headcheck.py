"""Check an EAGLE-3 draft head against the served target before anything on the host changes (pure).

What vLLM 0.16 needs from a head (``vllm/model_executor/models/llama_eagle3.py``, ``vllm/config/speculative.py``,
``vllm/transformers_utils/configs/speculators/``; shared/FACTS.md), checked here from the head's ``config.json``,
the shapes in its safetensors header(s) and the target's ``config.json`` (``text_config`` when nested):

* **hidden size**: the draft's ``fc`` fuses the target's aux hidden states, ``fc.weight`` is
  ``[hidden, n_aux * target_hidden]``; ``target_hidden_size`` (when set) and the draft's hidden size must equal the
  target's ``hidden_size`` (vLLM shares the target's embedding with the draft when the head has none).
* **vocabulary**: the draft's ``vocab_size`` is the target's; ``d2t`` has ``draft_vocab_size`` entries (offsets,
  ``target id = i + d2t[i]``), ``t2d`` (when stored; vLLM skips it) has one per target token, ``lm_head.weight``
  has ``draft_vocab_size`` rows.
* **aux layers**: ``eagle_aux_hidden_state_layer_ids`` are vLLM-convention ids: vLLM captures the *input* of each
  listed target layer inside its ``for idx, layer in enumerate(layers)`` loop as ``hidden_states + residual``
  (``vllm/model_executor/models/llama.py``), and ``residual`` is None before layer 0, so each id must be in
  ``[1, num_hidden_layers)`` (id 0 fails at the first request); as many as ``fc`` fuses.
* **verifier**: a speculators-format head names its verifier (``speculators_config.verifier``): its architectures
  must be the target's.

Each failure is a :class:`HeadMismatch` naming the field, both values and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HeadFacts", "HeadMismatch", "check_head", "offline_acceptance"]


class HeadMismatch(ValueError):
    """The head does not fit the served target; ``field`` is the head's config key or tensor at fault."""

    def __init__(self, field_name: str, message: str, fix: str) -> None:
        self.field = field_name
        super().__init__(f"draft head `{field_name}`: {message}; fix: {fix}")


@dataclass(frozen=True)
class HeadFacts:
    """What the check established (recorded in the gate's results)."""

    hidden_size: int
    target_vocab_size: int
    draft_vocab_size: int
    aux_layer_ids: list[int]
    target_layers: int
    verifier_architectures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _text(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    return cfg.get("text_config") or cfg


def check_head(head_config: Mapping[str, Any], shapes: Mapping[str, Sequence[int]],
               target_config: Mapping[str, Any]) -> HeadFacts:
    """Check a head (``config.json`` dict, tensor name -> shape from its safetensors headers) against the target's
    ``config.json`` dict.

    Accepts speculators' format (``transformer_layer_config``, ``speculators_config``) and the
    ``Eagle3LlamaForCausalLM``/``LlamaForCausalLMEagle3`` layout (flat keys), as vLLM 0.16 does.

    Raises:
        HeadMismatch: the first misfit, by field (see the module doc).
    """
    tgt = _text(target_config)
    t_hidden, t_vocab, t_layers = int(tgt["hidden_size"]), int(tgt["vocab_size"]), int(tgt["num_hidden_layers"])
    layer = head_config.get("transformer_layer_config") or head_config
    retrain = "train the head for this target (eagle3ops train) or pass the head trained for it"
    d_hidden = int(layer.get("hidden_size", 0))
    if d_hidden != t_hidden:
        raise HeadMismatch("hidden_size", f"{d_hidden}, the target's hidden_size is {t_hidden}", retrain)
    th = head_config.get("target_hidden_size")
    if th is not None and int(th) != t_hidden:
        raise HeadMismatch("target_hidden_size", f"{th}, the target's hidden_size is {t_hidden}", retrain)
    vocab = int(layer.get("vocab_size", head_config.get("vocab_size", 0)))
    if vocab != t_vocab:
        raise HeadMismatch("vocab_size", f"{vocab}, the target's vocab_size is {t_vocab}", retrain)
    nd = int(head_config.get("draft_vocab_size") or vocab)
    if "d2t" in shapes:
        if list(shapes["d2t"]) != [nd]:
            raise HeadMismatch("d2t", f"shape {list(shapes['d2t'])}, draft_vocab_size is {nd}",
                               "rebuild the vocabulary mapping (eagle3ops train: stage vocab) for this head")
    elif nd != t_vocab:
        raise HeadMismatch("d2t", f"missing while draft_vocab_size {nd} differs from the target's vocab {t_vocab}",
                           "export the head with its d2t tensor (speculators' save_pretrained writes it)")
    if "t2d" in shapes and list(shapes["t2d"]) != [t_vocab]:
        raise HeadMismatch("t2d", f"shape {list(shapes['t2d'])}, the target's vocab_size is {t_vocab}",
                           "rebuild the vocabulary mapping for the served target")
    if "lm_head.weight" in shapes and int(shapes["lm_head.weight"][0]) != nd:
        raise HeadMismatch("lm_head.weight", f"{shapes['lm_head.weight'][0]} rows, draft_vocab_size is {nd}",
                           "set draft_vocab_size to the lm_head's rows or re-export the head")
    aux = head_config.get("eagle_aux_hidden_state_layer_ids")
    warnings: list[str] = []
    if aux is None:
        aux = [2, t_layers // 2, t_layers - 3]  # vLLM's default for Llama-style targets
        warnings.append(f"no eagle_aux_hidden_state_layer_ids: vLLM uses its default {aux}")
    aux = [int(i) for i in aux]
    bad = [i for i in aux if not 1 <= i < t_layers]
    if bad:
        raise HeadMismatch("eagle_aux_hidden_state_layer_ids",
                           f"{aux}: {bad} outside [1, {t_layers}) for a target of {t_layers} layers (vLLM captures "
                           "the input of each listed layer as hidden + residual; there is no residual before "
                           "layer 0)", retrain)
    fc = shapes.get("fc.weight")
    if fc is not None and int(fc[1]) != len(aux) * t_hidden:
        raise HeadMismatch("fc.weight", f"shape {list(fc)} fuses {int(fc[1]) / t_hidden:g} target hidden states, "
                           f"{len(aux)} aux layers are listed", retrain)
    archs: list[str] = []
    spec = head_config.get("speculators_config")
    if spec:
        ver = spec.get("verifier") or {}
        archs = list(ver.get("architectures") or [])
        t_archs = list(target_config.get("architectures") or [])
        if archs and t_archs and archs != t_archs:
            raise HeadMismatch("speculators_config.verifier.architectures",
                               f"{archs}, the served target is {t_archs}", retrain)
    return HeadFacts(t_hidden, t_vocab, nd, aux, t_layers, archs, warnings)


def offline_acceptance(train_manifest: Mapping[str, Any] | None) -> float | None:
    """The train manifest's ``offline_estimate.acceptance_length`` (teacher-forced, optimistic), None when absent."""
    est = (train_manifest or {}).get("offline_estimate") or {}
    v = est.get("acceptance_length")
    return float(v) if v is not None else None
