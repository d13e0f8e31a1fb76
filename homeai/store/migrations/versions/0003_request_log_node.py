"""The request log says which node served what: ``request_log.node``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02

``node`` is the cluster node whose replica served the request (its last placement, when a failed
replica made the router place it again); NULL on a single box and for rows written before this revision.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _has_column(table: str, column: str) -> bool:
    return any(c["name"] == column for c in sa.inspect(op.get_bind()).get_columns(table))


def upgrade() -> None:
    # a database adopted by 0001 (made by ``create_all`` of newer tables) may have the column already
    if not _has_column("request_log", "node"):
        with op.batch_alter_table("request_log") as batch:
            batch.add_column(sa.Column("node", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("request_log") as batch:
        batch.drop_column("node")
