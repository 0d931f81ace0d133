"""Stage ``extract``: hidden states of the target for every prepared sample, in speculators' v1 file format.

Engine: speculators' ``VllmHiddenStatesGenerator`` (with this project's patch series applied) on vLLM, tensor
parallel size from ``extract.tensor_parallel_size``. ``extract.engine: transformers`` is a reference engine
(a plain transformers forward with hooks on the same layers) for hosts without vLLM and for checking vLLM's
numbers; it is slow and single-device.

Layers: ``aux_layer_ids`` (3 ids; default speculators' ``[2, L // 2, L - 3]``) plus the last layer ``L - 1``,
each the output of that decoder layer *before* the final norm (the residual stream ``hidden + residual``; the
same thing speculators' patched forward captures). The generator returns them in layer order, so the ids
must be increasing and below ``L - 1``.

Output, in ``<run_dir>/extract/``:

- ``hidden/data_NNNNNN.pt``, one per sample ``i`` of ``prepare/samples.jsonl``: ``torch.save`` of
  ``{"input_ids": long [T], "hidden_states": [bf16 [T, H]] * 4, "loss_mask": long [T]}`` — speculators'
  ``standardize_data_v1`` input, i.e. 3 aux layers + the last layer = ``4 × H × 2`` bytes per token of
  hidden states (plus 16 bytes per token of ids and mask);
- ``progress.jsonl``: one line per finished file (written after the file, fsynced), so a rerun skips the
  samples already written and resumes;
- ``state.json``: what the files were made from (prepare manifest digest, layer ids, engine); a rerun with
  other inputs stops and says to pass ``--restart``;
- ``manifest.json``: count, tokens, dtype, hidden size, layer ids, per-sample tokens/file/sha256, wall time
  and tokens/s.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from eagle3ops.config.pipeline import PipelineConfig, PipelineConfigError
from eagle3ops.stages.manifest import (
    MANIFEST,
    StageInputError,
    atomic_write_text,
    check_inputs,
    output_dir,
    promote,
    sha256_file,
    stage_dir,
    write_manifest,
)
from eagle3ops.stages import shards
from eagle3ops.stages.chunkplan import value_bytes
from eagle3ops.stages.prepare import read_samples
from eagle3ops.stages.vocab import target_text_config

HIDDEN_DIR = "hidden"
PROGRESS = "progress.jsonl"
STATE = "state.json"
BYTES_PER_VALUE = 2  # bf16


def resolve_layer_ids(config: PipelineConfig) -> tuple[list[int], int, int]:
    """``(aux_layer_ids, num_layers, hidden_size)`` of the target; aux ids default to speculators' choice
    ``[2, L // 2, L - 3]``, or ``[L - 4, L - 3, L - 2]`` for targets under 7 layers, where speculators' choice
    repeats a layer.

    Raises:
        LayerIdsError: (a PipelineConfigError and a ValueError) an id is out of range, the default is degenerate
            for a shallow target (then the message asks for ``extract.aux_layer_ids`` with a valid example), the ids
            are not increasing and below the last layer, or the target has under 4 layers.
    """
    t = target_text_config(config.target_model)
    n = int(t.num_hidden_layers)
    aux = config.extract.aux_layer_ids
    source = "extract.aux_layer_ids"
    if aux is None:
        aux = [2, n // 2, n - 3]  # speculators 0.3.0 VllmHiddenStatesGenerator default (without the last)
        source = f"speculators' default [2, L // 2, L - 3] for L = {n}"
        if aux != sorted(set(aux)) and n >= 4:
            # Below 7 layers speculators' default repeats a layer (L = 4 gives [2, 2, 1]): its capture then
            # stores fewer tensors than the draft head's fc expects. Take the three layers before the last.
            aux = [n - 4, n - 3, n - 2]
            source = f"the three layers before the last (speculators' default is degenerate for L = {n})"
    if not (len(aux) == 3 and all(0 <= a < n - 1 for a in aux) and aux == sorted(set(aux))):
        if n < 4:
            raise LayerIdsError(
                f"{source} = {aux}: the target ({config.target_model}) has {n} layers; EAGLE-3 captures 3 aux layers "
                f"below the last, so it needs a target of at least 4 layers")
        # a valid example: speculators' default where it is one, else the three layers before the last
        example = [2, n // 2, n - 3] if n >= 7 else [n - 4, n - 3, n - 2]
        raise LayerIdsError(
            f"{source} = {aux}: need 3 distinct increasing layer ids in [0, {n - 2}] (layer {n - 1} is the last "
            f"layer, captured anyway); set `extract.aux_layer_ids` in pipeline.yaml, e.g. {example}"
        )
    return list(aux), n, int(t.hidden_size)


class LayerIdsError(PipelineConfigError, ValueError):
    """``extract.aux_layer_ids`` (or speculators' default) does not fit the target's layer count: a configuration
    error (the stage CLI prints it as ``error: stage ...`` and exits 2); a ValueError for callers that catch one."""


class TransformersEngine:
    """Reference engine: transformers forward (eager attention) with forward hooks on the captured layers.

    ``generate(list[list[int]])`` returns the same list of dicts as speculators' generator:
    ``{"input_ids": long [T], "hidden_states": [tensor [T, H]] * len(layer_ids), "loss_mask": None}``, each
    tensor the decoder layer's output (the residual stream, before the final norm).
    """

    def __init__(self, model_path: str, layer_ids: list[int], device: str | None = None, dtype: Any = None) -> None:
        """``dtype``: a torch dtype for the weights and activations; None = the checkpoint's (``dtype="auto"``)."""
        import torch

        from eagle3ops.stages.target import load_text_model

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        # The text backbone: for wrappers such as Kimi-K2.5 the `language_model.*` tensors in a model of
        # text_config (the vision tower is not part of the hidden states).
        self.model = load_text_model(model_path, dtype=dtype).to(self.device)
        self.layer_ids = layer_ids
        self._captured: dict[int, Any] = {}
        layers = self.model.model.layers
        for j in layer_ids:
            layers[j].register_forward_hook(self._hook(j))

    def _hook(self, j: int):
        def fn(_module: Any, _inp: Any, output: Any) -> None:
            self._captured[j] = output[0] if isinstance(output, tuple) else output

        return fn

    def generate(self, token_ids: list[list[int]]) -> list[dict[str, Any]]:
        import torch

        results = []
        with torch.inference_mode():
            for ids in token_ids:
                self._captured.clear()
                x = torch.tensor([ids], dtype=torch.long, device=self.device)
                self.model.model(input_ids=x)
                results.append({
                    "input_ids": torch.tensor(ids, dtype=torch.long),
                    "hidden_states": [self._captured[j][0].detach().cpu() for j in self.layer_ids],
                    "loss_mask": None,
                })
        return results


def resolve_tp(config: PipelineConfig) -> int:
    """``extract.tensor_parallel_size``, with ``auto`` = the number of visible CUDA devices (1 without any)."""
    tp = config.extract.tensor_parallel_size
    if tp == "auto":
        import torch

        return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1
    return int(tp)


def make_vllm_generator(
    config: PipelineConfig, layer_ids: list[int], max_num_batched_tokens: int | None = None
) -> Any:
    """speculators' ``VllmHiddenStatesGenerator`` (patched) for the target, capturing ``layer_ids``.

    ``max_num_batched_tokens``: vLLM's per-step token budget (the patched generator's argument; None = its
    default ``max(8192, max_model_len)``). The probe passes a small one so prompts are prefilled in chunks.
    """
    from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

    import torch

    if not torch.cuda.is_available() and getattr(target_text_config(config.target_model), "kv_lora_rank", None):
        # vLLM 0.16 CPU: "MLA is not supported on CPU" unless MLA is expanded to per-head attention (FACTS.md).
        os.environ.setdefault("VLLM_MLA_DISABLE", "1")
    return VllmHiddenStatesGenerator(
        model_path=config.target_model,
        layer_ids=layer_ids,
        max_model_len=config.effective_max_model_len(),
        gpu_memory_utilization=config.extract.gpu_memory_utilization,
        tensor_parallel_size=resolve_tp(config),
        **({"max_num_batched_tokens": max_num_batched_tokens} if max_num_batched_tokens else {}),
    )


#: The largest finite float8_e4m3fn value (OCP FP8; ``torch.finfo(torch.float8_e4m3fn).max``): a row's scale is
#: ``max |row| / E4M3_MAX``.
E4M3_MAX = 448.0


def to_fp8(h: Any) -> tuple[Any, Any]:
    """``h`` ``[T, H]`` → ``(q, scale)``: ``q`` float8_e4m3fn ``[T, H]``, ``scale`` fp32 ``[T, 1]`` (one per token:
    ``max |row| / 448``, at least 1e-12); ``q * scale`` reads it back (:func:`eagle3ops.stages.draft.dequantize`)."""
    import torch

    x = h.float()
    scale = (x.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).clamp_min(1e-12)
    return (x / scale).to(torch.float8_e4m3fn).contiguous(), scale.contiguous()


def _save_sample(path: Path, ids: list[int], mask: list[int], hidden: list[Any], dtype: str = "bfloat16") -> None:
    """One sample file in speculators' v1 layout (``input_ids``, ``hidden_states`` list, ``loss_mask``); with
    ``dtype`` ``float8_e4m3fn`` the states are fp8 and ``hidden_scales`` holds one fp32 scale per token and layer."""
    import torch

    states, scales = [], []
    for h in hidden:
        if dtype == "float8_e4m3fn":
            q, sc = to_fp8(h)
            states.append(q)
            scales.append(sc)
            continue
        h = h.to(torch.bfloat16).contiguous()
        if h.untyped_storage().nbytes() != h.numel() * BYTES_PER_VALUE:
            h = h.clone()  # never save a view of a larger buffer
        states.append(h)
    data = {"input_ids": torch.tensor(ids, dtype=torch.long), "hidden_states": states,
            "loss_mask": torch.tensor(mask, dtype=torch.long)}
    if scales:
        data["hidden_scales"] = scales
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(data, tmp)
    os.replace(tmp, path)


def _read_progress(out: Path) -> dict[int, dict[str, Any]]:
    done: dict[int, dict[str, Any]] = {}
    p = out / PROGRESS
    if not p.is_file():
        return done
    for line in p.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line from a killed run
        f = out / rec["file"]
        if f.is_file() and f.stat().st_size == rec["bytes"]:
            done[int(rec["i"])] = rec
    return done


def _open_output(run_dir: Path, config: PipelineConfig, inputs: dict[str, Any], layer_ids: list[int], *,
                 restart: bool, shard: tuple[int, int] | None) -> Path:
    """The directory this run writes (``extract/``, or for ``--restart`` over a finished extract the new one beside
    it, promoted once complete), its earlier output checked against these inputs; only then is anything changed on
    disk: the hidden-state folder made, a stale manifest removed and ``state.json`` written (a refused rerun leaves a
    finished extract and its manifest as they were).

    Raises:
        StageInputError: the directory holds hidden states made from other inputs or settings.
    """
    out = stage_dir(run_dir, "extract") if shard is not None else output_dir(run_dir, "extract", restart=restart)
    state = {
        "prepare_manifest_sha256": sha256_file(stage_dir(run_dir, "prepare") / MANIFEST),
        "config_digest": config.section_digest("target_model", "extract"),
        "layer_ids": layer_ids,
        "prepare_samples": inputs["prepare"]["samples"],
    }
    state_path = out / STATE
    if state_path.is_file():
        old = json.loads(state_path.read_text())
        if old != state:
            raise StageInputError(
                f"stage extract: {out} holds hidden states made from other inputs or settings ({state_path} "
                f"differs); rerun with --restart to delete them: python -m eagle3ops stage extract --run-dir "
                f"{run_dir} --restart"
            )
    (out / HIDDEN_DIR).mkdir(parents=True, exist_ok=True)
    if shard is None:
        (out / MANIFEST).unlink(missing_ok=True)  # a manifest only describes a finished, complete stage
    else:
        shards.manifest_path(run_dir, shard).unlink(missing_ok=True)
    atomic_write_text(state_path, json.dumps(state, indent=2) + "\n")
    return out


def _checked(s: dict[str, Any], r: dict[str, Any], n_layers: int, hidden_size: int) -> list[Any]:
    """The hidden states the engine returned for sample ``s``: ``n_layers`` tensors of shape ``[T, hidden_size]``.

    Raises:
        RuntimeError: other token ids than given, or other tensors than asked for.
    """
    ids = s["input_ids"]
    if r["input_ids"].tolist() != ids:
        raise RuntimeError(f"extract: sample {s['i']}: engine returned other token ids than given")
    hs = r["hidden_states"]
    want = (len(ids), hidden_size)
    if len(hs) != n_layers or any(tuple(h.shape) != want for h in hs):
        raise RuntimeError(
            f"extract: sample {s['i']}: expected {n_layers} tensors of shape {want}, got "
            f"{[tuple(h.shape) for h in hs]}"
        )
    return hs


def _generate(out: Path, config: PipelineConfig, engine: Any, samples: list[dict[str, Any]],
              todo: list[dict[str, Any]], done: dict[int, dict[str, Any]], layer_ids: list[int], hidden_size: int,
              log: Any) -> tuple[float, int]:
    """The hidden states of ``todo`` in batches of ``extract.batch_size``, each sample's file written and recorded
    in ``progress.jsonl`` (fsynced: a killed run resumes after it) and in ``done``; returns (seconds in the engine,
    tokens generated). ``engine``: the caller's, else the one ``extract.engine`` names, started here and shut down
    before this returns.

    Raises:
        RuntimeError: the engine returned another number of results, other token ids, layer count or shapes.
    """
    if engine is None:
        engine = (
            TransformersEngine(config.target_model, layer_ids)
            if config.extract.engine == "transformers"
            else make_vllm_generator(config, layer_ids)
        )
    gen_s, gen_tokens = 0.0, 0
    bs = config.extract.batch_size
    with open(out / PROGRESS, "a", encoding="utf-8") as prog:
        for start in range(0, len(todo), bs):
            chunk = todo[start : start + bs]
            tg = time.monotonic()
            results = engine.generate([s["input_ids"] for s in chunk])
            gen_s += time.monotonic() - tg
            if len(results) != len(chunk):
                raise RuntimeError(f"extract: engine returned {len(results)} results for {len(chunk)} sequences")
            for s, r in zip(chunk, results, strict=True):
                hs = _checked(s, r, len(layer_ids), hidden_size)
                rel = f"{HIDDEN_DIR}/data_{s['i']:06d}.pt"
                _save_sample(out / rel, s["input_ids"], s["loss_mask"], hs, config.extract.hidden_dtype)
                rec = {"i": s["i"], "file": rel, "tokens": len(s["input_ids"]), "bytes": (out / rel).stat().st_size,
                       "sha256": sha256_file(out / rel)}
                prog.write(json.dumps(rec) + "\n")
                prog.flush()
                os.fsync(prog.fileno())
                done[s["i"]] = rec
                gen_tokens += len(s["input_ids"])
            log(f"extract: {sum(1 for x in samples if x['i'] in done)}/{len(samples)} samples written")
    if hasattr(engine, "executor"):
        del engine  # shut vLLM's workers down before the manifest is written
    return gen_s, gen_tokens


def _figures(config: PipelineConfig, samples: list[dict[str, Any]], recs: list[dict[str, Any]], aux: list[int],
             layer_ids: list[int], n_layers: int, hidden_size: int, todo: int, gen_s: float, gen_tokens: int,
             t0: float) -> dict[str, Any]:
    """The manifest's figures (module doc), ``samples_index`` included."""
    tokens = sum(r["tokens"] for r in recs)
    dtype = config.extract.hidden_dtype
    return {
        "samples": len(recs),
        "tokens": tokens,
        "dtype": dtype,
        "hidden_size": hidden_size,
        "num_layers": n_layers,
        "aux_layer_ids": aux,
        "layer_ids": layer_ids,
        "layer_convention": "output of decoder layer j, before the final norm (hidden + residual)",
        "tensors_per_sample": {
            "input_ids": "long [T]",
            "loss_mask": "long [T]",
            "hidden_states": f"{len(layer_ids)} x {dtype} [T, {hidden_size}] (3 aux layers "
                             f"+ last layer)" + (", hidden_scales: 4 x float32 [T, 1]"
                                          if dtype == "float8_e4m3fn" else ""),
        },
        "hidden_bytes_per_token": len(layer_ids) * value_bytes(hidden_size, dtype),
        "hidden_bytes": tokens * len(layer_ids) * value_bytes(hidden_size, dtype),
        "file_bytes": sum(r["bytes"] for r in recs),
        "engine": "transformers" if config.extract.engine == "transformers" else "vllm",
        "tensor_parallel_size": resolve_tp(config) if config.extract.engine == "vllm" else 1,
        "samples_this_run": todo,
        "generate_s": round(gen_s, 3),
        "generate_tokens_per_s": round(gen_tokens / gen_s, 1) if gen_s > 0 else None,
        # each sample's user-turn content keys travel with it: train holds samples out by content
        "samples_index": [{"i": r["i"], "file": r["file"], "tokens": r["tokens"],
                           **({"content": s["content"]} if "content" in s else {})}
                          for r, s in zip(recs, samples)],
        "wall_s": round(time.monotonic() - t0, 3),
    }


def run_extract(
    run_dir: Path, config: PipelineConfig, log: Any = print, restart: bool = False, engine: Any = None,
    shard: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Run stage ``extract``; returns the manifest's figures. The steps: inputs checked → the output directory
    opened (:func:`_open_output`) → the samples still to do → their hidden states generated and written
    (:func:`_generate`) → the manifest (or the shard's) written.

    ``engine`` (an object with ``generate(list[list[int]])`` like speculators' generator) replaces the one
    ``extract.engine`` names; the benchmark passes its own.

    ``shard``: only samples ``[start, end)`` (a fleet run's window, :mod:`eagle3ops.stages.shards`): the same files
    in the same ``extract/`` directory, the manifest at ``extract/shards/<start>-<end>.json``; ``restart`` then redoes
    only the shard's samples (other shards' files on this host stay).

    Raises:
        StageInputError: prepare/ missing or inconsistent, or earlier extract output made from other inputs.
        RuntimeError: the engine returned other token ids, layer count or shapes than asked for.
    """
    t0 = time.monotonic()
    inputs = check_inputs(run_dir, "extract", config, hash_files=True)
    aux, n_layers, hidden_size = resolve_layer_ids(config)
    layer_ids = [*aux, n_layers - 1]
    out = _open_output(run_dir, config, inputs, layer_ids, restart=restart, shard=shard)
    samples = shards.select(read_samples(run_dir), shard)
    done = _read_progress(out)
    if shard is not None and restart:
        done = {i: rec for i, rec in done.items() if not shard[0] <= i < shard[1]}
    todo = [s for s in samples if s["i"] not in done]
    what = "" if shard is None else f" of shard [{shard[0]}, {shard[1]})"
    log(f"extract: {len(samples)} samples{what}, {len(samples) - len(todo)} already written, {len(todo)} to do; "
        f"layers {layer_ids}")
    gen_s, gen_tokens = (_generate(out, config, engine, samples, todo, done, layer_ids, hidden_size, log)
                         if todo else (0.0, 0))
    recs = [done[s["i"]] for s in samples]
    figures = _figures(config, samples, recs, aux, layer_ids, n_layers, hidden_size, len(todo), gen_s, gen_tokens,
                       t0)
    files = {r["file"]: {"bytes": r["bytes"], "sha256": r["sha256"]} for r in recs}
    rest = {k: v for k, v in figures.items() if k != "samples_index"}
    if shard is not None:
        shards.write_shard_manifest(run_dir, config, shard, files, **rest, sample_files=figures["samples_index"])
    else:
        promote(run_dir, "extract", out)
        write_manifest(run_dir, "extract", config, files, **rest, sample_files=figures["samples_index"])
    log(f"extract: {len(recs)} samples, {figures['tokens']} tokens, {figures['hidden_bytes']} bytes of hidden "
        f"states in {figures['wall_s']} s")
    return figures
