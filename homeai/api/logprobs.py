"""Token logprobs in OpenAI's two shapes (chat ``content`` entries, legacy completions arrays).

The values come from the distribution each token was drawn from; a token the grammar forbade has
probability 0, sent as OpenAI does as -9999.0 (JSON has no -Infinity).
"""

from __future__ import annotations

import math
from typing import Any

from homeai.core.types import TokenLogprob

FLOOR = -9999.0


def _finite(value: float) -> float:
    return value if math.isfinite(value) else FLOOR


def _text(tokenizer: Any, token_id: int) -> str:
    return tokenizer.decode([token_id])


def chat_logprobs(items: list[TokenLogprob], tokenizer: Any) -> dict[str, Any]:
    """``choice.logprobs`` of a chat completion (or of one streamed chunk)."""
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = _text(tokenizer, token_id)
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode())}

    return {"content": [entry(i.token_id, i.logprob) | {"top_logprobs": [entry(t, lp) for t, lp in i.top]}
                        for i in items], "refusal": None}


def completion_logprobs(items: list[TokenLogprob], tokenizer: Any, offset: int = 0) -> dict[str, Any]:
    """``choice.logprobs`` of a text completion: tokens, their logprobs, top alternatives, text offsets."""
    tokens, offsets = [], []
    for item in items:
        offsets.append(offset)
        text = _text(tokenizer, item.token_id)
        tokens.append(text)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [_finite(i.logprob) for i in items],
            "top_logprobs": [{_text(tokenizer, t): _finite(lp) for t, lp in i.top} for i in items],
            "text_offset": offsets}
