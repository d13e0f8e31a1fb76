"""A real server for the jobs tests, which a test may kill (SIGKILL) and start again on the same data.

It runs the policy next to this file (interactive ``embedding`` and background ``indexing`` classes, a
small ``chat`` class for prompt jobs). The database is SQLite in the data directory, or the PostgreSQL
of HOMEAI_TEST_DATABASE_URL (emptied first) when that is set.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_launcher import ServerProcess
from sqlalchemy import Engine, create_engine
from store_helpers import TEST_DATABASE_URL_ENV, empty_database, sync_url
from waiting import wait_until

POLICY = Path(__file__).with_name("policy.yaml")


def database(server: ServerProcess) -> Engine:
    """A blocking engine on the server's database, to check what was committed (dispose it after use)."""
    return create_engine(sync_url(server.database_url))


def make_jobs_server(data_dir: Path, cache_dir: Path, env: dict[str, str] | None = None) -> ServerProcess:
    """A jobs server on ``data_dir``: SQLite there, or the (emptied) PostgreSQL of HOMEAI_TEST_DATABASE_URL."""
    database_url = os.environ.get(TEST_DATABASE_URL_ENV)
    if database_url:
        empty_database(database_url)
    # small indexing requests: many commits per run, so a kill lands between two of them; the tests' folders
    # lie in pytest's tmp (beside data_dir), outside the home folder index jobs may read by default
    return ServerProcess(data_dir, cache_dir, policy=POLICY, database_url=database_url,
                         env={"HOMEAI_INDEX_BATCH_CHUNKS": "8", "HOMEAI_JOB_ROOTS": str(data_dir.parent),
                              **(env or {})})


@pytest.fixture(scope="session")
def jobs_server(pulled_models: dict[str, Path], homeai_cache_dir: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = make_jobs_server(tmp_path_factory.mktemp("jobs-data"), homeai_cache_dir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def http(jobs_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=jobs_server.url, timeout=60) as client:
        yield client


def add_job(http: httpx.Client, **body: Any) -> dict[str, Any]:
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def wait_job(http: httpx.Client, job_id: int, timeout_s: float = 120.0) -> dict[str, Any]:
    """The job once it is done (fails at once on failed or paused: nobody paused it; or on timeout)."""

    def finished() -> dict[str, Any] | None:
        job: dict[str, Any] = http.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in ("failed", "paused"):
            pytest.fail(f"job {job_id} {job['state']}: {job}")
        return job if job["state"] == "done" else None

    return wait_until(finished, timeout_s, interval_s=0.2,
                      what=lambda: f"job {job_id} to be done: {http.get(f'/v1/jobs/{job_id}').json()}")
