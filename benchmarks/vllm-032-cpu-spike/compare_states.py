#!/usr/bin/env python3
"""Compare hidden states written by vLLM 0.32's ExampleHiddenStatesConnector (``extract_hidden_states``
speculative method) with a transformers forward of the same target on the same token ids.

Runs inside the 0.32 base image (torch 2.13.0, transformers 5.19.0):

    docker run --rm --network none -v TARGET:/models/target:ro -v OUT:/out -v $PWD/benchmarks:/b:ro \
        --entrypoint python eagle3ops/vllm-openai-local:v0.32.0 /b/vllm-032-cpu-spike/compare_states.py \
        --target /models/target --files /out/*.safetensors --layers 3,16,28 --json /out/compare.json

vLLM's aux-layer id i is the INPUT of decoder layer i (vllm/model_executor/models/llama.py: the state after layer
i-1 plus its residual), which is transformers' ``hidden_states[i]`` with ``output_hidden_states=True`` for
0 < i < num_hidden_layers (``hidden_states[num_hidden_layers]`` is after the final norm in transformers).
The connector stores ``hidden_states`` as [tokens, num_layers, hidden] (a KV-cache view: block slot x "heads").
"""

from __future__ import annotations

import argparse
import json

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--files", nargs="+", required=True)
    p.add_argument("--layers", required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--json", required=True)
    a = p.parse_args()
    layers = [int(x) for x in a.layers.split(",")]
    model = AutoModelForCausalLM.from_pretrained(a.target, dtype=getattr(torch, a.dtype))
    model.eval()
    out = {"target": a.target, "dtype": a.dtype, "layers": layers, "files": []}
    for f in a.files:
        d = load_file(f)
        hs, ids = d["hidden_states"], d["token_ids"]
        rec = {"file": f, "keys": {k: [list(v.shape), str(v.dtype)] for k, v in d.items()}, "tokens": int(ids.numel())}
        with torch.no_grad():
            ref = model(ids.reshape(1, -1).long(), output_hidden_states=True).hidden_states
        per = []
        for j, layer in enumerate(layers):
            got = hs[:, j, :].float()
            want = ref[layer][0].float()
            if layer == model.config.num_hidden_layers:
                # vLLM stores the last layer's output before the final norm; transformers' last entry is normed
                with torch.no_grad():
                    got = model.model.norm(hs[:, j, :].to(model.dtype)).float()
            n = min(got.shape[0], want.shape[0])
            diff = (got[:n] - want[:n]).abs()
            rel = diff.norm(dim=-1) / want[:n].norm(dim=-1).clamp_min(1e-6)
            per.append({"layer": layer, "tokens_compared": n, "max_abs": round(diff.max().item(), 6),
                        "median_abs": round(diff.median().item(), 6),
                        "median_rel_l2": round(rel.median().item(), 6), "max_rel_l2": round(rel.max().item(), 6)})
        rec["per_layer"] = per
        out["files"].append(rec)
    out["torch"] = torch.__version__
    import transformers
    out["transformers"] = transformers.__version__
    with open(a.json, "w") as fh:
        json.dump(out, fh, indent=1)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
