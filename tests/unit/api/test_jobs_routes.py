"""The jobs and search routes on a tiny app: a real store and job manager on tmp SQLite, no model.

Bad requests answer 400 (404 for what does not exist) naming the field; scheduled jobs can be listed,
shown, paused, resumed and deleted; /readyz says "degraded" while the request log cannot write.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from homeai.api.errors import exception_handler
from homeai.api.jobs_routes import jobs_router
from homeai.api.observability_routes import observability_router
from homeai.api.services import DEPENDENCIES, Services, app_state, services_of
from homeai.api.settings import Settings
from homeai.jobs.manager import JobManager
from homeai.policy.loader import load_policy
from homeai.policy.store import PolicyHolder
from homeai.search.matrix_cache import SearchIndex
from homeai.store.db import Store

DEFAULT_POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"


class FakeGateway:
    started_s = 1.0
    loop = object()  # a started gateway has its device loop

    def engine_health(self) -> dict[str, Any]:
        return {"failing": False}

    def snapshot(self) -> dict[str, Any]:
        return {"classes": {}, "device": {}}

    def served_models(self) -> list[str]:
        return []


class StubWriter:
    healthy = True


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[Litestar]:
    store = Store.in_dir(tmp_path / "data")
    await store.init()
    manager = JobManager(store, lambda: None)
    await manager.start()
    services = Services(Settings(data_dir=tmp_path / "data", job_roots=(Path("/"),)),  # any folder
                        PolicyHolder(load_policy(DEFAULT_POLICY)), store=store, jobs=manager,
                        search=SearchIndex(store.collections), gateway=FakeGateway(), request_log=StubWriter())
    yield Litestar(route_handlers=[jobs_router, observability_router], state=app_state(services),
                   dependencies=DEPENDENCIES, exception_handlers={Exception: exception_handler})
    await manager.shutdown()
    await store.close()


@pytest.fixture
async def client(app: Litestar) -> AsyncIterator[AsyncTestClient[Litestar]]:
    async with AsyncTestClient(app=app) as c:
        yield c


@pytest.mark.parametrize(("body", "param"), [
    ({"kind": "backup"}, "kind"),
    ({"kind": "index", "collection": "c"}, "path"),
    ({"kind": "index", "path": "relative/docs", "collection": "c"}, "path"),
    ({"kind": "index", "path": "/tmp/\u0000x", "collection": "c"}, "path"),
    ({"kind": "index", "path": "/definitely/not/here", "collection": "c"}, "path"),
    ({"kind": "index", "path": "/", "collection": " "}, "collection"),
    ({"kind": "index", "path": "/", "collection": "c", "chunk_tokens": 4}, "chunk_tokens"),
    ({"kind": "index", "path": "/", "collection": "c", "overlap_tokens": 500}, "overlap_tokens"),
    ({"kind": "retention", "schedule": "whenever"}, "schedule"),
    ({"kind": "retention", "schedule": ",".join(map(str, range(60))) + " * * * *"}, "schedule"),  # 177 chars
    ({"kind": "index", "path": "/", "collection": "a\u0000b"}, "collection"),
    ({"kind": "retention", "days": 0}, "days"),
    ({"kind": "prompt"}, "prompt"),
    ({"kind": "prompt", "prompt": "hi", "class": "indexing"}, "class"),
    ({"kind": "prompt", "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"kind": "retention", "colour": "red"}, "colour"),
    ({"kind": 3}, "kind"),
    ({}, "kind"),
])
async def test_bad_job_requests_name_the_field(client: AsyncTestClient[Litestar], body: dict[str, Any],
                                               param: str) -> None:
    r = await client.post("/v1/jobs", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


async def test_index_job_outside_the_job_roots_is_refused(app: Litestar, client: AsyncTestClient[Litestar],
                                                          tmp_path: Path) -> None:
    (tmp_path / "root" / "docs").mkdir(parents=True)
    services_of(app).settings.job_roots = ((tmp_path / "root").resolve(),)
    r = await client.post("/v1/jobs", json={"kind": "index", "path": str(tmp_path), "collection": "c"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "path", r.text
    r = await client.post("/v1/jobs", json={"kind": "index", "path": str(tmp_path / "root/docs"), "collection": "c"})
    assert r.status_code == 201, r.text


async def test_scheduled_job_lifecycle(client: AsyncTestClient[Litestar]) -> None:
    r = await client.post("/v1/jobs", json={"kind": "retention", "days": 7, "schedule": "0 3 * * *"})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["state"] == "queued" and job["spec"] == {"days": 7.0} and job["next_run_at"]
    assert job["progress"]["done_chunks"] == 0 and job["created_by"] == "anonymous"
    assert [j["id"] for j in (await client.get("/v1/jobs")).json()["jobs"]] == [job["id"]]
    paused = (await client.post(f"/v1/jobs/{job['id']}/pause")).json()
    assert paused["state"] == "paused" and paused["next_run_at"] is None
    assert (await client.post(f"/v1/jobs/{job['id']}/resume")).json()["next_run_at"]
    r = await client.post(f"/v1/jobs/{job['id']}/resume")
    assert r.status_code == 400 and r.json()["error"]["param"] == "id"
    assert (await client.delete(f"/v1/jobs/{job['id']}")).json() == {"id": job["id"], "deleted": True}
    for job_id in (job["id"], 0, 2**40):
        for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/pause"), ("POST", "/resume")):
            r = await client.request(method, f"/v1/jobs/{job_id}{path}")
            assert r.status_code == 404 and r.json()["error"]["param"] == "id"


async def test_index_job_is_stored_with_an_absolute_path(client: AsyncTestClient[Litestar], tmp_path: Path) -> None:
    r = await client.post("/v1/jobs", json={"kind": "index", "path": str(tmp_path), "collection": "home",
                                            "chunk_tokens": 100, "overlap_tokens": 20})
    assert r.status_code == 201, r.text
    assert r.json()["spec"] == {"path": str(tmp_path.resolve()), "collection": "home", "chunk_tokens": 100,
                                "overlap_tokens": 20}
    shown = (await client.get(f"/v1/jobs/{r.json()['id']}")).json()
    assert shown["kind"] == "index" and shown["state"] in ("queued", "running")


async def test_search_errors(client: AsyncTestClient[Litestar]) -> None:
    r = await client.post("/v1/search", json={"collection": "nothing", "query": "cats"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "collection"
    for body, param in (({"collection": "c", "query": "x", "k": 0}, "k"), ({"collection": "c", "query": " "}, "query"),
                        ({"query": "x"}, "collection"), ({"collection": "a\u0000b", "query": "x"}, "collection")):
        r = await client.post("/v1/search", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


async def test_readyz_is_degraded_while_the_request_log_cannot_write(client: AsyncTestClient[Litestar],
                                                                     app: Litestar) -> None:
    assert (await client.get("/readyz")).json()["status"] == "ready"
    services_of(app).request_log.healthy = False
    body = (await client.get("/readyz")).json()
    assert body["status"] == "degraded" and body["store"] == "slow"
