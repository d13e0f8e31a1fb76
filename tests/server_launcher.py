"""The one way tests start a real `homeai serve`: every integration and TUI test goes through here.

One launcher so that every test server is sandboxed the same way (a free loopback port, its own data
directory, its own database, the test model cache, no settings leaking in from the caller's shell), is
called ready by the same check (``/readyz`` says "ready", i.e. the gateway runs and the store answers,
under one generous timeout for a loaded machine), shows its log when it fails to start, and stops the
same way (SIGTERM, then SIGKILL if it hangs). A test may also SIGKILL it and start it again on the same
port and data, which is what a power cut and a restart look like to clients.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from homeai.bench.soak_server import stop_server
from homeai.store.db import sqlite_url

START_TIMEOUT_S = 300.0  # model loading on 2 busy cores can take minutes; a hung start still fails
STOP_TIMEOUT_S = 40.0  # longer than the server's own graceful-shutdown window, then SIGKILL
LOG_TAIL_CHARS = 8000
# Settings a developer's shell may hold that must not reach a test server: they would point it at a real
# database, data directory or model folder, or arm the indexer's test pause point for every job. (The
# device, HOMEAI_DEVICE, passes through: a GPU machine may run the suite on its GPU.)
SCRUBBED_ENV = ("HOMEAI_DATA_DIR", "HOMEAI_DATABASE_URL", "HOMEAI_HOST", "HOMEAI_PORT", "HOMEAI_MODELS_DIR",
                "HOMEAI_API_KEY", "HOMEAI_URL", "HOMEAI_JOB_ROOTS", "HOMEAI_TEST_PAUSE_AFTER_FILES",
                "HOMEAI_TEST_PAUSE_MARKER")
PORT_IN_USE = "address already in use"
MAX_PORT_TRIES = 3


def free_port() -> int:
    """A port nobody listens on right now (another process may still take it before the server binds:
    :meth:`ServerProcess.start` retries on a new port in that case)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``homeai serve`` on loopback with its own data directory: start, stop, kill -9, start again.

    ``env`` adds settings (e.g. ``HOMEAI_INDEX_BATCH_CHUNKS``); ``database_url`` defaults to SQLite in
    the data directory; ``policy`` is passed as ``--policy`` (else the server copies the default policy
    into the data directory on first start); ``ready_statuses`` are the /readyz statuses that count as
    started (add "degraded" to start a server on purpose with, say, an invalid policy file).
    """

    def __init__(self, data_dir: Path, cache_dir: Path, *, policy: Path | None = None,
                 env: Mapping[str, str] | None = None, database_url: str | None = None,
                 port: int | None = None, ready_statuses: tuple[str, ...] = ("ready",)) -> None:
        self.data_dir, self.cache_dir, self.policy = data_dir, cache_dir, policy
        self.ready_statuses = ready_statuses
        self.port = port or free_port()
        self.database_url = database_url or sqlite_url(data_dir / "homeai.db")  # the server's default, spelled out
        base = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
        self.env = {**base, "HOMEAI_DATA_DIR": str(data_dir), "HOMEAI_CACHE_DIR": str(cache_dir),
                    "HOMEAI_DATABASE_URL": self.database_url, **(env or {})}
        self.log_path = data_dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.num_starts = 0

    @property
    def url(self) -> str:
        """Base URL, no trailing slash."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start and wait until ready; fails the test (with the server's log) if it exits or hangs.
        The first start moves to a new port if another process took the chosen one meanwhile."""
        for attempt in range(1, MAX_PORT_TRIES + 1):
            self._spawn()
            exit_code = self._wait_ready()
            if exit_code is None:
                return
            if self.num_starts == 1 and attempt < MAX_PORT_TRIES and PORT_IN_USE in self.log().lower():
                self.num_starts, self.port = 0, free_port()
                continue
            pytest.fail(f"homeai serve exited with {exit_code} before it was ready:\n{self.log()}")

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``; returns the exit status (None if not running)."""
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        stop_server(proc, STOP_TIMEOUT_S)
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, exactly like a power cut for the process."""
        assert self.proc is not None and self.proc.poll() is None, "the server is not running"
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def log(self) -> str:
        """The end of the server's log (every start appends to the same file)."""
        if not self.log_path.exists():
            return "(no log)"
        return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]

    def _spawn(self) -> None:
        cmd = [sys.executable, "-m", "homeai.cli.main", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--log-level", "warning"]
        if self.policy is not None:
            cmd += ["--policy", str(self.policy)]
        self.num_starts += 1
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.num_starts} on port {self.port}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def _wait_ready(self) -> int | None:
        """None once /readyz answers 200 with one of ``ready_statuses``; the exit status if the process
        ended first."""
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code, self.proc = self.proc.returncode, None
                return code
            try:
                response = httpx.get(f"{self.url}/readyz", timeout=5)
                last = f"{response.status_code} {response.text[:200]}"
                if response.status_code == 200 and response.json().get("status") in self.ready_statuses:
                    return None
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.3)
        self.stop()
        pytest.fail(f"homeai serve not ready after {START_TIMEOUT_S:.0f} s (last /readyz: {last}):\n{self.log()}")


@contextmanager
def running_server(data_dir: Path, cache_dir: Path, *, policy: Path | None = None,
                   env: Mapping[str, str] | None = None, database_url: str | None = None,
                   ready_statuses: tuple[str, ...] = ("ready",)) -> Iterator[ServerProcess]:
    """A started server for the length of the block, stopped (or killed) afterwards."""
    server = ServerProcess(data_dir, cache_dir, policy=policy, env=env, database_url=database_url,
                           ready_statuses=ready_statuses)
    try:
        server.start()
        yield server
    finally:
        server.stop()
