"""A real server for the jobs tests, which a test may kill (SIGKILL) and start again on the same data.

It runs the policy next to this file (interactive ``embedding`` and background ``indexing`` classes, a
small ``chat`` class for prompt jobs). The database is SQLite in the data directory, or the PostgreSQL
of HOMEAI_TEST_DATABASE_URL (emptied first) when that is set.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, create_engine
from store_helpers import TEST_DATABASE_URL_ENV, empty_database, sync_url

from homeai.store.db import sqlite_url

POLICY = Path(__file__).with_name("policy.yaml")
START_TIMEOUT_S = 240.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``homeai serve`` on a fixed port and data directory: start, kill -9, start again."""

    def __init__(self, data_dir: Path, cache_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.database_url = os.environ.get(TEST_DATABASE_URL_ENV) or sqlite_url(data_dir / "homeai.db")
        self.env = {**os.environ, "HOMEAI_DATA_DIR": str(data_dir), "HOMEAI_CACHE_DIR": str(cache_dir),
                    "HOMEAI_DATABASE_URL": self.database_url, **(env or {})}
        self.log_path = data_dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.num_starts = 0

    def start(self) -> None:
        cmd = [sys.executable, "-m", "homeai.cli.main", "serve", "--port", str(self.port), "--policy", str(POLICY),
               "--log-level", "warning"]
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.num_starts + 1}\n".encode())
            self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.num_starts += 1
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        pytest.fail(f"server not ready after {START_TIMEOUT_S:.0f} s:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, exactly like a power cut for the process."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def engine(self) -> Engine:
        """A blocking engine on the server's database, to check what was committed."""
        return create_engine(sync_url(self.database_url))


@pytest.fixture(scope="session")
def jobs_server(pulled_models: dict[str, Path], homeai_cache_dir: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    if os.environ.get(TEST_DATABASE_URL_ENV):
        empty_database(os.environ[TEST_DATABASE_URL_ENV])
    # small indexing requests: many commits per run, so a kill lands between two of them
    server = ServerProcess(tmp_path_factory.mktemp("jobs-data"), homeai_cache_dir,
                           {"HOMEAI_INDEX_BATCH_CHUNKS": "8"})
    server.start()
    try:
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
    """The job once it is done (fails on failed or on timeout)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = http.get(f"/v1/jobs/{job_id}").json()
        if job["state"] == "failed":
            pytest.fail(f"job {job_id} failed: {job['error']}")
        if job["state"] == "done":
            return job  # type: ignore[no-any-return]
        time.sleep(0.2)
    pytest.fail(f"job {job_id} not done after {timeout_s} s: {job}")
