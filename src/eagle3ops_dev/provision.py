"""Provisioning commands run in a container of the pipeline image on the build engine (the sandbox's model), as argv."""

from __future__ import annotations


def tiny_model(out_dir: str, kind: str = "llama", seed: int = 0) -> list[str]:
    """Build a tiny local target (:mod:`eagle3ops_dev.tinymodel`) into ``out_dir`` (a path inside the container)."""
    return ["python3", "-m", "eagle3ops_dev.tinymodel", out_dir, "--kind", kind, "--seed", str(seed)]


def trained_model(out_dir: str, corpus: str, *, layers: int = 24, steps: int = 400, seed: int = 0) -> list[str]:
    """Build the trained, deepened sandbox target (:mod:`eagle3ops_dev.tinytrained`) into ``out_dir`` from the
    ``{prompt, completion}`` JSONL ``corpus`` (paths inside the container)."""
    return ["python3", "-m", "eagle3ops_dev.tinytrained", out_dir, "--corpus", corpus, "--layers", str(layers),
            "--steps", str(steps), "--seed", str(seed)]
