"""Chunks counted in the embedding model's tokens: windows of ``size_tokens`` that overlap by
``overlap_tokens``, cut at token boundaries and mapped back to the original text through offsets.

The tokenizer is a function from text to the (start, end) character offsets of its tokens, without
special tokens and without truncation, so that any tokenizer (or a test's word splitter) will do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TokenOffsets = Callable[[str], list[tuple[int, int]]]
DEFAULT_SIZE_TOKENS = 200
DEFAULT_OVERLAP_TOKENS = 40


@dataclass(frozen=True, slots=True)
class Chunk:
    text: str
    num_tokens: int


def chunk_text(text: str, offsets: TokenOffsets, size_tokens: int = DEFAULT_SIZE_TOKENS,
               overlap_tokens: int = DEFAULT_OVERLAP_TOKENS) -> list[Chunk]:
    """Windows [start, start + size) of the tokens; the next starts ``size - overlap`` tokens later.

    The last window ends at the last token (no window only repeats the previous one's tail).
    """
    if size_tokens < 1:
        raise ValueError(f"size_tokens must be at least 1, got {size_tokens}")
    if not 0 <= overlap_tokens < size_tokens:
        raise ValueError(f"overlap_tokens must be in [0, {size_tokens}), got {overlap_tokens}")
    spans = offsets(text)
    chunks: list[Chunk] = []
    start = 0
    while start < len(spans):
        end = min(start + size_tokens, len(spans))
        piece = text[spans[start][0]:spans[end - 1][1]].strip()
        if piece:
            chunks.append(Chunk(piece, end - start))
        if end == len(spans):
            break
        start = end - overlap_tokens
    return chunks


def hf_token_offsets(tokenizer: Any) -> TokenOffsets:
    """Offsets from a Hugging Face fast tokenizer, on a private copy of its Rust tokenizer with neither
    truncation nor padding (the shared one is reconfigured per call by the embedding path)."""
    from tokenizers import Tokenizer

    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    private = Tokenizer.from_str(backend.to_str())
    private.no_truncation()
    private.no_padding()

    def offsets(text: str) -> list[tuple[int, int]]:
        return [(int(a), int(b)) for a, b in private.encode(text, add_special_tokens=False).offsets]

    return offsets


def word_offsets(text: str) -> list[tuple[int, int]]:
    """A whitespace tokenizer (tests, and a fallback with no model at hand)."""
    import re

    return [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
