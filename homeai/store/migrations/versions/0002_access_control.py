"""Access control: key scopes, and collections with an owner and the users who may search them.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

``api_keys.scopes`` holds space-separated scopes (``metrics``: may read stats and /metrics without being
an admin). ``collections.owner`` is the user whose job built it; collections made before this revision
have none and are searchable by admins only until an admin shares them. ``collection_readers`` lists
the other users who may search a collection (``*``: everyone with a key).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _has_column(table: str, column: str) -> bool:
    return any(c["name"] == column for c in sa.inspect(op.get_bind()).get_columns(table))


def upgrade() -> None:
    # a database adopted by 0001 (made by ``create_all`` of newer tables) may have the columns already
    if not _has_column("api_keys", "scopes"):
        with op.batch_alter_table("api_keys") as batch:
            batch.add_column(sa.Column("scopes", sa.String(200), nullable=False, server_default=""))
    if not _has_column("collections", "owner"):
        with op.batch_alter_table("collections") as batch:
            batch.add_column(sa.Column("owner", sa.String(64), nullable=True))
    op.create_table(
        "collection_readers",
        sa.Column("collection_id", sa.Integer, sa.ForeignKey("collections.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("user", sa.String(64), primary_key=True))


def downgrade() -> None:
    op.drop_table("collection_readers")
    with op.batch_alter_table("collections") as batch:
        batch.drop_column("owner")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("scopes")
