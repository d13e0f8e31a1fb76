"""The job manager on a real database: schedules live in APScheduler's persistent store and survive a
restart; a job a dead process left "running" runs again at start; pause holds a schedule."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from indexing_helpers import FakeEmbedder
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from store_helpers import open_store
from waiting import DEFAULT_TIMEOUT_S, await_until

import homeai.jobs.manager as manager_module
from homeai.core.types import FinishReason, TokenDelta
from homeai.gateway.gateway import Route
from homeai.jobs.manager import JobManager, aps_id
from homeai.store.db import Store


async def wait_run(job_id: int) -> None:
    """Until the job's run (the task ``JobManager.launch`` started, named after the job) has ended; the
    caller then checks the state it left."""
    for run in [t for t in asyncio.all_tasks() if t.get_name() == f"job-{job_id}"]:
        await asyncio.wait_for(asyncio.shield(run), DEFAULT_TIMEOUT_S)


def docs_folder(tmp_path: Path, num_files: int, words: int) -> Path:
    """A folder of ``num_files`` text files of ``words`` distinct words each, to index."""
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(num_files):
        (folder / f"f{i:02}.txt").write_text(" ".join(f"word{i}_{k}" for k in range(words)))
    return folder


async def test_schedules_survive_a_restart(store: Store) -> None:
    first = JobManager(store, lambda: None)
    await first.start()
    job = await first.add("retention", {"days": 30}, "0 3 * * *", "test")
    next_run = await first.next_run_at(job.id)
    assert next_run is not None
    await first.shutdown()
    second = JobManager(store, lambda: None)
    await second.start()
    try:
        assert second.scheduler.get_job(aps_id(job.id)) is not None
        assert await second.next_run_at(job.id) == next_run
        assert await second.pause(job.id) and await second.next_run_at(job.id) is None
        assert await second.resume(job.id) and await second.next_run_at(job.id) == next_run
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


class HeldPromptGateway:
    """A gateway whose answers wait for ``release``; ``calls`` counts the prompts asked."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls = 0

    def route(self, model: str | None, class_name: str | None, kind: str, user: str) -> Route:
        return Route("m", "chat")

    async def ensure_llm(self, model: str, timeout_s: float | None = None, class_name: str = "") -> None:
        return None

    def chat_prompt(self, model: str, messages: list[dict[str, Any]]) -> list[int]:
        return [1, 2, 3]

    async def generate(self, route: Route, ids: list[int], params: Any, user: str, request_id: str,
                       kind: str = "chat") -> AsyncGenerator[TokenDelta, None]:
        self.calls += 1
        await self.release.wait()
        yield TokenDelta(request_id, f"answer {self.calls}", [5], 3, 1, finish_reason=FinishReason.STOP)


async def test_a_prompt_paused_while_it_runs_ends_done_and_never_runs_twice(store: Store) -> None:
    """A prompt cannot stop midway: its run finished, and the job stayed "paused" (its last write wanted
    "running"), so a resume ran the prompt a second time."""
    gateway = HeldPromptGateway()
    manager = JobManager(store, lambda: gateway)
    await manager.start()
    try:
        job = await manager.add("prompt", {"prompt": "hi"}, None, "test")
        await await_until(lambda: gateway.calls == 1)
        assert await manager.pause(job.id)
        gateway.release.set()
        await wait_run(job.id)
        found = await store.jobs.get(job.id)
        assert found is not None and found.state == "done"
        assert not await manager.resume(job.id)
    finally:
        await manager.shutdown()
    assert gateway.calls == 1 and [r.output for r in await store.jobs.runs(job.id)] == ["answer 1"]


