"""The offline acceptance estimate of a draft head trained elsewhere, on a run's hidden states.

``speculate --head DIR`` ships a head that no train stage here measured; without an estimate, learning that it
accepts nothing costs two serving restarts (sglang #27829). Before any restart the host's inspect helper
(:func:`eagle3ops.speculate.onhost.inspect`, in the pipeline image) runs :func:`estimate_head` on the hidden
states the host already has from the run (its ``extract/``): the same teacher-forced measure the train stage
records in its manifest (:func:`eagle3ops.stages.train.offline_estimate`: ``1 + Σ_k full_acc_k`` from speculators'
``Eagle3DraftModel.forward``), on the run's held-out samples (:func:`eagle3ops.stages.train.held_out_indices`
with the run's seed and ``train.held_out_fraction``; all samples when none is held out), at most ``max_tokens``
tokens of them (whole samples, at least one), on CPU.

The head is rebuilt as speculators 0.3.0 loads one: ``Eagle3SpeculatorConfig`` from its ``config.json``, the
verifier pointed at the served target (a head from elsewhere names the path it was trained with), the target's
embeddings and lm_head taken from the target (``Eagle3DraftModel`` loads them; a head shipped for vLLM often
leaves ``embed_tokens`` out, as vLLM takes the target's), its own tensors loaded over them, ``d2t``/``t2d`` its
own. Teacher logits use the target's final norm, as in training (:func:`eagle3ops.stages.draft.standardize_with_norm`).

Not estimable (the answer says why, as ``{"unavailable": reason}``): the run has no finished extract on this host,
or the head reads other aux layers than the run extracted (its ``eagle_aux_hidden_state_layer_ids`` against the
extracted ids + 1, vLLM's convention), or its tensors do not fit the rebuilt model.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

#: Tokens of held-out samples the estimate reads by default: a few seconds on CPU for the tiny and SmolLM2 heads.
DEFAULT_MAX_TOKENS = 8192
#: Keys a head may lack: the verifier's (the target's) own tensors, which the rebuilt model takes from the target.
FROM_TARGET = {"embed_tokens.weight", "verifier_lm_head.weight"}


def estimate_head(head: Path, run: Path, target: Path, *, max_tokens: int = DEFAULT_MAX_TOKENS,
                  name: str | None = None) -> dict[str, Any]:
    """Teacher-forced acceptance length of the head at ``head`` on run ``run``'s held-out hidden states.

    Args:
        head: the head's directory (speculators' saved format: ``config.json``, ``*.safetensors``).
        run: the run's directory (``extract/manifest.json`` and its sample files, ``pipeline.yaml``).
        target: the served target's directory (embeddings, lm_head, final norm).
        max_tokens: at most this many tokens of samples (whole samples, in index order; at least one sample).
        name: the run's name in messages (default: the directory's name; the inspect helper sees it at ``/run``).

    Returns:
        ``{"acceptance_length", "per_position": {"k": full_acc_k}, "held_out_samples", "held_out_tokens", "kind",
        "source", "missing_from_head", "ttt_steps"}`` (per_position for k < the run's ``train.ttt_steps``), or
        ``{"unavailable": reason}`` naming what is missing or differs.
    """
    name = name or run.name
    manifest = run / "extract" / "manifest.json"
    if not manifest.is_file():
        return {"unavailable": f"run {name} has no hidden states on this host (no finished extract: "
                               "extract/manifest.json is missing)"}
    ext = json.loads(manifest.read_text())
    conf = json.loads((head / "config.json").read_text())
    extracted = list(ext.get("aux_layer_ids") or [])
    want = [j + 1 for j in extracted]
    have = conf.get("eagle_aux_hidden_state_layer_ids")
    if have != want:
        return {"unavailable": f"the head's eagle_aux_hidden_state_layer_ids {have} are not the layers run "
                               f"{name} extracted ({extracted}, i.e. {want} in vLLM's convention): its hidden "
                               "states cannot estimate this head"}
    samples = ext.get("sample_files") or []
    if not samples:
        return {"unavailable": f"run {name}'s extract/manifest.json lists no sample files"}

    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages.trainplan import held_out_of

    cfg = load_pipeline_config(run)
    held = sorted(held_out_of(samples, cfg.train.held_out_fraction, cfg.seed))
    source = f"run {name}'s held-out hidden states"
    if not held:
        held, source = list(range(len(samples))), f"run {name}'s hidden states (none held out: all samples)"
    chosen, tokens = [], 0
    for i in held:
        if chosen and tokens + int(samples[i]["tokens"]) > max_tokens:
            break
        chosen.append(i)
        tokens += int(samples[i]["tokens"])
    try:
        return {**_measure(head, conf, run, target, [samples[i] for i in chosen], cfg), "source": source}
    except _Misfit as e:
        return {"unavailable": str(e)}


class _Misfit(Exception):
    """The head's tensors do not fit the model rebuilt from its config."""


def _measure(head: Path, conf: dict[str, Any], run: Path, target: Path, samples: list[dict[str, Any]],
             cfg: Any) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.train.data import Eagle3SampleFileDataset, create_collate_fn

    from eagle3ops.stages.draft import register_dense_attention, standardize_with_norm, target_final_norm
    from eagle3ops.stages.train import offline_estimate

    torch._dynamo.config.disable = True  # speculators compiles the draft forward; eager is what runs on CPU
    conf = json.loads(json.dumps(conf))
    conf.setdefault("speculators_config", {}).setdefault("verifier", {})["name_or_path"] = str(target)
    spec_cfg = Eagle3SpeculatorConfig.model_validate(conf)
    spec_cfg.transformer_layer_config._attn_implementation = register_dense_attention()
    sd: dict[str, Any] = {}
    for f in sorted(head.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    if "d2t" not in sd or "t2d" not in sd:
        raise _Misfit(f"{head}: the head has no d2t/t2d tensors")
    model = Eagle3DraftModel(spec_cfg, t2d=sd["t2d"], d2t=sd["d2t"])
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected or set(missing) - FROM_TARGET:
        raise _Misfit(f"{head}: the head's tensors do not fit its config.json (missing "
                      f"{sorted(set(missing) - FROM_TARGET)}, unexpected {sorted(unexpected)})")
    tc = cfg.train
    norm_w, eps = target_final_norm(str(target))
    ext_dir = run / "extract"
    dataset = Eagle3SampleFileDataset(max_len=tc.batch_max_tokens, file_list=[str(ext_dir / s["file"]) for s in samples],
                                      standardize_fn=standardize_with_norm(norm_w, eps))
    est = offline_estimate(model, dataset, create_collate_fn(tc.batch_max_tokens), "cpu",
                           SimpleNamespace(ttt_steps=tc.ttt_steps, ttt_step_loss_decay=tc.ttt_step_loss_decay))
    return {**(est or {}), "missing_from_head": sorted(set(missing) - {"verifier_lm_head.weight"}),
            "ttt_steps": tc.ttt_steps}
