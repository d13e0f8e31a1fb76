"""Every policy that was applied: its YAML text, when, by whom, and why (admin PUT, rollback, file)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from homeai.store.tables import PolicyVersionRow, utcnow


@dataclass(frozen=True, slots=True)
class PolicyVersion:
    version: int
    yaml_text: str
    applied_at: datetime
    applied_by: str
    note: str

    @classmethod
    def from_row(cls, row: PolicyVersionRow) -> PolicyVersion:
        return cls(row.version, row.yaml_text, row.applied_at, row.applied_by, row.note)

    def summary(self) -> dict[str, object]:
        """JSON-ready, without the text (history listings)."""
        return {"version": self.version, "applied_at": self.applied_at.isoformat(),
                "applied_by": self.applied_by, "note": self.note, "num_chars": len(self.yaml_text)}


class PolicyVersions:
    """Append-only history of applied policies; versions count up from 1 (independent of the file)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def record(self, yaml_text: str, applied_by: str, note: str = "") -> PolicyVersion:
        async with self._sessions.begin() as session:
            row = PolicyVersionRow(yaml_text=yaml_text, applied_by=applied_by[:64], note=note[:200],
                                   applied_at=utcnow())
            session.add(row)
            await session.flush()
            return PolicyVersion.from_row(row)

    async def history(self, limit: int = 50) -> list[PolicyVersion]:
        """Newest first."""
        async with self._sessions() as session:
            query = select(PolicyVersionRow).order_by(PolicyVersionRow.version.desc()).limit(limit)
            return [PolicyVersion.from_row(row) for row in await session.scalars(query)]

    async def get(self, version: int) -> PolicyVersion | None:
        async with self._sessions() as session:
            row = await session.get(PolicyVersionRow, version)
            return PolicyVersion.from_row(row) if row is not None else None

    async def latest(self) -> PolicyVersion | None:
        found = await self.history(limit=1)
        return found[0] if found else None

    async def count(self) -> int:
        async with self._sessions() as session:
            return int(await session.scalar(select(func.count()).select_from(PolicyVersionRow)) or 0)
