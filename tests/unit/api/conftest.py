"""Fixtures the API unit tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from homeai.store.db import Store


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    """A fresh SQLite store in the test's folder."""
    s = Store.in_dir(tmp_path / "data")
    await s.init()
    yield s
    await s.close()
