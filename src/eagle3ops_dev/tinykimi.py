"""A tiny Kimi-K2.5-class target, built locally, laid out like the ``moonshotai/Kimi-K2.5`` checkpoint.

What is the same as the real checkpoint (what the pipeline stages and vLLM 0.16 look at):

- ``config.json``: ``model_type: kimi_k25``, ``architectures: [KimiK25ForConditionalGeneration]``, an ``auto_map``
  to ``configuration_kimi_k25.KimiK25Config`` shipped in the model directory (remote code: transformers 4.57.6 has
  no ``kimi_k25`` config; vLLM 0.16 registers its own class for the same JSON), a nested DeepSeek-V3
  ``text_config`` and a ``vision_config``. The wrapper config has no flat ``hidden_size``/``num_hidden_layers``:
  whoever reads the text backbone's sizes must go through ``text_config``.
- weights (``model.safetensors``, bf16) under the names vLLM's ``KimiK25ForConditionalGeneration`` loads:
  ``language_model.model.*`` and ``language_model.lm_head.weight`` (the DeepSeek-V3 text backbone),
  ``vision_tower.*`` (MoonViT) and ``mm_projector.{pre_norm,proj.0,proj.2}.*``.
- the tokenizer: a *slow* :class:`transformers.PreTrainedTokenizer` (``TikTokenTokenizer`` in
  ``tokenization_kimi.py``, ``auto_map`` in ``tokenizer_config.json``, so it loads only with
  ``trust_remote_code=True``) backed by ``tiktoken`` and a ``tiktoken.model`` rank file (base64 token, rank per
  line); 163,584 ranks + 256 special/reserved ids = 163,840 = ``text_config.vocab_size``. Kimi-style special
  tokens at Kimi's ids (``[BOS]`` 163584, ``[EOS]`` 163585, ``<|im_end|>`` 163586, ``<|im_user|>`` 163587,
  ``<|im_assistant|>`` 163588, ``<|im_system|>`` 163594, the tool-call section tokens 163595-163599,
  ``<|im_middle|>`` 163601, ``<|media_pad|>`` 163605 = ``media_placeholder_token_id``, ``[UNK]`` 163838,
  ``[PAD]`` 163839) and a Kimi-style chat template (``<|im_user|>user<|im_middle|>...<|im_end|>``, a default
  system prompt when the conversation has none, tool calls in Kimi's section format).
- an image processor (``kimi_k25_vision_processing.py``, ``auto_map`` in ``preprocessor_config.json``): vLLM 0.16
  builds ``KimiK25ProcessingInfo`` (which loads it with remote code) even when the vision modality is switched off.

What is a stand-in: the sizes (text backbone: the CPU-safe MLA/MoE sizes of FACTS.md, hidden 128, 4 layers; the
vision tower: 1 block, hidden 32, 2 heads, the smallest vLLM's ``MoonViT3dPretrainedModel`` builds with rotary
head size divisible by 4), random weights, the BPE merges (generated, not learnt: byte-level ranks, then English
words, numbers, and syllable "words", each merge added so that the word encodes to one token), and the image
processor (``preprocess`` raises: this target is served and extracted with ``limit_mm_per_prompt
{"vision_chunk": 0}``).

Entry point: :func:`build_tiny_kimi` (via :func:`eagle3ops_dev.tinymodel.build_tiny_model` with ``kind="kimi-k25"``).
"""

from __future__ import annotations

import ast
import base64
import json
import random
from pathlib import Path
from typing import Any

from eagle3ops_dev.words import WORDS

__all__ = ["KIMI_CHAT_TEMPLATE", "KIMI_SPECIAL_TOKENS", "KIMI_VOCAB_SIZE", "N_RANKS", "REMOTE_CODE_FILES",
           "build_tiny_kimi", "kimi_ranks", "remote_source", "synthetic_chat_rows", "syllable_words"]

