"""A migrated SQLite store in the test's temporary folder, for the unit tests that need one (a module
that wants PostgreSQL too, or another folder, defines its own)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from homeai.store.db import Store


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = Store.in_dir(tmp_path)
    await s.init()
    yield s
    await s.close()
