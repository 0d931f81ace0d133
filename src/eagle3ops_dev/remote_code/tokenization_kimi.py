"""Slow tiktoken-backed tokenizer of an eagle3ops tiny Kimi-K2.5-class model (trust_remote_code=True).

Ids 0..n-1 are the ranks of tiktoken.model (base64 token, rank per line); ids n..n+255 the special and
reserved tokens (named by added_tokens_decoder in tokenizer_config.json, else <|reserved_token_ID|>).
Tokens are exposed as GPT-2 byte-level strings, as Kimi's own TikTokenTokenizer does.
"""

import os
from shutil import copyfile

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import PreTrainedTokenizer
from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

PAT_STR = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
NUM_RESERVED_SPECIAL_TOKENS = 256


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "tiktoken.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, bos_token="[BOS]", eos_token="[EOS]", unk_token="[UNK]",
                 pad_token="[PAD]", additional_special_tokens=None, added_tokens_decoder=None, **kwargs):
        self.vocab_file = vocab_file
        ranks = load_tiktoken_bpe(vocab_file)
        n = len(ranks)
        names = {int(i): str(getattr(t, "content", t)) for i, t in (added_tokens_decoder or {}).items()}
        self.special_tokens = {names.get(i, f"<|reserved_token_{i}|>"): i
                               for i in range(n, n + NUM_RESERVED_SPECIAL_TOKENS)}
        self.model = tiktoken.Encoding(name=os.path.basename(vocab_file), pat_str=PAT_STR,
                                       mergeable_ranks=ranks, special_tokens=self.special_tokens)
        byte_encoder = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in byte_encoder.items()}
        self.decoder = {i: "".join(byte_encoder[b] for b in tok) for tok, i in ranks.items()}
        self.decoder.update({i: s for s, i in self.special_tokens.items()})
        self.encoder = {s: i for i, s in self.decoder.items()}
        super().__init__(bos_token=bos_token, eos_token=eos_token, unk_token=unk_token, pad_token=pad_token,
                         additional_special_tokens=additional_special_tokens,
                         added_tokens_decoder=added_tokens_decoder, **kwargs)

    @property
    def vocab_size(self):
        return self.model.n_vocab

    def get_vocab(self):
        return dict(self.encoder)

    def _tokenize(self, text, **kwargs):
        # Special tokens were split off by PreTrainedTokenizer.tokenize; what is left is ordinary text.
        return [self.decoder[i] for i in self.model.encode_ordinary(text)]

    def _convert_token_to_id(self, token):
        return self.encoder.get(token, self.special_tokens["[UNK]"] if "[UNK]" in self.special_tokens else 0)

    def _convert_id_to_token(self, index):
        return self.decoder.get(index, "[UNK]")

    def convert_tokens_to_string(self, tokens):
        out, data = [], bytearray()
        for t in tokens:
            if t in self.special_tokens:
                out.append(data.decode("utf-8", errors="replace"))
                data = bytearray()
                out.append(t)
            else:
                data.extend(self.byte_decoder[c] for c in t)
        out.append(data.decode("utf-8", errors="replace"))
        return "".join(out)

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        ids = list(token_ids_0)
        return ids if token_ids_1 is None else ids + list(token_ids_1)

    def save_vocabulary(self, save_directory, filename_prefix=None):
        path = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + "tiktoken.model")
        if os.path.abspath(path) != os.path.abspath(self.vocab_file):
            copyfile(self.vocab_file, path)
        return (path,)
