"""Jobs and their runs: what each job is, its state and progress, and what every run produced."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from homeai.store.tables import JobRow, JobRunRow, utcnow

STATES = ("queued", "running", "paused", "done", "failed")
KEPT_RUNS = 100  # runs kept per job (the API shows the last 5)


@dataclass(frozen=True, slots=True)
class JobInfo:
    id: int
    kind: str
    spec: dict[str, Any]
    schedule: str | None
    state: str
    done_chunks: int
    total_chunks: int
    done_files: int
    total_files: int
    error: str | None
    created_by: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def from_row(cls, row: JobRow) -> JobInfo:
        return cls(row.id, row.kind, json.loads(row.spec), row.schedule, row.state, row.done_chunks,
                   row.total_chunks, row.done_files, row.total_files, row.error, row.created_by, row.created_at,
                   row.started_at, row.finished_at)


@dataclass(frozen=True, slots=True)
class JobRun:
    id: int
    job_id: int
    state: str
    started_at: datetime
    finished_at: datetime | None
    num_done: int
    output: str | None
    error: str | None

    @classmethod
    def from_row(cls, row: JobRunRow) -> JobRun:
        return cls(row.id, row.job_id, row.state, row.started_at, row.finished_at, row.num_done, row.output,
                   row.error)


class Jobs:
    """The job table's repository (the scheduler's own trigger store is APScheduler's business)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def create(self, kind: str, spec: dict[str, Any], schedule: str | None, created_by: str) -> JobInfo:
        async with self._sessions.begin() as session:
            row = JobRow(kind=kind, spec=json.dumps(spec, sort_keys=True), schedule=schedule, state="queued",
                         done_chunks=0, total_chunks=0, done_files=0, total_files=0, created_by=created_by[:64],
                         created_at=utcnow())
            session.add(row)
            await session.flush()
            return JobInfo.from_row(row)

    async def get(self, job_id: int) -> JobInfo | None:
        async with self._sessions() as session:
            row = await session.get(JobRow, job_id)
            return JobInfo.from_row(row) if row is not None else None

    async def all(self, states: Sequence[str] | None = None) -> list[JobInfo]:
        query = select(JobRow).order_by(JobRow.id)
        if states is not None:
            query = query.where(JobRow.state.in_(list(states)))
        async with self._sessions() as session:
            return [JobInfo.from_row(row) for row in await session.scalars(query)]

    async def delete(self, job_id: int) -> bool:
        async with self._sessions.begin() as session:
            await session.execute(delete(JobRunRow).where(JobRunRow.job_id == job_id))
            result = await session.execute(delete(JobRow).where(JobRow.id == job_id))
            return bool(getattr(result, "rowcount", 0))

    async def update(self, job_id: int, **values: Any) -> None:
        """Set columns of a job (state, error, progress counts, times)."""
        async with self._sessions.begin() as session:
            await session.execute(update(JobRow).where(JobRow.id == job_id).values(**values))

    async def set_state(self, job_id: int, state: str, *, only_from: Sequence[str] | None = None,
                        **values: Any) -> bool:
        """Move a job to ``state`` (if it is in one of ``only_from``); False when it was not."""
        if state not in STATES:
            raise ValueError(f"unknown job state {state!r}")
        query = update(JobRow).where(JobRow.id == job_id)
        if only_from is not None:
            query = query.where(JobRow.state.in_(list(only_from)))
        async with self._sessions.begin() as session:
            result = await session.execute(query.values(state=state, **values))
            return bool(getattr(result, "rowcount", 0))

    # ---- runs ------------------------------------------------------------------------------------
    async def start_run(self, job_id: int) -> int:
        """A new run; the job's runs before its last ``KEPT_RUNS`` go (but its last finished one, which a
        prompt job's {new_documents} counts from): a schedule every minute added 525,000 rows a year."""
        async with self._sessions.begin() as session:
            row = JobRunRow(job_id=job_id, state="running", started_at=utcnow(), num_done=0)
            session.add(row)
            await session.flush()
            oldest_kept = await session.scalar(select(JobRunRow.id).where(JobRunRow.job_id == job_id)
                                               .order_by(JobRunRow.id.desc()).offset(KEPT_RUNS - 1).limit(1))
            if oldest_kept is not None:
                last_done = await session.scalar(select(func.max(JobRunRow.id)).where(
                    JobRunRow.job_id == job_id, JobRunRow.state == "done"))
                await session.execute(delete(JobRunRow).where(
                    JobRunRow.job_id == job_id, JobRunRow.id < oldest_kept, JobRunRow.id != (last_done or -1)))
            return row.id

    async def finish_run(self, run_id: int, state: str, num_done: int = 0, output: str | None = None,
                         error: str | None = None) -> None:
        async with self._sessions.begin() as session:
            await session.execute(update(JobRunRow).where(JobRunRow.id == run_id).values(
                state=state, finished_at=utcnow(), num_done=num_done, output=output, error=error))

    async def interrupt_stale_runs(self) -> int:
        """Runs left "running" by a process that died are marked "interrupted" (at start, before resuming)."""
        async with self._sessions.begin() as session:
            result = await session.execute(update(JobRunRow).where(JobRunRow.state == "running").values(
                state="interrupted", finished_at=utcnow()))
            return int(getattr(result, "rowcount", 0) or 0)

    async def runs(self, job_id: int, limit: int = 20) -> list[JobRun]:
        """Newest first."""
        query = select(JobRunRow).where(JobRunRow.job_id == job_id).order_by(JobRunRow.id.desc()).limit(limit)
        async with self._sessions() as session:
            return [JobRun.from_row(row) for row in await session.scalars(query)]

    async def last_finished_run(self, job_id: int) -> JobRun | None:
        query = (select(JobRunRow).where(JobRunRow.job_id == job_id, JobRunRow.state == "done")
                 .order_by(JobRunRow.id.desc()).limit(1))
        async with self._sessions() as session:
            row = await session.scalar(query)
            return JobRun.from_row(row) if row is not None else None