async def test_an_index_run_resumed_while_it_stops_goes_on_to_the_end(store: Store, tmp_path: Path,
                                                                        monkeypatch: Any) -> None:
    """Paused, then resumed before its run had wound down: the resume could not start a run (one was still
    there), and the stopping run's last write found the job "queued", not "running": the job sat queued with
    nothing running, 2 of 10 files indexed, until the next start."""
    gate = asyncio.Event()

    class HeldEmbedder(FakeEmbedder):
        async def embed(self, texts: list[str]) -> Any:
            await gate.wait()
            return await super().embed(texts)

    monkeypatch.setattr(manager_module, "GatewayTextEmbedder", lambda gateway: HeldEmbedder())
    folder = docs_folder(tmp_path, 10, 40)
    manager = JobManager(store, lambda: object(), batch_chunks=1)
    await manager.start()
    finish_run = store.jobs.finish_run
    stopping, resumed = asyncio.Event(), asyncio.Event()

    async def finish_after_the_resume(run_id: int, state: str, *args: Any, **kwargs: Any) -> Any:
        if state == "paused":  # the run has seen the stop; it writes its end once the resume is in
            stopping.set()
            await resumed.wait()
        return await finish_run(run_id, state, *args, **kwargs)

    monkeypatch.setattr(store.jobs, "finish_run", finish_after_the_resume)  # before the run can stop
    try:
        job = await manager.add("index", {"path": str(folder), "collection": "c"}, None, "test")
        await await_until(lambda: manager._progress.get(job.id) is not None)
        assert await manager.pause(job.id)
        gate.set()
        await asyncio.wait_for(stopping.wait(), DEFAULT_TIMEOUT_S)
        assert await manager.resume(job.id) and job.id in manager._tasks
        resumed.set()

        async def done() -> bool:
            found = await store.jobs.get(job.id)
            return found is not None and found.state == "done" and job.id not in manager._tasks

        await await_until(done)
    finally:
        resumed.set()
        await manager.shutdown()
    cid = await store.collections.find("c")
    assert cid is not None and len(await store.collections.documents(cid)) == 10
    assert [r.state for r in await store.jobs.runs(job.id)] == ["done", "paused"]


async def test_an_index_run_reads_only_inside_the_job_roots_at_every_run(store: Store, tmp_path: Path,
                                                                           monkeypatch: Any) -> None:
    """The folder was checked against the roots only when the job was made: replaced by a link to a folder
    outside them afterwards, the next run indexed that one."""
    monkeypatch.setattr(manager_module, "GatewayTextEmbedder", lambda gateway: FakeEmbedder())
    root, outside = tmp_path / "home", tmp_path / "secret"
    (root / "docs").mkdir(parents=True)
    outside.mkdir()
    (outside / "s.txt").write_text("a secret")
    (root / "docs").rmdir()
    (root / "docs").symlink_to(outside)  # after the job was accepted for root/docs
    manager = JobManager(store, lambda: object(), job_roots=(root,))
    await manager.start()
    try:
        job = await manager.add("index", {"path": str(root / "docs"), "collection": "c"}, None, "test")
        await wait_run(job.id)
    finally:
        await manager.shutdown()
    found = await store.jobs.get(job.id)
    assert found is not None and found.state == "failed" and "outside the folders" in (found.error or "")
    assert await store.collections.find("c") is None


async def test_a_one_time_job_whose_time_passed_before_it_ran_runs_or_says_why(store: Store) -> None:
    """A date job fires, waits for the models to load, and the server stops: APScheduler has dropped it, and
    at the next start its date is in the past, so it was neither scheduled nor run, "queued" for good. Within
    the misfire grace it runs now; later than that it fails saying so."""
    recent = (datetime.now() - timedelta(seconds=10)).isoformat(timespec="seconds")
    old = (datetime.now() - timedelta(hours=2)).isoformat(timespec="seconds")
    late = await store.jobs.create("retention", {"days": 30}, recent, "test")
    missed = await store.jobs.create("retention", {"days": 30}, old, "test")
    manager = JobManager(store, lambda: object())
    await manager.start()
    try:
        await wait_run(late.id)
    finally:
        await manager.shutdown()
    ran, failed = await store.jobs.get(late.id), await store.jobs.get(missed.id)
    assert ran is not None and ran.state == "done"
    assert failed is not None and failed.state == "failed" and "passed while the server was not running" in (
        failed.error or "")
    assert await store.jobs.runs(missed.id) == []


