"""Top-k chunks of a collection for a query vector: numpy over a matrix cached per collection.

The cache holds each collection's vectors with the version they were read at; a search first reads the
collection's version (one indexed row) and loads the matrix again only when a commit bumped it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from homeai.store.collections import Collections, CollectionVectors

THREAD_ABOVE_ROWS = 50_000  # bigger matrices are scored off the event loop
# Collections whose matrices stay in memory (one each: a collection searched by another encoder since
# replaces its entry). Without a bound every collection ever searched stayed, with each encoder's copy.
MAX_CACHED_COLLECTIONS = 16


@dataclass(frozen=True, slots=True)
class Hit:
    text: str
    score: float
    document: str


def top_k(matrix: np.ndarray, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices, scores) of the ``k`` best rows by dot product (cosine for unit vectors), best first."""
    if matrix.shape[0] == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    scores = matrix @ query.astype(np.float32, copy=False)
    k = min(k, scores.shape[0])
    best = np.argpartition(-scores, k - 1)[:k]
    best = best[np.argsort(-scores[best], kind="stable")]
    return best, scores[best]


class SearchIndex:
    def __init__(self, collections: Collections) -> None:
        self.collections = collections
        self._cache: dict[tuple[int, int, str | None], CollectionVectors] = {}  # (collection, dimensions, model)
        self._locks: dict[int, asyncio.Lock] = {}
        self.num_loads = 0  # how often a matrix was (re)loaded (tests, stats)

    async def vectors(self, collection_id: int, dim: int, model: str | None = None) -> CollectionVectors:
        """The collection's vectors of ``dim`` dimensions (that ``model`` made, if named), loaded again only
        when its version moved."""
        key = (collection_id, dim, model)
        version = await self.collections.version(collection_id)
        cached = self._cache.get(key)
        if cached is not None and cached.version == version:
            return cached
        async with self._locks.setdefault(collection_id, asyncio.Lock()):
            cached = self._cache.get(key)
            if cached is None or cached.version != version:
                cached = await self.collections.vectors(collection_id, dim, model)
                for other in [k for k in self._cache if k[0] == collection_id]:  # another encoder's, or older
                    del self._cache[other]
                self._cache[key] = cached
                self.num_loads += 1
                while len(self._cache) > MAX_CACHED_COLLECTIONS:  # the least recently loaded goes
                    del self._cache[next(iter(self._cache))]
        return cached

    async def search(self, collection_id: int, query: np.ndarray, k: int, model: str | None = None) -> list[Hit]:
        """The ``k`` chunks nearest ``query``, among those embedded by ``model`` (any model of the query's
        width when None): two encoders of one width make vectors of the same shape that mean different things
        (a collection indexed with another model before answers from what was indexed again since)."""
        dim = int(query.shape[-1])
        data = await self.vectors(collection_id, dim, model)
        if not data.matrix.shape[0]:
            others = {(m, w) for m, w in await self.collections.vector_spaces(collection_id)
                      if w != dim or (model is not None and m not in (model, None))}
            if others:
                raise ValueError(f"it was indexed with another embedding model: the collection holds "
                                 f"{_spaces(others)}, the query is {_spaces({(model, dim)})}; search with a class "
                                 "on its model, or run its index job again")
        if data.matrix.shape[0] > THREAD_ABOVE_ROWS:
            rows, scores = await asyncio.to_thread(top_k, data.matrix, query, k)
        else:
            rows, scores = top_k(data.matrix, query, k)
        return [Hit(data.texts[i], float(s), data.documents[i]) for i, s in zip(rows.tolist(), scores.tolist(),
                                                                                  strict=True)]


def _spaces(spaces: set[tuple[str | None, int]]) -> str:
    """"model 'a' (384 dimensions)" for each, or "vectors of 8 dimensions" where the model is unknown."""
    return " and ".join(f"model {m!r} ({w} dimensions)" if m else f"vectors of {w} dimensions"
                        for m, w in sorted(spaces, key=lambda s: (s[0] or "", s[1])))
