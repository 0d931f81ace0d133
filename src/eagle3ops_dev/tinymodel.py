"""Build tiny, randomly initialised target models fully locally (no hub downloads).

Three kinds, all small enough that vLLM's CPU build starts them in well under a minute:

``llama``
    ``LlamaForCausalLM``: hidden 128, 4 layers, 4 attention heads / 2 KV heads (head size 32),
    intermediate 256, vocab 2048, bf16 safetensors. Tokenizer: a byte-level BPE trained with the
    ``tokenizers`` library on a built-in corpus, saved as a fast tokenizer (``tokenizer.json``) with a
    simple chat template in ``tokenizer_config.json``.
``llama-remote-code``
    The same Llama weights, but the tokenizer can only be loaded with ``trust_remote_code=True``:
    ``tokenizer_config.json`` carries ``auto_map`` -> ``tokenization_tiny.TinyTokenizer``, a *slow*
    :class:`transformers.PreTrainedTokenizer` subclass shipped in the model directory (the way
    Kimi-K2.5 ships its tiktoken-based tokenizer). There is no ``tokenizer.json``, so no fast fallback.
``deepseek-v3``
    ``DeepseekV3ForCausalLM`` (MLA + MoE), the text-backbone class of Kimi-K2.5, with the tiny config
    measured to serve on vLLM 0.16 CPU (see ``/work/shared/FACTS.md``): vocab 2048, hidden 128, 4 layers,
    4 heads, q_lora_rank 48, kv_lora_rank 32, qk_nope 48 + qk_rope 16 (= head size 64, which the CPU
    attention backend supports), v_head_dim 32, 8 routed experts top-2 in 2 groups + 1 shared,
    first_k_dense_replace 1, ``topk_method="noaux_tc"``, ``scoring_func="sigmoid"``. On vLLM CPU it needs
    ``VLLM_MLA_DISABLE=1`` and the ``-rotary_embedding`` custom-op workaround.
``kimi-k25``
    Laid out like a ``moonshotai/Kimi-K2.5`` checkpoint (see :mod:`eagle3ops_dev.tinykimi`):
    ``KimiK25ForConditionalGeneration`` (``model_type: kimi_k25``, remote-code config), the tiny DeepSeek-V3
    above as ``text_config`` but with Kimi's 163,840-token vocabulary, a one-block vision tower, weights under
    ``language_model.*`` / ``vision_tower.*`` / ``mm_projector.*``, and a slow tiktoken-backed remote-code
    tokenizer with Kimi-style role tokens and chat template.

Entry points: :func:`build_tiny_model` and ``python -m eagle3ops_dev.tinymodel OUT --kind llama``.
torch and transformers are imported lazily so that importing this module stays cheap.
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import textwrap
from pathlib import Path
from typing import Literal

from eagle3ops_dev.words import WORDS

__all__ = ["CHAT_TEMPLATE", "KINDS", "SPECIAL_TOKENS", "build_shaped_llama_config", "build_tiny_model", "main"]

Kind = Literal["llama", "llama-remote-code", "deepseek-v3", "kimi-k25"]
KINDS: tuple[str, ...] = ("llama", "llama-remote-code", "deepseek-v3", "kimi-k25")

#: Model vocabulary size (embedding rows); the tokenizers use at most this many ids.
VOCAB_SIZE = 2048
MAX_POSITIONS = 4096

#: Special tokens, in id order (ids 0..5 in every tokenizer built here).
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|pad|>",
    "<|bos|>",
    "<|eos|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
)
PAD, BOS, EOS = SPECIAL_TOKENS[0], SPECIAL_TOKENS[1], SPECIAL_TOKENS[2]
#: Token settings of every tokenizer built here (``PreTrainedTokenizer`` keyword arguments and
#: ``tokenizer_config.json`` keys).
_TOKENIZER_SETTINGS = {
    "bos_token": BOS,
    "eos_token": EOS,
    "pad_token": PAD,
    "additional_special_tokens": list(SPECIAL_TOKENS[3:]),
    "model_max_length": MAX_POSITIONS,
}
#: Special-token ids (the positions in :data:`SPECIAL_TOKENS`) in model and generation configs.
_TOKEN_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}

#: Jinja chat template: ``<|role|>\ncontent<|eos|>\n`` per turn, generation prompt ``<|assistant|>\n``.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def _corpus(seed: int, n_lines: int = 4000) -> list[str]:
    """Deterministic synthetic English-like corpus for BPE training (words, digits, punctuation)."""
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        n = rng.randint(4, 18)
        words = [rng.choice(WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            words.insert(rng.randint(0, n), str(rng.randint(0, 9999)))
        sentence = " ".join(words)
        sentence = sentence[0].upper() + sentence[1:] + rng.choice([".", "?", "!", ",", ":"])
        if i % 7 == 0:
            sentence = f"def f_{i}(x): return x + {i}"
        lines.append(sentence)
    return lines


def _train_bpe(seed: int):  # -> tokenizers.Tokenizer
    """Train a byte-level BPE (``tokenizers``) whose ids stay below :data:`VOCAB_SIZE`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    if tok.get_vocab_size() > VOCAB_SIZE:
        raise RuntimeError(f"BPE vocab {tok.get_vocab_size()} exceeds model vocab {VOCAB_SIZE}")
    return tok


