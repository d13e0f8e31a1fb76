"""Alembic at start: a new database is migrated to head, the schema equals the tables' metadata, a
second start does nothing, and a database made before migrations (create_all) is adopted."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Table
from sqlalchemy.ext.asyncio import create_async_engine
from store_helpers import BACKENDS, database_url

from homeai.store.db import Store, sqlite_url
from homeai.store.migrate import head_revision
from homeai.store.tables import ApiKeyRow, Base, PolicyVersionRow, UserRow


@pytest.mark.parametrize("backend", BACKENDS)
async def test_new_database_is_at_head_and_matches_the_tables(backend: str, tmp_path: Path) -> None:
    store = Store(database_url(backend, tmp_path))
    await store.init()
    assert store.engine is not None
    async with store.engine.connect() as conn:
        diff = await conn.run_sync(lambda c: compare_metadata(MigrationContext.configure(c), Base.metadata))
        revision = await conn.run_sync(lambda c: MigrationContext.configure(c).get_current_revision())
    await store.close()
    assert diff == []
    assert revision == head_revision() is not None
    again = Store(store.url)
    await again.init()  # already at head: nothing to do, nothing fails
    await again.close()


async def test_a_database_from_before_migrations_is_adopted(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "homeai.db")
    engine = create_async_engine(url)
    legacy: list[Table] = [UserRow.__table__, ApiKeyRow.__table__, PolicyVersionRow.__table__]  # type: ignore[list-item]
    async with engine.begin() as conn:
        await conn.run_sync(lambda c: Base.metadata.create_all(c, tables=legacy))
    await engine.dispose()
    store = Store(url)
    await store.init()
    key, _ = await store.keys.create("old-key")
    assert await store.keys.verify(key) is not None
    await store.close()
    with sqlite3.connect(tmp_path / "homeai.db") as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"request_log", "jobs", "job_runs", "collections", "documents", "chunks", "alembic_version"} <= tables
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(head_revision(),)]


def test_sync_url_names_the_same_database(tmp_path: Path) -> None:
    assert Store.in_dir(tmp_path).sync_url == f"sqlite:///{(tmp_path / 'homeai.db').resolve()}"
    assert Store("postgresql+asyncpg://u:p@db:5432/homeai").sync_url == "postgresql+psycopg://u:p@db:5432/homeai"
