"""A model leaves the device (its keep_alive ran out) only when nothing is posted to it or scheduled, and the
device thread decides that under the engine's inbox lock. A request that had looked the engine up before
and submits after used to wait forever: its add lay in an inbox nobody read again. Now the submission fails
at once (ModelUnloadedError), and the gateway loads the model again and submits once more."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from conftest import EngineFactory

from homeai.core.types import SamplingParams, TokenDelta
from homeai.engine.device_loop import DeviceLoop, run_alone
from homeai.engine.errors import ModelUnloadedError
from homeai.engine.llm_engine import LLMEngine
from homeai.gateway.gateway import Gateway, Route
from homeai.policy.schema import Policy
from homeai.scheduling.batcher import Batcher

PARAMS = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


def manual_loop(engine: LLMEngine) -> DeviceLoop:
    """The server's loop for one engine, not started: the test is its device thread."""
    policy = Policy.model_validate({"classes": {"default": {"kind": "llm", "model": "alone"}}})
    return DeviceLoop(engine, Batcher(policy, engine.scheduler, engine.scheduler.clock))


def test_a_model_with_a_posted_request_stays_and_one_that_left_refuses_new_ones(make_engine: EngineFactory) -> None:
    engine = make_engine()
    loop = manual_loop(engine)
    engine.submit(engine.make_sequence([1, 2, 3], PARAMS, "first"))
    leaving = loop.post_model("llm", None)
    loop.apply_inbox()  # the leave is decided before the engine's inbox is drained: the add is still there
    assert leaving.result() is False and loop.llms["llm"] is engine
    while engine.scheduler.has_work():
        loop.run_once()
    leaving = loop.post_model("llm", None)
    loop.apply_inbox()
    assert leaving.result() is True and "llm" not in loop.llms
    with pytest.raises(ModelUnloadedError, match="'llm' was unloaded before the request reached it"):
        engine.submit(engine.make_sequence([4, 5], PARAMS, "late"))


async def test_a_stream_on_a_model_that_left_fails_at_once_and_leaves_no_stream_open(
        make_engine: EngineFactory) -> None:
    engine = make_engine()
    loop = manual_loop(engine)
    loop.post_model("llm", None)
    loop.apply_inbox()
    stream = engine.generate([1, 2, 3], PARAMS, "late")
    with pytest.raises(ModelUnloadedError):
        await asyncio.wait_for(anext(stream), 5)
    assert engine.streams._streams == {}


class Pool:
    """What ``Gateway._leased`` asks of the model pool: the lease, and which models it manages."""

    def __init__(self) -> None:
        self.models = {"m": object()}
        self.leases = 0
        self.max_leases = 0

    def lease(self, name: str) -> None:
        self.leases += 1
        self.max_leases = max(self.max_leases, self.leases)

    def release(self, name: str) -> None:
        self.leases -= 1


class ReloadingGateway:
    """A gateway's pool and loader around ``Gateway._leased``: ``ensure_llm`` hands out the engine loaded again."""

    def __init__(self, loaded_again: LLMEngine) -> None:
        self.pool = Pool()
        self.closing: str | None = None  # the drain's deadline has not passed
        self.loaded_again = loaded_again
        self.loads: list[tuple[str, Any, str]] = []

    async def ensure_llm(self, model: str, timeout_s: float | None = None, class_name: str = "") -> LLMEngine:
        self.loads.append((model, timeout_s, class_name))
        return self.loaded_again


async def test_the_gateway_loads_a_model_that_left_again_and_submits_once_more(make_engine: EngineFactory) -> None:
    gone, loaded_again = make_engine(), make_engine()
    left = manual_loop(gone)
    left.post_model("llm", None)
    left.apply_inbox()
    device = run_alone(loaded_again)
    try:
        gateway = ReloadingGateway(loaded_again)
        stream = Gateway._leased(gateway, Route("m", "chat"), gone,  # type: ignore[arg-type]
                                 lambda engine: engine.generate([1, 2, 3], PARAMS, "r1"), 2_000_000)

        async def collect() -> list[TokenDelta]:
            return [d async for d in stream]

        deltas = await asyncio.wait_for(collect(), 10)  # it waited forever in the inbox of the model that left
    finally:
        device.shutdown()
    assert deltas[-1].finished and deltas[-1].error is None
    assert sum(len(d.token_ids) for d in deltas) == 3
    assert gateway.loads == [("m", 2.0, "chat")]
    assert gateway.pool.leases == 0 and gateway.pool.max_leases == 1  # held across the reload, then released
