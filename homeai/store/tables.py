"""SQLAlchemy tables of the store (declarative, SQLAlchemy 2 typing).

Users, API keys (only a SHA-256 of each key is kept, with a short prefix to tell keys apart), every
policy version that was applied (its YAML text, when, and by whom), the request log, background jobs
and their runs, and the search collections (documents, their chunks and vectors). Times are UTC.
Every column type is portable (SQLite and PostgreSQL); the schema is created by Alembic
(homeai/store/migrations), so a change here needs a new revision there.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend (SQLite hands naive datetimes back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: object) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: object) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    pass


class UserRow(Base):
    """A household member or a service (a key always belongs to one)."""

    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ApiKeyRow(Base):
    """An API key: the caller's user, default class and admin flag. The key itself is never stored."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the whole key
    prefix: Mapped[str] = mapped_column(String(16), index=True)  # "hai_" + 8 characters, for display
    user: Mapped[str] = mapped_column(ForeignKey("users.name"), index=True)
    default_class: Mapped[str | None] = mapped_column(String(64), nullable=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    scopes: Mapped[str] = mapped_column(String(200), default="", server_default="")  # space-separated
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True, default=None)


class PolicyVersionRow(Base):
    """One applied policy: the YAML exactly as it was applied, so a rollback restores the text too."""

    __tablename__ = "policy_versions"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    yaml_text: Mapped[str] = mapped_column(Text)
    applied_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    applied_by: Mapped[str] = mapped_column(String(64))
    note: Mapped[str] = mapped_column(String(200), default="")


class RequestLogRow(Base):
    """One finished request (written in batches off the token path by the request-log writer)."""

    __tablename__ = "request_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    request_id: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))  # chat, completion, embedding, ...
    class_name: Mapped[str] = mapped_column(String(64), index=True)
    user: Mapped[str] = mapped_column(String(64), index=True)
    model: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16))
    num_prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    num_output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    queue_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    ttft_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    itl_ms: Mapped[float | None] = mapped_column(Float, nullable=True)  # mean gap between output tokens
    e2e_ms: Mapped[float] = mapped_column(Float)
    node: Mapped[str | None] = mapped_column(String(64), nullable=True)  # cluster node; NULL on a single box


class JobRow(Base):
    """A background job: what it does (``kind`` + ``spec`` JSON), when (``schedule``), where it stands."""

    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))  # index, prompt, retention
    spec: Mapped[str] = mapped_column(Text)  # JSON of the kind's fields
    schedule: Mapped[str | None] = mapped_column(String(128), nullable=True)
    state: Mapped[str] = mapped_column(String(16), default="queued")  # queued running paused done failed
    done_chunks: Mapped[int] = mapped_column(Integer, default=0)
    total_chunks: Mapped[int] = mapped_column(Integer, default=0)
    done_files: Mapped[int] = mapped_column(Integer, default=0)
    total_files: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_by: Mapped[str] = mapped_column(String(64), default="system")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class JobRunRow(Base):
    """One execution of a job: its outcome, counts, and output (a prompt job's answer)."""

    __tablename__ = "job_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    state: Mapped[str] = mapped_column(String(16))  # running, done, failed, paused
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    num_done: Mapped[int] = mapped_column(Integer, default=0)
    output: Mapped[str | None] = mapped_column(Text, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class CollectionRow(Base):
    """A named set of documents; ``version`` counts commits, so a search cache knows when it is stale.
    Its ``owner`` (the user whose job built it; None for collections older than ownership) and the
    users in ``collection_readers`` may search it, and admins."""

    __tablename__ = "collections"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    version: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    owner: Mapped[str | None] = mapped_column(String(64), nullable=True, default=None)


class CollectionReaderRow(Base):
    """A user (besides the owner and admins) who may search a collection; ``*`` is everyone with a key."""

    __tablename__ = "collection_readers"

    collection_id: Mapped[int] = mapped_column(ForeignKey("collections.id", ondelete="CASCADE"), primary_key=True)
    user: Mapped[str] = mapped_column(String(64), primary_key=True)


class DocumentRow(Base):
    """An indexed file: its path and the SHA-256 of the content its chunks were made from."""

    __tablename__ = "documents"
    __table_args__ = (UniqueConstraint("collection_id", "path", name="uq_documents_collection_path"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    collection_id: Mapped[int] = mapped_column(ForeignKey("collections.id", ondelete="CASCADE"), index=True)
    path: Mapped[str] = mapped_column(String(1024))
    sha256: Mapped[str] = mapped_column(String(64))
    mtime: Mapped[float] = mapped_column(Float)
    num_chunks: Mapped[int] = mapped_column(Integer, default=0)
    indexed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # the encoder that made its vectors (None: written before this was recorded, or by a test's embedder)
    embedding_model: Mapped[str | None] = mapped_column(String(200), nullable=True)


class ChunkRow(Base):
    """A window of a document's tokens, its text and its unit embedding (float32 bytes, little-endian)."""

    __tablename__ = "chunks"
    __table_args__ = (UniqueConstraint("document_id", "ordinal", name="uq_chunks_document_ordinal"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    document_id: Mapped[int] = mapped_column(ForeignKey("documents.id", ondelete="CASCADE"), index=True)
    ordinal: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    num_tokens: Mapped[int] = mapped_column(Integer)
    vector: Mapped[bytes] = mapped_column(LargeBinary)
