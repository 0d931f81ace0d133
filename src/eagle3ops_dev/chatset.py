"""Chat prompts for the speculation gate, rendered by the live server's own chat template (development harness:
``make demo`` and ``benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py``; the sandbox's serving port is on this machine's
loopback).

A held-out user turn becomes ``/v1/completions`` text as serving's ``/v1/chat/completions`` would render it: vLLM's
``/tokenize`` with ``messages`` and ``add_generation_prompt``, the text from ``/detokenize``, kept only when
``/tokenize`` of the text gives the same ids back (a BOS the text already starts with is dropped once, since
``/v1/completions`` adds it again).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["render_prompts"]


def _template_text(model_path: str, user: str) -> str | None:
    """``user`` as one user turn rendered by the chat template in the served model's ``tokenizer_config.json``
    (or ``chat_template.jinja``) with jinja2, as transformers renders it (``trim_blocks``, ``lstrip_blocks``,
    ``add_generation_prompt``); None when the model directory has no template."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    d = Path(model_path)
    cfg = json.loads((d / "tokenizer_config.json").read_text()) if (d / "tokenizer_config.json").is_file() else {}
    tpl = cfg.get("chat_template") or ((d / "chat_template.jinja").read_text()
                                       if (d / "chat_template.jinja").is_file() else None)
    if not tpl:
        return None

    def tok(v: Any) -> str:
        return (v.get("content", "") if isinstance(v, dict) else v) or ""

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(tpl).render(messages=[{"role": "user", "content": user}], add_generation_prompt=True,
                                       bos_token=tok(cfg.get("bos_token")), eos_token=tok(cfg.get("eos_token")))


def render_prompts(h: Any, sel: dict[str, Any], n: int, max_tokens: int, *, prompt_set: str = "chat"
                   ) -> tuple[list[dict], dict[str, Any]]:
    """Each selected user turn rendered as one user message by the live server's chat template (``/tokenize``
    with ``messages``, ``add_generation_prompt``; the text from ``/detokenize``, else the model directory's template
    rendered here: :func:`_template_text`), kept when ``/tokenize`` of the text gives the same ids and prompt +
    ``max_tokens`` fits ``max_model_len``; the first ``n`` kept.

    ``sel``: ``{"rows": [{"id", "user"}], "held_out_from"?, "package"?, "file"?, "file_sha256"?, "records_read"?,
    "user_chars"?, "prompt_chars"?, "source"?}`` (the selection and where it came from, copied into the record).

    Returns:
        (JSONL rows ``{"id", "prompt", "set"}``, the record: counts, token figures, refused ids and why).

    Raises:
        httpx.HTTPError: the server did not answer ``/tokenize``.
    """
    import httpx

    base, model = f"http://127.0.0.1:{h.serving.port}", h.serving.served_model_name
    kept, refused, tokens, how = [], [], [], {"detokenize": 0, "detokenize without the BOS": 0, "template": 0}
    with httpx.Client(timeout=60) as c:
        for row in sel["rows"]:
            if len(kept) >= n:
                break
            t = c.post(f"{base}/tokenize", json={"model": model, "add_generation_prompt": True,
                                                  "messages": [{"role": "user", "content": row["user"]}]})
            t.raise_for_status()
            ids, limit = t.json()["tokens"], t.json().get("max_model_len")
            text = c.post(f"{base}/detokenize", json={"model": model, "tokens": ids}).json()["prompt"]
            again = c.post(f"{base}/tokenize", json={"model": model, "prompt": text}).json()["tokens"]
            way = "detokenize"
            if again != ids and len(ids) > 1 and again == [ids[0], *ids]:
                # the rendered text starts with the BOS token's own text (SmolLM2's <|im_start|> is its BOS), and
                # /tokenize, like /v1/completions, adds a BOS: the text without the first token gives the chat ids
                text = c.post(f"{base}/detokenize", json={"model": model, "tokens": ids[1:]}).json()["prompt"]
                again = c.post(f"{base}/tokenize", json={"model": model, "prompt": text}).json()["tokens"]
                way = "detokenize without the BOS"
            if again != ids and (alt := _template_text(h.model_path, row["user"])) is not None:
                text, way = alt, "template"
                again = c.post(f"{base}/tokenize", json={"model": model, "prompt": text}).json()["tokens"]
            if again != ids:
                refused.append({"id": row["id"], "why": "text does not tokenize back to the chat ids"})
            elif limit and len(ids) + max_tokens > limit:
                refused.append({"id": row["id"], "why": f"{len(ids)} + {max_tokens} tokens > {limit}"})
            else:
                kept.append({"id": row["id"], "prompt": text, "set": prompt_set})
                tokens.append(len(ids))
                how[way] += 1
    rec = {"source": sel.get("source") or f"ShareGPT V3 held out (record index >= {sel.get('held_out_from')}), "
                                          f"{sel.get('package')}",
           "file": sel.get("file"), "file_sha256": sel.get("file_sha256"), "records_read": sel.get("records_read"),
           "rule": sel.get("rule") or (
               f"first user turn (cut at {sel.get('user_chars')} chars) under {sel.get('prompt_chars')} chars, file "
               "order; one user turn rendered by the served chat template (vLLM /tokenize messages + "
               "add_generation_prompt, /detokenize), its token ids checked by /tokenize of the text"),
           "count": len(kept), "refused": refused, "text_from": how, "prompt_tokens_total": sum(tokens),
           "prompt_tokens_min": min(tokens, default=0), "prompt_tokens_max": max(tokens, default=0),
           "prompt_tokens_mean": round(sum(tokens) / len(tokens), 1) if tokens else 0,
           "ids": [k["id"] for k in kept]}
    return kept, rec
