"""The job manager: APScheduler (a BackgroundScheduler with a persistent SQLAlchemy job store) fires
schedules; each run is an asyncio task of this process that talks to the gateway like any client.

The scheduler runs on a thread of its own because its job store's SQL is blocking: on the event loop
(AsyncIOScheduler) its write of a job's next run time waited for an aiosqlite transaction that needs the
loop to commit, so every stream froze for SQLite's 15 s busy timeout, the write failed, and the scheduler
never woke again (schedules silently stopped). On its thread it waits for the lock while the loop goes on;
a schedule that fires hands the job to the loop.

A job without a schedule runs at once. Runs are resumable: at start, jobs left "running" (the process
died) and one-off jobs that never ran are started again, and an indexing run skips every file whose
hash is already committed. Pause stops a run at the next batch boundary (what is embedded is still
committed) and pauses its schedule; resume continues it. Misfires: a schedule missed by less than
``misfire_grace_s`` (the server was down) still runs once (coalesced); older ones are skipped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from apscheduler.jobstores.base import JobLookupError
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.exc import OperationalError

from homeai.jobs.gateway_embedder import GatewayTextEmbedder
from homeai.jobs.indexer import Indexer, IndexSpec
from homeai.jobs.kinds import expand_prompt, run_prompt, run_retention
from homeai.jobs.progress import Progress
from homeai.jobs.schedules import one_time, parse_schedule
from homeai.store.jobs import JobInfo
from homeai.store.tables import utcnow

log = logging.getLogger(__name__)
T = TypeVar("T")

_current: JobManager | None = None  # the serving process's manager, for APScheduler's stored callable


def fire(job_id: int) -> None:
    """What the persistent job store names (``homeai.jobs.manager:fire``): start a run of ``job_id`` on the
    serving loop (called on the scheduler's executor thread)."""
    manager = _current
    if manager is not None and manager.loop is not None:
        try:
            manager.loop.call_soon_threadsafe(manager.launch, job_id)
        except RuntimeError:  # the loop closed: the server is stopping, the schedule fires at the next start
            log.info("job %d fired while the server stopped", job_id)


def aps_id(job_id: int) -> str:
    return f"homeai-job-{job_id}"


FIRST_RETRY_S = 1.0  # a write the locked database refused is tried again after this, then twice as long...
STORE_RETRY_MAX_S = 30.0  # ... up to this long between two tries
BOOKKEEPING_TRIES = 6  # a run's own state writes, tried over ~1 minute before the run gives up on them


class PatientJobStore(SQLAlchemyJobStore):
    """APScheduler's table, whose writes from the scheduler's own loop wait for a locked database. APScheduler
    writes a job's next run time outside any ``try``: one "database is locked" (another writer held SQLite past
    the 15 s busy timeout: a large delete, a backup, a CLI process) ended the scheduler's thread while
    ``scheduler.running`` stayed True, so no schedule fired again until a restart. ``stopping`` ends the wait
    (a shutdown joins this thread)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stopping = threading.Event()

    def update_job(self, job: Any) -> None:
        self._patiently(super().update_job, job)

    def remove_job(self, job_id: str) -> None:
        self._patiently(super().remove_job, job_id)

    def _patiently(self, write: Callable[[Any], None], arg: Any) -> None:
        delay = FIRST_RETRY_S
        while True:
            try:
                write(arg)
                return
            except OperationalError as e:
                if self.stopping.is_set():
                    raise
                log.warning("the job schedules' table is busy (%s); trying again in %.0f s", e.orig, delay)
                if self.stopping.wait(delay):
                    raise
                delay = min(2 * delay, STORE_RETRY_MAX_S)


def job_store(sync_url: str) -> PatientJobStore:
    """APScheduler's table in the same database, through a blocking driver with short timeouts."""
    connect_args = {"timeout": 15} if sync_url.startswith("sqlite") else {"connect_timeout": 2}
    return PatientJobStore(url=sync_url, engine_options={"connect_args": connect_args, "pool_pre_ping": True})


async def patiently(what: str, write: Callable[[], Awaitable[T]], tries: int = BOOKKEEPING_TRIES) -> T:
    """A run's bookkeeping write, tried again while the database is locked (1, 2, 4 ... s apart): one that
    failed left its job "running" (or "queued") until a restart, which ran it again."""
    delay = FIRST_RETRY_S
    for attempt in range(tries):
        try:
            return await write()
        except OperationalError as e:
            if attempt == tries - 1:
                raise
            log.warning("%s: the database is busy (%s); trying again in %.0f s", what, e.orig, delay)
            await asyncio.sleep(delay)
            delay = min(2 * delay, STORE_RETRY_MAX_S)
    raise AssertionError("unreachable")


class JobManager:
    def __init__(self, store: Any, gateway: Callable[[], Any], misfire_grace_s: int = 3600,
                 batch_chunks: int = 32, job_roots: tuple[Path, ...] | None = None) -> None:
        self.store = store
        self._gateway = gateway
        self.batch_chunks = batch_chunks
        self.misfire_grace_s = misfire_grace_s
        self.job_roots = job_roots  # the folders index jobs may read, checked at every run (None: any)
        self.loop: asyncio.AbstractEventLoop | None = None  # the serving loop, where runs start
        self.job_store = job_store(store.sync_url)
        self.scheduler = BackgroundScheduler(
            jobstores={"default": self.job_store},
            job_defaults={"coalesce": True, "misfire_grace_time": misfire_grace_s, "max_instances": 1})
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._progress: dict[int, Progress] = {}
        self._stop: set[int] = set()
        self._relaunch: set[int] = set()  # resumed while its run was still stopping: run again once it ends
        # one index run per collection at a time: two (a nightly schedule and an "index now") both found a file
        # new and both inserted it, and one failed on the unique (collection, path) key part-way
        self._collections: dict[str, asyncio.Lock] = {}

    # ---- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        global _current
        self.loop = asyncio.get_running_loop()
        _current = self
        await asyncio.to_thread(self.scheduler.start)  # reads its job store: blocking SQL, off the loop
        await self.recover()

    async def shutdown(self) -> None:
        """Stop firing and cancel runs; their jobs stay "running" in the store and resume at next start."""
        global _current
        if _current is self:
            _current = None
        self.job_store.stopping.set()  # a write waiting for a locked table gives up: the thread can end
        if self.scheduler.running:  # joins the scheduler's thread, which may be waiting for a lock: off the loop
            await asyncio.to_thread(self.scheduler.shutdown, False)
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def recover(self) -> None:
        """Restart what a dead process left: running jobs, one-off jobs never started, lost schedules."""
        jobs = self.store.jobs
        await jobs.interrupt_stale_runs()
        for job in await jobs.all(states=["running", "queued"]):
            if job.schedule and job.state == "queued" and await self._aps_job(job.id) is None:
                try:
                    await self._schedule(job)
                except ValueError as e:  # a one-time schedule that passed while the server was down
                    await self._missed(job, str(e))
                    continue
            if job.state == "running" or not job.schedule:
                log.info("resuming job %d (%s)", job.id, job.kind)
                self.launch(job.id)

    async def _missed(self, job: JobInfo, why: str, while_: str = "the server was not running") -> None:
        """A one-time job whose time passed before it ran (it fired while the models were still loading and
        the server stopped, or the server was down then): it runs now if that was within the misfire grace,
        as a missed schedule does, else it fails saying so. It stayed "queued" for good before."""
        when = one_time(job.schedule or "")
        if when is not None and not await self.store.jobs.runs(job.id, limit=1):
            late_s = (datetime.now(UTC) - when).total_seconds()
            if late_s <= self.misfire_grace_s:
                log.info("job %d: its time passed %.0f s ago before it ran: running it now", job.id, late_s)
                self.launch(job.id)
                return
        log.warning("job %d: schedule %r not restored: %s", job.id, job.schedule, why)
        await self.store.jobs.set_state(job.id, "failed", only_from=["queued"], finished_at=utcnow(),
                                        error=f"its time ({job.schedule}) passed while {while_}")

    # ---- commands --------------------------------------------------------------------------------
    async def add(self, kind: str, spec: dict[str, Any], schedule: str | None, created_by: str) -> JobInfo:
        if schedule:
            parse_schedule(schedule)  # ValueError before anything is stored
        job = await self.store.jobs.create(kind, spec, schedule, created_by)
        if schedule:
            await self._schedule(job)
        else:
            self.launch(job.id)
        return job

    async def _schedule(self, job: JobInfo) -> None:
        # APScheduler's store is blocking SQL: on the event loop it would wait for an aiosqlite write that
        # needs the loop to commit ("database is locked" after the busy timeout); a thread lets it finish.
        assert job.schedule is not None
        await asyncio.to_thread(self.scheduler.add_job, fire, parse_schedule(job.schedule), args=[job.id],
                                id=aps_id(job.id), name=f"{job.kind} job {job.id}", replace_existing=True)

    async def pause(self, job_id: int) -> bool:
        """Pause a job (False: it is done or failed and has no schedule left to pause; a one-time schedule
        that has fired has none either: paused and resumed, such a job stayed "queued" for good)."""
        job = await self.store.jobs.get(job_id)
        recurring = job is not None and job.schedule is not None and one_time(job.schedule) is None
        if job is None or not await self.store.jobs.set_state(job_id, "paused",
                                                              only_from=["queued", "running", "paused"]
                                                              + (["done", "failed"] if recurring else [])):
            return False
        self._stop.add(job_id)
        await self._aps(self.scheduler.pause_job, job_id)
        return True

    async def resume(self, job_id: int) -> bool:
        """Resume a paused job: its schedule fires again, and an interrupted run continues now."""
        job = await self.store.jobs.get(job_id)
        if job is None or job.state != "paused":
            return False
        self._stop.discard(job_id)
        await self.store.jobs.set_state(job_id, "queued", only_from=["paused"])
        when = one_time(job.schedule) if job.schedule else None
        passed = when is not None and when <= datetime.now(UTC)  # APScheduler would drop it as missed
        if job.schedule:
            await self._aps(self.scheduler.remove_job if passed else self.scheduler.resume_job, job_id)
        if job_id in self._tasks:  # its run has not ended yet (it was stopping): it goes on after that
            self._relaunch.add(job_id)
            return True
        runs = await self.store.jobs.runs(job_id, limit=1)
        if not job.schedule or (runs and runs[0].state in ("paused", "interrupted")):
            self.launch(job_id)
        elif passed:  # paused past its time: it runs now within the misfire grace, else fails saying so (it
            await self._missed(job, "its time passed while it was paused", "it was paused")  # stayed "queued")
        return True

    async def delete(self, job_id: int) -> bool:
        self._stop.add(job_id)
        self._relaunch.discard(job_id)
        task = self._tasks.get(job_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._aps(self.scheduler.remove_job, job_id)
        self._progress.pop(job_id, None)
        deleted = bool(await self.store.jobs.delete(job_id))
        self._stop.discard(job_id)  # SQLite may give this id to the next job, which must not start paused
        return deleted

    async def _aps(self, method: Callable[[str], Any], job_id: int) -> None:
        try:
            await asyncio.to_thread(method, aps_id(job_id))  # blocking SQL, off the loop (see _schedule)
        except JobLookupError:  # a one-off, or a date schedule that has fired
            pass

    # ---- reads -----------------------------------------------------------------------------------
    def progress(self, job: JobInfo) -> dict[str, Any]:
        live = self._progress.get(job.id)
        if live is not None and job.id in self._tasks:
            return live.to_dict()
        return {"done_chunks": job.done_chunks, "total_chunks": job.total_chunks, "done_files": job.done_files,
                "total_files": job.total_files, "phase": None, "chunks_per_s": 0.0,
                "eta_s": 0.0 if job.state == "done" else None}

    async def next_run_at(self, job_id: int) -> str | None:
        aps_job = await self._aps_job(job_id) if self.scheduler.running else None
        when = getattr(aps_job, "next_run_time", None)
        return when.isoformat() if when is not None else None

    async def _aps_job(self, job_id: int) -> Any:
        """APScheduler's job for ``job_id`` (None: no schedule stored), read off the loop (blocking SQL)."""
        return await asyncio.to_thread(self.scheduler.get_job, aps_id(job_id))

    # ---- runs ------------------------------------------------------------------------------------
    def launch(self, job_id: int, only_queued: bool = False) -> bool:
        """Start a run now unless one is in progress (``only_queued``: only if the job is still queued)."""
        if job_id in self._tasks:
            log.info("job %d is already running", job_id)
            return False
        task = asyncio.get_running_loop().create_task(self._run(job_id, only_queued), name=f"job-{job_id}")
        self._tasks[job_id] = task
        task.add_done_callback(lambda done: self._ended(job_id, done))
        return True

    def _ended(self, job_id: int, task: asyncio.Task[None]) -> None:
        self._tasks.pop(job_id, None)
        if not task.cancelled() and task.exception() is not None:  # its bookkeeping failed for good: say so now
            log.error("job %d: its run ended without recording its outcome", job_id, exc_info=task.exception())
        if job_id in self._relaunch:
            self._relaunch.discard(job_id)
            if not task.cancelled():  # a shutdown or a delete cancels: nothing goes on after those
                self.launch(job_id, only_queued=True)

    async def _run(self, job_id: int, only_queued: bool = False) -> None:
        jobs = self.store.jobs
        job = await jobs.get(job_id)
        if job is None or job.state == "paused" or (only_queued and job.state != "queued"):
            return
        gateway = await self._wait_gateway()
        started = await patiently(f"job {job_id}", lambda: jobs.set_state(
            job_id, "running", only_from=["queued", "running", "done", "failed"], started_at=utcnow(),
            finished_at=None, error=None))
        if not started:
            return  # paused (or deleted) meanwhile
        run_id = await patiently(f"job {job_id}", lambda: jobs.start_run(job_id))
        progress = self._progress[job_id] = Progress()
        try:
            output, stopped = await self._execute(job, gateway, progress)
        except asyncio.CancelledError:
            raise  # shutdown (the job stays "running" and resumes) or delete (the row is gone)
        except Exception as e:
            log.exception("job %d (%s) failed", job_id, job.kind)
            message = f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e)
            await patiently(f"job {job_id}", lambda: jobs.finish_run(run_id, "failed", progress.run_chunks,
                                                                     error=message))
            await patiently(f"job {job_id}", lambda: self._settle(job, "failed", error=message))
            return
        state = "paused" if stopped else "done"
        await patiently(f"job {job_id}", lambda: jobs.finish_run(run_id, state, progress.run_chunks, output=output))
        await patiently(f"job {job_id}", lambda: self._settle(job, state))

    async def _settle(self, job: JobInfo, state: str, error: str | None = None) -> None:
        """The job's state once its run has ended ``state``, after what was done to the job meanwhile. A run
        paused and then resumed while it stopped goes on (after this task: ``_relaunch``); a run that
        finished although it was paused (a prompt cannot stop midway) leaves a one-off done (resuming it would
        run it again) and a schedule paused."""
        jobs = self.store.jobs
        now = await jobs.get(job.id)
        if now is None:
            return
        if state == "paused":
            if now.state == "queued":
                self._relaunch.add(job.id)
            else:
                await jobs.set_state(job.id, "paused", only_from=["running", "paused"], finished_at=utcnow())
            return
        if now.state == "paused" and job.schedule:
            return
        await jobs.set_state(job.id, state, only_from=["running", "queued", "paused"], finished_at=utcnow(),
                             error=error)

    async def _execute(self, job: JobInfo, gateway: Any, progress: Progress) -> tuple[str, bool]:
        """Run one job of any kind; returns (output, stopped early)."""
        if job.kind == "index":
            spec = IndexSpec(**{k: job.spec[k] for k in ("path", "collection", "chunk_tokens", "overlap_tokens")
                                if k in job.spec})
            folder = spec.folder()  # a missing folder fails the run before the embedding model is looked up
            if self.job_roots is not None and not any(folder.is_relative_to(r) for r in self.job_roots):
                # checked when the job was made, and again now: the folder may have become a link elsewhere
                raise ValueError(f"folder {str(folder)!r} is outside the folders index jobs may read "
                                 f"({', '.join(map(str, self.job_roots)) or 'none'})")
            embedder = await asyncio.to_thread(GatewayTextEmbedder, gateway)
            indexer = Indexer(self.store.collections, self.store.jobs, embedder, job.id, progress,
                              batch_chunks=self.batch_chunks)
            lock = self._collections.setdefault(spec.collection, asyncio.Lock())
            if lock.locked():
                log.info("job %d waits for another index run of collection %r to end", job.id, spec.collection)
            async with lock:  # the second run then finds what the first committed and skips it
                outcome = await indexer.run(spec, should_stop=lambda: job.id in self._stop)
            return outcome.summary() + "".join(f"\n{line}" for line in outcome.failed[:50]), outcome.stopped
        if job.kind == "prompt":
            prompt = await expand_prompt(job, self.store.jobs, self.store.collections)
            return await run_prompt(gateway, job, prompt), False
        if job.kind == "retention":
            return await run_retention(self.store.sessions, job), False
        raise ValueError(f"unknown job kind {job.kind!r}")

    async def _wait_gateway(self) -> Any:
        while (gateway := self._gateway()) is None:
            await asyncio.sleep(0.5)
        return gateway
