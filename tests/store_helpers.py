"""Databases for store and jobs tests: SQLite in tmp always, PostgreSQL too when HOMEAI_TEST_DATABASE_URL
is set (``postgresql+asyncpg://user:pw@host/db``; every test starts from an empty database)."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import MetaData, create_engine
from sqlalchemy.engine import make_url

from homeai.store.db import Store, sqlite_url

TEST_DATABASE_URL_ENV = "HOMEAI_TEST_DATABASE_URL"

# Parametrize store tests with these: PostgreSQL only when a server is configured (no skip noise otherwise).
BACKENDS = ["sqlite"] + (["postgresql"] if os.environ.get(TEST_DATABASE_URL_ENV) else [])


def sync_url(url: str) -> str:
    """The same database through a blocking driver (what the tests read it with)."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    driver = {"postgresql": "postgresql+psycopg"}.get(backend, backend)
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


def empty_database(url: str) -> None:
    """Drop every table (ours, Alembic's, APScheduler's) so that a test starts from nothing."""
    engine = create_engine(sync_url(url))
    try:
        with engine.begin() as conn:
            meta = MetaData()
            meta.reflect(conn)
            meta.drop_all(conn)
    finally:
        engine.dispose()


def database_url(backend: str, tmp_path: Path) -> str:
    """A fresh database of ``backend`` for one test."""
    if backend == "sqlite":
        return sqlite_url(tmp_path / "homeai.db")
    url = os.environ[TEST_DATABASE_URL_ENV]
    empty_database(url)
    return url


async def open_store(backend: str, tmp_path: Path) -> Store:
    store = Store(database_url(backend, tmp_path))
    await store.init()
    return store
