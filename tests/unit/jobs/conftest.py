"""A migrated store on each test backend, and a fake embedder (no model)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from indexing_helpers import FakeEmbedder
from store_helpers import BACKENDS, open_store

from homeai.store.db import Store


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s = await open_store(request.param, tmp_path)
    yield s
    await s.close()


@pytest.fixture
def embedder() -> FakeEmbedder:
    return FakeEmbedder()
