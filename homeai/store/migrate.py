"""Run the store's Alembic migrations from code (``upgrade head`` at every start; cheap when current).

``upgrade_head`` takes a *sync* connection, which is what ``AsyncConnection.run_sync`` hands over, so
the server migrates on its own async engine: no second driver, no second engine.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
# Alembic logs a line per plugin as it is first imported (below, lazily): not worth a line at every start.
logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


def alembic_config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade_head(connection: Connection) -> None:
    """Bring the schema to the newest revision (inside the caller's transaction)."""
    from alembic import command

    command.upgrade(alembic_config(connection), "head")


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()
