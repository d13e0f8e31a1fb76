"""A fake ``TextEmbedder`` for indexing tests: words are tokens, a text's vector comes from its hash."""

from __future__ import annotations

import hashlib

import numpy as np

from homeai.jobs.chunking import word_offsets


class FakeEmbedder:
    """``TextEmbedder`` without a model: a text's vector is a unit vector seeded by its hash.

    After ``fail_after`` batches it raises (a crash mid-run); ``batches`` records what was embedded."""

    max_chunk_tokens = 254

    def __init__(self, dim: int = 8, fail_after: int | None = None) -> None:
        self.dim = dim
        self.fail_after = fail_after
        self.batches: list[list[str]] = []

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return word_offsets(text)

    async def embed(self, texts: list[str]) -> np.ndarray:
        if self.fail_after is not None and len(self.batches) >= self.fail_after:
            raise RuntimeError("simulated crash")
        self.batches.append(list(texts))
        return np.stack([vector_of(t, self.dim) for t in texts])


def vector_of(text: str, dim: int = 8) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)
