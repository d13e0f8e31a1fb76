"""The app's side of a drain: 503 + Retry-After once it begins, probes still answer,
the live-stats stream ends, and the deadline ends the engine's open generations (no model here; the
real SIGTERM with streams in flight is tests/integration/api/test_drain_server.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from waiting import DEFAULT_TIMEOUT_S

from homeai.api.auth import authenticate
from homeai.api.drain import (
    RESTART_ESTIMATE_S,
    SHUTDOWN_MESSAGE,
    Drain,
    end_open_generations,
    engine_error,
    refuse_while_draining,
)
from homeai.api.errors import exception_handler
from homeai.api.observability_routes import _stats_events, observability_router
from homeai.api.openai_routes import OpenAIController
from homeai.api.services import DEPENDENCIES, Services, app_state
from homeai.api.settings import Settings
from homeai.policy.loader import load_policy
from homeai.policy.store import PolicyHolder
from homeai.store.db import Store

DEFAULT_POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"


@dataclass
class FakeEngine:
    failed_with: list[str] = field(default_factory=list)

    def fail_all_soon(self, message: str) -> None:
        self.failed_with.append(message)


@dataclass
class FakeGateway:
    llms: dict[str, FakeEngine] = field(default_factory=lambda: {"llm": FakeEngine()})
    started_s: float = 1.0
    loop: object = field(default_factory=object)  # a started gateway has its device loop

    def engine_health(self) -> dict[str, Any]:
        return {"failing": False}

    def snapshot(self) -> dict[str, Any]:
        return {"classes": {}, "device": {}}


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def services_with(drain: Drain, data_dir: Path, **fields: Any) -> Services:
    return Services(Settings(data_dir=data_dir), PolicyHolder(load_policy(DEFAULT_POLICY)), drain=drain, **fields)


def make_app(store: Store, drain: Drain, data_dir: Path) -> Litestar:
    services = services_with(drain, data_dir, store=store, gateway=FakeGateway(), stats_interval_s=0.01)
    return Litestar(route_handlers=[OpenAIController, observability_router], guards=[refuse_while_draining,
                    authenticate], exception_handlers={Exception: exception_handler}, state=app_state(services),
                    dependencies=DEPENDENCIES)


async def test_draining_refuses_new_work_but_answers_probes(store: Store, tmp_path: Path) -> None:
    clock = FakeClock()
    drain = Drain(timeout_s=30.0, clock=clock)
    async with AsyncTestClient(app=make_app(store, drain, tmp_path)) as client:
        assert (await client.get("/readyz")).json()["status"] == "ready"
        assert (await client.get("/v1/stats")).status_code == 200
        drain.begin()  # what `homeai serve` does on SIGTERM (no loop attached: at once)
        assert drain.draining
        r = await client.post("/v1/chat/completions", json={"model": "m", "messages": []})
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        assert r.headers["retry-after"] == str(int(30 + RESTART_ESTIMATE_S))
        clock.now_s += 25.0
        r = await client.post("/v1/embeddings", json={"model": "m", "input": "x"})
        assert r.status_code == 503 and r.headers["retry-after"] == str(int(5 + RESTART_ESTIMATE_S))
        assert (await client.get("/v1/stats")).status_code == 503
        ready = await client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        assert (await client.get("/healthz")).status_code == 200


async def test_stats_stream_ends_when_the_drain_begins(tmp_path: Path) -> None:
    drain = Drain(timeout_s=30.0)
    events = _stats_events(services_with(drain, tmp_path), 0.001)
    assert (await anext(events)).event == "stats"
    drain.begin()
    with pytest.raises(StopAsyncIteration):
        await anext(events)


class ManualLoop:
    """The two loop calls a Drain makes, by hand: ``call_soon_threadsafe`` runs at once, ``call_later``
    keeps its timer until the test fires it (an injected clock for the deadline)."""

    def __init__(self) -> None:
        self.timers: list[ManualTimer] = []

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        callback()

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> ManualTimer:
        timer = ManualTimer(delay_s, callback)
        self.timers.append(timer)
        return timer

    def fire(self) -> None:
        """The deadline comes: every timer not cancelled goes off."""
        for timer in self.timers:
            if not timer.cancelled:
                timer.callback()


@dataclass
class ManualTimer:
    delay_s: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


async def test_the_deadline_ends_open_generations() -> None:
    """On the real loop: the deadline's timer ends every open generation (once, whatever the signals)."""
    gateway = FakeGateway()
    ended = asyncio.Event()

    def on_deadline() -> None:
        end_open_generations(gateway)
        ended.set()

    drain = Drain(timeout_s=0.05)
    drain.attach(asyncio.get_running_loop(), on_deadline)
    drain.begin()
    drain.begin()  # a second signal changes nothing
    await asyncio.wait_for(ended.wait(), DEFAULT_TIMEOUT_S)
    assert gateway.llms["llm"].failed_with == [SHUTDOWN_MESSAGE]


def test_a_second_signal_arms_no_second_deadline_and_close_disarms_it() -> None:
    gateway, loop = FakeGateway(), ManualLoop()
    drain = Drain(timeout_s=30.0)
    drain.attach(cast(asyncio.AbstractEventLoop, loop), lambda: end_open_generations(gateway))
    drain.begin()
    drain.begin()  # a second signal changes nothing
    assert [t.delay_s for t in loop.timers] == [30.0]
    loop.fire()
    assert gateway.llms["llm"].failed_with == [SHUTDOWN_MESSAGE]
    quiet, loop = FakeGateway(), ManualLoop()
    early = Drain(timeout_s=30.0)
    early.attach(cast(asyncio.AbstractEventLoop, loop), lambda: end_open_generations(quiet))
    early.begin()
    early.close()  # the server stopped before the deadline: nothing left to end
    assert [t.cancelled for t in loop.timers] == [True]
    loop.fire()
    assert quiet.llms["llm"].failed_with == []


def test_a_request_ended_by_the_drain_is_a_503_not_a_500(tmp_path: Path) -> None:
    """Non-streaming requests (and streams still queued) that the deadline ends answer 503 + Retry-After."""

    @dataclass
    class FakeConnection:
        app: Any

    @dataclass
    class FakeApp:
        state: Any

    drain = Drain(timeout_s=30.0)
    connection: Any = FakeConnection(FakeApp(app_state(services_with(drain, tmp_path))))
    err = engine_error(connection, "engine error: boom")
    assert (err.status_code, err.code) == (500, "engine_error")  # not draining: a real engine error
    drain.begin()
    err = engine_error(connection, SHUTDOWN_MESSAGE)
    assert (err.status_code, err.code) == (503, "shutting_down") and "Retry-After" in err.headers