async def test_a_schedule_that_fires_while_a_write_holds_sqlite_neither_stalls_the_loop_nor_stops(
        tmp_path: Path) -> None:
    """APScheduler's job store writes each firing's next run time with a blocking driver. On the event loop
    (AsyncIOScheduler) that write waited for an aiosqlite transaction which needs the loop to commit: every
    stream froze for SQLite's 15 s busy timeout, the write failed, and the schedule never fired again."""
    from homeai.store.db import sqlite_url

    store = Store(sqlite_url(tmp_path / "home.db"))
    await store.init()
    manager = JobManager(store, lambda: object())
    await manager.start()
    lags: list[float] = []

    async def watch_the_loop() -> None:
        while True:
            t0 = asyncio.get_running_loop().time()
            await asyncio.sleep(0.05)
            lags.append(asyncio.get_running_loop().time() - t0 - 0.05)

    watcher = asyncio.create_task(watch_the_loop())
    try:
        job = await manager.add("retention", {"days": 30}, "every 1s", "test")
        assert store.sessions is not None
        async with store.sessions() as session:  # a write transaction held across two firings
            await session.execute(text("UPDATE jobs SET created_by = 'holder' WHERE id = :id"), {"id": job.id})
            await asyncio.sleep(2.5)
            await session.commit()
        assert max(lags) < 1.0
        held_runs = len(await store.jobs.runs(job.id, limit=1000))
        await await_until(lambda: _more_runs(store, job.id, held_runs + 2))  # it goes on firing
    finally:
        watcher.cancel()
        await manager.shutdown()
        await store.close()


async def _more_runs(store: Store, job_id: int, at_least: int) -> bool:
    return len(await store.jobs.runs(job_id, limit=1000)) >= at_least


async def test_a_one_time_job_that_has_run_cannot_be_paused(store: Store) -> None:
    """Its schedule fired and is gone: paused and resumed, it stayed "queued" for good (and after a restart
    was reported failed, its time passed)."""
    manager = JobManager(store, lambda: object())
    await manager.start()
    try:
        job = await manager.add("retention", {"days": 30}, (datetime.now() + timedelta(seconds=1)).isoformat(),
                                "test")
        await await_until(lambda: _state_is(store, job.id, "done"))
        assert not await manager.pause(job.id)
        found = await store.jobs.get(job.id)
        assert found is not None and found.state == "done"
    finally:
        await manager.shutdown()


async def _state_is(store: Store, job_id: int, state: str) -> bool:
    job = await store.jobs.get(job_id)
    return job is not None and job.state == state


async def test_a_job_keeps_its_last_runs_and_its_last_finished_one(store: Store) -> None:
    """Every firing added a run row, kept for ever (a schedule every minute: 525,000 rows a year)."""
    from homeai.store.jobs import KEPT_RUNS

    job = await store.jobs.create("prompt", {"prompt": "hi"}, "every 1m", "test")
    first = await store.jobs.start_run(job.id)
    await store.jobs.finish_run(first, "done")
    for _ in range(KEPT_RUNS + 20):
        await store.jobs.finish_run(await store.jobs.start_run(job.id), "failed", error="boom")
    runs = await store.jobs.runs(job.id, limit=10_000)
    assert len(runs) == KEPT_RUNS + 1 and runs[-1].id == first  # the last finished one stays
    last = await store.jobs.last_finished_run(job.id)
    assert last is not None and last.id == first


def locked(what: str) -> OperationalError:
    return OperationalError(what, {}, Exception("database is locked"))


async def test_the_scheduler_waits_for_a_locked_database_instead_of_stopping(tmp_path: Path,
                                                                             monkeypatch: Any) -> None:
    """APScheduler writes a job's next run time outside any ``try``: one "database is locked" past the busy
    timeout ended its thread while ``scheduler.running`` stayed True, and no schedule fired again."""
    monkeypatch.setattr(manager_module, "FIRST_RETRY_S", 0.01)
    fires: list[int] = []
    store = await open_store("sqlite", tmp_path)
    manager = JobManager(store, lambda: None)
    manager.launch = lambda job_id, only_queued=False: fires.append(job_id) is None  # type: ignore[method-assign]
    refusals = {"left": 3}
    update = SQLAlchemyJobStore.update_job

    def busy_update(self: SQLAlchemyJobStore, job: Any) -> None:
        if refusals["left"] > 0:
            refusals["left"] -= 1
            raise locked("UPDATE apscheduler_jobs")
        update(self, job)

    monkeypatch.setattr(SQLAlchemyJobStore, "update_job", busy_update)
    await manager.start()
    try:
        job = await store.jobs.create("retention", {"days": 30}, "every 1s", "test")
        await manager._schedule(job)
        await await_until(lambda: len(fires) >= 3)  # fired through the three refusals, and on
        assert refusals["left"] == 0 and manager.scheduler._thread.is_alive()  # type: ignore[attr-defined]
    finally:
        await manager.shutdown()
        await store.close()


