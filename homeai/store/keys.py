"""API keys: created once (the plaintext is shown then and never again), listed, revoked, verified.

Only ``sha256(key)`` is stored. ``verify`` runs on every request, so it reads an in-memory map of the
active keys' hashes, refreshed at once by ``create``/``revoke`` in this process and at most
``cache_ttl_s`` later for changes made elsewhere (``homeai keys revoke`` while the server runs).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from homeai.store.tables import ApiKeyRow, UserRow, utcnow

log = logging.getLogger(__name__)

KEY_PREFIX = "hai_"
DISPLAY_CHARS = 12  # "hai_" + 8: enough to tell a household's keys apart, useless to an attacker
MIN_MATCH_CHARS = 6  # a revoke by prefix must name at least this much of the key
KNOWN_SCOPES = frozenset({"metrics"})  # metrics: may read /v1/stats, its stream and /metrics
RESERVED_USER = "anonymous"  # the user of requests made without a key (homeai.api.auth.ANONYMOUS)


class KeyStoreError(ValueError):
    """A key operation that cannot be done as asked (duplicate name, no match, ambiguous prefix)."""


class KeyStoreUnavailable(RuntimeError):
    """The keys table cannot be read and nothing is cached (auth answers 503)."""


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What the store knows about a key (never the key itself)."""

    id: int
    name: str
    prefix: str
    user: str
    default_class: str | None
    is_admin: bool
    created_at: datetime
    revoked_at: datetime | None
    scopes: tuple[str, ...] = ()  # e.g. ("metrics",): what a non-admin key may do beyond serving

    @classmethod
    def from_row(cls, row: ApiKeyRow) -> KeyInfo:
        return cls(row.id, row.name, row.prefix, row.user, row.default_class, row.is_admin,
                   row.created_at, row.revoked_at, tuple((row.scopes or "").split()))


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class ApiKeys:
    """Key repository over the store's session factory, with the verification cache."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], cache_ttl_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sessions = sessions
        self.cache_ttl_s = cache_ttl_s
        self._clock = clock
        self._active: dict[str, KeyInfo] | None = None  # key_hash -> info
        self._loaded_s = 0.0

    async def create(self, name: str, user: str | None = None, default_class: str | None = None,
                     is_admin: bool = False, scopes: Sequence[str] = ()) -> tuple[str, KeyInfo]:
        """Make a key; returns (plaintext, info). The plaintext exists only in this return value."""
        name = name.strip()
        if not name or len(name) > 64:
            raise KeyStoreError("a key name is 1 to 64 characters")
        unknown = sorted(set(scopes) - KNOWN_SCOPES)
        if unknown:
            raise KeyStoreError(f"unknown scope(s) {', '.join(unknown)} (known: {', '.join(sorted(KNOWN_SCOPES))})")
        user = (user or name).strip()
        if user == RESERVED_USER:
            raise KeyStoreError(f"the user {RESERVED_USER!r} is the one of requests without a key; name another "
                                "(--user NAME)")
        key = new_key()
        async with self._sessions.begin() as session:
            taken = await session.scalar(select(ApiKeyRow.id).where(ApiKeyRow.name == name,
                                                                    ApiKeyRow.revoked_at.is_(None)))
            if taken is not None:
                raise KeyStoreError(f"an active key is already named {name!r}")
            if await session.get(UserRow, user) is None:
                session.add(UserRow(name=user))
                await session.flush()
            row = ApiKeyRow(name=name, key_hash=hash_key(key), prefix=key[:DISPLAY_CHARS], user=user,
                            default_class=default_class, is_admin=is_admin, created_at=utcnow(),
                            scopes=" ".join(sorted(set(scopes))))
            session.add(row)
            await session.flush()
            info = KeyInfo.from_row(row)
        self.invalidate()
        return key, info

    async def list(self, include_revoked: bool = False) -> list[KeyInfo]:
        async with self._sessions() as session:
            query = select(ApiKeyRow).order_by(ApiKeyRow.id)
            if not include_revoked:
                query = query.where(ApiKeyRow.revoked_at.is_(None))
            return [KeyInfo.from_row(row) for row in await session.scalars(query)]

    async def revoke(self, name_or_prefix: str) -> KeyInfo:
        """Revoke the one active key with this name, or whose key starts with this prefix."""
        needle = name_or_prefix.strip()
        async with self._sessions.begin() as session:
            active = select(ApiKeyRow).where(ApiKeyRow.revoked_at.is_(None))
            rows = list(await session.scalars(active.where(ApiKeyRow.name == needle)))
            if not rows and len(needle) >= MIN_MATCH_CHARS:
                probe = needle[:DISPLAY_CHARS]
                rows = [r for r in await session.scalars(active.where(ApiKeyRow.prefix.startswith(probe)))
                        if needle.startswith(r.prefix) or r.prefix.startswith(needle)]
            if not rows:
                raise KeyStoreError(f"no active key named or starting with {needle!r}")
            if len(rows) > 1:
                raise KeyStoreError(f"{needle!r} matches {len(rows)} keys: "
                                    + ", ".join(f"{r.name} ({r.prefix})" for r in rows))
            rows[0].revoked_at = utcnow()
            info = KeyInfo.from_row(rows[0])
        self.invalidate()
        return info

    async def verify(self, key: str) -> KeyInfo | None:
        """The active key's info, or None. Reads the cache (one dict lookup when fresh)."""
        if not key.startswith(KEY_PREFIX):
            return None
        active = await self._active_keys()
        return active.get(hash_key(key))

    async def has_active(self) -> bool:
        """Whether any key exists that is not revoked (then every request must carry one)."""
        return bool(await self._active_keys())

    def invalidate(self) -> None:
        """Forget the cache: the next verify reads the table again."""
        self._active = None

    async def _active_keys(self) -> dict[str, KeyInfo]:
        now = self._clock()
        if self._active is not None and now - self._loaded_s < self.cache_ttl_s:
            return self._active
        try:
            async with self._sessions() as session:
                rows = await session.scalars(select(ApiKeyRow).where(ApiKeyRow.revoked_at.is_(None)))
                self._active = {row.key_hash: KeyInfo.from_row(row) for row in rows}
        except Exception as e:
            if self._active is None:  # never read: fail closed rather than guess that no keys exist
                raise KeyStoreUnavailable(f"cannot read API keys: {e}") from e
            log.warning("cannot read API keys (%s); using the cached ones", e)
        self._loaded_s = now
        return self._active
