"""Alembic at start: a new database is migrated to head, the schema equals the tables' metadata, a
second start does nothing, a database made before migrations (create_all) is adopted, and one made at
an older revision is upgraded with its rows kept."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Table, create_engine, insert, select, text
from sqlalchemy.ext.asyncio import create_async_engine
from store_helpers import BACKENDS, database_url

from homeai.store.db import Store, sqlite_url
from homeai.store.migrate import alembic_config, head_revision
from homeai.store.tables import ApiKeyRow, Base, PolicyVersionRow, RequestLogRow, UserRow


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


async def test_a_database_at_0002_upgrades_and_keeps_its_request_log(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "homeai.db")
    old = create_engine(Store(url).sync_url)
    with old.begin() as conn:
        command.upgrade(alembic_config(conn), "0002")
        assert "node" not in {c[1] for c in conn.execute(text("PRAGMA table_info(request_log)"))}
        conn.execute(text("INSERT INTO request_log (created_at, request_id, kind, class_name, user, model, status, "
                          "num_prompt_tokens, num_output_tokens, e2e_ms) "
                          "VALUES ('2026-12-01 00:00:00', 'old', 'chat', 'chat', 'u', 'm', 'ok', 1, 1, 5.0)"))
    old.dispose()
    store = Store(url)
    await store.init()  # what every start does: upgrade head
    assert store.engine is not None and store.sessions is not None
    async with store.engine.connect() as conn:
        diff = await conn.run_sync(lambda c: compare_metadata(MigrationContext.configure(c), Base.metadata))
        revision = await conn.run_sync(lambda c: MigrationContext.configure(c).get_current_revision())
    assert diff == [] and revision == head_revision()
    base = {"request_id": "new", "kind": "chat", "class_name": "chat", "user": "u", "model": "m", "status": "ok",
            "num_prompt_tokens": 1, "num_output_tokens": 1, "e2e_ms": 1.0}
    async with store.sessions.begin() as session:
        await session.execute(insert(RequestLogRow), [{**base, "node": "node-b"}])
    async with store.sessions() as session:
        found = (await session.execute(select(RequestLogRow.request_id, RequestLogRow.node)
                                       .order_by(RequestLogRow.id))).all()
    await store.close()
    assert [tuple(r) for r in found] == [("old", None), ("new", "node-b")]


def test_sync_url_names_the_same_database(tmp_path: Path) -> None:
    assert Store.in_dir(tmp_path).sync_url == f"sqlite:///{(tmp_path / 'homeai.db').resolve()}"
    assert Store("postgresql+asyncpg://u:p@db:5432/homeai").sync_url == "postgresql+psycopg://u:p@db:5432/homeai"
