"""The store: one async SQLAlchemy engine, SQLite (WAL) in the data directory by default.

``Store(url)`` takes any SQLAlchemy async URL (``postgresql+asyncpg://...``); ``Store.in_dir(path)``
uses ``<path>/homeai.db``. ``init()`` migrates the schema to the newest Alembic revision and builds the
per-area repositories: ``store.keys`` (API keys, cached for auth), ``store.policy_versions``,
``store.jobs`` and ``store.collections`` (documents, chunks and vectors for search).
``sync_url`` names the same database for libraries that need a blocking driver (APScheduler).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from homeai.store.keys import ApiKeys
from homeai.store.policy_versions import PolicyVersions

if TYPE_CHECKING:  # imported in init(): alembic and numpy would slow every CLI command's start
    from homeai.store.collections import Collections
    from homeai.store.jobs import Jobs

log = logging.getLogger(__name__)

DB_FILE_NAME = "homeai.db"


def sqlite_url(path: str | Path) -> str:
    return f"sqlite+aiosqlite:///{Path(path).expanduser().resolve()}"


class Store:
    """Owns the engine and the session factory; ``init`` before use, ``close`` at shutdown."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine: AsyncEngine | None = None
        self.sessions: async_sessionmaker[AsyncSession] | None = None
        self._keys: ApiKeys | None = None
        self._policy_versions: PolicyVersions | None = None
        self._jobs: Jobs | None = None
        self._collections: Collections | None = None

    @classmethod
    def in_dir(cls, data_dir: str | Path) -> Store:
        """The embedded default: SQLite at ``<data_dir>/homeai.db``."""
        return cls(sqlite_url(Path(data_dir) / DB_FILE_NAME))

    @property
    def is_sqlite(self) -> bool:
        return make_url(self.url).get_backend_name() == "sqlite"

    @property
    def sync_url(self) -> str:
        """The same database through a blocking driver: pysqlite for SQLite, psycopg for PostgreSQL."""
        url = make_url(self.url)
        backend = url.get_backend_name()
        driver = {"postgresql": "postgresql+psycopg"}.get(backend, backend)
        return url.set(drivername=driver).render_as_string(hide_password=False)

    async def init(self) -> None:
        """Connect, switch SQLite to WAL, run the migrations (``alembic upgrade head``)."""
        if self.engine is not None:
            return
        from homeai.store.collections import Collections
        from homeai.store.jobs import Jobs
        from homeai.store.migrate import upgrade_head

        kwargs: dict[str, Any] = {}
        if self.is_sqlite:
            database = make_url(self.url).database
            if database and database != ":memory:":
                Path(database).parent.mkdir(parents=True, exist_ok=True)
                owner_only(Path(database))
            kwargs["connect_args"] = {"timeout": 10}
        engine = create_async_engine(self.url, **kwargs)
        if self.is_sqlite:
            event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        async with engine.begin() as conn:
            await conn.run_sync(upgrade_head)
        self.engine = engine
        self.sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._keys = ApiKeys(self.sessions)
        self._policy_versions = PolicyVersions(self.sessions)
        self._jobs = Jobs(self.sessions)
        self._collections = Collections(self.sessions)

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.dispose()
            self.engine = None

    @property
    def keys(self) -> ApiKeys:
        if self._keys is None:
            raise RuntimeError("Store.init() has not run")
        return self._keys

    @property
    def policy_versions(self) -> PolicyVersions:
        if self._policy_versions is None:
            raise RuntimeError("Store.init() has not run")
        return self._policy_versions

    @property
    def jobs(self) -> Jobs:
        if self._jobs is None:
            raise RuntimeError("Store.init() has not run")
        return self._jobs

    @property
    def collections(self) -> Collections:
        if self._collections is None:
            raise RuntimeError("Store.init() has not run")
        return self._collections

    async def ping(self, timeout_s: float = 1.0) -> bool:
        """True when the database answers a trivial query within ``timeout_s`` (for /readyz)."""
        if self.engine is None:
            return False
        try:
            async with asyncio.timeout(timeout_s):
                async with self.engine.connect() as conn:
                    await conn.execute(text("SELECT 1"))
            return True
        except Exception as e:  # any failure means "not available"
            log.warning("store ping failed: %s", e)
            return False


def owner_only(database: Path) -> None:
    """The SQLite file (and its WAL and shared-memory files, which SQLite creates with the database's mode)
    readable by its owner only: it holds every indexed chunk's text, the request log and key hashes, and
    another account on a shared PC read them past the collections' readers with the umask's 0644."""
    database.touch(mode=0o600, exist_ok=True)
    for path in (database, database.with_name(database.name + "-wal"), database.with_name(database.name + "-shm")):
        if path.exists() and path.stat().st_mode & 0o077:
            path.chmod(0o600)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    """WAL lets readers (stats, the TUI's history) run while a writer commits; NORMAL sync is safe in WAL."""
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=10000")
    finally:
        cur.close()