def _write_fast_tokenizer(out: Path, seed: int) -> None:
    """Save a ``PreTrainedTokenizerFast`` (tokenizer.json) with the chat template in tokenizer_config."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=_train_bpe(seed), **_TOKENIZER_SETTINGS)
    fast.save_pretrained(out)
    _put_chat_template(out)


def _put_chat_template(out: Path) -> None:
    """Store :data:`CHAT_TEMPLATE` in ``tokenizer_config.json`` (and drop a separate .jinja file)."""
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    (out / "chat_template.jinja").unlink(missing_ok=True)


# GPT-2 byte -> printable character map (byte value -> one-character token). Used here to write the vocab and
# shipped, as this very source text (inspect.getsource), inside tokenization_tiny.py: one definition for both.
def _byte_chars():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


#: Source of the slow, remote-code tokenizer shipped inside ``llama-remote-code`` model directories.
REMOTE_TOKENIZER_SOURCE = textwrap.dedent(
    '''
    """Slow byte-level tokenizer for an eagle3ops tiny model; loadable only with trust_remote_code=True.

    Ids 0..5 are the special tokens, ids 6..261 the 256 byte values (GPT-2 style printable mapping).
    """

    import json
    import os

    from transformers import PreTrainedTokenizer

    SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]


    # <_byte_chars, spliced in from eagle3ops_dev.tinymodel>


    class TinyTokenizer(PreTrainedTokenizer):
        vocab_files_names = {"vocab_file": "tiny_vocab.json"}
        model_input_names = ["input_ids", "attention_mask"]

        def __init__(self, vocab_file, **kwargs):
            with open(vocab_file, encoding="utf-8") as f:
                self.encoder = json.load(f)
            self.decoder = {v: k for k, v in self.encoder.items()}
            self.byte_encoder = _byte_chars()
            self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
            kwargs.setdefault("bos_token", "<|bos|>")
            kwargs.setdefault("eos_token", "<|eos|>")
            kwargs.setdefault("pad_token", "<|pad|>")
            super().__init__(**kwargs)

        @property
        def vocab_size(self):
            return len(self.encoder)

        def get_vocab(self):
            return dict(self.encoder, **self.added_tokens_encoder)

        def _tokenize(self, text, **kwargs):
            return [self.byte_encoder[b] for b in text.encode("utf-8")]

        def _convert_token_to_id(self, token):
            return self.encoder.get(token, self.encoder["<|pad|>"])

        def _convert_id_to_token(self, index):
            return self.decoder.get(index, "<|pad|>")

        def convert_tokens_to_string(self, tokens):
            data = bytearray()
            out = []
            for t in tokens:
                if t in self.byte_decoder:
                    data.append(self.byte_decoder[t])
                else:
                    out.append(data.decode("utf-8", errors="replace"))
                    data = bytearray()
                    out.append(t)
            out.append(data.decode("utf-8", errors="replace"))
            return "".join(out)

        def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
            ids = list(token_ids_0)
            return ids if token_ids_1 is None else ids + list(token_ids_1)

        def save_vocabulary(self, save_directory, filename_prefix=None):
            name = (filename_prefix + "-" if filename_prefix else "") + "tiny_vocab.json"
            path = os.path.join(save_directory, name)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(self.encoder, f, ensure_ascii=False)
            return (path,)
    '''
).lstrip().replace("# <_byte_chars, spliced in from eagle3ops_dev.tinymodel>\n", inspect.getsource(_byte_chars))


def _write_remote_tokenizer(out: Path) -> None:
    """Write ``tokenization_tiny.py``, its vocab and a tokenizer_config whose auto_map needs remote code."""
    byte_chars = _byte_chars()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for b in range(256):
        vocab[byte_chars[b]] = len(SPECIAL_TOKENS) + b
    (out / "tokenization_tiny.py").write_text(REMOTE_TOKENIZER_SOURCE)
    (out / "tiny_vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    cfg = {
        "tokenizer_class": "TinyTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_tiny.TinyTokenizer", None]},
        **_TOKENIZER_SETTINGS,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}, indent=2) + "\n"
    )


#: Settings both architectures share (hidden 128, 4 layers, 4 heads, intermediate 256, untied bf16, ids 0/1/2).
_COMMON_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    max_position_embeddings=MAX_POSITIONS,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    **_TOKEN_IDS,
    dtype="bfloat16",
)
#: What each architecture adds (see the module docstring and FACTS.md for the DeepSeek-V3 values).
_ARCH_CONFIG = {
    "llama": dict(num_key_value_heads=2, rms_norm_eps=1e-5),
    "deepseek-v3": dict(
        moe_intermediate_size=64,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        first_k_dense_replace=1,
        q_lora_rank=48,
        kv_lora_rank=32,
        qk_nope_head_dim=48,
        qk_rope_head_dim=16,
        v_head_dim=32,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        rope_scaling=None,
        rms_norm_eps=1e-6,
    ),
}


def _model_config(kind: Kind):
    """The transformers config of ``kind`` (``llama-remote-code`` uses the Llama one)."""
    if kind == "deepseek-v3":
        from transformers import DeepseekV3Config as config_class
    else:
        from transformers import LlamaConfig as config_class
    arch = "deepseek-v3" if kind == "deepseek-v3" else "llama"
    return config_class(**_COMMON_CONFIG, **_ARCH_CONFIG[arch])


def build_tiny_model(out_dir: str | Path, kind: Kind = "llama", seed: int = 0) -> Path:
    """Build a tiny random target model of ``kind`` into ``out_dir`` and return that path.

    Writes ``config.json``, ``generation_config.json``, ``model.safetensors`` (bf16 weights drawn with
    ``torch.manual_seed(seed)`` by transformers' own initialisation) and a tokenizer (see module doc).
    The same ``seed`` gives byte-identical weights for ``llama`` and ``llama-remote-code``.

    Raises:
        ValueError: ``kind`` is not one of :data:`KINDS`.
        FileExistsError: ``out_dir`` exists and is not empty.
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: expected one of {', '.join(KINDS)}")
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out}: output directory is not empty; pass a new or empty directory")
    out.mkdir(parents=True, exist_ok=True)
    if kind == "kimi-k25":
        from eagle3ops_dev.tinykimi import build_tiny_kimi

        return build_tiny_kimi(out, seed=seed, text_config=_model_config("deepseek-v3").to_dict())

    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    config = _model_config(kind)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    if kind == "deepseek-v3":
        # transformers initialises the noaux_tc correction bias to zeros; give it a small spread so the
        # bias-corrected top-k path is exercised (vLLM loads it as ``e_score_correction_bias``).
        gen = torch.Generator().manual_seed(seed + 1)
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn(buf.shape, generator=gen) * 0.01)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(**_TOKEN_IDS).save_pretrained(out)

    if kind == "llama-remote-code":
        _write_remote_tokenizer(out)
    else:
        _write_fast_tokenizer(out, seed)
    return out


