"""Each indexed document says which embedding model made its vectors: ``documents.embedding_model``.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05

Two encoders of the same width (a 384-dimension MiniLM and a multilingual 384-dimension model) give vectors
of the same shape that mean different things: a search compared a query of one with chunks of the other and
ranked noise, and an index job kept the old vectors of unchanged files. NULL for rows written before this
revision (their model is unknown: only their width is checked, as before).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _has_column(table: str, column: str) -> bool:
    return any(c["name"] == column for c in sa.inspect(op.get_bind()).get_columns(table))


def upgrade() -> None:
    # a database adopted by 0001 (made by ``create_all`` of newer tables) may have the column already
    if not _has_column("documents", "embedding_model"):
        with op.batch_alter_table("documents") as batch:
            batch.add_column(sa.Column("embedding_model", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("documents") as batch:
        batch.drop_column("embedding_model")
