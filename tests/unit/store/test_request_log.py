"""The request-log writer: batches rows off the request path, drops the oldest when its queue is
full, turns unhealthy while the database fails and healthy again once a write succeeds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, insert, select
from store_helpers import BACKENDS, open_store
from waiting import await_until

from homeai.metrics.recorder import FinishedRequest, MetricsRecorder
from homeai.store.db import Store
from homeai.store.request_log import RequestLogWriter, prune_request_log
from homeai.store.tables import RequestLogRow


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s = await open_store(request.param, tmp_path)
    yield s
    await s.close()


def finished(i: int, status: str = "ok") -> FinishedRequest:
    return FinishedRequest(f"r{i}", "chat", "chat", "alice", "smollm2", 10, 5, 12.5, 80.0, status, 1_700_000_000.0 + i,
                           queue_ms=1.5, itl_ms=14.0)


async def rows(store: Store) -> list[RequestLogRow]:
    assert store.sessions is not None
    async with store.sessions() as session:
        return list(await session.scalars(select(RequestLogRow).order_by(RequestLogRow.id)))


async def test_rows_are_written_in_batches(store: Store) -> None:
    assert store.sessions is not None
    writer = RequestLogWriter(store.sessions, batch_size=50)
    for i in range(120):
        writer.submit(finished(i))
    writer.start()
    await await_until(lambda: writer.num_written == 120)
    await writer.stop()
    found = await rows(store)
    assert [r.request_id for r in found] == [f"r{i}" for i in range(120)]
    first = found[0]
    assert (first.class_name, first.user, first.model, first.status) == ("chat", "alice", "smollm2", "ok")
    assert (first.num_prompt_tokens, first.num_output_tokens, first.queue_ms, first.ttft_ms, first.itl_ms,
            first.e2e_ms) == (10, 5, 1.5, 12.5, 14.0, 80.0)
    assert first.created_at == datetime.fromtimestamp(1_700_000_000, UTC)


async def test_a_full_queue_drops_the_oldest_and_counts(store: Store) -> None:
    assert store.sessions is not None
    writer = RequestLogWriter(store.sessions, max_queue=10)
    for i in range(25):
        writer.submit(finished(i))
    assert writer.num_dropped == 15 and writer.queue.qsize() == 10
    writer.start()
    await writer.stop()
    assert [r.request_id for r in await rows(store)] == [f"r{i}" for i in range(15, 25)]


async def test_unhealthy_while_the_database_fails_then_recovers(store: Store) -> None:
    assert store.sessions is not None
    writer = RequestLogWriter(store.sessions, write_timeout_s=1.0, max_backoff_s=0.05)
    real_write = writer.write
    failing = True

    async def flaky(batch: list[dict[str, object]]) -> bool:
        if failing:
            writer.healthy = False  # what a refused connection does (see write)
            return False
        return await real_write(batch)

    writer.write = flaky  # type: ignore[method-assign]
    writer.start()
    writer.submit(finished(1))
    await await_until(lambda: not writer.healthy)
    writer.submit(finished(2))  # serving goes on: submit never blocks
    failing = False
    await await_until(lambda: writer.healthy and writer.num_written == 2)
    await writer.stop()
    assert [r.request_id for r in await rows(store)] == ["r1", "r2"]


async def test_a_dead_database_marks_the_writer_unhealthy(tmp_path: Path) -> None:
    store = Store.in_dir(tmp_path)
    await store.init()
    assert store.sessions is not None and store.engine is not None
    writer = RequestLogWriter(store.sessions)
    async with store.engine.begin() as conn:
        await conn.run_sync(lambda c: RequestLogRow.__table__.drop(c))  # type: ignore[attr-defined]
    assert not await writer.write([{"request_id": "x"}])
    assert not writer.healthy and writer.status()["healthy"] is False
    await store.close()


async def test_the_recorder_feeds_the_writer(store: Store) -> None:
    assert store.sessions is not None
    now = [0.0]
    recorder = MetricsRecorder(clock=lambda: now[0])
    writer = RequestLogWriter(store.sessions)
    recorder.listeners.append(writer.submit)
    writer.start()
    recorder.request_started("q", "chat", "chat", "bob", "m", 7)
    now[0] = 0.01
    recorder.queued("q", 0.01)
    now[0] = 0.05
    recorder.tokens("q", 1)
    now[0] = 0.15
    recorder.tokens("q", 2)
    recorder.finished("q", "ok", 3)
    await await_until(lambda: writer.num_written == 1)
    await writer.stop()
    (row,) = await rows(store)
    assert row.user == "bob" and row.num_output_tokens == 3
    assert row.queue_ms == pytest.approx(10.0) and row.ttft_ms == pytest.approx(50.0)
    assert row.itl_ms == pytest.approx(50.0) and row.e2e_ms == pytest.approx(150.0)


async def test_the_row_names_the_node_that_served_the_request(store: Store) -> None:
    assert store.sessions is not None
    recorder = MetricsRecorder()
    writer = RequestLogWriter(store.sessions)
    recorder.listeners.append(writer.submit)
    writer.start()
    for rid, node in (("a", "node-a"), ("long", "n" * 80), ("single", None)):
        recorder.request_started(rid, "chat", "chat", "bob", "m", 7)
        if node is not None:
            recorder.placed(rid, node)
        recorder.finished(rid, "ok", 1)
    await await_until(lambda: writer.num_written == 3)
    await writer.stop()
    assert [(r.request_id, r.node) for r in await rows(store)] == [("a", "node-a"), ("long", "n" * 64),
                                                                   ("single", None)]


async def test_retention_prunes_old_rows(store: Store) -> None:
    assert store.sessions is not None
    now = datetime.now(UTC)
    base = {"request_id": "r", "kind": "chat", "class_name": "chat", "user": "u", "model": "m", "status": "ok",
            "num_prompt_tokens": 1, "num_output_tokens": 1, "e2e_ms": 1.0}
    async with store.sessions.begin() as session:
        await session.execute(insert(RequestLogRow), [{**base, "created_at": now - timedelta(days=d)}
                                                      for d in (0, 1, 5, 40, 400)])
    assert await prune_request_log(store.sessions, 30) == 2
    async with store.sessions() as session:
        assert await session.scalar(select(func.count()).select_from(RequestLogRow)) == 3


async def test_the_writer_prunes_rows_older_than_its_days_once_a_day(store: Store) -> None:
    """Found by a review: nothing pruned the log unless someone made a retention job (one row per request,
    ~1 GB a year at 10k requests a day). The server's writer now keeps HOMEAI_REQUEST_LOG_DAYS (90)."""
    assert store.sessions is not None
    clock = [0.0]
    writer = RequestLogWriter(store.sessions, keep_days=30, clock=lambda: clock[0])
    base = {"request_id": "old", "kind": "chat", "class_name": "chat", "user": "u", "model": "m", "status": "ok",
            "num_prompt_tokens": 1, "num_output_tokens": 1, "e2e_ms": 1.0}

    async def add_old() -> None:
        async with store.sessions.begin() as session:  # type: ignore[union-attr]
            aged = datetime.now(UTC) - timedelta(days=40)
            await session.execute(insert(RequestLogRow), [{**base, "created_at": aged}])

    async def write_one(i: int) -> None:
        done = finished(i)
        done.finished_at = datetime.now(UTC).timestamp()
        writer.submit(done)
        await await_until(lambda: writer.num_written == i)
        await asyncio.sleep(0.05)  # the prune after the write

    await add_old()
    writer.start()
    try:
        await write_one(1)
        assert [r.request_id for r in await rows(store)] == ["r1"]
        await add_old()
        await write_one(2)  # the same day: not again
        assert sorted(r.request_id for r in await rows(store)) == ["old", "r1", "r2"]
        clock[0] += 86_401
        await write_one(3)
        assert sorted(r.request_id for r in await rows(store)) == ["r1", "r2", "r3"]
    finally:
        await writer.stop()
