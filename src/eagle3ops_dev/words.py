"""The built-in English-like word list of the tiny models' tokenizers: the BPE corpus of
:mod:`eagle3ops_dev.tinymodel` and the English merges of :mod:`eagle3ops_dev.tinykimi` (one list for both, so neither
builder imports the other's internals)."""

__all__ = ["WORDS"]

#: Words of the synthetic corpus, in a fixed order (a change changes every tiny tokenizer built from it).
WORDS: tuple[str, ...] = (
    "the", "a", "an", "one", "two", "three", "model", "draft", "head", "target", "token", "layer", "hidden",
    "state", "speculative", "decoding", "server", "host", "image", "patch", "series", "hunk", "fuzz", "digest",
    "window", "lock", "journal", "release", "inventory", "vector", "matrix", "batch", "prefill", "decode",
    "cache", "block", "scheduler", "request", "sequence", "prompt", "answer", "question", "user", "assistant",
    "system", "message", "train", "epoch", "loss", "mask", "accuracy", "acceptance", "length", "rate", "fast",
    "slow", "small", "large", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "river", "mountain",
    "forest", "city", "street", "house", "garden", "water", "fire", "earth", "wind", "light", "dark", "morning",
    "evening", "night", "day", "week", "month", "year", "time", "people", "child", "teacher", "student", "book",
    "paper", "letter", "number", "word", "sentence", "language", "code", "python", "function", "class",
    "method", "value", "error", "warning", "result", "output", "input", "file", "folder", "path", "network",
    "socket", "packet", "bytes", "memory", "disk", "cpu", "gpu", "kernel", "thread", "process", "signal",
    "timeout", "retry", "check", "verify", "apply", "build", "ship", "deploy", "run", "stop", "start",
    "restore", "health", "gate", "probe", "extract", "vocab", "prepare", "is", "are", "was", "were", "be",
    "been", "has", "have", "had", "do", "does", "did", "will", "would", "can", "could", "should", "may",
    "might", "must", "and", "or", "but", "if", "then", "else", "when", "while", "for", "with", "without",
    "from", "into", "onto", "about", "above", "below", "under", "between", "after", "before", "during",
    "because", "so", "than", "very", "more", "most", "less", "least", "many", "much", "few", "some", "any",
    "every", "each", "all", "no", "not", "only", "also", "just", "still"
)
