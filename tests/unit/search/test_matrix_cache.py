"""Top-k by numpy over a matrix cached per collection, reloaded only when the collection's version moves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from store_helpers import BACKENDS, open_store

from homeai.search.matrix_cache import SearchIndex, top_k
from homeai.store.collections import NewChunk
from homeai.store.db import Store


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s = await open_store(request.param, tmp_path)
    yield s
    await s.close()


def unit(*values: float) -> np.ndarray:
    v = np.array(values, dtype=np.float32)
    return v / np.linalg.norm(v)


def test_top_k_orders_by_score() -> None:
    matrix = np.stack([unit(1, 0, 0), unit(0, 1, 0), unit(1, 1, 0), unit(0, 0, 1)])
    rows, scores = top_k(matrix, unit(1, 0.2, 0), 3)
    assert rows.tolist() == [0, 2, 1]
    assert scores[0] > scores[1] > scores[2]
    assert top_k(matrix, unit(1, 0, 0), 10)[0].shape == (4,)
    assert top_k(np.zeros((0, 3), np.float32), unit(1, 0, 0), 5)[0].shape == (0,)


async def test_cache_is_reloaded_only_after_a_commit(store: Store) -> None:
    cid = await store.collections.ensure("home")
    await store.collections.commit_document(cid, "/d/cats.txt", "s1", 0.0, [
        NewChunk("cats purr", 2, unit(1, 0, 0)), NewChunk("cats sleep", 2, unit(0.9, 0.1, 0))])
    index = SearchIndex(store.collections)
    hits = await index.search(cid, unit(1, 0, 0), 1)
    assert [(h.text, h.document) for h in hits] == [("cats purr", "/d/cats.txt")]
    assert hits[0].score == pytest.approx(1.0, abs=1e-6)
    await index.search(cid, unit(0, 1, 0), 2)
    assert index.num_loads == 1
    await store.collections.commit_document(cid, "/d/tax.md", "s2", 0.0, [NewChunk("tax forms", 2, unit(0, 1, 0))])
    hits = await index.search(cid, unit(0, 1, 0), 2)
    assert index.num_loads == 2 and hits[0].document == "/d/tax.md"
    await store.collections.remove_documents(cid, ["/d/tax.md"])
    hits = await index.search(cid, unit(0, 1, 0), 5)
    assert index.num_loads == 3 and {h.document for h in hits} == {"/d/cats.txt"}


async def test_empty_collection_and_wrong_dimensions(store: Store) -> None:
    cid = await store.collections.ensure("empty")
    index = SearchIndex(store.collections)
    assert await index.search(cid, unit(1, 0, 0), 3) == []
    await store.collections.commit_document(cid, "/d/a.txt", "s", 0.0, [NewChunk("a", 1, unit(1, 0, 0, 0))])
    with pytest.raises(ValueError, match="another embedding model"):
        await index.search(cid, unit(1, 0, 0), 3)


async def test_the_cache_keeps_one_matrix_a_collection_and_a_bounded_number_of_collections(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a review: a collection searched by a second encoder kept the first one's matrix (texts and
    paths too) for good, and every collection ever searched stayed in memory."""
    from homeai.search import matrix_cache

    monkeypatch.setattr(matrix_cache, "MAX_CACHED_COLLECTIONS", 2)
    index = SearchIndex(store.collections)
    cids = []
    for name in ("a", "b", "c"):
        cid = await store.collections.ensure(name)
        await store.collections.commit_document(cid, f"/d/{name}.txt", "s", 0.0, [NewChunk(name, 1, unit(1, 0, 0))])
        cids.append(cid)
    await index.search(cids[0], unit(1, 0, 0), 1, model="mini")
    await index.search(cids[0], unit(1, 0, 0), 1, model="bge")  # another encoder of the same width
    assert [k for k in index._cache if k[0] == cids[0]] == [(cids[0], 3, "bge")]
    await index.search(cids[1], unit(1, 0, 0), 1)
    await index.search(cids[2], unit(1, 0, 0), 1)
    assert len(index._cache) == 2 and all(k[0] != cids[0] for k in index._cache)  # the oldest went
