"""The speculation gate's measurement and decision, shared by the driver (``speculate``, ``release --gate``,
``watch``) and the host-side supervisor's speculate job: ``replay`` (fixed prompts at a concurrency, foreign-request
monitor), ``metrics`` (vLLM's spec-decode counters and their deltas), ``measure`` (passes x levels of a release, as
data), ``decide`` (the pure keep / rollback / undecided rule with its interval), ``like`` (what each measured release runs,
and whether two may be compared: like for like), ``answers`` (how many greedy answers two releases share). Imports nothing else of eagle3ops,
so the supervisor may import it (import-linter layers, pyproject.toml)."""
