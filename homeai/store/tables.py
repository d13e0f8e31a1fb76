"""SQLAlchemy tables of the store (declarative, SQLAlchemy 2 typing).

Users, API keys (only a SHA-256 of each key is kept, with a short prefix to tell keys apart), and
every policy version that was applied (its YAML text, when, and by whom). Times are UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Boolean, DateTime, ForeignKey, Integer, String, Text
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
