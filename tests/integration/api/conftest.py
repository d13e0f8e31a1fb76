"""One real server for all API tests, started by the shared launcher (tests/server_launcher.py).

The server runs the test policy next to this file (answers capped at 8 tokens in the default classes,
a one-slot class ``solo`` for overload tests), a data directory in tmp, and the models already pulled
into the test cache. Tests talk to it only over HTTP, with clients nobody here wrote.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_launcher import ServerProcess
from waiting import DEFAULT_TIMEOUT_S, wait_until

POLICY = Path(__file__).with_name("policy.yaml")


@pytest.fixture(scope="session")
def server(pulled_models: dict[str, Path], homeai_cache_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A running server on a copy of the test policy (tests may edit the copy: see ``policy_path``)."""
    data_dir = tmp_path_factory.mktemp("homeai-data")
    policy_path = Path(shutil.copyfile(POLICY, data_dir / "test-policy.yaml"))
    server = ServerProcess(data_dir, homeai_cache_dir, policy=policy_path)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def policy_path(server: ServerProcess) -> Path:
    """The policy file the server runs and watches."""
    assert server.policy is not None
    return server.policy


@pytest.fixture(scope="session")
def server_url(server: ServerProcess) -> str:
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


def wait_engine_idle(http: httpx.Client, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Until no sequence runs or waits and every KV block is free (polled: the engine is in the server's
    process); fails after ``timeout_s``, which bounds a hang and is no measure of speed."""
    wait_until(lambda: engine_idle(http), timeout_s, interval_s=0.1,
               what=lambda: f"an idle engine (now: {engine_state(http)})")


def engine_idle(http: httpx.Client) -> bool:
    kv, classes = engine_state(http)
    return kv == 0.0 and all(c["running"] == 0 and c["queued"] == 0 for c in classes.values())
