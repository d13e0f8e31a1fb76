"""Lifespan of the background services: the request-log writer and the job manager (with search).

Starts after the engine (jobs talk to the gateway) and stops before it: runs are cancelled first
(their jobs stay "running" in the store and resume at the next start), then the request log is flushed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar

from homeai.api.services import services_of
from homeai.jobs.manager import JobManager
from homeai.search.matrix_cache import SearchIndex
from homeai.store.request_log import RequestLogWriter

log = logging.getLogger(__name__)

BATCH_CHUNKS_ENV = "HOMEAI_INDEX_BATCH_CHUNKS"  # chunks per indexing request (default 32)


@asynccontextmanager
async def background_lifespan(app: Litestar) -> AsyncIterator[None]:
    services = services_of(app)
    store = services.store
    if store is None:
        yield
        return
    if store.sessions is None:
        raise RuntimeError("Store.init() has not run")  # store_lifespan opens the store before this starts
    writer = RequestLogWriter(store.sessions, keep_days=services.settings.request_log_days)
    writer.start()
    services.request_log = writer
    recorder = services.metrics  # the gateway meters every request into it
    recorder.listeners.append(writer.submit)  # one row per metered request, jobs' included
    manager = JobManager(store, lambda: services.gateway,
                         batch_chunks=int(os.environ.get(BATCH_CHUNKS_ENV, "32")),
                         job_roots=services.settings.job_roots)
    await manager.start()
    services.jobs = manager
    services.search = SearchIndex(store.collections)
    try:
        yield
    finally:
        services.jobs = None
        services.search = None
        await manager.shutdown()  # cancelled job requests are metered (aborted) and logged before the flush
        recorder.listeners.remove(writer.submit)
        await writer.stop()
        services.request_log = None
