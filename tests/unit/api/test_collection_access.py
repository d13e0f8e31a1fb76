"""Any key used to be able to search any collection, including one an admin built from a system
folder. Now a collection has an owner (whoever created its index job) and a list of readers. A
collection a key may not search answers as one that does not exist (404, the same body), so a plain key
cannot probe for names.

The real routers and guard on a tmp SQLite store with keys; no gateway, so a search that passes the
access check answers 503 (it would embed the query next): 503 means "allowed", 403 "refused".
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from homeai.api.auth import authenticate
from homeai.api.collections_routes import collections_router
from homeai.api.errors import exception_handler
from homeai.api.jobs_routes import jobs_router
from homeai.api.services import DEPENDENCIES, Services, app_state
from homeai.api.settings import Settings
from homeai.jobs.manager import JobManager
from homeai.policy.loader import load_policy
from homeai.policy.store import PolicyHolder
from homeai.search.matrix_cache import SearchIndex
from homeai.store.collections import CollectionAccess
from homeai.store.db import Store

DEFAULT_POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"
QUERY = {"collection": "family", "query": "where are the passports?", "k": 3}


@pytest.fixture
async def client(store: Store, tmp_path: Path) -> AsyncIterator[AsyncTestClient[Litestar]]:
    services = Services(Settings(data_dir=tmp_path, job_roots=(tmp_path,)), PolicyHolder(load_policy(DEFAULT_POLICY)),
                        store=store, jobs=JobManager(store, lambda: None), search=SearchIndex(store.collections))
    app = Litestar(route_handlers=[jobs_router, collections_router], guards=[authenticate],
                   state=app_state(services), dependencies=DEPENDENCIES,
                   exception_handlers={Exception: exception_handler})
    async with AsyncTestClient(app=app) as c:
        yield c


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_may_search() -> None:
    access = CollectionAccess(1, "c", "alice", ("bob",))
    assert access.may_search("alice", False) and access.may_search("bob", False)
    assert not access.may_search("carol", False) and access.may_search("carol", True)
    assert CollectionAccess(1, "c", None, ("*",)).may_search("carol", False)
    assert not CollectionAccess(1, "c", None, ()).may_search("alice", False)  # made before owners: admins


async def test_owner_readers_and_admins_may_search(client: AsyncTestClient[Any], store: Store,
                                                   tmp_path: Path) -> None:
    admin, _ = await store.keys.create("dad", is_admin=True)
    alice, _ = await store.keys.create("alice")
    bob, _ = await store.keys.create("bob")
    folder = tmp_path / "docs"
    folder.mkdir()
    job = {"kind": "index", "path": str(folder), "collection": "family", "schedule": "0 3 * * *"}
    r = await client.post("/v1/jobs", json=job, headers=bearer(admin))
    assert r.status_code == 201, r.text
    access = await store.collections.access("family")
    assert access is not None and access.owner == "dad" and access.readers == ()
    assert (await client.post("/v1/search", json=QUERY, headers=bearer(admin))).status_code == 503
    r = await client.post("/v1/search", json=QUERY, headers=bearer(alice))
    assert r.status_code == 404 and r.json()["error"]["param"] == "collection"
    assert (await client.post("/v1/search", json={**QUERY, "collection": "nope"},
                              headers=bearer(alice))).status_code == 404
    assert (await client.get("/v1/collections", headers=bearer(alice))).json() == {"collections": []}
    # only the owner or an admin shares it
    r = await client.put("/v1/collections/family/readers", json={"users": ["alice"]}, headers=bearer(bob))
    assert r.status_code == 404
    r = await client.put("/v1/collections/family/readers", json={"users": ["alice"]}, headers=bearer(admin))
    assert r.status_code == 200 and r.json() == {"name": "family", "owner": "dad", "readers": ["alice"]}
    assert (await client.post("/v1/search", json=QUERY, headers=bearer(alice))).status_code == 503
    assert (await client.post("/v1/search", json=QUERY, headers=bearer(bob))).status_code == 404
    r = await client.put("/v1/collections/family/readers", json={"users": []}, headers=bearer(alice))
    assert r.status_code == 403  # a reader knows it exists; only its owner or an admin shares it
    listed = (await client.get("/v1/collections", headers=bearer(alice))).json()["collections"]
    assert [c["name"] for c in listed] == ["family"]
    r = await client.put("/v1/collections/family/readers", json={"users": ["*"]}, headers=bearer(admin))
    assert r.status_code == 200
    assert (await client.post("/v1/search", json=QUERY, headers=bearer(bob))).status_code == 503
    assert (await client.put("/v1/collections/nope/readers", json={"users": []},
                             headers=bearer(admin))).status_code == 404


async def test_someone_elses_collection_looks_missing(client: AsyncTestClient[Any], store: Store) -> None:
    """Before: 403 for a collection that exists, 404 for one that does not; a plain key could list names."""
    await store.collections.ensure("dads-taxes", owner="dad")
    alice, _ = await store.keys.create("alice")
    theirs = await client.post("/v1/search", json={**QUERY, "collection": "dads-taxes"}, headers=bearer(alice))
    missing = await client.post("/v1/search", json={**QUERY, "collection": "nope"}, headers=bearer(alice))
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["error"] == {**missing.json()["error"], "message": "no collection named 'dads-taxes'"}
    for name in ("dads-taxes", "nope"):
        r = await client.put(f"/v1/collections/{name}/readers", json={"users": ["alice"]}, headers=bearer(alice))
        assert r.status_code == 404 and r.json()["error"]["message"] == f"no collection named {name!r}"


async def test_an_existing_collection_keeps_its_owner(store: Store) -> None:
    cid = await store.collections.ensure("notes", owner="alice")
    assert await store.collections.ensure("notes", owner="mallory") == cid
    access = await store.collections.access("notes")
    assert access is not None and access.owner == "alice"
