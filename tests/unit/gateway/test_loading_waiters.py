"""Requests for a model that is still loading wait in the gateway as they would in their class queue: the
wait counts against their queue timeout, and their class's max_queue_size holds how many may wait (429
past it, with Retry-After). Before, any number waited, unrefused, for as long as a load took."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from homeai.api.errors import ApiError
from homeai.api.routing import RequestContext, resident
from homeai.engine.errors import QueueTimeoutError
from homeai.gateway.gateway import LOAD_RETRY_AFTER_S, Gateway, Route
from homeai.gateway.metering import Meter
from homeai.metrics.recorder import MetricsRecorder
from homeai.policy.loader import load_policy, parse_policy
from homeai.policy.store import PolicyHolder
from homeai.scheduling.class_queue import QueueFullError

DEFAULT_POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"


class LoadingPool:
    """A model pool whose one model is loading until ``finish``."""

    def __init__(self) -> None:
        self.models = {"big": object()}
        self.load: Future[Any] = Future()
        self.waits = 0

    def acquire(self, model: str) -> Future[Any]:
        return self.load

    def waiting(self, model: str, delta: int) -> None:
        self.waits += delta

    def keep_alive(self, model: str, seconds: float | None, unload_now: bool = False) -> None:
        pass


def test_waiting_for_a_load_is_held_to_the_queue_size_and_its_timeout() -> None:
    pool = LoadingPool()
    gateway = Gateway(PolicyHolder(load_policy(DEFAULT_POLICY)), pool=pool)  # type: ignore[arg-type]

    async def scenario() -> None:
        first = asyncio.create_task(gateway.ensure_llm("big", None, "chat", max_waiting=2))
        second = asyncio.create_task(gateway.ensure_llm("big", None, "chat", max_waiting=2))
        other_class = asyncio.create_task(gateway.ensure_llm("big", None, "voice", max_waiting=2))
        await asyncio.sleep(0)
        with pytest.raises(QueueFullError) as full:
            await gateway.ensure_llm("big", None, "chat", max_waiting=2)
        assert full.value.retry_after_s == LOAD_RETRY_AFTER_S and full.value.class_name == "chat"
        with pytest.raises(QueueTimeoutError, match="still loading"):
            await gateway.ensure_llm("big", 0.01, "embedding", max_waiting=0)
        engine = object()
        pool.load.set_result(engine)
        assert await asyncio.gather(first, second, other_class) == [engine] * 3
        assert pool.waits == 0 and sum(gateway.loading_waiters.values()) == 0

    asyncio.run(scenario())


def test_a_request_refused_while_its_model_loads_is_counted_as_a_refusal() -> None:
    """The 429 and the 503 above reached the client but no counter: homeai_rejections_total and /v1/stats
    counted only the refusals of the class queues."""
    recorder = MetricsRecorder()
    gateway = Gateway(PolicyHolder(load_policy(DEFAULT_POLICY)), pool=LoadingPool(),  # type: ignore[arg-type]
                      meter=Meter(recorder))
    ctx = RequestContext(user="ann", class_name=None, priority_level=None, timeout_us=None)

    async def scenario() -> None:
        waiting = [asyncio.create_task(gateway.ensure_llm("big", None, "voice", max_waiting=16)) for _ in range(16)]
        await asyncio.sleep(0)
        with pytest.raises(ApiError) as full:
            await resident(gateway, Route("big", "voice"), ctx)  # voice's queue holds 16, all waiting already
        assert full.value.status_code == 429
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        with pytest.raises(ApiError) as late:
            await resident(gateway, Route("big", "voice"), RequestContext("ann", None, None, timeout_us=10_000))
        assert late.value.status_code == 503

    asyncio.run(scenario())
    assert recorder.rejections("voice") == {"queue_full": 1, "timeout": 1}


def test_a_delay_class_waits_for_its_models_load_whatever_timeout_the_request_names() -> None:
    """Under DELAY a request past its timeout moves behind in its class queue and never fails; with a timeout
    header it was a 503 while its model loaded (the header became a hard limit on the load's wait)."""
    text = DEFAULT_POLICY.read_text().replace(  # chat (DELAY) takes a request's own timeout
        "      timeout_action: DELAY\n", "      timeout_action: DELAY\n      allow_timeout_override: true\n", 1)
    gateway = Gateway(PolicyHolder(parse_policy(text, source="test")), pool=LoadingPool())  # type: ignore[arg-type]
    waited: list[float | None] = []

    async def ensure_llm(model: str, timeout_s: float | None, class_name: str, max_waiting: int = 0) -> None:
        waited.append(timeout_s)

    gateway.ensure_llm = ensure_llm  # type: ignore[method-assign,assignment]
    asyncio.run(resident(gateway, Route("big", "chat"), RequestContext("ann", None, None, timeout_us=10_000)))
    asyncio.run(resident(gateway, Route("big", "voice"), RequestContext("ann", None, None, timeout_us=10_000)))
    assert waited == [None, 0.01]  # chat (DELAY) waits for the load; voice (REJECT) within the header's 10 ms


def test_after_the_drain_deadline_no_request_starts() -> None:
    """A request admitted before the deadline but still waiting for an on-demand model's load was submitted
    after it: no engine's fail-all reached it, and uvicorn cut its stream with no final message."""
    from homeai.api.drain import SHUTDOWN_MESSAGE, end_open_generations
    from homeai.api.errors import to_api_error
    from homeai.engine.errors import ShuttingDownError

    gateway = Gateway(PolicyHolder(load_policy(DEFAULT_POLICY)))
    end_open_generations(gateway)
    assert gateway.closing == SHUTDOWN_MESSAGE

    def submit(engine: Any) -> Any:
        raise AssertionError("submitted after the deadline")

    async def first() -> None:
        await anext(gateway._leased(Route("m", "chat"), object(), submit, None))  # type: ignore[arg-type]

    with pytest.raises(ShuttingDownError) as closed:
        asyncio.run(first())
    answer = to_api_error(closed.value)
    assert answer.status_code == 503 and answer.headers.get("Retry-After") == "10"
