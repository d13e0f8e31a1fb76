"""A refused policy file through the whole app: an invalid policy.yaml in the data directory, the real models.

Before the fix `create_app` raised PolicyError and `homeai serve` exited ("invalid policy"). Now the
app starts on the newest valid stored version and says why in /readyz and /v1/stats. In-process
(``create_app`` and its lifespans under Litestar's test client): the shared launcher waits for "ready",
and a server in this state is, on purpose, "degraded".
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from homeai.api.app import create_app
from homeai.api.settings import DEFAULT_POLICY, POLICY_FILE_NAME, Settings
from homeai.store.db import Store

pytestmark = pytest.mark.slow

DEFAULT_TEXT = DEFAULT_POLICY.read_text(encoding="utf-8")
STORED = DEFAULT_TEXT.replace("    max_batch_size: 16\n", "    max_batch_size: 12\n", 1)
INVALID = DEFAULT_TEXT.replace("      max_queue_size: 16 ", "      max_queue_size: -1 ", 1)


async def test_start_with_an_invalid_policy_file(pulled_models: dict[str, Path], homeai_cache_dir: Path,
                                                 tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert STORED != DEFAULT_TEXT and INVALID != DEFAULT_TEXT
    store = Store.in_dir(tmp_path)
    await store.init()
    await store.policy_versions.record(DEFAULT_TEXT, "startup")
    await store.policy_versions.record(STORED, "dad", "PUT /admin/policy")
    await store.close()
    (tmp_path / POLICY_FILE_NAME).write_text(INVALID, encoding="utf-8")  # refused while it ran, still there

    caplog.set_level(logging.ERROR, logger="homeai.api.policy_startup")
    app = create_app(Settings(data_dir=tmp_path, cache_dir=homeai_cache_dir, database_url=None))
    assert "refused at start-up" in caplog.text and "max_queue_size" in caplog.text
    async with AsyncTestClient(app=app, timeout=120, base_url="http://127.0.0.1:8000") as client:  # its own name
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        body = ready.json()
        assert body["status"] == "degraded" and body["store"] == "ok"
        assert "max_queue_size" in body["reason"] and "stored policy version 2" in body["reason"]
        stats = (await client.get("/v1/stats")).json()
        assert stats["policy"]["status"] == "fallback"
        assert stats["policy"]["errors"][0]["path"] == "classes.voice.default_queue_policy.max_queue_size"
        assert (await client.get("/admin/policy")).text == STORED  # the last valid version runs
        r = await client.post("/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": "still serving"})
        assert r.status_code == 200, r.text
        # an admin puts a valid policy: the fallback is over
        assert (await client.put("/admin/policy", content=DEFAULT_TEXT)).status_code == 200
        assert (await client.get("/readyz")).json()["status"] == "ready"
    assert (tmp_path / POLICY_FILE_NAME).read_text(encoding="utf-8") == DEFAULT_TEXT
