"""One real server for all API tests: `homeai serve` as a subprocess on a free loopback port.

The server runs the test policy next to this file (answers capped at 8 tokens in the default classes,
a one-slot class ``solo`` for overload tests), a data directory in tmp, and the models already pulled
into the test cache. Tests talk to it only over HTTP, with clients nobody here wrote.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

POLICY = Path(__file__).with_name("policy.yaml")
START_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True)
class Server:
    url: str  # no trailing slash
    policy_path: Path  # the file it runs (a copy of policy.yaml: tests may edit it)
    log_path: Path


@pytest.fixture(scope="session")
def server(pulled_models: dict[str, Path], homeai_cache_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A running server; its log is printed if it fails to start."""
    data_dir = tmp_path_factory.mktemp("homeai-data")
    log_path = data_dir / "server.log"
    policy_path = Path(shutil.copyfile(POLICY, data_dir / "test-policy.yaml"))
    port = free_port()
    env = {**os.environ, "HOMEAI_DATA_DIR": str(data_dir), "HOMEAI_CACHE_DIR": str(homeai_cache_dir)}
    cmd = [sys.executable, "-m", "homeai.cli.main", "serve", "--port", str(port), "--policy", str(policy_path),
           "--log-level", "warning"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url, log_path)
        yield Server(url, policy_path, log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"server not ready after {START_TIMEOUT_S:.0f} s:\n{log_path.read_text()[-4000:]}")


@pytest.fixture(scope="session")
def server_url(server: Server) -> str:
    return server.url


@pytest.fixture(scope="session")
def http(server_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server_url, timeout=60) as client:
        yield client


def engine_state(http: httpx.Client) -> tuple[float, dict[str, dict[str, int]]]:
    """(KV usage of the LLM, {class: {"running", "queued"}}) from /v1/stats."""
    response = http.get("/v1/stats")
    response.raise_for_status()
    body = response.json()
    kv = max((d.get("kv_usage", 0.0) for d in body.get("device", {}).values()), default=0.0)
    classes = {name: {"running": int(c.get("running", 0)), "queued": int(c.get("queued", 0))}
               for name, c in body.get("classes", {}).items()}
    return kv, classes


def wait_engine_idle(http: httpx.Client, timeout_s: float = 10.0) -> float:
    """Seconds until no sequence runs or waits and every KV block is free; fails after ``timeout_s``."""
    started = time.monotonic()
    while True:
        kv, classes = engine_state(http)
        if kv == 0.0 and all(c["running"] == 0 and c["queued"] == 0 for c in classes.values()):
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            pytest.fail(f"engine still busy after {timeout_s} s: kv={kv} classes={classes}")
        time.sleep(0.1)
