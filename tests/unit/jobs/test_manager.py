"""The job manager on a real database: schedules live in APScheduler's persistent store and survive a
restart; a job a dead process left "running" runs again at start; pause holds a schedule."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sqlalchemy import text
from store_helpers import open_store
from waiting import DEFAULT_TIMEOUT_S

from homeai.jobs.manager import JobManager, aps_id
from homeai.store.db import Store


async def wait_run(job_id: int) -> None:
    """Until the job's run (the task ``JobManager.launch`` started, named after the job) has ended; the
    caller then checks the state it left."""
    for run in [t for t in asyncio.all_tasks() if t.get_name() == f"job-{job_id}"]:
        await asyncio.wait_for(asyncio.shield(run), DEFAULT_TIMEOUT_S)


async def test_schedules_survive_a_restart(store: Store) -> None:
    first = JobManager(store, lambda: None)
    await first.start()
    job = await first.add("retention", {"days": 30}, "0 3 * * *", "test")
    next_run = first.next_run_at(job.id)
    assert next_run is not None
    await first.shutdown()
    second = JobManager(store, lambda: None)
    await second.start()
    try:
        assert second.scheduler.get_job(aps_id(job.id)) is not None
        assert second.next_run_at(job.id) == next_run
        assert await second.pause(job.id) and second.next_run_at(job.id) is None
        assert await second.resume(job.id) and second.next_run_at(job.id) == next_run
    finally:
        await second.shutdown()


async def test_a_job_left_running_by_a_dead_process_runs_again(store: Store) -> None:
    job = await store.jobs.create("retention", {"days": 30}, None, "test")
    await store.jobs.set_state(job.id, "running")
    await store.jobs.start_run(job.id)  # the run the dead process never finished
    manager = JobManager(store, lambda: object())
    await manager.start()
    try:
        await wait_run(job.id)
    finally:
        await manager.shutdown()
    found = await store.jobs.get(job.id)
    assert found is not None and found.state == "done"
    runs = await store.jobs.runs(job.id)
    assert [r.state for r in runs] == ["done", "interrupted"]
    assert runs[0].output == "deleted 0 request-log rows older than 30 days"


async def test_a_failing_job_is_failed_with_its_error(store: Store) -> None:
    manager = JobManager(store, lambda: object())
    await manager.start()
    try:
        job = await manager.add("index", {"path": "/definitely/not/here", "collection": "c"}, None, "test")
        await wait_run(job.id)
    finally:
        await manager.shutdown()
    found = await store.jobs.get(job.id)
    assert found is not None and found.state == "failed"
    assert found.error is not None and "not a folder" in found.error


async def test_a_schedule_changes_while_another_coroutine_holds_a_write(tmp_path: Path) -> None:
    """APScheduler's blocking store once ran on the event loop: while an aiosqlite transaction that needs
    the loop to commit held SQLite's write lock, removing a scheduled job waited out the busy timeout and
    failed with "database is locked" (found by schemathesis on the jobs routes)."""
    store = await open_store("sqlite", tmp_path)
    manager = JobManager(store, lambda: None)
    await manager.start()
    holding, removing = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    real_remove_job = manager.scheduler.remove_job

    def remove_job(job_id: str, *args: Any, **kwargs: Any) -> None:
        loop.call_soon_threadsafe(removing.set)  # the delete has reached its first write
        real_remove_job(job_id, *args, **kwargs)

    async def hold_the_write_lock() -> None:
        assert store.engine is not None
        async with store.engine.begin() as conn:
            await conn.execute(text("CREATE TABLE held (x INTEGER)"))
            await conn.execute(text("INSERT INTO held VALUES (1)"))
            holding.set()
            await removing.wait()  # commits only if the loop runs while the delete waits for the lock

    try:
        job = await manager.add("retention", {"days": 30}, "0 3 * * *", "test")
        manager.scheduler.remove_job = remove_job  # type: ignore[method-assign]
        holder = asyncio.create_task(hold_the_write_lock())
        await holding.wait()
        async with asyncio.timeout(10):
            assert await manager.delete(job.id)  # APScheduler's remove_job is its first write
            await holder
        assert manager.scheduler.get_job(aps_id(job.id)) is None
    finally:
        await manager.shutdown()
        await store.close()
