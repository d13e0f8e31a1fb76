"""Run the store's Alembic migrations from code (``upgrade head`` at every start; cheap when current).

``upgrade_head`` takes a *sync* connection, which is what ``AsyncConnection.run_sync`` hands over, so
the server migrates on its own async engine: no second driver, no second engine.
"""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # a line per plugin at every start


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade_head(connection: Connection) -> None:
    """Bring the schema to the newest revision (inside the caller's transaction)."""
    command.upgrade(alembic_config(connection), "head")


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()