async def test_a_run_whose_bookkeeping_meets_a_locked_database_still_ends(store: Store, monkeypatch: Any) -> None:
    """A run's own writes (its state, its run row) raised "database is locked" out of the task: the job
    stayed "running" until a restart, which ran it again."""
    monkeypatch.setattr(manager_module, "FIRST_RETRY_S", 0.01)
    finish_run = store.jobs.finish_run
    refusals = {"left": 2}

    async def busy_finish(*args: Any, **kwargs: Any) -> Any:
        if refusals["left"] > 0:
            refusals["left"] -= 1
            raise locked("UPDATE job_runs")
        return await finish_run(*args, **kwargs)

    monkeypatch.setattr(store.jobs, "finish_run", busy_finish)
    manager = JobManager(store, lambda: object())
    await manager.start()
    try:
        job = await manager.add("retention", {"days": 30}, None, "test")
        await wait_run(job.id)
    finally:
        await manager.shutdown()
    found = await store.jobs.get(job.id)
    assert found is not None and found.state == "done" and refusals["left"] == 0
    assert [r.state for r in await store.jobs.runs(job.id)] == ["done"]


async def test_two_index_runs_of_one_collection_take_turns(store: Store, tmp_path: Path, monkeypatch: Any) -> None:
    """A nightly schedule and an "index now" of the same collection ran at once: both found each file new, both
    inserted it, and one failed on the unique (collection, path) key part-way."""

    class SlowEmbedder(FakeEmbedder):
        async def embed(self, texts: list[str]) -> Any:
            await asyncio.sleep(0.005)  # the two runs interleave batch by batch
            return await super().embed(texts)

    monkeypatch.setattr(manager_module, "GatewayTextEmbedder", lambda gateway: SlowEmbedder())
    folder = docs_folder(tmp_path, 12, 200)
    manager = JobManager(store, lambda: object(), batch_chunks=2)
    await manager.start()
    try:
        first = await manager.add("index", {"path": str(folder), "collection": "c"}, None, "test")
        second = await manager.add("index", {"path": str(folder), "collection": "c"}, None, "test")
        await wait_run(first.id)
        await wait_run(second.id)
    finally:
        await manager.shutdown()
    for job in (first, second):
        found = await store.jobs.get(job.id)
        assert found is not None and found.state == "done", found.error if found else None
    cid = await store.collections.find("c")
    assert cid is not None and len(await store.collections.documents(cid)) == 12


async def test_a_one_time_job_resumed_after_its_time_runs_or_says_why(store: Store) -> None:
    """Paused before its date and resumed after it: APScheduler dropped the resumed date job as missed, and the
    job stayed "queued" with no next run for good. Within the misfire grace it runs now; later it fails."""

    def soon() -> datetime:  # whole seconds (as people write them), far enough ahead to be stored in time
        return (datetime.now() + timedelta(seconds=2)).replace(microsecond=0)

    async def until(when: datetime, after_s: float) -> None:
        await asyncio.sleep(max(0.0, (when - datetime.now()).total_seconds() + after_s))

    manager = JobManager(store, lambda: object(), misfire_grace_s=60)
    await manager.start()
    try:
        when = soon()
        job = await manager.add("retention", {"days": 30}, when.isoformat(), "test")
        assert await manager.pause(job.id)
        await until(when, 0.3)  # its time passes while it is paused
        assert await manager.resume(job.id)
        await wait_run(job.id)
        ran = await store.jobs.get(job.id)
        assert ran is not None and ran.state == "done"
    finally:
        await manager.shutdown()
    manager = JobManager(store, lambda: object(), misfire_grace_s=1)
    await manager.start()
    try:
        when = soon()
        late = await manager.add("retention", {"days": 30}, when.isoformat(), "test")
        assert await manager.pause(late.id)
        await until(when, 1.5)  # past its time by more than the grace
        assert await manager.resume(late.id)
        await asyncio.sleep(0.5)  # APScheduler's look at the resumed job
        failed = await store.jobs.get(late.id)
        assert failed is not None and failed.state == "failed" and "passed while it was paused" in (failed.error or "")
    finally:
        await manager.shutdown()