#: Kimi-K2/K2.5's vocabulary: 163,584 BPE ranks + 256 special/reserved ids.
KIMI_VOCAB_SIZE = 163_840
N_RANKS = 163_584
N_SPECIAL = KIMI_VOCAB_SIZE - N_RANKS
#: Named special tokens by offset from :data:`N_RANKS` (Kimi's ids); the other offsets are
#: ``<|reserved_token_{id}|>``.
KIMI_SPECIAL_TOKENS: dict[int, str] = {
    0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
    6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>", 17: "<|im_middle|>",
    18: "<|media_begin|>", 19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>",
    22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]",
}
BOS_ID, EOS_ID, IM_END_ID = N_RANKS + 0, N_RANKS + 1, N_RANKS + 2
MEDIA_PAD_ID, UNK_ID, PAD_ID = N_RANKS + 21, N_RANKS + 254, N_RANKS + 255
DEFAULT_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."

#: Kimi-style chat template: ``<|im_{role}|>{role}<|im_middle|>{content}<|im_end|>`` per message (other roles,
#: e.g. ``tool``, as ``<|im_system|>{role}<|im_middle|>``), a default system message when the conversation
#: starts without one, tool calls in Kimi's section format, generation prompt ``<|im_assistant|>assistant<|im_middle|>``.
KIMI_CHAT_TEMPLATE = (
    "{%- if not messages or messages[0]['role'] != 'system' -%}"
    "<|im_system|>system<|im_middle|>" + DEFAULT_SYSTEM + "<|im_end|>"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}<|im_system|>system<|im_middle|>"
    "{%- elif m['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- elif m['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- else -%}<|im_system|>{{ m['role'] }}<|im_middle|>"
    "{%- endif -%}"
    "{{ m['content'] or '' }}"
    "{%- if m['role'] == 'assistant' and m['tool_calls'] is defined and m['tool_calls'] -%}"
    "<|tool_calls_section_begin|>"
    "{%- for c in m['tool_calls'] -%}"
    "<|tool_call_begin|>functions.{{ c['function']['name'] }}:{{ loop.index0 }}<|tool_call_argument_begin|>"
    "{%- if c['function']['arguments'] is string -%}{{ c['function']['arguments'] }}"
    "{%- else -%}{{ c['function']['arguments'] | tojson }}{%- endif -%}"
    "<|tool_call_end|>"
    "{%- endfor -%}"
    "<|tool_calls_section_end|>"
    "{%- endif -%}"
    "<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)

#: The remote-code sources shipped in the model directory (``trust_remote_code``), kept as real files beside this
#: module (``remote_code/``) and copied byte for byte: ``tokenization_kimi.py``, ``configuration_kimi_k25.py``,
#: ``kimi_k25_vision_processing.py``.
REMOTE_CODE_DIR = Path(__file__).resolve().parent / "remote_code"
REMOTE_CODE_FILES = ("tokenization_kimi.py", "configuration_kimi_k25.py", "kimi_k25_vision_processing.py")


def remote_source(name: str) -> str:
    """The text of the remote-code file ``name`` (one of :data:`REMOTE_CODE_FILES`) as written into a model dir.

    Raises:
        ValueError: ``name`` is not one of :data:`REMOTE_CODE_FILES`.
        FileNotFoundError: the file is missing beside this module (an incomplete copy of ``eagle3ops_dev``).
    """
    if name not in REMOTE_CODE_FILES:
        raise ValueError(f"{name!r}: not a remote-code file of the tiny Kimi (one of {', '.join(REMOTE_CODE_FILES)})")
    return (REMOTE_CODE_DIR / name).read_text(encoding="utf-8")


