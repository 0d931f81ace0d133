"""Ship the head: a speculative serving release kept only when measured faster.

One job per module: :mod:`.metrics` (vLLM's spec-decode counters as deltas), :mod:`.prompts` (the gate's prompt
sets, disjoint from training), :mod:`.replay` (fixed prompts at a concurrency against an OpenAI-compatible
server), :mod:`.decide` (keep or roll back, from figures measured on both sides).
"""
