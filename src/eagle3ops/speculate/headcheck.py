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

__all__ = ["HeadFacts", "HeadMismatch", "check_head", "check_vllm_reading", "check_vocab_values",
           "offline_acceptance"]


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


#: What the trainers that write each config format assume for a key the config leaves out (speculators 0.3.0's
#: ``Eagle3SpeculatorConfig`` field defaults; the flat EAGLE/SpecForge ``LlamaForCausalLMEagle3`` layout).
TRAINER_DEFAULTS = {"speculators": {"norm_before_residual": False}, "flat": {"norm_before_residual": False}}
#: Where EAGLE-3 trainers other than speculators nest the aux layer ids (SpecForge / EAGLE ``eagle_config``).
NESTED_AUX = (("eagle_config", "eagle_aux_hidden_state_layer_ids"),
              ("transformer_layer_config", "eagle_aux_hidden_state_layer_ids"))
AUX_KEY = "eagle_aux_hidden_state_layer_ids"


def _get(d: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    for k in path:
        if not isinstance(d, Mapping) or k not in d:
            return None
        d = d[k]
    return d


def check_vllm_reading(head_config: Mapping[str, Any], vllm_view: Mapping[str, Any], *, target_layers: int,
                       train_manifest: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Compare, key by key, how a head was trained (its ``config.json``; the run's train manifest when there is one)
    with how vLLM 0.16 reads it (``vllm_view``: :func:`eagle3ops.speculate.onhost.vllm_view`, made in the pipeline
    image by vLLM's own config loader: ``{"config": the draft's effective hf_config as a dict, "read_keys": config
    keys vLLM's EAGLE-3 model code and LlamaConfig read, "vllm_version"}``). Pure.

    Checks:
        * a key the head sets to a true value that vLLM never reads (``norm_before_fc``, ``norm_output``,
          ``fc_norm``...): vLLM runs the head without that part;
        * ``norm_before_residual``: the trainer's value (its default when the config leaves it out: False for
          speculators and the flat layout) against vLLM's effective value (0.16 defaults a speculators-format head
          without it to True);
        * ``eagle_aux_hidden_state_layer_ids``: nested where vLLM 0.16 does not read it (``eagle_config``, or the
          layer config of a flat head) so that vLLM uses its default ``[2, L // 2, L - 3]``; a number other than
          three (0.16's ``fc`` fuses exactly three); ids in the other convention (the train manifest's
          ``aux_layer_ids_extracted``, the outputs of those layers, where vLLM takes the input of layer id, so
          ``j + 1``).

    Returns:
        ``{"eagle_aux_hidden_state_layer_ids": what vLLM will use, "norm_before_residual": ..., "vllm_version"}``.

    Raises:
        HeadMismatch: naming the head's key and what vLLM 0.16 would do instead.
    """
    eff = dict(vllm_view.get("config") or {})
    read = set(vllm_view.get("read_keys") or [])
    version = vllm_view.get("vllm_version") or "0.16"
    fmt = "speculators" if head_config.get("speculators_model_type") else "flat"
    layer = head_config.get("transformer_layer_config") or {}
    fix = "export the head with the keys vLLM 0.16 reads (eagle3ops train writes them), or serve a vLLM that reads it"
    # keys the head sets that vLLM never reads
    for where, cfg in (("", head_config), ("transformer_layer_config.", layer)):
        for k, v in cfg.items():
            if v is True and k not in read:
                raise HeadMismatch(f"{where}{k}", f"true, but vLLM {version} does not read `{k}`: it runs the head "
                                   f"without it (as if false), not as it was trained", fix)
    # norm_before_residual: trained value vs effective value
    trained = head_config.get("norm_before_residual", layer.get("norm_before_residual",
                              TRAINER_DEFAULTS[fmt]["norm_before_residual"]))
    served = bool(eff.get("norm_before_residual", False))
    if bool(trained) != served:
        said = "set to" if "norm_before_residual" in head_config or "norm_before_residual" in layer             else "left out of config.json, so trained with the default"
        raise HeadMismatch("norm_before_residual", f"{said} {bool(trained)}, but vLLM {version} reads the head with "
                           f"norm_before_residual={served}", f"write `norm_before_residual: {str(bool(trained)).lower()}`"
                           " into the head's config.json")
    # aux layer ids: where they are, how many, which convention
    default = [2, target_layers // 2, target_layers - 3]
    used = list(eff.get(AUX_KEY) or []) or default
    if not eff.get(AUX_KEY):
        for path in NESTED_AUX:
            nested = _get(head_config, path)
            if nested:
                raise HeadMismatch(".".join(path), f"{list(nested)}, but vLLM {version} reads only a top-level "
                                   f"`{AUX_KEY}` and uses its default {default} instead",
                                   f"move it to the top level of config.json as `{AUX_KEY}: {list(nested)}`")
    if len(used) != 3:
        raise HeadMismatch(AUX_KEY, f"{used}: {len(used)} aux layers, but vLLM {version} fuses exactly three (its fc "
                           "takes 3 x hidden_size)", "train the head on three aux layers")
    man = train_manifest or {}
    extracted, want = man.get("aux_layer_ids_extracted"), man.get(AUX_KEY)
    if extracted and want and list(used) == list(extracted) and list(extracted) != list(want):
        raise HeadMismatch(AUX_KEY, f"{used} counts layer outputs (the convention the hidden states were extracted "
                           f"in), but vLLM {version} captures the input of each listed layer: this head was trained "
                           f"on what vLLM calls {list(want)}", f"write `{AUX_KEY}: {list(want)}` into config.json")
    return {AUX_KEY: used, "norm_before_residual": served, "vllm_version": version}


def check_vocab_values(d2t: Sequence[int] | Any, t2d: Sequence[bool] | Any | None, *, target_vocab: int) -> None:
    """Check the values of a head's vocabulary mapping (numpy arrays or sequences; shapes are :func:`check_head`'s).

    vLLM 0.16 maps draft id ``i`` to target id ``i + d2t[i]`` (``Eagle3LlamaForCausalLM.compute_logits``) and skips
    ``t2d``; speculators' ``t2d`` is a bool mask over the target vocabulary. Each target id must be in
    ``[0, target_vocab)`` and appear once; a ``d2t`` of all zeros maps the draft vocabulary onto the first
    ``len(d2t)`` target ids, which is right only when the vocabularies are equal; ``t2d``, when stored, must mark
    exactly the target ids ``d2t`` gives.

    Raises:
        HeadMismatch: field ``d2t`` or ``t2d``, naming the first bad entries and what vLLM 0.16 would do with them.
    """
    import numpy as np

    d = np.asarray(d2t, dtype=np.int64).reshape(-1)
    nd = int(d.shape[0])
    fix = "rebuild the vocabulary mapping (eagle3ops train: stage vocab) and export the head again"
    if nd < target_vocab and nd and not d.any():
        raise HeadMismatch("d2t", f"all zero while the draft vocabulary ({nd}) is smaller than the target's "
                           f"({target_vocab}): vLLM 0.16 would map draft id i to target id i, the first {nd} ids", fix)
    targets = np.arange(nd, dtype=np.int64) + d
    out = np.nonzero((targets < 0) | (targets >= target_vocab))[0]
    if out.size:
        raise HeadMismatch("d2t", f"draft ids {out[:5].tolist()} map to target ids {targets[out[:5]].tolist()}, "
                           f"outside [0, {target_vocab}): vLLM 0.16 would index past its logits", fix)
    uniq, counts = np.unique(targets, return_counts=True)
    if (counts > 1).any():
        t = int(uniq[counts > 1][0])
        raise HeadMismatch("d2t", f"draft ids {np.nonzero(targets == t)[0][:5].tolist()} map to the same target id "
                           f"{t}: vLLM 0.16 would keep one of their logits and lose the others", fix)
    if t2d is not None:
        m = np.asarray(t2d).reshape(-1).astype(bool)
        marked = np.nonzero(m)[0]
        if marked.shape[0] != nd or not np.array_equal(marked, np.sort(targets)):
            miss = np.setdiff1d(np.sort(targets), marked)[:5].tolist()
            extra = np.setdiff1d(marked, targets)[:5].tolist()
            raise HeadMismatch("t2d", f"disagrees with d2t: {marked.shape[0]} target ids marked, d2t gives {nd}; "
                               f"given by d2t but not marked {miss}, marked but not given {extra} (vLLM 0.16 uses "
                               "d2t only: the head was trained with another mapping than it will be served with)",
                               fix)


def offline_acceptance(train_manifest: Mapping[str, Any] | None) -> float | None:
    """The train manifest's ``offline_estimate.acceptance_length`` (teacher-forced, optimistic), None when absent."""
    est = (train_manifest or {}).get("offline_estimate") or {}
    v = est.get("acceptance_length")
    return float(v) if v is not None else None
