"""Token logprobs in OpenAI's two shapes (chat ``content`` entries, legacy completions arrays).

The values come from the distribution each token was drawn from; a token the grammar forbade has
probability 0, sent as OpenAI does as -9999.0 (JSON has no -Infinity).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from homeai.core.types import TokenLogprob

FLOOR = -9999.0


def _finite(value: float) -> float:
    return value if math.isfinite(value) else FLOOR


def _text(tokenizer: Any, token_id: int) -> str:
    return tokenizer.decode([token_id])


@functools.cache
def _byte_decoder() -> dict[str, int]:
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    """The token's own bytes: a byte-level BPE token (GPT-2's, SmolLM2's, Llama 3's) may hold part of a
    character (an emoji is three tokens), whose decoded text alone is U+FFFD; its bytes are what a client
    joins to rebuild the character. Other vocabularies: the UTF-8 of its decoded text."""
    piece = tokenizer.convert_ids_to_tokens(token_id) if hasattr(tokenizer, "convert_ids_to_tokens") else None
    decoder = _byte_decoder()
    if isinstance(piece, str) and piece and all(c in decoder for c in piece):
        return bytes(decoder[c] for c in piece)
    return _text(tokenizer, token_id).encode()


def _content(items: list[TokenLogprob], tokenizer: Any) -> list[TokenLogprob]:
    """The entries of tokens that are in the content: not the end token (or any special token, which the
    detokenizer leaves out of the text), as OpenAI leaves it out."""
    special = set(getattr(tokenizer, "all_special_ids", ()))
    return [i for i in items if i.token_id not in special]


def chat_logprobs(items: list[TokenLogprob], tokenizer: Any) -> dict[str, Any]:
    """``choice.logprobs`` of a chat completion (or of one streamed chunk)."""
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": _text(tokenizer, token_id), "logprob": _finite(logprob),
                "bytes": list(token_bytes(tokenizer, token_id))}

    return {"content": [entry(i.token_id, i.logprob) | {"top_logprobs": [entry(t, lp) for t, lp in i.top]}
                        for i in _content(items, tokenizer)], "refusal": None}


def completion_logprobs(items: list[TokenLogprob], tokenizer: Any, offset: int = 0) -> dict[str, Any]:
    """``choice.logprobs`` of a text completion: tokens, their logprobs, top alternatives, text offsets. A
    token's offset is the characters of text before it, counted from the bytes of the tokens before it: a
    character split over tokens (each alone decodes to U+FFFD) counted one per token, and every offset after
    it pointed at the wrong character."""
    tokens, offsets = [], []
    items = _content(items, tokenizer)
    before = b""
    for item in items:
        offsets.append(offset + len(before.decode("utf-8", errors="ignore")))  # a partial last character: 0
        tokens.append(_text(tokenizer, item.token_id))
        before += token_bytes(tokenizer, item.token_id)
    return {"tokens": tokens, "token_logprobs": [_finite(i.logprob) for i in items],
            "top_logprobs": [{_text(tokenizer, t): _finite(lp) for t, lp in i.top} for i in items],
            "text_offset": offsets}
