"""Keys on a real `homeai serve` whose database already holds keys (its own server:
the shared one runs without keys, as most API tests need).

Before the fixes: /v1/stats, its stream and /metrics answered without a key and named every person;
/api/pull answered without a key; an unauthenticated ``{}`` got a 400 naming a field instead of 401.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_launcher import ServerProcess

from homeai.store.db import Store

pytestmark = pytest.mark.slow


async def make_keys(data_dir: Path) -> dict[str, str]:
    store = Store.in_dir(data_dir)
    await store.init()
    try:
        plain, _ = await store.keys.create("kid-tablet", user="kids")
        watcher, _ = await store.keys.create("tui", user="dad", scopes=["metrics"])
        admin, _ = await store.keys.create("root", user="dad", is_admin=True)
    finally:
        await store.close()
    return {"plain": plain, "metrics": watcher, "admin": admin}


@pytest.fixture(scope="module")
def keyed(pulled_models: dict[str, Path], homeai_cache_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    data_dir = tmp_path_factory.mktemp("homeai-keyed")
    keys = asyncio.run(make_keys(data_dir))
    server = ServerProcess(data_dir, homeai_cache_dir)
    server.start()
    try:
        yield server.url, keys
    finally:
        server.stop()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_stats_and_metrics_need_a_metrics_key(keyed: tuple[str, dict[str, str]]) -> None:
    url, keys = keyed
    with httpx.Client(base_url=url, timeout=30) as http:
        for path in ("/v1/stats", "/metrics", "/v1/stats/stream?count=1"):
            assert http.get(path).status_code == 401, path
            assert http.get(path, headers=auth(keys["plain"])).status_code == 403, path
            assert http.get(path, headers=auth(keys["metrics"])).status_code == 200, path
            assert http.get(path, headers=auth(keys["admin"])).status_code == 200, path
        assert http.get("/healthz").status_code == 200 and http.get("/readyz").status_code == 200


def test_authentication_comes_before_validation(keyed: tuple[str, dict[str, str]]) -> None:
    url, keys = keyed
    with httpx.Client(base_url=url, timeout=30) as http:
        for path in ("/v1/chat/completions", "/v1/embeddings", "/api/chat", "/v1/responses", "/v1/jobs"):
            r = http.post(path, json={})
            assert r.status_code == 401, (path, r.text)
        r = http.post("/v1/chat/completions", json={}, headers=auth(keys["plain"]))
        assert r.status_code == 400 and r.json()["error"]["param"] == "model"


def test_pull_and_jobs_need_an_admin(keyed: tuple[str, dict[str, str]]) -> None:
    url, keys = keyed
    with httpx.Client(base_url=url, timeout=30) as http:
        assert http.post("/api/pull", json={"model": "all-minilm-l6-v2"}).status_code == 401
        r = http.post("/api/pull", json={"model": "all-minilm-l6-v2"}, headers=auth(keys["plain"]))
        assert r.status_code == 403
        assert http.get("/v1/jobs", headers=auth(keys["metrics"])).status_code == 403
        assert http.get("/v1/jobs", headers=auth(keys["admin"])).status_code == 200
