"""A `homeai serve` of the soak's own, on loopback, sandboxed in a work directory.

The soak needs the server's process id (memory and open files are read from /proc) and its database
(request-log rows are counted there), so by default it starts the server itself: a free port, a data
directory and SQLite database under the work directory, the soak policy, the caller's model cache.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from homeai.bench.soak_policy import soak_policy_yaml
from homeai.store.db import sqlite_url

START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0


@dataclass(slots=True)
class SoakServer:
    """Where the soak's server is and what it runs on."""

    url: str
    pid: int
    database_url: str
    policy_path: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"homeai serve exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            r = httpx.get(f"{url}/readyz", timeout=5)
            if r.status_code == 200 and r.json().get("status") == "ready":
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"homeai serve not ready after {START_TIMEOUT_S:.0f} s:\n{log_path.read_text()[-4000:]}")


@contextmanager
def soak_server(work_dir: Path) -> Iterator[SoakServer]:
    """Start the server (SIGTERM on the way out, SIGKILL if it hangs)."""
    data_dir = work_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    policy_path = data_dir / "soak-policy.yaml"
    policy_path.write_text(soak_policy_yaml(0), encoding="utf-8")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    database_url = sqlite_url(data_dir / "homeai.db")
    env = {**os.environ, "HOMEAI_DATA_DIR": str(data_dir), "HOMEAI_DATABASE_URL": database_url,
           "HOMEAI_JOB_ROOTS": str(work_dir)}
    for key in ("HOMEAI_API_KEY", "HOMEAI_MODELS_DIR", "HOMEAI_HOST", "HOMEAI_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "homeai.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--policy", str(policy_path), "--log-level", "warning"]
    log_path = work_dir / "server.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(proc, url, log_path)
        yield SoakServer(url, proc.pid, database_url, policy_path)
    finally:
        stop_server(proc)


def stop_server(proc: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM (the server drains), then SIGKILL if it is still there after ``timeout_s``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
