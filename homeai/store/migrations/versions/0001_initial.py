"""Initial schema: users, API keys, policy versions, request log, jobs, collections, documents, chunks.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

A database made before migrations existed (``create_all`` of users, api_keys and policy_versions)
is adopted: tables that are already there are left as they are.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)


def _absent(name: str) -> bool:
    return not sa.inspect(op.get_bind()).has_table(name)


def _legacy_tables() -> None:
    if _absent("users"):
        op.create_table(
            "users",
            sa.Column("name", sa.String(64), primary_key=True),
            sa.Column("created_at", TIME, nullable=False))
    if _absent("api_keys"):
        op.create_table(
            "api_keys",
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("name", sa.String(64), nullable=False, index=True),
            sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
            sa.Column("prefix", sa.String(16), nullable=False, index=True),
            sa.Column("user", sa.String(64), sa.ForeignKey("users.name"), nullable=False, index=True),
            sa.Column("default_class", sa.String(64), nullable=True),
            sa.Column("is_admin", sa.Boolean, nullable=False),
            sa.Column("created_at", TIME, nullable=False),
            sa.Column("revoked_at", TIME, nullable=True))
    if _absent("policy_versions"):
        op.create_table(
            "policy_versions",
            sa.Column("version", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("yaml_text", sa.Text, nullable=False),
            sa.Column("applied_at", TIME, nullable=False),
            sa.Column("applied_by", sa.String(64), nullable=False),
            sa.Column("note", sa.String(200), nullable=False))


def _log_and_jobs() -> None:
    op.create_table(
        "request_log",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("created_at", TIME, nullable=False, index=True),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("class_name", sa.String(64), nullable=False, index=True),
        sa.Column("user", sa.String(64), nullable=False, index=True),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("num_prompt_tokens", sa.Integer, nullable=False),
        sa.Column("num_output_tokens", sa.Integer, nullable=False),
        sa.Column("queue_ms", sa.Float, nullable=True),
        sa.Column("ttft_ms", sa.Float, nullable=True),
        sa.Column("itl_ms", sa.Float, nullable=True),
        sa.Column("e2e_ms", sa.Float, nullable=False))
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("schedule", sa.String(128), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("done_chunks", sa.Integer, nullable=False),
        sa.Column("total_chunks", sa.Integer, nullable=False),
        sa.Column("done_files", sa.Integer, nullable=False),
        sa.Column("total_files", sa.Integer, nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("created_by", sa.String(64), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("started_at", TIME, nullable=True),
        sa.Column("finished_at", TIME, nullable=True))
    op.create_table(
        "job_runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("started_at", TIME, nullable=False),
        sa.Column("finished_at", TIME, nullable=True),
        sa.Column("num_done", sa.Integer, nullable=False),
        sa.Column("output", sa.Text, nullable=True),
        sa.Column("error", sa.Text, nullable=True))


def _collections() -> None:
    op.create_table(
        "collections",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("created_at", TIME, nullable=False))
    op.create_table(
        "documents",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("collection_id", sa.Integer, sa.ForeignKey("collections.id", ondelete="CASCADE"),
                  nullable=False, index=True),
        sa.Column("path", sa.String(1024), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("mtime", sa.Float, nullable=False),
        sa.Column("num_chunks", sa.Integer, nullable=False),
        sa.Column("indexed_at", TIME, nullable=False),
        sa.UniqueConstraint("collection_id", "path", name="uq_documents_collection_path"))
    op.create_table(
        "chunks",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("document_id", sa.Integer, sa.ForeignKey("documents.id", ondelete="CASCADE"),
                  nullable=False, index=True),
        sa.Column("ordinal", sa.Integer, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("num_tokens", sa.Integer, nullable=False),
        sa.Column("vector", sa.LargeBinary, nullable=False),
        sa.UniqueConstraint("document_id", "ordinal", name="uq_chunks_document_ordinal"))


def upgrade() -> None:
    _legacy_tables()
    _log_and_jobs()
    _collections()


def downgrade() -> None:
    for name in ("chunks", "documents", "collections", "job_runs", "jobs", "request_log",
                 "policy_versions", "api_keys", "users"):
        op.drop_table(name)
