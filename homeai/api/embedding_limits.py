"""An embedding input longer than the model takes: refused by name, or cut only when the caller allows it.

The encoder embeds at most ``max_length`` tokens ([CLS] and [SEP] included; 256 for all-minilm-l6-v2)
and its tokenizer silently cuts longer texts, so a search could miss everything past the cut and
nobody would know. OpenAI's /v1/embeddings refuses such an input with a 400 naming it; Ollama's
/api/embed has ``truncate`` (default true: cut; false: refuse). Both routes call ``check_input_lengths``
when refusing is what their API does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from homeai.api.errors import BadRequest


def input_lengths(embedder: Any, inputs: Sequence[str] | Sequence[Sequence[int]]) -> list[int]:
    """Tokens each input would take uncut, special tokens included (token arrays: as given). Through the
    embedder, which serializes use of its tokenizer across threads."""
    if inputs and isinstance(inputs[0], str):
        return list(embedder.token_lengths(list(inputs)))
    return [len(row) for row in inputs]


async def check_input_lengths(embedder: Any, model: str, inputs: Sequence[str] | Sequence[Sequence[int]],
                              field: str = "input") -> None:
    """BadRequest naming the first input over ``embedder.max_length`` (tokenized off the event loop)."""
    limit = int(embedder.max_length)
    lengths = await asyncio.to_thread(input_lengths, embedder, inputs)
    for i, n in enumerate(lengths):
        if n > limit:
            param = f"{field}[{i}]" if len(lengths) > 1 else field
            raise BadRequest(f"{param} has {n} tokens; model {model!r} embeds at most {limit} tokens per input. "
                             "Shorten it or split it into several inputs.", param=param,
                             code="context_length_exceeded")
