"""The request log: one row per finished request, written in batches by a task off the token path.

``submit`` is called from the metrics recorder as a request finishes (event loop, no I/O): it puts the
record in a bounded ``asyncio.Queue`` and, when the queue is full, drops the oldest record and counts
it. The writer task takes up to ``batch_size`` records at a time and inserts them in one statement.
A write that fails or takes longer than ``write_timeout_s`` marks the writer unhealthy (/readyz says
"degraded") and is retried with back-off while serving goes on; the first write that succeeds makes
it healthy again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from homeai.metrics.recorder import FinishedRequest
from homeai.store.tables import RequestLogRow

log = logging.getLogger(__name__)

PRUNE_EVERY_S = 86_400.0


def log_row(done: FinishedRequest) -> dict[str, Any]:
    """Column values of a request_log row for a finished request."""
    return {"created_at": datetime.fromtimestamp(done.finished_at, UTC), "request_id": done.request_id[:64],
            "kind": done.kind[:16], "class_name": done.class_name[:64], "user": done.user[:64],
            "model": done.model[:128], "status": done.status[:16], "num_prompt_tokens": done.num_prompt_tokens,
            "num_output_tokens": done.num_output_tokens, "queue_ms": done.queue_ms, "ttft_ms": done.ttft_ms,
            "itl_ms": done.itl_ms, "e2e_ms": done.e2e_ms, "node": None if done.node is None else done.node[:64]}


class RequestLogWriter:
    """Bounded, batching, drop-oldest writer of request-log rows; ``healthy`` is read by /readyz."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], max_queue: int = 10_000,
                 batch_size: int = 500, write_timeout_s: float = 2.0, max_backoff_s: float = 5.0,
                 keep_days: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._sessions = sessions
        # rows older than this go once a day (0: none): one row per request, ~1 GB a year at 10k a day, and
        # nothing pruned unless someone made a retention job
        self.keep_days = keep_days
        self._clock = clock
        self._pruned_at: float | None = None
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=max_queue)
        self.batch_size = batch_size
        self.write_timeout_s = write_timeout_s
        self.max_backoff_s = max_backoff_s
        self.healthy = True
        self.num_dropped = 0
        self.num_written = 0
        self._held: list[dict[str, Any]] = []  # a batch whose write failed, retried first
        self._task: asyncio.Task[None] | None = None

    # ---- the request path ------------------------------------------------------------------------
    def submit(self, done: FinishedRequest) -> None:
        """Queue a row; never blocks, never raises (a full queue loses its oldest row)."""
        try:
            row = log_row(done)
            while True:
                try:
                    self.queue.put_nowait(row)
                    return
                except asyncio.QueueFull:
                    self.queue.get_nowait()
                    self.num_dropped += 1
        except Exception:
            log.exception("request log: could not queue a row")

    # ---- the writer task -------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="request-log-writer")

    async def stop(self, flush_timeout_s: float = 2.0) -> None:
        """Write what is queued (within ``flush_timeout_s``), then stop the task."""
        if self._task is None:
            return
        try:
            async with asyncio.timeout(flush_timeout_s):
                while (self._held or not self.queue.empty()) and not self._task.done():
                    await asyncio.sleep(0.02)
        except TimeoutError:
            log.warning("request log: %d rows not written at shutdown", len(self._held) + self.queue.qsize())
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None

    async def _run(self) -> None:
        backoff_s = 0.1
        while True:
            if not self._held:
                self._held = [await self.queue.get()]
            while len(self._held) < self.batch_size and not self.queue.empty():
                self._held.append(self.queue.get_nowait())
            if await self.write(self._held):
                self._held = []
                backoff_s = 0.1
                await self._prune_daily()
            else:
                await asyncio.sleep(backoff_s)
                backoff_s = min(self.max_backoff_s, backoff_s * 2)

    async def write(self, rows: list[dict[str, Any]]) -> bool:
        """Insert ``rows`` in one statement; False (and unhealthy) when the database fails or is slow."""
        try:
            async with asyncio.timeout(self.write_timeout_s):
                async with self._sessions.begin() as session:
                    await session.execute(insert(RequestLogRow), rows)
        except Exception as e:  # timeout, connection refused, locked database ...
            if self.healthy:
                log.warning("request log: write of %d rows failed (%s); serving goes on", len(rows), e)
            self.healthy = False
            return False
        if not self.healthy:
            log.info("request log: writes succeed again")
        self.healthy = True
        self.num_written += len(rows)
        return True

    async def _prune_daily(self) -> None:
        """After a write, once a day: delete the rows older than ``keep_days`` (a failure is logged, and
        tried again the next day)."""
        now = self._clock()
        if not self.keep_days or (self._pruned_at is not None and now - self._pruned_at < PRUNE_EVERY_S):
            return
        self._pruned_at = now
        try:
            removed = await prune_request_log(self._sessions, self.keep_days)
        except Exception as e:  # noqa: BLE001 - serving and logging go on
            log.warning("request log: pruning rows older than %g days failed (%s)", self.keep_days, e)
            return
        if removed:
            log.info("request log: %d rows older than %g days deleted", removed, self.keep_days)

    def status(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "queued": self.queue.qsize() + len(self._held),
                "dropped": self.num_dropped, "written": self.num_written}


async def prune_request_log(sessions: async_sessionmaker[AsyncSession], older_than_days: float) -> int:
    """Delete rows older than ``older_than_days``; returns how many went."""
    cutoff = datetime.now(UTC) - timedelta(days=older_than_days)
    async with sessions.begin() as session:
        result = await session.execute(delete(RequestLogRow).where(RequestLogRow.created_at < cutoff))
    return int(getattr(result, "rowcount", 0) or 0)
