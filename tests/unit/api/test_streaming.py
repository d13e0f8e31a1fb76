"""Disconnects without a server: a closed stream closes its generator; a racing wait is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from homeai.api.errors import ClientGone
from homeai.api.streaming import _ClosingASGIStreamingResponse, sse_data, until_disconnect


async def _disconnect_after(delay_s: float) -> dict[str, Any]:
    await asyncio.sleep(delay_s)
    return {"type": "http.disconnect"}


async def test_stream_closes_its_generator_when_the_client_leaves() -> None:
    """Litestar cancels the sending task on disconnect; our generator must see GeneratorExit (its
    ``finally`` is where the engine request is aborted), not wait for the garbage collector."""
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"data: x\n\n"
        finally:
            closed.set()

    sent: list[Any] = []

    async def slow_send(message: Any) -> None:  # a slow client: the disconnect comes while sending
        sent.append(message)
        await asyncio.sleep(1)

    stream = endless()  # held here, as Litestar's response holds it: no garbage collection to help
    response = _ClosingASGIStreamingResponse(iterator=stream)
    await asyncio.wait_for(response.send_body(slow_send, lambda: _disconnect_after(0.05)), timeout=5)
    assert closed.is_set() and len(sent) == 1


class _FakeRequest:
    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    async def receive(self) -> dict[str, Any]:
        return await _disconnect_after(self.delay_s)


async def test_until_disconnect_cancels_the_work() -> None:
    cancelled = asyncio.Event()

    async def slow() -> int:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 1

    with pytest.raises(ClientGone):
        await until_disconnect(_FakeRequest(0.02), slow())  # type: ignore[arg-type]
    assert cancelled.is_set()
    assert await until_disconnect(_FakeRequest(10), asyncio.sleep(0, result=7)) == 7  # type: ignore[arg-type]


def test_sse_format() -> None:
    assert sse_data({"a": 1}) == b'data: {"a":1}\n\n'
    assert sse_data({"a": 1}, event="e") == b'event: e\ndata: {"a":1}\n\n'
