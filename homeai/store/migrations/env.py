"""Alembic environment: the store's metadata, on a connection handed in by ``homeai.store.migrate``.

At start the server runs ``upgrade head`` on a connection of its own async engine (``run_sync``), so
this file never opens one. Run standalone (``alembic -c ... upgrade head``), it opens an async engine
on ``sqlalchemy.url`` or HOMEAI_DATABASE_URL. APScheduler's own table is left to APScheduler.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from homeai.store.tables import Base

config = context.config
target_metadata = Base.metadata
FOREIGN_TABLES = {"apscheduler_jobs"}


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    return not (type_ == "table" and name in FOREIGN_TABLES)


def run_on(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, include_object=include_object,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


async def run_standalone(url: str) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(run_on)
    finally:
        await engine.dispose()


def main() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        run_on(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("HOMEAI_DATABASE_URL")
    if not url:
        raise SystemExit("set sqlalchemy.url or HOMEAI_DATABASE_URL")
    if context.is_offline_mode():
        context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    asyncio.run(run_standalone(url))


main()
