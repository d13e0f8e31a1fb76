"""The app's one ``Services`` and the dependencies that hand it out: a handler names what it needs and gets
it, and what is not there yet answers as before (503 with Retry-After, or None for the handler to decide)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar, get
from litestar.datastructures import State
from litestar.testing import AsyncTestClient

from homeai.api.errors import exception_handler
from homeai.api.services import DEPENDENCIES, Injected, Services, app_state, services_of
from homeai.api.settings import DEFAULT_POLICY, Settings
from homeai.gateway.gateway import Gateway
from homeai.jobs.manager import JobManager
from homeai.policy.loader import load_policy
from homeai.policy.store import PolicyHolder
from homeai.store.db import Store


class FakeGateway:
    def served_models(self) -> list[str]:
        return ["m"]


@get("/gateway")
async def needs_gateway(gateway: Injected[Gateway]) -> list[str]:
    return gateway.served_models()


@get("/jobs")
async def needs_jobs(jobs: Injected[JobManager]) -> str:
    return type(jobs).__name__


@get("/store")
async def maybe_store(store: Injected[Store | None], policy_holder: Injected[PolicyHolder],
                      settings: Injected[Settings]) -> dict[str, Any]:
    return {"store": store is not None, "version": policy_holder.version, "host": settings.host}


def services(tmp_path: Path) -> Services:
    return Services(Settings(data_dir=tmp_path), PolicyHolder(load_policy(DEFAULT_POLICY)))


def app_with(services: Services) -> Litestar:
    return Litestar(route_handlers=[needs_gateway, needs_jobs, maybe_store], state=app_state(services),
                    dependencies=DEPENDENCIES, exception_handlers={Exception: exception_handler})


async def test_what_is_not_started_yet_answers_503_then_the_handler_gets_it(tmp_path: Path, store: Store) -> None:
    running = services(tmp_path)
    async with AsyncTestClient(app=app_with(running)) as client:
        for path, message in (("/gateway", "the engine is still starting"), ("/jobs", "jobs are not available")):
            r = await client.get(path)
            assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text
            assert message in r.json()["error"]["message"]
        assert (await client.get("/store")).json() == {"store": False, "version": 1, "host": "127.0.0.1"}
        running.gateway = FakeGateway()  # what engine_lifespan and background_lifespan set
        running.store = store
        running.jobs = JobManager(store, lambda: running.gateway)
        assert (await client.get("/gateway")).json() == ["m"]
        assert (await client.get("/jobs")).text == "JobManager"
        assert (await client.get("/store")).json()["store"] is True


def test_services_of_an_app(tmp_path: Path) -> None:
    running = services(tmp_path)
    app = app_with(running)
    assert services_of(app) is running
    with pytest.raises(RuntimeError, match="no Services"):
        services_of(Litestar(route_handlers=[], state=State({})))