def _pat_str() -> str:
    """``PAT_STR`` as the shipped ``tokenization_kimi.py`` assigns it (one definition: that file)."""
    tree = ast.parse(remote_source("tokenization_kimi.py"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["PAT_STR"]:
            return ast.literal_eval(node.value)
    raise RuntimeError(f"{REMOTE_CODE_DIR / 'tokenization_kimi.py'} assigns no PAT_STR")


#: Text pre-tokenization regex (tiktoken ``pat_str``; cl100k-like: contractions, letters with an optional leading
#: space, 1-3 digits, punctuation runs, newlines, spaces), read from ``remote_code/tokenization_kimi.py``.
PAT_STR = _pat_str()

_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


def syllable_words(seed: int = 0) -> list[str]:
    """The syllable "words" (consonant-vowel syllables, 1 to 3 of them), in the order their tokens are added.

    All 1- and 2-syllable words come first, then every 3-syllable word in a ``seed``-shuffled order. The first
    ones (as many as fit) become single tokens, with a leading space (how a word inside a sentence is split by
    :data:`PAT_STR`); :func:`kimi_ranks` says how many.
    """
    syl = [c + v for c in _CONSONANTS for v in _VOWELS]
    one_two = syl + [a + b for a in syl for b in syl]
    three = [a + b + c for a in syl for b in syl for c in syl]
    random.Random(seed).shuffle(three)
    return one_two + three


def _bpe(ranks: dict[bytes, int], piece: bytes) -> list[bytes]:
    """tiktoken's byte-pair merge of one piece: repeatedly merge the adjacent pair of lowest rank."""
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best_rank, best_i = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best_rank is None or r < best_rank):
                best_rank, best_i = r, i
        if best_rank is None:
            break
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return parts


def kimi_ranks(seed: int = 0) -> tuple[list[bytes], int]:
    """``(tokens in rank order, number of syllable words that are single tokens)``: exactly :data:`N_RANKS` tokens.

    Ranks 0-255 are the bytes. Then, per word (English words of the tiny models' corpus, with and without a leading
    space and capitalised; the numbers 0-999; ``" " + w`` for the :func:`syllable_words`), merges are added until
    :func:`_bpe` encodes the word to one token: each new token is the merge of the first two parts of the word's
    current encoding. A merge added later has a higher rank than every earlier one, so it never changes how an
    earlier word encodes (the tokens stay reachable).
    """
    order: list[bytes] = [bytes([b]) for b in range(256)]
    ranks: dict[bytes, int] = {t: i for i, t in enumerate(order)}

    def ensure(word: str) -> bool:
        piece = word.encode("utf-8")
        while True:
            parts = _bpe(ranks, piece)
            if len(parts) == 1:
                return True
            if len(order) >= N_RANKS:
                return False
            new = parts[0] + parts[1]
            ranks[new] = len(order)
            order.append(new)

    english = [v for w in WORDS for v in (w, " " + w, w.capitalize(), " " + w.capitalize())]
    for w in [*english, *(str(n) for n in range(1000)), *DEFAULT_SYSTEM.split(" "), "system", "tool"]:
        ensure(w)
    whole = 0
    for w in syllable_words(seed):
        if not ensure(" " + w):
            break
        whole += 1
    if len(order) != N_RANKS:
        raise RuntimeError(f"generated {len(order)} ranks, expected {N_RANKS}")
    return order, whole


def synthetic_chat_rows(n: int, seed: int = 0, words: int | None = None, turns: int = 2,
                        reply_words: tuple[int, int] = (40, 160)) -> list[dict[str, Any]]:
    """``n`` chat rows (``{"messages": [...]}``) of syllable words drawn by Zipf's law (a stand-in dataset).

    Each row is ``turns`` user/assistant pairs; a user turn has 5-20 words, a reply ``reply_words`` words.
    Word ``k`` (0-based, of the first ``words`` :func:`syllable_words`; default: those that are single tokens of
    the seed-0 tiny Kimi tokenizer) is drawn with probability proportional to ``1 / (k + 1)``, so the assistant
    text holds many distinct target tokens with a long tail (what the vocab stage's draft vocabulary must cut).
    """
    pool = syllable_words(0)[: words or kimi_ranks(0)[1]]
    weights = [1.0 / (k + 1) for k in range(len(pool))]
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        msgs = []
        for _t in range(turns):
            u = rng.choices(pool, weights, k=rng.randint(5, 20))
            a = rng.choices(pool, weights, k=rng.randint(*reply_words))
            msgs.append({"role": "user", "content": " ".join(u).capitalize() + "?"})
            msgs.append({"role": "assistant", "content": " ".join(a).capitalize() + "."})
        rows.append({"messages": msgs})
    return rows


#: The vision config: the smallest MoonViT that vLLM 0.16's ``MoonViT3dPretrainedModel`` builds (one block; head
#: size 16, divisible by 4 as its 2-D rotary embedding requires; a 4 x 4 learnt position grid).
VISION_CONFIG = {
    "patch_size": 14, "init_pos_emb_height": 4, "init_pos_emb_width": 4, "init_pos_emb_time": 4,
    "pos_emb_type": "divided_fixed", "num_attention_heads": 2, "num_hidden_layers": 1, "hidden_size": 32,
    "intermediate_size": 64, "merge_kernel_size": [2, 2], "video_attn_type": "spatial_temporal",
    "merge_type": "sd2_tpool", "mm_projector_type": "patchmerger", "projector_hidden_act": "gelu",
    "projector_ln_eps": 1e-5, "model_type": "kimi_k25_vision",
}


def vision_weight_shapes(vision: dict[str, Any], text_hidden: int) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor name -> shape of the vision tower and projector, as vLLM 0.16 loads them.

    Names follow vLLM's ``kimi_k25_vit.py`` modules; the projector's ``proj.0``/``proj.2`` are what
    ``KimiK25ForConditionalGeneration.hf_to_vllm_mapper`` maps to ``linear_1``/``linear_2``.
    """
    d, m, p = vision["hidden_size"], vision["intermediate_size"], vision["patch_size"]
    kh, kw = vision["merge_kernel_size"]
    merged = d * kh * kw
    out: dict[str, tuple[int, ...]] = {
        "vision_tower.patch_embed.proj.weight": (d, 3, p, p),
        "vision_tower.patch_embed.proj.bias": (d,),
        "vision_tower.patch_embed.pos_emb.weight": (vision["init_pos_emb_height"], vision["init_pos_emb_width"], d),
        "vision_tower.encoder.final_layernorm.weight": (d,),
        "vision_tower.encoder.final_layernorm.bias": (d,),
        "mm_projector.pre_norm.weight": (d,),
        "mm_projector.pre_norm.bias": (d,),
        "mm_projector.proj.0.weight": (merged, merged),
        "mm_projector.proj.0.bias": (merged,),
        "mm_projector.proj.2.weight": (text_hidden, merged),
        "mm_projector.proj.2.bias": (text_hidden,),
    }
    for i in range(vision["num_hidden_layers"]):
        b = f"vision_tower.encoder.blocks.{i}"
        out.update({
            f"{b}.norm0.weight": (d,), f"{b}.norm0.bias": (d,), f"{b}.norm1.weight": (d,), f"{b}.norm1.bias": (d,),
            f"{b}.wqkv.weight": (3 * d, d), f"{b}.wqkv.bias": (3 * d,), f"{b}.wo.weight": (d, d), f"{b}.wo.bias": (d,),
            f"{b}.mlp.fc0.weight": (m, d), f"{b}.mlp.fc0.bias": (m,), f"{b}.mlp.fc1.weight": (d, m),
            f"{b}.mlp.fc1.bias": (d,),
        })
    return out


def _write_tokenizer(out: Path, seed: int) -> None:
    order, _whole = kimi_ranks(seed)
    with open(out / "tiktoken.model", "w", encoding="ascii") as f:
        for rank, tok in enumerate(order):
            f.write(f"{base64.b64encode(tok).decode()} {rank}\n")
    (out / "tokenization_kimi.py").write_text(remote_source("tokenization_kimi.py"))
    added = {}
    for off in range(N_SPECIAL):
        name = KIMI_SPECIAL_TOKENS.get(off, f"<|reserved_token_{N_RANKS + off}|>")
        added[str(N_RANKS + off)] = {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                                     "single_word": False, "special": True}
    named = [KIMI_SPECIAL_TOKENS[k] for k in sorted(KIMI_SPECIAL_TOKENS)]
    cfg = {
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in named if t not in ("[BOS]", "[EOS]", "[UNK]", "[PAD]")],
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]", "eos_token": "[EOS]", "unk_token": "[UNK]", "pad_token": "[PAD]",
        "chat_template": KIMI_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1048576,
        "tokenizer_class": "TikTokenTokenizer",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "[BOS]", "eos_token": "[EOS]", "unk_token": "[UNK]", "pad_token": "[PAD]"}, indent=2) + "\n")


def build_tiny_kimi(out: Path, seed: int, text_config: dict[str, Any]) -> Path:
    """Write the tiny Kimi-K2.5-class target into the empty directory ``out`` and return it (see module doc).

    ``text_config``: a ``DeepseekV3Config.to_dict()`` of the backbone; its vocabulary and special-token ids are
    replaced by Kimi's. Weights: transformers' own initialisation of ``DeepseekV3ForCausalLM`` under
    ``torch.manual_seed(seed)`` (plus a small spread on the noaux_tc correction bias, as the ``deepseek-v3``
    kind does), saved in bf16 with the prefix ``language_model.``; vision weights drawn from ``N(0, 0.02)``
    (norm weights 1, biases 0). Takes a few seconds (the 163,584 ranks are generated in Python).
    """
    import torch
    from safetensors.torch import save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, GenerationConfig

    tc = dict(text_config)
    for k in ("architectures", "transformers_version", "_name_or_path"):
        tc.pop(k, None)
    tc.update(vocab_size=KIMI_VOCAB_SIZE, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    text = DeepseekV3Config(**tc)
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(text)
    gen = torch.Generator().manual_seed(seed + 1)
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buf.copy_(torch.randn(buf.shape, generator=gen) * 0.01)
    sd = {f"language_model.{k}": v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    del model
    for name, shape in vision_weight_shapes(VISION_CONFIG, text.hidden_size).items():
        if "norm" in name and name.endswith(".weight"):
            t = torch.ones(shape)
        elif name.endswith(".bias"):
            t = torch.zeros(shape)
        else:
            t = torch.randn(shape, generator=gen) * 0.02
        sd[name] = t.to(torch.bfloat16)
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})

    text_dict = text.to_dict()
    text_dict.pop("transformers_version", None)
    text_dict["architectures"] = ["DeepseekV3ForCausalLM"]
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config"},
        "model_type": "kimi_k25",
        "text_config": text_dict,
        "vision_config": {**VISION_CONFIG, "mm_hidden_size": text.hidden_size},
        "media_placeholder_token_id": MEDIA_PAD_ID,
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "ignore_index": -100,
        "use_unified_vision_chunk": False,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("configuration_kimi_k25.py", "kimi_k25_vision_processing.py"):
        (out / name).write_text(remote_source(name))
    (out / "preprocessor_config.json").write_text(json.dumps({
        "auto_map": {"AutoImageProcessor": "kimi_k25_vision_processing.KimiK25VisionProcessor"},
        "image_processor_type": "KimiK25VisionProcessor",
        "patch_size": VISION_CONFIG["patch_size"], "merge_kernel_size": VISION_CONFIG["merge_kernel_size"],
        "num_frames_per_chunk": 4,
    }, indent=2) + "\n")
    GenerationConfig(bos_token_id=BOS_ID, eos_token_id=[EOS_ID, IM_END_ID], pad_token_id=PAD_ID).save_pretrained(out)
    _write_tokenizer(out, seed)
    return out