def build_shaped_llama_config(out_dir: str | Path, tokenizer_from: str | Path, **shape: int) -> Path:
    """A Llama target *config* of any width (no weights) that uses a tiny model's tokenizer, for benchmarks.

    Copies the tokenizer files (``tokenizer*``, ``special_tokens*``, ``chat_template*``) of ``tokenizer_from`` (a
    :func:`build_tiny_model` output) and writes a ``LlamaConfig(**shape)`` in bf16 with that model's bos/eos/pad
    ids. ``out_dir`` is replaced. Weights are the caller's business (e.g. random init from the config).

    Args:
        shape: ``LlamaConfig`` sizes, e.g. ``vocab_size``, ``hidden_size``, ``num_hidden_layers``.
    """
    import shutil

    from transformers import LlamaConfig

    out, tiny = Path(out_dir), Path(tokenizer_from)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, out / f.name)
    ids = json.loads((tiny / "config.json").read_text())
    cfg = LlamaConfig(**shape, bos_token_id=ids.get("bos_token_id"), eos_token_id=ids.get("eos_token_id"),
                      pad_token_id=ids.get("pad_token_id"), torch_dtype="bfloat16")
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m eagle3ops_dev.tinymodel OUT [--kind K] [--seed N]``: build one tiny model, print its path."""
    p = argparse.ArgumentParser(prog="python -m eagle3ops_dev.tinymodel", description=main.__doc__)
    p.add_argument("out", type=Path, help="output directory (created; must be empty)")
    p.add_argument("--kind", choices=KINDS, default="llama")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(build_tiny_model(args.out, kind=args.kind, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
